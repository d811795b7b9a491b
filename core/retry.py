"""Ready tenacity policies for gated calls: retry what is safe to retry, never what is not.

::

    from effectgate.retry import EffectRetrying, retry_effect

    @retry_effect                      # sync or async; or EffectRetrying(stop=...).wraps(fn)
    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict: ...

Retried by default:

* a known failure — an exception its gate recorded FAILED (:class:`NotExecuted`, your
  ``classifiers=``, and, for an effect with a vendor key, httpx and requests errors raised
  before a byte left: :mod:`effectgate.classify`), or, raised outside a gate, one
  ``eg.classify`` calls FAILED: the effect certainly did not happen, and the next ``begin``
  runs attempt n+1;
* :class:`EffectInFlight` — another holder is executing it: the next attempt waits exactly its
  ``retry_after_seconds`` and then gets the stored result, or runs if that holder failed;
* :class:`StoreError` — the store was unreachable; the gate keeps the retry safe.

Never retried, whatever ``retry=`` says (the veto wraps any predicate you pass, and survives
``copy()`` / ``retry_with``): :class:`EffectAmbiguous` (nobody knows whether it happened),
:class:`ApprovalRequired`, :class:`EffectDenied`, and the errors no retry can fix
(:class:`PayloadMismatch`, :class:`EffectKeyError`, :class:`ConfigError`, :class:`StaleLease`)
— also when one of them, or an error a gate recorded AMBIGUOUS, is the cause the error
was raised from, or a leaf of an exception group (:func:`never_retry`).
The error is re-raised as is (``reraise=True`` by default), not wrapped in ``RetryError``.
An exception the classifiers call AMBIGUOUS is not retried by default either; if you widen
``retry=`` to include it, the next attempt is refused by the gate with :class:`EffectAmbiguous`,
which then stops the loop.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

import tenacity
from tenacity import RetryCallState

from .classify import Classifier, checked_classifiers, classify, recorded_outcome
from .errors import (
    ApprovalRequired,
    ConfigError,
    EffectAmbiguous,
    EffectDenied,
    EffectInFlight,
    EffectKeyError,
    PayloadError,
    PayloadMismatch,
    StaleLease,
    StoreError,
)
from .states import Outcome

__all__ = [
    "NEVER_RETRY",
    "AsyncEffectRetrying",
    "EffectRetrying",
    "is_retryable",
    "never_retry",
    "retry_effect",
    "retry_if_retryable",
    "wait_retry_after",
]

log = logging.getLogger("effectgate")
F = TypeVar("F", bound=Callable[..., Any])

NEVER_RETRY: tuple[type[BaseException], ...] = (
    EffectAmbiguous, ApprovalRequired, EffectDenied,
    PayloadMismatch, PayloadError, EffectKeyError, ConfigError, StaleLease,
)
"""Errors no policy here retries, whatever ``retry=`` says (a :class:`PayloadError`, arguments
with no canonical JSON form, is refused the same way at every attempt)."""

DEFAULT_ATTEMPTS = 5


_MAX_LINKS = 64


def never_retry(exc: BaseException) -> bool:
    """Whether ``exc`` is, or carries, an error no retry may follow: one of
    :data:`NEVER_RETRY`, or an error a gate recorded AMBIGUOUS — itself, as the cause it was
    raised from (``raise ToolError(...) from err``), or among an exception group's leaves (a
    ``TaskGroup`` that wrapped a blocked call). An error merely raised while another was being
    handled (its implicit ``__context__``) is judged on its own. Past :data:`_MAX_LINKS`
    errors the answer is yes: never retry what could not be looked through."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        if len(seen) >= _MAX_LINKS:
            return True
        one = todo.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        if isinstance(one, NEVER_RETRY) or recorded_outcome(one) is Outcome.AMBIGUOUS:
            return True
        if isinstance(one, BaseExceptionGroup):
            todo.extend(one.exceptions)
        if one.__cause__ is not None:
            todo.append(one.__cause__)
    return False


def is_retryable(exc: BaseException, classifiers: Iterable[Classifier] = ()) -> bool:
    """True when retrying after ``exc`` is safe and may help (see the module docstring)."""
    if never_retry(exc):
        return False
    if isinstance(exc, (EffectInFlight, StoreError)):
        return True
    if not isinstance(exc, Exception):  # KeyboardInterrupt, CancelledError, SystemExit
        return False
    gated = recorded_outcome(exc)  # what the gate that raised it recorded, if one did
    if gated is not None:
        return gated is Outcome.FAILED
    return classify(exc, tuple(classifiers)) is Outcome.FAILED


class retry_if_retryable(tenacity.retry_base):
    """tenacity ``retry=`` predicate: :func:`is_retryable` on the attempt's exception."""

    def __init__(self, classifiers: Iterable[Classifier] = ()) -> None:
        self.classifiers = checked_classifiers(classifiers)  # (ConfigError when one is not)

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        if outcome is None or not outcome.failed:
            return False
        exc = outcome.exception()
        return exc is not None and is_retryable(exc, self.classifiers)


