"""The core paths beside the raw driver: an executed effect through the decorator (reserve →
no-op body → commit) and a duplicate refusal, answered from the store and from the memo.

Then, untimed, the same paths once more under a trace: round trips (Postgres) or statements
(SQLite) per effect and per refusal, and whether a refusal wrote anything.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..gate import Gate
from ..payload import result_json
from ..request import Lease, LeaseSecret
from ..states import Outcome
from .baseline import Cycle, KeySource, RawPostgres, RawSqlite, batch, calling, timed_calls
from .measure import Figure, Ratio, Report, interleave
from .replay import Replay
from .stores import Scratch
from .trace import PgTrace, SqliteTrace, pg_fingerprint

__all__ = ["EFFECT_TARGETS", "REFUSAL_TARGETS", "bench_core", "gated", "python_calls",
           "store_calls"]

# (backend, durability variant) -> the largest allowed ratio to the raw driver (docs/benchmarks.md)
EFFECT_TARGETS = {("sqlite", "default"): 1.3, ("sqlite", "normal"): 2.5,
                  ("postgres", "default"): 1.15}
REFUSAL_TARGETS = {"sqlite": 3.0, "postgres": 1.5}
MEMO_TARGET = 1.5
_AMOUNT = 500  # the gated function's one default argument (its store calls pass it too)
_TRACED = 50
_LABELS = {
    ("sqlite", "default"): ("effect, default sync", "raw FULL+NORMAL"),
    ("sqlite", "normal"): ("effect, relaxed", "raw NORMAL+NORMAL"),
    ("postgres", "default"): ("effect (decorator)", "raw sync+async"),
}


def gated(gate: Gate) -> Callable[[str], Any]:
    """The benchmark's gated function: a no-op body under ``"bench:{txn_id}"``."""

    @gate.effect("bench:{txn_id}", effect_type="bench.effect")
    def refund(txn_id: str, amount_cents: int = _AMOUNT) -> dict:  # type: ignore[type-arg]
        return {"ok": True}

    return refund


def store_calls(gate: Gate, fn: Callable[[str], Any]) -> Callable[[list[str]], float]:
    """The executed effect of :func:`gated` by the gate's store calls alone: the decorator's
    request (key and payload hash), the reservation, the body, its result's JSON and the
    COMMITTED report, without the layers above the store (the flow and its decision, the
    decorator, the report's checks, the memo, telemetry). Seconds for a list of keys."""
    request = fn.effect_spec.request  # type: ignore[attr-defined]
    body = fn.__wrapped__  # type: ignore[attr-defined]
    store, namespace, committed = gate.store, gate.namespace, Outcome.COMMITTED

    def run(keys: list[str]) -> float:
        start = time.perf_counter()
        for key in keys:
            secret = LeaseSecret()
            row = store.reserve(request({"txn_id": key, "amount_cents": _AMOUNT}), secret)
            if row.inserted:
                store.record_outcome(namespace, Lease(row.key, row.token, secret.raw),
                                     committed, result=result_json(body(key)), error=None,
                                     reason=None, note=None, actual_cost_micros=None,
                                     spends=False)
        return time.perf_counter() - start

    return run


