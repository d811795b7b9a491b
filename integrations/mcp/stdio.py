"""stdio for the MCP server and gateway: a read stream that answers the lines the SDK cannot
read. The SDK's stdio transport drops such a line (JSON nested too deep, a lone surrogate, a
number too long) after logging it at debug level, and its caller waits for ever; streamable
HTTP answers the same body ``-32700``. :class:`Answered` gives stdio the same answer.

The SDK decodes stdin with ``errors="replace"``: a line with invalid UTF-8 would reach a tool
with U+FFFD in place of its bad bytes, and two calls differing only in those bytes would share
an effect key (the second answered as the first's duplicate). :func:`answered_stdio` reads
stdin itself, keeping bad bytes as lone surrogates (``surrogateescape``) that the SDK cannot
parse, so :class:`Answered` answers the line ``-32700``.

A process has one stdin: one stdio run at a time (:func:`one_stdio_run`)."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import IO, Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
from pydantic import ValidationError

import effectgate as eg

try:
    from mcp.server.stdio import stdio_server
    from mcp.shared.dispatcher import coerce_request_id
    from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
    from mcp.shared.message import SessionMessage
    from mcp_types import (
        INVALID_REQUEST,
        PARSE_ERROR,
        ErrorData,
        JSONRPCError,
        JSONRPCNotification,
        JSONRPCRequest,
        JSONRPCResponse,
        RequestId,
    )
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp needs the mcp package: pip install ".[mcp]"'
    ) from err

__all__ = ["Answered", "answered_stdio", "check_stdio_free", "one_stdio_run", "run_stdio",
           "unless_ended"]

T = TypeVar("T")
_UNREADABLE = ("json_invalid", "string_unicode")  # no JSON; invalid UTF-8 (the SDK's types)
_STDIO_IN_USE = threading.Lock()  # held while this process's stdin is served


def check_stdio_free() -> None:
    """:class:`~effectgate.ConfigError` while this process's stdin is already served."""
    if _STDIO_IN_USE.locked():
        raise _stdio_busy()


@contextmanager
def one_stdio_run() -> Iterator[None]:
    """Hold this process's stdin for one run; :func:`check_stdio_free`'s error if another
    run holds it."""
    if not _STDIO_IN_USE.acquire(blocking=False):
        raise _stdio_busy()
    try:
        yield
    finally:
        _STDIO_IN_USE.release()


def _stdio_busy() -> eg.ConfigError:
    return eg.ConfigError(
        "stdio is already being served in this process: a process has one stdin, so a second "
        "stdio run at once would serve no client (it reads the null device the first leaves "
        "on fd 0) and its end of input could end the first one's approval waits; run one at "
        "a time")


@asynccontextmanager
async def answered_stdio(ended: anyio.Event | None = None,
                         ) -> AsyncIterator[tuple[Answered, Any]]:
    """The read and write streams of the SDK's stdio transport on this process's stdin and
    stdout, the read stream :class:`Answered` (setting ``ended``, if given, at the end of
    input: :attr:`Answered.ended`), and stdin decoded strictly: a line with invalid
    UTF-8 is answered ``-32700`` and never reaches a tool. While serving, fd 0 reads the null
    device, as under the SDK's own stdin (a tool or child reading stdin gets EOF, not the
    client's lines). Its lines are read by a daemon thread (:class:`_DaemonLines`): a server
    told to stop while its client still holds stdin open stops, rather than waiting for a
    line that may never come. One run at a time (:func:`one_stdio_run`)."""
    with one_stdio_run(), _claimed_stdin() as wire, _claimed(sys.stdout, 1, 2) as out:
        text = _UnownedText(wire, encoding="utf-8", errors="surrogateescape")
        lines: Any = _DaemonLines(text)  # the SDK iterates its stdin: lines are all it needs
        sink: Any = anyio.wrap_file(_Wire(out)) if out is not None else None  # type: ignore[arg-type]
        async with stdio_server(stdin=lines, stdout=sink) as (read, write):
            answered = Answered(read, write, ended)
            yield answered, answered.replies


