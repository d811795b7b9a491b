"""A caller cancelled while its reservation or its report is on the way, on SQLite and
Postgres: the write cannot be taken back, so the gate settles it itself. A reservation made
for a caller already gone is released FAILED at once (its body never started), not left as a
live lease that lapses into AMBIGUOUS and waits for an operator; a finished body's report that
the closing loop cancels is written from a thread of its own, so the result is kept."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import effectgate as eg

from .conftest import PG_URL


@contextlib.contextmanager
def write_lock(gate: eg.Gate, seconds: float) -> Iterator[None]:
    """Hold the store's write lock for ``seconds`` from another connection (reads pass)."""
    ready = threading.Event()

    def hold() -> None:
        if gate.store.is_sqlite:
            import sqlite3

            conn = sqlite3.connect(gate.store.engine.url.database, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            ready.set()
            time.sleep(seconds)
            conn.execute("ROLLBACK")
            conn.close()
        else:
            import psycopg

            url = gate.store.url  # on a schema of its own (own_store_url): that one's table
            schema = url.rsplit("search_path%3D", 1)[1] if "search_path%3D" in url else None
            with psycopg.connect(PG_URL.replace("postgresql+psycopg", "postgresql"), **(
                    {"options": f"-csearch_path={schema}"} if schema else {})) as pg:
                pg.execute("LOCK TABLE effectgate_effects IN EXCLUSIVE MODE")
                ready.set()
                time.sleep(seconds)
                pg.rollback()

    holder = threading.Thread(target=hold)
    holder.start()
    ready.wait(10)
    try:
        yield
    finally:
        holder.join()


def _settled(gate: eg.Gate, key: str, timeout: float = 10.0) -> eg.EffectRecord | None:
    """The record once nothing is in flight for ``key`` (None: no record)."""
    end = time.monotonic() + timeout
    while True:
        try:
            record = gate.get(key)
        except eg.UnknownEffect:
            record = None
        if record is None or record.state is not eg.State.IN_FLIGHT or (
                time.monotonic() > end):
            return record
        time.sleep(0.05)


def _runs_again(gate: eg.Gate, key: str) -> bool:
    d = gate.begin(effect_type="payment.refund", key=key, payload={"txn": key})
    if d.decision is eg.Decision.EXECUTE:
        gate.report(d, "committed")
    return d.decision is eg.Decision.EXECUTE


def test_an_abegin_timed_out_while_its_reservation_waited_is_released(gate: eg.Gate) -> None:
    """``wait_for(gate.abegin(...))`` timed out while the write waited for the lock: the
    write landed after (150 of 150 tries on SQLite) as a live lease nobody held."""
    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(gate.abegin(effect_type="payment.refund", key="refund:b",
                                               payload={"txn": "refund:b"}), 0.2)

    with write_lock(gate, 0.8):
        asyncio.run(main())
    record = _settled(gate, "refund:b")
    if record is not None:  # written after its caller left: released, never held
        assert record.state is eg.State.FAILED
        assert record.error == "cancelled before the body started"
    assert _runs_again(gate, "refund:b")


def test_a_tool_cancelled_by_the_closing_loop_before_its_body_is_released(
        gate: eg.Gate) -> None:
    """The loop closes (asyncio.run returning with a tool still reserving) and cancels the
    tool and its shielded begin with it: the reservation is released FAILED."""
    ran: list[str] = []

    @gate.effect("refund:{txn}", effect_type="payment.refund")
    async def refund(txn: str) -> dict[str, str]:
        ran.append(txn)
        return {"ok": txn}

    async def main() -> None:
        asyncio.get_running_loop().create_task(refund("a"))
        await asyncio.sleep(0.2)  # the tool is inside its begin, waiting for the lock

    with write_lock(gate, 0.8):
        asyncio.run(main())
    record = _settled(gate, "refund:a")
    if record is not None:
        assert record.state is eg.State.FAILED
    assert ran == []
    assert asyncio.run(refund("a")) == {"ok": "a"} and ran == ["a"]


def _refund_then_close_the_loop(gate: eg.Gate) -> tuple[Any, list[str]]:
    """A gated refund run as a task that the program's loop closes on right after its body
    finished: its report, in a task of its own, is cancelled with the loop. The function and
    the keys its body ran for."""
    ran: list[str] = []
    done: asyncio.Event

    @gate.effect("refund:{txn}", effect_type="payment.refund")
    async def refund(txn: str) -> dict[str, str]:
        await asyncio.sleep(0.01)
        ran.append(txn)
        done.set()
        return {"refund_id": f"re_{txn}"}

    async def main() -> None:
        nonlocal done
        done = asyncio.Event()
        asyncio.get_running_loop().create_task(refund("t1"))
        await done.wait()  # the program ends once the work is seen done

    asyncio.run(main())
    return refund, ran


def test_a_finished_bodys_report_cancelled_by_the_closing_loop_is_still_written(
        gate: eg.Gate) -> None:
    """The body made the refund, then the loop closed: its report, in a task of its own, was
    cancelled with it; the effect stayed IN_FLIGHT, lapsed to AMBIGUOUS, its result lost."""
    refund, ran = _refund_then_close_the_loop(gate)
    record = _settled(gate, "refund:t1")
    assert record is not None and record.state is eg.State.COMMITTED
    assert record.result == {"refund_id": "re_t1"}
    assert asyncio.run(refund("t1")) == {"refund_id": "re_t1"} and ran == ["t1"]


def test_closing_the_gate_at_once_waits_for_that_report(make_gate: Any) -> None:
    """The report the closing loop left to a thread of its own is written before the gate's
    close() returns: close() does not shut the connection that thread writes on under it
    (that crashed a test process once, in psycopg)."""
    gate = make_gate()
    before = set(threading.enumerate())
    _refund_then_close_the_loop(gate)
    started = [t for t in threading.enumerate() if t not in before]
    gate.close()
    assert all(not t.is_alive() for t in started)
    record = make_gate().get("refund:t1")
    assert record.state is eg.State.COMMITTED and record.result == {"refund_id": "re_t1"}


@pytest.mark.parametrize("cut", [0.0, 0.001, 0.003, 0.01])
def test_no_begin_cut_short_is_ever_left_in_flight(gate: eg.Gate, cut: float) -> None:
    """Begins cut short at random points (before, during and after their write): each key is
    absent, executed by its caller, or FAILED; none is left held by nobody."""
    async def main() -> list[Any]:
        async def one(i: int) -> Any:
            try:
                return await asyncio.wait_for(gate.abegin(
                    effect_type="payment.refund", key=f"refund:{i}",
                    payload={"txn": f"refund:{i}"}), cut)
            except TimeoutError:
                return None
        return await asyncio.gather(*[one(i) for i in range(20)])

    decisions = asyncio.run(main())
    for i, d in enumerate(decisions):
        if d is not None and d.decision is eg.Decision.EXECUTE:  # its caller holds it
            assert gate.get(f"refund:{i}").state is eg.State.IN_FLIGHT
            gate.report(d, "committed")
            continue
        record = _settled(gate, f"refund:{i}")  # released (or never written) by now
        if record is not None:
            assert record.state is eg.State.FAILED, (i, record.state)
