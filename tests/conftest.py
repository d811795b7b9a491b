"""Every store test runs on SQLite and on Postgres.

Postgres is the server on 127.0.0.1:5432 (``$EFFECTGATE_TEST_PG_URL`` overrides). Each test gets
its own namespace, so tests run in parallel (pytest-xdist) on one database. With ``CI=true`` a
Postgres test that cannot connect fails; elsewhere it skips.

The database is shared (other runs may be using it at the same time), so every namespace this
run makes starts with one prefix of its own (:data:`TEST_PREFIX`, ``t-<run>-``, the same in
every xdist worker); when the whole run ends, every row under that prefix is deleted from every
``effectgate_*`` table that has a namespace column — and only those rows.
"""

from __future__ import annotations

import asyncio
import os
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg

PG_URL = os.environ.get(
    "EFFECTGATE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# One id per test run, set by the first process (the xdist controller) and inherited by its
# workers through the environment.
RUN = os.environ.setdefault("EFFECTGATE_TEST_RUN", uuid.uuid4().hex[:8])
TEST_PREFIX = f"t-{RUN}-"
# CrewAI reads these when it is first imported (by any test, or a worker process): no telemetry
# or tracing export (there is no network), and no first-run prompt on the console. Not
# OTEL_SDK_DISABLED: that turns every SDK provider into a no-op, the telemetry tests' too.
for _name, _value in (("CREWAI_DISABLE_TELEMETRY", "true"),
                      ("CREWAI_TRACING_ENABLED", "false"), ("CREWAI_TESTING", "true")):
    os.environ.setdefault(_name, _value)
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


@pytest.fixture(autouse=True)
def _no_default_event_loop_left_open() -> Iterator[None]:
    """OpenAI Agents' and pydantic-ai's ``run_sync`` run on the thread's default event loop
    and leave it open on purpose, for their next call. A later test that sets its own loop
    (pytest-asyncio's runner, ``asyncio.run``) drops it unclosed, and whichever test the
    garbage collector runs in then reports its sockets as a ResourceWarning. Each test here
    hands the thread back with no default loop. (effectgate sets none: its own loops are
    closed where they are made, ``test_bench`` holds the bench to that.)"""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:  # none is set
            return
    if not loop.is_running():
        loop.close()
        asyncio.set_event_loop(None)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        require_postgres()
    return str(request.param)


@pytest.fixture
def pg_schema(backend: str) -> Iterator[str | None]:
    """A scratch Postgres schema of its own (so breaking its store touches no other test):
    its URL; None on SQLite."""
    if backend != "postgres":
        yield None
        return
    from sqlalchemy import create_engine, text

    schema = f"eg_broken_{uuid.uuid4().hex[:10]}"
    engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with engine.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


@pytest.fixture
def own_store_url(backend: str, pg_schema: str | None, tmp_path: Path) -> str:
    """A store no other test shares: a SQLite file, or a scratch Postgres schema."""
    return pg_schema or f"sqlite:///{tmp_path / 'own.db'}"


@pytest.fixture
def store_url(backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'effects.db'}"
    return PG_URL


@pytest.fixture
def pg_admin() -> Iterator[Any]:
    """A superuser connection of its own to the suite's Postgres, in autocommit, to watch and
    kill a gate's backend with (``pg_terminate_backend``)."""
    require_postgres()
    import psycopg

    with psycopg.connect(PG_URL.replace("+psycopg", ""), autocommit=True) as conn:
        yield conn


@pytest.fixture
def namespace() -> str:
    return f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}"


