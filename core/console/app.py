"""The console's ASGI app (Starlette): pages for people, every action through the Gate API.

Sign-in is by an operator's token; the session cookie is HttpOnly, SameSite=Strict, Secure
unless served on localhost over plain HTTP, and signed with a key derived from the store's
secret. Each request re-reads the operator (one indexed read), so a revoked token signs its
sessions out at once. Every form carries a CSRF token; a POST without the right one is refused
(403) and changes nothing. Decisions go through :class:`effectgate.principals.Acting` — the
same Gate methods the CLI calls, with the operator's name as ``by`` — so no rule is written
twice. The pages run no script (CSP ``script-src 'none'``).
"""

from __future__ import annotations

import datetime
import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from ..errors import ConfigError, EffectGateError, Forbidden, Unauthenticated, UnknownEffect
from ..governance import dollars
from ..principals import OPERATOR, Principal, authenticate_row, principal_of
from ..states import ApprovalState, State
from .pages import CSS, render
from .session import SESSION_SECONDS, Signer, new_csrf

if TYPE_CHECKING:
    from ..gate import Gate
    from ..records import ApprovalRecord, EffectRecord

__all__ = ["SESSION_COOKIE", "Console", "build_app"]

SESSION_COOKIE = "eg_session"
_LOGIN_COOKIE = "eg_login"
_FLASH_COOKIE = "eg_flash"
_PAGE = 50
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


