"""The console's routes: each page and action of :mod:`.auth`, :mod:`.approvals`,
:mod:`.effects`, :mod:`.sagas` and :mod:`.admin` behind :meth:`Console.signed_in
<effectgate.console.app.Console.signed_in>`, as one Starlette app (:func:`build_app`)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ..errors import ConfigError, StoreError
from ..net import loopback_host_names
from . import admin, approvals, auth, effects, sagas
from .app import Console, View

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..gate import Gate

__all__ = ["build_app"]


def build_app(gate: Gate, *, secure_cookies: bool = False, host: str | None = None,
              allow_hosts: Sequence[str] = ()) -> Starlette:
    """The console for ``gate`` as an ASGI app. ``secure_cookies``: mark cookies ``Secure``
    (served over HTTPS, or anywhere but localhost). ``host``: the address it listens on; on a
    loopback address a request whose ``Host`` is not a name of it (another loopback name, any
    port: :func:`effectgate.net.loopback_host_names`) or one of ``allow_hosts`` (the name a
    reverse proxy on this machine passes on) is refused (421), so a web page that DNS-rebinds
    its own name to this address cannot reach the console."""
    extra = [_allowed(name) for name in allow_hosts]
    c = Console(gate, secure_cookies=secure_cookies)
    s = c.signed_in

    def get(path: str, view: View) -> Route:
        return Route(path, s(view), methods=["GET"])

    def post(path: str, view: View) -> Route:
        return Route(path, s(view), methods=["POST"])

    routes = [
        Route("/login", partial(auth.login_page, c), methods=["GET"]),
        Route("/login", partial(auth.login, c), methods=["POST"]),
        post("/logout", auth.logout),
        Route("/console.css", c.css, methods=["GET"]),
        get("/", effects.overview),
        get("/approvals", approvals.listing),
        get("/approvals/{approval_id}", approvals.one),
        post("/approvals/{approval_id}/{verb}", approvals.decide),
        get("/ambiguous", effects.ambiguous),
        get("/effects", effects.search),
        get("/effects/{effect_id}", effects.one),
        get("/effects/{effect_id}/resolve", effects.confirm_resolve),
        post("/effects/{effect_id}/resolve", effects.resolve),
        post("/effects/{effect_id}/reconcile", effects.reconcile),
        get("/groups", sagas.groups),
        get("/groups/view", sagas.group),
        get("/groups/unwind", sagas.confirm_unwind),
        post("/groups/unwind", sagas.unwind),
        get("/principals", admin.principals),
        post("/principals", admin.add_principal),
        get("/principals/created", admin.created),
        post("/principals/revoke", admin.revoke_principal),
        get("/audit", admin.audit),
    ]
    loopback = loopback_host_names(host) if host is not None else ()
    names = (*loopback, *extra) if loopback else ()
    app = Starlette(routes=routes, exception_handlers={StoreError: c.store_failed},
                    middleware=[Middleware(_HostCheck, names=names)] if names else [])
    app.state.console = c
    return app


class _HostCheck:
    """Serves only requests whose ``Host`` (without its port) is one of ``names``."""

    def __init__(self, app: Any, names: tuple[str, ...]) -> None:
        self.app, self.names = app, frozenset(names)
        self.refused = PlainTextResponse(
            "Misdirected request: this console answers only to " + ", ".join(names) + ".",
            status_code=421)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            hosts = [v.decode("latin-1").lower() for k, v in scope["headers"] if k == b"host"]
            if not hosts or any(_name(host) not in self.names for host in hosts):
                await self.refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _name(host: str) -> str:
    """``host`` without its port and a final dot: ``[::1]:8765`` -> ``[::1]``,
    ``localhost.:80`` -> ``localhost``; anything after an IPv6 literal but a port keeps it
    (it matches no name)."""
    if host.startswith("["):
        end = host.find("]") + 1
        name, rest = host[:end], host[end:]
        return name if end and (not rest or rest[0] == ":") else host
    name = host.split(":")[0]
    return name[:-1] if name.endswith(".") and name != "." else name


def _allowed(name: str) -> str:
    """One of ``allow_hosts``, as :func:`_name` compares it; :class:`ConfigError` unless it
    is a host name or address without port, path or spaces."""
    if not isinstance(name, str) or not name or any(
            c in "/\\@?#" or ord(c) < 33 or ord(c) == 127 for c in name):
        raise ConfigError(f"--allow-host takes a host name, not {name!r}")
    found = _name(name.lower())
    if found != name.lower().rstrip(".") or not found:
        raise ConfigError(f"--allow-host takes a host name without a port, not {name!r}")
    return found
