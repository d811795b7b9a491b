"""An undo's own type (``<type>.compensate``) is counted by no spend ceiling: it gives back,
and a budget spent must never stop an unwind halfway. A red team (round 8) found that any
begin naming *any* committed effect as its step (``compensates_effect_id``) under any
``….compensate`` type, at any key, as often as it liked, went past every ceiling: five
$1,000 "undos" of a committed email ran past a $100-a-day ceiling on ``payment.*``.

Now such a request must be the step's one undo: of the step's type plus ``.compensate``, at
the step's compensation key (``compensate:<step key>``), declaring no more than its step spent
(the review of that fix: five $0 ``payment.ping`` steps, each with its own $1,000 undo, still
spent $5,000 past the ceiling), or ``begin`` refuses it with a :class:`~effectgate.ConfigError`
and writes nothing. The undo :func:`~effectgate.sagas.
compensation_request` describes still runs past a full ceiling, once; a call of another type
that names a step is counted by the ceilings as any call is. On both backends, sync and async,
and ``preview`` answers the same.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

import effectgate as eg
from effectgate.sagas import compensation_key, compensation_request

DOLLAR = 1_000_000
CEILING = {"effects": {"payment.*": {"budget": {"per_day_micros": 100 * DOLLAR}},
                       "email.*": {}}}


def _tables(gate: eg.Gate) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the namespace's effects, approvals and spend counters."""
    out = {}
    with gate.store.engine.connect() as conn:
        for table in ("effectgate_effects", "effectgate_approvals", "effectgate_budgets"):
            out[table] = [tuple(r) for r in conn.execute(text(
                f"SELECT * FROM {table} WHERE namespace = :ns ORDER BY 1, 2"),
                {"ns": gate.namespace})]
    return out


def _committed(gate: eg.Gate, effect_type: str, key: str, cost: int | None = None) -> int:
    d = gate.begin(effect_type=effect_type, key=key, payload={"k": key},
                   estimated_cost_micros=cost)
    assert d.decision is eg.Decision.EXECUTE, d
    gate.report(d, "committed", result={"ok": True})
    return d.effect_id  # type: ignore[no-any-return]


@pytest.mark.parametrize(("effect_type", "key"), [
    ("payment.charge.compensate", "refund:big"),          # another step's undo type, any key
    ("payment.charge.compensate", "compensate:email:hi"),  # ... even at the step's undo key
    ("email.send.compensate", "refund:big"),               # the step's undo type, another key
])
def test_an_undo_that_is_not_its_steps_own_is_refused_and_writes_nothing(
        make_gate: Any, effect_type: str, key: str) -> None:
    gate = make_gate(policy=CEILING)
    email = _committed(gate, "email.send", "email:hi")
    before = _tables(gate)
    with pytest.raises(eg.ConfigError) as caught:
        gate.begin(effect_type=effect_type, key=key, payload={"n": 1},
                   estimated_cost_micros=1000 * DOLLAR, compensates_effect_id=email)
    assert "'email.send.compensate' at key 'compensate:email:hi'" in str(caught.value)
    with pytest.raises(eg.ConfigError):
        gate.preview(effect_type=effect_type, key=key, payload={"n": 1},
                     estimated_cost_micros=1000 * DOLLAR, compensates_effect_id=email)

    async def abegin() -> None:
        with pytest.raises(eg.ConfigError):
            await gate.abegin(effect_type=effect_type, key=key, payload={"n": 1},
                              estimated_cost_micros=1000 * DOLLAR, compensates_effect_id=email)

    asyncio.run(abegin())
    assert _tables(gate) == before


def test_the_steps_own_undo_runs_past_a_full_ceiling_once(make_gate: Any) -> None:
    """The day's $100 is spent on a charge; its undo (the request sagas build, at its cost)
    runs, charges no counter, and a second begin of it is its duplicate."""
    gate = make_gate(policy=CEILING)
    charge = _committed(gate, "payment.charge", "charge:1", cost=100 * DOLLAR)
    spent = _tables(gate)["effectgate_budgets"]
    undo = compensation_request(gate.get("charge:1"))
    assert undo["key"] == compensation_key("charge:1") == "compensate:charge:1"
    d = gate.begin(**undo)
    assert d.decision is eg.Decision.EXECUTE and d.budget_warning is None, d
    gate.report(d, "committed", result={"refunded": True})
    assert gate.begin(**undo).decision is eg.Decision.DUPLICATE
    assert _tables(gate)["effectgate_budgets"] == spent
    assert gate.get("compensate:charge:1").compensates_effect_id == charge


