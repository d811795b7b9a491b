"""LangChain: gated tools and EffectGateMiddleware in the real create_agent loop, driven
offline by a scripted chat model, on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, StructuredTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field, field_validator

import effectgate as eg
from effectgate.integrations import langchain as eg_lc
from effectgate.integrations.langchain import (
    GatedTool,
    UngatedToolWarning,
    gate_tool,
    gate_tools,
)
from effectgate.testing import temporary_gate

from .agent_worker import run_two_agents
from .conftest import PG_URL, require_postgres, snapshot

ARGS = {"txn_id": "T1", "amount_cents": 500}


class ScriptedModel(FakeMessagesListChatModel):
    """Answers with the scripted messages in turn; records the tool definitions it was given."""

    seen_tools: list[Any] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        definitions = [convert_to_openai_tool(t) for t in tools]
        self.seen_tools.append(definitions)
        return self.bind(tools=definitions)


def call(call_id: str, args: dict[str, Any] | None = None, name: str = "refund") -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args or ARGS, "id": call_id,
                                      "type": "tool_call"}])


def script(*calls: AIMessage) -> ScriptedModel:
    return ScriptedModel(responses=[*calls, AIMessage("All done.")])


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def run(agent: Any, thread: str = "thread-1") -> list[ToolMessage]:
    result = agent.invoke({"messages": [{"role": "user", "content": "refund T1"}]},
                          config={"configurable": {"thread_id": thread}})
    return tool_messages(result)


@pytest.fixture
def ledger() -> list[Any]:
    return []


@pytest.fixture
def refund(ledger: list[Any]) -> Any:
    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id} (#{len(ledger)})"

    return refund


@pytest.fixture
def lost_reply(ledger: list[Any]) -> Any:
    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        raise TimeoutError("the reply was lost")

    return refund


@pytest.fixture
def sqlite_gate() -> Iterator[eg.Gate]:
    with temporary_gate() as gate:
        yield gate


def gated_agent(form: str, tool_: Any, gate: eg.Gate, model: ScriptedModel,
                **options: Any) -> Any:
    if form == "tool":
        tools = [gate_tool(tool_, "refund:{txn_id}", gate=gate, **options)]
        return create_agent(model, tools=tools, name="billing")
    middleware = eg_lc.EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate, **options)
    return create_agent(model, tools=[tool_], middleware=[middleware], name="billing")


# -- the tool definition -------------------------------------------------------------------


class Order(BaseModel):
    id: str = Field(description="order id")
    lines: list[int] = Field(default_factory=list)


def test_gated_tool_definition_is_byte_identical(sqlite_gate: eg.Gate) -> None:
    @tool
    def sync_tool(txn_id: str, amount_cents: int = 0, note: str | None = None) -> str:
        """Refund, with defaults.

        Args:
            txn_id: the transaction.
        """
        return "ok"

    @tool
    async def async_tool(order: Order, flag: bool = False) -> str:
        """Async, nested model."""
        return "ok"

    @tool(response_format="content_and_artifact")
    def artifact_tool(txn_id: str) -> tuple[str, dict[str, Any]]:
        """Content and artifact."""
        return "ok", {}

    @tool
    def injected(txn_id: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """With an injected call id."""
        return tool_call_id

    for original, key in ((sync_tool, "r:{txn_id}"), (async_tool, "o:{order.id}"),
                          (artifact_tool, "a:{txn_id}"), (injected, "i:{txn_id}")):
        gated = gate_tool(original, key, gate=sqlite_gate)
        assert isinstance(gated, GatedTool)
        assert json.dumps(convert_to_openai_tool(gated)) == json.dumps(
            convert_to_openai_tool(original))
        assert gated.tool_call_schema.model_json_schema() == \
            original.tool_call_schema.model_json_schema()  # type: ignore[union-attr]
        assert (gated.name, gated.description, gated.args_schema, gated.response_format) == (
            original.name, original.description, original.args_schema,
            original.response_format)


def test_key_template_naming_a_missing_argument_fails_at_wrap_time(
        sqlite_gate: eg.Gate, refund: Any) -> None:
    with pytest.raises(eg.EffectKeyError, match="txn"):
        gate_tool(refund, "refund:{txn}", gate=sqlite_gate)


# -- the agent loop ------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_same_refund_twice_runs_once_and_second_result_is_the_stored_one(
        gate: eg.Gate, refund: Any, ledger: list[Any], form: str) -> None:
    model = script(call("call_1"), call("call_2", {"txn_id": "T1", "amount_cents": "500"}))
    messages = run(gated_agent(form, refund, gate, model))
    assert ledger == [("T1", 500)]
    first, second = messages
    assert (first.tool_call_id, second.tool_call_id) == ("call_1", "call_2")
    assert first.content == second.content == "refunded 500 on T1 (#1)"
    assert first.status == second.status == "success"
    assert model.seen_tools[0] == [convert_to_openai_tool(refund)]
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED
    assert (record.run_id, record.agent_id) == ("thread-1", "billing")


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_async_tool_in_async_agent_runs_once(gate: eg.Gate, ledger: list[Any],
                                             form: str) -> None:
    @tool
    async def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        await asyncio.sleep(0)
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    agent = gated_agent(form, refund, gate, script(call("call_1"), call("call_2")))
    result = asyncio.run(agent.ainvoke({"messages": [{"role": "user", "content": "refund"}]}))
    first, second = tool_messages(result)
    assert ledger == [("T1", 500)]
    assert first.content == second.content == "refunded 500 on T1"


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_lost_reply_is_ambiguous_and_model_is_told_not_to_retry(
        gate: eg.Gate, lost_reply: Any, ledger: list[Any], form: str) -> None:
    messages = run(gated_agent(form, lost_reply, gate, script(call("call_1"), call("call_2"))))
    assert ledger == [("T1", 500)]  # the body never ran again
    first, second = messages
    assert first.status == second.status == "error"
    assert "OUTCOME UNKNOWN" in str(first.content) and "TimeoutError" in str(first.content)
    assert "Do not call this tool again" in str(second.content)
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_raise_mode_ambiguous_stops_the_run(gate: eg.Gate, lost_reply: Any,
                                            ledger: list[Any], form: str) -> None:
    model = script(call("call_1"), call("call_2"))
    agent = gated_agent(form, lost_reply, gate, model, on_refusal="raise")
    with pytest.raises(eg.EffectAmbiguous) as err:
        run(agent)
    assert isinstance(err.value.__cause__, TimeoutError)
    # A second run is refused before the body: blocked, not retried.
    with pytest.raises(eg.EffectAmbiguous) as again:
        run(gated_agent(form, lost_reply, gate, script(call("call_3")), on_refusal="raise"))
    assert again.value.decision == "blocked"
    assert ledger == [("T1", 500)]


def test_in_flight_tells_the_model_to_wait(gate: eg.Gate, refund: Any,
                                          ledger: list[Any]) -> None:
    holder = gate.begin(effect_type="refund", key="refund:T1", payload=ARGS, lease_seconds=30)
    messages = run(gated_agent("tool", refund, gate, script(call("call_1"))))
    assert ledger == []
    assert messages[0].status == "error" and "NOT DONE YET" in str(messages[0].content)
    gate.report(holder, "committed", result="refunded by the other worker")
    assert gate_tool(refund, "refund:{txn_id}", gate=gate).invoke(ARGS) == \
        "refunded by the other worker"


def test_known_failure_lets_the_model_try_again(gate: eg.Gate, ledger: list[Any]) -> None:
    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        ledger.append(txn_id)
        if len(ledger) == 1:
            raise eg.NotExecuted("card network refused the connection")
        return "refunded"

    messages = run(gated_agent("tool", refund, gate, script(call("call_1"), call("call_2"))))
    assert [m.status for m in messages] == ["error", "success"]
    assert "FAILED" in str(messages[0].content) and "may try again" in str(messages[0].content)
    assert gate.get("refund:T1").attempt == 2


def test_injected_call_id_is_not_part_of_the_payload(gate: eg.Gate, ledger: list[Any]) -> None:
    @tool
    def refund(txn_id: str, amount_cents: int,
               tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Refund a card transaction."""
        ledger.append(tool_call_id)
        return f"refunded under {tool_call_id}"

    messages = run(gated_agent("tool", refund, gate, script(call("call_1"), call("call_2"))))
    assert ledger == ["call_1"]
    assert [m.content for m in messages] == ["refunded under call_1"] * 2


