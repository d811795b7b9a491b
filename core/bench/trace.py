"""Counting what reaches the database, rather than assuming it.

* PostgreSQL: libpq's own protocol trace (``PQtrace``) of the connection; every
  ``ReadyForQuery`` the server sends closes one round trip.
* SQLite: the connection's statement trace (``sqlite3`` ``set_trace_callback``); statements
  run by triggers are left out (they do not cross any boundary). The trace cannot tell a
  trigger's run from an immediate repeat of the same statement text; neither path repeats one.
* Writes: SQLite's ``total_changes`` on the connection; on Postgres a fingerprint of the
  namespace's rows (``xmin``/``ctid`` change on any update) and the id sequence.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from types import TracebackType
from typing import Any

__all__ = ["PgTrace", "SqliteTrace", "pg_fingerprint"]

_VERB = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|PRAGMA|WITH|BEGIN|COMMIT)\b", re.I)


class PgTrace:
    """Round trips and statements sent on one ``psycopg`` connection inside the block."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.round_trips = 0
        self.statements: list[str] = []
        self._file: Any = None

    def __enter__(self) -> PgTrace:
        from psycopg import pq

        self._file = tempfile.TemporaryFile()
        self.conn.pgconn.trace(self._file.fileno())
        self.conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.conn.pgconn.untrace()
        self._file.seek(0)
        for line in self._file.read().decode("utf-8", "replace").splitlines():
            parts = line.split("\t")
            if len(parts) < 3:
                continue
            if parts[0] == "B" and parts[2].startswith("ReadyForQuery"):
                self.round_trips += 1
            elif parts[0] == "F" and parts[2].startswith("Query"):
                match = _VERB.search(line)
                self.statements.append(match.group(1).upper() if match else "?")
            elif parts[0] == "F" and parts[2].startswith("Bind"):
                # A prepared statement's text was sent once, before; count it by its Bind.
                self.statements.append("statement")
        self._file.close()


class SqliteTrace:
    """Statements a ``sqlite3`` connection ran inside the block, and rows it changed."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements: list[str] = []
        self.changes = 0
        self._before = 0
        self._last = ""

    def _seen(self, sql: str) -> None:
        # Python reports a trigger's sub-program (and SQLite's RETURNING, which runs as one)
        # with the expanded text of the statement that fired it: the same text again, at once.
        if sql == self._last or sql.lstrip().startswith("--"):
            return
        self._last = sql
        match = _VERB.search(sql)
        self.statements.append(match.group(1).upper() if match else "?")

    def __enter__(self) -> SqliteTrace:
        self._before = self.conn.total_changes
        self.conn.set_trace_callback(self._seen)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.conn.set_trace_callback(None)
        self.changes = self.conn.total_changes - self._before


def pg_fingerprint(dsn: str, namespace: str) -> tuple[str, int]:
    """(a digest of the namespace's effect rows, the id sequence's last value).

    Any write to an effect row (its history included, which lives in the row) gives it a new
    ``xmin`` and ``ctid``, and so changes the digest."""
    from .baseline import connect_postgres

    with connect_postgres(dsn) as conn:
        rows = conn.execute(
            "SELECT id, xmin::text, ctid::text FROM effectgate_effects WHERE namespace = %s "
            "ORDER BY id", (namespace,),
        ).fetchall()
        seq = conn.execute(
            "SELECT pg_sequence_last_value("
            "pg_get_serial_sequence('effectgate_effects', 'id')::regclass)"
        ).fetchone()
    digest = hashlib.sha256(repr(rows).encode()).hexdigest()
    return digest, int(seq[0]) if seq and seq[0] is not None else 0
