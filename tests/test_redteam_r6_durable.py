"""Red team, round 6: the durable engines (DBOS, Temporal) and the CrewAI, Google ADK and
Microsoft Agent Framework adapters, driven through their real loops offline."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg

# -- DBOS ------------------------------------------------------------------------------------


@pytest.fixture
def dbos_app(tmp_path: Path) -> Iterator[Any]:
    dbos = pytest.importorskip("dbos")
    dbos.DBOS.destroy(destroy_registry=True)
    dbos.DBOS(config={"name": "effectgate-r6",
                      "system_database_url": f"sqlite:///{tmp_path / 'dbos.sqlite'}"})
    yield dbos
    dbos.DBOS.destroy(destroy_registry=True)


def test_dbos_a_body_raising_effect_in_flight_is_ambiguous_at_once_not_waited_on(
        gate: eg.Gate, dbos_app: Any) -> None:
    """The step's body charged, then called another gated effect that someone else holds:
    that EffectInFlight is the body's error (the step's effect is AMBIGUOUS), not "this step's
    key is in flight elsewhere". The step must say so at once, not sleep out the other
    effect's lease and then report it."""
    from effectgate.integrations.durable.dbos import effect_step
    DBOS = dbos_app.DBOS
    ledger: list[str] = []

    @gate.effect("notify:{txn_id}", effect_type="notify")
    def notify(txn_id: str) -> str:
        return "sent"

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)  # the charge happened
        notify(txn_id)  # held by another worker: EffectInFlight
        return {"refunded": amount_cents}

    @DBOS.workflow()
    def settle(txn_id: str) -> dict[str, Any]:
        return refund(txn_id, 500)

    DBOS.launch()
    other = gate.begin(effect_type="notify", key="notify:T1", payload={"txn_id": "T1"},
                       lease_seconds=30)
    assert other.decision is eg.Decision.EXECUTE
    with pytest.raises(eg.EffectAmbiguous) as caught:
        settle("T1")
    assert ledger == ["T1"]
    assert caught.value.key == "refund:T1"
    assert isinstance(caught.value.__cause__, eg.EffectInFlight)  # the body's, named as such
    assert "raised EffectInFlight after its body started" in str(caught.value)
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


async def test_dbos_an_async_body_raising_effect_in_flight_is_ambiguous_at_once(
        gate: eg.Gate, dbos_app: Any) -> None:
    """The same through an async step: the body's EffectInFlight is its own error."""
    from effectgate.integrations.durable.dbos import effect_step
    DBOS = dbos_app.DBOS
    ledger: list[str] = []

    @gate.effect("notify:{txn_id}", effect_type="notify")
    async def notify(txn_id: str) -> str:
        return "sent"

    @effect_step(gate, "refund:{txn_id}", effect_type="payment.refund")
    async def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        ledger.append(txn_id)
        await notify(txn_id)
        return {"refunded": amount_cents}

    @DBOS.workflow()
    async def settle(txn_id: str) -> dict[str, Any]:
        return await refund(txn_id, 500)

    DBOS.launch()
    gate.begin(effect_type="notify", key="notify:T1", payload={"txn_id": "T1"},
               lease_seconds=30)
    with pytest.raises(eg.EffectAmbiguous) as caught:
        await settle("T1")
    assert ledger == ["T1"] and caught.value.key == "refund:T1"
    assert isinstance(caught.value.__cause__, eg.EffectInFlight)
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


# -- Temporal --------------------------------------------------------------------------------


def _environment(attempt: int = 1) -> Any:
    import dataclasses

    from temporalio.testing import ActivityEnvironment

    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt, workflow_id="wf-r6",
                                   activity_id="7")
    return env


