"""Postgres only: the gate's server connection killed mid-report, and workers with wrong clocks.

These faults do not exist on SQLite (an embedded store has no server connection to lose, and
its clock is the host's), so every test here runs on Postgres alone. The connection is killed
with ``pg_terminate_backend`` at a moment the test controls: while the report's UPDATE waits for
a row lock (its commit cannot have happened), or after the commit, with the reply held back by
a loopback proxy (the commit reached the server; the client never heard). The server itself is
never restarted here: other suites share it.

The tests that drive the gate's begin/report path run for a sync caller and an async one
(``caller``): the async one awaits ``abegin``/``areport`` (or an ``async def`` under
``@gate.effect``) on an event loop of its own, and the connection killed, traced or inspected is
the async store's ``AsyncConnection`` for that loop, the one those calls run on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

import effectgate as eg

from .conftest import PG_URL, require_postgres
from .workers import TIMEOUT, spawn, stop
from .workers.callers import CALLERS, Caller, making

pytestmark = pytest.mark.slow
LIBPQ_URL = PG_URL.replace("+psycopg", "")
WAIT = 30.0  # generous: other suites share the machine's two cores


@pytest.fixture
def pg_gate(namespace: str) -> Iterator[eg.Gate]:
    require_postgres()
    gate = eg.Gate(PG_URL, namespace=namespace)
    yield gate
    gate.close()


@pytest.fixture(params=CALLERS)
def caller(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def drive(caller: str) -> Iterator[Callable[[eg.Gate], Caller]]:
    """Makes a :class:`Caller` of this test's kind for a gate (closed after the test). Its
    ``backend_pid()`` is the server process of the connection its begin/report calls use:
    this thread's sync connection, or the async store's connection on its event loop."""
    with making(caller) as make:
        yield make


def _until(condition: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _wait_for_state(gate: eg.Gate, key: str, state: eg.State) -> eg.EffectRecord:
    deadline = time.monotonic() + WAIT
    while (record := gate.get(key)).state is not state and time.monotonic() < deadline:
        assert record.state is eg.State.IN_FLIGHT, record
        time.sleep(0.05)
    return record


class ReplyHoldingProxy:
    """A loopback TCP proxy to Postgres that can hold back the server's replies.

    ``hold`` holds back the replies on the connections open when it was set: a connection
    opened while it is set (a recheck on a fresh connection) gets its replies, or its
    handshake would be lost half-way. ``cut`` leaves no connection open, one being set up
    as it cuts included."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.hold = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            exempt = self.hold.is_set()
            self._sockets.append(client)
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self._sockets.append(upstream)
            if self._cut:  # cut while this one was being set up: (cut sets it, then shuts
                _shut(client, upstream)  # down what it finds, so one of the two sees it)
                continue
            threading.Thread(target=self._pump, args=(client, upstream, False, exempt),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True, exempt),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool,
              exempt: bool) -> None:
        try:
            while data := src.recv(65536):
                if not (from_server and not exempt and self.hold.is_set()):
                    dst.sendall(data)
        except OSError:
            pass
        _shut(dst, src)  # one side gone: close the other, as a network would

    def refuse_new(self) -> None:
        """Stop accepting connections (new ones are refused); those open go on."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def cut(self) -> None:
        """Refuse new connections and cut every open one (both of its ends see it closed)."""
        self._cut = True
        self.refuse_new()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.refuse_new()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


def _shut(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


@pytest.fixture
def proxy() -> Iterator[ReplyHoldingProxy]:
    require_postgres()
    url = make_url(PG_URL)
    server = ReplyHoldingProxy((url.host or "127.0.0.1", url.port or 5432))
    yield server
    server.close()


def test_connection_killed_before_report_commits_is_reported_again_on_a_new_one(
    pg_gate: eg.Gate, pg_admin: psycopg.Connection[Any], drive: Callable[[eg.Gate], Caller]
) -> None:
    """pg_terminate_backend while the report's UPDATE waits (so its commit never happens):
    the report is sent once more on a fresh connection, and the body's success is recorded
    (it was lost: the effect went IN_FLIGHT, then AMBIGUOUS, its result gone). A report is
    its holder's to repeat: one that did land is found done. Never FAILED, never run twice."""
    gate = pg_gate
    c = drive(gate)
    pid = c.backend_pid()
    killed: list[bool] = []
    lock = psycopg.connect(LIBPQ_URL)  # holds the effect's row lock while the report waits

    def terminate_when_report_waits() -> None:
        waiting = _until(lambda: pg_admin.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone() == ("Lock",))
        if waiting:
            killed.append(pg_admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0])
        lock.rollback()  # let go (and unblock a report that was never killed)

    @c.effect("refund:{txn_id}", effect_type="payment.refund", lease_seconds=1.5)
    def refund(txn_id: str) -> dict[str, str]:
        # The reservation is committed; lock its row so the coming report has to wait.
        lock.execute("SELECT id FROM effectgate_effects WHERE namespace = %s AND key = %s "
                     "FOR UPDATE", (gate.namespace, f"refund:{txn_id}"))
        terminator.start()
        return {"refund_id": "re_1"}

    terminator = threading.Thread(target=terminate_when_report_waits, daemon=True)
    try:
        assert refund("txn_1") == {"refund_id": "re_1"}
    finally:
        if terminator.is_alive():
            terminator.join(WAIT)
        lock.close()
    assert killed == [True]
    assert c.backend_pid() != pid  # a fresh connection
    record = gate.get("refund:txn_1")
    assert record.state is eg.State.COMMITTED and record.result == {"refund_id": "re_1"}
    assert refund("txn_1") == {"refund_id": "re_1"}  # answered from the store
    states = [h.to_state for h in record.history]
    assert states == [eg.State.IN_FLIGHT, eg.State.COMMITTED]