def test_tool_runtime_is_injected_and_not_part_of_the_payload(
        gate: eg.Gate, ledger: list[Any]) -> None:
    @tool
    def refund(txn_id: str, amount_cents: int, runtime: ToolRuntime) -> str:
        """Refund a card transaction."""
        ledger.append(runtime.tool_call_id)
        return f"refunded under {runtime.tool_call_id}"

    gated = gate_tool(refund, "refund:{txn_id}", gate=gate)
    assert convert_to_openai_tool(gated) == convert_to_openai_tool(refund)
    messages = run(create_agent(script(call("call_1"), call("call_2")), tools=[gated]))
    assert ledger == ["call_1"]
    assert [m.content for m in messages] == ["refunded under call_1"] * 2


def test_callbacks_see_one_tool_run_per_call(sqlite_gate: eg.Gate, refund: Any) -> None:
    class Recorder(BaseCallbackHandler):
        def __init__(self) -> None:
            self.events: list[tuple[str, str]] = []

        def on_tool_start(self, serialized: dict[str, Any], input_str: str,
                          **kwargs: Any) -> None:
            self.events.append(("start", serialized["name"]))

        def on_tool_end(self, output: Any, **kwargs: Any) -> None:
            self.events.append(("end", str(getattr(output, "content", output))))

    recorder = Recorder()
    gated = gate_tool(refund, "refund:{txn_id}", gate=sqlite_gate)
    gated.invoke({"type": "tool_call", "id": "c1", "name": "refund", "args": ARGS},
                 config={"callbacks": [recorder]})
    assert recorder.events == [("start", "refund"), ("end", "refunded 500 on T1 (#1)")]


