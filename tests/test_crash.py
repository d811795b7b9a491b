"""Crashes, on SQLite and Postgres: holders killed with SIGKILL or paused past their lease.

Executions are counted by the side effect (a line appended to a file by the body), not by the
store. The crash harness (G12) runs its trials in a few long-lived worker processes that fork
one child per trial; ``$EFFECTGATE_CRASH_TRIALS`` sets the trials per kill point per backend
(default 50, the issue's bar), for the async caller too (it costs about as much as the sync
one, so it runs the full bar).

Every test runs for a sync caller and an async one (``caller``): the holders' calls, the
harness's children and retries, and the test's own calls go through the gate's async twins
(an ``async def`` under ``@gate.effect``, ``abegin``/``areport``/``aextend_lease``).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import effectgate as eg

from .conftest import snapshot
from .workers import TIMEOUT, executions, spawn, stop
from .workers.callers import CALLERS, Caller, making

pytestmark = pytest.mark.slow

LEASE = 0.5  # short: these tests need leases to lapse
HARNESS_LEASE = 2.0  # waited out once per harness worker, so it can afford to be generous
TRIALS_PER_POINT = int(os.environ.get("EFFECTGATE_CRASH_TRIALS", "50"))
HARNESS_WORKERS = 2
POINTS = ("before_reserve", "after_reserve", "mid_body", "after_body", "during_report")


@pytest.fixture(params=CALLERS)
def caller(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def drive(caller: str) -> Iterator[Callable[[eg.Gate], Caller]]:
    """Makes a :class:`Caller` of this test's kind for a gate (closed after the test)."""
    with making(caller) as make:
        yield make


def _wait_for_state(gate: eg.Gate, key: str, state: eg.State) -> eg.EffectRecord:
    deadline = time.monotonic() + 30
    while True:
        record = gate.get(key)
        if record.state is state or time.monotonic() > deadline:
            return record
        assert record.state is eg.State.IN_FLIGHT, record
        time.sleep(0.05)


def _refund_spec(c: Caller, effects_file: Path, calls: list[str]) -> Any:
    @c.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        calls.append(txn_id)
        with effects_file.open("a") as f:
            f.write(f"refund:{txn_id} test {os.getpid()}\n")
        return {"refund_id": "re_retry"}

    return refund


def _kill_mid_body(store_url: str, namespace: str, effects_file: Path, txn_id: str,
                   caller: str) -> dict[str, Any]:
    """Start a holder, wait until its body has performed the side effect, SIGKILL it."""
    proc = spawn("holder.py", store_url, namespace, str(effects_file), txn_id, str(LEASE), "hang",
                 caller)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "holder died"
        held: dict[str, Any] = json.loads(line)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    finally:
        stop([proc])
    return held


def test_sigkilled_body_is_ambiguous_after_lease_and_resolve_committed_answers_retry(
    gate: eg.Gate, store_url: str, namespace: str, tmp_path: Path, caller: str,
    drive: Callable[[eg.Gate], Caller]
) -> None:
    """A body killed with SIGKILL mid-call: after the lease its effect reads AMBIGUOUS, a retry
    is refused without running, and once an operator resolves it committed a retry returns
    the stored result. The body ran exactly once (counted by its side effect)."""
    effects_file = tmp_path / "effects.log"
    held = _kill_mid_body(store_url, namespace, effects_file, "txn_1", caller)
    assert held["attempt"] == 1
    record = _wait_for_state(gate, "refund:txn_1", eg.State.AMBIGUOUS)
    assert record.state is eg.State.AMBIGUOUS and record.reason == "lease lapsed"

    calls: list[str] = []
    c = drive(gate)
    refund = _refund_spec(c, effects_file, calls)
    with pytest.raises(eg.EffectAmbiguous) as refused:
        refund("txn_1", 500)
    assert refused.value.decision == "blocked" and refused.value.key == "refund:txn_1"
    with pytest.raises(eg.EffectAmbiguous):
        refund("txn_1", 500)

    c.resolve("refund:txn_1", "committed", by="ops", result={"refund_id": "re_seen"},
              note="seen in the vendor's dashboard")
    assert refund("txn_1", 500) == {"refund_id": "re_seen"}
    assert calls == []
    assert executions(effects_file) == {"refund:txn_1": 1}
    history = [(h.from_state, h.to_state, h.by) for h in gate.get("refund:txn_1").history]
    assert history == [
        (None, eg.State.IN_FLIGHT, None),
        (eg.State.IN_FLIGHT, eg.State.AMBIGUOUS, "lease"),
        (eg.State.AMBIGUOUS, eg.State.COMMITTED, "ops"),
    ]


