"""Engines and the per-thread driver connections the per-call path runs on.

The per-call path skips the pool's checkout and reset: each thread keeps one driver connection
(``sqlite3`` / ``psycopg``) detached from the engine's pool, in autocommit mode; a connection
that broke is dropped and the next call opens another; a thread's connection is closed once the
thread has ended.

Reads and writes take different paths, chosen by the caller (never guessed from a statement's
text: on Postgres some writes are ``SELECT`` calls of the store's functions). A read
(:meth:`Connections.read`, :meth:`Connections.first`) that finds the connection an earlier call
left this thread closed by the server (a restart, ``pg_terminate_backend``, an idle timeout, a
proxy) runs once more on a new connection: it changes nothing, so nothing can happen twice. A
connection this same call opened is not tried again (a server that is down fails a read after
one connect attempt). A write (:meth:`Connections.run`, :meth:`Connections.transaction`) is
never repeated: one whose reply was lost may have committed, and it fails (``StoreError``,
``outcome_unknown``) for its caller to recover.

Durability is chosen per commit. SQLite: ``synchronous=FULL`` for every commit that reserves,
``NORMAL`` for outcomes unless ``durability="all"`` (``"relaxed"`` syncs nothing, an explicit
opt-in). Postgres: every connection commits synchronously (``synchronous_commit`` is raised to
``on`` when the server's default is ``off``), so a reservation is durable whatever the server
says.

Forks: a child never uses or closes a connection its parent opened. On SQLite a fork waits
until no thread of this process is inside a write (``os.register_at_fork``), because a child
that inherits SQLite's in-process lock state from a thread caught inside a write transaction
could never write ("database is locked", forever).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import weakref
from collections.abc import Iterator, Mapping
from time import monotonic
from typing import TYPE_CHECKING, Any, Literal, NoReturn, overload

from ..errors import ConfigError, StoreError
from . import embedded, pg_direct
from .version import VERSION_SQL, VersionWatch

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from .sql import Sql

__all__ = ["DEFAULT_ASYNC_POOL_SIZE", "MAX_POOL_SIZE", "Connections", "Durability",
           "aborted_whole", "again_after", "driver_text", "make_engine", "safe_url",
           "store_error"]

Durability = Literal["reserve", "all", "relaxed"]
_FULL, _NORMAL = "PRAGMA synchronous=FULL", "PRAGMA synchronous=NORMAL"
# Async callers on Postgres: connections open at once per event loop (further tasks wait).
DEFAULT_ASYNC_POOL_SIZE = 10
MAX_POOL_SIZE = 10_000

# Every live SQLite Connections object: a fork waits for each one's write lock.
_guarded: weakref.WeakSet[Connections] = weakref.WeakSet()
_guard_lock = threading.Lock()


def _before_fork() -> None:
    _guard_lock.acquire()
    for conns in sorted(_guarded, key=id):
        conns.write_lock.acquire()


def _after_fork() -> None:
    for conns in list(_guarded):
        with contextlib.suppress(RuntimeError):
            conns.write_lock.release()
    _guard_lock.release()


_forks = 0
"""How many forks this process is from the one that imported this module: a thread's
connection is used only in the generation it was opened in (an exact check, without a
``getpid`` system call on every statement)."""


def _after_fork_in_child() -> None:
    global _forks
    _forks += 1
    _after_fork()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork,
                    after_in_child=_after_fork_in_child)


class Connections:
    """One store's driver connections: one per thread, reopened after a break or a fork."""

    def __init__(self, url: str, durability: Durability, *, read_only: bool = False,
                 engine: Engine | None = None, database: str | None = None,
                 conninfo: str | None = None) -> None:
        """``engine``: the one made already (else made when first needed); ``database``:
        the SQLite file of a plain URL, whose connections open with sqlite3 itself;
        ``conninfo``: the libpq URI of a plain Postgres URL, whose connections open with
        psycopg itself."""
        if durability not in ("reserve", "all", "relaxed"):
            raise ConfigError(
                f"durability must be 'reserve', 'all' or 'relaxed', not {durability!r}"
            )
        self._engine = engine
        self.url = url
        self.read_only = read_only
        self.durability = durability
        self.database = database
        self.conninfo = conninfo
        self.is_sqlite = database is not None or (
            engine is not None and engine.dialect.name == "sqlite")
        self.sync_reserve = _NORMAL if durability == "relaxed" else _FULL
        self.sync_outcome = _FULL if durability == "all" else _NORMAL
        self.write_lock = threading.RLock()
        self._local = threading.local()
        # (owner thread, connection): closed on close(), or once the owner thread has ended
        self._opened: list[tuple[threading.Thread, Any]] = []
        self._opened_lock = threading.Lock()
        self._engine_lock = threading.Lock()
        self._pid = os.getpid()
        self._inherited: Any = None
        self.watch: VersionWatch | None = None  # set once the schema is known (not read-only)
        if self.is_sqlite:
            with _guard_lock:
                _guarded.add(self)

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (pooled connections, for everything but the per-call path),
        made the first time it is needed."""
        found = self._engine
        if found is None:
            with self._engine_lock:
                if self._engine is None:
                    self._engine = make_engine(self.url, read_only=self.read_only,
                                               durability=self.durability)
                found = self._engine
        return found

    def driver(self) -> Any:
        """This thread's driver connection, opened once and kept."""
        local = self._local
        try:  # the common case: this thread's connection, in this process
            conn = local.conn
            if conn is not None and local.forks == _forks:
                return conn
        except AttributeError:  # a thread's first call
            pass
        return self._open()

    def _open(self) -> Any:
        """Open this thread's connection (and, in a forked child, forget the parent's)."""
        local = self._local
        if self._pid != os.getpid():
            self._forget_parent()
            local = self._local
        try:
            if self.database is not None:
                conn: Any = embedded.connect(self.database, read_only=self.read_only)
            elif self.conninfo is not None:
                conn = pg_direct.connect(self.conninfo, self.durability)
            else:
                proxied = self.engine.raw_connection()
                conn = proxied.driver_connection
                proxied.detach()  # ours now: the pool neither counts nor resets it
        except Exception as err:
            raise StoreError(f"cannot reach the store at {safe_url(self.url)}: "
                             f"{type(err).__name__}") from err
        local.conn, local.forks = conn, _forks
        local.sync = _FULL  # as the connect hook left it
        self._adopt(conn)
        if self.watch is not None:  # a new connection: was the store migrated meanwhile?
            try:
                row = local.conn.execute(VERSION_SQL).fetchone()
            except Exception as err:
                self.drop()
                raise store_error(err, writing=False) from err
            self.watch.note(None if row is None else row[0])
        return conn

    def _adopt(self, conn: Any) -> None:
        """Keep ``conn`` as this thread's, and close the connections of threads that have
        ended (and this thread's dropped one): a thread per request must not leave a
        connection behind it each time, until the server runs out of them."""
        me = threading.current_thread()
        with self._opened_lock:
            kept = []
            for thread, other in self._opened:
                if thread is not me and thread.is_alive():
                    kept.append((thread, other))
                else:
                    with contextlib.suppress(Exception):
                        other.close()
            kept.append((me, conn))
            self._opened = kept

    def _forget_parent(self) -> None:
        """In a forked child: leave the parent's connections alone (never use or close a
        socket another process is using) and open our own from now on. The parent's stay
        referenced, so that not even garbage collection closes them here."""
        self._inherited = (self._opened, self._engine and self._engine.pool)
        if self._engine is not None:
            self._engine.dispose(close=False)
        self._opened = []
        self._opened_lock = threading.Lock()  # the parent's may have been held at the fork
        self._engine_lock = threading.Lock()
        self._local = threading.local()
        self._pid = os.getpid()

    def drop(self) -> None:
        """Forget (and close) this thread's connection: the next call opens a new one."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    @overload
    def run(self, sql: Sql, binds: Mapping[str, Any] | tuple[Any, ...],
            sync: str | None = None, *, count: Literal[False] = False) -> list[Any]: ...

    @overload
    def run(self, sql: Sql, binds: Mapping[str, Any] | tuple[Any, ...],
            sync: str | None = None, *, count: Literal[True]) -> int: ...

    def run(self, sql: Sql, binds: Mapping[str, Any] | tuple[Any, ...],
            sync: str | None = None, *, count: bool = False) -> list[Any] | int:
        """One statement in autocommit, never run again (a write's: reads take :meth:`read`):
        its rows, or (``count``) how many rows it changed; ``sync`` (SQLite) is the durability
        of its commit, and marks it as a write (``outcome_unknown`` when its connection
        broke). ``binds`` by name, or (a numbered text's) already in the order of
        ``sql.names``."""
        local = self._local  # (:meth:`driver`'s look-up, inline: every executed effect writes
        conn = getattr(local, "conn", None)  # twice)
        if conn is None or local.forks != _forks:
            conn = self.driver()
        if sql.order is not None and not isinstance(binds, tuple):
            binds = sql.order(binds)
        if sync is None:  # a read (or a write that needs no durability of its own)
            try:
                cur = conn.execute(sql.text, binds)
                return cur.rowcount if count else cur.fetchall()  # type: ignore[no-any-return]
            except Exception as err:
                raise self._failed(err, writing=False) from err
        if (watch := self.watch) is not None and monotonic() >= watch.next_read:
            self._check_version(conn)
        try:
            if self.is_sqlite:
                with self.write_lock:
                    if local.sync != sync:  # (this connection's: a close() meanwhile makes
                        conn.execute(sync)  # a new local) only when it changes: durability is
                        local.sync = sync  # per commit
                    cur = conn.execute(sql.text, binds)
                    return cur.rowcount if count else cur.fetchall()  # type: ignore[no-any-return]
            cur = conn.execute(sql.text, binds)
            return cur.rowcount if count else cur.fetchall()  # type: ignore[no-any-return]
        except Exception as err:
            raise self._failed(err, writing=True) from err

    def read(self, sql: Sql, binds: Mapping[str, Any] | tuple[Any, ...]) -> list[Any]:
        """A read's rows: a statement that changes nothing, as its caller knows (a write goes
        through :meth:`run`). On the connection an earlier call left this thread, closed by
        the server since, it runs once more on a new one (:meth:`_read_again`). ``binds`` as
        :meth:`run` takes them."""
        if sql.order is not None and not isinstance(binds, tuple):
            binds = sql.order(binds)
        local = self._local  # (driver()'s own look-up, inline: it tells a kept connection)
        conn = getattr(local, "conn", None)
        if conn is None or local.forks != _forks:
            return self._read_new(sql.text, binds, False)  # type: ignore[no-any-return]
        try:
            return conn.execute(sql.text, binds).fetchall()  # type: ignore[no-any-return]
        except Exception as err:
            return self._read_again(err, sql.text, binds, False)  # type: ignore[no-any-return]

    def first(self, sql: Sql, binds: Mapping[str, Any] | tuple[Any, ...]) -> Any:
        """A read's first row, or None (the hot read, a repeat's: one step, no list); once
        more on a new connection as :meth:`read`. ``binds`` as the text takes them: a
        numbered text's by position (``sql.names``' order), a named text's by name."""
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.forks != _forks:
            return self._read_new(sql.text, binds, True)
        try:
            return conn.execute(sql.text, binds).fetchone()
        except Exception as err:
            return self._read_again(err, sql.text, binds, True)

    def _read_again(self, err: Exception, text: str, binds: Any, one: bool) -> Any:
        """A read that failed with ``err`` on the connection an earlier call left this
        thread: run once more on a new connection when the server had closed it (Postgres;
        a read changes nothing, so running it again is safe), else ``err`` as a
        :class:`StoreError`."""
        if not is_disconnect(err):
            raise self._failed(err, writing=False) from err
        self.drop()
        return self._read_new(text, binds, one)

    def _read_new(self, text: str, binds: Any, one: bool) -> Any:
        """A read on a connection opened for it (this thread had none, or it was closed):
        never run again, so a server that is down fails it after one connect attempt."""
        conn = self._open()
        try:
            cur = conn.execute(text, binds)
            return cur.fetchone() if one else cur.fetchall()
        except Exception as err:
            raise self._failed(err, writing=False) from err

    def _failed(self, err: Exception, *, writing: bool) -> StoreError:
        """``err`` from the driver as a :class:`StoreError` (the connection dropped when it is
        gone)."""
        if is_disconnect(err):
            self.drop()
        return store_error(err, writing=writing)

    def _check_version(self, conn: Any) -> None:
        """Before a write: the store's schema version read again when the watch says so
        (:class:`~effectgate.store.version.VersionWatch`), refused when it is newer."""
        watch = self.watch
        if watch is None or not watch.due():
            return
        try:
            row = conn.execute(VERSION_SQL).fetchone()
        except Exception as err:
            if is_disconnect(err):
                self.drop()
            raise store_error(err, writing=True) from err
        watch.seen(None if row is None else row[0])

    def _roll_back(self, conn: Any) -> None:
        """End ``conn``'s transaction, if it has one; a connection that cannot is dropped."""
        try:
            if self.is_sqlite and not conn.in_transaction:
                return
            conn.execute("ROLLBACK")
        except BaseException:
            self.drop()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Several statements as one atomic, durable write (SQLite ``BEGIN IMMEDIATE``)."""
        conn = self.driver()
        with contextlib.ExitStack() as stack:
            try:
                if self.is_sqlite:
                    stack.enter_context(self.write_lock)
                    if self._local.sync != self.sync_reserve:
                        conn.execute(self.sync_reserve)
                        self._local.sync = self.sync_reserve
                    conn.execute("BEGIN IMMEDIATE")
                else:
                    conn.execute("BEGIN")
            except BaseException as err:
                # An exception raised into this thread from outside (a Temporal cancel) can
                # land just after BEGIN returned: never leave the connection in that
                # transaction, where the thread's next writes would wait, uncommitted.
                if is_disconnect(err) or not isinstance(err, Exception):
                    self.drop()
                else:
                    self._roll_back(conn)
                if not isinstance(err, Exception):
                    raise
                raise store_error(err, writing=True) from err
            try:
                self._check_version(conn)  # inside the transaction: it sees what it writes to
                yield Transaction(conn)
                conn.execute("COMMIT")
            except BaseException as err:
                self._roll_back(conn)
                if isinstance(err, Exception) and not isinstance(err, (StoreError, Rollback)) and (
                    type(err).__module__.startswith(("sqlite3", "psycopg"))
                ):
                    if is_disconnect(err):
                        self.drop()
                    raise store_error(err, writing=True) from err
                raise

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """This thread's driver connection, in autocommit mode (for tools and tests)."""
        conn = self.driver()
        try:
            yield conn
        except BaseException as err:
            if is_disconnect(err) or is_disconnect(err.__cause__):
                self.drop()
            raise

    def close(self, busy: frozenset[int] = frozenset()) -> None:
        """Close every connection this store opened (in this process) but those of the
        threads ``busy`` names (by ident: a statement may be running on them), which are kept
        for a later close; every thread opens a new one on its next call."""
        if self._pid != os.getpid():
            self._forget_parent()
        with self._opened_lock:
            kept = []
            for thread, conn in self._opened:
                if thread.ident in busy:
                    kept.append((thread, conn))
                    continue
                with contextlib.suppress(Exception):
                    conn.close()
            self._opened = kept
        self._local = threading.local()
        if self._engine is not None:
            self._engine.dispose()


