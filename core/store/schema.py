"""Tables, the store's clock and schema migrations, declared once for every dialect.

Times are seconds since the epoch on the *database's* clock (:class:`db_now`), never a
worker's. Every transition of ``state`` or of the fencing ``token`` appends one line to the
effect's own ``history`` column in the statement that makes it (see ``statements``), so
history costs no extra row, index entry or round trip. ``effectgate_meta`` holds the schema
version, the store's secret for vendor keys, and the policy each namespace last ran with
(:func:`policy_meta_name`). Version 5 adds the console's server-side sessions
(``effectgate_sessions``) and the record of operators' actions (``effectgate_audit``);
version 6 what a vendor calls an effect's attempt (``vendor_ref``, e.g. an MCP upstream task).

:func:`ensure_schema` creates a fresh store at the latest version, or migrates an older one
under a lock, in one transaction: each migration first checks that the store has exactly the
shape of the version it starts from, and refuses (changing nothing) a shape it does not
recognise; a migration that replaces a table carries every row of it over. Afterwards every
table is checked to have every column this version reads. A store whose schema is newer than
this effectgate's is never written: it is refused at open (a :class:`~effectgate.StoreError`
naming both versions), and a store that stays open while a newer effectgate migrates it
refuses its writes from the next connection it opens, or within a recheck interval
(:class:`~effectgate.store.version.VersionWatch`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    case,
    literal_column,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from ..errors import ConfigError, StoreError
from ..states import State
from .version import SCHEMA_VERSION, VERSION_SQL, newer_schema, vendor_secret_of, version_of

__all__ = [
    "ambiguous_since", "approvals", "audit", "budgets", "db_clock", "db_day", "db_now", "effects",
    "ensure_schema", "in_flight_lapsed", "in_flight_live", "literal", "metadata", "principals",
    "read_schema", "reads_ambiguous", "sessions",
]

metadata = MetaData()
_Id = BigInteger().with_variant(Integer(), "sqlite")

effects = Table(
    "effectgate_effects",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("namespace", String(128), nullable=False),
    Column("key", String(512), nullable=False),
    Column("effect_type", String(200), nullable=False),
    Column("payload_hash", String(64), nullable=False),
    Column("state", String(20), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("lease_expires_at", Double),
    Column("attempt_started_at", Double),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("result", Text),
    Column("error", Text),
    Column("reason", Text),
    Column("run_id", String(256)),
    Column("agent_id", String(256)),
    Column("group_key", String(512)),
    Column("compensation", Text),
    Column("compensates_effect_id", BigInteger),
    Column("vendor", String(32)),
    Column("estimated_cost_micros", BigInteger),
    Column("actual_cost_micros", BigInteger),
    Column("approval_id", String(64)),
    Column("actor", String(256)),
    Column("note", Text),
    Column("pruned_at", Double),
    Column("budget_keys", Text),
    Column("history", Text),
    # v3: proof of holding (SHA-256 of the secret issued with the lease), and the attempt and
    # time the current vendor idempotency key was first issued for.
    Column("lease_secret", String(64)),
    Column("vendor_attempt", Integer),
    Column("vendor_since", Double),
    # v6: what the vendor calls the current attempt (e.g. an MCP upstream's task id), written
    # by the holder with a heartbeat, read by a reconcile hook after a crash.
    Column("vendor_ref", Text),
    UniqueConstraint("namespace", "key", name="uq_effectgate_effects_key"),
)
# A saga's steps by group: a partial index, in SQL that both backends read alike. (Declared as
# an ``Index`` with ``sqlite_where`` and ``postgresql_where``, SQLAlchemy would import both
# dialects to check those arguments: +50 ms at every start, for every user, of one backend.)
GROUP_INDEX = ("CREATE INDEX ix_effectgate_effects_group ON effectgate_effects "
               "(namespace, group_key) WHERE group_key IS NOT NULL")
# Deliberately no more indexes. One on ``state`` (or any column a transition writes) would stop
# Postgres updating a row in place (a HOT update): every report would write every index again
# (measured: +35% per executed effect). One on (namespace, created_at) was chosen by the
# reservation's generic plan over the unique key (a scan of the namespace: 10x slower). Lists
# go newest first by ``id``, the primary key.

approvals = Table(
    "effectgate_approvals",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("namespace", String(128), nullable=False),
    Column("effect_id", BigInteger, nullable=False, index=True),
    Column("effect_type", String(200), nullable=False),
    Column("key", String(512), nullable=False),
    Column("payload_hash", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("requested_by", String(256)),
    Column("run_id", String(256)),
    Column("estimated_cost_micros", BigInteger),
    Column("allow_self_approval", Integer, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    Column("decided_by", String(256)),
    Column("decided_at", Double),
    Column("reason", Text),
    # v3: the normalised arguments that will execute, for the approver (redacted per field;
    # cleared once decided or expired). Never in the effects table.
    Column("arguments", Text),
)

budgets = Table(
    "effectgate_budgets",
    metadata,
    Column("namespace", String(128), primary_key=True),
    Column("scope_key", String(800), primary_key=True),
    Column("spent_micros", BigInteger, nullable=False),
    Column("updated_at", Double, nullable=False),
)

# v4: named operators and agents. A token is ``egp_`` + 43 URL-safe characters; its first 12
# after the prefix are ``token_id`` (the primary key: authentication is one indexed read), and
# the whole token is kept only as a salted PBKDF2 hash.
principals = Table(
    "effectgate_principals",
    metadata,
    Column("token_id", String(16), primary_key=True),
    Column("namespace", String(128), nullable=False),
    Column("name", String(256), nullable=False),
    Column("role", String(16), nullable=False),
    Column("salt", String(64), nullable=False),
    Column("token_hash", String(128), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("last_used_at", Double),
    Column("revoked_at", Double),
    UniqueConstraint("namespace", "name", name="uq_effectgate_principals_name"),
)

# v5: the console's sessions, kept in the store so that every console process on it agrees
# and signing out ends a session everywhere. ``id`` is the SHA-256 of the secret the cookie
# carries (the store never holds a usable cookie); ``token_id`` names the principal, re-read
# with the session on every request (a revoked principal is signed out at once).
sessions = Table(
    "effectgate_sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("namespace", String(128), nullable=False),
    Column("token_id", String(16), nullable=False),
    Column("name", String(256), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    Column("ended_at", Double),
)

# v5: what operators did, as the console and the CLI record it — who (``actor``), what
# (``action``: approve, deny, resolve, reconcile, unwind, principal.add, principal.revoke,
# login, logout), to what (``subject``: a key, an approval id, a group, a principal's name),
# through what (``via``), when (the store's clock). Appended once the action succeeded;
# never updated.
audit = Table(
    "effectgate_audit",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("namespace", String(128), nullable=False),
    Column("at", Double, nullable=False),
    Column("actor", String(256), nullable=False),
    Column("action", String(32), nullable=False),
    Column("subject", String(512)),
    Column("effect_id", BigInteger),
    Column("via", String(16), nullable=False),
    Column("detail", Text),
)

meta = Table(
    "effectgate_meta",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)


def literal(text: str) -> ColumnElement[str]:
    """A constant string written into the SQL itself (no bind to merge on every call)."""
    return literal_column("'" + text.replace("'", "''") + "'", String)


class db_now(FunctionElement[float]):
    """The database's clock as epoch seconds (a float), fixed for the statement."""

    type = Double()
    inherit_cache = True
    name = "db_now"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(db_now, "postgresql")
