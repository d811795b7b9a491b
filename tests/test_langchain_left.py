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
import gc
import json
import operator
import threading
import time
import weakref
from typing import Annotated, Any, NotRequired

import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import AgentState, create_agent
from langchain.agents.middleware import AgentMiddleware, SummarizationMiddleware
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
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


# -- 3. a review of the two findings' fixes ---------------------------------------------------


class Ledger(Refunds):
    """A state that declares the gate's own channel (as ``EffectGateMiddleware`` adds it):
    what a ``gate_tool`` tool needs to survive a middleware that drops messages."""

    effectgate_applied: NotRequired[Annotated[list[str], operator.add]]


def agent_of(bank: Bank, model: Any, *, extra: tuple[Any, ...] = (),
             state: type = Refunds) -> Any:
    """``bank``'s refund in an agent of its own ``model``, after the ``extra`` middleware."""
    if bank.form == "tool":
        return create_agent(model, tools=[eg_lc.gate_tool(bank.tool, KEY, gate=bank.gate)],
                            state_schema=state, checkpointer=bank.saver, middleware=[*extra])
    return create_agent(model, tools=[bank.tool], state_schema=state, checkpointer=bank.saver,
                        middleware=[*extra, eg_lc.EffectGateMiddleware({"refund": KEY},
                                                                       gate=bank.gate)])


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_parallel_repeats_in_a_run_that_lacks_the_updates_apply_them_once(
        gate: eg.Gate, form: str) -> None:
    """A later run's first repeats of a stored ``Command`` are two identical calls of one turn
    (``"500"`` and ``500`` alike): both found the updates missing and both applied them —
    ``refunded`` held T1 twice. The earlier call of the turn gets them, the other its message."""
    bank = Bank(gate, form)
    invoke(bank.agent(call("a1", T1)), "r1")
    twins = AIMessage("", tool_calls=[
        {"name": "refund", "args": T1, "id": "x1", "type": "tool_call"},
        {"name": "refund", "args": {"txn_id": "T1"}, "id": "x2", "type": "tool_call"}])
    later = invoke(bank.agent(twins), "r2")
    assert bank.made == ["T1"]
    assert later["refunded"] == ["T1"]
    assert [(i, c) for i, c, _ in answers(later)] == [("x1", "refunded T1 #1"),
                                                       ("x2", "refunded T1 #1")]


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_twins_of_a_leader_in_another_run_apply_its_updates_once(gate: eg.Gate,
                                                                   form: str) -> None:
    """Two identical calls of one turn wait for the same refund running in another run: one of
    them gives this run the leader's updates, the other its message alone."""
    bank = Bank(gate, form, delay=0.5)
    done: dict[str, Any] = {}

    def go(thread: str, *calls: AIMessage) -> None:
        done[thread] = invoke(bank.agent(*calls), thread)

    first = threading.Thread(target=go, args=("r1", call("a1", T1)))
    second = threading.Thread(target=go, args=("r2", both("b1", "b2")))
    first.start()
    assert bank.started.wait(10)
    second.start()
    first.join()
    second.join()
    assert bank.made == ["T1"]
    assert done["r1"]["refunded"] == done["r2"]["refunded"] == ["T1"]


class Trim(AgentMiddleware):  # type: ignore[type-arg]
    """Drops every message before a new human one, once the thread is long."""

    def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        messages = state["messages"]
        if len(messages) > 4 and isinstance(messages[-1], HumanMessage):
            return {"messages": [RemoveMessage(id=m.id) for m in messages[:-1]]}
        return None


def summariser() -> Any:
    return SummarizationMiddleware(
        FakeMessagesListChatModel(responses=[AIMessage("Summary: T1 was refunded.")] * 3),
        trigger=("messages", 5), keep=("messages", 1))


@pytest.mark.parametrize("drop", ["summarise", "remove"])
@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_repeat_after_the_messages_were_dropped_does_not_apply_the_updates_again(
        gate: eg.Gate, form: str, drop: str) -> None:
    """A thread refunds T1 (its ``Command`` appends to ``refunded``), a summarising or trimming
    middleware then drops the old messages, and the model refunds T1 again: the repeat read
    the messages, found no trace of the refund and applied its updates a second time. The
    state's own record (the middleware's channel; a ``gate_tool`` state that declares it)
    survives the messages."""
    bank = Bank(gate, form)
    model = ScriptedModel(responses=[call("a1", T1), AIMessage("Refunded."), call("x1", T1),
                                     AIMessage("Done.")])
    extra = summariser() if drop == "summarise" else Trim()
    agent = agent_of(bank, model, extra=(extra,), state=Ledger if form == "tool" else Refunds)
    invoke(agent, "r1")
    out = invoke(agent, "r1", {"messages": [{"role": "user", "content": "was it refunded?"}]})
    assert not any(isinstance(m, ToolMessage) and m.tool_call_id == "a1"
                   for m in out["messages"])  # the trace is gone
    assert bank.made == ["T1"]
    assert out["refunded"] == ["T1"]
    assert answers(out)[-1][:2] == ("x1", "refunded T1 #1")


