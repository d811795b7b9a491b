"""One driver per framework for the adapter contract test: build the framework's own refund
tool, gate it, and run the framework's real agent loop offline with a scripted model.

A driver's ``run(tools, turns, run_id=...)`` plays ``turns`` (each a list of
``(call_id, arguments)``: the tool calls the model makes in that turn, then a final text turn)
and returns the tool results the model saw, as ``{call_id: text}``. Adding a framework is one
more class here. (The MCP driver also takes a call naming its tool, ``(call_id, arguments,
name)``; every call is to ``refund`` otherwise.)

No ``from __future__ import annotations``: LlamaIndex reads annotations at runtime.
"""

import asyncio
import dataclasses
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import effectgate as eg

Turns = list[list[tuple[str, dict[str, Any]]]]
SLOW_SECONDS = 0.3  # a body this slow overlaps its twin in the same turn


def refund_body(ledger: list[Any], behaviour: str) -> Callable[..., str]:
    """The side effect every framework's tool wraps: append to the ledger."""

    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        if behaviour == "slow":
            time.sleep(SLOW_SECONDS)
        if behaviour == "lost":
            raise TimeoutError("the reply was lost")
        return f"refunded {amount_cents} on {txn_id} (#{len(ledger)})"

    return refund


def send_mail(to: str) -> str:
    """Send an email."""
    return "sent"


class Driver:
    """What the contract test asks of a framework."""

    name = ""
    gated_form = "gate_tool"
    # Where a framework's gating legitimately differs, the contract asks it what to expect:
    coerces_arguments = True  # "500" for an integer is coerced (pydantic), not refused
    strict_refuses_at = "setup"  # strict: ConfigError when gating ("setup") or per call ("call")
    carries_ids = True  # the run id and agent name of the framework's loop reach the record
    # What the model is told of a body that raised TimeoutError, and of the call after it:
    unknown_says: tuple[str, ...] = ("OUTCOME UNKNOWN", "TimeoutError")
    blocked_says = "Do not call this tool again"
    conflict_says = "CONFLICT"  # a call under a key first used with another payload
    # A loop that makes one tool call per model turn plays a turn's calls one after another
    # (no twins); one that refuses an immediate repeat of the same call itself says this:
    one_call_per_turn = False
    repeat_says: str | None = None

    def available(self) -> bool:
        raise NotImplementedError

    def tool(self, fn: Callable[..., Any]) -> Any:
        raise NotImplementedError

    def gate_tool(self, tool: Any, key: str, gate: eg.Gate) -> Any:
        raise NotImplementedError

    def gate_tools(self, tools: list[Any], effects: Any, gate: eg.Gate,
                   strict: bool = False) -> list[Any]:
        raise NotImplementedError

    def definitions(self, tools: list[Any]) -> str:
        """The tool definitions the model is sent, as JSON text."""
        raise NotImplementedError

    def run(self, tools: list[Any], turns: Turns, *, run_id: str) -> dict[str, str]:
        raise NotImplementedError


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


class LangChain(Driver):
    name = "langchain"

    def available(self) -> bool:
        return _importable("langchain.agents") and _importable("langchain_core")

    def tool(self, fn: Callable[..., Any]) -> Any:
        from langchain_core.tools import tool

        return tool(fn)

    def gate_tool(self, tool: Any, key: str, gate: eg.Gate) -> Any:
        from effectgate.integrations.langchain import gate_tool

        return gate_tool(tool, key, gate=gate)

    def gate_tools(self, tools: list[Any], effects: Any, gate: eg.Gate,
                   strict: bool = False) -> list[Any]:
        from effectgate.integrations.langchain import gate_tools

        return gate_tools(tools, effects, gate=gate, strict=strict)

    def definitions(self, tools: list[Any]) -> str:
        from langchain_core.utils.function_calling import convert_to_openai_tool

        return json.dumps([convert_to_openai_tool(t) for t in tools])

    def run(self, tools: list[Any], turns: Turns, *, run_id: str) -> dict[str, str]:
        from langchain.agents import create_agent
        from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
        from langchain_core.messages import AIMessage, ToolMessage
        from langchain_core.utils.function_calling import convert_to_openai_tool

        class Scripted(FakeMessagesListChatModel):
            def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
                return self.bind(tools=[convert_to_openai_tool(t) for t in tools])

        responses = [AIMessage("", tool_calls=[
            {"name": "refund", "args": args, "id": call_id, "type": "tool_call"}
            for call_id, args in turn]) for turn in turns]
        agent = create_agent(Scripted(responses=[*responses, AIMessage("All done.")]),
                             tools=tools, name="billing")
        result = agent.invoke({"messages": [{"role": "user", "content": "refund T1"}]},
                              config={"configurable": {"thread_id": run_id}})
        return {m.tool_call_id: str(m.content) for m in result["messages"]
                if isinstance(m, ToolMessage)}


