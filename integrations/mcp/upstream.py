"""One connection to an upstream MCP server (a stdio command or a streamable HTTP URL), held
by its own task and re-opened when it drops.

The connection declares the capabilities of the client it stands for (roots, sampling,
elicitation: exactly what that client declared, so the upstream behaves as it would for the
client directly) and hands whatever the upstream asks or announces to a :class:`Peer`: its
``roots/list``, ``sampling/createMessage`` and ``elicitation/create`` requests, and its
notifications (log messages, list changes, resource updates).

:meth:`Upstream.ready` is what the gateway calls just before sending a gated call: it proves the
upstream is there (a ping, or a fresh connection) and raises :class:`~effectgate.NotExecuted`
when it is not, because then the call was never sent. Anything that goes wrong after the call
is sent is left to the caller to treat as AMBIGUOUS.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import urllib.parse
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TextIO, TypeVar

import anyio
import anyio.abc
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

import effectgate as eg

try:
    from mcp import ClientSession, StdioServerParameters, types
    from mcp.client.session import ClientRequestContext
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.upstream needs the mcp package: pip install "effectgate[mcp]"'
    ) from err

__all__ = ["ALL_CAPABILITIES", "Peer", "StartupPeer", "Upstream", "redacted"]

log = logging.getLogger("effectgate")
R = TypeVar("R", bound=BaseModel)
_SAMPLED: TypeAdapter[types.CreateMessageResult | types.CreateMessageResultWithTools] = (
    TypeAdapter(types.CreateMessageResult | types.CreateMessageResultWithTools))

ALL_CAPABILITIES = types.ClientCapabilities(
    roots=types.RootsCapability(list_changed=True), sampling=types.SamplingCapability(),
    elicitation=types.ElicitationCapability(form=types.FormElicitationCapability(),
                                            url=types.UrlElicitationCapability()))
"""Every client capability a gateway forwards (what a start-up probe declares)."""


class Peer(Protocol):
    """Where an upstream's own requests and notifications go (the client behind the gateway)."""

    async def request(self, request: types.ServerRequest, result_type: type[R]) -> R:
        """Send ``request`` to the client and return its answer; ``MCPError`` if it refuses."""
        ...

    async def notify(self, notification: types.ServerNotification) -> None:
        """Pass ``notification`` on to the client (best effort)."""
        ...


class StartupPeer:
    """The client of a start-up probe (no person behind it): no roots, and sampling or
    elicitation refused."""

    async def request(self, request: types.ServerRequest, result_type: type[R]) -> R:
        """An empty roots list; any other request refused."""
        if isinstance(request, types.ListRootsRequest):
            return result_type.model_validate({"roots": []})
        raise MCPError(types.INVALID_REQUEST, "effectgate is probing the server; no client yet")

    async def notify(self, notification: types.ServerNotification) -> None:
        """Dropped."""


