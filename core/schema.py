"""Tables, the store's clock and schema migrations, declared once for every dialect.

Times are seconds since the epoch on the *database's* clock (:class:`db_now`), never a
worker's. Every transition of ``state`` or of the fencing ``token`` appends one line to the
effect's own ``history`` column in the statement that makes it (see ``store.Statements``), so
history costs no extra row, index entry or round trip. ``effectgate_meta`` holds the schema
version and the store's secret for vendor keys; :func:`ensure_schema` applies pending
migrations under a lock.
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
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from .errors import ConfigError, StoreError

__all__ = [
    "SCHEMA_VERSION", "approvals", "budgets", "db_day", "db_now", "effects", "ensure_schema",
    "metadata", "read_schema",
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
    UniqueConstraint("namespace", "key", name="uq_effectgate_effects_key"),
)
Index(
    "ix_effectgate_effects_group",
    effects.c.namespace,
    effects.c.group_key,
    sqlite_where=effects.c.group_key.isnot(None),
    postgresql_where=effects.c.group_key.isnot(None),
)

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
)

budgets = Table(
    "effectgate_budgets",
    metadata,
    Column("namespace", String(128), primary_key=True),
    Column("scope_key", String(800), primary_key=True),
    Column("spent_micros", BigInteger, nullable=False),
    Column("updated_at", Double, nullable=False),
)

meta = Table(
    "effectgate_meta",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)


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


def _v1(conn: Connection, dialect: str) -> None:
    metadata.create_all(conn)
    conn.execute(meta.insert().values(name="vendor_secret", value=secrets.token_hex(32)))


def _v2(conn: Connection, dialect: str) -> None:
    """History moves from a trigger-fed table into the effect row (one write per transition
    instead of three). Version 1 stores get the column; their old history table is dropped."""
    from sqlalchemy import inspect

    columns = {c["name"] for c in inspect(conn).get_columns("effectgate_effects")}
    if "history" not in columns:
        conn.exec_driver_sql("ALTER TABLE effectgate_effects ADD COLUMN history TEXT")
    for trigger in ("effectgate_history_insert", "effectgate_history_update"):
        conn.exec_driver_sql(
            f"DROP TRIGGER IF EXISTS {trigger}"
            + (" ON effectgate_effects" if dialect == "postgresql" else "")
        )
    if dialect == "postgresql":
        conn.exec_driver_sql("DROP FUNCTION IF EXISTS effectgate_history_fn()")
    conn.exec_driver_sql("DROP TABLE IF EXISTS effectgate_history")


# Each migration takes the store from version n-1 to n, inside one transaction.
MIGRATIONS: list[Callable[[Connection, str], None]] = [_v1, _v2]
SCHEMA_VERSION = len(MIGRATIONS)


def ensure_schema(engine: Engine) -> dict[str, str]:
    """Create or migrate the store's tables; return the ``effectgate_meta`` rows.

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
                raise ConfigError(
                    f"the store's schema is version {version}, newer than this effectgate "
                    f"understands ({SCHEMA_VERSION}); upgrade effectgate"
                )
            for number in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[number - 1](conn, dialect)
            if version < SCHEMA_VERSION:
                stmt = text(
                    "UPDATE effectgate_meta SET value = :v WHERE name = 'schema_version'"
                    if version
                    else "INSERT INTO effectgate_meta (name, value) VALUES ('schema_version', :v)"
                )
                conn.execute(stmt, {"v": str(SCHEMA_VERSION)})
            rows = {name: value for name, value in conn.execute(meta.select())}
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
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"the store at {where} has schema version {version}; this effectgate reads "
                f"version {SCHEMA_VERSION} (open it read-write once to migrate)"
            )
        rows = {name: value for name, value in conn.execute(meta.select())}
        conn.rollback()
    return rows


def _current_version(conn: Connection) -> int:
    from sqlalchemy import inspect

    if not inspect(conn).has_table("effectgate_meta"):
        return 0
    value = conn.execute(
        text("SELECT value FROM effectgate_meta WHERE name = 'schema_version'")
    ).scalar()
    return int(value) if value is not None else 0
