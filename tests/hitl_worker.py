"""One step of a paused agent run in its own OS process, for the human-in-the-loop tests.

    python -m tests.hitl_worker FRAMEWORK STORE_URL NAMESPACE LEDGER STATE STEP [ANSWER_JSON]

Builds the framework's real agent loop, driven offline by a scripted model that asks for
``refund(txn_id="T1", amount_cents=50_000)`` (above the policy's approval threshold) and then
answers "All done.". The refund appends one line to LEDGER (``O_APPEND``: the side effect the
parent counts). STATE is where the framework keeps the paused run (a LangGraph SqliteSaver
file). STEP ``start`` runs until the pause and prints ``{"interrupts": [...]}``; ``resume``
resumes with ANSWER_JSON and prints ``{"tool_results": [...]}``.

``$HITL_VARIANT`` (JSON, read by both steps, so a new process builds the same run) changes the
run: ``calls`` (a list of argument dicts: the tool calls of the model's first turn), for
OpenAI Agents ``own_approval`` (the tool declares ``needs_approval=True`` itself), for
LangChain ``at_pause`` (resume the checkpoint that paused, as a replayed or racing resume does,
instead of the thread's head).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import effectgate as eg

ARGS = {"txn_id": "T1", "amount_cents": 50_000}
THREAD = "thread-hitl"
POLICY = {"effects": {"refund": {"approval": {"at_or_above_micros": 100_000_000}}}}


def cost(amount_cents: int) -> int:
    """A refund's estimated cost in micros (1 cent = 10,000 micros)."""
    return amount_cents * 10_000


def book(ledger: Path, txn_id: str, amount_cents: int) -> str:
    """The side effect: one line appended to the ledger."""
    fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"{txn_id} {amount_cents} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return f"refunded {amount_cents} on {txn_id}"


def lines(ledger: Path) -> list[str]:
    """The refunds the ledger recorded, one line each."""
    return ledger.read_text().splitlines() if ledger.exists() else []


