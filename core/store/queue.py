"""The AMBIGUOUS queue as a bounded walk down the primary key.

There is deliberately no index that names ``state`` — not even a partial one (``WHERE state
= 'ambiguous'``): Postgres counts the columns of an index's predicate among the indexed ones,
so such an index makes every transition a non-HOT update, the same +35% per executed effect
that a plain index on ``state`` cost. Instead a page is found by walking ``id`` downwards
from a cursor, one window of ids at a time (each window a range scan of the primary key,
newest first, stopping at ``limit`` rows), for at most ``max_scan`` ids per page. A page
therefore costs the same however large the table grows, and the cursor it returns says where
the next one starts.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Engine,
    Integer,
    String,
    bindparam,
    case,
    func,
    literal_column,
    select,
)

from ..errors import StoreError
from ..states import ApprovalState, State
from .rows import ROW_COLUMNS, ApprovalRow, EffectRow, approval_row, effect_row
from .schema import approvals, budgets, db_now, effects

__all__ = ["WINDOW", "QueuePage", "ambiguous_page", "ambiguous_statement", "oldest_ambiguous",
           "pending_approvals", "spend_counters"]

WINDOW = 25_000


class QueuePage(NamedTuple):
    """AMBIGUOUS effects newest first; ``next_before_id`` is the cursor of the next page
    (None: nothing older is left), ``scanned_to`` the lowest id this page looked at."""

    rows: list[EffectRow]
    next_before_id: int | None
    scanned_to: int


def ambiguous_statement(dialect_name: str) -> Any:
    """The window query: AMBIGUOUS (or lapsed IN_FLIGHT) effects of a namespace with ``lo <=
    id < hi``, newest first, at most ``limit``. On SQLite the namespace is compared as
    ``+namespace`` (a unary plus: SQLite's documented way to keep a term off an index), or
    its planner walks the whole namespace through the unique key and sorts it."""
    t = effects.c
    now = db_now()
    namespace: Any = (literal_column("+effectgate_effects.namespace", String)
                      if dialect_name == "sqlite" else t.namespace)
    lapsed = (t.state == State.IN_FLIGHT.value) & (t.lease_expires_at < now)
    return (
        select(*[t[name] for name in ROW_COLUMNS], now.label("now"))
        .where(t.id < bindparam("hi", type_=BigInteger),
               t.id >= bindparam("lo", type_=BigInteger),
               namespace == bindparam("namespace", type_=String),
               (t.state == State.AMBIGUOUS.value) | lapsed)
        .order_by(t.id.desc())
        .limit(bindparam("limit", type_=Integer))
    )


def ambiguous_page(engine: Engine, namespace: str, *, before_id: int | None, limit: int,
                   max_scan: int = 4 * WINDOW) -> QueuePage:
    """One page of the queue (see the module's docstring)."""
    stmt = ambiguous_statement(engine.dialect.name)
    try:
        with engine.connect() as conn:
            hi = before_id
            if hi is None:
                top = conn.execute(select(func.max(effects.c.id))).scalar()
                hi = int(top or 0) + 1
            rows: list[EffectRow] = []
            floor = max(1, hi - max_scan)
            while hi > floor and len(rows) < limit:
                lo = max(floor, hi - WINDOW)
                found = conn.execute(stmt, {"namespace": namespace, "lo": lo, "hi": hi,
                                            "limit": limit - len(rows)})
                rows.extend(effect_row(r) for r in found)
                hi = lo
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
    if len(rows) >= limit:
        return QueuePage(rows, rows[-1].id, rows[-1].id)
    return QueuePage(rows, hi if hi > 1 else None, hi)


def oldest_ambiguous(engine: Engine, namespace: str) -> float | None:
    """Seconds since the oldest AMBIGUOUS (or lapsed IN_FLIGHT) effect became so, or None.
    (A scan of the namespace, as counting by state is: for the overview, not per call.)"""
    t = effects.c
    now = db_now()
    since = func.min(case((t.state == State.AMBIGUOUS.value, t.updated_at),
                          else_=t.lease_expires_at))
    stmt = select(now - since).where(
        t.namespace == namespace,
        (t.state == State.AMBIGUOUS.value)
        | ((t.state == State.IN_FLIGHT.value) & (t.lease_expires_at < now)))
    try:
        with engine.connect() as conn:
            value = conn.execute(stmt).scalar()
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
    return None if value is None else float(value)


def spend_counters(engine: Engine, namespace: str, limit: int = 50,
                   ) -> list[tuple[str, int, float]]:
    """The namespace's spend counters (scope key, micros spent, last change), most recently
    changed first."""
    b = budgets.c
    stmt = (select(b.scope_key, b.spent_micros, b.updated_at).where(b.namespace == namespace)
            .order_by(b.updated_at.desc()).limit(limit))
    try:
        with engine.connect() as conn:
            return [(str(k), int(v), float(at)) for k, v, at in conn.execute(stmt)]
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err


def pending_approvals(engine: Engine, namespace: str, limit: int = 200,
                      ) -> tuple[list[ApprovalRow], int]:
    """The namespace's pending, unexpired approval requests, newest first (at most
    ``limit``), and how many there are in all."""
    a = approvals.c
    now = db_now()
    waiting = ((a.namespace == namespace) & (a.state == ApprovalState.PENDING.value)
               & (a.expires_at >= now))
    rows = (select(*approvals.c, now.label("now")).where(waiting)
            .order_by(a.created_at.desc(), a.id).limit(limit))
    try:
        with engine.connect() as conn:
            found = [approval_row(r) for r in conn.execute(rows)]
            total = int(conn.execute(select(func.count()).where(waiting)).scalar() or 0)
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
    return found, total
