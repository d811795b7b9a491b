"""The public surface: a sorted ``__all__``, pinned, every name documented."""

from __future__ import annotations

import inspect
from typing import Any

import effectgate as eg

EXPECTED = {
    "VENDOR_RULES", "ApprovalRecord", "ApprovalRequired", "ApprovalRule", "ApprovalState",
    "BeginDecision",
    "Budget", "BudgetWarning", "Classifier", "ConfigError", "Decision", "EffectAmbiguous",
    "EffectDenied", "EffectGateError", "EffectGateWarning", "EffectInFlight", "EffectKeyError",
    "EffectRecord",
    "EffectRefused", "EffectRule", "EffectSpec", "Forbidden", "Gate", "HistoryEntry",
    "InvalidTransition", "KeyTemplate", "Lease", "NotExecuted", "Outcome", "OverspendWarning",
    "PayloadError", "PayloadMismatch", "Policy", "PolicyError", "Principal", "Reconciled",
    "Request", "ResultNotStoredWarning", "StaleLease", "State", "StoreError", "Unauthenticated",
    "UnknownEffect", "UnwindReport", "UnwindStep", "UpstreamRule", "VendorKey",
    "__version__", "canonical_json", "classify", "classify_body", "classify_httpx",
    "classify_requests", "current_effect", "current_effect_scope", "effect_context",
    "payload_hash", "recorded_outcome", "refusal",
    "Webhooks", "verify_signature",
}


def test_all_is_pinned() -> None:
    assert set(eg.__all__) == EXPECTED
    assert len(eg.__all__) == len(EXPECTED)


def test_all_is_sorted_constants_classes_functions() -> None:
    def rank(name: str) -> tuple[int, str]:
        if name.isupper():
            return (0, name)
        if name[0].isupper():
            return (1, name)
        return (2, name)

    assert eg.__all__ == sorted(eg.__all__, key=rank)


def test_every_public_name_is_documented() -> None:
    for name in eg.__all__:
        obj = getattr(eg, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{name} has no docstring"


def test_errors_share_one_root_with_structured_fields() -> None:
    errors = [getattr(eg, n) for n in eg.__all__
              if inspect.isclass(getattr(eg, n)) and issubclass(getattr(eg, n), BaseException)
              and not issubclass(getattr(eg, n), Warning)]
    assert all(issubclass(e, eg.EffectGateError) for e in errors)
    err = eg.EffectAmbiguous("x", key="k", state="ambiguous", decision="blocked", reason="r")
    assert err.fields()["key"] == "k" and err.fields()["decision"] == "blocked"
    assert issubclass(eg.PolicyError, eg.ConfigError)
    assert issubclass(eg.EffectInFlight, eg.EffectRefused)


def _natural(name: str) -> tuple[int, list[Any]]:
    """ruff's order for ``__all__``: CONSTANTS, then Classes, then functions, digits as
    numbers (``check_g2`` before ``check_g12``)."""
    import re

    core = name.lstrip("_")
    rank = 0 if core.isupper() and len(core) > 1 else 1 if core[:1].isupper() else 2
    return rank, [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def test_every_module_has_a_sorted_all_of_names_it_defines() -> None:
    """Every module of ``effectgate`` and ``effectgate.integrations`` declares ``__all__``,
    sorted as ruff sorts it, and each name in it exists."""
    import importlib
    import pkgutil

    import effectgate.integrations as integrations

    seen = 0
    for package in (eg, integrations):
        assert isinstance(getattr(package, "__all__", None), list), package.__name__
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            try:
                module = importlib.import_module(info.name)
            except ImportError:  # a framework's extra is not installed
                continue
            names = getattr(module, "__all__", None)
            assert isinstance(names, list), f"{info.name} has no __all__"
            assert names == sorted(names, key=_natural), info.name
            missing = [n for n in names if not hasattr(module, n)]
            assert not missing, (info.name, missing)
            seen += 1
    assert seen > 80  # really walked the tree


def test_the_durable_engines_public_names_are_pinned_and_documented() -> None:
    """Each engine module exports its decorator (and the DBOS wait's default), documented."""
    import importlib

    import pytest

    expected = {"dbos": ["DEFAULT_WAIT_IN_FLIGHT", "effect_step"],
                "temporal": ["effect_activity"]}
    for engine, names in expected.items():
        try:
            module = importlib.import_module(f"effectgate.integrations.durable.{engine}")
        except ImportError:
            pytest.skip(f"the {engine} extra is not installed")
        assert module.__all__ == names
        for name in names:
            obj = getattr(module, name)
            assert not inspect.isfunction(obj) or obj.__doc__, name