class OpenAIAgents(Driver):
    name = "openai_agents"

    def available(self) -> bool:
        return _importable("agents")

    def tool(self, fn: Callable[..., Any]) -> Any:
        from agents import function_tool

        return function_tool(fn)

    def gate_tool(self, tool: Any, key: str, gate: eg.Gate) -> Any:
        from effectgate.integrations.openai_agents import gate_tool

        return gate_tool(tool, key, gate=gate)

    def gate_tools(self, tools: list[Any], effects: Any, gate: eg.Gate,
                   strict: bool = False) -> list[Any]:
        from effectgate.integrations.openai_agents import gate_tools

        return gate_tools(tools, effects, gate=gate, strict=strict)

    def definitions(self, tools: list[Any]) -> str:
        from agents.models.chatcmpl_converter import Converter

        return json.dumps([Converter.tool_to_openai(t) for t in tools])

    def run(self, tools: list[Any], turns: Turns, *, run_id: str) -> dict[str, str]:
        from agents import Agent, RunConfig, Runner, set_tracing_disabled
        from agents.items import ToolCallOutputItem
        from agents.testing import ScriptedModel, assistant_message, function_call

        set_tracing_disabled(True)
        model = ScriptedModel([
            *([function_call("refund", args, call_id=call_id) for call_id, args in turn]
              for turn in turns),
            [assistant_message("All done.")]])
        agent = Agent(name="billing", model=model, tools=tools)
        result = Runner.run_sync(agent, "refund T1", run_config=RunConfig(group_id=run_id))
        out = {}
        for item in result.new_items:
            if isinstance(item, ToolCallOutputItem):
                raw = item.raw_item
                call_id = raw["call_id"] if isinstance(raw, dict) else raw.call_id
                out[call_id] = str(item.output)
        return out


class LlamaIndex(Driver):
    name = "llama_index"

    def available(self) -> bool:
        return _importable("llama_index.core")

    def tool(self, fn: Callable[..., Any]) -> Any:
        from llama_index.core.tools import FunctionTool

        return FunctionTool.from_defaults(fn=fn)

    def gate_tool(self, tool: Any, key: str, gate: eg.Gate) -> Any:
        from effectgate.integrations.llama_index import gate_tool

        return gate_tool(tool, key, gate=gate)

    def gate_tools(self, tools: list[Any], effects: Any, gate: eg.Gate,
                   strict: bool = False) -> list[Any]:
        from effectgate.integrations.llama_index import gate_tools

        return gate_tools(tools, effects, gate=gate, strict=strict)

    def definitions(self, tools: list[Any]) -> str:
        return json.dumps([t.metadata.to_openai_tool() for t in tools])

    def run(self, tools: list[Any], turns: Turns, *, run_id: str) -> dict[str, str]:
        from llama_index.core.agent.workflow import ToolCallResult
        from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
        from llama_index.core.llms.mock import MockFunctionCallingLLM

        from effectgate.integrations.llama_index import EffectGateFunctionAgent

        script = iter([
            *(ChatMessage(role=MessageRole.ASSISTANT, blocks=[
                ToolCallBlock(tool_call_id=call_id, tool_name="refund", tool_kwargs=dict(args))
                for call_id, args in turn]) for turn in turns),
            ChatMessage(role=MessageRole.ASSISTANT, content="All done.")])
        llm = MockFunctionCallingLLM(response_generator=lambda messages, **kw: next(script))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            agent = EffectGateFunctionAgent(name="billing", tools=tools, llm=llm)

        # LlamaIndex's runtime keeps every run id it has seen in this process (a run that raised
        # keeps its queue), and refuses one again: a repeated id gets a suffix, once per use.
        seen = _LLAMA_RUN_IDS.setdefault(run_id, 0)
        _LLAMA_RUN_IDS[run_id] = seen + 1
        unique = run_id if not seen else f"{run_id}.{seen}"

        async def go() -> dict[str, str]:
            handler = agent.run(user_msg="refund T1", run_id=unique)
            out = {ev.tool_id: str(ev.tool_output.content) async for ev in handler.stream_events()
                   if isinstance(ev, ToolCallResult)}
            await handler
            return out

        return asyncio.run(go())


