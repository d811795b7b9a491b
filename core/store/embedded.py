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

__all__ = ["check_database", "connect", "database_of", "read_meta", "refuse_unsafe", "set_up",
           "uri_parts"]

# sqlite:///relative/path or sqlite:////absolute/path, nothing SQLAlchemy would read further
# (no query, no escapes): the file is the text after the third slash, exactly as make_url has it.
# A name that starts with "file:" is left to SQLAlchemy too: SQLite reads it as a URI when it was
# built with SQLITE_USE_URI (Debian's is) while SQLAlchemy opens it as a plain name, so the
# reservations and the schema would land in two different files.
_PLAIN = re.compile(r"sqlite(?:\+pysqlite)?:///(?![fF][iI][lL][eE]:)([^?#%]+)")
_IN_MEMORY = ("an in-memory SQLite store cannot be shared between calls and processes; "
              "use a file (effectgate.testing.temporary_gate() makes a throw-away one)")
# The VFS SQLite opens a file with by default, which locks it as every other process does:
# "unix-excl" keeps other processes out until the connection closes, "unix-dotfile" locks in a
# way processes using the default do not see (and without WAL), "unix-none" not at all.
_LOCKING_VFS = ("unix", "win32")
_FALSE = ("0", "no", "off", "false")  # the false spellings of a URI boolean SQLite reads
_BUSY, _WAL, _FULL = "PRAGMA busy_timeout=60000", "PRAGMA journal_mode=WAL", \
    "PRAGMA synchronous=FULL"


def database_of(url: str) -> str | None:
    """The file a plain ``sqlite:///path`` URL names, or None for any other URL."""
    found = _PLAIN.fullmatch(url)
    return None if found is None else found.group(1)


def check_database(database: str, url: str, *, read_only: bool) -> None:
    """Refuse a database no other connection or process shares, or shares unlocked
    (:func:`refuse_unsafe`), a file with more than one name (hard links: each name has a
    write-ahead log and locks of its own), and, read-only, a file that is not there;
    read-write, make the file's folder (a ``file:`` URI's: the folder of the path in it)."""
    refuse_unsafe(database, read_only=read_only)
    uri = uri_parts(database)
    path = os.path.expanduser(database) if uri is None else uri[0]
    try:
        links = os.stat(path).st_nlink
    except (OSError, ValueError):  # not there yet (made on first use), or no name stat reads
        links = 1
    if links > 1:
        raise ConfigError(
            f"the store file {path!r} has {links} names (hard links): SQLite keeps the "
            "write-ahead log and the locks beside the name it opens, so processes opening it "
            "by different names could each execute the same effect; open it by one name "
            "(remove the other links; a symbolic link is safe)")
    if read_only:
        if not os.path.isfile(path):
            raise StoreError(f"no effectgate store at {url} (no such file)")
    else:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)


def refuse_unsafe(database: str, options: Iterable[tuple[str, str]] = (), *,
                  read_only: bool) -> None:
    """:class:`ConfigError` when SQLite would open ``database`` (a file name or a ``file:``
    URI), with ``options`` (a URL's query, as SQLAlchemy read it), in a way that breaks what
    the store relies on. Read on the safe side: keys in any case, %-escapes decoded, every
    occurrence of a key, and whether or not the URL asks SQLite to read URIs (SQLite may read
    them anyway).

    - A database only this connection sees: ``:memory:``, an empty name (a private temporary
      file), a URI whose path is one of those or that asks for ``mode=memory`` or the
      ``memdb`` VFS. Each process (and each connection) would reserve the same key in its own
      store, and nothing would survive a crash.
    - A file opened without the locks other processes take: ``nolock`` or ``immutable`` with
      any value but a false one (``0``, ``no``, ``off``, ``false``), a ``vfs`` other than the
      default (``unix``; ``win32`` on Windows). Several processes could each win one key.
    - ``cache`` other than ``private``: a shared cache locks tables within the process
      without the busy timeout's wait, so concurrent calls fail (their reports are lost).
    - ``mode=ro`` for a store opened read-write: every write would fail.
    """
    uri = uri_parts(database)
    path, pairs = (database, []) if uri is None else uri
    pairs += [(_decoded(key), _decoded(value)) for key, value in options]
    pairs = [(key.lower(), value) for key, value in pairs]
    if path in ("", ":memory:") or any(
            (key, value.lower()) in (("mode", "memory"), ("vfs", "memdb"))
            for key, value in pairs):
        raise ConfigError(_IN_MEMORY)
    for key, value in pairs:
        if key in ("nolock", "immutable") and value.lower() not in _FALSE:
            raise ConfigError(
                f"the SQLite URI parameter {key}={value[:20]!r} opens the store without "
                "locking it: several processes could each execute the same effect; remove it")
        if key == "vfs" and value not in _LOCKING_VFS:
            raise ConfigError(
                f"the SQLite VFS {value[:40]!r} does not lock the store as other processes "
                f"do (several could execute the same effect, or all but one wait): remove "
                f"the vfs parameter (SQLite's default, {_LOCKING_VFS[0]!r}, locks)")
        if key == "cache" and value.lower() != "private":
            raise ConfigError(
                "a shared SQLite cache (cache=shared) makes concurrent calls of one process "
                "fail without waiting ('database table is locked'), their reports lost: "
                "remove the cache parameter")
        if key == "mode" and value.lower() == "ro" and not read_only:
            raise ConfigError("the SQLite URI parameter mode=ro opens the store read-only: "
                              "open it with read_only=True, or remove mode=ro")


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
