"""The core gate on both backends: decisions, states, leases, fencing, resolve (G1, G3–G7)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import effectgate as eg
from effectgate.testing import lapse_leases

from .conftest import PG_URL, require_postgres, snapshot

REFUND = {"txn_id": "txn_1", "amount_cents": 500}


def begin(gate: eg.Gate, key: str = "refund:txn_1", payload: Any = None, **kw: Any) -> Any:
    return gate.begin(effect_type="payment.refund", key=key,
                      payload=REFUND if payload is None else payload, **kw)


def test_g1_committed_effect_never_executes_again(make_gate: Any) -> None:
    """G1: a committed effect is never executed again; a duplicate returns the stored result."""
    gate = make_gate()
    calls: list[str] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        calls.append(txn_id)
        return {"refund_id": f"re_{len(calls)}", "amount": amount_cents}

    first = refund("txn_1", 500)
    assert refund("txn_1", 500) == first
    assert refund(txn_id="txn_1", amount_cents=500) == first
    # Another process's gate (no shared memory) answers from the store.
    other = make_gate(memo_size=0)
    d = begin(other, payload={"txn_id": "txn_1", "amount_cents": 500})
    assert d.decision is eg.Decision.DUPLICATE
    assert d.result == first
    assert calls == ["txn_1"]
    record = gate.get("refund:txn_1")
    assert record.state is eg.State.COMMITTED and record.result == first
    assert [(h.from_state, h.to_state) for h in record.history] == [
        (None, eg.State.IN_FLIGHT), (eg.State.IN_FLIGHT, eg.State.COMMITTED)
    ]


def test_protocol_begin_report_duplicate(gate: eg.Gate) -> None:
    d = begin(gate)
    assert d.decision is eg.Decision.EXECUTE and d.should_execute
    assert d.attempt == 1 and d.lease_token >= 1 and d.lease_expires_at is not None
    gate.report(d, "committed", result={"ok": True})
    again = begin(gate)
    assert again.decision is eg.Decision.DUPLICATE and again.result == {"ok": True}
    assert again.effect_id == d.effect_id


def test_in_flight_while_lease_is_live(gate: eg.Gate) -> None:
    d = begin(gate, lease_seconds=30)
    other = begin(gate)
    assert other.decision is eg.Decision.IN_FLIGHT
    assert 0 < other.retry_after_seconds <= 30
    gate.report(d, "committed", result=1)
    assert begin(gate).decision is eg.Decision.DUPLICATE


def test_g3_lapsed_lease_is_ambiguous_and_blind_retry_refused(gate: eg.Gate) -> None:
    """G3: past its lease an IN_FLIGHT effect reads AMBIGUOUS at once and a retry is blocked."""
    d = begin(gate, lease_seconds=0.2)
    time.sleep(0.35)
    # A read says so before anyone calls begin again.
    assert gate.get("refund:txn_1").state is eg.State.AMBIGUOUS
    retry = begin(gate)
    assert retry.decision is eg.Decision.BLOCKED
    assert retry.reason == "lease lapsed"
    assert begin(gate).decision is eg.Decision.BLOCKED
    # Its holder cannot revive the lease ...
    with pytest.raises(eg.StaleLease):
        gate.extend_lease(d, 30)
    assert gate.get("refund:txn_1").state is eg.State.AMBIGUOUS
    # ... but, as nobody has acted since, its own late report settles the effect.
    gate.report(d, "committed", result={"late": True})
    record = gate.get("refund:txn_1")
    assert record.state is eg.State.COMMITTED and record.result == {"late": True}
    assert record.history[-1].note == "late report"
    assert begin(gate).result == {"late": True}


def test_resolve_committed_then_retry_returns_stored_result(gate: eg.Gate) -> None:
    begin(gate, lease_seconds=30)
    lapse_leases(gate)
    assert begin(gate).decision is eg.Decision.BLOCKED
    record = gate.resolve("refund:txn_1", "committed", by="alice", result={"seen": "dashboard"},
                          note="seen in the dashboard")
    assert record.state is eg.State.COMMITTED
    assert record.history[-1].by == "alice" and record.history[-1].note == "seen in the dashboard"
    again = begin(gate)
    assert again.decision is eg.Decision.DUPLICATE and again.result == {"seen": "dashboard"}


def test_g4_failed_permits_new_attempt_with_new_vendor_key(gate: eg.Gate) -> None:
    """G4: FAILED permits a new attempt, with a new token and a new vendor key."""
    d1 = begin(gate, vendor="stripe")
    gate.report(d1, "failed", error="card declined before charge")
    d2 = begin(gate, vendor="stripe")
    assert d2.decision is eg.Decision.EXECUTE
    assert d2.attempt == 2 and d2.lease_token > d1.lease_token
    assert d2.vendor_idempotency_key != d1.vendor_idempotency_key
    # Deterministic: the same attempt of the same effect gives the same key on any gate.
    assert d1.vendor_idempotency_key == eg.vendors.vendor_key(
        gate.store.secret, "stripe", namespace=gate.namespace, effect_type="payment.refund",
        key="refund:txn_1", attempt=1,
    ).value
    # The record names it as the decision does (a reconcile hook reads the record).
    assert gate.get("refund:txn_1").vendor_idempotency_key == d2.vendor_idempotency_key


def test_max_attempts_denies_further_attempts(gate: eg.Gate) -> None:
    for _ in range(2):
        d = begin(gate, max_attempts=2)
        assert d.decision is eg.Decision.EXECUTE
        gate.report(d, "failed")
    denied = begin(gate, max_attempts=2)
    assert denied.decision is eg.Decision.DENIED and "max_attempts" in (denied.reason or "")


def test_g5_key_reused_with_another_payload_is_refused(gate: eg.Gate) -> None:
    """G5: the same key with a different payload raises PayloadMismatch in every state."""
    d = begin(gate)
    before = snapshot(gate)
    with pytest.raises(eg.PayloadMismatch) as err:
        begin(gate, payload={"txn_id": "txn_1", "amount_cents": 501})
    assert err.value.key == "refund:txn_1" and err.value.state == "in_flight"
    gate.report(d, "committed", result=None)
    with pytest.raises(eg.PayloadMismatch):
        begin(gate, payload={"txn_id": "txn_1", "amount_cents": 501})
    assert snapshot(gate)[0][0] == before[0][0]


def test_g6_stale_token_refused_after_resolve(gate: eg.Gate) -> None:
    """G6: once an operator resolves, the old holder's token is stale."""
    d = begin(gate, lease_seconds=30)
    gate.resolve("refund:txn_1", "failed", by="ops", force=True)
    with pytest.raises(eg.StaleLease) as err:
        gate.report(d, "committed", result={"zombie": True})
    assert err.value.state == "failed"
    with pytest.raises(eg.StaleLease):
        gate.extend_lease(d, 30)
    assert gate.get("refund:txn_1").state is eg.State.FAILED