def test_invoke_outside_an_agent_loop(gate: eg.Gate, refund: Any, ledger: list[Any]) -> None:
    gated = gate_tool(refund, "refund:{txn_id}", gate=gate)
    assert gated.invoke(ARGS) == "refunded 500 on T1 (#1)"
    assert gated.invoke({"txn_id": "T1", "amount_cents": "500"}) == "refunded 500 on T1 (#1)"
    assert asyncio.run(gated.ainvoke(ARGS)) == "refunded 500 on T1 (#1)"
    conflict = gated.invoke({"type": "tool_call", "id": "c9", "name": "refund",
                             "args": {"txn_id": "T1", "amount_cents": 501}})
    assert conflict.status == "error" and "CONFLICT" in conflict.content
    assert ledger == [("T1", 500)]

    @tool(response_format="content_and_artifact")
    def charge(txn_id: str) -> tuple[str, dict[str, Any]]:
        """Charge, with an artifact."""
        ledger.append(txn_id)
        return "charged", {"charge_id": "ch_1"}

    gated_charge = gate_tool(charge, "charge:{txn_id}", gate=gate)
    tc = {"type": "tool_call", "id": "c1", "name": "charge", "args": {"txn_id": "T1"}}
    first = gated_charge.invoke(tc)
    second = gated_charge.invoke({**tc, "id": "c2"})
    assert (first.content, first.artifact) == ("charged", {"charge_id": "ch_1"})
    assert (second.content, second.artifact) == ("charged", {"charge_id": "ch_1"})
    assert ledger.count("T1") == 1


def test_gate_none_uses_one_process_wide_default_gate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refund: Any, ledger: list[Any]) -> None:
    from effectgate.integrations._kernel import gates as _common

    monkeypatch.setenv("EFFECTGATE_URL", f"sqlite:///{tmp_path / 'default.db'}")
    monkeypatch.setattr(_common, "_default", None)
    first = gate_tool(refund, "refund:{txn_id}")
    second = gate_tool(refund, "refund:{txn_id}")
    try:
        assert first.gated_call.spec.gate is second.gated_call.spec.gate
        assert first.invoke(ARGS) == second.invoke(ARGS)
        assert ledger == [("T1", 500)]
        assert (tmp_path / "default.db").exists()
    finally:
        _common.default_gate().close()


# -- approvals -----------------------------------------------------------------------------