def bench_core(s: Scratch, report: Report, *, n: int, chunks: int) -> None:
    """Measure the core paths on the scratch backend ``s`` and add the rows to ``report``."""
    variants = [("default", "reserve", ("FULL", "NORMAL"))]
    if s.backend == "sqlite":
        variants.append(("normal", "relaxed", ("NORMAL", "NORMAL")))
    for variant, durability, syncs in variants:
        name = f"core_{variant}"
        gate = Gate(s.url(name), namespace=s.namespace(name), durability=durability,  # type: ignore[arg-type]
                    policy=False)
        raw = s.raw(name, syncs=syncs) if s.backend == "sqlite" else s.raw(name)
        replay: Replay | None = None
        try:
            fn = gated(gate)
            gate_keys, raw_keys = KeySource(""), KeySource("bench:")
            runners = {"raw": batch(raw.execute, raw_keys), "gate": calling(fn, gate_keys)}
            if variant == "default":  # the gate's statements without its Python: the floor
                replay = Replay(gate, fn, "probe", render="bench:{}".format,
                                where=s.path(name) if s.backend == "sqlite" else s.dsn(name))
                runners["replay"] = batch(replay.execute, KeySource("replay-"))
                runners["store"] = batch(store_calls(gate, fn), KeySource("store-"))
            times = interleave(runners, total=n, chunks=chunks)
            title, base = _LABELS[(s.backend, variant)]
            report.ratios.append(Ratio("core", s.backend, title, times["gate"], times["raw"],
                                       base, EFFECT_TARGETS[(s.backend, variant)],
                                       times.spread("gate", "raw")))
            if replay is not None:
                report.ratios += [
                    Ratio("core", s.backend, "  its statements alone", times["replay"],
                          times["raw"], base, None, times.spread("replay", "raw")),
                    Ratio("core", s.backend, "  its store calls alone", times["store"],
                          times["raw"], base, None, times.spread("store", "raw")),
                    Ratio("core", s.backend, "  its Python per call", times["gate"],
                          times["replay"], "its statements alone", None,
                          times.spread("gate", "replay")),
                ]
            if variant == "default" and isinstance(raw, RawSqlite):
                report.ratios.append(_python_after_sync(s, raw, n=n, chunks=chunks))
            if variant == "default":
                _count_effect(s, report, gate, fn, raw, gate_keys, raw_keys)
                _refusals(s, report, gate, fn, raw, gate_keys.issued, raw_keys.issued,
                          n=n, chunks=chunks)
        finally:
            if replay is not None:
                replay.close()
            gate.close()
            raw.close()


def _python_after_sync(s: Scratch, raw: RawSqlite, *, n: int, chunks: int) -> Ratio:
    """The same plain Python timed right after a reserving commit that waited for the disk and
    after one that did not: what the wait alone costs the code that follows it on this
    machine, which the gate's Python after its reservation pays and raw's few lines barely
    do."""
    relaxed = s.raw("after_relaxed", syncs=("NORMAL", "NORMAL"))
    assert isinstance(relaxed, RawSqlite)
    try:
        times = interleave({"sync": batch(raw.python_after, KeySource("after:")),
                            "relaxed": batch(relaxed.python_after, KeySource("after:"))},
                           total=n, chunks=chunks)
    finally:
        relaxed.close()
    return Ratio("core", s.backend, "  Python after a synced commit", times["sync"],
                 times["relaxed"], "after a relaxed one", None, times.spread("sync", "relaxed"))


def _refusals(s: Scratch, report: Report, gate: Gate, fn: Callable[[str], Any],
              raw: RawSqlite | RawPostgres, gate_done: list[str], raw_done: list[str], *,
              n: int, chunks: int) -> None:
    """Duplicates of committed keys: from the store (no memo), from the memo, raw SELECT."""
    # A second gate without a memo sees the store as another process would.
    cold = Gate(gate.url, namespace=gate.namespace, memo_size=0, policy=False)
    replay: Replay | None = None
    try:
        cold_fn = gated(cold)
        size = min(1000, len(gate_done), len(raw_done))  # the memo holds the latest 4096
        gate_cycle, cold_cycle = Cycle(gate_done[-size:]), Cycle(gate_done[-size:])
        raw_cycle = Cycle(raw_done[-size:])
        # The refusal's own read (on SQLite a reservation's first read: what a repeat of a
        # COMMITTED effect answers with) by the bare driver: the floor under its Python.
        replay = Replay(cold, cold_fn, gate_done[0], render="bench:{}".format,
                        where=s.path("core_default") if s.backend == "sqlite" else
                        s.dsn("core_default"))
        times = interleave({
            "raw": batch(raw.refuse, raw_cycle),
            "store": calling(cold_fn, cold_cycle),
            "read": batch(replay.execute, Cycle(gate_done[-size:])),
            "memo": calling(fn, gate_cycle),
        }, total=n, chunks=chunks)
        target = REFUSAL_TARGETS[s.backend]
        base = "raw SELECT by key"
        report.ratios += [
            Ratio("core", s.backend, "duplicate, from store", times["store"], times["raw"],
                  base, target, times.spread("store", "raw")),
            Ratio("core", s.backend, "  its read alone", times["read"], times["raw"], base,
                  None, times.spread("read", "raw")),
            Ratio("core", s.backend, "  its Python per refusal", times["store"],
                  times["read"], "its read alone", None, times.spread("store", "read")),
        ]
        report.ratios.append(Ratio("core", s.backend, "duplicate, from memo",
                                   times["memo"], times["raw"], base, MEMO_TARGET,
                                   times.spread("memo", "raw")))
        _count_refusal(s, report, cold, cold_fn, gate, fn, raw, gate_done[-size:],
                       raw_done[-size:])
    finally:
        if replay is not None:
            replay.close()
        cold.close()


