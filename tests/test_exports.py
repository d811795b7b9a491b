"""The public surface: a sorted ``__all__``, pinned, every name documented."""

from __future__ import annotations

import inspect

import effectgate as eg

EXPECTED = {
    "VENDOR_RULES", "ApprovalRecord", "ApprovalRequired", "ApprovalRule", "ApprovalState",
    "BeginDecision",
    "Budget", "BudgetWarning", "Classifier", "ConfigError", "Decision", "EffectAmbiguous",
    "EffectDenied", "EffectGateError", "EffectInFlight", "EffectKeyError", "EffectRecord",
    "EffectRefused", "EffectRule", "EffectSpec", "Forbidden", "Gate", "HistoryEntry",
    "InvalidTransition", "KeyTemplate", "Lease", "NotExecuted", "Outcome", "OverspendWarning",
    "PayloadError", "PayloadMismatch", "Policy", "PolicyError", "Principal", "Reconciled",
    "Request", "ResultNotStoredWarning", "StaleLease", "State", "StoreError", "Unauthenticated",
    "UnknownEffect", "UnwindReport", "UnwindStep", "UpstreamRule", "VendorKey",
    "__version__", "canonical_json", "classify", "classify_httpx", "classify_requests",
    "current_effect", "current_effect_scope", "effect_context", "payload_hash", "refusal",
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