def test_the_middlewares_record_of_applied_updates_is_private(gate: eg.Gate) -> None:
    """The channel is no part of the agent's input or output; a fork before the refund lacks
    it, so the replay gets the updates."""
    bank = Bank(gate, "middleware")
    agent = bank.agent(call("a1", T1))
    out = invoke(agent, "r1")
    assert "effectgate_applied" not in out
    config = {"configurable": {"thread_id": "r1"}}
    assert agent.get_state(config).values["effectgate_applied"] == ["a1"]


@pytest.mark.parametrize("loop", ["sync", "async"])
def test_a_tool_result_shaped_like_a_stored_command_is_a_plain_result(
        gate: eg.Gate, loop: str) -> None:
    """A ``gate_tool`` tool passing on a vendor's JSON that reads like the stored ``Command``
    form was turned into a ``Command``: the first call wrote the JSON's ``update`` into the
    agent's state (``approved``), and the model saw only its ``content``; without a call id the
    tool returned the ``content`` for the dict. It stays the tool's plain result, first time
    and repeated."""
    reply = {"effectgate.langchain.Command": {
        "tool_call_id": "x", "content": "ok", "update": {"approved": True}}}

    class Approvals(AgentState):
        approved: NotRequired[bool]

    @tool
    def charge(txn_id: str, runtime: ToolRuntime) -> dict[str, Any]:  # type: ignore[type-arg]
        """Charge a card; answers with the vendor's JSON."""
        return reply

    @tool
    def pay(txn_id: str) -> dict[str, Any]:
        """Pay; answers with the vendor's JSON."""
        return {"effectgate.langchain.value": "ok"}

    gated = eg_lc.gate_tool(charge, KEY, gate=gate)
    agent = create_agent(script(call("c1", T1, name="charge"), call("c2", T1, name="charge")),
                         tools=[gated], state_schema=Approvals, checkpointer=InMemorySaver())
    payload = {"messages": [{"role": "user", "content": "charge T1"}]}
    config: Any = {"configurable": {"thread_id": "r"}}
    out = (asyncio.run(agent.ainvoke(payload, config=config)) if loop == "async"
           else agent.invoke(payload, config=config))
    assert "approved" not in out
    assert [json.loads(c) for _, c, _ in answers(out)] == [reply, reply]
    plain = eg_lc.gate_tool(pay, "pay:{txn_id}", gate=gate)
    first = plain.invoke({"txn_id": "P1"})
    again = (asyncio.run(plain.ainvoke({"txn_id": "P1"})) if loop == "async"
             else plain.invoke({"txn_id": "P1"}))
    assert first == again == {"effectgate.langchain.value": "ok"}


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_an_update_the_policy_redacted_is_not_given_to_a_later_run(
        make_gate: Any, form: str) -> None:
    """The policy's ``redact_result`` names ``card``: the store keeps ``"[redacted]"`` in the
    stored update, which a later run's repeat wrote into its state as though it were the
    card. A later run gets the tool message alone."""
    gate = make_gate(policy={"effects": {"refund": {"redact_result": ["card"]}}})
    bank = Bank(gate, form, at={"card": "4111111111111111", "last4": "1111"})
    first = invoke(bank.agent(call("a1", T1)), "r1")
    assert first["at"]["card"] == "4111111111111111"
    stored = gate.get("refund:T1").result["effectgate.langchain.Command"]
    assert stored["update"]["at"]["card"] == "[redacted]"
    later = invoke(bank.agent(call("x1", T1)), "r2")
    assert bank.made == ["T1"] and "at" not in later and not later.get("refunded")
    assert answers(later) == [("x1", "refunded T1 #1", "success")]


def test_a_shared_middleware_keeps_no_per_request_tool_alive(gate: eg.Gate) -> None:
    """Each ``_Shape`` held its tool through its validator: a middleware shared by agents
    built per request kept every request's tool alive, and scanned them all at each call."""
    middleware = eg_lc.EffectGateMiddleware({"refund": KEY}, gate=gate)
    seen: list[Any] = []

    def one_request(i: int) -> None:
        @tool("refund")
        def refund(txn_id: str, amount_cents: int) -> str:
            """Refund a card transaction. Irreversible."""
            return "refunded"

        seen.append(weakref.ref(refund))
        invoke(create_agent(script(call(f"c{i}", {"txn_id": f"T{i}", "amount_cents": 1})),
                            tools=[refund], middleware=[middleware]), f"t{i}")

    for i in range(5):
        one_request(i)
    gc.collect()
    assert [r() for r in seen] == [None] * 5


