"""Governance on both backends: approvals (G8), budgets (G9), sagas (G10), retention (G11)."""

from __future__ import annotations

import datetime
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate.testing import lapse_leases

DOLLAR = 1_000_000


def governed(make_gate: Any, **policy: Any) -> eg.Gate:
    return make_gate(policy=eg.Policy.from_dict(policy))  # type: ignore[no-any-return]


def refund(gate: eg.Gate, txn: str = "txn_1", amount: int = 500, **kw: Any) -> eg.BeginDecision:
    kw.setdefault("estimated_cost_micros", amount * 10_000)
    return gate.begin(effect_type="payment.refund", key=f"refund:{txn}",
                      payload={"txn_id": txn, "amount_cents": amount}, **kw)


# -- G8: approvals ---------------------------------------------------------------------------

APPROVE_ALWAYS = {"effects": {"payment.*": {"approval": "always"}}}


def test_g8_approval_bound_to_payload_and_single_use(make_gate: Any) -> None:
    """G8: approval_required -> approve -> the same payload executes once; a replay is a
    duplicate, never a second execution; the approval cannot be used again."""
    gate = governed(make_gate, **APPROVE_ALWAYS)
    d = refund(gate, agent_id="agent-1")
    assert d.decision is eg.Decision.APPROVAL_REQUIRED and d.approval_id
    again = refund(gate, agent_id="agent-1")
    assert again.decision is eg.Decision.APPROVAL_REQUIRED and again.approval_id == d.approval_id
    assert gate.get("refund:txn_1").state is eg.State.PENDING_APPROVAL
    with pytest.raises(eg.PayloadMismatch):  # a changed payload is not what was approved
        refund(gate, amount=999)
    record = gate.approve(d.approval_id, by="alice")
    assert record.state == "approved" and record.decided_by == "alice"
    run = refund(gate, agent_id="agent-1")
    assert run.decision is eg.Decision.EXECUTE and run.attempt == 1
    gate.report(run, "committed", result={"refund": "re_1"})
    assert refund(gate).decision is eg.Decision.DUPLICATE
    assert gate.list_approvals(state=None)[0].state == "consumed"
    with pytest.raises(eg.InvalidTransition):
        gate.approve(d.approval_id, by="alice")


def test_g8_failed_attempt_needs_new_approval(make_gate: Any) -> None:
    gate = governed(make_gate, **APPROVE_ALWAYS)
    first = refund(gate)
    gate.approve(first.approval_id, by="alice")
    run = refund(gate)
    gate.report(run, "failed", error="declined")
    retry = refund(gate)
    assert retry.decision is eg.Decision.APPROVAL_REQUIRED
    assert retry.approval_id != first.approval_id


def test_deny_holds(make_gate: Any) -> None:
    gate = governed(make_gate, **APPROVE_ALWAYS)
    d = refund(gate)
    gate.deny(d.approval_id, by="bob", reason="not this customer")
    for _ in range(2):
        denied = refund(gate)
        assert denied.decision is eg.Decision.DENIED
        assert "bob" in (denied.reason or "") and "not this customer" in (denied.reason or "")
    assert gate.get("refund:txn_1").state is eg.State.DENIED
    with pytest.raises(eg.InvalidTransition):
        gate.approve(d.approval_id, by="alice")


def test_approval_expires(make_gate: Any) -> None:
    gate = governed(make_gate, effects={
        "payment.*": {"approval": {"always": True, "expires_seconds": 0.2}}})
    d = refund(gate)
    import time

    time.sleep(0.3)
    with pytest.raises(eg.InvalidTransition, match="expired"):
        gate.approve(d.approval_id, by="alice")
    fresh = refund(gate)
    assert fresh.decision is eg.Decision.APPROVAL_REQUIRED and fresh.approval_id != d.approval_id


def test_self_approval_refused_when_policy_says_so(make_gate: Any) -> None:
    gate = governed(make_gate, **APPROVE_ALWAYS)
    d = refund(gate, agent_id="agent-1")
    with pytest.raises(eg.InvalidTransition, match="own request"):
        gate.approve(d.approval_id, by="agent-1")
    gate.approve(d.approval_id, by="human")


def test_approval_by_cost_threshold(make_gate: Any) -> None:
    gate = governed(make_gate, effects={
        "payment.*": {"approval": {"at_or_above_micros": 100 * DOLLAR}}})
    assert refund(gate, "small", 500).decision is eg.Decision.EXECUTE
    assert refund(gate, "big", 20_000).decision is eg.Decision.APPROVAL_REQUIRED


