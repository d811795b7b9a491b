"""Serving an MCP server over streamable HTTP: where it may listen, and who may call it.

A server listens on a loopback address (``127.0.0.1``, ``::1``, ``localhost``) unless
``allow_remote`` is set. ``guard`` wraps the ASGI app; :func:`bearer_guard` is the one
effectgate ships: every request needs ``Authorization: Bearer <token>`` of an *agent*
principal of the gate's namespace (``effectgate principals add NAME --role agent``), else 401
(403 for an operator's token). The principal rides in a context variable into the tools
(:func:`caller`), which then act only for it: ``begin_effect`` records it as the agent,
``report_effect`` and ``extend_lease`` are refused on an effect another agent began, and
``resolve_effect`` and ``unwind_group`` are an operator's acts, refused to agents. An MCP
session is bound to the principal that opened it: another token cannot read or post to it.
"""

from __future__ import annotations

import contextvars
import json
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import effectgate as eg
from effectgate.net import is_loopback, listen
from effectgate.principals import AGENT, Principal, require_holder, require_operator

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "HttpGuard", "agent_for", "bearer_guard", "caller", "check_bind", "http_auth", "is_loopback",
    "listen", "operator_only", "require_holds", "serve_http",
]

HttpGuard = Callable[["ASGIApp"], "ASGIApp"]
"""Wraps the HTTP app with authentication (the operators issue's bearer tokens plug in here)."""

MCP_PATH = "/mcp"


def check_bind(host: str, port: int, *, allow_remote: bool = False,
               guard: HttpGuard | None = None) -> None:
    """Raise :class:`~effectgate.ConfigError` for an address this server must not listen on:
    a bad port, or an address off this machine without ``allow_remote`` or a ``guard``."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise eg.ConfigError(f"--port must be 0..65535, not {port!r}")
    if not isinstance(host, str) or not host.strip() or any(ord(c) < 33 for c in host):
        raise eg.ConfigError(f"--host must be an address or a host name, not {host!r}")
    if not is_loopback(host) and not allow_remote and guard is None:
        raise eg.ConfigError(
            f"refusing to listen on {host!r}: off localhost anyone who can reach the port could "
            "act through this server, and it has no authentication yet. Listen on 127.0.0.1, "
            "or pass --allow-remote if a network boundary you trust protects it.")


def url_of(sock: socket.socket) -> str:
    """``http://host:port/mcp`` of a listening socket."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{MCP_PATH}"


_caller: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "effectgate_mcp_caller", default=None)


def caller() -> Principal | None:
    """The agent principal of the HTTP request being served (None without authentication:
    stdio, or ``--no-auth``)."""
    return _caller.get()


def agent_for(agent_id: str | None) -> str | None:
    """The agent id a ``begin`` records: the authenticated agent's name (an ``agent_id`` naming
    anyone else is :class:`~effectgate.Forbidden`), else what the caller said."""
    who = caller()
    if who is None:
        return agent_id
    if agent_id is not None and agent_id != who.name:
        raise eg.Forbidden(f"{who.name} may not begin effects as {agent_id!r}",
                           reason="agent_id is not the caller")
    return who.name


async def require_holds(gate: eg.Gate, key: str, what: str) -> None:
    """:class:`~effectgate.Forbidden` unless the authenticated agent began ``key`` (nothing to
    check without authentication; the lease proof is checked by the gate either way)."""
    who = caller()
    if who is None:
        return
    record = await gate.aget(key)
    require_holder(who, record, what)


def operator_only(what: str) -> None:
    """:class:`~effectgate.Forbidden` when an authenticated agent asks for an operator's act."""
    who = caller()
    if who is not None:
        require_operator(who, what)


def http_auth(gate: eg.Gate, host: str, *, auth: bool, guard: HttpGuard | None,
              what: str) -> tuple[HttpGuard | None, str]:
    """The guard an HTTP server on ``host`` runs behind, and how its start line says it
    authenticates: bearer tokens of agent principals (:func:`bearer_guard`) unless ``auth``
    is False, which only a loopback address may use (:class:`~effectgate.ConfigError`), or
    the caller's own ``guard``. ``what``: what any client could do without it."""
    if not auth and not is_loopback(host):
        raise eg.ConfigError(f"--no-auth only on localhost: off it, any client could {what}")
    if not auth:
        return guard, "off (--no-auth, localhost only)"
    if guard is not None:
        return guard, "your guard"
    return bearer_guard(gate), "bearer tokens of agent principals"


def bearer_guard(gate: eg.Gate) -> HttpGuard:
    """A guard that admits only requests bearing a token of an agent principal of ``gate``'s
    namespace (one indexed read per request; revocation is seen at once), and keeps each MCP
    session to the principal that opened it."""
    import anyio.to_thread

    owners: dict[str, str] = {}

    def wrap(app: ASGIApp) -> ASGIApp:
        async def refuse(send: Send, status: int, message: str) -> None:
            body = json.dumps({"error": "Unauthenticated" if status == 401 else "Forbidden",
                               "message": message}).encode("utf-8")
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode("ascii"))]
            if status == 401:
                headers.append((b"www-authenticate", b'Bearer realm="effectgate"'))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers = {k.lower(): v for k, v in scope.get("headers", [])}
            raw = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, token = raw.partition(" ")
            try:
                if scheme.lower() != "bearer":
                    raise eg.Unauthenticated("a bearer token is required")
                who = await anyio.to_thread.run_sync(gate.authenticate, token.strip())
            except eg.Unauthenticated:
                await refuse(send, 401, "a bearer token of an agent principal is required "
                             "(effectgate principals add NAME --role agent)")
                return
            if who.role != AGENT:
                await refuse(send, 403, f"{who.name} is an {who.role}: MCP is for agents")
                return
            session = headers.get(b"mcp-session-id", b"").decode("latin-1")
            if session and owners.get(session, who.name) != who.name:
                await refuse(send, 403, "this MCP session belongs to another principal")
                return

            async def remember(message: Message) -> None:
                if message["type"] == "http.response.start":
                    for name, value in message.get("headers", []):
                        if name.lower() == b"mcp-session-id":
                            owners.setdefault(value.decode("latin-1"), who.name)
                            while len(owners) > 100_000:  # bounded: the oldest go first
                                owners.pop(next(iter(owners)))
                await send(message)

            reset = _caller.set(who)
            try:
                await app(scope, receive, remember)
            finally:
                _caller.reset(reset)

        return guarded

    return wrap


async def serve_http(app: Any, sock: socket.socket, *, what: str, out: TextIO,
                     guard: HttpGuard | None = None, auth: str | None = None) -> None:
    """Serve ``app`` (the MCP Starlette app) on ``sock`` until cancelled; print where, and
    whether (and how) requests are authenticated."""
    import uvicorn

    if guard is not None:
        app = guard(app)
    said = f"; auth: {auth}" if auth else ""
    print(f"effectgate: {what} listening on {url_of(sock)} (streamable HTTP{said})", file=out,
          flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    await server.serve(sockets=[sock])
