"""``--scale``: does the gate stay cheap as the store grows, as a process runs long, and as
processes race?

* growth: per-effect time in a store holding ``scale_rows`` committed effects beside one
  holding ``scale_small`` (two scratch stores, timed in alternating chunks). Rows are
  bulk-loaded with one ``INSERT … SELECT`` generated in the database (committed effects with a
  result, random-looking keys), so the big store's index is as deep as a busy store's.
* memory: a fresh process gates ``memory_effects`` effects and reports its RSS along the way.
* race: ``procs`` processes gate the same keys, one winner per key counted by the bodies
  themselves, beside the same processes doing the same writes raw (``INSERT … ON CONFLICT DO
  NOTHING``, and the winner's ``UPDATE``) at the same durability.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from ..errors import EffectInFlight
from ..gate import Gate
from .baseline import KeySource, calling, connect_postgres, connect_raw
from .core_paths import gated
from .measure import Figure, Ratio, Report, interleave
from .stores import Scratch

if TYPE_CHECKING:
    from . import BenchConfig

__all__ = ["bench_scale"]

GROWTH_TARGET = 1.3
MEMORY_GROWTH_TARGET = 0.05  # RSS from 10% of the effects to all of them, as a fraction
RACE_TARGET = 1.3  # DESIGN: wall per attempt <= 1.3x raw, exactly one winner per key


def bench_scale(s: Scratch, report: Report, config: BenchConfig) -> None:
    """Growth, memory and the multi-process race, added to ``report``."""
    _growth(s, report, config)
    _memory(s, report, config)
    _race(s, report, config)


# -- growth --------------------------------------------------------------------------------

_LOAD_COLUMNS = ("namespace, key, effect_type, payload_hash, state, attempt, token, "
                 "created_at, updated_at, result")


def _bulk_load(s: Scratch, name: str, namespace: str, rows: int) -> None:
    now = time.time()
    if s.backend == "sqlite":
        import sqlite3

        conn = sqlite3.connect(s.path(name), isolation_level=None, timeout=60.0)
        try:
            conn.execute(
                "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?) "
                f"INSERT INTO effectgate_effects ({_LOAD_COLUMNS}) "
                "SELECT ?, printf('load:%08x', (i * 2654435761) % 4294967296), 'bench.load', "
                "?, 'committed', 1, 1, ?, ?, '{\"ok\":true}' FROM c",
                (rows, namespace, "0" * 64, now, now),
            )
            conn.execute("ANALYZE")
        finally:
            conn.close()
        return
    with connect_postgres(s.dsn(name)) as pg:
        pg.execute(
            f"INSERT INTO effectgate_effects ({_LOAD_COLUMNS}) "
            "SELECT %s, 'load:' || lpad(to_hex((i * 2654435761) %% 4294967296), 8, '0'), "
            "'bench.load', %s, 'committed', 1, 1, %s, %s, '{\"ok\":true}' "
            "FROM generate_series(1::bigint, %s) AS i",
            (namespace, "0" * 64, now, now, rows),
        )
        pg.execute("VACUUM ANALYZE effectgate_effects")


def _growth(s: Scratch, report: Report, config: BenchConfig) -> None:
    # Relaxed durability on SQLite: an fsync per effect would hide the cost of a deeper index.
    durability = "relaxed" if s.backend == "sqlite" else "reserve"
    sizes = {"small": config.scale_small, "big": config.scale_rows}
    gates: dict[str, Gate] = {}
    try:
        for label, rows in sizes.items():
            name = f"grow_{label}"
            gates[label] = Gate(s.url(name), namespace=s.namespace(name),
                                durability=durability, policy=False)  # type: ignore[arg-type]
            start = time.perf_counter()
            _bulk_load(s, name, s.namespace(name), rows)
            if label == "big":
                report.figures.append(Figure("scale", s.backend, f"bulk load of {rows:,} rows",
                                             time.perf_counter() - start, "s"))
        fns = {label: gated(gate) for label, gate in gates.items()}
        sources = {label: KeySource("") for label in gates}
        times = interleave({label: calling(fns[label], sources[label]) for label in gates},
                           total=config.scale_effects, chunks=10)
        how = ", relaxed" if durability == "relaxed" else ""
        report.ratios.append(Ratio(
            "scale", s.backend, f"effect at {config.scale_rows:,} rows{how}", times["big"],
            times["small"], f"at {config.scale_small:,} rows", GROWTH_TARGET,
        ))
    finally:
        for gate in gates.values():
            gate.close()


# -- memory --------------------------------------------------------------------------------

def _rss_kib() -> int:
    """Current resident set size in KiB (Linux), else the peak."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        return _peak_kib()


