"""A FAILED a built-in exception classifier inferred from a connection error keeps the vendor
key; one the body proved (``NotExecuted``), one of the caller's classifiers answered, or the
holder reported itself moves it.

A built-in classifier judges the request that raised, not the body: a body that charged a card
and then failed to connect for a follow-up request is FAILED, and its retry runs the body again.
The vendor deduplicates that retry only if it carries the key the charge carried.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import tenacity

import effectgate as eg
from effectgate.integrations._kernel import GatedCall, Refused
from effectgate.retry import retry_effect
from effectgate.store.rows import EffectHead

KEY = "charge:o2"


def _charge_then_connect_error(sent: list[str | None]) -> None:
    """The red team's body: the charge reaches the vendor, then a follow-up cannot connect."""
    d = eg.current_effect()
    assert d is not None
    sent.append(d.vendor_idempotency_key)
    raise httpx.ConnectError("connection refused")  # the follow-up request's error


def _vendor_attempt(gate: eg.Gate, key: str) -> tuple[int, int | None]:
    row: Any = gate.store.fetch(gate.namespace, key)
    assert isinstance(row, EffectHead)
    return row.attempt, row.vendor_attempt


def test_a_builtin_classifiers_failed_keeps_the_vendor_key(gate: eg.Gate) -> None:
    sent: list[str | None] = []

    @gate.effect("charge:{order}", effect_type="payment.charge", vendor="stripe")
    def charge(order: str) -> None:
        _charge_then_connect_error(sent)

    for _ in range(2):
        with pytest.raises(httpx.ConnectError):
            charge("o2")
    record = gate.get(KEY)
    assert record.state is eg.State.FAILED and record.attempt == 2
    assert sent[0] is not None and sent == [sent[0], sent[0]]
    assert _vendor_attempt(gate, KEY) == (2, 1)


async def test_a_users_classifiers_failed_moves_the_vendor_key_async(gate: eg.Gate) -> None:
    """A classifier of the caller's knows its body and its vendor: a FAILED it answers (a
    decline the vendor stored, say: Stripe replays a stored 402 for the same key for 24 h)
    moves the next attempt to a new key, as ``NotExecuted`` does (review of round 8)."""
    sent: list[str | None] = []

    def declined_by_vendor(exc: BaseException) -> eg.Outcome | None:
        return eg.Outcome.FAILED if isinstance(exc, LookupError) else None

    @gate.effect("charge:{order}", effect_type="payment.charge", vendor="stripe",
                 classifiers=(declined_by_vendor,))
    async def charge(order: str) -> None:
        d = eg.current_effect()
        assert d is not None
        sent.append(d.vendor_idempotency_key)
        raise LookupError("card declined")

    for _ in range(2):
        with pytest.raises(LookupError):
            await charge("o2")
    assert gate.get(KEY).state is eg.State.FAILED
    assert sent[0] is not None and sent[1] is not None and sent[0] != sent[1]


async def test_the_builtin_classifiers_failed_keeps_the_vendor_key_async(gate: eg.Gate) -> None:
    sent: list[str | None] = []

    @gate.effect("charge:{order}", effect_type="payment.charge", vendor="stripe")
    async def charge(order: str) -> None:
        _charge_then_connect_error(sent)

    for _ in range(2):
        with pytest.raises(httpx.ConnectError):
            await charge("o2")
    assert sent[0] is not None and sent == [sent[0], sent[0]]


def test_not_executed_still_moves_the_vendor_key(gate: eg.Gate) -> None:
    sent: list[str | None] = []

    @gate.effect("charge:{order}", effect_type="payment.charge", vendor="stripe")
    def charge(order: str) -> None:
        d = eg.current_effect()
        assert d is not None
        sent.append(d.vendor_idempotency_key)
        raise eg.NotExecuted("the card was declined before the charge")

    for _ in range(2):
        with pytest.raises(eg.NotExecuted):
            charge("o2")
    assert len(set(sent)) == 2 and None not in sent
    assert _vendor_attempt(gate, KEY) == (2, 3)


async def test_not_executed_still_moves_the_vendor_key_async(gate: eg.Gate) -> None:
    sent: list[str | None] = []

    @gate.effect("charge:{order}", effect_type="payment.charge", vendor="stripe")
    async def charge(order: str) -> None:
        d = eg.current_effect()
        assert d is not None
        sent.append(d.vendor_idempotency_key)
        raise eg.NotExecuted("declined")

    for _ in range(2):
        with pytest.raises(eg.NotExecuted):
            await charge("o2")
    assert len(set(sent)) == 2 and None not in sent


def test_an_explicit_failed_report_still_moves_the_vendor_key(gate: eg.Gate) -> None:
    first = gate.begin(effect_type="payment.charge", key=KEY, payload={}, vendor="stripe")
    gate.report(first, "failed", error="declined")
    second = gate.begin(effect_type="payment.charge", key=KEY, payload={}, vendor="stripe")
    assert second.attempt == 2
    assert second.vendor_idempotency_key != first.vendor_idempotency_key


async def test_an_explicit_failed_areport_still_moves_the_vendor_key(gate: eg.Gate) -> None:
    first = await gate.abegin(effect_type="payment.charge", key=KEY, payload={},
                              vendor="stripe")
    await gate.areport(first, eg.Outcome.FAILED, error="declined")
    second = await gate.abegin(effect_type="payment.charge", key=KEY, payload={},
                               vendor="stripe")
    assert second.attempt == 2
    assert second.vendor_idempotency_key != first.vendor_idempotency_key


