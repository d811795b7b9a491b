"""The async paths: an ``async def`` tool gated by the decorator beside the same sync tool, on
the same store, in alternating chunks; and how long the gate ever keeps the event loop from
running other work (a ticker task records the longest gap between its wake-ups while gated
calls run).

Targets (docs/benchmarks.md): an ``async def`` tool <= 1.2x its sync path on Postgres (psycopg's
own async connection, no thread hop), <= 1.5x on SQLite (reads on the loop, writes on a worker
thread); the loop never blocked by the gate for more than 2 ms. On SQLite a third contender,
the sync tool between two thread hops that do nothing, is that path's floor on the machine.
The loop's longest block is measured for the common tool and for tools whose result, or
whose arguments, are large (about 600 KB of JSON).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ..gate import Gate
from .baseline import KeySource, calling
from .core_paths import gated
from .measure import Figure, Ratio, Report, interleave
from .stores import Scratch

__all__ = ["ASYNC_TARGETS", "bench_async"]

ASYNC_TARGETS = {"sqlite": 1.5, "postgres": 1.2}
_BLOCK_TARGET_MS = 2.0


def agated(gate: Gate) -> Callable[[str], Any]:
    """The benchmark's gated ``async def`` tool, the async twin of :func:`gated`."""

    @gate.effect("bench:{txn_id}", effect_type="bench.effect")
    async def refund(txn_id: str, amount_cents: int = 500) -> dict:  # type: ignore[type-arg]
        return {"ok": True}

    return refund