_LLAMA_RUN_IDS: dict[str, int] = {}


class PydanticAI(Driver):
    name = "pydantic_ai"
    gated_form = "EffectGateToolset"

    def available(self) -> bool:
        return _importable("pydantic_ai")

    def tool(self, fn: Callable[..., Any]) -> Any:
        from pydantic_ai import Tool

        return Tool(fn)

    def gate_tool(self, tool: Any, key: str, gate: eg.Gate) -> Any:
        from effectgate.integrations.pydantic_ai import gate_tool

        return gate_tool(tool, key, gate=gate)

    def gate_tools(self, tools: list[Any], effects: Any, gate: eg.Gate,
                   strict: bool = False) -> list[Any]:
        from pydantic_ai.toolsets import FunctionToolset

        from effectgate.integrations.pydantic_ai import EffectGateToolset

        return [EffectGateToolset(FunctionToolset(tools), effects, gate=gate, strict=strict)]

    def _agent(self, tools: list[Any], model: Any) -> Any:
        """An agent with ``tools``: toolsets as they are, plain tools in one FunctionToolset
        (so a gated toolset and the plain tools it wraps are wired alike)."""
        from pydantic_ai import Agent
        from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

        sets = [t for t in tools if isinstance(t, AbstractToolset)]
        plain = [t for t in tools if not isinstance(t, AbstractToolset)]
        if plain:
            sets.append(FunctionToolset(plain))
        return Agent(model, name="billing", toolsets=sets)

    def definitions(self, tools: list[Any]) -> str:
        from pydantic_ai.messages import ModelResponse, TextPart
        from pydantic_ai.models.function import FunctionModel

        seen: list[Any] = []

        def model(messages: Any, info: Any) -> Any:
            seen.append([dataclasses.asdict(t) for t in info.function_tools])
            return ModelResponse(parts=[TextPart("nothing to do")])

        self._agent(tools, FunctionModel(model)).run_sync("hello")
        return json.dumps(seen, default=str)

    def run(self, tools: list[Any], turns: Turns, *, run_id: str) -> dict[str, str]:
        from pydantic_ai.messages import (
            ModelResponse,
            RetryPromptPart,
            TextPart,
            ToolCallPart,
            ToolReturnPart,
        )
        from pydantic_ai.models.function import FunctionModel

        script = iter([*turns, None])
        out: dict[str, str] = {}

        def model(messages: Any, info: Any) -> Any:
            for part in messages[-1].parts:
                if isinstance(part, (ToolReturnPart, RetryPromptPart)):
                    out[part.tool_call_id] = str(part.content)
            turn = next(script)
            if turn is None:
                return ModelResponse(parts=[TextPart("All done.")])
            return ModelResponse(parts=[ToolCallPart("refund", dict(args), tool_call_id=call_id)
                                        for call_id, args in turn])

        self._agent(tools, FunctionModel(model)).run_sync("refund T1", run_id=run_id)
        return out


