# ruff: noqa: E501  (HTML templates: a line is a tag, not code)
"""The console's pages: server-rendered HTML (Jinja2, autoescaped), no scripts at all.

Every form carries the session's CSRF token; every value a caller or an agent supplied is
escaped by the template engine (arguments, keys, notes, errors).
"""

from __future__ import annotations

from typing import Any

import jinja2

__all__ = ["CSS", "render"]

CSS = """
body{font-family:"DejaVu Sans",Arial,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2430;color:#fff;padding:.6rem 1rem;display:flex;gap:1.2rem;
align-items:center;flex-wrap:wrap}
header a{color:#fff;text-decoration:none}header a:hover{text-decoration:underline}
header .who{margin-left:auto;font-size:.9rem}
main{padding:1rem 1.4rem;max-width:1200px}
h1{font-size:1.4rem;margin:.4rem 0 1rem}h2{font-size:1.1rem;margin:1.2rem 0 .5rem}
table{border-collapse:collapse;width:100%;background:#fff;margin-bottom:1rem}
th,td{border:1px solid #d5d9e0;padding:.35rem .5rem;text-align:left;vertical-align:top;
font-size:.9rem}th{background:#eceff3}
pre{margin:0;white-space:pre-wrap;word-break:break-all;font-size:.85rem}
code{font-size:.85rem;word-break:break-all}
form.inline{display:inline-block;margin:.15rem .3rem .15rem 0}
input[type=text],input[type=password],select{padding:.25rem;font-size:.9rem}
button{padding:.3rem .7rem;font-size:.9rem;cursor:pointer}
.approve{background:#1f7a3a;color:#fff;border:1px solid #17602d}
.deny,.danger{background:#a8261f;color:#fff;border:1px solid #861d18}
[role=status]{background:#e3f4e8;border:1px solid #1f7a3a;padding:.5rem .8rem;margin:.5rem 0}
[role=alert]{background:#fbe4e2;border:1px solid #a8261f;padding:.5rem .8rem;margin:.5rem 0}
.muted{color:#5b6576;font-size:.85rem}.yes{color:#1f7a3a}.no{color:#a8261f}
.cards{display:flex;gap:1rem;flex-wrap:wrap;margin-bottom:1rem}
.card{background:#fff;border:1px solid #d5d9e0;padding:.7rem 1rem;min-width:11rem}
.card b{display:block;font-size:1.4rem}
"""

_BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }} · effectgate console</title>
<link rel="stylesheet" href="/console.css"></head>
<body>
{% if who %}<header><strong>effectgate</strong>
<nav aria-label="main"><a href="/">Overview</a> · <a href="/approvals">Approvals</a> ·
<a href="/ambiguous">Ambiguous</a> · <a href="/effects">Effects</a> ·
<a href="/groups">Sagas</a></nav>
<span class="who">{{ who }} · namespace <code>{{ namespace }}</code>
<form class="inline" method="post" action="/logout">
<input type="hidden" name="csrf_token" value="{{ csrf }}">
<button type="submit">Sign out</button></form></span></header>{% endif %}
<main>
{% if flash %}<div role="{{ 'alert' if flash.kind == 'error' else 'status' }}">{{ flash.text }}</div>{% endif %}
{% block body %}{% endblock %}
</main></body></html>
"""

_CSRF = '<input type="hidden" name="csrf_token" value="{{ csrf }}">'

_LOGIN = """{% extends "base" %}{% block body %}
<h1>Sign in</h1>
<p class="muted">An operator's token (<code>effectgate principals add NAME --role operator</code>).</p>
<form method="post" action="/login">
<input type="hidden" name="csrf_token" value="{{ login_nonce }}">
<input type="hidden" name="next" value="{{ next }}">
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

_APPROVAL_ROW = """<tr>
<td><a href="/approvals/{{ a.approval_id | urlencode }}"><code>{{ a.approval_id }}</code></a></td>
<td>{{ a.effect_type }}<br><code>{{ a.key }}</code></td>
<td><pre>{{ a.arguments_text }}</pre><span class="muted">hash <code>{{ a.payload_hash }}</code></span></td>
<td>{{ a.requested_by or "(unattributed)" }}</td><td>{{ a.cost }}</td><td>{{ a.expires }}</td>
<td>{% if a.pending %}
<form class="inline" method="post" action="/approvals/{{ a.approval_id | urlencode }}/approve">
""" + _CSRF + """<button class="approve" type="submit">Approve</button></form>
<form class="inline" method="post" action="/approvals/{{ a.approval_id | urlencode }}/deny">
""" + _CSRF + """<label>reason <input type="text" name="reason" size="14"></label>
<button class="deny" type="submit">Deny</button></form>
{% else %}{{ a.state }}{% if a.decided_by %} by {{ a.decided_by }}{% endif %}{% endif %}</td></tr>"""

_APPROVALS = """{% extends "base" %}{% block body %}
<h1>Pending approvals</h1>
{% if total > approvals | length %}<p class="muted">The newest {{ approvals | length }} of {{ total }}.</p>{% endif %}
{% if approvals %}<table><thead><tr><th>approval</th><th>effect</th>
<th>what will execute</th><th>requested by</th><th>cost</th><th>expires</th><th>decision</th>
</tr></thead><tbody>{% for a in approvals %}""" + _APPROVAL_ROW + """{% endfor %}</tbody></table>
{% else %}<p>Nothing waits for approval.</p>{% endif %}{% endblock %}"""

