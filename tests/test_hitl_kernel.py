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
    replacement,
    review_of,
    store_decision,
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


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_an_edit_raced_by_an_approval_of_the_original_runs_only_the_original(
        gated: GatedCall, caller: str) -> None:
    """Bob approves the original in the CLI while Alice's edit is applied: the store's
    decision wins. The edit ran first and the original was denied after, which failed
    quietly (it was approved): both refunds ran, the original on a replayed resume."""
    import asyncio

    from effectgate.integrations._kernel.review import aapply

    refused = gated.run(ARGS, lambda: None)
    review = review_of(gated, refused, ARGS)
    gate = gated.spec.gate
    gate.approve(review.approval_id, by="bob")  # lands after the resumed call found it pending
    done: list[dict[str, Any]] = []
    edit = Verdict("edit", by="alice", arguments={**review.arguments, "amount_cents": 300})
    if caller == "sync":
        out = apply(gated, review, edit, ARGS, run_with(done))
    else:
        async def arun(one: GatedCall, arguments: Any) -> Any:
            return await one.arun(arguments, _append(done, arguments))

        out = asyncio.run(aapply(gated, review, edit, ARGS, arun))
    assert out == "ok" and done == [ARGS]  # the original, approved by bob, once
    assert gate.approval(review.approval_id).state is eg.ApprovalState.CONSUMED
    assert [a.key for a in gate.list_approvals(state=None)] == ["refund:T1"]  # no edit opened
    again = apply(gated, review, edit, ARGS, run_with(done))  # a replayed resume
    assert again == "ok" and done == [ARGS]


def _append(done: list[dict[str, Any]], arguments: Any) -> Any:
    async def body() -> str:
        done.append(dict(arguments))
        return "ok"
    return body



@pytest.mark.parametrize("caller", ["sync", "async"])
def test_an_edit_of_a_request_decided_otherwise_meanwhile_runs_nothing(
        gated: GatedCall, caller: str) -> None:
    """The request found pending when the resume began is decided before its edit lands: by
    a human's rejection in the CLI, or by another resume's edit (two resumes editing one
    request at once). The edit ran anyway under its own fresh key: a refund the human
    rejected, or two refunds of one transaction. Only a replay of the edit that replaced
    the request runs (its effect answers)."""
    import asyncio

    from effectgate.integrations._kernel.review import aapply

    gate = gated.spec.gate
    done: list[dict[str, Any]] = []

    def resume(review: Any, verdict: Verdict) -> Any:
        if caller == "sync":
            return apply(gated, review, verdict, ARGS, run_with(done))

        async def arun(one: GatedCall, arguments: Any) -> Any:
            return await one.arun(arguments, _append(done, arguments))

        return asyncio.run(aapply(gated, review, verdict, ARGS, arun))

    refused = gated.run(ARGS, lambda: None)
    review = review_of(gated, refused, ARGS)
    gate.deny(review.approval_id, by="bob", reason="no")  # lands after the resume read it
    edit = Verdict("edit", by="alice", arguments={**review.arguments, "amount_cents": 300})
    out = resume(review, edit)
    assert isinstance(out, Refused) and out.kind == "denied" and done == []
    assert gate.approval(review.approval_id).reason == "no"
    assert [a.key for a in gate.list_approvals(state=None)] == ["refund:T1"]  # no edit opened

    args2 = {**ARGS, "txn_id": "T2"}
    second = review_of(gated, gated.run(args2, lambda: None), args2)

    def resume2(verdict: Verdict) -> Any:
        if caller == "sync":
            return apply(gated, second, verdict, args2, run_with(done))

        async def arun(one: GatedCall, arguments: Any) -> Any:
            return await one.arun(arguments, _append(done, arguments))

        return asyncio.run(aapply(gated, second, verdict, args2, arun))

    alice = Verdict("edit", by="alice", arguments={**second.arguments, "amount_cents": 200})
    carol = Verdict("edit", by="carol", arguments={**second.arguments, "amount_cents": 100})
    assert resume2(alice) == "ok"
    out = resume2(carol)  # found pending too, but alice's edit replaced it first
    assert isinstance(out, Refused) and out.kind == "denied"
    assert [d["amount_cents"] for d in done] == [200]
    assert resume2(alice) == "ok" and len(done) == 1  # a replay of alice's: its stored result

