"""One connection to an upstream MCP server (a stdio command or a streamable HTTP URL), held
by its own task and re-opened when it drops.

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
from contextlib import AbstractAsyncContextManager
from typing import Any, TextIO

import anyio
import anyio.abc

import effectgate as eg

try:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import Implementation, Tool
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.upstream needs the mcp package: pip install "effectgate[mcp]"'
    ) from err

__all__ = ["Upstream"]

log = logging.getLogger("effectgate")


class Upstream:
    """The upstream MCP server named by ``target``: a command line (run over stdio, with this
    process's environment plus ``env``) or an ``http(s)://`` URL (streamable HTTP)."""

    def __init__(self, target: str, *, env: dict[str, str] | None = None,
                 errlog: TextIO | None = None, connect_timeout: float = 30.0,
                 ping_timeout: float = 10.0) -> None:
        self.target = target.strip()
        if not self.target:
            raise eg.ConfigError("the upstream is empty: give a command or an http(s) URL")
        self.is_http = self.target.startswith(("http://", "https://"))
        if not self.is_http:
            argv = shlex.split(self.target)
            self._params = StdioServerParameters(
                command=argv[0], args=argv[1:], env={**os.environ, **(env or {})})
        self.errlog = errlog if errlog is not None else sys.stderr
        self.connect_timeout = connect_timeout
        self.ping_timeout = ping_timeout
        self.server_info: Implementation | None = None
        self.instructions: str | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._session: ClientSession | None = None
        self._stop: anyio.Event | None = None
        self._lock = anyio.Lock()

    def _transport(self) -> AbstractAsyncContextManager[Any]:
        if self.is_http:
            return streamable_http_client(self.target)
        return stdio_client(self._params, errlog=self.errlog)

    async def _hold(self, *, task_status: anyio.abc.TaskStatus[
            tuple[ClientSession, anyio.Event]]) -> None:
        stop = anyio.Event()
        started = False
        try:
            async with self._transport() as streams, ClientSession(
                streams[0], streams[1]
            ) as session:
                with anyio.fail_after(self.connect_timeout):
                    init = await session.initialize()
                self.server_info, self.instructions = init.server_info, init.instructions
                task_status.started((session, stop))
                started = True
                await stop.wait()
        except Exception as err:
            if not started:
                raise
            log.debug("upstream connection closed: %r", err)

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Connect; connection tasks live in ``tg``. Raises if the upstream cannot be reached."""
        self._tg = tg
        await self._connect()

    async def _connect(self) -> ClientSession:
        assert self._tg is not None, "Upstream.start() first"
        self.close()
        try:
            session, stop = await self._tg.start(self._hold)
        except Exception as err:
            raise ConnectionError(f"cannot reach the upstream {self.target!r}: "
                                  f"{_describe(err)}") from err
        self._session, self._stop = session, stop
        return session  # type: ignore[no-any-return]

    async def list_tools(self) -> list[Tool]:
        """Every tool the upstream offers (all pages)."""
        session = await self.session()
        tools: list[Tool] = []
        cursor: str | None = None
        while True:
            from mcp.types import PaginatedRequestParams

            page = await session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

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

    def close(self) -> None:
        """Drop the current connection (its task ends; a stdio upstream is stopped)."""
        if self._stop is not None:
            self._stop.set()
        self._session = self._stop = None


def _describe(err: BaseException) -> str:
    """The innermost message of an exception (group)."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return f"{type(err).__name__}: {err}"
