"""An approved call whose declared cost alone is over a spend ceiling's limit, on both backends.

It was told, and its effect's reason said, that it "waits for room": no window ever makes
room for a cost its ceiling's limit is below, so it waited for ever. Now the answer, the reason
on the effect, and what ``effectgate ls`` / ``show`` and the console's effect page say of the
next call all name the truth: its cost alone is over that ceiling, it will not run under it.
The approval is kept, unconsumed (a person's yes is never lost to a budget): once the ceiling
is raised, or at a cost within it, the next call runs on it.

A call not yet approved whose cost alone is over a ceiling that counts it is refused at once,
by the pure decision: no human is asked for a yes that could run nothing, nothing is charged
(an approval here is one given before its ceiling was lowered below its cost).
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
from .test_approvals_r7 import _table

DOLLAR = 1_000_000
OVER = {"effects": {"payment.*": {"approval": "always",
                                  "budget": {"per_day_micros": 30 * DOLLAR}}}}
ROOMY = {"effects": {"payment.*": {"approval": "always",
                                   "budget": {"per_day_micros": 60 * DOLLAR}}}}
"""OVER's rule before its ceiling was lowered below a $50 refund (when it was approved)."""
ALONE = ("its estimated cost alone is over the day ceiling of $30.00 on payment.*: it will "
         "not run under that ceiling")
TOLD = ("its estimated cost alone is over the day ceiling of $30.00 on payment.*: "
        "it will not run under that ceiling; its approval is kept, unconsumed, and the next "
        "call runs on it once the ceiling is raised (or at a cost within it)")
WRITTEN = f"{OVER_ITS_LIMIT}: day ceiling of $30.00 on payment.*"


def _begin(gate: eg.Gate, cost: int | None, key: str = "refund:1",
           effect_type: str = "payment.refund", **ids: Any) -> eg.BeginDecision:
    ids.setdefault("agent_id", "agent")
    return gate.begin(effect_type=effect_type, key=key, payload={"txn": key},
                      estimated_cost_micros=cost, **ids)


def _approved(gate: eg.Gate, cost: int) -> str:
    d = _begin(gate, cost)
    assert d.decision is eg.Decision.APPROVAL_REQUIRED and d.approval_id is not None
    gate.approve(d.approval_id, by="alice")
    return d.approval_id


def _approved_then_lowered(make_gate: Any, cost: int, before: dict[str, Any] = ROOMY,
                           after: dict[str, Any] = OVER) -> tuple[eg.Gate, str]:
    """A call at ``cost`` approved under ``before``, then a gate (same store and namespace)
    whose policy ``after`` lowered the ceiling below that cost: the gate and the approval."""
    return make_gate(policy=after), _approved(make_gate(policy=before), cost)


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_an_approved_cost_over_the_limit_alone_is_told_it_will_not_run(
        make_gate: Any, drive: str) -> None:
    """$50 approved under a $30-a-day ceiling, nothing else spent: refused, told (and its
    effect's reason says) that its cost alone is over that ceiling — never that it waits
    for room — and nothing moved: the effect waits, approved and unconsumed, nothing charged.
    A call at a cost within the ceiling then runs on the same approval."""
    gate, approval = _approved_then_lowered(make_gate, 50 * DOLLAR)
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
    gate, approval = _approved_then_lowered(make_gate, 50 * DOLLAR)
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
    rule = {"payment.*": {"approval": {"at_or_above_micros": 45 * DOLLAR},
                          "budget": {"per_day_micros": 60 * DOLLAR}}}
    before = make_gate(policy={"effects": rule})  # approved before the global $40 was set
    for key, effect_type, cost in (("c", "payment.charge", 35), ("f", "payment.fee", 20)):
        assert _begin(before, cost * DOLLAR, key, effect_type).decision is eg.Decision.EXECUTE
    gate, approval = _approved_then_lowered(
        make_gate, 50 * DOLLAR, {"effects": rule},
        {"budget": {"per_effect_type_micros": 40 * DOLLAR}, "effects": rule})
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
    assert (refused.decision, refused.reason) == (eg.Decision.DENIED, ALONE)
    record = gate.get("refund:1")
    assert (record.state, record.reason) == (State.DENIED, ALONE)


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

    gate, _ = _approved_then_lowered(make_gate, 50 * DOLLAR)
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


# -- a call not yet approved: refused before a human is asked ---------------------------------


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_a_call_needing_approval_whose_cost_alone_is_over_is_denied_at_once(
        make_gate: Any, drive: str) -> None:
    """$50 under a $30-a-day ceiling, approval always: no window will ever make room, so no
    human is asked for a yes that could run nothing. DENIED at once, saying why, with no
    approval request and nothing charged; ``preview`` says the same, writing nothing. Asked
    again, the same answer (no request then either); at a cost within it, asked as any."""
    gate = make_gate(policy=OVER)
    fields: dict[str, Any] = {"effect_type": "payment.refund", "key": "refund:1",
                              "payload": {"txn": "refund:1"}, "agent_id": "agent"}
    seen = gate.preview(**fields, estimated_cost_micros=50 * DOLLAR)
    assert (seen.decision, seen.reason, seen.approval_id) == (eg.Decision.DENIED, ALONE, None)
    assert snapshot(gate) == []

    def call(cost: int) -> eg.BeginDecision:
        if drive == "async":
            return asyncio.run(gate.abegin(**fields, estimated_cost_micros=cost))
        return gate.begin(**fields, estimated_cost_micros=cost)

    for _ in range(2):
        refused = call(50 * DOLLAR)
        assert (refused.decision, refused.reason, refused.approval_id) == (
            eg.Decision.DENIED, ALONE, None)
        record = gate.get("refund:1")
        assert (record.state, record.reason, record.approval_id) == (State.DENIED, ALONE, None)
        assert _table(gate, "effectgate_approvals") == []  # nobody was asked
        assert _table(gate, "effectgate_budgets") == []  # nothing charged
    asked = call(20 * DOLLAR)
    assert asked.decision is eg.Decision.APPROVAL_REQUIRED and asked.approval_id is not None


