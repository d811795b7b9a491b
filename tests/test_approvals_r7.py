"""Governance gaps of round 7, on both backends where a store is involved:

* An approved request that a call declaring another cost set aside (its effect asked again, was
  denied, or ran without one) stayed APPROVED in every listing, though it could never run
  anything: it now ends in the same transaction, reading EXPIRED with a reason that says it
  was superseded and how.
* A policy rule written for undos (``*.compensate``): its spend ceiling was silently never
  counted (an undo is counted by no ceiling), and its approval rule was shadowed by any step
  glob with a longer prefix (``booking.*``), so the undo ran unapproved. A ceiling there is
  refused at load; a rule written for undos governs them.
* An approved effect that a spend ceiling refused when it was called kept a reason saying it
  waited for a human: the refusal is now written on the effect (in the transaction that
  tried it), and cleared when it runs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import effectgate as eg
from effectgate.governance import WAITS_FOR_ROOM
from effectgate.states import ApprovalState
from effectgate.store.queue import approvals_page

from .conftest import snapshot

DOLLAR = 1_000_000
ALWAYS = {"effects": {"payment.*": {"approval": "always"}}}


def _begin(gate: eg.Gate, cost: int | None, key: str = "refund:1") -> eg.BeginDecision:
    return gate.begin(effect_type="payment.refund", key=key, payload={"txn": key},
                      agent_id="agent", estimated_cost_micros=cost)


def _approved(gate: eg.Gate, cost: int | None, note: str | None = None) -> str:
    d = _begin(gate, cost)
    assert d.decision is eg.Decision.APPROVAL_REQUIRED and d.approval_id is not None
    gate.approve(d.approval_id, by="alice", note=note)
    return d.approval_id


# -- 1. an approval set aside by a call at another cost ---------------------------------------


@pytest.mark.parametrize(("shown", "declared", "says"), [
    (DOLLAR, 9_000 * DOLLAR, "an estimated cost of $9,000.00"),
    (None, 5 * DOLLAR, "an estimated cost of $5.00"),
    (5 * DOLLAR, None, "no estimated cost"),
])
def test_an_approval_set_aside_by_another_cost_reads_expired_and_says_why(
        make_gate: Any, shown: int | None, declared: int | None, says: str) -> None:
    """A larger cost, a cost where none was shown, none where one was: the begin asks again,
    and the approval it set aside is no longer listed (nor decidable) as approved, but as
    expired, its reason naming the new request and keeping the approver's note."""
    gate = make_gate(policy=ALWAYS)
    old = _approved(gate, shown, note="fine at that price")
    again = _begin(gate, declared)
    assert again.decision is eg.Decision.APPROVAL_REQUIRED and again.approval_id != old
    record = gate.approval(old)
    assert record.state is ApprovalState.EXPIRED
    assert record.reason == (f"superseded: a call declared {says}, not the cost this approval "
                             f"was given for, and asked for a new approval, {again.approval_id}"
                             "; the approver noted fine at that price")
    assert record.expires_at < gate.approval(again.approval_id).created_at  # ended then
    assert [a.approval_id for a in gate.list_approvals(state="approved")] == []
    assert [a.approval_id for a in gate.list_approvals(state="expired")] == [old]
    assert [a.approval_id for a in gate.list_approvals()] == [again.approval_id]
    # the console's queue reads the same
    for state, ids in ((ApprovalState.APPROVED, []), (ApprovalState.EXPIRED, [old]),
                       (ApprovalState.PENDING, [again.approval_id])):
        page = approvals_page(gate.store.engine, gate.namespace, state=state)
        assert [r.id for r in page.rows] == ids, state
    with pytest.raises(eg.InvalidTransition, match="expired, not pending"):
        gate.approve(old, by="bob")
    gate.approve(again.approval_id, by="bob")
    run = _begin(gate, declared)
    assert run.decision is eg.Decision.EXECUTE
    assert gate.approval(again.approval_id).state is ApprovalState.CONSUMED
    assert gate.approval(old).state is ApprovalState.EXPIRED


def test_an_approval_set_aside_by_a_call_the_policy_lets_run_says_it_ran_without_one(
        make_gate: Any) -> None:
    """Approved with no cost shown (under a threshold, a cost left out is asked), then called
    declaring a cost under the threshold: it runs without an approval, and the one set aside
    says so rather than waiting, approved, for nothing."""
    gate = make_gate(policy={"effects": {"payment.*": {
        "approval": {"at_or_above_micros": 100 * DOLLAR}}}})
    old = _approved(gate, None)
    assert _begin(gate, DOLLAR).decision is eg.Decision.EXECUTE
    record = gate.approval(old)
    assert record.state is ApprovalState.EXPIRED
    assert record.reason == ("superseded: a call declared an estimated cost of $1.00, not the "
                             "cost this approval was given for, and started without one (the "
                             "policy asks none at that cost)")