def test_an_edit_denies_the_original_before_it_runs(gated: GatedCall) -> None:
    """The original is decided (denied, naming the edit's key) before the edit runs, so no
    approval of the original can land between the edit running and the denial."""
    refused = gated.run(ARGS, lambda: None)
    review = review_of(gated, refused, ARGS)
    gate = gated.spec.gate
    seen: list[eg.ApprovalState] = []

    def run(one: GatedCall, arguments: Any) -> Any:
        seen.append(gate.approval(review.approval_id).state)
        return one.run(arguments, lambda: "ok")

    edit = Verdict("edit", by="alice", arguments={**review.arguments, "amount_cents": 300})
    assert apply(gated, review, edit, ARGS, run) == "ok"
    assert seen and set(seen) == {eg.ApprovalState.DENIED}
    reason = gate.approval(review.approval_id).reason or ""
    assert reason.startswith("replaced by an edit (key refund:T1~edit:"), reason


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
    {"kind": "approve", "by": "a", "approval_id": 5},
    {"kind": "approve", "by": "a", "approval_id": "apr_" + "0" * 80},
    {"kind": "edit", "by": "a", "arguments": {}, "approves_edit": "no"},
])
def test_a_malformed_verdict_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(eg.ConfigError):
        Verdict(**bad)


def paused(gated: GatedCall, arguments: dict[str, Any] = ARGS) -> Any:
    refused = gated.run(arguments, lambda: None)
    assert isinstance(refused, Refused) and refused.kind == "approval_required"
    return review_of(gated, refused, arguments)


def test_a_verdict_naming_another_approval_changes_nothing(gated: GatedCall) -> None:
    from .conftest import snapshot

    review = paused(gated)
    other = paused(gated, {**ARGS, "txn_id": "T2"})
    before = snapshot(gated.spec.gate)
    done: list[dict[str, Any]] = []
    for kind in ("approve", "reject"):
        out = apply(gated, review, Verdict(kind, by="alice", approval_id=other.approval_id),
                    ARGS, run_with(done))  # type: ignore[arg-type]
        assert isinstance(out, Refused) and "another approval" in out.message
    assert done == [] and snapshot(gated.spec.gate) == before


def test_an_edit_no_reviewer_approved_waits_for_its_own_approval(gated: GatedCall) -> None:
    gate = gated.spec.gate
    review = paused(gated)
    done: list[dict[str, Any]] = []
    edit = Verdict("edit", by="resume", arguments={**ARGS, "amount_cents": 9},
                   approves_edit=False)
    out = apply(gated, review, edit, ARGS, run_with(done))
    assert isinstance(out, Refused) and out.kind == "approval_required" and done == []
    asked = gate.approval(out.error.approval_id)  # type: ignore[attr-defined]
    assert asked.state is eg.ApprovalState.PENDING and asked.decided_by is None
    assert asked.key.startswith("refund:T1~edit:") and asked.arguments["amount_cents"] == 9
    assert gate.approval(review.approval_id).state is eg.ApprovalState.DENIED
    # The original, called again, is answered by what replaced it: still waiting.
    denied = gated.run(ARGS, lambda: done.append(ARGS))
    waiting = replacement(gated, denied, ARGS)
    assert waiting is not None and waiting.key == asked.key
    assert isinstance(waiting.answer, Refused) and waiting.answer.kind == "approval_required"
    # A human approves the edit; it runs once; the original is answered with its result.
    gate.approve(asked.approval_id, by="alice")
    other = edited_call(gated, review.key)
    assert other.run({**ARGS, "amount_cents": 9}, lambda: done.append({"ran": 9}) or "ok9") \
        == "ok9"
    ran = replacement(gated, gated.run(ARGS, lambda: done.append(ARGS)), ARGS)
    assert ran is not None and ran.answer == "ok9" and done == [{"ran": 9}]


def test_an_edit_of_an_edit_gets_its_own_key(gated: GatedCall) -> None:
    first = edited_call(gated, "refund:T1")
    key = first.spec.request({**ARGS, "amount_cents": 1}).key
    second = edited_call(gated, key)
    again = second.spec.request({**ARGS, "amount_cents": 2}).key
    assert again.startswith("refund:T1~edit:") and again not in (key, "refund:T1")
    assert second.spec.request({**ARGS, "txn_id": "T9"}).key == "refund:T9"