def _now_postgres(element: db_now, compiler: Any, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"


class db_clock(FunctionElement[float]):
    """The database's clock as epoch seconds when the expression is evaluated: where a lease
    starts. On Postgres a statement may wait for a lock after it started (a migration's or an
    index build's table lock, a counter row a frozen transaction holds), and a lease counted
    from the statement's start (:class:`db_now`) would be that much shorter, or over before
    its holder was told to run. SQLite evaluates ``'now'`` once per statement, after its lock
    is taken (``BEGIN IMMEDIATE``): the same as :class:`db_now` there."""

    type = Double()
    inherit_cache = True
    name = "db_clock"


@compiles(db_clock, "sqlite")
def _clock_sqlite(element: db_clock, compiler: Any, **kw: Any) -> str:
    return _now_sqlite(db_now(), compiler, **kw)


@compiles(db_clock, "postgresql")
def _clock_postgres(element: db_clock, compiler: Any, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


def in_flight_live(now: ColumnElement[float]) -> ColumnElement[bool]:
    """An IN_FLIGHT effect under a live lease: its end not before the store's clock ``now``.
    The SQL of :func:`effectgate.decide.lease_live`, and its one home in the store: every
    statement that asks it says it so."""
    t = effects.c
    return (t.state == literal(State.IN_FLIGHT.value)) & (t.lease_expires_at >= now)


def in_flight_lapsed(now: ColumnElement[float]) -> ColumnElement[bool]:
    """An IN_FLIGHT effect whose lease has lapsed (it reads AMBIGUOUS): the SQL of
    :func:`effectgate.decide.lapsed`. A NULL end is neither live nor lapsed, as there."""
    t = effects.c
    return (t.state == literal(State.IN_FLIGHT.value)) & (t.lease_expires_at < now)


def reads_ambiguous(now: ColumnElement[float]) -> ColumnElement[bool]:
    """An effect that reads AMBIGUOUS: marked so, or IN_FLIGHT past its lease (the SQL of
    :func:`effectgate.decide.effective_state` for AMBIGUOUS)."""
    return (effects.c.state == literal(State.AMBIGUOUS.value)) | in_flight_lapsed(now)


def ambiguous_since() -> ColumnElement[float]:
    """When an effect that reads AMBIGUOUS became so: its last change if marked, else the
    end of the lease it outlived."""
    t = effects.c
    return case((t.state == literal(State.AMBIGUOUS.value), t.updated_at),
                else_=t.lease_expires_at)


class db_day(FunctionElement[str]):
    """The database's UTC date as ``YYYY-MM-DD`` (for per-day spend ceilings)."""

    type = String()
    inherit_cache = True
    name = "db_day"


@compiles(db_day, "sqlite")
def _day_sqlite(element: db_day, compiler: Any, **kw: Any) -> str:
    return "strftime('%Y-%m-%d', 'now')"


@compiles(db_day, "postgresql")
def _day_postgres(element: db_day, compiler: Any, **kw: Any) -> str:
    return "to_char(statement_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD')"


def _shape(conn: Connection) -> dict[str, set[str]]:
    """Table name → its columns, for every ``effectgate_*`` table, in one query."""
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql(
            "SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p "
            "WHERE m.type = 'table' AND m.name LIKE 'effectgate%'"
        )
    else:
        rows = conn.exec_driver_sql(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name LIKE 'effectgate%%'"
        )
    shape: dict[str, set[str]] = {}
    for table, column in rows:
        shape.setdefault(str(table), set()).add(str(column))
    return shape


def _columns(conn: Connection, table: str) -> set[str]:
    return _shape(conn).get(table, set())


def _has_table(conn: Connection, table: str) -> bool:
    return table in _shape(conn)


# The columns each version's tables have (what a migration from that version expects).
_V1_EFFECTS = {c.name for c in effects.c} - {"history", "lease_secret", "vendor_attempt",
                                               "vendor_since", "vendor_ref"}
_V1_APPROVALS = {c.name for c in approvals.c} - {"arguments"}
_V2_EFFECTS = _V1_EFFECTS | {"history"}
_V1_HISTORY = {"id", "effect_id", "from_state", "to_state", "at", "by", "note", "token"}


def _expect(conn: Connection, version: int, table: str, wanted: set[str]) -> None:
    """Refuse to migrate a table that does not have the shape of ``version``."""
    if not _has_table(conn, table):
        raise ConfigError(
            f"the store says schema version {version} but has no {table} table; it was not "
            "written by a released effectgate, and is left as it is"
        )
    found = _columns(conn, table)
    if found != wanted:
        missing, extra = sorted(wanted - found), sorted(found - wanted)
        raise ConfigError(
            f"the store says schema version {version} but {table} does not have that version's "
            f"columns (missing: {', '.join(missing) or 'none'}; unexpected: "
            f"{', '.join(extra) or 'none'}); nothing was changed"
        )


def _v2(conn: Connection, dialect: str) -> None:
    """History moves from a trigger-fed table into the effect row (one write per transition
    instead of three). Every history row of version 1 is carried into its effect's column
    before the old table and its triggers are dropped."""
    from .lines import encode_line

    _expect(conn, 1, "effectgate_effects", _V1_EFFECTS)
    _expect(conn, 1, "effectgate_approvals", _V1_APPROVALS)
    conn.exec_driver_sql("ALTER TABLE effectgate_effects ADD COLUMN history TEXT")
    for trigger in ("effectgate_history_insert", "effectgate_history_update"):
        conn.exec_driver_sql(
            f"DROP TRIGGER IF EXISTS {trigger}"
            + (" ON effectgate_effects" if dialect == "postgresql" else "")
        )
    if _has_table(conn, "effectgate_history"):
        found = _columns(conn, "effectgate_history")
        if not found >= _V1_HISTORY:
            raise ConfigError(
                "the store's version 1 history table lacks columns "
                f"{', '.join(sorted(_V1_HISTORY - found))}; nothing was changed"
            )
        lines: dict[int, list[str]] = {}
        rows = conn.exec_driver_sql(
            "SELECT effect_id, from_state, to_state, at, token, by, note "
            "FROM effectgate_history ORDER BY effect_id, id"
        )
        for effect_id, from_state, to_state, at, token, by, note in rows:
            lines.setdefault(int(effect_id), []).append(
                encode_line(from_state, to_state, float(at), int(token), by, note))
        update = text("UPDATE effectgate_effects SET history = :h WHERE id = :id")
        for effect_id, entries in lines.items():
            conn.execute(update, {"h": "".join(entries), "id": effect_id})
        conn.exec_driver_sql("DROP TABLE effectgate_history")
    if dialect == "postgresql":
        conn.exec_driver_sql("DROP FUNCTION IF EXISTS effectgate_history_fn()")


def _v3(conn: Connection, dialect: str) -> None:
    """Proof of holding and kept vendor keys on effects; the arguments an approver sees."""
    _expect(conn, 2, "effectgate_effects", _V2_EFFECTS)
    _expect(conn, 2, "effectgate_approvals", _V1_APPROVALS)
    for column, kind in (("lease_secret", "VARCHAR(64)"), ("vendor_attempt", "INTEGER"),
                         ("vendor_since", "DOUBLE PRECISION")):
        conn.exec_driver_sql(f"ALTER TABLE effectgate_effects ADD COLUMN {column} {kind}")
    # Until now a vendor key was derived from the attempt, first used when it started.
    conn.exec_driver_sql(
        "UPDATE effectgate_effects SET vendor_attempt = attempt, "
        "vendor_since = attempt_started_at"
    )
    conn.exec_driver_sql("ALTER TABLE effectgate_approvals ADD COLUMN arguments TEXT")


_V3_EFFECTS = {c.name for c in effects.c} - {"vendor_ref"}
_V3_APPROVALS = {c.name for c in approvals.c}


def _v4(conn: Connection, dialect: str) -> None:
    """Named principals (operators and agents) with hashed tokens: a new table; every effect
    and approval stays as it is."""
    _expect(conn, 3, "effectgate_effects", _V3_EFFECTS)
    _expect(conn, 3, "effectgate_approvals", _V3_APPROVALS)
    if _has_table(conn, principals.name):
        raise ConfigError(
            f"the store says schema version 3 but already has a {principals.name} table; it "
            "was not written by a released effectgate; nothing was changed")
    principals.create(conn)


_V4_PRINCIPALS = {c.name for c in principals.c}


def _v5(conn: Connection, dialect: str) -> None:
    """The console's server-side sessions and the record of operators' actions: two new
    tables; every effect, approval and principal stays as it is."""
    _expect(conn, 4, "effectgate_effects", _V3_EFFECTS)
    _expect(conn, 4, "effectgate_approvals", _V3_APPROVALS)
    _expect(conn, 4, principals.name, _V4_PRINCIPALS)
    for table in (sessions, audit):
        if _has_table(conn, table.name):
            raise ConfigError(
                f"the store says schema version 4 but already has a {table.name} table; it "
                "was not written by a released effectgate; nothing was changed")
        table.create(conn)


def _v6(conn: Connection, dialect: str) -> None:
    """What the vendor calls an attempt (``vendor_ref``, e.g. an MCP upstream's task id): a
    new, empty column on effects; every other row and table stays as it is."""
    _expect(conn, 5, "effectgate_effects", _V3_EFFECTS)
    conn.exec_driver_sql("ALTER TABLE effectgate_effects ADD COLUMN vendor_ref TEXT")


# MIGRATIONS[n - 1] takes a store from version n - 1 to n, inside one transaction. A fresh
# store is created at the latest version directly.
MIGRATIONS: list[Callable[[Connection, str], None] | None] = [None, _v2, _v3, _v4, _v5, _v6]
assert len(MIGRATIONS) == SCHEMA_VERSION, "a migration without its version in store/version.py"


def _create(conn: Connection) -> None:
    metadata.create_all(conn)
    conn.exec_driver_sql(GROUP_INDEX)
    conn.execute(meta.insert().values(name="vendor_secret", value=secrets.token_hex(32)))
    conn.execute(meta.insert().values(name="schema_version", value=str(SCHEMA_VERSION)))


def _check_latest(conn: Connection) -> None:
    """Every table has every column this version reads: a store stamped with this version by
    an earlier development build fails here, at open, not at every call."""
    shape = _shape(conn)
    for table in (effects, approvals, budgets, principals, sessions, audit, meta):
        if table.name not in shape:
            raise ConfigError(
                f"the store says schema version {SCHEMA_VERSION} but has no {table.name} table")
        missing = {c.name for c in table.c} - shape[table.name]
        if missing:
            raise ConfigError(
                f"the store says schema version {SCHEMA_VERSION} but {table.name} lacks "
                f"{', '.join(sorted(missing))}: it was written by a development build of "
                "effectgate; migrate it by hand or start a new store"
            )


def ensure_schema(engine: Engine, where: str = "this URL") -> dict[str, str]:
    """Create or migrate the store's tables; return the ``effectgate_meta`` rows. A store whose
    schema is newer than this effectgate's is refused (:func:`newer_schema`), changing nothing.

    Runs under a lock (SQLite ``BEGIN IMMEDIATE``, a Postgres advisory lock) so that many
    workers starting at once migrate exactly once.
    """
    dialect = engine.dialect.name
    if dialect not in ("sqlite", "postgresql"):
        raise ConfigError(f"effectgate supports SQLite and PostgreSQL, not {dialect}")
    with engine.connect() as conn:
        if dialect == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7406253911)")
        try:
            version = _current_version(conn)
            if version > SCHEMA_VERSION:
                raise newer_schema(version, where)
            if version == 0:
                if _has_table(conn, effects.name):
                    raise ConfigError(
                        "the store has effectgate tables but no schema version; it is left as "
                        "it is"
                    )
                _create(conn)
            elif version < SCHEMA_VERSION:
                for number in range(version + 1, SCHEMA_VERSION + 1):
                    migration = MIGRATIONS[number - 1]
                    assert migration is not None
                    migration(conn, dialect)
                conn.execute(
                    text("UPDATE effectgate_meta SET value = :v WHERE name = 'schema_version'"),
                    {"v": str(SCHEMA_VERSION)},
                )
            _check_latest(conn)
            rows = _meta_rows(conn)
            conn.exec_driver_sql("COMMIT")
        except BaseException:
            conn.exec_driver_sql("ROLLBACK")
            raise
    return rows


def read_schema(engine: Engine, where: str) -> dict[str, str]:
    """The ``effectgate_meta`` rows of an existing store, creating and migrating nothing.

    :class:`~effectgate.StoreError` when there is no effectgate store there, or when its schema
    is not the version this effectgate writes (it must be opened read-write once to migrate)."""
    with engine.connect() as conn:
        version = _current_version(conn)
        if version == 0:
            raise StoreError(f"no effectgate store at {where}")
        if version > SCHEMA_VERSION:
            raise newer_schema(version, where)
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"the store at {where} has schema version {version}; this effectgate reads "
                f"version {SCHEMA_VERSION} (open it read-write once to migrate)"
            )
        _check_latest(conn)
        rows = _meta_rows(conn)
        conn.rollback()
    return rows


def _meta_rows(conn: Connection) -> dict[str, str]:
    """The ``effectgate_meta`` rows, refused without a usable vendor secret
    (:func:`~effectgate.store.version.vendor_secret_of`)."""
    rows = {str(name): str(value) for name, value in conn.execute(meta.select())}
    vendor_secret_of(rows)
    return rows


def _current_version(conn: Connection) -> int:
    if not _has_table(conn, meta.name):
        return 0
    return version_of(conn.execute(text(VERSION_SQL)).scalar())
