"""The demo's agent as a real LangChain loop: ``langchain.agents.create_agent`` with a scripted
chat model (offline). With the gate, its tools are wrapped with
:func:`effectgate.integrations.langchain.gate_tool` and the model is told exactly what that
adapter tells any model; without it, the same tools run raw. Imported only when the
``langchain`` extra is installed."""

from __future__ import annotations

import itertools
import json
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from ..gate import Gate
from ..integrations.langchain import gate_tool
from .agents import KEYS, Answer, bodies, brief, effect_options, register_undo
from .vendor import FakeVendor

__all__ = ["LangChainAgent", "ScriptedModel"]


class ScriptedModel(FakeMessagesListChatModel):
    """A chat model that answers from a script and accepts tools (as a real one would)."""

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def _tools(vendor: FakeVendor, gate: Gate | None) -> list[BaseTool]:
    raw = bodies(vendor, gated=gate is not None)
    tools: list[BaseTool] = [StructuredTool.from_function(fn, name=name)
                             for name, fn in raw.items()]
    if gate is None:
        return tools
    register_undo(gate, vendor)
    return [gate_tool(t, KEYS[t.name], gate=gate, **effect_options(t.name)) for t in tools]


class LangChainAgent:
    """Each tool call is one run of a ``create_agent`` loop: the scripted model asks for the
    tool, the tool (gated or not) answers, the model finishes. What the model is told comes
    back whole."""

    name = "LangChain create_agent (scripted model)"

    def __init__(self, vendor: FakeVendor, gate: Gate | None) -> None:
        self.vendor = vendor
        self.gate = gate
        self.tools = _tools(vendor, gate)
        self._ids = itertools.count(1)

    def call(self, tool_name: str, args: dict[str, Any]) -> Answer:
        """Run the loop for one tool call; return what the model is told."""
        call_id = f"call_{next(self._ids)}"
        model = ScriptedModel(responses=[
            AIMessage("", tool_calls=[{"name": tool_name, "args": args, "id": call_id,
                                       "type": "tool_call"}]),
            AIMessage("Done."),
        ])
        agent = create_agent(model=model, tools=self.tools, name="support-agent")
        before = len(self.vendor.calls)
        gated = self.gate is not None
        try:
            state = agent.invoke({"messages": [{"role": "user", "content": "handle the ticket"}]},
                                 config={"configurable": {"thread_id": "demo-run"}})
        except Exception as err:  # without the gate a tool's exception ends the run
            return Answer(None, f"{type(err).__name__}: {err}", ok=False, raised=True)
        message = next(m for m in state["messages"]
                       if isinstance(m, ToolMessage) and m.tool_call_id == call_id)
        content = message.content if isinstance(message.content, str) else json.dumps(
            message.content)
        reached = len(self.vendor.calls) > before
        if message.status == "error":
            decision = None
            if gated:
                decision = "execute" if reached else _decision(content)
            return Answer(decision, content, ok=False)
        decision = ("execute" if reached else "duplicate") if gated else None
        return Answer(decision, brief(content), ok=True)


def _decision(content: str) -> str:
    """The gate's decision, read back from the words the adapter gave the model."""
    for prefix, decision in (("OUTCOME UNKNOWN", "blocked"), ("WAITING FOR APPROVAL",
                             "approval_required"), ("DENIED", "denied"),
                             ("NOT DONE YET", "in_flight")):
        if content.startswith(prefix):
            return decision
    return "refused"
