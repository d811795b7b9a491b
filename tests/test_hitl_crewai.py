"""Approvals with CrewAI, which has no pause that survives a process: a refund above the
approval threshold is answered with its approval request (recorded in the store with the
arguments that would execute), a human decides in the CLI, and the next kickoff — in another
process — executes it once. Real crew loop, scripted ``BaseLLM``, both backends; the refund is
counted in an O_APPEND ledger."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("crewai")

import effectgate as eg

from . import hitl_worker as worker

lines = worker.lines


@pytest.fixture
def hgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    with worker.make_gate(store_url, namespace) as gate:
        yield gate


def here(gate: eg.Gate, tmp: Path) -> list[str]:
    out = worker.crew_step(gate, tmp / "ledger", tmp / "state.json", "start", None)
    return list(out["tool_results"])


def cli(store_url: str, namespace: str, tmp: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "effectgate.cli", *args, "--url", store_url,
                           "--namespace", namespace],
                          cwd=tmp, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_approved_in_the_cli_the_next_kickoff_in_another_process_executes_once(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    [said] = here(hgate, tmp_path)  # (CrewAI takes seconds to import: one new process only)
    [approval] = hgate.list_approvals()
    assert said.startswith("WAITING FOR APPROVAL") and approval.approval_id in said
    assert approval.arguments == worker.ARGS and lines(tmp_path / "ledger") == []
    cli(store_url, namespace, tmp_path, "approve", approval.approval_id, "--by", "bob")
    second = worker.in_new_process("crewai", store_url, namespace, tmp_path, "resume")
    assert second["tool_results"] == ["refunded 50000 on T1"]
    assert len(lines(tmp_path / "ledger")) == 1
    assert hgate.approval(approval.approval_id).decided_by == "bob"
    assert here(hgate, tmp_path) == ["refunded 50000 on T1"]  # the stored result
    assert len(lines(tmp_path / "ledger")) == 1


def test_undecided_the_request_stays_one_request_and_nothing_runs(
        hgate: eg.Gate, tmp_path: Path) -> None:
    [first] = here(hgate, tmp_path)
    [again] = here(hgate, tmp_path)
    [approval] = hgate.list_approvals()
    assert approval.approval_id in first and approval.approval_id in again
    assert lines(tmp_path / "ledger") == []


def test_a_denial_in_the_cli_is_what_the_next_kickoff_hears(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    here(hgate, tmp_path)
    [approval] = hgate.list_approvals()
    cli(store_url, namespace, tmp_path, "deny", approval.approval_id, "--by", "dave",
        "--reason", "not this one")
    [said] = here(hgate, tmp_path)
    assert said.startswith("DENIED") and lines(tmp_path / "ledger") == []
