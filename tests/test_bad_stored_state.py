"""A stored state no state of this version is (a tampered database, or a newer version's), on
both backends: every read that meets it raises the store's typed error naming the effect (or
approval) and the value — never a bare ``KeyError`` from deep inside the row mapping — and
nothing is written.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

import effectgate as eg

from .conftest import snapshot

POLICY = {"effects": {"payment.*": {"approval": "always"}}}


def _tamper(gate: eg.Gate, table: str, column: str, ident: Any, value: str) -> None:
    with gate.store.engine.begin() as conn:
        done = conn.execute(text(f"UPDATE {table} SET state = :value "
                                 f"WHERE namespace = :ns AND {column} = :ident"),
                            {"value": value, "ns": gate.namespace, "ident": ident})
        assert done.rowcount == 1


def _refused(err: pytest.ExceptionInfo[eg.StoreError], what: str, value: str) -> None:
    message = str(err.value)
    assert what in message and repr(value) in message, message
    assert err.value.reason == "unknown state"


@pytest.mark.parametrize("bad", ["exploded", "COMMITTED", ""])
def test_an_unknown_effect_state_is_a_store_error_that_changes_nothing(
        make_gate: Any, bad: str) -> None:
    """A committed effect, an in-flight one and a failed one, each with its state replaced:
    get, get_by_id, list_effects, group_steps, begin (sync and async, a repeat and a new
    attempt), report, extend_lease and resolve all raise :class:`StoreError` naming the key
    and the stored value, and the store is as it was (the begins are a second gate's, which
    remembers no result: a gate's memo answers a repeat without reading the store)."""
    gate = make_gate()
    done = gate.begin(effect_type="pay.card", key="done", payload={}, group_key="g")
    gate.report(done, "committed", result={"ok": True})
    held = gate.begin(effect_type="pay.card", key="held", payload={}, group_key="g")
    failed = gate.begin(effect_type="pay.card", key="failed", payload={}, group_key="g")
    gate.report(failed, "failed", error="declined")
    for key in ("done", "held", "failed"):
        _tamper(gate, "effectgate_effects", "key", key, bad)
    before = snapshot(gate)
    gate = make_gate()  # another process's gate: no memo of the committed one to answer from
    ids = {"done": done.effect_id, "held": held.effect_id, "failed": failed.effect_id}

    def calls(key: str) -> list[Any]:
        return [
            lambda: gate.get(key),
            lambda: gate.get_by_id(ids[key]),
            lambda: gate.begin(effect_type="pay.card", key=key, payload={}, group_key="g"),
            lambda: asyncio.run(gate.abegin(effect_type="pay.card", key=key, payload={},
                                            group_key="g")),
            lambda: gate.resolve(key, "committed", by="op", force=True),
        ]

    for key in ("done", "held", "failed"):
        for call in calls(key):
            with pytest.raises(eg.StoreError) as err:
                call()
            _refused(err, repr(key), bad)
            assert err.value.key == key
    for call in (lambda: gate.report(held, "committed"), lambda: gate.extend_lease(held, 30),
                 lambda: gate.list_effects(), lambda: gate.group_steps("g")):
        with pytest.raises(eg.StoreError) as err:
            call()
        _refused(err, "effect", bad)
    assert snapshot(gate) == before


def test_an_unknown_approval_state_is_a_store_error_that_changes_nothing(
        make_gate: Any) -> None:
    """An approval request with its state replaced: reading it, listing, approving, denying
    and the begin that waits on it raise :class:`StoreError` naming the request, its effect's
    key and the value; nothing is written."""
    gate = make_gate(policy=POLICY)
    d = gate.begin(effect_type="payment.refund", key="refund:1", payload={})
    assert d.approval_id is not None
    _tamper(gate, "effectgate_approvals", "id", d.approval_id, "maybe")
    before = snapshot(gate)
    for call in (lambda: gate.approval(d.approval_id or ""),
                 lambda: gate.list_approvals(state=None),
                 lambda: gate.approve(d.approval_id or "", by="alice"),
                 lambda: gate.deny(d.approval_id or "", by="alice"),
                 lambda: gate.begin(effect_type="payment.refund", key="refund:1", payload={})):
        with pytest.raises(eg.StoreError) as err:
            call()
        _refused(err, repr(d.approval_id), "maybe")
        assert err.value.key == "refund:1"
    assert snapshot(gate) == before


def test_a_denial_of_an_effect_with_an_unknown_state_changes_nothing(make_gate: Any) -> None:
    """Denying a pending request whose effect's state was replaced: the denial's transaction
    reads the effect, meets the state, raises :class:`StoreError` naming the key, and rolls
    back whole — the request is still pending."""
    gate = make_gate(policy=POLICY)
    d = gate.begin(effect_type="payment.refund", key="refund:1", payload={})
    _tamper(gate, "effectgate_effects", "key", "refund:1", "exploded")
    before = snapshot(gate)
    with pytest.raises(eg.StoreError) as err:
        gate.deny(d.approval_id or "", by="alice", reason="no")
    _refused(err, "'refund:1'", "exploded")
    assert snapshot(gate) == before
    assert gate.approval(d.approval_id or "").state.value == "pending"


def test_counting_by_state_over_an_unknown_state_is_a_store_error(make_gate: Any) -> None:
    """``count_by_state`` (the console's effects page, ``stats``) over an effect whose state was
    replaced raises :class:`StoreError` naming the namespace and the value (it was a bare
    ``ValueError`` from ``State(...)``); an effect in a known state still counts as before."""
    gate = make_gate()
    for key in ("a", "b"):
        gate.report(gate.begin(effect_type="pay.card", key=key, payload={}), "committed")
    assert gate.count_by_state()[eg.State.COMMITTED] == 2
    _tamper(gate, "effectgate_effects", "key", "b", "exploded")
    before = snapshot(gate)
    with pytest.raises(eg.StoreError) as err:
        gate.count_by_state()
    _refused(err, repr(gate.namespace), "exploded")
    assert snapshot(gate) == before
