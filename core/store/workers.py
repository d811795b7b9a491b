"""The calls an async caller hands a store to run on the event loop's executor threads
(:meth:`effectgate.store.Store.on_worker`), counted so that :meth:`~effectgate.store.Store.close`
waits for them before it closes any connection: closing a connection while another thread
runs a statement on it can crash the process (SQLite's and psycopg's both). A worker thread
stays in the executor's pool after its call, so the calls are counted, not the threads.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["WorkerCalls"]

_HANDED, _STARTED, _WITHDRAWN = range(3)  # a worker call's ticket: who counts it down

# Every live WorkerCalls: a forked child starts each one afresh, in the forking thread before
# fork() returns (the only thread the child has), so no two threads of the child can both
# reset one and lose a count.
_live: weakref.WeakSet[WorkerCalls] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for calls in list(_live):
        calls._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)


class WorkerCalls:
    """The store's work off its callers' threads that has not ended: the calls
    :meth:`Store.on_worker` handed to the executor's threads (not started yet, or running)
    and the threads :meth:`Store.in_background` started, by thread. Each is counted from the
    moment it is handed over (a :meth:`Store.close` right after it must not close the
    connections before a thread takes it) to its end. A call its caller withdrew before a
    worker started it (a cancel that came first) is not counted, and is not run. The lock is
    held only briefly, and by :meth:`quiet` while a store closes."""

    __slots__ = ("__weakref__", "_closing", "_cond", "_lock", "_running", "_total")

    def __init__(self) -> None:
        self._reset()
        _live.add(self)

    def _reset(self) -> None:
        """Nothing counted, nobody waiting: new, or in a forked child (the parent's calls, and
        its lock, maybe held, are not there)."""
        self._lock = threading.Lock()  # entered as itself (the C lock's ``with``: cheaper)
        self._cond = threading.Condition(self._lock)
        self._total = 0  # handed over or running
        self._running: dict[int, int] = {}  # thread id: how many of its calls run (nested)
        self._closing = 0  # closes waiting for calls to end (none: nobody to wake)

    def handed(self) -> list[int]:
        """Count a call just handed to the executor; its ticket."""
        with self._lock:
            self._total += 1
        return [_HANDED]

    def start(self, ticket: list[int]) -> bool:
        """On the thread, before the call: counted as this thread's from now on. False (not
        counted: do not run it) when its caller withdrew it first: its cancel came first, and
        the call is as if it never was handed over (nothing runs after a close)."""
        me = threading.get_ident()
        with self._lock:
            if ticket[0] == _WITHDRAWN:
                return False
            ticket[0] = _STARTED
            self._running[me] = self._running.get(me, 0) + 1
            return True

    def end(self) -> None:
        """On the worker, after the call."""
        me = threading.get_ident()
        with self._lock:
            left = self._running.pop(me, 0) - 1
            if left > 0:
                self._running[me] = left
            self._total -= 1
            if self._closing:
                self._cond.notify_all()

    def withdraw(self, ticket: list[int]) -> None:
        """Its caller has stopped awaiting a call (cancelled, or the executor refused it):
        no longer counted if no worker has taken it."""
        with self._lock:
            if ticket[0] == _HANDED:
                ticket[0] = _WITHDRAWN
                self._total -= 1
                if self._closing:
                    self._cond.notify_all()

    @contextmanager
    def quiet(self, deadline: float) -> Iterator[None]:
        """Held once no call is handed over or running but the calling thread's own, or at
        ``deadline`` (``time.monotonic``); none starts or ends until the block is left."""
        me = threading.get_ident()
        with self._cond:
            self._closing += 1
            try:
                while self._total - self._running.get(me, 0) > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            finally:
                self._closing -= 1
            yield