def test_g6_zombie_cannot_report_over_newer_attempt(gate: eg.Gate) -> None:
    """G6: a holder past its lease cannot report over what a newer attempt did."""
    zombie = begin(gate, lease_seconds=30)
    lapse_leases(gate)
    begin(gate)  # lapses to AMBIGUOUS
    gate.resolve("refund:txn_1", "failed", by="ops")
    fresh = begin(gate)
    assert fresh.decision is eg.Decision.EXECUTE and fresh.attempt == 2
    with pytest.raises(eg.StaleLease) as err:
        gate.report(zombie, "committed", result={"zombie": True})
    assert "stale" in str(err.value)
    gate.report(fresh, "committed", result={"fresh": True})
    assert gate.get("refund:txn_1").result == {"fresh": True}


def test_g7_unresolvable_template_fails_before_body(gate: eg.Gate) -> None:
    """G7: a template that cannot be resolved raises EffectKeyError; nothing runs or is stored."""
    calls: list[Any] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: Any, amount_cents: int = 0) -> None:
        calls.append(txn_id)

    for bad in (None, "", 1.5, ["a"], {"a": 1}, True):
        with pytest.raises(eg.EffectKeyError):
            refund(bad)
    assert calls == []
    assert snapshot(gate) == []
    with pytest.raises(eg.EffectKeyError):

        @gate.effect("refund:{txn}", effect_type="payment.refund")
        def typo(txn_id: str) -> None: ...


def test_extend_lease_keeps_holder(gate: eg.Gate) -> None:
    d = begin(gate, lease_seconds=0.3)
    new_expiry = gate.extend_lease(d, 30)
    assert new_expiry > d.lease_expires_at
    time.sleep(0.4)
    assert begin(gate).decision is eg.Decision.IN_FLIGHT
    gate.report(d, "committed", result="ok")


