"""Review of round 7's kernel and governance commits (the reconcile grace an operator waits;
approvals set aside or refused for spend; rules written for undos), on both backends where a
store is involved:

* A rule written for undos (``*.compensate``) governs them before a step's glob, and may carry
  no ceiling. A call that only bears an undo's name (``booking.flight.compensate`` with no
  ``compensates_effect_id``: no undo, so every ceiling should count it) then found no ceiling
  at all: it spent past its step glob's (``booking.*``). Its ceilings are now the most
  specific other rule's; a real undo is still counted by none.
* The same change let a rule added to have undos approved drop what the step's glob kept out
  of the store: ``booking.*``'s ``store_result = false`` or ``redact_result`` no longer applied
  to ``booking.flight.compensate``, and the undo's result (a passport number) was stored. A
  rule written for undos now keeps no more of their data than the step's glob does.
* Nor its other options: the undo of a ``vendor = "stripe"`` step lost its vendor key (its
  compensator refunded with no idempotency key), a step glob's ``reconcile_grace_seconds``
  and ``on_ambiguous = "block"`` stopped covering its undos. What a rule for undos leaves
  unset comes from the rule that governed them before.

And what held under attack, kept as a regression: OS processes racing on approved effects
that a spend ceiling refuses for some of them (the consume undone by a savepoint, the
refusal written on the effect) run each effect at most once, consume an approval only with
its attempt, and charge exactly what ran.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import effectgate as eg
from effectgate.sagas import compensation_key
from effectgate.states import ApprovalState

DOLLAR = 1_000_000
UNDOS_ASKED = {"effects": {
    "booking.*": {"budget": {"per_day_micros": DOLLAR}},
    "*.compensate": {"approval": {"at_or_above_micros": 500 * DOLLAR}},
}}


def _call(gate: eg.Gate, key: str, *, undoes: int | None = None,
          cost: int = 90 * DOLLAR // 100) -> eg.BeginDecision:
    payload = {"k": key} if undoes is None else {"effect_id": undoes, "compensation": None}
    return gate.begin(effect_type="booking.flight.compensate", key=key, payload=payload,
                      estimated_cost_micros=cost, compensates_effect_id=undoes)


def test_a_call_bearing_an_undos_name_is_counted_by_its_step_globs_ceiling(
        make_gate: Any) -> None:
    """$1 a day on ``booking.*``, and an approval rule for large undos on ``*.compensate``:
    two $0.90 calls of ``booking.flight.compensate`` that undo nothing both ran ($1.80
    spent). The second is refused by ``booking.*``'s ceiling, writing only its refusal;
    an undo of a committed step (at what its step spent) still runs past the full ceiling."""
    gate = make_gate(policy=UNDOS_ASKED)
    assert _call(gate, "plain:1").decision is eg.Decision.EXECUTE
    refused = _call(gate, "plain:2")
    assert refused.decision is eg.Decision.DENIED, refused
    assert refused.reason == "spend ceiling reached: day ceiling of $1.00 on booking.*"
    assert gate.get("plain:2").state is eg.State.DENIED
    step = gate.begin(effect_type="booking.flight", key="flight:1", payload={},
                      estimated_cost_micros=DOLLAR // 10)  # the day's last $0.10
    gate.report(step, "committed")
    counters = _counters(gate)
    undo = _call(gate, compensation_key("flight:1"), undoes=step.effect_id, cost=DOLLAR // 10)
    assert undo.decision is eg.Decision.EXECUTE and undo.budget_warning is None
    assert _counters(gate) == counters == [("booking.*", DOLLAR)]


def _counters(gate: eg.Gate) -> list[tuple[str, int]]:
    """Each spend counter of ``gate``'s namespace: its pattern and what it holds."""
    with gate.store.engine.connect() as conn:
        return [(str(k).split("|")[0], int(v)) for k, v in conn.execute(text(
            "SELECT scope_key, spent_micros FROM effectgate_budgets WHERE namespace = :ns "
            "ORDER BY scope_key"), {"ns": gate.namespace})]


def test_rules_for_undos_still_govern_them_but_lend_no_step_their_ceilings() -> None:
    """The ceilings a ``….compensate`` type is counted by come from the most specific rule
    not written for undos (exact undo names and undo globs carry none); its approval and
    denial still come from the rule written for undos."""
    policy = eg.Policy.from_dict({"budget": {"per_run_micros": 7}, "effects": {
        "hotel.*": {"budget": {"per_day_micros": 5}},
        "booking.*": {"budget": {"per_day_micros": 3}},
        "booking.*.compensate": {"deny": "ask ops"},
        "booking.car.compensate": {"approval": "always"}}})
    assert policy.ceilings_for("booking.car.compensate") == [
        ("booking.*", "day", 3), ("*", "run", 7)]
    assert policy.ceilings_for("hotel.stay.compensate") == [("hotel.*", "day", 5),
                                                            ("*", "run", 7)]
    assert policy.rule_for("booking.car.compensate").effect_type == "booking.car.compensate"
    assert policy.rule_for("booking.bus.compensate").effect_type == "booking.*.compensate"
    assert policy.ceilings_for("booking.hotel") == [("booking.*", "day", 3), ("*", "run", 7)]