def test_temporal_a_body_that_returned_after_a_forced_failed_is_never_retried(
        gate: eg.Gate) -> None:
    """An operator forces FAILED on an activity that looks stuck; the body, which does not
    heartbeat, goes on, deploys and returns. Its report is fenced (the operator's word
    stands), but the deploy happened: Temporal must not be told to retry it (attempt 2 would
    deploy again), as it was ("a new attempt gets what was settled")."""
    pytest.importorskip("temporalio")
    from temporalio import activity
    from temporalio.exceptions import ApplicationError

    from effectgate.integrations.durable.temporal import effect_activity
    ledger: list[str] = []

    @activity.defn
    @effect_activity(gate, "deploy:{name}", effect_type="deploy", lease_seconds=30)
    def deploy(name: str) -> str:
        gate.resolve(f"deploy:{name}", "failed", by="alice", force=True, note="looks stuck")
        ledger.append(name)  # the deploy happens all the same
        return "done"

    with pytest.raises(ApplicationError) as caught:
        _environment().run(deploy, "api")
    err = caught.value
    assert err.non_retryable and err.type == "StaleLease"
    assert "effectgate resolve deploy:api --committed" in err.message
    assert ledger == ["api"]
    assert gate.get("deploy:api").state is eg.State.FAILED  # the operator's record stands


async def test_temporal_an_async_body_that_returned_after_a_forced_failed_is_never_retried(
        gate: eg.Gate) -> None:
    pytest.importorskip("temporalio")
    from temporalio import activity
    from temporalio.exceptions import ApplicationError

    from effectgate.integrations.durable.temporal import effect_activity
    ledger: list[str] = []

    @activity.defn
    @effect_activity(gate, "deploy:{name}", effect_type="deploy", lease_seconds=30)
    async def deploy(name: str) -> str:
        await gate.aresolve(f"deploy:{name}", "failed", by="alice", force=True)
        ledger.append(name)
        return "done"

    with pytest.raises(ApplicationError) as caught:
        await _environment().run(deploy, "api")
    assert caught.value.non_retryable and caught.value.type == "StaleLease"
    assert ledger == ["api"]


def test_temporal_a_forced_failed_that_stops_the_body_at_a_heartbeat_is_still_retried(
        gate: eg.Gate) -> None:
    """The body did not return (stopped at its heartbeat): the operator's FAILED is what a
    retry gets, as before."""
    pytest.importorskip("temporalio")
    from temporalio import activity
    from temporalio.exceptions import ApplicationError

    from effectgate.integrations.durable.temporal import effect_activity

    @activity.defn
    @effect_activity(gate, "deploy:{name}", effect_type="deploy", lease_seconds=0.4)
    def deploy(name: str) -> str:
        gate.resolve(f"deploy:{name}", "failed", by="alice", force=True)
        time.sleep(0.15)
        activity.heartbeat()
        raise AssertionError("stopped at the heartbeat")

    with pytest.raises(ApplicationError) as caught:
        _environment().run(deploy, "api")
    assert caught.value.type == "StaleLease" and not caught.value.non_retryable


def test_dbos_a_body_that_returned_after_a_forced_failed_says_it_happened(
        gate: eg.Gate, dbos_app: Any) -> None:
    """The DBOS twin of the Temporal case: the step is not retried (StaleLease never is), and
    its error must say the effect happened, as an unknown outcome naming the operator's next
    step, not leave a fork to run it again on the operator's FAILED without a word."""
    from effectgate.integrations.durable.dbos import effect_step
    DBOS = dbos_app.DBOS
    ledger: list[str] = []

    @effect_step(gate, "deploy:{name}", effect_type="deploy",
                 step={"retries_allowed": True, "max_attempts": 3, "interval_seconds": 0.01})
    def deploy(name: str) -> str:
        gate.resolve(f"deploy:{name}", "failed", by="alice", force=True, note="looks stuck")
        ledger.append(name)
        return "done"

    @DBOS.workflow()
    def ship(name: str) -> str:
        return deploy(name)

    DBOS.launch()
    with pytest.raises(eg.EffectAmbiguous) as caught:
        ship("api")
    assert ledger == ["api"]
    assert "effectgate resolve deploy:api --committed" in str(caught.value)
    assert "body returned" in str(caught.value)


