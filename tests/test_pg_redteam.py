"""Red team of the Postgres store (h5): the bare reserve function's lost and cancelled
replies, a lock-order deadlock between an operator's resolve and a governed retry, and a
runtime role that may not create functions.

The faults are real: a small wire proxy between the store and Postgres holds the server's
reply to one statement until the server has said ReadyForQuery (the statement committed),
then either loses it (``pg_terminate_backend`` of its backend, the client socket closed) or
hands it on late. No store or framework object is mocked.

Each finding's test failed before its fix: the deadlock (the governed retry now locks the
effect row before its counters), the lease a lock wait shortened (it now starts at the row's
write), the role without CREATE (it now gets a ``StoreError`` saying what to do).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import effectgate as eg

from .conftest import PG_URL, TEST_PREFIX, require_postgres

_SSL, _GSS = 80877103, 80877104
GOVERNED = {"effects": {"pay.gov": {"budget": {"per_run_micros": 10_000_000}}}}
COST = 1_000_000


class WireProxy:
    """Forwards every connection to the Postgres server of ``PG_URL``. :meth:`arm` picks the
    first connection that sends ``marker`` next: the server's reply to that statement is
    held until ReadyForQuery, then lost (``"kill"``) or forwarded ``delay`` seconds late."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.marker: bytes | None = None
        self.mode, self.delay = "kill", 0.0
        self.fired = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self) -> str:
        tail = PG_URL.split("@", 1)[1].split("/", 1)[1]
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{tail}?sslmode=disable"

    def arm(self, marker: bytes, mode: str = "kill", delay: float = 0.0) -> None:
        with self.lock:
            self.marker, self.mode, self.delay = marker, mode, delay
            self.fired.clear()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        state: dict[str, Any] = {"pid": None, "trigger": None}
        try:
            head = _exactly(client, 8)
            while struct.unpack("!II", head)[1] in (_SSL, _GSS):
                client.sendall(b"N")  # no TLS, no GSS: the startup follows in the clear
                head = _exactly(client, 8)
            server = socket.create_connection(("127.0.0.1", 5432))
            server.sendall(head)
        except OSError:
            client.close()
            return
        threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
        self._down(client, server, state)

    def _up(self, client: socket.socket, server: socket.socket, state: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self.lock:
                    if self.marker is not None and self.marker in data:
                        state["trigger"], self.marker = (self.mode, self.delay), None
                server.sendall(data)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _down(self, client: socket.socket, server: socket.socket,
              state: dict[str, Any]) -> None:
        buf = held = b""
        try:
            while data := server.recv(65536):
                buf += data
                out = b""
                while len(buf) >= 5:
                    size = struct.unpack("!I", buf[1:5])[0]
                    if len(buf) < 1 + size:
                        break
                    msg, buf = buf[:1 + size], buf[1 + size:]
                    if msg[:1] == b"K":
                        state["pid"] = struct.unpack("!I", msg[5:9])[0]
                    if state["trigger"] is None:
                        out += msg
                        continue
                    held += msg
                    if msg[:1] != b"Z":  # not yet ReadyForQuery: not yet committed
                        continue
                    (mode, delay), state["trigger"] = state["trigger"], None
                    client.sendall(out)
                    out = b""
                    self.fired.set()
                    if mode == "kill":
                        _terminate(state["pid"])
                        return
                    time.sleep(delay)
                    out, held = held, b""
                client.sendall(out)
        except OSError:
            pass
        finally:
            for sock in (client, server):  # shut down first: wakes the other direction's recv
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def _exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise OSError("closed")
        out += chunk
    return out


def _terminate(pid: int | None) -> None:
    import psycopg

    with psycopg.connect(PG_URL.replace("+psycopg", ""), autocommit=True) as side:
        side.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture
def proxy() -> Iterator[WireProxy]:
    require_postgres()
    found = WireProxy()
    yield found
    found.close()


def _gates(proxy: WireProxy, policy: Any = False) -> tuple[eg.Gate, eg.Gate]:
    """A gate through the proxy and one straight to the server, in one fresh namespace."""
    ns = f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}"
    return (eg.Gate(proxy.url(), policy, namespace=ns),
            eg.Gate(PG_URL, policy, namespace=ns))


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_bare_reservation_reply_lost_after_commit_is_adopted(proxy: WireProxy,
                                                             caller: str) -> None:
    """The bare function's reservation commits and its reply is lost (the backend is
    terminated once the server said ReadyForQuery): the begin reads the key back and adopts
    its own reservation; a second begin is refused; the body runs once."""
    gate, other = _gates(proxy)
    fields = {"effect_type": "t.bare", "key": "k", "payload": {"a": 1}}
    try:
        proxy.arm(b"effectgate_bare_")
        d = gate.begin(**fields) if caller == "sync" else asyncio.run(gate.abegin(**fields))
        assert proxy.fired.is_set()
        assert d.decision is eg.Decision.EXECUTE and (d.attempt, d.lease_token) == (1, 1)
        assert other.begin(**fields).decision is eg.Decision.IN_FLIGHT
        gate.report(d, "committed", result={"ok": 1})
        assert other.begin(**fields).decision is eg.Decision.DUPLICATE
    finally:
        gate.close()
        other.close()