def test_connection_killed_after_report_committed_leaves_effect_committed(
    proxy: ReplyHoldingProxy, namespace: str, pg_admin: psycopg.Connection[Any],
    drive: Callable[[eg.Gate], Caller]
) -> None:
    """The report's commit reached the server but its reply never came back (held by a
    proxy) when pg_terminate_backend killed the connection: the report is sent again on a new
    connection, which finds it done (the holder's own report, landed) and says nothing; the
    effect is COMMITTED with its result, and a retry returns it without running."""
    url = make_url(PG_URL).set(host="127.0.0.1", port=proxy.port)
    gate = eg.Gate(url.render_as_string(hide_password=False), namespace=namespace)
    c = drive(gate)
    calls: list[str] = []
    try:

        @c.effect("refund:{txn_id}", effect_type="payment.refund")
        def refund(txn_id: str) -> dict[str, str]:
            calls.append(txn_id)
            proxy.hold.set()  # from now on the server's replies are held back
            terminator.start()
            return {"refund_id": "re_1"}

        pid = c.backend_pid()
        killed: list[bool] = []

        def terminate_once_committed() -> None:
            _until(lambda: pg_admin.execute(
                "SELECT state FROM effectgate_effects WHERE namespace = %s AND key = %s",
                (namespace, "refund:txn_1"),
            ).fetchone() == ("committed",))
            killed.append(pg_admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0])
            proxy.hold.clear()  # the network is back for the report sent again

        terminator = threading.Thread(target=terminate_once_committed, daemon=True)
        assert refund("txn_1") == {"refund_id": "re_1"}
        terminator.join(WAIT)
        assert killed == [True]
        record = gate.get("refund:txn_1")  # recovered: a new connection through the proxy
        assert record.state is eg.State.COMMITTED and record.result == {"refund_id": "re_1"}
        assert refund("txn_1") == {"refund_id": "re_1"}
        assert calls == ["txn_1"]
    finally:
        proxy.hold.clear()
        gate.close()


