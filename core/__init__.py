"""effectgate: make an AI agent's real-world side effects happen at most once.

Name each consequence with an effect key (``"refund:{txn_id}"``); the gate reserves it in one
atomic write before the action runs, and answers every repeat from the store::

    import effectgate as eg

    gate = eg.Gate()

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict:
        ...
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .classify import (
    Classifier,
    classify,
    classify_body,
    classify_httpx,
    classify_requests,
    recorded_outcome,
)
from .context import current_effect, current_effect_scope, effect_context
from .decorator import EffectSpec, refusal
from .errors import (
    ApprovalRequired,
    BudgetWarning,
    ConfigError,
    EffectAmbiguous,
    EffectDenied,
    EffectGateError,
    EffectGateWarning,
    EffectInFlight,
    EffectKeyError,
    EffectRefused,
    Forbidden,
    InvalidTransition,
    NotExecuted,
    OverspendWarning,
    PayloadError,
    PayloadMismatch,
    PolicyError,
    ResultNotStoredWarning,
    StaleLease,
    StoreError,
    Unauthenticated,
    UnknownEffect,
)
from .keys import KeyTemplate
from .payload import canonical_json, payload_hash
from .principals import Principal
from .reconcile import Reconciled
from .records import BeginDecision
from .request import Lease, Request
from .states import ApprovalState, Decision, Outcome, State
from .vendors import VENDOR_RULES, VendorKey

if TYPE_CHECKING:
    __version__: str

    from .gate import Gate
    from .policy import ApprovalRule, Budget, EffectRule, Policy, UpstreamRule
    from .sagas import UnwindReport, UnwindStep
    from .stored import ApprovalRecord, EffectRecord, HistoryEntry
    from .webhooks import Webhooks, verify_signature

# Imported on first use: the store (SQLAlchemy) and the policy (pydantic) cost a third of a
# second that ``import effectgate`` need not pay (PEP 562); sagas and the stored records
# (frozen dataclasses), ~10 ms of a worker's start.
_LAZY = {"Gate": ".gate", "ApprovalRecord": ".stored", "ApprovalRule": ".policy",
         "Budget": ".policy", "EffectRecord": ".stored", "HistoryEntry": ".stored",
         "EffectRule": ".policy", "Policy": ".policy", "UpstreamRule": ".policy",
         "UnwindReport": ".sagas", "UnwindStep": ".sagas",
         "Webhooks": ".webhooks", "verify_signature": ".webhooks"}


def __getattr__(name: str) -> Any:
    if name == "__version__":  # reading the installed metadata costs 20 ms: on first use
        globals()[name] = value = _version()
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'effectgate' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value

# The library prints nothing: without the application's own logging set up, records stop here.
logging.getLogger("effectgate").addHandler(logging.NullHandler())

def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("effectgate")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"

__all__ = [
    "VENDOR_RULES",
    "ApprovalRecord",
    "ApprovalRequired",
    "ApprovalRule",
    "ApprovalState",
    "BeginDecision",
    "Budget",
    "BudgetWarning",
    "Classifier",
    "ConfigError",
    "Decision",
    "EffectAmbiguous",
    "EffectDenied",
    "EffectGateError",
    "EffectGateWarning",
    "EffectInFlight",
    "EffectKeyError",
    "EffectRecord",
    "EffectRefused",
    "EffectRule",
    "EffectSpec",
    "Forbidden",
    "Gate",
    "HistoryEntry",
    "InvalidTransition",
    "KeyTemplate",
    "Lease",
    "NotExecuted",
    "Outcome",
    "OverspendWarning",
    "PayloadError",
    "PayloadMismatch",
    "Policy",
    "PolicyError",
    "Principal",
    "Reconciled",
    "Request",
    "ResultNotStoredWarning",
    "StaleLease",
    "State",
    "StoreError",
    "Unauthenticated",
    "UnknownEffect",
    "UnwindReport",
    "UnwindStep",
    "UpstreamRule",
    "VendorKey",
    "Webhooks",
    "__version__",
    "canonical_json",
    "classify",
    "classify_body",
    "classify_httpx",
    "classify_requests",
    "current_effect",
    "current_effect_scope",
    "effect_context",
    "payload_hash",
    "recorded_outcome",
    "refusal",
    "verify_signature",
]
