# ruff: noqa: E501  (HTML templates: a line is a tag, not code)
"""The console's pages about people: principals (list, add — the token shown once —,
revoke) and the audit of operators' actions."""

from __future__ import annotations

from .snippets import CSRF

__all__ = ["TEMPLATES"]

_PRINCIPALS = """{% extends "base" %}{% block body %}
<h1>Principals</h1>
<p class="muted">Operators sign in here and approve, deny, resolve, reconcile and unwind;
agents begin, report and extend what they hold (MCP over HTTP). A token is shown once, when
its principal is added; the store keeps only a salted hash. A revoked name stays taken.</p>
<table><thead><tr><th>name</th><th>role</th><th>created</th><th>last used</th><th>status</th><th></th></tr></thead><tbody>
{% for p in principals %}<tr><td><code>{{ p.name }}</code></td><td>{{ p.role }}</td>
<td>{{ when(p.created_at) }}</td><td>{{ when(p.last_used_at) or "never" }}</td>
<td>{% if p.revoked_at %}<span class="no">revoked {{ when(p.revoked_at) }}</span>{% else %}<span class="yes">active</span>{% endif %}</td>
<td>{% if not p.revoked_at and p.name != who %}<form class="inline" method="post" action="/principals/revoke">
""" + CSRF + """<input type="hidden" name="name" value="{{ p.name | asis }}">
<button class="danger" type="submit" aria-label="Revoke {{ p.name }}">Revoke</button></form>
{% elif p.name == who %}<span class="muted">you</span>{% endif %}</td></tr>
{% else %}<tr><td colspan="6">No principals yet.</td></tr>{% endfor %}</tbody></table>
<h2>Add a principal</h2>
<form method="post" action="/principals">""" + CSRF + """
<label>name <input type="text" name="name" size="20" maxlength="64" required></label>
<label>role <select name="role" required><option value="" selected>choose…</option>
<option value="operator">operator</option><option value="agent">agent</option></select></label>
<button type="submit">Add principal</button></form>
<p class="muted">Names: 1-64 lower-case letters, digits and . _ @ - (starting with a letter or digit).</p>
{% endblock %}"""

_CREATED = """{% extends "base" %}{% block body %}
<h1>Principal added</h1>
{% if token %}<p>Added {{ role }} <code>{{ added }}</code>. Its token, shown this once (the store
keeps only a hash; it cannot be shown again):</p>
<code class="token" aria-label="token">{{ token }}</code>
<p class="muted">Copy it now. Reloading this page will not show it again.</p>
{% else %}<div role="alert">The new token was shown once already (or its minute passed): it
cannot be shown again. Revoke that principal and add another if it was lost.</div>{% endif %}
<p><a href="/principals">Back to principals</a></p>
{% endblock %}"""

_AUDIT = """{% extends "base" %}{% block body %}
<h1>Audit</h1>
<p class="muted">What operators did through the console and the <code>effectgate</code> CLI:
approvals, denials, resolves, reconciles, unwinds, principals added and revoked, sign-ins and
sign-outs, newest first, on the store's clock (UTC). Decisions made in code through the Gate
API are in the timeline of each effect and approval they changed.</p>
<form class="search" method="get" action="/audit" role="search">
<label>who <input type="text" name="actor" value="{{ q.actor | asis }}" size="12"></label>
<label>action <select name="action"><option value="">any</option>
{% for a in actions %}<option value="{{ a }}"{% if q.action == a %} selected{% endif %}>{{ a }}</option>{% endfor %}</select></label>
<label>subject <input type="text" name="subject" value="{{ q.subject | asis }}" size="20"></label>
<button type="submit">Search</button></form>
{% if entries %}<table><thead><tr><th>when</th><th>who</th><th>action</th><th>subject</th>
<th>via</th><th>detail</th></tr></thead><tbody>
{% for a in entries %}<tr><td>{{ when(a.at) }}</td><td><code>{{ a.actor }}</code></td><td>{{ a.action }}</td>
<td>{% if a.effect_id %}<a href="/effects/{{ a.effect_id }}"><code>{{ a.subject or ("#" ~ a.effect_id) }}</code></a>{% elif a.subject %}<code>{{ a.subject }}</code>{% endif %}</td>
<td>{{ a.via }}</td><td>{{ a.detail or "" }}</td></tr>{% endfor %}</tbody></table>
{% else %}<p>No actions recorded{% if before %} before entry {{ before }}{% endif %}.</p>{% endif %}
{% if next_query %}<p><a href="/audit?{{ next_query }}">Older</a></p>{% endif %}
{% endblock %}"""

TEMPLATES = {"principals": _PRINCIPALS, "principal_created": _CREATED, "audit": _AUDIT}
