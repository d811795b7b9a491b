"""The per-call statements as the store runs them: :class:`Sql` texts, looked up by name in
one :class:`Statements` set per dialect and durability (:func:`statements_for`).

Every dialect's texts are rendered ahead of time, SQLite's into
:mod:`effectgate.store.sqlite_texts` and Postgres's (with its generated functions) into
:mod:`effectgate.store.pg_texts` (tests pin both to SQLAlchemy's compilation of
:mod:`effectgate.store.statements`), so that a worker runs its calls without importing
SQLAlchemy.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from functools import partial
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from sqlalchemy.sql import ClauseElement

__all__ = ["NAMES", "Sql", "Statements", "StoredFunction", "dialect_key", "install", "numbered",
           "rendered", "rendered_postgres", "statements_for"]

NAMES = (
    "adjust", "approval_consume", "approval_decide", "approval_forget", "approval_get",
    "approval_insert", "approval_restore", "charge", "charge_day", "extend", "fetch",
    "fetch_brief", "fetch_row",
    "fetch_row_id", "insert", "insert_bare", "insert_lean", "lapse", "lock_row", "note_reason",
    "now",
    "prune", "prune_approvals", "prune_arguments", "prune_count", "report",
    "report_committed", "report_late", "report_plain", "resolve", "take",
)


class Sql:
    """A statement's text for one dialect (compiled from ``stmt`` for ``dialect`` once).

    ``order``, for a text with numbered placeholders (:func:`numbered`), makes the positional
    binds of a mapping of them by name; None: the driver binds the mapping by name."""

    __slots__ = ("names", "order", "text")

    def __init__(self, stmt: ClauseElement | str, dialect: Any = None,
                 names: tuple[str, ...] | None = None) -> None:
        self.names = names
        """The bind parameters' names in the order the text takes them by position (SQLite's
        ``?1``..., Postgres's ``%s``), or None for a text that takes them by name."""
        self.order: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
        if names is not None:
            self.order = _ordered(names)
        if isinstance(stmt, str):
            self.text = stmt
            return
        compiled = stmt.compile(dialect=dialect)
        if any(v is not None for v in compiled.params.values()):
            raise AssertionError(f"a per-call statement has a literal bind: {compiled.params}")
        self.text = compiled.string

    def __repr__(self) -> str:
        return f"Sql({self.text[:60]!r}...)"