def bench_async(s: Scratch, report: Report, *, n: int, chunks: int) -> None:
    """Measure the async paths on ``s`` and add the rows to ``report``."""
    name = "async"
    gate = Gate(s.url(name), namespace=s.namespace(name), policy=False)
    loop = asyncio.new_event_loop()
    try:
        sync_fn, async_fn = gated(gate), agated(gate)
        sync_keys, async_keys = KeySource("s"), KeySource("a")

        def run_async(count: int) -> float:
            keys = async_keys.take(count)

            async def calls() -> float:
                start = time.perf_counter()
                for key in keys:
                    await async_fn(key)
                return time.perf_counter() - start

            return loop.run_until_complete(calls())

        runners = {"sync": calling(sync_fn, sync_keys), "async": run_async}
        if s.backend == "sqlite":
            runners["hops"] = _with_empty_hops(loop, sync_fn, KeySource("h"))
        times = interleave(runners, total=n, chunks=chunks)
        report.ratios.append(Ratio("async", s.backend, "async def tool, executed",
                                   times["async"], times["sync"], "the same sync tool",
                                   ASYNC_TARGETS[s.backend], times.spread("async", "sync")))
        if s.backend == "sqlite":
            report.ratios.append(Ratio("async", s.backend, "  the sync tool + 2 empty hops",
                                       times["hops"], times["sync"], "the same sync tool",
                                       None, times.spread("hops", "sync")))
        keys = async_keys.take(min(n, 500))
        busy, seconds = loop.run_until_complete(_longest_block(async_fn, keys))
        idle, _ = loop.run_until_complete(_longest_block(None, [], seconds))
        report.figures += _block_figures(s.backend, "gated calls", busy, idle)
        for label, tool in _large_tools(gate):
            count = max(2, min(20, n // 100))  # each call makes ~600 KB of JSON
            keys = KeySource("large").take(count)
            busy, seconds = loop.run_until_complete(_longest_block(tool, keys))
            idle, _ = loop.run_until_complete(_longest_block(None, [], seconds))
            cpu = loop.run_until_complete(_longest_cpu_block(tool, KeySource("large").take(
                count)))
            report.figures += _block_figures(s.backend, label, busy, idle, target=False)
            report.figures.append(Figure(
                "async", s.backend, "  the loop's longest CPU between ticks", round(cpu, 2),
                "ms", target=f"<= {_BLOCK_TARGET_MS:g}", passed=cpu <= _BLOCK_TARGET_MS))
    finally:
        loop.close()
        gate.close()


_LARGE_ROWS = 10_000  # about 600 KB of JSON: tens of milliseconds to make at once


def _large_tools(gate: Gate) -> list[tuple[str, Callable[[str], Any]]]:
    """Gated ``async def`` tools whose result, or whose arguments, are large (a list of
    records, as a search or a query answers), each with its label."""
    rows = [{"id": i, "name": f"record {i}", "tags": ["a", "b"], "ok": True}
            for i in range(_LARGE_ROWS)]

    @gate.effect("bench-result:{txn_id}", effect_type="bench.large_result")
    async def large_result(txn_id: str) -> list[dict]:  # type: ignore[type-arg]
        return rows

    @gate.effect("bench-args:{txn_id}", effect_type="bench.large_args")
    async def large_args(txn_id: str, records: list[dict] = rows) -> bool:  # type: ignore[type-arg]
        return True

    return [("a large result", large_result), ("large arguments", large_args)]


def _block_figures(backend: str, label: str, busy: float, idle: float, *,
                   target: bool = True) -> list[Figure]:
    """The longest loop block while ``label`` ran (``busy``), while the loop idled as long
    (``idle``), and the gate's share of it (against the target, when ``target``; else named
    apart, for information: the target is then on the loop's CPU)."""
    worst = max(0.0, busy - idle)  # a loaded machine delays an idle loop too
    return [
        Figure("async", backend, f"longest loop block, {label}", round(busy, 2), "ms"),
        Figure("async", backend, "  the same time, idle loop", round(idle, 2), "ms"),
        Figure("async", backend, "  the gate's share", round(worst, 2), "ms",
               target=f"<= {_BLOCK_TARGET_MS:g}", passed=worst <= _BLOCK_TARGET_MS)
        if target else Figure("async", backend, "  the gate's share, wall clock",
                              round(worst, 2), "ms"),
    ]


def _with_empty_hops(loop: asyncio.AbstractEventLoop, sync_fn: Callable[[str], Any],
                     keys: KeySource) -> Callable[[int], float]:
    """The sync tool called on the loop between two thread hops that do nothing: on SQLite
    the async path's floor on this machine (its reservation and its report are writes, each
    on a worker thread; what a hop costs is the wake-ups of a thread and of the loop)."""

    def run(count: int) -> float:
        batch = keys.take(count)

        async def calls() -> float:
            start = time.perf_counter()
            for key in batch:
                await asyncio.to_thread(int)
                sync_fn(key)
                await asyncio.to_thread(int)
            return time.perf_counter() - start

        return loop.run_until_complete(calls())

    return run


async def _longest_block(fn: Callable[[str], Any] | None, keys: list[str],
                         seconds: float = 0.0) -> tuple[float, float]:
    """Milliseconds of the longest gap a 0.5 ms ticker saw, beyond the tick itself, while
    ``fn`` ran over ``keys`` (or, with no ``fn``, while the loop idled ``seconds``); and the
    seconds it watched."""
    worst = 0.0
    running = True
    started = time.perf_counter()

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0.0005)
            now = time.perf_counter()
            worst = max(worst, (now - last - 0.0005) * 1000)
            last = now

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.01)
    if fn is None:
        await asyncio.sleep(seconds)
    for key in keys:
        await fn(key)  # type: ignore[misc]
    running = False
    await task
    return worst, time.perf_counter() - started


async def _longest_cpu_block(fn: Callable[[str], Any], keys: list[str]) -> float:
    """Milliseconds of CPU the loop's thread spent, at the most, between two turns of a
    ticker while ``fn`` ran over ``keys``: the longest the loop was held by work, counted in
    the thread's own CPU time, which a loaded machine's preemption does not inflate (a wait
    for the GIL is not counted)."""
    worst = 0.0
    running = True

    async def ticker() -> None:
        nonlocal worst
        last = time.thread_time()
        while running:
            await asyncio.sleep(0)
            now = time.thread_time()
            worst = max(worst, (now - last) * 1000)
            last = now

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    for key in keys:
        await fn(key)
    running = False
    await task
    return worst
