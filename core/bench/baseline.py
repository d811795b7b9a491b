"""The baselines: the raw driver (``sqlite3`` / ``psycopg``) doing by hand the writes an
idempotent effect needs, with the same durability as the gate.

Per executed effect: one ``INSERT … ON CONFLICT DO NOTHING RETURNING id`` (the reservation, its
own transaction) and one ``UPDATE … WHERE id = ?`` (the outcome, its own transaction). Per
refusal: one ``SELECT`` by key. On SQLite the reserving commit runs at the given
``synchronous`` level and the outcome commit at another, switched with a ``PRAGMA`` exactly as
the gate switches it; on Postgres the reservation commits synchronously and the outcome
asynchronously (``set_config('synchronous_commit', 'off', true)`` in the UPDATE itself), as the
gate's default durability does. No history, no lease, no fencing token: this is the floor.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "Cycle", "KeySource", "RawPostgres", "RawSqlite", "batch", "calling", "connect_postgres",
    "connect_raw", "fixed_python", "timed_calls",
]

_RESULT = '{"ok":true}'
_HASH = "0" * 64


def connect_postgres(dsn: str) -> Any:
    """A ``psycopg`` connection to ``dsn`` (a libpq URI) in autocommit mode, opened with the
    store's connect timeout (:func:`~effectgate.store.pg_direct.with_connect_timeout`): a
    server that is down, or accepts and never answers, fails the run with a
    :class:`~effectgate.errors.StoreError` naming it (password hidden) instead of hanging it."""
    import psycopg

    from ..errors import ConfigError, StoreError
    from ..store.connections import driver_text, safe_url
    from ..store.pg_direct import with_connect_timeout

    try:
        return psycopg.connect(dsn, autocommit=True, **with_connect_timeout(dsn, {}))
    except psycopg.OperationalError as err:
        raise StoreError(f"bench: cannot reach the Postgres server at {safe_url(dsn)}: "
                         f"{type(err).__name__}: {driver_text(err)}") from err
    except psycopg.Error:  # libpq cannot read it; its message quotes the text (a password)
        raise ConfigError(f"bench: not a connection string libpq reads: {safe_url(dsn)}"
                          ) from None


class KeySource:
    """Fresh random keys (``prefix`` + 16 hex digits), remembered in the order issued."""

    def __init__(self, prefix: str = "bench:") -> None:
        self.prefix = prefix
        self.issued: list[str] = []

    def take(self, count: int) -> list[str]:
        """``count`` keys never issued before."""
        keys = [f"{self.prefix}{os.urandom(8).hex()}" for _ in range(count)]
        self.issued.extend(keys)
        return keys


class Cycle:
    """Hands out keys from a fixed list, round and round (for repeats of committed keys)."""

    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise ValueError("Cycle needs at least one key")
        self.keys = keys
        self.at = 0

    def take(self, count: int) -> list[str]:
        """The next ``count`` keys."""
        out = []
        for _ in range(count):
            out.append(self.keys[self.at])
            self.at = (self.at + 1) % len(self.keys)
        return out


def timed_calls(fn: Any, keys: list[str]) -> float:
    """Seconds taken to call ``fn(key)`` for every key."""
    start = time.perf_counter()
    for key in keys:
        fn(key)
    return time.perf_counter() - start


def calling(fn: Any, source: KeySource | Cycle) -> Callable[[int], float]:
    """A runner: ``fn(key)`` for each of the next ``count`` keys of ``source``."""
    return lambda count: timed_calls(fn, source.take(count))


def batch(method: Callable[[list[str]], float],
          source: KeySource | Cycle) -> Callable[[int], float]:
    """A runner: ``method(keys)`` (which times itself) on the next ``count`` keys."""
    return lambda count: method(source.take(count))


_COLUMNS = "namespace, key, effect_type, payload_hash, state, created_at, updated_at"


class _Raw:
    """The statements both drivers share; ``ph`` is the driver's placeholder."""

    conn: Any
    ph = "?"
    ride = ""  # what makes the outcome commit asynchronous (Postgres)

    def __init__(self, table: str, namespace: str) -> None:
        self.table = table
        self.namespace = namespace
        ph = self.ph
        self.insert = (
            f"INSERT INTO {table} ({_COLUMNS}) VALUES ({', '.join([ph] * 7)}) "
            "ON CONFLICT (namespace, key) DO NOTHING RETURNING id"
        )
        self.update = f"UPDATE {table} SET state = {ph}, result = {ph}, updated_at = {ph} " \
            f"WHERE id = {ph}" + self.ride
        self.select = f"SELECT id, state, payload_hash, result FROM {table} " \
            f"WHERE namespace = {ph} AND key = {ph}"

    def _reserve(self, key: str) -> Any:
        now = time.time()
        return self.conn.execute(
            self.insert,
            (self.namespace, key, "bench.effect", _HASH, "in_flight", now, now),
        ).fetchone()

    def _commit(self, row_id: Any) -> None:
        self.conn.execute(self.update, ("committed", _RESULT, time.time(), row_id))

    def execute(self, keys: list[str]) -> float:
        """Reserve, then record the outcome of, one effect per key; seconds taken."""
        start = time.perf_counter()
        for key in keys:
            row = self._reserve(key)
            if row is not None:
                self._commit(row[0])
        return time.perf_counter() - start

    def refuse(self, keys: list[str]) -> float:
        """One ``SELECT`` by key per key; seconds taken."""
        start = time.perf_counter()
        ns = self.namespace
        for key in keys:
            self.conn.execute(self.select, (ns, key)).fetchone()
        return time.perf_counter() - start

    def race(self, keys: list[str]) -> tuple[float, list[str]]:
        """The gate's writes, raw: ``INSERT … ON CONFLICT DO NOTHING`` per key and, for each
        key this one won, the ``UPDATE`` of its outcome: (seconds, the keys it won)."""
        won = []
        start = time.perf_counter()
        for key in keys:
            row = self._reserve(key)
            if row is not None:
                won.append(key)
                self._commit(row[0])
        return time.perf_counter() - start, won

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class RawSqlite(_Raw):
    """``sqlite3`` in autocommit mode on a WAL file; ``syncs`` = (reserve, outcome) levels."""

    def __init__(self, path: str, *, namespace: str, syncs: tuple[str, str] = ("FULL", "NORMAL"),
                 table: str = "raw_effects") -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=60.0)
        self.conn.execute("PRAGMA busy_timeout=60000")
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={syncs[0]}")
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, "
            "namespace TEXT NOT NULL, key TEXT NOT NULL, effect_type TEXT NOT NULL, "
            "payload_hash TEXT NOT NULL, state TEXT NOT NULL, result TEXT, "
            "created_at REAL NOT NULL, updated_at REAL NOT NULL, UNIQUE (namespace, key))"
        )
        self.switch = syncs[0] != syncs[1]
        self.sync_reserve = f"PRAGMA synchronous={syncs[0]}"
        self.sync_outcome = f"PRAGMA synchronous={syncs[1]}"
        super().__init__(table, namespace)

    def _reserve(self, key: str) -> Any:
        if self.switch:
            self.conn.execute(self.sync_reserve)
        return super()._reserve(key)

    def _commit(self, row_id: Any) -> None:
        if self.switch:
            self.conn.execute(self.sync_outcome)
        super()._commit(row_id)

    def python_after(self, keys: list[str]) -> float:
        """Reserve each key at this connection's reserving durability, then run
        :func:`fixed_python`; seconds spent in that Python alone (what a commit's wait leaves
        the code after it: ``synchronous=FULL`` waits for the disk, ``NORMAL`` does not)."""
        spent = 0.0
        clock = time.perf_counter
        for key in keys:
            self._reserve(key)
            start = clock()
            fixed_python()
            spent += clock() - start
        return spent


