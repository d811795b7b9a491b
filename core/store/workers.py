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

    Closes are numbered as they begin. A close waits for the calls handed over before it
    began (and for what they hand over in turn), not for those new callers hand over while
    it waits: under a steady stream of calls it would else wait out its whole budget and then
    close connections in use. Such a late call starts once the closes it came during are
    done, on a new connection; a close that begins after it waits for it as for any other.
    The lock is held only briefly, and by :meth:`quiet` while a store closes."""

    __slots__ = ("__weakref__", "_began", "_cond", "_live", "_lock", "_open", "_running")

    def __init__(self) -> None:
        self._reset()
        _live.add(self)

    def _reset(self) -> None:
        """Nothing counted, nobody waiting: new, or in a forked child (the parent's calls, and
        its lock, maybe held, are not there)."""
        self._lock = threading.Lock()  # entered as itself (the C lock's ``with``: cheaper)
        self._cond = threading.Condition(self._lock)
        self._began = 0  # closes begun so far (each one's number)
        self._open: set[int] = set()  # the numbers of the closes under way
        self._live: dict[int, int] = {}  # closes begun when handed over: calls not ended
        self._running: dict[int, int] = {}  # thread id: how many of its calls run (nested)

    @property
    def _total(self) -> int:
        """Calls handed over or running."""
        return sum(self._live.values())

    def handed(self) -> list[int]:
        """Count a call just handed to the executor; its ticket: its state, and how many
        closes had begun when it was handed over (a call a counted call hands over is part of
        that call's work, as if handed over before any close)."""
        with self._lock:
            began = 0 if self._open and threading.get_ident() in self._running else self._began
            self._live[began] = self._live.get(began, 0) + 1
            return [_HANDED, began]

    def start(self, ticket: list[int]) -> bool:
        """On the thread, before the call: counted as this thread's from now on. False (not
        counted: do not run it) when its caller withdrew it first: its cancel came first, and
        the call is as if it never was handed over (nothing runs after a close). A call handed
        over during a close waits here until that close is done."""
        me = threading.get_ident()
        with self._cond:
            while ticket[0] != _WITHDRAWN and self._open and min(self._open) <= ticket[1]:
                self._cond.wait()
            if ticket[0] == _WITHDRAWN:
                return False
            ticket[0] = _STARTED
            self._running[me] = self._running.get(me, 0) + 1
            return True

    def here(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the calling thread, counted as a worker's call is: an async
        caller's read on its event loop (SQLite), which a close from another thread must not
        close the connection under. One that comes during that close waits for it first."""
        ticket = self.handed()
        self.start(ticket)
        try:
            return fn(*args)
        finally:
            self.end(ticket)

    def end(self, ticket: list[int]) -> None:
        """On the worker, after the call."""
        me = threading.get_ident()
        with self._lock:
            left = self._running.pop(me, 0) - 1
            if left > 0:
                self._running[me] = left
            self._forget(ticket)

    def withdraw(self, ticket: list[int]) -> None:
        """Its caller has stopped awaiting a call (cancelled, or the executor refused it):
        no longer counted if no worker has taken it."""
        with self._lock:
            if ticket[0] == _HANDED:
                ticket[0] = _WITHDRAWN
                self._forget(ticket)

    def _forget(self, ticket: list[int]) -> None:
        """(Under the lock.) ``ticket``'s call is no longer counted; a close waiting wakes."""
        left = self._live[ticket[1]] - 1
        if left:
            self._live[ticket[1]] = left
        else:
            del self._live[ticket[1]]
        if self._open:
            self._cond.notify_all()

    @contextmanager
    def quiet(self, deadline: float) -> Iterator[frozenset[int]]:
        """Held once no call handed over before it began is waiting or running but the calling
        thread's own, or at ``deadline`` (``time.monotonic``); none starts or ends until the
        block is left, and calls handed over meanwhile start after it. What it holds: the
        threads whose calls still run (past the deadline: a connection they use must not be
        closed under them)."""
        me = threading.get_ident()
        with self._cond:
            self._began += 1
            number = self._began
            self._open.add(number)
            try:
                while sum(n for began, n in self._live.items() if began < number) - (
                        self._running.get(me, 0)) > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                yield frozenset(t for t in self._running if t != me)
            finally:
                self._open.discard(number)
                self._cond.notify_all()  # calls handed over meanwhile, waiting to start