async def run_stdio(server: Any, ended: anyio.Event | None = None) -> None:
    """Run the low-level MCP ``server`` on this process's stdin and stdout through
    :func:`answered_stdio` (``ended`` set at the end of input): the one stdio path of ``mcp
    serve``, of :func:`~.server.build_server`'s ``run()`` and of the gateway."""
    async with answered_stdio(ended) as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def unless_ended(ended: anyio.Event | None, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``'s answer, or :class:`ConnectionError` as soon as ``ended`` is set (the
    client's input has ended: a request to it can be answered no more). None: no such end is
    known (HTTP), ``call()`` alone. Its own errors are raised as they came."""
    if ended is None:
        return await call()
    got: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:

        async def ask() -> None:
            try:
                got["answer"] = await call()
            except Exception as err:  # raised as it is, not in a group
                got["error"] = err
            tg.cancel_scope.cancel()

        async def gone() -> None:
            await ended.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(ask)
        tg.start_soon(gone)
    if "error" in got:
        raise got["error"]
    if "answer" not in got:
        raise ConnectionError("the client has closed its input: it can answer nothing more")
    return got["answer"]  # type: ignore[no-any-return]


class _DaemonLines:
    """The lines of ``text``, for ``async for``, read by a daemon thread of their own and
    handed over one at a time (the reader waits until each is taken: a client writing faster
    than the server reads fills no memory). The SDK reads stdin on an anyio worker thread,
    which its cancellation must wait for and the interpreter joins at exit: blocked in
    ``readline`` on a client that keeps stdin open, it held a SIGTERM'd server forever."""

    def __init__(self, text: IO[str]) -> None:
        self._text = text

    async def __aiter__(self) -> AsyncIterator[str]:
        send, receive = anyio.create_memory_object_stream[str](0)
        token = anyio.lowlevel.current_token()

        def read() -> None:
            with suppress(Exception):  # the loop or the reader is gone: stop reading
                for line in self._text:
                    anyio.from_thread.run(send.send, line, token=token)
            with suppress(Exception):  # end of input: the iteration ends
                anyio.from_thread.run(send.aclose, token=token)

        threading.Thread(target=read, name="effectgate-mcp-stdin", daemon=True).start()
        async with receive:
            async for line in receive:
                yield line


class _UnownedText(io.TextIOWrapper):
    """A text layer whose close leaves the stream under it open (it is stdin's)."""

    def close(self) -> None:
        with suppress(ValueError):
            self.detach()


@contextmanager
def _claimed_stdin() -> Iterator[IO[bytes]]:
    """Stdin for the transport alone (:func:`_claimed`, fd 0 on the null device meanwhile);
    where fd 0 cannot be moved, stdin's own buffer; where the process was started with it
    closed (``sys.stdin`` None), no input at all: the server ends at once, as at end of
    input."""
    if sys.stdin is None:
        yield io.BytesIO()
        return
    with _claimed(sys.stdin.buffer, 0, os.devnull) as private:
        yield sys.stdin.buffer if private is None else os.fdopen(private, "rb", closefd=False)


@contextmanager
def _claimed(stream: IO[Any] | None, fd: int, stand_in: str | int) -> Iterator[int | None]:
    """A private duplicate of ``fd`` (``stream``'s) for the transport alone, with ``fd`` itself
    on ``stand_in`` (a path opened for it, or a descriptor) until the end, then restored:
    stray reads get EOF, stray writes miss the wire, as under the SDK's own claim. None where
    ``fd`` cannot be moved. The duplicate is never closed: a worker thread may still be
    blocked on it."""
    try:
        if stream is None or stream.fileno() != fd:
            raise OSError(f"the stream is not fd {fd}")
        stream.flush()
        private = os.dup(fd)
    except (OSError, ValueError, io.UnsupportedOperation):
        yield None
        return
    try:
        other = os.open(stand_in, os.O_RDWR) if isinstance(stand_in, str) else stand_in
        try:
            os.dup2(other, fd)
        finally:
            if other != stand_in:
                os.close(other)
    except OSError:
        os.close(private)
        yield None
        return
    try:
        yield private
    finally:
        os.dup2(private, fd)


class _Wire:
    """The transport's stdout: text written to a private duplicate of fd 1, and dropped once
    the client has closed its end (EPIPE). The SDK's writer would raise, and its transport
    cancel every call still running (a gated upstream call left AMBIGUOUS) instead of letting
    it finish and be recorded, as the end of input does (:class:`Answered`)."""

    def __init__(self, fd: int) -> None:
        self._fd, self.broken = fd, False

    def write(self, text: str) -> int:
        """Write ``text`` whole, or nothing once the client has stopped reading."""
        data = text.encode("utf-8")
        try:
            while data and not self.broken:
                data = data[os.write(self._fd, data):]
        except (BrokenPipeError, ConnectionResetError):
            self.broken = True
        return len(text)

    def flush(self) -> None:
        """Nothing to flush: every write goes straight to the descriptor."""


_DRAIN_POLL = 0.05  # seconds between looks at the open requests, once input has ended


class _Replies:
    """The write stream the server answers through: each response or error closes its
    request in ``open`` (:class:`Answered`)."""

    def __init__(self, inner: Any, close: Callable[[RequestId], None]) -> None:
        self._inner, self._close = inner, close

    async def send(self, item: SessionMessage) -> None:
        """Send ``item``; an answer closes its request."""
        await self._inner.send(item)
        message = item.message
        if isinstance(message, (JSONRPCResponse, JSONRPCError)) and message.id is not None:
            self._close(message.id)

    async def aclose(self) -> None:
        """Close the underlying stream."""
        await self._inner.aclose()

    async def __aenter__(self) -> _Replies:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Answered:
    """The stdio read stream of :func:`answered_stdio`. A line the SDK cannot read (JSON nested
    too deep, a lone surrogate, a number too long, invalid UTF-8: the SDK's stdio transport
    drops it silently, and its caller would wait forever) is answered with the JSON-RPC error
    that streamable HTTP gives it (``-32700``, or ``-32600`` for JSON that is no JSON-RPC message),
    with the request's ``id`` when it can be read; it never reaches a tool.

    At the end of input it waits until every request it passed on has been answered (through
    :attr:`replies`, the write stream to serve with) or cancelled by the client: the SDK
    cancels whatever is still running when its input ends, and a client that wrote its last
    request and closed stdin (``requests | effectgate mcp serve``) was answered ``Connection
    closed`` for a call whose reservation, or upstream call, may already have been made.
    :attr:`ended` is set when input ends, before that wait: a call waiting for the client
    itself (an approval elicited from it, :mod:`.elicit`) can stop waiting."""

    def __init__(self, inner: Any, write: Any, ended: anyio.Event | None = None) -> None:
        self.inner, self.write = inner, write
        self.ended = ended if ended is not None else anyio.Event()
        """Set at the end of input: the client can send nothing more (an answer included)."""
        self.open: Counter[RequestId] = Counter()
        """The requests passed on and not yet answered or cancelled, counted by id as the SDK
        correlates ids (``"7"`` is 7): a client may reuse an id while it is in flight, and the
        SDK runs both requests."""
        self._cancelled: set[RequestId] = set()
        """The open ids whose newest request the client has cancelled: the SDK cancels only
        that one (its newest under the id, while it runs), so a second cancel of the id is
        no answer for an older request still running under it."""
        self.replies = _Replies(write, self._close)

    @property
    def last_context(self) -> Any:
        """The sender's context of the last item (the SDK's context streams)."""
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> Any:
        """The next message; unreadable lines are answered and skipped. At the end of input,
        once every open request is answered."""
        while True:
            try:
                item = await self.inner.receive()
            except anyio.EndOfStream:
                self.ended.set()
                while self.open:  # answered through self.replies, from the SDK's handlers
                    await anyio.sleep(_DRAIN_POLL)
                raise
            if isinstance(item, SessionMessage):
                self._note(item.message)
                return item
            if not isinstance(item, ValidationError):
                return item
            error = item.errors()[0]
            raw = error.get("input")  # the line when it is no JSON, else one value inside it
            parse = error.get("type") in _UNREADABLE
            reason = ("invalid UTF-8" if error.get("type") == "string_unicode"
                      else str((error.get("ctx") or {}).get("error") or error.get("msg"))[:200])
            await self.write.send(SessionMessage(JSONRPCError(
                jsonrpc="2.0", id=_request_id(raw) if parse and isinstance(raw, str) else None,
                error=ErrorData(code=PARSE_ERROR if parse else INVALID_REQUEST,
                                message=f"Parse error: {reason}" if parse
                                else "Invalid request: not a JSON-RPC message"))))

    def _note(self, message: Any) -> None:
        if isinstance(message, JSONRPCRequest):
            key = coerce_request_id(message.id)
            self.open[key] += 1
            self._cancelled.discard(key)
        elif isinstance(message, JSONRPCNotification) and (
                message.method == "notifications/cancelled"):  # never answered (MCP)
            cancelled = cancelled_request_id_from_params(message.params)
            if cancelled is None:
                return
            key = coerce_request_id(cancelled)
            if key in self.open and key not in self._cancelled:
                self._close(key)
                if key in self.open:
                    self._cancelled.add(key)

    def _close(self, request_id: RequestId) -> None:
        """One request under ``request_id`` answered or cancelled."""
        key = coerce_request_id(request_id)
        self.open[key] -= 1
        if self.open[key] <= 0:
            del self.open[key]
            self._cancelled.discard(key)

    async def aclose(self) -> None:
        """Close the underlying stream."""
        await self.inner.aclose()

    def __aiter__(self) -> Answered:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Answered:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# A string left open runs to the end of the line, as JSON reads it: a token never fails after
# scanning, so the line is read once (an open string at every escaped quote was quadratic).
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[{}\[\]]', re.DOTALL)
_COLON = re.compile(r"\s*:\s*")
_DECODE = json.JSONDecoder().raw_decode


def _request_id(line: str) -> int | str | None:
    """The top-level ``id`` of a request ``line`` the SDK could not read, found without
    parsing what it nests (None when it has none that can be sent back)."""
    depth, found, method = 0, None, False
    for token in _TOKEN.finditer(line):
        text = token.group()
        if text in ("{", "["):
            depth += 1
        elif text in ("}", "]"):
            depth -= 1
        elif depth == 1 and (name := _name(text)) in ("id", "method"):
            colon = _COLON.match(line, token.end())
            if colon is None:
                continue
            method = method or name == "method"
            if name == "id":
                try:
                    found, _ = _DECODE(line, colon.end())
                except (ValueError, RecursionError):
                    return None
    if not method or isinstance(found, bool) or not isinstance(found, int | str):
        return None
    if (isinstance(found, str) and not found.isprintable()) or len(str(found)) > 200:
        return None  # an id that would not survive the way back
    return found


def _name(token: str) -> str | None:
    """A string token as JSON reads it (a key spelt ``"\\u0069d"`` is ``id`` to the SDK);
    None for one left open."""
    if "\\" not in token:
        return token[1:-1] if len(token) > 1 and token.endswith('"') else None
    try:
        return str(json.loads(token))
    except ValueError:
        return None
