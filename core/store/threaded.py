"""The store's reads and writes for async callers, each awaited on a worker thread so the
event loop never waits on the database."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..request import LeaseSecret, Request
    from . import Store
    from .rows import ApprovalRow, EffectHead, EffectRow

__all__ = ["ThreadedStore"]


class ThreadedStore:
    """The async face of a :class:`~effectgate.store.Store`, one thread hop per call."""

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    async def reserve(self, req: Request, secret: LeaseSecret) -> EffectHead:
        """:meth:`Store.reserve`, off the event loop."""
        return await asyncio.to_thread(self._store.reserve, req, secret)

    async def fetch(self, namespace: str, key: str) -> EffectHead | None:
        """:meth:`Store.fetch`, off the event loop."""
        return await asyncio.to_thread(self._store.fetch, namespace, key)

    async def get(self, namespace: str, key: str) -> EffectRow | None:
        """:meth:`Store.get`, off the event loop."""
        return await asyncio.to_thread(self._store.get, namespace, key)

    async def approval(self, namespace: str, approval_id: str) -> ApprovalRow | None:
        """:meth:`Store.approval`, off the event loop."""
        return await asyncio.to_thread(self._store.approval, namespace, approval_id)
