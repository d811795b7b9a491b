"""The lapsed-lease rule has one Python home, :mod:`effectgate.decide`: a lease is live while
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
# The store's SQL copies are the store's (to be generated from one expression there); the
# model checker and the flow are another engineer's (issue 24, first bullet).
EXEMPT = ("core/decide.py", "core/store/", "core/verify/", "core/flow.py")


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


def test_no_other_python_copy_of_the_rule() -> None:
    """Outside ``decide`` (and the exempt store, model checker and flow) no module compares a
    lease's end with the clock itself."""
    copies = []
    for path in sorted([*(ROOT / "core").rglob("*.py"), *(ROOT / "integrations").rglob("*.py")]):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith(EXEMPT):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if _compares_lease_end(node):
                copies.append(f"{where}:{node.lineno}")  # type: ignore[attr-defined]
    assert copies == []
