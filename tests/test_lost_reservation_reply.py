"""A reservation whose reply was lost, and what happened to the key before the gate looked
again (red team, round 3, item 1), on both backends, for a sync and an async caller.

The reserving write commits, its reply never reaches the gate, and the gate reads the key once
more to learn whether the reservation is its own. Before it looks, others may act: an operator
resolves the effect (FAILED or COMMITTED), or the lease lapses. The row still carries this
begin's lease secret (a resolve keeps it), so a recovery that compares only the secret would
run the body on an effect that is no longer its own — and the legitimate retry would run it
too. Recovery adopts the row only when nobody has acted since: IN_FLIGHT, the attempt and
token the insert wrote, and a live lease.

The lost reply is injected into our own store object (the real write is made, then a
:class:`StoreError` with ``outcome_unknown=True`` is raised, as the replay harness does); the
databases are real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import effectgate as eg
from effectgate.testing import lapse_leases

PAYLOAD = {"txn_id": "txn_1", "amount_cents": 500}
KEY = "refund:txn_1"


@pytest.fixture(params=["sync", "async"])
def caller(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def lose_the_reservation_reply(gate: eg.Gate, meanwhile: Callable[[], None]) -> list[str]:
    """The next reservation on ``gate`` is written, then ``meanwhile()`` runs (others act),
    then the reply is lost. Returns a list that names the faced operation once it fired."""
    store = gate.store
    face = store.async_face()
    fired: list[str] = []
    sync_reserve, async_reserve = store.reserve, face.reserve

    def lost() -> eg.StoreError:
        meanwhile()
        return eg.StoreError("the reply was lost (test)", outcome_unknown=True)

    def reserve(*args: Any, **kwargs: Any) -> Any:
        store.reserve = sync_reserve  # type: ignore[method-assign]
        sync_reserve(*args, **kwargs)
        fired.append("reserve")
        raise lost()

    async def areserve(*args: Any, **kwargs: Any) -> Any:
        face.reserve = async_reserve  # type: ignore[method-assign]
        await async_reserve(*args, **kwargs)
        fired.append("areserve")
        raise lost()

    store.reserve = reserve  # type: ignore[method-assign]
    if not store.is_sqlite:  # SQLite's async face reserves through the sync store
        face.reserve = areserve  # type: ignore[method-assign]
    return fired


def begin(gate: eg.Gate, caller: str) -> eg.BeginDecision:
    kw: dict[str, Any] = {"effect_type": "payment.refund", "key": KEY, "payload": PAYLOAD}
    if caller == "async":
        return asyncio.run(gate.abegin(**kw))
    return gate.begin(**kw)


def report(gate: eg.Gate, caller: str, d: eg.BeginDecision, result: Any) -> None:
    if caller == "async":
        asyncio.run(gate.areport(d, "committed", result=result))
    else:
        gate.report(d, "committed", result=result)


def test_recovered_when_nobody_acted(make_gate: Any, caller: str) -> None:
    """Nothing happened in between: the row is this begin's own, and the body runs once."""
    gate = make_gate(lease_seconds=30)
    fired = lose_the_reservation_reply(gate, lambda: None)
    d = begin(gate, caller)
    assert fired and d.decision is eg.Decision.EXECUTE and (d.attempt, d.lease_token) == (1, 1)
    report(gate, caller, d, {"refund_id": "re_1"})
    again = begin(gate, caller)
    assert again.decision is eg.Decision.DUPLICATE and again.result == {"refund_id": "re_1"}


def test_an_operators_failed_is_not_adopted_and_only_one_attempt_runs(
        make_gate: Any, caller: str) -> None:
    """The lease lapsed and an operator resolved FAILED before the gate looked again: the lost
    reservation is not this begin's any more. The begin decides on the FAILED row like any
    other (a new attempt, with its own token), so the retry that follows waits: the body runs
    once, and its holder's report lands."""
    gate = make_gate(lease_seconds=30)

    def operator() -> None:
        lapse_leases(gate)
        gate.resolve(KEY, "failed", by="ops", note="never reached the vendor")

    fired = lose_the_reservation_reply(gate, operator)
    executed = [d for d in (begin(gate, caller), begin(gate, caller))
                if d.decision is eg.Decision.EXECUTE]
    assert fired
    assert len(executed) == 1, executed
    [d] = executed
    row = gate.get(KEY)
    assert (d.attempt, d.lease_token) == (row.attempt, row.lease_token) == (2, 3)
    report(gate, caller, d, {"refund_id": "re_2"})
    assert gate.get(KEY).state is eg.State.COMMITTED