def test_an_expired_approval_set_aside_keeps_its_expiry_and_reason(make_gate: Any) -> None:
    """An approval that had already run out when the call came is forgotten as before: its
    expiry and reason are what they were (only its arguments go)."""
    gate = make_gate(policy={"effects": {"payment.*": {
        "approval": {"always": True, "expires_seconds": 0.2}}}})
    old = _approved(gate, DOLLAR, note="quick")
    before = gate.approval(old)
    time.sleep(0.3)
    assert gate.approval(old).state is ApprovalState.EXPIRED
    assert _begin(gate, DOLLAR).decision is eg.Decision.APPROVAL_REQUIRED
    after = gate.approval(old)
    assert (after.state, after.expires_at, after.reason) == (
        ApprovalState.EXPIRED, before.expires_at, "quick")


# -- 2. policy rules written for undos -------------------------------------------------------


@pytest.mark.parametrize("pattern", ["*.compensate", "refund.compensate",
                                     "booking.*.compensate"])
def test_a_spend_ceiling_on_undos_is_refused_at_load(pattern: str) -> None:
    """No spend ceiling counts an undo (a budget spent must never stop an unwind halfway), so
    a ceiling written for undos would be silently ignored: the policy is refused, saying why
    and what to write instead."""
    with pytest.raises(eg.ConfigError, match="no spend ceiling counts an undo") as caught:
        eg.Policy.from_dict({"effects": {pattern: {"budget": {"per_day_micros": DOLLAR}}}})
    assert isinstance(caught.value, eg.PolicyError)
    assert f"effects.{pattern}.budget" in str(caught.value)
    assert "approval (at_or_above_micros)" in str(caught.value)


def test_a_spend_ceiling_on_undos_in_a_file_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "effectgate.toml"
    path.write_text('[effects."refund.*"]\napproval = "always"\n\n'
                    '[effects."*.compensate"]\nbudget = { per_day_micros = 5 }\n',
                    encoding="utf-8")
    with pytest.raises(eg.PolicyError, match=rf"{path}:5: effects\.\*\.compensate\.budget"):
        eg.Policy.load(path)


def test_ceilings_on_steps_and_everything_still_load_and_leave_undos_uncounted() -> None:
    """A step glob's ceiling (``booking.*``) and the top-level ones are the steps': they load,
    and an undo's governance counts none of them."""
    from effectgate.governance import evaluate

    policy = eg.Policy.from_dict({"budget": {"per_day_micros": DOLLAR}, "effects": {
        "booking.*": {"budget": {"per_run_micros": DOLLAR}}}})
    step = evaluate(policy, "booking.hotel", DOLLAR)
    assert step is not None and len(step.ceilings) == 2
    assert evaluate(policy, "booking.hotel.compensate", DOLLAR, spends=False) is None


def test_a_rule_written_for_undos_governs_them_beside_a_step_glob(make_gate: Any) -> None:
    """``*.compensate`` asks a person for every undo; a ``booking.*`` rule (a longer prefix)
    used to win for ``booking.hotel.compensate``, and the undo ran unapproved."""
    gate = make_gate(policy={"effects": {"booking.*": {"max_attempts": 2},
                                         "*.compensate": {"approval": "always"}}})
    undone: list[str] = []

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        undone.append(record.key)

    d = gate.begin(effect_type="booking.hotel", key="hotel:1", payload={}, group_key="trip:1",
                   compensation={"cancel": "hotel"})
    assert d.decision is eg.Decision.EXECUTE  # the step is booking.*'s: no approval
    gate.report(d, "committed")
    report = gate.unwind("trip:1", by="ops")
    assert undone == [] and [s.key for s in report.unresolved] == ["hotel:1"]
    undo = gate.get("compensate:hotel:1")
    assert undo.state is eg.State.PENDING_APPROVAL and undo.approval_id is not None
    gate.approve(undo.approval_id, by="bob")
    assert gate.unwind("trip:1", by="ops").complete and undone == ["hotel:1"]


def test_the_most_specific_undo_pattern_wins_among_undo_patterns() -> None:
    policy = eg.Policy.from_dict({"effects": {
        "*": {}, "booking.*": {}, "*.compensate": {"approval": "always"},
        "booking.*.compensate": {"deny": "no undos of bookings"},
        "booking.car.compensate": {}}})
    assert policy.rule_for("booking.hotel.compensate").effect_type == "booking.*.compensate"
    assert policy.rule_for("payment.refund.compensate").effect_type == "*.compensate"
    assert policy.rule_for("booking.car.compensate").effect_type == "booking.car.compensate"
    assert policy.rule_for("booking.hotel").effect_type == "booking.*"
    assert policy.rule_for("other").effect_type == "*"


# -- 3. an approved effect a spend ceiling refused -------------------------------------------


def _table(gate: eg.Gate, table: str) -> list[Any]:
    with gate.store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            text(f"SELECT * FROM {table} WHERE namespace = :ns"), {"ns": gate.namespace})]


