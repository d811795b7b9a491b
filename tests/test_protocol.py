"""The protocol's edges (the kernel issue), on both backends: each of the ways one effect could
run twice, and each wrong state, as a test.

1. another namespace settling my effect; 2. guessed or borrowed ids and tokens; 3. resolving a
live lease; 4. reconcile asking too early, and the vendor key a reconciled failure keeps;
5. the effect type as part of identity. Then: a cancellation before the body starts, the
lapsed holder's late report, and async reconcile hooks.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import effectgate as eg
from effectgate.testing import lapse_leases

from .conftest import snapshot

PAYLOAD = {"txn_id": "txn_1", "amount_cents": 500}


def begin(gate: eg.Gate, **kw: Any) -> eg.BeginDecision:
    kw.setdefault("effect_type", "payment.refund")
    kw.setdefault("key", "refund:txn_1")
    kw.setdefault("payload", PAYLOAD)
    return gate.begin(**kw)


# -- 1. namespaces ---------------------------------------------------------------------------


def test_another_namespace_cannot_settle_my_effect(make_gate: Any, namespace: str) -> None:
    """A gate in namespace B, even holding A's decision or its whole proof, cannot report,
    extend, resolve or read A's effect; A's retry is still in flight, not a second attempt."""
    mine = make_gate()
    theirs = make_gate(namespace=f"{namespace}-b")
    d = begin(mine, lease_seconds=30)
    lease = d.lease
    assert lease is not None
    before = snapshot(mine)
    with pytest.raises(eg.InvalidTransition):
        theirs.report(d, "failed")
    for call in (lambda: theirs.report(lease, "failed"),
                 lambda: theirs.extend_lease(lease, 30)):
        with pytest.raises((eg.StaleLease, eg.UnknownEffect)):
            call()
    with pytest.raises(eg.UnknownEffect):
        theirs.resolve(d.key, "failed", by="ops", force=True)
    with pytest.raises(eg.UnknownEffect):
        theirs.get(d.key)
    assert snapshot(mine) == before
    assert begin(mine).decision is eg.Decision.IN_FLIGHT


# -- 2. ids and tokens are not credentials -----------------------------------------------------


def test_an_effect_id_and_token_are_not_a_proof_of_holding(gate: eg.Gate) -> None:
    """Knowing an effect's id, key and token is not enough to report on it: the lease secret
    is, and it is never stored in the clear."""
    d = begin(gate)
    assert d.lease_secret and len(d.lease_secret) >= 22  # 128 random bits, url-safe
    before = snapshot(gate)
    assert all(d.lease_secret not in str(cell) for row in before for cell in row)
    for forged in ("A" * 22, d.lease_secret[:-1] + ("B" if d.lease_secret[-1] != "B" else "C")):
        with pytest.raises(eg.StaleLease) as err:
            gate.report(eg.Lease(d.key, d.lease_token, forged), "failed")
        assert err.value.reason == "the lease secret does not match"
    with pytest.raises(eg.ConfigError):
        gate.report(d.effect_id, "failed")  # type: ignore[arg-type]
    assert snapshot(gate) == before
    gate.report(d.lease, "committed", result={"ok": True})  # type: ignore[arg-type]
    assert gate.get(d.key).state is eg.State.COMMITTED


def test_each_holder_gets_its_own_secret(gate: eg.Gate) -> None:
    """A new attempt is a new holder with a new secret: the old one's no longer reports."""
    first = begin(gate)
    gate.report(first, "failed", error="declined")
    second = begin(gate)
    assert second.attempt == 2 and second.lease_secret != first.lease_secret
    stolen = eg.Lease(second.key, second.lease_token, first.lease_secret or "")
    with pytest.raises(eg.StaleLease):
        gate.report(stolen, "failed")
    gate.report(second, "committed")


# -- 4. reconcile waits out a grace period; a reconciled failure keeps the vendor key --------


