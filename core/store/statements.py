"""Every statement of the per-call path, written once with SQLAlchemy Core and compiled once
per dialect (:mod:`effectgate.store.sql` holds the texts the store runs; SQLite's are rendered
ahead of time). Bind parameter names are this module's and the store's business only.

Compare-and-set is the rule for every transition: an update names the state (and fencing
token) it expects, and does nothing when another writer moved the effect first. A holder's own
writes (report, extend) are found by the holder's proof — namespace, key, token and the hash of
the secret issued with its lease — never by an effect id.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    String,
    Text,
    case,
    cast,
    false,
    func,
    literal_column,
    null,
    select,
    true,
)
from sqlalchemy import bindparam as p
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.expression import ColumnElement

from ..states import ApprovalState, State
from ..validate import MAX_INT
from . import history
from .binds import BARE_NAMES, BARE_OMITS, NULL_NOTE
from .pg_reserve import ReserveFunction
from .rows import BRIEF_COLUMNS, FOUND_COLUMNS, HEAD_COLUMNS, ROW_COLUMNS
from .schema import (
    approvals,
    budgets,
    db_clock,
    db_day,
    db_now,
    effects,
    in_flight_lapsed,
    in_flight_live,
    literal,
)
from .sql import NAMES, Sql, Statements, StoredFunction

__all__ = ["build", "pg_texts_source", "render_postgres", "render_sqlite", "sqlite_texts_source"]


_ONE: ColumnElement[int] = literal_column("1")


def _state(state: State | ApprovalState) -> ColumnElement[str]:
    return literal(state.value)


def build(dialect: Any, dialect_name: str, durability: str = "reserve") -> Statements:
    """The statements for ``dialect`` and ``durability``, each compiled the first time it is
    used (use :func:`~effectgate.store.sql.statements_for`: one set per process)."""
    return _Definitions(dialect, dialect_name, durability).statements()


class _Definitions:
    """Every per-call statement, written once; ``lazy`` maps each name to its definition."""

    reserve_function: ReserveFunction | None
    bare_function: ReserveFunction | None
    governed_function: ReserveFunction | None

    def __init__(self, dialect: Any, dialect_name: str, durability: str = "reserve") -> None:
        lazy: dict[str, Callable[[], ClauseElement]] = {}
        self.lazy = lazy
        self.dialect = dialect
        now = db_now()
        # Postgres: a write that may ride on the next sync commits asynchronously, for its own
        # transaction only (``set_config(..., is_local)`` in the statement itself: no extra
        # round trip). Reservations always commit synchronously unless durability="relaxed".
        pg = dialect_name == "postgresql"
        rides = pg and durability == "reserve"  # "relaxed": the whole session rides
        ride: Any = (func.set_config(literal("synchronous_commit"), literal("off"), true())
                     .is_not(None)) if rides else true()
        t = effects.c
        head = [t[name] for name in HEAD_COLUMNS] + [now.label("now")]
        full = [t[name] for name in ROW_COLUMNS] + [now.label("now")]
        found = [t[name] for name in FOUND_COLUMNS] + [now.label("now")]
        in_ns = t.namespace == p("namespace")
        by_key = in_ns & (t.key == p("key"))
        ambiguous = _state(State.AMBIGUOUS)
        line = history.append
        starts = p("state") == _state(State.IN_FLIGHT)  # does the move start an attempt?

        insert_values = {
            "namespace": p("namespace"),
            "key": p("key"),
            "effect_type": p("effect_type"),
            "payload_hash": p("payload_hash"),
            "state": p("state"),
            "attempt": literal_column("1"),
            "token": literal_column("1"),
            "lease_expires_at": db_clock() + p("lease_seconds"),  # after any lock wait
            "attempt_started_at": now,
            "created_at": now,
            "updated_at": now,
            "reason": p("reason"),
            "run_id": p("run_id"),
            "agent_id": p("agent_id"),
            "group_key": p("group_key"),
            "compensation": p("compensation"),
            "compensates_effect_id": p("compensates_effect_id"),
            "vendor": p("vendor"),
            "vendor_attempt": literal_column("1"),
            "vendor_since": case((starts, now), else_=null()),
            "estimated_cost_micros": p("estimated_cost_micros"),
            "approval_id": p("approval_id"),
            "budget_keys": p("budget_keys"),
            "actor": p("actor"),
            "note": p("note"),
            "lease_secret": p("lease_secret"),
            "history": line(literal(""), p("state"), literal_column("1"), first=True),
        }
        dialect_insert: Any
        if dialect_name == "postgresql":  # each dialect's module only where it is used
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        else:
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        insert = (
            dialect_insert(effects)
            .values(insert_values)
            .on_conflict_do_nothing(index_elements=[t.namespace, t.key])
        )
        lazy["fetch"] = lambda: select(*found).where(by_key)
        # A reservation's first read (SQLite): in full only what a repeat of a COMMITTED effect
        # answers with, and the vendor key its attempt used, packed in one text that is NULL
        # without a vendor (each column a driver hands up costs as much as a cheap Python
        # call; another state is read again in full).
        since = func.coalesce(t.vendor_since, t.attempt_started_at, t.created_at)
        vendor_tail = case((t.vendor.is_not(None), (
            t.vendor + literal(" ") + cast(func.coalesce(t.vendor_attempt, t.attempt), String)
            + literal(" ") + cast(now - since, String))))  # (a CASE: no clock read without)
        brief = [t[name] for name in BRIEF_COLUMNS] + [vendor_tail.label("vendor_tail")]
        lazy["fetch_brief"] = lambda: select(*brief).where(by_key)
        lazy["fetch_row"] = lambda: select(*full).where(by_key)
        lazy["fetch_row_id"] = lambda: select(*full).where(in_ns & (t.id == p("id")))
        # Postgres: a governed move of an existing effect locks its row before it charges the
        # counters, in the order every report and resolve takes them (row, then counters):
        # the other order deadlocked against an operator's resolve (SQLSTATE 40P01).
        lazy["lock_row"] = lambda: (
            select(t.id).where(in_ns & (t.id == p("id"))).with_for_update())
        lazy["insert"] = lambda: insert.returning(*head, true().label("inserted"))
        # The reservation of a new key only needs what the store decided: id, lease, clock.
        lazy["insert_lean"] = lambda: insert.returning(t.id, t.lease_expires_at, now)
        # The same for a request that carries none of the optional fields: SQLite binds and
        # stores every column an insert lists, NULL or not (the bare one costs ~45% less), and
        # what is always the same is written into the text (each bind costs the driver).
        in_flight, none = _state(State.IN_FLIGHT), literal(NULL_NOTE)
        bare = {k: v for k, v in insert_values.items() if k not in BARE_OMITS} | {
            "state": in_flight, "vendor_since": now,
            "history": line(literal(""), in_flight, literal_column("1"), none, first=True,
                            note=none)}
        lazy["insert_bare"] = lambda: (
            dialect_insert(effects).values(bare)
            .on_conflict_do_nothing(index_elements=[t.namespace, t.key])
            .returning(t.id, t.lease_expires_at, now)
        )
        # Postgres: read-if-present, else insert, in one round trip: the two statements above
        # run inside a function generated from them (see pg_reserve).
        reserve_columns = [(c.name, str(c.type.compile(dialect=dialect))) for c in head[:-1]] + [
            ("now", "double precision"), ("inserted", "boolean")]
        self.reserve_function = ReserveFunction(
            select(*head, false().label("inserted")).where(by_key),
            insert.returning(*head, true().label("inserted")),
            dialect, reserve_columns,
        ) if pg else None
        # The same for a bare request (is_bare): its six binds by position, the rest in its
        # text. A refusal sends every bind of the reservation it might have been, and each one
        # costs the driver and the server: a third of the gap to a plain read.
        self.bare_function = ReserveFunction(
            select(*head, false().label("inserted")).where(by_key),
            dialect_insert(effects).values(bare)
            .on_conflict_do_nothing(index_elements=[t.namespace, t.key])
            .returning(*head, true().label("inserted")),
            dialect, reserve_columns, prefix="effectgate_bare_", order=BARE_NAMES,
        ) if pg else None

        cas = in_ns & (t.id == p("id")) & (t.token == p("token"))
        live = in_flight_live(now)
        holder = by_key & (t.token == p("token")) & (t.lease_secret == p("lease_secret"))
        # A begin moving an existing effect on: a new attempt on a FAILED effect, an approved
        # one starting, or a governed refusal (PENDING_APPROVAL, DENIED). A new token (and, for
        # an attempt, a new lease secret) each time; the vendor key is kept as it was, and the
        # vendor's reference (which names the attempt it was recorded for) is cleared. What the
        # attempt declares (run, agent, saga group and undo, cost, vendor) is its own.
        # On Postgres the take locks its row first (a sub-select FOR UPDATE): an UPDATE
        # computes its values, the lease among them, before it waits on a row lock, and a
        # governed move's lock (``lock_row``) rolled back after a wait left a take that had
        # waited on it a lease shortened by the wait. The sub-select waits, then the values.
        row = effects.alias("row_lock")
        locked = (t.id == select(row.c.id).where(
            (row.c.namespace == p("namespace")) & (row.c.id == p("id"))
        ).with_for_update().scalar_subquery()) if pg else true()
        lazy["take"] = lambda: (
            effects.update()
            .where(cas & (t.state == p("expected_state")) & locked)
            .values(
                history=line(t.state, p("state"), t.token + _ONE),
                state=p("state"),
                approval_id=p("approval_id"),
                budget_keys=p("budget_keys"),
                attempt=t.attempt + p("attempt_increment"),
                token=t.token + _ONE,
                lease_expires_at=db_clock() + p("lease_seconds"),
                attempt_started_at=now,
                updated_at=now,
                result=null(),
                error=null(),
                reason=p("reason"),
                run_id=p("run_id"),
                agent_id=p("agent_id"),
                group_key=p("group_key"),  # the saga this attempt is a step of, and its undo
                compensation=p("compensation"),
                compensates_effect_id=p("compensates_effect_id"),
                estimated_cost_micros=p("estimated_cost_micros"),
                actual_cost_micros=null(),
                vendor=p("vendor"),
                vendor_ref=null(),
                vendor_since=case((starts, func.coalesce(t.vendor_since, now)),
                                  else_=t.vendor_since),
                actor=p("actor"),
                note=p("note"),
                lease_secret=p("lease_secret"),
                pruned_at=null(),  # a pruned tombstone that moves on is live again
            )
            .returning(*head)
        )
        lazy["lapse"] = lambda: (
            effects.update()
            .where(cas & in_flight_lapsed(now) & ride)
            .values(state=ambiguous, reason=literal("lease lapsed"), updated_at=now,
                    actor=literal("lease"), note=null(),
                    history=line(t.state, ambiguous, t.token, literal('"lease"')))
            .returning(*head)
        )
        # The holder's outcome. A FAILED its holder proves moves the next attempt to a new
        # vendor key (a vendor that stored its answer to the old key, a declined card, would
        # replay it), unless the current key was kept from an earlier attempt (whose holder
        # may still send it), or a built-in classifier inferred the FAILED
        # (``keeps_vendor_key``): the vendor never saw the request it judged, and when the
        # body had sent another first, the vendor deduplicates the retry by the key.
        proved = (p("state") == _state(State.FAILED)) & (t.vendor_attempt == t.attempt) & (
            ~p("keeps_vendor_key", type_=Boolean))

        def outcome(where: Any, note: Any, *, returning: bool = True) -> Any:
            stmt = (
                effects.update()
                .where(where)
                .values(
                    history=line(t.state, p("state"), t.token, literal("null")),
                    state=p("state"),
                    result=p("result"),
                    error=p("error"),
                    reason=p("reason"),
                    actual_cost_micros=p("actual_cost_micros"),
                    lease_expires_at=null(),
                    updated_at=now,
                    actor=null(),
                    note=note,
                    vendor_attempt=case((proved, t.attempt + _ONE), else_=t.vendor_attempt),
                    vendor_since=case((proved, null()), else_=t.vendor_since),
                )
            )
            return stmt.returning(t.budget_keys, t.estimated_cost_micros) if returning else stmt

        lazy["report"] = lambda: outcome(holder & live & ride, null())
        # The same when the attempt moves no spend: only whether it landed matters (the row
        # count; SQLite's RETURNING costs a quarter of the update).
        lazy["report_plain"] = lambda: outcome(holder & live & ride, null(), returning=False)
        # The same for the common report, COMMITTED with nothing but its result (the
        # decorator's): what is always the same written into the text, and a committed
        # outcome leaves the vendor key as it is.
        done = _state(State.COMMITTED)
        lazy["report_committed"] = lambda: (
            effects.update()
            .where(holder & live & ride)
            .values(history=line(t.state, done, t.token, literal("null"), note=literal(NULL_NOTE)),
                    state=done, result=p("result"), error=null(), reason=null(),
                    actual_cost_micros=null(), lease_expires_at=null(), updated_at=now,
                    actor=null(), note=null())
        )
        # The lapsed holder's own late report settles its AMBIGUOUS effect, as long as nobody
        # has held or resolved it since (the token would have moved on).
        lapsed = in_flight_lapsed(now) | (
            (t.state == ambiguous) & t.lease_expires_at.is_not(None))
        lazy["report_late"] = lambda: outcome(holder & lapsed & ride, literal("late report"))
        lazy["extend"] = lambda: (
            effects.update()
            .where(holder & live & ride)
            .values(lease_expires_at=db_clock() + p("lease_seconds"), updated_at=now,
                    vendor_ref=func.coalesce(p("vendor_ref"), t.vendor_ref))
            .returning(t.lease_expires_at)
        )
        # Not on a lease its holder extended since the resolve read it lapsed (the extend
        # committed while this waited on the row's lock), unless forced.
        lazy["resolve"] = lambda: (
            effects.update()
            .where(cas & (t.state == p("expected_state"))
                   & (p("forced", type_=Boolean) | ~in_flight_live(now)))
            .values(
                history=line(t.state, p("state"), t.token + _ONE),
                state=p("state"),
                token=t.token + _ONE,
                result=p("result"),
                error=p("error"),
                reason=p("reason"),
                lease_expires_at=null(),
                updated_at=now,
                actor=p("actor"),
                note=p("note"),
                pruned_at=null(),
                vendor_attempt=case(
                    ((p("state") == _state(State.COMMITTED)) & (t.vendor_attempt > t.attempt),
                     t.attempt), else_=t.vendor_attempt),
            )
            .returning(*full)
        )
        lazy["now"] = lambda: select(now)

        # Retention: settled effects last changed before the cut lose their results, errors,
        # notes and history (the tombstone stays); approvals go with their pruned effect, or
        # lose their arguments once expired.
        settled = [_state(s) for s in (State.COMMITTED, State.FAILED, State.DENIED)]
        cut = now - p("older_than")
        old = in_ns & (t.updated_at <= cut) & t.state.in_(settled) & t.pruned_at.is_(None)
        a = approvals.c
        lazy["prune_count"] = lambda: select(func.count()).select_from(effects).where(old)
        lazy["prune"] = lambda: (
            effects.update().where(old)
            .values(result=null(), error=null(), note=null(), history=null(), vendor_ref=null(),
                    pruned_at=now)
            .returning(t.id)
        )
        pruned_ids = select(t.id).where(in_ns & t.pruned_at.is_not(None) & t.state.in_(settled))
        lazy["prune_approvals"] = lambda: approvals.delete().where(
            (a.namespace == p("namespace")) & a.effect_id.in_(pruned_ids)
            & a.state.in_([_state(s) for s in (ApprovalState.CONSUMED, ApprovalState.DENIED,
                                                ApprovalState.APPROVED, ApprovalState.PENDING)])
            & (a.created_at < cut))
        lazy["prune_arguments"] = lambda: (
            approvals.update()
            .where((a.namespace == p("namespace")) & (a.expires_at < now)
                   & a.arguments.is_not(None))
            .values(arguments=null())
        )

        # Spend: a charge against one ceiling is counted only while the sum stays within the
        # limit; a per-day ceiling's counter is named by the store's UTC date.
        b = budgets.c

        def charge(scope_key: Any) -> Any:
            return (
                dialect_insert(budgets)
                .values(namespace=p("namespace"), scope_key=scope_key, spent_micros=p("cost"),
                        updated_at=now)
                .on_conflict_do_update(
                    index_elements=[b.namespace, b.scope_key],
                    set_={"spent_micros": b.spent_micros + p("cost"), "updated_at": now},
                    # spent + cost <= limit, written so that nothing can pass a BIGINT
                    # (cost <= limit is checked first, so limit - cost >= 0).
                    where=b.spent_micros <= p("limit", type_=BigInteger()) - p(
                        "cost", type_=BigInteger()),
                )
                .returning(b.scope_key, b.spent_micros)
            )

        charges = (charge(p("scope_key")), charge(p("scope_key") + db_day()))
        lazy["charge"], lazy["charge_day"] = (lambda: charges[0]), (lambda: charges[1])
        # Postgres: a governed reservation of a new key — read, else charge every ceiling,
        # else insert — in one round trip (see pg_reserve).
        self.governed_function = ReserveFunction(
            select(*head, false().label("inserted")).where(by_key),
            insert.returning(*head, true().label("inserted")),
            dialect, reserve_columns, prefix="effectgate_governed_", charges=charges,
        ) if pg else None
        # A counter moved by an actual cost or a resolution stops at the most a BIGINT holds
        # (over every ceiling) rather than overflowing: ``room`` is how far it may rise before
        # that (adjust_binds).
        lazy["adjust"] = lambda: (
            budgets.update()
            .where((b.namespace == p("namespace")) & (b.scope_key == p("scope_key")))
            .values(spent_micros=case(
                (b.spent_micros > p("room", type_=BigInteger()), literal_column(str(MAX_INT))),
                else_=b.spent_micros + p("delta", type_=BigInteger())),
                    updated_at=now)
            .returning(b.scope_key, b.spent_micros)
        )
        # A committed attempt that cost more than its estimate and pushed a counter past its
        # ceiling says so in its record (the money was spent; nobody may miss it).
        lazy["note_reason"] = lambda: (
            effects.update()
            .where((t.namespace == p("namespace")) & (t.key == p("key"))
                   & (t.token == p("token")))
            .values(reason=p("reason"))
        )

        a = approvals.c
        mine = (a.namespace == p("namespace")) & (a.id == p("approval_id"))
        pending, approved = _state(ApprovalState.PENDING), _state(ApprovalState.APPROVED)
        lazy["approval_insert"] = lambda: (
            approvals.insert().values(
                id=p("approval_id"), namespace=p("namespace"), effect_id=p("effect_id"),
                effect_type=p("effect_type"), key=p("key"), payload_hash=p("payload_hash"),
                state=pending, requested_by=p("agent_id"), run_id=p("run_id"),
                estimated_cost_micros=p("estimated_cost_micros"),
                allow_self_approval=p("allow_self_approval"), created_at=now,
                expires_at=now + p("expires_seconds"), arguments=p("arguments"),
            )
        )
        lazy["approval_get"] = lambda: select(*approvals.c, now.label("now")).where(mine)
        # A decision clears the arguments: the approver has seen them; they are not kept.
        lazy["approval_decide"] = lambda: (
            approvals.update()
            .where(mine & (a.state == pending) & (a.expires_at >= now))
            .values(state=p("state"), decided_by=p("by"), decided_at=now, reason=p("reason"),
                    arguments=null())
            .returning(a.id)
        )
        lazy["approval_consume"] = lambda: (
            approvals.update()
            .where(mine & (a.state == approved) & (a.expires_at >= now)
                   & (a.effect_type == p("effect_type")) & (a.key == p("key"))
                   & (a.payload_hash == p("payload_hash")))
            .values(state=_state(ApprovalState.CONSUMED), arguments=null())
            .returning(a.id)
        )
        # A request its effect was decided on again without (a call declaring a cost its
        # approver did not see asks anew) can never run anything: one still live ends here,
        # its expiry moved to the millisecond before this write (live through its expiry's
        # instant; SQLite's clock counts milliseconds), so it reads EXPIRED from now on, with
        # ``reason`` saying why (ahead of an approver's note). One already expired keeps its
        # expiry. Either way its arguments go.
        still_live = a.state.in_((pending, approved)) & (a.expires_at >= now)
        why = p("reason", type_=Text())
        lazy["approval_forget"] = lambda: approvals.update().where(mine).values(
            arguments=null(),
            expires_at=case((still_live, now - literal_column("0.001")), else_=a.expires_at),
            reason=case((still_live & a.reason.is_(None), why),
                        (still_live, why + literal("; the approver noted ") + a.reason),
                        else_=a.reason),
        )
        # A consumed approval given back (Store.unconsume): its begin's caller never took the
        # answer, so the body never ran and the human's yes still stands.
        lazy["approval_restore"] = lambda: (
            approvals.update()
            .where(mine & (a.state == _state(ApprovalState.CONSUMED)))
            .values(state=approved)
            .returning(a.id)
        )

    def statements(self) -> Statements:
        """The set, compiling each definition on first use."""
        dialect = self.dialect
        return Statements(
            {name: partial(_compiled, define, dialect) for name, define in self.lazy.items()},
            reserve_function=_stored(self.reserve_function),
            bare_function=_stored(self.bare_function),
            governed_function=_stored(self.governed_function))


def _stored(function: ReserveFunction | None) -> StoredFunction | None:
    return None if function is None else StoredFunction(function.name, function.ddl,
                                                         function.call, function.order)


def _compiled(define: Callable[[], ClauseElement], dialect: Any) -> Sql:
    return Sql(define(), dialect)


def render_sqlite() -> dict[str, str]:
    """Every statement's text on SQLite, compiled now (what ``sqlite_texts`` must hold)."""
    from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

    sql = build(sqlite_dialect(paramstyle="named"), "sqlite")
    return {name: getattr(sql, name).text for name in NAMES}