def test_connection_killed_between_calls_is_reopened(
    pg_gate: eg.Gate, pg_admin: psycopg.Connection[Any], drive: Callable[[eg.Gate], Caller]
) -> None:
    """A connection the server dropped while idle fails at most the one call that finds it
    dead (with a typed StoreError); the gate reconnects and nothing is lost."""
    gate = pg_gate
    c = drive(gate)
    d = c.begin(effect_type="x", key="k:1", payload={})
    pid = c.backend_pid()
    assert pg_admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    assert _until(lambda: pg_admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                        (pid,)).fetchone() is None)
    try:
        c.report(d, "committed", result=1)
    except eg.StoreError as err:  # the dead connection is noticed by this call
        assert err.outcome_unknown
        c.report(d, "committed", result=1)  # nothing reached the server: report again
    assert gate.get("k:1").state is eg.State.COMMITTED
    assert c.backend_pid() != pid


def test_idle_async_connections_the_server_dropped_fail_no_later_call(
        pg_gate: eg.Gate, pg_admin: psycopg.Connection[Any]) -> None:
    """The server dropped every idle connection of a loop's pool (a restart, an idle
    timeout): the first call to meet one may fail (typed), the rest are closed with it. The
    pool kept them, so every begin met a dead one and its recovering read another: half of
    a pool's worth of calls failed in a row."""
    import asyncio

    gate = eg.Gate(PG_URL, namespace=pg_gate.namespace, async_pool_size=4)

    async def main() -> list[str]:
        await asyncio.gather(*[gate.abegin(effect_type="x", key=f"warm:{i}", payload={})
                               for i in range(4)])
        pool = gate.store.async_face()._pools[asyncio.get_running_loop()]
        pids = [conn.info.backend_pid for conn in pool.idle]
        assert len(pids) == 4
        for pid in pids:
            pg_admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert _until(lambda: not pg_admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchall())
        outcomes = []
        for i in range(6):
            try:
                d = await gate.abegin(effect_type="x", key=f"after:{i}", payload={})
                outcomes.append(d.decision.value)
            except eg.StoreError:
                outcomes.append("store error")
        return outcomes

    try:
        outcomes = asyncio.run(main())
    finally:
        gate.close()
    assert outcomes.count("store error") <= 1, outcomes
    assert outcomes[1:] == ["execute"] * 5, outcomes


def test_reads_on_a_pooled_connection_the_server_dropped_are_typed_or_answered(
        pg_gate: eg.Gate, pg_admin: psycopg.Connection[Any]) -> None:
    """Counting by state, listing approvals and the gauges read through the engine's pool:
    a pooled connection the server dropped raised SQLAlchemy's own OperationalError (an
    untyped error, for a read that a new connection answers)."""
    from effectgate.store.gauges import read_gauges

    gate = pg_gate
    gate.begin(effect_type="x", key="k:1", payload={})
    for _ in range(2):
        with gate.store.engine.connect() as conn:  # the pool's connection, given back
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        pg_admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert _until(lambda dead=pid: pg_admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (dead,)).fetchone() is None)
        assert gate.count_by_state()[eg.State.IN_FLIGHT] == 1  # pre-pinged: a new one
        assert gate.list_approvals() == []
        assert read_gauges(gate.store, gate.namespace).pending_approvals == 0


# -- clocks --------------------------------------------------------------------------------


class Worker:
    """A skewed_clock.py process: one JSON command in, one JSON answer out."""

    def __init__(self, namespace: str, offset: float, caller: str = "sync") -> None:
        prefix: tuple[str, ...] = ()
        python_offset = offset
        if shutil.which("faketime"):  # the whole process's clock, C library included
            prefix = ("env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "faketime", "-f",
                      f"{offset:+.0f}s")
            python_offset = 0.0
        self.proc = spawn("skewed_clock.py", PG_URL, namespace, str(python_offset), caller,
                          prefix=prefix)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read() if self.proc.stderr else "worker died"
        return json.loads(line)  # type: ignore[no-any-return]