def test_report_ambiguous_blocks(gate: eg.Gate) -> None:
    d = begin(gate)
    gate.report(d, "ambiguous", error="reply lost")
    blocked = begin(gate)
    assert blocked.decision is eg.Decision.BLOCKED and blocked.reason == "reply lost"


def test_report_by_lease_proof(gate: eg.Gate) -> None:
    """A holder that kept only its proof (key, token, secret) reports with it."""
    d = begin(gate)
    assert d.lease == eg.Lease(d.key, d.lease_token, d.lease_secret)  # type: ignore[arg-type]
    gate.report(eg.Lease(d.key, d.lease_token, d.lease_secret or ""), "committed", result=[1, 2])
    assert gate.get_by_id(d.effect_id).result == [1, 2]


def test_decorator_failures_classified(gate: eg.Gate) -> None:
    attempts: list[int] = []

    @gate.effect("email:{msg}", effect_type="email.send")
    def send(msg: str) -> str:
        attempts.append(eg.current_effect().attempt)
        if len(attempts) == 1:
            raise eg.NotExecuted("SMTP refused the connection")
        if len(attempts) == 2:
            raise TimeoutError("no reply")
        return "sent"

    with pytest.raises(eg.NotExecuted):
        send("m1")
    assert gate.get("email:m1").state is eg.State.FAILED
    with pytest.raises(TimeoutError):
        send("m1")
    assert gate.get("email:m1").state is eg.State.AMBIGUOUS
    with pytest.raises(eg.EffectAmbiguous) as err:
        send("m1")
    assert err.value.decision == "blocked" and err.value.key == "email:m1"
    assert attempts == [1, 2]


def test_keyboard_interrupt_is_ambiguous(gate: eg.Gate) -> None:
    @gate.effect("deploy:{env}", effect_type="deploy")
    def deploy(env: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        deploy("prod")
    assert gate.get("deploy:prod").state is eg.State.AMBIGUOUS


def test_current_effect_outside_body() -> None:
    with pytest.raises(eg.EffectGateError):
        eg.current_effect()


class Receipt(BaseModel):
    refund_id: str
    amount: int


def test_duplicate_rebuilds_annotated_type(make_gate: Any) -> None:
    gate = make_gate()

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str) -> Receipt:
        return Receipt(refund_id="re_1", amount=5)

    first = refund("t")
    again = refund("t")
    assert isinstance(again, Receipt) and again == first


def test_reconciler_resolves_ambiguous(gate: eg.Gate) -> None:
    asked: list[str] = []

    @gate.reconciler("payment.*")
    def ask_vendor(record: eg.EffectRecord) -> eg.Reconciled:
        asked.append(record.key)
        if record.key == "refund:txn_1":
            return eg.Reconciled("committed", {"vendor": "says done"})
        if record.key == "refund:txn_2":
            return eg.Reconciled("failed")
        return eg.Reconciled("unknown")

    for key in ("refund:txn_1", "refund:txn_2", "refund:txn_3"):
        d = begin(gate, key=key)
        gate.report(d, "ambiguous", error="reply lost")
    dup = begin(gate, key="refund:txn_1")
    assert dup.decision is eg.Decision.DUPLICATE and dup.result == {"vendor": "says done"}
    retry = begin(gate, key="refund:txn_2")
    assert retry.decision is eg.Decision.EXECUTE and retry.attempt == 2
    assert begin(gate, key="refund:txn_3").decision is eg.Decision.BLOCKED
    assert asked == ["refund:txn_1", "refund:txn_2", "refund:txn_3"]
    assert gate.get("refund:txn_1").history[-1].by.startswith("reconciler:")


def test_the_default_grace_is_the_lapsed_holders_lease_not_the_askers(gate: eg.Gate) -> None:
    """A caller's own short lease must not cut the grace the lapsed holder is owed (an MCP
    agent chooses its lease_seconds): the hook is asked only the holder's lease after it."""
    import time

    asked: list[str] = []

    @gate.reconciler("payment.*")
    def ask_vendor(record: eg.EffectRecord) -> str:
        asked.append(record.key)
        return "failed"

    held = gate.begin(effect_type="payment.refund", key="refund:slow", payload={},
                      lease_seconds=0.6)
    time.sleep(0.7)  # lapsed: the slow holder may still be acting
    early = gate.begin(effect_type="payment.refund", key="refund:slow", payload={},
                       lease_seconds=0.01)
    assert early.decision is eg.Decision.BLOCKED and "grace period" in (early.reason or "")
    assert asked == []
    time.sleep(0.6)
    late = gate.begin(effect_type="payment.refund", key="refund:slow", payload={},
                      lease_seconds=0.01)
    assert late.decision is eg.Decision.EXECUTE and asked == ["refund:slow"]
    assert late.vendor_idempotency_key == held.vendor_idempotency_key


