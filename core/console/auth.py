"""Signing in and out of the console, and the operator of a request.

A session lives in the store (``effectgate_sessions``), not in its cookie: the cookie carries
a random secret (signed for this store and namespace), the store the secret's SHA-256, the
operator's token id and name, and when the session ends. Every request reads the session
with its principal (one read of two primary keys): a session that ended (signed out),
expired, or whose principal was revoked is refused — by every console process on the store,
since they all read the same row. Signing out ends the row, so a copied cookie is refused
afterwards. A new session (and secret) is made at every sign-in.

The login form carries its own CSRF nonce in a separate signed cookie (``path=/login``): an
anonymous page never writes the session cookie, so a cross-site link that arrives without it
(SameSite=Strict) cannot sign anyone out.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..errors import EffectGateError, Unauthenticated
from ..principals import OPERATOR, authenticate_row
from .app import SESSION_COOKIE, safe_next, session_operator, session_secret
from .session import SESSION_SECONDS, new_csrf, new_session_secret, session_id

if TYPE_CHECKING:
    from ..principals import Principal
    from .app import Console

__all__ = ["LOGIN_COOKIE", "login", "login_page", "logout", "session_operator"]

LOGIN_COOKIE = "eg_login"


async def login_page(console: Console, request: Request) -> Response:
    """The sign-in form (its CSRF nonce in its own cookie)."""
    nonce = new_csrf()
    response = console.page(request, "login", title="Sign in", login_nonce=nonce,
                            next=safe_next(request.query_params.get("next", "/")))
    console.cookie(response, LOGIN_COOKIE, console.signer.sign("login", {"c": nonce}, 900),
                   900, path="/login")
    return response


async def login(console: Console, request: Request) -> Response:
    """Check the token; an operator gets a new session in the store and its cookie."""
    from ..store.sessions import end_session, insert_session, purge_sessions

    length = request.headers.get("content-length", "")
    if not length.isdigit() or int(length) > 65536:
        return console.refuse(request, 413, "Refused", "The form is too large.")
    form = await request.form(max_files=0, max_fields=5, max_part_size=8192)
    nonce = console.signer.unsign("login", request.cookies.get(LOGIN_COOKIE))
    sent = form.get("csrf_token")
    if nonce is None or not isinstance(sent, str) or not hmac.compare_digest(
            sent.encode("utf-8"), str(nonce.get("c", "")).encode("utf-8")):
        return console.refuse(request, 403, "Refused",
                              "CSRF token missing or invalid: reload the sign-in page.",
                              "/login", "Sign in")
    gate = console.gate
    try:
        row = await run_in_threadpool(authenticate_row, gate, form.get("token"))
    except Unauthenticated:
        return console.page(request, "login", 401, title="Sign in", login_nonce=nonce["c"],
                            next=safe_next(form.get("next")),
                            flash={"kind": "error", "text": "Invalid or revoked token."})
    if row.role != OPERATOR:
        return console.refuse(request, 403, "Refused",
                              f"{row.name} is an {row.role}: only operators sign in here.",
                              "/login", "Sign in")
    old = session_secret(console, request)
    secret = new_session_secret()

    def start() -> None:
        if old is not None:  # signing in again ends the session this browser had
            end_session(gate.store.engine, session_id(old))
        purge_sessions(gate.store.engine, gate.namespace)
        insert_session(gate.store.engine, session_id=session_id(secret),
                       namespace=gate.namespace, token_id=row.token_id, name=row.name,
                       seconds=SESSION_SECONDS)

    await run_in_threadpool(start)
    warning = await run_in_threadpool(console.audit, row.name, "login")
    response = console.redirect(safe_next(form.get("next")),
                                ("error", warning.strip(" ()")) if warning else None)
    console.cookie(response, SESSION_COOKIE,
                   console.signer.sign("session", {"s": secret}, SESSION_SECONDS),
                   SESSION_SECONDS)
    console.forget(response, LOGIN_COOKIE, path="/login")
    return response


async def logout(console: Console, request: Request, who: Principal) -> Response:
    """End the session in the store (a copy of its cookie is refused from now on) and
    forget the cookie."""
    from ..store.sessions import end_session

    session = request.scope.get("eg_session") or {}
    ident = session.get("id")
    try:
        if isinstance(ident, str):
            await run_in_threadpool(end_session, console.gate.store.engine, ident)
    except EffectGateError as err:
        return console.refuse(request, 503, "Not signed out",
                              f"The session could not be ended: {err.message}. Try again.")
    await run_in_threadpool(console.audit, who.name, "logout")
    response = console.redirect("/login", ("ok", "Signed out."))
    console.forget(response, SESSION_COOKIE)
    return response