class GoogleAdk(Driver):
    """ADK's real ``Runner`` loop (``InMemoryRunner``) driven by a scripted ``BaseLlm``; each
    run is one session whose id is the run id."""

    name = "google_adk"

    def available(self) -> bool:
        return _importable("google.adk")

    def tool(self, fn: Callable[..., Any]) -> Any:
        from google.adk.tools import FunctionTool

        return FunctionTool(fn)

    def gate_tool(self, tool: Any, key: str, gate: eg.Gate) -> Any:
        from effectgate.integrations.google_adk import gate_tool

        return gate_tool(tool, key, gate=gate)

    def gate_tools(self, tools: list[Any], effects: Any, gate: eg.Gate,
                   strict: bool = False) -> list[Any]:
        from effectgate.integrations.google_adk import gate_tools

        return gate_tools(tools, effects, gate=gate, strict=strict)

    def definitions(self, tools: list[Any]) -> str:
        return json.dumps([t._get_declaration().model_dump(mode="json", exclude_none=True)
                           for t in tools])

    def run(self, tools: list[Any], turns: Turns, *, run_id: str) -> dict[str, str]:
        return asyncio.run(adk_run(tools, [[(c, a, "refund") for c, a, *_ in turn]
                                           for turn in turns], run_id=run_id))


def adk_model(turns: list[list[tuple[str, dict[str, Any], str]]]) -> Any:
    """A scripted ADK model: each turn's function calls, then "All done."."""
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    class Scripted(BaseLlm):
        model: str = "scripted"
        script: list[Any] = []  # noqa: RUF012 - a pydantic field (copied per instance)

        async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
            if self.script:
                parts = [types.Part(function_call=types.FunctionCall(id=c, name=n, args=a))
                         for c, a, n in self.script.pop(0)]
            else:
                parts = [types.Part(text="All done.")]
            yield LlmResponse(content=types.Content(role="model", parts=parts))

    return Scripted(script=[list(t) for t in turns])


def adk_text(response: Any) -> str:
    """A function response as the text the model reads."""
    if isinstance(response, dict) and set(response) == {"result"}:
        return str(response["result"])
    if isinstance(response, dict) and set(response) == {"error"}:
        return str(response["error"])
    return json.dumps(response, default=str)


async def adk_run(tools: list[Any], turns: list[list[tuple[str, dict[str, Any], str]]], *,
                  run_id: str) -> dict[str, str]:
    from google.adk.agents import LlmAgent
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    agent = LlmAgent(name="billing", model=adk_model(turns), tools=tools)
    runner = InMemoryRunner(agent=agent, app_name="contract")
    await runner.session_service.create_session(app_name="contract", user_id="u",
                                                session_id=run_id)
    out: dict[str, str] = {}
    message = types.Content(role="user", parts=[types.Part(text="refund T1")])
    async for event in runner.run_async(user_id="u", session_id=run_id, new_message=message):
        for response in event.get_function_responses():
            out[str(response.id)] = adk_text(response.response)
    await runner.close()
    return out


class AgentFramework(Driver):
    """Microsoft Agent Framework's real ``Agent`` loop (its function-invocation layer) over a
    scripted chat client. Its gated form is middleware, not a wrapped tool: ``gate_tools`` and
    ``gate_tool`` give the tools as they are plus an ``EffectGateMiddleware``, which ``run``
    installs on the agent."""

    name = "agent_framework"
    gated_form = "EffectGateMiddleware"

    def available(self) -> bool:
        return _importable("agent_framework")

    def tool(self, fn: Callable[..., Any]) -> Any:
        from agent_framework import tool

        return tool(fn)

    def gate_tool(self, tool: Any, key: str, gate: eg.Gate) -> Any:
        from effectgate.integrations.agent_framework import EffectGateMiddleware

        return [tool, EffectGateMiddleware({tool.name: key}, gate=gate)]

    def gate_tools(self, tools: list[Any], effects: Any, gate: eg.Gate,
                   strict: bool = False) -> list[Any]:
        from effectgate.integrations.agent_framework import EffectGateMiddleware

        return [*tools, EffectGateMiddleware(effects, gate=gate, strict=strict)]

    @staticmethod
    def split(items: list[Any]) -> tuple[list[Any], list[Any]]:
        """(tools, middleware) of a gated form."""
        from effectgate.integrations.agent_framework import EffectGateMiddleware

        flat: list[Any] = []
        for item in items:
            flat.extend(item if isinstance(item, list) else [item])
        return ([t for t in flat if not isinstance(t, EffectGateMiddleware)],
                [t for t in flat if isinstance(t, EffectGateMiddleware)])

    def definitions(self, tools: list[Any]) -> str:
        return json.dumps([t.to_json_schema_spec() for t in self.split(tools)[0]])

    def run(self, tools: list[Any], turns: Turns, *, run_id: str) -> dict[str, str]:
        from agent_framework import Agent

        plain, middleware = self.split(tools)
        agent = Agent(client=af_client([[(c, a) for c, a, *_ in t] for t in turns]),
                      name="billing", tools=plain, middleware=middleware)

        async def go() -> dict[str, str]:
            response = await agent.run("refund T1", session=agent.create_session(
                session_id=run_id))
            return af_results(response.messages)

        return asyncio.run(go())


