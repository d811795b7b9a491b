"""The state machine alone (``effectgate.decide``): every stored state × every kind of request,
as a table, with no store, no clock and no I/O — each case runs in microseconds."""

from __future__ import annotations

import ast
import inspect
from typing import Any

import pytest

import effectgate as eg
from effectgate import decide
from effectgate.decide import LAPSE, RECONCILE, Answer, Move, ReadApproval
from effectgate.governance import evaluate
from effectgate.states import ApprovalState, Decision, Outcome, State
from effectgate.store.rows import ApprovalRow, EffectHead

NOW = 1_000_000.0
D, S = Decision, State

POLICIES: dict[str, Any] = {
    "plain": None,
    "deny": {"effects": {"t": {"deny": "not today"}}},
    "approval": {"effects": {"t": {"approval": "always"}}},
    "ceiling": {"effects": {"t": {"budget": {"per_effect_type_micros": 100}}}},
    "block": {"effects": {"t": {"on_ambiguous": "block"}}},
}


def request(kind: str = "plain", *, cost: int | None = 10, max_attempts: int = 3,
            grace: float = 60.0, effect_type: str = "t", payload_hash: str = "h") -> eg.Request:
    data = POLICIES[kind]
    gov = None if data is None else evaluate(eg.Policy.from_dict(data), effect_type, cost)
    return eg.Request("ns", "k", effect_type, payload_hash, None, max_attempts, 30.0, grace,
                      "run", "agent", None, None, None, cost, gov, {})


def row(state: State, **kw: Any) -> EffectHead:
    fields: dict[str, Any] = dict(
        id=1, namespace="ns", key="k", effect_type="t", payload_hash="h", state=state,
        attempt=1, token=1, lease_expires_at=None, attempt_started_at=NOW - 5,
        created_at=NOW - 5, result=None, reason=None, vendor=None, vendor_attempt=1,
        vendor_since=None, approval_id=None, budget_keys=None, estimated_cost_micros=None,
        pruned_at=None, lease_secret=None, now=NOW)
    fields.update(kw)
    return EffectHead(**fields)


def approval(status: ApprovalState, *, expires: float = NOW + 60,
             cost: int | None = 10) -> ApprovalRow:
    """Request ``apr_1``, shown at ``cost`` (the requests here declare 10)."""
    return ApprovalRow("apr_1", "ns", 1, "t", "k", "h", status, "agent", None, cost, 0,
                       NOW - 10, expires, None, None, None, None, NOW)


LIVE = row(S.IN_FLIGHT, lease_expires_at=NOW + 10)
LAPSED = row(S.IN_FLIGHT, lease_expires_at=NOW - 1)
AMB_RECENT = row(S.AMBIGUOUS, lease_expires_at=NOW - 5, reason="lease lapsed")
AMB_OLD = row(S.AMBIGUOUS, lease_expires_at=NOW - 600, reason="lease lapsed")
AMB_REPORTED = row(S.AMBIGUOUS, reason="timeout")
FAILED = row(S.FAILED)
FAILED_MAX = row(S.FAILED, attempt=3)
PENDING = row(S.PENDING_APPROVAL, approval_id="apr_1")
HUMAN_DENIED = row(S.DENIED, reason="approval denied by alice: no")
POLICY_DENIED = row(S.DENIED, reason="not today")
BUDGET_DENIED = row(S.DENIED, reason="spend ceiling reached: effect_type ceiling")


def expect_move(to: State, decision: Decision, *, expected: State | None = None,
                attempt: int = 0, **more: Any) -> dict[str, Any]:
    return {"to": to, "decision": decision, "expected": expected, "attempt_increment": attempt,
            **more}


