"""Approvals through Google ADK's own tool confirmation: a refund above the approval threshold
makes the gated tool call ``tool_context.request_confirmation``, the run ends with an
``adk_request_confirmation`` call, and another process answers it with a ``FunctionResponse``
on the same session (``DatabaseSessionService`` on an SQLite file). Real ``Runner`` loop,
scripted ``BaseLlm``, both backends; the refund is counted in an O_APPEND ledger."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.tools import FunctionTool
from google.adk.tools.tool_context import ToolContext

import effectgate as eg

from . import hitl_worker as worker

lines = worker.lines


@pytest.fixture
def hgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    with worker.make_gate(store_url, namespace) as gate:
        yield gate


def step(store_url: str, namespace: str, tmp: Path, name: str,
         answer: Any = None) -> dict[str, Any]:
    """One step in a new OS process."""
    return worker.in_new_process("google_adk", store_url, namespace, tmp, name, answer)


def here(gate: eg.Gate, tmp: Path, name: str, answer: Any = None) -> dict[str, Any]:
    """One step in this process (a new Runner on the same session file)."""
    import asyncio

    return asyncio.run(worker.adk_step(gate, tmp / "ledger", tmp / "state.json", name,
                                       answer))


@pytest.mark.slow
def test_a_confirmation_in_another_process_executes_once_and_a_replay_gets_the_result(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    # Paused here, confirmed in a new OS process on the session file (one new process only).
    first = here(hgate, tmp_path, "start")
    [request] = first["requests"]
    shown = request["toolConfirmation"]["payload"]
    [approval] = hgate.list_approvals()
    assert shown["effectgate"]["approval_id"] == approval.approval_id
    assert shown["effectgate"]["payload_hash"] == approval.payload_hash
    assert shown["arguments"] == worker.ARGS == request["originalFunctionCall"]["args"]
    assert first["tool_results"][0]["error"].startswith("WAITING FOR APPROVAL")
    assert first["texts"] == [] and lines(tmp_path / "ledger") == []  # the model was not asked
    shutil.copy(tmp_path / "state.json", tmp_path / "paused.db")

    second = step(store_url, namespace, tmp_path, "resume", {"confirmed": True,
                                                             "payload": shown})
    assert second["tool_results"] == [{"result": "refunded 50000 on T1"}]
    assert second["texts"] == ["All done."] and len(lines(tmp_path / "ledger")) == 1
    assert hgate.approval(approval.approval_id).decided_by == "google-adk-resume"
    # The paused session restored and confirmed again: ADK would run the tool again.
    shutil.copy(tmp_path / "paused.db", tmp_path / "state.json")
    replay = here(hgate, tmp_path, "resume", {"confirmed": True})
    assert replay["tool_results"] == [{"result": "refunded 50000 on T1"}]
    assert len(lines(tmp_path / "ledger")) == 1


def test_approved_in_the_cli_wakes_the_paused_run(store_url: str, namespace: str,
                                                  hgate: eg.Gate, tmp_path: Path) -> None:
    here(hgate, tmp_path, "start")
    [approval] = hgate.list_approvals()
    cli = subprocess.run(
        [sys.executable, "-m", "effectgate.cli", "approve", approval.approval_id, "--by", "bob",
         "--url", store_url, "--namespace", namespace],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    out = here(hgate, tmp_path, "resume", {"confirmed": True})
    assert out["tool_results"] == [{"result": "refunded 50000 on T1"}]
    assert hgate.approval(approval.approval_id).decided_by == "bob"
    assert len(lines(tmp_path / "ledger")) == 1


def test_a_rejection_executes_nothing_and_stays_denied(store_url: str, namespace: str,
                                                       hgate: eg.Gate, tmp_path: Path) -> None:
    here(hgate, tmp_path, "start")
    shutil.copy(tmp_path / "state.json", tmp_path / "paused.db")
    [approval] = hgate.list_approvals()
    out = here(hgate, tmp_path, "resume", {"confirmed": False})
    [said] = out["tool_results"]
    assert said["error"].startswith("DENIED") and "google-adk-resume" in said["error"]
    assert hgate.approval(approval.approval_id).state is eg.ApprovalState.DENIED
    # The paused session again, now confirmed: the store's denial stands.
    shutil.copy(tmp_path / "paused.db", tmp_path / "state.json")
    again = here(hgate, tmp_path, "resume", {"confirmed": True})
    assert again["tool_results"][0]["error"].startswith("DENIED")
    assert lines(tmp_path / "ledger") == []


def test_a_confirmation_arriving_after_its_request_expired_approves_nothing(
        hgate: eg.Gate, tmp_path: Path) -> None:
    """The resumed call opens a new request in the expired one's place, which nobody was
    shown: the late yes approves nothing, and the model is told the new request waits (ADK
    opens no second confirmation from a confirmed call; a call made again pauses on it)."""
    from sqlalchemy import text

    here(hgate, tmp_path, "start")
    shutil.copy(tmp_path / "state.json", tmp_path / "paused.db")
    [shown] = hgate.list_approvals()
    with hgate.store.engine.begin() as conn:
        conn.execute(text("UPDATE effectgate_approvals SET expires_at = expires_at - 1000000 "
                          "WHERE namespace = :ns AND id = :id"),
                     {"ns": hgate.namespace, "id": shown.approval_id})
    out = here(hgate, tmp_path, "resume", {"confirmed": True})
    assert lines(tmp_path / "ledger") == []
    [pending] = hgate.list_approvals()
    assert pending.approval_id != shown.approval_id
    [said] = out["tool_results"]
    assert said["error"].startswith("WAITING FOR APPROVAL") and pending.approval_id in \
        said["error"]
    assert pending.state is eg.ApprovalState.PENDING
    # A client that names the new request (the model's text gave its id) cannot stand in for
    # the session's record of what the pause showed.
    shutil.copy(tmp_path / "paused.db", tmp_path / "state.json")
    named = here(hgate, tmp_path, "resume", {
        "confirmed": True, "payload": {"effectgate": {"approval_id": pending.approval_id}}})
    assert named["tool_results"][-1]["error"].startswith("DENIED")
    assert lines(tmp_path / "ledger") == []
    # The paused session answered again (a replay, a racing resumer): the answer is bound to
    # the request the session recorded showing, never to the new one.
    shutil.copy(tmp_path / "paused.db", tmp_path / "state.json")
    again = here(hgate, tmp_path, "resume", {"confirmed": True})
    assert again["tool_results"][-1]["error"].startswith("DENIED")
    assert lines(tmp_path / "ledger") == []
    assert hgate.approval(pending.approval_id).state is eg.ApprovalState.PENDING


async def _own_turn(gate: eg.Gate, ledger: Path, service: Any, session_id: str,
                    message: Any) -> tuple[list[Any], list[str]]:
    """One run of a session whose tool has ADK's own ``require_confirmation``: (the
    confirmations ADK asked for, the tool answers)."""
    from google.adk.runners import Runner

    runner = Runner(agent=worker.adk_agent(gate, ledger, require_confirmation=True),
                    app_name="h", session_service=service)
    asked: list[Any] = []
    said: list[str] = []
    async for event in runner.run_async(user_id="u", session_id=session_id,
                                        new_message=message):
        asked += [fc for fc in event.get_function_calls()
                  if fc.name == "adk_request_confirmation"]
        said += [str(fr.response) for fr in event.get_function_responses()]
    await runner.close()
    return asked, said


def _yes(asked: Any, payload: Any = None) -> Any:
    from google.genai import types

    response: dict[str, Any] = {"confirmed": True}
    if payload is not None:
        response["payload"] = payload
    return types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
        id=asked.id, name=asked.name, response=response))])


def _ask(text: str) -> Any:
    from google.genai import types

    return types.Content(role="user", parts=[types.Part(text=text)])


def test_the_tools_own_confirmation_approves_a_request_the_run_was_told_of(
        hgate: eg.Gate, tmp_path: Path) -> None:
    """A tool with ADK's own ``require_confirmation`` is confirmed before the gate can show
    its request: the first yes meets a request the resumed call opened (nobody was asked
    about it), so it waits and the model is told so; the model calls again, ADK asks again,
    and that yes — given after the run was told of the request, in the session's own order —
    approves it, once."""
    from google.adk.sessions import DatabaseSessionService

    ledger = tmp_path / "ledger"

    async def turns() -> list[str]:
        async with DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path / 's.db'}") as service:
            await service.create_session(app_name="h", user_id="u", session_id="s")
            message, said = _ask("refund T1"), []
            for _ in range(6):
                asked, answers = await _own_turn(hgate, ledger, service, "s", message)
                said += answers
                if asked:
                    message = _yes(asked[-1])
                elif "refunded" in said[-1]:
                    break
                else:
                    message = _ask("try again")
            return said

    said = asyncio.run(turns())
    assert any("WAITING FOR APPROVAL" in s for s in said) and "refunded 50000" in said[-1]
    assert len(lines(ledger)) == 1
    [approval] = hgate.list_approvals(state=None)
    assert approval.state is eg.ApprovalState.CONSUMED


@pytest.mark.parametrize("naming", [False, True])
def test_the_tools_own_confirmation_never_approves_another_sessions_request(
        hgate: eg.Gate, tmp_path: Path, naming: bool) -> None:
    """Session A is asked; then session B's call opens the request. A's yes came before A's
    run was told of that request, so it approves nothing — even when A's client names the
    request's id (the model's text of another run may carry it): no clock compared."""
    from google.adk.sessions import DatabaseSessionService

    ledger = tmp_path / "ledger"

    async def race() -> list[str]:
        async with DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path / 's.db'}") as service:
            for sid in ("A", "B"):
                await service.create_session(app_name="h", user_id="u", session_id=sid)
            asked_a, _ = await _own_turn(hgate, ledger, service, "A", _ask("refund T1"))
            asked_b, _ = await _own_turn(hgate, ledger, service, "B", _ask("refund T1"))
            await _own_turn(hgate, ledger, service, "B", _yes(asked_b[-1]))  # opens the request
            [request] = hgate.list_approvals()
            named = {"effectgate": {"approval_id": request.approval_id}} if naming else None
            _, said = await _own_turn(hgate, ledger, service, "A", _yes(asked_a[-1], named))
            return said

    said = asyncio.run(race())
    assert "WAITING FOR APPROVAL" in said[-1] and lines(ledger) == []
    [request] = hgate.list_approvals()
    assert request.state is eg.ApprovalState.PENDING


@pytest.mark.parametrize("named", [
    {"effectgate": {"approval_id": "apr_forged"}},
    {"effectgate": {"payload_hash": "0" * 64}},
])
def test_a_confirmation_naming_another_request_approves_nothing(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path,
        named: dict[str, Any]) -> None:
    here(hgate, tmp_path, "start")
    out = here(hgate, tmp_path, "resume", {"confirmed": True, "payload": named})
    assert out["tool_results"][0]["error"].startswith("DENIED")
    assert "nothing was approved" in out["tool_results"][0]["error"]
    assert lines(tmp_path / "ledger") == []
    assert hgate.list_approvals()[0].state is eg.ApprovalState.PENDING


def test_a_malformed_confirmation_payload_changes_nothing(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    from .conftest import snapshot

    here(hgate, tmp_path, "start")
    before = snapshot(hgate)
    out = here(hgate, tmp_path, "resume",
               {"confirmed": True, "payload": {"effectgate": {"approval_id": ["x"] * 3}}})
    assert out["tool_results"][0]["error"].startswith("INVALID ARGUMENTS")
    assert snapshot(hgate) == before and lines(tmp_path / "ledger") == []


def test_below_the_threshold_there_is_no_pause_and_no_request(
        hgate: eg.Gate, tmp_path: Path) -> None:
    import asyncio

    from .adapter_drivers import adk_run

    agent_tools = [worker.adk_agent(hgate, tmp_path / "ledger").tools[0]]
    out = asyncio.run(adk_run(agent_tools, [[("c1", {"txn_id": "T2", "amount_cents": 500},
                                              "refund")]], run_id="small"))
    assert out == {"c1": "refunded 500 on T2"} and len(lines(tmp_path / "ledger")) == 1
    assert hgate.list_approvals(state=None) == []


def _transfer_tool(ledger: list[tuple[str, float]]) -> Any:
    """A tool written as ADK's own confirmation sample writes it: the function asks for the
    user's confirmation itself and returns; ADK calls it again once the user has answered."""
    def transfer_funds(amount: float, recipient: str, tool_context: ToolContext) -> dict[str, str]:
        """Transfer funds."""
        if amount >= 100:
            if not tool_context.tool_confirmation:
                tool_context.request_confirmation(hint=f"Confirm ${amount} to {recipient}.")
                return {"error": "This tool call requires confirmation, please approve or reject."}
            if not tool_context.tool_confirmation.confirmed:
                return {"error": "Transfer rejected by user."}
        ledger.append((recipient, amount))
        return {"result": f"Successfully transferred ${amount} to {recipient}"}

    return FunctionTool(transfer_funds)


