"""The embedded SQLite store opened without SQLAlchemy, so that a worker's way to its first
``begin`` does not import it: a plain ``sqlite:///path`` URL is read here, its connections
are opened with :mod:`sqlite3` itself (the same settings the engine's connect hook gives its
own), and a store already at this schema version is checked here, from its meta rows and
the columns of its tables (:mod:`effectgate.store.sqlite_texts`). Everything else — another
URL form, a store to create or migrate, any doubt — goes the SQLAlchemy way, which also says
what is wrong.
"""

from __future__ import annotations

import os
import re
import sqlite3

from ..errors import ConfigError, StoreError
from .version import SCHEMA_VERSION

__all__ = ["check_database", "connect", "database_of", "read_meta", "set_up"]

# sqlite:///relative/path or sqlite:////absolute/path, nothing SQLAlchemy would read further
# (no query, no escapes): the file is the text after the third slash, exactly as make_url has it.
_PLAIN = re.compile(r"sqlite(?:\+pysqlite)?:///([^?#%]+)")
_BUSY, _WAL, _FULL = "PRAGMA busy_timeout=60000", "PRAGMA journal_mode=WAL", \
    "PRAGMA synchronous=FULL"


def database_of(url: str) -> str | None:
    """The file a plain ``sqlite:///path`` URL names, or None for any other URL."""
    found = _PLAIN.fullmatch(url)
    return None if found is None else found.group(1)


def check_database(database: str, url: str, *, read_only: bool) -> None:
    """Refuse an in-memory database (it cannot be shared between calls and processes) and,
    read-only, a file that is not there; read-write, make the file's folder."""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        raise ConfigError(
            "an in-memory SQLite store cannot be shared between calls and processes; "
            "use a file (effectgate.testing.temporary_gate() makes a throw-away one)"
        )
    path = os.path.expanduser(database)
    if read_only:
        if not os.path.isfile(path):
            raise StoreError(f"no effectgate store at {url} (no such file)")
    else:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)


def connect(database: str, *, read_only: bool) -> sqlite3.Connection:
    """A connection to ``database`` in autocommit mode, set up as the engine's pooled ones
    are (:func:`set_up`)."""
    conn = sqlite3.connect(database, timeout=60.0, check_same_thread=False,
                           isolation_level=None)
    try:
        set_up(conn, read_only=read_only)
    except BaseException:
        conn.close()
        raise
    return conn


def set_up(conn: sqlite3.Connection, *, read_only: bool) -> None:
    """Give a new connection the store's settings (the engine's connect hook calls this
    too): a 60-second busy timeout, then query-only, or WAL at ``synchronous=FULL``."""
    conn.execute(_BUSY)
    if read_only:
        conn.execute("PRAGMA query_only=ON")
        return
    conn.execute(_WAL)
    conn.execute(_FULL)


def read_meta(conn: sqlite3.Connection) -> dict[str, str] | None:
    """The ``effectgate_meta`` rows of a store at exactly this schema version whose tables
    have every column it reads; None otherwise (a store to create, to migrate, or to refuse:
    the schema module decides which)."""
    from .sqlite_texts import COLUMNS

    try:
        rows = {str(name): str(value) for name, value in
                conn.execute("SELECT name, value FROM effectgate_meta").fetchall()}
        if rows.get("schema_version") != str(SCHEMA_VERSION) or "vendor_secret" not in rows:
            return None
        for table, wanted in COLUMNS.items():
            have = {row[0] for row in conn.execute(
                "SELECT name FROM pragma_table_info(?)", (table,)).fetchall()}
            if not wanted <= have:
                return None
    except sqlite3.Error:
        return None
    return rows
