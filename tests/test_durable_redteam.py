"""Red-team tests of the durable-engine adapters: what a demanding user of DBOS and Temporal
meets, on a real DBOS (SQLite system database) and a real store."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from tests.conftest import snapshot

pytest.importorskip("dbos")
pytest.importorskip("temporalio")
from dbos import DBOS, SetWorkflowID
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from effectgate.integrations.durable.dbos import effect_step
from effectgate.integrations.durable.temporal import effect_activity

NAIVE = datetime.datetime(2026, 1, 1, 9, 30)  # no timezone: no canonical JSON form


@pytest.fixture
def dbos_app(tmp_path: Path) -> Iterator[None]:
    """A DBOS application on a fresh SQLite system database."""
    DBOS.destroy(destroy_registry=True)
    DBOS(config={"name": "effectgate-redteam",
                 "system_database_url": f"sqlite:///{tmp_path / 'dbos.sqlite'}"})
    yield
    DBOS.destroy(destroy_registry=True)


ROOT = Path(__file__).parent.parent


def environment(attempt: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt, workflow_id="wf-rt",
                                   activity_id="9")
    return env


def test_temporal_never_retries_arguments_with_no_canonical_form(gate: eg.Gate) -> None:
    """A naive datetime cannot be hashed at any attempt: the activity fails non-retryably
    (Temporal's default policy would retry a plain error forever), the body never ran and the
    store is unchanged."""
    ran: list[str] = []

    @activity.defn
    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, when: datetime.datetime) -> str:
        ran.append(txn_id)
        return "ok"

    before = snapshot(gate)
    with pytest.raises(ApplicationError) as caught:
        environment(attempt=1).run(refund, "T1", NAIVE)
    err = caught.value
    assert err.type == "PayloadError" and err.non_retryable
    assert "naive datetime" in err.message
    assert ran == [] and snapshot(gate) == before


def test_dbos_never_retries_arguments_with_no_canonical_form(gate: eg.Gate,
                                                             dbos_app: None) -> None:
    """DBOS's retries (with a should_retry that says yes to everything) never repeat a
    PayloadError: one attempt, the body never ran, the store is unchanged."""
    ran: list[str] = []
    asked: list[str] = []

    def yes(error: BaseException) -> bool:
        asked.append(type(error).__name__)
        return True

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund",
                 step={"retries_allowed": True, "max_attempts": 3, "interval_seconds": 0.01,
                       "should_retry": yes})
    def refund(txn_id: str, when: datetime.datetime) -> str:
        ran.append(txn_id)
        return "ok"

    @DBOS.workflow()
    def settle(txn_id: str) -> str:
        return refund(txn_id, NAIVE)

    DBOS.launch()
    before = snapshot(gate)
    with pytest.raises(eg.PayloadError, match="naive datetime"), SetWorkflowID("wf-naive"):
        settle("T1")
    assert ran == [] and asked == [] and snapshot(gate) == before


async def test_a_dbos_step_timeout_mid_body_is_ambiguous_and_not_run_again(
        gate: eg.Gate, dbos_app: None) -> None:
    """DBOS cancels an async step past its ``timeout_seconds`` and retries it: the body that
    was cut short ran once, the retry is refused (EffectAmbiguous), the effect is AMBIGUOUS."""
    ledger: list[str] = []

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund",
                 step={"retries_allowed": True, "max_attempts": 3, "interval_seconds": 0.01,
                       "timeout_seconds": 0.3})
    async def refund(txn_id: str) -> dict[str, Any]:
        ledger.append(txn_id)
        await asyncio.sleep(5)
        return {"ok": True}

    @DBOS.workflow()
    async def settle(txn_id: str) -> dict[str, Any]:
        return await refund(txn_id)

    DBOS.launch()
    with pytest.raises(eg.EffectAmbiguous) as caught, SetWorkflowID("wf-timeout"):
        await settle("T1")
    assert caught.value.key == "refund:T1" and ledger == ["T1"]
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


ASYNC_WORKER = '''
import asyncio, json, os, signal, sys
from dbos import DBOS, SetWorkflowID
import effectgate as eg
from effectgate.integrations.durable.dbos import effect_step

store, namespace, system_db, ledger, mode = sys.argv[1:6]
gate = eg.Gate(store, namespace=namespace)
DBOS(config={"name": "effectgate-async-crash", "system_database_url": system_db,
             "application_version": "async-crash"})


@effect_step(gate, "refund:{txn_id}", effect_type="payment.refund", lease_seconds=1.0,
             step={"retries_allowed": True, "max_attempts": 3, "interval_seconds": 0.05})
async def refund(txn_id: str, amount_cents: int) -> dict:
    with open(ledger, "a") as out:
        out.write(f"refund {txn_id}\\n")
        out.flush()
        os.fsync(out.fileno())
    if mode == "run":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"refunded": amount_cents}


@DBOS.workflow()
async def settle(txn_id: str) -> dict:
    return await refund(txn_id, 500)


async def main() -> None:
    DBOS.launch()
    try:
        if mode == "run":
            with SetWorkflowID("wf-async-crash"):
                await settle("T1")
        handle = await DBOS.retrieve_workflow_async("wf-async-crash")
        try:
            print(json.dumps({"result": await handle.get_result()}))
        except Exception as err:
            print(json.dumps({"error": type(err).__name__, "key": getattr(err, "key", None)}))
    finally:
        DBOS.destroy()


asyncio.run(main())
'''


@pytest.mark.slow
def test_an_async_step_killed_after_its_side_effect_is_refused_on_recovery(
        gate: eg.Gate, store_url: str, tmp_path: Path) -> None:
    """SIGKILL inside an async step's body, after the side effect: DBOS's recovery in a new
    process re-runs the step, which waits out the dead holder's lease and ends the workflow
    with EffectAmbiguous (DBOS's retries are on); the refund happened once."""

    worker = tmp_path / "async_worker.py"
    worker.write_text(ASYNC_WORKER)
    ledger = tmp_path / "ledger"

    def run(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(worker), store_url, gate.namespace,
             f"sqlite:///{tmp_path / 'dbos.sqlite'}", str(ledger), mode],
            capture_output=True, text=True, timeout=240,
            env={**os.environ, "PYTHONPATH": str(ROOT)})

    killed = run("run")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert gate.get("refund:T1").state is eg.State.IN_FLIGHT
    recovered = run("recover")
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    outcome = json.loads(recovered.stdout.strip().splitlines()[-1])
    assert outcome == {"error": "EffectAmbiguous", "key": "refund:T1"}
    assert ledger.read_text().count("refund T1") == 1
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


TEMPORAL_WORKER = '''
import os, signal, sys
from temporalio import activity
from temporalio.testing import ActivityEnvironment
import effectgate as eg
from effectgate.integrations.durable.temporal import effect_activity

store, namespace, ledger = sys.argv[1:4]
gate = eg.Gate(store, namespace=namespace)


@activity.defn
@effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund", lease_seconds=1.0)
def refund(txn_id: str, amount_cents: int) -> dict:
    activity.heartbeat()
    with open(ledger, "a") as out:
        out.write(f"refund {txn_id}\\n")
        out.flush()
        os.fsync(out.fileno())
    os.kill(os.getpid(), signal.SIGKILL)  # the worker dies before anything is recorded
    return {"refunded": amount_cents}


ActivityEnvironment().run(refund, "T1", 500)
'''


@pytest.mark.slow
def test_a_temporal_worker_killed_after_the_side_effect_is_never_retried(
        gate: eg.Gate, store_url: str, tmp_path: Path) -> None:
    """A worker process SIGKILLed inside the activity's body, after the side effect: Temporal's
    next attempt is told to come back after the dead holder's lease (retryable
    EffectInFlight), and the one after that gets a non-retryable EffectAmbiguous. One refund."""

    worker = tmp_path / "temporal_worker.py"
    worker.write_text(TEMPORAL_WORKER)
    ledger = tmp_path / "ledger"
    killed = subprocess.run([sys.executable, str(worker), store_url, gate.namespace, str(ledger)],
                            capture_output=True, text=True, timeout=240,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]

    @activity.defn
    @effect_activity(gate, "refund:{txn_id}", effect_type="payment.refund", lease_seconds=1.0)
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        raise AssertionError("a retry must not run the refund again")

    with pytest.raises(ApplicationError) as waiting:
        environment(attempt=2).run(refund, "T1", 500)
    delay = waiting.value.next_retry_delay
    assert waiting.value.type == "EffectInFlight" and not waiting.value.non_retryable
    assert delay is not None and delay <= datetime.timedelta(seconds=1)
    time.sleep(delay.total_seconds() + 0.05)
    with pytest.raises(ApplicationError) as refused:
        environment(attempt=3).run(refund, "T1", 500)
    assert refused.value.type == "EffectAmbiguous" and refused.value.non_retryable
    assert "effectgate resolve refund:T1" in refused.value.message
    assert ledger.read_text().count("refund T1") == 1
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS
