"""One driver per framework for the adapter contract test: build the framework's own refund
tool, gate it, and run the framework's real agent loop offline with a scripted model.

A driver's ``run(tools, turns, run_id=...)`` plays ``turns`` (each a list of
``(call_id, arguments)``: the tool calls the model makes in that turn, then a final text turn)
and returns the tool results the model saw, as ``{call_id: text}``. Adding a framework (the MCP
gateway next) is one more class here.

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

        async def go() -> dict[str, str]:
            handler = agent.run(user_msg="refund T1", run_id=run_id)
            out = {ev.tool_id: str(ev.tool_output.content) async for ev in handler.stream_events()
                   if isinstance(ev, ToolCallResult)}
            await handler
            return out

        return asyncio.run(go())


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


DRIVERS = [LangChain(), OpenAIAgents(), LlamaIndex(), PydanticAI()]
