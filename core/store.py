"""The store: one set of tables on SQLAlchemy Core, SQLite (WAL) or PostgreSQL.

SQLAlchemy declares the tables, runs migrations and compiles every statement once per dialect
(:class:`Statements`). The per-call path then runs those compiled strings on the driver
connection the engine pools (``sqlite3`` / ``psycopg``), each as a single autocommit statement:
one round trip, no ORM, no per-call compilation.

* SQLite: WAL, ``busy_timeout`` so concurrent processes wait rather than fail, and
  ``synchronous=FULL`` for every commit that reserves (an effect's reservation survives a power
  cut); the outcome commit runs at ``NORMAL`` and rides on the next sync (a lost outcome decays
  to AMBIGUOUS, never to a second execution). ``durability="all"`` syncs outcomes too;
  ``durability="relaxed"`` syncs nothing (an explicit opt-in).
* PostgreSQL: a unique index and ``INSERT … ON CONFLICT DO NOTHING`` in one statement with the
  read of the existing row (:meth:`Store.reserve`), and compare-and-set ``UPDATE``\\ s on the
  fencing token for every later transition.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import namedtuple
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn

from sqlalchemy import (
    Engine,
    String,
    bindparam,
    cast,
    create_engine,
    event,
    false,
    func,
    literal_column,
    null,
    select,
    true,
)
from sqlalchemy import bindparam as p
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError, NoSuchModuleError
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.expression import ColumnClause

from .errors import ConfigError, StoreError
from .pg_reserve import ReserveFunction
from .schema import approvals, budgets, db_day, db_now, effects, ensure_schema, read_schema

__all__ = [
    "DEFAULT_URL", "Durability", "HotEffect", "Rollback", "Statements", "Store", "StoredEffect",
    "parse_history", "resolve_url",
]

DEFAULT_URL = "sqlite:///.effectgate/effects.db"
Durability = Literal["reserve", "all", "relaxed"]

_COLUMNS = [c for c in effects.c]
StoredEffect = namedtuple(  # type: ignore[misc]
    "StoredEffect", [c.name for c in _COLUMNS] + ["now", "inserted"], defaults=(False,)
)
StoredEffect.__doc__ = "One row of ``effectgate_effects`` plus the store's clock at the read."
# What the per-call path needs to decide: no history, no audit fields.
_HOT = [
    effects.c[name] for name in (
        "id", "namespace", "key", "effect_type", "payload_hash", "state", "attempt", "token",
        "lease_expires_at", "attempt_started_at", "created_at", "result", "reason", "vendor",
        "approval_id", "budget_keys", "estimated_cost_micros", "pruned_at",
    )
]
HotEffect = namedtuple(  # type: ignore[misc]
    "HotEffect", [c.name for c in _HOT] + ["now", "inserted"], defaults=(False,)
)
HotEffect.__doc__ = "The columns of an effect the per-call path decides on, and the store's clock."
_ApprovalRow = namedtuple(  # type: ignore[misc]
    "_ApprovalRow", [c.name for c in approvals.c] + ["now"]
)


def _entry(from_state: Any, to_state: Any, token: Any, by: Any = None, *,
           first: bool = False) -> Any:
    """``history`` with one more line appended: from, to, at (store clock), token, by, note —
    tab-separated; ``by`` and ``note`` JSON-encoded so they cannot break the line."""
    t = effects.c
    tab: Any = bindparam("h_tab", "\t")
    return (
        (from_state if first else func.coalesce(t.history, bindparam("h_empty", "")) + from_state)
        + tab + to_state + tab
        + cast(db_now(), String) + tab + cast(token, String) + tab
        + (p("h_by") if by is None else by) + tab + p("h_note") + bindparam("h_nl", "\n")
    )


def parse_history(text: str | None) -> list[tuple[str | None, str, float, int, Any, Any]]:
    """The lines :func:`_entry` wrote: (from, to, at, token, by, note), oldest first."""
    out = []
    for line in (text or "").splitlines():
        from_state, to_state, at, token, by, note = line.split("\t", 5)
        out.append((from_state or None, to_state, float(at), int(token), json.loads(by),
                    json.loads(note)))
    return out

IN_FLIGHT: ColumnClause[str] = literal_column("'in_flight'")
AMBIGUOUS: ColumnClause[str] = literal_column("'ambiguous'")


def resolve_url(url: str | None) -> str:
    """``url``, else ``$EFFECTGATE_URL``, else the embedded SQLite default."""
    return url or os.environ.get("EFFECTGATE_URL") or DEFAULT_URL


class _Sql:
    """A statement compiled once for one dialect; ``params`` fills in its literal binds."""

    __slots__ = ("defaults", "text")

    def __init__(self, stmt: ClauseElement, dialect: Any) -> None:
        compiled = stmt.compile(dialect=dialect)
        self.text = compiled.string
        self.defaults = {k: v for k, v in compiled.params.items() if v is not None}

    @classmethod
    def from_text(cls, text: str) -> _Sql:
        """A statement already written for the driver, with no literal binds."""
        sql = cls.__new__(cls)
        sql.text, sql.defaults = text, {}
        return sql

    def params(self, values: Mapping[str, Any]) -> Mapping[str, Any]:
        if not self.defaults:
            return values
        out = dict(self.defaults)
        out.update(values)
        return out


class Statements:
    """Every statement of the per-call path, written once, compiled for one dialect."""

    def __init__(self, dialect: Any, dialect_name: str) -> None:
        now = db_now()
        t = effects.c
        where_key = (t.namespace == p("namespace")) & (t.key == p("key"))
        returning = [*_HOT, now.label("now")]
        full = [*_COLUMNS, now.label("now")]
        insert_values = {
            "namespace": p("namespace"),
            "key": p("key"),
            "effect_type": p("effect_type"),
            "payload_hash": p("payload_hash"),
            "state": p("state"),
            "attempt": 1,
            "token": 1,
            "lease_expires_at": now + p("lease_seconds"),
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
            "estimated_cost_micros": p("estimated_cost_micros"),
            "approval_id": p("approval_id"),
            "budget_keys": p("budget_keys"),
            "actor": p("actor"),
            "note": p("note"),
            "history": _entry(bindparam("h_none", ""), p("state"), literal_column("1"),
                              first=True),
        }
        dialect_insert = postgresql.insert if dialect_name == "postgresql" else sqlite.insert
        insert = (
            dialect_insert(effects)
            .values(insert_values)
            .on_conflict_do_nothing(index_elements=[t.namespace, t.key])
        )
        self.fetch = _Sql(select(*returning).where(where_key), dialect)
        self.fetch_full = _Sql(select(*full).where(where_key), dialect)
        self.fetch_id = _Sql(select(*full).where(t.id == p("id")), dialect)
        self.insert = _Sql(insert.returning(*returning, true().label("inserted")), dialect)
        # The reservation of a new key only needs what the store decided: id, lease, clock.
        self.insert_lean = _Sql(insert.returning(t.id, t.lease_expires_at, now), dialect)
        # Postgres: read-if-present, else insert, in one round trip: the two statements above
        # run inside a function generated from them (see pg_reserve).
        self.reserve_function = ReserveFunction(
            select(*returning, false().label("inserted")).where(where_key),
            insert.returning(*returning, true().label("inserted")),
            dialect,
            [(c.name, str(c.type.compile(dialect=dialect))) for c in _HOT]
            + [("now", "double precision"), ("inserted", "boolean")],
        ) if dialect_name == "postgresql" else None
        # (SQLite reserves with fetch + insert from the client; see Store.reserve.)
        self.reserve = _Sql.from_text(
            self.reserve_function.call if self.reserve_function is not None else ""
        )
        cas = (t.id == p("id")) & (t.token == p("token"))
        live = (t.state == IN_FLIGHT) & (t.lease_expires_at >= now)
        # A begin moving an existing effect on: a new attempt on a FAILED effect, an approved
        # one starting, or a governed refusal (PENDING_APPROVAL, DENIED). A new token each time.
        self.take = _Sql(
            effects.update()
            .where(cas & (t.state == p("expected_state")))
            .values(
                history=_entry(t.state, p("state"), t.token + 1),
                state=p("state"),
                approval_id=p("approval_id"),
                budget_keys=p("budget_keys"),
                attempt=t.attempt + p("attempt_increment"),
                token=t.token + 1,
                lease_expires_at=now + p("lease_seconds"),
                attempt_started_at=now,
                updated_at=now,
                result=null(),
                error=null(),
                reason=p("reason"),
                run_id=p("run_id"),
                agent_id=p("agent_id"),
                estimated_cost_micros=p("estimated_cost_micros"),
                actual_cost_micros=null(),
                vendor=p("vendor"),
                actor=p("actor"),
                note=p("note"),
                pruned_at=null(),  # a pruned tombstone that moves on is live again
            )
            .returning(*returning),
            dialect,
        )
        self.lapse = _Sql(
            effects.update()
            .where(cas & (t.state == IN_FLIGHT) & (t.lease_expires_at < now))
            .values(state=AMBIGUOUS, reason="lease lapsed", updated_at=now, actor="lease",
                    note=null(),
                    history=_entry(t.state, AMBIGUOUS, t.token,
                                   bindparam("h_lease", '"lease"')))
            .returning(*returning),
            dialect,
        )
        self.report = _Sql(
            effects.update()
            .where(cas & live)
            .values(
                history=_entry(t.state, p("state"), t.token),
                state=p("state"),
                result=p("result"),
                error=p("error"),
                reason=p("reason"),
                actual_cost_micros=p("actual_cost_micros"),
                lease_expires_at=null(),
                updated_at=now,
                actor=p("actor"),
                note=null(),
            )
            .returning(t.budget_keys, t.estimated_cost_micros),
            dialect,
        )
        self.extend = _Sql(
            effects.update()
            .where(cas & live)
            .values(lease_expires_at=now + p("lease_seconds"), updated_at=now)
            .returning(t.lease_expires_at, now.label("now")),
            dialect,
        )
        self.resolve = _Sql(
            effects.update()
            .where(cas & (t.state == p("expected_state")))
            .values(
                history=_entry(t.state, p("state"), t.token + 1),
                state=p("state"),
                token=t.token + 1,
                result=p("result"),
                error=p("error"),
                reason=p("reason"),
                lease_expires_at=null(),
                updated_at=now,
                actor=p("actor"),
                note=p("note"),
                pruned_at=null(),
            )
            .returning(*full),
            dialect,
        )
        self.now = _Sql(select(now), dialect)
        # Governance: spend counters and approvals.
        # A charge against one ceiling: counted only while the sum stays within the limit.
        # A per-day ceiling's counter is named by the store's date (charge_day).
        b = budgets.c

        def charge(scope_key: Any) -> _Sql:
            return _Sql(
                dialect_insert(budgets)
                .values(namespace=p("namespace"), scope_key=scope_key, spent_micros=p("cost"),
                        updated_at=now)
                .on_conflict_do_update(
                    index_elements=[b.namespace, b.scope_key],
                    set_={"spent_micros": b.spent_micros + p("cost"), "updated_at": now},
                    where=b.spent_micros + p("cost") <= p("limit"),
                )
                .returning(b.scope_key, b.spent_micros),
                dialect,
            )

        self.charge = charge(p("scope_key"))
        self.charge_day = charge(p("scope_key") + db_day())
        self.adjust = _Sql(
            budgets.update()
            .where((b.namespace == p("namespace")) & (b.scope_key == p("scope_key")))
            .values(spent_micros=b.spent_micros + p("delta"), updated_at=now),
            dialect,
        )
        a = approvals.c
        self.approval_insert = _Sql(
            approvals.insert().values(
                id=p("approval_id"), namespace=p("namespace"), effect_id=p("effect_id"),
                effect_type=p("effect_type"), key=p("key"), payload_hash=p("payload_hash"),
                state=literal_column("'pending'"), requested_by=p("agent_id"),
                run_id=p("run_id"), estimated_cost_micros=p("estimated_cost_micros"),
                allow_self_approval=p("allow_self_approval"), created_at=now,
                expires_at=now + p("expires_seconds"),
            ),
            dialect,
        )
        self.approval_get = _Sql(
            select(*approvals.c, now.label("now")).where(a.id == p("approval_id")), dialect
        )
        self.approval_decide = _Sql(
            approvals.update()
            .where((a.id == p("approval_id")) & (a.state == literal_column("'pending'"))
                   & (a.expires_at >= now))
            .values(state=p("state"), decided_by=p("by"), decided_at=now, reason=p("reason"))
            .returning(a.id),
            dialect,
        )
        self.approval_consume = _Sql(
            approvals.update()
            .where((a.id == p("approval_id")) & (a.state == literal_column("'approved'"))
                   & (a.expires_at >= now))
            .values(state=literal_column("'consumed'"))
            .returning(a.id),
            dialect,
        )


class Store:
    """Connections, durability and the compiled statements for one database URL."""

    def __init__(self, url: str | None = None, *, durability: Durability = "reserve",
                 read_only: bool = False) -> None:
        self.url = resolve_url(url)
        self.read_only = read_only
        if durability not in ("reserve", "all", "relaxed"):
            raise ConfigError(
                f"durability must be 'reserve', 'all' or 'relaxed', not {durability!r}"
            )
        self.durability = durability
        self.engine = _make_engine(self.url, read_only=read_only)
        self.dialect_name = self.engine.dialect.name
        self.is_sqlite = self.dialect_name == "sqlite"
        try:
            self.meta = read_schema(self.engine, _safe(self.url)) if read_only else (
                ensure_schema(self.engine))
        except StoreError:
            raise
        except Exception as err:
            if isinstance(err, ConfigError):
                raise
            raise StoreError(f"cannot open the store at {_safe(self.url)}: {err}") from err
        self.secret = bytes.fromhex(self.meta["vendor_secret"])
        dialect = sqlite.dialect(paramstyle="named") if self.is_sqlite else self.engine.dialect
        self.sql = Statements(dialect, self.dialect_name)
        if self.sql.reserve_function is not None and not read_only:
            try:
                self.sql.reserve_function.install(self.engine)
            except Exception as err:
                raise StoreError(f"cannot install the reserve function: {err}") from err
        self._sync_reserve = "PRAGMA synchronous=NORMAL" if durability == "relaxed" else (
            "PRAGMA synchronous=FULL"
        )
        self._sync_outcome = "PRAGMA synchronous=FULL" if durability == "all" else (
            "PRAGMA synchronous=NORMAL"
        )
        self._local = threading.local()
        # (owner thread, connection): closed on dispose, or once the owner thread has ended
        self._opened: list[tuple[threading.Thread, Any]] = []
        self._opened_lock = threading.Lock()
        self._pid = os.getpid()
        self._inherited: Any = None

    # -- connections -----------------------------------------------------------------------

    def _driver(self) -> Any:
        """This thread's driver connection, opened from the engine once and kept.

        The per-call path skips the pool's checkout and reset: a thread keeps its connection
        (a forked child opens its own), and a connection that broke is dropped and reopened.
        """
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            if self._pid != os.getpid():
                self._forget_parent()
                local = self._local
            try:
                proxied = self.engine.raw_connection()
            except Exception as err:
                raise StoreError(f"cannot reach the store at {_safe(self.url)}: {err}") from err
            conn = proxied.driver_connection
            proxied.detach()  # ours now: the pool neither counts nor resets it
            local.conn, local.pid = conn, os.getpid()
            local.sync = "PRAGMA synchronous=FULL"  # as the connect hook left it
            self._adopt(conn)
        return conn

    def _adopt(self, conn: Any) -> None:
        """Keep ``conn`` as this thread's, and close the connections of threads that have
        ended (and this thread's dropped one): a thread per request must not leave a
        connection behind it each time, until the server runs out of them."""
        me = threading.current_thread()
        with self._opened_lock:
            kept = []
            for thread, other in self._opened:
                if thread is not me and thread.is_alive():
                    kept.append((thread, other))
                else:
                    with contextlib.suppress(Exception):
                        other.close()
            kept.append((me, conn))
            self._opened = kept

    def _forget_parent(self) -> None:
        """In a forked child: leave the parent's connections alone (never use or close a
        socket another process is using) and open our own from now on. The parent's stay
        referenced, so that not even garbage collection closes them here."""
        self._inherited = (self._opened, self.engine.pool)
        self.engine.dispose(close=False)
        self._opened = []
        self._opened_lock = threading.Lock()  # the parent's may have been held at the fork
        self._local = threading.local()
        self._pid = os.getpid()

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """This thread's driver connection (``sqlite3`` or ``psycopg``), in autocommit mode."""
        conn = self._driver()
        try:
            yield conn
        except BaseException as err:
            if _is_disconnect(err) or _is_disconnect(err.__cause__):
                self._drop()
            raise

    def _run(self, sql: _Sql, values: Mapping[str, Any], sync: str | None = None) -> list[Any]:
        conn = self._driver()
        try:
            if sync is not None and self.is_sqlite and self._local.sync != sync:
                conn.execute(sync)  # only when it changes: durability is per commit
                self._local.sync = sync
            return conn.execute(sql.text, sql.params(values)).fetchall()  # type: ignore[no-any-return]
        except Exception as err:
            if _is_disconnect(err):
                self._drop()
            raise _store_error(err, writing=sync is not None) from err

    def _one(self, sql: _Sql, values: Mapping[str, Any], sync: str | None = None) -> Any:
        rows = self._run(sql, values, sync)
        return HotEffect(*rows[0]) if rows else None

    def _full(self, sql: _Sql, values: Mapping[str, Any], sync: str | None = None) -> Any:
        rows = self._run(sql, values, sync)
        return StoredEffect(*rows[0]) if rows else None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Transaction]:
        """Several statements as one atomic, durable write (SQLite ``BEGIN IMMEDIATE``)."""
        conn = self._driver()
        try:
            if self.is_sqlite:
                if self._local.sync != self._sync_reserve:
                    conn.execute(self._sync_reserve)
                    self._local.sync = self._sync_reserve
                conn.execute("BEGIN IMMEDIATE")
            else:
                conn.execute("BEGIN")
        except Exception as err:
            if _is_disconnect(err):
                self._drop()
            raise _store_error(err, writing=True) from err
        try:
            yield _Transaction(conn)
            conn.execute("COMMIT")
        except BaseException as err:
            try:
                conn.execute("ROLLBACK")
            except Exception:
                self._drop()
            if isinstance(err, Exception) and not isinstance(err, (StoreError, _Rollback)) and (
                type(err).__module__.startswith(("sqlite3", "psycopg"))
            ):
                if _is_disconnect(err):
                    self._drop()
                raise _store_error(err, writing=True) from err
            raise

    # -- the per-call operations -------------------------------------------------------------

    def reserve(self, values: Mapping[str, Any]) -> Any:
        """Insert the effect if its key is absent; otherwise return the existing row.

        Either way, one row with ``inserted`` telling which. The insert is durable (FULL)."""
        for _ in range(8):
            if self.is_sqlite:
                # Embedded: a read is cheap, and a repeat (the common refusal) must not write.
                row = self._one(self.sql.fetch, values)
                if row is None:
                    new = self._run(self.sql.insert_lean, values, self._sync_reserve)
                    if new:
                        return _inserted(values, *new[0])
            else:
                row = self._one(self.sql.reserve, values)
            if row is not None:
                return row
        raise StoreError("could not reserve or read the key after 8 tries", key=values["key"])

    def fetch(self, namespace: str, key: str) -> Any:
        """The row for ``key``, or None."""
        return self._one(self.sql.fetch, {"namespace": namespace, "key": key})

    def fetch_full(self, namespace: str, key: str) -> Any:
        """Every column of the row for ``key`` (history included), or None."""
        return self._full(self.sql.fetch_full, {"namespace": namespace, "key": key})

    def fetch_id(self, effect_id: int) -> Any:
        """Every column of the row with ``effect_id``, or None."""
        return self._full(self.sql.fetch_id, {"id": effect_id})

    def take(self, values: Mapping[str, Any]) -> Any:
        """Compare-and-set a FAILED (or approved) effect to a new IN_FLIGHT attempt."""
        return self._one(self.sql.take, values, self._sync_reserve)

    def lapse(self, effect_id: int, token: int) -> Any:
        """Compare-and-set an IN_FLIGHT effect past its lease to AMBIGUOUS."""
        return self._one(self.sql.lapse, {"id": effect_id, "token": token, "h_note": "null"},
                         self._sync_outcome)

    def report(self, values: Mapping[str, Any]) -> Any:
        """Record the holder's outcome: (budget_keys, estimated cost), or None when the token or
        the lease no longer holds."""
        rows = self._run(self.sql.report, values, self._sync_outcome)
        return rows[0] if rows else None

    def extend(self, effect_id: int, token: int, seconds: float) -> Any:
        """Push the lease out by ``seconds`` from now; None when it no longer holds."""
        rows = self._run(
            self.sql.extend, {"id": effect_id, "token": token, "lease_seconds": seconds},
            self._sync_outcome,
        )
        return rows[0] if rows else None

    def resolve(self, values: Mapping[str, Any]) -> Any:
        """Compare-and-set an effect to an operator's (or reconciler's) outcome."""
        return self._full(self.sql.resolve, values, self._sync_reserve)

    def approval(self, approval_id: str | None) -> Any:
        """The approvals row (with the store's clock as ``now``), or None."""
        if approval_id is None:
            return None
        rows = self._run(self.sql.approval_get, {"approval_id": approval_id})
        return _ApprovalRow(*rows[0]) if rows else None

    def decide_approval(self, approval_id: str, state: str, by: str,
                        reason: str | None) -> Any:
        """Compare-and-set a pending, unexpired approval to approved or denied."""
        rows = self._run(self.sql.approval_decide, {
            "approval_id": approval_id, "state": state, "by": by, "reason": reason,
        }, self._sync_reserve)
        return rows[0] if rows else None

    def approvals(self, namespace: str) -> list[Any]:
        """Every approval of a namespace, newest first."""
        from sqlalchemy import select as sa_select

        with self.engine.connect() as conn:
            rows = conn.execute(
                sa_select(*approvals.c, db_now().label("now"))
                .where(approvals.c.namespace == namespace)
                .order_by(approvals.c.created_at.desc())
            ).fetchall()
        return [_ApprovalRow(*r) for r in rows]  # type: ignore[call-arg]

    def select_effects(self, namespace: str, *, state: str | None = None,
                       effect_type: str | None = None, run_id: str | None = None,
                       group_key: str | None = None, originals_only: bool = False,
                       newest_first: bool = True, limit: int | None = None) -> list[Any]:
        """Effects of a namespace by filter. ``state`` is the state a read reports: an
        IN_FLIGHT row past its lease counts as ``ambiguous``, not ``in_flight``."""
        now = db_now()
        t = effects.c
        stmt = select(*_COLUMNS, now.label("now")).where(t.namespace == namespace)
        lapsed = (t.state == IN_FLIGHT) & (t.lease_expires_at < now)
        if state == "ambiguous":
            stmt = stmt.where((t.state == AMBIGUOUS) | lapsed)
        elif state == "in_flight":
            stmt = stmt.where((t.state == IN_FLIGHT) & (t.lease_expires_at >= now))
        elif state is not None:
            stmt = stmt.where(t.state == state)
        if effect_type is not None:
            stmt = stmt.where(t.effect_type.like(effect_type.replace("*", "%")))
        if run_id is not None:
            stmt = stmt.where(t.run_id == run_id)
        if group_key is not None:
            stmt = stmt.where(t.group_key == group_key)
        if originals_only:
            stmt = stmt.where(t.compensates_effect_id.is_(None))
        order = (t.created_at.desc(), t.id.desc()) if newest_first else (t.created_at, t.id)
        stmt = stmt.order_by(*order)
        if limit is not None:
            stmt = stmt.limit(limit)
        try:
            with self.engine.connect() as conn:
                return [StoredEffect(*r) for r in conn.execute(stmt)]  # type: ignore[call-arg]
        except Exception as err:
            raise _store_error(err, writing=False) from err

    def prune(self, namespace: str, older_than_seconds: float, *, dry_run: bool = False) -> int:
        """Drop results, history and finished approvals of settled effects last changed more
        than ``older_than_seconds`` ago; keep each key's tombstone (key, state, payload hash)."""
        from sqlalchemy import delete, update

        now = db_now()
        t = effects.c
        old = (t.namespace == namespace) & (t.updated_at <= now - older_than_seconds) & (
            t.state.in_(("committed", "failed", "denied"))
        )
        if dry_run:
            with self.engine.connect() as conn:
                return int(conn.execute(
                    select(func.count()).select_from(effects).where(old & t.pruned_at.is_(None))
                ).scalar_one())
        with self.engine.connect() as conn:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN")
            try:
                pruned = conn.execute(
                    update(effects).where(old & t.pruned_at.is_(None)).values(
                        result=None, error=None, compensation=None, note=None, history=None,
                        pruned_at=now,
                    )
                ).rowcount
                a = approvals.c
                conn.execute(delete(approvals).where(
                    (a.namespace == namespace) & (a.created_at < now - older_than_seconds)
                    & (a.state.in_(("consumed", "denied")) | (a.expires_at < now))
                ))
                conn.exec_driver_sql("COMMIT")
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
        return int(pruned)

    def now(self) -> float:
        """The store's clock, epoch seconds."""
        return float(self._run(self.sql.now, {})[0][0])

    def dispose(self) -> None:
        """Close every connection this store opened."""
        if self._pid != os.getpid():
            self._forget_parent()
        with self._opened_lock:
            for _, conn in self._opened:
                with contextlib.suppress(Exception):
                    conn.close()
            self._opened = []
        self._local = threading.local()
        self.engine.dispose()


