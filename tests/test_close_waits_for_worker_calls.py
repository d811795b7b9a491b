"""``Store.close`` never closes a connection under a write an async caller left on a worker
thread of the loop's executor (``asyncio.to_thread``): closing a connection while another
thread executes on it can crash the process (SQLite's and psycopg's both). The threads stay in
the executor's pool after their call, so the store counts the calls (``Store.on_worker``), not
the threads, from the moment one is handed over to its end.

Each write here is held on its worker by a wrapped store method waiting on an event (the
database itself is the real one). The event is set once the connections have closed, or
after a moment if they have not: a close that does not wait has closed them by then, and the
held write lands after."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

import effectgate as eg
import effectgate.store as store_module

if TYPE_CHECKING:
    from effectgate.store import Store

_ABANDONED = "cancelled before the body started"


@pytest.fixture(autouse=True)
def _close_waits_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy machine never makes a close that waits give up: only a close that does not
    wait closes the connections before the write is done."""
    monkeypatch.setattr(store_module, "_BACKGROUND_WAIT", 120.0)


class Seen:
    """What happened, in order, across the threads: the held write, the connections'
    close."""

    def __init__(self, store: Store) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.closed = threading.Event()
        conns = store._conns
        close = conns.close

        def closing(busy: frozenset[int] = frozenset()) -> None:
            self.note("closed")
            self.closed.set()
            close(busy)

        conns.close = closing  # type: ignore[method-assign]

    def note(self, event: str) -> None:
        with self.lock:
            self.events.append(event)


def hold(store: Store, name: str, seen: Seen) -> tuple[threading.Event, threading.Event,
                                                           threading.Event]:
    """Wrap ``store.<name>`` so that a call on a worker thread waits for ``go`` before it
    runs (``entered`` set as it starts waiting), notes ``name`` once it has run, and sets
    ``done``."""
    entered, go, done = threading.Event(), threading.Event(), threading.Event()
    real: Callable[..., Any] = getattr(store, name)

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        go.wait(60)
        try:
            return real(*args, **kwargs)
        finally:
            seen.note(name)
            done.set()

    setattr(store, name, held)
    return entered, go, done


@contextlib.contextmanager
def let_go_once_closed_or_waiting(seen: Seen, go: threading.Event) -> Iterator[None]:
    """Around a close(): set ``go`` once the connections are closed, or after a moment (a
    close that waits is still waiting then)."""
    def let_go() -> None:
        seen.closed.wait(0.5)
        go.set()

    helper = threading.Thread(target=let_go)
    helper.start()
    try:
        yield
    finally:
        helper.join(60)


def _failed_once(gate: eg.Gate, key: str) -> None:
    """``key`` begun and reported FAILED: its next begin moves the row, on a worker thread
    (both stores: a move of an existing row needs a transaction)."""
    d = gate.begin(effect_type="payment.refund", key=key, payload={"txn": key})
    assert d.decision is eg.Decision.EXECUTE
    gate.report(d, "failed", error="declined")