class Rollback(Exception):
    """Raised inside :meth:`Connections.transaction` to undo it without an error."""


class Transaction:
    """Statements inside one transaction."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def all(self, sql: Sql, binds: Mapping[str, Any]) -> list[Any]:
        """Every row the statement returns (none for a statement that returns nothing)."""
        cursor = self.conn.execute(sql.text, binds if sql.order is None else sql.order(binds))
        return cursor.fetchall() if cursor.description is not None else []

    def one(self, sql: Sql, binds: Mapping[str, Any]) -> Any:
        """The first row the statement returns, or None."""
        rows = self.all(sql, binds)
        return rows[0] if rows else None

    @staticmethod
    def rollback() -> NoReturn:
        """Undo the transaction (raises :class:`Rollback`, which the caller catches)."""
        raise Rollback


def make_engine(url: str, *, read_only: bool = False,
                durability: Durability = "reserve") -> Engine:
    """The engine for ``url``: SQLite (a file; WAL) or Postgres (psycopg)."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as err:  # ValueError: a port that is no number
        what = "a port that is no number" if isinstance(err, ValueError) else str(err)
        raise ConfigError(f"not a database URL: {safe_url(url)} ({what})") from None
    if parsed.password is not None and "@" in f"{parsed.host or ''}/{parsed.database or ''}":
        # the password ended at its first '@': the rest of it would be the host the driver
        # names when it cannot resolve it
        raise ConfigError(f"not a database URL: {safe_url(url)} (an '@' in a password is "
                          "written %40)")
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        # the database the URL means (refused before the engine exists: nothing is opened)...
        embedded.refuse_unsafe(parsed.database or "", [
            (key, value) for key, values in parsed.query.items()
            for value in ((values,) if isinstance(values, str) else values)],
            read_only=read_only)
        try:
            engine = create_engine(
                parsed, isolation_level="AUTOCOMMIT",
                connect_args={"timeout": 60.0, "check_same_thread": False},
            )
            # ...and the name its driver will open (with ?uri=true, the database and the
            # query joined as a file: URI)
            named, _ = engine.dialect.create_connect_args(engine.url)
        except ArgumentError:  # a user, a password or a host in it: no SQLite URL
            raise ConfigError(f"not a SQLite URL: {safe_url(url)} (sqlite:///path/to/file.db)"
                              ) from None
        embedded.check_database(str(named[0]) if named else "", safe_url(url),
                                read_only=read_only)
        _fork_safe(engine)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            embedded.set_up(dbapi_conn, read_only=read_only)

        return engine
    if backend == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
        connect_args: dict[str, Any] = {}
        if read_only:  # kept beside the URL's own options (a search_path, say)
            own = parsed.query.get("options", "")
            own = " ".join(own) if isinstance(own, tuple) else own
            connect_args["options"] = f"{own} -c default_transaction_read_only=on".strip()
            parsed = parsed.difference_update_query(["options"])
        if not pg_direct.timeout_chosen(parsed.query):
            connect_args["connect_timeout"] = pg_direct.CONNECT_TIMEOUT
        try:
            engine = create_engine(  # pre-ping: a pooled connection the server dropped
                parsed, isolation_level="AUTOCOMMIT", pool_size=8, max_overflow=32,
                connect_args=connect_args, pool_pre_ping=True,  # while idle is replaced
            )
            engine.effectgate_connect_args = connect_args  # type: ignore[attr-defined]
        except (ModuleNotFoundError, NoSuchModuleError) as err:
            raise ConfigError(
                'Postgres needs psycopg: pip install ".[postgres]" in the effectgate clone'
            ) from err
        _fork_safe(engine)

        @event.listens_for(engine, "connect")
        def _synchronous(dbapi_conn: Any, _record: Any) -> None:
            pg_direct.set_up(dbapi_conn, durability)

        return engine
    raise ConfigError(f"effectgate supports sqlite and postgresql URLs, not {backend!r}")


