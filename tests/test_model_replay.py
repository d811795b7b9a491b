"""Model schedules replayed step by step on SQLite and Postgres through the real Gate, by the
sync flow (each ``begin`` on its own thread) and by the async one (each ``abegin`` a task of
one event loop, through the store's async face), every store call released by the schedule,
the database clock moved by shifting stored timestamps a tick (no sleeping). After every step
the stored rows and every answer must equal the model's, and the invariants hold on the store.

Normal suite: every transition class of every 2-worker config (what a step does and
what it answers, :mod:`effectgate.verify.cover`; every transition itself is some 1.5 million)
on both stores, by both flows, the memo off and on; on SQLite every schedule of a set that takes
every transition of the small replay bound (some two thousand), on Postgres an even sample of
150 of them, by the async flow 600 and 150. Three mutations of the async path's own source
that only the async replay can see. Slow: every third covering schedule of the replay bound
on Postgres (both flows), a random sample of the 3-worker bound on both stores and both
flows, and the kept class cover's smallest entries checked against a fresh exploration.
Counts and time are printed (``-s``)."""

from __future__ import annotations
import __future__

import contextlib
import dataclasses
import functools
import inspect
import os
import shutil
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from effectgate.verify.explore import BOUNDS, covering_schedules, mutation, sample_schedules
from effectgate.verify.replay import Replayer, ReplayReport

from . import replay_cover
from .conftest import PG_URL, TEST_PREFIX, require_postgres


@functools.cache
def _cover(one_call: bool = False) -> list[tuple[Any, ...]]:
    """Schedules taking every transition of the replay bound, in a store shape (SQLite, or
    Postgres: a governed begin's first call is its one-call move)."""
    return covering_schedules(dataclasses.replace(BOUNDS["replay"][0], one_call=one_call))


def _prefix() -> str:
    """This test's own namespace prefix (under the run's, which the suite cleans up)."""
    return f"{TEST_PREFIX}replay-{uuid.uuid4().hex[:6]}-"


@contextlib.contextmanager
def _replayer(backend: str, drive: Literal["sync", "async"] = "sync") -> Iterator[Replayer]:
    if backend == "postgres":
        require_postgres()
        with Replayer(PG_URL, prefix=_prefix(), drive=drive) as r:
            yield r
        return
    # SQLite in memory-backed storage when there is one: the decisions are the same, and the
    # synchronous reservation commits cost no disk flushes on a shared machine.
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=root) as folder, Replayer(
            f"sqlite:///{Path(folder) / 'replay.db'}", prefix=_prefix(), drive=drive) as r:
        yield r


@pytest.fixture(params=["sqlite", "postgres"])
def replayer(request: pytest.FixtureRequest) -> Iterator[Replayer]:
    """A replayer of the sync flow (each begin on its own thread) on each store; a test
    parametrized with :data:`BOTH_FLOWS` or :data:`ASYNC` gets (store, flow) pairs."""
    backend, drive = (request.param, "sync") if isinstance(request.param, str) else (
        request.param)
    with _replayer(backend, drive) as r:
        yield r