def _ordered(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    if len(names) > 1:
        return itemgetter(*names)
    if names:
        name = names[0]
        return lambda binds: (binds[name],)
    return lambda binds: ()


# A named placeholder (``:name``) outside a string literal; literals are matched whole so
# that nothing inside one is taken for a placeholder.
_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|:([A-Za-z_][A-Za-z0-9_]*)")


def numbered(text: str) -> Sql:
    """A text with named placeholders (``:name``, as SQLAlchemy renders SQLite's) as the same
    statement with numbered ones (``?1``, each name one number however often it occurs), bound
    by position: the driver binds a tuple without looking each name up in a mapping."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return match.group(0)
        return f"?{numbers.setdefault(name, len(numbers) + 1)}"

    return Sql(_PLACEHOLDER.sub(number, text), names=tuple(numbers))


class StoredFunction(NamedTuple):
    """A function the store generates on Postgres (:mod:`effectgate.store.pg_reserve`)."""

    name: str
    """Its name, which carries a hash of its text: each version of effectgate installs (and
    calls) its own, and versions sharing one database never replace each other's."""
    ddl: str
    """The statement that creates it."""
    call: str
    """The statement that calls it (psycopg's placeholders: by name, or by position)."""
    names: tuple[str, ...] | None = None
    """The names of its call's binds in their order, where it takes them by position (``%s``:
    the bare function); None where it takes them by name."""


_INSTALLED = ("SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
              "WHERE p.proname = ANY(%s) AND n.nspname = current_schema()")


def install(conn: Any, functions: tuple[StoredFunction, ...]) -> None:
    """Create those of ``functions`` the current schema lacks, on the driver connection
    ``conn`` (psycopg, in autocommit mode), under a lock: many workers starting at once
    create each one once."""
    have = {row[0] for row in conn.execute(_INSTALLED, ([f.name for f in functions],))}
    missing = [f for f in functions if f.name not in have]
    if not missing:
        return
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(7406253912)")
        for function in missing:
            conn.execute(function.ddl)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class Statements:
    """The statements for one dialect and durability, each made the first time it is used
    (a worker's first ``begin`` compiles the two or three it runs, not all of them), then a
    plain attribute. Shared by every store of that dialect and durability in the process."""

    adjust: Sql
    approval_consume: Sql
    approval_decide: Sql
    approval_forget: Sql
    approval_get: Sql
    approval_insert: Sql
    approval_restore: Sql
    charge: Sql
    charge_day: Sql
    extend: Sql
    fetch: Sql
    fetch_brief: Sql
    fetch_row: Sql
    fetch_row_id: Sql
    insert: Sql
    insert_bare: Sql
    insert_lean: Sql
    lapse: Sql
    lock_row: Sql
    note_reason: Sql
    now: Sql
    prune: Sql
    prune_approvals: Sql
    prune_arguments: Sql
    prune_count: Sql
    report: Sql
    report_committed: Sql
    report_late: Sql
    report_plain: Sql
    resolve: Sql
    take: Sql

    def __init__(self, lazy: Mapping[str, Callable[[], Sql]], *,
                 reserve_function: StoredFunction | None = None,
                 bare_function: StoredFunction | None = None,
                 governed_function: StoredFunction | None = None) -> None:
        self._lazy = lazy
        self.reserve_function = reserve_function
        """Postgres: the generated read-else-insert function (None elsewhere)."""
        self.bare_function = bare_function
        """Postgres: the same for a request with none of the optional fields, bound by
        position (None elsewhere)."""
        self.governed_function = governed_function
        """Postgres: the generated read-else-charge-and-insert function (None elsewhere)."""
        self.reserve = Sql(reserve_function.call if reserve_function else "")
        self.reserve_bare = Sql(bare_function.call if bare_function else "",
                                names=bare_function.names if bare_function else None)
        self.reserve_governed = Sql(governed_function.call if governed_function else "")

    def __getattr__(self, name: str) -> Sql:
        """Make the statement ``name`` on first use and keep it (later reads of it are plain
        attribute reads: this method is not called again for that name)."""
        lazy: Mapping[str, Callable[[], Sql]] | None = self.__dict__.get("_lazy")
        if lazy is None or name not in lazy:
            raise AttributeError(name)
        sql = lazy[name]()
        self.__dict__[name] = sql
        return sql

    def compile_all(self) -> None:
        """Make every statement now (a check that each one compiles)."""
        for name in NAMES:
            getattr(self, name)


_SHARED: dict[tuple[Any, ...], Statements] = {}
_SHARED_LOCK = threading.Lock()


def dialect_key(dialect: Any) -> tuple[Any, ...]:
    """What a compiled text depends on besides the dialect's name: its driver, placeholder
    style and server version (the key of statements compiled at run time)."""
    return (getattr(dialect, "driver", None), getattr(dialect, "paramstyle", None),
            getattr(dialect, "server_version_info", None))


def statements_for(dialect_name: str, durability: str = "reserve") -> Statements:
    """The process's :class:`Statements` for this dialect and durability, made the first time
    from the texts rendered ahead of time (every store on the same kind of database shares
    them: a statement's text depends only on the dialect and the durability)."""
    key = (dialect_name, durability)
    found = _SHARED.get(key)
    if found is None:
        with _SHARED_LOCK:
            found = _SHARED.get(key)
            if found is None:
                if dialect_name == "sqlite":
                    found = rendered()
                elif dialect_name == "postgresql":
                    found = rendered_postgres(durability)
                else:
                    raise ValueError(f"no statements for {dialect_name!r}")
                _SHARED[key] = found
    return found


def rendered() -> Statements:
    """SQLite's statements, from the texts rendered ahead of time (the same at every
    durability: the durability of a commit is a pragma on SQLite)."""
    from .sqlite_texts import TEXTS

    return Statements({name: partial(numbered, text) for name, text in TEXTS.items()})


def rendered_postgres(durability: str) -> Statements:
    """Postgres's statements at ``durability``, from the texts rendered ahead of time."""
    from .pg_texts import FUNCTIONS, STEADY, TEXTS

    texts = TEXTS if durability == "reserve" else {**TEXTS, **STEADY}
    return Statements({name: partial(Sql, text) for name, text in texts.items()},
                      reserve_function=StoredFunction(*FUNCTIONS["reserve_function"]),
                      bare_function=StoredFunction(*FUNCTIONS["bare_function"]),
                      governed_function=StoredFunction(*FUNCTIONS["governed_function"]))
