"""The floor under the gate's Python: the gate's own statements for one executed effect,
captured once from a real gated call and replayed by the bare driver with only the key
changed.

Beside the raw baseline (the fewest writes an idempotent effect needs) and the gate, it splits
the gap in two: what the gate's statements cost the database (a wider row, its history, the
lease secret and fencing token, the read before the insert on SQLite, a function call on
Postgres) and what the gate's Python costs per call (everything else).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from ..gate import Gate

__all__ = ["Replay"]


class Replay:
    """The statements ``fn(probe)`` sent to ``gate``'s store, replayed per key (its key
    ``render(key)``) on a connection of its own to the same store (``where``: the SQLite file
    path, or a libpq connection string)."""

    def __init__(self, gate: Gate, fn: Callable[[str], Any], probe: str, *,
                 render: Callable[[str], str], where: str) -> None:
        conns = gate.store._conns
        # (sql, its binds by name, the durability of its commit, whether one row is read)
        captured: list[tuple[Any, dict[str, Any], str | None, bool]] = []
        real, first, read = conns.run, conns.first, conns.read

        def by_name(sql: Any, binds: Any) -> dict[str, Any]:
            return dict(binds) if sql.names is None or type(binds) is not tuple else dict(
                zip(sql.names, binds, strict=True))

        def spy(sql: Any, binds: Any, sync: str | None = None, *, count: bool = False) -> Any:
            captured.append((sql, by_name(sql, binds), sync, False))
            return real(sql, binds, sync, count=count)  # type: ignore[call-overload]

        def spy_first(sql: Any, binds: Any) -> Any:
            captured.append((sql, by_name(sql, binds), None, True))
            return first(sql, binds)

        def spy_read(sql: Any, binds: Any) -> Any:
            captured.append((sql, by_name(sql, binds), None, False))
            return read(sql, binds)

        conns.run = spy  # type: ignore[method-assign]
        conns.first = spy_first  # type: ignore[method-assign]
        conns.read = spy_read  # type: ignore[method-assign]
        try:
            fn(probe)
        finally:
            del conns.run, conns.first, conns.read
        rendered = render(probe)
        if not captured or any(binds.get("key") != rendered for _, binds, _, _ in captured):
            raise RuntimeError(f"the probe's statements do not all name its key: {captured}")
        self.statements = captured
        self.render = render
        self.is_sqlite = gate.store.is_sqlite
        if self.is_sqlite:
            self.conn: Any = sqlite3.connect(where, isolation_level=None, timeout=60.0)
            self.conn.execute("PRAGMA busy_timeout=60000")
            self.conn.execute("PRAGMA journal_mode=WAL")
        else:
            from .baseline import connect_postgres

            self.conn = connect_postgres(where)
        self.sync: str | None = None

    def execute(self, keys: list[str]) -> float:
        """The captured statements once per key, in order; seconds taken."""
        conn, render, statements = self.conn, self.render, self.statements
        start = time.perf_counter()
        for key in keys:
            rendered = render(key)
            for sql, binds, sync, one in statements:
                if sync is not None and self.is_sqlite and sync != self.sync:
                    conn.execute(sync)  # the durability of this commit, as the gate sets it
                    self.sync = sync
                binds["key"] = rendered
                cursor = conn.execute(sql.text, binds if sql.order is None else sql.order(binds))
                if one:
                    cursor.fetchone()
                elif cursor.description is not None:  # a report that returns no rows
                    cursor.fetchall()
        return time.perf_counter() - start

    def close(self) -> None:
        """Close the replay's connection."""
        self.conn.close()