def test_approval_required_refund_is_approved_then_runs_once(
        make_gate: Any, refund: Any, ledger: list[Any]) -> None:
    policy = eg.Policy.from_dict({"effects": {"payment.refund": {
        "key": "refund:{txn_id}", "tools": ["refund"], "approval": "always"}}})
    gate = make_gate(policy=policy)
    [gated] = gate_tools([refund], policy, gate=gate)
    [waiting] = run(create_agent(script(call("call_1")), tools=[gated]))
    [approval] = gate.list_approvals()
    assert ledger == []
    assert waiting.status == "error" and approval.approval_id in waiting.content
    gate.approve(approval.approval_id, by="alice")
    messages = run(create_agent(script(call("call_2"), call("call_3")), tools=[gated]))
    assert ledger == [("T1", 500)]
    assert [m.content for m in messages] == ["refunded 500 on T1 (#1)"] * 2


# -- gate_tools and the middleware's reports -----------------------------------------------


def test_gate_tools_reports_each_ungated_tool_once_and_strict_refuses(
        sqlite_gate: eg.Gate, refund: Any, caplog: pytest.LogCaptureFixture) -> None:
    @tool
    def lc_send_mail_1(to: str) -> str:
        """Send an email."""
        return "sent"

    @tool
    def lc_lookup_1(txn_id: str) -> str:
        """Read a transaction."""
        return "found"

    tools = [refund, lc_send_mail_1, lc_lookup_1]
    with caplog.at_level(logging.WARNING, logger="effectgate"), \
            pytest.warns(UngatedToolWarning, match="lc_send_mail_1") as record:
        out = gate_tools(tools, {"refund": "refund:{txn_id}", "lc_lookup_1": None},
                         gate=sqlite_gate)
    assert [type(t) for t in out] == [GatedTool, type(lc_send_mail_1), type(lc_lookup_1)]
    assert len(record) == 1
    assert [r for r in caplog.records if "lc_send_mail_1" in r.getMessage()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once: a second wrap is silent
        gate_tools(tools, {"refund": "refund:{txn_id}"}, gate=sqlite_gate,
                   read_only=["lc_lookup_1"])
    with pytest.raises(eg.ConfigError, match="lc_send_mail_1"):
        gate_tools(tools, {"refund": "refund:{txn_id}"}, gate=sqlite_gate, strict=True,
                   read_only=["lc_lookup_1"])
    with pytest.raises(eg.ConfigError, match="refnd"):
        gate_tools(tools, {"refnd": "refund:{txn_id}"}, gate=sqlite_gate)


def test_gate_tools_takes_a_policy_and_needs_the_gate_built_with_it(
        tmp_path: Path, refund: Any) -> None:
    policy = eg.Policy.from_dict({"strict": True, "effects": {"payment.refund": {
        "key": "refund:{txn_id}", "tools": ["refund"], "max_attempts": 2}}})
    with eg.Gate(f"sqlite:///{tmp_path / 'p.db'}", policy=policy) as gate:
        [gated] = gate_tools([refund], policy, gate=gate)
        assert isinstance(gated, GatedTool)
        spec = gated.gated_call.spec
        assert (spec.effect_type, spec.max_attempts) == ("payment.refund", 2)

        @tool
        def lc_unlisted_2(x: str) -> str:
            """Not in the policy."""
            return x

        with pytest.raises(eg.ConfigError, match="lc_unlisted_2"):  # policy.strict
            gate_tools([refund, lc_unlisted_2], policy, gate=gate)
    with temporary_gate() as other, pytest.raises(eg.ConfigError, match="policy"):
        gate_tools([refund], policy, gate=other)


def test_middleware_reports_ungated_tools_at_the_first_model_call(
        sqlite_gate: eg.Gate, refund: Any) -> None:
    @tool
    def lc_send_mail_3(to: str) -> str:
        """Send an email."""
        return "sent"

    middleware = eg_lc.EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=sqlite_gate)
    agent = create_agent(script(), tools=[refund, lc_send_mail_3], middleware=[middleware])
    with pytest.warns(UngatedToolWarning, match="lc_send_mail_3"):
        run(agent)
    strict = eg_lc.EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=sqlite_gate,
                                        strict=True)
    agent = create_agent(script(call("call_1")), tools=[refund, lc_send_mail_3],
                         middleware=[strict])
    with pytest.raises(eg.ConfigError, match="lc_send_mail_3"):
        run(agent)


