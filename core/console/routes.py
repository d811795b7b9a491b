"""The console's routes: each page and action of :mod:`.auth`, :mod:`.approvals`,
:mod:`.effects`, :mod:`.sagas` and :mod:`.admin` behind :meth:`Console.signed_in
<effectgate.console.app.Console.signed_in>`, as one Starlette app (:func:`build_app`)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.routing import Route

from ..errors import StoreError
from . import admin, approvals, auth, effects, sagas
from .app import Console, View

if TYPE_CHECKING:
    from ..gate import Gate

__all__ = ["build_app"]


def build_app(gate: Gate, *, secure_cookies: bool = False) -> Starlette:
    """The console for ``gate`` as an ASGI app. ``secure_cookies``: mark cookies ``Secure``
    (served over HTTPS, or anywhere but localhost)."""
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
        post("/groups/unwind", sagas.unwind),
        get("/principals", admin.principals),
        post("/principals", admin.add_principal),
        get("/principals/created", admin.created),
        post("/principals/revoke", admin.revoke_principal),
        get("/audit", admin.audit),
    ]
    app = Starlette(routes=routes, exception_handlers={StoreError: c.store_failed})
    app.state.console = c
    return app
