"""Review r3 of 2ddc174 (sagas: undos never out of order) and f53300c (Postgres store: the bare
reserve function, leases from the row's write, a governed move locks its row first).

Each test failed on the code the review read, for the reason its docstring gives:

* An MCP ``unwind_group`` undid an older step in this process while it handed the newer
  step's undo to the agent (out of order, G10): a step handed off now holds the older back.
* The console's saga page took any effect at the undo's key naming the step for its undo;
  it now applies the one test unwind and the MCP server apply (``sagas.is_undo``).
* The governed new-key function charges its counters before its insert; a holder's report
  takes the row, then the counters: 40P01, and the victim was the holder's report, whose
  outcome was lost. A transaction the server aborts whole is now run once more.

* Postgres computes an INSERT's VALUES before it waits on the unique index, so a
  reservation that waited there on another's insert (rolled back) was told EXECUTE on a lease
  counted from before the wait. Each generated reservation function now restarts the lease
  from the clock after its insert, while the row is still its own transaction's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import effectgate as eg

from .conftest import PG_URL, TEST_PREFIX, require_postgres

GROUP = "trip:r3"


# -- sagas -------------------------------------------------------------------------------------

def test_mcp_unwind_never_undoes_an_older_step_before_the_agents_newer_undo(
        make_gate: Any) -> None:
    """The hotel (newer) has no compensator in the MCP server's process: ``unwind_group``
    hands its undo to the agent (``to_compensate``). The flight (older) has one there. The
    flight must not be cancelled before the hotel's undo (newest first, G10): it is held back
    until the agent's undo is settled. Today the same call cancels the flight at once, and the
    agent then cancels the hotel: the older undo ran first."""
    from effectgate.integrations.mcp.server import unwind_answer

    gate: eg.Gate = make_gate(policy=False)
    order: list[str] = []

    @gate.compensator("booking.flight")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        order.append(compensation["cancel"])

    for step in ("flight", "hotel"):
        d = gate.begin(effect_type=f"booking.{step}", key=f"{step}:1", payload={},
                       group_key=GROUP, compensation={"cancel": step})
        gate.report(d, "committed")
    answer = unwind_answer(gate, GROUP, "agent")
    assert [s["key"] for s in answer["to_compensate"]] == ["hotel:1"]
    assert order == [], "the flight was cancelled before the hotel's undo was even begun"
    assert [s["key"] for s in answer["unresolved"]] == ["flight:1"]
    undo = gate.begin(**answer["to_compensate"][0]["begin_effect"], agent_id="agent")
    gate.report(undo, "committed")
    again = unwind_answer(gate, GROUP, "agent")
    assert order == ["flight"] and again["complete"]


def test_console_saga_page_agrees_with_unwind_on_what_undid_a_step(tmp_path: Any) -> None:
    """A user's own effect at ``compensate:a`` that names step ``a`` (its undo's type, another
    payload; another type is refused) is not a's undo: unwind lists ``a`` failed
    (PayloadMismatch) and undoes nothing, MCP says its undo's key is taken. The console's
    group page must not show ``a`` compensated by it."""
    from effectgate.console.app import Console
    from effectgate.console.sagas import steps_of

    gate = eg.Gate(f"sqlite:///{tmp_path / 'c.db'}", policy=False)
    try:
        @gate.compensator("booking.*")
        def cancel(record: eg.EffectRecord, compensation: Any) -> None:
            raise AssertionError("never called")

        d = gate.begin(effect_type="booking.x", key="a", payload={}, group_key="g",
                       compensation={"cancel": "a"})
        gate.report(d, "committed")
        with pytest.raises(eg.EffectKeyError):  # not the undo's type: the key is reserved
            gate.begin(effect_type="email.send", key="compensate:a", payload={"to": "x"},
                       compensates_effect_id=d.effect_id)
        with pytest.raises(eg.ConfigError):  # not its payload (red team, round 10)
            gate.begin(effect_type="booking.x.compensate", key="compensate:a",
                       payload={"to": "x"}, compensates_effect_id=d.effect_id)
        _left_by_an_older_effectgate(gate, d.effect_id)  # such an effect, begun before then
        report = gate.unwind("g")
        assert [s.key for s in report.failed] == ["a"] and report.compensated == []
        (step,) = steps_of(Console(gate, secure_cookies=False), "g")
        assert not step.undone, "the console shows compensated a step unwind says failed"
        assert step.undo is None
    finally:
        gate.close()


def _left_by_an_older_effectgate(gate: eg.Gate, step_id: int) -> None:
    """An effect at ``compensate:a`` of the undo's type naming step ``step_id`` with another
    payload, committed: what an effectgate before round 10's check let any caller begin."""
    from sqlalchemy import insert, select

    from effectgate.store.schema import effects

    with gate.store.engine.begin() as conn:
        row = dict(conn.execute(select(effects).where(effects.c.id == step_id)).one()._mapping)
        del row["id"]
        conn.execute(insert(effects).values(**{
            **row, "key": "compensate:a", "effect_type": "booking.x.compensate",
            "payload_hash": "0" * 64, "compensates_effect_id": step_id, "group_key": None,
            "compensation": None}))