def test_the_adapter_kernel_keeps_the_vendor_key_of_a_classified_failure(
        gate: eg.Gate) -> None:
    sent: list[str | None] = []
    call = GatedCall(eg.EffectSpec(gate, "charge:{order}", effect_type="payment.charge",
                                   vendor="stripe"), "charge")
    for _ in range(2):
        answer = call.run({"order": "o2"}, lambda: _charge_then_connect_error(sent))
        assert isinstance(answer, Refused) and answer.kind == "failed"
    assert sent[0] is not None and sent == [sent[0], sent[0]]


async def test_the_adapter_kernel_async_moves_the_key_only_for_not_executed(
        gate: eg.Gate) -> None:
    sent: list[str | None] = []
    call = GatedCall(eg.EffectSpec(gate, "charge:{order}", effect_type="payment.charge",
                                   vendor="stripe"), "charge")

    async def declined() -> None:
        d = eg.current_effect()
        assert d is not None
        sent.append(d.vendor_idempotency_key)
        raise eg.NotExecuted("declined")

    async def refused() -> None:
        _charge_then_connect_error(sent)

    for body in (declined, refused, refused):
        answer = await call.arun({"order": "o2"}, body)
        assert isinstance(answer, Refused) and answer.kind == "failed"
    assert sent[0] != sent[1] and sent[1] == sent[2]


@pytest.mark.parametrize("spends", [False, None])
@pytest.mark.parametrize("keeps", [True, False])
def test_the_stores_failed_report_keeps_the_key_only_when_told(
        gate: eg.Gate, spends: bool | None, keeps: bool) -> None:
    """Each statement a FAILED report runs (one statement, or with its spend in a
    transaction) reads ``keeps_vendor_key``."""
    first = gate.begin(effect_type="payment.charge", key=KEY, payload={}, vendor="stripe")
    assert first.lease is not None
    done = gate.store.record_outcome(
        gate.namespace, first.lease, eg.Outcome.FAILED, result=None, error=None, reason=None,
        note=None, actual_cost_micros=None, spends=spends, keeps_vendor_key=keeps)
    assert done is not None and not done.late
    second = gate.begin(effect_type="payment.charge", key=KEY, payload={}, vendor="stripe")
    assert second.attempt == 2
    same = second.vendor_idempotency_key == first.vendor_idempotency_key
    assert same is keeps


@pytest.mark.parametrize("keeps", [True, False])
def test_a_late_failed_report_keeps_the_key_only_when_told(make_gate: Any,
                                                         keeps: bool) -> None:
    import time

    gate = make_gate(lease_seconds=0.2)
    first = gate.begin(effect_type="payment.charge", key=KEY, payload={}, vendor="stripe")
    time.sleep(0.4)  # the lease lapses; nobody acts, so the holder's report lands, late
    done = gate.store.record_outcome(
        gate.namespace, first.lease, eg.Outcome.FAILED, result=None, error=None, reason=None,
        note=None, actual_cost_micros=None, spends=False, keeps_vendor_key=keeps)
    assert done is not None and done.late
    second = gate.begin(effect_type="payment.charge", key=KEY, payload={}, vendor="stripe")
    assert second.attempt == 2
    assert (second.vendor_idempotency_key == first.vendor_idempotency_key) is keeps


def test_without_a_vendor_key_a_builtins_failed_is_ambiguous(gate: eg.Gate) -> None:
    """Red team, round 9: with no vendor key nothing deduplicates a retry, and the built-in
    judged only the follow-up request, not the charge the body sent first; retried as a known
    failure, the body charged five times for one key. Without a vendor key the built-ins are
    not asked: the effect is AMBIGUOUS, and the next call is refused without running."""
    charged: list[str] = []

    @gate.effect("charge:{order}", effect_type="payment.charge")
    def charge(order: str) -> None:
        charged.append(order)  # the charge reached the vendor
        raise httpx.ConnectError("connection refused")  # the follow-up request's error

    with pytest.raises(httpx.ConnectError):
        charge("o2")
    assert eg.recorded_outcome(_raised(charge, "o3")) is eg.Outcome.AMBIGUOUS
    assert gate.get(KEY).state is eg.State.AMBIGUOUS
    with pytest.raises(eg.EffectAmbiguous):
        charge("o2")
    assert charged == ["o2", "o3"]


def test_a_retry_policy_does_not_retry_it(gate: eg.Gate) -> None:
    """The red team's loop: ``@retry_effect`` retries known failures; the refused follow-up
    is not one without a vendor key, so the body ran once."""
    charged: list[str] = []

    @retry_effect(stop=tenacity.stop_after_attempt(5), wait=tenacity.wait_none())
    @gate.effect("charge:{order}", effect_type="payment.charge")
    def charge(order: str) -> None:
        charged.append(order)
        raise httpx.ConnectError("connection refused")

    with pytest.raises(httpx.ConnectError):
        charge("o2")
    assert charged == ["o2"]
    assert gate.get(KEY).state is eg.State.AMBIGUOUS


def test_a_body_that_sends_one_request_says_so_with_its_own_classifier(gate: eg.Gate) -> None:
    """The opt-in: the built-in, given as the effect's own classifier, is the owner's word
    that its body sends one request, once; its FAILED lets the next call run."""
    calls: list[str] = []

    @gate.effect("ping:{n}", effect_type="http.ping", classifiers=(eg.classify_httpx,))
    def ping(n: str) -> None:
        calls.append(n)
        raise httpx.ConnectError("connection refused")

    for _ in range(2):
        with pytest.raises(httpx.ConnectError):
            ping("1")
    record = gate.get("ping:1")
    assert record.state is eg.State.FAILED and record.attempt == 2
    assert calls == ["1", "1"]


def _raised(fn: Any, *args: Any) -> BaseException:
    try:
        fn(*args)
    except BaseException as err:
        return err
    raise AssertionError("did not raise")
