"""Red-team findings in the OpenAI Agents SDK and CrewAI adapters, each driven through the real
agent loop offline (the SDK's ``ScriptedModel``; CrewAI's crew with a scripted ``BaseLLM``), on
SQLite and Postgres.

OpenAI Agents:

* a tool made from a callable instance (``function_tool(obj)``, an instance with a plain
  ``__call__``) was keyed on its JSON as sent, while the SDK validated it for the body:
  ``" T1"`` and ``"T1"`` were two effects and one transaction was refunded twice;
* ``EffectGateRunHooks(strict=True)`` never saw the tools of an agent used as a tool (its
  nested run gets other hooks) nor a tool that runs here without being a function tool (a
  ``CustomTool``): both ran ungated in a strict run;
* :func:`approve` took the first gated tool of the interruption's name: with two tools of one
  name in two namespaces it decided the other tool's effect (refused, and nothing approved);
* a body error recorded FAILED was answered by the tool's failure function without the run's
  ``tool_error_formatter``, unlike the ungated tool.

CrewAI:

* an async tool in a crew kicked off inside a running event loop: ``asyncio.run`` refused to
  start it, and the effect was recorded AMBIGUOUS (and the model told the outcome is unknown)
  although nothing ran;
* with a schema that allows extra fields, CrewAI's ``security_context`` (new fingerprints in
  every crew) was hashed with the arguments: the repeat in the next crew was a conflict.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import pytest

pytest.importorskip("agents")
pytest.importorskip("crewai")

from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool import CustomTool, tool_namespace
from openai.types.responses import ResponseCustomToolCall
from pydantic import BaseModel, ConfigDict, StringConstraints

import effectgate as eg
from effectgate.integrations import crewai as eg_crew
from effectgate.integrations import openai_agents as eg_oa

from .adapter_drivers import crew_run

set_tracing_disabled(True)


def outputs(result: Any) -> dict[str, Any]:
    """{call_id: output} of a run's tool results."""
    out: dict[str, Any] = {}
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            raw = item.raw_item
            out[raw["call_id"] if isinstance(raw, dict) else raw.call_id] = item.output
    return out


def script(*calls: Any) -> ScriptedModel:
    return ScriptedModel([*([c] for c in calls), [assistant_message("All done.")]])


# -- OpenAI Agents: a callable instance is keyed on what its body receives ----------------------

Txn = Annotated[str, StringConstraints(strip_whitespace=True)]


class Refunder:
    """A tool made from a callable instance."""

    def __init__(self) -> None:
        self.ledger: list[tuple[str, int]] = []

    def __call__(self, txn_id: Txn, amount_cents: int) -> str:
        """Refund a card transaction."""
        self.ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"


class AsyncRefunder(Refunder):
    async def __call__(self, txn_id: Txn, amount_cents: int) -> str:  # type: ignore[override]
        """Refund a card transaction."""
        self.ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"


@pytest.mark.parametrize("kind", [Refunder, AsyncRefunder])
def test_a_callable_instance_tool_is_keyed_on_the_arguments_its_body_receives(
        gate: eg.Gate, kind: type[Refunder]) -> None:
    refunder = kind()
    tool = eg_oa.gate_tool(function_tool(refunder, name_override="refund", strict_mode=False),
                           "refund:{txn_id}", gate=gate)
    agent = Agent(name="billing", tools=[tool], model=script(
        function_call("refund", {"txn_id": "T1", "amount_cents": 500}, call_id="a"),
        function_call("refund", {"txn_id": " T1", "amount_cents": 500}, call_id="b"),
        function_call("refund", {"txn_id": "T1", "amount_cents": "500"}, call_id="c")))
    seen = outputs(Runner.run_sync(agent, "refund T1"))
    assert refunder.ledger == [("T1", 500)]  # once: " T1" is T1, "500" is 500
    assert set(seen.values()) == {"refunded 500 on T1"}, seen
    assert gate.get("refund:T1").state is eg.State.COMMITTED


# -- OpenAI Agents: strict hooks see every tool that runs here ----------------------------------


def _refund_tool(ledger: list[str]) -> Any:
    @function_tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        ledger.append(txn_id)
        return f"refunded {amount_cents} on {txn_id}"

    return refund