def _step(at: int, seen: dict[str, int]) -> int:
    seen["n"] = at
    return at + len(seen)


def fixed_python() -> int:
    """The same few microseconds of plain Python every time (calls, a dict, a tuple, a
    string): the same work on either side of a comparison."""
    seen: dict[str, int] = {}
    at = 0
    for _ in range(60):
        at = _step(at, seen)
    return len(f"{at}:{tuple(seen)}")


class RawPostgres(_Raw):
    """``psycopg`` in autocommit mode: every statement its own transaction and round trip."""

    ph = "%s"
    ride = " AND set_config('synchronous_commit', 'off', true) IS NOT NULL"

    def __init__(self, dsn: str, *, namespace: str, table: str = "raw_effects") -> None:
        self.conn = connect_postgres(dsn)
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (id BIGSERIAL PRIMARY KEY, "
            "namespace VARCHAR(128) NOT NULL, key VARCHAR(512) NOT NULL, "
            "effect_type VARCHAR(200) NOT NULL, payload_hash VARCHAR(64) NOT NULL, "
            "state VARCHAR(20) NOT NULL, result TEXT, created_at DOUBLE PRECISION NOT NULL, "
            "updated_at DOUBLE PRECISION NOT NULL, UNIQUE (namespace, key))"
        )
        super().__init__(table, namespace)


def connect_raw(kind: str, where: str, namespace: str, **options: Any) -> RawSqlite | RawPostgres:
    """A raw baseline: ``kind`` ``"sqlite"`` (``where`` a file path) or ``"postgres"``
    (``where`` a libpq connection string)."""
    if kind == "sqlite":
        return RawSqlite(where, namespace=namespace, **options)
    return RawPostgres(where, namespace=namespace, **options)