def _vetoed(retry_state: RetryCallState) -> bool:
    outcome = retry_state.outcome
    if outcome is None or not outcome.failed:
        return False
    exc = outcome.exception()
    return exc is not None and never_retry(exc)


class _Veto(tenacity.retry_base):
    """``inner`` AND NOT one of :data:`NEVER_RETRY`; applied once (idempotent under copy)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, retry_state: RetryCallState) -> bool:
        if _vetoed(retry_state):
            return False
        return bool(self.inner(retry_state))


class _AsyncVeto(_Veto):
    """:class:`_Veto` for ``AsyncRetrying``, where ``inner`` may be an async predicate."""

    async def __call__(self, retry_state: RetryCallState) -> bool:  # type: ignore[override]
        if _vetoed(retry_state):
            return False
        answer = self.inner(retry_state)
        if inspect.isawaitable(answer):
            answer = await answer
        return bool(answer)


class wait_retry_after(tenacity.wait.wait_base):
    """Wait an in-flight refusal's ``retry_after_seconds``; anything else waits ``fallback``."""

    def __init__(self, fallback: Any = None) -> None:
        self.fallback = fallback if fallback is not None else (
            tenacity.wait_exponential(multiplier=0.1, max=5.0) + tenacity.wait_random(0, 0.1))

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        if outcome is not None and outcome.failed:
            exc = outcome.exception()
            if isinstance(exc, EffectInFlight) and exc.retry_after_seconds is not None:
                return float(exc.retry_after_seconds)
        return float(self.fallback(retry_state))


def _log_retry(retry_state: RetryCallState) -> None:
    outcome = retry_state.outcome
    exc = outcome.exception() if outcome is not None and outcome.failed else None
    wait = retry_state.upcoming_sleep
    log.info("retrying after %s (attempt %d, in %.2fs)", type(exc).__name__,
             retry_state.attempt_number, wait,
             extra={"key": getattr(exc, "key", None), "decision": getattr(exc, "decision", None),
                    "reason": str(exc)})


def _options(veto: type[_Veto], retry: Any, wait: Any, stop: Any,
             classifiers: Iterable[Classifier], kwargs: dict[str, Any]) -> dict[str, Any]:
    if retry is None:
        retry = retry_if_retryable(classifiers)
    if isinstance(retry, _Veto):
        if type(retry) is not veto:  # a sync veto given to the async class, or back
            retry = veto(retry.inner)
    else:
        retry = veto(retry)
    if not isinstance(wait, wait_retry_after):
        wait = wait_retry_after(wait)
    kwargs.setdefault("reraise", True)
    kwargs.setdefault("before_sleep", _log_retry)
    return {"retry": retry, "wait": wait,
            "stop": stop if stop is not None else tenacity.stop_after_attempt(DEFAULT_ATTEMPTS),
            **kwargs}


class EffectRetrying(tenacity.Retrying):
    """``tenacity.Retrying`` for gated calls: retries known failures and in-flight refusals,
    never :data:`NEVER_RETRY` (see the module docstring).

    ``retry``, ``wait`` and ``stop`` default to :class:`retry_if_retryable`, exponential
    jitter (0.1 s to 5 s; an in-flight refusal waits its ``retry_after_seconds``) and 5
    attempts; ``classifiers`` extends what counts as a known failure. Other keyword arguments
    go to tenacity. Use as ``policy(fn, ...)``, ``policy.wraps(fn)`` or
    ``for attempt in policy: with attempt: ...``.
    """

    def __init__(self, *, retry: Any = None, wait: Any = None, stop: Any = None,
                 classifiers: Iterable[Classifier] = (), **kwargs: Any) -> None:
        super().__init__(**_options(_Veto, retry, wait, stop, classifiers, kwargs))


class AsyncEffectRetrying(tenacity.AsyncRetrying):
    """:class:`EffectRetrying` for coroutines (``await policy(afn, ...)``,
    ``policy.wraps(afn)``, ``async for attempt in policy``); accepts async predicates."""

    def __init__(self, *, retry: Any = None, wait: Any = None, stop: Any = None,
                 classifiers: Iterable[Classifier] = (), **kwargs: Any) -> None:
        super().__init__(**_options(_AsyncVeto, retry, wait, stop, classifiers, kwargs))


@overload
def retry_effect(fn: F, /) -> F: ...
@overload
def retry_effect(fn: None = None, /, **options: Any) -> Callable[[F], F]: ...


def retry_effect(fn: Any = None, /, **options: Any) -> Any:
    """Decorator: :class:`EffectRetrying` for a function, :class:`AsyncEffectRetrying` for a
    coroutine function. ``@retry_effect`` or ``@retry_effect(stop=..., classifiers=...)``."""

    def decorate(func: F) -> F:
        # tenacity 9.2 types wraps() loosely, 9.1 (which google-genai pins) as F.
        if inspect.iscoroutinefunction(func):
            return AsyncEffectRetrying(**options).wraps(func)  # type: ignore[return-value,unused-ignore]
        return EffectRetrying(**options).wraps(func)  # type: ignore[return-value,unused-ignore]

    return decorate(fn) if fn is not None else decorate