def test_an_operators_committed_is_a_duplicate(make_gate: Any, caller: str) -> None:
    """An operator forced the live effect COMMITTED (seen in the vendor's dashboard) before
    the gate looked again: the begin is answered with the operator's result, never executed."""
    gate = make_gate(lease_seconds=30)

    def operator() -> None:
        gate.resolve(KEY, "committed", by="ops", result={"refund_id": "re_ops"}, force=True)

    fired = lose_the_reservation_reply(gate, operator)
    d = begin(gate, caller)
    assert fired
    assert d.decision is eg.Decision.DUPLICATE and d.result == {"refund_id": "re_ops"}
    assert gate.get(KEY).state is eg.State.COMMITTED


def test_a_lease_that_lapsed_meanwhile_is_not_adopted(make_gate: Any, caller: str) -> None:
    """The reservation's lease lapsed before the gate looked again (a long outage): the
    effect is AMBIGUOUS for everyone, this begin included — no body runs past its lease."""
    gate = make_gate(lease_seconds=30)
    fired = lose_the_reservation_reply(gate, lambda: lapse_leases(gate))
    d = begin(gate, caller)
    assert fired
    assert d.decision is eg.Decision.BLOCKED, d
    assert gate.get(KEY).state is eg.State.AMBIGUOUS


def test_a_governed_reservation_resolved_failed_is_not_adopted(
        make_gate: Any, backend: str, caller: str) -> None:
    """The same for a governed begin (a spend ceiling): on Postgres its insert and charges are
    one call, on SQLite a move in a transaction; either is read back like a plain
    reservation, and the operator's FAILED is never executed as attempt 1."""
    policy = {"effects": {"payment.refund": {"budget": {"per_effect_type_micros": 10**9}}}}
    gate = make_gate(lease_seconds=30, policy=policy)
    store, face = gate.store, gate.store.async_face()
    sync_move, async_move = store.move, face.move_new
    fired: list[str] = []

    def operator() -> eg.StoreError:
        fired.append("move")
        lapse_leases(gate)
        gate.resolve(KEY, "failed", by="ops")
        return eg.StoreError("the reply was lost (test)", outcome_unknown=True)

    def move(*args: Any, **kwargs: Any) -> Any:
        store.move = sync_move  # type: ignore[method-assign]
        sync_move(*args, **kwargs)
        raise operator()

    async def move_new(*args: Any, **kwargs: Any) -> Any:
        face.move_new = async_move  # type: ignore[method-assign]
        await async_move(*args, **kwargs)
        raise operator()

    if caller == "async" and not store.is_sqlite:
        face.move_new = move_new  # type: ignore[method-assign]
    else:  # SQLite's async face moves through the sync store, on a worker thread
        store.move = move  # type: ignore[method-assign]
    kw: dict[str, Any] = {"effect_type": "payment.refund", "key": KEY, "payload": PAYLOAD,
                          "estimated_cost_micros": 1000}
    answers: list[Any] = []
    for _ in range(2):
        try:
            answers.append(asyncio.run(gate.abegin(**kw)) if caller == "async"
                           else gate.begin(**kw))
        except eg.StoreError as err:
            assert err.outcome_unknown and backend == "sqlite"
            answers.append(err)
    executed = [d for d in answers
                if isinstance(d, eg.BeginDecision) and d.decision is eg.Decision.EXECUTE]
    assert fired and len(executed) == 1, answers
    assert (executed[0].attempt, executed[0].lease_token) == (2, 3)


