"""``effectgate bench --profile``: where an executed effect and a refusal spend their time.

cProfile over the decorator path on each store, reported as microseconds per operation for
the functions with the most time of their own (``tottime``) and the most time inside them
(``cumtime``). cProfile slows Python code more than C code, so read the shares, not the sums.
"""

from __future__ import annotations

import cProfile
import pstats

from ..gate import Gate
from .baseline import Cycle, KeySource, timed_calls
from .core_paths import gated
from .stores import Scratch, new_run_id

__all__ = ["profile_hot_paths"]


def _top(prof: cProfile.Profile, ops: int, key: str, limit: int) -> list[str]:
    stats = pstats.Stats(prof)
    rows: list[tuple[float, float, int, str]] = []
    for (path, line, func), (_cc, calls, tottime, cumtime, _callers) in (
        stats.stats.items()  # type: ignore[attr-defined]
    ):
        where = "/".join(path.split("/")[-2:])  # core/store.py, psycopg/cursor.py
        rows.append((float(tottime), float(cumtime), int(calls), f"{where}:{line} {func}"))
    rows.sort(key=lambda r: -(r[0] if key == "tottime" else r[1]))
    out = [f"  {'own µs':>8} {'cum µs':>8} {'calls':>6}  function (per operation)"]
    for tottime, cumtime, calls, name in rows[:limit]:
        out.append(f"  {tottime / ops * 1e6:8.1f} {cumtime / ops * 1e6:8.1f} "
                   f"{calls / ops:6.1f}  {name[-70:]}")
    return out


def profile_hot_paths(urls: tuple[str, ...] | list[str] | None = None, *, ops: int = 2000,
                      limit: int = 25) -> list[str]:
    """Profile ``ops`` executed effects and ``ops`` refusals (from the store) per store;
    return the report as lines of text."""
    import tempfile

    targets = list(urls or [f"sqlite:///{tempfile.gettempdir()}/effectgate-bench/x.db"])
    lines: list[str] = []
    for url in targets:
        with Scratch(url, new_run_id()) as s:
            gate = Gate(s.url("profile"), namespace=s.namespace("profile"), policy=False)
            cold = Gate(gate.url, namespace=gate.namespace, memo_size=0, policy=False)
            try:
                fn, cold_fn = gated(gate), gated(cold)
                keys = KeySource("")
                timed_calls(fn, keys.take(50))  # warm up
                timed_calls(cold_fn, keys.issued[:50])
                effect = cProfile.Profile()
                effect.enable()
                timed_calls(fn, keys.take(ops))
                effect.disable()
                refusal = cProfile.Profile()
                repeats = Cycle(keys.issued[-ops:])
                refusal.enable()
                timed_calls(cold_fn, repeats.take(ops))
                refusal.disable()
            finally:
                gate.close()
                cold.close()
            for title, prof in (("executed effect", effect), ("refusal from store", refusal)):
                for key in ("tottime", "cumtime"):
                    lines.append(f"profile {s.backend}: {title}, by {key}")
                    lines += _top(prof, ops, key, limit)
    return lines