def test_decorator_raises_approval_required(make_gate: Any) -> None:
    gate = governed(make_gate, **APPROVE_ALWAYS)
    calls: list[str] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def do_refund(txn_id: str) -> str:
        calls.append(txn_id)
        return "done"

    with pytest.raises(eg.ApprovalRequired) as err:
        do_refund("t")
    gate.approve(err.value.approval_id, by="alice")
    assert do_refund("t") == "done" and do_refund("t") == "done"
    assert calls == ["t"]


# -- G9: budgets -----------------------------------------------------------------------------

def test_g9_ceiling_refuses_and_ambiguous_holds_spend(make_gate: Any) -> None:
    """G9: over a ceiling -> denied naming it; FAILED releases; AMBIGUOUS holds its spend."""
    gate = governed(make_gate, effects={"payment.*": {"budget": {"per_run_micros": 10 * DOLLAR}}})
    a = refund(gate, "a", 600, run_id="r1")  # $6
    assert a.decision is eg.Decision.EXECUTE
    b = refund(gate, "b", 500, run_id="r1")  # $5: over $10
    assert b.decision is eg.Decision.DENIED and "run ceiling" in (b.reason or "")
    assert refund(gate, "b2", 500, run_id="r2").decision is eg.Decision.EXECUTE  # other run
    gate.report(a, "failed")  # releases $6
    c = refund(gate, "c", 900, run_id="r1")
    assert c.decision is eg.Decision.EXECUTE
    gate.report(c, "ambiguous", error="reply lost")  # $9 held
    assert refund(gate, "d", 200, run_id="r1").decision is eg.Decision.DENIED
    gate.resolve("refund:c", "failed", by="ops")  # released
    assert refund(gate, "d2", 200, run_id="r1").decision is eg.Decision.EXECUTE
    # A budget-denied effect is asked again once the reason no longer holds.
    assert refund(gate, "b", 500, run_id="r1").decision is eg.Decision.EXECUTE


def test_actual_cost_corrects_estimate(make_gate: Any) -> None:
    gate = governed(make_gate, budget={"per_day_micros": 10 * DOLLAR})
    d = refund(gate, "a", 900)  # $9 estimated
    gate.report(d, "committed", result=None, actual_cost_micros=2 * DOLLAR)
    assert refund(gate, "b", 700).decision is eg.Decision.EXECUTE  # 2 + 7 <= 10


def test_no_declared_cost_sets_budget_warning(make_gate: Any) -> None:
    gate = governed(make_gate, effects={"payment.*": {"budget": {"per_agent_micros": DOLLAR}}})
    d = gate.begin(effect_type="payment.refund", key="refund:x", payload={}, agent_id="a")
    assert d.decision is eg.Decision.EXECUTE
    assert d.budget_warning and "cannot fire" in d.budget_warning

    @gate.effect("refund:{t}", effect_type="payment.refund")
    def do(t: str) -> None: ...

    with pytest.warns(eg.BudgetWarning):
        do("y")


def test_a_run_or_agent_ceiling_that_cannot_count_a_call_says_so(make_gate: Any) -> None:
    """A per-run or per-agent ceiling cannot count a call with no run or agent id (an agent
    on the protocol path can leave it out): the call runs uncounted, with a budget warning,
    never silently past the ceiling."""
    gate = governed(make_gate, budget={"per_agent_micros": 2 * DOLLAR,
                                       "per_run_micros": 2 * DOLLAR})
    for i in range(3):
        d = gate.begin(effect_type="payment.refund", key=f"refund:{i}", payload={},
                       estimated_cost_micros=DOLLAR)
        assert d.decision is eg.Decision.EXECUTE
        assert d.budget_warning and "no agent_id or run_id" in d.budget_warning
    scoped = [gate.begin(effect_type="payment.refund", key=f"refund:bot{i}", payload={},
                         estimated_cost_micros=DOLLAR, agent_id="bot", run_id="r1")
              for i in range(3)]
    assert [d.decision for d in scoped] == [eg.Decision.EXECUTE] * 2 + [eg.Decision.DENIED]
    assert scoped[0].budget_warning is None
    half = gate.begin(effect_type="payment.refund", key="refund:half", payload={},
                      estimated_cost_micros=DOLLAR, agent_id="other")
    assert half.budget_warning and "no run_id" in half.budget_warning
    assert "agent (" not in half.budget_warning


