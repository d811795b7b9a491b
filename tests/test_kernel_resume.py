"""The adapter kernel's resume (``_kernel/resume.py``), without a framework: a yes or no to a
paused call, applied only after the store was asked, and only to the store's own pending
request for exactly these arguments (both backends)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import effectgate as eg
from effectgate.integrations._kernel import GatedCall, Refused
from effectgate.integrations._kernel.call import keep_refusal
from effectgate.integrations._kernel.resume import Answer, aresume, claimed

from .conftest import snapshot

POLICY = {"effects": {"refund": {"approval": "always"}}}
ARGS = {"txn_id": "T1", "amount_cents": 500}


@pytest.fixture
def gated(make_gate: Any) -> GatedCall:
    spec = eg.EffectSpec(make_gate(policy=POLICY), "refund:{txn_id}", effect_type="refund")
    return GatedCall(spec, "refund", pause=keep_refusal)


def resume(gated: GatedCall, answer: Answer, done: list[Any]) -> Any:
    async def run(one: GatedCall, arguments: Any) -> Any:
        async def body() -> str:
            done.append(dict(arguments))
            return "ok"
        return await one.arun(arguments, body)

    return asyncio.run(aresume(gated, ARGS, answer, run))


def paused(gated: GatedCall) -> eg.ApprovalRecord:
    out = gated.run(ARGS, lambda: pytest.fail("ran before approval"))
    assert isinstance(out, Refused) and out.kind == "approval_required"
    [record] = gated.spec.gate.list_approvals()
    return record


def test_a_yes_executes_once_and_a_replayed_yes_gets_the_stored_result(
        gated: GatedCall) -> None:
    record = paused(gated)
    done: list[Any] = []
    answer = Answer(True, "alice", approval_id=record.approval_id,
                    payload_hash=record.payload_hash)
    assert resume(gated, answer, done) == "ok" and resume(gated, answer, done) == "ok"
    assert done == [ARGS]
    assert gated.spec.gate.approval(record.approval_id).decided_by == "alice"


def test_a_no_denies_and_a_later_yes_is_still_denied(gated: GatedCall) -> None:
    record = paused(gated)
    done: list[Any] = []
    first = resume(gated, Answer(False, "bob", message="no", approval_id=record.approval_id),
                   done)
    assert isinstance(first, Refused) and first.kind == "denied"
    later = resume(gated, Answer(True, "alice", approval_id=record.approval_id), done)
    assert isinstance(later, Refused) and later.kind == "denied" and done == []
    assert gated.spec.gate.approval(record.approval_id).state is eg.ApprovalState.DENIED


@pytest.mark.parametrize("named", [{"approval_id": "apr_other"}, {"payload_hash": "f" * 64}])
def test_an_answer_naming_another_request_changes_nothing(gated: GatedCall,
                                                          named: dict[str, str]) -> None:
    record = paused(gated)
    before = snapshot(gated.spec.gate)
    done: list[Any] = []
    out = resume(gated, Answer(True, "alice", **{"approval_id": record.approval_id, **named}),
                 done)
    assert isinstance(out, Refused) and out.kind == "denied" and done == []
    assert snapshot(gated.spec.gate) == before


@pytest.mark.parametrize("approved", [True, False])
def test_an_answer_naming_no_request_decides_nothing(gated: GatedCall,
                                                     approved: bool) -> None:
    """A yes or a no that names no request (and no record of what the run was told) was not
    given to this one: it waits (a no given to an unseen request would deny it for good)."""
    record = paused(gated)
    before = snapshot(gated.spec.gate)
    done: list[Any] = []
    out = resume(gated, Answer(approved, "alice"), done)
    assert isinstance(out, Refused) and out.kind == "approval_required" and done == []
    assert snapshot(gated.spec.gate) == before
    told = Answer(approved, "alice", told=frozenset({record.approval_id}))
    after = resume(gated, told, done)  # the run had been told of it: the answer stands
    assert (after == "ok") if approved else (isinstance(after, Refused)
                                             and after.kind == "denied")


def test_a_decision_in_the_store_wins_over_the_answer(gated: GatedCall) -> None:
    record = paused(gated)
    gated.spec.gate.approve(record.approval_id, by="carol")
    done: list[Any] = []
    assert resume(gated, Answer(False, "bob"), done) == "ok" and done == [ARGS]
    assert gated.spec.gate.approval(record.approval_id).decided_by == "carol"


@pytest.mark.parametrize("payload", [
    {"effectgate": {"approval_id": 5}}, {"effectgate": {"payload_hash": ["x"]}},
    {"effectgate": {"approval_id": "a" * 129}},
])
def test_a_malformed_echo_is_a_config_error(payload: dict[str, Any]) -> None:
    with pytest.raises(eg.ConfigError):
        claimed(payload)


@pytest.mark.parametrize("payload", [None, "x", {}, {"effectgate": "x"}, {"other": 1}])
def test_an_echo_that_names_nothing_names_nothing(payload: Any) -> None:
    assert claimed(payload) == (None, None)
