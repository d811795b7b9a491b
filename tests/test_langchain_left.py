"""LangChain: two findings left by a review, checked in the real ``create_agent`` loop driven
offline by a scripted model, on SQLite and Postgres.

* A middleware shared by two agents whose plain tools share a name reads each tool by itself:
  its arguments, its template's names, a reviewer's edit (it had read the second agent's tool
  by the first one's: a conflicting refund was answered as done, a tool it cannot key was
  refused to the model call after call, an edit of an argument the first tool lacks was
  refused).
* A tool that answers with a ``Command`` (a tool message plus other state updates): a twin in
  another run, and a repeat answered from the store in a later run, get the updates that run
  lacks, once; a repeat in the run that applied them gets the tool message alone (both had
  lost the updates, and a stored repeat its content too).
"""

from __future__ import annotations

import asyncio
import datetime
import operator
import threading
import time
from typing import Annotated, Any, NotRequired

import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import AgentState, create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import effectgate as eg
from effectgate.integrations import langchain as eg_lc

from .conftest import snapshot

KEY = "refund:{txn_id}"


class ScriptedModel(FakeMessagesListChatModel):
    """Answers with the scripted messages in turn."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools])


def call(call_id: str, args: dict[str, Any], name: str = "refund") -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id,
                                      "type": "tool_call"}])


def script(*calls: AIMessage) -> ScriptedModel:
    return ScriptedModel(responses=[*calls, AIMessage("All done.")])


def invoke(agent: Any, thread: str, payload: Any = None) -> dict[str, Any]:
    payload = payload if payload is not None else {
        "messages": [{"role": "user", "content": "refund T1"}]}
    return agent.invoke(payload,  # type: ignore[no-any-return]
                        config={"configurable": {"thread_id": thread}})


def answers(result: dict[str, Any]) -> list[tuple[str, Any, str]]:
    return [(m.tool_call_id, m.content, m.status) for m in result["messages"]
            if isinstance(m, ToolMessage)]


# -- 1. one middleware, two agents, two tools of one name -----------------------------------


@tool("refund")
def card_refund(txn_id: str, amount_cents: int) -> str:
    """Refund a card transaction. Irreversible."""
    return f"card refund of {amount_cents} on {txn_id}"


def multi_currency(ran: list[Any]) -> Any:
    @tool("refund")
    def refund(txn_id: str, amount_cents: int, currency: str) -> str:
        """Refund a transaction in its currency. Irreversible."""
        ran.append((txn_id, amount_cents, currency))
        return f"refunded {amount_cents} {currency} on {txn_id}"

    return refund


def test_a_shared_middleware_hashes_each_agents_tool_by_its_own_arguments(
        gate: eg.Gate) -> None:
    """Agent B's refund takes a ``currency`` that agent A's does not: B's second call, in EUR
    after USD, is another payload for the same key — a conflict. It was hashed by A's argument
    names (currency dropped), so the store answered it as a duplicate: the model was told the
    EUR refund was done."""
    ran: list[Any] = []
    middleware = eg_lc.EffectGateMiddleware({"refund": KEY}, gate=gate)
    invoke(create_agent(script(call("a1", {"txn_id": "T0", "amount_cents": 1})),
                        tools=[card_refund], middleware=[middleware]), "a")
    usd = {"txn_id": "T1", "amount_cents": 500, "currency": "USD"}
    out = invoke(create_agent(script(call("b1", usd), call("b2", {**usd, "currency": "EUR"})),
                              tools=[multi_currency(ran)], middleware=[middleware]), "b")
    first, second = answers(out)
    assert ran == [("T1", 500, "USD")]
    assert first == ("b1", "refunded 500 USD on T1", "success")
    assert second[2] == "error" and "CONFLICT" in second[1]


def test_a_shared_middleware_refuses_a_tool_its_template_cannot_key_as_a_lone_one(
        gate: eg.Gate) -> None:
    """Agent B's refund names its argument ``payment_id``: the template cannot key it, which
    is a configuration error (as for a middleware that saw B's tool first), raised before the
    tool runs and writing nothing. It was told to the model as invalid arguments, call after
    call."""
    ran: list[Any] = []

    @tool("refund")
    def by_payment(payment_id: str, amount_cents: int) -> str:
        """Refund a payment. Irreversible."""
        ran.append(payment_id)
        return "refunded"

    middleware = eg_lc.EffectGateMiddleware({"refund": KEY}, gate=gate)
    invoke(create_agent(script(call("a1", {"txn_id": "T0", "amount_cents": 1})),
                        tools=[card_refund], middleware=[middleware]), "a")
    before = snapshot(gate)
    agent = create_agent(script(call("c1", {"payment_id": "P1", "amount_cents": 5})),
                         tools=[by_payment], middleware=[middleware])
    with pytest.raises(eg.EffectKeyError, match="txn_id"):
        invoke(agent, "c")
    assert ran == [] and snapshot(gate) == before
    lone = eg_lc.EffectGateMiddleware({"refund": KEY}, gate=gate)
    with pytest.raises(eg.EffectKeyError):
        invoke(create_agent(script(call("c2", {"payment_id": "P1", "amount_cents": 5})),
                            tools=[by_payment], middleware=[lone]), "c2")


def test_a_shared_middleware_validates_an_edit_by_the_agents_own_tool(
        make_gate: Any) -> None:
    """A reviewer edits agent B's paused refund to EUR: the edit is validated by B's tool (it
    was validated by A's, which has no ``currency``: refused as an unknown argument, asked
    again, never run)."""
    gate = make_gate(policy={"effects": {"refund": {
        "approval": {"at_or_above_micros": 100_000_000}}}})
    ran: list[Any] = []
    middleware = eg_lc.EffectGateMiddleware({"refund": {
        "key": KEY, "cost_micros": lambda amount_cents: amount_cents * 10_000}}, gate=gate)
    invoke(create_agent(script(call("a1", {"txn_id": "T0", "amount_cents": 1})),
                        tools=[card_refund], middleware=[middleware]), "a")
    agent = create_agent(script(call("b1", {"txn_id": "T2", "amount_cents": 50_000,
                                            "currency": "USD"})),
                         tools=[multi_currency(ran)], middleware=[middleware],
                         checkpointer=InMemorySaver())
    paused = invoke(agent, "b")
    [pause] = paused["__interrupt__"]
    shown = pause.value["action_requests"][0]["args"]
    assert shown == {"txn_id": "T2", "amount_cents": 50_000, "currency": "USD"} and ran == []
    edit = {"type": "edit", "by": "alice", "edited_action": {
        "name": "refund", "args": {**shown, "currency": "EUR"}}}
    out = invoke(agent, "b", Command(resume={"decisions": [edit]}))
    assert "__interrupt__" not in out
    assert ran == [("T2", 50_000, "EUR")]
    assert answers(out)[-1][1].endswith("refunded 50000 EUR on T2")


# -- 2. a tool that answers with a Command ---------------------------------------------------


class Refunds(AgentState):
    refunded: NotRequired[Annotated[list[str], operator.add]]
    at: NotRequired[Any]


class Bank:
    """A refund tool answering with a ``Command`` (its message, plus ``refunded`` appended to
    the state, ``at`` set where asked), the agents that use it, and what it did."""

    def __init__(self, gate: eg.Gate, form: str, *, at: Any = None,
                 delay: float = 0.0) -> None:
        self.gate, self.form = gate, form
        self.made: list[str] = []
        self.started = threading.Event()
        self.saver = InMemorySaver()
        made, started = self.made, self.started

        @tool
        def refund(txn_id: str, runtime: ToolRuntime) -> Command:  # type: ignore[type-arg]
            """Refund a card transaction. Irreversible."""
            made.append(txn_id)
            started.set()
            time.sleep(delay)
            update: dict[str, Any] = {
                "messages": [ToolMessage(f"refunded {txn_id} #{len(made)}",
                                         tool_call_id=runtime.tool_call_id)],
                "refunded": [txn_id]}
            if at is not None:
                update["at"] = at
            return Command(update=update)

        self.tool = refund

    def agent(self, *calls: AIMessage) -> Any:
        if self.form == "tool":
            return create_agent(script(*calls), tools=[eg_lc.gate_tool(
                self.tool, KEY, gate=self.gate)], state_schema=Refunds,
                checkpointer=self.saver)
        return create_agent(script(*calls), tools=[self.tool], state_schema=Refunds,
                            checkpointer=self.saver, middleware=[
                                eg_lc.EffectGateMiddleware({"refund": KEY}, gate=self.gate)])


T1 = {"txn_id": "T1"}


def both(*ids: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "refund", "args": T1, "id": i,
                                      "type": "tool_call"} for i in ids])


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_twin_in_another_run_gets_the_commands_state_updates(gate: eg.Gate,
                                                                form: str) -> None:
    """The same refund in two concurrent runs: one executes, the other waits for it and is
    answered with its ``Command`` — its tool message re-addressed and its ``refunded`` update,
    which that run's state lacked (the twin got the tool message alone)."""
    bank = Bank(gate, form, delay=0.5)
    done: dict[str, Any] = {}

    def go(thread: str, call_id: str) -> None:
        done[thread] = invoke(bank.agent(call(call_id, T1)), thread)

    first = threading.Thread(target=go, args=("r1", "a1"))
    second = threading.Thread(target=go, args=("r2", "b1"))
    first.start()
    assert bank.started.wait(10)  # the twin arrives while the refund runs
    second.start()
    first.join()
    second.join()
    assert bank.made == ["T1"]
    assert done["r1"]["refunded"] == done["r2"]["refunded"] == ["T1"]
    assert answers(done["r2"]) == [("b1", "refunded T1 #1", "success")]


@pytest.mark.parametrize("loop", ["sync", "async"])
@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_repeat_in_a_later_run_gets_the_stored_commands_state_updates_once(
        gate: eg.Gate, form: str, loop: str) -> None:
    """A later run's refund is answered from the store: the tool message's content (it was
    told "Done earlier (its result was not stored)", or "null") and the ``refunded`` update,
    applied once however often that run repeats the call."""
    bank = Bank(gate, form)
    invoke(bank.agent(call("a1", T1)), "r1")
    stored = gate.get("refund:T1").result
    assert stored == {"effectgate.langchain.Command": {
        "tool_call_id": "a1", "content": "refunded T1 #1", "update": {"refunded": ["T1"]}}}
    agent = bank.agent(call("x1", T1), call("x2", T1), both("x3", "x4"))
    if loop == "async":
        later = asyncio.run(agent.ainvoke(
            {"messages": [{"role": "user", "content": "refund T1"}]},
            config={"configurable": {"thread_id": "r2"}}))
    else:
        later = invoke(agent, "r2")
    assert bank.made == ["T1"]
    assert later["refunded"] == ["T1"]
    assert [(i, c) for i, c, _ in answers(later)] == [
        (i, "refunded T1 #1") for i in ("x1", "x2", "x3", "x4")]


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_repeat_in_the_run_that_applied_the_updates_does_not_apply_them_again(
        gate: eg.Gate, form: str) -> None:
    """Two identical calls in one turn, then the same call in a later turn of the same run:
    ``refunded`` (an appending channel) holds the refund once."""
    bank = Bank(gate, form, delay=0.3)
    agent = bank.agent(both("a1", "a2"), call("a3", T1))
    out = invoke(agent, "r1")
    assert bank.made == ["T1"]
    assert out["refunded"] == ["T1"]
    assert {(i, c) for i, c, _ in answers(out)} == {
        (i, "refunded T1 #1") for i in ("a1", "a2", "a3")}


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_replay_of_the_call_from_its_checkpoint_gets_the_updates_it_never_applied(
        gate: eg.Gate, form: str) -> None:
    """The run is replayed from the checkpoint before its tools ran (LangGraph time travel,
    as a resumed crash would): the refund is answered from the store, and the fork's state —
    which never got the updates — gets them once."""
    bank = Bank(gate, form)
    agent = bank.agent(call("a1", T1), AIMessage("again"))
    invoke(agent, "r1")
    config = {"configurable": {"thread_id": "r1"}}
    before = next(snap.config for snap in agent.get_state_history(config)
                  if snap.next == ("tools",))
    forked = agent.invoke(None, config=before)
    assert bank.made == ["T1"]
    assert forked["refunded"] == ["T1"]
    assert [(i, c) for i, c, _ in answers(forked)] == [("a1", "refunded T1 #1")]


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_command_whose_updates_are_not_plain_json_stores_its_message_alone(
        gate: eg.Gate, form: str) -> None:
    """An update that would not read back equal (a datetime) is not stored: a later run gets
    the tool message's content alone, never a changed value."""
    bank = Bank(gate, form, at=datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC))
    first = invoke(bank.agent(call("a1", T1)), "r1")
    assert first["at"].year == 2026
    stored = gate.get("refund:T1").result["effectgate.langchain.Command"]
    assert stored["update"] is None and stored["content"] == "refunded T1 #1"
    later = invoke(bank.agent(call("x1", T1)), "r2")
    assert bank.made == ["T1"] and "at" not in later and not later.get("refunded")
    assert answers(later) == [("x1", "refunded T1 #1", "success")]