def test_a_denial_that_only_looks_replaced_answers_nothing_else(gated: GatedCall,
                                                               make_gate: Any) -> None:
    """A reviewer's reject message written like the kernel's link, pointing at another
    effect type's stored result: the denial stands; nothing of that effect is shown."""
    gate = gated.spec.gate
    other = gate.effect("mail:{to}", effect_type="mail.send")(lambda to: f"secret for {to}")
    other(to="x@example.com")
    target = gate.get("mail:x@example.com").effect_id
    review = paused(gated)
    apply(gated, review, Verdict("reject", by="alice",
                                 message=f"replaced by an edit (effect #{target})"),
          ARGS, run_with([]))
    denied = gated.run(ARGS, lambda: None)
    assert isinstance(denied, Refused) and denied.kind == "denied"
    assert replacement(gated, denied, ARGS) is None


def test_the_store_decides_only_what_a_human_approved(gated: GatedCall, make_gate: Any) -> None:
    gate = gated.spec.gate
    request = gated.spec.request(ARGS)
    assert store_decision(gate, request) is None  # no request yet
    review = paused(gated)
    assert store_decision(gate, request) is None  # pending
    gate.approve(review.approval_id, by="alice")
    approved = store_decision(gate, request)
    assert approved is not None and approved.kind == "approved"
    gated.run(ARGS, lambda: "ok")
    decided = store_decision(gate, request)
    assert decided is not None and decided.kind == "approved"  # consumed: it ran, once
    other = gated.spec.request({**ARGS, "txn_id": "T2"})
    review2 = paused(gated, {**ARGS, "txn_id": "T2"})
    gate.deny(review2.approval_id, by="bob", reason="no")
    denied = store_decision(gate, other)
    assert denied is not None and denied.kind == "denied" and "no" in (denied.reason or "")
    # A policy that lets the call run without a human: never "approved".
    free = eg.EffectSpec(make_gate(policy=False), "refund:{txn_id}", effect_type="refund")
    alone = {**ARGS, "txn_id": "T3"}
    assert store_decision(free.gate, free.request(alone)) is None
    assert free.run(alone, lambda: "ran") == "ran"
    assert store_decision(free.gate, free.request(alone)) is None


@pytest.mark.parametrize("caller", ["sync", "async"])
@pytest.mark.parametrize("shape", ["edited key", "edit key too long"])
def test_an_edit_that_cannot_be_keyed_denies_nothing(gated: GatedCall, caller: str,
                                                      shape: str) -> None:
    """An edit whose key cannot be made — its template fails on the edited arguments, or the
    original key is so long that its ``~edit:`` key passes the key limit (then every edit of
    it) — was refused as invalid only after it had denied the original "replaced by an
    edit": nothing ran, and the request was gone for good (a corrected edit is now refused
    as "already decided", the original's approval meets a denial). It denies nothing now."""
    import asyncio

    from effectgate.integrations._kernel.review import aapply

    gate = gated.spec.gate
    done: list[dict[str, Any]] = []
    args = ARGS if shape == "edited key" else {**ARGS, "txn_id": "L" * 500}

    def resume(review: Any, verdict: Verdict) -> Any:
        if caller == "sync":
            return apply(gated, review, verdict, args, run_with(done))

        async def arun(one: GatedCall, arguments: Any) -> Any:
            return await one.arun(arguments, _append(done, arguments))

        return asyncio.run(aapply(gated, review, verdict, args, arun))

    review = review_of(gated, gated.run(args, lambda: None), args)
    bad = {**review.arguments, "amount_cents": 300}
    if shape == "edited key":
        bad["txn_id"] = "x" * 600
    out = resume(review, Verdict("edit", by="alice", arguments=bad))
    assert isinstance(out, Refused) and out.kind == "invalid" and done == []
    record = gate.approval(review.approval_id)
    assert record.state is eg.ApprovalState.PENDING and record.reason is None
    if shape == "edited key":  # a corrected edit runs
        good = Verdict("edit", by="alice", arguments={**review.arguments, "amount_cents": 300})
        assert resume(review, good) == "ok"
        assert [d["amount_cents"] for d in done] == [300]
    else:  # the original, approved, runs
        assert resume(review, Verdict("approve", by="alice")) == "ok" and done == [args]
