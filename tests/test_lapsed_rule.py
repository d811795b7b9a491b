"""The lapsed-lease rule has one Python home, :mod:`effectgate.decide`, and one SQL home,
:mod:`effectgate.store.schema` (``in_flight_live``, ``in_flight_lapsed``): a lease is live while
its end is not before the store's clock; an IN_FLIGHT effect past it reads AMBIGUOUS."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from effectgate import decide
from effectgate.states import State

__all__: list[str] = []

ROOT = Path(__file__).resolve().parent.parent
# The rule's two homes: in Python, and in the store's SQL (every statement builds it there).
EXEMPT = ("core/decide.py", "core/store/schema.py")


class Row:
    """The three fields the rule reads."""

    def __init__(self, state: State, lease_expires_at: float | None, now: float) -> None:
        self.state, self.lease_expires_at, self.now = state, lease_expires_at, now


@pytest.mark.parametrize("state, expires, now, live, lapsed, effective", [
    (State.IN_FLIGHT, 10.0, 9.0, True, False, State.IN_FLIGHT),
    (State.IN_FLIGHT, 10.0, 10.0, True, False, State.IN_FLIGHT),  # the boundary is live
    (State.IN_FLIGHT, 10.0, 10.001, False, True, State.AMBIGUOUS),
    (State.IN_FLIGHT, None, 10.0, False, False, State.IN_FLIGHT),
    (State.COMMITTED, 10.0, 11.0, False, False, State.COMMITTED),
    (State.AMBIGUOUS, 10.0, 11.0, False, False, State.AMBIGUOUS),
])
def test_the_rule(state: State, expires: float | None, now: float, live: bool, lapsed: bool,
                  effective: State) -> None:
    """Live up to and including the end; lapsed only for IN_FLIGHT past it."""
    row: Any = Row(state, expires, now)
    assert decide.lease_live(row) is live
    assert decide.lapsed(row) is lapsed
    assert decide.effective_state(row) is effective


def _compares_lease_end(node: ast.AST) -> bool:
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    named = any(isinstance(s, ast.Attribute) and s.attr == "lease_expires_at" for s in sides)
    ordered = any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops)
    return named and ordered


def test_no_other_copy_of_the_rule() -> None:
    """Outside its two homes no module compares a lease's end with the clock itself: not in
    Python, not in a SQLAlchemy expression (the store, the model checker and the flow
    included)."""
    copies = []
    for path in sorted([*(ROOT / "core").rglob("*.py"), *(ROOT / "integrations").rglob("*.py")]):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith(EXEMPT):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if _compares_lease_end(node):
                copies.append(f"{where}:{node.lineno}")  # type: ignore[attr-defined]
    assert copies == []


_CASES = [(State.IN_FLIGHT, 10.0, 9.0), (State.IN_FLIGHT, 10.0, 10.0),
          (State.IN_FLIGHT, 10.0, 10.001), (State.IN_FLIGHT, None, 10.0),
          (State.COMMITTED, 10.0, 11.0), (State.AMBIGUOUS, 10.0, 11.0),
          (State.AMBIGUOUS, None, 11.0), (State.FAILED, 12.0, 11.0)]


def test_the_sql_home_says_what_decide_says(make_gate: Any) -> None:
    """``in_flight_live`` and ``in_flight_lapsed``, run by the database on rows in each case
    (a NULL lease end included), answer as ``decide`` does for the same row and clock."""
    from sqlalchemy import bindparam, select, update

    from effectgate.store.schema import effects, in_flight_lapsed, in_flight_live

    gate = make_gate(policy=False)
    t = effects.c
    with gate.store.engine.begin() as conn:
        for i, (state, expires, _) in enumerate(_CASES):
            gate.begin(effect_type="t.rule", key=f"rule:{i}", payload={"i": i})
            conn.execute(update(effects).where(
                (t.namespace == gate.namespace) & (t.key == f"rule:{i}")).values(
                state=state.value, lease_expires_at=expires))
    now = bindparam("now", type_=effects.c.lease_expires_at.type)
    stmt = select(t.key, in_flight_live(now), in_flight_lapsed(now)).where(
        (t.namespace == gate.namespace) & (t.key == bindparam("key")))
    with gate.store.engine.connect() as conn:
        for i, (state, expires, at) in enumerate(_CASES):
            _, live, lapsed = conn.execute(stmt, {"now": at, "key": f"rule:{i}"}).one()
            row: Any = Row(state, expires, at)
            assert bool(live) is (state is State.IN_FLIGHT and decide.lease_live(row)), i
            assert bool(lapsed) is decide.lapsed(row), i
