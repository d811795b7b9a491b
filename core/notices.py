"""What the gate tells an observer that a person should hear about: a new approval request, an
effect that became AMBIGUOUS, a spend ceiling that cannot fire.

The kernel builds a :class:`Notice` at the moment it observes one of these (``flow`` when it
requests an approval, lapses a lease or passes a budget warning; ``gate`` when a holder reports
``ambiguous``) and hands it to the gate's observer — :class:`effectgate.webhooks.Webhooks` —
which must return at once (it queues; it never does I/O on the caller's thread). A notice
carries names and ids only: never a payload, a result or a lease secret.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["AMBIGUOUS", "APPROVAL_REQUIRED", "BUDGET_WARNING", "EVENTS", "Notice", "Observer",
           "notice", "reported"]

APPROVAL_REQUIRED = "approval_required"
AMBIGUOUS = "ambiguous"
BUDGET_WARNING = "budget_warning"
EVENTS = (APPROVAL_REQUIRED, AMBIGUOUS, BUDGET_WARNING)


class Notice(NamedTuple):
    """One event for people. ``store`` is where the effect lives (an observer may read the
    fields a report did not know, off the caller's thread); it is never serialised."""

    event: str
    namespace: str
    key: str
    effect_type: str | None = None
    effect_id: int | None = None
    attempt: int | None = None
    state: str | None = None
    reason: str | None = None
    approval_id: str | None = None
    run_id: str | None = None
    agent_id: str | None = None
    estimated_cost_micros: int | None = None
    token: int | None = None
    """The fencing token of the attempt it is about, where the maker knew no attempt (a bare
    lease's report): what is read later is read only while the effect is still at it."""
    store: Any = None


Observer = Callable[[Notice], None]


def notice(event: str, row: Any, store: Any = None, **extra: Any) -> Notice:
    """A notice about the effect head ``row`` (an ``EffectHead``), with ``extra`` fields."""
    fields: dict[str, Any] = {
        "effect_type": row.effect_type, "effect_id": row.id, "attempt": row.attempt,
        "state": row.state.value, "reason": row.reason, "approval_id": row.approval_id,
        "estimated_cost_micros": row.estimated_cost_micros,
    }
    fields.update(extra)
    return Notice(event, row.namespace, row.key, store=store, **fields)


def reported(held: Any, key: str, namespace: str, store: Any, reason: str | None) -> Notice:
    """A notice that the holder of ``key`` reported ``ambiguous`` (``held``: its decision,
    whose fields are known, or a bare lease, whose fields an observer reads later)."""
    if hasattr(held, "effect_type"):
        return Notice(AMBIGUOUS, namespace, key, held.effect_type, held.effect_id, held.attempt,
                      "ambiguous", reason, store=store)
    return Notice(AMBIGUOUS, namespace, key, state="ambiguous", reason=reason,
                  token=getattr(held, "token", None), store=store)