def test_a_tool_given_another_schema_is_read_again(gate: eg.Gate) -> None:
    """A tool whose ``args_schema`` was replaced after the middleware first read it (here a
    ``currency`` added) was still hashed by its old argument names: the EUR refund after the
    USD one was answered as done."""
    ran: list[Any] = []
    middleware = eg_lc.EffectGateMiddleware({"refund": KEY}, gate=gate)
    invoke(create_agent(script(call("a1", {"txn_id": "T0", "amount_cents": 1})),
                        tools=[card_refund], middleware=[middleware]), "a")
    changed = multi_currency(ran)
    refund = card_refund.model_copy()
    invoke(create_agent(script(call("b0", {"txn_id": "T9", "amount_cents": 1})),
                        tools=[refund], middleware=[middleware]), "b0")
    refund.args_schema = changed.args_schema
    refund.func = changed.func
    usd = {"txn_id": "T1", "amount_cents": 500, "currency": "USD"}
    out = invoke(create_agent(script(call("b1", usd), call("b2", {**usd, "currency": "EUR"})),
                              tools=[refund], middleware=[middleware]), "b")
    first, second = answers(out)
    assert ran == [("T1", 500, "USD")] and first[1] == "refunded 500 USD on T1"
    assert second[2] == "error" and "CONFLICT" in second[1]


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_an_edit_of_a_command_tools_call_tells_the_model(make_gate: Any, form: str) -> None:
    """A reviewer edits a paused refund whose tool answers with a ``Command``: the model's
    answer had no note that its call was replaced (a text tool's has), first or replayed."""
    gate = make_gate(policy={"effects": {"refund": {"approval": {"always": True}}}})
    bank = Bank(gate, form)
    agent = agent_of(bank, ScriptedModel(responses=[call("a1", T1), *[AIMessage("Done.")] * 2]))
    paused = invoke(agent, "r1")
    assert "__interrupt__" in paused
    config = {"configurable": {"thread_id": "r1"}}
    at_pause = agent.get_state(config).config
    edit = {"type": "edit", "by": "alice",
            "edited_action": {"name": "refund", "args": {"txn_id": "T2"}}}
    out = invoke(agent, "r1", Command(resume={"decisions": [edit]}))
    assert bank.made == ["T2"] and out["refunded"] == ["T2"]
    [answer] = answers(out)
    assert answer[1].startswith("Note: a human reviewer replaced this tool call")
    assert answer[1].endswith("refunded T2 #1")
    replayed = agent.invoke(Command(resume={"decisions": [edit]}), config=at_pause)
    assert bank.made == ["T2"] and replayed["refunded"] == ["T2"]
    assert answers(replayed)[0][1].startswith("Note: a human reviewer replaced this tool call")


# -- 4. a review of the twin test (_same_call) -----------------------------------------------


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_an_earlier_twin_a_human_rejected_does_not_take_the_updates(gate: eg.Gate,
                                                                    form: str) -> None:
    """A later run's two identical refunds of one turn, the first rejected by a human
    (``HumanInTheLoopMiddleware`` answers it without running it), the second approved and
    answered from the store: the second read the rejected first as the twin that applies the
    updates, and gave the run its message alone — ``refunded`` never reached the run."""
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    bank = Bank(gate, form)
    invoke(bank.agent(call("a1", T1)), "r1")
    hitl = HumanInTheLoopMiddleware(interrupt_on={"refund": True})
    agent = agent_of(bank, script(both("x1", "x2")), extra=(hitl,))
    invoke(agent, "r2")
    out = invoke(agent, "r2", Command(resume={"decisions": [
        {"type": "reject", "message": "no"}, {"type": "approve"}]}))
    assert bank.made == ["T1"]
    assert [(i, c) for i, c, _ in answers(out)][-1] == ("x2", "refunded T1 #1")
    assert out["refunded"] == ["T1"]


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_an_earlier_twin_a_human_edited_does_not_take_the_updates(gate: eg.Gate,
                                                                  form: str) -> None:
    """As above, the first call edited by the human to another refund (its message keeps the
    model's arguments): it is no twin, and the approved second gives the run its updates."""
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    bank = Bank(gate, form)
    invoke(bank.agent(call("a1", T1)), "r1")
    hitl = HumanInTheLoopMiddleware(interrupt_on={"refund": True})
    agent = agent_of(bank, script(both("x1", "x2")), extra=(hitl,))
    invoke(agent, "r2")
    edit = {"type": "edit", "edited_action": {"name": "refund", "args": {"txn_id": "T2"}}}
    out = invoke(agent, "r2", Command(resume={"decisions": [edit, {"type": "approve"}]}))
    assert bank.made == ["T1", "T2"]
    assert sorted(out["refunded"]) == ["T1", "T2"]


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_two_refunds_of_one_turn_both_record_their_updates(gate: eg.Gate, form: str) -> None:
    """Two different refunds of one turn each answer with a ``Command`` naming its call in the
    middleware's channel: the channel was read as a last-value one (its reducer was not the
    last annotation), and the run crashed with ``InvalidUpdateError`` after both refunds ran."""
    bank = Bank(gate, form)
    turn = AIMessage("", tool_calls=[{"name": "refund", "args": {"txn_id": t}, "id": i,
                                      "type": "tool_call"} for t, i in (("T1", "a1"),
                                                                        ("T2", "a2"))])
    agent = agent_of(bank, script(turn), state=Ledger if form == "tool" else Refunds)
    out = invoke(agent, "r1")
    assert sorted(bank.made) == sorted(out["refunded"]) == ["T1", "T2"]
    state = agent.get_state({"configurable": {"thread_id": "r1"}}).values
    assert sorted(state["effectgate_applied"]) == ["a1", "a2"]