def _inserted(values: Mapping[str, Any], effect_id: int, lease: float, now: float) -> Any:
    """The row a reservation just inserted, from its request and what the store returned."""
    v = values
    return HotEffect(  # type: ignore[call-arg]
        effect_id, v["namespace"], v["key"], v["effect_type"], v["payload_hash"], v["state"], 1, 1,
        lease, now, now, None, v["reason"], v["vendor"], v["approval_id"], v["budget_keys"],
        v["estimated_cost_micros"], None, now, True,
    )


class _Rollback(Exception):
    """Raised inside :meth:`Store.transaction` to undo it without an error."""


class _Transaction:
    """Statements inside one transaction."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def all(self, sql: _Sql, values: Mapping[str, Any]) -> list[Any]:
        cursor = self.conn.execute(sql.text, sql.params(values))
        return cursor.fetchall() if cursor.description is not None else []

    def one(self, sql: _Sql, values: Mapping[str, Any]) -> Any:
        rows = self.all(sql, values)
        return rows[0] if rows else None

    def effect(self, sql: _Sql, values: Mapping[str, Any]) -> Any:
        rows = self.all(sql, values)
        if not rows:
            return None
        row = rows[0]
        return (StoredEffect if len(row) > len(HotEffect._fields) else HotEffect)(*row)

    @staticmethod
    def rollback() -> NoReturn:
        """Undo the transaction (the context manager swallows nothing: catch ``Rollback``)."""
        raise _Rollback


Rollback = _Rollback


def _make_engine(url: str, *, read_only: bool = False) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError as err:
        raise ConfigError(f"not a database URL: {url!r} ({err})") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise ConfigError(
                "an in-memory SQLite store cannot be shared between calls and processes; "
                "use a file (effectgate.testing.temporary_gate() makes a throw-away one)"
            )
        if read_only:
            if not Path(database).expanduser().is_file():
                raise StoreError(f"no effectgate store at {_safe(url)} (no such file)")
        else:
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed, isolation_level="AUTOCOMMIT",
            connect_args={"timeout": 60.0, "check_same_thread": False},
        )

        _fork_safe(engine)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA busy_timeout=60000")
            if read_only:
                dbapi_conn.execute("PRAGMA query_only=ON")
                return
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=FULL")

        return engine
    if backend == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
        try:
            engine = create_engine(
                parsed, isolation_level="AUTOCOMMIT", pool_size=8, max_overflow=32,
                connect_args={"options": "-c default_transaction_read_only=on"}
                if read_only else {},
            )
            _fork_safe(engine)
            return engine
        except (ModuleNotFoundError, NoSuchModuleError) as err:
            raise ConfigError(
                'Postgres needs psycopg: pip install ".[postgres]" in the effectgate clone'
            ) from err
    raise ConfigError(f"effectgate supports sqlite and postgresql URLs, not {backend!r}")


def _fork_safe(engine: Engine) -> None:
    """Never hand a pooled connection to a process other than the one that opened it (after
    ``os.fork()`` the pool's sockets are shared with the parent): SQLAlchemy's recipe."""

    @event.listens_for(engine, "connect")
    def _remember_pid(_dbapi_conn: Any, record: Any) -> None:
        record.info["pid"] = os.getpid()

    @event.listens_for(engine, "checkout")
    def _check_pid(_dbapi_conn: Any, record: Any, proxy: Any) -> None:
        pid = os.getpid()
        if record.info.get("pid", pid) != pid:
            record.dbapi_connection = proxy.dbapi_connection = None
            raise DisconnectionError(
                f"connection opened by process {record.info['pid']}, checked out in {pid}"
            )


def _is_disconnect(err: BaseException | None) -> bool:
    if err is None:
        return False
    name = type(err).__module__
    if name.startswith("psycopg"):
        conn_closed = "closed" in str(err).lower() or "terminat" in str(err).lower()
        return conn_closed or type(err).__name__ in ("OperationalError", "InterfaceError")
    return False


def _store_error(err: Exception, *, writing: bool) -> StoreError:
    if isinstance(err, StoreError):
        return err
    # A write whose connection broke may or may not have committed.
    unknown = writing and _is_disconnect(err)
    return StoreError(f"the store failed: {type(err).__name__}: {err}", outcome_unknown=unknown)


def _safe(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<bad url>"
