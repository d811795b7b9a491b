"""A human's "no" to a paused call whose approval request the store already decided otherwise
(approved in the CLI or the console, consumed by a run, denied, replaced by an edit): it says
so — ``InvalidTransition``, nothing written, the framework not told — or it is answered as the
store decided; it never tells the model "rejected" over a store that stays approved (the next
call with the same arguments would execute). Real framework loops, scripted models, both
backends; the refund is counted in an O_APPEND ledger."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate.integrations._kernel import GatedCall, Refused
from effectgate.integrations._kernel.call import keep_refusal
from effectgate.integrations._kernel.review import Verdict, aapply, apply, review_of

from . import hitl_worker as worker
from .conftest import snapshot

lines = worker.lines


@pytest.fixture
def hgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    with worker.make_gate(store_url, namespace) as gate:
        yield gate


# -- OpenAI Agents: reject() ---------------------------------------------------------------------


def _openai_reject(gate: eg.Gate, tmp: Path, by: str, reason: str | None) -> list[str]:
    """Restore the paused RunState, reject its interruption with ``eg_oa.reject`` and run on:
    what the model was told. ``InvalidTransition`` propagates (the interruption still waits)."""
    from agents import Runner, RunState, ToolCallOutputItem

    from effectgate.integrations import openai_agents as eg_oa

    agent = worker.openai_agent(gate, tmp / "ledger", "resume")

    async def go() -> list[str]:
        state = await RunState.from_json(agent, json.loads((tmp / "state.json").read_text()))
        [item] = state.get_interruptions()
        try:
            eg_oa.reject(state, item, by=by, reason=reason)
        except eg.InvalidTransition:
            assert state._context.is_tool_approved("refund", item.call_id) is None  # not told
            raise
        result = await Runner.run(agent, state)
        return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]

    return asyncio.run(go())


@pytest.mark.parametrize("decided", ["approved", "consumed"])
def test_openai_reject_of_a_request_the_store_approved_is_refused_and_records_nothing(
        hgate: eg.Gate, tmp_path: Path, decided: str) -> None:
    """It told the model "DENIED: rejected by carol" while the store stayed approved: the next
    run making the same call refunded with no human asked."""
    pytest.importorskip("agents")
    asyncio.run(worker.openai_step(hgate, tmp_path / "ledger", tmp_path / "state.json",
                                   "start", None))
    [shown] = hgate.list_approvals()
    hgate.approve(shown.approval_id, by="bob")  # in the CLI or the console
    if decided == "consumed":  # and run, by a resume of a copy of the paused state
        copy = tmp_path / "copy"
        copy.mkdir()
        (copy / "state.json").write_text((tmp_path / "state.json").read_text())
        out = asyncio.run(worker.openai_step(hgate, tmp_path / "ledger", copy / "state.json",
                                             "resume", {"decision": "store"}))
        assert out["tool_results"] == ["refunded 50000 on T1"]
    before = snapshot(hgate)
    with pytest.raises(eg.InvalidTransition, match="approved in the store") as raised:
        _openai_reject(hgate, tmp_path, "carol", "no")
    assert raised.value.key == "refund:T1"
    assert snapshot(hgate) == before
    # The approval stands: carried into the state, it executes once (or answers the result).
    out = asyncio.run(worker.openai_step(hgate, tmp_path / "ledger", tmp_path / "state.json",
                                         "resume", {"decision": "store"}))
    assert out["tool_results"] == ["refunded 50000 on T1"]
    assert len(lines(tmp_path / "ledger")) == 1


def test_openai_reject_of_a_request_denied_in_the_store_carries_that_denial(
        hgate: eg.Gate, tmp_path: Path) -> None:
    """Denied by bob in the console, then carol's reject: the model hears bob's denial (it
    heard carol's, which was never recorded), and nothing is written."""
    pytest.importorskip("agents")
    asyncio.run(worker.openai_step(hgate, tmp_path / "ledger", tmp_path / "state.json",
                                   "start", None))
    [shown] = hgate.list_approvals()
    hgate.deny(shown.approval_id, by="bob", reason="too big")
    before = snapshot(hgate)
    [said] = _openai_reject(hgate, tmp_path, "carol", "no")
    assert said.startswith("DENIED") and "too big" in said and "carol" not in said
    assert snapshot(hgate) == before and lines(tmp_path / "ledger") == []


# -- the kernel (LangChain, LlamaIndex, and the confirmation adapters' resume) ------------------

POLICY = {"effects": {"refund": {"approval": "always"}}}
ARGS = {"txn_id": "T1", "amount_cents": 500}


@pytest.fixture
def gated(make_gate: Any) -> GatedCall:
    spec = eg.EffectSpec(make_gate(policy=POLICY), "refund:{txn_id}", effect_type="refund")
    return GatedCall(spec, "refund", pause=keep_refusal)


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_a_reject_raced_by_an_approval_in_the_store_answers_what_the_store_decided(
        gated: GatedCall, caller: str) -> None:
    """Bob approves in the CLI after the resumed call found the request pending, before the
    reviewer's reject is applied. The denial failed quietly and the model was told "rejected"
    while the store stayed approved (the next call executed). Now the store's decision
    stands, as it does when the approval lands first: the call runs, once."""
    done: list[dict[str, Any]] = []

    def body(arguments: Any) -> Any:
        return lambda: done.append(dict(arguments)) or "ok"

    refused = gated.run(ARGS, body(ARGS))
    review = review_of(gated, refused, ARGS)
    gate = gated.spec.gate
    gate.approve(review.approval_id, by="bob")
    no = Verdict("reject", by="carol", message="no")
    if caller == "sync":
        out = apply(gated, review, no, ARGS, lambda one, a: one.run(a, body(a)))
    else:
        async def arun(one: GatedCall, arguments: Any) -> Any:
            async def call() -> Any:
                return body(arguments)()
            return await one.arun(arguments, call)

        out = asyncio.run(aapply(gated, review, no, ARGS, arun))
    assert out == "ok" and done == [ARGS]
    assert gate.approval(review.approval_id).state is eg.ApprovalState.CONSUMED
    again = apply(gated, review, no, ARGS, lambda one, a: one.run(a, body(a)))  # replayed
    assert again == "ok" and done == [ARGS]


def test_a_reject_of_a_pending_request_still_denies_it(gated: GatedCall) -> None:
    refused = gated.run(ARGS, lambda: None)
    review = review_of(gated, refused, ARGS)
    out = apply(gated, review, Verdict("reject", by="carol"), ARGS,
                lambda one, a: one.run(a, lambda: "ran"))
    assert isinstance(out, Refused) and out.kind == "denied"
    assert gated.spec.gate.approval(review.approval_id).state is eg.ApprovalState.DENIED


# -- pydantic-ai: reject() ----------------------------------------------------------------------


def test_pydantic_reject_of_a_request_an_edit_replaced_is_refused_and_records_nothing(
        hgate: eg.Gate, tmp_path: Path) -> None:
    """An edit (override_args) replaced the request and, approved, refunded 30000; carol's
    reject of the original pause then told the model "DENIED ... It has not been carried out"
    — the model told the user nothing was refunded."""
    pytest.importorskip("pydantic_ai")
    from effectgate.integrations import pydantic_ai as eg_pa

    state = tmp_path / "state.json"
    meta = worker.pydantic_step(hgate, tmp_path / "ledger", state, "start",
                                None)["metadata"]["call_1"]
    original = state.read_text()
    edit = {"args": {"txn_id": "T1", "amount_cents": 30_000}}
    paused = worker.pydantic_step(hgate, tmp_path / "ledger", state, "resume", edit)["paused"]
    hgate.approve(paused["metadata"]["call_1"]["effectgate"]["approval_id"], by="bob")
    state.write_text(json.dumps(paused))
    ran = worker.pydantic_step(hgate, tmp_path / "ledger", state, "resume", edit)
    assert ran["tool_results"] == ["refunded 30000 on T1"]
    state.write_text(original)
    before = snapshot(hgate)
    with pytest.raises(eg.InvalidTransition, match="replaced by an edit"):
        eg_pa.reject(meta, gate=hgate, by="carol", reason="no")
    assert snapshot(hgate) == before and len(lines(tmp_path / "ledger")) == 1
