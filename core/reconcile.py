"""Reconcile hooks: ask the vendor what happened to an AMBIGUOUS effect.

A hook is ``fn(record) -> "committed" | "failed" | "unknown" | Reconciled`` (or an ``async
def`` returning the same), registered with ``@gate.reconciler("payment.refund")``. A ``begin``
that meets an AMBIGUOUS effect of that type calls it — for a lapsed lease only after the grace
period (the lease again, unless the policy says ``reconcile_grace_seconds``), since the holder
may be slow rather than dead and the vendor may not have seen its request yet. ``committed``
settles the effect with ``result`` (a repeat then returns it); ``failed`` lets a new attempt run
under the *same* vendor idempotency key (so the vendor still deduplicates a late request from
the old holder); ``unknown``, an exception or an answer that cannot be stored leaves it
AMBIGUOUS, and the ``begin`` answers ``blocked``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import ConfigError
from .states import Outcome

if TYPE_CHECKING:
    from .records import EffectRecord

__all__ = ["Reconciled", "Reconciler", "verdict"]


class Reconciled(NamedTuple):
    """A reconcile hook's verdict: ``committed`` (with the vendor's ``result``), ``failed`` or
    ``unknown``, and an optional ``note`` for the history."""

    outcome: str
    result: Any = None
    note: str | None = None


Reconciler = Callable[["EffectRecord"], "Reconciled | str | Awaitable[Reconciled | str]"]


def verdict(answer: object) -> Reconciled | None:
    """A hook's answer as a :class:`Reconciled` whose outcome is committed or failed, or None
    for unknown; :class:`ConfigError` for anything else."""
    if isinstance(answer, str):
        answer = Reconciled(answer)
    if not isinstance(answer, Reconciled):
        raise ConfigError(
            f"a reconcile hook returns 'committed', 'failed', 'unknown' or eg.Reconciled, not "
            f"{type(answer).__name__}")
    outcome = answer.outcome.lower() if isinstance(answer.outcome, str) else answer.outcome
    if outcome == "unknown" or outcome == Outcome.AMBIGUOUS.value:
        return None
    if outcome not in (Outcome.COMMITTED.value, Outcome.FAILED.value):
        raise ConfigError(f"a reconcile hook's outcome is committed, failed or unknown, not "
                          f"{answer.outcome!r}")
    if answer.note is not None and not isinstance(answer.note, str):
        raise ConfigError("a reconcile hook's note is a str")
    return Reconciled(outcome, answer.result, answer.note)