_APPROVAL = """{% extends "base" %}{% block body %}
<h1>Approval {{ a.approval_id }}</h1>
<table><thead><tr><th>approval</th><th>effect</th>
<th>what will execute</th><th>requested by</th><th>cost</th><th>expires</th><th>decision</th>
</tr></thead><tbody>""" + _APPROVAL_ROW + """</tbody></table>
<p>State: <strong>{{ a.state }}</strong>{% if a.reason %} — {{ a.reason }}{% endif %}.
Effect <a href="/effects/{{ a.effect_id }}">#{{ a.effect_id }}</a>.</p>
{% endblock %}"""

_EFFECT_ROWS = """<table><thead><tr><th>id</th><th>key</th><th>type</th><th>state</th>
<th>run / agent</th><th>updated</th></tr></thead><tbody>
{% for e in effects %}<tr><td><a href="/effects/{{ e.effect_id }}">#{{ e.effect_id }}</a></td>
<td><code>{{ e.key }}</code></td><td>{{ e.effect_type }}</td><td>{{ e.state.value }}</td>
<td>{{ e.run_id or "" }} / {{ e.agent_id or "" }}</td><td>{{ when(e.updated_at) }}</td></tr>
{% endfor %}</tbody></table>"""

_RESOLVE_FORMS = """<form class="inline" method="post" action="/effects/{{ e.effect_id }}/reconcile">
""" + _CSRF + """<button type="submit">Reconcile now</button></form>
<form class="inline" method="post" action="/effects/{{ e.effect_id }}/resolve">
""" + _CSRF + """<select name="outcome" aria-label="outcome"><option value="committed">committed</option>
<option value="failed">failed</option></select>
<label>note <input type="text" name="note" size="18"></label>
<button type="submit">Resolve</button></form>"""

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
<td>""" + _RESOLVE_FORMS + """</td></tr>{% endfor %}</tbody></table>
{% else %}<p>No ambiguous effects{% if before %} at or below #{{ before }}{% endif %}.</p>{% endif %}
{% if next_before %}<p><a href="/ambiguous?before={{ next_before }}">Older</a>
<span class="muted">(continues below #{{ next_before }})</span></p>{% endif %}
{% endblock %}"""

_EFFECTS = """{% extends "base" %}{% block body %}
<h1>Effects</h1>
<form method="get" action="/effects" role="search">
<label>key starts with <input type="text" name="key" value="{{ q.key }}" size="16"></label>
<label>type <input type="text" name="type" value="{{ q.type }}" size="12"></label>
<label>state <select name="state"><option value="">any</option>
{% for s in states %}<option value="{{ s }}"{% if q.state == s %} selected{% endif %}>{{ s }}</option>{% endfor %}
</select></label>
<label>run <input type="text" name="run" value="{{ q.run }}" size="10"></label>
<label>agent <input type="text" name="agent" value="{{ q.agent }}" size="10"></label>
<button type="submit">Search</button></form>
{% if effects %}""" + _EFFECT_ROWS + """{% else %}<p>No effects match.</p>{% endif %}
{% if next_before %}<p><a href="/effects?{{ next_query }}">Older</a></p>{% endif %}
{% endblock %}"""

_EFFECT = """{% extends "base" %}{% block body %}
<h1>Effect #{{ e.effect_id }}</h1>
<table><tbody>
{% for name, value in fields %}<tr><th>{{ name }}</th><td>{{ value }}</td></tr>{% endfor %}
</tbody></table>
{% if e.state.value in ("ambiguous", "in_flight") %}<h2>Resolve</h2>
{% if e.state.value == "in_flight" %}<p class="muted">Its holder's lease is live until
{{ when(e.lease_expires_at) }}: a resolve is refused until it lapses.</p>{% endif %}
""" + _RESOLVE_FORMS + """{% endif %}
<h2>Timeline</h2>
<table><thead><tr><th>at</th><th>from</th><th>to</th><th>by</th><th>note</th><th>token</th>
</tr></thead><tbody>{% for h in e.history %}<tr><td>{{ when(h.at) }}</td>
<td>{{ h.from_state.value if h.from_state else "" }}</td><td>{{ h.to_state.value }}</td>
<td>{{ h.by or "" }}</td><td>{{ h.note or "" }}</td><td>{{ h.token }}</td></tr>{% endfor %}
</tbody></table>
{% if e.group_key %}<p>Saga <a href="/groups/view?group={{ e.group_key | urlencode }}">{{ e.group_key }}</a></p>{% endif %}
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
{% if effects %}""" + _EFFECT_ROWS + """
<form method="post" action="/groups/unwind">""" + _CSRF + """
<input type="hidden" name="group" value="{{ group }}">
<button class="danger" type="submit">Unwind</button></form>
{% else %}<p>No steps in this group.</p>{% endif %}
{% if report %}<h2>Last unwind</h2><table><thead><tr><th>outcome</th><th>key</th><th>state</th>
<th>detail</th></tr></thead><tbody>{% for name, s in report %}<tr><td>{{ name }}</td>
<td><code>{{ s.key }}</code></td><td>{{ s.state }}</td><td>{{ s.detail }}</td></tr>
{% endfor %}</tbody></table>{% endif %}
{% endblock %}"""

_MESSAGE = """{% extends "base" %}{% block body %}
<h1>{{ title }}</h1><div role="alert">{{ message }}</div>
{% if link %}<p><a href="{{ link }}">{{ link_text }}</a></p>{% endif %}
{% endblock %}"""

_env = jinja2.Environment(
    loader=jinja2.DictLoader({
        "base": _BASE, "login": _LOGIN, "overview": _OVERVIEW, "approvals": _APPROVALS,
        "approval": _APPROVAL, "ambiguous": _AMBIGUOUS, "effects": _EFFECTS,
        "effect": _EFFECT, "groups": _GROUPS, "group": _GROUP, "message": _MESSAGE,
    }),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def render(name: str, **context: Any) -> str:
    """The page ``name`` rendered with ``context`` (every value escaped)."""
    return _env.get_template(name).render(**context)
