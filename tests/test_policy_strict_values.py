"""A policy refuses what it cannot mean (red team, round 9): a file that is not UTF-8 is a
:class:`PolicyError` naming the file (not a bare ``UnicodeDecodeError``, and without the file's
text); a bool or a string is no number of seconds (``lease_seconds = true`` was a one-second
lease while ``max_attempts = true`` was refused); an effect type pattern holds what an effect
type may hold (an empty one, a NUL, a no-break space or a decomposed accent matched no type:
a rule that governed nothing); a key template field is an argument's name, never a position
(``{0}``: a decorator refuses it, since no parameter is named ``0``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import effectgate as eg


def test_a_policy_file_that_is_not_utf8_is_a_policy_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "effectgate.toml"
    path.write_bytes(b'[effects."payment.*"]\nkey = "hunter2-secret"\n\xff\xfe\n')
    with pytest.raises(eg.PolicyError) as refused:
        eg.Policy.load(path)
    message = str(refused.value)
    assert str(path) in message and "UTF-8" in message
    assert "hunter2" not in message and "\\xff" not in message and "0xff" not in message
    with pytest.raises(eg.PolicyError):
        eg.Gate(f"sqlite:///{tmp_path / 'e.db'}", policy=path)
    assert not (tmp_path / "e.db").exists()


NOT_NUMBERS: list[tuple[str, dict[str, Any]]] = [
    ("lease_seconds", {"lease_seconds": True}),
    ("lease_seconds", {"lease_seconds": "30"}),
    ("reconcile_grace_seconds", {"reconcile_grace_seconds": True}),
    ("reconcile_grace_seconds", {"reconcile_grace_seconds": "60"}),
    ("expires_seconds", {"approval": {"always": True, "expires_seconds": True}}),
    ("expires_seconds", {"approval": {"always": True, "expires_seconds": "3600"}}),
    ("max_attempts", {"max_attempts": True}),
    ("at_or_above_micros", {"approval": {"at_or_above_micros": True}}),
    ("per_day_micros", {"budget": {"per_day_micros": True}}),
]


def _accepted(rules: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The rules a policy loads (each refused one must name its field)."""
    accepted = []
    for field, rule in rules:
        try:
            eg.Policy.from_dict({"effects": {"a.*": rule}})
        except eg.PolicyError as err:
            assert field in str(err)
        else:
            accepted.append((field, rule))
    return accepted


def test_no_numeric_field_takes_a_bool_or_a_string() -> None:
    assert _accepted(NOT_NUMBERS) == []


def test_a_toml_lease_of_true_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "effectgate.toml"
    path.write_text("[effects.'a.*']\nlease_seconds = true\n")
    with pytest.raises(eg.PolicyError, match=r"effectgate\.toml:2: .*lease_seconds"):
        eg.Policy.load(path)


@pytest.mark.parametrize(("field", "number", "not_number"), [
    ("lease_seconds", 30, True), ("lease_seconds", 0.5, "0.5"),
    ("reconcile_grace_seconds", 60, True), ("expires_seconds", 3600, True),
])
def test_whole_and_fractional_seconds_load_and_bools_do_not(
        field: str, number: float, not_number: object) -> None:
    def rule(value: object) -> dict[str, Any]:
        if field == "expires_seconds":
            return {"approval": {"always": True, field: value}}
        return {field: value}

    policy = eg.Policy.from_dict({"effects": {"a.*": rule(number)}})
    assert policy.rule_for("a.x") is not None
    with pytest.raises(eg.PolicyError, match=field):
        eg.Policy.from_dict({"effects": {"a.*": rule(not_number)}})


@pytest.mark.parametrize("pattern", ["", " ", "a\x00", "payment.refund\u00a0",
                                     "payment\u2003refund", "a\u200b.*", "a\u3164",
                                     "paiement.rembourse\u0301"])
def test_a_pattern_no_effect_type_can_hold_is_refused(pattern: str) -> None:
    with pytest.raises(eg.PolicyError, match="effect type pattern"):
        eg.Policy.from_dict({"effects": {pattern: {"approval": "always"}}})


