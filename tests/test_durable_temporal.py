"""A gated Temporal activity (``effect_activity``) under Temporal's own ``ActivityEnvironment``,
offline: a retried attempt is answered from the store, heartbeats extend the lease, a lost
lease stops the activity, and each refusal is the ApplicationError Temporal must see."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import gc
import threading
import time
from typing import Any

import pytest

import effectgate as eg
from tests.conftest import snapshot

pytest.importorskip("temporalio")
from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment

from effectgate.integrations.durable.temporal import effect_activity
from tests.callables import APPROVE_BOTH, AsyncRefund, Refund, wire
from tests.test_cancelled_begins import write_lock


def environment(attempt: int = 1, workflow_id: str = "wf-1") -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt, workflow_id=workflow_id,
                                   activity_id="7")
    return env


class LostReply(Exception):
    """Fault injection: the activity returned, its reply never reached Temporal."""


def test_a_retried_attempt_after_a_lost_reply_is_answered_from_the_store(
        gate: eg.Gate) -> None:
    ledger: list[str] = []

    @activity.defn
    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        return {"refunded": amount_cents}

    def worker_loses_the_reply(txn_id: str, amount_cents: int) -> None:
        refund(txn_id, amount_cents)
        raise LostReply

    with pytest.raises(LostReply):
        environment(attempt=1).run(worker_loses_the_reply, "T1", 500)
    assert environment(attempt=2).run(refund, "T1", 500) == {"refunded": 500}
    assert ledger == ["T1"]
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED and record.run_id == "wf-1"


async def test_an_async_retried_attempt_is_answered_from_the_store(gate: eg.Gate) -> None:
    ledger: list[str] = []

    @activity.defn
    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")
    async def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        return {"refunded": amount_cents}

    assert await environment(attempt=1).run(refund, "T1", 500) == {"refunded": 500}
    assert await environment(attempt=2).run(refund, "T1", 500) == {"refunded": 500}
    assert ledger == ["T1"]
    assert gate.get("refund:T1").run_id == "wf-1"


def _ambiguous(err: ApplicationError, gate: eg.Gate, key: str) -> None:
    assert err.non_retryable and err.type == "EffectAmbiguous"
    assert f"effectgate resolve {key} --committed (or --failed) -n {gate.namespace}" in err.message
    assert err.details[0]["key"] == key and err.details[0]["state"] == "ambiguous"


def test_an_ambiguous_effect_is_a_non_retryable_error_naming_the_next_step(
        gate: eg.Gate) -> None:
    ledger: list[str] = []

    @activity.defn
    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        raise TimeoutError("the vendor did not answer")

    with pytest.raises(ApplicationError) as first:
        environment(attempt=1).run(refund, "T1", 500)
    _ambiguous(first.value, gate, "refund:T1")
    assert isinstance(first.value.__cause__, TimeoutError)  # what the body raised
    assert "the vendor did not answer" not in first.value.message
    with pytest.raises(ApplicationError) as retried:  # Temporal's retry, had it made one
        environment(attempt=2).run(refund, "T1", 500)
    _ambiguous(retried.value, gate, "refund:T1")
    assert ledger == ["T1"]
    gate.resolve("refund:T1", "committed", by="alice", result={"refunded": 500})
    assert environment(attempt=3).run(refund, "T1", 500) == {"refunded": 500}
    assert ledger == ["T1"]


async def test_an_async_ambiguous_effect_is_non_retryable(gate: eg.Gate) -> None:
    @activity.defn
    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")
    async def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        raise ConnectionResetError("reset after send")

    with pytest.raises(ApplicationError) as caught:
        await environment().run(refund, "T1", 500)
    _ambiguous(caught.value, gate, "refund:T1")


def test_a_failed_effect_is_retryable_and_the_retry_runs_the_next_attempt(
        gate: eg.Gate) -> None:
    attempts: list[int] = []

    @activity.defn
    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        attempts.append(eg.current_effect().attempt)
        if len(attempts) == 1:
            raise eg.NotExecuted("the vendor refused the connection")
        return {"refunded": amount_cents}

    with pytest.raises(eg.NotExecuted):  # as it is: Temporal retries it
        environment(attempt=1).run(refund, "T1", 500)
    assert environment(attempt=2).run(refund, "T1", 500) == {"refunded": 500}
    assert attempts == [1, 2]


def test_in_flight_elsewhere_is_retryable_after_the_holders_lease(gate: eg.Gate) -> None:
    @activity.defn
    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        raise AssertionError("must not run while another holder has it")

    call = {"effect_type": "payment.refund", "key": "refund:T1",
            "payload": {"txn_id": "T1", "amount_cents": 500}, "lease_seconds": 30}
    assert gate.begin(**call).decision is eg.Decision.EXECUTE
    told = gate.begin(**call).retry_after_seconds
    assert told is not None and told > 0
    with pytest.raises(ApplicationError) as caught:
        environment().run(refund, "T1", 500)
    err = caught.value
    assert err.type == "EffectInFlight" and not err.non_retryable
    assert err.next_retry_delay == datetime.timedelta(seconds=told)


def test_approval_denial_and_a_payload_mismatch_are_non_retryable(make_gate: Any) -> None:
    gate = make_gate(policy={"effects": {"payment.*": {"approval": "always"},
                                         "email.*": {"deny": True}}})

    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> None: ...

    @effect_activity(gate, "mail:{to}", effect_type="email.send")
    def mail(to: str) -> None: ...

    @effect_activity(gate, "mail:{to}", effect_type="note.send")
    def note(to: str, text: str) -> None: ...

    with pytest.raises(ApplicationError) as approval:
        environment().run(refund, "T1", 500)
    assert approval.value.type == "ApprovalRequired" and approval.value.non_retryable
    assert approval.value.details[0]["approval_id"]
    with pytest.raises(ApplicationError) as denied:
        environment().run(mail, "a@example.com")
    assert denied.value.type == "EffectDenied" and denied.value.non_retryable
    gate_plain = make_gate(policy=False)

    @effect_activity(gate_plain, "k:{to}", effect_type="note.send")
    def first(to: str) -> None: ...

    @effect_activity(gate_plain, "k:{to}", effect_type="note.send")
    def second(to: str, text: str = "hi") -> None: ...

    environment().run(first, "x")
    with pytest.raises(ApplicationError) as mismatch:
        environment().run(second, "x")
    assert mismatch.value.type == "PayloadMismatch" and mismatch.value.non_retryable
    del note


def test_heartbeats_extend_the_lease_and_reach_temporal(gate: eg.Gate) -> None:
    beats: list[tuple[Any, ...]] = []
    expiries: list[datetime.datetime | None] = []

    @activity.defn
    @effect_activity(gate, "deploy:{name}", effect_type="deploy", lease_seconds=0.4)
    def deploy(name: str) -> str:
        for step in range(3):
            import time

            time.sleep(0.15)
            activity.heartbeat(step)
            expiries.append(gate.get(f"deploy:{name}").lease_expires_at)
        time.sleep(0.3)  # past the first lease: only the heartbeats kept it
        return "done"

    env = environment()
    env.on_heartbeat = lambda *details: beats.append(details)
    assert env.run(deploy, "api") == "done"
    assert beats == [(0,), (1,), (2,)]
    assert gate.get("deploy:api").state is eg.State.COMMITTED
    assert expiries[0] is not None and expiries[-1] is not None and expiries[-1] > expiries[0]


def test_a_lost_lease_stops_a_sync_activity_at_its_next_heartbeat(gate: eg.Gate) -> None:
    after: list[str] = []

    @activity.defn
    @effect_activity(gate, "deploy:{name}", effect_type="deploy", lease_seconds=0.2)
    def deploy(name: str) -> str:
        import time

        time.sleep(0.35)  # the lease lapses: the effect is AMBIGUOUS now
        activity.heartbeat()
        after.append("went on")
        return "done"

    with pytest.raises(ApplicationError) as caught:
        environment().run(deploy, "api")
    err = caught.value
    assert err.type == "StaleLease" and err.non_retryable
    assert "effectgate resolve deploy:api --committed" in err.message
    assert after == []
    assert gate.get("deploy:api").state is eg.State.AMBIGUOUS


async def test_a_lost_lease_cancels_an_async_activity(gate: eg.Gate) -> None:
    after: list[str] = []

    @activity.defn
    @effect_activity(gate, "deploy:{name}", effect_type="deploy", lease_seconds=0.2)
    async def deploy(name: str) -> str:
        await asyncio.sleep(0.35)
        activity.heartbeat()
        await asyncio.sleep(2)  # cancelled here once the extension is refused
        after.append("went on")
        return "done"

    with pytest.raises(ApplicationError) as caught:
        await environment().run(deploy, "api")
    assert caught.value.type == "StaleLease" and caught.value.non_retryable
    assert after == []
    assert gate.get("deploy:api").state is eg.State.AMBIGUOUS


def test_an_operator_resolution_during_the_activity_stops_it_retryably(gate: eg.Gate) -> None:
    @activity.defn
    @effect_activity(gate, "deploy:{name}", effect_type="deploy", lease_seconds=0.4)
    def deploy(name: str) -> str:
        import time

        gate.resolve(f"deploy:{name}", "failed", by="alice", force=True, note="stuck")
        time.sleep(0.15)
        activity.heartbeat()
        return "done"

    with pytest.raises(ApplicationError) as caught:
        environment().run(deploy, "api")
    assert caught.value.type == "StaleLease" and not caught.value.non_retryable
    assert gate.get("deploy:api").state is eg.State.FAILED


def test_temporal_cancellation_passes_through(gate: eg.Gate) -> None:
    from temporalio.exceptions import CancelledError

    @activity.defn
    @effect_activity(gate, "deploy:{name}", effect_type="deploy")
    def deploy(name: str) -> str:
        raise CancelledError("cancelled by the workflow")

    with pytest.raises(CancelledError):
        environment().run(deploy, "api")
    assert gate.get("deploy:api").state is eg.State.AMBIGUOUS


def test_bad_options_are_refused_before_anything_runs(gate: eg.Gate) -> None:
    before = snapshot(gate)

    def refund(txn_id: str) -> None: ...

    with pytest.raises(eg.ConfigError):
        effect_activity("not a gate", "refund:{txn_id}")(refund)  # type: ignore[arg-type]
    with pytest.raises(eg.ConfigError):
        effect_activity(gate, "refund:{txn_id}")("not a function")  # type: ignore[arg-type]
    with pytest.raises(eg.ConfigError):
        effect_activity(gate, "refund:{txn_id}", lease_seconds=-1)(refund)
    with pytest.raises(eg.EffectKeyError):
        effect_activity(gate, "refund:{order}")(refund)
    with pytest.raises(ApplicationError) as caught:  # a key the arguments cannot render
        environment().run(effect_activity(gate, "refund:{txn_id}")(refund), "")
    assert caught.value.non_retryable
    assert snapshot(gate) == before



def test_a_callable_object_or_a_partial_gets_the_effect_type_gate_effect_gives_it(
        make_gate: Any) -> None:
    """The policy's rule for that type (here: approval) applies; the adapter's own wrapper
    never names the effect."""
    gate = make_gate(policy=APPROVE_BOTH)
    ledger: list[str] = []

    with pytest.raises(eg.ApprovalRequired):  # what gate.effect does with the same callable
        gate.effect("refund:{txn_id}")(Refund(ledger))("T0", 500)
    wire_eur = functools.partial(wire, ledger, "EUR")
    for body, key, effect_type in ((Refund(ledger), "refund:{txn_id}", "Refund"),
                                   (wire_eur, "wire:{txn_id}", "wire")):
        with pytest.raises(ApplicationError) as caught:
            environment().run(effect_activity(gate, key)(body), "T1", 500)
        assert caught.value.type == "ApprovalRequired" and caught.value.non_retryable
        assert gate.get(key.format(txn_id="T1")).effect_type == effect_type
    assert gate.get("refund:T0").effect_type == "Refund"
    assert ledger == []


def test_a_partials_heartbeats_extend_the_lease_of_its_effect_type(make_gate: Any) -> None:
    """The lease the heartbeat keeps is the policy's lease for the effect's own type."""
    gate = make_gate(policy={"effects": {"deploy": {"lease_seconds": 1.2}}})
    held: list[float] = []

    def deploy(region: str, name: str) -> str:
        for step in range(5):
            time.sleep(0.3)  # 1.5 s in all: past the first lease, kept by the heartbeats
            activity.heartbeat(step)
            expiry = gate.get(f"deploy:{name}").lease_expires_at
            assert expiry is not None
            held.append((expiry - datetime.datetime.now(datetime.UTC)).total_seconds())
        return f"{name} in {region}"

    gated_deploy = effect_activity(gate, "deploy:{name}")(functools.partial(deploy, "eu"))
    assert environment().run(gated_deploy, "api") == "api in eu"
    record = gate.get("deploy:api")
    assert record.effect_type == "deploy" and record.state is eg.State.COMMITTED
    assert max(held) <= 1.25  # the policy's 1.2 s lease, not the gate's default


async def test_an_async_callable_object_is_gated_as_async(gate: eg.Gate) -> None:
    ledger: list[str] = []
    for body, txn in ((AsyncRefund(ledger), "T1"), (functools.partial(AsyncRefund(ledger)), "T2")):
        gated_refund = effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")(body)
        assert await environment().run(gated_refund, txn, 500) == {"refunded": 500}
        assert gate.get(f"refund:{txn}").state is eg.State.COMMITTED
    assert ledger == ["T1", "T2"]


def test_a_cancellation_while_begin_waits_is_recorded_failed_and_the_body_never_starts(
        gate: eg.Gate) -> None:
    """Temporal raises CancelledError into a sync activity's thread while the gate's begin
    waits on the store: begin finishes whole (never cut short mid-write), the body does not
    start, the effect is FAILED (it provably never ran) and the activity is cancelled."""
    ran: list[str] = []

    @activity.defn
    @effect_activity(gate, "email:{msg_id}", effect_type="email.send")
    def send_email(msg_id: str) -> str:
        ran.append(msg_id)
        return "sent"

    env = environment()
    cancel = threading.Timer(0.3, env.cancel)  # the workflow cancels the activity
    with write_lock(gate, 0.8):  # another worker is writing meanwhile
        cancel.start()
        with pytest.raises(CancelledError):
            env.run(send_email, "E1")
    cancel.join()
    assert ran == []
    assert gate.get("email:E1").state is eg.State.FAILED
    assert environment(attempt=2).run(send_email, "E1") == "sent"  # a later run runs it
    assert ran == ["E1"]


def test_a_cancellation_while_the_outcome_is_written_keeps_the_record_whole(
        gate: eg.Gate) -> None:
    """The body returned; Temporal's cancellation arrives while the gate's report waits on
    the store: the report finishes (COMMITTED, with the result), then the activity is
    cancelled."""
    env = environment()
    others = contextlib.ExitStack()
    cancel = threading.Timer(0.3, env.cancel)

    @activity.defn
    @effect_activity(gate, "email:{msg_id}", effect_type="email.send")
    def send_email(msg_id: str) -> str:
        others.enter_context(write_lock(gate, 0.8))  # another worker writes as the body ends
        cancel.start()
        return "sent"

    with others, pytest.raises(CancelledError):
        env.run(send_email, "E1")
    cancel.join()
    record = gate.get("email:E1")
    assert record.state is eg.State.COMMITTED and record.result == "sent"
    assert environment(attempt=2).run(send_email, "E1") == "sent"  # answered from the store


def test_a_lost_lease_is_noticed_within_a_quarter_of_the_lease(gate: eg.Gate) -> None:
    """What the docs promise: heartbeats consult the store at most every quarter of the
    lease, so an activity whose lease an operator took away stops at the first heartbeat a
    quarter of the lease after the last check — not sooner. (The collector is held off while
    the activity runs: a full collection of a long-running test worker's heap took longer than
    the quarter lease the steps are timed against.)"""
    returned: list[float] = []

    @activity.defn
    @effect_activity(gate, "deploy:{name}", effect_type="deploy", lease_seconds=4)
    def deploy(name: str) -> str:
        started = time.monotonic()
        gate.resolve(f"deploy:{name}", "failed", by="alice", force=True, note="stuck")
        for step in range(40):
            time.sleep(0.1)
            activity.heartbeat(step)
            returned.append(time.monotonic() - started)
        return "done"

    collecting = gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(ApplicationError) as caught:
            environment().run(deploy, "api")
    finally:
        if collecting:
            gc.enable()
    assert caught.value.type == "StaleLease"
    assert 4 <= len(returned) <= 10 and returned[-1] < 1.0 + 0.15  # stopped by 4 s / 4
