"""The store's per-call operations for async callers on Postgres, on psycopg's own
``AsyncConnection``: no thread hop. Each event loop gets its own bounded pool of connections
(a connection belongs to the loop that opened it): at most ``pool_size`` open at once (the
gate's ``async_pool_size``, default 10), the one released last handed out first, and a task
that finds them all busy waits in line for one — awaiting, never blocking the loop. A forked
child opens its own.

The pool is written here rather than taken from ``psycopg_pool``: its ``AsyncConnectionPool``
runs maintenance tasks on the loop it was opened on and must be closed there, so a pool made
implicitly for a caller's short-lived loop (``asyncio.run`` per request, a test's loop) would
keep that loop and its connections alive after the loop ended. This one holds no reference
to its loop while nobody waits, so a finished loop is collected with its idle connections,
and :meth:`AsyncPostgres.close_idle` closes them from any thread.

The statements and how rows are read are the sync store's (``Store``), the binds those of
:mod:`effectgate.store.binds`: this module only awaits them. Operations that need a
transaction (a governed move, a report that moves spend) stay on the sync store, run on a
worker thread.

As on the sync store (:mod:`effectgate.store.connections`), reads and writes take different
paths: a read (:meth:`AsyncPostgres.read`) that meets a pooled connection the server has
closed since an earlier call (a restart, an idle timeout) runs once more on another; a write
(:meth:`AsyncPostgres.run`) never runs twice.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import StoreError
from ..states import State
from .abandoned import abandonable, release_lost
from .binds import (
    bare_binds,
    begin_binds,
    extend_binds,
    is_bare,
    late_binds,
    move_binds,
    outcome_binds,
    over_ceiling,
)
from .connections import (
    DEFAULT_ASYNC_POOL_SIZE,
    again_after,
    is_disconnect,
    safe_url,
    store_error,
)
from .pg_direct import with_connect_timeout
from .rows import (
    ApprovalRow,
    EffectHead,
    EffectRow,
    Moved,
    Recorded,
    approval_row,
    effect_head,
    effect_row,
    found_head,
)
from .version import VERSION_SQL

if TYPE_CHECKING:
    from ..decide import Move
    from ..request import Lease, LeaseSecret, Request
    from ..states import Outcome
    from . import Store
    from .sql import Sql

__all__ = ["AsyncPostgres"]

log = logging.getLogger("effectgate")


class _LoopPool:
    """One event loop's connections. ``opened`` counts those open or being opened (idle and
    in use); ``waiting`` holds, in arrival order, the futures of tasks waiting for one: each
    is handed a connection, or ``None`` (a slot: open a new one). The lock guards ``idle``
    and ``opened`` against :meth:`AsyncPostgres.close_idle` on another thread; it is never
    held across an ``await``."""

    __slots__ = ("idle", "lock", "opened", "waiting")

    def __init__(self) -> None:
        self.idle: list[Any] = []
        self.opened = 0
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.lock = threading.Lock()

    def take(self, size: int) -> tuple[Any, bool]:
        """(an idle connection, False), else (None, True) with a slot to open one, else
        (None, False): wait."""
        with self.lock:
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed:
                    return conn, False
                self.opened -= 1
            if self.opened < size:
                self.opened += 1
                return None, True
        return None, False

    def give(self, conn: Any) -> None:
        """Hand a healthy connection to the first waiter, else keep it idle."""
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        with self.lock:
            self.idle.append(conn)

    def free(self) -> None:
        """A connection (or a slot to open one) is gone: its slot passes to the first
        waiter, else the count goes down."""
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        with self.lock:
            self.opened -= 1


class AsyncPostgres:
    """The async face of a Postgres :class:`~effectgate.store.Store`."""

    def __init__(self, store: Store, conninfo: str, connect_options: Mapping[str, Any],
                 session: str, pool_size: int = DEFAULT_ASYNC_POOL_SIZE) -> None:
        self._store = store
        self._conninfo = conninfo
        self._options = dict(connect_options)
        self._session = session  # pg_direct.session_sql: the sync store's session settings
        self.pool_size = pool_size
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPool] = (
            weakref.WeakKeyDictionary())
        self._pid = os.getpid()

    # -- connections -------------------------------------------------------------------------

    def _pool(self) -> _LoopPool:
        if self._pid != os.getpid():  # a forked child: never touch the parent's sockets
            self._pools = weakref.WeakKeyDictionary()
            self._pid = os.getpid()
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = _LoopPool()
            # The loop gone (``asyncio.run`` returned): its idle connections are closed, not
            # left to the garbage collector (a ResourceWarning, a server session held).
            weakref.finalize(loop, _finish_idle, pool, self._pid)
        return pool

    async def _acquire(self) -> Any:
        """A connection of this loop's pool: an idle one, a new one while fewer than
        ``pool_size`` are open, else the next one released (waiting in line)."""
        pool = self._pool()
        conn, may_open = pool.take(self.pool_size)
        if conn is not None:
            return conn
        return (await self._wait_or_open(pool, may_open))[0]

    async def _wait_or_open(self, pool: _LoopPool, may_open: bool) -> tuple[Any, bool]:
        """When no connection is idle: (the next one released, False) after waiting in line,
        or (a new one, True) in a slot of ``pool`` (``may_open``: this task holds one)."""
        if not may_open:
            waiter = asyncio.get_running_loop().create_future()
            pool.waiting.append(waiter)
            try:
                conn = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # handed one as we were cancelled
                    handed = waiter.result()
                    if handed is None:
                        pool.free()
                    else:
                        pool.give(handed)
                else:
                    with contextlib.suppress(ValueError):
                        pool.waiting.remove(waiter)
                raise
            if conn is not None:
                return conn, False
        try:  # this task holds a slot: open a connection in it
            return await self._connect(), True
        except BaseException:
            pool.free()
            raise

    async def _connect(self) -> Any:
        import psycopg

        try:
            conn = await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True,
                **with_connect_timeout(self._conninfo, self._options))
            await conn.execute(self._session)
            watch = self._store.version_watch
            if watch is not None:  # a new connection: was the store migrated meanwhile?
                row = await (await conn.execute(VERSION_SQL)).fetchone()
                watch.note(None if row is None else row[0])
        except Exception as err:
            raise StoreError(f"cannot reach the store at {safe_url(self._store.url)}: "
                             f"{type(err).__name__}") from err
        return conn

    def _release(self, conn: Any) -> None:
        """Give ``conn`` back to this loop's pool (to the next waiter first)."""
        pool = self._pool()
        if conn.closed:
            pool.free()
        else:
            pool.give(conn)

    async def _discard(self, conn: Any) -> None:
        """Close ``conn`` (broken, or in an unknown state) and free its slot."""
        self._pool().free()
        await _close(conn)

    async def run(self, sql: Sql, binds: Mapping[str, Any] | tuple[Any, ...], *,
                  writing: bool = False,
                  sent: tuple[Request, LeaseSecret] | None = None) -> list[Any]:
        """One statement in autocommit on this loop's connection, never run again (a
        write's: reads take :meth:`read`). ``sent``: the request and lease secret of a
        reservation: cancelled once sent, it may have committed before the cancel came, and
        is released if it did (:func:`~.abandoned.release_lost`)."""
        conn = await self._acquire()
        pid = 0
        try:
            if sent is not None:  # a reservation's backend (:func:`_orphan_ended_then`):
                pid = conn.pgconn.backend_pid  # unknown once psycopg gives up on ``conn``
            watch = self._store.version_watch
            if writing and watch is not None and watch.due():
                row = await (await conn.execute(VERSION_SQL)).fetchone()
                watch.seen(None if row is None else row[0])  # a newer schema: StoreError
            cur = await conn.execute(sql.text, binds)
            rows: list[Any] = await cur.fetchall()
        except BaseException as err:
            await self._failed(conn, err, writing, sent, pid)
        self._release(conn)
        return rows

    async def read(self, sql: Sql, binds: Mapping[str, Any]) -> list[Any]:
        """A read's rows (a statement that changes nothing, as its caller knows). On a
        pooled connection an earlier call left, closed by the server since (a restart,
        ``pg_terminate_backend``, an idle timeout), it runs once more on another
        (:meth:`run`: the dead one and the idle ones discarded first); a connection opened
        for this call is not tried again (a server that is down fails it after one connect
        attempt)."""
        pool = self._pool()
        conn, may_open = pool.take(self.pool_size)
        opened = False
        if conn is None:
            conn, opened = await self._wait_or_open(pool, may_open)
        try:
            cur = await conn.execute(sql.text, binds)
            rows: list[Any] = await cur.fetchall()
        except BaseException as err:
            if opened or not (isinstance(err, Exception) and is_disconnect(err)):
                await self._failed(conn, err, False, None)
            await self._lost(conn)
            return await self.run(sql, binds)
        self._release(conn)
        return rows

    async def _failed(self, conn: Any, err: BaseException, writing: bool,
                      sent: tuple[Request, LeaseSecret] | None, pid: int = 0) -> NoReturn:
        """``err`` from a statement on ``conn`` (given back to the pool, or discarded when it
        is gone or its state unknown), raised: a driver's error as a :class:`StoreError`.
        ``pid``: the backend a reservation (``sent``) was sent to."""
        if isinstance(err, Exception) and is_disconnect(err):
            await self._lost(conn)
            raise store_error(err, writing=writing) from err
        if isinstance(err, asyncio.CancelledError):
            if sent is not None and conn.closed and pid:
                # Cancelled again while psycopg asked the server to cancel the statement: it
                # closed the connection, and the statement may still be running on the
                # server (waiting on a lock), to commit after any read back. Ended first.
                _orphan_ended_then(self._conninfo, self._options, pid, release_lost,
                                   self._store, sent[0].namespace, sent[0].key, sent[1])
            elif sent is not None:
                release_lost(self._store, sent[0].namespace, sent[0].key, sent[1])
            await self._discard(conn)  # its state is unknown mid-query
            raise err
        self._release(conn)
        if isinstance(err, Exception) and type(err).__module__.startswith("psycopg"):
            raise store_error(err, writing=writing) from err
        raise err

    async def _lost(self, conn: Any) -> None:
        """``conn`` found closed by the server: discarded, and this loop's idle ones closed
        with it (they went through the same: a restart, an idle timeout), or each next call
        would meet one and fail."""
        await self._discard(conn)
        for idle in _taken_idle(self._pool()):
            await _close(idle)

    async def close(self) -> None:
        """Close this loop's idle connections (those in use close when they come back)."""
        with contextlib.suppress(RuntimeError):
            # The pool itself stays: connections in use still come back to it.
            pool = self._pools.get(asyncio.get_running_loop())
            if pool is not None:
                for conn in _taken_idle(pool):
                    await _close(conn)

    def close_idle(self) -> None:
        """Close the idle connections of every event loop, from any thread (``Store.close``).
        An idle connection is in no loop's hands, and closing one is a libpq call that
        awaits nothing. As with the sync store, the next call opens a new one."""
        if self._pid != os.getpid():
            return  # a forked child holds its parent's sockets: never close those
        for pool in list(self._pools.values()):
            for conn in _taken_idle(pool):
                with contextlib.suppress(Exception):
                    conn.pgconn.finish()

    # -- the operations the async begin loop and report use -----------------------------------

    async def reserve(self, req: Request, secret: LeaseSecret) -> EffectHead:
        """:meth:`Store.reserve`: one call of the generated reserve function."""
        sql = self._store.sql
        bare = is_bare(req)
        for _ in range(8):
            rows = await self.run(
                sql.reserve_bare if bare else sql.reserve,
                bare_binds(sql.reserve_bare, req, secret.hash) if bare else begin_binds(
                    req, State.IN_FLIGHT, secret.hash), writing=True, sent=(req, secret))
            if rows:
                return effect_head(rows[0])
        raise StoreError("could not reserve or read the key after 8 tries", key=req.key)

    async def move_new(self, move: Move, req: Request, secret: LeaseSecret) -> Moved:
        """:meth:`Store.move` of a new key in one call (:meth:`Store.one_call`), awaited; the
        moves that need a transaction run on a worker thread."""
        store = self._store
        if not store.one_call(move):
            return await abandonable(store, secret, lambda: store.move(None, move, req, secret))
        sql, binds = store.one_call_sql(move), move_binds(None, move, req, secret, None)
        tries = 1
        while True:
            try:
                rows = await self.run(sql, binds, writing=True, sent=(req, secret))
                return Moved(effect_head(rows[0]) if rows else None)
            except StoreError as err:
                pause = again_after(err, tries)  # a deadlock's victim, rolled back whole
                if pause is None:
                    return Moved(None, over_ceiling(err, move))
            await asyncio.sleep(pause)
            tries += 1

    async def fetch(self, namespace: str, key: str) -> EffectHead | None:
        """:meth:`Store.fetch`."""
        rows = await self.read(self._store.sql.fetch, {"namespace": namespace, "key": key})
        return found_head(rows[0], namespace, key) if rows else None

    async def get(self, namespace: str, key: str) -> EffectRow | None:
        """:meth:`Store.get`."""
        rows = await self.read(self._store.sql.fetch_row, {"namespace": namespace, "key": key})
        return effect_row(rows[0]) if rows else None

    async def approval(self, namespace: str, approval_id: str) -> ApprovalRow | None:
        """:meth:`Store.approval`."""
        rows = await self.read(self._store.sql.approval_get,
                               {"namespace": namespace, "approval_id": approval_id})
        return approval_row(rows[0]) if rows else None

    async def record_outcome(self, namespace: str, lease: Lease, outcome: Outcome, *,
                             result: str | None, error: str | None, reason: str | None,
                             note: str | None, actual_cost_micros: int | None,
                             spends: bool | None, overspend: Any = None,
                             keeps_vendor_key: bool = False) -> Recorded | None:
        """:meth:`Store.record_outcome`; natively when the attempt moves no spend."""
        store = self._store
        if spends is not False:
            return await store.on_worker(
                store.record_outcome, namespace, lease, outcome, result=result, error=error,
                reason=reason, note=note, actual_cost_micros=actual_cost_micros, spends=spends,
                overspend=overspend, keeps_vendor_key=keeps_vendor_key)
        binds = outcome_binds(namespace, lease, outcome, result=result, error=error,
                              reason=reason, note=note, actual_cost_micros=actual_cost_micros,
                              keeps_vendor_key=keeps_vendor_key)
        rows = await self.run(store.sql.report, binds, writing=True)
        if rows:
            return Recorded(rows[0][0], rows[0][1], False)
        rows = await self.run(store.sql.report_late, late_binds(binds, note), writing=True)
        return Recorded(rows[0][0], rows[0][1], True) if rows else None

    async def extend(self, namespace: str, lease: Lease, seconds: float,
                     vendor_ref: str | None = None) -> float | None:
        """:meth:`Store.extend`."""
        rows = await self.run(self._store.sql.extend,
                              extend_binds(namespace, lease, seconds, vendor_ref),
                              writing=True)
        return float(rows[0][0]) if rows else None


