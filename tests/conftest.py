"""Every store test runs on SQLite and on Postgres.

Postgres is the server on 127.0.0.1:5432 (``$EFFECTGATE_TEST_PG_URL`` overrides). Each test gets
its own namespace, so tests run in parallel (pytest-xdist) on one database. With ``CI=true`` a
Postgres test that cannot connect fails; elsewhere it skips.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg

PG_URL = os.environ.get(
    "EFFECTGATE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_pg_error: list[str] = []


def _postgres_available() -> str | None:
    if _pg_error:
        return _pg_error[0] or None
    try:
        import psycopg

        with psycopg.connect(PG_URL.replace("+psycopg", ""), connect_timeout=3):
            pass
        _pg_error.append("")
        return None
    except Exception as err:  # pragma: no cover - depends on the machine
        _pg_error.append(f"Postgres unavailable at {PG_URL}: {err}")
        return _pg_error[0]


def require_postgres() -> None:
    """Skip (or, in CI, fail) when Postgres cannot be reached."""
    problem = _postgres_available()
    if problem:
        if IN_CI:
            pytest.fail(problem)
        pytest.skip(problem)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        require_postgres()
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'effects.db'}"
    return PG_URL


@pytest.fixture
def namespace() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_gate(store_url: str, namespace: str) -> Iterator[Any]:
    gates: list[eg.Gate] = []

    def make(**options: Any) -> eg.Gate:
        options.setdefault("namespace", namespace)
        gate = eg.Gate(store_url, **options)
        gates.append(gate)
        return gate

    yield make
    for gate in gates:
        gate.close()


@pytest.fixture
def gate(make_gate: Any) -> eg.Gate:
    return make_gate()  # type: ignore[no-any-return]


def snapshot(gate: eg.Gate) -> list[tuple[Any, ...]]:
    """Every row of this gate's namespace (effects with their history, approvals, spend
    counters), for asserting that nothing changed."""
    from sqlalchemy import text

    rows: list[tuple[Any, ...]] = []
    with gate.store.engine.connect() as conn:
        for table, order in (("effectgate_effects", "id"), ("effectgate_approvals", "id"),
                             ("effectgate_budgets", "scope_key")):
            rows += [tuple(r) for r in conn.execute(
                text(f"SELECT * FROM {table} WHERE namespace = :ns ORDER BY {order}"),
                {"ns": gate.namespace},
            )]
    return rows
