"""An approved call whose declared cost alone is over a spend ceiling's limit, on both backends.

It was told, and its effect's reason said, that it "waits for room": no window ever makes
room for a cost its ceiling's limit is below, so it waited for ever. Now the answer, the reason
on the effect, and what ``effectgate ls`` / ``show`` and the console's effect page say of the
next call all name the truth: its cost alone is over that ceiling, it will not run under it.
The approval is kept, unconsumed (a person's yes is never lost to a budget): once the ceiling
is raised, or at a cost within it, the next call runs on it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import effectgate as eg
from effectgate import decide
from effectgate.governance import (
    OVER_ITS_LIMIT,
    WAITS_FOR_ROOM,
    Governance,
    OverLimit,
    decided_next,
    evaluate,
)
from effectgate.policy import Policy
from effectgate.states import ApprovalState, State

from .conftest import snapshot

DOLLAR = 1_000_000
OVER = {"effects": {"payment.*": {"approval": "always",
                                  "budget": {"per_day_micros": 30 * DOLLAR}}}}
TOLD = ("its estimated cost alone is over the day ceiling of $30.00 on payment.*: "
        "it will not run under that ceiling; its approval is kept, unconsumed, and the next "
        "call runs on it once the ceiling is raised (or at a cost within it)")
WRITTEN = f"{OVER_ITS_LIMIT}: day ceiling of $30.00 on payment.*"


def _begin(gate: eg.Gate, cost: int | None, key: str = "refund:1",
           effect_type: str = "payment.refund") -> eg.BeginDecision:
    return gate.begin(effect_type=effect_type, key=key, payload={"txn": key},
                      agent_id="agent", estimated_cost_micros=cost)


def _approved(gate: eg.Gate, cost: int) -> str:
    d = _begin(gate, cost)
    assert d.decision is eg.Decision.APPROVAL_REQUIRED and d.approval_id is not None
    gate.approve(d.approval_id, by="alice")
    return d.approval_id


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_an_approved_cost_over_the_limit_alone_is_told_it_will_not_run(
        make_gate: Any, drive: str) -> None:
    """$50 approved under a $30-a-day ceiling, nothing else spent: refused, told (and its
    effect's reason says) that its cost alone is over that ceiling — never that it waits
    for room — and nothing moved: the effect waits, approved and unconsumed, nothing charged.
    A call at a cost within the ceiling then runs on the same approval."""
    gate = make_gate(policy=OVER)
    approval = _approved(gate, 50 * DOLLAR)
    waiting = gate.get("refund:1")
    before = snapshot(gate)

    def call(cost: int) -> eg.BeginDecision:
        if drive == "async":
            return asyncio.run(gate.abegin(
                effect_type="payment.refund", key="refund:1", payload={"txn": "refund:1"},
                agent_id="agent", estimated_cost_micros=cost))
        return _begin(gate, cost)

    for _ in range(2):  # and again: the same answer, nothing written twice
        refused = call(50 * DOLLAR)
        assert refused.decision is eg.Decision.DENIED and refused.approval_id == approval
        assert refused.reason == TOLD
        record = gate.get("refund:1")
        assert record.reason == WRITTEN
        assert not record.reason.startswith(WAITS_FOR_ROOM)
        assert (record.state, record.lease_token, record.approval_id, record.history) == (
            State.PENDING_APPROVAL, waiting.lease_token, approval, waiting.history)
        assert gate.approval(approval).state is ApprovalState.APPROVED  # unconsumed
        after = snapshot(gate)
        assert [r for r in after if r not in before] == [
            r for r in after if "refund:1" in r and WRITTEN in r]  # only the note, written
    run = call(20 * DOLLAR)  # within the ceiling: runs on the same approval
    assert run.decision is eg.Decision.EXECUTE
    assert gate.get("refund:1").reason is None
    assert gate.approval(approval).state is ApprovalState.CONSUMED


def test_raising_the_ceiling_runs_it_on_the_same_approval(
        make_gate: Any, namespace: str) -> None:
    """What the reason promises: a gate whose ceiling was raised runs the next call on the
    approval already given (no second approval is asked for)."""
    gate = make_gate(policy=OVER)
    approval = _approved(gate, 50 * DOLLAR)
    assert _begin(gate, 50 * DOLLAR).decision is eg.Decision.DENIED
    raised = make_gate(policy={"effects": {"payment.*": {
        "approval": "always", "budget": {"per_day_micros": 60 * DOLLAR}}}})
    run = _begin(raised, 50 * DOLLAR)
    assert run.decision is eg.Decision.EXECUTE
    assert raised.approval(approval).state is ApprovalState.CONSUMED


def test_the_ceiling_its_cost_alone_is_over_is_the_one_named(make_gate: Any) -> None:
    """Two ceilings refuse an approved $50 refund: the rule's $60 a day (first in order, with
    $55 held: no room now, room later) and the global $40 per effect type (which $50 alone is
    over). The answer and the reason name the one no window relieves, never "waits for
    room"."""
    gate = make_gate(policy={
        "budget": {"per_effect_type_micros": 40 * DOLLAR},
        "effects": {"payment.*": {"approval": {"at_or_above_micros": 45 * DOLLAR},
                                  "budget": {"per_day_micros": 60 * DOLLAR}}}})
    for key, effect_type, cost in (("c", "payment.charge", 35), ("f", "payment.fee", 20)):
        assert _begin(gate, cost * DOLLAR, key, effect_type).decision is eg.Decision.EXECUTE
    approval = _approved(gate, 50 * DOLLAR)
    refused = _begin(gate, 50 * DOLLAR)
    assert refused.decision is eg.Decision.DENIED and refused.approval_id == approval
    assert (refused.reason or "").startswith(
        "its estimated cost alone is over the effect_type ceiling of $40.00 on *")
    assert gate.get("refund:1").reason == f"{OVER_ITS_LIMIT}: effect_type ceiling of $40.00 on *"


