"""OpenAI Agents SDK: gated function tools in the real Runner loop, driven offline by the SDK's
ScriptedModel, on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest

pytest.importorskip("agents")

from agents import (
    Agent,
    AgentsException,
    FunctionTool,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallOutputItem
from agents.models.chatcmpl_converter import Converter
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from pydantic import Field

import effectgate as eg
from effectgate.integrations.openai_agents import (
    EffectGateAgentsError,
    EffectGateRunHooks,
    UngatedToolWarning,
    gate_tool,
    gate_tools,
    is_gated,
)
from effectgate.testing import temporary_gate

from .agent_worker import run_two_agents
from .conftest import PG_URL, require_postgres

set_tracing_disabled(True)
ARGS = {"txn_id": "T1", "amount_cents": 500}


def script(*calls: Any) -> ScriptedModel:
    return ScriptedModel([*([c] for c in calls), [assistant_message("All done.")]])


def call(call_id: str, args: dict[str, Any] | None = None, name: str = "refund") -> Any:
    return function_call(name, args or ARGS, call_id=call_id)


def outputs(result: Any) -> list[tuple[str, Any]]:
    out = []
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            raw = item.raw_item
            call_id = raw["call_id"] if isinstance(raw, dict) else raw.call_id
            out.append((call_id, item.output))
    return out


def run(agent: Agent[Any], **kwargs: Any) -> list[tuple[str, Any]]:
    return outputs(Runner.run_sync(agent, "refund T1", **kwargs))


@pytest.fixture
def ledger() -> list[Any]:
    return []


@pytest.fixture
def refund(ledger: list[Any]) -> FunctionTool:
    @function_tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible.

        Args:
            txn_id: The transaction.
            amount_cents: The amount in cents.
        """
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id} (#{len(ledger)})"

    return refund


@pytest.fixture
def lost_reply(ledger: list[Any]) -> FunctionTool:
    @function_tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        raise TimeoutError("the reply was lost")

    return refund


@pytest.fixture
def sqlite_gate() -> Iterator[eg.Gate]:
    with temporary_gate() as gate:
        yield gate


def test_gated_tool_definition_is_byte_identical(sqlite_gate: eg.Gate,
                                                 refund: FunctionTool) -> None:
    @function_tool(strict_mode=False)
    def loose(txn_id: str, amount_cents: int = 0) -> str:
        """Not strict, with a default."""
        return "ok"

    @function_tool
    async def async_refund(txn_id: str) -> str:
        """Async."""
        return "ok"

    for original in (refund, loose, async_refund):
        gated = gate_tool(original, "r:{txn_id}", gate=sqlite_gate)
        assert isinstance(gated, FunctionTool) and is_gated(gated)
        assert json.dumps(Converter.tool_to_openai(gated)) == json.dumps(
            Converter.tool_to_openai(original))
        assert (gated.name, gated.description, gated.params_json_schema,
                gated.strict_json_schema) == (original.name, original.description,
                                              original.params_json_schema,
                                              original.strict_json_schema)


def test_same_refund_twice_runs_once_and_second_result_is_the_stored_one(
        gate: eg.Gate, refund: FunctionTool, ledger: list[Any]) -> None:
    model = script(call("call_1"), call("call_2", {"txn_id": "T1", "amount_cents": "500"}))
    agent = Agent(name="billing", model=model,
                  tools=[gate_tool(refund, "refund:{txn_id}", gate=gate)])
    results = run(agent, run_config=RunConfig(group_id="conversation-9"))
    assert ledger == [("T1", 500)]
    assert results == [("call_1", "refunded 500 on T1 (#1)"),
                       ("call_2", "refunded 500 on T1 (#1)")]
    record = gate.get("refund:T1")
    assert (record.run_id, record.agent_id) == ("conversation-9", "billing")


def test_async_tool_runs_once(gate: eg.Gate, ledger: list[Any]) -> None:
    @function_tool
    async def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        await asyncio.sleep(0)
        ledger.append(txn_id)
        return f"refunded {txn_id}"

    agent = Agent(name="billing", model=script(call("call_1"), call("call_2")),
                  tools=[gate_tool(refund, "refund:{txn_id}", gate=gate)])
    result = asyncio.run(Runner.run(agent, "refund T1"))
    assert ledger == ["T1"]
    assert [o for _, o in outputs(result)] == ["refunded T1", "refunded T1"]


def test_lost_reply_is_ambiguous_and_model_is_told_not_to_retry(
        gate: eg.Gate, lost_reply: FunctionTool, ledger: list[Any]) -> None:
    agent = Agent(name="billing", model=script(call("call_1"), call("call_2")),
                  tools=[gate_tool(lost_reply, "refund:{txn_id}", gate=gate)])
    (_, first), (_, second) = run(agent)
    assert ledger == [("T1", 500)]
    assert "OUTCOME UNKNOWN" in first and "TimeoutError" in first
    assert "Please try again" not in first  # not the SDK's default failure message
    assert "Do not call this tool again" in second
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


def test_raise_mode_ambiguous_stops_the_run_unwrapped(
        gate: eg.Gate, lost_reply: FunctionTool, ledger: list[Any]) -> None:
    gated = gate_tool(lost_reply, "refund:{txn_id}", gate=gate, on_refusal="raise")
    model = script(call("call_1"), call("call_2"))
    with pytest.raises(eg.EffectAmbiguous) as err:
        run(Agent(name="billing", model=model, tools=[gated]))
    assert isinstance(err.value, EffectGateAgentsError) and isinstance(err.value, AgentsException)
    assert isinstance(err.value.__cause__, TimeoutError)
    assert len(model.calls) == 1  # the run stopped at the first tool call
    with pytest.raises(eg.EffectAmbiguous) as again:
        run(Agent(name="billing", model=script(call("call_3")), tools=[gated]))
    assert again.value.decision == "blocked" and again.value.key == "refund:T1"
    assert ledger == [("T1", 500)]


def test_in_flight_tells_the_model_to_wait(gate: eg.Gate, refund: FunctionTool,
                                          ledger: list[Any]) -> None:
    gate.begin(effect_type="refund", key="refund:T1", payload=ARGS, lease_seconds=30)
    agent = Agent(name="billing", model=script(call("call_1")),
                  tools=[gate_tool(refund, "refund:{txn_id}", gate=gate)])
    [(_, answer)] = run(agent)
    assert ledger == [] and "NOT DONE YET" in answer


def test_invoke_outside_a_run(gate: eg.Gate, refund: FunctionTool, ledger: list[Any]) -> None:
    gated = gate_tool(refund, "refund:{txn_id}", gate=gate)

    async def invoke(args: dict[str, Any]) -> Any:
        text = json.dumps(args)
        ctx = ToolContext(context=None, tool_name="refund", tool_call_id="c", tool_arguments=text)
        return await gated.on_invoke_tool(ctx, text)

    assert asyncio.run(invoke(ARGS)) == "refunded 500 on T1 (#1)"
    assert asyncio.run(invoke({"txn_id": "T1", "amount_cents": "500"})) == \
        "refunded 500 on T1 (#1)"
    assert "CONFLICT" in asyncio.run(invoke({"txn_id": "T1", "amount_cents": 501}))
    asyncio.run(invoke({"txn_id": "T1", "amount_cents": "not a number"}))  # invalid: no run
    assert ledger == [("T1", 500)]


def test_approval_required_refund_is_approved_then_runs_once(
        make_gate: Any, refund: FunctionTool, ledger: list[Any]) -> None:
    policy = eg.Policy.from_dict({"effects": {"payment.refund": {
        "key": "refund:{txn_id}", "tools": ["refund"], "approval": "always"}}})
    gate = make_gate(policy=policy)
    [gated] = gate_tools([refund], policy, gate=gate, pause=False)  # text, not the SDK pause
    [(_, waiting)] = run(Agent(name="billing", model=script(call("call_1")), tools=[gated]))
    [approval] = gate.list_approvals()
    assert ledger == [] and approval.approval_id in waiting
    gate.approve(approval.approval_id, by="alice")
    results = run(Agent(name="billing", model=script(call("call_2"), call("call_3")),
                        tools=[gated]))
    assert ledger == [("T1", 500)]
    assert [o for _, o in results] == ["refunded 500 on T1 (#1)"] * 2


def test_gate_tools_reports_ungated_once_and_hooks_refuse_them(
        sqlite_gate: eg.Gate, refund: FunctionTool) -> None:
    @function_tool
    def oa_send_mail_1(to: str) -> str:
        """Send an email."""
        return "sent"

    with pytest.warns(UngatedToolWarning, match="oa_send_mail_1"):
        tools = gate_tools([refund, oa_send_mail_1], {"refund": "refund:{txn_id}"},
                           gate=sqlite_gate)
    assert [is_gated(t) for t in tools] == [True, False]
    with pytest.raises(eg.ConfigError, match="oa_send_mail_1"):
        gate_tools([refund, oa_send_mail_1], {"refund": "refund:{txn_id}"}, gate=sqlite_gate,
                   strict=True)
    model = script(call("call_1"))
    agent = Agent(name="billing", model=model, tools=tools)
    with pytest.raises(EffectGateAgentsError, match="oa_send_mail_1") as err:
        run(agent, hooks=EffectGateRunHooks(strict=True))
    assert isinstance(err.value, eg.ConfigError)
    assert len(model.calls) == 0  # stopped before the first model call, so before any tool
    run(Agent(name="billing", model=script(), tools=tools),
        hooks=EffectGateRunHooks(strict=True, read_only=["oa_send_mail_1"]))


def test_strict_hooks_see_the_tools_of_an_agents_mcp_servers() -> None:
    """The SDK turns an agent's MCP servers' tools into function tools as it runs: strict
    hooks check those too, before any tool is called (an ungated MCP write ran, unreported)."""
    from agents.mcp import MCPServer
    from mcp.types import CallToolResult, GetPromptResult, ListPromptsResult, TextContent
    from mcp.types import Tool as MCPTool

    refunds: list[Any] = []

    class Payments(MCPServer):  # type: ignore[misc]
        """An offline MCP server with one write tool."""

        async def connect(self) -> None:
            return None

        @property
        def name(self) -> str:
            return "payments"

        async def cleanup(self) -> None:
            return None

        async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[MCPTool]:
            return [MCPTool(name="mcp_refund", description="Refund. Irreversible.",
                            inputSchema={"type": "object",
                                         "properties": {"txn_id": {"type": "string"}}})]

        async def call_tool(self, tool_name: str, arguments: Any,
                            meta: Any = None) -> CallToolResult:
            refunds.append(arguments)
            return CallToolResult(content=[TextContent(type="text", text="refunded")])

        async def list_prompts(self) -> ListPromptsResult:
            return ListPromptsResult(prompts=[])

        async def get_prompt(self, name: str, arguments: Any = None) -> GetPromptResult:
            raise NotImplementedError

    model = script(call("call_1", {"txn_id": "T1"}, name="mcp_refund"))
    agent = Agent(name="billing", model=model, mcp_servers=[Payments()])
    with pytest.raises(EffectGateAgentsError, match="mcp_refund"):
        run(agent, hooks=EffectGateRunHooks(strict=True))
    assert refunds == [] and len(model.calls) == 0


def test_strict_hooks_see_a_tool_disabled_when_the_agent_starts() -> None:
    """A tool whose ``is_enabled`` turns on later is checked too (the SDK lists it each turn;
    the hooks run once, as the agent starts)."""
    enabled = [False]

    @function_tool(is_enabled=lambda ctx, agent: enabled[0])
    def oa_late_refund(txn_id: str) -> str:
        """Refund a card transaction. Irreversible."""
        return "refunded"

    model = script(call("call_1", {"txn_id": "T1"}, name="oa_late_refund"))
    with pytest.raises(EffectGateAgentsError, match="oa_late_refund"):
        run(Agent(name="billing", model=model, tools=[oa_late_refund]),
            hooks=EffectGateRunHooks(strict=True))
    assert len(model.calls) == 0


@pytest.mark.slow
def test_two_agents_in_two_processes_execute_the_refund_once(
        tmp_path: Path, namespace: str) -> None:
    require_postgres()
    lines, results = run_two_agents("openai_agents", PG_URL, namespace, tmp_path)
    assert len(lines) == 1
    winner = f"refunded 500 on T1 by {lines[0]}"
    for outs in results:
        assert len(outs) == 2
        assert all(o == winner or "NOT DONE YET" in o for o in outs)
    assert any(winner in outs for outs in results)


def _chain(error: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def test_invalid_arguments_raised_carry_no_validation_error(
        sqlite_gate: eg.Gate, monkeypatch: pytest.MonkeyPatch, ledger: list[Any]) -> None:
    """With failure_error_function=None the SDK raises for invalid arguments; what the gated
    tool raises must not chain the pydantic error (it holds the arguments, which
    DONT_LOG_TOOL_DATA keeps out of logs)."""
    from agents import _debug
    from pydantic import ValidationError

    @function_tool(failure_error_function=None)
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund."""
        ledger.append(txn_id)
        return "refunded"

    monkeypatch.setattr(_debug, "DONT_LOG_TOOL_DATA", True)
    gated = gate_tool(refund, "refund:{txn_id}", gate=sqlite_gate)
    text = json.dumps({"txn_id": "T1", "amount_cents": "secret-4111"})
    ctx = ToolContext(context=None, tool_name="refund", tool_call_id="c", tool_arguments=text)
    with pytest.raises(AgentsException) as err:
        asyncio.run(gated.on_invoke_tool(ctx, text))
    chain = _chain(err.value)
    assert not any(isinstance(e, ValidationError) for e in chain)
    assert not any("secret-4111" in str(e) for e in chain)
    assert ledger == []


def test_the_wrapped_function_stays_reachable(sqlite_gate: eg.Gate,
                                              refund: FunctionTool) -> None:
    gated = gate_tool(refund, "refund:{txn_id}", gate=sqlite_gate)
    assert gated.__wrapped__ is refund.__wrapped__
    assert gated.__wrapped__("T9", 1).startswith("refunded 1 on T9")


def test_failure_error_function_answers_what_did_not_happen(
        sqlite_gate: eg.Gate, ledger: list[Any]) -> None:
    def custom(ctx: Any, error: Exception) -> str:
        return f"custom: {type(error).__name__}"

    @function_tool(failure_error_function=custom)
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund."""
        ledger.append(txn_id)
        if txn_id == "T1":
            raise eg.NotExecuted("the card network refused the connection")
        raise TimeoutError("the reply was lost")

    agent = Agent(name="billing", model=script(call("call_1"), call("call_2", {
        "txn_id": "T2", "amount_cents": 5})),
        tools=[gate_tool(refund, "refund:{txn_id}", gate=sqlite_gate)])
    (_, failed), (_, lost) = run(agent)
    assert failed == "custom: NotExecuted"  # nothing happened: the tool's own words
    assert "OUTCOME UNKNOWN" in lost and "custom" not in lost  # overridden: it may have
    assert sqlite_gate.get("refund:T1").state is eg.State.FAILED


def test_failure_error_function_none_raises_what_it_would_raise(
        sqlite_gate: eg.Gate, ledger: list[Any]) -> None:
    @function_tool(failure_error_function=None)
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund."""
        ledger.append(txn_id)
        if txn_id == "T1":
            raise eg.NotExecuted("refused before sending")
        raise TimeoutError("the reply was lost")

    gated = gate_tool(refund, "refund:{txn_id}", gate=sqlite_gate)

    async def invoke(txn_id: str) -> Any:
        text = json.dumps({"txn_id": txn_id, "amount_cents": 5})
        ctx = ToolContext(context=None, tool_name="refund", tool_call_id="c",
                          tool_arguments=text)
        return await gated.on_invoke_tool(ctx, text)

    with pytest.raises(eg.NotExecuted):
        asyncio.run(invoke("T1"))
    with pytest.raises(eg.EffectAmbiguous) as err:
        asyncio.run(invoke("T2"))
    assert isinstance(err.value, EffectGateAgentsError)
    assert ledger == ["T1", "T2"]


def test_a_parameter_with_an_alias_is_keyed_by_its_name_and_gated_once(
        gate: eg.Gate) -> None:
    # (the template's names were checked against the JSON schema's, which are the aliases,
    # while a call's arguments are keyed by the model's fields: no template could name it)
    ledger: list[Any] = []

    @function_tool
    def refund(txn_id: Annotated[str, Field(alias="txnId")], amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    with pytest.raises(eg.EffectKeyError, match="names txnId"):
        gate_tool(refund, "refund:{txnId}", gate=gate)
    gated = gate_tool(refund, "refund:{txn_id}", gate=gate)
    args = {"txnId": "T1", "amount_cents": 500}
    answers = [run(Agent(name="billing", model=script(call(f"c{n}", args)), tools=[gated]),
                   run_config=RunConfig(group_id=f"run-{n}")) for n in range(3)]
    assert [a for found in answers for _, a in found] == ["refunded 500 on T1"] * 3
    assert ledger == [("T1", 500)]
    assert gate.get("refund:T1").state is eg.State.COMMITTED