def _count_effect(s: Scratch, report: Report, gate: Gate, fn: Callable[[str], Any],
                  raw: RawSqlite | RawPostgres, gate_keys: KeySource,
                  raw_keys: KeySource) -> None:
    k = _TRACED
    report.figures.append(Figure("core", s.backend, "Python calls / effect",
                                 python_calls(fn, gate_keys.take(k))))
    with gate.store.connection() as conn:
        if s.backend == "postgres":
            with PgTrace(conn) as gt:
                timed_calls(fn, gate_keys.take(k))
            with PgTrace(raw.conn) as rt:
                raw.execute(raw_keys.take(k))
            report.figures += [
                Figure("core", s.backend, "round trips / effect", gt.round_trips / k,
                       target="<= 2", passed=gt.round_trips / k <= 2),
                Figure("core", s.backend, "  raw driver, effect", rt.round_trips / k),
            ]
            report.figures.append(Figure("core", s.backend, "statements / effect",
                                         len(gt.statements) / k))
        else:
            with SqliteTrace(conn) as sgt:
                timed_calls(fn, gate_keys.take(k))
            with SqliteTrace(raw.conn) as srt:
                raw.execute(raw_keys.take(k))
            report.figures += [
                Figure("core", s.backend, "statements / effect", len(sgt.statements) / k),
                Figure("core", s.backend, "  raw driver, effect", len(srt.statements) / k),
            ]
            report.notes.append(f"sqlite: an effect runs {_verbs(sgt.statements, k)}; "
                                f"raw runs {_verbs(srt.statements, k)}")


def _count_refusal(s: Scratch, report: Report, cold: Gate, cold_fn: Callable[[str], Any],
                   gate: Gate, fn: Callable[[str], Any], raw: RawSqlite | RawPostgres,
                   gate_done: list[str], raw_done: list[str]) -> None:
    k = min(_TRACED, len(gate_done))
    keys = gate_done[:k]
    report.figures.append(Figure("core", s.backend, "Python calls / refusal (store)",
                                 python_calls(cold_fn, keys)))
    if s.backend == "postgres":
        dsn = s.dsn("core_default")
        before = pg_fingerprint(dsn, cold.namespace)
        with cold.store.connection() as conn, PgTrace(conn) as ct:
            timed_calls(cold_fn, keys)
        after = pg_fingerprint(dsn, cold.namespace)
        with gate.store.connection() as conn, PgTrace(conn) as mt:
            timed_calls(fn, keys)
        with PgTrace(raw.conn) as rt:
            raw.refuse(raw_done[:k])
        wrote = before[0] != after[0]
        report.figures += [
            Figure("core", s.backend, "round trips / refusal", ct.round_trips / k,
                   target="1", passed=ct.round_trips / k <= 1),
            Figure("core", s.backend, "  from memo", mt.round_trips / k),
            Figure("core", s.backend, "  raw driver, refusal", rt.round_trips / k),
            Figure("core", s.backend, "rows written by refusals", int(wrote), target="0",
                   passed=not wrote),
            Figure("core", s.backend, "id sequence used / refusal", (after[1] - before[1]) / k),
        ]
    else:
        with cold.store.connection() as conn, SqliteTrace(conn) as sct:
            timed_calls(cold_fn, keys)
        with gate.store.connection() as conn, SqliteTrace(conn) as smt:
            timed_calls(fn, keys)
        report.figures += [
            Figure("core", s.backend, "statements / refusal", len(sct.statements) / k,
                   target="1", passed=len(sct.statements) / k <= 1),
            Figure("core", s.backend, "  from memo", len(smt.statements) / k),
            Figure("core", s.backend, "rows written by refusals", sct.changes + smt.changes,
                   target="0", passed=sct.changes + smt.changes == 0),
        ]


def python_calls(fn: Callable[[str], Any], keys: list[str]) -> float:
    """Python function calls per ``fn(key)`` (cProfile's count: the same on a busy machine,
    where microseconds are not)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    try:
        timed_calls(fn, keys)
    finally:
        profile.disable()
    calls = int(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]
    return round(calls / max(1, len(keys)), 1)


def _verbs(statements: list[str], k: int) -> str:
    counts = Counter(statements)
    parts = [f"{v / k:g} {verb}" for verb, v in sorted(counts.items())]
    return " + ".join(parts) if parts else "nothing"
