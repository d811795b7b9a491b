"""Google ADK, red-teamed: a gated tool must do what the ungated one does, once, and the store
must say what happened.

* A plain ``def`` that hands back a coroutine (a sync decorator around an ``async def``, or a
  function returning another's coroutine) is awaited by ADK. The gate's own call of a sync
  function on its worker thread did not: the coroutine was never awaited, the refund never
  ran, and the effect was recorded AMBIGUOUS — every call of such a tool failed, for good.
* A function that asks for its own confirmation (ADK's confirmation sample) and is told "no"
  decides itself what the no means: its answer stays its result (COMMITTED; a no is no proof
  it did nothing), and ``NotExecuted`` makes it FAILED, so the call made again runs (pinned
  here; the red team's first fix recorded every such no FAILED, which a function that acts on
  a no would turn into a second run).
* A confirmation whose payload edits the arguments its pause showed (the human approved a
  smaller refund in the client's form) was taken as a yes to the original call: the larger
  refund ran. Now an edited yes approves nothing and changes nothing in the store.
* One reply that answers two pauses on the same approval request (two identical calls in one
  turn) with a yes and a no ran the refund and told the model, for the other call, "DENIED …
  It has not been carried out", or refused it, depending on which call ran first. A no in
  the reply now refuses the request, whatever the order.

Real ``InMemoryRunner`` loop, scripted model, both backends.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.agents import LlmAgent
from google.adk.runners import InMemoryRunner
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

import effectgate as eg
from effectgate.integrations.google_adk import gate_tool

from . import hitl_worker as worker
from .adapter_drivers import adk_model, adk_run
from .conftest import snapshot
from .test_hitl_google_adk import _transfer_tool

ARGS = {"txn_id": "T1", "amount_cents": 500}


def _sync_decorated(ledger: list[str]) -> Callable[..., Any]:
    def traced(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)
        return wrapper

    @traced
    async def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        await asyncio.sleep(0)
        ledger.append(txn_id)
        return f"refunded {amount_cents} on {txn_id}"

    return refund


def _returns_a_coroutine(ledger: list[str]) -> Callable[..., Any]:
    async def send(txn_id: str, amount_cents: int) -> str:
        await asyncio.sleep(0)
        ledger.append(txn_id)
        return f"refunded {amount_cents} on {txn_id}"

    def refund(txn_id: str, amount_cents: int) -> Any:
        """Refund a card transaction. Irreversible."""
        return send(txn_id, amount_cents)

    return refund


@pytest.mark.parametrize("make", [_sync_decorated, _returns_a_coroutine])
def test_a_def_that_returns_a_coroutine_runs_once_as_adk_runs_it(
        gate: eg.Gate, make: Callable[[list[str]], Any]) -> None:
    ledger: list[str] = []
    tool = gate_tool(FunctionTool(make(ledger)), "refund:{txn_id}", gate=gate)
    for call_id, run_id in (("c1", "s1"), ("c2", "s2")):
        out = asyncio.run(adk_run([tool], [[(call_id, ARGS, "refund")]], run_id=run_id))
        assert out == {call_id: "refunded 500 on T1"}
    assert ledger == ["T1"]
    assert gate.get("refund:T1").state is eg.State.COMMITTED


async def _converse(runner: Any, session_id: str, message: Any) -> tuple[list[Any], list[Any]]:
    """One run: (the confirmation requests it ended with, the tool answers)."""
    requests: list[Any] = []
    answers: list[Any] = []
    async for event in runner.run_async(user_id="u", session_id=session_id,
                                        new_message=message):
        requests += [c for c in event.get_function_calls()
                     if c.name == "adk_request_confirmation"]
        answers += [r.response for r in event.get_function_responses()]
    return requests, answers


def _reply(*answers: tuple[Any, bool]) -> Any:
    return types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
        id=request.id, name=request.name, response={"confirmed": confirmed}))
        for request, confirmed in answers])


def _text(text: str) -> Any:
    return types.Content(role="user", parts=[types.Part(text=text)])


def _transfer_saying_not_executed(ledger: list[tuple[str, float]]) -> Any:
    """ADK's confirmation sample, its "no" told to the gate: nothing was done."""
    def transfer_funds(amount: float, recipient: str,
                       tool_context: ToolContext) -> dict[str, str]:
        """Transfer funds."""
        if not tool_context.tool_confirmation:
            tool_context.request_confirmation(hint=f"Confirm ${amount} to {recipient}.")
            return {"error": "This tool call requires confirmation, please approve or reject."}
        if not tool_context.tool_confirmation.confirmed:
            raise eg.NotExecuted("Transfer rejected by user.")
        ledger.append((recipient, amount))
        return {"result": f"Successfully transferred ${amount} to {recipient}"}

    return FunctionTool(transfer_funds)


@pytest.mark.parametrize("says", ["answer", "not_executed"])
def test_a_no_to_the_functions_own_confirmation_is_what_the_function_says(
        gate: eg.Gate, says: str) -> None:
    """The function asked for its own confirmation and the user said no. A no is no proof
    that the function did nothing (it decides what a no means, and may act anyway): its
    answer is its result, COMMITTED, and a repeat is answered from the store, never run. A
    function that says nothing happened (``NotExecuted``) is FAILED, and the call the model
    makes again, once confirmed, runs once."""
    ledger: list[tuple[str, float]] = []
    fn = _transfer_tool if says == "answer" else _transfer_saying_not_executed
    tool = gate_tool(fn(ledger), "transfer:{recipient}", gate=gate)
    args = {"amount": 200, "recipient": "Bob"}

    async def conversation() -> list[Any]:
        model = adk_model([[("c1", args, "transfer_funds")]])
        agent = LlmAgent(name="bank", tools=[tool], model=model)
        runner = InMemoryRunner(agent=agent, app_name="bank")
        await runner.session_service.create_session(app_name="bank", user_id="u",
                                                    session_id="s")
        asked, _ = await _converse(runner, "s", _text("Send Bob $200"))
        await _converse(runner, "s", _reply((asked[-1], False)))
        record = gate.get("transfer:Bob")
        assert ledger == []
        assert record.state is (eg.State.COMMITTED if says == "answer" else eg.State.FAILED)
        model.script.append([("c2", args, "transfer_funds")])
        asked_again, said = await _converse(runner, "s", _text("Actually, do send it"))
        if asked_again:
            _, said = await _converse(runner, "s", _reply((asked_again[-1], True)))
        await runner.close()
        return said

    said = asyncio.run(conversation())
    if says == "answer":  # the stored answer, the transfer never made
        assert said[-1] == {"error": "Transfer rejected by user."} and ledger == []
    else:
        assert said[-1] == {"result": "Successfully transferred $200.0 to Bob"}
        assert ledger == [("Bob", 200.0)]
        assert gate.get("transfer:Bob").state is eg.State.COMMITTED


@pytest.mark.parametrize("yes_first", [True, False])
def test_a_reply_with_a_no_to_one_of_twin_pauses_refuses_the_request(
        store_url: str, namespace: str, tmp_path: Path, yes_first: bool) -> None:
    ledger = tmp_path / "ledger"
    with worker.make_gate(store_url, namespace) as gate:
        def refund(txn_id: str, amount_cents: int) -> str:
            """Refund a card transaction. Irreversible."""
            return worker.book(ledger, txn_id, amount_cents)

        tool = gate_tool(FunctionTool(refund), "refund:{txn_id}", gate=gate,
                         cost_micros=worker.cost)

        async def conversation() -> list[Any]:
            agent = LlmAgent(name="bank", tools=[tool], model=adk_model(
                [[("c1", worker.ARGS, "refund"), ("c2", worker.ARGS, "refund")]]))
            runner = InMemoryRunner(agent=agent, app_name="bank")
            await runner.session_service.create_session(app_name="bank", user_id="u",
                                                        session_id="s")
            asked, _ = await _converse(runner, "s", _text("refund T1 twice over"))
            assert len(asked) == 2 and len(gate.list_approvals()) == 1
            _, said = await _converse(runner, "s", _reply((asked[0], yes_first),
                                                          (asked[1], not yes_first)))
            await runner.close()
            return said

        said = asyncio.run(conversation())
        assert worker.lines(ledger) == []
        assert [s["error"].split(":")[0] for s in said] == ["DENIED", "DENIED"]
        assert gate.get("refund:T1").state is eg.State.DENIED
        [request] = gate.list_approvals(state=None)
        assert request.state is eg.ApprovalState.DENIED


def test_a_yes_that_edits_the_shown_arguments_approves_nothing(
        store_url: str, namespace: str, tmp_path: Path) -> None:
    ledger, state = tmp_path / "ledger", tmp_path / "state.json"
    with worker.make_gate(store_url, namespace) as gate:
        paused = asyncio.run(worker.adk_step(gate, ledger, state, "start", None))
        shown = paused["requests"][0]["toolConfirmation"]["payload"]
        assert shown["arguments"] == worker.ARGS
        before = snapshot(gate)
        edited = {**shown, "arguments": {**worker.ARGS, "amount_cents": 5_000}}
        out = asyncio.run(worker.adk_step(gate, ledger, state, "resume",
                                          {"confirmed": True, "payload": edited}))
        [said] = out["tool_results"]
        assert said["error"].startswith("DENIED") and "changes the arguments" in said["error"]
        assert worker.lines(ledger) == [] and snapshot(gate) == before
        [request] = gate.list_approvals()
        assert request.state is eg.ApprovalState.PENDING
