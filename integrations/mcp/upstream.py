"""One connection to an upstream MCP server (a stdio command or a streamable HTTP URL), held
by its own task and re-opened when it drops.

The connection declares the capabilities of the client it stands for (roots, sampling,
elicitation: exactly what that client declared, so the upstream behaves as it would for the
client directly) and hands whatever the upstream asks or announces to a :class:`Peer`: its
``roots/list``, ``sampling/createMessage`` and ``elicitation/create`` requests, and its
notifications (log messages, list changes, resource updates).

:meth:`Upstream.ready` is what the gateway calls just before sending a gated call: it proves the
upstream is there (a ping, or a fresh connection) and raises :class:`~effectgate.NotExecuted`
when it is not, because then the call was never sent. A connection with requests in flight is
never replaced because a ping was slow (that would stop the upstream under them). Anything that
goes wrong after the call is sent is left to the caller to treat as AMBIGUOUS; an answer the
connection cannot read (not JSON, nested too deep, not UTF-8) while requests are pending drops
it, so those requests end at once instead of waiting forever; a line of plain text (a log
line a server prints to its stdout) is no answer, and is skipped.
"""

from __future__ import annotations

import codecs
import logging
import os
import shlex
import sys
import urllib.parse
from collections.abc import Callable
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
    """A client session that declares exactly the capabilities it is given, and counts the
    requests it has sent and not yet had answered (pings aside): :attr:`busy`. ``asked`` is
    called as each request of the upstream's (pings aside) arrives, before it is answered."""

    def __init__(self, *args: Any, capabilities: types.ClientCapabilities,
                 asked: Callable[[], None] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._forwarded = capabilities
        self._asked = asked
        self.busy = 0

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        return self._forwarded

    async def _on_request(self, dctx: Any, method: str, params: Any) -> Any:
        # Every request, not only those a callback answers: the SDK answers one it does not
        # know ``-32601`` itself, and the tool that asked may raise that as the call's error.
        if method != "ping" and self._asked is not None:
            self._asked()
        return await super()._on_request(dctx, method, params)

    async def send_request(self, request: Any, result_type: Any, *args: Any,
                           **kw: Any) -> Any:
        if isinstance(request, types.PingRequest):
            return await super().send_request(request, result_type, *args, **kw)
        self.busy += 1
        try:
            return await super().send_request(request, result_type, *args, **kw)
        finally:
            self.busy -= 1


# A stdio upstream's output is read as UTF-8 with every invalid byte sequence made a NUL
# character, which no JSON text may hold unescaped: the line is then unparseable, and reaches
# the session as a parse error (:meth:`Upstream._on_message`) instead of ending the SDK's
# reader in a decode error (which leaves every pending call unanswered).
_UNREADABLE_BYTES = "effectgate.mcp.unreadable"
_STDIO_ENCODING = "effectgate_mcp_utf8"


def _unreadable(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeDecodeError):
        raise err
    return "\x00", err.end


class _MarkingDecoder(codecs.IncrementalDecoder):
    """UTF-8, incrementally, with invalid sequences decoded as NUL (see above)."""

    def __init__(self, errors: str = "strict") -> None:
        super().__init__(errors)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(_UNREADABLE_BYTES)

    def decode(self, input: Any, final: bool = False) -> str:
        return self._utf8.decode(input, final)

    def reset(self) -> None:
        self._utf8.reset()


def _find_codec(name: str) -> codecs.CodecInfo | None:
    if name != _STDIO_ENCODING:
        return None
    utf8 = codecs.lookup("utf-8")
    return codecs.CodecInfo(utf8.encode, utf8.decode, name=_STDIO_ENCODING,
                            incrementalencoder=utf8.incrementalencoder,
                            incrementaldecoder=_MarkingDecoder)


codecs.register_error(_UNREADABLE_BYTES, _unreadable)
codecs.register(_find_codec)


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
                command=argv[0], args=argv[1:], env={**os.environ, **(env or {})},
                encoding=_STDIO_ENCODING)
        self.errlog = errlog if errlog is not None else sys.stderr
        self.connect_timeout = connect_timeout
        self.ping_timeout = ping_timeout
        self.capabilities = capabilities or types.ClientCapabilities()
        self.peer = peer
        self.init: types.InitializeResult | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._session: _Session | None = None
        self.asked = 0
        """How many requests the upstream has sent this client (roots, sampling, elicitation,
        any other but pings, served or not): one sent during a call means the call had
        started."""
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

    def _client(self, streams: Any) -> _Session:
        caps = self.capabilities
        made: list[_Session] = []

        async def on_message(message: Any) -> None:
            await self._on_message(message, made[0] if made else None)

        session = _Session(
            streams[0], streams[1], capabilities=caps, message_handler=on_message,
            asked=self._count_asked,
            list_roots_callback=self._roots if caps.roots is not None else None,
            sampling_callback=self._sample if caps.sampling is not None else None,
            elicitation_callback=self._elicit if caps.elicitation is not None else None)
        made.append(session)
        return session

    async def _hold(self, *, task_status: anyio.abc.TaskStatus[
            tuple[_Session, anyio.Event, anyio.Event]]) -> None:
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

    async def _connect(self) -> _Session:
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
        :class:`~effectgate.NotExecuted` when neither works (the call was never sent).

        A ping that times out while the session has requests in flight (a single-threaded
        upstream busy with another call) proves only that it is busy: the session is kept,
        since reconnecting would stop the upstream under those calls, and pinged again until
        it answers (the call is then sent) or has nothing in flight any more (it is then
        replaced). The call is never sent on a session that has not answered: a wedged
        upstream would hold it, AMBIGUOUS, where a wait before it leaves ends FAILED."""
        while True:
            busy: _Session | None = None
            async with self._lock:
                session = self._session
                if session is not None:
                    try:
                        with anyio.fail_after(self.ping_timeout):
                            await session.send_ping()
                        return session
                    except Exception as err:
                        if isinstance(err, TimeoutError) and session.busy \
                                and session is self._session:
                            busy = session  # busy, not gone: kept (see above)
                        else:
                            log.warning("upstream %s did not answer a ping (%s); reconnecting",
                                        self.target, _describe(err))
                if busy is None:
                    try:
                        return await self._connect()
                    except ConnectionError as err:
                        raise eg.NotExecuted("the upstream refused before receiving the call: "
                                             f"{err}", reason=str(err)) from err
            # outside the lock: a wait for a busy upstream holds up no one else's
            if await self._answers_while_busy(busy) and busy is self._session:
                return busy

    async def _answers_while_busy(self, session: _Session) -> bool:
        """Ping ``session`` until it answers (True) or has nothing in flight any more, is
        replaced or fails (False: :meth:`ready` then decides again)."""
        log.warning("upstream %s is slow to answer a ping while it runs %d request(s); "
                    "waiting, not reconnecting", self.target, session.busy)
        while session.busy and session is self._session:
            try:
                with anyio.move_on_after(self.ping_timeout) as waited:
                    await session.send_ping()
            except Exception:  # the connection failed: ready() finds out and reconnects
                return False
            if not waited.cancelled_caught:
                return True
        return False

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

    def _count_asked(self) -> None:
        self.asked += 1

    async def _ask(self, request: types.ServerRequest, result_type: type[R]) -> R | types.ErrorData:
        self.asked += 1  # also counted on arrival (:class:`_Session`); only a change matters
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

    async def _on_message(self, message: Any, session: _Session | None = None) -> None:
        if isinstance(message, Exception):
            if session is not None and session is self._session and session.busy \
                    and _may_be_an_answer(message):
                # An answer the session cannot read may be the answer to a pending call,
                # which would then wait forever (its heartbeat keeping the effect in flight):
                # the connection is dropped, so every pending call ends (AMBIGUOUS: the
                # upstream may have acted) and the next one reconnects.
                log.warning("upstream %s sent what cannot be read while %d request(s) were "
                            "pending (%s); dropping the connection", self.target, session.busy,
                            _describe(message))
                self.close()
                return
            log.debug("upstream transport error: %r", message)
            return
        if self.peer is not None:
            await self.peer.notify(message)


def _may_be_an_answer(err: Exception) -> bool:
    """Whether what the upstream sent and the session could not read may be the answer to a
    request: not a line of plain text or a JSON value that is no response (a stray log line
    a server prints to its stdout, which the session skipped and goes on reading past), but
    an object that cannot be read (invalid UTF-8, nested too deep, cut short), one with an
    ``id`` and a ``result`` or ``error``, or a failure of the transport itself."""
    if not isinstance(err, ValidationError):
        return True
    errors = err.errors(include_url=False)
    seen = errors[0].get("input") if errors else None
    if isinstance(seen, str):
        return seen.lstrip().startswith("{")
    return isinstance(seen, dict) and "id" in seen and ("result" in seen or "error" in seen)


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
