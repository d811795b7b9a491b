"""Red team, round 6: sagas and unwinding, webhooks, the sweeper, operators' acts — on both
backends where a store is involved.

Each test states the attack and what must hold."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import effectgate as eg
from effectgate.notices import AMBIGUOUS, Notice
from effectgate.sagas import compensation_request, unwind, unwind_plan
from effectgate.webhooks import Webhooks

from .test_webhooks import Receiver

GROUP = "trip:r6"


def _booked(gate: eg.Gate, step: str) -> eg.BeginDecision:
    return gate.begin(effect_type=f"booking.{step}", key=f"{step}:r6", payload={},
                      group_key=GROUP, compensation={"cancel": step})


def _cancelling(gate: eg.Gate) -> list[str]:
    """Register a compensator for the bookings; the list of what it cancelled."""
    undone: list[str] = []

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> dict[str, Any]:
        undone.append(compensation["cancel"])
        return {"cancelled": compensation["cancel"]}

    return undone


# -- an undo that ran before its step committed --------------------------------------------------

def _as_before_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Begin undos as effectgate did before ``begin`` refused an undo of an uncommitted step
    (:func:`effectgate.flow._undoable`): a store may hold such early undos, written then."""
    monkeypatch.setattr("effectgate.flow._undoable", lambda req, step, at_old_key: None)


@pytest.mark.parametrize("call", ["begin", "abegin"])
def test_an_undo_of_a_step_not_committed_is_refused_and_writes_nothing(
        make_gate: Any, call: str) -> None:
    """The root of the early undo: ``begin`` of an undo (``compensates_effect_id``) whose step
    is in flight, failed or unknown, or names no step, is refused before anything is
    written; once the step committed, the same undo executes."""
    import asyncio

    from .conftest import snapshot

    gate: eg.Gate = make_gate()

    def begin(**fields: Any) -> eg.BeginDecision:
        if call == "begin":
            return gate.begin(**fields)
        return asyncio.run(gate.abegin(**fields))

    step = _booked(gate, "boat")
    undo = compensation_request(gate.get("boat:r6"))
    before = snapshot(gate)
    with pytest.raises(eg.InvalidTransition, match="in_flight, not committed"):
        begin(**undo)
    with pytest.raises(eg.InvalidTransition, match="in_flight, not committed"):
        gate.preview(**undo)  # what begin would answer
    with pytest.raises(eg.UnknownEffect, match="not in this namespace"):
        begin(**{**undo, "compensates_effect_id": 10**9})
    assert snapshot(gate) == before
    gate.report(step, "failed", error="no boat")
    with pytest.raises(eg.InvalidTransition, match="failed, not committed"):
        begin(**compensation_request(gate.get("boat:r6")))
    again = _booked(gate, "boat")
    gate.report(again, "committed", result={"booked": "boat"})
    assert begin(**compensation_request(gate.get("boat:r6"))).decision is eg.Decision.EXECUTE


