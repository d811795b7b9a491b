"""Red team, round 5, framework integrations: real agent loops with scripted models, offline.

Each test names what it caught: a payload carried out that differs from the one approved, a
second execution, or a record lost."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel

import effectgate as eg

from . import hitl_worker as worker

CONFIG = {"configurable": {"thread_id": "rt5"}}


class RefundArgs(BaseModel):
    """The refund tool's schema, given: it declares ``currency``, defaulting to USD."""

    txn_id: str
    currency: str = "USD"


def ledgered_refund() -> tuple[list[tuple[str, str]], Any]:
    """(the ledger, a ``refund(txn_id, currency="USD")`` that appends to it)."""
    ran: list[tuple[str, str]] = []

    def refund(txn_id: str, currency: str = "USD") -> str:
        ran.append((txn_id, currency))
        return f"refunded {txn_id} in {currency}"

    return ran, refund


@pytest.fixture
def sgate(tmp_path: Path) -> Any:
    with worker.make_gate(f"sqlite:///{tmp_path / 'effects.db'}", "rt5") as gate:
        yield gate


@pytest.fixture
def plain(tmp_path: Path) -> Any:
    with eg.Gate(f"sqlite:///{tmp_path / 'plain.db'}", namespace="rt5", policy=False) as gate:
        yield gate


# -- LangChain v1 middleware: a reviewer's edit is validated once, as it was hashed -----------


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_middleware_edit_never_runs_another_payload_than_the_approved_one(
        sgate: eg.Gate, asynchronous: bool) -> None:
    """The schema converts dollars to cents (an ``AfterValidator`` that is not idempotent).
    The middleware validated the reviewer's edit (400 → 40000 cents), hashed and approved it,
    then handed the *validated* arguments to the tool node, which validated them again: the
    tool refunded 4000000 cents under an approval bound to 40000. An edit of such a schema
    cannot bind what runs (the reviewer edits the validated form): it is refused, nothing is
    recorded, and the request still waits; approved as shown, it runs as shown, once."""
    pytest.importorskip("langchain.agents")
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command
    from pydantic import AfterValidator, BaseModel

    from effectgate.integrations import langchain as eg_lc

    class RefundArgs(BaseModel):
        txn_id: str
        amount_cents: Annotated[int, AfterValidator(lambda dollars: dollars * 100)]

    ran: list[tuple[str, int]] = []

    def refund(txn_id: str, amount_cents: int) -> str:
        ran.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    async def arefund(txn_id: str, amount_cents: int) -> str:
        return refund(txn_id, amount_cents)

    tool = StructuredTool.from_function(refund, coroutine=arefund, name="refund",
                                        description="Refund (amount in dollars).",
                                        args_schema=RefundArgs)
    middleware = eg_lc.EffectGateMiddleware({"refund": {
        "key": "refund:{txn_id}", "cost_micros": worker.cost}}, gate=sgate)
    agent = create_agent(worker.scripted_model({"txn_id": "T1", "amount_cents": 500}),
                         tools=[tool], middleware=[middleware], checkpointer=InMemorySaver())

    def invoke(payload: Any) -> Any:
        if asynchronous:
            import asyncio

            return asyncio.run(agent.ainvoke(payload, config=CONFIG))
        return agent.invoke(payload, config=CONFIG)

    paused = invoke({"messages": [{"role": "user", "content": "refund"}]})
    shown = paused["__interrupt__"][0].value["action_requests"][0]["args"]
    assert shown == {"txn_id": "T1", "amount_cents": 50_000} and ran == []
    edit = {"type": "edit", "by": "alice", "edited_action": {
        "name": "refund", "args": {"txn_id": "T1", "amount_cents": 400}}}
    invoke(Command(resume={"decisions": [edit]}))
    assert ran == []
    [request] = sgate.list_approvals(state=None)  # no edit recorded; the request waits
    assert request.state is eg.ApprovalState.PENDING
    sgate.approve(request.approval_id, by="bob")
    invoke({"messages": [{"role": "user", "content": "refund"}]})
    assert ran == [("T1", 50_000)]  # what was shown and approved, once
    assert sgate.get("refund:T1").state is eg.State.COMMITTED


# -- the twins' registry: a call cancelled before its thread started leaves no slot -----------