def lose_the_next_move_reply(gate: eg.Gate) -> list[str]:
    """The next move of an existing effect (a new attempt, an approval consumed) is written,
    then its reply is lost. (Both callers make it through the sync store: an async one on a
    worker thread.)"""
    store = gate.store
    fired: list[str] = []
    real = store.move

    def move(*args: Any, **kwargs: Any) -> Any:
        store.move = real  # type: ignore[method-assign]
        real(*args, **kwargs)
        fired.append("move")
        raise eg.StoreError("the reply was lost (test)", outcome_unknown=True)

    store.move = move  # type: ignore[method-assign]
    return fired


def test_a_new_attempt_whose_reply_was_lost_is_adopted(make_gate: Any, caller: str) -> None:
    """The retake of a FAILED effect was written and its reply lost: the begin raised, and the
    row stayed IN_FLIGHT under a secret nobody held, to lapse into AMBIGUOUS though no body
    ran. Read back, it is this begin's own (its secret, the token it wrote, nobody since)."""
    gate = make_gate(lease_seconds=30)
    first = begin(gate, caller)
    gate.report(first, "failed", error="declined")
    fired = lose_the_next_move_reply(gate)
    d = begin(gate, caller)
    assert fired and d.decision is eg.Decision.EXECUTE
    assert (d.attempt, d.lease_token) == (2, 2)
    report(gate, caller, d, {"refund_id": "re_2"})
    again = begin(gate, caller)
    assert again.decision is eg.Decision.DUPLICATE and again.result == {"refund_id": "re_2"}


def test_an_approved_begin_whose_reply_was_lost_runs_on_its_approval(
        make_gate: Any, caller: str) -> None:
    """The move that consumed an approval was written and its reply lost: the approval was
    spent, the effect held by nobody, then AMBIGUOUS, and an operator needed. Read back, it is
    this begin's own: it executes, once, on the approval it consumed."""
    gate = make_gate(lease_seconds=30,
                     policy={"effects": {"payment.refund": {"approval": "always"}}})
    asked = begin(gate, caller)
    assert asked.decision is eg.Decision.APPROVAL_REQUIRED and asked.approval_id
    gate.approve(asked.approval_id, by="bob")
    fired = lose_the_next_move_reply(gate)
    d = begin(gate, caller)
    assert fired and d.decision is eg.Decision.EXECUTE
    assert gate.approval(asked.approval_id).state is eg.ApprovalState.CONSUMED
    report(gate, caller, d, {"refund_id": "re_1"})
    assert begin(gate, caller).decision is eg.Decision.DUPLICATE


def test_a_reservation_whose_read_back_failed_too_is_released(make_gate: Any,
                                                              caller: str) -> None:
    """The reply was lost and the read-back failed as well (the store went away for a
    moment): the begin raises, unsure, and the body never runs. The reservation it made is
    then released FAILED by a thread of its own once the key can be read, not left to lapse
    into AMBIGUOUS for an operator; the retry runs."""
    import time

    gate = make_gate(lease_seconds=30)
    store, face = gate.store, gate.store.async_face()
    sync_fetch, async_fetch = store.fetch, face.fetch

    def fetch(*args: Any, **kwargs: Any) -> Any:
        store.fetch = sync_fetch  # type: ignore[method-assign]
        raise eg.StoreError("the store went away (test)", outcome_unknown=True)

    async def afetch(*args: Any, **kwargs: Any) -> Any:
        face.fetch = async_fetch  # type: ignore[method-assign]
        raise eg.StoreError("the store went away (test)", outcome_unknown=True)

    def lost_read_back() -> None:
        store.fetch = fetch  # type: ignore[method-assign]
        if not store.is_sqlite:  # SQLite's async face reads through the sync store
            face.fetch = afetch  # type: ignore[method-assign]

    fired = lose_the_reservation_reply(gate, lost_read_back)
    with pytest.raises(eg.StoreError) as raised:
        begin(gate, caller)
    assert fired and raised.value.outcome_unknown
    end = time.monotonic() + 5
    while gate.get(KEY).state is not eg.State.FAILED and time.monotonic() < end:
        time.sleep(0.02)
    row = gate.get(KEY)
    assert row.state is eg.State.FAILED, row
    assert "never ran" in (row.error or "")
    d = begin(gate, caller)
    assert d.decision is eg.Decision.EXECUTE and d.attempt == 2
