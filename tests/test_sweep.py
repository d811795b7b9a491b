"""Lapses nobody touches still reach people: the sweeper marks a lapsed lease AMBIGUOUS and
sends its webhook once — however many sweepers (``effectgate watch``, consoles) and agents
race for it, across processes — on SQLite and Postgres, with a real HTTP receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

import effectgate as eg
from effectgate.cli import main
from effectgate.notices import Notice
from effectgate.sweep import Sweeper, sweep_lapsed

from .conftest import snapshot
from .test_webhooks import SECRET, Receiver, hooks


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _lapsing(gate: eg.Gate, n: int, prefix: str = "mail:") -> list[eg.BeginDecision]:
    held = [gate.begin(effect_type="email.send", key=f"{prefix}{i}", payload={"i": i},
                       lease_seconds=0.2) for i in range(n)]
    time.sleep(0.35)  # every lease lapses; nobody calls begin
    return held


def _stored_state(gate: eg.Gate, key: str) -> str:
    from sqlalchemy import text

    with gate.store.engine.connect() as conn:
        return str(conn.execute(text("SELECT state FROM effectgate_effects WHERE namespace = "
                                     ":ns AND key = :k"), {"ns": gate.namespace, "k": key})
                   .scalar())


def test_a_lapse_nobody_touches_sends_one_ambiguous_webhook(make_gate: Any,
                                                            receiver: Receiver) -> None:
    wh = hooks(receiver.url)
    gate = make_gate(webhooks=wh)
    (held,) = _lapsing(gate, 1)
    assert wh.flush(5) and receiver.got == []  # nobody touched it: nothing was sent
    assert _stored_state(gate, "mail:0") == "in_flight"
    sent = sweep_lapsed(gate)
    assert [(n.key, n.event, n.effect_id) for n in sent] == [("mail:0", "ambiguous",
                                                              held.effect_id)]
    assert wh.flush(10)
    got = receiver.wait(1)
    body = json.loads(got[0][1])
    assert (body["event"], body["key"], body["effect_id"], body["reason"]) == (
        "ambiguous", "mail:0", held.effect_id, "lease lapsed")
    assert body["url"].endswith(f"/effects/{held.effect_id}")
    assert _stored_state(gate, "mail:0") == "ambiguous"
    assert gate.get("mail:0").history[-1].by == "lease"
    assert sweep_lapsed(gate) == []  # announced once
    again = gate.begin(effect_type="email.send", key="mail:0", payload={"i": 0})
    assert again.decision is eg.Decision.BLOCKED
    assert wh.flush(5) and len(receiver.got) == 1
    # The lapsed holder's own late report still settles it, as after a begin's lapse.
    gate.report(held, "committed", result={"sent": True})
    record = gate.get("mail:0")
    assert record.state is eg.State.COMMITTED and record.history[-1].note == "late report"


def test_a_sweep_touches_only_lapsed_leases_of_its_namespace(make_gate: Any) -> None:
    told: list[Notice] = []
    gate = make_gate()
    elsewhere = make_gate(namespace=gate.namespace + "-other")
    _lapsing(elsewhere, 1)
    live = gate.begin(effect_type="email.send", key="live", payload={}, lease_seconds=900)
    done = gate.begin(effect_type="email.send", key="done", payload={}, lease_seconds=0.2)
    gate.report(done, "committed")
    time.sleep(0.3)
    before = snapshot(elsewhere), snapshot(gate)
    assert sweep_lapsed(gate, told.append) == [] and told == []
    assert (snapshot(elsewhere), snapshot(gate)) == before
    assert gate.get("live").state is eg.State.IN_FLIGHT and live.decision is eg.Decision.EXECUTE


def test_a_sweep_with_nobody_to_tell_is_refused_and_changes_nothing(gate: eg.Gate) -> None:
    _lapsing(gate, 1)
    before = snapshot(gate)
    with pytest.raises(eg.ConfigError, match="nothing to notify"):
        sweep_lapsed(gate)
    for bad in (0, -1, 10_001, True, 2.5):
        with pytest.raises(eg.ConfigError):
            sweep_lapsed(gate, lambda n: None, limit=bad)  # type: ignore[arg-type]
    for interval in (0, -1, 0.01, float("inf"), "5"):
        with pytest.raises(eg.ConfigError):
            Sweeper(gate, lambda n: None, interval=interval)  # type: ignore[arg-type]
    with pytest.raises(eg.ConfigError):
        Sweeper(gate)
    assert snapshot(gate) == before
    result = CliRunner().invoke(main, ["watch", "--once", "--url", gate.url, "--namespace",
                                       gate.namespace], env={"EFFECTGATE_WEBHOOK_URL": ""})
    assert result.exit_code == 2 and "nothing to notify" in result.stderr
    assert snapshot(gate) == before


def test_watch_once_announces_and_prints_each_lapse(store_url: str, namespace: str,
                                                    receiver: Receiver) -> None:
    with eg.Gate(store_url, namespace=namespace, webhooks=False) as gate:
        _lapsing(gate, 2)
    env = {"EFFECTGATE_WEBHOOK_URL": receiver.url, "EFFECTGATE_WEBHOOK_SECRET": SECRET}
    where = ["--url", store_url, "--namespace", namespace]
    result = CliRunner().invoke(main, ["watch", "--once", *where], env=env)
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert sorted(line[2] for line in lines) == ["mail:0", "mail:1"]
    assert all(line[1] == "lapsed" for line in lines)
    assert sorted(json.loads(b)["key"] for _, b in receiver.wait(2)) == ["mail:0", "mail:1"]
    again = CliRunner().invoke(main, ["watch", "--once", *where], env=env)
    assert again.exit_code == 0 and again.stdout == ""


def test_threads_racing_to_sweep_announce_each_lapse_once(make_gate: Any) -> None:
    import threading

    gate = make_gate()
    others = [make_gate() for _ in range(3)]
    _lapsing(gate, 20)
    told: list[tuple[str, int | None]] = []
    lock = threading.Lock()

    def tell(n: Notice) -> None:
        with lock:
            told.append((n.key, n.attempt))

    start = threading.Barrier(4)

    def race(g: eg.Gate) -> None:
        start.wait()
        sweep_lapsed(g, tell)

    threads = [threading.Thread(target=race, args=(g,)) for g in [gate, *others]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(told) == sorted((f"mail:{i}", 1) for i in range(20))


def test_the_sweeper_thread_announces_what_lapses_while_it_runs(make_gate: Any) -> None:
    told: list[str] = []
    gate = make_gate()
    with Sweeper(gate, lambda n: told.append(n.key), interval=0.1) as sweeper:
        _lapsing(gate, 2)
        deadline = time.monotonic() + 10
        while len(told) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert sorted(told) == ["mail:0", "mail:1"] and sweeper.sent == 2


@pytest.mark.slow
def test_watchers_and_a_console_in_separate_processes_announce_each_lapse_once(
        store_url: str, namespace: str, receiver: Receiver) -> None:
    """Two ``effectgate watch`` processes and an ``effectgate console`` (which sweeps too),
    all on one store: each of 30 lapses reaches the receiver exactly once."""
    from .mcp_helpers import serving

    env = {**os.environ, "EFFECTGATE_WEBHOOK_URL": receiver.url,
           "EFFECTGATE_WEBHOOK_SECRET": SECRET}
    where = ["--url", store_url, "--namespace", namespace]
    gate = eg.Gate(store_url, namespace=namespace, webhooks=False)
    watchers = [subprocess.Popen([sys.executable, "-m", "effectgate.cli", "watch",
                                  "--interval", "0.1", *where], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    try:
        with serving([sys.executable, "-m", "effectgate.cli", "console", "--port", "0",
                      "--sweep-interval", "0.1", *where], env=env) as console:
            assert any("sweeping for lapsed leases" in line for line in console.lines)
            _lapsing(gate, 30)
            got = receiver.wait(30, timeout=30)
            time.sleep(1.0)  # room for a duplicate to arrive
            got = list(receiver.got)
    finally:
        for proc in watchers:
            proc.terminate()
        outs = [proc.communicate(timeout=10)[0] for proc in watchers]
        gate.close()
    keys = [json.loads(body)["key"] for _, body in got]
    assert sorted(keys) == sorted(f"mail:{i}" for i in range(30)), keys
    printed = [line for out in outs for line in out.splitlines() if "\tlapsed\t" in line]
    assert len(printed) <= 30 and len(set(printed)) == len(printed)