def _when(value: datetime.datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def _safe_next(value: object) -> str:
    """A local path to go to after signing in (never another site)."""
    if (not isinstance(value, str) or not value.startswith("/") or value.startswith("//")
            or "\\" in value or any(ord(c) < 32 for c in value) or len(value) > 2000):
        return "/"
    return value


class Console:
    """The console for one gate (one store and namespace)."""

    def __init__(self, gate: Gate, *, secure_cookies: bool) -> None:
        self.gate = gate
        self.secure = secure_cookies
        self.signer = Signer(gate.store.secret, gate.namespace)

    # -- responses -------------------------------------------------------------------------

    def _headers(self, response: Response) -> Response:
        for name, value in _HEADERS.items():
            response.headers[name] = value
        return response

    def _cookie(self, response: Response, name: str, value: str, seconds: int,
                path: str = "/") -> None:
        response.set_cookie(name, value, max_age=seconds, path=path, httponly=True,
                            samesite="strict", secure=self.secure)

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        session = request.scope.get("eg_session") or {}
        flash = self.signer.unsign("flash", request.cookies.get(_FLASH_COOKIE))
        values: dict[str, Any] = {
            "who": session.get("n"), "namespace": self.gate.namespace,
            "csrf": session.get("c", ""), "flash": flash, "when": _when,
            "title": name.capitalize()}
        values.update(context)
        html = render(name, **values)
        response = HTMLResponse(html, status_code=status)
        if flash is not None:
            response.delete_cookie(_FLASH_COOKIE, path="/", httponly=True, samesite="strict",
                                   secure=self.secure)
        return self._headers(response)

    def redirect(self, where: str, flash: tuple[str, str] | None = None) -> Response:
        response = RedirectResponse(where, status_code=303)
        if flash is not None:
            kind, text = flash
            self._cookie(response, _FLASH_COOKIE,
                         self.signer.sign("flash", {"kind": kind, "text": text[:600]}, 120), 120)
        return self._headers(response)

    def refuse(self, request: Request, status: int, title: str, message: str,
               link: str | None = None, link_text: str = "") -> Response:
        return self.page(request, "message", status, title=title, message=message,
                         link=link, link_text=link_text)

    # -- the operator of a request ---------------------------------------------------------

    def operator(self, request: Request) -> Principal | None:
        """The signed-in operator, checked against the store; None when there is none."""
        session = self.signer.unsign("session", request.cookies.get(SESSION_COOKIE))
        if session is None or not isinstance(session.get("t"), str):
            return None
        from ..store.principals import principal_by_token_id

        row = principal_by_token_id(self.gate.store.engine, session["t"])
        if (row is None or row.revoked_at is not None or row.namespace != self.gate.namespace
                or row.name != session.get("n") or row.role != OPERATOR):
            return None
        request.scope["eg_session"] = session
        return principal_of(row)

    def csrf_ok(self, request: Request, form: Any) -> bool:
        import hmac

        session = request.scope.get("eg_session") or {}
        sent, wanted = form.get("csrf_token"), session.get("c")
        return (isinstance(sent, str) and isinstance(wanted, str) and bool(wanted)
                and hmac.compare_digest(sent.encode("utf-8"), wanted.encode("utf-8")))

    def signed_in(self, fn: Callable[[Request, Principal], Awaitable[Response]]) -> Handler:
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
                return await fn(request, who)
            except (UnknownEffect, ConfigError) as err:
                return self.refuse(request, 404 if isinstance(err, UnknownEffect) else 400,
                                   "Not found" if isinstance(err, UnknownEffect) else "Refused",
                                   err.message)

        return handler

    # -- sign in / out ---------------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        nonce = new_csrf()
        response = self.page(request, "login", title="Sign in", login_nonce=nonce,
                             next=_safe_next(request.query_params.get("next", "/")))
        self._cookie(response, _LOGIN_COOKIE, self.signer.sign("login", {"c": nonce}, 900),
                     900, path="/login")
        return response

    async def login(self, request: Request) -> Response:
        import hmac

        if _too_big(request):
            return self.refuse(request, 413, "Refused", "The form is too large.")
        form = await request.form(max_files=0, max_fields=5, max_part_size=8192)
        nonce = self.signer.unsign("login", request.cookies.get(_LOGIN_COOKIE))
        sent = form.get("csrf_token")
        if nonce is None or not isinstance(sent, str) or not hmac.compare_digest(
                sent.encode("utf-8"), str(nonce.get("c", "")).encode("utf-8")):
            return self.refuse(request, 403, "Refused",
                               "CSRF token missing or invalid: reload the sign-in page.",
                               "/login", "Sign in")
        token = form.get("token")
        try:
            row = await run_in_threadpool(authenticate_row, self.gate, token)
        except Unauthenticated:
            response = self.page(request, "login", 401, title="Sign in",
                                 login_nonce=nonce["c"], next=_safe_next(form.get("next")),
                                 flash={"kind": "error", "text": "Invalid or revoked token."})
            return response
        if row.role != OPERATOR:
            return self.refuse(request, 403, "Refused",
                               f"{row.name} is an {row.role}: only operators sign in here.",
                               "/login", "Sign in")
        response = self.redirect(_safe_next(form.get("next")))
        self._cookie(response, SESSION_COOKIE, self.signer.sign(
            "session", {"t": row.token_id, "n": row.name, "c": new_csrf()}, SESSION_SECONDS),
            SESSION_SECONDS)
        response.delete_cookie(_LOGIN_COOKIE, path="/login", httponly=True, samesite="strict",
                               secure=self.secure)
        return response

    async def logout(self, request: Request, who: Principal) -> Response:
        response = self.redirect("/login")
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                               secure=self.secure)
        return response

    # -- pages -----------------------------------------------------------------------------

    async def overview(self, request: Request, who: Principal) -> Response:
        from ..store.queue import oldest_ambiguous, pending_approvals, spend_counters

        gate = self.gate
        counts = await run_in_threadpool(gate.count_by_state)
        oldest = await run_in_threadpool(oldest_ambiguous, gate.store.engine, gate.namespace)
        _, pending = await run_in_threadpool(pending_approvals, gate.store.engine,
                                             gate.namespace, 1)
        spend = await run_in_threadpool(spend_counters, gate.store.engine, gate.namespace)
        return self.page(
            request, "overview", title="Overview",
            counts={s.value: counts.get(s, 0) for s in State},
            oldest=None if oldest is None else _ago(oldest),
            pending=pending,
            spend=[{"scope": k, "spent": dollars(v), "updated": _when(
                datetime.datetime.fromtimestamp(at, datetime.UTC))} for k, v, at in spend])

    def _approval_view(self, a: ApprovalRecord) -> dict[str, Any]:
        args = a.arguments
        return {
            "approval_id": a.approval_id, "effect_id": a.effect_id,
            "effect_type": a.effect_type, "key": a.key, "payload_hash": a.payload_hash,
            "arguments_text": ("(cleared once decided)" if args is None
                               else json.dumps(args, indent=2, ensure_ascii=False,
                                               sort_keys=True)),
            "requested_by": a.requested_by,
            "cost": "" if a.estimated_cost_micros is None else dollars(a.estimated_cost_micros),
            "expires": _when(a.expires_at), "state": a.state.value,
            "pending": a.state is ApprovalState.PENDING, "decided_by": a.decided_by,
            "reason": a.reason,
        }

    async def approvals(self, request: Request, who: Principal) -> Response:
        from ..store.queue import pending_approvals
        from ..translate import approval_record

        found, total = await run_in_threadpool(pending_approvals, self.gate.store.engine,
                                               self.gate.namespace, 200)
        return self.page(request, "approvals", title="Approvals", total=total,
                         approvals=[self._approval_view(approval_record(r)) for r in found])

    async def approval(self, request: Request, who: Principal) -> Response:
        approval_id = request.path_params["approval_id"]
        record = await run_in_threadpool(self.gate.approval, approval_id)
        return self.page(request, "approval", title=f"Approval {approval_id}",
                         a=self._approval_view(record))

    async def decide(self, request: Request, who: Principal) -> Response:
        approval_id = request.path_params["approval_id"]
        verb = request.path_params["verb"]
        form = request.scope["eg_form"]
        acting = self.gate.acting_as(who)
        back = "/approvals"
        try:
            if verb == "approve":
                record = await run_in_threadpool(acting.approve, approval_id)
                text = f"Approved: {record.key}"
            elif verb == "deny":
                reason = form.get("reason") or None
                record = await run_in_threadpool(lambda: acting.deny(approval_id,
                                                                      reason=reason))
                text = f"Denied: {record.key}"
            else:
                return self.refuse(request, 404, "Not found", "no such action")
        except Forbidden as err:
            return self.refuse(request, 403, "Refused", err.message)
        except (UnknownEffect, ConfigError):
            raise
        except EffectGateError as err:
            return self.redirect(back, ("error", f"Refused: {err.message}"))
        return self.redirect(back, ("ok", text))

    async def ambiguous(self, request: Request, who: Principal) -> Response:
        before = _int(request.query_params.get("before"))
        found, cursor = await run_in_threadpool(
            lambda: self.gate.ambiguous_queue(before_id=before, limit=_PAGE))
        now = datetime.datetime.now(datetime.UTC)

        def age(e: EffectRecord) -> str:
            since = e.lease_expires_at if e.lease_lapsed and e.lease_expires_at else e.updated_at
            return _ago((now - since).total_seconds())

        return self.page(request, "ambiguous", title="Ambiguous", effects=found,
                         next_before=cursor, before=before, age=age)

    async def effects(self, request: Request, who: Principal) -> Response:
        q = {name: (request.query_params.get(name) or "").strip()
             for name in ("key", "type", "state", "run", "agent")}
        before = _int(request.query_params.get("before"))
        found = await run_in_threadpool(lambda: self.gate.list_effects(
            key_prefix=q["key"] or None, effect_type=q["type"] or None,
            state=q["state"] or None, run_id=q["run"] or None, agent_id=q["agent"] or None,
            limit=_PAGE, before_id=before))
        cursor = found[-1].effect_id if len(found) == _PAGE else None
        next_query = urllib.parse.urlencode({**{k: v for k, v in q.items() if v},
                                             "before": cursor or ""})
        return self.page(request, "effects", title="Effects", effects=found, q=q,
                         states=[s.value for s in State], next_before=cursor,
                         next_query=next_query)

    async def effect(self, request: Request, who: Principal) -> Response:
        record = await run_in_threadpool(self.gate.get_by_id,
                                         _int(request.path_params["effect_id"]) or 0)
        shown = record.as_dict()
        fields = [(k, "" if v is None else (json.dumps(v, ensure_ascii=False)
                                            if isinstance(v, (dict, list)) else v))
                  for k, v in shown.items() if k not in ("history", "effect_id")]
        return self.page(request, "effect", title=f"Effect #{record.effect_id}", e=record,
                         fields=fields)

    async def settle(self, request: Request, who: Principal) -> Response:
        effect_id = _int(request.path_params["effect_id"]) or 0
        verb = request.path_params["verb"]
        form = request.scope["eg_form"]
        acting = self.gate.acting_as(who)
        record = await run_in_threadpool(self.gate.get_by_id, effect_id)
        back = str(form.get("back") or f"/effects/{effect_id}")
        back = _safe_next(back)
        try:
            if verb == "resolve":
                outcome = form.get("outcome")
                note = form.get("note") or None
                done = await run_in_threadpool(
                    lambda: acting.resolve(record.key, str(outcome), note=note))
                text = f"Resolved {done.key}: {done.state.value}"
            elif verb == "reconcile":
                done = await run_in_threadpool(acting.reconcile, record.key)
                text = (f"Reconciled {done.key}: {done.state.value}"
                        if done.state is not State.AMBIGUOUS
                        else f"The reconcile hook could not tell: {done.key} stays ambiguous")
            else:
                return self.refuse(request, 404, "Not found", "no such action")
        except Forbidden as err:
            return self.refuse(request, 403, "Refused", err.message)
        except EffectGateError as err:
            return self.redirect(back, ("error", f"Refused: {err.message}"))
        return self.redirect(back, ("ok", text))

    async def groups(self, request: Request, who: Principal) -> Response:
        recent = await run_in_threadpool(lambda: self.gate.list_effects(limit=500))
        seen: list[str] = []
        for e in recent:
            if e.group_key and e.group_key not in seen:
                seen.append(e.group_key)
        return self.page(request, "groups", title="Sagas", groups=seen[:100])

    async def group(self, request: Request, who: Principal) -> Response:
        group = request.query_params.get("group") or ""
        steps = await run_in_threadpool(self.gate.group_steps, group)
        return self.page(request, "group", title=f"Saga {group}", group=group, effects=steps,
                         report=None)

    async def unwind(self, request: Request, who: Principal) -> Response:
        form = request.scope["eg_form"]
        group = str(form.get("group") or "")
        acting = self.gate.acting_as(who)
        try:
            report = await run_in_threadpool(acting.unwind, group)
        except Forbidden as err:
            return self.refuse(request, 403, "Refused", err.message)
        steps = await run_in_threadpool(self.gate.group_steps, group)
        rows = [(name, s) for name in ("compensated", "unresolved", "irreversible", "failed",
                                       "skipped") for s in getattr(report, name)]
        flash = (f"Unwound {group}: {len(report.compensated)} compensated"
                 + ("" if report.complete else "; some steps are left (see below)"))
        return self.page(request, "group", title=f"Saga {group}", group=group, effects=steps,
                         report=rows, flash={"kind": "ok" if report.complete else "error",
                                             "text": flash})

    async def css(self, request: Request) -> Response:
        response = Response(CSS, media_type="text/css")
        response.headers["Cache-Control"] = "max-age=3600"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def _too_big(request: Request) -> bool:
    """A form without a length, or longer than any of the console's forms can be."""
    length = request.headers.get("content-length", "")
    return not length.isdigit() or int(length) > 65536