def test_a_tool_that_asks_for_its_own_confirmation_runs_once_confirmed(gate: eg.Gate) -> None:
    """The early "requires confirmation" answer is no result: the call is FAILED (nothing
    done), so the confirmed call ADK makes again runs, once."""
    import asyncio

    from google.adk.agents import LlmAgent
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    from effectgate.integrations.google_adk import gate_tool

    from .adapter_drivers import adk_model

    ledger: list[tuple[str, float]] = []
    tool = gate_tool(_transfer_tool(ledger), "transfer:{recipient}", gate=gate)

    async def conversation() -> list[Any]:
        agent = LlmAgent(name="bank", tools=[tool], model=adk_model(
            [[("c1", {"amount": 200, "recipient": "Bob"}, "transfer_funds")]]))
        runner = InMemoryRunner(agent=agent, app_name="bank")
        await runner.session_service.create_session(app_name="bank", user_id="u",
                                                    session_id="s")
        answers: list[Any] = []
        message = types.Content(role="user", parts=[types.Part(text="Send Bob $200")])
        for _turn in range(2):
            requests = []
            async for event in runner.run_async(user_id="u", session_id="s",
                                                new_message=message):
                requests += [c for c in event.get_function_calls()
                             if c.name == "adk_request_confirmation"]
                answers += [r.response for r in event.get_function_responses()]
            if not requests:
                break
            assert gate.get("transfer:Bob").state is eg.State.FAILED and ledger == []
            [request] = requests
            message = types.Content(role="user", parts=[types.Part(
                function_response=types.FunctionResponse(
                    id=request.id, name=request.name, response={"confirmed": True}))])
        await runner.close()
        return answers

    answers = asyncio.run(conversation())
    assert answers[0] == {"error": "This tool call requires confirmation, please approve "
                                   "or reject."}
    assert answers[-1] == {"result": "Successfully transferred $200.0 to Bob"}
    assert ledger == [("Bob", 200.0)]
    record = gate.get("transfer:Bob")
    assert record.state is eg.State.COMMITTED and record.attempt == 2
