"""Approvals through Microsoft Agent Framework's own function approval: a refund above the
approval threshold makes ``EffectGateMiddleware`` answer with a ``function_approval_request``,
the run returns ``user_input_requests``, the session goes to JSON, and another process answers
(``approve`` / ``reject`` of the middleware, or the framework's bare response) and runs on.
Real ``Agent`` loop, scripted chat client, both backends; the refund is counted in an O_APPEND
ledger."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agent_framework")

import effectgate as eg

from . import hitl_worker as worker
from .conftest import snapshot

lines = worker.lines


@pytest.fixture
def hgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    with worker.make_gate(store_url, namespace) as gate:
        yield gate


def here(gate: eg.Gate, tmp: Path, name: str, answer: Any = None) -> dict[str, Any]:
    return asyncio.run(worker.af_step(gate, tmp / "ledger", tmp / "state.json", name, answer))


@pytest.mark.slow
def test_a_request_approved_in_another_process_executes_once_and_a_replay_gets_the_result(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    first = worker.in_new_process("agent_framework", store_url, namespace, tmp_path, "start")
    [request] = first["requests"]
    [approval] = hgate.list_approvals()
    shown = request["additional_properties"]
    assert shown["effectgate"]["approval_id"] == approval.approval_id
    assert shown["effectgate"]["payload_hash"] == approval.payload_hash
    assert shown["arguments"] == worker.ARGS and lines(tmp_path / "ledger") == []
    assert request["function_call"]["name"] == "refund"
    shutil.copy(tmp_path / "state.json", tmp_path / "paused.json")

    second = worker.in_new_process("agent_framework", store_url, namespace, tmp_path,
                                   "resume", {"decision": "approve", "by": "alice"})
    assert second["tool_results"] == ["refunded 50000 on T1"] and second["text"] == "All done."
    assert len(lines(tmp_path / "ledger")) == 1
    assert hgate.approval(approval.approval_id).decided_by == "alice"
    # The paused session restored and approved again (the framework's binding is per session).
    shutil.copy(tmp_path / "paused.json", tmp_path / "state.json")
    replay = here(hgate, tmp_path, "resume", {"decision": "bare"})
    assert replay["tool_results"] == ["refunded 50000 on T1"]
    assert len(lines(tmp_path / "ledger")) == 1


def test_the_frameworks_bare_approval_is_recorded_as_the_approver(
        hgate: eg.Gate, tmp_path: Path) -> None:
    here(hgate, tmp_path, "start")
    [approval] = hgate.list_approvals()
    out = here(hgate, tmp_path, "resume", {"decision": "bare"})
    assert out["tool_results"] == ["refunded 50000 on T1"]
    assert hgate.approval(approval.approval_id).decided_by == "agent-framework-resume"
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
    out = here(hgate, tmp_path, "resume", {"decision": "bare"})
    assert out["tool_results"] == ["refunded 50000 on T1"]
    assert hgate.approval(approval.approval_id).decided_by == "bob"
    assert len(lines(tmp_path / "ledger")) == 1


def test_a_rejection_executes_nothing_and_stays_denied(hgate: eg.Gate, tmp_path: Path) -> None:
    here(hgate, tmp_path, "start")
    shutil.copy(tmp_path / "state.json", tmp_path / "paused.json")
    [approval] = hgate.list_approvals()
    out = here(hgate, tmp_path, "resume",
               {"decision": "reject", "by": "carol", "reason": "not this one"})
    assert hgate.approval(approval.approval_id).state is eg.ApprovalState.DENIED
    assert hgate.approval(approval.approval_id).decided_by == "carol"
    assert lines(tmp_path / "ledger") == [] and out["requests"] == []
    # The paused session again, now approved by the framework alone: the denial stands.
    shutil.copy(tmp_path / "paused.json", tmp_path / "state.json")
    again = here(hgate, tmp_path, "resume", {"decision": "bare"})
    assert again["tool_results"][0].startswith("DENIED")
    assert lines(tmp_path / "ledger") == []


def test_a_bare_rejection_runs_nothing_and_leaves_the_request_pending(
        hgate: eg.Gate, tmp_path: Path) -> None:
    here(hgate, tmp_path, "start")
    here(hgate, tmp_path, "resume", {"decision": "bare_reject"})
    assert lines(tmp_path / "ledger") == []
    assert hgate.list_approvals()[0].state is eg.ApprovalState.PENDING


@pytest.mark.parametrize("forge", [{"approval_id": "apr_forged"},
                                   {"payload_hash": "0" * 64}])
def test_a_response_naming_another_request_approves_nothing(
        hgate: eg.Gate, tmp_path: Path, forge: dict[str, str]) -> None:
    here(hgate, tmp_path, "start")
    out = here(hgate, tmp_path, "resume", {"decision": "bare", "forge": forge})
    [said] = out["tool_results"]
    assert said.startswith("DENIED") and "nothing was approved" in said
    assert lines(tmp_path / "ledger") == []
    assert hgate.list_approvals()[0].state is eg.ApprovalState.PENDING


@pytest.mark.parametrize("forge", [{"approval_id": "apr_forged"},
                                   {"payload_hash": "0" * 64}, {"approval_id": 7}])
def test_the_helpers_refuse_a_request_naming_another_approval(
        hgate: eg.Gate, tmp_path: Path, forge: dict[str, Any]) -> None:
    here(hgate, tmp_path, "start")
    before = snapshot(hgate)
    for decision in ("approve", "reject"):
        with pytest.raises(eg.ConfigError):
            here(hgate, tmp_path, "resume", {"decision": decision, "forge": forge})
    assert snapshot(hgate) == before and lines(tmp_path / "ledger") == []


def test_a_self_approval_the_policy_forbids_is_refused(hgate: eg.Gate, tmp_path: Path) -> None:
    here(hgate, tmp_path, "start")
    with pytest.raises(eg.InvalidTransition):
        here(hgate, tmp_path, "resume", {"decision": "approve", "by": "billing"})
    assert hgate.list_approvals()[0].state is eg.ApprovalState.PENDING
    assert lines(tmp_path / "ledger") == []


def test_below_the_threshold_there_is_no_pause_and_no_request(
        hgate: eg.Gate, tmp_path: Path) -> None:
    from .adapter_drivers import AgentFramework

    agent, middleware = worker.af_agent(hgate, tmp_path / "ledger", "start")
    tools = [*agent.default_options["tools"], middleware]
    out = AgentFramework().run(tools, [[("c1", {"txn_id": "T2", "amount_cents": 500})]],
                               run_id="small")
    assert out == {"c1": "refunded 500 on T2"} and len(lines(tmp_path / "ledger")) == 1
    assert hgate.list_approvals(state=None) == []


def test_approve_validates_the_requests_arguments_as_the_call_does(make_gate: Any) -> None:
    """``approve`` hashed the request's JSON arguments without the tool's input model, so a
    legitimate request with a ``Decimal`` argument ("12.50") was refused as being for other
    arguments. Validated as the call is (by the tool this middleware gated, or ``tool=``),
    it is approved, and the resumed call runs once."""
    from decimal import Decimal

    from agent_framework import Agent, Message, tool

    from effectgate.integrations.agent_framework import EffectGateMiddleware

    from .adapter_drivers import af_client, af_results

    gate = make_gate(policy={"effects": {"refund": {"approval": {"always": True}}}})
    paid: list[Decimal] = []

    @tool
    def refund(txn_id: str, amount: Decimal) -> str:
        """Refund ``amount`` dollars."""
        paid.append(amount)
        return f"refunded {amount} on {txn_id}"

    effects = {"refund": "refund:{txn_id}"}
    middleware = EffectGateMiddleware(effects, gate=gate)

    async def run(turns: Any, message: Any, session: Any = None) -> Any:
        agent = Agent(client=af_client(turns), name="billing", tools=[refund],
                      middleware=[middleware])
        session = session or agent.create_session(session_id="s1")
        return await agent.run(message, session=session), session

    paused, session = asyncio.run(run([[("c1", {"txn_id": "T1", "amount": "12.50"})]],
                                      "refund T1"))
    [request] = paused.user_input_requests
    reply = middleware.approve(request, by="alice")
    # Another process's middleware, which has never gated the tool, is given it.
    with pytest.raises(eg.ConfigError, match="tool="):
        EffectGateMiddleware(effects, gate=gate).approve(request, by="alice")
    EffectGateMiddleware(effects, gate=gate).approve(request, by="alice", tool=refund)
    [approval] = gate.list_approvals(state=None)
    assert approval.state is eg.ApprovalState.APPROVED and approval.decided_by == "alice"
    resumed, _ = asyncio.run(run([], Message(role="user", contents=[reply]), session))
    assert af_results(resumed.messages) == {"c1": "refunded 12.50 on T1"}
    assert paid == [Decimal("12.50")]