def _flows(*pairs: tuple[str, str]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("replayer", pairs, indirect=True, ids="-".join)


BOTH_FLOWS = _flows(("sqlite", "sync"), ("sqlite", "async"), ("postgres", "sync"),
                    ("postgres", "async"))
"""Each store, each flow: sync (Gate.begin on a thread) and async (Gate.abegin on a loop)."""
ASYNC = _flows(("sqlite", "async"), ("postgres", "async"))


def _show(name: str, report: ReplayReport, record_property: Any) -> None:
    print(f"\n[replay {name}] {report.schedules} schedules, {report.steps} steps, "
          f"{report.seconds:.1f}s")
    record_property(f"{name}: schedules", report.schedules)
    record_property(f"{name}: seconds", round(report.seconds, 2))


def _assert_ok(report: ReplayReport) -> None:
    problems = report.violations + report.mismatches
    assert not problems, "\n".join(problems[:10])


def test_replays_agree_with_the_model_on_both_stores(replayer: Replayer,
                                                      record_property: Any) -> None:
    """SQLite: every covering schedule of the replay bound (each of its transitions at least
    once); Postgres: an even sample of them. (The 2-worker bound: the class cover below.)"""
    backend = replayer.store.dialect_name
    every = _cover(not replayer.store.is_sqlite)
    cover = len(every) if replayer.store.is_sqlite else 150
    report = ReplayReport()
    step = max(1, len(every) // cover)
    chosen = every[::step][:cover]
    replayer.replay_all(replayer.shaped(BOUNDS["replay"][0]), chosen, report)
    _show(f"{backend}: {len(chosen)} of the {len(every)} covering schedules", report,
          record_property)
    _assert_ok(report)
    assert report.schedules == len(chosen)
    assert report.steps > report.schedules * 5


@ASYNC
def test_async_replays_agree_with_the_model_on_both_stores(replayer: Replayer,
                                                            record_property: Any) -> None:
    """The async flow (Gate.abegin as tasks of one event loop, through the store's async
    face; areport, aresolve, aapprove, adeny, aprune): an even sample of the covering
    schedules of the replay bound (the 2-worker bound, with its governed moves, approvals,
    spend, lost replies and ``async def`` reconcile hook: the class cover below)."""
    assert replayer.drive == "async"
    backend = replayer.store.dialect_name
    every = _cover(not replayer.store.is_sqlite)
    cover = ASYNC_COVER if replayer.store.is_sqlite else ASYNC_COVER_PG
    chosen = every[::max(1, len(every) // cover)][:cover]
    report = replayer.replay_all(replayer.shaped(BOUNDS["replay"][0]), chosen)
    _show(f"{backend}, async: {len(chosen)} of the {len(every)} covering schedules", report,
          record_property)
    _assert_ok(report)
    assert report.schedules == len(chosen)
    assert report.steps > report.schedules * 5


_PARTS = 2
"""The 2-worker configs are replayed in this many parts a (store, flow, memo) (so that
pytest-xdist spreads them over the cores)."""


@pytest.mark.parametrize("part", range(_PARTS), ids=lambda p: f"part {p}")
@pytest.mark.parametrize("memo", [False, True], ids=["memo off", "memo on"])
@BOTH_FLOWS
def test_every_transition_class_of_the_two_worker_bound_replays(
        replayer: Replayer, memo: bool, part: int, record_property: Any) -> None:
    """Every transition class (:func:`effectgate.verify.cover.transition_class`: what a step
    does, not where) of every 2-worker config, on each store, by each flow, with the
    COMMITTED memo off and on (the model models it when on): the kept class cover
    (tests/replay_cover.py) of each config, every field and every invariant compared at every
    step, each schedule under the replayer's timeout."""
    report = ReplayReport()
    classes = expected = 0
    configs = BOUNDS["2-worker"][part::_PARTS]
    kept = replay_cover.load()
    for config in configs:
        config = dataclasses.replace(replayer.shaped(config), memo=memo)
        classes += kept[replay_cover.entry_name(config)]["classes"]
        chosen = replay_cover.schedules(config)
        expected += len(chosen)
        replayer.replay_all(config, chosen, report)
    _show(f"{replayer.store.dialect_name}, {replayer.drive}, memo {'on' if memo else 'off'}, "
          f"part {part}: the class cover of {len(configs)} configs "
          f"({classes} classes)", report, record_property)
    _assert_ok(report)
    assert report.schedules == expected > len(configs)
    assert report.steps > report.schedules * 5


@pytest.mark.slow
@pytest.mark.parametrize("config", replay_cover.smallest(6), ids=replay_cover.entry_name)
def test_the_kept_class_cover_is_the_bound_s(config: Any) -> None:
    """tests/data/replay_cover.json is what the bound explores to now, for its six smallest
    entries (each a full search; all 80 take some ten minutes of CPU: ``python -m
    tests.replay_cover --check``). Else: write it again, ``python -m tests.replay_cover``."""
    assert replay_cover.stale([config]) == []


ASYNC_COVER = 600
"""Covering schedules the async replay takes on SQLite (evenly), in the normal suite."""
ASYNC_COVER_PG = 150
"""The same on Postgres."""


@pytest.mark.slow
@pytest.mark.parametrize("drive", ["sync", "async"])
def test_more_covering_schedules_on_postgres(drive: Literal["sync", "async"],
                                             record_property: Any) -> None:
    every = _cover(True)
    with _replayer("postgres", drive) as r:
        report = r.replay_all(r.shaped(BOUNDS["replay"][0]), every[1::3])
    _show(f"postgresql, {drive}: every third covering schedule ({len(every[1::3])})", report,
          record_property)
    _assert_ok(report)


@pytest.mark.slow
@BOTH_FLOWS
def test_a_random_sample_of_the_three_worker_bound(replayer: Replayer,
                                                    record_property: Any) -> None:
    count = 150 if replayer.store.is_sqlite else 30
    report = ReplayReport()
    for config in map(replayer.shaped, BOUNDS["3-worker"]):
        replayer.replay_all(config, sample_schedules(config, count, seed=23), report)
    _show(f"{replayer.store.dialect_name}, {replayer.drive}: 3-worker sample", report,
          record_property)
    _assert_ok(report)


@BOTH_FLOWS
def test_a_replay_notices_when_the_store_and_the_model_disagree(
        replayer: Replayer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the model's report rule not scoped to the namespace (the store's SQL keeps the
    scope), a report with another namespace's lease lands in the model and is refused by the
    store: the replay says so (the comparison can fail)."""
    from effectgate.verify import model

    config = replayer.shaped(next(c for c in BOUNDS["2-worker"]
                                  if c.name.endswith("two namespaces")))
    schedule = (("begin", 0), ("step", 0, False, None), ("borrow", 1, 0))
    real = model.report_standing
    with monkeypatch.context() as patch:
        patch.setattr(model, "report_standing", lambda row, ns, key, token, secret: real(
            row, row.namespace, key, token, secret))
        problems, _ = replayer.replay(config, schedule)
    assert problems and "report was written, the real one refused" in problems[0], problems
    assert replayer.replay(config, schedule)[0] == []  # on main they agree


def test_a_counter_the_store_wrote_without_a_ceiling_is_found_after_the_last_step(
        replayer: Replayer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config without a ceiling has its spend compared once, after its last step (not at
    every step): a counter that appeared in the store meanwhile is still a finding."""
    from effectgate.verify import replay

    config = replayer.shaped(next(c for c in BOUNDS["2-worker"]
                                  if c.name.endswith("two namespaces")))
    assert not config.budget
    schedule = (("begin", 0), ("step", 0, False, None), ("begin", 1))
    real = replay._Run.step

    def step(run: Any, action: Any) -> str | None:
        found = real(run, action)
        if action == ("begin", 0):  # a stray counter, written as the first step lands
            with run.r.store.connection() as conn:
                conn.execute("INSERT INTO effectgate_budgets (namespace, scope_key, "
                             "spent_micros, updated_at) VALUES (" +
                             ", ".join(["?" if run.r.store.is_sqlite else "%s"] * 4) + ")",
                             (run.names[config.workers[0][0]], "stray", 7, 0.0))
        return found

    with monkeypatch.context() as patch:
        patch.setattr(replay._Run, "step", step)
        problems, steps = replayer.replay(config, schedule)
    assert steps == len(schedule), problems
    assert problems and "the store's [('stray', 7)]" in problems[0], problems
    assert replayer.replay(config, schedule)[0] == []  # on main they agree


RECOVERY_BUG = (("begin", 0), ("step", 0, True, None), ("resolve", "failed", True, False),
                ("step", 0, False, None))
"""Issue 26's bug: the reservation is written, its reply lost; an operator force-resolves it
FAILED; the lost-reply recovery reads the row (same lease secret) and must not execute it."""


@BOTH_FLOWS
def test_the_recovery_bug_is_found_on_the_store_when_its_fix_is_reverted(
        replayer: Replayer) -> None:
    config = replayer.shaped(next(c for c in BOUNDS["2-worker"]
                                  if c.name.endswith("two effect types")))
    assert replayer.replay(config, RECOVERY_BUG)[0] == []
    with mutation("adopt-by-secret"):
        problems, _ = replayer.replay(config, RECOVERY_BUG)
    assert problems and "VIOLATION" in problems[0], problems


def _mutant(owner: Any, name: str, old: str, new: str) -> Any:
    """``owner.name``, a function of the product, recompiled from its own source with ``old``
    (exactly once in it) replaced by ``new``, in its module's namespace."""
    real = getattr(owner, name)
    source = textwrap.dedent(inspect.getsource(real))
    assert source.count(old) == 1, f"{name}: the product moved on (update the mutation)"
    scope = dict(vars(sys.modules[real.__module__]))
    code = compile(source.replace(old, new), inspect.getsourcefile(real) or name, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, scope)  # the product's own source, one point changed
    return scope[name]


HOOKED = (("begin", 0), ("step", 0, False, None), ("send", 0), ("land", 0, "executed"),
          ("die", 0), ("tick",), ("tick",), ("begin", 1), ("step", 1, False, None),
          ("step", 1, False, None), ("step", 1, False, "committed"), ("step", 1, False, None))
"""A holder dies after the vendor executed; the next begin asks the reconcile hook, which
answers committed: the effect is COMMITTED and the begin answers DUPLICATE."""
LATE = (("begin", 0), ("step", 0, False, None), ("tick",), ("tick",), ("begin", 1),
        ("step", 1, False, None), ("step", 1, False, None), ("report", 0, "failed", False))
"""A holder's lease lapses, the next begin marks the effect AMBIGUOUS; the holder's report
still lands (late)."""


@pytest.mark.filterwarnings("ignore:coroutine '_ahook' was never awaited:RuntimeWarning")
@pytest.mark.parametrize(("backend", "target", "old", "new", "schedule"), [
    pytest.param(
        "sqlite", "_drive._acall_hook", "return await c.fn(c.record)", "return c.fn(c.record)",
        HOOKED, id="sqlite: the async flow does not await an async def reconcile hook"),
    pytest.param(
        "postgres", "_drive._acall_hook", "return await c.fn(c.record)",
        "return c.fn(c.record)", HOOKED,
        id="postgres: the async flow does not await an async def reconcile hook"),
    pytest.param(
        "postgres", "async_pg.AsyncPostgres.record_outcome",
        "rows = await self.run(store.sql.report_late, late_binds(binds, note), "
        "writing=True)", "rows = []",
        LATE, id="postgres: the native async report never lands late"),
])
def test_the_async_replay_catches_a_mutation_of_the_async_path_that_the_sync_one_cannot(
        backend: str, target: str, old: str, new: str, schedule: tuple[Any, ...],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-point mutation of the async path's source (the driver's hook call, the
    Postgres face's report): the async replay of one schedule finds that the store or the
    answer left the model's; the sync replay of it, which never runs that code, agrees."""
    from effectgate import _drive
    from effectgate.store import async_pg

    module, *path = target.split(".")
    owner = {"_drive": _drive, "async_pg": async_pg}[module]
    for part in path[:-1]:
        owner = getattr(owner, part)
    config = dataclasses.replace(BOUNDS["replay"][0], one_call=backend == "postgres")
    with _replayer(backend, "sync") as sync, _replayer(backend, "async") as asynchronous:
        assert sync.replay(config, schedule) == ([], len(schedule))
        assert asynchronous.replay(config, schedule) == ([], len(schedule))
        monkeypatch.setattr(owner, path[-1], _mutant(owner, path[-1], old, new))
        assert sync.replay(config, schedule) == ([], len(schedule))
        problems, steps = asynchronous.replay(config, schedule)
    assert problems and "(async)" in problems[0] and steps <= len(schedule), problems
    print(f"\n[{target} mutated: the async replay stops at step {steps}] {problems[0]}")


_UNSURE = next(c for c in BOUNDS["2-worker"] if c.inferred)


@BOTH_FLOWS
def test_an_inferred_failed_keeps_the_vendor_key_on_the_store(
        replayer: Replayer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's inferred FAILED is the decorator's (``INFERRED_FAILED``) through the real
    gate: the store keeps the vendor key, and the retry's report lands on it. Told to the
    store as a plain FAILED (``keeps_vendor_key`` lost on the way), the replay says so."""
    from effectgate import reporting

    from .test_model_check import INFERRED_RETRY

    config = replayer.shaped(_UNSURE)
    assert replayer.replay(config, INFERRED_RETRY) == ([], len(INFERRED_RETRY))
    monkeypatch.setattr(reporting, "INFERRED_FAILED", reporting._Inferred("failed"))
    problems, steps = replayer.replay(config, INFERRED_RETRY)
    assert steps == 5 and "keeps_vendor_key [False], not True" in problems[0], problems


_KEEPS = {"sqlite": " AND :keeps_vendor_key = 0", "postgres": " AND NOT %(keeps_vendor_key)s"}
"""Where the report statements' texts (as each store runs them, rendered ahead) read
``keeps_vendor_key``: in the vendor attempt's CASE and the vendor key age's."""


@pytest.mark.parametrize(("backend", "drive"), [
    ("sqlite", "sync"), ("sqlite", "async"), ("postgres", "sync"), ("postgres", "async")],
    ids="-".join)
def test_report_sql_that_ignores_keeps_vendor_key_is_found_by_the_replay(
        backend: str, drive: Literal["sync", "async"],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The report statements with their ``keeps_vendor_key`` test removed (an inferred FAILED
    moves the vendor key, as every FAILED did before): the store's rows leave the model's at
    the inferred report, on each store and by each flow (Postgres's native async report
    included). The statements are the texts the stores run, patched for this test's stores
    only."""
    from effectgate.store import pg_texts, sql, sqlite_texts

    module: Any = sqlite_texts if backend == "sqlite" else pg_texts
    patched = 0
    for texts in (module.TEXTS, getattr(module, "STEADY", {})):
        for name, text in list(texts.items()):
            if name.startswith("report") and _KEEPS[backend] in text:
                monkeypatch.setitem(texts, name, text.replace(_KEEPS[backend], ""))
                patched += 1
    assert patched == (3 if backend == "sqlite" else 6)  # report, report_late, report_plain
    monkeypatch.setattr(sql, "_SHARED", {})  # this test's stores make their statements anew
    from .test_model_check import INFERRED_RETRY

    with _replayer(backend, drive) as mutant:
        problems, steps = mutant.replay(mutant.shaped(_UNSURE), INFERRED_RETRY)
    assert steps == 5 and problems and "vendor attempt" in problems[0], problems


@BOTH_FLOWS
def test_a_schedule_past_its_timeout_is_a_finding(replayer: Replayer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule still replaying after ``schedule_timeout`` stops there and is reported
    (here a timeout of nothing: the first step already ran past it), leaving nothing behind,
    on both flows."""
    from sqlalchemy import text

    monkeypatch.setattr(replayer, "schedule_timeout", 0.0)
    schedule = (("begin", 0), ("step", 0, False, None), ("begin", 1))
    problems, steps = replayer.replay(replayer.shaped(BOUNDS["replay"][0]), schedule)
    assert steps == 1 and len(problems) == 1 and "past its 0s timeout" in problems[0], problems
    assert ("(async)" in problems[0]) == (replayer.drive == "async")
    with replayer.store.engine.connect() as conn:
        left = conn.execute(text("SELECT COUNT(*) FROM effectgate_effects WHERE namespace "
                                 "LIKE :p"), {"p": f"{replayer.prefix}%"}).scalar()
    assert left == 0


@BOTH_FLOWS
def test_a_replay_leaves_nothing_behind(replayer: Replayer) -> None:
    from sqlalchemy import text

    config = replayer.shaped(BOUNDS["2-worker"][0])
    problems, steps = replayer.replay(config, sample_schedules(config, 1, seed=5)[0])
    assert problems == [] and steps > 0
    with replayer.store.engine.connect() as conn:
        left = conn.execute(text("SELECT COUNT(*) FROM effectgate_effects WHERE namespace "
                                 "LIKE :p"), {"p": f"{replayer.prefix}%"}).scalar()
    assert left == 0


def test_verify_exhaustive_reports_states_schedules_and_violations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """``effectgate verify --exhaustive`` on the user's store (here a small bound, to keep
    the test fast): states explored, schedules replayed, violations; nothing left behind;
    exit 1 once a fix is reverted."""
    import json

    from click.testing import CliRunner
    from sqlalchemy import create_engine, text

    import effectgate as eg
    from effectgate.cli import main
    from effectgate.verify import exhaustive

    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    folder = Path(tempfile.mkdtemp(dir=root))
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{folder / 'user.db'}"
    with eg.Gate(url, namespace="prod", policy=False) as user:
        d = user.begin(effect_type="refund", key="refund:1", payload={"x": 1})
        user.report(d, "committed", result={"id": "re_1"})
    small = (BOUNDS["replay"][0],)
    monkeypatch.setitem(exhaustive.BOUNDS, "2-worker", small)
    run = CliRunner().invoke(main, ["verify", "--url", url, "--only", "G1", "--exhaustive",
                                    "--json"])
    assert run.exit_code == 0, run.output
    doc = json.loads(run.output)
    ex = doc["exhaustive"]
    assert ex["passed"] and ex["violations"] == [] and ex["states"] > 1000
    assert ex["schedules_replayed"] == min(120, len(_cover())) + 30
    assert ex["bounds"][0]["name"] == small[0].name
    with create_engine(url).connect() as conn:
        rows = conn.execute(text("SELECT namespace, key, state FROM effectgate_effects")).all()
    assert rows == [("prod", "refund:1", "committed")]  # the user's data only, untouched

    text_run = CliRunner().invoke(main, ["verify", "--url", url, "--only", "G1",
                                         "--exhaustive"])
    said = " ".join(text_run.output.split())
    assert text_run.exit_code == 0 and "states explored" in said
    assert "schedules replayed on the store, 0 violations" in said

    with mutation("grace"):
        bad = CliRunner().invoke(main, ["verify", "--url", url, "--only", "G1",
                                        "--exhaustive"])
    assert bad.exit_code == 1, bad.output
    assert "RECONCILED FAILED IS TRUE" in " ".join(bad.output.split())


@BOTH_FLOWS
def test_a_lost_reply_of_a_write_that_changed_nothing_replays_as_the_model_answers(
        replayer: Replayer, record_property: Any) -> None:
    # A governed insert that finds the key taken writes nothing; the model answers it as it
    # is (no fault spent), so the replay must not lose its reply either (it did: the real
    # flow answered StoreError where the model's read the key).
    config = dataclasses.replace(
        BOUNDS["replay"][0], begins=(1, 1), faults=1, ops=1, approval=True, ticks=0,
        name="2 workers, approvals, a lost reply")
    every = covering_schedules(config)
    report = replayer.replay_all(replayer.shaped(config), every)
    _show(config.name, report, record_property)
    assert report.schedules == len(every) > 100
    assert report.ok, (report.mismatches[:3], report.violations[:3])


_DAY = dataclasses.replace(
    next(c for c in BOUNDS["2-worker"] if "per-day" in c.name), keys=(), ticks=2, ops=0,
    name="2 workers on one key under a per-day ceiling, a midnight")
_SETTLED_AFTER_MIDNIGHT = {
    False: (("begin", 0), ("step", 0, False, None), ("step", 0, False, None), ("begin", 1),
            ("tick",), ("step", 1, False, None), ("tick",), ("step", 1, False, None),
            ("step", 1, False, "failed"), ("midnight",), ("step", 1, False, None),
            ("step", 1, False, None)),
    True: (("begin", 0), ("step", 0, False, None), ("begin", 1), ("tick",),
           ("step", 1, False, None), ("tick",), ("step", 1, False, None),
           ("step", 1, False, "failed"), ("midnight",), ("step", 1, False, None),
           ("step", 1, False, None)),
}
"""Worker 0 executes on day 0 and its lease lapses; worker 1's begin reads the row for the
reconcile hook (failed), the date changes, the begin settles the row (the release lands on
day 0's counter) and executes on day 1's (by store shape: one call or not)."""


def test_a_midnight_replays_on_both_stores(replayer: Replayer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's date cannot be moved: the replay moves every stored date a day back, and
    hands a flow that read a row before the midnight the counters' names now (the rename
    is the replay's, not the store's). Without that, the release misses its counter."""
    config = replayer.shaped(_DAY)
    schedule = _SETTLED_AFTER_MIDNIGHT[config.one_call]
    assert replayer.replay(config, schedule) == ([], len(schedule))
    monkeypatch.setattr(replayer, "_redated", lambda row: row)
    problems, _ = replayer.replay(config, schedule)
    assert problems and "spend" in problems[0], problems


def test_a_lost_repeat_repeated_again_replays_on_both_stores(replayer: Replayer) -> None:
    from .test_model_check import _REPEATS, LOST_REPEATS

    config = replayer.shaped(_REPEATS)
    for schedule in LOST_REPEATS:
        assert replayer.replay(config, schedule) == ([], len(schedule))
