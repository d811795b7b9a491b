"""The pages about people: principals — list, add (its token shown once), revoke — through
the public Gate API (``add_principal``, ``revoke_principal``, ``list_principals``), and the
audit of operators' actions (:mod:`effectgate.audit`). Only a signed-in operator reaches
them; every form is CSRF-checked and answered with a redirect (303).

The token of a principal just added reaches its page in a one-shot cookie (signed, HttpOnly,
SameSite=Strict, sent only to ``/principals/created``, one minute, deleted when shown): the
add answers with a redirect like every other form, and the token is never in a URL, a log
line, the store or a page that can be loaded twice.
"""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..audit import ACTIONS, list_actions
from ..errors import ConfigError, UnknownEffect
from .app import before_of

if TYPE_CHECKING:
    from ..principals import Principal
    from .app import Console

__all__ = ["add_principal", "audit", "created", "principals", "revoke_principal"]

_TOKEN_COOKIE = "eg_new_token"
_TOKEN_PATH = "/principals/created"
_PAGE = 50


async def principals(c: Console, request: Request, who: Principal) -> Response:
    """Every principal of the namespace, the form to add one, a Revoke button for each."""
    found = await run_in_threadpool(c.gate.list_principals)
    return c.page(request, "principals", title="Principals", principals=found)


async def add_principal(c: Console, request: Request, who: Principal) -> Response:
    """Add a principal; its token goes to the page that shows it once."""
    form = c.form(request)
    name, role = form.get("name"), form.get("role")
    if not role:
        return c.redirect("/principals", ("error", "Refused: choose a role — operator or "
                                                   "agent. Nothing was added."))
    try:
        added, token = await run_in_threadpool(c.gate.add_principal, name, role)
    except ConfigError as err:
        return c.redirect("/principals", ("error", f"Refused: {err.message}"))
    warning = await run_in_threadpool(lambda: c.audit(
        who.name, "principal.add", subject=added.name, detail=f"role {added.role}"))
    response = c.redirect(_TOKEN_PATH, ("error", warning.strip(" ()")) if warning else None)
    c.cookie(response, _TOKEN_COOKIE, c.signer.sign(
        "new token", {"name": added.name, "role": added.role, "token": token}, 60), 60,
        path=_TOKEN_PATH)
    return response


async def created(c: Console, request: Request, who: Principal) -> Response:
    """The token of the principal just added, this once."""
    value = c.signer.unsign("new token", request.cookies.get(_TOKEN_COOKIE))
    shown = value if value is not None and all(
        isinstance(value.get(k), str) for k in ("name", "role", "token")) else {}
    response = c.page(request, "principal_created", title="Principal added",
                      added=shown.get("name", ""), role=shown.get("role", ""),
                      token=shown.get("token", ""))
    c.forget(response, _TOKEN_COOKIE, path=_TOKEN_PATH)
    return response


async def revoke_principal(c: Console, request: Request, who: Principal) -> Response:
    """Revoke a principal (its token and sessions stop working at once)."""
    name = c.form(request).get("name")
    if name == who.name:
        return c.redirect("/principals", (
            "error", "Refused: you cannot revoke yourself here (ask another operator, or use "
                     "effectgate principals revoke)."))
    try:
        done = await run_in_threadpool(c.gate.revoke_principal, name)
    except (ConfigError, UnknownEffect) as err:
        return c.redirect("/principals", ("error", f"Refused: {err.message}"))
    warning = await run_in_threadpool(lambda: c.audit(
        who.name, "principal.revoke", subject=done.name, detail=f"role {done.role}"))
    return c.redirect("/principals", ("ok", f"Revoked {done.name}{warning}"))


async def audit(c: Console, request: Request, who: Principal) -> Response:
    """The audit, newest first: by who, action and subject; paged."""
    q = {name: (request.query_params.get(name) or "").strip()
         for name in ("actor", "action", "subject")}
    if q["action"] and q["action"] not in ACTIONS:
        raise ConfigError(f"action must be one of {', '.join(ACTIONS)}")
    before = before_of(request)
    entries = await run_in_threadpool(lambda: list_actions(
        c.gate, actor=q["actor"] or None, action=q["action"] or None,
        subject=q["subject"] or None, before_id=before, limit=_PAGE))
    next_query = None
    if len(entries) == _PAGE:
        next_query = urllib.parse.urlencode({**{k: v for k, v in q.items() if v},
                                             "before": entries[-1].entry_id})
    return c.page(request, "audit", title="Audit", entries=entries, q=q, actions=ACTIONS,
                  before=before, next_query=next_query)
