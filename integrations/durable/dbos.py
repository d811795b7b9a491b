"""DBOS: a gated step, at most once where DBOS runs a step at least once.

DBOS records a step's output only after the step returns, so a crash between the side effect
and that checkpoint runs the step again when the workflow is recovered. :func:`effect_step`
puts the gate inside the step::

    from dbos import DBOS
    from effectgate.integrations.durable.dbos import effect_step

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund",
                 step={"retries_allowed": True, "max_attempts": 3})
    def refund(txn_id: str, amount_cents: int) -> dict: ...

    @DBOS.workflow()
    def settle(txn_id: str) -> dict:
        return refund(txn_id, 500)

What the re-run gets:

* the effect committed before the crash: the stored result, and the body does not run;
* the holder died after the side effect, before its outcome was recorded: the step waits for
  the lease to lapse (``wait_in_flight``), then raises :class:`~effectgate.EffectAmbiguous`,
  which DBOS never retries and whose message names the operator's next step (``effectgate
  resolve KEY --committed|--failed`` or the console, then ``dbos workflow fork WORKFLOW_ID
  --step N``, whose re-run of this step the gate answers from the store);
* a body error the gate recorded FAILED (:class:`~effectgate.NotExecuted`, an error raised
  before a byte left): raised as it is, so ``retries_allowed`` retries it as attempt n+1;
* a body that returned after someone settled its effect FAILED (``effectgate resolve
  --failed --force`` while it ran): its report is fenced, and the step raises
  :class:`~effectgate.EffectAmbiguous` (the effect happened: record it ``--committed``), so
  that nothing runs it again on that FAILED unawares. A body that raised is not covered here:
  the one who settled it FAILED said it did nothing.

DBOS's own retries (``step={"retries_allowed": True, ...}``) never retry what the gate refuses
(``effectgate.retry.NEVER_RETRY``: AMBIGUOUS, approvals, denials, key and payload errors;
and arguments with no canonical JSON form, :class:`~effectgate.PayloadError`),
whatever ``should_retry`` you pass; yours is asked for every other error (an async step's may
answer with an awaitable, which is awaited; a sync step's must answer a bool). An effect in
flight elsewhere is waited for first. The
effect's ``run_id`` is the DBOS workflow id unless an :class:`~effectgate.effect_context` says
otherwise. The key template is yours: a fork or a new workflow has new DBOS ids, and only a
key made from the action's own arguments (``refund:{txn_id}``) keeps it one effect across them.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

from effectgate import (
    ConfigError,
    EffectAmbiguous,
    EffectInFlight,
    Gate,
    State,
)
from effectgate.integrations._kernel.context import framework_context
from effectgate.integrations._kernel.extras import requires_extra
from effectgate.retry import NEVER_RETRY

from ._gated import Attempt, gated, is_async, unknown_outcome

with requires_extra("durable.dbos", "dbos"):
    from dbos import DBOS, StepOptions

__all__ = ["DEFAULT_WAIT_IN_FLIGHT", "effect_step"]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_WAIT_IN_FLIGHT = 300.0
"""Seconds a step waits, at most, for an effect another holder has in flight (a crashed
holder's lease lapses within its lease; a live one finishes) before raising
:class:`~effectgate.EffectInFlight`."""

_STEP_OPTIONS = frozenset(StepOptions.__optional_keys__ | StepOptions.__required_keys__)


def effect_step(gate: Gate, key: str, *, step: StepOptions | None = None,
                wait_in_flight: float = DEFAULT_WAIT_IN_FLIGHT,
                **effect_options: Any) -> Callable[[F], F]:
    """Decorate a function (sync or async) as a DBOS step gated on the key template ``key``.

    ``effect_options`` are those of :meth:`effectgate.Gate.effect` (``effect_type``,
    ``vendor``, ``lease_seconds``, ``max_attempts`` of the effect, ...); with no
    ``effect_type``, the effect type is the one ``gate.effect`` gives ``fn`` (a callable
    object: its class's name). ``step`` is DBOS's :class:`dbos.StepOptions`
    (``retries_allowed``, ``max_attempts`` of DBOS's retries, ``should_retry``, ...), passed
    to ``DBOS.step`` with effectgate's veto added to ``should_retry``: an async
    ``should_retry`` on a sync step is a :class:`ConfigError`, and so is a sync step's
    ``should_retry`` that answers with an awaitable (raised when it does).
    ``wait_in_flight``: seconds to wait, at most, for an effect in flight elsewhere (see
    :data:`DEFAULT_WAIT_IN_FLIGHT`). Returns the DBOS step.
    """
    if not isinstance(gate, Gate):
        raise ConfigError(f"gate must be an effectgate.Gate, not {type(gate).__name__}")
    options = _step_options(step)
    wait = _seconds(wait_in_flight)

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise ConfigError(f"effect_step decorates a function, not {type(fn).__name__}")
        asynchronous = is_async(fn)
        step_options = {**options, "should_retry": _veto(options.get("should_retry"),
                                                         asynchronous=asynchronous)}
        call = gated(gate, fn, key, effect_options)
        if asynchronous:

            @functools.wraps(fn)
            async def astep(*args: Any, **kwargs: Any) -> Any:
                deadline = time.monotonic() + wait
                with framework_context(run_id=DBOS.workflow_id):
                    while True:
                        with Attempt.scope() as attempt:
                            try:
                                return await call(*args, **kwargs)
                            except Exception as err:
                                if (elsewhere := _elsewhere(err, attempt)) is None:
                                    state = await attempt.arecorded(gate, err)
                                    _raise(_translated(gate, err, attempt, state), err)
                                pause = _pause(elsewhere, deadline)
                        await asyncio.sleep(pause)

            return DBOS.step(**step_options)(astep)  # type: ignore[return-value]

        @functools.wraps(fn)
        def sync_step(*args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + wait
            with framework_context(run_id=DBOS.workflow_id):
                while True:
                    with Attempt.scope() as attempt:
                        try:
                            return call(*args, **kwargs)
                        except Exception as err:
                            if (elsewhere := _elsewhere(err, attempt)) is None:
                                state = attempt.recorded(gate, err)
                                _raise(_translated(gate, err, attempt, state), err)
                            pause = _pause(elsewhere, deadline)
                    time.sleep(pause)

        return DBOS.step(**step_options)(sync_step)  # type: ignore[return-value]

    return decorate


def _step_options(step: Mapping[str, Any] | None) -> dict[str, Any]:
    if step is None:
        step = {}
    if not isinstance(step, Mapping):
        raise ConfigError(f"step must be a mapping of DBOS step options, not "
                          f"{type(step).__name__}")
    unknown = sorted(str(name) for name in step if name not in _STEP_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown DBOS step option(s) {unknown}; known: "
                          f"{sorted(_STEP_OPTIONS)}")
    options = dict(step)
    theirs = options.get("should_retry")
    if theirs is not None and not callable(theirs):
        raise ConfigError("step['should_retry'] must be a function of the exception")
    return options


def _veto(theirs: Callable[[BaseException], Any] | None, *,
          asynchronous: bool) -> Callable[[BaseException], Any]:
    """``should_retry`` that never lets DBOS retry what the gate refused, else asks yours.

    An async step's ``should_retry`` may answer with an awaitable, which is awaited (as DBOS
    does). A sync step has no loop to await one on: an async ``should_retry`` is refused here
    (:class:`ConfigError`), and a plain function that returns an awaitable raises
    :class:`ConfigError` when it does, instead of the awaitable counting as "retry"."""
    if theirs is None:
        return _never_retry_refused
    if asynchronous:
        async def averdict(error: BaseException) -> bool:
            if isinstance(error, NEVER_RETRY):
                return False
            answer = theirs(error)
            if inspect.isawaitable(answer):
                answer = await answer
            return bool(answer)

        return averdict
    if is_async(theirs):
        raise ConfigError("step['should_retry'] is async but the step is sync: DBOS cannot "
                          "await it; make the step async, or should_retry a plain function")

    def verdict(error: BaseException) -> bool:
        if isinstance(error, NEVER_RETRY):
            return False
        answer = theirs(error)
        if inspect.isawaitable(answer):
            close = getattr(answer, "close", None)
            if callable(close):  # a coroutine never awaited: no warning about it later
                close()
            raise ConfigError(
                f"step['should_retry'] returned {type(answer).__name__!r}, an awaitable, for "
                "a sync step, which cannot await it (and must not count it as yes); make the "
                "step async, or should_retry answer a bool") from error
        return bool(answer)

    return verdict


def _never_retry_refused(error: BaseException) -> bool:
    """DBOS's ``should_retry`` when you gave none: retry anything but what the gate refused."""
    return not isinstance(error, NEVER_RETRY)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise ConfigError(f"wait_in_flight must be a number of seconds >= 0, not {value!r}")
    return float(value)


def _elsewhere(err: Exception, attempt: Attempt) -> EffectInFlight | None:
    """``err`` if it says this step's own key is in flight elsewhere: an
    :class:`EffectInFlight` from the gate before the body ran, else None. One the body raised
    (a gated call inside it met another holder) is the body's error: its effect may be done."""
    return err if isinstance(err, EffectInFlight) and attempt.decision is None else None


def _pause(err: EffectInFlight, deadline: float) -> float:
    """How long to wait before asking again; re-raises ``err`` once the deadline has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise err
    return min(max(err.retry_after_seconds or 0.0, 0.05), left)


def _then() -> str:
    workflow, step = DBOS.workflow_id, DBOS.step_id
    if workflow is None or step is None:
        return "then call it again: the repeat returns the stored result, or runs after --failed"
    return (f"then run this step again: dbos workflow fork {workflow} --step {step} (the "
            "repeat returns the stored result, or runs after --failed)")


def _translated(gate: Gate, err: Exception, attempt: Attempt,
                state: State | None) -> Exception:
    """The error the step raises for ``err``: an unknown outcome as a non-retryable
    :class:`EffectAmbiguous` naming the next step; anything else as it is."""
    held = attempt.decision
    if held is None:  # refused before the body ran
        if isinstance(err, EffectAmbiguous) and err.key is not None:
            return unknown_outcome(gate, err.key, err.reason or "unknown outcome", _then(),
                                   effect_id=err.effect_id)
        return err
    if state in (State.AMBIGUOUS, State.IN_FLIGHT):
        return unknown_outcome(
            gate, held.key, f"the step raised {type(err).__name__} after its body started",
            _then(), effect_id=held.effect_id)
    if attempt.returned and state is State.FAILED:  # its report was fenced: a fork runs it again
        return unknown_outcome(
            gate, held.key, "it was settled failed by someone else while the step ran, and "
            "then its body returned: it most likely happened", _then(),
            effect_id=held.effect_id)
    return err


def _raise(error: Exception, cause: Exception) -> NoReturn:
    if error is cause:
        raise cause
    raise error from cause
