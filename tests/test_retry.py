"""effectgate.retry: tenacity policies that retry known failures and in-flight refusals, and
never an ambiguous effect, an approval or a denial — even when ``retry=`` is widened."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import tenacity
from tenacity import retry_if_exception_type, stop_after_attempt, wait_none

import effectgate as eg
from effectgate.retry import (
    AsyncEffectRetrying,
    EffectRetrying,
    is_retryable,
    never_retry,
    retry_effect,
    wait_retry_after,
)

REFUND = {"txn_id": "T1", "amount_cents": 500}


def flaky(failures: list[BaseException]) -> Any:
    """A plain function raising ``failures`` in turn, then returning "ok"; counts calls."""
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "ok"

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


def test_failed_is_retried_until_it_runs(gate: eg.Gate) -> None:
    attempts: list[int] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> str:
        attempts.append(eg.current_effect().attempt)
        if len(attempts) < 3:
            raise eg.NotExecuted("connection refused before sending")
        return "refunded"

    assert EffectRetrying(wait=wait_none())(refund, **REFUND) == "refunded"
    assert attempts == [1, 2, 3]
    assert gate.get("refund:T1").state is eg.State.COMMITTED


def test_ambiguous_is_not_retried_even_when_retry_is_widened(gate: eg.Gate) -> None:
    runs: list[int] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> str:
        runs.append(1)
        raise TimeoutError("the reply was lost")

    with pytest.raises(TimeoutError):  # the default policy does not retry an unknown outcome
        EffectRetrying(wait=wait_none())(refund, **REFUND)
    assert runs == [1]
    widened = EffectRetrying(retry=retry_if_exception_type(Exception), wait=wait_none(),
                             stop=stop_after_attempt(10))
    with pytest.raises(eg.EffectAmbiguous):  # the gate refuses; the veto stops the loop
        widened(refund, **REFUND)
    assert runs == [1]
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


@pytest.mark.parametrize("error", [
    eg.EffectAmbiguous("unknown", key="k"),
    eg.ApprovalRequired("needs approval", key="k", approval_id="apr_1"),
    eg.EffectDenied("denied", key="k"),
    eg.PayloadMismatch("collision", key="k"),
])
def test_never_retried_errors_survive_any_retry_predicate(error: BaseException) -> None:
    fn = flaky([error, error])
    for policy in (EffectRetrying(retry=tenacity.retry_always, wait=wait_none()),
                   EffectRetrying(wait=wait_none()).copy(retry=tenacity.retry_always)):
        with pytest.raises(type(error)):
            policy(fn)
    assert len(fn.calls) == 2  # one call per policy: never a second attempt


def _wrapped(inner: BaseException, how: str) -> BaseException:
    """``inner`` as a framework or a TaskGroup hands it on."""
    if how == "group":
        return ExceptionGroup("unhandled errors in a TaskGroup", [ValueError("sibling"), inner])
    try:
        try:
            raise inner
        except BaseException as err:
            if how == "cause":
                raise RuntimeError("tool failed") from err
            raise eg.NotExecuted("handled; a new failure")  # noqa: B904 - context, not cause
    except (RuntimeError, eg.NotExecuted) as outer:
        return outer


@pytest.mark.parametrize("how", ["group", "cause"])
def test_a_never_retried_error_inside_a_group_or_a_chain_is_not_retried(gate: eg.Gate,
                                                                         how: str) -> None:
    """A blocked call wrapped by a TaskGroup, or by a framework's ``raise ... from``, stops the
    loop: sibling work around it is not done again and again."""
    ambiguous = eg.EffectAmbiguous("unknown", key="k")
    fn = flaky([_wrapped(ambiguous, how), _wrapped(ambiguous, how)])
    for policy in (EffectRetrying(retry=tenacity.retry_always, wait=wait_none()),
                   EffectRetrying(wait=wait_none())):
        with pytest.raises((ExceptionGroup, RuntimeError)):  # re-raised as it was
            policy(fn)
    assert len(fn.calls) == 2

    @gate.effect("charge:{n}", effect_type="payment.charge")
    def charge(n: int) -> None:
        raise TimeoutError("the reply was lost")  # recorded AMBIGUOUS by the gate

    def workflow() -> None:
        try:
            charge(1)
        except TimeoutError as err:
            raise RuntimeError("the step failed") from err

    calls: list[int] = []

    def counted() -> None:
        calls.append(1)
        workflow()

    with pytest.raises(RuntimeError):
        EffectRetrying(retry=tenacity.retry_always, wait=wait_none())(counted)
    assert calls == [1]


def test_a_group_too_big_to_look_through_is_not_retried_and_a_handled_one_is() -> None:
    """Past the links it looks through, the veto says no (fail closed); an error raised while
    an ambiguous one was being handled, not from it, is judged on its own."""
    many = ExceptionGroup("many", [ValueError(str(n)) for n in range(70)]
                          + [eg.EffectAmbiguous("unknown", key="k")])
    assert never_retry(many) and not is_retryable(many)
    handled = _wrapped(eg.EffectAmbiguous("unknown", key="k"), "context")
    assert isinstance(handled, eg.NotExecuted) and is_retryable(handled)


def test_in_flight_waits_its_retry_after_seconds_then_gets_the_stored_result(
        gate: eg.Gate) -> None:
    holder = gate.begin(effect_type="payment.refund", key="refund:T1", payload=REFUND,
                        lease_seconds=30)
    runs: list[int] = []
    sleeps: list[float] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> str:
        runs.append(1)
        return "refunded twice!"

    def sleep(seconds: float) -> None:  # the other holder finishes while we wait
        sleeps.append(seconds)
        gate.report(holder, "committed", result="refunded by the holder")

    policy = EffectRetrying(sleep=sleep, wait=tenacity.wait_fixed(99))
    assert policy(refund, **REFUND) == "refunded by the holder"
    assert runs == []
    assert len(sleeps) == 1 and 0 < sleeps[0] <= 1.0  # retry_after_seconds, not the 99 s wait


def test_store_errors_and_known_failures_are_retryable() -> None:
    assert is_retryable(eg.NotExecuted())
    assert is_retryable(eg.EffectInFlight("busy", retry_after_seconds=0.2))
    assert is_retryable(eg.StoreError("server restarting"))
    assert not is_retryable(TimeoutError("reply lost"))
    assert not is_retryable(eg.EffectAmbiguous("unknown"))
    assert is_retryable(ValueError("x"), classifiers=[lambda e: eg.Outcome.FAILED])
    assert not is_retryable(KeyboardInterrupt())


def test_async_failed_retried_and_ambiguous_not(gate: eg.Gate) -> None:
    runs: list[str] = []

    @gate.effect("charge:{txn_id}", effect_type="payment.charge")
    async def charge(txn_id: str) -> str:
        runs.append(txn_id)
        await asyncio.sleep(0)
        if txn_id == "lost":
            raise TimeoutError("the reply was lost")
        if runs.count(txn_id) < 2:
            raise eg.NotExecuted("declined before sending")
        return f"charged {txn_id}"

    async def main() -> None:
        assert await AsyncEffectRetrying(wait=wait_none())(charge, "ok") == "charged ok"
        widened = AsyncEffectRetrying(retry=retry_if_exception_type(Exception),
                                      wait=wait_none())
        with pytest.raises(TimeoutError):
            await AsyncEffectRetrying(wait=wait_none())(charge, "lost")
        with pytest.raises(eg.EffectAmbiguous):
            await widened(charge, "lost")

    asyncio.run(main())
    assert runs == ["ok", "ok", "lost"]


def test_async_policy_accepts_async_predicates_and_keeps_the_veto() -> None:
    async def always(retry_state: Any) -> bool:
        return True

    attempts: list[int] = []

    async def fn() -> None:
        attempts.append(1)
        raise eg.EffectAmbiguous("unknown")

    policy = AsyncEffectRetrying(retry=always, wait=wait_none())
    with pytest.raises(eg.EffectAmbiguous):
        asyncio.run(policy(fn))
    assert attempts == [1]


def test_retry_effect_decorates_sync_and_async_functions() -> None:
    sync_failures: list[BaseException] = [eg.NotExecuted(), eg.NotExecuted()]
    async_failures: list[BaseException] = [eg.NotExecuted()]

    @retry_effect(wait=wait_none())
    def sync_fn() -> str:
        if sync_failures:
            raise sync_failures.pop()
        return "sync"

    @retry_effect(wait=wait_none())
    async def async_fn() -> str:
        if async_failures:
            raise async_failures.pop()
        return "async"

    assert sync_fn() == "sync" and asyncio.run(async_fn()) == "async"
    assert isinstance(sync_fn.retry, EffectRetrying)  # type: ignore[attr-defined]
    assert isinstance(async_fn.retry, AsyncEffectRetrying)  # type: ignore[attr-defined]
    assert sync_fn.statistics["attempt_number"] == 3  # type: ignore[attr-defined]


def test_wait_retry_after_falls_back_for_other_errors() -> None:
    wait = wait_retry_after(tenacity.wait_fixed(2))
    state = tenacity.RetryCallState(EffectRetrying(), fn=None, args=(), kwargs={})
    state.set_exception((eg.NotExecuted, eg.NotExecuted(), None))
    assert wait(state) == 2
    state.set_exception((eg.EffectInFlight, eg.EffectInFlight("busy", retry_after_seconds=0.3),
                         None))
    assert wait(state) == 0.3