class _LowerRaises(str):
    def lower(self) -> str:
        raise ValueError("boom")


class _EqRaises:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    __hash__ = object.__hash__


@pytest.mark.parametrize("junk", [_LowerRaises("committed"), eg.Reconciled(_EqRaises())],
                         ids=["lower raises", "eq raises"])
def test_a_reconcile_hook_whose_answer_raises_leaves_the_effect_blocked(
        make_gate: Any, junk: Any) -> None:
    gate = make_gate()
    gate.reconciler("payment.*")(lambda record: junk)
    d = begin(gate)
    gate.report(d, "ambiguous", error="reply lost")
    assert begin(gate).decision is eg.Decision.BLOCKED
    assert gate.get(d.key).state is eg.State.AMBIGUOUS


def test_a_compensation_callable_that_raises_is_a_config_error_and_runs_nothing(
        gate: eg.Gate) -> None:
    ran: list[str] = []

    @gate.effect("book:{trip}", effect_type="booking.car", group_key="trip:{trip}",
                 compensation=lambda trip: ["undo"][5])
    def book(trip: str) -> None:
        ran.append(trip)

    with pytest.raises(eg.ConfigError, match="compensation for 'book:t1' raised IndexError"):
        book("t1")
    assert ran == [] and gate.list_effects() == []


def test_a_key_stored_before_blank_characters_were_refused_stays_readable_and_settleable(
        gate: eg.Gate) -> None:
    """New keys may not hold a character that prints as nothing; an effect stored under one
    before can still be read, reported by its holder and resolved."""
    from sqlalchemy import text

    old = "email:thanks-\u2764\ufe0f-T1"
    with pytest.raises(eg.EffectKeyError):
        gate.begin(effect_type="email.send", key=old, payload={})
    for n, settle in enumerate(("report", "resolve")):
        d = gate.begin(effect_type="email.send", key=f"email:plain-{n}", payload={})
        stored = f"{old}-{n}"
        with gate.store.engine.begin() as conn:  # as an earlier version stored it
            conn.execute(text("UPDATE effectgate_effects SET key = :k WHERE id = :id"),
                         {"k": stored, "id": d.effect_id})
        assert gate.get(stored).state is eg.State.IN_FLIGHT
        if settle == "report":
            assert d.lease is not None
            gate.report(eg.Lease(stored, d.lease.token, d.lease.secret), "committed")
        else:
            gate.resolve(stored, "failed", by="ops", force=True)
        assert gate.get(stored).state in (eg.State.COMMITTED, eg.State.FAILED)


def test_resolve_rules(gate: eg.Gate) -> None:
    d = begin(gate)
    gate.report(d, "committed", result=1)
    with pytest.raises(eg.InvalidTransition):
        gate.resolve("refund:txn_1", "failed", by="ops")
    with pytest.raises(eg.UnknownEffect):
        gate.resolve("refund:nope", "failed", by="ops")
    with pytest.raises(eg.InvalidTransition):
        gate.resolve("refund:txn_1", "ambiguous", by="ops")


def test_namespaces_are_separate(make_gate: Any, namespace: str) -> None:
    a = make_gate(namespace=namespace + "-a")
    b = make_gate(namespace=namespace + "-b")
    assert begin(a).decision is eg.Decision.EXECUTE
    assert begin(b).decision is eg.Decision.EXECUTE


def test_effect_context_sets_run_and_agent(gate: eg.Gate) -> None:
    with eg.effect_context(run_id="run_7", agent_id="billing"):
        d = begin(gate)
    record = gate.get(d.key)
    assert record.run_id == "run_7" and record.agent_id == "billing"


async def test_async_decorator_and_twins(gate: eg.Gate) -> None:
    calls: list[int] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    async def refund(txn_id: str, amount_cents: int) -> dict[str, int]:
        await asyncio.sleep(0)
        calls.append(eg.current_effect().attempt)
        return {"amount": amount_cents}

    results = await asyncio.gather(*(refund("t1", 5) for _ in range(3)),
                                   return_exceptions=True)
    done = [r for r in results if r == {"amount": 5}]
    assert calls == [1] and len(done) >= 1
    assert all(isinstance(r, (dict, eg.EffectInFlight)) for r in results)
    d = await gate.abegin(effect_type="x", key="k:async", payload={"a": 1})
    await gate.aextend_lease(d, 10)
    await gate.areport(d, "committed", result="r")
    assert (await gate.aget("k:async")).result == "r"


