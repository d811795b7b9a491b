"""Approvals through LangGraph's own pause: a refund above the approval threshold interrupts a
LangChain v1 ``create_agent`` run (``HITLRequest`` payload), the process exits, and another
process resumes it from a SqliteSaver checkpoint with ``Command(resume=...)``. Real agent
loop, scripted model, both store backends; the refund is counted in an O_APPEND ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain.agents")
pytest.importorskip("langgraph.checkpoint.sqlite")

from langchain_core.messages import ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import effectgate as eg

from . import hitl_worker as worker

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"configurable": {"thread_id": worker.THREAD}}
APPROVE = {"decisions": [{"type": "approve"}]}


def lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def step(store_url: str, namespace: str, tmp: Path, name: str, answer: Any = None,
         form: str = "tool") -> dict[str, Any]:
    """One step of the run in a new OS process."""
    argv = [sys.executable, "-m", "tests.hitl_worker", "langchain", store_url, namespace,
            str(tmp / "ledger"), str(tmp / "checkpoints.db"), name]
    if answer is not None:
        argv.append(json.dumps(answer))
    env = {**os.environ, "HITL_FORM": form, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture
def hgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    with worker.make_gate(store_url, namespace) as gate:
        yield gate


class Run:
    """The same agent, rebuilt on the checkpoint file as a restarted process would."""

    def __init__(self, gate: eg.Gate, tmp: Path, form: str = "tool") -> None:
        self.gate, self.tmp, self.form = gate, tmp, form
        self.ledger = tmp / "ledger"

    def invoke(self, payload: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
        with SqliteSaver.from_conn_string(str(self.tmp / "checkpoints.db")) as saver:
            agent = worker.langchain_agent(self.gate, self.ledger, saver, self.form)
            return agent.invoke(payload, config=config or CONFIG)  # type: ignore[no-any-return]

    def start(self) -> dict[str, Any]:
        return self.invoke({"messages": [{"role": "user", "content": "refund T1"}]})

    def resume(self, answer: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.invoke(Command(resume=answer), config)

    def paused_checkpoint(self) -> dict[str, Any]:
        """The config of the checkpoint that paused at the tools step (what a second, racing
        resumer would load)."""
        with SqliteSaver.from_conn_string(str(self.tmp / "checkpoints.db")) as saver:
            agent = worker.langchain_agent(self.gate, self.ledger, saver, self.form)
            for snap in agent.get_state_history(CONFIG):
                if snap.next == ("tools",):
                    return dict(snap.config)
        raise AssertionError("no paused checkpoint")


def results(out: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]


def interrupt_value(out: dict[str, Any]) -> dict[str, Any]:
    [pause] = out["__interrupt__"]
    return pause.value  # type: ignore[no-any-return]


# -- across processes ------------------------------------------------------------------------


def test_paused_in_one_process_approved_on_resume_in_another_executes_once(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    # Paused here, resumed in a new OS process on the checkpoint file (LangChain takes seconds
    # to import: one new process only). Through JSON, as the worker prints it.
    first = json.loads(json.dumps(worker.langchain_step(
        hgate, tmp_path / "ledger", tmp_path / "checkpoints.db", "start", None, "tool"),
        default=str))
    [value] = first["interrupts"]
    [approval] = hgate.list_approvals()
    # LangChain's HITLRequest shape, bound to the store's approval of these exact arguments.
    assert value["action_requests"][0]["name"] == "refund"
    assert value["action_requests"][0]["args"] == worker.ARGS == approval.arguments
    assert "description" in value["action_requests"][0]
    assert value["review_configs"] == [{"action_name": "refund",
                                        "allowed_decisions": ["approve", "edit", "reject"]}]
    assert value["effectgate"]["approval_id"] == approval.approval_id
    assert value["effectgate"]["payload_hash"] == approval.payload_hash
    assert first["next"] == ["tools"] and lines(tmp_path / "ledger") == []

    second = step(store_url, namespace, tmp_path, "resume",
                  {"decisions": [{"type": "approve", "by": "alice"}]})
    assert second["tool_results"] == ["refunded 50000 on T1"] and second["next"] == []
    assert len(lines(tmp_path / "ledger")) == 1
    decided = hgate.approval(approval.approval_id)
    assert decided.decided_by == "alice"
    assert hgate.get("refund:T1").state is eg.State.COMMITTED

    # Replays: the finished thread again, and the paused checkpoint itself (a racing resumer).
    run = Run(hgate, tmp_path)
    run.resume(APPROVE)
    replay = run.resume(APPROVE, run.paused_checkpoint())
    assert results(replay)[-1] == "refunded 50000 on T1"  # the stored result
    assert len(lines(tmp_path / "ledger")) == 1


def test_approved_in_the_cli_then_resumed_executes_once(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path) -> None:
    run = Run(hgate, tmp_path, form="middleware")
    paused = run.start()
    approval_id = interrupt_value(paused)["effectgate"]["approval_id"]
    cli = subprocess.run(
        [sys.executable, "-m", "effectgate.cli", "approve", approval_id, "--by", "bob",
         "--url", store_url, "--namespace", namespace],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert lines(run.ledger) == []
    # The store is the source of truth: the resume finds it approved, whatever it says.
    out = step(store_url, namespace, tmp_path, "resume", {"decisions": [{"type": "reject"}]},
               form="middleware")
    assert out["tool_results"] == ["refunded 50000 on T1"]
    assert len(lines(run.ledger)) == 1 and hgate.approval(approval_id).decided_by == "bob"
    run.resume(APPROVE, run.paused_checkpoint())
    assert len(lines(run.ledger)) == 1


# -- in one process, a restart simulated by a new agent on the same checkpoint file ------------


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_an_edited_approval_executes_the_edited_arguments_once_never_the_original(
        hgate: eg.Gate, tmp_path: Path, form: str) -> None:
    run = Run(hgate, tmp_path, form)
    paused = run.start()
    original = interrupt_value(paused)["effectgate"]
    edit = {"decisions": [{"type": "edit", "by": "carol", "edited_action": {
        "name": "refund", "args": {"txn_id": "T1", "amount_cents": 30_000}}}]}
    out = run.resume(edit)
    [answer] = results(out)
    assert answer.startswith("Note: a human reviewer replaced this tool call")
    assert answer.endswith("refunded 30000 on T1")
    assert [line.split()[:2] for line in lines(run.ledger)] == [["T1", "30000"]]
    # The original is denied (replaced); the edit had its own approval, by the reviewer.
    assert hgate.approval(original["approval_id"]).state is eg.ApprovalState.DENIED
    [edited] = [a for a in hgate.list_approvals(state=None)
                if a.approval_id != original["approval_id"]]
    assert edited.decided_by == "carol" and edited.payload_hash != original["payload_hash"]
    assert edited.key.startswith("refund:T1~edit:")
    assert hgate.get(edited.key).state is eg.State.COMMITTED
    # Replaying the resume (from the paused checkpoint) executes nothing more, and tells the
    # model what ran: the edit's stored result, not a denial.
    for again in (edit, APPROVE):
        [replayed] = results(run.resume(again, run.paused_checkpoint()))[-1:]
        assert replayed.startswith("Note: a human reviewer replaced this tool call"), replayed
        assert replayed.endswith("refunded 30000 on T1")
    assert [line.split()[:2] for line in lines(run.ledger)] == [["T1", "30000"]]


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_replayed_edit_in_a_new_process_gets_the_stored_result_not_a_denial(
        store_url: str, namespace: str, hgate: eg.Gate, tmp_path: Path, form: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(hgate, tmp_path, form)
    run.start()
    edit = {"decisions": [{"type": "edit", "by": "carol", "edited_action": {
        "name": "refund", "args": {"txn_id": "T1", "amount_cents": 30_000}}}]}
    assert results(run.resume(edit))[-1].endswith("refunded 30000 on T1")
    # Another process resumes the paused checkpoint again (a replay, or a racing resumer).
    monkeypatch.setenv("HITL_VARIANT", json.dumps({"at_pause": True}))
    out = step(store_url, namespace, tmp_path, "resume", edit, form=form)
    replayed = out["tool_results"][-1]
    assert not replayed.startswith("DENIED"), replayed
    assert replayed.startswith("Note: a human reviewer replaced this tool call")
    assert replayed.endswith("refunded 30000 on T1") and out["next"] == []
    assert [line.split()[:2] for line in lines(tmp_path / "ledger")] == [["T1", "30000"]]


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_a_rejection_executes_nothing_and_stays_denied(hgate: eg.Gate, tmp_path: Path,
                                                       form: str) -> None:
    run = Run(hgate, tmp_path, form)
    approval_id = interrupt_value(run.start())["effectgate"]["approval_id"]
    out = run.resume({"decisions": [{"type": "reject", "message": "not this one"}]})
    [answer] = results(out)
    assert answer.startswith("DENIED") and "not this one" in answer
    assert hgate.approval(approval_id).state is eg.ApprovalState.DENIED
    run.resume(APPROVE, run.paused_checkpoint())
    assert lines(run.ledger) == []
    assert hgate.get("refund:T1").state is eg.State.DENIED


def test_denied_in_the_cli_is_not_undone_by_an_approving_resume(hgate: eg.Gate,
                                                                 tmp_path: Path) -> None:
    run = Run(hgate, tmp_path)
    approval_id = interrupt_value(run.start())["effectgate"]["approval_id"]
    hgate.deny(approval_id, by="dave", reason="fraud")
    [answer] = results(run.resume(APPROVE))
    assert answer.startswith("DENIED") and lines(run.ledger) == []


@pytest.mark.parametrize(("field", "what"), [("payload_hash", "other arguments"),
                                              ("approval_id", "another approval")])
def test_a_decision_for_another_payload_hash_approves_nothing(
        hgate: eg.Gate, tmp_path: Path, field: str, what: str) -> None:
    run = Run(hgate, tmp_path)
    approval_id = interrupt_value(run.start())["effectgate"]["approval_id"]
    forged = {"decisions": [{"type": "approve", field: "0" * 64}]}
    [answer] = results(run.resume(forged))
    assert answer.startswith("DENIED") and what in answer
    assert lines(run.ledger) == []
    assert hgate.approval(approval_id).state is eg.ApprovalState.PENDING


@pytest.mark.parametrize("answer", [
    "yes", {"decisions": []}, {"decisions": [{"type": "respond", "message": "done"}]},
    {"decisions": [{"type": "approve"}, {"type": "approve"}]},
    {"decisions": [{"type": "edit", "edited_action": {"name": "transfer", "args": {}}}]},
    {"decisions": [{"type": "edit"}]}, {"decisions": [{"type": "approve", "by": ""}]},
    {"decisions": [{"type": "approve", "by": "x" * 300}]},
    {"decisions": [{"type": "approve", "by": ["alice"]}]},
    {"decisions": [{"type": "reject", "message": "\x00"}]},
])
def test_a_malformed_resume_is_asked_again_and_records_nothing(
        hgate: eg.Gate, tmp_path: Path, answer: Any) -> None:
    from .conftest import snapshot

    run = Run(hgate, tmp_path)
    first = interrupt_value(run.start())
    before = snapshot(hgate)
    again = interrupt_value(run.resume(answer))
    assert again["error"] and again["effectgate"] == first["effectgate"]
    assert snapshot(hgate) == before and lines(run.ledger) == []
    assert results(run.resume(APPROVE)) == ["refunded 50000 on T1"]
    assert len(lines(run.ledger)) == 1


def test_an_edit_with_arguments_of_the_wrong_type_is_refused_and_runs_nothing(
        hgate: eg.Gate, tmp_path: Path) -> None:
    run = Run(hgate, tmp_path)
    approval_id = interrupt_value(run.start())["effectgate"]["approval_id"]
    bad = {"decisions": [{"type": "edit", "edited_action": {
        "name": "refund", "args": {"txn_id": "T1", "amount_cents": "lots"}}}]}
    [answer] = results(run.resume(bad))
    assert answer.startswith("INVALID ARGUMENTS") and lines(run.ledger) == []
    assert hgate.approval(approval_id).state is eg.ApprovalState.PENDING


def test_without_a_checkpointer_the_model_is_told_in_text(hgate: eg.Gate,
                                                           tmp_path: Path) -> None:
    agent = worker.langchain_agent(hgate, tmp_path / "ledger", None)
    out = agent.invoke({"messages": [{"role": "user", "content": "refund T1"}]}, config=CONFIG)
    assert "__interrupt__" not in out
    [answer] = results(out)
    assert answer.startswith("WAITING FOR APPROVAL") and lines(tmp_path / "ledger") == []


def test_a_reviewer_cannot_be_the_agent_that_asked(hgate: eg.Gate, tmp_path: Path) -> None:
    run = Run(hgate, tmp_path)
    approval_id = interrupt_value(run.start())["effectgate"]["approval_id"]
    [answer] = results(run.resume({"decisions": [{"type": "approve", "by": "billing"}]}))
    assert answer.startswith("WAITING FOR APPROVAL") and lines(run.ledger) == []
    assert hgate.approval(approval_id).state is eg.ApprovalState.PENDING


def test_an_edit_naming_another_transaction_is_gated_under_that_key(hgate: eg.Gate,
                                                                    tmp_path: Path) -> None:
    run = Run(hgate, tmp_path)
    run.start()
    edit = {"decisions": [{"type": "edit", "edited_action": {
        "name": "refund", "args": {"txn_id": "T2", "amount_cents": 50_000}}}]}
    [answer] = results(run.resume(edit))
    assert answer.endswith("refunded 50000 on T2")
    assert hgate.get("refund:T2").state is eg.State.COMMITTED
    assert hgate.get("refund:T1").state is eg.State.DENIED
    assert [line.split()[:2] for line in lines(run.ledger)] == [["T2", "50000"]]


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_the_async_loop_pauses_and_resumes_the_same_way(hgate: eg.Gate, tmp_path: Path,
                                                        form: str) -> None:
    import asyncio

    from langgraph.checkpoint.memory import InMemorySaver

    saver = InMemorySaver()
    agent = worker.langchain_agent(hgate, tmp_path / "ledger", saver, form)

    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        paused = await agent.ainvoke({"messages": [{"role": "user", "content": "refund"}]},
                                     config=CONFIG)
        done = await agent.ainvoke(Command(resume=APPROVE), config=CONFIG)
        history = [s async for s in agent.aget_state_history(CONFIG)]
        [at_pause] = [s for s in history if s.next == ("tools",)]
        replay = await agent.ainvoke(Command(resume=APPROVE), config=at_pause.config)
        return paused, done, replay

    paused, done, replay = asyncio.run(go())
    assert interrupt_value(paused)["effectgate"]["key"] == "refund:T1"
    assert results(done) == ["refunded 50000 on T1"]
    assert results(replay)[-1] == "refunded 50000 on T1"
    assert len(lines(tmp_path / "ledger")) == 1


def test_two_calls_in_one_turn_pause_together_and_resume_by_interrupt_id(
        hgate: eg.Gate, tmp_path: Path) -> None:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from effectgate.integrations import langchain as eg_lc

    class Model(FakeMessagesListChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        return worker.book(tmp_path / "ledger", txn_id, amount_cents)

    calls = [{"name": "refund", "args": {"txn_id": t, "amount_cents": 50_000}, "id": f"c{t}",
              "type": "tool_call"} for t in ("T1", "T2")]
    model = Model(responses=[AIMessage("", tool_calls=calls), AIMessage("done")])
    agent = create_agent(model, tools=[eg_lc.gate_tool(refund, "refund:{txn_id}", gate=hgate,
                                                       cost_micros=worker.cost)],
                         checkpointer=InMemorySaver())
    paused = agent.invoke({"messages": [{"role": "user", "content": "two"}]}, config=CONFIG)
    pauses = {p.value["effectgate"]["key"]: p.id for p in paused["__interrupt__"]}
    assert sorted(pauses) == ["refund:T1", "refund:T2"]
    answers = {pauses["refund:T1"]: APPROVE,
               pauses["refund:T2"]: {"decisions": [{"type": "reject"}]}}
    out = agent.invoke(Command(resume=answers), config=CONFIG)
    assert sorted(results(out)) == ["DENIED: effect 'refund:T2' was refused (rejected by "
                                    "langgraph-resume). It has not been carried out. Do not "
                                    "retry it; tell the user why.", "refunded 50000 on T1"]
    assert [line.split()[:2] for line in lines(tmp_path / "ledger")] == [["T1", "50000"]]


def test_a_middleware_edit_of_an_aliased_schema_runs_the_edited_arguments(
        hgate: eg.Gate, tmp_path: Path) -> None:
    """The tool's schema reads aliases (``txn``, ``amount``) and the model used them; the
    reviewer's edit came back by field name. Merged with the model's arguments, the alias was
    the value the tool read: the denied 50000 ran, recorded as the approved 40000."""
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langgraph.checkpoint.memory import InMemorySaver
    from pydantic import BaseModel, ConfigDict, Field

    from effectgate.integrations import langchain as eg_lc

    class RefundArgs(BaseModel):
        model_config = ConfigDict(populate_by_name=True)
        txn_id: str = Field(alias="txn")
        amount_cents: int = Field(alias="amount")

    ran: list[tuple[str, int]] = []

    def refund(txn_id: str, amount_cents: int) -> str:
        ran.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    tool = StructuredTool.from_function(refund, name="refund", description="Refund.",
                                        args_schema=RefundArgs)
    middleware = eg_lc.EffectGateMiddleware({"refund": {
        "key": "refund:{txn_id}", "cost_micros": lambda amount_cents: amount_cents * 10_000}},
        gate=hgate)
    model = worker.scripted_model({"txn": "T1", "amount": 50_000})  # the model's aliases
    agent = create_agent(model, tools=[tool], middleware=[middleware],
                         checkpointer=InMemorySaver())
    paused = agent.invoke({"messages": [{"role": "user", "content": "refund"}]}, config=CONFIG)
    shown = interrupt_value(paused)["action_requests"][0]["args"]
    assert shown == {"txn_id": "T1", "amount_cents": 50_000} and ran == []
    edit = {"type": "edit", "by": "alice", "edited_action": {
        "name": "refund", "args": {**shown, "amount_cents": 40_000}}}
    out = agent.invoke(Command(resume={"decisions": [edit]}), config=CONFIG)
    assert ran == [("T1", 40_000)]
    assert results(out)[-1].endswith("refunded 40000 on T1")


def expire(gate: eg.Gate, approval_id: str) -> None:
    from sqlalchemy import text

    with gate.store.engine.begin() as conn:
        conn.execute(text("UPDATE effectgate_approvals SET expires_at = expires_at - 1000000 "
                          "WHERE namespace = :ns AND id = :id"),
                     {"ns": gate.namespace, "id": approval_id})


@pytest.mark.parametrize("form", ["tool", "middleware"])
def test_an_answer_arriving_after_its_request_expired_approves_nothing(
        hgate: eg.Gate, tmp_path: Path, form: str) -> None:
    run = Run(hgate, tmp_path, form)
    shown = interrupt_value(run.start())["effectgate"]["approval_id"]
    expire(hgate, shown)
    [answer] = results(run.resume(APPROVE))
    # The resumed call opened a new request in the expired one's place: nobody was shown it,
    # so the late answer approves nothing and the model is told that the new request waits.
    [pending] = hgate.list_approvals()
    assert answer.startswith("WAITING FOR APPROVAL") and pending.approval_id in answer
    assert lines(run.ledger) == []
    assert pending.approval_id != shown and pending.state is eg.ApprovalState.PENDING
    assert hgate.get("refund:T1").state is eg.State.PENDING_APPROVAL
    # The paused checkpoint resumed again (a replay, a racing resumer): its answer is bound to
    # the request the checkpoint recorded showing, never to the one opened since.
    [again] = results(run.resume(APPROVE, run.paused_checkpoint()))
    assert again.startswith("WAITING FOR APPROVAL") and lines(run.ledger) == []
    assert hgate.approval(pending.approval_id).state is eg.ApprovalState.PENDING