def af_client(turns: list[list[tuple[str, Any]]]) -> Any:
    """A scripted Agent Framework chat client: each turn's function calls (until the last
    message is a tool result the script has no turn for), then "All done.". A call's
    arguments: a mapping, or the model's raw JSON text as it is."""
    from agent_framework import (
        BaseChatClient,
        ChatResponse,
        Content,
        FunctionInvocationLayer,
        Message,
    )

    class Scripted(FunctionInvocationLayer, BaseChatClient):  # type: ignore[misc]
        def __init__(self, script: list[Any]) -> None:
            super().__init__()
            self.script = script

        async def _answer(self) -> Any:
            if self.script:
                calls = [Content.from_function_call(call_id=c, name="refund",
                                                    arguments=a if isinstance(a, str)
                                                    else json.dumps(a))
                         for c, a in self.script.pop(0)]
                return ChatResponse(messages=[Message(role="assistant", contents=calls)])
            return ChatResponse(messages=[Message(role="assistant", contents=["All done."])])

        def _inner_get_response(self, *, messages: Any, stream: bool, options: Any,
                                **kwargs: Any) -> Any:
            return self._answer()

    return Scripted([list(t) for t in turns])


def af_results(messages: Any) -> dict[str, str]:
    """{call_id: the text the model read} of the function results among ``messages``."""
    out: dict[str, str] = {}
    for message in messages:
        for content in message.contents:
            if content.type == "function_result":
                result = content.result
                out[str(content.call_id)] = result if isinstance(result, str) else "".join(
                    str(getattr(i, "text", "") or "") for i in content.items or ())
    return out


class CrewAI(Driver):
    """CrewAI's real crew loop (``Crew.kickoff``: the agent executor's ReAct loop and its
    ``ToolUsage``) driven by a scripted ``BaseLLM`` that answers in CrewAI's own text format.

    Where it differs (and the contract asks): the loop makes one tool call per model turn, so
    a turn's calls are played one after another and there are no twins; CrewAI refuses an
    immediate repeat of the same tool and input itself, before the tool is called; a CrewAI
    tool is called with its arguments only, so no run id or agent name reaches the record
    (``eg.effect_context`` around the kickoff would give them)."""

    name = "crewai"
    one_call_per_turn = True
    repeat_says = "I tried reusing the same input"
    carries_ids = False

    def available(self) -> bool:
        crewai_env()
        return _importable("crewai")

    def tool(self, fn: Callable[..., Any]) -> Any:
        from crewai.tools import tool

        return tool(fn.__name__)(fn)

    def gate_tool(self, tool: Any, key: str, gate: eg.Gate) -> Any:
        from effectgate.integrations.crewai import gate_tool

        return gate_tool(tool, key, gate=gate)

    def gate_tools(self, tools: list[Any], effects: Any, gate: eg.Gate,
                   strict: bool = False) -> list[Any]:
        from effectgate.integrations.crewai import gate_tools

        return gate_tools(tools, effects, gate=gate, strict=strict)

    def definitions(self, tools: list[Any]) -> str:
        from crewai.utilities.agent_utils import render_text_description_and_args

        return json.dumps([render_text_description_and_args(tools), [t.name for t in tools],
                           [t.args_schema.model_json_schema() for t in tools]])

    def run(self, tools: list[Any], turns: Turns, *, run_id: str) -> dict[str, str]:
        calls = [(c, a, *named) for turn in turns for c, a, *named in turn]
        return crew_run(tools, [(c, named[0] if named else "refund", a)
                                for c, a, *named in calls])


