"""Governance: a ``begin`` that passes a policy (a spend ceiling and an approval rule, neither
of which refuses) beside a plain ``begin`` on the same store, in the same run."""

from __future__ import annotations

import time
from typing import Any

from ..gate import Gate
from .baseline import KeySource
from .measure import Figure, Ratio, Report, interleave
from .stores import Scratch

__all__ = ["POLICY", "TARGET", "bench_governance"]

TARGET = 1.3  # docs/benchmarks.md: a governed begin <= 1.3x a plain one, both backends
# Matches every benchmark effect; the approval threshold and the ceiling are never reached.
POLICY: dict[str, Any] = {
    "effects": {
        "bench.*": {
            "approval": {"at_or_above_micros": 10**12},
            "budget": {"per_run_micros": 10**15},
        }
    }
}


def _policy() -> Any:
    from .. import policy

    return policy.Policy.from_dict(POLICY, source="bench")


def _runner(gate: Gate, keys: KeySource, *, report: bool) -> Any:
    def run(count: int) -> float:
        batch = keys.take(count)
        start = time.perf_counter()
        for key in batch:
            d = gate.begin(effect_type="bench.effect", key=key, payload={"amount_cents": 500},
                           run_id="bench-run", estimated_cost_micros=500_000)
            if report:
                gate.report(d, "committed", result={"ok": True}, actual_cost_micros=500_000)
        return time.perf_counter() - start

    return run


def bench_governance(s: Scratch, report: Report, *, n: int, chunks: int) -> None:
    """Add the policy-vs-plain ``begin`` ratios for the backend ``s`` to ``report``."""
    try:
        policy = _policy()
    except ImportError:
        report.notes.append("governance: effectgate.policy is not available; skipped")
        return
    url = s.url("governance")
    plain = Gate(url, namespace=s.namespace("gov-plain"), policy=False)
    governed = Gate(url, namespace=s.namespace("gov-policy"), policy=policy)
    try:
        for with_report, title in ((False, "begin with policy"),
                                   (True, "begin+report, policy")):
            keys = KeySource("gov:")
            times = interleave({
                "plain": _runner(plain, keys, report=with_report),
                "policy": _runner(governed, keys, report=with_report),
            }, total=n, chunks=chunks)
            report.ratios.append(Ratio(
                "governance", s.backend, title, times["policy"], times["plain"],
                "plain begin+report" if with_report else "plain begin",
                TARGET if not with_report else None, times.spread("policy", "plain"),
            ))
        _count(s, report, plain, governed)
    finally:
        plain.close()
        governed.close()


def _count(s: Scratch, report: Report, plain: Gate, governed: Gate, k: int = 50) -> None:
    """Statements (SQLite) or round trips (Postgres) per begin+report, with and without."""
    from .trace import PgTrace, SqliteTrace

    counts = {}
    for label, gate in (("plain", plain), ("policy", governed)):
        run = _runner(gate, KeySource(f"gov-{label}:"), report=True)
        with gate.store.connection() as conn:
            trace: PgTrace | SqliteTrace = (
                PgTrace(conn) if s.backend == "postgres" else SqliteTrace(conn)
            )
            with trace:
                run(k)
        counts[label] = (trace.round_trips if isinstance(trace, PgTrace)
                         else len(trace.statements)) / k
    what = "round trips" if s.backend == "postgres" else "statements"
    report.figures += [
        Figure("governance", s.backend, f"{what} / begin+report, policy", counts["policy"]),
        Figure("governance", s.backend, "  plain", counts["plain"]),
    ]
