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
    func,
    literal_column,
    select,
)

from ..errors import StoreError
from ..states import ApprovalState
from .listing import glob, like, matches
from .rows import (
    HEAD_COLUMNS,
    ROW_COLUMNS,
    ApprovalRow,
    EffectHead,
    EffectRow,
    approval_row,
    effect_head,
    effect_row,
)
from .schema import (
    ambiguous_since,
    approvals,
    budgets,
    db_now,
    effects,
    in_flight_lapsed,
    reads_ambiguous,
)

__all__ = ["WINDOW", "ApprovalsPage", "QueuePage", "ambiguous_page", "ambiguous_statement",
           "approvals_page", "compensations_of", "lapsed_in_flight", "oldest_ambiguous",
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
    return (
        select(*[t[name] for name in ROW_COLUMNS], now.label("now"))
        .where(t.id < bindparam("hi", type_=BigInteger),
               t.id >= bindparam("lo", type_=BigInteger),
               namespace == bindparam("namespace", type_=String),
               reads_ambiguous(now))
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
    stmt = select(now - func.min(ambiguous_since())).where(
        t.namespace == namespace, reads_ambiguous(now))
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


def lapsed_in_flight(engine: Engine, namespace: str, limit: int = 500) -> list[EffectHead]:
    """IN_FLIGHT effects of ``namespace`` whose lease has lapsed and which nobody has marked
    AMBIGUOUS yet (oldest first, at most ``limit``): what a sweeper lapses and announces. (A
    scan of the namespace, as counting by state is: run every few seconds, not per call.)"""
    t = effects.c
    now = db_now()
    stmt = (select(*[t[name] for name in HEAD_COLUMNS], now.label("now"))
            .where(t.namespace == namespace, in_flight_lapsed(now))
            .order_by(t.id).limit(limit))
    try:
        with engine.connect() as conn:
            return [effect_head(r) for r in conn.execute(stmt)]
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err


class ApprovalsPage(NamedTuple):
    """Approval requests newest first; ``total`` how many match in all; ``next_before`` the
    cursor (requested-at, id) of the next page, None when nothing older is left."""

    rows: list[ApprovalRow]
    total: int
    next_before: tuple[float, str] | None


def approvals_page(engine: Engine, namespace: str, *, state: ApprovalState | None,
                   key_prefix: str | None = None, effect_type: str | None = None,
                   requested_by: str | None = None, run_id: str | None = None,
                   before: tuple[float, str] | None = None, limit: int = 50) -> ApprovalsPage:
    """One page of a namespace's approval requests, newest first by the time they were
    requested. ``state`` as people read it (EXPIRED: pending or approved past its expiry;
    PENDING and APPROVED: not expired; None: any). ``effect_type`` may be a glob; ``key_prefix``
    matches the start of the key literally; the others are exact."""
    a = approvals.c
    now = db_now()
    where: Any = a.namespace == namespace
    live = (a.state.in_((ApprovalState.PENDING.value, ApprovalState.APPROVED.value)))
    if state is ApprovalState.EXPIRED:
        where = where & live & (a.expires_at < now)
    elif state in (ApprovalState.PENDING, ApprovalState.APPROVED):
        where = where & (a.state == state.value) & (a.expires_at >= now)
    elif state is not None:
        where = where & (a.state == state.value)
    dialect = engine.dialect.name
    if key_prefix is not None:
        where = where & matches(a.key, dialect, like(key_prefix, glob=False) + "%",
                                glob(key_prefix, wildcards=False) + "*")
    if effect_type is not None:
        where = where & matches(a.effect_type, dialect, like(effect_type), glob(effect_type))
    if requested_by is not None:
        where = where & (a.requested_by == requested_by)
    if run_id is not None:
        where = where & (a.run_id == run_id)
    page = where
    if before is not None:
        at, ident = before
        page = page & ((a.created_at < at) | ((a.created_at == at) & (a.id > ident)))
    stmt = (select(*approvals.c, now.label("now")).where(page)
            .order_by(a.created_at.desc(), a.id).limit(limit + 1))
    try:
        with engine.connect() as conn:
            found = [approval_row(r) for r in conn.execute(stmt)]
            total = int(conn.execute(select(func.count()).where(where)).scalar() or 0)
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
    more = len(found) > limit
    rows = found[:limit]
    cursor = (rows[-1].created_at, rows[-1].id) if more and rows else None
    return ApprovalsPage(rows, total, cursor)


def compensations_of(engine: Engine, namespace: str,
                     wanted: dict[str, tuple[int, str]]) -> dict[int, EffectRow]:
    """The undo of saga steps, by the step's id: ``wanted`` maps each key a step's undo may be
    at (``undo_keys`` of the step) to the step's effect id and its undo's effect type; an
    effect found at such a key counts only if its ``compensates_effect_id`` is the step (one
    made there for anything else is not its undo), and where two of a step's keys hold one,
    the one of its undo's type. One read of the unique key per 500 steps."""
    t = effects.c
    keys = list(wanted)
    out: dict[int, EffectRow] = {}
    try:
        with engine.connect() as conn:
            for start in range(0, len(keys), 500):
                chunk = keys[start:start + 500]
                stmt = select(*[t[name] for name in ROW_COLUMNS], db_now().label("now")).where(
                    t.namespace == namespace, t.key.in_(chunk))
                for r in conn.execute(stmt):
                    row = effect_row(r)
                    step, undo_type = wanted.get(row.key, (None, ""))
                    if step is not None and row.compensates_effect_id == step and (
                            step not in out or row.effect_type == undo_type):
                        out[step] = row
    except Exception as err:
        raise StoreError(f"the store failed: {type(err).__name__}") from err
    return out