@pytest.mark.parametrize("drive", ["sync", "async"])
def test_an_approved_effect_refused_for_spend_says_so_on_its_record(
        make_gate: Any, drive: str) -> None:
    """$30 a day, $15 held by a charge in flight: an approved $20 refund is refused when
    called. Its effect keeps waiting, approved and unconsumed, nothing charged, and its reason
    says why (what ``show`` and the console's effect page print); once the held charge fails
    (its spend released) it runs on the same approval, and the reason is cleared."""
    gate = make_gate(policy={"effects": {"payment.*": {
        "approval": {"at_or_above_micros": 20 * DOLLAR},
        "budget": {"per_day_micros": 30 * DOLLAR}}}})
    held = _begin(gate, 15 * DOLLAR, key="refund:0")
    assert held.decision is eg.Decision.EXECUTE
    approval = _approved(gate, 20 * DOLLAR)
    waiting = gate.get("refund:1")
    approvals, budgets = _table(gate, "effectgate_approvals"), _table(gate, "effectgate_budgets")

    def call() -> eg.BeginDecision:
        if drive == "async":
            return asyncio.run(gate.abegin(
                effect_type="payment.refund", key="refund:1", payload={"txn": "refund:1"},
                agent_id="agent", estimated_cost_micros=20 * DOLLAR))
        return _begin(gate, 20 * DOLLAR)

    refused = call()
    assert refused.decision is eg.Decision.DENIED and refused.approval_id == approval
    assert refused.reason == "spend ceiling reached: day ceiling of $30.00 on payment.*"
    record = gate.get("refund:1")
    assert record.reason == f"{WAITS_FOR_ROOM}: {refused.reason}"
    assert (record.state, record.lease_token, record.approval_id, record.history) == (
        eg.State.PENDING_APPROVAL, waiting.lease_token, approval, waiting.history)
    assert _table(gate, "effectgate_approvals") == approvals  # still approved, unconsumed
    assert _table(gate, "effectgate_budgets") == budgets  # nothing charged
    assert gate.approval(approval).state is ApprovalState.APPROVED

    gate.report(held, "failed", error="declined")  # its $15 released: room for $20
    run = call()
    assert run.decision is eg.Decision.EXECUTE
    assert gate.get("refund:1").reason is None
    assert gate.approval(approval).state is ApprovalState.CONSUMED


def test_a_bad_begin_of_an_approved_effect_changes_nothing(make_gate: Any) -> None:
    """Bad input on the refused path (another payload on the key) is a typed error and
    writes nothing: neither the note nor the approval."""
    # Approved under a $30 ceiling, then the ceiling lowered to $10: a cost alone over the
    # limit is refused before any approval is asked, so the yes must come first.
    _approved(make_gate(policy={"effects": {"payment.*": {
        "approval": "always", "budget": {"per_day_micros": 30 * DOLLAR}}}}), 20 * DOLLAR)
    gate = make_gate(policy={"effects": {"payment.*": {
        "approval": "always", "budget": {"per_day_micros": 10 * DOLLAR}}}})
    before = snapshot(gate)
    with pytest.raises(eg.PayloadMismatch):
        gate.begin(effect_type="payment.refund", key="refund:1", payload={"txn": "other"},
                   agent_id="agent", estimated_cost_micros=20 * DOLLAR)
    assert snapshot(gate) == before


def test_ls_and_the_effect_page_say_which_ceiling_refused_an_approved_effect(
        make_gate: Any, store_url: str, namespace: str) -> None:
    """Where an operator looks: ``effectgate ls``'s note and ``show`` (its reason), and the
    console's effect page, name the ceiling that refused the approved call."""
    from click.testing import CliRunner
    from markupsafe import escape
    from starlette.testclient import TestClient

    from effectgate.cli import main
    from effectgate.console import build_app

    from .console_helpers import sign_in

    gate = make_gate(policy={"effects": {"pay.*": {
        "approval": "always", "budget": {"per_effect_type_micros": 3_000}}}})
    for key in ("pay:0", "pay:1"):  # pay:0 runs and holds 2_000 of the 3_000: no room now
        d = gate.begin(effect_type="pay.card", key=key, payload={}, estimated_cost_micros=2_000)
        gate.approve(d.approval_id, by="bob")
        refused = gate.begin(effect_type="pay.card", key=key, payload={},
                             estimated_cost_micros=2_000)
    assert refused.decision is eg.Decision.DENIED
    said = ("its last call was refused: spend ceiling reached: effect_type ceiling of $0.003 "
            "on pay.*")
    where = ["--url", store_url, "--namespace", namespace]
    runner = CliRunner()
    listed = " ".join(runner.invoke(main, ["ls", *where], env={"COLUMNS": "200"}).stdout.split())
    assert f"pay:1: approved by bob; the next call with the same arguments runs it, if the " \
           f"policy's spend ceilings have room for it then ({said})" in listed, listed
    shown = " ".join(runner.invoke(main, ["show", "pay:1", *where],
                                   env={"COLUMNS": "200"}).stdout.split())
    assert f"{WAITS_FOR_ROOM}: spend ceiling reached" in shown, shown
    assert said in shown, shown  # what the next call does, as ``ls`` says it
    with TestClient(build_app(gate), base_url="http://127.0.0.1") as client:
        sign_in(client, gate.add_principal("alice", "operator")[1])
        page = " ".join(client.get(f"/effects/{d.effect_id}").text.split())
    assert str(escape(said)) in page, page
