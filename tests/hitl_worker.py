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


def scripted_model(wanted: dict[str, Any]) -> Any:
    """A LangChain chat model that asks for the refund with ``wanted``, then (once it sees a
    tool result) answers."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class Scripted(BaseChatModel):
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

    return Scripted()


def langchain_agent(gate: eg.Gate, ledger: Path, checkpointer: Any, form: str = "tool",
                    args: dict[str, Any] | None = None) -> Any:
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from effectgate.integrations import langchain as eg_lc

    model = scripted_model(dict(args or ARGS))

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return book(ledger, txn_id, amount_cents)

    if form == "tool":
        gated = eg_lc.gate_tool(refund, "refund:{txn_id}", gate=gate, cost_micros=cost)
        return create_agent(model, tools=[gated], checkpointer=checkpointer,
                            name="billing")
    middleware = eg_lc.EffectGateMiddleware(
        {"refund": {"key": "refund:{txn_id}", "cost_micros": cost}}, gate=gate)
    return create_agent(model, tools=[refund], middleware=[middleware],
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
SETTLE_SECONDS = 10.0  # how long the resume waits for one answer's effect before the next
# (it goes on as soon as the answer shows)
FINISH_SECONDS = (15.0, 25.0)  # how long the resume waits for the run to finish, before and
# after it sends every answer a second time


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
    answers = []
    for one in answer.get("events", [answer]):
        fields = dict(one)
        pause = saved["events"][fields.pop("for", 0)]
        fields.setdefault("approval_id", pause["approval_id"])
        answers.append(fields)
    for n, fields in enumerate(answers):
        progress.clear()
        handler.ctx.send_event(HumanResponseEvent(**fields))
        if n < len(answers) - 1:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(progress.wait(), timeout=SETTLE_SECONDS)
    try:
        result = await asyncio.wait_for(asyncio.shield(handler), timeout=FINISH_SECONDS[0])
    except TimeoutError:
        # llama-index-workflows can drop an answer that arrives while the restored run
        # re-registers its waiters (Context.from_dict keeps no filters, and a re-registered
        # waiter replaces one the answer had just resolved): the run then waits for ever.
        # A client that sees no end sends its answers again, as a person would click again;
        # the adapter takes a second delivery as the same answer (never a second effect).
        print(f"resume: no end after {FINISH_SECONDS[0]} s; answers sent again "
              f"(tool results so far: {outputs}, asked again: {reasked})", file=sys.stderr)
        for fields in answers:
            handler.ctx.send_event(HumanResponseEvent(**fields))
        result = await asyncio.wait_for(handler, timeout=FINISH_SECONDS[1])
    await consumer
    return {"tool_results": outputs, "reasked": reasked, "final": str(result.response.content)}


# -- pydantic-ai --------------------------------------------------------------------------------


def pydantic_agent(gate: eg.Gate, ledger: Path, args: dict[str, Any] | None = None) -> Any:
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    from effectgate.integrations import pydantic_ai as eg_pa

    def answer(messages: Any, info: Any) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart("All done.")])
        return ModelResponse(parts=[ToolCallPart("refund", dict(args or ARGS),
                                                 tool_call_id="call_1")])

    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return book(ledger, txn_id, amount_cents)

    toolset = eg_pa.EffectGateToolset(
        FunctionToolset([refund]), {"refund": {"key": "refund:{txn_id}", "cost_micros": cost}},
        gate=gate)
    return Agent(FunctionModel(answer), toolsets=[toolset], name="billing",
                 output_type=[str, DeferredToolRequests])


def pydantic_step(gate: eg.Gate, ledger: Path, state_file: Path, step: str,
                  answer: Any, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """``start``: run to the DeferredToolRequests and save the history and the request's
    metadata; ``resume``: run on from them with ``answer``: ``{}`` (approve), ``{"args":
    {...}}`` (``ToolApproved(override_args=...)``), ``{"history_args": {...}}`` (approve, the
    call's arguments changed in the saved history itself) or ``{"reject": {"by", "reason"}}``
    (``eg_pa.reject``, then ``ToolDenied``). A resume that pauses again returns the new pause
    under ``"paused"`` (in the saved form)."""
    from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolCallPart, ToolReturnPart

    from effectgate.integrations import pydantic_ai as eg_pa

    agent = pydantic_agent(gate, ledger, args)

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


# -- Google ADK ----------------------------------------------------------------------------------


def adk_agent(gate: eg.Gate, ledger: Path, args: dict[str, Any] | None = None, *,
              require_confirmation: bool = False) -> Any:
    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.adk.tools import FunctionTool
    from google.genai import types

    from effectgate.integrations import google_adk as eg_adk

    wanted = dict(args or ARGS)

    class Scripted(BaseLlm):
        """Asks for the refund, then (once it sees a tool result) answers."""

        model: str = "scripted"

        async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
            last = llm_request.contents[-1] if llm_request.contents else None
            if last is not None and any(p.function_response for p in last.parts or ()):
                part = types.Part(text="All done.")
            else:
                part = types.Part(function_call=types.FunctionCall(id="call_1", name="refund",
                                                                   args=wanted))
            yield LlmResponse(content=types.Content(role="model", parts=[part]))

    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return book(ledger, txn_id, amount_cents)

    gated = eg_adk.gate_tool(FunctionTool(refund, require_confirmation=require_confirmation),
                             "refund:{txn_id}", gate=gate, cost_micros=cost)
    return LlmAgent(name="billing", model=Scripted(), tools=[gated])


async def adk_step(gate: eg.Gate, ledger: Path, state_file: Path, step: str,
                   answer: Any) -> dict[str, Any]:
    """``start``: run to ADK's confirmation request on a session kept in an SQLite file;
    ``resume``: answer it (``answer["confirmed"]``, optional ``answer["payload"]``) in a new
    ``run_async`` on the same session."""
    from google.adk.runners import Runner
    from google.adk.sessions import DatabaseSessionService
    from google.genai import types

    service = DatabaseSessionService(f"sqlite+aiosqlite:///{state_file}")
    runner = Runner(agent=adk_agent(gate, ledger), app_name="hitl", session_service=service)
    if step == "start":
        await service.create_session(app_name="hitl", user_id="u", session_id=THREAD)
        message = types.Content(role="user", parts=[types.Part(text="refund T1")])
    else:
        session = await service.get_session(app_name="hitl", user_id="u", session_id=THREAD)
        assert session is not None
        [request] = [fc for ev in session.events for fc in ev.get_function_calls()
                     if fc.name == "adk_request_confirmation"][-1:]
        response: dict[str, Any] = {"confirmed": bool(answer.get("confirmed"))}
        if "payload" in answer:
            response["payload"] = answer["payload"]
        message = types.Content(role="user", parts=[types.Part(
            function_response=types.FunctionResponse(id=request.id, name=request.name,
                                                     response=response))])
    requests: list[Any] = []
    results: list[Any] = []
    texts: list[str] = []
    async for event in runner.run_async(user_id="u", session_id=THREAD, new_message=message):
        for fc in event.get_function_calls():
            if fc.name == "adk_request_confirmation":
                requests.append(fc.args)
        for fr in event.get_function_responses():
            results.append(fr.response)
        texts += [p.text for p in (event.content.parts if event.content else ()) or ()
                  if p.text]
    await runner.close()
    await service.close()  # the runner flushes its session service, and leaves it open
    return {"requests": requests, "tool_results": results, "texts": texts}


# -- Microsoft Agent Framework ------------------------------------------------------------------


def af_agent(gate: eg.Gate, ledger: Path, step: str) -> tuple[Any, Any]:
    """(the agent, its EffectGateMiddleware)."""
    from agent_framework import Agent, tool

    from effectgate.integrations import agent_framework as eg_af

    from .adapter_drivers import af_client

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return book(ledger, txn_id, amount_cents)

    middleware = eg_af.EffectGateMiddleware(
        {"refund": {"key": "refund:{txn_id}", "cost_micros": cost}}, gate=gate)
    client = af_client([[("call_1", ARGS)]] if step == "start" else [])
    return Agent(client=client, name="billing", tools=[refund],
                 middleware=[middleware]), middleware


async def af_step(gate: eg.Gate, ledger: Path, state_file: Path, step: str,
                  answer: Any) -> dict[str, Any]:
    """``start``: run to the function approval request and save the session (and the
    request); ``resume``: restore the session and answer (``answer["decision"]``: approve /
    reject through the middleware's helpers, bare / bare_reject through the framework alone)."""
    from agent_framework import AgentSession, Content, Message

    from .adapter_drivers import af_results

    agent, middleware = af_agent(gate, ledger, step)
    if step == "start":
        session = agent.create_session(session_id=THREAD)
        response = await agent.run("refund T1", session=session)
        requests = [r.to_dict() for r in response.user_input_requests]
        state_file.write_text(json.dumps({"session": session.to_dict(), "requests": requests}))
        return {"requests": requests, "text": response.text}
    saved = json.loads(state_file.read_text())
    session = AgentSession.from_dict(saved["session"])
    [request] = [Content.from_dict(r) for r in saved["requests"]]
    if answer.get("forge"):
        request.additional_properties["effectgate"].update(answer["forge"])
    by = answer.get("by", "agent-framework-resume")
    decision = answer["decision"]
    if decision == "approve":
        reply = middleware.approve(request, by=by)
    elif decision == "reject":
        reply = middleware.reject(request, by=by, reason=answer.get("reason"))
    else:
        reply = request.to_function_approval_response(decision == "bare")
    response = await agent.run(Message(role="user", contents=[reply]), session=session)
    return {"tool_results": list(af_results(response.messages).values()),
            "requests": [r.to_dict() for r in response.user_input_requests],
            "text": response.text}


# -- CrewAI -------------------------------------------------------------------------------------


def crew_step(gate: eg.Gate, ledger: Path, state_file: Path, step: str,
              answer: Any) -> dict[str, Any]:
    """Every step is a kickoff whose model asks for the refund: CrewAI cannot pause a run, so
    the approval lives in the store alone, and the next kickoff executes it."""
    from .adapter_drivers import crew_run, crewai_env

    crewai_env()
    from crewai.tools import tool

    from effectgate.integrations import crewai as eg_crew

    @tool("refund")
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return book(ledger, txn_id, amount_cents)

    gated = eg_crew.gate_tool(refund, "refund:{txn_id}", gate=gate, cost_micros=cost)
    seen = crew_run([gated], [("call_1", "refund", dict(ARGS))])
    return {"tool_results": list(seen.values())}


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
        elif framework == "google_adk":
            out = asyncio.run(adk_step(gate, Path(ledger), Path(state), step, answer))
        elif framework == "agent_framework":
            out = asyncio.run(af_step(gate, Path(ledger), Path(state), step, answer))
        elif framework == "crewai":
            out = crew_step(gate, Path(ledger), Path(state), step, answer)
        elif framework == "llama_index":
            out = asyncio.run(llama_step(gate, Path(ledger), Path(state), step, answer))
        else:
            raise SystemExit(f"unknown framework {framework!r}")
    print(json.dumps(out, default=str), flush=True)
    if framework == "crewai":
        # CrewAI's event threads hold interpreter shutdown for seconds; the gate is closed and
        # the answer printed, so nothing is left to flush.
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