def test_worker_clock_an_hour_off_changes_no_lease_decision(pg_gate: eg.Gate, namespace: str,
                                                            caller: str) -> None:
    """Two workers whose clocks are an hour fast and an hour slow (Python's clock shifted,
    and the C library's too under faketime when it is installed) make exactly the lease
    decisions a correct clock makes: leases are measured on the database's clock. An async
    worker awaits abegin/aextend_lease/aget."""
    gate = pg_gate
    fast, slow = Worker(namespace, 3600, caller), Worker(namespace, -3600, caller)
    try:
        for worker, offset in ((fast, 3600), (slow, -3600)):
            clock = worker.ask(op="clock")
            for seen in (clock["time"], clock["datetime_now"]):
                assert abs(seen - time.time() - offset) < 120, clock  # it really is skewed

        # A live lease taken by the fast worker: in flight for everyone, expiry on the DB clock.
        held = fast.ask(op="begin", key="k:live", lease=30)
        assert held["decision"] == "execute"
        assert abs(held["expires"] - (held["store_now"] + 30)) < 10
        for worker in (slow, fast):
            answer = worker.ask(op="begin", key="k:live", lease=30)
            assert answer["decision"] == "in_flight" and 0 < answer["retry_after"] <= 30
        assert gate.get("k:live").state is eg.State.IN_FLIGHT
        assert fast.ask(op="get", key="k:live")["state"] == "in_flight"

        # A short lease taken by the slow worker lapses on time, for the slow worker too.
        assert slow.ask(op="begin", key="k:short", lease=0.5)["decision"] == "execute"
        assert fast.ask(op="begin", key="k:short", lease=30)["decision"] == "in_flight"
        _wait_for_state(gate, "k:short", eg.State.AMBIGUOUS)
        assert slow.ask(op="get", key="k:short")["state"] == "ambiguous"
        blocked = slow.ask(op="begin", key="k:short", lease=30)
        assert blocked["decision"] == "blocked" and blocked["reason"] == "lease lapsed"

        # A heartbeat from the slow worker extends from the DB's now, not its own.
        assert slow.ask(op="begin", key="k:beat", lease=5)["decision"] == "execute"
        beat = slow.ask(op="extend", key="k:beat", seconds=60)
        assert abs(beat["expires"] - (beat["store_now"] + 60)) < 10
        record = gate.get("k:beat")
        assert record.state is eg.State.IN_FLIGHT
        assert record.lease_expires_at is not None
        assert abs(record.lease_expires_at.timestamp() - gate.store.now() - 60) < 10
    finally:
        for worker in (fast, slow):
            if worker.proc.stdin is not None:
                worker.proc.stdin.close()
            worker.proc.wait(timeout=TIMEOUT)
        stop([fast.proc, slow.proc])


# -- a server restart (opt-in) ------------------------------------------------------------

PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))


