"""Start-up, in fresh processes: ``import effectgate``, and a worker's way to its first
``begin`` (import, open the store, one gated call), each beside a bare interpreter's start,
taking turns, medians.

Then, inside fresh processes, the part after the imports (``Gate()`` and the first gated
call): its CPU time and the Python function calls it makes (a count, so it reads the same on a
busy machine), and the CPU time of a second ``Gate()`` on the same store in that process.

A worker process pays this once; a CLI call or a short-lived job pays it every time.

The processes read effectgate's bytecode from a cache made by a first run, as an installed
package's is (pip compiles it at install), even where ``PYTHONDONTWRITEBYTECODE`` is set;
one more figure shows the first begin of a process that compiles effectgate's source (an
editable install with bytecode writing off).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from .measure import Figure, Report
from .stores import Scratch

__all__ = ["FIRST_BEGIN_TARGET_MS", "IMPORT_TARGET_MS", "bench_startup"]

IMPORT_TARGET_MS = 150.0
FIRST_BEGIN_TARGET_MS = 150.0
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


_AFTER_IMPORTS = (
    "import cProfile, json, pstats, sys, time\n"
    "import effectgate as eg, effectgate.gate\n"
    "profile = cProfile.Profile()\n"
    "cpu = time.process_time()\n"
    "profile.enable()\n"
    "gate = eg.Gate(sys.argv[1], namespace=sys.argv[2], policy=False)\n"
    "@gate.effect('start:{n}', effect_type='bench.start')\n"
    "def start(n: int) -> int:\n"
    "    return n\n"
    "start(1)\n"
    "profile.disable()\n"
    "first = time.process_time() - cpu\n"
    "cpu = time.process_time()\n"
    "eg.Gate(sys.argv[1], namespace=sys.argv[2] + '-2', policy=False).close()\n"
    "second = time.process_time() - cpu\n"
    "print(json.dumps([first * 1000, pstats.Stats(profile).total_calls, second * 1000]))\n"
)


def _env(cache: str, *, write: bool = True) -> dict[str, str]:
    """The children's environment: bytecode read from (and written to) ``cache``; not
    ``write``: none written (an empty ``cache``: effectgate's source compiled at every
    start)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONPYCACHEPREFIX"] = cache
    return env


def _after_imports(url: str, namespace: str, env: dict[str, str]) -> tuple[float, int, float]:
    """(CPU ms of Gate() + first begin under the profiler, its Python calls, CPU ms of a
    second Gate() on the same store), measured inside one fresh process."""
    out = subprocess.run([sys.executable, "-c", _AFTER_IMPORTS, url, namespace], check=True,
                         capture_output=True, text=True, env=env).stdout
    first, calls, second = json.loads(out.strip().splitlines()[-1])
    return float(first), int(calls), float(second)


def _wall_ms(code: str, *args: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    return (time.perf_counter() - start) * 1000


def bench_startup(s: Scratch, report: Report) -> None:
    """Add the start-up figures for the scratch backend ``s`` to ``report``."""
    url = s.url("startup")
    with tempfile.TemporaryDirectory(prefix="eg-pycache-") as cache:
        empty = os.path.join(cache, "empty")  # bytecode never written there
        _measure(s, report, url, _env(os.path.join(cache, "kept")), _env(empty, write=False))


def _measure(s: Scratch, report: Report, url: str, env: dict[str, str],
             compiling: dict[str, str]) -> None:
    _wall_ms(_FIRST_BEGIN, url, s.namespace("startup-warm"), env=env)  # fills the cache
    bare: list[float] = []
    imported: list[float] = []
    first: list[float] = []
    uncached: list[float] = []
    for run in range(_RUNS):  # taking turns: a busy moment hits all four alike
        bare.append(_wall_ms(_BARE, env=env))
        imported.append(_wall_ms(_IMPORT, env=env))
        first.append(_wall_ms(_FIRST_BEGIN, url, s.namespace(f"startup{run}"), env=env))
        uncached.append(_wall_ms(_FIRST_BEGIN, url, s.namespace(f"startup-c{run}"),
                                 env=compiling))
    inside = [_after_imports(url, s.namespace(f"startup-in{run}"), env) for run in range(3)]
    base = statistics.median(bare)
    took = statistics.median(imported) - base
    to_first = statistics.median(first) - base
    report.figures += [
        Figure("core", s.backend, "import effectgate, ms", round(took, 1),
               target=f"<= {IMPORT_TARGET_MS:g}", passed=took <= IMPORT_TARGET_MS),
        Figure("core", s.backend, "  to a worker's first begin, ms", round(to_first, 1),
               target=f"<= {FIRST_BEGIN_TARGET_MS:g}", passed=to_first <= FIRST_BEGIN_TARGET_MS),
        Figure("core", s.backend, "  ... compiling effectgate's source, ms",
               round(statistics.median(uncached) - base, 1)),
        Figure("core", s.backend, "  a bare interpreter's start, ms", round(base, 1)),
        Figure("core", s.backend, "  Gate() + first begin, CPU ms (profiled)",
               round(statistics.median(i[0] for i in inside), 1)),
        Figure("core", s.backend, "  Gate() + first begin, Python calls",
               statistics.median(i[1] for i in inside)),
        Figure("core", s.backend, "  a second Gate() on that store, CPU ms",
               round(statistics.median(i[2] for i in inside), 1)),
    ]
