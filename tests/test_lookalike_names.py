"""Effect types, namespaces and group keys refuse what keys refuse: a space other than U+0020
(no-break, em, ideographic, ...) and a character that prints as nothing. ``payment.refund``
followed by a no-break space was a type of its own that printed like ``payment.refund``, so
the exact rule for ``payment.refund`` (approval ``always``) did not govern it, and it ran
(red team, round 9). A namespace such a store already holds can still be read (a read-only
gate opens it); only new writes are refused."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

import effectgate as eg

from .conftest import snapshot

LOOKALIKES = {
    "a no-break space": "\u00a0",
    "an em space": "\u2003",
    "an ideographic space": "\u3000",
    "a narrow no-break space": "\u202f",
    "an ogham space mark": "\u1680",
    "a Hangul filler": "\u3164",
    "a blank braille pattern": "\u2800",
}
POLICY = {"effects": {"payment.refund": {"approval": "always"}, "*": {}}}


@pytest.mark.parametrize("char", LOOKALIKES.values(), ids=list(LOOKALIKES))
def test_an_effect_type_with_a_lookalike_character_is_refused_and_writes_nothing(
        char: str, make_gate: Any) -> None:
    gate = make_gate(policy=POLICY)
    approval = gate.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
    assert approval.decision is eg.Decision.APPROVAL_REQUIRED
    before = snapshot(gate)
    lookalike = f"payment.refund{char}"
    with pytest.raises(eg.ConfigError, match=f"effect_type .*U\\+{ord(char):04X}"):
        gate.begin(effect_type=lookalike, key="refund:2", payload={"n": 2})
    with pytest.raises(eg.ConfigError, match="effect_type"):
        gate.kind(f"payment{char}refund")
    with pytest.raises(eg.ConfigError, match="effect_type"):
        gate.effect("refund:{n}", effect_type=lookalike)(lambda n: n)(3)
    assert snapshot(gate) == before


@pytest.mark.parametrize("char", LOOKALIKES.values(), ids=list(LOOKALIKES))
def test_a_group_key_with_a_lookalike_character_is_refused_and_writes_nothing(
        char: str, gate: eg.Gate) -> None:
    first = gate.begin(effect_type="booking.hotel", key="hotel:1", payload={},
                       group_key="trip:1")
    gate.report(first, "committed", result=None)
    before = snapshot(gate)
    with pytest.raises(eg.ConfigError, match="group_key"):
        gate.begin(effect_type="booking.flight", key="flight:1", payload={},
                   group_key=f"trip:1{char}")
    assert snapshot(gate) == before


@pytest.mark.parametrize("char", ["\u00a0", "\u2003", "\u3164"])
def test_a_namespace_with_a_lookalike_character_is_refused_for_writing_but_read(
        char: str, store_url: str, namespace: str, make_gate: Any) -> None:
    """A store an older effectgate wrote under such a namespace stays readable."""
    gate = make_gate()
    done = gate.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
    gate.report(done, "committed", result={"ok": True})
    lookalike = f"{namespace}{char}"
    with gate.store.engine.begin() as conn:  # as an older version would have written it
        conn.execute(text("UPDATE effectgate_effects SET namespace = :new WHERE namespace = :ns"),
                     {"new": lookalike, "ns": namespace})
    with pytest.raises(eg.ConfigError, match=f"namespace .*U\\+{ord(char):04X}"):
        eg.Gate(store_url, policy=False, namespace=lookalike)
    with pytest.raises(eg.ConfigError, match="namespace"):
        gate.in_namespace(lookalike)
    with eg.Gate(store_url, policy=False, namespace=lookalike, read_only=True) as reader:
        assert reader.namespace == lookalike
        assert reader.get("refund:1").state is eg.State.COMMITTED
    with pytest.raises(eg.UnknownEffect):
        gate.get("refund:1")  # (moved to the look-alike namespace: nothing was added back)


@pytest.mark.parametrize(("name", "lookalike"), [
    ("paiement.rembours\u00e9", "paiement.rembours\u00e9\u00a0"),
    ("\u652f\u4ed8.\u9000\u6b3e", "\u652f\u4ed8\u3000\u9000\u6b3e"),
    ("payment refund", "payment\u00a0refund"),
])
def test_a_name_runs_and_its_lookalike_does_not(name: str, lookalike: str,
                                                gate: eg.Gate) -> None:
    first = gate.begin(effect_type=name, key="refund:1", payload={}, group_key=name)
    assert first.decision is eg.Decision.EXECUTE
    assert first.effect_type == name
    before = snapshot(gate)
    with pytest.raises(eg.ConfigError, match="effect_type"):
        gate.begin(effect_type=lookalike, key="refund:2", payload={})
    with pytest.raises(eg.ConfigError, match="group_key"):
        gate.begin(effect_type=name, key="refund:3", payload={}, group_key=lookalike)
    assert snapshot(gate) == before