def test_strict_hooks_see_the_tools_of_an_agent_used_as_a_tool(gate: eg.Gate) -> None:
    ledger: list[str] = []
    call = function_call("refund", {"txn_id": "T1", "amount_cents": 5}, call_id="i1")
    outer_call = function_call("billing", {"input": "refund T1"}, call_id="o1")
    # Ungated inside: the nested run never meets the hooks; they stop the run at its start.
    inner = Agent(name="inner", model=script(call), tools=[_refund_tool(ledger)])
    outer = Agent(name="outer", model=script(outer_call),
                  tools=[inner.as_tool(tool_name="billing", tool_description="Billing.")])
    with pytest.raises(eg_oa.EffectGateAgentsError, match="ungated: refund"):
        Runner.run_sync(outer, "go", hooks=eg_oa.EffectGateRunHooks(strict=True,
                                                                    read_only=["billing"]))
    assert ledger == []
    # Gated inside: the agent tool itself is no effect, and the run goes on.
    inner = Agent(name="inner", model=script(call), tools=[
        eg_oa.gate_tool(_refund_tool(ledger), "refund:{txn_id}", gate=gate)])
    outer = Agent(name="outer", model=script(outer_call),
                  tools=[inner.as_tool(tool_name="billing", tool_description="Billing.")])
    result = Runner.run_sync(outer, "go", hooks=eg_oa.EffectGateRunHooks(strict=True))
    assert result.final_output == "All done." and ledger == ["T1"]


def test_strict_hooks_and_gate_tools_refuse_a_custom_tool_that_runs_here(gate: eg.Gate) -> None:
    ledger: list[str] = []

    async def wire(ctx: Any, raw: str) -> str:
        ledger.append(raw)
        return f"wired {raw}"

    tool = CustomTool(name="wire", description="Wire money: 'ACCOUNT AMOUNT'.",
                      on_invoke_tool=wire)

    def agent() -> Agent[Any]:
        return Agent(name="x", tools=[tool], model=script(ResponseCustomToolCall(
            type="custom_tool_call", call_id="c1", name="wire", input="ACC1 500")))

    with pytest.raises(eg_oa.EffectGateAgentsError, match="ungated: wire"):
        Runner.run_sync(agent(), "go", hooks=eg_oa.EffectGateRunHooks(strict=True))
    with pytest.raises(eg.ConfigError, match="ungated: wire"):
        eg_oa.gate_tools([tool], {}, gate=gate, strict=True)
    assert ledger == []
    # Declared read-only, it is accepted.
    assert eg_oa.gate_tools([tool], {}, gate=gate, strict=True, read_only=["wire"]) == [tool]
    Runner.run_sync(agent(), "go", hooks=eg_oa.EffectGateRunHooks(strict=True,
                                                                read_only=["wire"]))
    assert ledger == ["ACC1 500"]


# -- OpenAI Agents: an interruption is decided for its own tool ---------------------------------