@pytest.mark.parametrize("how", ["shared", "dynamic"])
@pytest.mark.parametrize("declared", ["mapping", "policy"])
def test_middleware_gates_a_declared_tool_it_did_not_see_first(
        make_gate: Any, refund: Any, ledger: list[Any], how: str, declared: str) -> None:
    """A tool is resolved the first time it is seen, never from a set frozen at the first
    model call: a middleware shared by two agents, or one behind a dynamic-tools middleware
    that offers fewer tools first, still gates the refund (it had run twice, unrecorded)."""
    from langchain.agents.middleware import AgentMiddleware

    @tool
    def lookup(txn_id: str) -> str:
        """Look a transaction up (read only)."""
        return "found"

    if declared == "policy":
        effects: Any = eg.Policy.from_dict({"effects": {"payment.refund": {
            "key": "refund:{txn_id}", "tools": ["refund"]}}})
        gate = make_gate(policy=effects)
    else:
        effects, gate = {"refund": "refund:{txn_id}"}, make_gate()
    middleware = eg_lc.EffectGateMiddleware(effects, gate=gate, read_only=["lookup"])
    lookup_call = call("c0", {"txn_id": "T1"}, name="lookup")
    stack: list[Any] = [middleware]
    if how == "shared":  # a triage agent that has only the lookup uses it first
        run(create_agent(script(lookup_call), tools=[lookup], middleware=[middleware]))
        scripted = script(call("c1"), call("c2"))
    else:
        class ReadFirst(AgentMiddleware):  # type: ignore[type-arg]
            def wrap_model_call(self, request: Any, handler: Any) -> Any:
                if len(request.messages) <= 1:
                    request = request.override(
                        tools=[t for t in request.tools if t.name == "lookup"])
                return handler(request)

        stack = [ReadFirst(), middleware]
        scripted = script(lookup_call, call("c1"), call("c2"))
    answers = run(create_agent(scripted, tools=[lookup, refund], middleware=stack))
    assert ledger == [("T1", 500)]
    assert gate.get("refund:T1").state is eg.State.COMMITTED
    assert answers[-1].content == answers[-2].content  # the repeat got the stored result


def test_a_shared_middleware_gates_a_plain_tool_named_as_another_agents_wrapped_one(
        gate: eg.Gate, refund: Any, ledger: list[Any]) -> None:
    """Agent A has ``gate_tool(refund)`` (it passes through), agent B the plain ``refund``: B's
    is gated by name all the same (it had run twice, unrecorded, even under strict)."""
    middleware = eg_lc.EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate,
                                            strict=True)
    wrapped = gate_tool(refund, "refund:{txn_id}", gate=gate)
    run(create_agent(script(call("c0")), tools=[wrapped], middleware=[middleware]))
    ledger.clear()
    answers = run(create_agent(script(call("c1", {"txn_id": "T2", "amount_cents": 500}),
                                      call("c2", {"txn_id": "T2", "amount_cents": 500})),
                               tools=[refund], middleware=[middleware]))
    assert ledger == [("T2", 500)] and answers[0].content == answers[1].content
    assert gate.get("refund:T2").state is eg.State.COMMITTED