def _fork_safe(engine: Engine) -> None:
    """Never hand a pooled connection to a process other than the one that opened it (after
    ``os.fork()`` the pool's sockets are shared with the parent): SQLAlchemy's recipe."""
    from sqlalchemy import event
    from sqlalchemy.exc import DisconnectionError

    @event.listens_for(engine, "connect")
    def _remember_pid(_dbapi_conn: Any, record: Any) -> None:
        record.info["pid"] = os.getpid()

    @event.listens_for(engine, "checkout")
    def _check_pid(_dbapi_conn: Any, record: Any, proxy: Any) -> None:
        pid = os.getpid()
        if record.info.get("pid", pid) != pid:
            record.dbapi_connection = proxy.dbapi_connection = None
            raise DisconnectionError(
                f"connection opened by process {record.info['pid']}, checked out in {pid}"
            )


def is_disconnect(err: BaseException | None) -> bool:
    """True when ``err`` means the connection itself is gone (Postgres)."""
    if err is None:
        return False
    name = type(err).__module__
    if name.startswith("psycopg"):
        conn_closed = "closed" in str(err).lower() or "terminat" in str(err).lower()
        return conn_closed or type(err).__name__ in ("OperationalError", "InterfaceError")
    return False


def aborted_whole(err: StoreError) -> bool:
    """Whether the server aborted ``err``'s transaction whole (a deadlock's victim, SQLSTATE
    40P01, or a serialization failure, 40001): nothing of it was written, and running it once
    more is safe."""
    return getattr(err.__cause__, "sqlstate", None) in ("40P01", "40001")


