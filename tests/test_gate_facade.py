"""``Gate`` is a thin facade: ``core/gate.py`` stays small, and its public methods are the
binding ones (DESIGN.md "Public API"), each documented."""

from __future__ import annotations

import inspect
from pathlib import Path

import effectgate as eg

__all__: list[str] = []

GATE_PY = Path(__file__).resolve().parent.parent / "core" / "gate.py"
MAX_LINES = 600
PUBLIC = {
    "aapprove", "abegin", "acting_as", "add_principal", "adeny", "aextend_lease", "aget",
    "ambiguous_queue", "approval", "approve", "aprune", "areport", "aresolve", "aunwind",
    "authenticate", "begin", "close", "compensator", "compensator_for", "count_by_state",
    "deny", "effect", "extend_lease", "get", "get_by_id", "group_steps", "in_namespace", "kind",
    "list_approvals", "list_effects", "list_principals", "preview", "prune", "reconcile",
    "reconciler", "report", "request", "resolve", "revoke_principal", "store", "url",
    "unwind", "webhooks",
}


def test_gate_py_is_at_most_600_lines() -> None:
    """Request building, reports, operators' acts, reads and the policy in force live in
    their own modules; the facade stays under the bar (issue 24)."""
    lines = len(GATE_PY.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"core/gate.py has {lines} lines (at most {MAX_LINES})"


def test_the_facade_keeps_its_public_methods_documented() -> None:
    """Every public method and property of ``Gate`` is still there, with a docstring."""
    names = {n for n, _ in inspect.getmembers(eg.Gate) if not n.startswith("_")}
    assert names == PUBLIC
    for name in names:
        assert inspect.getdoc(getattr(eg.Gate, name)), name