def test_a_sync_tool_call_cancelled_while_queued_does_not_stall_its_repeats(
        plain: eg.Gate) -> None:
    """``arun_sync`` claimed the twins' slot, then waited for a worker thread. Cancelled
    while queued (a busy executor and a caller's timeout), the thread never ran, so nothing
    released the slot: every later identical call in the process was taken for its twin and
    waited out the whole lease (60 s by default) before asking the store."""
    import asyncio
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from langchain_core.tools import tool

    from effectgate.integrations import langchain as eg_lc
    from effectgate.integrations._kernel.twins import registry

    ran: list[str] = []

    @tool
    def refund(txn_id: str) -> str:
        """Refund a transaction."""
        ran.append(txn_id)
        return f"refunded {txn_id}"

    gated = eg_lc.gate_tool(refund, "refund:{txn_id}", gate=plain, lease_seconds=3)
    call = {"type": "tool_call", "id": "c1", "name": "refund", "args": {"txn_id": "T9"}}

    async def main() -> tuple[Any, float]:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(1)
        loop.set_default_executor(executor)
        release = threading.Event()
        busy = loop.run_in_executor(None, release.wait)  # the only worker thread is taken
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(gated.ainvoke(call), 0.1)
        release.set()
        await busy
        started = time.monotonic()
        again = await gated.ainvoke({**call, "id": "c2"})
        return again, time.monotonic() - started

    before = len(registry)
    again, waited = asyncio.run(main())
    assert again.content == "refunded T9" and ran == ["T9"]  # the cancelled call never ran
    assert waited < 1.5, f"the repeat waited {waited:.1f} s for a call that never started"
    assert len(registry) == before
    assert plain.get("refund:T9").state is eg.State.COMMITTED


# -- LangChain v1 middleware before a dynamic-tools middleware --------------------------------


def _dynamic_stack(supplied: Any, calls: list[dict[str, Any]]) -> tuple[Any, Any]:
    """LangChain's documented dynamic tools: a middleware that adds ``supplied`` to the
    model's tools and hands it to the tool node (``request.override(tool=...)``), and a
    scripted model that makes ``calls`` (one tool call each), then says "done"."""
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage

    class DynamicTools(AgentMiddleware):  # type: ignore[type-arg]
        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            return handler(request.override(tools=[*request.tools, supplied]))

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            return await handler(request.override(tools=[*request.tools, supplied]))

        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            if request.tool_call["name"] == supplied.name:
                request = request.override(tool=supplied)
            return handler(request)

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            if request.tool_call["name"] == supplied.name:
                request = request.override(tool=supplied)
            return await handler(request)

    class Model(FakeMessagesListChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    def model() -> Any:
        return Model(responses=[
            *(AIMessage("", tool_calls=[{**call, "id": f"c{i}", "type": "tool_call"}])
              for i, call in enumerate(calls)), AIMessage("done")])

    return DynamicTools, model


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_declared_tool_a_later_middleware_supplies_is_never_run_ungated(
        plain: eg.Gate, asynchronous: bool) -> None:
    """LangChain's documented dynamic tools: a middleware adds ``refund`` to the model's tools
    and supplies it to the tool node (``request.override(tool=...)``). With the gate's
    middleware listed first, it saw ``request.tool is None`` and passed the call on: the
    declared refund ran twice, with no record, even with ``strict=True``."""
    pytest.importorskip("langchain.agents")
    import asyncio

    from langchain.agents import create_agent
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool

    from effectgate.integrations import langchain as eg_lc

    ran: list[str] = []

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ran.append(txn_id)
        return f"refunded {amount_cents} on {txn_id}"

    @tool
    def lookup(txn_id: str) -> str:
        """Look a transaction up."""
        return "found"

    call = {"name": "refund", "args": {"txn_id": "T1", "amount_cents": 500}}
    dynamic_tools, model = _dynamic_stack(refund, [call, call])
    gate_mw = eg_lc.EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=plain,
                                         read_only=["lookup"], strict=True)
    agent = create_agent(model(), tools=[lookup], middleware=[gate_mw, dynamic_tools()])
    payload = {"messages": [{"role": "user", "content": "refund T1"}]}
    out = asyncio.run(agent.ainvoke(payload)) if asynchronous else agent.invoke(payload)
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert ran == []  # never run where the gate cannot see it
    assert [m.status for m in answers] == ["error", "error"]
    assert all("EffectGateMiddleware after the middleware" in str(m.content) for m in answers)
    with pytest.raises(eg.UnknownEffect):
        plain.get("refund:T1")

    # In the order the refusal names, the same stack gates it: once, recorded.
    agent = create_agent(model(), tools=[lookup], middleware=[dynamic_tools(), gate_mw])
    out = asyncio.run(agent.ainvoke(payload)) if asynchronous else agent.invoke(payload)
    assert ran == ["T1"] and plain.get("refund:T1").state is eg.State.COMMITTED


@pytest.mark.parametrize("asynchronous", [False, True])
def test_strict_refuses_an_undeclared_tool_a_later_middleware_supplies(
        plain: eg.Gate, asynchronous: bool) -> None:
    """A declared tool that reaches the gate's middleware with no tool object was refused,
    but an undeclared one still passed on, and the later middleware ran it ungated under
    ``strict=True`` (twice for two calls, never reported): strict runs no tool ungated."""
    pytest.importorskip("langchain.agents")
    import asyncio

    from langchain.agents import create_agent
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool

    from effectgate.integrations import langchain as eg_lc

    sent: list[str] = []

    @tool
    def send_email(to: str) -> str:
        """Send an email. Irreversible."""
        sent.append(to)
        return "sent"

    @tool
    def lookup(txn_id: str) -> str:
        """Look a transaction up."""
        return "found"

    call = {"name": "send_email", "args": {"to": "a@b.c"}}
    dynamic_tools, model = _dynamic_stack(send_email, [call, call])
    gate_mw = eg_lc.EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=plain,
                                         read_only=["lookup"], strict=True)
    agent = create_agent(model(), tools=[lookup], middleware=[gate_mw, dynamic_tools()])
    payload = {"messages": [{"role": "user", "content": "mail a@b.c"}]}
    out = asyncio.run(agent.ainvoke(payload)) if asynchronous else agent.invoke(payload)
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert sent == []
    assert [m.status for m in answers] == ["error", "error"]
    assert all("strict mode" in str(m.content) for m in answers)