@pytest.mark.parametrize("typed", [False, True])
@pytest.mark.parametrize("returns", ["command", "tool_message"])
@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_twin_of_a_tool_that_addresses_its_own_answer_gets_one_of_its_own(
        gate: eg.Gate, form: str, returns: str, typed: bool) -> None:
    """Two identical calls in one turn to a tool that answers with a ``Command`` or a
    ``ToolMessage`` addressed through its ``ToolRuntime``: the refund runs once, and each call
    gets an answer with its own id (the twin got its leader's, which left a call unanswered or
    crashed the run)."""
    made: list[str] = []

    def body(txn_id: str, runtime: Any) -> Any:
        made.append(txn_id)
        time.sleep(0.3)  # the twin arrives while this runs
        answer = ToolMessage(f"refunded #{len(made)}", tool_call_id=runtime.tool_call_id)
        return Command(update={"messages": [answer]}) if returns == "command" else answer

    if typed:  # the documented way to type a context: ToolRuntime[Ctx]
        @tool
        def refund(txn_id: str, runtime: ToolRuntime[None, dict[str, Any]]) -> Any:
            """Refund a card transaction. Irreversible."""
            return body(txn_id, runtime)
    else:
        @tool
        def refund(txn_id: str, runtime: ToolRuntime) -> Any:
            """Refund a card transaction. Irreversible."""
            return body(txn_id, runtime)

    two = AIMessage("", tool_calls=[{"name": "refund", "args": {"txn_id": "T1"}, "id": c,
                                     "type": "tool_call"} for c in ("c1", "c2")])
    if form == "tool":
        agent = create_agent(script(two), tools=[gate_tool(refund, "refund:{txn_id}", gate=gate)])
    else:
        agent = create_agent(script(two), tools=[refund], middleware=[
            eg_lc.EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate)])
    answers = {m.tool_call_id: m.content for m in run(agent)}
    assert made == ["T1"]
    assert answers == {"c1": "refunded #1", "c2": "refunded #1"}


# -- two processes -------------------------------------------------------------------------


@pytest.mark.slow
def test_two_agents_in_two_processes_execute_the_refund_once(
        tmp_path: Path, namespace: str) -> None:
    require_postgres()
    lines, results = run_two_agents("langchain", PG_URL, namespace, tmp_path)
    assert len(lines) == 1
    winner = f"refunded 500 on T1 by {lines[0]}"
    for outputs in results:
        assert len(outputs) == 2
        assert all(o == winner or "NOT DONE YET" in o for o in outputs)
    assert any(winner in outputs for outputs in results)


def test_a_tool_exception_classified_failed_is_answered_by_handle_tool_error(
        gate: eg.Gate, ledger: list[Any]) -> None:
    from langchain_core.tools import ToolException

    from effectgate.integrations.langchain import classify_tool_exception

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append(txn_id)
        raise ToolException("card expired")

    refund.handle_tool_error = lambda e: f"the tool says: {e}"

    declared = gate_tool(refund, "refund:{txn_id}", gate=gate,
                         classifiers=(classify_tool_exception,))
    assert declared.invoke(ARGS) == "the tool says: card expired"
    assert gate.get("refund:T1").state is eg.State.FAILED
    unknown = gate_tool(refund, "other:{txn_id}", gate=gate)  # no classifier: may have acted
    assert "OUTCOME UNKNOWN" in unknown.invoke(ARGS)
    assert gate.get("other:T1").state is eg.State.AMBIGUOUS


def test_identical_calls_in_one_turn_through_the_middleware_run_once(
        gate: eg.Gate, ledger: list[Any]) -> None:
    import time

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append(txn_id)
        time.sleep(0.3)
        return f"refunded {amount_cents} on {txn_id}"

    two = AIMessage("", tool_calls=[
        {"name": "refund", "args": ARGS, "id": cid, "type": "tool_call"} for cid in ("c1", "c2")])
    agent = gated_agent("middleware", refund, gate, script(two))
    messages = run(agent)
    assert ledger == ["T1"]
    assert {(m.tool_call_id, m.content, m.status) for m in messages} == {
        ("c1", "refunded 500 on T1", "success"), ("c2", "refunded 500 on T1", "success")}


@pytest.mark.parametrize("form", ["tool", "middleware"])
@pytest.mark.parametrize("on_refusal", ["message", "raise"])
def test_a_denial_is_answered_as_the_mode_says(make_gate: Any, refund: Any,
                                               ledger: list[Any], form: str,
                                               on_refusal: str) -> None:
    """A policy's denial in the real agent loop: a DENIED tool message, or (raise mode) the run
    stops with ``EffectDenied``. Denials pass through the adapter's pause hook, which must not
    turn a raise into text; nothing runs either way."""
    deny = make_gate(policy={"effects": {"refund": {"deny": "no refunds today"}}})
    agent = gated_agent(form, refund, deny, script(call("call_1")), on_refusal=on_refusal)
    if on_refusal == "raise":
        with pytest.raises(eg.EffectDenied, match="no refunds today"):
            run(agent)
    else:
        [said] = run(agent)
        assert said.status == "error" and str(said.content).startswith("DENIED")
    assert ledger == []


