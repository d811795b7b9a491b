"""Over ``effectgate mcp serve`` the agent names each effect's type itself (red team, round
8): with a policy whose rules name only some types, a type none of them matches
(``Payment.charge``, ``pay.charge``: the globs are case-sensitive) needs no approval and is
counted by no rule's ceiling. The server says so on stderr at start, beside the store and the
policy, unless the policy has a ``*`` rule (or no rules at all)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RULES = '[effects."payment.*"]\napproval = "always"\n'
EVERYTHING = RULES + '\n[effects."*"]\napproval = "always"\n'


@pytest.mark.parametrize(("policy", "warned"), [(RULES, True), (EVERYTHING, False),
                                                (None, False)])
def test_mcp_serve_warns_when_no_rule_covers_every_type(tmp_path: Path, policy: str | None,
                                                        warned: bool) -> None:
    args = [sys.executable, "-m", "effectgate.cli", "mcp", "serve", "--url",
            f"sqlite:///{tmp_path}/effects.db", "-n", "agents"]
    if policy is not None:
        (tmp_path / "policy.toml").write_text(policy)
        args += ["--policy", str(tmp_path / "policy.toml")]
    serve = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=60)
    assert "effectgate: mcp serve: store " in serve.stderr, serve.stderr
    assert ("warning: the policy has no '*' rule" in serve.stderr) is warned, serve.stderr
