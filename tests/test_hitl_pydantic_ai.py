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


def test_override_args_execute_the_edited_arguments_once_never_the_original(
        hgate: eg.Gate, tmp_path: Path) -> None:
    first = in_process(hgate, tmp_path, "start")
    original = first["metadata"]["call_1"]["effectgate"]["approval_id"]
    edit = {"args": {"txn_id": "T1", "amount_cents": 30_000}}
    assert in_process(hgate, tmp_path, "resume", edit)["tool_results"] == \
        ["refunded 30000 on T1"]
    assert hgate.approval(original).state is eg.ApprovalState.DENIED
    [edited] = [a for a in hgate.list_approvals(state=None) if a.approval_id != original]
    assert edited.key.startswith("refund:T1~edit:")
    assert edited.decided_by == "pydantic-ai-resume"
    assert in_process(hgate, tmp_path, "resume", edit)["tool_results"] == \
        ["refunded 30000 on T1"]
    in_process(hgate, tmp_path, "resume", {})  # the original, approved after the edit
    assert [line.split()[:2] for line in lines(tmp_path / "ledger")] == [["T1", "30000"]]


def test_a_denial_recorded_in_the_store_executes_nothing(hgate: eg.Gate,
                                                         tmp_path: Path) -> None:
    first = in_process(hgate, tmp_path, "start")
    hgate.deny(first["metadata"]["call_1"]["effectgate"]["approval_id"], by="dave")
    [said] = in_process(hgate, tmp_path, "resume", {})["tool_results"]
    assert said.startswith("DENIED") and lines(tmp_path / "ledger") == []


def test_metadata_naming_another_approval_approves_nothing(hgate: eg.Gate,
                                                           tmp_path: Path) -> None:
    in_process(hgate, tmp_path, "start")
    state = json.loads((tmp_path / "state.json").read_text())
    state["metadata"]["call_1"]["effectgate"]["approval_id"] = "apr_forged"
    (tmp_path / "state.json").write_text(json.dumps(state))
    [said] = in_process(hgate, tmp_path, "resume", {})["tool_results"]
    assert said.startswith("WAITING FOR APPROVAL") and lines(tmp_path / "ledger") == []
    assert hgate.list_approvals()[0].state is eg.ApprovalState.PENDING
