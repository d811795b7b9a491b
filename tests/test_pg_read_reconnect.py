"""Postgres only: a read on a connection the server has closed since the last call is answered.

The server may close a connection the store keeps between calls (a restart,
``pg_terminate_backend``, an idle timeout, a proxy dropping it). A read that meets one runs
once more on a new connection, so it no longer fails for a reason the caller cannot act on; a
write that meets one still fails, typed (``outcome_unknown``), and is never repeated (a write
whose reply was lost may have committed); and a server that cannot be reached fails a read
after one connect attempt, not two. Each test runs for a sync caller (this thread's connection
of the sync store) and an async one (the async store's pooled connection on its loop), except
where a kind of read exists on one side only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

import effectgate as eg
from effectgate.store.sql import Sql

from .conftest import PG_URL, require_postgres
from .pg_proxy import WedgingProxy
from .workers.callers import CALLERS, Caller, making

LIBPQ_URL = PG_URL.replace("+psycopg", "")
APPROVE_PAYMENTS = eg.Policy.from_dict({"effects": {"payment.*": {"approval": "always"}}})
WAIT = 30.0


@pytest.fixture
def pg_gate(namespace: str) -> Iterator[eg.Gate]:
    """A gate on the suite's Postgres database, in a namespace of its own (the suite deletes
    its rows at the end of the run), that asks for approval of ``payment.*`` effects."""
    require_postgres()
    gate = eg.Gate(PG_URL, namespace=namespace, policy=APPROVE_PAYMENTS)
    yield gate
    gate.close()


@pytest.fixture(params=CALLERS)
def caller(request: pytest.FixtureRequest, pg_gate: eg.Gate) -> Iterator[Caller]:
    with making(str(request.param)) as make:
        yield make(pg_gate)


def _kill(pg_admin: psycopg.Connection[Any], c: Caller) -> int:
    """Terminate the server process of the connection ``c``'s next call runs on (and wait
    until it is gone); its pid."""
    pid = c.backend_pid()
    assert pg_admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    deadline = time.monotonic() + WAIT
    while pg_admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
        assert time.monotonic() < deadline, f"backend {pid} still alive"
        time.sleep(0.01)
    return pid


def _committed(c: Caller, key: str = "k:1") -> eg.BeginDecision:
    d = c.begin(effect_type="x", key=key, payload={"n": 1})
    c.report(d, "committed", result={"ok": 1})
    return d


def _pending(c: Caller) -> eg.BeginDecision:
    d = c.begin(effect_type="payment.refund", key="refund:1", payload={"cents": 5})
    assert d.decision is eg.Decision.APPROVAL_REQUIRED and d.approval_id
    return d


# -- reads, sync ---------------------------------------------------------------------------

# Each read of the sync store's per-call path: (what it needs stored, the read, a check of
# what it answered).
SYNC_READS: dict[str, Callable[[eg.Gate, eg.BeginDecision], Any]] = {
    "get": lambda g, d: g.get("k:1").state is eg.State.COMMITTED,
    "get_by_id": lambda g, d: g.get_by_id(g.get("k:1").effect_id).key == "k:1",
    "fetch": lambda g, d: g.store.fetch(g.namespace, "k:1").state is eg.State.COMMITTED,
    "first_read": lambda g, d: g.store.first_read(g.namespace, "k:1").state is (
        eg.State.COMMITTED),
    "effects": lambda g, d: sorted(r.key for r in g.list_effects()) == ["k:1", "refund:1"],
    "group_steps": lambda g, d: g.group_steps("none") == [],
    "now": lambda g, d: g.store.now() > 1e9,
    "prune_count": lambda g, d: g.store.prune(g.namespace, 3600, dry_run=True) == 0,
    "preview": lambda g, d: g.preview(effect_type="x", key="k:1", payload={"n": 1}).decision
    is eg.Decision.DUPLICATE,
    "preview_new_key": lambda g, d: g.preview(effect_type="x", key="k:new", payload={})
    .decision is eg.Decision.EXECUTE,
    "approval": lambda g, d: g.approval(d.approval_id or "").state == "pending",
    # a begin that reads the key first (a governed one that asks for approval), then the
    # approval it waits on: both reads, on the connection the server closed
    "begin_reads_first": lambda g, d: g.begin(
        effect_type="payment.refund", key="refund:1", payload={"cents": 5}).approval_id
    == d.approval_id,
}


@pytest.mark.parametrize("read", sorted(SYNC_READS))
def test_a_sync_read_on_a_connection_the_server_closed_is_answered(
        pg_gate: eg.Gate, pg_admin: psycopg.Connection[Any], read: str) -> None:
    """Each read of the sync per-call path, on this thread's connection killed since its last
    call: answered on a new connection (it raised StoreError once before)."""
    with making("sync") as make:
        c = make(pg_gate)
        _committed(c)
        d = _pending(c)
        pid = _kill(pg_admin, c)
        assert SYNC_READS[read](pg_gate, d) is True
        assert c.backend_pid() != pid


def test_a_duplicate_begin_answered_from_the_store_after_the_connection_was_killed(
        pg_gate: eg.Gate, pg_admin: psycopg.Connection[Any], caller: Caller) -> None:
    """A repeat of a COMMITTED key with the memo off, answered by the store, on a connection
    the server closed: a duplicate (as before on Postgres: the reservation function is a
    write, recovered by reading the key back), and no second attempt."""
    gate = eg.Gate(PG_URL, namespace=pg_gate.namespace, memo_size=0, policy=APPROVE_PAYMENTS)
    try:
        with making(caller.mode) as make:
            c = make(gate)
            _committed(c)
            _kill(pg_admin, c)
            again = c.begin(effect_type="x", key="k:1", payload={"n": 1})
            assert again.decision is eg.Decision.DUPLICATE and again.result == {"ok": 1}
            # and a read right after a kill, the approval's (a read the begin makes itself)
            d = _pending(c)
            _kill(pg_admin, c)
            assert c.begin(effect_type="payment.refund", key="refund:1",
                           payload={"cents": 5}).approval_id == d.approval_id
            assert gate.get("k:1").attempt == 1
    finally:
        gate.close()


# -- reads, async --------------------------------------------------------------------------

ASYNC_READS: dict[str, Callable[[Any, str, eg.BeginDecision], Any]] = {
    "fetch": lambda face, ns, d: face.fetch(ns, "k:1"),
    "get": lambda face, ns, d: face.get(ns, "k:1"),
    "approval": lambda face, ns, d: face.approval(ns, d.approval_id),
}


@pytest.mark.parametrize("read", sorted(ASYNC_READS))
def test_an_async_read_on_a_pooled_connection_the_server_closed_is_answered(
        pg_gate: eg.Gate, pg_admin: psycopg.Connection[Any], read: str) -> None:
    """Each read of the async store, on the loop's pooled connection killed since its last
    call: answered on another connection (the dead one discarded)."""
    with making("async") as make:
        c = make(pg_gate)
        _committed(c)
        d = _pending(c)
        pid = _kill(pg_admin, c)
        face = pg_gate.store.async_face()
        row = c.run(ASYNC_READS[read](face, pg_gate.namespace, d))
        assert row is not None
        assert (row.state is eg.State.COMMITTED) if read != "approval" else (
            row.state is eg.ApprovalState.PENDING)
        assert c.backend_pid() != pid


def test_an_async_begin_that_reads_first_after_the_connection_was_killed(
        pg_gate: eg.Gate, pg_admin: psycopg.Connection[Any]) -> None:
    """The async begin's own reads (the key, then the approval it waits on), on a pooled
    connection the server closed: answered, the same approval request."""
    with making("async") as make:
        c = make(pg_gate)
        d = _pending(c)
        _kill(pg_admin, c)
        again = c.begin(effect_type="payment.refund", key="refund:1", payload={"cents": 5})
        assert again.decision is eg.Decision.APPROVAL_REQUIRED
        assert again.approval_id == d.approval_id


# -- once, and never on a connection the read opened itself --------------------------------

# A read whose every run ends its own connection (as a server restart would, mid-read).
SELF_KILLING = Sql("SELECT pg_terminate_backend(pg_backend_pid())")


def test_a_read_runs_again_once_and_never_on_a_connection_it_opened(
        pg_gate: eg.Gate, caller: Caller) -> None:
    """A read that meets a closed connection runs once more on one new connection, and no
    more when that one closes too; a read that opened its connection itself (the thread or
    the loop had none kept) is not run again at all: one connection opened either way."""
    c = caller
    _committed(c)  # a connection kept from this call
    store = pg_gate.store
    opened: list[int] = []
    if c.mode == "sync":
        conns = store._conns
        real_open = conns._open

        def counting_open() -> Any:
            opened.append(1)
            return real_open()

        conns._open = counting_open  # type: ignore[method-assign]

        def read() -> Any:
            return conns.read(SELF_KILLING, {})

        def forget() -> None:
            conns.drop()
    else:
        face: Any = store.async_face()
        real_connect = face._connect

        async def counting_connect() -> Any:
            opened.append(1)
            return await real_connect()

        face._connect = counting_connect

        def read() -> Any:
            return c.run(face.read(SELF_KILLING, {}))

        def forget() -> None:
            c.run(face.close())  # the loop's idle connections closed: none kept

    try:
        with pytest.raises(eg.StoreError) as err:
            read()  # on the kept connection: once more on a new one, which dies too
        assert not err.value.outcome_unknown
        assert len(opened) == 1
        forget()
        with pytest.raises(eg.StoreError):
            read()  # on a connection opened for it: not run again
        assert len(opened) == 2
    finally:
        if c.mode == "sync":
            del conns._open
        else:
            del face._connect
    assert pg_gate.get("k:1").state is eg.State.COMMITTED  # and the next read is answered


# -- writes are never repeated -------------------------------------------------------------


def _write(c: Caller, write: str, d: eg.BeginDecision, approval_id: str) -> Any:
    """One write of the store's per-call path, on ``c``'s side (sync or async store)."""
    gate, ns, lease = c.gate, c.gate.namespace, d.lease
    assert lease is not None
    if write == "extend":
        return c.extend_lease(d, 600)
    if write == "record_outcome":  # the store's own (the reporter's retry is a layer up)
        if c.mode == "sync":
            return gate.store.record_outcome(ns, lease, eg.Outcome.COMMITTED, result="1",
                                             error=None, reason=None, note=None,
                                             actual_cost_micros=None, spends=False)
        return c.run(gate.store.async_face().record_outcome(
            ns, lease, eg.Outcome.COMMITTED, result="1", error=None, reason=None, note=None,
            actual_cost_micros=None, spends=False))
    assert write == "decide_approval" and c.mode == "sync"  # (no async twin)
    return gate.store.decide_approval(ns, approval_id, eg.ApprovalState.APPROVED, "alice",
                                      None)


WRITES = [("sync", "extend"), ("sync", "record_outcome"), ("sync", "decide_approval"),
          ("async", "extend"), ("async", "record_outcome")]


@pytest.mark.parametrize(("mode", "write"), WRITES)
def test_a_write_on_a_connection_the_server_closed_still_fails_once_and_is_not_repeated(
        pg_gate: eg.Gate, pg_admin: psycopg.Connection[Any], mode: str, write: str) -> None:
    """A write on a killed connection raises StoreError (outcome unknown) as before, and is
    not sent again on a new connection: the store shows it did not happen (never twice). A
    read on the next killed connection is answered (the difference: reads only)."""
    with making(mode) as make:
        c = make(pg_gate)
        d = c.begin(effect_type="x", key="k:w", payload={})
        approval_id = _pending(c).approval_id or ""
        before = pg_gate.get("k:w")
        _kill(pg_admin, c)
        with pytest.raises(eg.StoreError) as err:
            _write(c, write, d, approval_id)
        assert err.value.outcome_unknown
        _kill(pg_admin, c)  # the next connection, killed too: a read after it is answered
        if c.mode == "async":
            row = c.run(pg_gate.store.async_face().get(pg_gate.namespace, "k:w"))
            assert row is not None and row.state is eg.State.IN_FLIGHT
        after = pg_gate.get("k:w")
        assert after.state is eg.State.IN_FLIGHT  # not written: no outcome,
        assert after.lease_expires_at == before.lease_expires_at  # no extension,
        assert after.history == before.history
        assert pg_gate.approval(approval_id).state == "pending"  # no decision
        _write(c, write, d, approval_id)  # once more, by the caller: it lands once
        record = pg_gate.get("k:w")
        assert len(record.history) <= len(before.history) + 1 and record.attempt == 1


# -- a server that cannot be reached -------------------------------------------------------


CONNECT_TIMEOUT = 2  # libpq's least


@pytest.fixture
def blackhole() -> Iterator[WedgingProxy]:
    require_postgres()
    url = make_url(PG_URL)
    proxy = WedgingProxy((url.host or "127.0.0.1", url.port or 5432))
    yield proxy
    proxy.close()


def test_a_read_when_the_server_cannot_be_reached_fails_after_one_connect_attempt(
        pg_gate: eg.Gate, blackhole: WedgingProxy, caller: Caller) -> None:
    """The server went away (every connection cut, new ones never answered): a read on the
    connection it closed tries one new connection, fails after one connect timeout (not
    two), typed; the next read, with no connection kept, tries one again."""
    url = make_url(PG_URL)
    through = (f"postgresql://{url.username}@127.0.0.1:{blackhole.port}/{url.database}"
               f"?connect_timeout={CONNECT_TIMEOUT}&sslmode=disable")
    gate = eg.Gate(through, namespace=pg_gate.namespace)
    try:
        with making(caller.mode) as make:
            c = make(gate)
            _committed(c)
            face = gate.store.async_face()

            def read() -> Any:
                if c.mode == "sync":
                    return gate.get("k:1")
                return c.run(face.get(gate.namespace, "k:1"))

            blackhole.wedge()
            for tries in (1, 2):
                started = time.monotonic()
                with pytest.raises(eg.StoreError):
                    read()
                took = time.monotonic() - started
                assert blackhole.wedged_attempts == tries
                assert took < 2 * CONNECT_TIMEOUT - 0.5, took
    finally:
        gate.close()
