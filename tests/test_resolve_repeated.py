"""An operator's resolve repeated with the same verdict by the same name is answered with the
row and writes nothing (red team, round 10: when the first one's reply was lost, a retry was
refused as "it is failed", and the operator could not tell their verdict had been stored). A
different verdict, another result or another name is still refused."""

from __future__ import annotations

from typing import Any

import pytest

import effectgate as eg


@pytest.mark.parametrize("outcome", ["failed", "committed"])
def test_the_same_verdict_again_is_answered_with_the_row(make_gate: Any, outcome: str) -> None:
    gate: eg.Gate = make_gate(policy=False)
    d = gate.begin(effect_type="t.x", key="k", payload={})
    gate.report(d, "ambiguous", error="timeout")
    reviewed = gate.get("k")
    first = gate.resolve("k", outcome, by="ops", result={"id": 7})
    again = gate.resolve("k", outcome, by="ops", result={"id": 7})
    assert again.state.value == outcome and again.lease_token == first.lease_token
    assert len(gate.get("k").history) == len(first.history)  # nothing written
    assert gate.resolve("k", outcome, by="ops", result={"id": 7}, expected=reviewed
                        ).lease_token == first.lease_token  # as reviewed before the first
    with pytest.raises(eg.InvalidTransition):
        gate.resolve("k", outcome, by="someone else", result={"id": 7})
    if outcome == "committed":  # another result, or FAILED, is another verdict
        for verdict, result in (("committed", {"id": 8}), ("failed", None)):
            with pytest.raises(eg.InvalidTransition):
                gate.resolve("k", verdict, by="ops", result=result)
    else:  # a FAILED found to have happened after all is still a verdict of its own
        assert gate.resolve("k", "committed", by="ops").lease_token == first.lease_token + 1
