"""What the engines share: ``gate.effect`` around the user's function, the decision its body ran
under, what the store recorded after an error, and the operator's next step in words."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import shlex
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from effectgate import (
    BeginDecision,
    EffectAmbiguous,
    EffectGateError,
    Gate,
    NotExecuted,
    Outcome,
    StaleLease,
    State,
    current_effect,
    recorded_outcome,
)

__all__ = ["Attempt", "effect_type_of", "gated", "is_async", "lease_of", "resolve_hint",
           "unknown_outcome"]

_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "effectgate_durable_attempt", default=None)

Enter = Callable[[BeginDecision], AbstractContextManager[Any]]


class Attempt:
    """One call of a gated function: the decision its body ran under (None: it never ran),
    the :class:`StaleLease` an engine's heartbeat met while it ran (None: none), and whether
    the body returned (its effect is done, whatever the store says since)."""

    __slots__ = ("decision", "lost", "returned")

    def __init__(self) -> None:
        self.decision: BeginDecision | None = None
        self.lost: StaleLease | None = None
        self.returned = False

    @staticmethod
    def current() -> Attempt | None:
        """The attempt of the call running here (None outside one)."""
        return _attempt.get()

    @classmethod
    @contextlib.contextmanager
    def scope(cls) -> Iterator[Attempt]:
        """A fresh attempt for the calls inside the block."""
        attempt = cls()
        token = _attempt.set(attempt)
        try:
            yield attempt
        finally:
            _attempt.reset(token)

    def recorded(self, gate: Gate, error: BaseException) -> State | None:
        """What the store recorded after the body raised ``error`` (None: the body never ran).

        The record is the truth; when it cannot be read, the default classification of
        ``error`` stands in (the gate recorded at least that much caution)."""
        if self.decision is None:
            return None
        try:
            return gate.get(self.decision.key).state
        except EffectGateError:
            return _guess(error)

    async def arecorded(self, gate: Gate, error: BaseException) -> State | None:
        """:meth:`recorded` without blocking the event loop."""
        if self.decision is None:
            return None
        try:
            return (await gate.aget(self.decision.key)).state
        except EffectGateError:
            return _guess(error)


def _guess(error: BaseException) -> State:
    """What the gate recorded for ``error`` (its mark), else the most cautious guess: FAILED
    only for :class:`NotExecuted` (a connection error may follow another request the body
    sent: AMBIGUOUS unless a vendor key covers it, which a guess cannot see)."""
    outcome = recorded_outcome(error) or (
        Outcome.FAILED if isinstance(error, NotExecuted) else Outcome.AMBIGUOUS)
    return State.FAILED if outcome is Outcome.FAILED else State.AMBIGUOUS


def _noted(enter: Enter | None) -> AbstractContextManager[Any]:
    decision = current_effect()
    attempt = _attempt.get()
    if attempt is not None:
        attempt.decision = decision
    return enter(decision) if enter is not None else contextlib.nullcontext()


def _returned() -> None:
    attempt = _attempt.get()
    if attempt is not None:
        attempt.returned = True


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine to await: a coroutine function, or a callable
    object whose ``__call__`` is one (the test ``gate.effect`` makes), also through a
    ``functools.partial``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own method
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


def effect_type_of(fn: Callable[..., Any], options: dict[str, Any]) -> str:
    """The effect type of ``fn`` declared with ``options``: the ``effect_type`` option, else
    the name ``gate.effect`` gives ``fn`` (a function's name; a ``functools.partial``'s
    function's; a callable object's class name)."""
    explicit = options.get("effect_type")
    if explicit:
        return str(explicit)
    for candidate in (fn, getattr(fn, "func", None), type(fn)):  # as core/decorator.py names it
        name = getattr(candidate, "__qualname__", None)
        if isinstance(name, str) and name:
            return name.rsplit(".", 1)[-1]
    return type(fn).__name__


def gated(gate: Gate, fn: Callable[..., Any], key: str, options: dict[str, Any],
          enter: Enter | None = None) -> Callable[..., Any]:
    """``gate.effect(key, **options)`` around ``fn``, whose body notes its decision in the
    current :class:`Attempt` and runs inside ``enter(decision)`` (an engine's hooks).

    The effect type is passed on explicitly (:func:`effect_type_of`): the wrapper's own name
    must never stand in for the one ``gate.effect`` would give ``fn``."""
    effect = gate.effect(key, **{**options, "effect_type": effect_type_of(fn, options)})
    if is_async(fn):

        @functools.wraps(fn)
        async def abody(*args: Any, **kwargs: Any) -> Any:
            with _noted(enter):
                result = await fn(*args, **kwargs)
            _returned()
            return result

        return effect(abody)

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        with _noted(enter):
            result = fn(*args, **kwargs)
        _returned()
        return result

    return effect(body)


def lease_of(gate: Gate, fn: Callable[..., Any], options: dict[str, Any]) -> float:
    """The lease (seconds) an effect of ``fn`` declared with ``options`` is held for: the
    option, else the policy's rule for its effect type (:func:`effect_type_of`), else the
    gate's default."""
    return gate.kind(effect_type_of(fn, options), vendor=options.get("vendor"),
                     lease_seconds=options.get("lease_seconds"),
                     max_attempts=options.get("max_attempts")).lease_seconds


def resolve_hint(gate: Gate, key: str) -> str:
    """The operator's next step for an AMBIGUOUS ``key``, as commands to copy."""
    namespace = "" if gate.namespace == "default" else f" -n {shlex.quote(gate.namespace)}"
    return (f"Check with the vendor, then record what happened: effectgate resolve "
            f"{shlex.quote(key)} --committed (or --failed){namespace}, or Resolve in the "
            "console (effectgate console)")


def unknown_outcome(gate: Gate, key: str, why: str, then: str, *,
                    effect_id: int | None = None) -> EffectAmbiguous:
    """The :class:`EffectAmbiguous` an engine must not retry: what is unknown, the operator's
    next step, and ``then`` (how the engine's run goes on once it is resolved)."""
    return EffectAmbiguous(
        f"{key!r} may or may not have happened ({why}); it is never retried blindly. "
        f"{resolve_hint(gate, key)}; {then}", key=key, state="ambiguous",
        decision="blocked", reason=why, effect_id=effect_id)