def crewai_env() -> None:
    """CrewAI offline and silent: no telemetry, no tracing, no first-run prompt (as
    tests/conftest.py sets for the whole run; here for a process that did not load it)."""
    import os

    for name, value in (("CREWAI_DISABLE_TELEMETRY", "true"), ("CREWAI_TRACING_ENABLED", "false"),
                        ("CREWAI_TESTING", "true")):
        os.environ.setdefault(name, value)


def crew_llm(calls: list[tuple[str, str, dict[str, Any]]], seen: dict[str, str]) -> Any:
    """A scripted CrewAI model: one action per turn, then a final answer; what each action
    observed is recorded in ``seen`` by call id."""
    from crewai.llms.base_llm import BaseLLM

    class Scripted(BaseLLM):
        def __init__(self) -> None:
            super().__init__(model="scripted")
            self.script = list(calls)
            self.last: str | None = None

        def call(self, messages: Any, tools: Any = None, callbacks: Any = None,
                 available_functions: Any = None, **kwargs: Any) -> str:
            if self.last is not None:
                said = str(messages[-1]["content"])
                seen[self.last] = said.rsplit("\nObservation: ", 1)[-1]
                self.last = None
            if self.script:
                call_id, name, args = self.script.pop(0)
                self.last = call_id
                return (f"Thought: I must call {name}.\nAction: {name}\n"
                        f"Action Input: {json.dumps(args)}")
            return "Thought: I am done.\nFinal Answer: All done."

        def supports_function_calling(self) -> bool:
            return False

    return Scripted()


def crew_run(tools: list[Any], calls: list[tuple[str, str, dict[str, Any]]]) -> dict[str, str]:
    """Kick off a one-agent, one-task crew whose model makes ``calls``; {call_id: observed}."""
    crewai_env()
    from crewai import Agent, Crew, Task

    seen: dict[str, str] = {}
    agent = Agent(role="billing", goal="Refund what is asked", backstory="A billing clerk.",
                  llm=crew_llm(calls, seen), tools=tools, verbose=False)
    task = Task(description="refund T1", expected_output="done", agent=agent)
    Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
    return seen


class _Gated:
    """The MCP driver's gated form: what an ``effectgate mcp gateway`` is started with."""

    def __init__(self, tools: list[Any], effects: Any, gate: eg.Gate, strict: bool) -> None:
        from effectgate.integrations.mcp.gateway import tool_specs

        names = {t.__name__ for t in tools}
        effects = dict(effects)
        # The contract's ``None`` (declared read-only) is, for the gateway, the policy's
        # ``read_only`` for this upstream; a template is a ``key`` of effect type = tool name.
        self.read_only = tuple(n for n, e in effects.items() if e is None)
        self.tools = tools
        self.gate = gate
        self.strict = strict
        self.specs = tool_specs(gate, {n: {"key": e, "effect_type": n} if isinstance(e, str) else e
                                       for n, e in effects.items() if e is not None})
        unknown = sorted(set(self.specs) - names)
        if unknown:
            raise eg.ConfigError(f"no upstream tool named {unknown[0]!r}")


