"""``Store.close`` under a steady stream of async calls (red team, round 9): the close waited
for every call handed over, including those that kept arriving while it waited, so it never
found a moment with none, waited out its whole budget, and then closed connections that
running calls were using. The process crashed (SQLite: a segmentation fault in
``connections.run``), two runs in four.

Now a close waits only for the calls handed over before it began; a call handed over while it
waits starts once the connections are closed, on a new one. And a call still running when the
budget runs out (a write waiting a minute for SQLite's lock) keeps its connection: closing it
under a statement is what crashes.

Each call here is held by an event (the database is the real one); the order of what
happened is noted across the threads."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import effectgate as eg
import effectgate.store as store_module

from .test_close_waits_for_worker_calls import Seen


def _wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


@pytest.mark.parametrize("caller", ["waits", "cancels"])
def test_a_call_handed_over_while_a_close_waits_starts_after_it(
        gate: eg.Gate, monkeypatch: pytest.MonkeyPatch, caller: str) -> None:
    """A call handed over before the close is waited for; one handed over while the close
    waits starts once the connections are closed, on a new one. If its caller stops waiting
    for it first (cancels), it is withdrawn: it never runs, and is no longer counted."""
    monkeypatch.setattr(store_module, "_BACKGROUND_WAIT", 120.0)  # never runs out here
    store = gate.store
    seen = Seen(store)
    entered, go = threading.Event(), threading.Event()

    def running() -> None:  # handed over before the close: it is waited for
        entered.set()
        go.wait(60)
        store.now()
        seen.note("before")

    def late() -> None:  # handed over while the close waits
        store.now()
        seen.note("late")

    async def main() -> None:
        first = asyncio.ensure_future(store.on_worker(running))
        assert await asyncio.to_thread(entered.wait, 60)
        closer = threading.Thread(target=store.close)
        closer.start()
        await asyncio.to_thread(_wait_for, lambda: store._worker_calls._open,
                                "the close waiting")
        second = asyncio.ensure_future(store.on_worker(late))
        # The late call is taken by another worker at once; were it to start, it would run
        # now and be noted before the close (the old code's order).
        await asyncio.sleep(0.5)
        if caller == "cancels":
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
        go.set()
        await asyncio.gather(first, *([second] if caller == "waits" else []))
        await asyncio.to_thread(closer.join, 60)

    asyncio.run(main())
    assert seen.events == ["before", "closed"] + (["late"] if caller == "waits" else [])
    assert not store._worker_calls._total


def test_a_call_still_running_when_the_wait_runs_out_keeps_its_connection(
        gate: eg.Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget runs out while a call is still on its connection (as a write waiting for
    SQLite's lock does): the close returns, and the connection that call uses is still open
    under it. The thread's next call opens a new one."""
    monkeypatch.setattr(store_module, "_BACKGROUND_WAIT", 0.2)
    store = gate.store
    entered, go = threading.Event(), threading.Event()
    answers: list[Any] = []

    def running() -> None:
        conn = store._conns.driver()  # this thread's connection, in use
        entered.set()
        go.wait(60)
        answers.append(conn.execute("SELECT 1").fetchone()[0])  # still open under it
        answers.append(store.now() > 0)  # the thread's next call: a new connection

    async def main() -> None:
        task = asyncio.ensure_future(store.on_worker(running))
        assert await asyncio.to_thread(entered.wait, 60)
        await asyncio.to_thread(store.close)  # returns once the 0.2 s wait ran out
        go.set()
        await task

    asyncio.run(main())
    assert answers == [1, True]
    store.close()  # the kept connection is closed by the next close
    assert not store._conns._opened


def test_a_close_from_another_thread_waits_for_a_read_on_the_event_loop(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On SQLite an async caller's reads run on its event loop (an embedded read takes
    microseconds): the red team's crash was one of those, on the loop, while a thread of the
    application closed the gate. The read is counted as a worker's call is: the close waits
    for it. (Postgres' async face reads on its own pooled connections, which a close leaves
    to their caller until they are idle.)"""
    monkeypatch.setattr(store_module, "_BACKGROUND_WAIT", 120.0)
    gate = eg.Gate(f"sqlite:///{tmp_path}/loop.db", namespace="loop-read", policy=False)
    store = gate.store
    seen = Seen(store)
    entered, go = threading.Event(), threading.Event()
    first_read = store.first_read

    def held(namespace: str, key: str) -> Any:
        if threading.current_thread() is threading.main_thread():  # the loop's read (the
            entered.set()  # reservation's own, on a worker, reads again: not held)
            go.wait(60)  # the loop is inside the store's read: the close comes now
            seen.note("read")
        return first_read(namespace, key)

    store.first_read = held  # type: ignore[method-assign]

    def close_then_let_go() -> None:
        assert entered.wait(60)
        closer = threading.Thread(target=store.close)
        closer.start()
        seen.closed.wait(0.5)  # a close that does not wait has closed by now
        go.set()
        closer.join(60)

    helper = threading.Thread(target=close_then_let_go)
    helper.start()

    async def main() -> eg.BeginDecision:
        return await gate.abegin(effect_type="payment.refund", key="refund:loop",
                                 payload={"n": 1})

    d = asyncio.run(main())
    helper.join(60)
    assert d.decision is eg.Decision.EXECUTE
    assert seen.events == ["read", "closed"]
    gate.report(d, "committed", result={"ok": True})
    assert gate.get("refund:loop").state is eg.State.COMMITTED
    gate.close()


def test_a_call_handed_over_during_one_close_is_waited_for_by_the_next(
        gate: eg.Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of the fix: a call handed over during a first close stayed held back for as
    long as any close was under way, a second one included, taking an executor worker each:
    with enough of them the calls a second close waited for could not start, and it waited
    out its whole budget (5 s, every time, under a steady stream of closes). A call handed
    over during a close waits for that close alone, and a close that began after it waits
    for it: here it has run when the second close closes the connections."""
    monkeypatch.setattr(store_module, "_BACKGROUND_WAIT", 120.0)
    store = gate.store
    calls = store._worker_calls
    entered, go = threading.Event(), threading.Event()
    ran: list[str] = []
    closes: list[bool] = []
    close = store._conns.close

    def closing(busy: frozenset[int] = frozenset()) -> None:
        closes.append(bool(ran))  # had the call handed over during the first close run?
        close(busy)

    store._conns.close = closing  # type: ignore[method-assign]

    def running() -> None:
        entered.set()
        go.wait(60)

    async def main() -> None:
        first = asyncio.ensure_future(store.on_worker(running))
        assert await asyncio.to_thread(entered.wait, 60)
        one = threading.Thread(target=store.close)
        one.start()
        await asyncio.to_thread(_wait_for, lambda: len(calls._open) == 1, "the first close")
        during = asyncio.ensure_future(store.on_worker(lambda: ran.append("during")))
        await asyncio.sleep(0.2)  # taken by a worker, held back by the first close
        two = threading.Thread(target=store.close)
        two.start()
        await asyncio.to_thread(_wait_for, lambda: len(calls._open) == 2, "the second close")
        go.set()
        await asyncio.gather(first, during)
        await asyncio.to_thread(one.join, 60)
        await asyncio.to_thread(two.join, 60)

    asyncio.run(main())
    assert closes == [False, True] and ran == ["during"] and not calls._total
