"""Temporal: a gated activity, at most once where Temporal runs an activity at least once.

Temporal retries an activity whose result it did not get: a worker that died after the side
effect, a reply lost on the way, a timeout. :func:`effect_activity` puts the gate inside the
activity::

    from temporalio import activity
    from effectgate.integrations.durable.temporal import effect_activity

    @activity.defn
    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")
    async def refund(txn_id: str, amount_cents: int) -> dict:
        ...
        activity.heartbeat()      # also extends the effect's lease
        ...

What an attempt gets:

* the effect committed by an earlier attempt: the stored result; the body does not run;
* FAILED (:class:`~effectgate.NotExecuted`, an error raised before a byte left): the error
  as it is, which Temporal retries as attempt n+1;
* AMBIGUOUS (the body raised after it started; an earlier holder lapsed):
  ``ApplicationError(non_retryable=True, type="EffectAmbiguous")`` whose message names the
  operator's next step (``effectgate resolve KEY --committed|--failed`` or the console);
* in flight elsewhere: a retryable ``ApplicationError(type="EffectInFlight")`` with
  ``next_retry_delay`` the holder's remaining lease;
* approval required, denied, a payload that does not match the key, a bad key, arguments
  with no canonical JSON form (:class:`~effectgate.PayloadError`): a non-retryable
  ``ApplicationError`` whose ``type`` is the effectgate error's class name.

Every ``ApplicationError`` carries the error's fields (``key``, ``state``, ``effect_id``,
``approval_id``...) as its one detail, for the workflow to branch on.

``activity.heartbeat()`` inside the body extends the lease, asking the store at most every
quarter of the lease (a heartbeat in between only reaches Temporal; a store that cannot be
reached is logged and tried again at the next heartbeat). A lease found no longer held stops
the activity: a sync body gets :class:`~effectgate.StaleLease` from ``heartbeat()``, an async
one is cancelled, and the activity fails with a non-retryable
``ApplicationError(type="StaleLease")`` while the effect is unresolved, or when the body
returned though someone settled the effect FAILED meanwhile (it happened: a retry would run it
again). The loss is found at the first heartbeat a quarter of the lease or more after the last
extension (or the body's start), not at every heartbeat: a body may go on for up to that long,
and until its next heartbeat, after losing its lease. What it reports then is never written
over what an operator or a newer holder did since (its fencing token is stale).

Temporal cancels a sync activity by raising ``CancelledError`` into its thread. The gate's own
store calls (``begin``, ``report``, lease extensions, reads) run under
``activity.shield_thread_cancel_exception()`` and finish whole; only the body is cancellable.
A cancellation that arrives before the body starts leaves the effect FAILED (it never ran),
one during the body AMBIGUOUS; the activity raises ``CancelledError`` either way (an async
activity's cancellation is recorded the same way by the core). The effect's
``run_id`` is the Temporal workflow id (the activity id outside a workflow) unless an
:class:`~effectgate.effect_context` says otherwise. The key template is yours: a reset or a
new run has new Temporal ids, and only a key made from the action's own arguments keeps it one
effect across them.

A workflow that names the activity imports its module under
``workflow.unsafe.imports_passed_through()``: the gate the decorator needs is made when that
module is imported, which reads files the workflow sandbox refuses. Nothing here runs in
workflow code.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime
import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from effectgate import (
    BeginDecision,
    ConfigError,
    EffectAmbiguous,
    EffectGateError,
    EffectInFlight,
    Gate,
    NotExecuted,
    StaleLease,
    State,
)
from effectgate.integrations._kernel.context import framework_context
from effectgate.integrations._kernel.extras import requires_extra
from effectgate.retry import NEVER_RETRY

from ._gated import Attempt, gated, is_async, lease_of, unknown_outcome

with requires_extra("durable.temporal", "temporal"):
    from temporalio import activity
    from temporalio.exceptions import ApplicationError
    from temporalio.exceptions import CancelledError as TemporalCancelled

__all__ = ["effect_activity"]

log = logging.getLogger("effectgate")
F = TypeVar("F", bound=Callable[..., Any])

_THEN = ("then run the activity again (the workflow's own retry, or a reset to before it): the "
         "repeat returns the stored result, or runs after --failed")


def effect_activity(gate: Gate, key: str, **effect_options: Any) -> Callable[[F], F]:
    """Gate a Temporal activity function (sync or async) on the key template ``key``.

    Apply it under ``@activity.defn``. ``effect_options`` are those of
    :meth:`effectgate.Gate.effect` (``effect_type``, ``vendor``, ``lease_seconds``,
    ``max_attempts``, ...); with no ``effect_type``, the effect type is the one
    ``gate.effect`` gives ``fn`` (a callable object: its class's name). Give the effect a
    lease longer than the time between two heartbeats.
    """
    if not isinstance(gate, Gate):
        raise ConfigError(f"gate must be an effectgate.Gate, not {type(gate).__name__}")

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise ConfigError(f"effect_activity decorates a function, not {type(fn).__name__}")
        lease = lease_of(gate, fn, effect_options)
        if is_async(fn):
            acall = gated(gate, fn, key, effect_options,
                          enter=lambda d: _leased(gate, d, lease, asynchronous=True))

            @functools.wraps(fn)
            async def arun(*args: Any, **kwargs: Any) -> Any:
                with framework_context(run_id=_run_id()), Attempt.scope() as attempt:
                    try:
                        return await acall(*args, **kwargs)
                    except asyncio.CancelledError as err:
                        if attempt.lost is None:
                            raise
                        state = await attempt.arecorded(gate, err)
                        raise _lease_lost(gate, attempt, state) from err
                    except Exception as err:
                        state = await attempt.arecorded(gate, err)
                        _raise(_translated(gate, err, attempt, state), err)

            return arun  # type: ignore[return-value]

        call = gated(gate, fn, key, effect_options,
                     enter=lambda d: _cancellable_body(gate, d, lease))

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with _Shield(), framework_context(run_id=_run_id()), Attempt.scope() as attempt:
                try:
                    return call(*args, **kwargs)
                except Exception as err:
                    _raise(_translated(gate, err, attempt, attempt.recorded(gate, err)), err)

        return run  # type: ignore[return-value]

    return decorate


_shields: contextvars.ContextVar[_Shield | None] = contextvars.ContextVar(
    "effectgate_temporal_shield", default=None)


class _Shield:
    """Temporal's cancellation of a sync activity held off the gate's own work.

    Temporal cancels a sync activity by raising ``CancelledError`` into its thread, wherever
    that thread is. Inside the gate's ``begin``, ``report`` or ``get`` it would cut a store
    call short; so the whole activity runs under ``activity.shield_thread_cancel_exception()``
    except its body, between :meth:`lift` and :meth:`restore`. A cancellation that arrived
    while shielded is raised (by Temporal) when the shield is lifted: just before the body
    (which then never starts), or when the activity ends."""

    def __init__(self) -> None:
        self._held: AbstractContextManager[None] | None = None
        self._token: contextvars.Token[_Shield | None] | None = None

    @staticmethod
    def current() -> _Shield | None:
        """The shield of the sync activity running here (None: none)."""
        return _shields.get()

    def __enter__(self) -> _Shield:
        self.restore()
        self._token = _shields.set(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _shields.reset(self._token)
        self.lift()

    def lift(self) -> None:
        """Let Temporal's cancellation in (one held off meanwhile is raised now)."""
        held, self._held = self._held, None
        if held is not None:
            held.__exit__(None, None, None)

    def restore(self) -> None:
        """Hold Temporal's cancellation off again."""
        if self._held is None:
            held = activity.shield_thread_cancel_exception()
            held.__enter__()
            self._held = held


class _CancelledBeforeBody(NotExecuted):
    """Temporal cancelled the activity after ``begin`` answered execute, before the body
    started: the effect is FAILED (it provably never ran) and the activity is cancelled."""


_NOT_STARTED = "the activity was cancelled before its body started"


@contextlib.contextmanager
def _cancellable_body(gate: Gate, held: BeginDecision, lease: float) -> Iterator[None]:
    """A sync activity's body: its heartbeats extend the lease, and it alone may be cancelled.

    A cancellation already requested, or one raised while the shield is lifted, stops the
    call before the body starts: :class:`_CancelledBeforeBody` (the gate records FAILED)."""
    with _leased(gate, held, lease, asynchronous=False):
        shield = _Shield.current()
        if activity.is_cancelled():
            raise _CancelledBeforeBody(_NOT_STARTED, key=held.key)
        if shield is None:  # not under effect_activity's own wrapper
            yield
            return
        try:
            try:
                shield.lift()
            except TemporalCancelled as err:
                raise _CancelledBeforeBody(_NOT_STARTED, key=held.key) from err
            yield
        finally:
            shield.restore()  # the gate's report and reads run shielded again


def _run_id() -> str | None:
    info = activity.info()
    return info.workflow_id or info.activity_id or None


class _Heartbeat:
    """``activity.heartbeat`` while a gated body runs: extend the lease, then heartbeat."""

    def __init__(self, gate: Gate, held: BeginDecision, lease: float,
                 forward: Callable[..., None] | None, attempt: Attempt | None,
                 task: asyncio.Task[Any] | None) -> None:
        self.gate, self.held, self.lease, self.forward = gate, held, lease, forward
        self.attempt, self.task = attempt, task
        self.every = lease / 4
        self.last = time.monotonic()
        self.pending: asyncio.Task[None] | None = None
        self.closed = False

    def __call__(self, *details: Any) -> None:
        lost = self.attempt.lost if self.attempt is not None else None
        if lost is not None:
            raise lost
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            if self.task is None:
                self._extend()
            elif self.pending is None or self.pending.done():
                self.pending = asyncio.get_running_loop().create_task(self._aextend())
        if self.forward is not None:
            self.forward(*details)

    def _extend(self) -> None:
        try:
            with activity.shield_thread_cancel_exception():  # never cut short by a cancellation
                self.gate.extend_lease(self.held, self.lease)
        except StaleLease as err:
            self._lost(err)
            raise
        except EffectGateError as err:
            log.warning("could not extend the lease on %s: %s", self.held.key, err,
                        extra={"key": self.held.key})

    async def _aextend(self) -> None:
        try:
            await self.gate.aextend_lease(self.held, self.lease)
        except StaleLease as err:
            if not self.closed:
                self._lost(err)
                if self.task is not None:
                    self.task.cancel()
        except EffectGateError as err:
            log.warning("could not extend the lease on %s: %s", self.held.key, err,
                        extra={"key": self.held.key})

    def _lost(self, err: StaleLease) -> None:
        if self.attempt is not None:
            self.attempt.lost = err


@contextlib.contextmanager
def _leased(gate: Gate, held: BeginDecision, lease: float, *,
            asynchronous: bool) -> Iterator[None]:
    """Route ``activity.heartbeat`` through :class:`_Heartbeat` while the body runs.

    Temporal has no public hook on an activity's heartbeat that also works outside a worker
    (``ActivityEnvironment`` runs no interceptors), so the activity's context is replaced
    for the body by a copy whose heartbeat extends the lease first."""
    context = activity._Context.current()
    beat = _Heartbeat(gate, held, lease, context.heartbeat, Attempt.current(),
                      asyncio.current_task() if asynchronous else None)
    token = activity._Context.set(dataclasses.replace(context, heartbeat=beat))
    try:
        yield
    finally:
        beat.closed = True
        activity._Context.reset(token)


def _error(err: EffectGateError, *, retryable: bool,
           delay: float | None = None) -> ApplicationError:
    return ApplicationError(
        err.message, _fields(err), type=type(err).__name__, non_retryable=not retryable,
        next_retry_delay=None if delay is None else datetime.timedelta(seconds=delay))


def _translated(gate: Gate, err: Exception, attempt: Attempt,
                state: State | None) -> Exception:
    """What the activity raises for ``err``; ``state`` is what the store recorded (None: the
    body never ran)."""
    held = attempt.decision
    if isinstance(err, TemporalCancelled):
        return err
    if isinstance(err, _CancelledBeforeBody):  # recorded FAILED; Temporal sees a cancellation
        return TemporalCancelled(_NOT_STARTED)
    if held is None:  # refused, or broken, before the body ran
        if isinstance(err, EffectAmbiguous) and err.key is not None:
            return _error(unknown_outcome(gate, err.key, err.reason or "unknown outcome", _THEN,
                                          effect_id=err.effect_id), retryable=False)
        if isinstance(err, EffectInFlight):
            return _error(err, retryable=True,
                          delay=max(float(err.retry_after_seconds or 0.0), 0.1))
        if isinstance(err, NEVER_RETRY) and isinstance(err, EffectGateError):
            return _error(err, retryable=False)
        return err
    if attempt.lost is not None or isinstance(err, StaleLease):
        return _lease_lost(gate, attempt, state)
    if state in (State.AMBIGUOUS, State.IN_FLIGHT):
        return _error(unknown_outcome(
            gate, held.key, f"the activity raised {type(err).__name__} after its body started",
            _THEN, effect_id=held.effect_id), retryable=False)
    return err


def _lease_lost(gate: Gate, attempt: Attempt, state: State | None) -> ApplicationError:
    """The activity stopped because its lease no longer held: an operator's question while
    the outcome is unknown; a retry's otherwise (it gets what was resolved)."""
    held = attempt.decision
    assert held is not None
    lost = attempt.lost or StaleLease("the lease no longer holds", key=held.key)
    why = f"its lease was lost while the activity ran: {lost.reason or lost.message}"
    if attempt.returned and state is State.FAILED:
        # The body finished: its effect is done, though the store was told it never
        # happened meanwhile. A retry would run it again.
        why = ("it was settled failed by someone else while the activity ran, and then its "
               "body returned: it most likely happened")
        stop = unknown_outcome(gate, held.key, why, _THEN, effect_id=held.effect_id)
        return ApplicationError(stop.message, _fields(stop), type="StaleLease",
                                non_retryable=True)
    if state in (State.AMBIGUOUS, State.IN_FLIGHT, None):
        stop = unknown_outcome(gate, held.key, why, _THEN, effect_id=held.effect_id)
        return ApplicationError(stop.message, _fields(stop), type="StaleLease",
                                non_retryable=True)
    done = StaleLease(f"{held.key!r} was settled ({state.value}) by someone else while the "
                      "activity ran; the activity stopped, and a new attempt gets what was "
                      "settled", key=held.key, state=state.value, reason=why,
                      effect_id=held.effect_id)
    return _error(done, retryable=True)


def _fields(err: EffectGateError) -> dict[str, Any]:
    return {name: value for name, value in err.fields().items() if name != "message"}


def _raise(error: Exception, cause: Exception) -> None:
    if error is cause:
        raise cause
    raise error from cause