class _Session(ClientSession):
    """A client session that declares exactly the capabilities it is given."""

    def __init__(self, *args: Any, capabilities: types.ClientCapabilities, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._forwarded = capabilities

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        return self._forwarded


class Upstream:
    """The upstream MCP server named by ``target``: a command line (run over stdio, with this
    process's environment plus ``env``) or an ``http(s)://`` URL (streamable HTTP).

    ``capabilities`` are declared to the upstream as the client's own (default: none);
    ``peer`` receives what the upstream asks and announces (default: requests refused,
    notifications dropped)."""

    def __init__(self, target: str, *, env: dict[str, str] | None = None,
                 errlog: TextIO | None = None, connect_timeout: float = 30.0,
                 ping_timeout: float = 10.0,
                 capabilities: types.ClientCapabilities | None = None,
                 peer: Peer | None = None) -> None:
        if not isinstance(target, str) or not target.strip():
            raise eg.ConfigError("the upstream is empty: give a command or an http(s) URL")
        if "\x00" in target:
            raise eg.ConfigError("the upstream command or URL contains a NUL character")
        self.target = target.strip()
        self.is_http = self.target.startswith(("http://", "https://"))
        if not self.is_http:
            try:
                argv = shlex.split(self.target)
            except ValueError as err:
                raise eg.ConfigError(f"cannot parse the upstream command: {err}") from None
            if not argv:
                raise eg.ConfigError("the upstream command is empty")
            self._params = StdioServerParameters(
                command=argv[0], args=argv[1:], env={**os.environ, **(env or {})})
        self.errlog = errlog if errlog is not None else sys.stderr
        self.connect_timeout = connect_timeout
        self.ping_timeout = ping_timeout
        self.capabilities = capabilities or types.ClientCapabilities()
        self.peer = peer
        self.init: types.InitializeResult | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._session: ClientSession | None = None
        self._stop: anyio.Event | None = None
        self._done: anyio.Event | None = None
        self._lock = anyio.Lock()

    @property
    def server_info(self) -> types.Implementation | None:
        """The upstream's name and version, once connected."""
        return self.init.server_info if self.init else None

    @property
    def instructions(self) -> str | None:
        """The upstream's instructions for models, once connected."""
        return self.init.instructions if self.init else None

    @property
    def server_capabilities(self) -> types.ServerCapabilities | None:
        """What the upstream serves (tools, resources, prompts, logging, ...), once connected."""
        return self.init.capabilities if self.init else None

    def describe(self) -> str:
        """``stdio: COMMAND`` or ``http: URL`` (without credentials or query), for start
        lines."""
        return f"{'http' if self.is_http else 'stdio'}: {redacted(self.target)}"

    # -- the connection --------------------------------------------------------------------

    def _transport(self) -> AbstractAsyncContextManager[Any]:
        if self.is_http:
            return streamable_http_client(self.target)
        return stdio_client(self._params, errlog=self.errlog)

    def _client(self, streams: Any) -> ClientSession:
        caps = self.capabilities
        return _Session(
            streams[0], streams[1], capabilities=caps, message_handler=self._on_message,
            list_roots_callback=self._roots if caps.roots is not None else None,
            sampling_callback=self._sample if caps.sampling is not None else None,
            elicitation_callback=self._elicit if caps.elicitation is not None else None)

    async def _hold(self, *, task_status: anyio.abc.TaskStatus[
            tuple[ClientSession, anyio.Event, anyio.Event]]) -> None:
        stop, done = anyio.Event(), anyio.Event()
        started = False
        try:
            async with self._transport() as streams, self._client(streams) as session:
                with anyio.fail_after(self.connect_timeout):
                    self.init = await session.initialize()
                task_status.started((session, stop, done))
                started = True
                await stop.wait()
        except Exception as err:
            if not started:
                raise
            log.debug("upstream connection closed: %r", err)
        finally:
            done.set()

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Connect; connection tasks live in ``tg``. Raises if the upstream cannot be reached."""
        self._tg = tg
        await self._connect()

    def attach(self, tg: anyio.abc.TaskGroup) -> None:
        """Connect later, on first use (:meth:`session`, :meth:`ready`), with tasks in ``tg``."""
        self._tg = tg

    @property
    def current(self) -> ClientSession | None:
        """The session open now, if any (no connecting)."""
        return self._session

    async def _connect(self) -> ClientSession:
        assert self._tg is not None, "Upstream.start() first"
        self.close()
        try:
            session, stop, done = await self._tg.start(self._hold)
        except Exception as err:
            raise ConnectionError(f"cannot reach the upstream {self.target!r}: "
                                  f"{_describe(err)}") from err
        self._session, self._stop, self._done = session, stop, done
        return session  # type: ignore[no-any-return]

    async def session(self) -> ClientSession:
        """The current session (connecting if there is none)."""
        async with self._lock:
            return self._session if self._session is not None else await self._connect()

    async def ready(self) -> ClientSession:
        """A session proven alive just now: a ping answered, else a fresh connection.
        :class:`~effectgate.NotExecuted` when neither works (the call was never sent)."""
        async with self._lock:
            if self._session is not None:
                try:
                    with anyio.fail_after(self.ping_timeout):
                        await self._session.send_ping()
                    return self._session
                except Exception as err:
                    log.warning("upstream %s did not answer a ping (%s); reconnecting",
                                self.target, _describe(err))
            try:
                return await self._connect()
            except ConnectionError as err:
                raise eg.NotExecuted(f"the upstream refused before receiving the call: {err}",
                                     reason=str(err)) from err

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the upstream offers (all pages)."""
        session = await self.session()
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(1000):  # a cursor that never ends is the upstream's bug, not a hang
            page = await session.list_tools(
                params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def close(self) -> None:
        """Drop the current connection (its task ends; a stdio upstream is stopped)."""
        if self._stop is not None:
            self._stop.set()
        self._session = self._stop = None

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the connection has ended (a stdio upstream exited)."""
        done = self._done
        self.close()
        if done is not None:
            with anyio.move_on_after(10), anyio.CancelScope(shield=True):
                await done.wait()

    # -- what the upstream asks and announces ----------------------------------------------

    async def _ask(self, request: types.ServerRequest, result_type: type[R]) -> R | types.ErrorData:
        if self.peer is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message="no client to ask")
        try:
            return await self.peer.request(request, result_type)
        except MCPError as err:
            return err.error
        except Exception as err:
            log.warning("the client could not answer the upstream's %s: %s", request.method,
                        _describe(err))
            return types.ErrorData(code=types.INTERNAL_ERROR, message=_describe(err))

    async def _roots(self, ctx: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        return await self._ask(types.ListRootsRequest(), types.ListRootsResult)

    async def _sample(self, ctx: ClientRequestContext, params: types.CreateMessageRequestParams
                      ) -> types.CreateMessageResult | types.CreateMessageResultWithTools \
            | types.ErrorData:
        answer = await self._ask(types.CreateMessageRequest(params=params), _RawResult)
        if isinstance(answer, types.ErrorData):
            return answer
        try:
            return _SAMPLED.validate_python(answer.model_dump(by_alias=True), by_name=False)
        except ValidationError:
            return types.ErrorData(code=types.INTERNAL_ERROR,
                                   message="the client's sampling answer is malformed")

    async def _elicit(self, ctx: ClientRequestContext,
                      params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        return await self._ask(types.ElicitRequest(params=params), types.ElicitResult)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            log.debug("upstream transport error: %r", message)
            return
        if self.peer is not None:
            await self.peer.notify(message)


class _RawResult(types.Result):
    """Any result, every field kept (validated afterwards against the exact type)."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)


def redacted(target: str) -> str:
    """An upstream URL without credentials, query or fragment (a command line as it is)."""
    if not target.strip().startswith(("http://", "https://")):
        return target
    parts = urllib.parse.urlsplit(target.strip())
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        netloc = f"{host}:{parts.port}" if parts.port else host
    except ValueError:
        netloc = host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _describe(err: BaseException) -> str:
    """The innermost message of an exception (group)."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return f"{type(err).__name__}: {err}"
