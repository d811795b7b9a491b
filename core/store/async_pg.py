"""The store's per-call operations for async callers on Postgres, on psycopg's own
``AsyncConnection``: no thread hop. Each event loop gets its own small pool of connections
(a connection belongs to the loop that opened it); a forked child opens its own.

The statements, their binds and how rows are read are the sync store's (``Store``): this module
only awaits them. Operations that need a transaction (a governed move, a report that moves
spend) stay on the sync store, run on a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from ..states import State
from .connections import is_disconnect, safe_url, store_error
from .rows import (
    ApprovalRow,
    EffectHead,
    EffectRow,
    Moved,
    Recorded,
    approval_row,
    effect_head,
    effect_row,
)

if TYPE_CHECKING:
    from ..decide import Move
    from ..request import Lease, LeaseSecret, Request
    from ..states import Outcome
    from . import Store
    from .statements import Sql

__all__ = ["AsyncPostgres"]

_IDLE = 8  # connections kept per event loop


class AsyncPostgres:
    """The async face of a Postgres :class:`~effectgate.store.Store`."""

    def __init__(self, store: Store, conninfo: str, connect_options: Mapping[str, Any],
                 synchronous: str | None) -> None:
        self._store = store
        self._conninfo = conninfo
        self._options = dict(connect_options)
        self._synchronous = synchronous
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = (
            weakref.WeakKeyDictionary())
        self._pid = os.getpid()

    # -- connections -------------------------------------------------------------------------

    async def _acquire(self) -> Any:
        if self._pid != os.getpid():  # a forked child: never touch the parent's sockets
            self._pools = weakref.WeakKeyDictionary()
            self._pid = os.getpid()
        pool = self._pools.setdefault(asyncio.get_running_loop(), [])
        while pool:
            conn = pool.pop()
            if not conn.closed:
                return conn
        import psycopg

        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True,
                                                         **self._options)
            if self._synchronous is not None:
                await conn.execute(self._synchronous)
            else:
                row = await (await conn.execute("SHOW synchronous_commit")).fetchone()
                if row is not None and row[0] == "off":  # as the sync store does
                    await conn.execute("SET synchronous_commit = on")
        except Exception as err:
            raise StoreError(f"cannot reach the store at {safe_url(self._store.url)}: "
                             f"{type(err).__name__}") from err
        return conn

    def _release(self, conn: Any) -> None:
        pool = self._pools.setdefault(asyncio.get_running_loop(), [])
        if len(pool) < _IDLE and not conn.closed:
            pool.append(conn)
        else:
            task = asyncio.ensure_future(_close(conn))
            _closing.add(task)
            task.add_done_callback(_closing.discard)

    async def run(self, sql: Sql, binds: Mapping[str, Any], *,
                  writing: bool = False) -> list[Any]:
        """One statement in autocommit on this loop's connection."""
        conn = await self._acquire()
        try:
            cur = await conn.execute(sql.text, binds)
            rows: list[Any] = await cur.fetchall()
        except BaseException as err:
            if isinstance(err, Exception) and is_disconnect(err):
                await _close(conn)
                raise store_error(err, writing=writing) from err
            if isinstance(err, asyncio.CancelledError):
                await _close(conn)  # its state is unknown mid-query
                raise
            self._release(conn)
            if isinstance(err, Exception) and type(err).__module__.startswith("psycopg"):
                raise store_error(err, writing=writing) from err
            raise
        self._release(conn)
        return rows

    async def close(self) -> None:
        """Close this loop's connections."""
        with contextlib.suppress(RuntimeError):
            for conn in self._pools.pop(asyncio.get_running_loop(), []):
                await _close(conn)

    def close_idle(self) -> None:
        """Close the idle connections of every event loop, from any thread (``Store.close``).
        An idle connection is in no loop's hands, and closing one is a libpq call that
        awaits nothing. As with the sync store, the next call opens a new one."""
        if self._pid != os.getpid():
            return  # a forked child holds its parent's sockets: never close those
        pools, self._pools = self._pools, weakref.WeakKeyDictionary()
        for pool in list(pools.values()):
            while pool:
                with contextlib.suppress(Exception):
                    pool.pop().pgconn.finish()

    # -- the operations the async begin loop and report use -----------------------------------

    async def reserve(self, req: Request, secret: LeaseSecret) -> EffectHead:
        """:meth:`Store.reserve`: one call of the generated reserve function."""
        from . import _begin_binds

        for _ in range(8):
            rows = await self.run(self._store.sql.reserve,
                                  _begin_binds(req, State.IN_FLIGHT, secret.hash), writing=True)
            if rows:
                return effect_head(rows[0])
        raise StoreError("could not reserve or read the key after 8 tries", key=req.key)

    async def move_new(self, move: Move, req: Request, secret: LeaseSecret) -> Moved:
        """:meth:`Store.move` of a new key in one call (:meth:`Store.one_call`), awaited; the
        moves that need a transaction run on a worker thread."""
        from . import move_binds, over_ceiling

        store = self._store
        if not store.one_call(move):
            return await asyncio.to_thread(store.move, None, move, req, secret)
        try:
            rows = await self.run(store.one_call_sql(move),
                                  move_binds(None, move, req, secret, None), writing=True)
        except StoreError as err:
            return Moved(None, over_ceiling(err, move))
        return Moved(effect_head(rows[0]) if rows else None)

    async def fetch(self, namespace: str, key: str) -> EffectHead | None:
        """:meth:`Store.fetch`."""
        rows = await self.run(self._store.sql.fetch, {"namespace": namespace, "key": key})
        return effect_head(rows[0]) if rows else None

    async def get(self, namespace: str, key: str) -> EffectRow | None:
        """:meth:`Store.get`."""
        rows = await self.run(self._store.sql.fetch_row, {"namespace": namespace, "key": key})
        return effect_row(rows[0]) if rows else None

    async def approval(self, namespace: str, approval_id: str) -> ApprovalRow | None:
        """:meth:`Store.approval`."""
        rows = await self.run(self._store.sql.approval_get,
                              {"namespace": namespace, "approval_id": approval_id})
        return approval_row(rows[0]) if rows else None

    async def record_outcome(self, namespace: str, lease: Lease, outcome: Outcome, *,
                             result: str | None, error: str | None, reason: str | None,
                             note: str | None, actual_cost_micros: int | None,
                             spends: bool | None, overspend: Any = None) -> Recorded | None:
        """:meth:`Store.record_outcome`; natively when the attempt moves no spend."""
        store = self._store
        if spends is not False:
            return await asyncio.to_thread(
                store.record_outcome, namespace, lease, outcome, result=result, error=error,
                reason=reason, note=note, actual_cost_micros=actual_cost_micros, spends=spends,
                overspend=overspend)
        binds, late = store.outcome_binds(namespace, lease, outcome, result=result, error=error,
                                          reason=reason, note=note,
                                          actual_cost_micros=actual_cost_micros)
        rows = await self.run(store.sql.report, binds, writing=True)
        if rows:
            return Recorded(rows[0][0], rows[0][1], False)
        rows = await self.run(store.sql.report_late, late, writing=True)
        return Recorded(rows[0][0], rows[0][1], True) if rows else None

    async def extend(self, namespace: str, lease: Lease, seconds: float) -> float | None:
        """:meth:`Store.extend`."""
        rows = await self.run(self._store.sql.extend,
                              self._store.extend_binds(namespace, lease, seconds), writing=True)
        return float(rows[0][0]) if rows else None


_closing: set[asyncio.Future[None]] = set()


async def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
