"""The way through the gateway for everything that is not a gated call: one client's link to
its own upstream session, and the helpers that relay requests, progress and notifications as
they are.

A :class:`Link` is opened for each client connection (on the handshake protocol) with exactly
the client's roots, sampling and elicitation capabilities, and is the upstream's
:class:`~.upstream.Peer`: what the upstream asks or announces rides the stream of the client's
request being answered (on HTTP, that request's SSE response), else the client's standalone
stream.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel

from .stdio import unless_ended
from .upstream import Upstream

try:
    from mcp import types
    from mcp.server.connection import Connection
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import NotificationOptions, Server
    from mcp.server.session import ServerSession
    from mcp.shared.message import ServerMessageMetadata
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.relay needs the mcp package: pip install "effectgate[mcp]"'
    ) from err

__all__ = ["Ctx", "Link", "RelayServer", "UpstreamFactory", "clean_meta", "clean_params",
           "connection_of", "forwarded_capabilities", "progress_relay"]

log = logging.getLogger("effectgate")
R = TypeVar("R", bound=BaseModel)
Ctx = ServerRequestContext[Any, Any]
UpstreamFactory = Callable[[types.ClientCapabilities, Any], Upstream]
"""``factory(capabilities, peer)``: a new, unstarted :class:`Upstream` for one client."""


class Link:
    """One client's path through the gateway: its own upstream session, and the way back to
    the client for what the upstream asks (roots, sampling, elicitation) or announces."""

    def __init__(self, factory: UpstreamFactory, capabilities: types.ClientCapabilities,
                 standalone: ServerSession | None, ended: anyio.Event | None = None) -> None:
        self._standalone = standalone
        self._ended = ended
        self._active: list[Ctx] = []
        self.tools: dict[str, types.Tool] = {}
        self.stale = True
        self.upstream = factory(capabilities, self if standalone is not None else None)

    @contextlib.contextmanager
    def serving(self, ctx: Ctx) -> Iterator[None]:
        """While the client's request ``ctx`` is being answered, the upstream's requests and
        notifications ride its stream (on HTTP: that request's SSE response)."""
        self._active.append(ctx)
        try:
            yield
        finally:
            self._active.remove(ctx)

    def _current(self) -> Ctx | None:
        return next((c for c in reversed(self._active) if c.request_id is not None), None)

    async def request(self, request: types.ServerRequest, result_type: type[R]) -> R:
        """Ask the client what the upstream asks (roots, a sampled message, an elicitation);
        ``ConnectionError`` once the client's input has ended (it can answer nothing more)."""
        ctx = self._current()

        async def send() -> R:
            if ctx is not None:
                meta = ServerMessageMetadata(related_request_id=ctx.request_id)
                return await ctx.session.send_request(request, result_type, metadata=meta)
            assert self._standalone is not None
            return await self._standalone.send_request(request, result_type)

        return await unless_ended(self._ended, send)

    async def notify(self, notification: types.ServerNotification) -> None:
        """Pass the upstream's notification on to the client (a changed tool list also makes
        the gateway list the tools again before its next call)."""
        if isinstance(notification, types.ToolListChangedNotification):
            self.stale = True
        ctx = self._current()
        try:
            if ctx is not None:
                await ctx.session.send_notification(notification, related_request_id=ctx.request_id)
            elif self._standalone is not None:
                await self._standalone.send_notification(notification)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.debug("dropped %s: the client is gone", notification.method)

    def absorb(self, tools: list[types.Tool], *, first_page: bool) -> None:
        """Remember a page of the upstream's tool list."""
        if first_page:
            self.tools = {}
            self.stale = False
        self.tools.update((tool.name, tool) for tool in tools)

    async def tool(self, name: str) -> types.Tool | None:
        """The upstream's tool ``name`` (listing again if the list changed or lacks it)."""
        if self.stale or name not in self.tools:
            self.absorb(await self.upstream.list_tools(), first_page=True)
        return self.tools.get(name)


class RelayServer(Server[Any]):
    """A low-level server that announces the upstream's list-changed notifications (relayed)
    on every transport, including the HTTP session manager's default initialization."""

    notification_options: NotificationOptions | None = None

    def create_initialization_options(
            self, notification_options: NotificationOptions | None = None,
            experimental_capabilities: dict[str, dict[str, Any]] | None = None,
            extensions: dict[str, dict[str, Any]] | None = None) -> Any:
        return super().create_initialization_options(
            notification_options or self.notification_options, experimental_capabilities,
            extensions)


def connection_of(ctx: Ctx) -> Connection | None:
    """The client connection ``ctx`` arrived on, on the handshake protocol (None for a
    2026-07-28 request, which is its own connection). The SDK hands handlers the connection
    only through the session; ``Connection.state`` and ``exit_stack`` are its documented
    per-connection storage and teardown."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None
    connection = getattr(ctx.session, "_connection", None)
    return connection if isinstance(connection, Connection) else None


def forwarded_capabilities(caps: types.ClientCapabilities) -> types.ClientCapabilities:
    """The client capabilities the upstream is told about: roots, sampling, elicitation."""
    return types.ClientCapabilities(roots=caps.roots, sampling=caps.sampling,
                                    elicitation=caps.elicitation)


def clean_meta(meta: Any) -> dict[str, Any] | None:
    """A request's ``_meta`` for the upstream: without the progress token (the gateway relays
    progress under its own) and the reserved ``io.modelcontextprotocol/`` keys."""
    if not meta:
        return None
    kept = {k: v for k, v in dict(meta).items()
            if k != "progress_token" and not k.startswith("io.modelcontextprotocol/")}
    return kept or None


def clean_params(params: Any) -> Any:
    if params is None or not getattr(params, "meta", None):
        return params
    return params.model_copy(update={"meta": clean_meta(params.meta)})


def progress_relay(ctx: Ctx | None) -> Any:
    """A progress callback relaying the upstream's progress to the client, when it asked (on
    2026-07-28 the request's token is not in ``ctx.meta``: the callback is always made, and
    the SDK's ``report_progress`` does nothing for a request that asked for none)."""
    if ctx is None:
        return None
    asked = bool(ctx.meta) and "progress_token" in (ctx.meta or {})
    if not asked and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return None

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await ctx.session.report_progress(progress, total, message)

    return relay