def _finish_idle(pool: _LoopPool, pid: int) -> None:
    """Close the idle connections of a loop that is gone (no loop left to await a close on:
    libpq's own, as :meth:`AsyncPostgres.close_idle`); never a parent's, in a forked child."""
    # Never waiting for the pool's lock: a collection run inside ``_taken_idle`` (an
    # allocation under the lock) calls this on the thread holding it, which would wait
    # forever. Whoever holds it for a gone loop's pool is closing its idle connections.
    if pid != os.getpid():
        return
    for conn in _taken_idle(pool, wait=False):
        with contextlib.suppress(Exception):
            conn.pgconn.finish()


def _taken_idle(pool: _LoopPool, *, wait: bool = True) -> list[Any]:
    """Take every idle connection out of ``pool`` (their slots freed) for closing; none
    when ``wait`` is False and another holds the pool's lock."""
    if not pool.lock.acquire(blocking=wait):
        return []
    try:
        taken, pool.idle = pool.idle, []
        pool.opened -= len(taken)
    finally:
        pool.lock.release()
    return taken


_ORPHAN_SQL = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
               "WHERE pid = %s AND state <> 'idle' AND usename = current_user")
_ALIVE_SQL = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state <> 'idle'"
_ORPHAN_WAIT = 5.0  # seconds for a terminated backend to be gone


def _orphan_ended_then(conninfo: str, options: Mapping[str, Any], pid: int,
                       then: Callable[..., None], *args: Any) -> None:
    """On a (non-daemon) thread of its own: end the statement backend ``pid`` may still be
    running for a connection psycopg closed mid-query (terminated, its transaction rolled
    back, unless it committed already), wait for it to be gone, then ``then(*args)``."""
    def run() -> None:
        import psycopg

        try:
            with psycopg.connect(conninfo, autocommit=True,
                                 **with_connect_timeout(conninfo, options)) as pg:
                pg.execute(_ORPHAN_SQL, (pid,))
                end = time.monotonic() + _ORPHAN_WAIT
                while pg.execute(_ALIVE_SQL, (pid,)).fetchone() is not None and (
                        time.monotonic() < end):
                    time.sleep(0.01)
        except Exception as err:  # then reads back as it would have: at worst a lapse
            log.warning("could not end the statement of a cancelled reservation: %s", err)
        then(*args)

    with contextlib.suppress(RuntimeError):  # the interpreter is shutting down
        threading.Thread(target=run, name="effectgate-orphan").start()


async def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