def test_an_undo_committed_while_its_step_was_in_flight_is_not_counted(
        make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent (or a buggy script) begins the undo of a step while the step is still in
    flight — a cancel that found nothing to cancel — and records it committed; then the step
    commits (the booking is made). The undo never undid that booking: unwind must not call
    the step "compensated earlier" and the report must not be complete."""
    gate: eg.Gate = make_gate()
    undone = _cancelling(gate)

    step = _booked(gate, "hotel")
    assert step.decision is eg.Decision.EXECUTE
    _as_before_the_check(monkeypatch)
    early = gate.begin(**compensation_request(gate.get("hotel:r6")), agent_id="rogue")
    assert early.decision is eg.Decision.EXECUTE
    gate.report(early, "committed", result={"cancelled": "nothing yet"})
    time.sleep(0.01)
    gate.report(step, "committed", result={"booked": "hotel"})  # the booking stands

    report = gate.unwind(GROUP, by="ops")
    assert not report.complete, report.as_dict()
    assert report.compensated == []
    assert [s.key for s in report.failed] == ["hotel:r6"]
    assert "before the step committed" in report.failed[0].detail
    assert undone == []  # nothing can run it again at that key: a person must check
    assert unwind_plan(gate, GROUP)[0] == []  # nothing planned for it either
    confirmed = unwind(gate, GROUP, "ops", confirmed=[])
    assert [s.key for s in confirmed.failed] == ["hotel:r6"] and not confirmed.complete



def test_an_early_undo_is_neither_compensated_over_mcp_nor_on_the_console(
        make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same early undo where no compensator is registered: the MCP server's unwind (it
    hands such steps to the agent) and the console's saga page read the undo at the step's
    undo key themselves, and must not call the step compensated either."""
    from effectgate.console.app import Console
    from effectgate.console.sagas import steps_of
    from effectgate.integrations.mcp.server import unwind_answer

    gate: eg.Gate = make_gate()
    step = _booked(gate, "car")
    _as_before_the_check(monkeypatch)
    early = gate.begin(**compensation_request(gate.get("car:r6")), agent_id="rogue")
    gate.report(early, "committed", result={"cancelled": "nothing yet"})
    time.sleep(0.01)
    gate.report(step, "committed", result={"booked": "car"})

    answer = unwind_answer(gate, GROUP, "agent")
    assert answer["compensated"] == [] and not answer["complete"], answer
    assert [s["key"] for s in answer["failed"]] == ["car:r6"], answer
    assert "before the step committed" in answer["failed"][0]["detail"]
    (shown,) = steps_of(Console(gate, secure_cookies=False), GROUP)
    assert not shown.undone and "before the step committed" in shown.note, shown

def test_an_undo_that_failed_early_and_ran_after_the_commit_counts(
        make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side: an undo begun too early that FAILED, run again by unwind once the step
    committed, is a real undo: compensated, complete (no false alarm)."""
    gate: eg.Gate = make_gate()
    undone = _cancelling(gate)

    step = _booked(gate, "car")
    _as_before_the_check(monkeypatch)
    early = gate.begin(**compensation_request(gate.get("car:r6")), agent_id="rogue")
    gate.report(early, "failed", error="nothing to cancel yet")
    time.sleep(0.01)
    gate.report(step, "committed", result={"booked": "car"})
    report = gate.unwind(GROUP, by="ops")
    assert report.complete and undone == ["car"]
    assert [s.key for s in report.compensated_now] == ["car:r6"]
    again = gate.unwind(GROUP, by="ops")
    assert again.complete and [s.key for s in again.compensated_earlier] == ["car:r6"]
    assert undone == ["car"]


# -- webhooks: a hostile receiver ---------------------------------------------------------------

SECRET = "whsec_" + "r" * 32


@pytest.mark.parametrize("after", ["\u00b2", "\u00b9\u00b3", "\u0663"])
def test_a_retry_after_of_unicode_digits_neither_loses_nor_uncounts_a_delivery(
        after: str) -> None:
    """A receiver answers 503 with ``Retry-After: ²`` (a latin-1 superscript: ``isdigit``
    says yes, ``float`` says no). The delivery must still be retried and delivered — not
    dropped by an exception on the delivery thread, counted nowhere."""
    receiver = Receiver((503,), headers=((("Retry-After", after),),))
    hooks = Webhooks(receiver.url, SECRET, backoff_seconds=0.05, max_backoff_seconds=0.1,
                     flush_on_exit=0)
    try:
        hooks.notify(Notice(AMBIGUOUS, "ns", "k:1", "t", 1, 1, "ambiguous"))
        assert hooks.flush(10)
        stats = hooks.stats()
        assert (stats.delivered, stats.retried, stats.failed) == (1, 1, 0), stats
        assert len(receiver.got) == 2
    finally:
        hooks.close(0.5)
        receiver.close()


# -- an undo that ran but could not be recorded ---------------------------------------------------

def test_an_undo_whose_commit_the_store_lost_holds_back_the_older_steps(namespace: str) -> None:
    """Postgres through a proxy: the car's cancel runs, then the store goes away while its
    commit is written (a network blip) and comes back at once. The car's undo is left in
    flight — it ran — so it must be listed unresolved (not "failed", as if nothing ran), and
    the hotel and the flight must not be cancelled out of order while the car may stand."""
    from sqlalchemy.engine import make_url

    from .conftest import PG_URL, require_postgres
    from .pg_proxy import WedgingProxy

    require_postgres()
    target = make_url(PG_URL)
    proxy = WedgingProxy((target.host or "127.0.0.1", target.port or 5432))
    url = target.set(host="127.0.0.1", port=proxy.port,
                     query={"connect_timeout": "2"}).render_as_string(hide_password=False)
    gate = eg.Gate(url, namespace=namespace)
    undone: list[str] = []

    def back_once_tried() -> None:  # the commit's own connection stays silent: it times out
        end = time.monotonic() + 20
        while proxy.wedged_attempts < 1 and time.monotonic() < end:
            time.sleep(0.01)
        proxy.wedged.clear()

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> dict[str, Any]:
        undone.append(compensation["cancel"])
        if compensation["cancel"] == "car":
            proxy.wedge()
            threading.Thread(target=back_once_tried, daemon=True).start()
        return {"cancelled": compensation["cancel"]}

    try:
        for step in ("flight", "hotel", "car"):
            gate.report(_booked(gate, step), "committed")
        report = gate.unwind(GROUP, by="ops")
        assert undone == ["car"], report.as_dict()
        assert report.failed == [] and report.compensated == []
        assert [s.key for s in report.unresolved] == ["car:r6", "hotel:r6", "flight:r6"]
        assert "could not be recorded" in report.unresolved[0].detail
        assert report.unresolved[1].detail.startswith(
            "held back: the undo of the newer step car:r6 is unrecorded")
        assert gate.get("compensate:car:r6").state is eg.State.IN_FLIGHT
        again = gate.unwind(GROUP, by="ops")  # still unsettled: nothing older, nothing twice
        assert undone == ["car"] and not again.complete
        gate.resolve("compensate:car:r6", "committed", by="ops", force=True,
                     note="the rental company confirmed the cancel")
        last = gate.unwind(GROUP, by="ops")
        assert last.complete and undone == ["car", "hotel", "flight"]
    finally:
        gate.close()
        proxy.close()


# -- operators' acts: hostile actor names and notes in the log ------------------------------------

FORGED = "ops\r\n2026-12-07 INFO effectgate: approved all by root\x1b[2J\u202e"


def _one_line(text: str) -> bool:
    return not any(ch in text for ch in "\r\n\x1b\u202e\x85\u2028")


def test_an_operators_name_or_note_cannot_forge_log_lines(make_gate: Any,
                                                          caplog: pytest.LogCaptureFixture,
                                                          ) -> None:
    """``by`` and ``note`` are free text (a CLI flag, a console form): a line feed in them
    must not start a forged line in a plain-text log, nor an escape drive the terminal that
    tails it. Every operator act logs them shown visibly, as the CLI shows them."""
    policy = eg.Policy.from_dict({"effects": {"pay.*": {"approval": "always"}}})
    gate: eg.Gate = make_gate(policy=policy)
    caplog.set_level("INFO", logger="effectgate")
    d = gate.begin(effect_type="other.x", key="x:r6", payload={}, lease_seconds=0.05)
    time.sleep(0.1)
    gate.resolve("x:r6", "failed", by=FORGED, note=FORGED * 20)
    asked = [gate.begin(effect_type="pay.out", key=f"pay:{n}", payload={"n": n},
                        agent_id="agent") for n in (1, 2)]
    gate.approve(asked[0].approval_id or "", by=FORGED, note=FORGED)
    gate.deny(asked[1].approval_id or "", by=FORGED, reason=FORGED)
    acts = [r for r in caplog.records if "by ops" in r.getMessage()]
    assert len(acts) == 3, [r.getMessage() for r in caplog.records]
    for record in acts:
        assert _one_line(record.getMessage()), record.getMessage()
        assert _one_line(str(getattr(record, "reason", "") or "")), record.__dict__
    assert d.decision is eg.Decision.EXECUTE
    assert gate.get("x:r6").history[-1].by == FORGED  # the store keeps what was said


@pytest.mark.parametrize("bad", ["\t", "\x7f", "\x01", "\x0b"])
@pytest.mark.parametrize("what", ["url", "console_url"])
def test_a_webhook_url_with_a_control_character_is_refused_when_configured(
        bad: str, what: str) -> None:
    """``urlsplit`` silently drops a tab, so such a URL passed the check, and every delivery
    then failed in ``http.client`` (InvalidURL), retried to the end: a misconfiguration
    reported nowhere but in warnings. It is a :class:`~effectgate.ConfigError` up front."""
    url = f"https://hooks.example.com/T0/B{bad}0"
    options = {"url": url} if what == "url" else {
        "url": "https://hooks.example.com/T0", "console_url": url}
    with pytest.raises(eg.ConfigError, match="http"):
        Webhooks(secret=SECRET, flush_on_exit=0, **options)


# -- kill -9 in the middle of an undo -------------------------------------------------------------

_UNWINDER = r"""
import pathlib, sys, time
import effectgate as eg
url, namespace, log, mode = sys.argv[1:5]
gate = eg.Gate(url, namespace=namespace, lease_seconds=1.0)

@gate.compensator("booking.*")
def cancel(record, compensation):
    with open(log, "a") as f:
        f.write(compensation["cancel"] + "\n")
        f.flush()
    if mode == "die" and compensation["cancel"] == "car":
        time.sleep(60)  # killed -9 here, its cancel sent, its outcome never recorded
    return {"cancelled": compensation["cancel"]}

report = gate.unwind("trip:r6", by="ops")
print(len(report.compensated_now), len(report.unresolved), report.complete, flush=True)
"""


def test_an_unwind_killed_mid_undo_never_runs_that_undo_again(store_url: str, namespace: str,
                                                              tmp_path: Any) -> None:
    """A real process unwinds and is killed -9 inside the car's cancel. Unwinds in other
    processes — at once, and after the dead one's lease lapsed — never run the car's cancel
    again and never cancel the hotel or the flight while it is unsettled; an operator's
    verdict lets the next unwind finish, each cancel having run once."""
    import os
    import signal
    import subprocess
    import sys

    gate = eg.Gate(store_url, namespace=namespace)
    try:
        for step in ("flight", "hotel", "car"):
            gate.report(_booked(gate, step), "committed")
        log = tmp_path / "cancels.txt"
        script = tmp_path / "unwinder.py"
        script.write_text(_UNWINDER)

        def run(mode: str) -> subprocess.Popen[str]:
            return subprocess.Popen([sys.executable, str(script), store_url, namespace,
                                     str(log), mode], stdout=subprocess.PIPE, text=True)

        doomed = run("die")
        end = time.monotonic() + 60
        while not (log.exists() and "car" in log.read_text()) and time.monotonic() < end:
            time.sleep(0.02)
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(10)
        assert log.read_text().split() == ["car"]

        for _ in range(2):  # in flight under the dead one's lease, then AMBIGUOUS
            other = run("live")
            out, _ = other.communicate(timeout=60)
            assert out.split() == ["0", "3", "False"], out
            assert log.read_text().split() == ["car"]
            time.sleep(1.2)
        assert gate.get("compensate:car:r6").state is eg.State.AMBIGUOUS
        gate.resolve("compensate:car:r6", "committed", by="ops", note="checked: cancelled")
        last = run("live")
        out, _ = last.communicate(timeout=60)
        assert out.split() == ["2", "0", "True"], out
        assert log.read_text().split() == ["car", "hotel", "flight"]
    finally:
        gate.close()


# -- the sweeper against operators and live leases ------------------------------------------------

def test_sweepers_racing_an_operator_lose_no_verdict_and_spare_live_leases(
        make_gate: Any) -> None:
    """Two sweepers (two gates: as two processes would) lapse 30 lapsed leases while an
    operator resolves each of them at the same moment, and 10 live leases are in flight: every
    verdict stands (FAILED by ops), each lapse is announced at most once in all, and no live
    lease is touched."""
    from effectgate.sweep import sweep_lapsed

    gates = [make_gate(), make_gate(), make_gate()]
    gate = gates[0]
    lapsed = [gate.begin(effect_type="job.run", key=f"lapse:{n}", payload={},
                         lease_seconds=0.05) for n in range(30)]
    live = [gate.begin(effect_type="job.run", key=f"live:{n}", payload={}, lease_seconds=120)
            for n in range(10)]
    time.sleep(0.2)
    told: list[Notice] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def sweep(g: eg.Gate) -> None:
        try:
            while not stop.is_set():
                sweep_lapsed(g, told.append)
        except BaseException as err:  # reported below
            errors.append(err)

    sweepers = [threading.Thread(target=sweep, args=(g,)) for g in gates[1:]]
    for t in sweepers:
        t.start()
    try:
        for d in lapsed:
            gate.resolve(d.key, "failed", by="ops", note="the job never started")
    finally:
        stop.set()
        for t in sweepers:
            t.join(30)
    assert errors == []
    for d in lapsed:
        record = gate.get(d.key)
        assert record.state is eg.State.FAILED and record.history[-1].by == "ops", record
    keys = [n.key for n in told]
    assert len(keys) == len(set(keys)) and set(keys) <= {d.key for d in lapsed}
    for d in live:
        assert gate.get(d.key).state is eg.State.IN_FLIGHT
        gate.report(d, "committed")  # their holders' word still lands


# -- a step that joins the group while it is being unwound ----------------------------------------

def test_a_step_committed_while_unwinding_leaves_the_unwind_incomplete(make_gate: Any) -> None:
    """An agent still working on the trip books a taxi in the group while an operator's unwind
    is cancelling the car. The unwind read the group before the taxi existed: it must not say
    the saga is completely unwound while the taxi stands; the next unwind cancels it."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> dict[str, Any]:
        undone.append(compensation["cancel"])
        if compensation["cancel"] == "car":  # meanwhile, the agent books on
            gate.report(_booked(gate, "taxi"), "committed", result={"booked": "taxi"})
        return {"cancelled": compensation["cancel"]}

    for step in ("hotel", "car"):
        gate.report(_booked(gate, step), "committed")
    report = gate.unwind(GROUP, by="ops")
    assert undone == ["car", "hotel"]
    assert not report.complete, report.as_dict()
    assert [s.key for s in report.unresolved] == ["taxi:r6"]
    assert "joined the group" in report.unresolved[0].detail
    again = gate.unwind(GROUP, by="ops")
    assert again.complete and undone == ["car", "hotel", "taxi"]