# (case, row, request kind, approval, reconcilable, expected: an Answer's decision/reason
# start, a Move's fields, or one of LAPSE / RECONCILE / ReadApproval)
TABLE: list[tuple[str, EffectHead | None, str, ApprovalRow | None, bool, Any]] = [
    ("new key, plain", None, "plain", None, False, expect_move(S.IN_FLIGHT, D.EXECUTE)),
    ("new key, denied by policy", None, "deny", None, False,
     expect_move(S.DENIED, D.DENIED, reason="not today")),
    ("new key, approval required", None, "approval", None, False,
     expect_move(S.PENDING_APPROVAL, D.APPROVAL_REQUIRED, request_approval=True)),
    ("new key, charged to a ceiling", None, "ceiling", None, False,
     expect_move(S.IN_FLIGHT, D.EXECUTE, cost=10)),
    ("committed", row(S.COMMITTED, result="1"), "plain", None, False, (D.DUPLICATE, None)),
    ("committed, pruned", row(S.COMMITTED, pruned_at=NOW - 1), "deny", None, False,
     (D.DUPLICATE, "its stored result was pruned")),
    ("in flight, live lease", LIVE, "plain", None, False, (D.IN_FLIGHT, "another holder")),
    ("in flight, lapsed lease", LAPSED, "plain", None, True, LAPSE),
    ("ambiguous, no hook", AMB_OLD, "plain", None, False, (D.BLOCKED, "lease lapsed")),
    ("ambiguous, hook, inside the grace period", AMB_RECENT, "plain", None, True,
     (D.BLOCKED, "lease lapsed; the reconcile hook is asked once the grace period ends")),
    ("ambiguous, hook, after the grace period", AMB_OLD, "plain", None, True, RECONCILE),
    ("ambiguous (reported), hook: no grace", AMB_REPORTED, "plain", None, True, RECONCILE),
    ("ambiguous, hook, policy blocks", AMB_OLD, "block", None, True, (D.BLOCKED, "lease")),
    ("failed, new attempt", FAILED, "plain", None, False,
     expect_move(S.IN_FLIGHT, D.EXECUTE, expected=S.FAILED, attempt=1)),
    ("failed, new attempt needs approval", FAILED, "approval", None, False,
     expect_move(S.PENDING_APPROVAL, D.APPROVAL_REQUIRED, expected=S.FAILED, attempt=1)),
    ("failed, max attempts", FAILED_MAX, "plain", None, False, (D.DENIED, "max_attempts (3)")),
    ("pending, approval not read", PENDING, "approval", None, False, ReadApproval("apr_1")),
    ("pending, still pending", PENDING, "approval", approval(ApprovalState.PENDING), False,
     (D.APPROVAL_REQUIRED, "waiting")),
    ("pending, approved", PENDING, "approval", approval(ApprovalState.APPROVED), False,
     expect_move(S.IN_FLIGHT, D.EXECUTE, expected=S.PENDING_APPROVAL,
                 consume_approval="apr_1")),
    ("pending, approved at a lower cost: asked again", PENDING, "approval",
     approval(ApprovalState.APPROVED, cost=9), False,
     expect_move(S.PENDING_APPROVAL, D.APPROVAL_REQUIRED, expected=S.PENDING_APPROVAL,
                 forget_approval="apr_1", request_approval=True)),
    ("pending, approved with no cost shown: asked again", PENDING, "approval",
     approval(ApprovalState.APPROVED, cost=None), False,
     expect_move(S.PENDING_APPROVAL, D.APPROVAL_REQUIRED, expected=S.PENDING_APPROVAL,
                 forget_approval="apr_1", request_approval=True)),
    ("pending, approved at a higher cost", PENDING, "approval",
     approval(ApprovalState.APPROVED, cost=11), False,
     expect_move(S.IN_FLIGHT, D.EXECUTE, expected=S.PENDING_APPROVAL,
                 consume_approval="apr_1")),
    ("pending, approval expired", PENDING, "approval",
     approval(ApprovalState.PENDING, expires=NOW - 1), False,
     expect_move(S.PENDING_APPROVAL, D.APPROVAL_REQUIRED, expected=S.PENDING_APPROVAL,
                 forget_approval="apr_1", request_approval=True)),
    ("pending, approved but the policy now denies", PENDING, "deny",
     approval(ApprovalState.APPROVED), False,
     expect_move(S.DENIED, D.DENIED, expected=S.PENDING_APPROVAL)),
    ("denied by a person: final", HUMAN_DENIED, "plain", None, False,
     (D.DENIED, "approval denied by alice")),
    ("denied by policy, still denied", POLICY_DENIED, "deny", None, False,
     (D.DENIED, "not today")),
    ("denied by policy, policy lifted", POLICY_DENIED, "plain", None, False,
     expect_move(S.IN_FLIGHT, D.EXECUTE, expected=S.DENIED)),
    ("denied by a ceiling, asked again", BUDGET_DENIED, "ceiling", None, False,
     expect_move(S.IN_FLIGHT, D.EXECUTE, expected=S.DENIED, cost=10)),
]


