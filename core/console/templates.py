# ruff: noqa: E501  (HTML templates: a line is a tag, not code)
"""The console's operational pages: sign-in, overview, approvals, the AMBIGUOUS queue, effects
and their timelines, the resolve confirmation, sagas. Each extends ``base``
(:mod:`.pages`); every form that writes carries the session's CSRF token and posts to an
action that answers with a redirect (303)."""

from __future__ import annotations

from .snippets import CSRF

__all__ = ["TEMPLATES"]

_LOGIN = """{% extends "base" %}{% block body %}
<h1>Sign in</h1>
<p class="muted">An operator's token (<code>effectgate principals add NAME --role operator</code>).</p>
<form method="post" action="/login">
<input type="hidden" name="csrf_token" value="{{ login_nonce | asis }}">
<input type="hidden" name="next" value="{{ next | asis }}">
<label for="token">Operator token</label>
<input type="password" id="token" name="token" autocomplete="off" size="50" required>
<button type="submit">Sign in</button>
</form>{% endblock %}"""

_OVERVIEW = """{% extends "base" %}{% block body %}
<h1>Overview</h1>
<div class="cards">
<div class="card"><span>Ambiguous</span><b>{{ counts.ambiguous }}</b>
<a href="/ambiguous">the queue</a></div>
<div class="card"><span>Oldest ambiguous</span><b>{{ oldest or "none" }}</b></div>
<div class="card"><span>Pending approvals</span><b>{{ pending }}</b>
<a href="/approvals">the queue</a></div>
</div>
<h2>Effects by state</h2>
<table><thead><tr><th>state</th><th>effects</th></tr></thead><tbody>
{% for state, n in counts.items() %}<tr><td>{{ state }}</td><td>{{ n }}</td></tr>{% endfor %}
</tbody></table>
<h2>Spend per ceiling</h2>
{% if spend %}<table><thead><tr><th>ceiling counter</th><th>spent</th><th>updated</th></tr></thead>
<tbody>{% for s in spend %}<tr><td><code>{{ s.scope }}</code></td><td>{{ s.spent }}</td>
<td>{{ s.updated }}</td></tr>{% endfor %}</tbody></table>
{% else %}<p class="muted">No spend counted yet.</p>{% endif %}
{% endblock %}"""

_APPROVAL_HEAD = """<thead><tr><th>approval</th><th>effect</th><th>what will execute</th>
<th>requested by</th><th>run</th><th>requested at</th><th>cost</th><th>expires</th><th>decision</th>
</tr></thead>"""

_APPROVAL_ROW = """<tr>
<td><a href="/approvals/{{ a.approval_id | urlencode }}"><code>{{ a.approval_id }}</code></a></td>
<td>{{ a.effect_type }}<br><code>{{ a.key }}</code></td>
<td><pre>{{ a.arguments_text }}</pre><span class="muted">hash <code>{{ a.payload_hash }}</code></span></td>
<td>{{ a.requested_by or "(unattributed)" }}</td><td>{% if a.run_id %}<code>{{ a.run_id }}</code>{% endif %}</td>
<td>{{ a.requested_at }}</td><td>{{ a.cost }}</td><td>{{ a.expires }}</td>
<td>{% if a.pending %}
<form class="inline" method="post" action="/approvals/{{ a.approval_id | urlencode }}/approve">
""" + CSRF + """<button class="approve" type="submit">Approve</button></form>
<form class="inline" method="post" action="/approvals/{{ a.approval_id | urlencode }}/deny">
""" + CSRF + """<label>reason <input type="text" name="reason" size="14"></label>
<button class="deny" type="submit">Deny</button></form>
{% else %}{{ a.state }}{% if a.decided_by %} by {{ a.decided_by }}{% endif %}{% endif %}</td></tr>"""

_APPROVALS = """{% extends "base" %}{% block body %}
<h1>{{ heading }}</h1>
<form class="search" method="get" action="/approvals" role="search">
<label>state <select name="state">{% for s in states %}<option value="{{ s }}"{% if q.state == s %} selected{% endif %}>{{ s }}</option>{% endfor %}</select></label>
<label>key starts with <input type="text" name="key" value="{{ q.key | asis }}" size="16"></label>
<label>type <input type="text" name="type" value="{{ q.type | asis }}" size="12"></label>
<label>requested by <input type="text" name="by" value="{{ q.by | asis }}" size="10"></label>
<label>run <input type="text" name="run" value="{{ q.run | asis }}" size="10"></label>
<button type="submit">Search</button></form>
<p class="muted">{{ total }} match{{ "" if total == 1 else "es" }}{% if approvals %}; showing {{ approvals | length }}, newest first{% endif %}.</p>
{% if approvals %}<table>""" + _APPROVAL_HEAD + """<tbody>{% for a in approvals %}""" + _APPROVAL_ROW + """{% endfor %}</tbody></table>
{% else %}<p>{{ "Nothing waits for approval." if q.state == "pending" else "No approval requests match." }}</p>{% endif %}
<nav aria-label="pages">{% if first_query is not none %}<a href="/approvals?{{ first_query }}">Newest</a> {% endif %}
{% if next_query %}<a href="/approvals?{{ next_query }}">Older</a>{% endif %}</nav>
{% endblock %}"""

