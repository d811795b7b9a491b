"""The store: one set of tables on SQLAlchemy Core, SQLite (WAL) or PostgreSQL, behind a few
domain operations — ``reserve``, ``fetch``, ``lapse``, ``move``, ``record_outcome``,
``extend``, ``resolve``, the approval decisions, ``prune`` — that take validated requests and
hand up typed rows (:mod:`effectgate.store.rows`). Statements, bind parameters, the history
encoding and transactions never leave this package.

* SQLite: WAL, ``busy_timeout`` so concurrent processes wait rather than fail, and
  ``synchronous=FULL`` for every commit that reserves (a reservation survives a power cut); the
  outcome commit runs at ``NORMAL`` and rides on the next sync (a lost outcome decays to
  AMBIGUOUS, never to a second execution). A repeat reads the key first and writes nothing;
  that read selects in full only what a repeat of a COMMITTED effect answers with
  (:class:`~effectgate.store.rows.CommittedHead`: each column a driver hands up costs as much
  as a cheap Python call), and reads any other state's head again. SQLite binds and stores
  every column an insert lists, so a request with none of the optional fields is reserved by
  an insert of only the columns it sets; a report that moves no spend is told it landed by
  its row count, not by a RETURNING; and the texts run with numbered placeholders, bound by
  position (a name looked up per bind costs the driver more than the bind).
* PostgreSQL: a unique index, and the reservation as one call to a function generated from the
  dialect-compiled read and insert (``pg_reserve``): one round trip, and a repeat only reads.

Both open a plain URL without SQLAlchemy when the store is up to date (``embedded``,
``pg_direct``): the statements come rendered ahead of time (``sqlite_texts``, ``pg_texts``)
and the connections from the driver itself. The engine is made only for a store to create or
migrate, another URL form, a read-only store, and the tools.

The reads here run through ``Connections.read`` / ``first`` (once more on a new connection when
the server closed the one kept), the writes through ``run`` / ``transaction`` (never twice).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .. import validate
from ..decide import outcome_spend_delta, reads_first
from ..errors import ConfigError, StoreError
from ..governance import superseded, waits_for_room
from ..states import ApprovalState, Outcome, State
from . import embedded, pg_direct
from .binds import (
    NULL_NOTE,
    NewApproval,
    bare_binds,
    begin_binds,
    committed_binds,
    extend_binds,
    is_bare,
    late_binds,
    move_binds,
    outcome_binds,
    over_ceiling,
)
from .connections import (
    DEFAULT_ASYNC_POOL_SIZE,
    MAX_POOL_SIZE,
    Connections,
    Durability,
    Rollback,
    Transaction,
    again_after,
    driver_text,
    make_engine,
    safe_url,
    store_error,
)
from .lines import encode_text
from .listing import Filters, listing_binds, listing_sql, named_sqlite
from .rows import (
    ApprovalRow,
    CommittedHead,
    EffectHead,
    EffectRow,
    Moved,
    Recorded,
    approval_row,
    committed_head,
    effect_head,
    effect_row,
    found_head,
    unknown_state,
)
from .sql import install, statements_for
from .version import VersionWatch, vendor_secret_of
from .workers import WorkerCalls

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from ..decide import Move, Resolution
    from ..request import Lease, LeaseSecret, Request
    from .async_pg import AsyncPostgres
    from .sql import Sql
    from .threaded import ThreadedStore

__all__ = ["DEFAULT_URL", "Durability", "NewApproval", "Store", "resolve_url"]

_BACKGROUND_WAIT = 5.0  # seconds close() waits for the store's work off its callers' threads

DEFAULT_URL = "sqlite:///.effectgate/effects.db"


def _direct(url: str) -> str | None:
    """The libpq URI of a plain Postgres URL when psycopg is there to open it (without it, the
    SQLAlchemy way says what to install)."""
    conninfo = pg_direct.conninfo_of(url)
    if conninfo is None:
        return None
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return None
    return conninfo


def resolve_url(url: str | None) -> str:
    """``url``, else ``$EFFECTGATE_URL``, else the embedded SQLite default."""
    return url or os.environ.get("EFFECTGATE_URL") or DEFAULT_URL


_T = TypeVar("_T")


class Store:
    """One database URL: its connections, durability and the domain operations."""

    def __init__(self, url: str | None = None, *, durability: Durability = "reserve",
                 read_only: bool = False, async_pool_size: int = DEFAULT_ASYNC_POOL_SIZE) -> None:
        self.async_pool_size = validate.whole(async_pool_size, "async_pool_size", minimum=1,
                                              maximum=MAX_POOL_SIZE)
        self.url = resolve_url(url)
        self.read_only = read_only
        self.durability = durability
        # A plain sqlite:///path or postgresql:// URL opens without SQLAlchemy when the store
        # is up to date (store.embedded, store.pg_direct); every other URL, and any store to
        # create or migrate, through it.
        database = embedded.database_of(self.url)
        conninfo = None if read_only or database is not None else _direct(self.url)
        engine: Engine | None = None
        if database is not None:
            embedded.check_database(database, self.url, read_only=read_only)
            self.dialect_name = "sqlite"
        elif conninfo is not None:
            self.dialect_name = "postgresql"
        else:
            engine = make_engine(self.url, read_only=read_only, durability=durability)
            self.dialect_name = engine.dialect.name
        self._conninfo = conninfo
        self._connect_args: dict[str, Any] = dict(getattr(engine, "effectgate_connect_args", {}))
        self.is_sqlite = self.dialect_name == "sqlite"
        self._conns = Connections(self.url, durability, read_only=read_only, engine=engine,
                                  database=database, conninfo=conninfo)
        self.background: set[threading.Thread] = set()
        """The threads :meth:`in_background` started that are still running."""
        self._worker_calls = WorkerCalls()
        try:  # a store refused here (newer, missing, no functions) keeps nothing open
            found = self._read_meta() if database is not None or conninfo is not None else None
            self.meta: dict[str, str] = self._schema() if found is None else found
            # A store kept open while a newer effectgate migrates it stops writing (read-only:
            # the database refuses writes already).
            self.version_watch = None if read_only else VersionWatch(safe_url(self.url))
            self._conns.watch = self.version_watch
            self.secret = vendor_secret_of(self.meta)
            self.sql = statements_for(self.dialect_name, durability)
            functions = (self.sql.reserve_function, self.sql.bare_function,
                         self.sql.governed_function)
            if self.sql.reserve_function is not None and not read_only:
                try:
                    with self._conns.connection() as conn:
                        install(conn, tuple(f for f in functions if f is not None))
                except Exception as err:
                    raise StoreError(
                        "cannot install the reservation functions of this version of effectgate "
                        f"({driver_text(err)}): open the store once as a role that may create "
                        "functions in its schema (its owner), then start the workers") from err
        except BaseException:
            self._conns.close()
            raise
        self._reserve_sync = self._conns.sync_reserve
        self._outcome_sync = self._conns.sync_outcome
        self._async_face: ThreadedStore | AsyncPostgres | None = None
        self._async_face_lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (tools, reads by filter, retention), made when first needed:
        an embedded store's per-call path runs without it."""
        return self._conns.engine

    def _read_meta(self) -> dict[str, str] | None:
        """The meta rows of a store opened without SQLAlchemy when it is up to date, else
        None."""
        if not self.is_sqlite:
            try:
                self._conns.driver()
            except StoreError as err:  # the server did not answer: the schema's way, through
                # SQLAlchemy, would wait out the connect timeout a second time to say so
                cause = err.__cause__ or err
                raise StoreError(f"cannot open the store at {safe_url(self.url)}: "
                                 f"{type(cause).__name__}: {driver_text(cause)}") from cause
        try:
            with self._conns.connection() as conn:
                if self.is_sqlite:
                    return embedded.read_meta(conn)
                found = pg_direct.read_meta(conn)
                if found is None and (conn.broken or conn.closed):
                    self._conns.drop()  # gone while it read: the next call opens another
                return found
        except StoreError:
            self._conns.drop()
            return None  # the schema's way says what is wrong

    def _schema(self) -> dict[str, str]:
        """Create or migrate the tables (read-only: only read them), through SQLAlchemy."""
        from .schema import ensure_schema, read_schema

        where = safe_url(self.url)
        try:
            return read_schema(self.engine, where) if self.read_only else (
                ensure_schema(self.engine, where))
        except (StoreError, ConfigError):
            raise
        except Exception as err:
            raise StoreError(f"cannot open the store at {where}: "
                             f"{type(err).__name__}: {driver_text(err)}") from err

    def __repr__(self) -> str:
        return f"Store({safe_url(self.url)!r})"

    def async_face(self) -> ThreadedStore | AsyncPostgres:
        """The operations for async callers, one per store (every gate on this store, in any
        namespace, shares its connections): natively async on Postgres (psycopg's
        ``AsyncConnection``, one pool per event loop of at most ``async_pool_size``
        connections, for which further tasks wait in line); on SQLite, reads on the loop
        itself (microseconds, never waiting on a writer in WAL mode) and writes on a worker
        thread."""
        face = self._async_face
        if face is None:
            with self._async_face_lock:
                if self._async_face is None:
                    self._async_face = self._make_async_face()
                face = self._async_face
        return face

    def _make_async_face(self) -> ThreadedStore | AsyncPostgres:
        if self.is_sqlite:
            from .threaded import ThreadedStore

            return ThreadedStore(self)
        from .async_pg import AsyncPostgres
        from .pg_direct import session_sql

        if self._conninfo is not None:
            conninfo, options = self._conninfo, {}
        else:
            cargs, cparams = self.engine.dialect.create_connect_args(self.engine.url)
            conninfo = cargs[0] if cargs else ""
            options = {**cparams, **self._connect_args}
        return AsyncPostgres(self, conninfo, options, session_sql(self.durability),
                             self.async_pool_size)

    # -- for tools and tests ------------------------------------------------------------------

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """This thread's driver connection (``sqlite3`` or ``psycopg``), in autocommit mode."""
        with self._conns.connection() as conn:
            yield conn

    def close(self) -> None:
        """Close every connection this store opened (the async callers' idle ones too), once
        the store's work off its callers' threads has ended: the threads :meth:`in_background`
        started and the calls :meth:`on_worker` handed to the executor (all of them within
        ``_BACKGROUND_WAIT`` seconds), but for those the closing thread is itself inside. None
        starts while the connections close: one handed over meanwhile runs after, on a new
        connection. A call still running when the wait ran out keeps its thread's connection
        open (closing it under a statement can crash the process): it is closed by a later
        close, or with the process. A sync call on another thread is not counted (the sync
        path pays for nothing): close once those have returned."""
        with self._worker_calls.quiet(time.monotonic() + _BACKGROUND_WAIT) as busy:
            if self._async_face is not None:
                self._async_face.close_idle()
            self._conns.close(busy)

    dispose = close

    def in_background(self, name: str, fn: Callable[[], object]) -> None:
        """Run ``fn`` on a (non-daemon) thread of its own, which finishes even as the program
        ends and closes the connection it opened: a write left behind by a caller that is
        gone (a release, a report). :meth:`close` waits for it: closing a connection while
        another thread uses it can crash the process (SQLite's and psycopg's both)."""
        calls = self._worker_calls
        ticket = calls.handed()  # before it starts: a close() from now on waits for it

        def run() -> None:
            calls.start(ticket)
            try:
                fn()
            finally:
                self.drop_thread_connection()
                self.background.discard(thread)
                calls.end(ticket)

        thread = threading.Thread(target=run, name=name)
        self.background.add(thread)
        try:
            thread.start()
        except RuntimeError:  # the interpreter is shutting down
            self.background.discard(thread)
            calls.withdraw(ticket)

    async def on_worker(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` on the event loop's default executor
        (``asyncio.to_thread``): an async caller's call of this store off the loop, which
        :meth:`close` waits for from the moment it is handed over (before a worker takes it)
        to its end. Once a worker has started it, it runs to its end whether or not its caller
        is still there (a cancelled ``abegin``'s reservation runs on, and is released on the
        same worker); one whose caller was gone before a worker started it is not run at all.
        A worker thread stays in the executor's pool after its call, so the calls are
        counted, not the threads; the count costs the async path a lock or two per call, the
        sync path nothing."""
        import asyncio  # (an async caller's: imported already)

        calls = self._worker_calls
        ticket = calls.handed()

        def run() -> _T:
            if not calls.start(ticket):  # its caller was cancelled before a worker took it
                return cast("_T", None)  # (nobody takes the answer)
            try:
                return fn(*args, **kwargs)
            finally:
                calls.end(ticket)

        # Named as the call it makes (what a look at the executor's work sees: a test that
        # counts the thread hops of an async tool, for one).
        run.__qualname__ = getattr(fn, "__qualname__", run.__qualname__)
        try:
            return await asyncio.to_thread(run)
        except BaseException:
            calls.withdraw(ticket)  # cancelled before a worker took it: it never runs
            raise

    def drop_thread_connection(self) -> None:
        """Close the connection this thread opened, if any (a short-lived thread's, before it
        ends: the next call on this thread opens another)."""
        self._conns.drop()

    def now(self) -> float:
        """The store's clock, epoch seconds."""
        return float(self._conns.read(self.sql.now, {})[0][0])

    # -- begin ----------------------------------------------------------------------------------

    def reserve(self, req: Request, secret: LeaseSecret) -> EffectHead | CommittedHead:
        """Insert a plain (ungoverned) effect as IN_FLIGHT if its key is absent; otherwise
        return the existing row, unchanged (on SQLite a COMMITTED one as a
        :class:`CommittedHead`: :meth:`first_read`). ``inserted`` tells which. The insert is
        durable."""
        run = self._conns.run
        for _ in range(8):
            if self.is_sqlite:
                # Embedded: a read is cheap, and a repeat (the common refusal) must not write.
                found = self.first_read(req.namespace, req.key)
                if found is not None:
                    return found
                if is_bare(req):
                    sql = self.sql.insert_bare
                    new = run(sql, bare_binds(sql, req, secret.hash), self._reserve_sync)
                else:
                    new = run(self.sql.insert_lean, begin_binds(req, State.IN_FLIGHT,
                                                                secret.hash), self._reserve_sync)
                if new:
                    effect_id, lease, now = new[0]
                    return _inserted(req, effect_id, lease, now, secret.hash)
            else:
                if is_bare(req):
                    sql = self.sql.reserve_bare
                    rows = run(sql, bare_binds(sql, req, secret.hash), self._reserve_sync)
                else:
                    rows = run(self.sql.reserve, begin_binds(req, State.IN_FLIGHT, secret.hash),
                               self._reserve_sync)
                if rows:
                    return effect_head(rows[0])
        raise StoreError("could not reserve or read the key after 8 tries", key=req.key)

    def first_read(self, namespace: str, key: str) -> EffectHead | CommittedHead | None:
        """A reservation's read of ``key`` before it inserts: a COMMITTED effect as a repeat of
        it reads it (:class:`CommittedHead`, a narrow read: the common refusal), any other
        effect's head in full (a second read), or None."""
        sql = self.sql.fetch_brief
        found = self._conns.first(sql, (namespace, key) if sql.order is not None else {
            "namespace": namespace, "key": key})  # SQLite's numbered text: binds by position
        if found is None:
            return None
        return committed_head(found, namespace, key) or self._fetch(namespace, key)

    def fetch(self, namespace: str, key: str) -> EffectHead | None:
        """The head of the effect at ``key``, or None."""
        return self._fetch(namespace, key)

    def _fetch(self, namespace: str, key: str) -> EffectHead | None:
        # (one store operation never calls another's public method: a caller that wraps them,
        # as the replay does, sees each operation once)
        rows = self._conns.read(self.sql.fetch, {"namespace": namespace, "key": key})
        return found_head(rows[0], namespace, key) if rows else None

    def lapse(self, row: EffectHead) -> EffectHead | None:
        """Compare-and-set an IN_FLIGHT effect past its lease to AMBIGUOUS (None: it moved)."""
        rows = self._conns.run(self.sql.lapse, {
            "namespace": row.namespace, "id": row.id, "token": row.token, "h_note": NULL_NOTE,
        }, self._outcome_sync)
        return effect_head(rows[0]) if rows else None

    def move(self, row: EffectHead | None, move: Move, req: Request, secret: LeaseSecret,
             approval: NewApproval | None = None) -> Moved:
        """Write ``move``: insert the key (``row`` None) or compare-and-set ``row`` on, with
        the approval it consumes or creates and the spend it charges, all or nothing."""
        binds = move_binds(row, move, req, secret, approval)
        if row is None and self.one_call(move):
            sql = self.one_call_sql(move)
            try:
                found = _again_if_aborted(lambda: self._conns.run(sql, binds,
                                                                  self._reserve_sync))
            except StoreError as err:
                return Moved(None, over_ceiling(err, move))
            return Moved(effect_head(found[0]) if found else None)
        return self._move(row, move, req, binds, approval)

    def _move(self, row: EffectHead | None, move: Move, req: Request, binds: dict[str, Any],
              approval: NewApproval | None) -> Moved:
        sql = self.sql.insert if row is None else self.sql.take
        if not (move.charges or move.consume_approval or move.forget_approval or approval):
            found = self._conns.run(sql, binds, self._reserve_sync)
            return Moved(_moved(found, row))
        over: str | None = None
        try:
            with self._conns.transaction() as tx:
                if move.consume_approval is not None:
                    tx.conn.execute(_BEFORE_CONSUME)
                    if tx.one(self.sql.approval_consume, {
                        "namespace": req.namespace, "approval_id": move.consume_approval,
                        "effect_type": req.effect_type, "key": req.key,
                        "payload_hash": req.payload_hash,
                    }) is None:
                        tx.rollback()
                if move.forget_approval is not None:
                    tx.all(self.sql.approval_forget, {
                        "namespace": req.namespace, "approval_id": move.forget_approval,
                        "reason": superseded(req.estimated_cost_micros, move.decision,
                                             approval.approval_id if approval else None)})
                if move.charges and row is not None and not self.is_sqlite:
                    tx.all(self.sql.lock_row, {"namespace": req.namespace, "id": row.id})
                charged: list[str] = []
                for charge in move.charges:
                    got = None if move.cost > charge.limit else tx.one(
                        self.sql.charge_day if charge.per_day else self.sql.charge,
                        {"namespace": req.namespace, "scope_key": charge.scope_key,
                         "cost": move.cost, "limit": charge.limit},
                    )
                    if got is None:
                        over = charge.label
                        if row is None or move.consume_approval is None:
                            tx.rollback()
                        self._waits_for_room(tx, row, over)
                        return Moved(None, over)
                    charged.append(got[0])
                binds["budget_keys"] = json.dumps(charged) if charged else None
                new = _moved(tx.all(sql, binds), row)
                if new is None:
                    tx.rollback()
                if approval is not None:
                    # Expired requests' arguments go as a new one is made (and at prune):
                    # raw arguments are kept only while someone may decide on them.
                    tx.all(self.sql.prune_arguments, {"namespace": req.namespace})
                    tx.all(self.sql.approval_insert, {
                        "approval_id": approval.approval_id, "namespace": req.namespace,
                        "effect_id": new.id, "effect_type": req.effect_type, "key": req.key,
                        "payload_hash": req.payload_hash, "agent_id": req.agent_id,
                        "run_id": req.run_id, "estimated_cost_micros": req.estimated_cost_micros,
                        "allow_self_approval": int(approval.allow_self_approval),
                        "expires_seconds": approval.expires_seconds,
                        "arguments": approval.arguments,
                    })
        except Rollback:
            return Moved(None, over)
        return Moved(new)

    def _waits_for_room(self, tx: Transaction, row: EffectHead, label: str) -> None:
        """An approved move refused by the ceiling ``label``: undo what it wrote (the
        approval consumed, the counters charged) and, in the same transaction, write why on
        its effect, which keeps waiting, approved, for room (compare-and-set on the token
        the move read: an effect that moved since is left as it is)."""
        tx.conn.execute(_UNDO_CONSUME)
        tx.all(self.sql.note_reason, {"namespace": row.namespace, "key": row.key,
                                      "token": row.token, "reason": waits_for_room(label)})

    def one_call(self, move: Move) -> bool:
        """Whether the insert of a new key by ``move`` is one round trip that reads first
        (Postgres: the generated functions; an existing key comes back unchanged, with
        ``inserted`` false). Moves that consume, forget or request an approval are not."""
        return not self.is_sqlite and reads_first(move)

    def one_call_sql(self, move: Move) -> Sql:
        """The statement :meth:`one_call` runs for ``move``."""
        return self.sql.reserve_governed if move.charges else self.sql.reserve

    # -- a holder's outcome ---------------------------------------------------------------------

    def record_outcome(self, namespace: str, lease: Lease, outcome: Outcome, *,
                       result: str | None, error: str | None, reason: str | None,
                       note: str | None, actual_cost_micros: int | None,
                       spends: bool | None,
                       overspend: Callable[[list[tuple[str, int]]], str | None] | None = None,
                       keeps_vendor_key: bool = False) -> Recorded | None:
        """Record the holder's outcome; None when its proof no longer holds (a newer holder,
        an operator's resolution, or a lease lapsed and acted upon since).

        A lease that lapsed while nobody acted still takes the report, late. ``spends``:
        False when the caller knows the attempt charged nothing (one statement), else the
        outcome and its spend move in one transaction. ``overspend`` is asked, when an actual
        cost above the estimate raised counters, with each (counter, spent now); a text it
        returns becomes the effect's ``reason`` in the same transaction.
        ``keeps_vendor_key``: a FAILED that a built-in classifier inferred leaves the next
        attempt the vendor key it has (any other FAILED moves it)."""
        # The common report, COMMITTED with nothing but its result (the decorator's): a text
        # of its own, with what is always the same written in.
        plain_commit = spends is False and outcome is Outcome.COMMITTED and error is None and (
            reason is None and note is None and actual_cost_micros is None)
        if plain_commit:
            sql = self.sql.report_committed
            if self._conns.run(sql, committed_binds(sql, namespace, lease, result),
                               self._outcome_sync, count=True):
                return _ON_TIME
        binds = outcome_binds(
            namespace, lease, outcome, result=result, error=error, reason=reason, note=note,
            actual_cost_micros=actual_cost_micros, keeps_vendor_key=keeps_vendor_key)
        if spends is False:
            if not plain_commit and self._conns.run(self.sql.report_plain, binds,
                                                    self._outcome_sync, count=True):
                return _ON_TIME
            rows = self._conns.run(self.sql.report_late, late_binds(binds, note),
                                   self._reserve_sync)
            return Recorded(rows[0][0], rows[0][1], True) if rows else None
        return _again_if_aborted(lambda: self._report_moving_spend(
            namespace, lease, outcome, binds, note, actual_cost_micros, overspend))

    def _report_moving_spend(self, namespace: str, lease: Lease, outcome: Outcome,
                             binds: dict[str, Any], note: str | None,
                             actual_cost_micros: int | None,
                             overspend: Callable[[list[tuple[str, int]]], str | None] | None,
                             ) -> Recorded | None:
        with self._conns.transaction() as tx:
            late = False
            found = tx.one(self.sql.report, binds)
            if found is None:
                late = True
                found = tx.one(self.sql.report_late, late_binds(binds, note))
            if found is None:
                return None
            keys, estimated = found[0], found[1]
            delta = outcome_spend_delta(outcome, estimated, actual_cost_micros)
            spent = self._adjust(tx, namespace, keys, delta)
            over = overspend(spent) if overspend is not None and delta > 0 and spent else None
            if over is not None:
                tx.all(self.sql.note_reason, {"namespace": namespace, "key": lease.key,
                                              "token": lease.token, "reason": over})
            return Recorded(keys, estimated, late, over)

    def extend(self, namespace: str, lease: Lease, seconds: float,
               vendor_ref: str | None = None) -> float | None:
        """Push a live lease out to ``seconds`` from now (and record ``vendor_ref``, what the
        vendor calls this attempt, when given); the new expiry, or None when the holder's
        proof no longer holds or the lease has lapsed."""
        rows = self._conns.run(self.sql.extend,
                               extend_binds(namespace, lease, seconds, vendor_ref),
                               self._outcome_sync)
        return float(rows[0][0]) if rows else None

    def unconsume(self, row: EffectHead, note: str) -> bool:
        """Give back the approval the move that wrote ``row`` (IN_FLIGHT, holding
        ``row.approval_id``) consumed, for a begin whose caller never took the answer (the
        body never ran): the effect waits again on its approved request (PENDING_APPROVAL, a
        new token, so the lost lease can no longer report), the request is approved again
        and the spend the move charged is released, all or nothing. False when the effect
        or the request moved on meanwhile (nothing written)."""
        from ..decide import APPROVAL_REQUESTED

        ns = row.namespace
        try:
            with self._conns.transaction() as tx:
                if tx.one(self.sql.resolve, {
                    "namespace": ns, "id": row.id, "token": row.token,
                    "expected_state": State.IN_FLIGHT.value,
                    "state": State.PENDING_APPROVAL.value, "result": None, "error": None,
                    "reason": APPROVAL_REQUESTED, "actor": None, "note": note,
                    "h_by": encode_text(None), "h_note": encode_text(note),
                    "forced": True,  # (its own lease, live: the begin that took it settles it)
                }) is None or tx.one(self.sql.approval_restore, {
                    "namespace": ns, "approval_id": row.approval_id}) is None:
                    tx.rollback()
                if row.estimated_cost_micros:
                    self._adjust(tx, ns, row.budget_keys, -row.estimated_cost_micros)
        except Rollback:
            return False
        return True

    # -- an operator's or a reconcile hook's settlement --------------------------------------

    def resolve(self, row: EffectHead, resolution: Resolution, *, result: str | None,
                reason: str, actor: str, note: str | None) -> EffectRow | None:
        """Compare-and-set ``row`` as ``resolution`` says (a new token: the old holder can no
        longer report), moving its spend; None when it moved first."""
        binds = {
            "namespace": row.namespace, "id": row.id, "token": row.token,
            "expected_state": resolution.expected.value, "state": resolution.to.value,
            "result": result, "error": None, "reason": reason, "actor": actor, "note": note,
            "h_by": encode_text(actor), "h_note": encode_text(note),
            "forced": resolution.forced,  # (a live lease: only where force allowed it)
        }
        # A held attempt settled COMMITTED: its counters hold the estimate, corrected by the
        # actual cost its holder reported with an AMBIGUOUS outcome, if it did (read as the
        # row is written), as a COMMITTED report would have corrected them.
        corrects = resolution.to is State.COMMITTED and row.budget_keys is not None and (
            resolution.expected is not State.FAILED)
        if not (resolution.spend_delta or corrects):
            rows = self._conns.run(self.sql.resolve, binds, self._reserve_sync)
            return effect_row(rows[0]) if rows else None
        with self._conns.transaction() as tx:
            found = tx.one(self.sql.resolve, binds)
            if found is None:
                return None
            done = effect_row(found)
            delta = resolution.spend_delta
            if corrects and done.actual_cost_micros is not None:
                delta += done.actual_cost_micros - (done.estimated_cost_micros or 0)
            self._adjust(tx, row.namespace, row.budget_keys, delta)
            return done

    def _adjust(self, tx: Transaction, namespace: str, keys: str | None,
                delta: int) -> list[tuple[str, int]]:
        """Move each counter by ``delta`` (stopping at the most a BIGINT holds); (counter,
        spent now) for each."""
        if not delta or not keys:
            return []
        out: list[tuple[str, int]] = []
        # How far a counter may rise before it would pass a BIGINT (it stops there instead).
        room = validate.MAX_INT - delta if delta > 0 else validate.MAX_INT
        for scope_key in json.loads(keys):
            for row in tx.all(self.sql.adjust, {"namespace": namespace, "scope_key": scope_key,
                                                "delta": delta, "room": room}):
                out.append((str(row[0]), int(row[1])))
        return out

    # -- reads ----------------------------------------------------------------------------------

    def get(self, namespace: str, key: str) -> EffectRow | None:
        """Every column of the effect at ``key`` (history included), or None."""
        rows = self._conns.read(self.sql.fetch_row, {"namespace": namespace, "key": key})
        return effect_row(rows[0]) if rows else None

    def get_by_id(self, namespace: str, effect_id: int) -> EffectRow | None:
        """Every column of the effect with ``effect_id`` in ``namespace``, or None."""
        rows = self._conns.read(self.sql.fetch_row_id, {"namespace": namespace, "id": effect_id})
        return effect_row(rows[0]) if rows else None

    def effects(self, namespace: str, *, state: State | None = None,
                effect_type: str | None = None, run_id: str | None = None,
                agent_id: str | None = None, group_key: str | None = None,
                key_prefix: str | None = None, newest_first: bool = True, limit: int | None = None,
                before_id: int | None = None) -> list[EffectRow]:
        """Effects of a namespace by filter, newest first. ``state`` is the state a read
        reports: an IN_FLIGHT row past its lease counts as AMBIGUOUS, not IN_FLIGHT.
        ``effect_type`` may be a glob (``*``, ``?``); every other character is literal."""
        filters = Filters(state, effect_type, run_id, agent_id, group_key, key_prefix,
                          newest_first, limit, before_id)
        sql = listing_sql(filters, self._listing_dialect())
        return [effect_row(r) for r in self._conns.read(sql, listing_binds(namespace, filters))]

    def _listing_dialect(self) -> Any:
        """The dialect the reads by filter are compiled for: the driver connection's (SQLite:
        ``sqlite3``'s named placeholders, as the rendered texts use)."""
        return named_sqlite() if self.is_sqlite else self.engine.dialect

    def count_by_state(self, namespace: str) -> dict[State, int]:
        """How many effects of a namespace are in each state, as reads report it."""
        from sqlalchemy import func, select

        from .schema import db_now, effects, in_flight_lapsed

        t = effects.c
        lapsed = in_flight_lapsed(db_now())
        stmt = select(t.state, lapsed.label("lapsed"), func.count()).where(
            t.namespace == namespace).group_by(t.state, lapsed)
        out = {s: 0 for s in State}
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(stmt).all()
        except Exception as err:
            raise store_error(err, writing=False) from err
        for state, was_lapsed, count in rows:
            try:
                target = State.AMBIGUOUS if was_lapsed else State(state)
            except ValueError:  # a state no state of this version is: typed, named
                raise unknown_state(state, f"an effect of namespace {namespace!r}", None,
                                    None) from None
            out[target] += int(count)
        return out

    # -- approvals --------------------------------------------------------------------------------

    def approval(self, namespace: str, approval_id: str) -> ApprovalRow | None:
        """The approval request ``approval_id`` of ``namespace`` (with the clock), or None."""
        rows = self._conns.read(self.sql.approval_get,
                                {"namespace": namespace, "approval_id": approval_id})
        return approval_row(rows[0]) if rows else None

    def decide_approval(self, namespace: str, approval_id: str, state: ApprovalState,
                        by: str, reason: str | None) -> bool:
        """Compare-and-set a pending, unexpired request to approved; False when it moved."""
        rows = self._conns.run(self.sql.approval_decide, {
            "namespace": namespace, "approval_id": approval_id, "state": state.value,
            "by": by, "reason": reason,
        }, self._reserve_sync)
        return bool(rows)

    def deny(self, approval: ApprovalRow, by: str, reason: str | None,
             effect_reason: str) -> bool:
        """Deny a pending request and move its effect to DENIED, atomically; False when the
        request moved first."""
        ns = approval.namespace
        try:
            with self._conns.transaction() as tx:
                if tx.one(self.sql.approval_decide, {
                    "namespace": ns, "approval_id": approval.id,
                    "state": ApprovalState.DENIED.value, "by": by, "reason": reason,
                }) is None:
                    tx.rollback()
                found = tx.one(self.sql.fetch_row_id, {"namespace": ns, "id": approval.effect_id})
                if found is not None:
                    effect = effect_row(found)
                    if effect.state is State.PENDING_APPROVAL and effect.approval_id == approval.id:
                        tx.all(self.sql.resolve, {
                            "namespace": ns, "id": effect.id, "token": effect.token,
                            "expected_state": State.PENDING_APPROVAL.value,
                            "state": State.DENIED.value, "result": None, "error": None,
                            "reason": effect_reason, "actor": by, "note": reason,
                            "h_by": encode_text(by), "h_note": encode_text(reason),
                            "forced": False,
                        })
        except Rollback:
            return False
        return True

    def approvals(self, namespace: str) -> list[ApprovalRow]:
        """Every approval request of a namespace, newest first."""
        from sqlalchemy import select

        from .schema import approvals, db_now

        a = approvals.c
        stmt = (select(*approvals.c, db_now().label("now")).where(a.namespace == namespace)
                .order_by(a.created_at.desc(), a.id))
        try:
            with self.engine.connect() as conn:
                return [approval_row(r) for r in conn.execute(stmt)]
        except Exception as err:
            raise store_error(err, writing=False) from err

    # -- retention --------------------------------------------------------------------------------

    def prune(self, namespace: str, older_than_seconds: float, *, dry_run: bool = False) -> int:
        """Drop results, errors, notes and history of settled effects (COMMITTED, FAILED,
        DENIED) last changed more than ``older_than_seconds`` ago, keeping each key's tombstone
        (key, type, state, payload hash) and a committed step's compensation (an unwind still
        needs it). Approval requests go only with their pruned effect, or once expired (their
        arguments); never those of an effect still waiting, in flight or AMBIGUOUS."""
        binds = {"namespace": namespace, "older_than": older_than_seconds}
        if dry_run:
            return int(self._conns.read(self.sql.prune_count, binds)[0][0])
        with self._conns.transaction() as tx:
            pruned = len(tx.all(self.sql.prune, binds))
            tx.all(self.sql.prune_approvals, binds)
            tx.all(self.sql.prune_arguments, {"namespace": namespace})
        return pruned

    def put_meta(self, name: str, value: str) -> None:
        """Set one ``effectgate_meta`` row (not the schema's own: the policy last recorded
        for a namespace, for instance)."""
        if name in ("schema_version", "vendor_secret"):
            raise ConfigError(f"{name} is the store's own")
        from .schema import meta

        c = meta.c
        try:
            connection = self.engine.connect()
        except Exception as err:
            raise store_error(err, writing=True) from err
        with self._conns.write_lock, connection as conn:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN")
            try:
                import importlib  # only the dialect in use

                dialect: Any = importlib.import_module(
                    "sqlalchemy.dialects." + ("sqlite" if self.is_sqlite else "postgresql"))
                upsert = dialect.insert(meta).values(name=name, value=value)
                conn.execute(upsert.on_conflict_do_update(index_elements=[c.name],
                                                          set_={"value": value}))
                conn.exec_driver_sql("COMMIT")
            except BaseException as err:
                conn.exec_driver_sql("ROLLBACK")
                if isinstance(err, Exception):
                    raise StoreError(f"cannot record {name}: {type(err).__name__}") from err
                raise
        self.meta[name] = value


_BEFORE_CONSUME = "SAVEPOINT effectgate_consume"
_UNDO_CONSUME = "ROLLBACK TO SAVEPOINT effectgate_consume"
"""An approved move's writes before its charges are known to fit: undone, without ending the
transaction, when a ceiling refuses one (:meth:`Store._waits_for_room`)."""


def _moved(rows: list[Any], row: EffectHead | None) -> EffectHead | None:
    """The row a move wrote, or None (an insert that met an existing key writes nothing)."""
    if not rows:
        return None
    return effect_head(rows[0])


def _inserted(req: Request, effect_id: int, lease: float, now: float,
              lease_secret: str) -> EffectHead:
    """The row a plain reservation just inserted, from its request and what the store said
    (built as the tuple it is: every executed effect makes one)."""
    return _new_head(EffectHead, (
        effect_id, req.namespace, req.key, req.effect_type, req.payload_hash, _IN_FLIGHT,
        1, 1, lease, now, now, None, None, req.vendor, 1, now, None, None,
        req.estimated_cost_micros, None, lease_secret, now, True,
    ))


def _again_if_aborted(call: Callable[[], _T]) -> _T:
    """``call()``, run again (a bounded number of times, after a random pause: see
    :func:`again_after`) while the server aborts its transaction whole (a deadlock's victim,
    SQLSTATE 40P01, or a serialization failure, 40001): nothing of it was written, and the
    other transaction it met has then moved on (a holder's report that lost a deadlock to a
    governed reservation of its key was not recorded, and the effect lapsed to AMBIGUOUS)."""
    tries = 1
    while True:
        try:
            return call()
        except StoreError as err:
            pause = again_after(err, tries)
            if pause is None:
                raise
        time.sleep(pause)
        tries += 1


_new_head = tuple.__new__
_IN_FLIGHT = State.IN_FLIGHT
_ON_TIME = Recorded(None, None, False)  # a report that moved no spend landed on time