@contextlib.contextmanager
def private_postgres() -> Iterator[tuple[str, Callable[[], None]]]:
    """A throw-away Postgres server of our own (never the shared one): yields its URL and a
    function that restarts it the hard way (``pg_ctl restart -m immediate``: a crash)."""
    if os.environ.get("EFFECTGATE_TEST_PG_RESTART") != "1":
        pytest.skip("set EFFECTGATE_TEST_PG_RESTART=1 to restart a (private) Postgres server")
    runuser = shutil.which("runuser")
    if not PG_BIN or os.geteuid() != 0 or runuser is None:
        pytest.skip("needs root, runuser and Postgres's server binaries to start a server")
    bin_dir = PG_BIN[-1]
    folder = Path(tempfile.mkdtemp(prefix="effectgate-pg-"))
    shutil.chown(folder, "postgres")
    data = folder / "data"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def pg(*args: str) -> None:
        subprocess.run([runuser, "-u", "postgres", "--", *args], check=True,
                       capture_output=True, timeout=120)

    pg(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    ctl = [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-o", options,
           "-w", "-t", "60"]
    pg(*ctl, "start")
    try:
        yield (f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres",
               lambda: pg(*ctl, "-m", "immediate", "restart"))
    finally:
        with contextlib.suppress(Exception):
            pg(*ctl, "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def test_server_restart_mid_run_loses_nothing_and_the_gate_recovers(namespace: str) -> None:
    """A Postgres server crash-restarted while a worker gates effects: calls fail with a
    StoreError while it is down, the same gate works again once it is back, every effect
    that was reserved is still there, and none is FAILED or executed twice."""
    with private_postgres() as (url, restart):
        gate = eg.Gate(url, namespace=namespace)
        restarter = threading.Thread(target=restart)
        reserved: dict[str, str] = {}  # key -> how its report went
        errors: list[eg.StoreError] = []
        try:
            i = 0
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if i == 20:
                    restarter.start()
                key = f"job:{i}"
                i += 1
                try:
                    d = gate.begin(effect_type="job.run", key=key, payload={"i": i})
                except eg.StoreError as err:  # down: the begin may or may not have landed
                    errors.append(err)
                    time.sleep(0.02)
                    continue
                assert d.decision is eg.Decision.EXECUTE
                try:
                    gate.report(d, "committed", result=i)
                    reserved[key] = "committed"
                except eg.StoreError as err:
                    errors.append(err)
                    reserved[key] = "unknown"
                if restarter.ident and not restarter.is_alive() and (
                    sum(v == "committed" for v in reserved.values()) >= 40
                ):
                    break
            restarter.join(WAIT)
            print(f"{i} calls, {len(errors)} StoreErrors, reports unknown: "
                  f"{sum(v == 'unknown' for v in reserved.values())}")
            assert errors, "the restart was not noticed"
            assert all(type(err) is eg.StoreError for err in errors)
            for key, how in reserved.items():  # nothing lost, nothing FAILED
                state = gate.get(key).state
                if how == "committed":
                    assert state is eg.State.COMMITTED, key
                else:
                    assert state in (eg.State.COMMITTED, eg.State.IN_FLIGHT,
                                     eg.State.AMBIGUOUS), key
        finally:
            gate.close()


def _lose_the_reservation_reply(proxy: ReplyHoldingProxy, c: Caller,
                                pg_admin: psycopg.Connection[Any], key: str,
                                after: Callable[[], None]) -> threading.Thread:
    """Hold back the server's replies, and once the reservation of ``key`` is committed, kill
    the backend of the connection ``c``'s next call runs on (its reply never arrives); then
    ``after()``."""
    gate = c.gate
    pid = c.backend_pid()
    proxy.hold.set()

    def kill_once_reserved() -> None:
        _until(lambda: pg_admin.execute(
            "SELECT 1 FROM effectgate_effects WHERE namespace = %s AND key = %s",
            (gate.namespace, key)).fetchone() is not None)
        pg_admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        after()

    killer = threading.Thread(target=kill_once_reserved, daemon=True)
    killer.start()
    return killer


def test_a_lost_reservation_reply_is_recovered_by_its_lease_secret(
    proxy: ReplyHoldingProxy, namespace: str, pg_admin: psycopg.Connection[Any],
    drive: Callable[[eg.Gate], Caller]
) -> None:
    """The reserving INSERT committed but its reply was lost: the gate reads the key again on
    a fresh connection, finds its own lease secret there, and holds the effect — the body runs
    once, and a retry is a duplicate."""
    url = make_url(PG_URL).set(host="127.0.0.1", port=proxy.port)
    gate = eg.Gate(url.render_as_string(hide_password=False), namespace=namespace)
    c = drive(gate)
    try:
        killer = _lose_the_reservation_reply(proxy, c, pg_admin, "refund:lost", proxy.hold.clear)
        d = c.begin(effect_type="payment.refund", key="refund:lost", payload={"n": 1})
        killer.join(WAIT)
        assert not killer.is_alive()
        assert d.decision is eg.Decision.EXECUTE and d.lease_secret
        c.report(d, "committed", result={"refund_id": "re_1"})
        again = c.begin(effect_type="payment.refund", key="refund:lost", payload={"n": 1})
        assert again.decision is eg.Decision.DUPLICATE and again.result == {"refund_id": "re_1"}
    finally:
        gate.close()


def test_a_lost_reservation_reply_that_cannot_be_checked_is_outcome_unknown(
    proxy: ReplyHoldingProxy, namespace: str, pg_admin: psycopg.Connection[Any],
    drive: Callable[[eg.Gate], Caller]
) -> None:
    """The reply is lost and the store cannot be reached to check: StoreError with
    outcome_unknown=True (it may have been written), and the body never ran."""
    url = make_url(PG_URL).set(host="127.0.0.1", port=proxy.port)
    gate = eg.Gate(url.render_as_string(hide_password=False), namespace=namespace)
    c = drive(gate)
    ran: list[int] = []

    @c.effect("refund:{n}", effect_type="payment.refund")
    def refund(n: int) -> int:
        ran.append(n)
        return n

    try:
        # The store out of reach: new connections refused and every open one through the
        # proxy cut. (Refusing new ones is not enough for an async caller: its check runs on
        # the sync store, off the loop, and may take an idle sync connection that is still
        # open, whose replies the proxy holds back for ever.)
        killer = _lose_the_reservation_reply(proxy, c, pg_admin, "refund:7", proxy.cut)
        with pytest.raises(eg.StoreError) as err:
            refund(7)
        killer.join(WAIT)
        assert err.value.outcome_unknown and not ran
    finally:
        gate.close()
    # Nothing was written after the reservation: the row as stored, then as the gate reads it
    # (IN_FLIGHT while its 60-second lease runs; past it, AMBIGUOUS, with nothing written).
    stored = pg_admin.execute(
        "SELECT state, token, history, lease_expires_at - EXTRACT(EPOCH FROM "
        "statement_timestamp())::float8 FROM effectgate_effects WHERE namespace = %s "
        "AND key = %s", (namespace, "refund:7")).fetchone()
    assert stored is not None and stored[:2] == ("in_flight", 1), stored
    assert stored[2].count("\n") == 1, stored  # its one history line, the reservation's
    with eg.Gate(PG_URL, namespace=namespace) as direct:
        seen = direct.get("refund:7").state
    left = stored[3]  # seconds of lease left when the row was read
    if left > 10.0 or left <= 0.0:  # (a read within 10 s of the end could go either way)
        assert seen is (eg.State.IN_FLIGHT if left > 0 else eg.State.AMBIGUOUS), (seen, stored)


def test_the_reserving_commit_is_synchronous_whatever_the_server_says(
    namespace: str, drive: Callable[[eg.Gate], Caller]
) -> None:
    """A session whose default is synchronous_commit=off (as a server may be configured)
    still reserves with a synchronous commit (on the async store's connection too)."""
    require_postgres()
    url = make_url(PG_URL).update_query_dict({"options": "-c synchronous_commit=off"})
    with psycopg.connect(LIBPQ_URL, options="-c synchronous_commit=off") as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"  # the premise
    with eg.Gate(url.render_as_string(hide_password=False), namespace=namespace) as gate:
        c = drive(gate)
        d = c.begin(effect_type="t", key="k:1", payload={})
        assert d.decision is eg.Decision.EXECUTE
        assert c.show("synchronous_commit") == "on"
        c.report(d, "committed", result=1)
        assert c.show("synchronous_commit") == "on"
    with psycopg.connect(LIBPQ_URL, options="-c synchronous_commit=remote_apply") as conn:
        # a stronger setting is not lowered (the hook only raises 'off')
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "remote_apply"


def test_outcomes_ride_on_the_next_sync_and_reservations_never_do(
    namespace: str, drive: Callable[[eg.Gate], Caller]
) -> None:
    """By default a holder's report (and a lapse, a heartbeat) commits asynchronously for its
    own transaction only — a lost outcome decays to AMBIGUOUS, never to a second execution —
    while every reservation commits synchronously; durability="all" makes outcomes wait for
    the disk too."""
    require_postgres()
    with eg.Gate(PG_URL, namespace=namespace) as gate:
        sql = gate.store.sql
        assert all("set_config" in s.text for s in (sql.report, sql.report_late, sql.lapse,
                                                     sql.extend))
        assert not any("set_config" in s.text for s in (sql.reserve, sql.take, sql.insert,
                                                        sql.resolve))
        c = drive(gate)
        d = c.begin(effect_type="t", key="k:1", payload={})
        c.report(d, "committed", result=1)
        # the setting did not outlive its transaction (on the connection the calls ran on)
        assert c.show("synchronous_commit") == "on"
        assert gate.get("k:1").state is eg.State.COMMITTED
    with eg.Gate(PG_URL, namespace=namespace, durability="all") as gate:
        assert "set_config" not in gate.store.sql.report.text


def _governed_gate(namespace: str, limit: int) -> eg.Gate:
    policy = eg.Policy.from_dict({"effects": {"pay.*": {
        "approval": {"at_or_above_micros": 10**12},
        "budget": {"per_run_micros": limit, "per_day_micros": limit},
    }}})
    return eg.Gate(PG_URL, namespace=namespace, policy=policy)


def test_governed_begin_is_one_round_trip_and_its_charges_all_or_nothing(
    namespace: str, drive: Callable[[eg.Gate], Caller]
) -> None:
    """A begin under a ceiling and an approval rule: the read, both charges and the insert are
    one call; a ceiling that refuses rolls back the other's charge; a repeat reads only. The
    round trips are counted on the connection the caller's begin runs on (for an async caller,
    the async store's connection of its event loop)."""
    require_postgres()
    from effectgate.bench.trace import PgTrace

    gate = _governed_gate(namespace, 1_000)
    c = drive(gate)
    try:
        with c.connection() as conn, PgTrace(conn) as trace:
            d = c.begin(effect_type="pay.out", key="gov:1", payload={"n": 1}, run_id="r",
                        estimated_cost_micros=600)
        assert d.decision is eg.Decision.EXECUTE
        assert trace.round_trips == 1
        c.report(d, "committed", result={"ok": 1})
        with c.connection() as conn, PgTrace(conn) as trace:
            again = c.begin(effect_type="pay.out", key="gov:1", payload={"n": 1},
                            run_id="r", estimated_cost_micros=600)
        assert again.decision is eg.Decision.DUPLICATE and trace.round_trips <= 1
        over = c.begin(effect_type="pay.out", key="gov:2", payload={"n": 2}, run_id="r",
                       estimated_cost_micros=600)
        assert over.decision is eg.Decision.DENIED
        assert "spend ceiling reached" in (over.reason or "")
        with gate.store.connection() as conn:
            spent = sorted(r[0] for r in conn.execute(
                "SELECT spent_micros FROM effectgate_budgets WHERE namespace = %s",
                (namespace,)).fetchall())
        assert spent == [600, 600]  # the refused begin charged neither ceiling
        fits = c.begin(effect_type="pay.out", key="gov:3", payload={"n": 3}, run_id="r",
                       estimated_cost_micros=400)
        assert fits.decision is eg.Decision.EXECUTE
        assert gate.get("gov:3").state is eg.State.IN_FLIGHT
    finally:
        gate.close()
