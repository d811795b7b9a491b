"""Policy loading: good files load; a malformed one fails at load naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

import effectgate as eg

GOOD = """
strict = true

[budget]
per_day_micros = 500_000_000

[effects."payment.*"]
vendor = "stripe"
lease_seconds = 30
max_attempts = 3
approval = { at_or_above_micros = 100_000_000, expires_seconds = 3600 }
budget = { per_run_micros = 50_000_000 }

[effects."payment.refund"]
key = "refund:{txn_id}"
tools = ["refund"]
on_ambiguous = "block"
"""


def write(tmp_path: Path, text: str, name: str = "effectgate.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_loads_effectgate_toml(tmp_path: Path) -> None:
    policy = eg.Policy.load(write(tmp_path, GOOD))
    assert policy.strict
    exact = policy.rule_for("payment.refund")
    assert exact is not None and exact.key == "refund:{txn_id}" and exact.on_ambiguous == "block"
    glob = policy.rule_for("payment.charge")
    assert glob is not None and glob.vendor == "stripe" and glob.max_attempts == 3
    assert policy.rule_for("email.send") is None
    assert set(policy.tool_effects()) == {"refund"}
    assert [s for _, s, _ in policy.ceilings_for("payment.charge")] == ["run", "day"]


def test_loads_pyproject_table(tmp_path: Path) -> None:
    text = '[project]\nname = "x"\n\n[tool.effectgate.effects."email.send"]\nkey = "email:{id}"\n'
    policy = eg.Policy.load(write(tmp_path, text, "pyproject.toml"))
    assert policy.rule_for("email.send") is not None


def test_gate_takes_a_policy_path(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    gate = eg.Gate(f"sqlite:///{tmp_path / 'e.db'}", policy=str(path))
    assert gate.policy is not None and gate.policy.strict
    gate.close()


MALFORMED = [
    ("max_attempts = 0", "max_attempts", "greater than or equal to 1"),
    ("lease_seconds = -1", "lease_seconds", "greater than 0"),
    ("lease_secs = 5", "lease_secs", "unknown field"),
    ('vendor = "paypal"', "vendor", "unknown vendor"),
    ('key = "refund:{}"', "key", "positional"),
    ('key = "refund:{txn_id!r}"', "key", "conversions"),
    ('on_ambiguous = "retry"', "on_ambiguous", "'block' or 'reconcile'"),
    ("approval = 5", "approval", ""),
    ('approval = { at_or_above_micros = -1 }', "at_or_above_micros", "greater than or equal"),
    ('budget = { per_run_micros = "lots" }', "per_run_micros", "integer"),
    ("budget = { per_week_micros = 5 }", "per_week_micros", "unknown field"),
    ('tools = "refund"', "tools", "tuple"),
]


@pytest.mark.parametrize(("line", "field", "message"), MALFORMED)
def test_malformed_policy_names_file_line_and_field(tmp_path: Path, line: str, field: str,
                                                    message: str) -> None:
    text = f'# a policy\n\n[effects."payment.refund"]\n{line}\n'
    path = write(tmp_path, text)
    with pytest.raises(eg.PolicyError) as err:
        eg.Policy.load(path)
    text_of_error = str(err.value)
    assert str(path) in text_of_error and field in text_of_error
    assert message.lower() in text_of_error.lower()
    assert f"{path}:4" in text_of_error  # the line it is on


@pytest.mark.parametrize(("text", "message"), [
    ("[effects\n", "not valid TOML"),
    ('[effects.a]\ntools = ["t"]\n', "tools need a key template"),
    ('[effects."a.*"]\nkey = "k:{x}"\ntools = ["t"]\n', "not a pattern"),
    ('[effects.a]\nkey="a:{x}"\ntools=["t"]\n[effects.b]\nkey="b:{x}"\ntools=["t"]\n',
     "declared by both"),
    ("strict = 3\n", "strict"),
])
def test_malformed_policy_structure(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(eg.PolicyError, match=message):
        eg.Policy.load(write(tmp_path, text))


def test_missing_file_and_missing_table(tmp_path: Path) -> None:
    with pytest.raises(eg.PolicyError, match="cannot read"):
        eg.Policy.load(tmp_path / "nope.toml")
    with pytest.raises(eg.PolicyError, match=r"no \[tool.effectgate\]"):
        eg.Policy.load(write(tmp_path, "[project]\nname='x'\n", "pyproject.toml"))
