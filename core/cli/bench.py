"""``effectgate bench``: the gate's cost beside the raw driver, as ratios measured in one run."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

__all__ = ["bench"]


@click.command()
@click.option("--url", "urls", multiple=True, metavar="URL",
              help="A store to measure (repeatable). SQLite: fresh files beside this one. "
                   "Postgres: fresh schemas in this database, dropped afterwards. Default: a "
                   "temporary SQLite file only (a database you did not name is never "
                   "written).")
@click.option("--n", "n", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Operations per contender and measure.")
@click.option("--chunks", type=click.IntRange(min=1), default=40, show_default=True,
              help="Alternating chunks per measure (the median is reported).")
@click.option("--only", "only", multiple=True,
              type=click.Choice(["core", "async", "governance", "ops", "adapters", "scale"]),
              help="Run only these sections (repeatable).")
@click.option("--scale", is_flag=True,
              help="Also run the scale section: growth, memory, racing processes.")
@click.option("--scale-rows", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Rows in the big store of the growth measure.")
@click.option("--scale-small", type=click.IntRange(min=1), default=1_000, show_default=True,
              help="Rows in the small store of the growth measure.")
@click.option("--scale-effects", type=click.IntRange(min=1), default=3_000, show_default=True,
              help="Effects timed in each store of the growth measure.")
@click.option("--memory-effects", type=click.IntRange(min=10), default=100_000,
              show_default=True, help="Effects gated by the memory process.")
@click.option("--race-keys", type=click.IntRange(min=1), default=2_000, show_default=True,
              help="Keys raced for by the processes (Postgres).")
@click.option("--procs", type=click.IntRange(min=1), default=8, show_default=True,
              help="Racing processes (Postgres).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--profile", is_flag=True,
              help="Also profile the gate's hot paths (cProfile) and print where time goes.")
def bench(urls: tuple[str, ...], n: int, chunks: int, only: tuple[str, ...], scale: bool,
          scale_rows: int, scale_small: int, scale_effects: int, memory_effects: int,
          race_keys: int, procs: int, as_json: bool, profile: bool) -> None:
    """Measure the gate beside the raw driver doing the same writes, in the same run.

    Prints, per backend, the time per executed effect (decorator path) and per duplicate
    refusal with ratios to sqlite3 / psycopg, round trips counted from the driver's trace,
    and each ratio's target (docs/benchmarks.md). Exit code 0 even when a target is missed (this
    is a measurement, not a test); 3 when a store cannot be reached.
    """
    from ..bench import SECTIONS, BenchConfig, run_bench
    from ..errors import StoreError

    sections = tuple(s for s in SECTIONS if s in only) if only else (
        ("core", "async", "governance", "ops", "adapters") + (("scale",) if scale else ())
    )
    config = BenchConfig(urls=urls, n=n, chunks=chunks, sections=sections,
                         scale_rows=scale_rows, scale_small=scale_small,
                         scale_effects=scale_effects, memory_effects=memory_effects,
                         race_keys=race_keys, procs=procs)
    err_console = _console(stderr=True)
    try:
        report = run_bench(config, progress=lambda msg: err_console.print(
            f"[dim]… {msg}[/]") if not as_json else None)
        if profile:
            from ..bench.profile import profile_hot_paths

            report.meta["profile"] = profile_hot_paths(config.urls or None)
    except StoreError as err:
        click.echo(f"effectgate: error: {err}", err=True)
        sys.exit(3)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2, default=str))
        return
    from ..bench.report import render

    render(report, _console())
    for text in report.meta.get("profile", []):
        click.echo(text)


def _console(*, stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(width=80, stderr=stderr, highlight=False, soft_wrap=False)
