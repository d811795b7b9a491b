"""Approvals through LlamaIndex's own pause: a refund above the approval threshold waits in the
gated tool on ``ctx.wait_for_event(HumanResponseEvent)`` behind an ``InputRequiredEvent``; the
workflow Context is serialised, the process exits, and another process restores it and sends
the human's answer. Real FunctionAgent loop, scripted LLM, both backends; the refund is counted
in an O_APPEND ledger."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

import effectgate as eg

from . import hitl_worker as worker

ROOT = Path(__file__).resolve().parents[1]


lines = worker.lines


@pytest.fixture
def hgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    with worker.make_gate(store_url, namespace) as gate:
        yield gate


def in_process(gate: eg.Gate, tmp: Path, name: str, answer: Any = None) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return asyncio.run(worker.llama_step(gate, tmp / "ledger", tmp / "state.json", name,
                                             answer))


def in_new_process(store_url: str, namespace: str, tmp: Path, name: str,
                   answer: Any = None) -> dict[str, Any]:
    return worker.in_new_process("llama_index", store_url, namespace, tmp, name, answer)


def test_paused_context_restored_and_approved_in_another_process_executes_once(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    asked = in_process(hgate, tmp_path, "start")["event"]
    [approval] = hgate.list_approvals()
    assert asked["approval_id"] == approval.approval_id
    assert asked["payload_hash"] == approval.payload_hash
    assert asked["arguments"] == worker.ARGS and asked["tool"] == "refund"
    assert asked["allowed_decisions"] == ["approve", "edit", "reject"]
    assert lines(tmp_path / "ledger") == []

    out = in_new_process(store_url, namespace, tmp_path, "resume",
                         {"response": "approve", "by": "alice"})
    assert out["tool_results"] == ["refunded 50000 on T1"] and out["final"] == "All done."
    assert len(lines(tmp_path / "ledger")) == 1
    assert hgate.approval(approval.approval_id).decided_by == "alice"
    # The same answer to the same saved Context again: the stored result, no second refund.
    # (LlamaIndex replays the waiting step on restore and again on the answer: each replay
    # is answered from the store.)
    again = in_process(hgate, tmp_path, "resume", {"response": "approve", "by": "alice"})
    assert again["tool_results"] and set(again["tool_results"]) == {"refunded 50000 on T1"}
    assert len(lines(tmp_path / "ledger")) == 1


def test_approved_in_the_cli_then_restored_executes_once(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    in_process(hgate, tmp_path, "start")
    [approval] = hgate.list_approvals()
    cli = subprocess.run(
        [sys.executable, "-m", "effectgate.cli", "approve", approval.approval_id, "--by", "bob",
         "--url", store_url, "--namespace", namespace],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    # The store comes first: approved there, the restored step executes whatever is answered.
    out = in_process(hgate, tmp_path, "resume", {"response": "reject"})
    assert out["tool_results"] and set(out["tool_results"]) == {"refunded 50000 on T1"}
    assert len(lines(tmp_path / "ledger")) == 1
    in_process(hgate, tmp_path, "resume", {"response": "approve"})
    assert len(lines(tmp_path / "ledger")) == 1


def test_an_edited_answer_executes_the_edited_arguments_once_never_the_original(
        hgate: eg.Gate, tmp_path: Path) -> None:
    asked = in_process(hgate, tmp_path, "start")["event"]
    edit = {"response": "edit", "by": "carol",
            "arguments": {"txn_id": "T1", "amount_cents": "30000"}}
    out = in_process(hgate, tmp_path, "resume", edit)
    assert out["tool_results"] == ["refunded 30000 on T1"]
    assert [line.split()[:2] for line in lines(tmp_path / "ledger")] == [["T1", "30000"]]
    assert hgate.approval(asked["approval_id"]).state is eg.ApprovalState.DENIED
    [edited] = [a for a in hgate.list_approvals(state=None)
                if a.approval_id != asked["approval_id"]]
    assert edited.decided_by == "carol" and edited.arguments is None  # consumed
    assert [line.split()[:2] for line in lines(tmp_path / "ledger")] == [["T1", "30000"]]


def test_a_replayed_edit_gets_the_stored_result_of_what_ran_not_a_denial(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    """The same paused Context restored again in a new process, with the same edit or a plain
    approval: the model is told what the edit did (the stored result), not "DENIED"."""
    in_process(hgate, tmp_path, "start")
    edit = {"response": "edit", "by": "carol",
            "arguments": {"txn_id": "T1", "amount_cents": 30_000}}
    assert in_process(hgate, tmp_path, "resume", edit)["tool_results"] == \
        ["refunded 30000 on T1"]
    replays = [in_new_process(store_url, namespace, tmp_path, "resume", edit),
               in_process(hgate, tmp_path, "resume", {"response": "approve", "by": "carol"})]
    for again in replays:
        assert again["tool_results"] and set(again["tool_results"]) == \
            {"refunded 30000 on T1"}, again
        assert again["final"] == "All done."
    assert [line.split()[:2] for line in lines(tmp_path / "ledger")] == [["T1", "30000"]]


def test_a_restored_context_takes_no_answer_naming_another_approval(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    """After ``Context.from_dict`` the workflow forgets the waiter's ``approval_id`` filter:
    the adapter checks it itself. An approval naming another id approves nothing and the call
    goes on waiting; the answer that names it is taken."""
    asked = in_process(hgate, tmp_path, "start")["event"]
    other = "apr_" + "0" * 20
    out = in_new_process(store_url, namespace, tmp_path, "resume", {"events": [
        {"response": "approve", "by": "mallory", "approval_id": other},
        {"response": "reject", "by": "dave", "message": "not this one"}]})
    assert lines(tmp_path / "ledger") == []
    [said] = set(out["tool_results"])
    assert said.startswith("DENIED") and "not this one" in said
    decided = hgate.approval(asked["approval_id"])
    assert decided.state is eg.ApprovalState.DENIED and decided.decided_by == "dave"


def test_with_two_pending_approvals_approving_one_never_executes_the_other(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    two = [{"txn_id": "T1", "amount_cents": 50_000}, {"txn_id": "T2", "amount_cents": 60_000}]
    monkeypatch.setenv("HITL_VARIANT", json.dumps({"calls": two}))
    asked = in_process(hgate, tmp_path, "start")["events"]
    by_key = {a["key"]: a["approval_id"] for a in asked}
    assert sorted(by_key) == ["refund:T1", "refund:T2"]
    first, second = (0, 1) if asked[0]["key"] == "refund:T1" else (1, 0)
    out = in_new_process(store_url, namespace, tmp_path, "resume", {"events": [
        {"for": first, "response": "approve", "by": "alice"},
        {"for": second, "response": "reject", "by": "alice"}]})
    assert [line.split()[:2] for line in lines(tmp_path / "ledger")] == [["T1", "50000"]]
    assert "refunded 50000 on T1" in out["tool_results"]
    assert hgate.approval(by_key["refund:T2"]).state is eg.ApprovalState.DENIED
    assert hgate.get("refund:T2").state is eg.State.DENIED


def test_a_rejection_executes_nothing_and_stays_denied(hgate: eg.Gate,
                                                       tmp_path: Path) -> None:
    asked = in_process(hgate, tmp_path, "start")["event"]
    out = in_process(hgate, tmp_path, "resume",
                     {"response": "reject", "by": "dave", "message": "not this one"})
    [said] = out["tool_results"]
    assert said.startswith("DENIED") and "not this one" in said
    assert hgate.approval(asked["approval_id"]).state is eg.ApprovalState.DENIED
    in_process(hgate, tmp_path, "resume", {"response": "approve"})
    assert lines(tmp_path / "ledger") == []


def test_an_answer_that_is_no_decision_records_nothing(hgate: eg.Gate,
                                                       tmp_path: Path) -> None:
    from .conftest import snapshot

    in_process(hgate, tmp_path, "start")
    before = snapshot(hgate)
    out = in_process(hgate, tmp_path, "resume", {"response": "sure, why not"})
    assert out["tool_results"][0].startswith("WAITING FOR APPROVAL")
    assert snapshot(hgate) == before and lines(tmp_path / "ledger") == []