MAX_BIGINT = 2**63 - 1

MONEY_FIELDS = [
    ("budget", {"budget": {"per_day_micros": None}}),
    ("effects.payment.refund.budget", {"effects": {"payment.refund": {"budget": {
        "per_run_micros": None}}}}),
    ("effects.payment.refund.budget", {"effects": {"payment.refund": {"budget": {
        "per_agent_micros": None}}}}),
    ("effects.payment.refund.budget", {"effects": {"payment.refund": {"budget": {
        "per_effect_type_micros": None}}}}),
    ("effects.payment.refund.approval", {"effects": {"payment.refund": {"approval": {
        "at_or_above_micros": None}}}}),
    ("effects.payment.refund", {"effects": {"payment.refund": {"max_attempts": None}}}),
]


def _with(policy: dict[str, Any], value: Any) -> dict[str, Any]:
    """``policy`` with its one None leaf set to ``value``."""
    return {k: (_with(v, value) if isinstance(v, dict) else value if v is None else v)
            for k, v in policy.items()}


def test_a_catch_all_rule_budget_beside_the_top_level_budget_is_refused() -> None:
    """``[effects."*"]`` and ``[budget]`` would count on one counter, charging each call
    twice (a $6 call denied under two $10 ceilings): the policy is refused at load."""
    with pytest.raises(eg.PolicyError, match="charging each call twice"):
        eg.Policy.from_dict({"budget": {"per_day_micros": 10_000_000},
                             "effects": {"*": {"budget": {"per_day_micros": 10_000_000}}}})
    alone = eg.Policy.from_dict({"effects": {"*": {"budget": {"per_day_micros": 1}}}})
    assert alone.ceilings_for("payment.refund") == [("*", "day", 1)]


@pytest.mark.parametrize(("where", "policy"), MONEY_FIELDS)
def test_a_ceiling_past_bigint_is_a_policy_error_at_load(store_url: str, namespace: str,
                                                         tmp_path: Path, where: str,
                                                         policy: dict[str, Any]) -> None:
    """A per-day ceiling (or any ceiling, threshold or attempt count) of 2^64 — or a bool, a
    float, a string — is refused when the policy loads, naming the field, before a gate
    writes anything; 2^63 - 1, the most a BIGINT holds on both databases, loads."""
    for bad in (2**64, MAX_BIGINT + 1, True, 5.0, "5"):
        with pytest.raises(eg.PolicyError, match=where.replace(".", r"\.")):
            eg.Policy.from_dict(_with(policy, bad))
        with pytest.raises(eg.PolicyError):
            eg.Gate(store_url, namespace=namespace, policy=_with(policy, bad))
    toml = tmp_path / "effectgate.toml"
    toml.write_text("[budget]\nper_day_micros = 18446744073709551616\n", encoding="utf-8")
    with pytest.raises(eg.PolicyError, match="per_day_micros"):
        eg.Policy.load(toml)
    with eg.Gate(store_url, namespace=namespace, policy=False) as gate:
        assert gate.store.meta.get(f"policy:{namespace}") is None  # nothing was recorded
    with eg.Gate(store_url, namespace=namespace, policy=_with(policy, MAX_BIGINT)) as gate:
        d = refund(gate, "big", amount=1)
        assert d.decision is eg.Decision.EXECUTE


def test_ceilings_and_costs_at_the_bigint_bound_never_overflow_a_counter(
        make_gate: Any) -> None:
    """A ceiling of 2^63 - 1 and estimates near it: the charge that would pass the bound is
    refused as over the ceiling (not a database error), and the counter holds what it did."""
    gate = governed(make_gate, budget={"per_day_micros": MAX_BIGINT})
    first = gate.begin(effect_type="payment.refund", key="refund:a", payload={},
                       estimated_cost_micros=MAX_BIGINT - 10)
    assert first.decision is eg.Decision.EXECUTE
    over = gate.begin(effect_type="payment.refund", key="refund:b", payload={},
                      estimated_cost_micros=100)
    assert over.decision is eg.Decision.DENIED and "ceiling" in (over.reason or "")
    fits = gate.begin(effect_type="payment.refund", key="refund:c", payload={},
                      estimated_cost_micros=10)
    assert fits.decision is eg.Decision.EXECUTE
    assert [spent for _, spent in _counters(gate)] == [MAX_BIGINT]


