"""The adapter kernel's review module, without a framework: what a reviewer is shown, and what
approve / edit / reject do in the store (both backends)."""

from __future__ import annotations

from typing import Any

import pytest

import effectgate as eg
from effectgate.integrations._kernel import GatedCall, Refused
from effectgate.integrations._kernel.call import keep_refusal
from effectgate.integrations._kernel.review import (
    REDACTED,
    Verdict,
    apply,
    edited_call,
    review_of,
)

POLICY = {"effects": {"refund": {"approval": "always", "redact_arguments": ["card"]}}}
ARGS = {"txn_id": "T1", "amount_cents": 500, "card": "4242"}


@pytest.fixture
def gated(make_gate: Any) -> GatedCall:
    spec = eg.EffectSpec(make_gate(policy=POLICY), "refund:{txn_id}", effect_type="refund")
    return GatedCall(spec, "refund", pause=keep_refusal)


def run_with(done: list[dict[str, Any]]) -> Any:
    def run(one: GatedCall, arguments: Any) -> Any:
        return one.run(arguments, lambda: done.append(dict(arguments)) or "ok")
    return run


def test_an_edit_keeps_a_redacted_value_it_did_not_change(gated: GatedCall) -> None:
    done: list[dict[str, Any]] = []
    refused = gated.run(ARGS, lambda: done.append(ARGS))
    assert isinstance(refused, Refused) and refused.kind == "approval_required"
    review = review_of(gated, refused, ARGS)
    assert review.arguments["card"] == REDACTED and review.arguments["amount_cents"] == 500
    edit = Verdict("edit", by="carol", arguments={**review.arguments, "amount_cents": 300})
    assert apply(gated, review, edit, ARGS, run_with(done)) == "ok"
    assert done == [{"txn_id": "T1", "amount_cents": 300, "card": "4242"}]
    # The same answer again: the edited effect's stored result, nothing more.
    assert apply(gated, review, edit, ARGS, run_with(done)) == "ok" and len(done) == 1


def test_a_verdict_for_another_payload_hash_changes_nothing(gated: GatedCall) -> None:
    refused = gated.run(ARGS, lambda: None)
    review = review_of(gated, refused, ARGS)
    done: list[dict[str, Any]] = []
    out = apply(gated, review, Verdict("approve", by="alice", payload_hash="f" * 64), ARGS,
                run_with(done))
    assert isinstance(out, Refused) and out.kind == "denied" and done == []
    assert gated.spec.gate.approval(review.approval_id).state is eg.ApprovalState.PENDING


def test_an_edited_call_gets_its_own_key_only_when_the_template_gives_the_same(
        gated: GatedCall) -> None:
    other = edited_call(gated, "refund:T1")
    same_key = other.spec.request({**ARGS, "amount_cents": 1}).key
    assert same_key.startswith("refund:T1~edit:") and len(same_key) == len("refund:T1~edit:") + 16
    assert other.spec.request({**ARGS, "txn_id": "T9"}).key == "refund:T9"
    assert gated.spec.request(ARGS).key == "refund:T1"  # the original is untouched


@pytest.mark.parametrize("bad", [
    {"kind": "maybe", "by": "a"}, {"kind": "edit", "by": "a"}, {"kind": "approve", "by": ""},
    {"kind": "approve", "by": "a" * 257}, {"kind": "approve", "by": 7},
    {"kind": "reject", "by": "a", "message": "x" * 3000},
    {"kind": "approve", "by": "a", "payload_hash": 5},
])
def test_a_malformed_verdict_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(eg.ConfigError):
        Verdict(**bad)