@pytest.mark.parametrize(("kept_out", "stored"), [
    ({"store_result": False}, None),
    ({"redact_result": ["passport"]}, {"cancelled": "f:1", "passport": "[redacted]"}),
])
def test_a_rule_for_undos_keeps_out_of_the_store_what_the_steps_glob_keeps_out(
        make_gate: Any, kept_out: dict[str, Any], stored: Any) -> None:
    """``booking.*`` keeps a booking's personal data out of the store; ``*.compensate`` was
    added to have undos approved. The undo runs once approved, and its result is kept as
    ``booking.*`` says (before, all of it was stored), while the approval still governs."""
    gate = make_gate(policy={"effects": {"booking.*": kept_out,
                                         "*.compensate": {"approval": "always"}}})

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> dict[str, str]:
        return {"cancelled": record.key, "passport": "P1234567"}

    step = gate.begin(effect_type="booking.flight", key="f:1", payload={}, group_key="trip",
                      compensation={"flight": "f:1"})
    gate.report(step, "committed", result={"passport": "P1234567"})
    assert not gate.unwind("trip", by="ops").complete  # the undo waits for its approval
    undo = gate.get("compensate:f:1")
    assert undo.state is eg.State.PENDING_APPROVAL and undo.approval_id is not None
    gate.approve(undo.approval_id, by="bob")
    assert gate.unwind("trip", by="ops").complete
    assert gate.get("compensate:f:1").result == stored
    with gate.store.engine.connect() as conn:
        kept = conn.execute(text("SELECT result FROM effectgate_effects WHERE namespace = :ns"
                                 " AND key = 'compensate:f:1'"), {"ns": gate.namespace}).scalar()
    assert "P1234567" not in str(kept)


STEP_OPTIONS = {"vendor": "stripe", "lease_seconds": 120, "max_attempts": 2,
                "reconcile_grace_seconds": 3600, "on_ambiguous": "block"}


def test_a_rule_for_undos_takes_what_it_leaves_unset_from_the_steps_glob(
        make_gate: Any) -> None:
    """``booking.*`` names Stripe, a lease, attempts, an hour's reconcile grace and blocks on
    AMBIGUOUS; ``*.compensate`` only asks for approval. The undo keeps all of that (its
    compensator gets a Stripe idempotency key) and still waits for its approval; an option
    the rule for undos does set is its own."""
    gate = make_gate(policy={"effects": {"booking.*": STEP_OPTIONS,
                                         "*.compensate": {"approval": "always"},
                                         "car.*": STEP_OPTIONS,
                                         "car.*.compensate": {"lease_seconds": 5}}})
    kind = gate.kind("booking.flight.compensate")
    assert (kind.vendor, kind.lease_seconds, kind.max_attempts,
            kind.reconcile_grace_seconds) == ("stripe", 120, 2, 3600)
    assert kind.governance is not None and kind.governance.on_ambiguous == "block"
    assert gate.kind("car.rental.compensate").lease_seconds == 5
    keys: list[str | None] = []

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        keys.append(eg.current_effect().vendor_idempotency_key)

    step = gate.begin(effect_type="booking.flight", key="f:1", payload={}, group_key="trip",
                      compensation={"flight": "f:1"})
    gate.report(step, "committed")
    assert not gate.unwind("trip", by="ops").complete
    undo = gate.get("compensate:f:1")
    assert undo.state is eg.State.PENDING_APPROVAL and undo.approval_id is not None
    gate.approve(undo.approval_id, by="bob")
    assert gate.unwind("trip", by="ops").complete
    assert len(keys) == 1 and keys[0] is not None and keys[0] != step.vendor_idempotency_key


RACER = """
import json, os, sys
import effectgate as eg
url, ns, out, keys, cost, policy = sys.argv[1:7]
gate = eg.Gate(url, namespace=ns, policy=json.loads(policy))
print("ready", flush=True)
sys.stdin.readline()
order = [f"k{i}" for i in range(int(keys))]
for key in (order + order[::-1]) * 2:
    d = gate.begin(effect_type="payment.refund", key=key, payload={"k": key},
                   agent_id="agent", estimated_cost_micros=int(cost))
    if d.decision is eg.Decision.EXECUTE:
        with open(out, "a") as f:
            f.write(f"{key} {cost}\\n")
        gate.report(d, "committed")
gate.close()
"""
RACED = {"effects": {"payment.*": {"approval": "always",
                                   "budget": {"per_day_micros": 67 * DOLLAR}}}}


@pytest.mark.slow
def test_processes_racing_on_approved_effects_a_ceiling_refuses_run_each_once(
        make_gate: Any, store_url: str, namespace: str, tmp_path: Path) -> None:
    """Eight effects approved at $20, $67 a day: three processes (two calling at $20, one at
    $5) race over them. Every effect runs at most once; a committed one consumed its
    approval and has no refusal left on it; one still waiting keeps its approval approved;
    the counter holds exactly what ran."""
    gate = make_gate(policy=RACED)
    for i in range(8):
        d = gate.begin(effect_type="payment.refund", key=f"k{i}", payload={"k": f"k{i}"},
                       agent_id="agent", estimated_cost_micros=20 * DOLLAR)
        gate.approve(d.approval_id or "", by="alice")
    out = tmp_path / "ran.log"
    procs = [subprocess.Popen(
        [sys.executable, "-c", RACER, store_url, namespace, str(out), "8", str(cost),
         json.dumps(RACED)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for cost in (20 * DOLLAR, 5 * DOLLAR, 20 * DOLLAR)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    ran = [line.split() for line in out.read_text().splitlines()] if out.exists() else []
    assert len({key for key, _ in ran}) == len(ran) > 0, ran  # each at most once
    for i in range(8):
        record = gate.get(f"k{i}")
        approval = gate.approval(record.approval_id or "")
        if any(key == f"k{i}" for key, _ in ran):
            assert (record.state, approval.state, record.reason) == (
                eg.State.COMMITTED, ApprovalState.CONSUMED, None), record
        else:
            assert (record.state, approval.state) == (
                eg.State.PENDING_APPROVAL, ApprovalState.APPROVED), record
    assert _counters(gate) == [("payment.*", sum(int(cost) for _, cost in ran))]
