"""A gated DBOS step (``effect_step``) on a real DBOS with a SQLite system database, offline:
what DBOS runs again (a fork, a recovery after a SIGKILL) the gate answers from the store, and
DBOS's own retries never retry an unknown outcome."""

from __future__ import annotations

import functools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from tests.callables import APPROVE_BOTH, AsyncRefund, Refund, wire
from tests.conftest import snapshot

dbos_module = pytest.importorskip("dbos")
from dbos import DBOS, SetWorkflowID  # noqa: E402

from effectgate.integrations.durable.dbos import effect_step  # noqa: E402

WORKER = Path(__file__).parent / "workers" / "durable_dbos.py"


@pytest.fixture
def dbos_app(tmp_path: Path) -> Iterator[None]:
    """A DBOS application on a fresh SQLite system database; declare steps and workflows in
    the test, then call ``DBOS.launch()``."""
    DBOS.destroy(destroy_registry=True)
    DBOS(config={"name": "effectgate-test",
                 "system_database_url": f"sqlite:///{tmp_path / 'dbos.sqlite'}"})
    yield
    DBOS.destroy(destroy_registry=True)


def test_a_step_dbos_runs_again_is_answered_from_the_store(gate: eg.Gate, dbos_app: None) -> None:
    """A fork re-runs the step under a new workflow id: the body ran once, the fork got the
    stored result, and the effect's run_id is the workflow that did it."""
    ledger: list[str] = []

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        return {"refunded": amount_cents, "step": DBOS.step_id}

    @DBOS.workflow()
    def settle(txn_id: str) -> dict[str, Any]:
        return refund(txn_id, 500)

    DBOS.launch()
    with SetWorkflowID("wf-first"):
        first = settle("T1")
    again = DBOS.fork_workflow("wf-first", 1).get_result()
    assert first == again == {"refunded": 500, "step": 1}
    assert ledger == ["T1"]
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED and record.run_id == "wf-first"


async def test_an_async_step_dbos_runs_again_is_answered_from_the_store(
        gate: eg.Gate, dbos_app: None) -> None:
    ledger: list[str] = []

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund")
    async def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        return {"refunded": amount_cents}

    @DBOS.workflow()
    async def settle(txn_id: str) -> dict[str, Any]:
        return await refund(txn_id, 500)

    DBOS.launch()
    with SetWorkflowID("wf-async"):
        first = await settle("T1")
    fork = await DBOS.fork_workflow_async("wf-async", 1)
    assert first == await fork.get_result() == {"refunded": 500}
    assert ledger == ["T1"]
    assert gate.get("refund:T1").run_id == "wf-async"


def test_dbos_retries_never_retry_an_ambiguous_effect(gate: eg.Gate, dbos_app: None) -> None:
    """retries_allowed with a should_retry that says yes to everything: the body that raised
    after it started ran once, and the step raised EffectAmbiguous naming the operator's next
    step and the fork that re-runs it."""
    ledger: list[str] = []
    asked: list[str] = []

    def yes(error: BaseException) -> bool:
        asked.append(type(error).__name__)
        return True

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund",
                 step={"retries_allowed": True, "max_attempts": 3, "interval_seconds": 0.01,
                       "should_retry": yes})
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        raise TimeoutError("the vendor did not answer")

    @DBOS.workflow()
    def settle(txn_id: str) -> dict[str, Any]:
        return refund(txn_id, 500)

    DBOS.launch()
    with pytest.raises(eg.EffectAmbiguous) as caught, SetWorkflowID("wf-amb"):
        settle("T1")
    assert ledger == ["T1"] and asked == []
    err = caught.value
    assert err.key == "refund:T1" and err.state == "ambiguous"
    message = str(err)
    assert f"effectgate resolve refund:T1 --committed (or --failed) -n {gate.namespace}" in message
    assert "dbos workflow fork wf-amb --step 1" in message
    assert "the vendor did not answer" not in message  # raw exception text is never stored
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


