"""The console's ASGI app (Starlette): pages for people, every action through the Gate API.

Sign-in is by an operator's token; the session lives in the store (:mod:`.auth`), so every
console process on it agrees and signing out ends it everywhere; its cookie is HttpOnly,
SameSite=Strict, Secure unless served on localhost over plain HTTP. Each request re-reads the
session with its operator (one indexed read), so a revoked token signs its sessions out at
once. Every form carries a CSRF token; a POST without the right one is refused (403) and
changes nothing. Every form that writes is answered with a redirect (303) to a page to GET,
so reloading never sends it again. Decisions go through :class:`effectgate.principals.Acting`
— the same Gate methods the CLI calls, with the operator's name as ``by`` — so no rule is
written twice; each one that succeeds is appended to the audit (:mod:`effectgate.audit`). The
pages run no script (CSP ``script-src 'none'``); every value on them is shown through
:func:`effectgate.redact.visible` (:mod:`.pages`). A bad query parameter is refused (400)
before the store is asked; a request the store cannot answer gets a 503 page, never a
traceback.

The pages themselves are in :mod:`.auth`, :mod:`.approvals`, :mod:`.effects`,
:mod:`.sagas` and :mod:`.admin`, and their routes in :mod:`.routes`; they build on this
module, which imports none of them.
"""

from __future__ import annotations

import datetime
import hmac
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ..errors import (
    ConfigError,
    EffectGateError,
    Forbidden,
    StoreError,
    Unauthenticated,
    UnknownEffect,
)
from ..principals import OPERATOR, principal_of
from .pages import CSS, render
from .session import Signer, session_id

if TYPE_CHECKING:
    from ..gate import Gate
    from ..principals import Principal

__all__ = [
    "FLASH_COOKIE",
    "SESSION_COOKIE",
    "Console",
    "View",
    "ago",
    "before_of",
    "safe_next",
    "session_operator",
    "session_secret",
    "when",
    "whole",
]

log = logging.getLogger("effectgate")
SESSION_COOKIE = "eg_session"
FLASH_COOKIE = "eg_flash"
_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; style-src 'self'; img-src 'self'; "
                                "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
                                "script-src 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[Request], Awaitable[Response]]
View = Callable[["Console", Request, "Principal"], Awaitable[Response]]


def when(value: datetime.datetime | None) -> str:
    """A time as the pages show it (UTC, to the second)."""
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(seconds: float) -> str:
    """An age in seconds, short (``42s``, ``7m``, ``3h 5m``, ``2d 4h``)."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def safe_next(value: object, default: str = "/") -> str:
    """A local path to go to after an action or signing in (never another site)."""
    if (not isinstance(value, str) or not value.startswith("/") or value.startswith("//")
            or "\\" in value or any(ord(c) < 32 or ord(c) == 127 for c in value)
            or len(value) > 2000):
        return default
    return value


def whole(value: object) -> int | None:
    """A positive id from a path or query parameter; None for anything else."""
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or (
            len(value) > 18):
        return None
    number = int(value)
    return number if number > 0 else None


def before_of(request: Request) -> int | None:
    """A page's ``before=<id>`` cursor; None when absent, refused (:class:`ConfigError`)
    when it is not a positive id."""
    text = request.query_params.get("before")
    if not text:
        return None
    number = whole(text)
    if number is None:
        raise ConfigError("before: not a cursor of this page (a positive id)")
    return number


def _too_big(request: Request) -> bool:
    """A form without a length, or longer than any of the console's forms can be."""
    length = request.headers.get("content-length", "")
    return not length.isdigit() or int(length) > 65536


