"""What a benchmark measures and how: interleaved chunks, medians, and the rows it reports.

A *runner* performs ``count`` operations and returns the seconds they took (it prepares its
own inputs before starting the clock). :func:`interleave` runs several runners in turns, in
chunks, rotating which goes first, and keeps the median per-operation time of each: a noisy
loopback or a neighbour's burst then hits every contender alike and is voted out.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Figure", "Ratio", "Report", "Runner", "Timings", "interleave"]

Runner = Callable[[int], float]


class Timings(dict[str, float]):
    """Median microseconds per operation, by runner; ``samples`` keeps every chunk's."""

    samples: dict[str, list[float]]

    def spread(self, gate: str, base: str) -> tuple[float, float]:
        """The 25th and 75th percentiles of the chunk-by-chunk ratio ``gate / base`` (each
        chunk of one ran right beside a chunk of the other)."""
        pairs = [g / b for g, b in zip(self.samples[gate], self.samples[base], strict=True)
                 if b > 0]
        if len(pairs) < 2:
            return (pairs[0], pairs[0]) if pairs else (0.0, 0.0)
        quartiles = statistics.quantiles(pairs, n=4)
        return quartiles[0], quartiles[2]


def interleave(runners: Mapping[str, Runner], *, total: int, chunks: int,
               warmup: int = 20) -> Timings:
    """Median microseconds per operation for each runner, run in alternating chunks.

    Each runner first runs ``warmup`` untimed operations (prepared statements, caches), then
    ``chunks`` chunks of ``total // chunks`` operations, taking turns with the others."""
    names = list(runners)
    chunks = max(1, min(chunks, total))
    per = max(1, total // chunks)
    for name in names:
        if warmup:
            runners[name](warmup)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(chunks):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(runners[name](per) / per * 1e6)
    out = Timings({name: statistics.median(values) for name, values in samples.items()})
    out.samples = samples
    return out


@dataclass
class Ratio:
    """The gate's time per operation beside a baseline's, measured in the same run."""

    section: str
    backend: str
    name: str
    gate_us: float
    base_us: float
    base: str
    target: float | None = None
    spread: tuple[float, float] | None = None
    """The interquartile range of the chunk-by-chunk ratios (the run's noise, shown)."""

    @property
    def ratio(self) -> float:
        """``gate_us / base_us``."""
        return self.gate_us / self.base_us if self.base_us > 0 else float("inf")

    @property
    def passed(self) -> bool | None:
        """Whether the ratio meets its target (None when there is no target)."""
        return None if self.target is None else self.ratio <= self.target

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with ``ratio`` and ``passed``."""
        return {**asdict(self), "ratio": round(self.ratio, 3), "passed": self.passed}


@dataclass
class Figure:
    """A counted or measured figure (round trips, rows written, memory) and its target."""

    section: str
    backend: str
    name: str
    value: float
    unit: str = ""
    target: str = ""
    passed: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass
class Report:
    """Everything one ``effectgate bench`` run measured."""

    ratios: list[Ratio] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "meta": self.meta,
            "ratios": [r.as_dict() for r in self.ratios],
            "figures": [f.as_dict() for f in self.figures],
            "notes": list(self.notes),
        }

    @property
    def missed(self) -> list[str]:
        """Names of the rows that missed their target."""
        out = [f"{r.backend}: {r.name.strip()}" for r in self.ratios if r.passed is False]
        return out + [f"{f.backend}: {f.name.strip()}" for f in self.figures if f.passed is False]
