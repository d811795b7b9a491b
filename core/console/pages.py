"""The console's page frame: its style sheet, the base template, and rendering (Jinja2,
autoescaped, no scripts at all). The pages themselves are in :mod:`.templates` and
:mod:`.templates_admin`.

Every ``{{ value }}`` passes :func:`effectgate.redact.visible` before it is escaped, so an
invisible or bidirectional character in an argument, a key, an id, a note or an error is
drawn as ``⟨U+202E⟩``, never obeyed — on every page, without a template having to remember.
A value that must reach the page as it is (a form field that has to round-trip, or text
already rendered through ``visible``) is marked with the ``asis`` filter or :class:`AsIs`.
Keys and arguments (``code``, ``pre``) are drawn left to right in their stored order
(``unicode-bidi: bidi-override``), so right-to-left letters cannot reorder them either.
"""

from __future__ import annotations

from typing import Any

import jinja2
from markupsafe import Markup

from ..redact import visible
from .snippets import CSRF

__all__ = ["CSRF", "CSS", "AsIs", "render"]

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
font-size:.9rem;unicode-bidi:isolate}th{background:#eceff3}
pre{margin:0;white-space:pre-wrap;word-break:break-all;font-size:.85rem}
code{font-size:.85rem;word-break:break-all}
code,pre{unicode-bidi:bidi-override;direction:ltr}
form.inline{display:inline-block;margin:.15rem .3rem .15rem 0}
form.search{display:flex;gap:.6rem;flex-wrap:wrap;align-items:end;margin-bottom:.8rem}
input[type=text],input[type=password],select{padding:.25rem;font-size:.9rem}
button{padding:.3rem .7rem;font-size:.9rem;cursor:pointer}
.approve{background:#1f7a3a;color:#fff;border:1px solid #17602d}
.deny,.danger{background:#a8261f;color:#fff;border:1px solid #861d18}
[role=status]{background:#e3f4e8;border:1px solid #1f7a3a;padding:.5rem .8rem;margin:.5rem 0}
[role=alert]{background:#fbe4e2;border:1px solid #a8261f;padding:.5rem .8rem;margin:.5rem 0}
.muted{color:#5b6576;font-size:.85rem}.yes{color:#1f7a3a}.no{color:#a8261f}
.undone{color:#5b6576;text-decoration:line-through}
.cards{display:flex;gap:1rem;flex-wrap:wrap;margin-bottom:1rem}
.card{background:#fff;border:1px solid #d5d9e0;padding:.7rem 1rem;min-width:11rem}
.card b{display:block;font-size:1.4rem}
.confirm{background:#fff;border:2px solid #1d2430;padding:.8rem 1rem;margin:.8rem 0}
.confirm dt{font-weight:bold}.confirm dd{margin:0 0 .5rem 0}
.warning{background:#fff4d6;border:1px solid #a86f00;padding:.5rem .8rem;margin:.5rem 0}
.token{font-size:1.1rem;background:#fff;border:2px dashed #1f7a3a;padding:.6rem;display:block}
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
<a href="/groups">Sagas</a> · <a href="/audit">Audit</a> ·
<a href="/principals">Principals</a></nav>
<span class="who">{{ who }} · namespace <code>{{ namespace }}</code>
<form class="inline" method="post" action="/logout">
""" + CSRF + """
<button type="submit">Sign out</button></form></span></header>{% endif %}
<main>
{% if flash %}<div role="{{ 'alert' if flash.kind == 'error' else 'status' }}">
{{- flash.text }}</div>{% endif %}
{% block body %}{% endblock %}
</main></body></html>
"""


class AsIs(str):
    """Text the page shows exactly as given (still HTML-escaped): a form field that must
    round-trip, or text already rendered through :func:`~effectgate.redact.visible`."""

    __slots__ = ()


def _finalize(value: Any) -> Any:
    if isinstance(value, (AsIs, Markup)) or not isinstance(value, str):
        return value
    return visible(value)


_templates: dict[str, str] = {"base": _BASE}
_env = jinja2.Environment(
    loader=jinja2.FunctionLoader(lambda name: _templates.get(name)),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    finalize=_finalize,
)
_env.filters["asis"] = lambda value: AsIs("" if value is None else str(value))


def _load() -> None:
    if len(_templates) == 1:
        from .templates import TEMPLATES
        from .templates_admin import TEMPLATES as ADMIN

        _templates.update(TEMPLATES)
        _templates.update(ADMIN)


def render(name: str, **context: Any) -> str:
    """The page ``name`` rendered with ``context`` (every value shown visibly and escaped)."""
    _load()
    return _env.get_template(name).render(**context)