def test_approving_a_namespaced_tools_interruption_decides_that_tools_effect(
        make_gate: Any) -> None:
    gate = make_gate(policy={"effects": {
        "stripe.refund": {"approval": {"at_or_above_micros": 1}},
        "paypal.refund": {"approval": {"at_or_above_micros": 1}}}})
    ledger: list[str] = []

    @function_tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund on Stripe."""
        ledger.append(f"stripe {txn_id}")
        return f"stripe refunded {txn_id}"

    @function_tool(name_override="refund")
    def paypal_refund(txn_id: str, amount_cents: int) -> str:
        """Refund on PayPal."""
        ledger.append(f"paypal {txn_id}")
        return f"paypal refunded {txn_id}"

    [stripe] = tool_namespace(name="stripe", description="Stripe", tools=[refund])
    [paypal] = tool_namespace(name="paypal", description="PayPal", tools=[paypal_refund])

    def cost(amount_cents: int) -> int:
        return amount_cents * 10_000

    tools = [eg_oa.gate_tool(stripe, "refund:{txn_id}", gate=gate, effect_type="stripe.refund",
                             cost_micros=cost),
             eg_oa.gate_tool(paypal, "refund:{txn_id}", gate=gate, effect_type="paypal.refund",
                             cost_micros=cost)]
    agent = Agent(name="billing", tools=tools, model=script(function_call(
        "refund", {"txn_id": "T1", "amount_cents": 5}, call_id="p", namespace="paypal")))

    async def go() -> Any:
        paused = await Runner.run(agent, "refund T1 on PayPal")
        state = paused.to_state()
        [item] = state.get_interruptions()
        eg_oa.approve(state, item, by="alice")
        return await Runner.run(agent, state)

    result = asyncio.run(go())
    assert outputs(result) == {"p": "paypal refunded T1"} and ledger == ["paypal T1"]
    [approval] = gate.list_approvals(state=None)
    assert approval.effect_type == "paypal.refund" and approval.decided_by == "alice"


# -- OpenAI Agents: a FAILED body is answered as it would be ungated ----------------------------


def test_a_failed_body_is_answered_through_the_runs_tool_error_formatter(gate: eg.Gate) -> None:
    def formatter(args: Any) -> str:
        return f"FORMATTED[{args.kind}]: {args.default_message}"

    def tool() -> Any:
        @function_tool
        def refund(txn_id: str, amount_cents: int) -> str:
            """Refund a card transaction."""
            raise eg.NotExecuted("the card network refused the connection")

        return refund

    def run(one: Any) -> dict[str, Any]:
        agent = Agent(name="billing", tools=[one], model=script(
            function_call("refund", {"txn_id": "T1", "amount_cents": 5}, call_id="a")))
        return outputs(Runner.run_sync(agent, "go", run_config=RunConfig(
            tool_error_formatter=formatter)))

    ungated = run(tool())
    gated = run(eg_oa.gate_tool(tool(), "refund:{txn_id}", gate=gate))
    assert gated == ungated and gated["a"].startswith("FORMATTED[tool_exception]"), gated
    assert gate.get("refund:T1").state is eg.State.FAILED


# -- CrewAI: an async tool inside a running event loop ------------------------------------------


class RefundArgs(BaseModel):
    txn_id: str
    amount_cents: int


class OpenRefundArgs(RefundArgs):
    model_config = ConfigDict(extra="allow")


def _async_refund(ledger: list[Any]) -> Any:
    from crewai.tools import BaseTool

    class Refund(BaseTool):
        name: str = "refund"
        description: str = "Refund a card transaction."
        args_schema: type[BaseModel] = RefundArgs

        async def _run(self, txn_id: str, amount_cents: int) -> str:
            await asyncio.sleep(0)
            ledger.append((txn_id, eg.current_effect() is not None))
            return f"refunded {amount_cents} on {txn_id}"

    return Refund()


def test_an_async_crewai_tool_in_a_running_event_loop_runs_once_and_commits(
        gate: eg.Gate) -> None:
    ledger: list[Any] = []
    tool = eg_crew.gate_tool(_async_refund(ledger), "refund:{txn_id}", gate=gate)
    call = ("c1", "refund", {"txn_id": "T1", "amount_cents": 500})

    async def inside_a_loop() -> dict[str, str]:  # as an async Flow step kicks off a crew
        return crew_run([tool], [call])

    seen = asyncio.run(inside_a_loop())
    assert seen["c1"] == "refunded 500 on T1", seen
    assert ledger == [("T1", True)]  # it ran, inside its effect
    assert gate.get("refund:T1").state is eg.State.COMMITTED
    # Outside a loop, the repeat is answered from the store.
    assert crew_run([tool], [("c2", *call[1:])])["c2"] == "refunded 500 on T1"
    assert len(ledger) == 1


# -- CrewAI: its security_context is not part of the effect -------------------------------------


def test_crewais_security_context_is_passed_on_but_not_keyed(gate: eg.Gate) -> None:
    from crewai.tools import BaseTool

    ledger: list[Any] = []

    class Refund(BaseTool):
        name: str = "refund"
        description: str = "Refund a card transaction."
        args_schema: type[BaseModel] = OpenRefundArgs

        def _run(self, txn_id: str, amount_cents: int, **extra: Any) -> str:
            time.sleep(0)
            ledger.append((txn_id, sorted(extra)))
            return f"refunded {amount_cents} on {txn_id}"

    tool = eg_crew.gate_tool(Refund(), "refund:{txn_id}", gate=gate)
    call = {"txn_id": "T1", "amount_cents": 500}
    first = crew_run([tool], [("c1", "refund", call)])
    second = crew_run([tool], [("c2", "refund", call)])  # a new crew: new fingerprints
    assert first["c1"] == second["c2"] == "refunded 500 on T1", (first, second)
    assert ledger == [("T1", ["security_context"])]  # the tool got it, as ungated
    assert gate.get("refund:T1").payload_hash == eg.payload_hash(call)


# -- review: a callable instance whose annotations name the class's own aliases -----------------


class ScopedRefunder:
    """A callable instance whose ``__call__`` names an alias of its own class (the SDK
    resolves it in the class; read without it, the tool was keyed on its JSON as sent)."""

    TxnId = Annotated[str, StringConstraints(strip_whitespace=True)]

    def __init__(self) -> None:
        self.ledger: list[tuple[str, int]] = []

    def __call__(self, txn_id: TxnId, amount_cents: int) -> str:
        """Refund a card transaction."""
        self.ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"


def test_a_callable_instance_naming_a_class_alias_is_keyed_as_its_body_receives(
        gate: eg.Gate) -> None:
    refunder = ScopedRefunder()
    tool = eg_oa.gate_tool(function_tool(refunder, name_override="refund", strict_mode=False),
                           "refund:{txn_id}", gate=gate)
    agent = Agent(name="billing", tools=[tool], model=script(
        function_call("refund", {"txn_id": "T1", "amount_cents": 500}, call_id="a"),
        function_call("refund", {"txn_id": " T1", "amount_cents": 500}, call_id="b")))
    seen = outputs(Runner.run_sync(agent, "refund T1"))
    assert refunder.ledger == [("T1", 500)], refunder.ledger  # once: " T1" is T1
    assert set(seen.values()) == {"refunded 500 on T1"}, seen


# -- review: an interruption of another namespace is not a gated tool's -------------------------


def test_approving_an_ungated_namespaced_tool_never_approves_a_gated_one_of_its_name(
        make_gate: Any) -> None:
    gate = make_gate(policy={"effects": {"paypal.refund": {"approval": {"at_or_above_micros": 1}}}})
    ledger: list[str] = []

    @function_tool(name_override="refund", needs_approval=True)
    def crm_refund(txn_id: str, amount_cents: int) -> str:
        """Note a refund in the CRM."""
        ledger.append(f"crm {txn_id}")
        return "noted"

    @function_tool(name_override="refund")
    def paypal_refund(txn_id: str, amount_cents: int) -> str:
        """Refund on PayPal."""
        ledger.append(f"paypal {txn_id}")
        return f"paypal refunded {txn_id}"

    [crm] = tool_namespace(name="crm", description="CRM", tools=[crm_refund])
    [paypal] = tool_namespace(name="paypal", description="PayPal", tools=[paypal_refund])
    gated = eg_oa.gate_tool(paypal, "refund:{txn_id}", gate=gate, effect_type="paypal.refund",
                            cost_micros=lambda amount_cents: amount_cents * 10_000)
    call = {"txn_id": "T1", "amount_cents": 5}
    agent = Agent(name="billing", tools=[crm, gated], model=script(
        function_call("refund", call, call_id="c", namespace="crm")))

    async def go() -> Any:
        # A PayPal refund of T1 waits for its approval...
        waiting = await Runner.run(Agent(name="billing", tools=[crm, gated], model=script(
            function_call("refund", call, call_id="p", namespace="paypal"))), "refund T1")
        assert len(waiting.interruptions) == 1
        # ...when the CRM's own refund tool (ungated: the SDK asks) is called with T1 too.
        paused = await Runner.run(agent, "note the refund of T1")
        state = paused.to_state()
        [item] = state.get_interruptions()
        assert item.tool_namespace == "crm"
        with pytest.raises(eg.ConfigError, match=r"crm\.refund"):
            eg_oa.approve(state, item, by="alice")  # not the PayPal refund's to decide

    asyncio.run(go())
    assert [a.state for a in gate.list_approvals(state=None)] == [eg.ApprovalState.PENDING]
    assert ledger == []
