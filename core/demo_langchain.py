"""The demo's agent as a real LangChain loop: ``langchain.agents.create_agent`` with a scripted
chat model (offline), whose tools are gated with
:func:`effectgate.integrations.langchain.gate_tool`. Imported only by ``effectgate demo`` when
the ``langchain`` extra is installed."""

from __future__ import annotations

import itertools
import json
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool

from .demo import FakeVendor, register_undo
from .gate import Gate
from .integrations.langchain import gate_tool

__all__ = ["LangChainAgent", "ScriptedModel"]


class ScriptedModel(FakeMessagesListChatModel):
    """A chat model that answers from a script and accepts tools (as a real one would)."""

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def _tools(gate: Gate, vendor: FakeVendor) -> list[BaseTool]:
    @tool
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund a card payment."""
        from . import current_effect

        return vendor.refund(txn_id, amount_cents, current_effect().vendor_idempotency_key)

    def booking(what: str) -> BaseTool:
        def book(trip_id: str) -> dict[str, Any]:
            return vendor.book(what, trip_id)

        inner = tool(f"book_{what}", description=f"Book a {what} for a trip.")(book)
        return gate_tool(inner, f"{what}:{{trip_id}}", gate=gate, effect_type=f"booking.{what}",
                         group_key="trip:{trip_id}",
                         compensation=lambda trip_id: {"cancel": what})

    register_undo(gate, vendor)
    return [
        gate_tool(refund, "refund:{txn_id}", gate=gate, effect_type="payment.refund",
                  vendor="stripe", cost_micros=lambda amount_cents: amount_cents * 10_000),
        booking("flight"), booking("hotel"), booking("car"),
    ]


class LangChainAgent:
    """Each tool call is one run of a ``create_agent`` loop: the scripted model asks for the
    tool, the gated tool answers, the model finishes. What the model is told comes back."""

    name = "LangChain create_agent (scripted model)"

    def __init__(self, gate: Gate, vendor: FakeVendor) -> None:
        self.vendor = vendor
        self.tools = _tools(gate, vendor)
        self._ids = itertools.count(1)

    def call(self, tool_name: str, args: dict[str, Any]) -> str:
        """Run the loop for one tool call; return what the model is told, briefly."""
        call_id = f"call_{next(self._ids)}"
        model = ScriptedModel(responses=[
            AIMessage("", tool_calls=[{"name": tool_name, "args": args, "id": call_id,
                                       "type": "tool_call"}]),
            AIMessage("Done."),
        ])
        agent = create_agent(model=model, tools=self.tools, name="support-agent")
        before = len(self.vendor.calls)
        state = agent.invoke({"messages": [{"role": "user", "content": "handle the ticket"}]},
                             config={"configurable": {"thread_id": "demo-run"}})
        message = next(m for m in state["messages"]
                       if isinstance(m, ToolMessage) and m.tool_call_id == call_id)
        return _told(message, reached=len(self.vendor.calls) > before)


def _told(message: ToolMessage, *, reached: bool) -> str:
    content = message.content if isinstance(message.content, str) else json.dumps(
        message.content)
    if message.status == "error":
        first = content.split(". ")[0].rstrip(".")
        return f"the model is told: {first}."
    try:
        value = json.loads(content)
    except ValueError:
        value = content
    brief = _brief(value)
    if reached:
        return f"executed → {brief}"
    return f"duplicate → {brief}, the stored result; the vendor was not called"


def _brief(value: Any) -> str:
    if isinstance(value, dict):
        for name in ("refund_id", "booking_id"):
            if name in value:
                return str(value[name])
    return str(value)