def test_an_approval_shown_a_cost_is_asked_again_for_a_call_that_declares_none() -> None:
    """No ceiling counts a call without a cost: a yes given to 10 must not run it."""
    step = decide.begin_step(PENDING, request("approval", cost=None),
                             approval(ApprovalState.APPROVED, cost=10))
    assert isinstance(step, decide.Move)
    assert (step.decision, step.forget_approval, step.consume_approval) == (
        D.APPROVAL_REQUIRED, "apr_1", None)
    same = decide.begin_step(PENDING, request("approval", cost=None),
                             approval(ApprovalState.APPROVED, cost=None))
    assert isinstance(same, decide.Move) and same.consume_approval == "apr_1"


@pytest.mark.parametrize(("case", "stored", "kind", "approved", "reconcilable", "want"),
                         TABLE, ids=[t[0] for t in TABLE])
def test_begin_step(case: str, stored: EffectHead | None, kind: str,
                    approved: ApprovalRow | None, reconcilable: bool, want: Any) -> None:
    step = decide.begin_step(stored, request(kind), approved, reconcilable=reconcilable)
    if type(want) is tuple:  # an Answer's (decision, reason); ReadApproval is a named tuple
        assert isinstance(step, Answer), step
        assert step.decision is want[0]
        assert (step.reason or "").startswith(want[1] or ""), step.reason
        if want[1] is None:
            assert step.reason is None
    elif isinstance(want, dict):
        assert isinstance(step, Move), step
        for name, value in want.items():
            assert getattr(step, name) == value, (name, step)
    else:
        assert step == want


def test_in_flight_answers_when_to_ask_again() -> None:
    step = decide.begin_step(LIVE, request(), reconcilable=False)
    assert isinstance(step, Answer) and step.retry_after_seconds == 1.0  # at most a second
    soon = decide.begin_step(row(S.IN_FLIGHT, lease_expires_at=NOW + 0.2), request())
    assert isinstance(soon, Answer) and soon.retry_after_seconds == 0.2


@pytest.mark.parametrize("stored", [None, LIVE, AMB_OLD, FAILED, PENDING, row(S.COMMITTED)])
def test_a_key_of_another_type_or_payload_is_refused(stored: EffectHead | None) -> None:
    if stored is None:
        return
    with pytest.raises(eg.PayloadMismatch, match="effect type 't'"):
        decide.begin_step(stored, request(effect_type="u"))
    with pytest.raises(eg.PayloadMismatch, match="another payload"):
        decide.begin_step(stored, request(payload_hash="other"))


def test_a_ceiling_move_carries_its_charges_and_a_refused_one_becomes_denied() -> None:
    step = decide.begin_step(FAILED, request("ceiling", cost=30), reconcilable=False)
    assert isinstance(step, Move) and step.cost == 30 and len(step.charges) == 1
    denied = decide.over_ceiling(step, step.charges[0].label)
    assert (denied.to, denied.decision, denied.expected, denied.attempt_increment) == (
        S.DENIED, D.DENIED, S.FAILED, 1)
    assert (denied.reason or "").startswith("spend ceiling reached")
    no_cost = decide.begin_step(None, request("ceiling", cost=None))
    assert isinstance(no_cost, Move) and not no_cost.charges
    assert no_cost.budget_warning and "cannot fire" in no_cost.budget_warning