def delete_namespaces(url: str, prefix: str) -> int:
    """Delete every row whose namespace starts with ``prefix`` from every ``effectgate_*``
    table of ``url``'s current schema that has a namespace column; returns the row count."""
    import psycopg

    pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    deleted = 0
    with psycopg.connect(url.replace("+psycopg", ""), connect_timeout=5,
                         autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'namespace' "
            "AND table_schema = current_schema() AND table_name LIKE 'effectgate\\_%'")]
        for table in tables:
            cur = conn.execute(f'DELETE FROM "{table}" WHERE namespace LIKE %s', (pattern,))
            deleted += cur.rowcount or 0
        # The policy each namespace last ran with (effectgate_meta rows "policy:<namespace>").
        has_meta = conn.execute("SELECT 1 FROM information_schema.tables WHERE table_name = "
                                "'effectgate_meta' AND table_schema = current_schema()").fetchone()
        if has_meta:
            cur = conn.execute("DELETE FROM effectgate_meta WHERE name LIKE %s",
                               ("policy:" + pattern,))
            deleted += cur.rowcount or 0
    return deleted


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """At the end of the whole run (the xdist controller, or the only process): delete this
    run's rows from the shared Postgres database."""
    if hasattr(session.config, "workerinput"):
        return
    try:
        delete_namespaces(PG_URL, TEST_PREFIX)
    except Exception as err:  # pragma: no cover - depends on the machine
        if IN_CI:
            raise RuntimeError(f"could not delete this run's rows from {PG_URL}: {err}") from err


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (addopts): one worker more than this process may use CPUs. A fifth of a
    two-worker run was idle CPU (``vmstat``: 19 %), the workers waiting on the processes,
    sockets and leases the tests start; a third worker fills it (a full run on 2 cores: 963 s
    with 2 workers, 768 s with 3)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cpus = os.cpu_count() or 1
    return cpus + 1


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


@pytest.fixture(scope="session")
def shared_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One ``tests/mcp_upstream.py`` process over streamable HTTP per worker, for the MCP
    tests whose subject is the gateway rather than its upstream's process (each starts an
    in-process gateway in front of it: :class:`tests.mcp_helpers.SharedUpstream`)."""
    pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')
    from .mcp_helpers import http_upstream_process

    with http_upstream_process(tmp_path_factory.mktemp("shared-upstream")) as upstream:
        yield upstream


@pytest.fixture(scope="session")
def shared_task_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One ``tests/mcp_conformance_upstream.py`` process over streamable HTTP per worker (the
    upstream whose tools run as tasks), shared like ``shared_upstream``."""
    pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')
    from .mcp_helpers import task_upstream_process

    with task_upstream_process(tmp_path_factory.mktemp("shared-task-upstream")) as upstream:
        yield upstream


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


# The longest tests start first, longest first, so that the rest of the suite runs beside them
# rather than after them: each is one unit of work on one worker, and one started last would
# lengthen the whole run by its own length (``--no-loadscope-reorder`` in addopts keeps this
# order: xdist would otherwise start every multi-test xdist_group first, by size). Wall seconds
# of each in a full run on this machine's 2 cores (pytest --durations=0) in the comments. A
# test of an xdist_group takes its whole group to the front (the "processes" group runs on one
# worker, in one unit). Sorting changes only the order: every test still runs.
_LONGEST_FIRST = (
    "test_every_notebook_runs_from_the_notebooks_extra_alone",  # 37 s; "processes" group
    "test_every_interleaving_of_the_three_worker_bound",  # 18-30 s each
    "test_inspector_cli_sees_the_gateway_as_it_sees_the_server",  # 30 s
    "test_random_sequences_match_the_reference_model",  # 4-28 s each, 4 of them
    "test_the_gateway_passes_every_fixture_of_the_suite",  # 25 s
    "test_at_2026_07_28_every_protocol_check_passes",  # 23 s through the gateway, else 8 s
    "test_the_governed_bounds_in_the_postgres_shape",  # 2-12 s each
    "test_the_gateway_passes_what_the_everything_server_passes",  # 11 s
    "test_bench_postgres_counts_round_trips",  # 10.5 s
    "test_a_call_cancelled_before_it_left_is_failed_not_ambiguous",  # 10 s each
    "test_every_interleaving_of_the_two_worker_bound",  # up to 9.5 s each (+ its group)
    "test_more_covering_schedules_on_postgres",  # 7-8 s each
    "test_init_never_overwrites_and_writes_nothing_it_cannot_check",  # 8 s
    "test_every_transition_class_of_the_two_worker_bound_replays",  # 1-6 s each, 16 of them
    "test_inspector_cli_write_file_is_gated_once_across_processes",  # 6.5 s each
    "test_verify_exhaustive_reports_states_schedules_and_violations",  # 5 s
)


def _start_rank(item: pytest.Item) -> int:
    for rank, prefix in enumerate(_LONGEST_FIRST):
        if item.name.startswith(prefix):
            return rank
    return len(_LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)  # stable: the rest keep their order
