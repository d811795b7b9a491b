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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["WorkerCalls"]

_HANDED, _STARTED, _WITHDRAWN = range(3)  # a worker call's ticket: who counts it down
_T = TypeVar("_T")

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
    worker started it (a cancel that came first) is not counted, and is not run.

    A close waits for the calls handed over before it began (and for what they hand over in
    turn), not for those new callers hand over while it waits (late): under a steady stream
    of calls it would else wait out its whole budget and then close connections in use. A
    late call starts once the close is done, on a new connection. The lock is held only
    briefly, and by :meth:`quiet` while a store closes."""

    __slots__ = ("__weakref__", "_closing", "_cond", "_late", "_lock", "_running", "_total")

    def __init__(self) -> None:
        self._reset()
        _live.add(self)

    def _reset(self) -> None:
        """Nothing counted, nobody waiting: new, or in a forked child (the parent's calls, and
        its lock, maybe held, are not there)."""
        self._lock = threading.Lock()  # entered as itself (the C lock's ``with``: cheaper)
        self._cond = threading.Condition(self._lock)
        self._total = 0  # handed over or running
        self._late = 0  # of those, handed over while a close waited, and not started yet
        self._running: dict[int, int] = {}  # thread id: how many of its calls run (nested)
        self._closing = 0  # closes waiting or closing (none: nobody to wake)

    def handed(self) -> list[int]:
        """Count a call just handed to the executor; its ticket (its state, and whether it is
        late: handed over while a close was under way, by a thread that runs none of the calls
        the close waits for; one such call's own work, a release it leaves to a thread, is
        part of it, and waited for)."""
        with self._lock:
            self._total += 1
            if self._closing and threading.get_ident() not in self._running:
                self._late += 1
                return [_HANDED, 1]
        return [_HANDED, 0]

    def start(self, ticket: list[int]) -> bool:
        """On the thread, before the call: counted as this thread's from now on. False (not
        counted: do not run it) when its caller withdrew it first: its cancel came first, and
        the call is as if it never was handed over (nothing runs after a close). A late call
        waits here until the close is done."""
        me = threading.get_ident()
        with self._cond:
            while ticket[1] and self._closing and ticket[0] != _WITHDRAWN:
                self._cond.wait()
            if ticket[0] == _WITHDRAWN:
                return False
            if ticket[1]:
                ticket[1] = 0
                self._late -= 1
            ticket[0] = _STARTED
            self._running[me] = self._running.get(me, 0) + 1
            return True

    def here(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the calling thread, counted as a worker's call is: an async
        caller's read on its event loop (SQLite), which a close from another thread must not
        close the connection under. A late one waits for that close to end first."""
        ticket = self.handed()
        self.start(ticket)
        try:
            return fn(*args)
        finally:
            self.end()

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
                if ticket[1]:
                    ticket[1] = 0
                    self._late -= 1
                if self._closing:
                    self._cond.notify_all()

    @contextmanager
    def quiet(self, deadline: float) -> Iterator[frozenset[int]]:
        """Held once no call handed over before it began is waiting or running but the calling
        thread's own, or at ``deadline`` (``time.monotonic``); none starts or ends until the
        block is left, and late ones start after it. What it holds: the threads whose calls
        still run (past the deadline: a connection they use must not be closed under them)."""
        me = threading.get_ident()
        with self._cond:
            self._closing += 1
            try:
                while self._total - self._late - self._running.get(me, 0) > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                yield frozenset(t for t in self._running if t != me)
            finally:
                self._closing -= 1
                self._cond.notify_all()  # late calls waiting to start