def in_new_process(framework: str, store_url: str, namespace: str, tmp: Path, step: str,
                   answer: Any = None) -> dict[str, Any]:
    """Run one ``step`` of ``framework``'s paused run in a fresh OS process; what it printed."""
    argv = [sys.executable, "-m", "tests.hitl_worker", framework, store_url, namespace,
            str(tmp / "ledger"), str(tmp / "state.json"), step]
    if answer is not None:
        argv.append(json.dumps(answer))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(argv, cwd=Path(__file__).resolve().parents[1], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def variant() -> dict[str, Any]:
    """The run's variant (``$HITL_VARIANT``), ``{}`` by default."""
    raw = os.environ.get("HITL_VARIANT")
    return dict(json.loads(raw)) if raw else {}


def calls() -> list[dict[str, Any]]:
    """The tool calls of the model's first turn: ``[ARGS]`` unless the variant says."""
    return [dict(c) for c in variant().get("calls", [ARGS])]


def make_gate(url: str, namespace: str) -> eg.Gate:
    return eg.Gate(url, namespace=namespace, policy=POLICY)


# -- LangChain / LangGraph -----------------------------------------------------------------------


def langchain_agent(gate: eg.Gate, ledger: Path, checkpointer: Any, form: str = "tool",
                    args: dict[str, Any] | None = None) -> Any:
    from langchain.agents import create_agent
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool

    from effectgate.integrations import langchain as eg_lc

    wanted = dict(args or ARGS)

    class Scripted(BaseChatModel):
        """Asks for the refund, then (once it sees a tool result) answers."""

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            if isinstance(messages[-1], ToolMessage):
                message = AIMessage("All done.")
            else:
                message = AIMessage("", tool_calls=[{"name": "refund", "args": wanted,
                                                     "id": "call_1", "type": "tool_call"}])
            return ChatResult(generations=[ChatGeneration(message=message)])

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        @property
        def _llm_type(self) -> str:
            return "scripted"

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return book(ledger, txn_id, amount_cents)

    if form == "tool":
        gated = eg_lc.gate_tool(refund, "refund:{txn_id}", gate=gate, cost_micros=cost)
        return create_agent(Scripted(), tools=[gated], checkpointer=checkpointer,
                            name="billing")
    middleware = eg_lc.EffectGateMiddleware(
        {"refund": {"key": "refund:{txn_id}", "cost_micros": cost}}, gate=gate)
    return create_agent(Scripted(), tools=[refund], middleware=[middleware],
                        checkpointer=checkpointer, name="billing")


def langchain_step(gate: eg.Gate, ledger: Path, state: Path, step: str, answer: Any,
                   form: str) -> dict[str, Any]:
    from langchain_core.messages import ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command

    config = {"configurable": {"thread_id": THREAD}}
    with SqliteSaver.from_conn_string(str(state)) as saver:
        agent = langchain_agent(gate, ledger, saver, form)
        if step == "start":
            out = agent.invoke({"messages": [{"role": "user", "content": "refund T1"}]},
                               config=config)
        else:
            at = config
            if variant().get("at_pause"):  # a replayed (or racing) resume of the pause itself
                at = next(dict(snap.config) for snap in agent.get_state_history(config)
                          if snap.next == ("tools",))
            out = agent.invoke(Command(resume=answer), config=at)
        return {
            "interrupts": [i.value for i in out.get("__interrupt__", [])],
            "tool_results": [m.content for m in out["messages"]
                             if isinstance(m, ToolMessage)],
            "next": list(agent.get_state(config).next),
        }


# -- OpenAI Agents ------------------------------------------------------------------------------


def openai_agent(gate: eg.Gate, ledger: Path, step: str) -> Any:
    from agents import Agent, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    from effectgate.integrations import openai_agents as eg_oa

    set_tracing_disabled(True)

    @function_tool(needs_approval=bool(variant().get("own_approval")))
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return book(ledger, txn_id, amount_cents)

    done = [assistant_message("All done.")]
    turns = [done] if step != "start" else [
        [function_call("refund", args, call_id=f"call_{n}")
         for n, args in enumerate(calls(), 1)], done]
    gated = eg_oa.gate_tool(refund, "refund:{txn_id}", gate=gate, cost_micros=cost)
    return Agent(name="billing", model=ScriptedModel(turns), tools=[gated])


async def openai_step(gate: eg.Gate, ledger: Path, state_file: Path, step: str,
                      answer: Any) -> dict[str, Any]:
    """``start``: run to the pause and save the RunState JSON; ``resume``: load it, decide
    (``answer["decision"]``: approve / reject / store) and run on."""
    from agents import Runner, RunState
    from agents.items import ToolCallOutputItem

    from effectgate.integrations import openai_agents as eg_oa

    agent = openai_agent(gate, ledger, step)
    if step == "start":
        result = await Runner.run(agent, "refund T1")
        state_file.write_text(json.dumps(result.to_state().to_json()))
        return {"interruptions": [{"tool_name": i.tool_name, "call_id": i.call_id,
                                   "arguments": i.arguments} for i in result.interruptions],
                "final_output": result.final_output}
    state = await RunState.from_json(agent, json.loads(state_file.read_text()))
    by = answer.get("by", eg_oa.DEFAULT_APPROVER)
    waiting = state.get_interruptions()
    if answer["decision"] == "approve":
        for item in waiting:
            eg_oa.approve(state, item, by=by)
    elif answer["decision"] == "reject":
        for item in waiting:
            eg_oa.reject(state, item, by=by, reason=answer.get("reason"))
    elif answer["decision"] == "bare":
        for item in waiting:
            state.approve(item)  # the SDK alone, not the store
    else:
        eg_oa.apply_store_decisions(state)
    result = await Runner.run(agent, state)
    return {"tool_results": [str(i.output) for i in result.new_items
                             if isinstance(i, ToolCallOutputItem)],
            "interruptions": [i.call_id for i in result.interruptions],
            "final_output": result.final_output}


# -- LlamaIndex ---------------------------------------------------------------------------------


def llama_agent(gate: eg.Gate, ledger: Path, args: dict[str, Any] | None = None) -> Any:
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.core.tools import FunctionTool

    from effectgate.integrations import llama_index as eg_li

    wanted = [dict(args)] if args is not None else calls()

    def answer(messages: Any, **kwargs: Any) -> ChatMessage:
        if messages and messages[-1].role == MessageRole.TOOL:
            return ChatMessage(role=MessageRole.ASSISTANT, content="All done.")
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[ToolCallBlock(
            tool_call_id=f"call_{n}", tool_name="refund", tool_kwargs=one)
            for n, one in enumerate(wanted, 1)])

    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return book(ledger, txn_id, amount_cents)

    gated = eg_li.gate_tool(FunctionTool.from_defaults(fn=refund), "refund:{txn_id}", gate=gate,
                            cost_micros=cost)
    return eg_li.EffectGateFunctionAgent(
        name="billing", tools=[gated], llm=MockFunctionCallingLLM(response_generator=answer),
        system_prompt="You refund things.")