# -- the arguments a call is keyed on are the ones the tool runs with -------------------------


class DollarArgs(BaseModel):
    txn_id: str
    amount_cents: int = Field(description="amount in cents, or '$12.50'")

    @field_validator("amount_cents", mode="before")
    @classmethod
    def dollars(cls, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("$"):
            return round(float(value[1:]) * 100)
        return value


class NumberIdArgs(BaseModel):
    model_config = ConfigDict(coerce_numbers_to_str=True)
    txn_id: str
    amount_cents: int


class AliasArgs(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    txn_id: str = Field(alias="txnId")
    amount_cents: int


def _schema_tool(schema: type[BaseModel], ledger: list[Any]) -> Any:
    def refund(txn_id: str, amount_cents: int) -> str:
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    return StructuredTool.from_function(refund, name="refund", args_schema=schema,
                                        description="Refund a card transaction. Irreversible.")


# (LangChain's tool_call_schema keeps a schema's fields, not its validators, its model_config
# or its aliases: the middleware keyed on it, failed where the tool's own schema accepted the
# call, and let the call through ungated.)
@pytest.mark.parametrize(("schema", "args", "runs_with"), [
    (DollarArgs, {"txn_id": "T1", "amount_cents": "$12.50"}, ("T1", 1250)),
    (NumberIdArgs, {"txn_id": 40021, "amount_cents": 500}, ("40021", 500)),
    (AliasArgs, {"txnId": "T1", "amount_cents": 500}, ("T1", 500)),
], ids=["before-validator", "model_config", "alias"])
@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_schema_the_tool_validates_by_its_own_rules_is_gated_once(
        make_gate: Any, form: str, schema: type[BaseModel], args: dict[str, Any],
        runs_with: tuple[str, int]) -> None:
    gate = make_gate()
    ledger: list[Any] = []
    tool_ = _schema_tool(schema, ledger)
    answers = [run(gated_agent(form, tool_, gate, script(call(f"c{n}", args))), f"t-{n}")
               for n in range(3)]
    assert ledger == [runs_with]
    assert {m.content for found in answers for m in found} == {
        f"refunded {runs_with[1]} on {runs_with[0]}"}
    record = gate.get(f"refund:{runs_with[0]}")
    assert record.state is eg.State.COMMITTED and record.attempt == 1


@pytest.mark.parametrize("args", [
    {"txn_id": "T1", "amount_cents": "lots"}, {"txn_id": "T1"}, {"amount_cents": 500},
], ids=["bad value", "no amount", "no id"])
def test_the_middleware_refuses_arguments_the_tool_would_refuse_and_writes_nothing(
        make_gate: Any, args: dict[str, Any]) -> None:
    gate = make_gate()
    ledger: list[Any] = []
    before = snapshot(gate)
    found = run(gated_agent("middleware", _schema_tool(DollarArgs, ledger), gate,
                            script(call("c1", args))))
    assert ledger == [] and snapshot(gate) == before
    assert len(found) == 1 and found[0].status == "error"
    assert "invalid argument" in str(found[0].content)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_middleware_gates_a_pydantic_v1_schema_and_refuses_what_it_does_not_validate(
        make_gate: Any) -> None:
    from pydantic import v1

    class V1Args(v1.BaseModel):
        txn_id: str
        amount_cents: int

    gate = make_gate()
    ledger: list[Any] = []
    tool_ = _schema_tool(V1Args, ledger)  # type: ignore[arg-type]
    for n in range(2):
        found = run(gated_agent("middleware", tool_, gate, script(call(f"c{n}"))), f"t-{n}")
        assert [m.content for m in found] == ["refunded 500 on T1"]
    before = snapshot(gate)
    found = run(gated_agent("middleware", tool_, gate, script(call(
        "bad", {"txn_id": "T2", "amount_cents": "lots"}))), "t-bad")
    assert found[0].status == "error" and "invalid argument" in str(found[0].content)
    assert ledger == [("T1", 500)] and snapshot(gate) == before