def test_bare_reservation_cancelled_after_commit_is_released(proxy: WireProxy) -> None:
    """An async begin cancelled (a timeout) after the bare function committed, its reply
    still on the way: the reservation is recorded FAILED ("cancelled before the body
    started"), never left to lapse; the next begin runs the body, once."""
    gate, other = _gates(proxy)
    fields = {"effect_type": "t.bare", "key": "k", "payload": {"a": 1}}

    async def timed_out() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(gate.abegin(**fields), 0.5)

    try:
        proxy.arm(b"effectgate_bare_", "delay", 1.5)
        asyncio.run(timed_out())
        assert proxy.fired.is_set()
        deadline = time.monotonic() + 5
        while other.get("k").state is not eg.State.FAILED and time.monotonic() < deadline:
            time.sleep(0.1)
        row = other.get("k")
        assert row.state is eg.State.FAILED and row.error == "cancelled before the body started"
        decisions = [other.begin(**fields).decision for _ in range(2)]
        assert decisions == [eg.Decision.EXECUTE, eg.Decision.IN_FLIGHT]
    finally:
        gate.close()
        other.close()


def _resolve_against_governed_retry(proxy: WireProxy) -> tuple[Any, Any, eg.Gate]:
    """A governed effect that FAILED; then an agent's retry (through the proxy: its charge
    of the run's counter is answered 0.3 s late, the counter locked meanwhile) and an
    operator's resolve as COMMITTED (straight to the server: the effect row, then the
    counter). The retry locks counter -> effect, the resolve effect -> counter. Returns what
    each caller got, and the direct gate (open)."""
    agent, operator = _gates(proxy, GOVERNED)
    fields = {"effect_type": "pay.gov", "key": "k", "payload": {}, "run_id": "r1",
              "estimated_cost_micros": COST}
    first = operator.begin(**fields)
    operator.report(first, "failed", error="declined")
    got: dict[str, Any] = {}

    def retry() -> None:
        try:
            got["begin"] = agent.begin(**fields)
        except eg.EffectGateError as err:
            got["begin"] = err

    proxy.arm(b"INSERT INTO effectgate_budgets", "delay", 0.3)
    thread = threading.Thread(target=retry)
    thread.start()
    assert proxy.fired.wait(10)  # the retry's charge ran: the counter is locked
    try:
        got["resolve"] = operator.resolve("k", "committed", by="ops", result={"ok": 1})
    except eg.EffectGateError as err:
        got["resolve"] = err
    thread.join(30)
    agent.close()
    return got["begin"], got["resolve"], operator


def test_resolve_against_governed_retry_deadlock_loses_nothing(proxy: WireProxy) -> None:
    """The retry and the resolve, served one after the other: the one that lost gets a typed
    answer (the resolve: the holder's lease is live), the other's write lands, and the effect
    and the counter agree with it (before the fix, Postgres aborted one with 40P01)."""
    begun, resolved, gate = _resolve_against_governed_retry(proxy)
    try:
        errors = [x for x in (begun, resolved) if isinstance(x, Exception)]
        assert len(errors) <= 1, errors
        for err in errors:  # the resolve, served after the retry took the effect
            assert isinstance(err, eg.InvalidTransition) and "lease is live" in str(err), err
        row = gate.get("k")
        with gate.store.connection() as conn:
            spent = conn.execute("SELECT spent_micros FROM effectgate_budgets WHERE "
                                 "namespace = %s", (gate.namespace,)).fetchone()[0]
        if isinstance(begun, eg.BeginDecision) and begun.decision is eg.Decision.EXECUTE:
            assert row.state is eg.State.IN_FLIGHT and row.attempt == 2
        else:
            assert row.state is eg.State.COMMITTED and row.attempt == 1
        assert spent == COST  # released at FAILED, counted again once
    finally:
        gate.close()