_APPROVAL = """{% extends "base" %}{% block body %}
<h1>Approval {{ a.approval_id }}</h1>
<table>""" + _APPROVAL_HEAD + """<tbody>""" + _APPROVAL_ROW + """</tbody></table>
<p>State: <strong>{{ a.state }}</strong>{% if a.reason %} — {{ a.reason }}{% endif %}.
Effect <a href="/effects/{{ a.effect_id }}">#{{ a.effect_id }}</a>.</p>
{% endblock %}"""

_EFFECT_ROWS = """<table><thead><tr><th>id</th><th>key</th><th>type</th><th>state</th>
<th>run / agent</th><th>updated</th></tr></thead><tbody>
{% for e in effects %}<tr><td><a href="/effects/{{ e.effect_id }}">#{{ e.effect_id }}</a></td>
<td><code>{{ e.key }}</code></td><td>{{ e.effect_type }}</td><td>{{ e.state.value }}</td>
<td>{{ e.run_id or "" }} / {{ e.agent_id or "" }}</td><td>{{ when(e.updated_at) }}</td></tr>
{% endfor %}</tbody></table>"""

# A resolve starts as a GET form (nothing is written): it leads to the confirmation page.
_RESOLVE_ASK = """<form class="inline" method="get" action="/effects/{{ e.effect_id }}/resolve">
<input type="hidden" name="back" value="{{ back | asis }}">
<input type="hidden" name="seen" value="{{ seen_of(e) | asis }}">
{% if forced %}<input type="hidden" name="force" value="1">{% endif %}
<select name="outcome" aria-label="outcome" required><option value="" selected>choose…</option>
{% for o in outcomes %}<option value="{{ o }}">{{ o }}</option>{% endfor %}</select>
<label>note <input type="text" name="note" size="18" maxlength="2000"></label>
<button type="submit">{{ "Force resolve…" if forced else "Resolve…" }}</button></form>"""

_RECONCILE = """<form class="inline" method="post" action="/effects/{{ e.effect_id }}/reconcile">
""" + CSRF + """<input type="hidden" name="back" value="{{ back | asis }}">
<button type="submit">Reconcile now</button></form>"""

_AMBIGUOUS = """{% extends "base" %}{% block body %}
<h1>Ambiguous effects</h1>
<p class="muted">Nobody knows whether these happened. Check with the vendor, then resolve.</p>
{% if effects %}<table><thead><tr><th>effect</th><th>age</th><th>vendor key</th>
<th>last error</th><th>history</th><th>action</th></tr></thead><tbody>
{% for e in effects %}<tr>
<td><a href="/effects/{{ e.effect_id }}">#{{ e.effect_id }}</a> {{ e.effect_type }}<br>
<code>{{ e.key }}</code></td><td>{{ age(e) }}</td>
<td>{% if e.vendor_key %}{{ e.vendor_key.vendor }}: <code>{{ e.vendor_key.value }}</code><br>
{% if e.vendor_key.covered is none %}<span class="muted">vendor window unknown</span>
{% elif e.vendor_key.covered %}<span class="yes">vendor window still covers it</span>
{% else %}<span class="no">vendor window has passed</span>{% endif %}
{% else %}<span class="muted">no vendor</span>{% endif %}</td>
<td>{{ e.error or e.reason or "" }}</td>
<td>{% for h in e.history[-3:] %}<div class="muted">{{ when(h.at) }}
{{ h.from_state.value if h.from_state else "" }} → {{ h.to_state.value }}
{% if h.by %}by {{ h.by }}{% endif %}</div>{% endfor %}</td>
<td>{% with back="/ambiguous", outcomes=("committed", "failed"), forced=False %}""" + _RECONCILE + _RESOLVE_ASK + """{% endwith %}</td></tr>{% endfor %}</tbody></table>
{% else %}<p>No ambiguous effects{% if before %} at or below #{{ before }}{% endif %}.</p>{% endif %}
{% if next_before %}<p><a href="/ambiguous?before={{ next_before }}">Older</a>
<span class="muted">(continues below #{{ next_before }})</span></p>{% endif %}
{% endblock %}"""

