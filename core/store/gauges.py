"""The few numbers an operator alerts on, read cheaply from the store when a metrics reader
collects them (see :mod:`effectgate.telemetry`): how many effects are AMBIGUOUS and since when,
how many approvals wait, and what the spend counters hold.

One aggregate statement for the effects and approvals, one bounded read of the spend counters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import func, select

from ..states import ApprovalState
from .connections import store_error
from .schema import ambiguous_since, approvals, budgets, db_now, effects, reads_ambiguous

if TYPE_CHECKING:
    from . import Store

__all__ = ["Gauges", "read_gauges", "read_spend"]

_SPEND_WINDOW = 86_400.0  # counters touched in the last day
_SPEND_ROWS = 1000  # the largest counters read per collection, at most


class Gauges(NamedTuple):
    """One namespace's waiting work: AMBIGUOUS effects (a lapsed IN_FLIGHT lease counts), the
    age in seconds of the oldest one (0 when none), and pending unexpired approvals."""

    ambiguous: int
    oldest_ambiguous_age: float
    pending_approvals: int


def read_gauges(store: Store, namespace: str) -> Gauges:
    """The AMBIGUOUS count and oldest age, and the pending approvals, in one statement."""
    t, a = effects.c, approvals.c
    now = db_now()
    waiting = select(func.count()).where(
        a.namespace == namespace, a.state == ApprovalState.PENDING.value,
        a.expires_at > now).scalar_subquery()
    stmt = select(func.count(), func.min(ambiguous_since()), now, waiting).where(
        t.namespace == namespace, reads_ambiguous(now))
    try:
        with store.engine.connect() as conn:
            count, oldest, clock, pending = conn.execute(stmt).one()
    except Exception as err:
        raise store_error(err, writing=False) from err
    age = 0.0 if oldest is None else max(0.0, float(clock) - float(oldest))
    return Gauges(int(count or 0), age, int(pending or 0))


def read_spend(store: Store, namespace: str) -> list[tuple[str, int]]:
    """(scope key, spent micros) of the spend counters touched in the last day, largest
    first, at most a bounded number."""
    b = budgets.c
    stmt = (select(b.scope_key, b.spent_micros)
            .where(b.namespace == namespace, b.updated_at > db_now() - _SPEND_WINDOW)
            .order_by(b.spent_micros.desc()).limit(_SPEND_ROWS))
    try:
        with store.engine.connect() as conn:
            return [(str(k), int(v)) for k, v in conn.execute(stmt)]
    except Exception as err:
        raise store_error(err, writing=False) from err
