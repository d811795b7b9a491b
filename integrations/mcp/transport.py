"""Serving an MCP server over streamable HTTP: where it may listen, and the seam where
authentication plugs in.

A server listens on a loopback address (``127.0.0.1``, ``::1``, ``localhost``) unless
``allow_remote`` is set: until bearer-token authentication of agent principals exists, anyone
who can reach the port can act through it. ``guard`` is that seam: a function that wraps the
ASGI app (e.g. refusing a request without a valid ``Authorization: Bearer`` token of an agent
principal); with a guard the remote bind is the guard's responsibility.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import effectgate as eg

if TYPE_CHECKING:
    from starlette.types import ASGIApp

__all__ = ["HttpGuard", "check_bind", "is_loopback", "listen", "serve_http"]

HttpGuard = Callable[["ASGIApp"], "ASGIApp"]
"""Wraps the HTTP app with authentication (the operators issue's bearer tokens plug in here)."""

MCP_PATH = "/mcp"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise eg.ConfigError(f"cannot resolve --host {host!r}: {err}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        sock.close()
        raise eg.ConfigError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://host:port/mcp`` of a listening socket."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{MCP_PATH}"


async def serve_http(app: Any, sock: socket.socket, *, what: str, out: TextIO,
                     guard: HttpGuard | None = None) -> None:
    """Serve ``app`` (the MCP Starlette app) on ``sock`` until cancelled; print where."""
    import uvicorn

    if guard is not None:
        app = guard(app)
    print(f"effectgate: {what} listening on {url_of(sock)} (streamable HTTP)", file=out,
          flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    await server.serve(sockets=[sock])
