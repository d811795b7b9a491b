"""The repository's own hygiene: the licence pyproject names is there in full, the code cites
the design files that ship with it, and the suite deletes what it writes in the shared
Postgres database."""

from __future__ import annotations

import re
import tomllib
import uuid
from pathlib import Path

import effectgate as eg

from .conftest import PG_URL, TEST_PREFIX, delete_namespaces, require_postgres

ROOT = Path(__file__).resolve().parent.parent


def test_the_license_is_the_full_apache_2_0_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == (
        "Apache-2.0")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    for n in range(1, 10):
        assert re.search(rf"^\s*{n}\. [A-Z]", text, re.M), f"section {n} missing"
    assert "END OF TERMS AND CONDITIONS" in text


def test_code_cites_design_files_that_ship_with_it() -> None:
    sources = [*ROOT.joinpath("core").rglob("*.py"), *ROOT.joinpath("integrations").rglob("*.py")]
    citing = [str(p.relative_to(ROOT)) for p in sources if "DESIGN.md" in p.read_text()]
    assert citing == []
    for page in ("guarantees", "states", "storage", "adapters", "benchmarks"):
        assert (ROOT / "docs" / f"{page}.md").is_file(), page
    guarantees = (ROOT / "docs" / "guarantees.md").read_text()
    for n in range(1, 17):
        assert f"| G{n} |" in guarantees, f"G{n}"
    for cited in re.findall(r"docs/[a-z_]+\.md", "".join(p.read_text() for p in sources)):
        assert (ROOT / cited).is_file(), cited


def test_the_end_of_run_cleanup_deletes_exactly_this_prefix() -> None:
    require_postgres()
    mine = f"{TEST_PREFIX}cleanup-{uuid.uuid4().hex[:8]}"
    other = f"keep-{uuid.uuid4().hex[:8]}"
    policy = eg.Policy.from_dict({"effects": {"payment.*": {
        "approval": "always", "budget": {"per_run_micros": 10}}}})
    for namespace in (mine, other):
        with eg.Gate(PG_URL, namespace=namespace, policy=policy) as gate:
            gate.begin(effect_type="payment.refund", key="refund:1", payload={}, run_id="r",
                       estimated_cost_micros=1)
            gate.begin(effect_type="other", key="k", payload={})
    try:
        assert delete_namespaces(PG_URL, mine) >= 3
        assert _rows(mine) == 0
        assert _rows(other) >= 3
    finally:
        delete_namespaces(PG_URL, other)
    assert _rows(other) == 0


def _rows(namespace: str) -> int:
    import psycopg

    with psycopg.connect(PG_URL.replace("+psycopg", "")) as conn:
        return sum(int(conn.execute(f"SELECT count(*) FROM {t} WHERE namespace = %s",
                                    (namespace,)).fetchone()[0])  # type: ignore[index]
                   for t in ("effectgate_effects", "effectgate_approvals", "effectgate_budgets"))
