"""Approvals through the OpenAI Agents SDK's own pause: a refund above the approval threshold
makes the gated tool's ``needs_approval`` answer True (the policy, asked by a dry run), the run
returns ``interruptions``, its ``RunState`` goes to JSON, and another process approves or
rejects it (recorded in the store) and runs on. Real ``Runner`` loop, scripted model, both
backends; the refund is counted in an O_APPEND ledger."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

import effectgate as eg

from . import hitl_worker as worker

ROOT = Path(__file__).resolve().parents[1]


lines = worker.lines


@pytest.fixture
def hgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    with worker.make_gate(store_url, namespace) as gate:
        yield gate


def in_process(gate: eg.Gate, tmp: Path, name: str, answer: Any = None) -> dict[str, Any]:
    return asyncio.run(worker.openai_step(gate, tmp / "ledger", tmp / "state.json", name,
                                          answer))


def in_new_process(store_url: str, namespace: str, tmp: Path, name: str,
                   answer: Any = None) -> dict[str, Any]:
    return worker.in_new_process("openai_agents", store_url, namespace, tmp, name, answer)


def test_paused_run_state_approved_in_another_process_executes_once(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    # Paused here, resumed in a new OS process from the RunState's JSON (the SDK takes
    # seconds to import: one new process only, as in test_hitl_crewai).
    first = in_process(hgate, tmp_path, "start")
    assert first["final_output"] is None
    [item] = first["interruptions"]
    assert item["tool_name"] == "refund" and json.loads(item["arguments"]) == worker.ARGS
    # The pause recorded the request: a human sees it in the CLI or the console.
    [approval] = hgate.list_approvals()
    assert approval.arguments == worker.ARGS and lines(tmp_path / "ledger") == []

    second = in_new_process(store_url, namespace, tmp_path, "resume",
                            {"decision": "approve", "by": "alice"})
    assert second["tool_results"] == ["refunded 50000 on T1"]
    assert second["final_output"] == "All done."
    assert len(lines(tmp_path / "ledger")) == 1
    assert hgate.approval(approval.approval_id).decided_by == "alice"
    # The same approved snapshot restored again (the SDK's snapshots are not single-use).
    replay = in_process(hgate, tmp_path, "resume", {"decision": "approve", "by": "alice"})
    assert replay["tool_results"] == ["refunded 50000 on T1"]  # the stored result
    assert len(lines(tmp_path / "ledger")) == 1


def test_approved_in_the_cli_wakes_the_paused_run(store_url: str, namespace: str,
                                                  hgate: eg.Gate, tmp_path: Path) -> None:
    in_process(hgate, tmp_path, "start")
    [approval] = hgate.list_approvals()
    cli = subprocess.run(
        [sys.executable, "-m", "effectgate.cli", "approve", approval.approval_id, "--by", "bob",
         "--url", store_url, "--namespace", namespace],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    out = in_process(hgate, tmp_path, "resume", {"decision": "store"})
    assert out["tool_results"] == ["refunded 50000 on T1"] and out["interruptions"] == []
    assert len(lines(tmp_path / "ledger")) == 1
    in_process(hgate, tmp_path, "resume", {"decision": "store"})
    assert len(lines(tmp_path / "ledger")) == 1


def test_a_pending_request_stays_paused_when_the_store_has_no_decision(
        hgate: eg.Gate, tmp_path: Path) -> None:
    in_process(hgate, tmp_path, "start")
    out = in_process(hgate, tmp_path, "resume", {"decision": "store"})
    assert out["interruptions"] == ["call_1"] and lines(tmp_path / "ledger") == []


def test_a_rejection_executes_nothing_and_stays_denied(hgate: eg.Gate,
                                                       tmp_path: Path) -> None:
    in_process(hgate, tmp_path, "start")
    [approval] = hgate.list_approvals()
    out = in_process(hgate, tmp_path, "resume",
                     {"decision": "reject", "by": "carol", "reason": "not this one"})
    [said] = out["tool_results"]
    assert said.startswith("DENIED") and "not this one" in said
    assert hgate.approval(approval.approval_id).state is eg.ApprovalState.DENIED
    # The paused snapshot again, now approved: the store's denial stands.
    again = in_process(hgate, tmp_path, "resume", {"decision": "approve"})
    assert again["tool_results"][0].startswith("DENIED")
    assert lines(tmp_path / "ledger") == []


def test_a_bare_sdk_approval_without_the_store_executes_nothing(hgate: eg.Gate,
                                                                tmp_path: Path) -> None:
    in_process(hgate, tmp_path, "start")
    out = in_process(hgate, tmp_path, "resume", {"decision": "bare"})
    assert out["tool_results"][0].startswith("WAITING FOR APPROVAL")
    assert lines(tmp_path / "ledger") == []
    [approval] = hgate.list_approvals()
    assert approval.state is eg.ApprovalState.PENDING


def test_a_self_approval_the_policy_forbids_is_refused_and_the_state_is_not_told(
        hgate: eg.Gate, tmp_path: Path) -> None:
    from agents import RunState

    from effectgate.integrations import openai_agents as eg_oa

    in_process(hgate, tmp_path, "start")
    agent = worker.openai_agent(hgate, tmp_path / "ledger", "resume")

    async def self_approve() -> list[Any]:
        state = await RunState.from_json(agent, json.loads((tmp_path / "state.json")
                                                           .read_text()))
        [item] = state.get_interruptions()
        with pytest.raises(eg.InvalidTransition):
            eg_oa.approve(state, item, by="billing")  # the agent that asked
        return list(state.get_interruptions())

    assert len(asyncio.run(self_approve())) == 1
    assert hgate.list_approvals()[0].state is eg.ApprovalState.PENDING


def _expire(gate: eg.Gate) -> None:
    from sqlalchemy import text

    with gate.store.engine.begin() as conn:
        conn.execute(text("UPDATE effectgate_approvals SET expires_at = expires_at - 1000000 "
                          "WHERE namespace = :ns"), {"ns": gate.namespace})


@pytest.mark.parametrize("decide", ["approve", "reject"])
def test_a_decision_on_an_interruption_whose_request_expired_records_nothing(
        hgate: eg.Gate, tmp_path: Path, decide: str) -> None:
    """approve()/reject() never open a request: a late yes would approve one nobody was shown
    (RequestGone, the state not told: resuming asks again, showing a new request), a late no
    would deny the effect for good (the SDK is told no, the store is left alone)."""
    from agents import RunState

    from effectgate.integrations import openai_agents as eg_oa

    in_process(hgate, tmp_path, "start")
    [shown] = hgate.list_approvals()
    _expire(hgate)
    agent = worker.openai_agent(hgate, tmp_path / "ledger", "resume")

    async def late() -> list[str]:
        from agents import Runner, ToolCallOutputItem

        state = await RunState.from_json(agent, json.loads((tmp_path / "state.json")
                                                           .read_text()))
        [item] = state.get_interruptions()
        if decide == "approve":
            with pytest.raises(eg_oa.RequestGone):
                eg_oa.approve(state, item, by="alice")
            eg_oa.ask_again(state, item)  # the model is told to call again, if still wanted
        else:  # the SDK is told no; the store's new request is not opened to be denied
            eg_oa.reject(state, item, by="alice")
        result = await Runner.run(agent, state)
        return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]

    said = asyncio.run(late())
    assert said == ([eg_oa.ASK_AGAIN] if decide == "approve" else
                    ["DENIED: rejected by alice. It has not been carried out. Do not retry it; "
                     "tell the user why."])
    assert [a.approval_id for a in hgate.list_approvals(state=None)] == [shown.approval_id]
    assert hgate.approval(shown.approval_id).state is eg.ApprovalState.EXPIRED
    assert lines(tmp_path / "ledger") == [] and hgate.get("refund:T1").state is \
        eg.State.PENDING_APPROVAL


def test_ask_again_refuses_while_the_request_waits_or_was_decided(hgate: eg.Gate,
                                                                   tmp_path: Path) -> None:
    """The model must not hear "expired" about a request that still waits, or one a human
    decided in the console."""
    from agents import RunState

    from effectgate.integrations import openai_agents as eg_oa

    in_process(hgate, tmp_path, "start")
    agent = worker.openai_agent(hgate, tmp_path / "ledger", "resume")

    async def ask(match: str) -> None:
        state = await RunState.from_json(agent, json.loads((tmp_path / "state.json")
                                                           .read_text()))
        [item] = state.get_interruptions()
        with pytest.raises(eg.InvalidTransition, match=match):
            eg_oa.ask_again(state, item)

    asyncio.run(ask("still waits"))
    [request] = hgate.list_approvals()
    hgate.approve(request.approval_id, by="bob")
    asyncio.run(ask("decided in the store"))
    assert lines(tmp_path / "ledger") == []


def test_below_the_threshold_there_is_no_pause_and_no_request(
        hgate: eg.Gate, tmp_path: Path) -> None:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    from effectgate.integrations import openai_agents as eg_oa

    set_tracing_disabled(True)

    @function_tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return worker.book(tmp_path / "ledger", txn_id, amount_cents)

    small = {"txn_id": "T2", "amount_cents": 500}
    model = ScriptedModel([[function_call("refund", small, call_id="c1")],
                           [assistant_message("ok")]])
    tool = eg_oa.gate_tool(refund, "refund:{txn_id}", gate=hgate, cost_micros=worker.cost)
    result = Runner.run_sync(Agent(name="billing", model=model, tools=[tool]), "refund T2")
    assert result.interruptions == [] and len(lines(tmp_path / "ledger")) == 1
    assert hgate.list_approvals(state=None) == []


# -- the tool's own needs_approval (issue 25, item 2) --------------------------------------------


def test_the_tools_own_pause_is_never_approved_by_a_store_that_decided_nothing(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A refund below the policy's threshold, paused by the tool's own ``needs_approval=True``:
    the store has no request and no decision, so ``apply_store_decisions`` leaves it waiting
    (it used to approve it, and the refund ran with no human)."""
    small = {"txn_id": "T2", "amount_cents": 500}
    monkeypatch.setenv("HITL_VARIANT", json.dumps({"own_approval": True, "calls": [small]}))
    first = in_process(hgate, tmp_path, "start")
    [item] = first["interruptions"]
    assert json.loads(item["arguments"]) == small
    assert hgate.list_approvals(state=None) == []  # nothing the store could decide
    out = in_new_process(store_url, namespace, tmp_path, "resume", {"decision": "store"})
    assert out["interruptions"] == ["call_1"] and out["tool_results"] == []
    assert lines(tmp_path / "ledger") == []
    with pytest.raises(eg.UnknownEffect):
        hgate.get("refund:T2")
    # A human's answer through the adapter runs it, once.
    done = in_process(hgate, tmp_path, "resume", {"decision": "approve", "by": "alice"})
    assert done["tool_results"] == ["refunded 500 on T2"] and len(lines(tmp_path / "ledger")) == 1


def test_the_tools_own_pause_over_the_threshold_records_the_request_and_waits_for_it(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool pauses by itself and the policy wants a human too: the request is recorded
    (so the CLI and the console show it), the run waits until it is decided there, and then
    the store's approval wakes the run, which executes once."""
    monkeypatch.setenv("HITL_VARIANT", json.dumps({"own_approval": True}))
    in_process(hgate, tmp_path, "start")
    [approval] = hgate.list_approvals()
    assert approval.arguments == worker.ARGS
    waiting = in_process(hgate, tmp_path, "resume", {"decision": "store"})
    assert waiting["interruptions"] == ["call_1"] and lines(tmp_path / "ledger") == []
    hgate.approve(approval.approval_id, by="bob")
    out = in_new_process(store_url, namespace, tmp_path, "resume", {"decision": "store"})
    assert out["tool_results"] == ["refunded 50000 on T1"] and out["interruptions"] == []
    again = in_process(hgate, tmp_path, "resume", {"decision": "store"})
    assert again["tool_results"] == ["refunded 50000 on T1"]  # the stored result
    assert len(lines(tmp_path / "ledger")) == 1
