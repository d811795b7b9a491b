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
from collections.abc import Iterable

from ..errors import ConfigError, StoreError
from .version import SCHEMA_VERSION

__all__ = ["check_database", "connect", "database_of", "read_meta", "refuse_in_memory", "set_up",
           "uri_parts"]

# sqlite:///relative/path or sqlite:////absolute/path, nothing SQLAlchemy would read further
# (no query, no escapes): the file is the text after the third slash, exactly as make_url has it.
# A name that starts with "file:" is left to SQLAlchemy too: SQLite reads it as a URI when it was
# built with SQLITE_USE_URI (Debian's is) while SQLAlchemy opens it as a plain name, so the
# reservations and the schema would land in two different files.
_PLAIN = re.compile(r"sqlite(?:\+pysqlite)?:///(?![fF][iI][lL][eE]:)([^?#%]+)")
_IN_MEMORY = ("an in-memory SQLite store cannot be shared between calls and processes; "
              "use a file (effectgate.testing.temporary_gate() makes a throw-away one)")
_BUSY, _WAL, _FULL = "PRAGMA busy_timeout=60000", "PRAGMA journal_mode=WAL", \
    "PRAGMA synchronous=FULL"


def database_of(url: str) -> str | None:
    """The file a plain ``sqlite:///path`` URL names, or None for any other URL."""
    found = _PLAIN.fullmatch(url)
    return None if found is None else found.group(1)


def check_database(database: str, url: str, *, read_only: bool) -> None:
    """Refuse a database no other connection or process shares (:func:`refuse_in_memory`)
    and, read-only, a file that is not there; read-write, make the file's folder (a ``file:``
    URI's: the folder of the path in it)."""
    refuse_in_memory(database)
    uri = uri_parts(database)
    path = os.path.expanduser(database) if uri is None else uri[0]
    if read_only:
        if not os.path.isfile(path):
            raise StoreError(f"no effectgate store at {url} (no such file)")
    else:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)


def refuse_in_memory(database: str, options: Iterable[tuple[str, str]] = ()) -> None:
    """:class:`ConfigError` when SQLite would open ``database`` (a file name or a ``file:``
    URI), with ``options`` (a URL's query, as SQLAlchemy read it), as a database only this
    connection sees: ``:memory:``, an empty name (a private temporary file), a URI whose path
    is one of those or that asks for ``mode=memory`` or the ``memdb`` VFS. Each process (and
    each connection) would reserve the same key in its own store, and nothing would survive a
    crash. Read on the safe side: in any case, %-escapes decoded, and whether or not the URL
    asks SQLite to read URIs (SQLite may read them anyway)."""
    uri = uri_parts(database)
    path, pairs = (database, []) if uri is None else uri
    pairs += [(_decoded(key), _decoded(value)) for key, value in options]
    if path in ("", ":memory:") or any(
            (key.lower(), value.lower()) in (("mode", "memory"), ("vfs", "memdb"))
            for key, value in pairs):
        raise ConfigError(_IN_MEMORY)


def uri_parts(name: str) -> tuple[str, list[tuple[str, str]]] | None:
    """``name`` read as SQLite reads a URI file name (``sqlite3ParseUri``): its path and its
    query's (key, value) pairs, %-decoded; None when ``name`` is no ``file:`` URI. A
    fragment is dropped, an authority (empty or ``localhost``) too; escapes are decoded after
    the name is split, so an escaped ``?``, ``&`` or ``=`` separates nothing."""
    if name[:5].lower() != "file:":
        return None
    rest = name[5:].split("#", 1)[0]
    if rest.startswith("//"):  # the path starts at the authority's end (none: it is empty)
        slash = rest.find("/", 2)
        rest = "" if slash < 0 else rest[slash:]
    path, _, query = rest.partition("?")
    pairs = [(_decoded(key), _decoded(value)) for key, _, value in
             (option.partition("=") for option in query.split("&")) if key]
    return _decoded(path), pairs


def _decoded(part: str) -> str:
    """``part`` of a URI %-decoded as SQLite decodes it (``%00`` ends it)."""
    from urllib.parse import unquote  # (with ipaddress: not on a plain URL's way to a begin)

    return unquote(part, errors="surrogateescape").split("\x00", 1)[0]


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
