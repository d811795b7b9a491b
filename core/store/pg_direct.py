"""Postgres opened without SQLAlchemy, so that a worker's way to its first ``begin`` does not
import it (as :mod:`effectgate.store.embedded` does for SQLite): a plain ``postgresql://`` URL
is handed to libpq as the connection URI it already is, its connections are opened with
psycopg itself (the settings the engine's connect hook gives its own), and a store already
at this schema version is checked here, from its meta rows and the columns of its tables.
Everything else — a URL with anything libpq and SQLAlchemy might read differently, a
read-only store, a store to create or migrate, any doubt — goes the SQLAlchemy way, which
also says what is wrong.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from .version import SCHEMA_VERSION

__all__ = ["CONNECT_TIMEOUT", "IDLE_IN_TRANSACTION", "connect", "conninfo_of", "hidden",
           "read_meta", "session_sql", "set_up", "timeout_chosen", "with_connect_timeout"]

# postgresql[+psycopg]://[user[:password]@]host[:port]/database[?key=value&...], in the
# characters where libpq's URI parser and SQLAlchemy's make_url read the same: a '%' only as
# an escape both decode, none in host or database (only one of them decodes it there), no
# '/', '@' or space in a password, no '+' in the query (parse_qsl reads it as a space), one
# '=' per pair, no fragment.
_ESCAPED = r"(?:[^%@/?#\s+]|%[0-9A-Fa-f]{2})"
_URL = re.compile(
    r"postgresql(?:\+psycopg)?://"
    rf"(?:(?P<user>(?:[A-Za-z0-9._~-]|%[0-9A-Fa-f]{{2}})+)(?::(?P<password>{_ESCAPED}*))?@)?"
    r"(?P<host>[A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?"
    r"(?:/(?P<database>[A-Za-z0-9._~-]*))?"
    r"(?:\?(?P<query>(?:[^%#\s+]|%[0-9A-Fa-f]{2})*))?"
)
# The libpq connection parameters a query may carry here; SQLAlchemy hands each one to
# psycopg as the keyword of that name, which means the same.
_LIBPQ = frozenset({
    "application_name", "connect_timeout", "host", "hostaddr", "keepalives",
    "keepalives_idle", "options", "port", "sslcert", "sslkey", "sslmode", "sslrootcert",
    "target_session_attrs",
})


def conninfo_of(url: str) -> str | None:
    """The libpq connection URI a plain Postgres URL stands for (the same server, user,
    database and options SQLAlchemy's psycopg dialect connects with), or None for any
    other URL."""
    found = _URL.fullmatch(url)
    if found is None:
        return None
    query = found.group("query")
    if query is not None:
        seen = set()
        for pair in query.split("&"):
            name, sep, value = pair.partition("=")
            if not sep or "=" in value or name not in _LIBPQ or name in seen:
                return None
            seen.add(name)
    return "postgresql://" + url.split("://", 1)[1]


def hidden(url: str) -> str | None:
    """A URL the store opens itself (:func:`conninfo_of`) with its password shown as ``***``
    (the rest as written), or None for any other URL."""
    found = _URL.fullmatch(url)
    if found is None or conninfo_of(url) is None:
        return None
    if found.group("password") is None:
        return url
    start, end = found.span("password")
    return url[:start] + "***" + url[end:]


IDLE_IN_TRANSACTION = "60s"
"""How long the server lets one of the store's connections sit idle inside a transaction
before it ends the session (where the server sets no limit of its own): the store's
transactions last milliseconds, and a worker frozen inside one (stopped, paused, cut off)
would otherwise hold its locks — a spend counter every governed begin of the namespace
needs — until TCP gives up."""


CONNECT_TIMEOUT = 10
"""Seconds libpq waits for a connection to the server to open (per host it tries), where the
user chose no ``connect_timeout`` of their own: without one it waits for the OS to give up on
TCP (minutes) or, on a server that accepts and never answers, forever — a ``Gate`` hangs
opening, and a release thread keeps the program from ending. Ten seconds is well above a TLS
handshake over a slow network or a busy server's answer (libpq advises no less than two)."""


def timeout_chosen(params: Mapping[str, Any]) -> bool:
    """True when the user chose a connect timeout: ``connect_timeout`` among the connection
    parameters ``params`` (their URL's), or ``$PGCONNECT_TIMEOUT``; theirs is never replaced.
    An empty one (``?connect_timeout=``) is no choice, as SQLAlchemy's URL parser reads it."""
    return bool(params.get("connect_timeout")) or bool(os.environ.get("PGCONNECT_TIMEOUT"))


def with_connect_timeout(conninfo: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword options to open ``conninfo`` with: ``options`` and, unless the user chose a
    timeout (:func:`timeout_chosen`, in either), ``connect_timeout`` :data:`CONNECT_TIMEOUT`."""
    from psycopg.conninfo import conninfo_to_dict

    if timeout_chosen(conninfo_to_dict(conninfo, **options)):
        return dict(options)
    return {**options, "connect_timeout": CONNECT_TIMEOUT}


def session_sql(durability: str) -> str:
    """The one statement that gives a new connection the store's session settings (the sync
    and the async store both run it). A reservation must be durable before the body runs,
    whatever the server's default: ``off`` is raised to ``on`` (a stronger setting, e.g.
    ``remote_apply``, is kept); ``durability="relaxed"`` is the explicit opt-in to commit
    nothing synchronously. READ COMMITTED, whatever the server's default: the store's
    compare-and-set statements rely on its re-check of a row after a lock wait (under
    REPEATABLE READ or SERIALIZABLE a race is a serialization failure, a begin a StoreError).
    And :data:`IDLE_IN_TRANSACTION`, where the server has no limit."""
    sync = ("set_config('synchronous_commit', 'off', false)" if durability == "relaxed" else
            "CASE WHEN current_setting('synchronous_commit') = 'off' "
            "THEN set_config('synchronous_commit', 'on', false) END")
    return (f"SELECT {sync}, CASE WHEN current_setting('default_transaction_isolation') <> "
            "'read committed' THEN set_config('default_transaction_isolation', "
            "'read committed', false) END, "
            "CASE WHEN current_setting('idle_in_transaction_session_timeout')"
            f" = '0' THEN set_config('idle_in_transaction_session_timeout', "
            f"'{IDLE_IN_TRANSACTION}', false) END")


def set_up(conn: Any, durability: str) -> None:
    """Give a new connection the store's session settings (:func:`session_sql`; the
    engine's connect hook calls this too)."""
    with conn.cursor() as cur:
        cur.execute(session_sql(durability))