# -- hostile model output through the frameworks' real loops ----------------------------------


def _af_run(gate: eg.Gate, func: Any, turns: list[list[tuple[str, Any]]],
            session: str) -> dict[str, str]:
    """Agent Framework's real loop; each call's arguments as the model's raw JSON text (a
    str) or a mapping."""
    import asyncio

    pytest.importorskip("agent_framework")
    from agent_framework import Agent

    from effectgate.integrations.agent_framework import EffectGateMiddleware
    from tests.adapter_drivers import af_client, af_results

    middleware = EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate)
    agent = Agent(client=af_client(turns), name="billing", tools=[func], middleware=[middleware])

    async def go() -> dict[str, str]:
        response = await agent.run("refund", session=agent.create_session(session_id=session))
        return af_results(response.messages)

    return asyncio.run(go())


def test_af_duplicate_json_keys_are_keyed_as_the_function_runs_them(gate: eg.Gate) -> None:
    """``{"amount_cents": 5, "amount_cents": 900}``: the framework parses it (the last one
    wins) and the gate keys what the function is called with, not the first value: the
    record's payload is the 900 refund, a clean 900 repeat gets the stored result, a 5 is a
    conflict."""
    pytest.importorskip("agent_framework")
    from agent_framework import tool

    ledger: list[tuple[str, int]] = []

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    raw = '{"txn_id": "T1", "amount_cents": 5, "amount_cents": 900}'
    out = _af_run(gate, refund, [[("c1", raw)]], "s1")
    assert out == {"c1": "refunded 900 on T1"} and ledger == [("T1", 900)]
    spec = eg.EffectSpec(gate, "refund:{txn_id}", effect_type="refund")
    record = gate.get("refund:T1")
    assert record.payload_hash == spec.request({"txn_id": "T1", "amount_cents": 900}).payload_hash
    again = _af_run(gate, refund, [[("c2", {"txn_id": "T1", "amount_cents": 900})],
                                   [("c3", {"txn_id": "T1", "amount_cents": 5})]], "s2")
    assert again["c2"] == "refunded 900 on T1" and again["c3"].startswith("CONFLICT")
    assert ledger == [("T1", 900)]


def test_adk_non_string_keys_deep_in_an_argument_are_refused_before_anything_is_stored(
        gate: eg.Gate) -> None:
    """A model's argument with a non-string mapping key (no canonical JSON form) or nested
    past the canonical form's depth, through ADK's real loop: told INVALID ARGUMENTS, the
    function never runs, and no row is written."""
    import asyncio

    pytest.importorskip("google.adk")
    from google.adk.tools import FunctionTool

    from effectgate.integrations.google_adk import gate_tool
    from tests.adapter_drivers import adk_run
    from tests.conftest import snapshot

    ledger: list[str] = []

    def refund(txn_id: str, amount_cents: int, meta: Any = None) -> str:
        """Refund a card transaction."""
        ledger.append(txn_id)
        return f"refunded {amount_cents} on {txn_id}"

    gated = gate_tool(FunctionTool(refund), "refund:{txn_id}", gate=gate)
    before = snapshot(gate)
    out = asyncio.run(adk_run([gated], [[
        ("c1", {"txn_id": "T1", "amount_cents": 5, "meta": {1: "x"}}, "refund"),
        ("c2", {"txn_id": "T2", "amount_cents": 5, "meta": float("nan")}, "refund"),
        ("c3", {"txn_id": "T3" * 300, "amount_cents": 5}, "refund"),
    ]], run_id="s-hostile"))
    assert all(text.startswith("INVALID ARGUMENTS") for text in out.values()), out
    assert set(out) == {"c1", "c2", "c3"}
    assert ledger == [] and snapshot(gate) == before