LLAMA_FIELDS = ("approval_id", "payload_hash", "key", "tool", "arguments", "allowed_decisions",
                "prefix")
SETTLE_SECONDS = 5.0  # how long the resume waits for one answer's effect before the next


async def llama_step(gate: eg.Gate, ledger: Path, state_file: Path, step: str,
                     answer: Any) -> dict[str, Any]:
    """``start``: run until every call waits behind its InputRequiredEvent, save the Context
    (and the agent's memory, which the JSON serializer skips) and cancel; ``resume``: restore
    it and send the answer — one ``HumanResponseEvent`` (its ``approval_id`` defaults to the
    first pause's), or ``{"events": [...]}``, each naming its pause by index (``"for"``) or
    ``approval_id``; after each but the last the resume waits for that answer to show (a tool
    result, or its pause asked again) for up to :data:`SETTLE_SECONDS`."""
    from llama_index.core.agent.workflow import ToolCallResult
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.memory import ChatMemoryBuffer
    from llama_index.core.workflow import Context, HumanResponseEvent, InputRequiredEvent

    agent = llama_agent(gate, ledger)
    if step == "start":
        handler = agent.run(user_msg="Refund T1")
        asked: list[dict[str, Any]] = []
        async for event in handler.stream_events():
            if isinstance(event, InputRequiredEvent):
                asked.append({k: event.get(k) for k in LLAMA_FIELDS})
                if len(asked) < len(calls()):
                    continue
                memory = await handler.ctx.store.get("memory")
                saved = {"ctx": handler.ctx.to_dict(), "events": asked,
                         "memory": [m.model_dump(mode="json") for m in await memory.aget_all()]}
                state_file.write_text(json.dumps(saved))
                await handler.cancel_run()
                break
        try:
            await handler
        except BaseException as err:  # the cancelled run
            if type(err).__name__ != "WorkflowCancelledByUser":
                raise
        return {"event": asked[0], "events": asked}
    saved = json.loads(state_file.read_text())
    restored = Context.from_dict(agent, saved["ctx"])
    handler = agent.run(ctx=restored)
    await handler.ctx.store.set("memory", ChatMemoryBuffer.from_defaults(
        chat_history=[ChatMessage.model_validate(m) for m in saved["memory"]]))
    outputs: list[str] = []
    reasked: list[str] = []
    progress = asyncio.Event()

    async def consume() -> None:
        async for event in handler.stream_events():
            if isinstance(event, ToolCallResult):
                outputs.append(str(event.tool_output.content))
                progress.set()
            elif isinstance(event, InputRequiredEvent):
                reasked.append(str(event.get("approval_id")))
                progress.set()

    consumer = asyncio.create_task(consume())
    answers = answer.get("events", [answer])
    for n, one in enumerate(answers):
        fields = dict(one)
        pause = saved["events"][fields.pop("for", 0)]
        fields.setdefault("approval_id", pause["approval_id"])
        progress.clear()
        handler.ctx.send_event(HumanResponseEvent(**fields))
        if n < len(answers) - 1:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(progress.wait(), timeout=SETTLE_SECONDS)
    result = await asyncio.wait_for(handler, timeout=30)
    await consumer
    return {"tool_results": outputs, "reasked": reasked, "final": str(result.response.content)}