def test_after_the_operator_resolves_it_the_fork_returns_what_was_resolved(
        gate: eg.Gate, dbos_app: None) -> None:
    ledger: list[str] = []

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        raise ConnectionResetError("reset after send")

    @DBOS.workflow()
    def settle(txn_id: str) -> dict[str, Any]:
        return refund(txn_id, 500)

    DBOS.launch()
    with pytest.raises(eg.EffectAmbiguous), SetWorkflowID("wf-r"):
        settle("T1")
    with pytest.raises(eg.EffectAmbiguous):  # DBOS replays the recorded error, the gate too
        DBOS.fork_workflow("wf-r", 1).get_result()
    gate.resolve("refund:T1", "committed", by="alice", result={"refunded": 500},
                 note="seen in the dashboard")
    assert DBOS.fork_workflow("wf-r", 1).get_result() == {"refunded": 500}
    assert ledger == ["T1"]


def test_a_failed_effect_is_retried_by_dbos_as_the_next_attempt(
        gate: eg.Gate, dbos_app: None) -> None:
    calls: list[int] = []

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund",
                 step={"retries_allowed": True, "max_attempts": 3, "interval_seconds": 0.01})
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        calls.append(eg.current_effect().attempt)
        if len(calls) == 1:
            raise eg.NotExecuted("the vendor refused the connection")
        return {"refunded": amount_cents}

    @DBOS.workflow()
    def settle(txn_id: str) -> dict[str, Any]:
        return refund(txn_id, 500)

    DBOS.launch()
    assert settle("T1") == {"refunded": 500}
    assert calls == [1, 2]
    assert gate.get("refund:T1").attempt == 2


def test_a_step_waits_for_an_effect_in_flight_elsewhere(gate: eg.Gate, dbos_app: None) -> None:
    """Another holder has the key in flight: the step waits, then gets what it committed."""
    ledger: list[str] = []

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund", lease_seconds=2)
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        return {"refunded": amount_cents, "by": "step"}

    @DBOS.workflow()
    def settle(txn_id: str) -> dict[str, Any]:
        return refund(txn_id, 500)

    DBOS.launch()
    held = gate.begin(effect_type="payment.refund", key="refund:T1",
                      payload={"txn_id": "T1", "amount_cents": 500}, lease_seconds=2)
    assert held.decision is eg.Decision.EXECUTE
    timer = threading.Timer(0.3, lambda: gate.report(held, "committed",
                                                     result={"refunded": 500, "by": "other"}))
    timer.start()
    try:
        assert settle("T1") == {"refunded": 500, "by": "other"}
    finally:
        timer.join()
    assert ledger == []


def test_a_step_gives_up_waiting_with_effect_in_flight(gate: eg.Gate, dbos_app: None) -> None:
    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund", wait_in_flight=0.2)
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        raise AssertionError("the body must not run while another holder has it")

    @DBOS.workflow()
    def settle(txn_id: str) -> dict[str, Any]:
        return refund(txn_id, 500)

    DBOS.launch()
    gate.begin(effect_type="payment.refund", key="refund:T1",
               payload={"txn_id": "T1", "amount_cents": 500}, lease_seconds=30)
    started = time.monotonic()
    with pytest.raises(eg.EffectInFlight):
        settle("T1")
    assert 0.15 < time.monotonic() - started < 5


def test_approval_and_denial_are_never_retried_by_dbos(make_gate: Any, dbos_app: None) -> None:
    gate = make_gate(policy={"effects": {"payment.*": {"approval": "always"}}})
    ledger: list[str] = []

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund",
                 step={"retries_allowed": True, "max_attempts": 3, "interval_seconds": 0.01})
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        return {"refunded": amount_cents}

    @DBOS.workflow()
    def settle(txn_id: str) -> dict[str, Any]:
        return refund(txn_id, 500)

    DBOS.launch()
    started = time.monotonic()
    with pytest.raises(eg.ApprovalRequired):
        settle("T1")
    assert time.monotonic() - started < 1.0  # not retried (3 attempts would back off)
    assert ledger == []