_EFFECTS = """{% extends "base" %}{% block body %}
<h1>Effects</h1>
<form class="search" method="get" action="/effects" role="search">
<label>key starts with <input type="text" name="key" value="{{ q.key | asis }}" size="16"></label>
<label>type <input type="text" name="type" value="{{ q.type | asis }}" size="12"></label>
<label>state <select name="state"><option value="">any</option>
{% for s in states %}<option value="{{ s }}"{% if q.state == s %} selected{% endif %}>{{ s }}</option>{% endfor %}
</select></label>
<label>run <input type="text" name="run" value="{{ q.run | asis }}" size="10"></label>
<label>agent <input type="text" name="agent" value="{{ q.agent | asis }}" size="10"></label>
<button type="submit">Search</button></form>
{% if effects %}""" + _EFFECT_ROWS + """{% else %}<p>No effects match.</p>{% endif %}
{% if next_before %}<p><a href="/effects?{{ next_query }}">Older</a></p>{% endif %}
{% endblock %}"""

_EFFECT = """{% extends "base" %}{% block body %}
<h1>Effect #{{ e.effect_id }}</h1>
{% if undo %}<p role="note" class="warning">Undone: compensated by
<a href="/effects/{{ undo.effect_id }}">#{{ undo.effect_id }}</a> (<code>{{ undo.key }}</code>, {{ undo.state.value }}).</p>{% endif %}
{% if e.compensates_effect_id %}<p>This is the undo of <a href="/effects/{{ e.compensates_effect_id }}">#{{ e.compensates_effect_id }}</a>.</p>{% endif %}
{% if decided %}<p role="note" class="decided">Approval
<a href="/approvals/{{ decided.a.approval_id | urlencode }}"><code>{{ decided.a.approval_id }}</code></a>
<strong>{{ decided.state }}</strong>{% if decided.a.decided_by %} by {{ decided.a.decided_by }}{% endif %}{% if decided.at %} at {{ decided.at }}{% endif %}{% if decided.a.reason %} — {{ decided.a.reason }}{% endif %}:
{{ decided.next }}.</p>{% endif %}
<table><tbody>
{% for name, value in fields %}<tr><th>{{ name }}</th><td>{{ value }}</td></tr>{% endfor %}
</tbody></table>
{% if offer.outcomes %}{% with back="/effects/" ~ e.effect_id, outcomes=offer.outcomes, forced=offer.forced %}
{% if offer.forced %}<h2>Force a resolve</h2>
<div class="warning">Its holder's lease is live until {{ offer.until }}: it may still be running.
A resolve is refused until the lease lapses. Force one only if you know the holder is gone;
the history records it as forced.</div>
{% else %}<h2>Resolve</h2>{% endif %}""" + _RESOLVE_ASK + """
{% if e.state.value == "ambiguous" %}""" + _RECONCILE + """{% endif %}{% endwith %}{% endif %}
<h2>Timeline</h2>
<table><thead><tr><th>at</th><th>from</th><th>to</th><th>by</th><th>note</th><th>token</th>
</tr></thead><tbody>{% for h in e.history %}<tr><td>{{ when(h.at) }}</td>
<td>{{ h.from_state.value if h.from_state else "" }}</td><td>{{ h.to_state.value }}</td>
<td>{{ h.by or "" }}</td><td>{{ h.note or "" }}</td><td>{{ h.token }}</td></tr>{% endfor %}
</tbody></table>
{% if e.group_key %}<p>Saga <a href="/groups/view?group={{ e.group_key | urlencode }}">{{ e.group_key }}</a></p>{% endif %}
{% endblock %}"""

_CONFIRM = """{% extends "base" %}{% block body %}
<h1>Confirm: resolve effect #{{ e.effect_id }}</h1>
{% if problem %}<div role="alert">{{ problem }}</div>
<p><a href="{{ back | asis }}">Back</a></p>
{% else %}
<p>Nothing is written until you confirm. This will be recorded:</p>
<div class="confirm" role="region" aria-label="what will be recorded"><dl>
<dt>outcome</dt><dd><strong>{{ outcome }}</strong> — {{ meaning }}</dd>
<dt>key</dt><dd><code>{{ e.key }}</code></dd>
<dt>effect</dt><dd>#{{ e.effect_id }} {{ e.effect_type }}, now {{ e.state.value }}, attempt {{ e.attempt }}</dd>
<dt>note</dt><dd>{{ note if note else "(none)" }}</dd>
<dt>by</dt><dd>{{ who }}</dd>
{% if forced %}<dt>forced</dt><dd class="no">yes: its holder's lease is live until {{ until }}; the history records a forced resolve</dd>{% endif %}
</dl></div>
<form method="post" action="/effects/{{ e.effect_id }}/resolve">
""" + CSRF + """<input type="hidden" name="outcome" value="{{ outcome | asis }}">
<input type="hidden" name="note" value="{{ note | asis }}">
<input type="hidden" name="seen" value="{{ seen | asis }}">
<input type="hidden" name="back" value="{{ back | asis }}">
{% if forced %}<input type="hidden" name="force" value="1">{% endif %}
<button class="{{ 'danger' if forced or outcome == 'failed' else 'approve' }}" type="submit">Record {{ outcome }}{{ " (forced)" if forced else "" }}</button>
<a href="{{ back | asis }}">Cancel</a></form>{% endif %}
{% endblock %}"""

