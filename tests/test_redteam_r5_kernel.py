"""Red team, round 5, the kernel: a begin whose caller is gone after its move consumed a
human's approval (the body never ran) gives that approval back instead of spending it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import effectgate as eg
from effectgate.store.lines import parse

DOLLAR = 1_000_000
POLICY = {"effects": {"pay.*": {"approval": {"always": True},
                                "budget": {"per_effect_type_micros": 10 * DOLLAR}}}}


def _hold_write_lock(gate: eg.Gate, backend: str, approval_id: str) -> Callable[[], None]:
    """Block the store's writers on the approval from another connection; the release."""
    if backend == "sqlite":
        path = gate.url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")

        def release_sqlite() -> None:
            conn.execute("COMMIT")
            conn.close()

        return release_sqlite
    import psycopg

    from tests.conftest import PG_URL

    pg = psycopg.connect(PG_URL.replace("+psycopg", ""))
    pg.execute("SELECT id FROM effectgate_approvals WHERE id = %s FOR UPDATE", (approval_id,))

    def release_pg() -> None:
        pg.commit()
        pg.close()

    return release_pg


def _spent(gate: eg.Gate) -> int:
    from sqlalchemy import text

    with gate.store.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT coalesce(sum(spent_micros), 0) FROM effectgate_budgets WHERE namespace = :ns"),
            {"ns": gate.namespace}).scalar_one())


def test_a_cancelled_begin_gives_back_the_approval_its_move_consumed(
        make_gate: Any, backend: str) -> None:
    """An approved effect's ``abegin`` is cancelled (a timeout) while its consuming move
    waits on a lock; the move then lands on the worker thread, consuming the approval and
    charging the budget, for a caller that is gone. Before the fix the reservation was
    released FAILED: the approval was spent and the next begin asked a human again. Now the
    effect waits again on its approved request, the spend is released, the lost lease cannot
    report, and the next begin runs it once."""
    gate = make_gate(policy=eg.Policy.from_dict(POLICY))
    asked = dict(effect_type="pay.x", key="pay:1", payload={"to": "bob"},
                 estimated_cost_micros=DOLLAR)
    first = gate.begin(**asked, agent_id="bot")
    assert first.decision is eg.Decision.APPROVAL_REQUIRED and first.approval_id
    gate.approve(first.approval_id, by="alice")
    release = _hold_write_lock(gate, backend, first.approval_id)
    entered = threading.Event()
    real_move = gate.store.move

    def move(*args: Any, **kwargs: Any) -> Any:  # the real write, marked as it starts
        entered.set()
        return real_move(*args, **kwargs)

    gate.store.move = move  # type: ignore[method-assign]
    timer = threading.Timer(0.3, release)

    async def cancelled() -> None:
        task = asyncio.ensure_future(gate.abegin(**asked))
        while not entered.is_set():  # the consuming move is on its way, waiting on the lock
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        timer.start()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(cancelled())  # waits for the worker thread's move to land
    finally:
        timer.join()
        gate.store.move = real_move  # type: ignore[method-assign]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        record = gate.get("pay:1")
        if record.state is not eg.State.IN_FLIGHT and len(parse(
                gate.store.get(gate.namespace, "pay:1").history)) >= 3:  # type: ignore[union-attr]
            break
        time.sleep(0.05)
    record = gate.get("pay:1")
    lines = parse(gate.store.get(gate.namespace, "pay:1").history)  # type: ignore[union-attr]
    assert [line.to_state for line in lines] == ["pending_approval", "in_flight",
                                                 "pending_approval"]
    assert lines[-1].note == "cancelled before the body started"
    assert record.state is eg.State.PENDING_APPROVAL
    assert gate.approval(first.approval_id).state is eg.ApprovalState.APPROVED
    assert _spent(gate) == 0
    again = gate.begin(**asked)
    assert again.decision is eg.Decision.EXECUTE and again.approval_id is None
    assert gate.approval(first.approval_id).state is eg.ApprovalState.CONSUMED
    assert _spent(gate) == DOLLAR
    gate.report(again, "committed", result={"ok": True})
    assert gate.get("pay:1").state is eg.State.COMMITTED