def test_an_unapproved_cost_over_the_limit_alone_is_denied_saying_so(make_gate: Any) -> None:
    """Without an approval rule the refusal is recorded (DENIED): its reason says the cost
    alone is over the ceiling, not that the ceiling was reached."""
    gate = make_gate(policy={"effects": {"payment.*": {
        "budget": {"per_day_micros": 30 * DOLLAR}}}})
    refused = _begin(gate, 50 * DOLLAR)
    said = ("its estimated cost alone is over the day ceiling of $30.00 on payment.*: it "
            "will not run under that ceiling")
    assert (refused.decision, refused.reason) == (eg.Decision.DENIED, said)
    record = gate.get("refund:1")
    assert (record.state, record.reason) == (State.DENIED, said)


def test_ls_show_and_the_effect_page_say_it_will_not_run(
        make_gate: Any, store_url: str, namespace: str) -> None:
    """Where an operator looks — ``effectgate ls``'s note, ``show`` (its reason and what the
    next call does) and the console's effect page — all say the same: refused too, its cost
    alone over the ceiling, runs on this approval once the ceiling is raised. None says it
    runs "if the policy's spend ceilings have room"."""
    from click.testing import CliRunner
    from markupsafe import escape
    from starlette.testclient import TestClient

    from effectgate.cli import main
    from effectgate.console import build_app

    from .console_helpers import sign_in

    gate = make_gate(policy=OVER)
    _approved(gate, 50 * DOLLAR)
    assert _begin(gate, 50 * DOLLAR).decision is eg.Decision.DENIED
    said = ("the next call with the same arguments is refused too: its cost alone is over the "
            "day ceiling of $30.00 on payment.*; it runs on this approval once that ceiling is "
            "raised (or at a cost within it), until the approval expires")
    assert decided_next("approved", gate.get("refund:1").reason) == said
    where = ["--url", store_url, "--namespace", namespace]
    runner = CliRunner()
    env = {"COLUMNS": "200"}
    listed = " ".join(runner.invoke(main, ["ls", *where], env=env).stdout.split())
    assert f"refund:1: approved by alice; {said}" in listed, listed
    shown = " ".join(runner.invoke(main, ["show", "refund:1", *where], env=env).stdout.split())
    assert WRITTEN in shown and said in shown, shown
    assert "have room" not in shown and "have room" not in listed
    effect_id = gate.get("refund:1").effect_id
    with TestClient(build_app(gate), base_url="http://127.0.0.1") as client:
        sign_in(client, gate.add_principal("bob", "operator")[1])
        page = " ".join(client.get(f"/effects/{effect_id}").text.split())
    assert str(escape(said)) in page, page
    assert "have room" not in page


def test_the_charges_put_the_ceiling_its_cost_alone_is_over_first() -> None:
    """The pure part: :meth:`Governance.charges` labels a ceiling the declared cost alone is
    over as an :class:`OverLimit` and puts it first (the store refuses on the first ceiling
    that refuses, and names it); :func:`decide.over_ceiling` words the refusal from it."""
    policy = Policy.model_validate({
        "budget": {"per_effect_type_micros": 40},
        "effects": {"pay.*": {"budget": {"per_day_micros": 60, "per_run_micros": 100}}}})
    gov = evaluate(policy, "pay.card", 50)
    assert isinstance(gov, Governance)
    charges = gov.charges("pay.card", "run-1", None)
    assert [c.scope_key for c in charges] == [
        "*|effect_type|pay.card", "pay.*|run|run-1", "pay.*|day|"]  # the others in order
    assert [isinstance(c.label, OverLimit) for c in charges] == [True, False, False]
    within = evaluate(policy, "pay.card", 40)
    assert within is not None
    assert not any(isinstance(c.label, OverLimit)
                   for c in within.charges("pay.card", "run-1", None))
    move = decide.Move(State.IN_FLIGHT, eg.Decision.EXECUTE, charges=charges, cost=50)
    step = decide.over_ceiling(move, charges[0].label)
    assert isinstance(step, decide.Move) and step.to is State.DENIED
    assert step.reason == ("its estimated cost alone is over the effect_type ceiling of "
                           "$0.00004 on *: it will not run under that ceiling")
    full = decide.over_ceiling(move, charges[2].label)
    assert isinstance(full, decide.Move)
    assert full.reason == "spend ceiling reached: day ceiling of $0.00006 on pay.*"