def test_resolve_and_governed_retry_do_not_deadlock(proxy: WireProxy) -> None:
    """The retry locks the effect row before its counters, as the resolve does: they are
    served one after the other, never a deadlock (SQLSTATE 40P01). Either the retry takes the
    effect (the resolve then meets its holder's live lease), or the resolve lands first (the
    retry then gets the committed result)."""
    begun, resolved, gate = _resolve_against_governed_retry(proxy)
    gate.close()
    assert not isinstance(begun, Exception), begun
    if begun.decision is eg.Decision.EXECUTE:
        assert isinstance(resolved, eg.InvalidTransition), resolved
        assert "lease is live" in str(resolved)
    else:
        assert begun.decision is eg.Decision.DUPLICATE, begun
        assert not isinstance(resolved, Exception), resolved


def test_a_role_without_create_opens_a_store_its_owner_opened_with_this_version() -> None:
    """A runtime role that may read and write the tables but not create in the schema
    (Postgres 15's default on ``public`` for any role but its owner) opens a store whose
    functions for this version exist (its owner opened it once with this version) and
    reserves. Where one is missing (the owner last opened it with an earlier version), its
    ``Gate()`` raises a ``StoreError`` that says what to do, and writes nothing."""
    require_postgres()
    import psycopg

    from effectgate.store.sql import statements_for

    schema, role = f"eg_priv_{uuid.uuid4().hex[:8]}", f"eg_app_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(PG_URL.replace("+psycopg", ""), autocommit=True)
    admin.execute(f"CREATE SCHEMA {schema}")
    admin.execute(f"CREATE ROLE {role} LOGIN")
    owner_url = f"{PG_URL}?options=-csearch_path%3D{schema}"
    server = PG_URL.split("@", 1)[1]
    app_url = f"postgresql+psycopg://{role}@{server}?options=-csearch_path%3D{schema}"
    try:
        eg.Gate(owner_url, namespace="own", policy=False).close()
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} "
                      f"TO {role}")
        admin.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
        gate = eg.Gate(app_url, namespace="app", policy=False)
        try:
            assert gate.begin(effect_type="t.x", key="k", payload={}).decision is (
                eg.Decision.EXECUTE)
        finally:
            gate.close()
        bare = statements_for("postgresql").bare_function
        assert bare is not None
        admin.execute(f"DROP FUNCTION {schema}.{bare.name}")  # as an earlier version left it
        with pytest.raises(eg.StoreError, match="open the store once as a role that may "
                           "create functions"):
            eg.Gate(app_url, namespace="app", policy=False)
        count = admin.execute(f"SELECT count(*) FROM {schema}.effectgate_effects").fetchone()
        assert count is not None and count[0] == 1
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")
        admin.close()


def test_a_reservation_that_waited_on_a_lock_gets_its_whole_lease() -> None:
    """A reservation that waits on a lock (here another session holds SHARE on the effects
    table for 1.5 s, as a plain CREATE INDEX does) must still answer EXECUTE with a lease of
    ``lease_seconds`` from when its row became visible. Today the lease counts from when the
    statement started: after a wait longer than the lease, the caller is told EXECUTE for a
    lease that ended before the answer (anyone else sees the effect AMBIGUOUS at once, and
    a reconcile hook or an operator may settle it while the body runs)."""
    require_postgres()
    import psycopg

    schema = f"eg_wait_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(PG_URL.replace("+psycopg", ""), autocommit=True)
    admin.execute(f"CREATE SCHEMA {schema}")
    gate = eg.Gate(f"{PG_URL}?options=-csearch_path%3D{schema}", namespace="w", policy=False,
                   lease_seconds=1)
    side = psycopg.connect(PG_URL.replace("+psycopg", ""))
    try:
        gate.begin(effect_type="t.x", key="warm", payload={})  # the function is installed
        side.execute(f"LOCK TABLE {schema}.effectgate_effects IN SHARE MODE")
        threading.Timer(1.5, side.commit).start()
        d = gate.begin(effect_type="t.x", key="k", payload={})
        clock = admin.execute("SELECT extract(epoch FROM clock_timestamp())::float8"
                              ).fetchone()
        assert d.decision is eg.Decision.EXECUTE and clock is not None
        assert d.lease_expires_epoch is not None
        assert d.lease_expires_epoch - clock[0] > 0.5, d.lease_expires_epoch - clock[0]
    finally:
        gate.close()
        side.close()
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()