def connect(conninfo: str, durability: str) -> Any:
    """A psycopg connection to ``conninfo`` in autocommit mode, given up after the connect
    timeout (:func:`with_connect_timeout`), set up as the engine's pooled ones are
    (:func:`set_up`)."""
    import psycopg

    conn = psycopg.connect(conninfo, autocommit=True, **with_connect_timeout(conninfo, {}))
    try:
        set_up(conn, durability)
    except BaseException:
        conn.close()
        raise
    return conn


_COLUMNS = ("SELECT c.relname, a.attname FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relname = ANY(%s) "
            "AND a.attnum > 0 AND NOT a.attisdropped")


def read_meta(conn: Any) -> dict[str, str] | None:
    """The ``effectgate_meta`` rows of a store at exactly this schema version whose tables,
    in the current schema, have every column it reads; None otherwise (a store to create, to
    migrate, or to refuse: the schema module decides which)."""
    import psycopg

    from .sqlite_texts import COLUMNS  # the schema's columns, the same on every dialect

    try:
        rows = {str(name): str(value) for name, value in
                conn.execute("SELECT name, value FROM effectgate_meta").fetchall()}
        if rows.get("schema_version") != str(SCHEMA_VERSION) or "vendor_secret" not in rows:
            return None
        have: dict[str, set[str]] = {}
        for table, column in conn.execute(_COLUMNS, (list(COLUMNS),)).fetchall():
            have.setdefault(table, set()).add(column)
        if any(not wanted <= have.get(table, set()) for table, wanted in COLUMNS.items()):
            return None
    except psycopg.Error:
        return None
    return rows