def _counters(gate: eg.Gate) -> list[tuple[str, Any]]:
    from sqlalchemy import text

    with gate.store.engine.connect() as conn:
        return [(str(k), v) for k, v in conn.execute(text(
            "SELECT scope_key, spent_micros FROM effectgate_budgets WHERE namespace = :ns"),
            {"ns": gate.namespace})]


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_a_report_with_an_actual_cost_past_bigint_changes_nothing(make_gate: Any,
                                                                  caller: str) -> None:
    """An actual cost of 2^63 (or negative, or not an int) is refused before anything is
    written: a typed ConfigError, the effect still in flight and its counters as charged,
    and the holder can still report what it spent."""
    import asyncio

    from .conftest import snapshot

    gate = governed(make_gate, budget={"per_day_micros": 10 * DOLLAR})
    d = refund(gate, "a", 100)

    def report(**kw: Any) -> None:
        if caller == "sync":
            gate.report(d, "committed", result={"ok": 1}, **kw)
        else:
            asyncio.run(gate.areport(d, "committed", result={"ok": 1}, **kw))

    before = snapshot(gate)
    for bad in (2**63, 2**64, -1, True, 1.5, "7"):
        with pytest.raises(eg.ConfigError, match="actual_cost_micros"):
            report(actual_cost_micros=bad)
        assert snapshot(gate) == before
    report(actual_cost_micros=2 * DOLLAR)
    assert gate.get("refund:a").state is eg.State.COMMITTED
    assert [spent for _, spent in _counters(gate)] == [2 * DOLLAR]


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_an_actual_cost_at_the_bigint_bound_is_recorded_and_stops_the_counter_there(
        make_gate: Any, caller: str) -> None:
    """The largest cost a BIGINT holds, reported under a ceiling: the report lands (the money
    was spent; refusing it would leave the effect in flight), the counters stop at 2^63 - 1
    instead of overflowing (a database error on Postgres, a float on SQLite), and the
    ceiling refuses what comes next."""
    import asyncio

    gate = governed(make_gate, budget={"per_day_micros": 10 * DOLLAR, "per_run_micros": DOLLAR})
    spent = refund(gate, "a", 50, run_id="r")
    d = refund(gate, "b", 50, run_id="r")
    gate.report(spent, "committed", result={"ok": 1})
    with pytest.warns(eg.OverspendWarning, match="run ceiling"):
        if caller == "sync":
            gate.report(d, "committed", result={"ok": 2}, actual_cost_micros=MAX_BIGINT)
        else:
            asyncio.run(gate.areport(d, "committed", result={"ok": 2},
                                     actual_cost_micros=MAX_BIGINT))
    record = gate.get("refund:b")
    assert record.state is eg.State.COMMITTED and record.actual_cost_micros == MAX_BIGINT
    counters = _counters(gate)
    assert len(counters) == 2
    assert all(type(v) is int and v == MAX_BIGINT for _, v in counters), counters
    assert refund(gate, "c", 1, run_id="r").decision is eg.Decision.DENIED


