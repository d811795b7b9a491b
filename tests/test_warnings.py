"""Every warning effectgate issues sits under one root, ``eg.EffectGateWarning``, declared in
``effectgate.errors`` and drawn in its module's tree."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate import errors

__all__: list[str] = []

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(ROOT / "core").rglob("*.py"), *(ROOT / "integrations").rglob("*.py")])


def _warning_classes() -> dict[str, Path]:
    """Every class in the package whose base is named ``...Warning``, and where it is."""
    found: dict[str, Path] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                    (isinstance(b, ast.Name) and b.id.endswith("Warning"))
                    or (isinstance(b, ast.Attribute) and b.attr.endswith("Warning"))
                    for b in node.bases):
                found[node.name] = path
    return found


def _warned_categories() -> set[str]:
    """The category named by every ``warnings.warn(...)`` call in the package."""
    names: set[str] = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "warn"):
                category = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "category"), None)
                assert isinstance(category, ast.Name), f"{path}: warn without a named category"
                names.add(category.id)
    return names


def test_every_warning_class_is_declared_in_errors_under_the_root() -> None:
    """No module declares a warning of its own: each lives in ``errors.py``, under the root."""
    found = _warning_classes()
    assert set(found) >= {"EffectGateWarning", "BudgetWarning", "OverspendWarning",
                          "ResultNotStoredWarning", "UngatedToolWarning"}
    for name, path in found.items():
        assert path == ROOT / "core" / "errors.py", (name, path)
        cls = getattr(errors, name)
        assert issubclass(cls, eg.EffectGateWarning) and issubclass(cls, UserWarning), name
        assert name in errors.__all__


def test_every_warn_call_uses_an_effectgate_warning() -> None:
    """Each ``warnings.warn`` names a category under the root (never a bare UserWarning)."""
    categories = _warned_categories()
    assert categories  # the scan really found the calls
    for name in categories:
        assert issubclass(getattr(errors, name), eg.EffectGateWarning), name


def test_the_tree_at_the_top_of_errors_draws_every_warning() -> None:
    """The module docstring's warning tree names every warning class."""
    doc = errors.__doc__ or ""
    for name in _warning_classes():
        assert f" {name} " in doc, name


def test_one_filter_on_the_root_catches_a_real_warning(make_gate: Any) -> None:
    """A budget that cannot fire warns ``BudgetWarning``; filtering the root alone turns it
    into an error."""
    gate = make_gate(policy={"effects": {"payment.*": {"budget": {"per_agent_micros": 10}}}})

    @gate.effect("refund:{t}", effect_type="payment.refund")
    def refund(t: str) -> None: ...

    with warnings.catch_warnings():
        warnings.simplefilter("error", eg.EffectGateWarning)
        with pytest.raises(eg.BudgetWarning):
            refund("y")
