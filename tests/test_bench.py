"""``effectgate bench`` runs end to end with tiny counts and reports positive ratios.

A smoke test of the benchmark program, not a timed assertion: it checks that every measure
produces its row, that ratios and counts are sane, and that the scratch stores are removed.
Each run has scratch stores of its own (a run id of its own, each test its own URL), so the
tests run on any worker, side by side.
"""

from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from effectgate.cli import main

from .conftest import PG_URL, require_postgres


def _bench(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["bench", "--json", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def _ratios(report: dict[str, Any], backend: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in report["ratios"] if r["backend"] == backend}


def _figures(report: dict[str, Any], backend: str) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in report["figures"] if f["backend"] == backend}


def _assert_core(report: dict[str, Any], backend: str) -> None:
    ratios = _ratios(report, backend)
    wanted = {"duplicate, from store", "duplicate, from memo"}
    wanted |= {"effect, default sync", "effect, relaxed"} if backend == "sqlite" else {
        "effect (decorator)"}
    assert wanted <= set(ratios)
    for row in ratios.values():
        assert row["gate_us"] > 0 and row["base_us"] > 0
        assert row["ratio"] > 0
        assert row["passed"] in ((None,) if row["target"] is None else (True, False))
    # The executed effect split in two: the gate's statements replayed by the bare driver,
    # and the gate beside them (its Python).
    effect = ratios["effect, default sync" if backend == "sqlite" else "effect (decorator)"]
    alone, python = ratios["  its statements alone"], ratios["  its Python per call"]
    assert alone["base_us"] == effect["base_us"] and python["gate_us"] == effect["gate_us"]
    assert python["base_us"] == alone["gate_us"]
    # Between them: the gate's request and store calls alone, none of the layers above.
    calls = ratios["  its store calls alone"]
    assert calls["base_us"] == effect["base_us"] and calls["gate_us"] > 0
    # So is the refusal from the store: its read by the bare driver, and the gate beside it.
    refusal = ratios["duplicate, from store"]
    read, refusing = ratios["  its read alone"], ratios["  its Python per refusal"]
    assert read["base_us"] == refusal["base_us"] and refusing["gate_us"] == refusal["gate_us"]
    assert refusing["base_us"] == read["gate_us"]
    figures = _figures(report, backend)
    assert figures["rows written by refusals"]["value"] == 0
    # Python calls counted, not timed: a refusal from the store makes fewer than an effect.
    assert 0 < figures["Python calls / refusal (store)"]["value"] < figures[
        "Python calls / effect"]["value"]
    # Start-up, in fresh processes (medians of separate starts: on a loaded machine the import
    # alone can read slower than the way to a first begin, so the two are not compared).
    assert figures["import effectgate, ms"]["value"] > 0
    assert figures["  to a worker's first begin, ms"]["value"] > 0
    assert figures["import effectgate, ms"]["passed"] in (True, False)
    assert figures["  to a worker's first begin, ms"]["passed"] in (True, False)
    assert figures["  ... compiling effectgate's source, ms"]["value"] > 0
    # After the imports, inside a fresh process: Gate() and the first begin make Python calls
    # (a count: the same on a busy machine); a second store on it reuses the statements.
    assert figures["  Gate() + first begin, Python calls"]["value"] > 1000
    assert figures["  Gate() + first begin, CPU ms (profiled)"]["value"] > 0
    assert figures["  a second Gate() on that store, CPU ms"]["value"] >= 0


def _sqlite_core(folder: Path) -> tuple[dict[str, Any], str]:
    """One core bench on SQLite through the CLI, printing its tables: the report, as
    ``--json`` would print it (the object ``run_bench`` returned to the CLI), and what the CLI
    printed (one run: seconds of fresh processes and timing loops). The other bench tests go
    through ``--json`` itself."""
    import effectgate.bench

    reports: list[Any] = []
    real = effectgate.bench.run_bench

    def kept(*args: Any, **kwargs: Any) -> Any:
        reports.append(real(*args, **kwargs))
        return reports[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(effectgate.bench, "run_bench", kept)
        result = CliRunner().invoke(main, ["bench", "--url", f"sqlite:///{folder / 'x.db'}",
                                           "--n", "30", "--chunks", "3", "--only", "core"])
    assert result.exit_code == 0, result.output
    [report] = reports
    return json.loads(json.dumps(report.as_dict(), indent=2, default=str)), result.output


def test_bench_sqlite_reports_every_core_ratio_prints_its_tables_and_leaves_no_files(
        tmp_path: Path) -> None:
    report, output = _sqlite_core(tmp_path)
    assert "Core paths — sqlite" in output  # the tables, with their targets
    assert "raw SELECT" in output
    assert "1.5x" in output
    _assert_core(report, "sqlite")
    after = _ratios(report, "sqlite")["  Python after a synced commit"]
    assert after["gate_us"] > 0 and after["base_us"] > 0 and after["target"] is None
    figures = _figures(report, "sqlite")
    assert figures["statements / refusal"]["value"] == 1  # one SELECT
    assert figures["  from memo"]["value"] == 0
    assert figures["statements / effect"]["value"] >= figures["  raw driver, effect"]["value"]
    assert list(tmp_path.iterdir()) == []  # the scratch files are gone


def test_bench_postgres_counts_round_trips_and_drops_its_schemas() -> None:
    require_postgres()
    report = _bench("--url", PG_URL, "--n", "30", "--chunks", "3", "--only", "core")
    _assert_core(report, "postgres")
    figures = _figures(report, "postgres")
    assert figures["round trips / effect"]["value"] == figures["  raw driver, effect"]["value"]
    assert figures["round trips / refusal"]["value"] == 1
    import psycopg

    with psycopg.connect(PG_URL.replace("+psycopg", "")) as conn:
        left = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE %s",
            (f"eg_bench_{report['meta']['run']}_%",),
        ).fetchone()
    assert left == (0,)


def test_bench_scale_with_tiny_counts_finds_one_winner_per_key(tmp_path: Path) -> None:
    urls = ["--url", f"sqlite:///{tmp_path / 'x.db'}"]
    from .conftest import _postgres_available

    if _postgres_available() is None:
        urls += ["--url", PG_URL]
    report = _bench(*urls, "--only", "scale", "--scale-rows", "3000", "--scale-small", "100",
                    "--scale-effects", "40", "--memory-effects", "200", "--race-keys", "40",
                    "--procs", "2")
    for backend in {r["backend"] for r in report["ratios"]}:
        ratios = _ratios(report, backend)
        growth = ratios["effect at 3,000 rows" + (", relaxed" if backend == "sqlite" else "")]
        assert growth["ratio"] > 0
        figures = _figures(report, backend)
        assert figures["peak RSS after 200 effects"]["value"] > 0
    for backend in {r["backend"] for r in report["ratios"]}:  # the race, on both backends
        figures = _figures(report, backend)
        assert figures["keys executed twice (gate)"]["value"] == 0
        assert figures["keys never executed (gate)"]["value"] == 0
        assert _ratios(report, backend)["race, 2 procs"]["ratio"] > 0


def test_bench_governance_and_adapters_report_a_row_or_say_why_not(tmp_path: Path) -> None:
    gc.collect()  # what earlier tests on this worker left is warned about before, not here
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        report = _bench("--url", f"sqlite:///{tmp_path / 'x.db'}", "--n", "10", "--chunks",
                        "2", "--only", "governance", "--only", "adapters")
        gc.collect()
    # the async frameworks' calls ran on one event loop of the bench's own, closed after them
    assert not [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    ratios = _ratios(report, "sqlite")
    assert ratios["begin with policy"]["ratio"] > 0
    assert ratios["begin with policy"]["base"] == "plain begin"
    figures = _figures(report, "sqlite")
    assert figures["statements / begin+report, policy"]["value"] >= 1
    for framework in ("langchain", "openai-agents", "llama-index"):
        row = ratios.get(f"{framework} gate_tool")
        said = [n for n in report["notes"] if framework.replace("-", "_") in n
                or framework in n]
        assert (row is not None and row["ratio"] > 0) or said, framework


def test_bench_async_reports_the_async_tool_its_hop_floor_and_the_loop_block(
        tmp_path: Path) -> None:
    report = _bench("--url", f"sqlite:///{tmp_path / 'x.db'}", "--n", "10", "--chunks", "2",
                    "--only", "async")
    ratios = _ratios(report, "sqlite")
    row = ratios["async def tool, executed"]
    assert row["ratio"] > 0 and row["base"] == "the same sync tool" and row["target"] == 1.5
    floor = ratios["  the sync tool + 2 empty hops"]
    assert floor["ratio"] > 0 and floor["base"] == "the same sync tool"
    assert floor["target"] is None
    figures = _figures(report, "sqlite")
    assert figures["  the gate's share"]["target"] == "<= 2"
    assert list(tmp_path.iterdir()) == []


def test_bench_ops_reports_the_webhooks_and_telemetry_row(tmp_path: Path) -> None:
    report = _bench("--url", f"sqlite:///{tmp_path / 'x.db'}", "--n", "10", "--chunks", "2",
                    "--only", "ops")
    ratios = _ratios(report, "sqlite")
    row = ratios["begin, webhooks + telemetry"]
    assert row["ratio"] > 0 and row["base"] == "plain begin" and row["target"] == 1.1
    assert ratios["begin+report, webhooks + telemetry"]["ratio"] > 0
    assert list(tmp_path.iterdir()) == []
