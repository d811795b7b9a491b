"""The read of a namespace's effects by filter (``gate.list_effects``, the console, the CLI):
one statement per *shape* of filter — which filters are given, the state asked for, the
order, whether a limit — compiled once per dialect and kept, then run on the driver
connection with binds, as the per-call statements are. Building a SQLAlchemy ``Select`` on
every read cost more than running it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, NamedTuple

from ..states import State
from .sql import Sql, dialect_key

__all__ = ["Filters", "glob", "like", "listing_binds", "listing_sql", "matches",
           "named_sqlite"]


class Filters(NamedTuple):
    """A read's filters, as given (each None or False: not filtered by it)."""

    state: State | None = None
    effect_type: str | None = None
    run_id: str | None = None
    agent_id: str | None = None
    group_key: str | None = None
    key_prefix: str | None = None
    newest_first: bool = True
    limit: int | None = None
    before_id: int | None = None

    def shape(self) -> tuple[Any, ...]:
        """What the statement depends on: which filters are given, and the state's kind."""
        state = self.state
        kind = None if state is None else (
            state.value if state in (State.AMBIGUOUS, State.IN_FLIGHT) else "stored")
        return (kind, self.effect_type is not None, self.run_id is not None,
                self.agent_id is not None, self.group_key is not None,
                self.key_prefix is not None, self.newest_first,
                self.limit is not None, self.before_id is not None)


_KEPT: dict[tuple[Any, ...], Sql] = {}
_KEPT_LOCK = threading.Lock()


def listing_sql(filters: Filters, dialect: Any) -> Sql:
    """The statement for ``filters``' shape on SQLAlchemy's ``dialect`` (made once)."""
    key = (dialect.name, *dialect_key(dialect), filters.shape())
    found = _KEPT.get(key)
    if found is None:
        with _KEPT_LOCK:
            found = _KEPT.get(key)
            if found is None:
                found = _KEPT[key] = Sql(_select(filters, dialect.name), dialect)
    return found


@functools.cache
def named_sqlite() -> Any:
    """SQLAlchemy's SQLite dialect with ``sqlite3``'s named placeholders (as the rendered
    per-call texts use), made once."""
    from sqlalchemy.dialects.sqlite import dialect

    return dialect(paramstyle="named")


def listing_binds(namespace: str, filters: Filters) -> dict[str, Any]:
    """The binds of ``filters``' statement: the effect type's glob and the key prefix each as
    a LIKE pattern and as SQLite's GLOB (each dialect's statement reads its own)."""
    binds: dict[str, Any] = {"namespace": namespace}
    f = filters
    if f.state is not None and f.state not in (State.AMBIGUOUS, State.IN_FLIGHT):
        binds["state"] = f.state.value
    if f.effect_type is not None:
        binds["effect_type"] = like(f.effect_type)
        binds["effect_glob"] = glob(f.effect_type)
    if f.key_prefix is not None:
        binds["key_prefix"] = like(f.key_prefix, glob=False) + "%"
        binds["key_glob"] = glob(f.key_prefix, wildcards=False) + "*"
    for name in ("run_id", "agent_id", "group_key", "before_id", "limit"):
        value = getattr(f, name)
        if value is not None:
            binds[name] = value
    if f.limit is not None:
        binds["offset"] = 0
    return binds


def like(pattern: str, *, glob: bool = True) -> str:
    """A LIKE pattern matching ``pattern`` literally, except the globs ``*`` and ``?``."""
    out = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    if glob:
        out = out.replace("*", "%").replace("?", "_")
    return out


def glob(pattern: str, *, wildcards: bool = True) -> str:
    """A SQLite GLOB pattern matching ``pattern`` literally, except the globs ``*`` and ``?``
    (with ``wildcards=False``, those too)."""
    out = pattern.replace("[", "[[]")
    if not wildcards:
        out = out.replace("*", "[*]").replace("?", "[?]")
    return out


def matches(column: Any, dialect_name: str, like_pattern: Any, glob_pattern: Any) -> Any:
    """``column`` matches a pattern, upper and lower case told apart on every dialect:
    SQLite's GLOB with the :func:`glob` form, elsewhere LIKE with the :func:`like` form.
    (SQLite's LIKE is blind to ASCII case: the prefix ``refund:`` would list ``REFUND:1``,
    another effect, too.)"""
    if dialect_name == "sqlite":
        return column.op("GLOB")(glob_pattern)
    return column.like(like_pattern, escape="\\")


def _select(f: Filters, dialect_name: str) -> Any:
    from sqlalchemy import Integer, select
    from sqlalchemy import bindparam as p

    from .rows import ROW_COLUMNS
    from .schema import db_now, effects, in_flight_live, reads_ambiguous

    now = db_now()
    t = effects.c
    stmt = select(*[t[name] for name in ROW_COLUMNS], now.label("now")).where(
        t.namespace == p("namespace"))
    if f.state is State.AMBIGUOUS:
        stmt = stmt.where(reads_ambiguous(now))
    elif f.state is State.IN_FLIGHT:
        stmt = stmt.where(in_flight_live(now))
    elif f.state is not None:
        stmt = stmt.where(t.state == p("state"))
    if f.effect_type is not None:
        stmt = stmt.where(matches(t.effect_type, dialect_name, p("effect_type"),
                                  p("effect_glob")))
    if f.key_prefix is not None:
        stmt = stmt.where(matches(t.key, dialect_name, p("key_prefix"), p("key_glob")))
    for column in ("run_id", "agent_id", "group_key"):
        if getattr(f, column) is not None:
            stmt = stmt.where(t[column] == p(column))
    if f.before_id is not None:
        stmt = stmt.where(t.id < p("before_id"))
    stmt = stmt.order_by(t.id.desc() if f.newest_first else t.id)  # the primary key
    if f.limit is not None:
        # An explicit offset: SQLite's compiler would add a literal ``OFFSET 0`` to the limit.
        stmt = stmt.limit(p("limit", type_=Integer())).offset(p("offset", type_=Integer()))
    return stmt