async def test_async_cancellation_is_ambiguous(gate: eg.Gate) -> None:
    started = asyncio.Event()

    @gate.effect("deploy:{env}", effect_type="deploy")
    async def deploy(env: str) -> None:
        started.set()
        await asyncio.sleep(30)

    task = asyncio.create_task(deploy("prod"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.get("deploy:prod").state is eg.State.AMBIGUOUS


def test_memo_answers_repeat_without_store(gate: eg.Gate) -> None:
    d = begin(gate)
    gate.report(d, "committed", result={"r": 1})
    gate.store.dispose()  # the memo still answers; no connection is needed
    calls = []
    original = gate.store.reserve
    gate.store.reserve = lambda values: calls.append(values) or original(values)  # type: ignore[method-assign]
    assert begin(gate).result == {"r": 1}
    assert calls == []


def test_ungated_result_not_storable_warns(gate: eg.Gate) -> None:
    @gate.effect("obj:{n}", effect_type="x")
    def make(n: int) -> object:
        return object()

    with pytest.warns(eg.ResultNotStoredWarning):
        make(1)
    assert gate.get("obj:1").state is eg.State.COMMITTED
    assert make(1) is None


def _unstorable_results() -> list[Any]:
    import dataclasses
    import datetime

    @dataclasses.dataclass
    class Receipt:
        txn: str
        settled_at: str = dataclasses.field(init=False)  # never set: its getter raises

    class Dumps:
        def model_dump(self) -> dict[str, Any]:
            raise KeyError("fee table")

    est = datetime.timezone(datetime.timedelta(hours=-5))
    return [Receipt("t1"), Dumps(), {"never": datetime.datetime.max.replace(tzinfo=est)}]


@pytest.mark.parametrize("result", _unstorable_results(), ids=["getter", "model_dump", "date"])
@pytest.mark.parametrize("redacted", [False, True])
def test_a_result_whose_json_form_raises_is_committed_unstored_never_lost(
        make_gate: Any, result: Any, redacted: bool) -> None:
    """The body ran: whatever its result's JSON form raises, the effect is COMMITTED (with
    no stored result and a warning), never left IN_FLIGHT to lapse into AMBIGUOUS."""
    import asyncio

    gate = make_gate(policy=eg.Policy.from_dict(
        {"effects": {"x": {"redact_result": ["secret"]}}}) if redacted else False)
    runs: list[int] = []

    @gate.effect("sync:{n}", effect_type="x")
    def sync(n: int) -> Any:
        runs.append(n)
        return result

    @gate.effect("async:{n}", effect_type="x")
    async def asynchronous(n: int) -> Any:
        runs.append(n)
        return result

    with pytest.warns(eg.ResultNotStoredWarning):
        sync(1)
    with pytest.warns(eg.ResultNotStoredWarning):
        asyncio.run(asynchronous(2))
    assert gate.get("sync:1").state is gate.get("async:2").state is eg.State.COMMITTED
    assert sync(1) is None and asyncio.run(asynchronous(2)) is None and runs == [1, 2]
    d = gate.begin(effect_type="x", key="raw:1", payload={})
    with pytest.raises(eg.PayloadError):
        gate.report(d, "committed", result=result)
    assert gate.get("raw:1").state is eg.State.IN_FLIGHT  # refused before writing


def test_an_argument_datetime_out_of_range_is_a_payload_error(gate: eg.Gate) -> None:
    import datetime

    early = datetime.datetime(1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=5)))
    ran: list[Any] = []

    @gate.effect("grant:{who}", effect_type="x")
    def grant(who: str, until: datetime.datetime) -> None:
        ran.append(who)

    with pytest.raises(eg.PayloadError):
        grant("bob", early)
    assert ran == [] and gate.list_effects() == []