class McpGateway(Driver):
    """The effectgate MCP gateway (``integrations/mcp/gateway.py``) in front of an upstream
    MCP server (the mcp package's ``MCPServer``, its tools the contract's functions), both in
    this process over the mcp package's in-memory transport, driven by the mcp package's own
    ``Client`` as a model's host would: ``tools/list``, then each turn's calls at once.

    Where it differs from a framework adapter (and the contract asks):

    * arguments are validated against the tool's JSON schema before anything is sent, so
      ``"500"`` for an integer is refused (``InvalidArguments``, nothing ran) rather than
      coerced: the gateway cannot know how a given upstream would coerce it;
    * a body that raises is the upstream's tool error (``isError``), passed on with the
      gateway's note (AMBIGUOUS; the gateway voice of ``_kernel/vocabulary.py``, not the tool
      texts); ``MCPServer`` reports only "Error executing tool refund", not the exception;
    * ``strict`` does not refuse to start: an ungated write is listed on stderr and each call
      of it is refused (``UngatedTool``);
    * an MCP call carries no run id and the gateway records none; the client's name
      (``clientInfo``, here ``billing``) is not taken as an agent id either: the record has
      neither (over HTTP the authenticated principal is checked, not recorded).
    """

    name = "mcp_gateway"
    gated_form = "Gateway"
    coerces_arguments = False
    strict_refuses_at = "call"
    carries_ids = False
    unknown_says = ("outcome is unknown", "AMBIGUOUS", "Error executing tool refund")
    blocked_says = "Do NOT call this tool again"
    conflict_says = '"error": "PayloadMismatch"'

    def available(self) -> bool:
        return _importable("mcp.server.mcpserver") and _importable(
            "effectgate.integrations.mcp.gateway")

    def tool(self, fn: Callable[..., Any]) -> Any:
        return fn  # an upstream tool: served by the MCPServer each run builds

    def gate_tool(self, tool: Any, key: str, gate: eg.Gate) -> Any:
        return _Gated([tool], {tool.__name__: key}, gate, strict=False)

    def gate_tools(self, tools: list[Any], effects: Any, gate: eg.Gate,
                   strict: bool = False) -> list[Any]:
        return [_Gated(tools, effects, gate, strict)]

    def definitions(self, tools: list[Any]) -> str:
        async def listed(client: Any) -> str:
            page = await client.list_tools()
            return json.dumps([t.model_dump(mode="json", by_alias=True, exclude_none=True)
                               for t in page.tools])

        return self._session(tools, listed)

    def run(self, tools: list[Any], turns: Turns, *, run_id: str) -> dict[str, str]:
        import anyio
        from mcp import types

        async def play(client: Any) -> dict[str, str]:
            await client.list_tools()
            out: dict[str, str] = {}

            async def call(call_id: str, args: dict[str, Any], name: str) -> None:
                result = await client.call_tool(name, dict(args))
                out[call_id] = "\n".join(c.text for c in result.content
                                         if isinstance(c, types.TextContent))

            for turn in turns:
                async with anyio.create_task_group() as tg:
                    for call_id, args, *named in turn:
                        tg.start_soon(call, call_id, args, named[0] if named else "refund")
            return out

        return self._session(tools, play)

    def _session(self, tools: list[Any], use: Callable[[Any], Any]) -> Any:
        """``await use(client)`` with a client session on the gateway (a gated form) or on the
        upstream directly (plain tools)."""
        import io

        import anyio
        from mcp import Client, types
        from mcp.client._memory import InMemoryTransport
        from mcp.server.mcpserver import MCPServer

        from effectgate.integrations.mcp.gateway import Gateway
        from effectgate.integrations.mcp.upstream import Upstream

        gated = next((t for t in tools if isinstance(t, _Gated)), None)
        upstream = MCPServer("billing-upstream")
        for fn in gated.tools if gated is not None else tools:
            upstream.add_tool(fn)

        class InProcess(Upstream):
            """The upstream over the in-memory transport (instead of a command's stdio)."""

            def _transport(self) -> Any:
                return InMemoryTransport(upstream)

        def factory(caps: types.ClientCapabilities, peer: Any) -> Upstream:
            return InProcess("in-memory", capabilities=caps, peer=peer)

        me = types.Implementation(name="billing", version="1")

        async def go() -> Any:
            if gated is None:
                async with Client(upstream, mode="legacy", client_info=me) as client:
                    return await use(client)
            rule = eg.UpstreamRule(name="billing-upstream", read_only=gated.read_only)
            gw = Gateway(gated.gate, factory, gated.specs, strict=gated.strict, rule=rule,
                         out=io.StringIO())
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    await gw.start(tg)
                    try:
                        async with Client(gw.server(), mode="legacy", client_info=me) as client:
                            return await use(client)
                    finally:
                        await gw.aclose()
                        tg.cancel_scope.cancel()

        return anyio.run(go)


DRIVERS = [LangChain(), OpenAIAgents(), LlamaIndex(), PydanticAI(), McpGateway(), GoogleAdk(),
           AgentFramework(), CrewAI()]