RESOLUTIONS = [
    # (stored, outcome, force, (expected, to, spend delta, forced) or an error)
    (AMB_OLD, Outcome.COMMITTED, False, (S.AMBIGUOUS, S.COMMITTED, 0, False)),
    (row(S.AMBIGUOUS, budget_keys='["x"]', estimated_cost_micros=5), Outcome.FAILED, False,
     (S.AMBIGUOUS, S.FAILED, -5, False)),
    (LAPSED, Outcome.FAILED, False, (S.IN_FLIGHT, S.FAILED, 0, False)),
    (LIVE, Outcome.FAILED, False, eg.InvalidTransition),
    (LIVE, Outcome.FAILED, True, (S.IN_FLIGHT, S.FAILED, 0, True)),
    (row(S.FAILED, budget_keys='["x"]', estimated_cost_micros=5), Outcome.COMMITTED, False,
     (S.FAILED, S.COMMITTED, 5, False)),
    (FAILED, Outcome.FAILED, False, eg.InvalidTransition),
    (row(S.COMMITTED), Outcome.FAILED, True, eg.InvalidTransition),
    (PENDING, Outcome.COMMITTED, False, eg.InvalidTransition),
    (HUMAN_DENIED, Outcome.FAILED, False, eg.InvalidTransition),
]


@pytest.mark.parametrize(("stored", "outcome", "force", "want"), RESOLUTIONS)
def test_resolution(stored: EffectHead, outcome: Outcome, force: bool, want: Any) -> None:
    if isinstance(want, type):
        with pytest.raises(want):
            decide.resolution(stored, outcome, force=force)
        return
    r = decide.resolution(stored, outcome, force=force)
    assert (r.expected, r.to, r.spend_delta, r.forced) == want


def test_a_live_lease_refusal_says_until_when() -> None:
    with pytest.raises(eg.InvalidTransition) as err:
        decide.resolution(LIVE, Outcome.FAILED)
    assert err.value.reason == "lease is live" and "UTC" in str(err.value)


@pytest.mark.parametrize(("outcome", "estimated", "actual", "delta"), [
    (Outcome.FAILED, 50, None, -50), (Outcome.COMMITTED, 50, None, 0),
    (Outcome.COMMITTED, 50, 80, 30), (Outcome.COMMITTED, None, 20, 20),
    (Outcome.AMBIGUOUS, 50, 10, 0), (Outcome.FAILED, None, None, 0),
])
def test_outcome_spend_delta(outcome: Outcome, estimated: int | None, actual: int | None,
                             delta: int) -> None:
    assert decide.outcome_spend_delta(outcome, estimated, actual) == delta


@pytest.mark.parametrize(("a", "b", "same"), [
    ("alice", "Alice", True), ("alice", "alice ", True), ("alice", "al\u200bice", True),
    ("alice", "ａｌｉｃｅ", True), ("alice", "\u202ealice", True), ("alice", "bob", False),
    ("alice", None, False), (None, None, False),
])
def test_identities_compare_normalised(a: str | None, b: str | None, same: bool) -> None:
    assert decide.same_principal(a, b) is same


def test_approval_checks() -> None:
    pending = approval(ApprovalState.PENDING)
    assert decide.check_approval(pending, "apr_1", "alice", approving=True) is pending
    with pytest.raises(eg.InvalidTransition, match="own request"):
        decide.check_approval(pending, "apr_1", "AGENT", approving=True)
    assert decide.check_approval(pending, "apr_1", "agent", approving=False) is pending
    with pytest.raises(eg.UnknownEffect):
        decide.check_approval(None, "apr_x", "alice", approving=True)
    expired = approval(ApprovalState.PENDING, expires=NOW - 1)
    assert decide.approval_status(expired) is ApprovalState.EXPIRED
    with pytest.raises(eg.InvalidTransition, match="expired"):
        decide.check_approval(expired, "apr_1", "alice", approving=True)


def test_decide_has_no_io_import() -> None:
    """The decision module imports only the standard library's pure modules and the kernel's
    errors and states at run time (rows, requests and governance are type-only)."""
    tree = ast.parse(inspect.getsource(decide))
    runtime: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            runtime |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            runtime.add(("." * node.level) + (node.module or ""))
    assert runtime <= {"__future__", "datetime", "unicodedata", "dataclasses", "typing",
                       ".errors", ".states"}, runtime