def _peak_kib() -> int:
    """Peak resident set size in KiB of this process image.

    Linux: ``VmHWM``, which starts afresh at ``exec`` (``ru_maxrss`` does not: a spawned
    child would report its parent's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # macOS counts bytes


def _memory_worker(url: str, namespace: str, total: int, marks: list[int], queue: Any) -> None:
    """Gate ``total`` effects; at each mark put (effects, peak KiB, current KiB) on ``queue``."""
    durability = "relaxed" if url.startswith("sqlite") else "reserve"
    gate = Gate(url, namespace=namespace, durability=durability, policy=False)  # type: ignore[arg-type]
    fn = gated(gate)
    prefix = os.urandom(4).hex()
    try:
        for i in range(1, total + 1):
            fn(f"{prefix}{i:x}")
            if i in marks:
                queue.put((i, _peak_kib(), _rss_kib()))
    finally:
        gate.close()
        queue.put(None)


def _memory(s: Scratch, report: Report, config: BenchConfig) -> None:
    total = config.memory_effects
    marks = sorted({max(1, total // 100), max(1, total // 10), total})
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_memory_worker,
                       args=(s.url("memory"), s.namespace("memory"), total, marks, queue))
    proc.start()
    seen: list[tuple[int, int, int]] = []
    while (item := queue.get()) is not None:
        seen.append(item)
    proc.join()
    if proc.exitcode != 0 or len(seen) != len(marks):
        report.notes.append(f"{s.backend}: the memory worker failed (exit {proc.exitcode})")
        return
    for effects, peak, current in seen:
        report.figures.append(Figure("scale", s.backend, f"peak RSS after {effects:,} effects",
                                     round(peak / 1024, 1), "MiB"))
        report.figures.append(Figure("scale", s.backend, "  current RSS",
                                     round(current / 1024, 1), "MiB"))
    # Flat: neither the peak nor the live set grows from a tenth of the effects to all.
    growth = max((seen[-1][i] - seen[-2][i]) / seen[-2][i] for i in (1, 2) if seen[-2][i])
    report.figures.append(Figure(
        "scale", s.backend, f"RSS growth {marks[-2]:,} → {marks[-1]:,}",
        round(growth * 100, 2), "%", f"<= {MEMORY_GROWTH_TARGET * 100:g}%",
        growth <= MEMORY_GROWTH_TARGET,
    ))


# -- the race ------------------------------------------------------------------------------

def _race_worker(index: int, procs: int, url: str, raw_at: tuple[str, str],
                 rounds: list[tuple[str, str]], keys: list[str], barrier: Any,
                 queue: Any) -> None:
    """One of ``procs`` racers: for each round, wait for all, then try every key once."""
    offset = index * len(keys) // procs
    order = keys[offset:] + keys[:offset]
    for kind, namespace in rounds:
        start, end, executed, in_flight, cpu = _race_round(kind, namespace, url, raw_at,
                                                           order, barrier)
        queue.put((kind, namespace, start, end, executed, in_flight, cpu))


def _race_round(kind: str, namespace: str, url: str, raw_at: tuple[str, str],
                order: list[str], barrier: Any) -> tuple[float, float, list[str], int, float]:
    """One round: (start, end, keys this process executed, in-flight refusals, CPU seconds
    from the start to the end)."""
    executed: list[str] = []
    in_flight = 0
    if kind == "raw":
        raw = connect_raw(*raw_at, namespace, table="race_raw")
        barrier.wait()
        start, cpu = time.perf_counter(), time.process_time()
        _, executed = raw.race(order)
        end, cpu = time.perf_counter(), time.process_time() - cpu
        raw.close()
        return start, end, executed, in_flight, cpu
    gate = Gate(url, namespace=namespace, policy=False)

    @gate.effect("{key}", effect_type="bench.race")
    def body(key: str) -> dict:  # type: ignore[type-arg]
        executed.append(key)
        return {"ok": True}

    body(f"warm-up:{os.getpid()}")  # connect before the start, as the raw driver has
    barrier.wait()
    start, cpu = time.perf_counter(), time.process_time()
    for key in order:
        try:
            body(key)
        except EffectInFlight:
            in_flight += 1
    end, cpu = time.perf_counter(), time.process_time() - cpu
    gate.close()
    executed.remove(f"warm-up:{os.getpid()}")
    return start, end, executed, in_flight, cpu


def _race(s: Scratch, report: Report, config: BenchConfig) -> None:
    procs, count = config.procs, config.race_keys
    url = s.url("race")
    raw_at = (s.backend, s.path("race") if s.backend == "sqlite" else s.dsn("race"))
    Gate(url, namespace=s.namespace("race"), policy=False).close()  # the schema first
    connect_raw(*raw_at, "-", table="race_raw").close()
    keys = [f"race:{i:06d}:{os.urandom(4).hex()}" for i in range(count)]
    kinds = ["raw", "gate", "gate", "raw", "raw", "gate"]
    rounds = [(kind, f"{s.namespace('race')}-{i}") for i, kind in enumerate(kinds)]
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_race_worker,
                           args=(i, procs, url, raw_at, rounds, keys, barrier, queue))
               for i in range(procs)]
    for w in workers:
        w.start()
    results = [queue.get() for _ in range(procs * len(rounds))]
    for w in workers:
        w.join()
    per_attempt: dict[str, list[float]] = {"raw": [], "gate": []}
    cpu: dict[str, list[float]] = {"raw": [], "gate": []}
    twice = missing = in_flight = 0
    for kind, namespace in rounds:
        mine = [r for r in results if r[1] == namespace]
        wall = max(r[3] for r in mine) - min(r[2] for r in mine)
        per_attempt[kind].append(wall / (procs * count) * 1e6)
        cpu[kind].append(sum(r[6] for r in mine) / (procs * count) * 1e6)
        if kind == "gate":  # the gate's bodies count executions; raw wins are the baseline's
            executed = [key for r in mine for key in r[4]]
            twice += len(executed) - len(set(executed))
            missing += count - len(set(executed))
            in_flight += sum(r[5] for r in mine)
    gate_us = statistics.median(per_attempt["gate"])
    raw_us = statistics.median(per_attempt["raw"])
    report.ratios.append(Ratio("scale", s.backend, f"race, {procs} procs", gate_us,
                               raw_us, "INSERT ON CONFLICT + UPDATE", RACE_TARGET))
    report.figures += [
        Figure("scale", s.backend, "race throughput, gate", round(1e6 / gate_us), "/s"),
        Figure("scale", s.backend, "  raw driver", round(1e6 / raw_us), "/s"),
        Figure("scale", s.backend, "  gate / raw", round(raw_us / gate_us, 2), "x",
               f">= {1 / RACE_TARGET:g}x", raw_us / gate_us >= 1 / RACE_TARGET),
        Figure("scale", s.backend, "client CPU / attempt, gate",
               round(statistics.median(cpu["gate"]), 1), "µs"),
        Figure("scale", s.backend, "  raw driver", round(statistics.median(cpu["raw"]), 1), "µs"),
        Figure("scale", s.backend, "keys executed twice (gate)", twice, "", "0", twice == 0),
        Figure("scale", s.backend, "keys never executed (gate)", missing, "", "0",
               missing == 0),
        Figure("scale", s.backend, "in-flight refusals (gate)", in_flight),
    ]