# -- LlamaIndex: a bound partial param is never replaced by the schema's default ---------------


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_bound_partial_param_runs_as_bound_not_as_the_schemas_default(
        plain: eg.Gate) -> None:
    """A ``FunctionTool`` with a given ``fn_schema`` declaring ``currency = "USD"`` and
    ``partial_params={"currency": "EUR"}``: ungated, the agent's call refunds in EUR (the
    bound value beats the schema's default). Gated, the validated arguments carried the
    schema's default over the bound value: the refund ran, and was recorded, in USD."""
    pytest.importorskip("llama_index.core")
    import asyncio
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
        from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
        from llama_index.core.llms.mock import MockFunctionCallingLLM
        from llama_index.core.tools import FunctionTool, ToolMetadata

    from effectgate.integrations import llama_index as eg_li

    ran, refund = ledgered_refund()

    def run(tool: Any, txn_id: str) -> list[Any]:
        turns = iter([ChatMessage(role=MessageRole.ASSISTANT, blocks=[ToolCallBlock(
            tool_call_id="c1", tool_name="refund", tool_kwargs={"txn_id": txn_id})]),
            ChatMessage(role=MessageRole.ASSISTANT, content="All done.")])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            agent = FunctionAgent(name="billing", tools=[tool], llm=MockFunctionCallingLLM(
                response_generator=lambda messages, **kw: next(turns)))

        async def go() -> list[Any]:
            handler = agent.run(user_msg="refund")
            out = [ev.tool_output async for ev in handler.stream_events()
                   if isinstance(ev, ToolCallResult)]
            await handler
            return out

        return asyncio.run(go())

    def tool() -> Any:
        return FunctionTool(fn=refund, metadata=ToolMetadata(
            name="refund", description="Refund.", fn_schema=RefundArgs),
            partial_params={"currency": "EUR"})

    run(tool(), "T0")
    assert ran == [("T0", "EUR")]  # ungated
    [answer] = run(eg_li.gate_tool(tool(), "refund:{txn_id}", gate=plain), "T1")
    assert ran[1:] == [("T1", "EUR")] and answer.content == "refunded T1 in EUR"
    assert plain.get("refund:T1").state is eg.State.COMMITTED


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_partial_param_the_model_sends_is_in_the_payload_an_approval_binds(
        tmp_path: Any) -> None:
    """``partial_params={"currency": "EUR"}`` beside a given ``fn_schema`` that declares
    ``currency``: the bound value was dropped from the payload, yet a call that sends
    ``currency`` runs with it (LlamaIndex lets the call's value win). The approval asked for
    the EUR call (payload ``{txn_id}``) let the USD call run. Now the payload carries the
    value that runs: the USD call is another payload, refused, and nothing ran."""
    pytest.importorskip("llama_index.core")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from llama_index.core.tools import FunctionTool, ToolMetadata

    from effectgate.integrations import llama_index as eg_li

    ran, refund = ledgered_refund()

    with eg.Gate(f"sqlite:///{tmp_path / 'e.db'}", policy={
            "effects": {"refund": {"approval": "always"}}}) as gate:
        tool = eg_li.gate_tool(FunctionTool(fn=refund, metadata=ToolMetadata(
            name="refund", description="Refund.", fn_schema=RefundArgs),
            partial_params={"currency": "EUR"}), "refund:{txn_id}", gate=gate,
            effect_type="refund")
        assert "WAITING FOR APPROVAL" in tool.call(txn_id="T1").content
        gate.approve(gate.get("refund:T1").approval_id, by="alice")
        other = tool.call(txn_id="T1", currency="USD")
        assert ran == [], other.content
        assert tool.call(txn_id="T1").content == "refunded T1 in EUR"
        assert ran == [("T1", "EUR")]
        # A partial param no schema shows the model, sent all the same (a model's JSON):
        hidden = eg_li.gate_tool(FunctionTool.from_defaults(
            fn=refund, name="refund2", partial_params={"currency": "EUR"}), "refund:{txn_id}",
            gate=gate, effect_type="refund")
        assert "currency" not in hidden.metadata.fn_schema.model_fields
        assert "WAITING FOR APPROVAL" in hidden.call(txn_id="T2").content
        gate.approve(gate.get("refund:T2").approval_id, by="alice")
        hidden.call(txn_id="T2", currency="USD")
        assert ran == [("T1", "EUR")]
