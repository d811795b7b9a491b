"""The store's operations for async callers on SQLite: reads on the event loop itself (an
embedded read takes microseconds, and in WAL mode never waits on a writer), writes on a worker
thread (a write may wait for the file's lock, and a synchronous commit for the disk). Both are
counted (:class:`~effectgate.store.workers.WorkerCalls`): a close from another thread waits
for them rather than close a connection under a statement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .abandoned import abandonable

if TYPE_CHECKING:
    from ..decide import Move
    from ..request import Lease, LeaseSecret, Request
    from . import Store
    from .rows import ApprovalRow, CommittedHead, EffectHead, EffectRow, Moved, Recorded

__all__ = ["ThreadedStore"]


class ThreadedStore:
    """The async face of an embedded :class:`~effectgate.store.Store`."""

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    def close_idle(self) -> None:
        """Nothing to close: the sync store's connections are the only ones."""

    async def reserve(self, req: Request, secret: LeaseSecret) -> EffectHead | CommittedHead:
        """:meth:`Store.reserve`: a repeat is answered by a read on the loop; only a new key
        goes to a worker thread to be written (released if its caller is gone by then:
        :mod:`effectgate.store.abandoned`)."""
        store = self._store
        row = store._worker_calls.here(store.first_read, req.namespace, req.key)
        if row is not None:
            return row
        return await abandonable(store, secret, lambda: store.reserve(req, secret))

    async def move_new(self, move: Move, req: Request, secret: LeaseSecret) -> Moved:
        """:meth:`Store.move` of a new key, on a worker thread."""
        store = self._store
        return await abandonable(store, secret, lambda: store.move(None, move, req, secret))

    async def fetch(self, namespace: str, key: str) -> EffectHead | None:
        """:meth:`Store.fetch`, on the loop."""
        return self._store._worker_calls.here(self._store.fetch, namespace, key)

    async def get(self, namespace: str, key: str) -> EffectRow | None:
        """:meth:`Store.get`, on the loop."""
        return self._store._worker_calls.here(self._store.get, namespace, key)

    async def approval(self, namespace: str, approval_id: str) -> ApprovalRow | None:
        """:meth:`Store.approval`, on the loop."""
        return self._store._worker_calls.here(self._store.approval, namespace, approval_id)

    async def record_outcome(self, namespace: str, lease: Lease, outcome: Any,
                             **kwargs: Any) -> Recorded | None:
        """:meth:`Store.record_outcome`, on a worker thread (:meth:`Store.on_worker`)."""
        return await self._store.on_worker(self._store.record_outcome, namespace, lease,
                                           outcome, **kwargs)

    async def extend(self, namespace: str, lease: Lease, seconds: float,
                     vendor_ref: str | None = None) -> float | None:
        """:meth:`Store.extend`, on a worker thread (:meth:`Store.on_worker`)."""
        return await self._store.on_worker(self._store.extend, namespace, lease, seconds,
                                           vendor_ref)