# A transaction the server aborted whole runs at most this many times in all.
_ABORTED_TRIES = 5


def again_after(err: StoreError, tries: int) -> float | None:
    """Seconds to wait before running once more a transaction that failed with ``err`` on
    its ``tries``-th run, or None to give up (raise ``err``). Only a transaction the server
    aborted whole runs again, a bounded number of times, after a random pause that grows:
    a deadlock's victim that ran again at once could meet the same writer again before that
    one saw the victim had gone (both waiting again, in the same order)."""
    if tries >= _ABORTED_TRIES or not aborted_whole(err):
        return None
    return random.uniform(0.005, 0.02 * 2 ** tries)


def store_error(err: Exception, *, writing: bool) -> StoreError:
    """``err`` from the driver as a :class:`StoreError`; ``outcome_unknown`` when a write's
    connection broke (it may or may not have committed)."""
    if isinstance(err, StoreError):
        return err
    unknown = writing and is_disconnect(err)
    return StoreError(f"the store failed: {type(err).__name__}: {driver_text(err)}",
                      outcome_unknown=unknown)


def driver_text(err: BaseException) -> str:
    """What a driver error may say in a message: its first line only (a driver's DETAIL
    lines and SQLAlchemy's ``[SQL: ...] [parameters: ...]`` carry the values written, which
    are results, errors and notes), through the default redactor, bounded."""
    from ..redact import bound, redact_text

    orig = getattr(err, "orig", None)  # SQLAlchemy's wrapper: the driver's own error
    first = str(orig if orig is not None else err).strip().split("\n", 1)[0]
    return bound(redact_text(first), 300)


