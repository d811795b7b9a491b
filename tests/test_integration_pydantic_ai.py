"""pydantic-ai: EffectGateToolset and gate_tool in real Agent runs, driven offline by
pydantic-ai's own TestModel and FunctionModel, on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import (
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.toolsets import FunctionToolset

import effectgate as eg
from effectgate.integrations.pydantic_ai import (
    EffectGateToolset,
    UngatedToolWarning,
    gate_tool,
    is_gated,
)
from effectgate.testing import temporary_gate

ARGS = {"txn_id": "T1", "amount_cents": 500}


@pytest.fixture
def ledger() -> list[Any]:
    return []


@pytest.fixture
def refund(ledger: list[Any]) -> Any:
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id} (#{len(ledger)})"

    return refund


@pytest.fixture
def sqlite_gate() -> Iterator[eg.Gate]:
    with temporary_gate() as gate:
        yield gate


def scripted(*turns: list[dict[str, Any]]) -> tuple[FunctionModel, list[Any]]:
    """A model that makes each turn's refund calls, then answers in text; and the parts it saw
    after each turn (tool returns, retry prompts)."""
    script = iter(turns)
    seen: list[Any] = []

    def model(messages: Any, info: Any) -> ModelResponse:
        seen.extend(p for p in messages[-1].parts
                    if isinstance(p, (ToolReturnPart, RetryPromptPart)))
        turn = next(script, None)
        if turn is None:
            return ModelResponse(parts=[TextPart("All done.")])
        return ModelResponse(parts=[ToolCallPart("refund", dict(args), tool_call_id=f"c{i}")
                                    for i, args in enumerate(turn)])

    return FunctionModel(model), seen


def toolset(fn: Any, gate: eg.Gate, **options: Any) -> EffectGateToolset:
    return EffectGateToolset(FunctionToolset([fn]), {"refund": "refund:{txn_id}"}, gate=gate,
                             **options)


def test_test_model_run_twice_executes_once(gate: eg.Gate, refund: Any,
                                            ledger: list[Any]) -> None:
    agent = Agent(TestModel(call_tools=["refund"]), toolsets=[toolset(refund, gate)],
                  name="billing")
    first = agent.run_sync("refund it", run_id="run-a")
    second = agent.run_sync("refund it again", run_id="run-b")
    assert ledger == [("a", 0)]  # TestModel's generated arguments
    assert first.output == second.output == '{"refund":"refunded 0 on a (#1)"}'
    record = gate.get("refund:a")
    assert (record.state, record.run_id, record.agent_id) == (eg.State.COMMITTED, "run-a",
                                                              "billing")


def test_gate_tool_in_agent_tools_executes_once(gate: eg.Gate, refund: Any,
                                                ledger: list[Any]) -> None:
    gated = gate_tool(Tool(refund), "refund:{txn_id}", gate=gate)
    assert is_gated(gated) and not is_gated(Tool(refund))
    model, seen = scripted([ARGS], [{"txn_id": "T1", "amount_cents": "500"}])
    Agent(model, tools=[gated]).run_sync("refund T1")
    assert ledger == [("T1", 500)]
    assert [p.content for p in seen] == ["refunded 500 on T1 (#1)"] * 2
    with pytest.raises(eg.ConfigError, match="already gated"):
        gate_tool(gated, "refund:{txn_id}", gate=gate)


def test_async_tool_executes_once(gate: eg.Gate, ledger: list[Any]) -> None:
    async def refund(txn_id: str, amount_cents: int) -> str:
        """Refund, asynchronously."""
        await asyncio.sleep(0)
        ledger.append(txn_id)
        return f"refunded {txn_id}"

    model, seen = scripted([ARGS], [ARGS])
    asyncio.run(Agent(model, toolsets=[toolset(refund, gate)]).run("refund T1"))
    assert ledger == ["T1"]
    assert [p.content for p in seen] == ["refunded T1"] * 2


def test_refusals_are_failed_tool_results_the_model_reads(gate: eg.Gate, refund: Any,
                                                          ledger: list[Any]) -> None:
    gate.begin(effect_type="refund", key="refund:T1", payload=ARGS, lease_seconds=30)
    model, seen = scripted([ARGS], [{"txn_id": "", "amount_cents": 1}])
    Agent(model, toolsets=[toolset(refund, gate)]).run_sync("refund T1")
    assert ledger == []
    waiting, invalid = seen
    assert isinstance(waiting, ToolReturnPart) and waiting.outcome == "failed"
    assert "NOT DONE YET" in waiting.model_response_str()
    # arguments that cannot name an effect: a retry prompt (correct them)
    assert isinstance(invalid, ToolReturnPart) and invalid.outcome == "retried"
    assert "INVALID ARGUMENTS" in invalid.model_response_str()


def test_a_lost_reply_is_outcome_unknown_and_raise_mode_stops_the_run(
        gate: eg.Gate, ledger: list[Any]) -> None:
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        ledger.append(txn_id)
        raise TimeoutError("the reply was lost")

    model, seen = scripted([ARGS], [ARGS])
    Agent(model, toolsets=[toolset(refund, gate)]).run_sync("refund T1")
    first, second = (p.model_response_str() for p in seen)
    assert "OUTCOME UNKNOWN" in first and "TimeoutError" in first
    assert "Do not call this tool again" in second
    model, _ = scripted([ARGS])
    with pytest.raises(eg.EffectAmbiguous):
        Agent(model, toolsets=[toolset(refund, gate, on_refusal="raise")]).run_sync("again")
    assert ledger == ["T1"]


def test_a_body_that_did_not_happen_may_be_tried_again(gate: eg.Gate,
                                                       ledger: list[Any]) -> None:
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        ledger.append(txn_id)
        if len(ledger) == 1:
            raise eg.NotExecuted("the card network refused the connection")
        return "refunded"

    model, seen = scripted([ARGS], [ARGS])
    Agent(model, toolsets=[toolset(refund, gate)]).run_sync("refund T1")
    assert "FAILED" in seen[0].model_response_str() and seen[1].content == "refunded"
    assert gate.get("refund:T1").attempt == 2


def test_approval_required_then_approved_runs_once(make_gate: Any, refund: Any,
                                                   ledger: list[Any]) -> None:
    policy = eg.Policy.from_dict({"effects": {"payment.refund": {
        "key": "refund:{txn_id}", "tools": ["refund"], "approval": "always"}}})
    gate = make_gate(policy=policy)
    gated = EffectGateToolset(FunctionToolset([refund]), policy, gate=gate)
    model, seen = scripted([ARGS])
    Agent(model, toolsets=[gated]).run_sync("refund T1")
    [approval] = gate.list_approvals()
    assert ledger == [] and approval.approval_id in seen[0].model_response_str()
    gate.approve(approval.approval_id, by="alice")
    model, seen = scripted([ARGS], [ARGS])
    Agent(model, toolsets=[gated]).run_sync("refund T1")
    assert ledger == [("T1", 500)] and [p.content for p in seen] == ["refunded 500 on T1 (#1)"] * 2


def test_ungated_tools_are_reported_once_or_refused(sqlite_gate: eg.Gate, refund: Any) -> None:
    def pa_send_mail_1(to: str) -> str:
        """Send an email."""
        return "sent"

    tools = FunctionToolset([refund, pa_send_mail_1])
    with pytest.warns(UngatedToolWarning, match="pa_send_mail_1"):
        Agent(TestModel(call_tools=[]), toolsets=[EffectGateToolset(
            tools, {"refund": "refund:{txn_id}"}, gate=sqlite_gate)]).run_sync("hi")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: no second warning
        Agent(TestModel(call_tools=[]), toolsets=[EffectGateToolset(
            tools, {"refund": "refund:{txn_id}"}, gate=sqlite_gate)]).run_sync("hi")
    with pytest.raises(eg.ConfigError, match="pa_send_mail_1"):
        Agent(TestModel(call_tools=[]), toolsets=[EffectGateToolset(
            tools, {"refund": "refund:{txn_id}"}, gate=sqlite_gate, strict=True)]).run_sync("hi")


def test_a_gate_tool_inside_the_toolset_is_not_gated_twice(sqlite_gate: eg.Gate, refund: Any,
                                                           ledger: list[Any]) -> None:
    inner = gate_tool(Tool(refund), "refund:{txn_id}", gate=sqlite_gate)
    outer = EffectGateToolset(FunctionToolset([inner]), {"refund": "other:{txn_id}"},
                              gate=sqlite_gate)
    model, seen = scripted([ARGS])
    Agent(model, toolsets=[outer]).run_sync("refund T1")
    assert ledger == [("T1", 500)] and seen[0].content == "refunded 500 on T1 (#1)"
    assert sqlite_gate.get("refund:T1").state is eg.State.COMMITTED
    with pytest.raises(eg.UnknownEffect):
        sqlite_gate.get("other:T1")


def test_bad_configuration_is_refused_up_front(sqlite_gate: eg.Gate, refund: Any) -> None:
    with pytest.raises(eg.ConfigError):
        EffectGateToolset(FunctionToolset([refund]), {"refund": 42}, gate=sqlite_gate)
    with pytest.raises(eg.ConfigError):
        EffectGateToolset(FunctionToolset([refund]), {"refund": "r:{x}"}, gate=sqlite_gate,
                          on_refusal="shout")  # type: ignore[arg-type]
    with pytest.raises(eg.ConfigError):
        EffectGateToolset("not a toolset", {}, gate=sqlite_gate)  # type: ignore[arg-type]
    with pytest.raises(eg.EffectKeyError):  # the template names no argument of the tool
        Agent(TestModel(call_tools=[]), toolsets=[EffectGateToolset(
            FunctionToolset([refund]), {"refund": "r:{order}"}, gate=sqlite_gate)]).run_sync("x")


_DBOS_RUN = '''
import asyncio, json, os, sys
from dbos import DBOS
from pydantic_ai import Agent
from pydantic_ai.durable_exec.dbos import DBOSAgent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.toolsets import FunctionToolset
import effectgate as eg
from effectgate.integrations.pydantic_ai import EffectGateToolset

store, namespace, system_db = sys.argv[1:4]
ledger = []

def refund(txn_id: str, amount_cents: int) -> str:
    """Refund a card transaction."""
    ledger.append(txn_id)
    return f"refunded {amount_cents} on {txn_id}"

def model(messages, info):
    returns = [p.content for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returns:
        return ModelResponse(parts=[TextPart(json.dumps(returns))])
    return ModelResponse(parts=[ToolCallPart("refund", {"txn_id": "T1", "amount_cents": 500},
                                             tool_call_id=c) for c in ("c1", "c2")])

gate = eg.Gate(store, namespace=namespace)
agent = Agent(FunctionModel(model), name="billing", toolsets=[EffectGateToolset(
    FunctionToolset([refund]), {"refund": "refund:{txn_id}"}, gate=gate)])
DBOS(config={"name": "effectgate-test", "system_database_url": system_db})
durable = DBOSAgent(agent)
DBOS.launch()

async def main():
    first = await durable.run("refund T1")
    second = await durable.run("refund T1 again")
    print(json.dumps({"outputs": [first.output, second.output], "ledger": ledger,
                      "state": gate.get("refund:T1").state.value}))

try:
    asyncio.run(main())
except BaseException:
    DBOS.destroy()
    raise
# Printed, and every write it depends on committed: exit without DBOS.destroy()'s second of
# joining idle threads.
sys.stdout.flush()
os._exit(0)
'''


def test_runs_under_dbos_durable_execution(store_url: str, namespace: str,
                                           tmp_path: Any) -> None:
    """pydantic-ai's DBOS wrapper runs offline (SQLite system database): the gated toolset
    inside a DBOS workflow still executes the refund once, twins included."""
    pytest.importorskip("dbos")
    import json
    import subprocess
    import sys

    script = tmp_path / "dbos_run.py"
    script.write_text(_DBOS_RUN)
    done = subprocess.run(
        [sys.executable, str(script), store_url, namespace,
         f"sqlite:///{tmp_path / 'dbos.sqlite'}"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ledger"] == ["T1"] and result["state"] == "committed"
    assert result["outputs"] == ['["refunded 500 on T1", "refunded 500 on T1"]'] * 2