def test_reconcile_asks_only_after_the_grace_period(make_gate: Any) -> None:
    """A holder slow past its lease may still reach the vendor: the reconcile hook is not
    asked inside the grace period (the lease again by default); after it, a "failed" verdict
    lets attempt 2 run under the SAME vendor key, so the vendor dedupes the old request."""
    gate = make_gate(lease_seconds=0.4)
    asked: list[int] = []

    @gate.reconciler("payment.*")
    def ask(record: eg.EffectRecord) -> str:
        asked.append(record.attempt)
        return "failed"

    first = begin(gate, vendor="stripe")
    time.sleep(0.5)  # lapsed, but inside the grace period
    early = begin(gate, vendor="stripe")
    assert early.decision is eg.Decision.BLOCKED and asked == []
    assert "grace period" in (early.reason or "")
    time.sleep(0.45)
    late = begin(gate, vendor="stripe")
    assert asked == [1]
    assert late.decision is eg.Decision.EXECUTE and late.attempt == 2
    assert late.vendor_idempotency_key == first.vendor_idempotency_key
    history = [(h.to_state, h.by) for h in gate.get(late.key).history]
    assert (eg.State.FAILED, "reconciler:test_reconcile_asks_only_after_the_grace_period"
            ".<locals>.ask") in history


def test_a_grace_period_per_effect_type_from_the_policy(make_gate: Any) -> None:
    gate = make_gate(policy={"effects": {"payment.*": {"reconcile_grace_seconds": 3600}}})
    asked: list[str] = []
    gate.reconciler("payment.refund")(lambda record: asked.append(record.key) or "failed")
    begin(gate, lease_seconds=30)
    lapse_leases(gate, seconds_ago=60)  # a minute ago: inside an hour's grace
    assert begin(gate).decision is eg.Decision.BLOCKED and asked == []
    lapse_leases(gate)  # long ago
    assert begin(gate).decision is eg.Decision.EXECUTE and asked == ["refund:txn_1"]



@pytest.mark.parametrize("grace", [{"reconcile_grace_seconds": 3600}, {"lease_seconds": 3600}])
def test_an_operator_reconcile_waits_the_grace_period_a_begin_waits(
        make_gate: Any, grace: dict[str, float]) -> None:
    """"Reconcile now" asked the hook at once about a lease that had just lapsed. Its holder
    may still be running and the vendor not yet know of its request: the hook says "failed",
    the record reads FAILED, the next call runs attempt 2, and the slow holder's request
    lands as well: twice. The operator's reconcile waits the grace period a ``begin`` waits
    (the policy's, else the lease again), refused with nothing asked or written."""
    gate = make_gate(policy={"effects": {"payment.*": grace}})
    asked: list[str] = []
    gate.reconciler("payment.refund")(lambda record: asked.append(record.key) or "failed")
    begin(gate, lease_seconds=30)
    lapse_leases(gate, seconds_ago=60)  # a minute ago: inside an hour's grace
    before = snapshot(gate)
    with pytest.raises(eg.InvalidTransition, match="grace period ends, in 3540s"):
        gate.reconcile("refund:txn_1", by="ops@example.com")
    assert asked == [] and snapshot(gate) == before
    lapse_leases(gate)  # long ago
    assert gate.reconcile("refund:txn_1", by="ops@example.com").state is eg.State.FAILED
    assert asked == ["refund:txn_1"]


def test_an_operator_reconcile_of_a_reported_ambiguous_outcome_asks_at_once(
        make_gate: Any) -> None:
    """An outcome the holder itself reported AMBIGUOUS has no holder left running: no grace
    period, the hook is asked now."""
    gate = make_gate()
    gate.reconciler("payment.refund")(lambda record: "committed")
    d = begin(gate)
    gate.report(d, "ambiguous", error="timeout")
    assert gate.reconcile("refund:txn_1", by="ops@example.com").state is eg.State.COMMITTED