class Console:
    """The console for one gate (one store and namespace): responses, the signed-in operator
    of a request, and the audit of what it does."""

    def __init__(self, gate: Gate, *, secure_cookies: bool) -> None:
        self.gate = gate
        self.secure = secure_cookies
        self.signer = Signer(gate.store.secret, gate.namespace)

    # -- responses -------------------------------------------------------------------------

    def headers(self, response: Response) -> Response:
        """``response`` with the console's security headers."""
        for name, value in _HEADERS.items():
            response.headers[name] = value
        return response

    def cookie(self, response: Response, name: str, value: str, seconds: int,
               path: str = "/") -> None:
        """Set an HttpOnly, SameSite=Strict cookie (Secure when served so)."""
        response.set_cookie(name, value, max_age=seconds, path=path, httponly=True,
                            samesite="strict", secure=self.secure)

    def forget(self, response: Response, name: str, path: str = "/") -> None:
        """Delete a cookie."""
        response.delete_cookie(name, path=path, httponly=True, samesite="strict",
                               secure=self.secure)

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        """The page ``name``, with the one-shot message a redirect left (then forgotten)."""
        session = request.scope.get("eg_session") or {}
        flash = self.signer.unsign("flash", request.cookies.get(FLASH_COOKIE))
        values: dict[str, Any] = {
            "who": session.get("n"), "namespace": self.gate.namespace,
            "csrf": session.get("c", ""), "flash": flash, "when": when,
            "title": name.capitalize()}
        values.update(context)
        response = HTMLResponse(render(name, **values), status_code=status)
        if flash is not None:
            self.forget(response, FLASH_COOKIE)
        return self.headers(response)

    def redirect(self, where: str, flash: tuple[str, str] | None = None) -> Response:
        """303 to ``where`` (a GET), carrying a one-shot message (kind, text) for it."""
        response = RedirectResponse(where, status_code=303)
        if flash is not None:
            kind, text = flash
            self.cookie(response, FLASH_COOKIE,
                        self.signer.sign("flash", {"kind": kind, "text": text[:600]}, 120), 120)
        return self.headers(response)

    def refuse(self, request: Request, status: int, title: str, message: str,
               link: str | None = None, link_text: str = "") -> Response:
        """A page that says why nothing was done."""
        return self.page(request, "message", status, title=title, message=message,
                         link=link, link_text=link_text)

    async def store_failed(self, request: Request, err: Exception) -> Response:
        """The page for a request the store could not answer (503, logged without the
        store's own text): try again, and check before repeating an action whose write may
        have landed."""
        unknown = isinstance(err, StoreError) and err.outcome_unknown
        log.warning("console: the store failed on %s %s: %s", request.method,
                    request.url.path, err.message if isinstance(err, StoreError)
                    else type(err).__name__)
        response = self.refuse(
            request, 503, "Store unavailable",
            "The store could not answer this request"
            + (": the action may or may not have been recorded; check its page before "
               "repeating it." if unknown else "; nothing was changed. Try again shortly."))
        response.headers["Retry-After"] = "5"
        return response

    # -- who is asking ---------------------------------------------------------------------

    def operator(self, request: Request) -> Principal | None:
        """The signed-in operator, checked against the store; None when there is none."""
        return session_operator(self, request)

    def csrf_ok(self, request: Request, form: Any) -> bool:
        """Whether ``form`` carries the session's CSRF token."""
        session = request.scope.get("eg_session") or {}
        sent, wanted = form.get("csrf_token"), session.get("c")
        return (isinstance(sent, str) and isinstance(wanted, str) and bool(wanted)
                and hmac.compare_digest(sent.encode("utf-8"), wanted.encode("utf-8")))

    def signed_in(self, view: View) -> Handler:
        """A page or action for a signed-in operator: anonymous GETs go to the login page
        (303), anonymous POSTs are refused (401); a POST needs the session's CSRF token."""

        async def handler(request: Request) -> Response:
            who = await run_in_threadpool(self.operator, request)
            if who is None:
                if request.method == "GET":
                    target = request.url.path + (f"?{request.url.query}" if request.url.query
                                                 else "")
                    return self.redirect("/login?" + urllib.parse.urlencode({"next": target}))
                return self.refuse(request, 401, "Sign in first",
                                   "This action needs a signed-in operator.", "/login",
                                   "Sign in")
            if request.method == "POST":
                if _too_big(request):
                    return self.refuse(request, 413, "Refused", "The form is too large.")
                form = await request.form(max_files=0, max_fields=20, max_part_size=65536)
                if not self.csrf_ok(request, form):
                    return self.refuse(request, 403, "Refused",
                                       "CSRF token missing or invalid: nothing was changed.")
                request.scope["eg_form"] = form
            try:
                return await view(self, request, who)
            except Forbidden as err:
                return self.refuse(request, 403, "Refused", err.message)
            except Unauthenticated as err:  # revoked while this request ran
                return self.refuse(request, 401, "Sign in first", err.message, "/login",
                                   "Sign in")
            except (UnknownEffect, ConfigError) as err:  # a bad id or parameter: nothing done
                return self.refuse(request, 404 if isinstance(err, UnknownEffect) else 400,
                                   "Not found" if isinstance(err, UnknownEffect) else "Refused",
                                   err.message)

        return handler

    def form(self, request: Request) -> Any:
        """The checked form of this POST."""
        return request.scope["eg_form"]

    def back(self, request: Request, default: str = "/") -> str:
        """Where this POST's answer goes: its form's ``back`` when that is a local path."""
        form = request.scope.get("eg_form")
        return safe_next(form.get("back") if form is not None else None, default)

    # -- the audit -------------------------------------------------------------------------

    def audit(self, who: str, action: str, *, subject: str | None = None,
              effect_id: int | None = None, detail: str | None = None) -> str:
        """Append what ``who`` just did to the audit; "" when recorded, else a warning for the
        operator (the action happened; only its entry could not be written)."""
        from ..audit import record_action

        try:
            record_action(self.gate, who, action, via="console", subject=subject,
                          effect_id=effect_id, detail=detail)
        except EffectGateError as err:
            log.warning("console: could not append %s by %s to the audit: %s", action, who,
                        err.message)
            return " (warning: this was done, but the audit entry could not be written)"
        return ""

    async def css(self, request: Request) -> Response:
        """The style sheet."""
        response = Response(CSS, media_type="text/css")
        response.headers["Cache-Control"] = "max-age=3600"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def session_secret(console: Console, request: Request) -> str | None:
    """The session secret this request's signed cookie carries, if it is well formed."""
    value = console.signer.unsign("session", request.cookies.get(SESSION_COOKIE))
    secret = None if value is None else value.get("s")
    return secret if isinstance(secret, str) and 20 <= len(secret) <= 100 else None


def session_operator(console: Console, request: Request) -> Principal | None:
    """The operator whose live session this request's cookie names, checked against the
    store (the session not ended or expired, the principal an unrevoked operator of this
    namespace); None otherwise. Sets the request's session (name, CSRF token, id)."""
    from ..store.sessions import session_with_principal

    secret = session_secret(console, request)
    if secret is None:
        return None
    gate = console.gate
    found = session_with_principal(gate.store.engine, session_id(secret))
    if found is None:
        return None
    session, row = found
    if (session.ended_at is not None or session.expires_at <= session.now
            or session.namespace != gate.namespace or row is None
            or row.revoked_at is not None or row.namespace != gate.namespace
            or row.name != session.name or row.role != OPERATOR):
        return None
    request.scope["eg_session"] = {"n": row.name, "id": session.id,
                                   "c": console.signer.derive("csrf", secret)}
    return principal_of(row)