@pytest.mark.parametrize("how", ["operator", "hook"])
def test_an_ambiguous_attempt_s_reported_cost_counts_when_it_is_settled_committed(
        make_gate: Any, how: str) -> None:
    """A holder reports AMBIGUOUS with the actual cost it knows ($9 on a $1 estimate); the
    effect is then found COMMITTED (an operator's resolve, a reconcile hook). Before the fix
    the counter kept the $1 estimate, so a further $8 call ran under a $10 ceiling ($17 spent,
    nothing said). The settlement now corrects the counters as a COMMITTED report would."""
    gate = make_gate(policy=eg.Policy.from_dict(
        {"effects": {"pay.*": {"budget": {"per_effect_type_micros": 10 * DOLLAR}}}}))
    if how == "hook":
        gate.reconciler("pay.*")(lambda record: "committed")
    d = gate.begin(effect_type="pay.x", key="pay:1", payload={}, estimated_cost_micros=DOLLAR)
    gate.report(d, "ambiguous", error="timeout", actual_cost_micros=9 * DOLLAR)
    if how == "operator":
        gate.resolve("pay:1", "committed", by="op")
    else:
        gate.reconcile("pay:1", by="op")
    assert gate.get("pay:1").state is eg.State.COMMITTED
    assert _spent(gate) == 9 * DOLLAR
    more = gate.begin(effect_type="pay.x", key="pay:2", payload={},
                      estimated_cost_micros=8 * DOLLAR)
    assert more.decision is eg.Decision.DENIED
    assert _spent(gate) == 9 * DOLLAR
    # Cheaper than estimated: the difference is released.
    d3 = gate.begin(effect_type="pay.x", key="pay:3", payload={}, estimated_cost_micros=DOLLAR)
    gate.report(d3, "ambiguous", error="timeout", actual_cost_micros=DOLLAR // 4)
    gate.resolve("pay:3", "committed", by="op")
    assert _spent(gate) == 9 * DOLLAR + DOLLAR // 4


def test_an_approval_given_at_one_cost_never_runs_the_call_at_a_larger_one(
        make_gate: Any) -> None:
    """A person approves a call shown at $150 (the rule: approval at or above $100). The same
    payload proposed again at $9,000,000 executed on that approval: the payload hash binds the
    arguments, not the estimate declared beside them. It now asks for a new approval (the old
    one forgotten); at the approved cost or below, the approval runs it, once."""
    gate = make_gate(policy=eg.Policy.from_dict({"effects": {"pay.*": {
        "approval": {"at_or_above_micros": 100 * DOLLAR}}}}))
    call = {"effect_type": "pay.x", "key": "pay:1", "payload": {"to": "acme"}}
    asked = gate.begin(**call, estimated_cost_micros=150 * DOLLAR)
    assert asked.decision is eg.Decision.APPROVAL_REQUIRED and asked.approval_id
    gate.approve(asked.approval_id, by="alice")
    larger = gate.begin(**call, estimated_cost_micros=9_000_000 * DOLLAR)
    assert larger.decision is eg.Decision.APPROVAL_REQUIRED
    assert larger.approval_id not in (None, asked.approval_id)
    assert gate.get("pay:1").state is eg.State.PENDING_APPROVAL
    gate.approve(larger.approval_id, by="alice")
    cheaper = gate.begin(**call, estimated_cost_micros=120 * DOLLAR)
    assert cheaper.decision is eg.Decision.EXECUTE
    gate.report(cheaper, "committed", result={"ok": True})
    again = gate.begin(**call, estimated_cost_micros=150 * DOLLAR)
    assert again.decision is eg.Decision.DUPLICATE


def test_an_approval_given_at_a_cost_never_runs_the_call_with_its_cost_left_out(
        make_gate: Any) -> None:
    """Approved at $150, the same payload begun with no ``estimated_cost_micros``: no
    ceiling can count it (the decision's budget warning says so) and its reported cost moves
    no counter, so it could run at $9M on a yes given to $150. It is asked again instead,
    showing no cost; approved so, the call without a cost runs on it."""
    gate = make_gate(policy=eg.Policy.from_dict({"effects": {"pay.*": {
        "approval": {"at_or_above_micros": 100 * DOLLAR},
        "budget": {"per_day_micros": 1_000 * DOLLAR}}}}))
    call = {"effect_type": "pay.wire", "key": "wire:1", "payload": {"to": "acct-9"}}
    asked = gate.begin(**call, estimated_cost_micros=150 * DOLLAR)
    assert asked.decision is eg.Decision.APPROVAL_REQUIRED
    gate.approve(asked.approval_id, by="alice")
    unpriced = gate.begin(**call)
    assert unpriced.decision is eg.Decision.APPROVAL_REQUIRED, unpriced
    assert unpriced.approval_id != asked.approval_id
    assert gate.approval(unpriced.approval_id).estimated_cost_micros is None
    assert gate.get("wire:1").state is eg.State.PENDING_APPROVAL
    gate.approve(unpriced.approval_id, by="alice")
    run = gate.begin(**call)
    assert run.decision is eg.Decision.EXECUTE and run.attempt == 1
    gate.report(run, "committed")
    assert gate.begin(**call).decision is eg.Decision.DUPLICATE