# -- pydantic-ai --------------------------------------------------------------------------------


def pydantic_agent(gate: eg.Gate, ledger: Path) -> Any:
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    from effectgate.integrations import pydantic_ai as eg_pa

    def answer(messages: Any, info: Any) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart("All done.")])
        return ModelResponse(parts=[ToolCallPart("refund", dict(ARGS), tool_call_id="call_1")])

    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return book(ledger, txn_id, amount_cents)

    toolset = eg_pa.EffectGateToolset(
        FunctionToolset([refund]), {"refund": {"key": "refund:{txn_id}", "cost_micros": cost}},
        gate=gate)
    return Agent(FunctionModel(answer), toolsets=[toolset], name="billing",
                 output_type=[str, DeferredToolRequests])


def pydantic_step(gate: eg.Gate, ledger: Path, state_file: Path, step: str,
                  answer: Any) -> dict[str, Any]:
    """``start``: run to the DeferredToolRequests and save the history and the request's
    metadata; ``resume``: run on from them with ``answer``: ``{}`` (approve), ``{"args":
    {...}}`` (``ToolApproved(override_args=...)``), ``{"history_args": {...}}`` (approve, the
    call's arguments changed in the saved history itself) or ``{"reject": {"by", "reason"}}``
    (``eg_pa.reject``, then ``ToolDenied``). A resume that pauses again returns the new pause
    under ``"paused"`` (in the saved form)."""
    from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolCallPart, ToolReturnPart

    from effectgate.integrations import pydantic_ai as eg_pa

    agent = pydantic_agent(gate, ledger)

    def pause(output: DeferredToolRequests, messages: bytes) -> dict[str, Any]:
        return {"history": messages.decode(), "metadata": output.metadata,
                "approvals": [p.tool_call_id for p in output.approvals]}

    if step == "start":
        result = agent.run_sync("refund T1")
        assert isinstance(result.output, DeferredToolRequests)
        saved = pause(result.output, result.all_messages_json())
        state_file.write_text(json.dumps(saved))
        return {"metadata": saved["metadata"], "approvals": saved["approvals"]}
    saved = json.loads(state_file.read_text())
    history = ModelMessagesTypeAdapter.validate_json(saved["history"])
    if answer.get("history_args") is not None:
        for message in history:
            for part in message.parts:
                if isinstance(part, ToolCallPart) and part.tool_call_id == "call_1":
                    part.args = dict(answer["history_args"])
    decision: Any = True
    if answer.get("args") is not None:
        decision = ToolApproved(override_args=answer["args"])
    if answer.get("reject") is not None:
        decision = eg_pa.reject(saved["metadata"]["call_1"], gate=gate, **answer["reject"])
    results = DeferredToolResults(approvals={"call_1": decision}, metadata=saved["metadata"])
    result = agent.run_sync(message_history=history, deferred_tool_results=results)
    returns = [str(p.content) for m in result.new_messages() for p in m.parts
               if isinstance(p, ToolReturnPart)]
    out: dict[str, Any] = {"tool_results": returns, "output": str(result.output)}
    if isinstance(result.output, DeferredToolRequests):
        out["paused"] = pause(result.output, result.all_messages_json())
    return out


def main(argv: list[str]) -> int:
    framework, url, namespace, ledger, state, step = argv[:6]
    answer = json.loads(argv[6]) if len(argv) > 6 else None
    form = os.environ.get("HITL_FORM", "tool")
    with make_gate(url, namespace) as gate:
        if framework == "langchain":
            out = langchain_step(gate, Path(ledger), Path(state), step, answer, form)
        elif framework == "openai_agents":
            out = asyncio.run(openai_step(gate, Path(ledger), Path(state), step, answer))
        elif framework == "pydantic_ai":
            out = pydantic_step(gate, Path(ledger), Path(state), step, answer)
        elif framework == "llama_index":
            out = asyncio.run(llama_step(gate, Path(ledger), Path(state), step, answer))
        else:
            raise SystemExit(f"unknown framework {framework!r}")
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