def test_lapse_leases_never_moves_a_lapse_later(make_gate: Any) -> None:
    """The test helper moves a lease that lapsed long ago no later when asked for "a minute
    ago" (time passing only moves a lapse back): it brought such a lease into the grace
    period, and the state-machine test's model (which knows time runs one way) then saw the
    hook not asked where it expected it."""
    gate = make_gate(policy={"effects": {"payment.*": {"reconcile_grace_seconds": 3600}}})
    asked: list[str] = []
    gate.reconciler("payment.refund")(lambda record: asked.append(record.key) or "unknown")
    begin(gate, lease_seconds=30)
    lapse_leases(gate)  # long ago
    long_ago = gate.get("refund:txn_1").lease_expires_at
    assert begin(gate).decision is eg.Decision.BLOCKED and asked == ["refund:txn_1"]
    assert lapse_leases(gate, seconds_ago=60) == 1
    assert gate.get("refund:txn_1").lease_expires_at == long_ago
    assert begin(gate).decision is eg.Decision.BLOCKED
    assert asked == ["refund:txn_1", "refund:txn_1"]  # past the grace: asked again

def test_an_operators_failed_keeps_the_vendor_key_and_a_holders_failed_moves_it(
    gate: eg.Gate,
) -> None:
    first = begin(gate, vendor="stripe", lease_seconds=30)
    lapse_leases(gate)
    gate.resolve(first.key, "failed", by="ops", note="no such refund at Stripe")
    second = begin(gate, vendor="stripe")
    assert second.attempt == 2
    assert second.vendor_idempotency_key == first.vendor_idempotency_key
    # The key was kept from attempt 1, whose holder may still send it: even a FAILED that
    # attempt 2's holder proves keeps it.
    gate.report(second, "failed", error="card declined")
    third = begin(gate, vendor="stripe")
    assert third.vendor_idempotency_key == first.vendor_idempotency_key
    # A holder's own proven FAILED on a key only it ever had moves the next attempt on.
    gate.report(third, "committed")
    other = begin(gate, key="refund:txn_2", vendor="stripe")
    gate.report(other, "failed", error="card declined")
    assert begin(gate, key="refund:txn_2", vendor="stripe").vendor_idempotency_key != (
        other.vendor_idempotency_key)


# -- 5. the effect type is part of an effect's identity ----------------------------------------


def test_the_same_key_under_another_type_is_refused(gate: eg.Gate) -> None:
    d = begin(gate)
    gate.report(d, "committed", result={"refund_id": "re_1"})
    before = snapshot(gate)
    with pytest.raises(eg.PayloadMismatch) as err:
        begin(gate, effect_type="payment.payout")
    assert "payment.refund" in str(err.value) and "payment.payout" in (err.value.reason or "")
    assert snapshot(gate) == before


def test_an_approval_never_crosses_effect_types(make_gate: Any) -> None:
    """An approval for a refund cannot be consumed by a payout on the same key and payload,
    and a deny cannot be escaped by asking under another type."""
    policy = {"effects": {"payment.*": {"approval": "always"}}}
    gate = make_gate(policy=policy)
    asked = begin(gate, agent_id="agent")
    assert asked.decision is eg.Decision.APPROVAL_REQUIRED
    gate.approve(asked.approval_id or "", by="alice")
    with pytest.raises(eg.PayloadMismatch):
        begin(gate, effect_type="payment.payout", agent_id="agent")
    assert begin(gate, agent_id="agent").decision is eg.Decision.EXECUTE  # the refund's own
    denied = begin(gate, key="refund:txn_2", agent_id="agent")
    gate.deny(denied.approval_id or "", by="alice", reason="no")
    with pytest.raises(eg.PayloadMismatch):
        begin(gate, key="refund:txn_2", effect_type="payment.payout", agent_id="agent")
    assert begin(gate, key="refund:txn_2").decision is eg.Decision.DENIED