def test_stale_token_of_killed_holder_refused_after_resolve(
    gate: eg.Gate, store_url: str, namespace: str, tmp_path: Path, caller: str,
    drive: Callable[[eg.Gate], Caller]
) -> None:
    """The token of a holder killed mid-call is stale once an operator resolves the effect:
    a late report or heartbeat with it raises StaleLease and writes nothing."""
    held = _kill_mid_body(store_url, namespace, tmp_path / "effects.log", "txn_2", caller)
    _wait_for_state(gate, "refund:txn_2", eg.State.AMBIGUOUS)
    c = drive(gate)
    c.resolve("refund:txn_2", "committed", by="ops", result={"refund_id": "re_ops"})
    before = snapshot(gate)
    lease = eg.Lease("refund:txn_2", held["token"], held["secret"])
    for call in (
        lambda: c.report(lease, "committed", result={"refund_id": "re_late"}),
        lambda: c.report(lease, "ambiguous"),
        lambda: c.extend_lease(lease, 30),
    ):
        with pytest.raises(eg.StaleLease) as err:
            call()
        assert err.value.key == "refund:txn_2" and err.value.state == "committed"
    assert snapshot(gate) == before
    assert gate.get("refund:txn_2").result == {"refund_id": "re_ops"}


def test_zombie_holder_past_its_lease_cannot_report_over_newer_attempt(
    gate: eg.Gate, store_url: str, namespace: str, tmp_path: Path, caller: str,
    drive: Callable[[eg.Gate], Caller]
) -> None:
    """G6 with a real zombie: a holder paused (SIGSTOP) past its lease, an operator's verdict
    and a new attempt later wakes up; its heartbeat and its report are refused and the newer
    attempt's record is untouched."""
    effects_file = tmp_path / "effects.log"
    proc = spawn("holder.py", store_url, namespace, str(effects_file), "txn_3", str(LEASE),
                 "zombie", caller)
    c = drive(gate)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "holder died"
        zombie = json.loads(line)
        assert zombie["decision"] == "execute"
        os.kill(proc.pid, signal.SIGSTOP)  # a pause far longer than its lease

        _wait_for_state(gate, "refund:txn_3", eg.State.AMBIGUOUS)
        payload = {"txn_id": "txn_3", "amount_cents": 500}
        blocked = c.begin(effect_type="payment.refund", key="refund:txn_3", payload=payload)
        assert blocked.decision is eg.Decision.BLOCKED
        c.resolve("refund:txn_3", "failed", by="ops", note="the vendor has no such refund")
        fresh = c.begin(effect_type="payment.refund", key="refund:txn_3", payload=payload,
                        lease_seconds=60)
        assert fresh.decision is eg.Decision.EXECUTE and fresh.attempt == 2
        assert fresh.lease_token > zombie["token"]
        before = snapshot(gate)

        os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.write("wake up\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err[-3000:]
    finally:
        stop([proc])
    answers = json.loads(out.strip().splitlines()[-1])
    for name in ("extend_lease", "report"):
        assert answers[name]["error"] == "StaleLease", answers
        assert answers[name]["state"] == "in_flight" and "stale" in answers[name]["reason"]
    assert snapshot(gate) == before  # the newer attempt's record is untouched
    c.report(fresh, "committed", result={"refund_id": "re_2"})
    record = gate.get("refund:txn_3")
    assert record.state is eg.State.COMMITTED and record.attempt == 2
    assert record.result == {"refund_id": "re_2"}


# -- the crash harness (G12) -----------------------------------------------------------------

# How many times each point's call may have happened (the retry included).
EXPECTED_SIDE_EFFECTS = {"before_reserve": {1}, "after_reserve": {0}, "mid_body": {0, 1},
                         "after_body": {1}, "during_report": {1}}
IN_FLIGHT_THEN = [None, "in_flight"]


def _run_harness(store_url: str, namespace: str, effects_file: Path,
                 caller: str) -> list[dict[str, Any]]:
    share = [TRIALS_PER_POINT // HARNESS_WORKERS] * HARNESS_WORKERS
    for i in range(TRIALS_PER_POINT % HARNESS_WORKERS):
        share[i] += 1
    procs = [spawn("crash_harness.py", store_url, namespace, str(effects_file), str(w),
                   str(n), str(HARNESS_LEASE), str(1000 + w), caller)
             for w, n in enumerate(share) if n]
    trials: list[dict[str, Any]] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 0, err[-3000:]
            lines = [json.loads(line) for line in out.strip().splitlines()]
            assert lines[-1].get("summary"), lines[-1]
            trials.extend(line for line in lines if not line.get("summary"))
    finally:
        stop(procs)
    return trials


def _check_trial(trial: dict[str, Any], side_effects: int) -> None:
    point, after_kill = trial["point"], trial["state_after_kill"]
    assert trial["killed"] and trial["error"] is None, trial
    assert side_effects in EXPECTED_SIDE_EFFECTS[point], trial
    if point == "before_reserve":  # nothing was written: absent, and the retry runs it
        assert after_kill == "absent" and trial["retry"] == "executed", trial
        assert trial["final_state"] == "committed", trial
        assert trial["history"] == [IN_FLIGHT_THEN, ["in_flight", "committed"]], trial
        return
    if point == "during_report" and after_kill == "committed":  # the report's write landed
        assert trial["retry"] == "duplicate", trial
        assert trial["retry_result"] == {"refund_id": f"re_{trial['txn_id']}", "by": "child"}
        assert trial["history"] == [IN_FLIGHT_THEN, ["in_flight", "committed"]], trial
        return
    # Every other kill: AMBIGUOUS once the lease lapsed, and a blind retry is refused.
    assert not trial["report_returned"], trial
    assert after_kill == "ambiguous" and trial["retry"] == "blocked", trial
    assert trial["final_state"] == "ambiguous", trial
    assert trial["history"] == [IN_FLIGHT_THEN, ["in_flight", "ambiguous"]], trial


def test_g12_worker_killed_at_any_point_never_executes_twice(
    gate: eg.Gate, store_url: str, namespace: str, tmp_path: Path, caller: str
) -> None:
    """G12: workers SIGKILLed before reserve, after reserve, mid-body, after the body and during
    report (TRIALS_PER_POINT each): zero double executions (counted by the side effect), zero
    lost records, and every killed effect in the state the design predicts — absent,
    AMBIGUOUS after its lease, or COMMITTED — with a retry that never runs it twice. For an
    async caller the children await abegin/areport and the retries run EffectSpec.arun."""
    effects_file = tmp_path / "effects.log"
    trials = _run_harness(store_url, namespace, effects_file, caller)
    assert {t["caller"] for t in trials} == {caller}
    counts = executions(effects_file)
    per_point = collections.Counter(t["point"] for t in trials)
    assert per_point == dict.fromkeys(POINTS, TRIALS_PER_POINT)
    assert max(counts.values(), default=0) <= 1, "a key executed twice"
    for trial in trials:
        _check_trial(trial, counts.get(trial["key"], 0))
    # Zero lost records: every trial's key is in the store, and nothing else is.
    with gate.store.engine.connect() as conn:
        keys = {row[0] for row in conn.execute(
            text("SELECT key FROM effectgate_effects WHERE namespace = :ns"),
            {"ns": namespace})}
    assert keys == {t["key"] for t in trials}
    landed = collections.Counter(
        ("returned" if t["report_returned"] else "killed in report", t["state_after_kill"])
        for t in trials if t["point"] == "during_report"
    )
    print(f"during_report outcomes ({gate.store.dialect_name}, {caller}): {dict(landed)}")