def _processes() -> Any:
    """Real OS processes, forked from one server process that imported effectgate, its store
    and this module once (``spawn`` paid those imports again in each of the 8 workers: most
    of the test's time). Each worker still builds its own gate and its own connections."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "effectgate.gate", "effectgate.store.sql",
                                "effectgate.store.pg_direct", "effectgate.policy", "psycopg"])
    return ctx


def _spend_worker(url: str, ns: str, worker: int, side: str, start: Any) -> None:
    gate = eg.Gate(url, namespace=ns, policy=eg.Policy.from_dict(
        {"effects": {"payment.*": {"budget": {"per_effect_type_micros": 10 * DOLLAR}}}}))
    start.wait(60)  # a barrier: every worker's gate is built before any of them begins
    for i in range(6):
        d = gate.begin(effect_type="payment.charge", key=f"charge:{worker}:{i}",
                       payload={}, estimated_cost_micros=DOLLAR)
        if d.decision is eg.Decision.EXECUTE:
            with open(side, "a") as f:
                f.write(f"{worker}:{i}\n")
            gate.report(d, "committed")


@pytest.mark.xdist_group("processes")
def test_g9_eight_processes_never_spend_past_ceiling(store_url: str, namespace: str,
                                                    tmp_path: Path) -> None:
    side = str(tmp_path / "spent.txt")
    ctx = _processes()
    start = ctx.Barrier(8)
    procs = [ctx.Process(target=_spend_worker, args=(store_url, namespace, w, side, start))
             for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    spent = Path(side).read_text().splitlines()
    assert len(spent) == 10  # 48 tries of $1 against a $10 ceiling


def test_g9_racers_for_one_new_key_charge_its_cost_once(make_gate: Any) -> None:
    """Sixteen concurrent begins of one new governed key (an agent's parallel tool calls):
    one executes and the ceiling is charged its cost once. On Postgres each loser's
    reservation read nothing, charged, then found the key taken; its charge, recorded on no
    effect and so never released, stayed counted (13 of 16 seen) and later spend within the
    ceiling was denied."""
    import asyncio

    gate = make_gate(policy=eg.Policy.from_dict({"budget": {"per_day_micros": 20 * DOLLAR}}),
                     async_pool_size=16)

    async def race() -> list[eg.BeginDecision]:
        return await asyncio.gather(*[gate.abegin(
            effect_type="payment.refund", key="refund:one", payload={},
            estimated_cost_micros=DOLLAR) for _ in range(16)])

    decisions = asyncio.run(race())
    assert [d.decision for d in decisions].count(eg.Decision.EXECUTE) == 1
    assert [spent for _, spent in _counters(gate)] == [DOLLAR]
    for d in decisions:
        if d.decision is eg.Decision.EXECUTE:
            gate.report(d, "failed")
    assert [spent for _, spent in _counters(gate)] == [0]


# -- G10: sagas ------------------------------------------------------------------------------

def _trip(gate: eg.Gate, undone: list[str]) -> None:
    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> dict[str, Any]:
        undone.append(compensation["cancel"])
        return {"cancelled": compensation["cancel"]}

    for step, comp in (("flight", {"cancel": "flight"}), ("hotel", {"cancel": "hotel"}),
                       ("insurance", None), ("car", {"cancel": "car"})):
        d = gate.begin(effect_type=f"booking.{step}", key=f"{step}:trip_1", payload={},
                       group_key="trip:1", compensation=comp)
        gate.report(d, "committed", result={"booked": step})


def test_g10_unwind_compensates_each_step_once_in_reverse(make_gate: Any) -> None:
    """G10: unwind runs the undos of committed steps in reverse order, each once; re-running
    compensates nothing twice; steps with no compensation are listed as irreversible."""
    gate = make_gate()
    undone: list[str] = []
    _trip(gate, undone)
    pending = gate.begin(effect_type="booking.train", key="train:trip_1", payload={},
                         group_key="trip:1", compensation={"cancel": "train"})
    report = gate.unwind("trip:1")
    assert undone == ["car", "hotel", "flight"]
    assert [s.key for s in report.compensated] == ["car:trip_1", "hotel:trip_1", "flight:trip_1"]
    assert [s.key for s in report.irreversible] == ["insurance:trip_1"]
    assert [s.key for s in report.unresolved] == ["train:trip_1"] and not report.complete
    again = gate.unwind("trip:1")
    assert undone == ["car", "hotel", "flight"]
    assert all(s.detail == "compensated earlier" for s in again.compensated)
    comp = gate.get("compensate:car:trip_1")
    assert comp.compensates_effect_id == gate.get("car:trip_1").effect_id
    gate.report(pending, "committed")


def test_a_reconciler_for_the_steps_never_answers_for_their_undos(make_gate: Any) -> None:
    """``booking.*`` is the steps' pattern: its reconciler (asked "does the booking exist?")
    must not settle an AMBIGUOUS undo (the compensator ran twice); a pattern written for undos
    (``*.compensate``) does reach them."""
    gate = make_gate()
    vendor: dict[str, str] = {}
    cancels: list[str] = []

    @gate.reconciler("booking.*")
    def ask_vendor(record: eg.EffectRecord) -> str:
        return "committed" if vendor.get(record.key) == "confirmed" else "failed"

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        cancels.append(record.key)
        vendor[record.key] = "cancelled"
        if len(cancels) == 1:
            raise TimeoutError("the cancel's reply was lost")

    d = gate.begin(effect_type="booking.car", key="car:trip_9", payload={},
                   group_key="trip:9", compensation={"cancel": "car"})
    vendor["car:trip_9"] = "confirmed"
    gate.report(d, "committed")
    first = gate.unwind("trip:9")  # the undo ran, its reply lost
    assert cancels == ["car:trip_9"] and [s.key for s in first.unresolved] == ["car:trip_9"]
    again = gate.unwind("trip:9")
    assert cancels == ["car:trip_9"] and not again.complete  # the booking hook was not asked
    assert gate.get("compensate:car:trip_9").state is eg.State.AMBIGUOUS
    asked: list[str] = []

    @gate.reconciler("*.compensate")
    def ask_about_cancels(record: eg.EffectRecord) -> str:
        asked.append(record.key)
        return "committed"

    assert gate.unwind("trip:9").complete and asked == ["compensate:car:trip_9"]
    assert cancels == ["car:trip_9"]


def test_a_catch_all_policy_rule_governs_types_named_as_undos_too(make_gate: Any) -> None:
    """Naming an effect type ``….compensate`` (an MCP agent chooses its type) never escapes an
    approval rule or a ceiling written as a glob."""
    gate = make_gate(policy=eg.Policy.from_dict({"effects": {"*": {"approval": "always"}}}))
    for effect_type in ("payment.refund", "payment.refund.compensate", "hr.compensate"):
        d = gate.begin(effect_type=effect_type, key=f"k:{effect_type}", payload={})
        assert d.decision is eg.Decision.APPROVAL_REQUIRED, effect_type


def test_a_retried_step_keeps_the_group_and_undo_its_attempt_declared(make_gate: Any) -> None:
    """Attempt 1 FAILED outside any saga; attempt 2 declares the group and its undo, commits,
    and unwind finds it (the move into attempt 2 had kept attempt 1's none)."""
    gate = make_gate()
    undone: list[Any] = []

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        undone.append(compensation)

    first = gate.begin(effect_type="booking.car", key="car:trip_7", payload={})
    gate.report(first, "failed", error="the vendor refused before booking")
    second = gate.begin(effect_type="booking.car", key="car:trip_7", payload={},
                        group_key="trip:7", compensation={"cancel": "car"}, run_id="r2")
    assert second.decision is eg.Decision.EXECUTE and second.attempt == 2
    gate.report(second, "committed")
    record = gate.get("car:trip_7")
    assert (record.group_key, record.compensation) == ("trip:7", {"cancel": "car"})
    report = gate.unwind("trip:7")
    assert undone == [{"cancel": "car"}] and report.complete
    assert [s.key for s in report.compensated] == ["car:trip_7"]


def test_a_second_unwind_says_it_compensated_nothing_new(make_gate: Any) -> None:
    """The report says what *this* unwind did: a step undone by an earlier unwind is marked
    ``earlier`` (and counted apart), never claimed as compensated again."""
    gate = make_gate()
    undone: list[str] = []
    _trip(gate, undone)
    first = gate.unwind("trip:1")
    assert [s.key for s in first.compensated_now] == ["car:trip_1", "hotel:trip_1",
                                                       "flight:trip_1"]
    assert first.compensated_earlier == [] and not any(s.earlier for s in first.compensated)
    d = gate.begin(effect_type="booking.boat", key="boat:trip_1", payload={},
                   group_key="trip:1", compensation={"cancel": "boat"})
    gate.report(d, "committed")
    again = gate.unwind("trip:1")
    assert [s.key for s in again.compensated_now] == ["boat:trip_1"]
    assert [s.key for s in again.compensated_earlier] == ["car:trip_1", "hotel:trip_1",
                                                          "flight:trip_1"]
    assert undone == ["car", "hotel", "flight", "boat"]
    shown = again.as_dict()["compensated"]
    assert [s["earlier"] for s in shown] == [False, True, True, True]


def _unwind_worker(url: str, ns: str, side: str, start: Any) -> None:
    gate = eg.Gate(url, namespace=ns)

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        with open(side, "a") as f:
            f.write(compensation["cancel"] + "\n")

    start.wait(60)  # a barrier: every worker's gate is built before any of them unwinds
    gate.unwind("trip:1")


@pytest.mark.xdist_group("processes")
def test_g10_concurrent_unwinds_compensate_once(make_gate: Any, store_url: str,
                                               namespace: str, tmp_path: Path) -> None:
    _trip(make_gate(), [])
    side = str(tmp_path / "undone.txt")
    ctx = _processes()
    start = ctx.Barrier(4)
    procs = [ctx.Process(target=_unwind_worker, args=(store_url, namespace, side, start))
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert sorted(Path(side).read_text().split()) == ["car", "flight", "hotel"]


# -- G11: retention --------------------------------------------------------------------------

def test_g11_pruned_keys_still_refuse_duplicates(make_gate: Any) -> None:
    """G11: prune drops results and history, keeps a tombstone that refuses a duplicate;
    it never touches in-flight or ambiguous effects."""
    gate = make_gate()
    d = refund(gate)
    gate.report(d, "committed", result={"card": "4242"})
    live = refund(gate, "live")
    lost = refund(gate, "lost")
    lapse_leases(gate, "refund:lost")
    assert gate.prune(datetime.timedelta(0)) == 1
    record = gate.get("refund:txn_1")
    assert record.state is eg.State.COMMITTED and record.result is None
    assert record.pruned_at is not None and record.history == ()
    other = make_gate(memo_size=0)
    dup = refund(other)
    assert dup.decision is eg.Decision.DUPLICATE and dup.reason == "its stored result was pruned"
    with pytest.raises(eg.PayloadMismatch):
        refund(other, amount=1)
    assert gate.get("refund:live").state is eg.State.IN_FLIGHT
    assert gate.get("refund:lost").state is eg.State.AMBIGUOUS
    assert gate.prune(datetime.timedelta(days=30)) == 0
    gate.report(live, "committed")
    del lost


def test_policy_deny(make_gate: Any) -> None:
    gate = governed(make_gate, effects={"deploy.prod": {"deny": "prod is frozen"}})
    d = gate.begin(effect_type="deploy.prod", key="deploy:prod:1", payload={})
    assert d.decision is eg.Decision.DENIED and d.reason == "prod is frozen"
    assert gate.get("deploy:prod:1").state is eg.State.DENIED


def test_policy_defaults_apply(make_gate: Any) -> None:
    gate = governed(make_gate, effects={"payment.*": {"vendor": "adyen", "max_attempts": 1}})
    d = refund(gate)
    assert d.vendor_key is not None and d.vendor_key.vendor == "adyen"
    gate.report(d, "failed")
    assert refund(gate).decision is eg.Decision.DENIED


def test_list_effects_filters(make_gate: Any) -> None:
    gate = make_gate()
    d = refund(gate, "a", run_id="r1")
    gate.report(d, "committed")
    refund(gate, "b", run_id="r2")
    refund(gate, "c", run_id="r1")
    lapse_leases(gate, "refund:c")
    assert [r.key for r in gate.list_effects(run_id="r1")] == ["refund:c", "refund:a"]
    assert [r.key for r in gate.list_effects(state="ambiguous")] == ["refund:c"]
    assert [r.key for r in gate.list_effects(state="in_flight")] == ["refund:b"]
    with pytest.raises(eg.ConfigError):
        gate.list_effects(state="nope")




def test_an_approved_effect_refused_by_a_ceiling_keeps_its_approval(make_gate: Any) -> None:
    """Two refunds approved by a human; the day's ceiling has room for one. The second is
    refused for the budget, but its approval is not lost to it: once the first one's spend is
    released (it FAILED), the second runs on the approval the human gave, asking nobody again.
    (The refusal used to move the effect to DENIED with the approval unconsumed and unusable:
    the next begin opened a new request, and the human had to approve it twice.)"""
    gate = make_gate(policy={"effects": {"pay.*": {
        "approval": {"always": True}, "budget": {"per_day_micros": 10_000_000}}}})
    a, b = ({"effect_type": "pay.refund", "key": f"refund:{k}", "payload": {"k": k},
             "estimated_cost_micros": 6_000_000} for k in ("a", "b"))
    for fields in (a, b):
        asked = gate.begin(**fields)
        assert asked.decision is eg.Decision.APPROVAL_REQUIRED
        gate.approve(asked.approval_id, by="alice")
    first = gate.begin(**a)
    assert first.decision is eg.Decision.EXECUTE
    refused = gate.begin(**b)
    assert refused.decision is eg.Decision.DENIED and "spend ceiling" in (refused.reason or "")
    assert gate.get("refund:b").state is eg.State.PENDING_APPROVAL
    gate.report(first, "failed", error="card declined")
    second = gate.begin(**b)
    assert second.decision is eg.Decision.EXECUTE, second
    assert gate.approval(refused.approval_id).state is eg.ApprovalState.CONSUMED


def test_an_undo_is_judged_by_its_steps_cost_and_never_counted_as_spend(
        make_gate: Any) -> None:
    """Under ``payment.*`` with "$100 or more needs approval" and a day's ceiling: the undo of
    a $1 charge runs at once and the undo of a $500 one waits for a human (each judged by its
    step's cost: an undo declaring no cost would need approval at any amount); neither is
    counted against the ceiling, which the charges filled (an unwind must never be blocked by
    a budget spent)."""
    gate = make_gate(policy={"effects": {"payment.*": {
        "approval": {"at_or_above_micros": 100_000_000},
        "budget": {"per_day_micros": 501_000_000}}}})
    undone: list[str] = []

    @gate.compensator("payment.charge")
    def refund(record: eg.EffectRecord, compensation: Any) -> None:
        undone.append(compensation["charge"])

    for name, cost in (("big", 500_000_000), ("small", 1_000_000)):
        d = gate.begin(effect_type="payment.charge", key=f"charge:{name}", payload={"n": name},
                       group_key="trip:1", compensation={"charge": name},
                       estimated_cost_micros=cost)
        if d.decision is eg.Decision.APPROVAL_REQUIRED:
            gate.approve(d.approval_id, by="alice")
            d = gate.begin(effect_type="payment.charge", key=f"charge:{name}",
                           payload={"n": name}, group_key="trip:1",
                           compensation={"charge": name}, estimated_cost_micros=cost)
        assert d.decision is eg.Decision.EXECUTE, d
        gate.report(d, "committed", result={"ok": name})
    report = gate.unwind("trip:1", by="ops")
    assert undone == ["small"]  # the newest first; the big one's undo waits for approval
    assert [s.key for s in report.compensated] == ["charge:small"]
    waiting = gate.get("compensate:charge:big")
    assert waiting.state is eg.State.PENDING_APPROVAL
    assert gate.get("compensate:charge:small").state is eg.State.COMMITTED
    gate.approve(waiting.approval_id, by="bob")
    gate.unwind("trip:1", by="ops")
    assert undone == ["small", "big"]  # no ceiling refused it, though the day is spent


def test_an_undo_is_judged_by_what_its_step_actually_cost(make_gate: Any) -> None:
    """A step estimated at $0.01 that its holder reported costing $1,000: its undo gives back
    $1,000, and "$100 or more needs approval" asks a human for it (judged by the estimate, it
    ran unasked)."""
    gate = make_gate(policy={"effects": {"payment.*": {
        "approval": {"at_or_above_micros": 100_000_000}}}})
    undone: list[str] = []

    @gate.compensator("payment.charge")
    def refund(record: eg.EffectRecord, compensation: Any) -> None:
        undone.append(compensation["charge"])

    d = gate.begin(effect_type="payment.charge", key="charge:1", payload={}, group_key="trip:2",
                   compensation={"charge": "1"}, estimated_cost_micros=10_000)
    assert d.decision is eg.Decision.EXECUTE
    gate.report(d, "committed", result={"ok": 1}, actual_cost_micros=1_000_000_000)
    report = gate.unwind("trip:2", by="ops")
    assert undone == [] and [s.key for s in report.unresolved] == ["charge:1"]
    assert gate.get("compensate:charge:1").state is eg.State.PENDING_APPROVAL


@pytest.mark.parametrize(("micros", "shown"), [
    (0, "$0.00"), (1, "$0.000001"), (1_000, "$0.001"), (4_000, "$0.004"), (10_000, "$0.01"),
    (1_500_000, "$1.50"), (1_005_000, "$1.005"), (1_234_567, "$1.234567"),
    (999_999, "$0.999999"), (1_000_000_000_000, "$1,000,000.00"), (-2_500, "-$0.0025"),
])
def test_dollars_are_shown_exactly_never_rounded(micros: int, shown: str) -> None:
    """Costs are counted in micro-units; a person reads them as dollars, to the last
    micro-unit that is not zero (a model call costs a fraction of a cent)."""
    from effectgate.governance import dollars

    assert dollars(micros) == shown


def test_a_sub_cent_ceiling_says_what_it_is(make_gate: Any) -> None:
    """A ceiling of 1,000 micro-units refuses with "$0.001" in its reason, not "$0.00"."""
    gate = governed(make_gate, effects={"payment.*": {"budget": {
        "per_effect_type_micros": 1_000}}})
    d = refund(gate, estimated_cost_micros=4_000)
    assert d.decision is eg.Decision.DENIED
    assert "ceiling of $0.001 on payment.*" in (d.reason or ""), d.reason
