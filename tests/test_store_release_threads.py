"""A reservation whose reply was lost, or whose async caller was cancelled, is released on a
thread of its own (``effectgate.store.abandoned``). Closing the store meanwhile waits for that
thread: closing the connection it reads on from another thread once crashed the process
(a segfault in ``test_model_replay``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import effectgate as eg
from effectgate.request import LeaseSecret
from effectgate.store.abandoned import release_lost


def test_close_waits_for_a_release_thread_still_reading(gate: eg.Gate) -> None:
    store = gate.store
    before = set(threading.enumerate())
    release_lost(store, gate.namespace, "never:written", LeaseSecret("a" * 32))
    [thread] = [t for t in threading.enumerate() if t not in before]
    assert thread.name == "effectgate-release" and thread.is_alive()  # it reads twice, 1 s apart
    gate.close()
    assert not thread.is_alive()
    assert not store.background


def test_a_release_thread_that_ended_is_forgotten(gate: eg.Gate) -> None:
    store = gate.store
    before = set(threading.enumerate())
    release_lost(store, gate.namespace, "never:written", LeaseSecret("b" * 32))
    [thread] = [t for t in threading.enumerate() if t not in before]
    thread.join(10)
    assert not thread.is_alive() and not store.background
    assert store.fetch(gate.namespace, "never:written") is None  # it found none, wrote none


def test_close_waits_for_a_report_the_closing_loop_left_to_a_thread(
        make_gate: Any) -> None:
    """The body made the refund, then the loop closed and cancelled its report: the report
    is written the sync way on a thread of its own. Closing the gate at once waits for it,
    and the effect is COMMITTED."""
    gate = make_gate()
    done: asyncio.Event

    @gate.effect("refund:{txn}", effect_type="payment.refund")
    async def refund(txn: str) -> dict[str, str]:
        await asyncio.sleep(0.01)
        done.set()
        return {"refund_id": f"re_{txn}"}

    async def main() -> None:
        nonlocal done
        done = asyncio.Event()
        asyncio.get_running_loop().create_task(refund("t1"))
        await done.wait()

    before = set(threading.enumerate())
    asyncio.run(main())
    started = [t for t in threading.enumerate() if t not in before]
    gate.close()
    assert all(not t.is_alive() for t in started)
    record = make_gate().get("refund:t1")
    assert record.state is eg.State.COMMITTED and record.result == {"refund_id": "re_t1"}