def sqlite_texts_source() -> str:
    """The source of :mod:`effectgate.store.sqlite_texts` as this version renders it: every
    statement's SQLite text, and the columns of every table (what an embedded store checks
    at open). ``tests/test_store_statements.py`` fails when the file differs from it."""
    from .schema import audit, meta, principals, sessions

    lines = ['"""SQLite\'s per-call statements and table columns, rendered ahead of time from',
             ":mod:`effectgate.store.statements` and :mod:`effectgate.store.schema` (generated:",
             "``tests/test_store_statements.py`` pins this file to them and says how to write it",
             'again), so that an embedded store runs without importing SQLAlchemy."""', "",
             "from __future__ import annotations", "",
             '__all__ = ["COLUMNS", "TEXTS"]', "", "TEXTS: dict[str, str] = {"]
    lines += [f"    {name!r}: {text!r}," for name, text in render_sqlite().items()]
    lines += ["}", "", "# Every column of every table, by table: a store at this schema version has"
              " them all.", "COLUMNS: dict[str, frozenset[str]] = {"]
    for table in (effects, approvals, budgets, principals, sessions, audit, meta):
        names = ", ".join(repr(c.name) for c in sorted(table.c, key=lambda c: c.name))
        lines.append(f"    {table.name!r}: frozenset(({names})),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_postgres() -> tuple[dict[str, str], dict[str, str], dict[str, StoredFunction]]:
    """Every statement's text on Postgres (psycopg), compiled now: at the default durability,
    the ones that differ at ``"all"`` and ``"relaxed"`` (the same at both: an outcome rides
    on the next synchronous commit only at the default), and the three generated functions
    (the same at every durability). What ``pg_texts`` must hold."""
    from sqlalchemy.dialects.postgresql import psycopg

    dialect = psycopg.dialect()  # type: ignore[no-untyped-call]
    made = {d: build(dialect, "postgresql", d) for d in ("reserve", "all", "relaxed")}
    texts = {d: {name: getattr(sql, name).text for name in NAMES} for d, sql in made.items()}
    assert texts["all"] == texts["relaxed"]
    steady = {name: text for name, text in texts["all"].items()
              if text != texts["reserve"][name]}
    functions = {}
    for which in ("reserve_function", "bare_function", "governed_function"):
        found = {getattr(sql, which) for sql in made.values()}
        assert len(found) == 1, which
        functions[which] = found.pop()
    return texts["reserve"], steady, functions


def pg_texts_source() -> str:
    """The source of :mod:`effectgate.store.pg_texts` as this version renders it.
    ``tests/test_store_statements.py`` fails when the file differs from it."""
    texts, steady, functions = render_postgres()
    lines = ['"""Postgres\'s per-call statements and generated functions, rendered ahead of time '
             "from", ":mod:`effectgate.store.statements` (generated: "
             "``tests/test_store_statements.py`` pins this", "file to them and says how to write "
             'it again), so that a worker reaches Postgres without', 'importing SQLAlchemy."""',
             "", "from __future__ import annotations", "",
             '__all__ = ["FUNCTIONS", "STEADY", "TEXTS"]', "",
             "# At the default durability (an outcome rides on the next synchronous commit).",
             "TEXTS: dict[str, str] = {"]
    lines += [f"    {name!r}: {text!r}," for name, text in texts.items()]
    lines += ["}", "", '# The texts that differ at durability "all" and "relaxed".',
              "STEADY: dict[str, str] = {"]
    lines += [f"    {name!r}: {text!r}," for name, text in steady.items()]
    lines += ["}", "", "# (name, CREATE statement, call, the call's binds in order where it",
              "# takes them by position) of each generated function.",
              "FUNCTIONS: dict[str, tuple[str, str, str, tuple[str, ...] | None]] = {"]
    lines += [f"    {which!r}: ({f.name!r}, {f.ddl!r}, {f.call!r}, {f.names!r}),"
              for which, f in functions.items()]
    lines.append("}")
    return "\n".join(lines) + "\n"