_GROUPS = """{% extends "base" %}{% block body %}
<h1>Sagas</h1>
<form method="get" action="/groups/view"><label>group key
<input type="text" name="group" size="30" required></label>
<button type="submit">Open</button></form>
<h2>Recent groups</h2>
{% if groups %}<ul>{% for g in groups %}<li><a href="/groups/view?group={{ g | urlencode }}">{{ g }}</a></li>
{% endfor %}</ul>{% else %}<p>No saga groups among recent effects.</p>{% endif %}
{% endblock %}"""

_GROUP = """{% extends "base" %}{% block body %}
<h1>Saga {{ group }}</h1>
{% if steps %}<table><thead><tr><th>step</th><th>key</th><th>type</th><th>state</th>
<th>undo</th><th>updated</th></tr></thead><tbody>
{% for s in steps %}<tr><td><a href="/effects/{{ s.e.effect_id }}">#{{ s.e.effect_id }}</a></td>
<td><code>{{ s.e.key }}</code></td><td>{{ s.e.effect_type }}</td>
<td{% if s.undone %} class="undone"{% endif %}>{{ s.e.state.value }}</td>
<td>{% if s.undo %}{% if s.undone %}<strong>compensated</strong> by {% else %}compensation {{ s.undo.state.value }}: {% endif %}<a href="/effects/{{ s.undo.effect_id }}">#{{ s.undo.effect_id }}</a>{% if s.undo.error %} <span class="muted">{{ s.undo.error }}</span>{% endif %}
{% else %}<span class="muted">{{ s.note }}</span>{% endif %}</td>
<td>{{ when(s.e.updated_at) }}</td></tr>{% endfor %}</tbody></table>
<form method="get" action="/groups/unwind">
<input type="hidden" name="group" value="{{ group | asis }}">
<input type="hidden" name="seen" value="{{ seen | asis }}">
<button class="danger" type="submit">Unwind…</button></form>
{% else %}<p>No steps in this group.</p>{% endif %}
{% endblock %}"""

# An unwind runs compensators: the confirmation names each undo and carries what was seen.
_CONFIRM_UNWIND = """{% extends "base" %}{% block body %}
<h1>Confirm: unwind {{ group }}</h1>
{% if problem %}<div role="alert">{{ problem }}</div>
<p><a href="{{ back | asis }}">Back</a></p>
{% else %}
<p>Nothing runs until you confirm. These undos will run, newest first, each at most once
(each is itself gated: a policy may still ask for approval or refuse it):</p>
<div class="confirm" role="region" aria-label="what will be undone"><table>
<thead><tr><th>step</th><th>key</th><th>type</th><th>compensation</th><th>undo</th></tr></thead>
<tbody>{% for r, undo_key, compensation in undos %}<tr><td>#{{ r.effect_id }}</td><td><code>{{ r.key }}</code></td>
<td>{{ r.effect_type }}</td><td><code>{{ compensation }}</code></td><td><code>{{ undo_key }}</code></td></tr>
{% endfor %}</tbody></table>
<p>by {{ who }}</p></div>
<form method="post" action="/groups/unwind">
""" + CSRF + """<input type="hidden" name="group" value="{{ group | asis }}">
<input type="hidden" name="seen" value="{{ seen | asis }}">
<button class="danger" type="submit">Run {{ undos | length }} undo{{ "" if undos | length == 1 else "s" }}</button>
<a href="{{ back | asis }}">Cancel</a></form>{% endif %}
{% endblock %}"""

_MESSAGE = """{% extends "base" %}{% block body %}
<h1>{{ title }}</h1><div role="alert">{{ message }}</div>
{% if link %}<p><a href="{{ link | asis }}">{{ link_text }}</a></p>{% endif %}
{% endblock %}"""

TEMPLATES = {
    "login": _LOGIN, "overview": _OVERVIEW, "approvals": _APPROVALS, "approval": _APPROVAL,
    "ambiguous": _AMBIGUOUS, "effects": _EFFECTS, "effect": _EFFECT, "confirm": _CONFIRM,
    "groups": _GROUPS, "group": _GROUP, "confirm_unwind": _CONFIRM_UNWIND,
    "message": _MESSAGE,
}