# -- Postgres: a lease counted from before a lock wait ------------------------------------------

def _raw() -> str:
    return PG_URL.replace("+psycopg", "")


def _clock(conn: Any) -> float:
    return float(conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8"
                              ).fetchone()[0])


@pytest.fixture
def pg_namespace() -> str:
    require_postgres()
    import uuid
    return f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}"


# The three generated functions: bare (no optional field), full, and governed (a budget).
_RESERVATIONS = {
    "bare": ({}, False),
    "full": ({"run_id": "r1"}, False),
    "governed": ({"run_id": "r1", "estimated_cost_micros": 1_000},
                 {"effects": {"t.x": {"budget": {"per_run_micros": 10_000_000}}}}),
}


@pytest.mark.parametrize("kind", sorted(_RESERVATIONS))
def test_a_reservation_that_waited_on_a_rolled_back_insert_gets_its_whole_lease(
        pg_namespace: str, kind: str) -> None:
    """Another transaction inserted the same key and rolls back 1.5 s later (a worker that
    died mid-transaction, a deadlock victim): the reservation waits on the unique index, then
    inserts. Its lease must run ``lease_seconds`` from then, in the row and in the answer; it
    was computed before the wait, so the caller was told EXECUTE on a lease already over (a
    read saw it AMBIGUOUS)."""
    import psycopg

    fields, policy = _RESERVATIONS[kind]
    gate = eg.Gate(PG_URL, namespace=pg_namespace, policy=policy, lease_seconds=1)
    admin = psycopg.connect(_raw(), autocommit=True)
    side = psycopg.connect(_raw())
    try:
        gate.begin(effect_type="t.x", key="warm", payload={}, **fields)
        side.execute("INSERT INTO effectgate_effects (namespace, key, effect_type, payload_hash, "
                     "state, attempt, token, created_at, updated_at) SELECT namespace, 'k', "
                     "effect_type, payload_hash, 'pending_approval', 1, 1, created_at, "
                     "updated_at FROM effectgate_effects WHERE namespace = %s AND key = 'warm'",
                     (pg_namespace,))
        threading.Timer(1.5, side.rollback).start()
        d = gate.begin(effect_type="t.x", key="k", payload={}, **fields)
        now = _clock(admin)
        stored = admin.execute("SELECT lease_expires_at FROM effectgate_effects WHERE "
                               "namespace = %s AND key = 'k'", (pg_namespace,)).fetchone()[0]
        assert d.decision is eg.Decision.EXECUTE
        left = (d.lease_expires_epoch or 0.0) - now
        assert left > 0.5, f"EXECUTE with {left:.2f}s of a 1 s lease left"
        assert stored == pytest.approx(d.lease_expires_epoch, abs=1e-6)
        assert gate.get("k").state is eg.State.IN_FLIGHT  # not read as lapsed
    finally:
        gate.close()
        side.close()
        admin.close()