def test_close_waits_for_the_write_of_a_cancelled_abegin_and_its_release(
        gate: eg.Gate) -> None:
    """The last review's case: an ``abegin`` cancelled while its write is on a worker, then
    ``gate.close()`` on the loop at once. The write, and the release the worker makes of what
    it reserved for the caller that is gone, end before the connections close."""
    store = gate.store
    _failed_once(gate, "refund:1")
    seen = Seen(store)
    entered, go, _ = hold(store, "move", seen)
    released = threading.Event()
    record = store.record_outcome

    def releasing(*args: Any, **kwargs: Any) -> Any:
        try:
            return record(*args, **kwargs)
        finally:
            seen.note("released")
            released.set()

    store.record_outcome = releasing  # type: ignore[method-assign]

    async def main() -> None:
        task = asyncio.ensure_future(gate.abegin(effect_type="payment.refund", key="refund:1",
                                                 payload={"txn": "refund:1"}))
        assert await asyncio.to_thread(entered.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with let_go_once_closed_or_waiting(seen, go):
            gate.close()

    asyncio.run(main())
    assert released.wait(60)
    assert seen.events == ["move", "released", "closed"]
    row = gate.get("refund:1")
    assert row.state is eg.State.FAILED and row.error == _ABANDONED
    assert not store._worker_calls._total


def test_close_waits_for_a_report_on_a_worker(gate: eg.Gate) -> None:
    """A report the async face writes on a worker (SQLite's always; Postgres' when it may
    move spend), in flight as the loop closes the store: written first, then closed."""
    store = gate.store
    d = gate.begin(effect_type="payment.refund", key="refund:2", payload={"txn": "refund:2"})
    seen = Seen(store)
    entered, go, done = hold(store, "record_outcome", seen)

    async def main() -> None:
        face = store.async_face()
        task = asyncio.ensure_future(face.record_outcome(
            gate.namespace, d.lease, eg.Outcome.COMMITTED, result='{"ok": 2}', error=None,
            reason=None, note=None, actual_cost_micros=None, spends=None))
        assert await asyncio.to_thread(entered.wait, 60)
        with let_go_once_closed_or_waiting(seen, go):
            gate.close()
        assert await task is not None

    asyncio.run(main())
    assert done.wait(60)
    assert seen.events == ["record_outcome", "closed"]
    assert gate.get("refund:2").state is eg.State.COMMITTED


@contextlib.contextmanager
def one_busy_worker() -> Iterator[tuple[threading.Event, threading.Event]]:
    """The running loop's default executor: one worker, kept busy (not with the store) until
    the second event is set; the first is set once it is busy. Calls handed over meanwhile
    wait in its queue."""
    loop = asyncio.get_running_loop()
    executor = concurrent.futures.ThreadPoolExecutor(1)
    loop.set_default_executor(executor)
    busy, free = threading.Event(), threading.Event()

    def occupy() -> None:
        busy.set()
        free.wait(60)

    executor.submit(occupy)
    assert busy.wait(60)
    try:
        yield busy, free
    finally:
        free.set()


def test_close_waits_for_a_write_handed_over_before_a_worker_took_it(
        gate: eg.Gate) -> None:
    """A write handed to the executor whose workers are all busy: close() right after waits
    for it too (it would run after the close, on a connection opened anew and left open)."""
    store = gate.store
    d = gate.begin(effect_type="payment.refund", key="refund:3", payload={"txn": "refund:3"})
    seen = Seen(store)
    _, go, done = hold(store, "record_outcome", seen)
    go.set()  # the write itself does not wait: the executor's queue holds it

    async def main() -> None:
        with one_busy_worker() as (_, free):
            task = asyncio.ensure_future(store.async_face().record_outcome(
                gate.namespace, d.lease, eg.Outcome.COMMITTED, result=None, error=None,
                reason=None, note=None, actual_cost_micros=None, spends=None))
            for _ in range(3):  # the task hands its write over
                await asyncio.sleep(0)
            assert not done.is_set()
            with let_go_once_closed_or_waiting(seen, free):
                gate.close()
            assert await task is not None

    asyncio.run(main())
    assert done.wait(60)
    assert seen.events == ["record_outcome", "closed"]
    assert gate.get("refund:3").state is eg.State.COMMITTED


def test_a_write_withdrawn_before_a_worker_took_it_is_not_waited_for(
        gate: eg.Gate) -> None:
    """Its caller cancelled while the write still waited in the executor's queue: it never
    runs, and close() does not wait for it (it would, until its bound, for a write that is
    not coming)."""
    store = gate.store
    d = gate.begin(effect_type="payment.refund", key="refund:4", payload={"txn": "refund:4"})
    seen = Seen(store)
    _, go, _ = hold(store, "record_outcome", seen)
    go.set()

    async def main() -> None:
        with one_busy_worker() as (_, free):
            task = asyncio.ensure_future(store.async_face().record_outcome(
                gate.namespace, d.lease, eg.Outcome.COMMITTED, result=None, error=None,
                reason=None, note=None, actual_cost_micros=None, spends=None))
            for _ in range(3):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

            def let_go() -> None:
                seen.closed.wait(60)  # a close that waited would hold the worker's queue
                seen.note("worker free")
                free.set()

            helper = threading.Thread(target=let_go)
            helper.start()
            gate.close()
            helper.join(60)

    asyncio.run(main())
    assert seen.events == ["closed", "worker free"]  # and the write never ran
    assert gate.get("refund:4").state is eg.State.IN_FLIGHT


def test_a_close_on_a_worker_inside_a_call_does_not_wait_for_that_call(
        gate: eg.Gate) -> None:
    """A close() made on a worker thread from inside the call that worker runs (a hook
    closing the gate): it closes at once rather than wait for itself until its bound."""
    store = gate.store
    d = gate.begin(effect_type="payment.refund", key="refund:5", payload={"txn": "refund:5"})
    seen = Seen(store)
    record = store.record_outcome

    def closing_first(*args: Any, **kwargs: Any) -> Any:
        store.close()
        seen.note("closed inside")
        return record(*args, **kwargs)

    store.record_outcome = closing_first  # type: ignore[method-assign]

    in_time: list[bool] = []
    watcher = threading.Thread(target=lambda: in_time.append(seen.closed.wait(60)))
    watcher.start()

    async def main() -> None:
        assert await store.async_face().record_outcome(
            gate.namespace, d.lease, eg.Outcome.COMMITTED, result=None, error=None,
            reason=None, note=None, actual_cost_micros=None, spends=None) is not None

    # A close that waited for its own call would hold it (120 s) past the watcher's 60 s.
    asyncio.run(main())
    watcher.join(60)
    assert in_time == [True] and seen.events == ["closed", "closed inside"]
    assert gate.get("refund:5").state is eg.State.COMMITTED


def test_close_waits_for_a_thread_a_worker_call_starts_while_it_waits(gate: eg.Gate) -> None:
    """A worker call that starts a background thread (a sync begin on a worker whose reply
    was lost releases the reservation on a thread of its own) after close() began: close
    waits for that thread too (it joined the background threads first, then waited for the
    worker calls, and let the thread run on over the connections it closed). The call is
    still counted when it hands the thread over."""
    import time

    store = gate.store
    closed, waiting = threading.Event(), threading.Event()
    seen: list[bool] = []

    def late() -> None:
        time.sleep(0.3)  # long enough for a close() that did not wait to return
        seen.append(closed.is_set())

    def worker_call() -> None:
        waiting.wait(10)
        time.sleep(0.2)  # close() is waiting by now
        store.in_background("effectgate-late", late)

    runner = threading.Thread(target=lambda: asyncio.run(store.on_worker(worker_call)))
    runner.start()
    waiting.set()
    time.sleep(0.05)
    store.close()
    closed.set()
    runner.join(10)
    for thread in threading.enumerate():
        if thread.name == "effectgate-late":
            thread.join(10)
    assert seen == [False]  # it ended before close() returned