@pytest.mark.parametrize(("pattern", "lookalike"), [
    ("payment.*", "payment.*\u00a0"), ("paiement.rembours\u00e9", "paiement.rembourse\u0301"),
    ("payment refund", "payment\u2003refund"), ("[!a]*.x", "[!a]*.x\x00"), ("*", ""),
])
def test_a_pattern_loads_and_its_lookalike_does_not(pattern: str, lookalike: str) -> None:
    policy = eg.Policy.from_dict({"effects": {pattern: {"approval": "always"}}})
    assert policy.effects[pattern].effect_type == pattern
    with pytest.raises(eg.PolicyError, match="effect type pattern"):
        eg.Policy.from_dict({"effects": {lookalike: {"approval": "always"}}})


@pytest.mark.parametrize("template", ["k:{0}", "k:{00}", "k:{0[a]}", "k:{1.x}", "{0}"])
def test_a_positional_key_field_is_refused_as_in_code(template: str, tmp_path: Path) -> None:
    with pytest.raises(eg.PolicyError, match="positional"):
        eg.Policy.from_dict({"effects": {"a.x": {"key": template, "tools": ["t"]}}})
    with eg.Gate(f"sqlite:///{tmp_path / 'e.db'}", policy=False) as gate, \
            pytest.raises(eg.EffectKeyError):  # in code: no parameter is named "0"
        gate.effect(template, effect_type="a.x")(lambda n: n)


@pytest.mark.parametrize(("named", "positional"), [
    ("k:{x0}", "k:{0}"), ("k:{x[0]}", "k:{0[0]}"), ("k:{x.y}", "k:{0.y}"), ("k:{_0}", "k:{10}"),
])
def test_a_named_key_field_loads_and_a_position_does_not(named: str, positional: str) -> None:
    eg.Policy.from_dict({"effects": {"a.x": {"key": named, "tools": ["t"]}}})
    with pytest.raises(eg.PolicyError, match="positional"):
        eg.Policy.from_dict({"effects": {"a.x": {"key": positional, "tools": ["t"]}}})


@pytest.mark.parametrize("number", [0, 0.0])
def test_approval_false_means_none_and_approval_zero_is_refused(number: float) -> None:
    """``approval = 0`` was read as ``false`` (no approval at all): one who meant a
    threshold of 0 (every call approved) got none."""
    policy = eg.Policy.from_dict({"effects": {"a.*": {"approval": False}}})
    rule = policy.rule_for("a.x")
    assert rule is not None and rule.approval is None
    with pytest.raises(eg.PolicyError, match="approval"):
        eg.Policy.from_dict({"effects": {"a.*": {"approval": number}}})


NOT_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("deny", {"deny": 0}), ("deny", {"deny": 1}), ("deny", {"deny": ""}),
    ("deny", {"deny": "  "}), ("deny", {"deny": "no\x00reason"}),
    ("always", {"approval": {"always": "yes"}}), ("always", {"approval": {"always": 1}}),
    ("always", {"approval": {"always": "false"}}),
    ("allow_self_approval", {"approval": {"always": True, "allow_self_approval": "no"}}),
    ("allow_self_approval", {"approval": {"always": True, "allow_self_approval": 1}}),
]


def test_a_flag_is_true_or_false_and_a_denial_a_reason() -> None:
    """``deny = 0`` denied nothing and ``deny = 1`` everything, ``always = "false"`` asked for
    every call: a flag that is not a bool (or, for ``deny``, a reason that shows) is refused."""
    assert _accepted(NOT_FLAGS) == []
    policy = eg.Policy.from_dict({"effects": {
        "a.*": {"deny": "frozen by finance"}, "b.*": {"deny": True}, "c.*": {"deny": False},
        "d.*": {"approval": {"always": True, "allow_self_approval": False}}}})
    assert [policy.rule_for(t).denied for t in ("a.x", "b.x", "c.x")] == [  # type: ignore[union-attr]
        "frozen by finance", "policy denies b.*", None]
    assert policy.rule_for("d.x").approval.always  # type: ignore[union-attr]