def _until_waiting(admin: Any, n: int, blocker: Any) -> None:
    """Until ``n`` sessions wait on a lock that the session ``blocker`` holds, or behind a
    session waiting for it."""
    end = time.time() + 10
    pid = blocker.info.backend_pid
    while admin.execute(
            "SELECT count(*) FROM pg_stat_activity a WHERE a.wait_event_type = 'Lock' AND "
            "(%(pid)s = ANY(pg_blocking_pids(a.pid)) OR EXISTS (SELECT 1 FROM "
            "unnest(pg_blocking_pids(a.pid)) b WHERE %(pid)s = ANY(pg_blocking_pids(b))))",
            {"pid": pid}).fetchone()[0] < n:
        assert time.time() < end, "never waited"
        time.sleep(0.02)


# -- Postgres: the governed new-key function's lock order ---------------------------------------

@pytest.fixture
def held() -> Iterator[list[Any]]:
    conns: list[Any] = []
    yield conns
    for conn in conns:
        conn.close()


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_a_governed_new_key_and_a_holders_report_do_not_deadlock(
        pg_namespace: str, held: list[Any], caller: str) -> None:
    """Two workers get the same job (one key) under a budget. A1 reserves it and reports
    FAILED (its report: the row, then the counters); A2, which read the key absent, holds the
    run counter and inserts the key: its unique check waits on A1's report, which waits on
    that counter. Postgres aborts one (40P01); here the holder's report, whose outcome was then
    not recorded (the effect lapsed to AMBIGUOUS): a transaction the server aborted whole is
    now run once more. The two side sessions only hold two counters
    for a moment (as other workers charging them do) to make the order certain."""
    import psycopg

    policy = eg.Policy.from_dict({"effects": {"pay.gov": {"budget": {
        "per_run_micros": 10**9, "per_agent_micros": 10**9}}}})
    fields: dict[str, Any] = {"effect_type": "pay.gov", "payload": {}, "run_id": "r",
                              "estimated_cost_micros": 1000}
    a1 = eg.Gate(PG_URL, namespace=pg_namespace, policy=policy)
    a2 = eg.Gate(PG_URL, namespace=pg_namespace, policy=policy)
    admin = psycopg.connect(_raw(), autocommit=True)
    held.append(admin)
    for gate, who in ((a1, "a1"), (a2, "a2")):  # the counters exist
        gate.report(gate.begin(**fields, key=f"warm:{who}", agent_id=who), "committed")

    def hold(scope: str) -> Any:
        conn = psycopg.connect(_raw())
        held.append(conn)
        conn.execute("SELECT 1 FROM effectgate_budgets WHERE namespace = %s AND scope_key = %s "
                     "FOR UPDATE", (pg_namespace, scope))
        return conn

    got: dict[str, Any] = {}

    def run(name: str, call: Any) -> threading.Thread:
        def target() -> None:
            try:
                got[name] = call()
            except eg.EffectGateError as err:
                got[name] = err
        thread = threading.Thread(target=target)
        thread.start()
        return thread

    try:
        on_run, on_agent2 = hold("pay.gov|run|r"), hold("pay.gov|agent|a2")
        t1 = run("a1", lambda: a1.begin(**fields, key="job:1", agent_id="a1"))
        _until_waiting(admin, 1, on_run)
        if caller == "sync":
            t2 = run("a2", lambda: a2.begin(**fields, key="job:1", agent_id="a2"))
        else:  # the async store's own governed reservation
            t2 = run("a2", lambda: asyncio.run(a2.abegin(**fields, key="job:1",
                                                         agent_id="a2")))
        _until_waiting(admin, 2, on_run)
        on_run.commit()  # a1 charges, inserts, EXECUTE; a2 holds the run counter
        t1.join(10)
        assert isinstance(got["a1"], eg.BeginDecision)
        assert got["a1"].decision is eg.Decision.EXECUTE
        t3 = run("report", lambda: a1.report(got["a1"], "failed", error="declined"))
        time.sleep(0.3)  # a1's report holds the row and waits for the run counter
        on_agent2.commit()
        t3.join(15)
        t2.join(15)
        assert not isinstance(got["report"], Exception), got["report"]
        assert not isinstance(got["a2"], Exception), got["a2"]
        assert a1.get("job:1").state is eg.State.FAILED
    finally:
        a1.close()
        a2.close()
