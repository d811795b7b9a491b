"""Postgres: the reservation as one server-side call.

A reservation reads the key and inserts it only when absent. On SQLite the client does that
(an embedded read costs microseconds). Over a network it must be one round trip, and a single
SQL statement that both reads and may insert (a data-modifying CTE) costs a repeat — the
common refusal — twice a plain read on the server. So on Postgres the same two statements run
inside a small PL/pgSQL function: the read, and the insert only when the read found nothing.

The function is *generated* from the two statements that :class:`~effectgate.store.Statements`
compiles for the dialect, so the SQL is still written once. Its name carries a hash of its
text: each version of effectgate installs (and calls) its own, and versions sharing one
database never replace each other's.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.sqltypes import NullType

__all__ = ["ReserveFunction"]

_BIND = re.compile(r"%\((\w+)\)s")


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace("'", "\\'").replace("\t", "\\t")
    return "E'" + text.replace("\n", "\\n") + "'"


class ReserveFunction:
    """The generated function for one pair of (read, insert) statements."""

    def __init__(self, fetch: ClauseElement, insert: ClauseElement, dialect: Any,
                 columns: list[tuple[str, str]]) -> None:
        read: Any = fetch.compile(dialect=dialect)
        write: Any = insert.compile(dialect=dialect)
        params: dict[str, str] = {}
        defaults: dict[str, Any] = {}
        for compiled in (read, write):
            for name, bind in compiled.binds.items():
                if bind.value is not None and not bind.required:
                    defaults[name] = bind.value
                elif name not in params:
                    kind = bind.type
                    params[name] = "text" if isinstance(kind, NullType) else str(
                        kind.compile(dialect=dialect))

        def body(sql: str) -> str:
            def swap(match: re.Match[str]) -> str:
                name = match.group(1)
                return _literal(defaults[name]) if name in defaults else f"p_{name}"
            return _BIND.sub(swap, sql)

        self.params = params
        returns = ", ".join(f"{name} {kind}" for name, kind in columns)
        signature = ", ".join(f"p_{name} {kind}" for name, kind in params.items())
        source = (
            f"({signature}) RETURNS TABLE ({returns}) LANGUAGE plpgsql AS $effectgate$\n"
            "#variable_conflict use_column\nBEGIN\n"
            f"  RETURN QUERY {body(read.string)};\n"
            "  IF FOUND THEN RETURN; END IF;\n"
            f"  RETURN QUERY {body(write.string)};\nEND\n$effectgate$"
        )
        self.name = "effectgate_reserve_" + hashlib.sha256(source.encode()).hexdigest()[:12]
        self.ddl = f"CREATE OR REPLACE FUNCTION {self.name}{source}"
        args = ", ".join(f"CAST(%({name})s AS {kind})" for name, kind in params.items())
        self.call = f"SELECT * FROM {self.name}({args})"

    def install(self, engine: Engine) -> None:
        """Create the function unless this version's already exists (under a lock, so that
        many workers starting at once create it once)."""
        with engine.connect() as conn:
            found = conn.exec_driver_sql(
                "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE p.proname = %(name)s AND n.nspname = current_schema()", {"name": self.name}
            ).first()
            if found is not None:
                return
            conn.exec_driver_sql("BEGIN")
            try:
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7406253912)")
                conn.exec_driver_sql(self.ddl)
                conn.exec_driver_sql("COMMIT")
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