def test_a_call_of_another_type_that_names_a_step_is_counted_by_the_ceilings(
        make_gate: Any) -> None:
    """Naming a step gives a call that is not an undo no leave to spend past a ceiling."""
    gate = make_gate(policy=CEILING)
    email = _committed(gate, "email.send", "email:hi")
    d = gate.begin(effect_type="payment.refund", key="refund:big", payload={"n": 1},
                   estimated_cost_micros=1000 * DOLLAR, compensates_effect_id=email)
    assert d.decision is eg.Decision.DENIED, d


def test_the_undo_of_a_step_with_a_long_key_is_at_its_hashed_key(make_gate: Any) -> None:
    """A step key too long to prefix: its undo's key is the digest form, and only that."""
    gate = make_gate(policy=CEILING)
    long_key = "email:" + "x" * 505
    _committed(gate, "email.send", long_key)
    undo = compensation_request(gate.get(long_key))
    assert undo["key"].startswith("compensate:sha256:")
    assert gate.begin(**undo).decision is eg.Decision.EXECUTE
    with pytest.raises(eg.ConfigError):
        gate.begin(**{**undo, "key": "compensate:" + long_key[:500]})


@pytest.mark.parametrize(("step_cost", "actual", "undo_cost", "runs"), [
    (None, None, 1000 * DOLLAR, False),       # a free step: its undo may declare nothing
    (0, None, 1, False),
    (5 * DOLLAR, None, 5 * DOLLAR + 1, False),
    (5 * DOLLAR, None, 5 * DOLLAR, True),       # what compensation_request declares
    (5 * DOLLAR, 7 * DOLLAR, 7 * DOLLAR, True),  # the actual cost its holder reported
    (5 * DOLLAR, 3 * DOLLAR, 4 * DOLLAR, False),
    (None, None, None, True),
])
def test_an_undo_declares_no_more_than_its_step_spent(
        make_gate: Any, step_cost: int | None, actual: int | None, undo_cost: int | None,
        runs: bool) -> None:
    gate = make_gate(policy=CEILING)
    d = gate.begin(effect_type="payment.ping", key="ping:1", payload={},
                   estimated_cost_micros=step_cost)
    gate.report(d, "committed", actual_cost_micros=actual)
    before = _tables(gate)
    undo = {"effect_type": "payment.ping.compensate", "key": "compensate:ping:1",
            "payload": {"effect_id": d.effect_id, "compensation": None},
            "compensates_effect_id": d.effect_id, "estimated_cost_micros": undo_cost}
    if runs:
        assert gate.begin(**undo).decision is eg.Decision.EXECUTE
        return
    with pytest.raises(eg.ConfigError, match="more than its step 'ping:1' spent"):
        gate.begin(**undo)
    assert _tables(gate) == before


def test_an_undo_is_never_undone_itself(make_gate: Any) -> None:
    """Red team, round 9: the undo of a committed undo is "its step's own undo" by type
    (``….compensate.compensate``), key and cost, and no ceiling counts it either, nor the undo
    of that: five $100 "undos" ran past a full $100-a-day ceiling, one chained on the other.
    An undo names a step that is not itself an undo, or ``begin`` refuses it (sync, async,
    ``preview``) and writes nothing; the first undo still runs."""
    gate = make_gate(policy=CEILING)
    _committed(gate, "payment.charge", "charge:1", 100 * DOLLAR)
    undo = compensation_request(gate.get("charge:1"))
    d = gate.begin(**undo)
    assert d.decision is eg.Decision.EXECUTE  # past the full ceiling: it gives back
    gate.report(d, "committed", result={"refunded": True})
    again = compensation_request(gate.get(undo["key"]))
    assert again["effect_type"] == "payment.charge.compensate.compensate"
    before = _tables(gate)
    with pytest.raises(eg.ConfigError, match="itself an undo"):
        gate.begin(**again)
    with pytest.raises(eg.ConfigError, match="itself an undo"):
        gate.preview(**again)

    async def abegin() -> None:
        with pytest.raises(eg.ConfigError, match="itself an undo"):
            await gate.abegin(**again)

    asyncio.run(abegin())
    assert _tables(gate) == before
