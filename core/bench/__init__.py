"""``effectgate bench``: the gate's per-operation cost beside the raw driver, in one run.

Every figure is a ratio against a baseline measured in the same run, on the same machine, in
alternating chunks (medians), on scratch stores that are removed afterwards:

* ``core``: an executed effect through the decorator and a duplicate refusal (from the store
  and from the memo), beside ``sqlite3`` / ``psycopg`` doing the same writes with the same
  durability; round trips and statements counted from the driver's own trace.
* ``governance``: a ``begin`` that passes a policy (ceiling + approval rule) beside a plain one.
* ``ops``: a ``begin`` with webhooks and OpenTelemetry on beside a plain one.
* ``adapters``: a gated framework tool beside the core decorator on the same function.
* ``scale``: growth to a million rows, memory over 100,000 effects, 8 racing processes.

Run it with ``effectgate bench``; use :func:`run_bench` from Python.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .measure import Figure, Ratio, Report
from .stores import Scratch, new_run_id

__all__ = ["SECTIONS", "BenchConfig", "Figure", "Ratio", "Report", "run_bench"]

log = logging.getLogger("effectgate")
SECTIONS = ("core", "async", "governance", "ops", "adapters", "scale")


@dataclass
class BenchConfig:
    """What to measure, where, and how much.

    ``urls``: stores to benchmark (SQLite: fresh files beside the named one; Postgres: fresh
    schemas in the named database). Empty: a fresh SQLite file in the temp folder only."""

    urls: tuple[str, ...] = ()
    n: int = 2000
    chunks: int = 40
    sections: tuple[str, ...] = ("core", "async", "governance", "ops", "adapters")
    scale_rows: int = 1_000_000
    scale_small: int = 1_000
    scale_effects: int = 3_000
    memory_effects: int = 100_000
    race_keys: int = 2_000
    procs: int = 8


def _targets(config: BenchConfig, report: Report) -> list[str]:
    """The stores to measure: the ones named, else a throw-away SQLite file only — a
    database the user did not name is never written (Postgres needs ``--url``)."""
    if config.urls:
        return list(config.urls)
    import tempfile

    report.notes.append("postgres not measured: name a database with --url "
                        "postgresql+psycopg://... (fresh schemas, dropped afterwards)")
    return [f"sqlite:///{Path(tempfile.gettempdir()) / 'effectgate-bench' / 'effects.db'}"]


def run_bench(config: BenchConfig, progress: Callable[[str], None] | None = None) -> Report:
    """Run the benchmark sections of ``config``; return every ratio and figure measured."""
    from .. import __version__

    say = progress or (lambda _: None)
    report = Report(meta={
        "version": __version__, "python": platform.python_version(), "n": config.n,
        "chunks": config.chunks, "sections": list(config.sections), "stores": [],
    })
    run = new_run_id()
    report.meta["run"] = run
    for url in _targets(config, report):
        with Scratch(url, run) as scratch:
            report.meta["stores"].append(scratch.describe())
            _fs_note(scratch, report)
            for section in config.sections:
                say(f"{scratch.backend}: {section}")
                _SECTION_RUNNERS[section](scratch, report, config)
    return report


def _core(s: Scratch, report: Report, config: BenchConfig) -> None:
    from .core_paths import bench_core
    from .startup import bench_startup

    bench_core(s, report, n=config.n, chunks=config.chunks)
    bench_startup(s, report)


def _async(s: Scratch, report: Report, config: BenchConfig) -> None:
    from .async_paths import bench_async

    bench_async(s, report, n=config.n, chunks=config.chunks)


def _governance(s: Scratch, report: Report, config: BenchConfig) -> None:
    from .governance import bench_governance

    bench_governance(s, report, n=config.n, chunks=config.chunks)


def _ops(s: Scratch, report: Report, config: BenchConfig) -> None:
    from .ops import bench_ops

    bench_ops(s, report, n=config.n, chunks=config.chunks)


def _adapters(s: Scratch, report: Report, config: BenchConfig) -> None:
    from .adapters import bench_adapters

    bench_adapters(s, report, n=config.n, chunks=config.chunks)


def _scale(s: Scratch, report: Report, config: BenchConfig) -> None:
    from .scale import bench_scale

    bench_scale(s, report, config)


_SECTION_RUNNERS: dict[str, Callable[[Scratch, Report, BenchConfig], None]] = {
    "core": _core, "async": _async, "governance": _governance, "ops": _ops, "adapters": _adapters,
    "scale": _scale,
}


def _fs_note(s: Scratch, report: Report) -> None:
    """Warn when the SQLite files sit on a RAM disk (an fsync there costs nothing)."""
    if s.folder is None:
        return
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return
    best, kind = "", ""
    for line in mounts:
        parts = line.split()
        if len(parts) > 2 and str(s.folder).startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    if kind in ("tmpfs", "ramfs"):
        report.notes.append(f"sqlite files are on {kind} ({best}): fsync is free there; "
                            "pass --url sqlite:///<a path on disk> to measure a disk")
