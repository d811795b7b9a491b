"""One gate driven by a sync caller or an async one, through the same calls, for tests that
run a scenario both ways (``caller`` parametrised over :data:`CALLERS`).

``Caller(gate, "async")`` awaits the gate's async twins (``abegin``, ``areport``,
``aextend_lease``, ``aresolve``; an ``async def`` under ``@gate.effect``) on one event loop of
its own that stays open between calls, as an application's loop does: the async Postgres store
keeps one small pool of connections per event loop (``core/store/async_pg.py``), so the
connection a call used is the one the next call uses. :meth:`Caller.backend_pid`,
:meth:`Caller.connection` and :meth:`Caller.show` reach that connection (for a sync caller,
this thread's connection of the sync store), so a test kills or inspects the connection the
gate really uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import effectgate as eg

__all__ = ["CALLERS", "Caller", "making"]

CALLERS = ("sync", "async")
T = TypeVar("T")


class Caller:
    """``gate``'s begin/report path, the sync way or the async way (``mode``)."""

    def __init__(self, gate: eg.Gate, mode: str) -> None:
        if mode not in CALLERS:
            raise ValueError(f"caller {mode!r}: one of {CALLERS}")
        self.gate = gate
        self.mode = mode
        self._runner = asyncio.Runner() if mode == "async" else None

    def __repr__(self) -> str:
        return f"Caller({self.mode})"

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on this caller's event loop (async callers only)."""
        assert self._runner is not None, "a sync caller has no event loop"
        return self._runner.run(coro)

    # -- the gate's calls ------------------------------------------------------------------

    def begin(self, **fields: Any) -> eg.BeginDecision:
        if self._runner is None:
            return self.gate.begin(**fields)
        return self.run(self.gate.abegin(**fields))

    def report(self, held: eg.BeginDecision | eg.Lease, outcome: str, **kwargs: Any) -> None:
        if self._runner is None:
            return self.gate.report(held, outcome, **kwargs)
        return self.run(self.gate.areport(held, outcome, **kwargs))

    def extend_lease(self, held: eg.BeginDecision | eg.Lease,
                     seconds: float | None = None) -> datetime.datetime:
        if self._runner is None:
            return self.gate.extend_lease(held, seconds)
        return self.run(self.gate.aextend_lease(held, seconds))

    def resolve(self, key: str, outcome: str, **kwargs: Any) -> eg.EffectRecord:
        if self._runner is None:
            return self.gate.resolve(key, outcome, **kwargs)
        return self.run(self.gate.aresolve(key, outcome, **kwargs))

    def effect(self, key: str, **options: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """``@gate.effect(key, **options)``. For an async caller the body becomes an
        ``async def`` (the decorator's async path: ``arun``, ``abegin``, ``areport``) and
        each call of the returned function awaits it on this caller's loop."""

        def decorate(fn: Callable[..., T]) -> Callable[..., T]:
            if self._runner is None:
                return self.gate.effect(key, **options)(fn)

            @functools.wraps(fn)
            async def body(*args: Any, **kwargs: Any) -> T:
                return fn(*args, **kwargs)

            gated: Callable[..., Coroutine[Any, Any, T]] = self.gate.effect(
                key, **options)(body)

            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> T:
                return self.run(gated(*args, **kwargs))

            return call

        return decorate

    # -- the connection the gate uses (Postgres) ---------------------------------------------

    async def _next_connection(self) -> Any:
        """The async store's connection this loop's next call takes: its pool hands the
        connection released last back first, so taking one and putting it back leaves it on
        top (opening it if the loop has none yet)."""
        face: Any = self.gate.store.async_face()
        conn = await face._acquire()
        face._release(conn)
        return conn

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """The ``psycopg`` connection (sync, or ``AsyncConnection``) this caller's next gate
        call runs on, e.g. for :class:`effectgate.bench.trace.PgTrace`."""
        if self._runner is None:
            with self.gate.store.connection() as conn:
                yield conn
        else:
            yield self.run(self._next_connection())

    def backend_pid(self) -> int:
        """The server process of the connection this caller's next gate call runs on."""
        with self.connection() as conn:
            return int(conn.info.backend_pid)

    def show(self, setting: str) -> str:
        """``SHOW setting`` on the connection this caller's gate calls run on."""
        if self._runner is None:
            with self.gate.store.connection() as conn:
                return str(conn.execute(f"SHOW {setting}").fetchone()[0])
        return self.run(self._ashow(setting))

    async def _ashow(self, setting: str) -> str:
        face: Any = self.gate.store.async_face()
        conn = await face._acquire()
        try:
            row = await (await conn.execute(f"SHOW {setting}")).fetchone()
        finally:
            face._release(conn)
        return str(row[0])

    def close(self) -> None:
        """Close this caller's loop (and the async store's connections on it)."""
        if self._runner is None:
            return
        face: Any = self.gate.store.async_face()
        if hasattr(face, "close"):  # Postgres: this loop's pool (SQLite keeps none)
            self._runner.run(face.close())
        self._runner.close()
        self._runner = None


@contextlib.contextmanager
def making(mode: str) -> Iterator[Callable[[eg.Gate], Caller]]:
    """A maker of :class:`Caller` s of one kind for gates; closes them all at the end (a
    test's ``drive`` fixture)."""
    made: list[Caller] = []

    def make(gate: eg.Gate) -> Caller:
        made.append(Caller(gate, mode))
        return made[-1]

    try:
        yield make
    finally:
        for caller in made:
            caller.close()