@pytest.mark.parametrize(("budget", "ids", "named"), [
    ({"per_run_micros": 30 * DOLLAR}, {"run_id": "run-1"}, "run ceiling of $30.00 on payment.*"),
    ({"per_agent_micros": 30 * DOLLAR}, {}, "agent ceiling of $30.00 on payment.*"),
    ({"per_effect_type_micros": 30 * DOLLAR, "per_day_micros": 100 * DOLLAR}, {},
     "effect_type ceiling of $30.00 on payment.*"),
])
def test_each_scope_that_counts_the_call_refuses_it_before_approval(
        make_gate: Any, budget: dict[str, int], ids: dict[str, str], named: str) -> None:
    """A run ceiling (the call has a run id), an agent ceiling (it has an agent id), an
    effect-type ceiling beside a roomier day one: each is named, the call DENIED at once."""
    gate = make_gate(policy={"effects": {"payment.*": {"approval": "always",
                                                       "budget": budget}}})
    refused = _begin(gate, 50 * DOLLAR, **ids)
    assert (refused.decision, refused.approval_id) == (eg.Decision.DENIED, None)
    assert refused.reason == decide.over_its_limit(named, approved=False)
    assert _table(gate, "effectgate_approvals") == [] and _table(gate, "effectgate_budgets") == []


@pytest.mark.parametrize("budget", [{"per_run_micros": 30 * DOLLAR},
                                    {"per_agent_micros": 30 * DOLLAR}])
def test_a_ceiling_that_cannot_count_the_call_does_not_refuse_it(
        make_gate: Any, budget: dict[str, int]) -> None:
    """$50 over a run (agent) ceiling, but the call has no run (agent) id: that ceiling
    cannot count it (the same rule as ``Governance.charges``), so it is asked as before."""
    gate = make_gate(policy={"effects": {"payment.*": {"approval": "always",
                                                       "budget": budget}}})
    asked = _begin(gate, 50 * DOLLAR, agent_id=None)
    assert asked.decision is eg.Decision.APPROVAL_REQUIRED and asked.approval_id is not None
    assert len(_table(gate, "effectgate_approvals")) == 1
    assert gate.get("refund:1").state is State.PENDING_APPROVAL


def test_a_request_pending_when_its_ceiling_was_lowered_is_refused_once_approved(
        make_gate: Any) -> None:
    """Asked at $50 under $60, then the ceiling lowered to $30: the request already made is
    the human's to answer (no begin withdraws it), and the call keeps waiting for it; once
    approved, the call is refused as an approved one is (a505bf7): told its cost alone is
    over the ceiling, the approval kept, unconsumed."""
    asked = _begin(make_gate(policy=ROOMY), 50 * DOLLAR)
    assert asked.decision is eg.Decision.APPROVAL_REQUIRED and asked.approval_id is not None
    gate = make_gate(policy=OVER)
    waiting = _begin(gate, 50 * DOLLAR)
    assert (waiting.decision, waiting.approval_id) == (
        eg.Decision.APPROVAL_REQUIRED, asked.approval_id)
    gate.approve(asked.approval_id, by="alice")
    refused = _begin(gate, 50 * DOLLAR)
    assert (refused.decision, refused.reason, refused.approval_id) == (
        eg.Decision.DENIED, TOLD, asked.approval_id)
    assert gate.approval(asked.approval_id).state is ApprovalState.APPROVED
    assert _table(gate, "effectgate_budgets") == []


def test_an_approval_for_a_smaller_cost_does_not_run_a_cost_over_the_limit(
        make_gate: Any) -> None:
    """Approved at $20; a call at $50 under the $30 ceiling costs more than the yes (so the
    approval is set aside, as ever) and its cost alone is over: DENIED at once, no new
    request, nothing charged."""
    gate, approval = _approved_then_lowered(make_gate, 20 * DOLLAR, OVER)
    refused = _begin(gate, 50 * DOLLAR)
    assert (refused.decision, refused.reason) == (eg.Decision.DENIED, ALONE)
    assert gate.get("refund:1").state is State.DENIED
    assert gate.approval(approval).state is not ApprovalState.APPROVED  # set aside
    assert len(_table(gate, "effectgate_approvals")) <= 1  # no new request
    assert _table(gate, "effectgate_budgets") == []


@pytest.mark.parametrize("one_call", [False, True])
def test_the_model_explores_a_cost_alone_over_a_ceiling_with_no_violation(
        one_call: bool) -> None:
    """The model checker's bound for it (``BOUNDS["over-alone"]``, in both store shapes):
    worker 0's cost alone is over the per-run ceiling its run id makes count it, worker 1's is
    within it. Every interleaving keeps every invariant, OVER ALONE among them (worker 0 is
    never asked for approval, never executes: it is DENIED)."""
    from dataclasses import replace

    from effectgate.verify.explore import BOUNDS, explore

    config = replace(BOUNDS["over-alone"][0], one_call=one_call)
    found = explore(config)
    assert found.violation is None, found.violation.format()
    assert found.states > 1000  # the bound really branches
