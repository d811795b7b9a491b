"""Start-up, in fresh processes: ``import effectgate``, and a worker's way to its first
``begin`` (import, open the store, one gated call), each beside a bare interpreter's start,
taking turns, medians.

A worker process pays this once; a CLI call or a short-lived job pays it every time.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from .measure import Figure, Report
from .stores import Scratch

__all__ = ["IMPORT_TARGET_MS", "bench_startup"]

IMPORT_TARGET_MS = 150.0
_RUNS = 7
_BARE = "pass"
_IMPORT = "import effectgate"
_FIRST_BEGIN = (
    "import sys, effectgate as eg\n"
    "gate = eg.Gate(sys.argv[1], namespace=sys.argv[2], policy=False)\n"
    "@gate.effect('start:{n}', effect_type='bench.start')\n"
    "def start(n: int) -> int:\n"
    "    return n\n"
    "start(1)\n"
)


def _wall_ms(code: str, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True,
                   stdout=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def bench_startup(s: Scratch, report: Report) -> None:
    """Add the start-up figures for the scratch backend ``s`` to ``report``."""
    url = s.url("startup")
    bare: list[float] = []
    imported: list[float] = []
    first: list[float] = []
    for run in range(_RUNS):  # taking turns: a busy moment hits all three alike
        bare.append(_wall_ms(_BARE))
        imported.append(_wall_ms(_IMPORT))
        first.append(_wall_ms(_FIRST_BEGIN, url, s.namespace(f"startup{run}")))
    base = statistics.median(bare)
    took = statistics.median(imported) - base
    report.figures += [
        Figure("core", s.backend, "import effectgate, ms", round(took, 1),
               target=f"<= {IMPORT_TARGET_MS:g}", passed=took <= IMPORT_TARGET_MS),
        Figure("core", s.backend, "  to a worker's first begin, ms",
               round(statistics.median(first) - base, 1)),
        Figure("core", s.backend, "  a bare interpreter's start, ms", round(base, 1)),
    ]