def safe_url(url: str) -> str:
    """``url`` as it may be shown (messages, the CLI, the console): its password and its
    whole query string hidden (libpq reads a password, and a client key's, in the query too:
    ``?password=``, ``?sslpassword=``), every unsafe character escaped
    (:func:`~effectgate.redact.visible`). ``<unprintable url>`` for text that is no URL."""
    from ..redact import visible

    plain = url if embedded.database_of(url) is not None else pg_direct.hidden(url)
    if plain is None:  # not a URL the store opens itself: SQLAlchemy reads it
        from sqlalchemy.engine import make_url

        try:
            plain = make_url(url).render_as_string(hide_password=True)
        except Exception:  # nothing of it is shown
            return "<unprintable url>"
    base, query, _ = plain.partition("?")
    return visible(_one_at(base) + ("?***" if query else ""))


def _one_at(base: str) -> str:
    """``base`` (a URL without its query, its password shown as ``***``) with whatever follows
    the password up to the last ``@`` (or ``%40``) hidden too: a password holding a raw ``@``
    ends, for SQLAlchemy and libpq alike, at its first one, and the rest of it reads as the
    host (or the host and database)."""
    scheme, sep, rest = base.partition("://")
    userinfo, at, after = rest.partition("@")
    tail = after.replace("%40", "@").split("@")  # (the database's '@' is escaped)
    if not sep or not at or ":" not in userinfo or "/" in userinfo or len(tail) == 1:
        return base
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@***@{tail[-1]}"
