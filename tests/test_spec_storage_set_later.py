"""What an effect spec stores follows its ``redact``, ``redact_result`` and ``store_result``
when one of them is set after the spec is made, as an adapter's copy of a spec does (the MCP
gateway's sets ``redact`` and ``redact_result`` on its copy): the spec's decided-once "stores
the result as it is" never lets a result the spec now redacts (or keeps out) into the store.
"""

from __future__ import annotations

import copy
from typing import Any

import effectgate as eg

SECRET = {"card": "4242424242424242", "ok": True}


def _spec(gate: eg.Gate) -> eg.EffectSpec:
    return eg.EffectSpec(gate, "refund:{txn}", effect_type="pay.refund")


def test_a_redact_set_after_the_spec_is_made_is_applied(make_gate: Any) -> None:
    gate = make_gate(policy=False)
    spec = _spec(gate)
    assert spec.run({"txn": "T1"}, lambda: dict(SECRET)) == SECRET
    assert gate.get("refund:T1").result == SECRET  # nothing to redact: stored as it is
    spec.redact = lambda result: {"ok": result["ok"]}
    assert spec.run({"txn": "T2"}, lambda: dict(SECRET)) == SECRET  # the caller gets it all
    assert gate.get("refund:T2").result == {"ok": True}


def test_a_copy_with_its_own_storage_rules_follows_them(make_gate: Any) -> None:
    gate = make_gate(policy=False)
    spec = _spec(gate)
    fields = copy.copy(spec)
    fields.redact_result = ("card",)
    kept_out = copy.copy(spec)
    kept_out.store_result = False
    fields.run({"txn": "T3"}, lambda: dict(SECRET))
    kept_out.run({"txn": "T4"}, lambda: dict(SECRET))
    spec.run({"txn": "T5"}, lambda: dict(SECRET))
    assert gate.get("refund:T3").result == {"card": "[redacted]", "ok": True}
    assert gate.get("refund:T4").result is None
    assert gate.get("refund:T5").result == SECRET  # the original is as it was
