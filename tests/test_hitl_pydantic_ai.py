"""Approvals through pydantic-ai's deferred tools: a refund above the approval threshold raises
``ApprovalRequired`` in the gating toolset, the run ends with ``DeferredToolRequests``, and
another process resumes from the message history with ``DeferredToolResults``. Real agent
loop, ``FunctionModel``, both backends; the refund is counted in an O_APPEND ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

import effectgate as eg

from . import hitl_worker as worker

ROOT = Path(__file__).resolve().parents[1]


lines = worker.lines


@pytest.fixture
def hgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    with worker.make_gate(store_url, namespace) as gate:
        yield gate


def in_process(gate: eg.Gate, tmp: Path, name: str, answer: Any = None) -> dict[str, Any]:
    return worker.pydantic_step(gate, tmp / "ledger", tmp / "state.json", name, answer)


def test_deferred_in_one_process_approved_in_another_executes_once(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    first = in_process(hgate, tmp_path, "start")
    meta = first["metadata"]["call_1"]
    [approval] = hgate.list_approvals()
    assert meta["effectgate"]["approval_id"] == approval.approval_id
    assert meta["effectgate"]["payload_hash"] == approval.payload_hash
    assert meta["arguments"] == worker.ARGS and lines(tmp_path / "ledger") == []
    argv = [sys.executable, "-m", "tests.hitl_worker", "pydantic_ai", store_url, namespace,
            str(tmp_path / "ledger"), str(tmp_path / "state.json"), "resume", "{}"]
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["tool_results"] == ["refunded 50000 on T1"] and out["output"] == "All done."
    assert len(lines(tmp_path / "ledger")) == 1
    assert hgate.approval(approval.approval_id).decided_by == "pydantic-ai-resume"
    replay = in_process(hgate, tmp_path, "resume", {})
    assert replay["tool_results"] == ["refunded 50000 on T1"]
    assert len(lines(tmp_path / "ledger")) == 1


def test_approved_in_the_cli_then_resumed_executes_once(hgate: eg.Gate, tmp_path: Path,
                                                        store_url: str, namespace: str) -> None:
    in_process(hgate, tmp_path, "start")
    [approval] = hgate.list_approvals()
    cli = subprocess.run(
        [sys.executable, "-m", "effectgate.cli", "approve", approval.approval_id, "--by", "bob",
         "--url", store_url, "--namespace", namespace],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert in_process(hgate, tmp_path, "resume", {})["tool_results"] == ["refunded 50000 on T1"]
    assert hgate.approval(approval.approval_id).decided_by == "bob"
    in_process(hgate, tmp_path, "resume", {})
    assert len(lines(tmp_path / "ledger")) == 1


def in_new_process(store_url: str, namespace: str, tmp: Path, name: str,
                   answer: Any = None) -> dict[str, Any]:
    return worker.in_new_process("pydantic_ai", store_url, namespace, tmp, name, answer)


def pause_again(tmp: Path, out: dict[str, Any]) -> dict[str, Any]:
    """Save the pause a resume ended in, as the next resume reads it; its metadata."""
    (tmp / "state.json").write_text(json.dumps(out["paused"]))
    return out["paused"]["metadata"]["call_1"]  # type: ignore[no-any-return]


def test_override_args_pause_again_for_their_own_approval_then_execute_once(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    """``ToolApproved(override_args=...)`` is an edit: the edited arguments are their own
    request, shown and left pending for a human (the resume cannot tell a reviewer's edit from
    altered history); the original is denied, replaced. Approving the new pause executes the
    edited arguments once; replays get the stored result."""
    first = in_process(hgate, tmp_path, "start")
    original = first["metadata"]["call_1"]["effectgate"]["approval_id"]
    first_pause = (tmp_path / "state.json").read_text()
    edit = {"args": {"txn_id": "T1", "amount_cents": 30_000}}
    out = in_new_process(store_url, namespace, tmp_path, "resume", edit)
    assert out["tool_results"] == [] and lines(tmp_path / "ledger") == []
    meta = pause_again(tmp_path, out)
    assert meta["arguments"] == edit["args"]
    edited = hgate.approval(meta["effectgate"]["approval_id"])
    assert edited.state is eg.ApprovalState.PENDING and edited.key.startswith("refund:T1~edit:")
    assert edited.arguments == edit["args"]
    assert hgate.approval(original).state is eg.ApprovalState.DENIED
    # The reviewer approves what the new pause shows: it executes, once.
    done = in_process(hgate, tmp_path, "resume", edit)
    assert done["tool_results"] == ["refunded 30000 on T1"]
    assert hgate.approval(edited.approval_id).decided_by == "pydantic-ai-resume"
    assert in_process(hgate, tmp_path, "resume", edit)["tool_results"] == \
        ["refunded 30000 on T1"]
    # The first pause replayed, with the edit or with a plain approval: what ran, stored.
    (tmp_path / "state.json").write_text(first_pause)
    assert in_process(hgate, tmp_path, "resume", edit)["tool_results"] == \
        ["refunded 30000 on T1"]
    assert in_process(hgate, tmp_path, "resume", {})["tool_results"] == \
        ["refunded 30000 on T1"]
    assert [line.split()[:2] for line in lines(tmp_path / "ledger")] == [["T1", "30000"]]


def test_arguments_changed_in_the_history_are_never_approved_by_the_original_approval(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    """The human approved 50,000; the saved history now says 99,999. The resume executes
    nothing: 99,999 is its own request, pending until a human decides it in the store."""
    first = in_process(hgate, tmp_path, "start")
    original = first["metadata"]["call_1"]["effectgate"]["approval_id"]
    forged = {"history_args": {"txn_id": "T1", "amount_cents": 99_999}}
    out = in_new_process(store_url, namespace, tmp_path, "resume", forged)
    assert lines(tmp_path / "ledger") == [] and out["tool_results"] == []
    meta = pause_again(tmp_path, out)
    asked = hgate.approval(meta["effectgate"]["approval_id"])
    assert asked.state is eg.ApprovalState.PENDING and asked.decided_by is None
    assert asked.arguments == forged["history_args"] == meta["arguments"]
    assert hgate.approval(original).state is eg.ApprovalState.DENIED
    # Decided by a human in the store: denied. The paused run executes nothing, ever.
    hgate.deny(asked.approval_id, by="dave", reason="not what I approved")
    [said] = in_process(hgate, tmp_path, "resume", {})["tool_results"]
    assert said.startswith("DENIED") and lines(tmp_path / "ledger") == []


def test_a_documented_reject_replayed_is_the_same_answer_and_changes_nothing(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    from .conftest import snapshot

    first = in_process(hgate, tmp_path, "start")
    approval_id = first["metadata"]["call_1"]["effectgate"]["approval_id"]
    reject = {"reject": {"by": "dave", "reason": "not this one"}}
    [said] = in_process(hgate, tmp_path, "resume", reject)["tool_results"]
    assert said.startswith("DENIED") and "not this one" in said
    decided = hgate.approval(approval_id)
    assert decided.state is eg.ApprovalState.DENIED and decided.decided_by == "dave"
    before = snapshot(hgate)
    again = in_new_process(store_url, namespace, tmp_path, "resume", reject)
    assert again["tool_results"] == [said]
    assert snapshot(hgate) == before and lines(tmp_path / "ledger") == []


def test_a_reject_of_a_request_the_store_approved_is_refused_and_changes_nothing(
        hgate: eg.Gate, tmp_path: Path) -> None:
    from effectgate.integrations import pydantic_ai as eg_pa

    from .conftest import snapshot

    meta = in_process(hgate, tmp_path, "start")["metadata"]["call_1"]
    hgate.approve(meta["effectgate"]["approval_id"], by="bob")
    before = snapshot(hgate)
    with pytest.raises(eg.InvalidTransition, match="approved"):
        eg_pa.reject(meta, gate=hgate, by="dave")
    assert snapshot(hgate) == before


@pytest.mark.parametrize("bad", [None, "x", 7, {}, {"effectgate": None},
                                 {"effectgate": {"approval_id": 5}},
                                 {"effectgate": {"approval_id": "apr_" + "0" * 20}},
                                 {"effectgate": {"approval_id": "x" * 500}}])
def test_a_reject_of_metadata_naming_no_request_is_a_typed_error(hgate: eg.Gate,
                                                                tmp_path: Path,
                                                                bad: Any) -> None:
    from effectgate.integrations import pydantic_ai as eg_pa

    from .conftest import snapshot

    in_process(hgate, tmp_path, "start")
    before = snapshot(hgate)
    with pytest.raises(eg.EffectGateError):
        eg_pa.reject(bad, gate=hgate, by="dave")
    assert snapshot(hgate) == before


def test_a_denial_recorded_in_the_store_executes_nothing(hgate: eg.Gate,
                                                         tmp_path: Path) -> None:
    first = in_process(hgate, tmp_path, "start")
    hgate.deny(first["metadata"]["call_1"]["effectgate"]["approval_id"], by="dave")
    [said] = in_process(hgate, tmp_path, "resume", {})["tool_results"]
    assert said.startswith("DENIED") and lines(tmp_path / "ledger") == []


def test_metadata_naming_another_approval_approves_nothing(hgate: eg.Gate,
                                                           tmp_path: Path) -> None:
    first = in_process(hgate, tmp_path, "start")
    real = first["metadata"]["call_1"]["effectgate"]["approval_id"]
    state = json.loads((tmp_path / "state.json").read_text())
    state["metadata"]["call_1"]["effectgate"]["approval_id"] = "apr_forged"
    (tmp_path / "state.json").write_text(json.dumps(state))
    out = in_process(hgate, tmp_path, "resume", {})
    # Still waiting: the run pauses again, on the request the store really holds.
    assert out["tool_results"] == [] and lines(tmp_path / "ledger") == []
    assert out["paused"]["metadata"]["call_1"]["effectgate"]["approval_id"] == real
    assert hgate.approval(real).state is eg.ApprovalState.PENDING


def test_resume_metadata_of_another_run_decides_nothing_of_that_run(
        hgate: eg.Gate, tmp_path: Path) -> None:
    """Run B (refund T2) resumed with run A's metadata (a UI that mixed them up): A's request
    was denied as "replaced by an edit" and A, approved later, was answered with B's refund.
    The metadata names a request that is not this call's: the store answers B's own call (it
    pauses again, on its own request), and A's request is untouched."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ledger = tmp_path / "ledger"
    t2 = {"txn_id": "T2", "amount_cents": 90_000}
    a = worker.pydantic_step(hgate, ledger, tmp_path / "a" / "state.json", "start", None)
    worker.pydantic_step(hgate, ledger, tmp_path / "b" / "state.json", "start", None, t2)
    a_request = a["metadata"]["call_1"]["effectgate"]["approval_id"]
    b_state = json.loads((tmp_path / "b" / "state.json").read_text())
    b_request = b_state["metadata"]["call_1"]["effectgate"]["approval_id"]
    b_state["metadata"] = a["metadata"]  # the mix-up
    (tmp_path / "b" / "state.json").write_text(json.dumps(b_state))
    mixed = worker.pydantic_step(hgate, ledger, tmp_path / "b" / "state.json", "resume", {},
                                 t2)
    assert mixed["tool_results"] == [] and lines(ledger) == []
    assert mixed["paused"]["metadata"]["call_1"]["effectgate"]["approval_id"] == b_request
    assert hgate.approval(a_request).state is eg.ApprovalState.PENDING
    done = worker.pydantic_step(hgate, ledger, tmp_path / "a" / "state.json", "resume", {})
    assert done["tool_results"] == ["refunded 50000 on T1"]
    assert [line.split()[:2] for line in lines(ledger)] == [["T1", "50000"]]