def _int(value: object) -> int | None:
    if not isinstance(value, str) or not value.isdigit() or len(value) > 18:
        return None
    number = int(value)
    return number if number > 0 else None


def build_app(gate: Gate, *, secure_cookies: bool = False) -> Starlette:
    """The console for ``gate`` as an ASGI app. ``secure_cookies``: mark cookies ``Secure``
    (served over HTTPS, or anywhere but localhost)."""
    c = Console(gate, secure_cookies=secure_cookies)
    s = c.signed_in
    routes = [
        Route("/login", c.login_page, methods=["GET"]),
        Route("/login", c.login, methods=["POST"]),
        Route("/logout", s(c.logout), methods=["POST"]),
        Route("/console.css", c.css, methods=["GET"]),
        Route("/", s(c.overview), methods=["GET"]),
        Route("/approvals", s(c.approvals), methods=["GET"]),
        Route("/approvals/{approval_id}", s(c.approval), methods=["GET"]),
        Route("/approvals/{approval_id}/{verb}", s(c.decide), methods=["POST"]),
        Route("/ambiguous", s(c.ambiguous), methods=["GET"]),
        Route("/effects", s(c.effects), methods=["GET"]),
        Route("/effects/{effect_id}", s(c.effect), methods=["GET"]),
        Route("/effects/{effect_id}/{verb}", s(c.settle), methods=["POST"]),
        Route("/groups", s(c.groups), methods=["GET"]),
        Route("/groups/view", s(c.group), methods=["GET"]),
        Route("/groups/unwind", s(c.unwind), methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.console = c
    return app