def test_logging_one_line_per_decision_refusals_at_info(
    gate: eg.Gate, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    with caplog.at_level(logging.DEBUG, logger="effectgate"):
        d = begin(gate)
        begin(gate)  # in flight: a refusal
        gate.report(d, "ambiguous", error="reply lost")
        begin(gate)  # blocked
        gate.resolve("refund:txn_1", "committed", by="ops")
    records = [(r.levelname, getattr(r, "decision", None), getattr(r, "key", None))
               for r in caplog.records]
    assert records[0] == ("DEBUG", "execute", "refund:txn_1")
    assert ("INFO", "in_flight", "refund:txn_1") in records
    assert ("INFO", "blocked", "refund:txn_1") in records
    resolved = [r for r in caplog.records if r.getMessage().startswith("resolved")]
    assert resolved and resolved[0].levelname == "INFO" and resolved[0].key == "refund:txn_1"


def test_repeated_report_of_the_same_outcome_is_accepted(gate: eg.Gate) -> None:
    """A holder whose report's reply was lost may send it again: same token, same outcome."""
    d = begin(gate)
    gate.report(d, "committed", result={"r": 1})
    gate.report(d, "committed", result={"r": 1})  # accepted, changes nothing
    with pytest.raises(eg.StaleLease):
        gate.report(d, "committed", result={"r": 2})  # not what was recorded
    with pytest.raises(eg.StaleLease):
        gate.report(d, "failed")
    assert gate.get(d.key).result == {"r": 1}


async def _report_story(gate: eg.Gate, other: eg.Gate, committed: Any, tag: str,
                        report: Any) -> list[Any]:
    """Every kind of report of COMMITTED a holder can make, ``committed`` spelled as given and
    made through ``report`` (``gate.report``, or ``gate.areport``, awaited): what each
    answered, and the rows it left (ids, times and keys aside)."""
    seen: list[Any] = []

    async def attempt(held: Any, result: Any) -> None:
        before = snapshot(gate)
        try:
            done = report(held, committed, result=result)
            if asyncio.iscoroutine(done):
                await done
        except eg.EffectGateError as err:
            seen.append((type(err).__name__, snapshot(gate) == before))
        else:
            seen.append("ok")

    d = begin(gate, key=f"refund:{tag}-1")
    await attempt(d, object())  # no JSON form
    await attempt(d._replace(lease_secret="guessed"), {"r": 1})  # a forged proof
    await attempt(d._replace(lease_token=d.lease_token + 1), {"r": 1})
    await attempt(d._replace(key=f"refund:{tag}-nobody"), {"r": 1})
    await attempt(d, {"r": 1, "card": "4242"})
    await attempt(d, {"r": 1, "card": "4242"})  # a repeat
    await attempt(d, {"r": 2})  # not what was recorded
    late = begin(gate, key=f"refund:{tag}-2")
    lapse_leases(gate, late.key)
    await attempt(late, "late")
    await attempt(begin(gate, key=f"refund:{tag}-1"), None)  # a duplicate holds nothing
    await attempt(begin(other, key=f"refund:{tag}-3"), None)  # another namespace's
    for key in (f"refund:{tag}-1", f"refund:{tag}-2"):
        record = gate.get(key)
        seen.append((record.state, record.result, record.error, record.reason,
                     record.actual_cost_micros, [(h.to_state, h.by, h.note)
                                                 for h in record.history]))
    return seen


@pytest.mark.parametrize("way", ["sync", "async"])
async def test_a_commit_reported_as_the_decorator_does_is_the_general_report(
        make_gate: Any, way: str) -> None:
    """The common report (``Outcome.COMMITTED``, nothing but a result, no spend: the
    decorator's, which takes a shorter way) answers and writes exactly what the same report
    spelled ``"committed"`` (the general way) does: a refusal changes nothing, a repeat is
    accepted, a late report lands late, the policy's redaction applies."""
    policy = eg.Policy.from_dict({"effects": {"payment.refund": {"redact_result": ["card"]}}})
    gate = make_gate(policy=policy)
    other = make_gate(namespace=gate.namespace + "-other")
    report = gate.report if way == "sync" else gate.areport
    common = await _report_story(gate, other, eg.Outcome.COMMITTED, "common", report)
    general = await _report_story(gate, other, "committed", "general", report)
    assert common == general
    assert common[:10] == [("PayloadError", True), ("StaleLease", True), ("StaleLease", True),
                           ("UnknownEffect", True), "ok", "ok", ("StaleLease", True), "ok",
                           ("InvalidTransition", True), ("InvalidTransition", True)]
    first, second = common[10], common[11]
    assert first[:2] == (eg.State.COMMITTED, {"r": 1, "card": "[redacted]"})
    assert first[2:5] == (None, None, None)
    assert second[1] == "late" and second[5][-1][2] == "late report"


def test_resolve_refuses_a_live_lease_without_force(gate: eg.Gate) -> None:
    """G15: a live lease is not resolvable (its holder may still act); force says so in the
    history."""
    d = begin(gate, lease_seconds=30)
    before = snapshot(gate)
    with pytest.raises(eg.InvalidTransition) as err:
        gate.resolve("refund:txn_1", "failed", by="ops")
    assert err.value.reason == "lease is live" and "UTC" in str(err.value)
    assert err.value.state == "in_flight"
    assert snapshot(gate) == before
    record = gate.resolve("refund:txn_1", "failed", by="ops", force=True)
    assert record.state is eg.State.FAILED
    assert "force-resolved" in (record.history[-1].note or record.reason or "")
    with pytest.raises(eg.StaleLease):
        gate.report(d, "committed", result={"late": True})
    with pytest.raises(eg.ConfigError):
        gate.resolve("refund:txn_1", "committed", by="ops", force="yes")  # type: ignore[arg-type]


def test_resolve_accepts_a_lapsed_lease(gate: eg.Gate) -> None:
    """A lease that has lapsed needs no force: nobody may still be acting under it."""
    begin(gate, lease_seconds=30)
    lapse_leases(gate)
    assert gate.resolve("refund:txn_1", "committed", by="ops").state is eg.State.COMMITTED


def test_resolve_on_a_reviewed_record_is_refused_once_the_effect_moved(gate: eg.Gate) -> None:
    """``expected``: the verdict was made on that record. Another operator's verdict, or a
    new attempt begun since (a forced resolve reviewed on attempt 1 must not land on attempt
    2's live lease and let attempt 3 run beside it), refuses it and writes nothing."""
    d = begin(gate, lease_seconds=30)
    reviewed = gate.get("refund:txn_1")  # in flight at token 1: a forced resolve's review
    gate.report(d, "failed", error="declined")
    second = begin(gate, lease_seconds=30)
    assert second.decision is eg.Decision.EXECUTE
    before = snapshot(gate)
    with pytest.raises(eg.InvalidTransition) as err:
        gate.resolve("refund:txn_1", "failed", by="ops", force=True, expected=reviewed)
    assert "changed since it was reviewed" in str(err.value)
    assert snapshot(gate) == before
    gate.report(second, "ambiguous")
    seen = gate.get("refund:txn_1")
    gate.resolve("refund:txn_1", "failed", by="bob", expected=seen)  # the first verdict
    moved = snapshot(gate)
    with pytest.raises(eg.InvalidTransition):
        gate.resolve("refund:txn_1", "committed", by="carol", expected=seen)
    assert snapshot(gate) == moved
    with pytest.raises(eg.ConfigError):  # not a record, or another key's: nothing written
        gate.resolve("refund:txn_1", "committed", by="carol",
                     expected=seen.as_dict())  # type: ignore[arg-type]
    other = dataclasses.replace(gate.get("refund:txn_1"), key="refund:txn_2")
    with pytest.raises(eg.ConfigError):
        gate.resolve("refund:txn_1", "committed", by="carol", expected=other)
    assert snapshot(gate) == moved
    now = gate.get("refund:txn_1")
    assert gate.resolve("refund:txn_1", "committed", by="carol",
                        expected=now).state is eg.State.COMMITTED


def test_prune_dry_run_counts_and_writes_nothing(gate: eg.Gate) -> None:
    d = begin(gate)
    gate.report(d, "committed", result={"ok": 1})
    before = snapshot(gate)
    assert gate.prune(datetime.timedelta(0), dry_run=True) == 1
    assert snapshot(gate) == before
    assert gate.prune(datetime.timedelta(0)) == 1
    assert gate.prune(datetime.timedelta(0), dry_run=True) == 0


def test_read_only_gate_needs_an_existing_store(tmp_path: Path) -> None:
    """A read-only gate creates nothing where there is no store, and refuses writes."""
    url = f"sqlite:///{tmp_path / 'nope' / 'effects.db'}"
    with pytest.raises(eg.StoreError) as err:
        eg.Gate(url, read_only=True)
    assert "no effectgate store" in str(err.value)
    assert not (tmp_path / "nope").exists()
    real = f"sqlite:///{tmp_path / 'effects.db'}"
    with eg.Gate(real) as writer:
        d = writer.begin(effect_type="t", key="k:1", payload={})
        writer.report(d, "committed", result=1)
    with eg.Gate(real, read_only=True) as reader:
        assert reader.get("k:1").state is eg.State.COMMITTED
        with pytest.raises(eg.StoreError):
            reader.begin(effect_type="t", key="k:2", payload={})
    with eg.Gate(real) as writer, pytest.raises(eg.UnknownEffect):
        writer.get("k:2")


def test_read_only_gate_on_postgres_refuses_writes(namespace: str) -> None:
    require_postgres()
    with eg.Gate(PG_URL, namespace=namespace) as writer:
        writer.begin(effect_type="t", key="k:1", payload={})
    with eg.Gate(PG_URL, namespace=namespace, read_only=True) as reader:
        assert reader.get("k:1").state is eg.State.IN_FLIGHT
        with pytest.raises(eg.StoreError):
            reader.begin(effect_type="t", key="k:2", payload={})


def test_a_normalising_key_filter_normalises_the_payload_too(gate: eg.Gate) -> None:
    """``{path|path}``: two spellings of one path are one effect (a duplicate), not one key
    with two payloads."""
    writes: list[str] = []

    @gate.effect("write:{path|path}", effect_type="fs.write")
    def write(path: str, content: str) -> int:
        writes.append(path)
        return len(content)

    assert write("fs/./a.txt", "hello") == 5
    assert write("fs/a.txt", "hello") == 5
    assert writes == ["fs/./a.txt"]


def test_only_a_method_defined_in_a_class_leaves_its_first_parameter_out(
        gate: eg.Gate) -> None:
    """The instance or class a method is called on is not one of the call's arguments; a
    plain function's first parameter is, whatever it is called (a function whose first
    parameter was named ``cls`` lost it from the key and the payload: labelling d1 "ham"
    after "spam" was answered from the store as a duplicate)."""
    applied: list[tuple[str, str]] = []

    @gate.effect("label:{doc_id}:{cls}")
    def label(cls: str, doc_id: str) -> str:
        applied.append((doc_id, cls))
        return f"labelled {doc_id} as {cls}"

    @gate.effect("relabel:{doc_id}")
    def relabel(cls: str, doc_id: str) -> str:
        applied.append((doc_id, cls))
        return cls

    class Labeller:
        @gate.effect("method:{doc_id}")
        def label(self, doc_id: str) -> str:
            applied.append((doc_id, "method"))
            return "method"

        def cls_first(self, cls: str, doc_id: str) -> str:
            applied.append((doc_id, cls))
            return cls

    assert label("spam", "d1") == "labelled d1 as spam"
    assert label("ham", "d1") == "labelled d1 as ham"  # another key: it runs
    relabel("spam", "d2")
    with pytest.raises(eg.PayloadMismatch):
        relabel("ham", "d2")  # the same key with another payload: never a duplicate
    assert Labeller().label("d3") == Labeller().label("d3") == "method"
    bound = gate.effect("bound:{doc_id}:{cls}")(Labeller().cls_first)
    assert bound("a", "d4") == "a" and bound("b", "d4") == "b"
    assert applied == [("d1", "spam"), ("d1", "ham"), ("d2", "spam"), ("d3", "method"),
                       ("d4", "a"), ("d4", "b")]


def test_a_key_given_as_a_str_subclass_is_its_text_not_its_str(gate: eg.Gate) -> None:
    import enum

    class Key(str, enum.Enum):  # noqa: UP042 - its str() is not its value: the case here
        DAILY = "report:daily:2024-06-01"

    class Masked(str):  # a type that hides ids in logs
        def __str__(self) -> str:
            return "****"

    first = gate.begin(effect_type="report.send", key=Key.DAILY, payload={"d": 1})
    assert first.key == "report:daily:2024-06-01"
    gate.report(first, "committed", result={"sent": 1})
    again = gate.begin(effect_type="report.send", key="report:daily:2024-06-01",
                       payload={"d": 1})
    assert again.decision is eg.Decision.DUPLICATE and again.result == {"sent": 1}
    one = gate.begin(effect_type="payment.refund", key=Masked("refund:txn_1"), payload={})
    two = gate.begin(effect_type="payment.refund", key=Masked("refund:txn_2"), payload={})
    assert (one.key, two.key) == ("refund:txn_1", "refund:txn_2")
    assert one.decision is two.decision is eg.Decision.EXECUTE
    assert gate.get(Masked("refund:txn_2")).key == "refund:txn_2"