def test_one_key_template_for_two_tools_is_a_policy_error() -> None:
    with pytest.raises(eg.PolicyError, match="one effect"):
        eg.Policy.from_dict({"effects": {"payment.any": {
            "key": "payment:{txn_id}", "tools": ["capture", "refund"]}}})


# -- the wrong states ----------------------------------------------------------------------------


def test_a_call_cancelled_during_begin_is_failed_not_ambiguous(gate: eg.Gate) -> None:
    """A task cancelled while its begin is on the way never ran its body: its effect is
    FAILED (a retry executes), not AMBIGUOUS."""
    ran: list[int] = []

    @gate.effect("refund:{n}", effect_type="payment.refund")
    async def refund(n: int) -> int:
        ran.append(n)
        return n

    async def cancelled_begin() -> None:
        task = asyncio.ensure_future(refund(1))
        await asyncio.sleep(0)  # the begin is on its way to the store
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_begin())
    for _ in range(100):  # the FAILED report rides on the worker thread
        state = gate.get("refund:1").state
        if state is not eg.State.IN_FLIGHT:
            break
        time.sleep(0.02)
    record = gate.get("refund:1")
    assert record.state is eg.State.FAILED and not ran
    assert "cancelled before the body started" in (record.error or "")
    assert asyncio.run(refund(1)) == 1 and ran == [1]


def test_the_lapsed_holders_late_report_settles_its_effect(gate: eg.Gate) -> None:
    """A holder whose lease lapsed while its body succeeded records its result (the refund
    id) instead of losing it — as long as nobody acted since."""
    d = begin(gate, lease_seconds=30)
    lapse_leases(gate)
    assert begin(gate).decision is eg.Decision.BLOCKED  # AMBIGUOUS for everyone else
    gate.report(d, "committed", result={"refund_id": "re_late"})
    record = gate.get(d.key)
    assert record.state is eg.State.COMMITTED and record.result == {"refund_id": "re_late"}
    assert record.history[-1].note == "late report"


def test_a_late_report_after_someone_acted_is_refused(gate: eg.Gate) -> None:
    d = begin(gate, lease_seconds=30)
    lapse_leases(gate)
    gate.resolve(d.key, "failed", by="ops")
    before = snapshot(gate)
    with pytest.raises(eg.StaleLease):
        gate.report(d, "committed", result={"refund_id": "re_late"})
    assert snapshot(gate) == before


def test_an_async_reconcile_hook_from_a_sync_begin_in_a_running_loop_is_an_error(
    gate: eg.Gate,
) -> None:
    """Never a silent BLOCKED: the caller is told to use abegin; with abegin the hook is
    awaited on the caller's own loop."""
    loops: list[Any] = []

    @gate.reconciler("payment.refund")
    async def ask(record: eg.EffectRecord) -> str:
        loops.append(asyncio.get_running_loop())
        return "committed"

    begin(gate, lease_seconds=30)
    lapse_leases(gate)

    async def inside_a_loop() -> eg.BeginDecision:
        with pytest.raises(eg.ConfigError, match="abegin"):
            begin(gate)
        d = await gate.abegin(effect_type="payment.refund", key="refund:txn_1",
                              payload=PAYLOAD)
        assert loops == [asyncio.get_running_loop()]
        return d

    assert asyncio.run(inside_a_loop()).decision is eg.Decision.DUPLICATE


def test_an_async_reconcile_hook_from_a_sync_begin_without_a_loop_runs(gate: eg.Gate) -> None:
    @gate.reconciler("payment.refund")
    async def ask(record: eg.EffectRecord) -> eg.Reconciled:
        await asyncio.sleep(0)
        return eg.Reconciled("committed", {"refund_id": "re_vendor"})

    begin(gate, lease_seconds=30)
    lapse_leases(gate)
    d = begin(gate)
    assert d.decision is eg.Decision.DUPLICATE and d.result == {"refund_id": "re_vendor"}