def test_bad_options_are_refused_before_anything_runs(gate: eg.Gate, dbos_app: None) -> None:
    before = snapshot(gate)

    def refund(txn_id: str) -> None: ...

    for bad in ({"retries": True}, "retries_allowed", {"should_retry": "yes"}):
        with pytest.raises(eg.ConfigError):
            effect_step(gate, "refund:{txn_id}", step=bad)(refund)  # type: ignore[arg-type]
    for wait in (-1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(eg.ConfigError):
            effect_step(gate, "refund:{txn_id}", wait_in_flight=wait)(refund)  # type: ignore[arg-type]
    with pytest.raises(eg.ConfigError):
        effect_step("not a gate", "refund:{txn_id}")(refund)  # type: ignore[arg-type]
    with pytest.raises(eg.ConfigError):
        effect_step(gate, "refund:{txn_id}")("not a function")  # type: ignore[arg-type]
    with pytest.raises(eg.EffectKeyError):
        effect_step(gate, "refund:{order}")(refund)
    assert snapshot(gate) == before



def test_a_callable_object_or_a_partial_gets_the_effect_type_gate_effect_gives_it(
        make_gate: Any, dbos_app: None) -> None:
    """The policy's rule for that type (here: approval) applies to the step."""
    gate = make_gate(policy=APPROVE_BOTH)
    ledger: list[str] = []

    refund = effect_step(gate, "refund:{txn_id}")(Refund(ledger))
    wire_eur = effect_step(gate, "wire:{txn_id}")(functools.partial(wire, ledger, "EUR"))

    @DBOS.workflow()
    def settle(txn_id: str) -> dict[str, Any]:
        return refund(txn_id, 500)  # type: ignore[no-any-return]

    @DBOS.workflow()
    def pay(txn_id: str) -> dict[str, Any]:
        return wire_eur(txn_id, 500)  # type: ignore[no-any-return]

    DBOS.launch()
    for workflow, key, effect_type in ((settle, "refund:T1", "Refund"), (pay, "wire:T1", "wire")):
        with pytest.raises(eg.ApprovalRequired):
            workflow("T1")
        assert gate.get(key).effect_type == effect_type
    assert ledger == []


async def test_an_async_callable_object_is_gated_as_an_async_step(
        gate: eg.Gate, dbos_app: None) -> None:
    ledger: list[str] = []
    refund = effect_step(gate, "refund:{txn_id}", effect_type="payment.refund")(
        AsyncRefund(ledger))

    @DBOS.workflow()
    async def settle(txn_id: str) -> dict[str, Any]:
        return await refund(txn_id, 500)  # type: ignore[no-any-return]

    DBOS.launch()
    assert await settle("T1") == {"refunded": 500}
    assert gate.get("refund:T1").state is eg.State.COMMITTED and ledger == ["T1"]


async def test_an_async_steps_should_retry_may_answer_with_an_awaitable(
        gate: eg.Gate, dbos_app: None) -> None:
    """A plain function returning an awaitable (which DBOS allows): its answer is awaited,
    so "do not retry" is obeyed, and "retry" runs attempt n+1."""
    calls: list[str] = []

    async def only(kind: str, error: BaseException) -> bool:
        return kind in str(error)

    options = {"retries_allowed": True, "max_attempts": 3, "interval_seconds": 0.01,
               "should_retry": lambda error: only("transient", error)}

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund", step=options)
    async def refund(txn_id: str, why: str) -> str:
        calls.append(txn_id)
        if calls.count(txn_id) == 1:
            raise eg.NotExecuted(f"{why}: the vendor refused the connection")
        return "refunded"

    @DBOS.workflow()
    async def settle(txn_id: str, why: str) -> str:
        return await refund(txn_id, why)  # type: ignore[no-any-return]

    DBOS.launch()
    with pytest.raises(eg.NotExecuted):
        await settle("T1", "permanent")
    assert calls == ["T1"] and gate.get("refund:T1").attempt == 1
    assert await settle("T2", "transient") == "refunded"
    assert calls == ["T1", "T2", "T2"] and gate.get("refund:T2").attempt == 2


def test_a_sync_steps_should_retry_cannot_answer_with_an_awaitable(
        gate: eg.Gate, dbos_app: None) -> None:
    """A sync step has no loop to await an answer on: an async should_retry is refused when
    the step is declared; a plain one that returns an awaitable raises ConfigError instead
    of its awaitable counting as "retry"."""
    calls: list[str] = []
    before = snapshot(gate)

    async def never(error: BaseException) -> bool:
        return False

    def refund(txn_id: str) -> str:
        calls.append(txn_id)
        raise eg.NotExecuted("the vendor refused the connection")

    options: dict[str, Any] = {"retries_allowed": True, "max_attempts": 3,
                               "interval_seconds": 0.01, "should_retry": never}
    with pytest.raises(eg.ConfigError):
        effect_step(gate, "refund:{txn_id}", effect_type="payment.refund", step=options)(refund)
    assert snapshot(gate) == before
    options["should_retry"] = lambda error: never(error)
    step = effect_step(gate, "refund:{txn_id}", effect_type="payment.refund",
                       step=options)(refund)  # type: ignore[arg-type]

    @DBOS.workflow()
    def settle(txn_id: str) -> str:
        return step(txn_id)  # type: ignore[no-any-return]

    DBOS.launch()
    with pytest.raises(eg.ConfigError, match="awaitable"):
        settle("T1")
    assert calls == ["T1"] and gate.get("refund:T1").state is eg.State.FAILED


# -- real crashes: SIGKILL, then DBOS recovery in a new process ---------------------------------


def _worker(store_url: str, namespace: str, tmp_path: Path, mode: str) -> list[str]:
    return [sys.executable, str(WORKER), store_url, namespace,
            f"sqlite:///{tmp_path / 'dbos.sqlite'}", str(tmp_path / "ledger"), "wf-crash", mode]


def _run(args: list[str], **env: str) -> dict[str, Any]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=240,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _wait_for(path: Path, child: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 240
    while not path.exists():
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.slow
def test_killed_after_the_commit_before_dbos_checkpoints_recovery_returns_the_stored_result(
        gate: eg.Gate, store_url: str, tmp_path: Path) -> None:
    """The process is SIGKILLed after the gate committed the refund and before DBOS recorded
    the step (its system database is held locked meanwhile, as a busy disk would): recovery in
    a new process re-runs the step, which the gate answers from the store."""
    ledger = tmp_path / "ledger"
    args = _worker(store_url, gate.namespace, tmp_path, "run")
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(Path(f"{ledger}.ready"), child)
        lock = sqlite3.connect(tmp_path / "dbos.sqlite", isolation_level=None, timeout=60)
        lock.execute("BEGIN IMMEDIATE")  # DBOS cannot write its checkpoint until we let go
        Path(f"{ledger}.go").touch()
        deadline = time.monotonic() + 120
        while gate.get("refund:T1").state is not eg.State.COMMITTED:
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)
        assert child.poll() is None  # still waiting for its checkpoint
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        lock.execute("ROLLBACK")
        lock.close()
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
    assert ledger.read_text().count("refund T1") == 1
    recovered = _run(_worker(store_url, gate.namespace, tmp_path, "recover"))
    assert recovered == {"result": {"refunded": 500, "txn": "T1"}}
    assert ledger.read_text().count("refund T1") == 1
    assert gate.get("refund:T1").run_id == "wf-crash"


@pytest.mark.slow
def test_killed_after_the_side_effect_recovery_refuses_then_a_fork_returns_the_resolution(
        gate: eg.Gate, store_url: str, tmp_path: Path) -> None:
    """SIGKILL after the side effect, before the gate recorded it: recovery waits out the dead
    holder's lease and ends the workflow with EffectAmbiguous (not retried, though DBOS's
    retries are on); the operator resolves it; the fork returns what was resolved. One refund."""
    ledger = tmp_path / "ledger"
    Path(f"{ledger}.go").touch()
    killed = subprocess.run(_worker(store_url, gate.namespace, tmp_path, "run"),
                            capture_output=True, text=True, timeout=240,
                            env={**os.environ, "KILL_IN_BODY": "1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert ledger.read_text().count("refund T1") == 1
    recovered = _run(_worker(store_url, gate.namespace, tmp_path, "recover"))
    assert recovered["error"] == "EffectAmbiguous" and recovered["key"] == "refund:T1"
    assert "effectgate resolve refund:T1 --committed" in recovered["message"]
    assert "dbos workflow fork wf-crash --step 1" in recovered["message"]
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS
    gate.resolve("refund:T1", "committed", by="alice", result={"refunded": 500, "txn": "T1"},
                 note="the vendor shows the refund")
    forked = _run(_worker(store_url, gate.namespace, tmp_path, "fork"))
    assert forked == {"result": {"refunded": 500, "txn": "T1"}}
    assert ledger.read_text().count("refund T1") == 1
