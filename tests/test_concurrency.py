"""G2 under real concurrency: OS processes racing on the same keys, on SQLite and Postgres.

Executions are counted by the side effect itself (one line per execution appended to a shared
``O_APPEND`` file by the body), never by asking the store.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg

from .workers import TIMEOUT, executions, spawn, stop

N_PROCESSES = 8
N_KEYS = 240

pytestmark = pytest.mark.slow


def test_g2_one_winner_per_key_across_8_processes(store_url: str, namespace: str,
                                                  tmp_path: Path) -> None:
    """G2: 8 OS processes (4 through the decorator, 4 through begin/report; half of each
    going through the keys forward, half backward) race on 240 keys started by one gun: every
    key executes exactly once, and every process that got an answer for a key got the
    winner's result."""
    effects_file = tmp_path / "effects.log"
    racers = [(mode, order) for mode in ("decorator", "protocol")
              for order in ("forward", "backward")] * (N_PROCESSES // 4)
    procs = [spawn("race.py", store_url, namespace, str(effects_file), str(N_KEYS), mode, order)
             for mode, order in racers]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        for proc in procs:  # the start gun: every racer is connected and waiting
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports: list[dict[str, Any]] = []
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 0, err[-3000:]
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        stop(procs)

    counts = executions(effects_file)
    order_ids = [f"o{i}" for i in range(N_KEYS)]
    assert sorted(counts) == sorted(order_ids)
    doubles = {k: n for k, n in counts.items() if n != 1}
    assert doubles == {}, f"executed more than once: {doubles}"
    winners = {line.split()[0]: line.split()[1]
               for line in effects_file.read_text().splitlines()}
    for report in reports:
        assert set(report["answers"]) == set(order_ids)
        for order_id, answer in report["answers"].items():
            assert answer == {"order_id": order_id, "by": winners[order_id]}
    # More than one racer won keys: the race was real, not one process doing all the work
    # (one run far ahead of its rivals under load wins at most the keys before the middle).
    assert len(set(winners.values())) > 1


def test_gate_opened_before_fork_is_safe_in_forked_children(store_url: str, namespace: str,
                                                             tmp_path: Path) -> None:
    """A gate opened in a parent and used by forked children (prefork servers, multiprocessing
    with fork): each child gets its own connection, every key executes once, and a child
    closing its gate does not break the parent's connection.

    Regression: the children used to share the parent's pooled Postgres connection, which
    mixed their replies and executed a key twice."""
    effects_file = tmp_path / "effects.log"
    proc = spawn("fork_race.py", store_url, namespace, str(effects_file), "4", "100")
    try:
        out, err = proc.communicate(timeout=60)  # the regression hung: fail in a minute
    finally:
        stop([proc])
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["errors"] == ""
    assert report["phase1_exit"] == [0, 0, 0, 0]
    assert report["phase2_exit"] == [0, 0]
    assert report["parent_after"] == "committed"
    counts = executions(effects_file)
    assert {k: n for k, n in counts.items() if n != 1} == {}
    assert len([k for k in counts if k.startswith("job:") and "phase2" not in k]) == 100
    gate = eg.Gate(store_url, namespace=namespace)
    try:
        assert gate.get("job:0").state is eg.State.COMMITTED
    finally:
        gate.close()


def _open_connections(gate: eg.Gate, backend_pids: list[int]) -> int:
    """How many connections this process holds to the store: Postgres backends still alive
    among ``backend_pids``, or file descriptors open on the SQLite database."""
    if gate.store.is_sqlite:
        database = Path(gate.store.engine.url.database or "").resolve()
        names = {str(database), f"{database}-wal"}
        return sum(os.path.realpath(f"/proc/self/fd/{fd}") in names
                   for fd in os.listdir("/proc/self/fd"))
    with gate.store.engine.connect() as conn:
        return int(conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%(pids)s)",
            {"pids": backend_pids},
        ).scalar_one())


def test_threads_that_end_leave_no_connection_behind(gate: eg.Gate) -> None:
    """A thread per call (a threaded server's request handlers): each thread's connection is
    closed once the thread has ended, so 60 such calls hold at most a couple of connections.

    Regression: every thread's connection stayed open until gate.close(), and a Postgres
    server ran out of connections after about a hundred requests."""
    backend_pids: list[int] = []
    errors: list[BaseException] = []

    def handle_request(i: int) -> None:
        try:
            d = gate.begin(effect_type="job.run", key=f"job:{i}", payload={"i": i})
            gate.report(d, "committed", result=i)
            with gate.store.connection() as conn:
                backend_pids.append(0 if gate.store.is_sqlite else conn.info.backend_pid)
        except BaseException as err:  # surfaced below
            errors.append(err)

    before = _open_connections(gate, [])
    for i in range(60):
        thread = threading.Thread(target=handle_request, args=(i,))
        thread.start()
        thread.join()
    assert errors == []
    assert _open_connections(gate, backend_pids) <= before + 3
    assert all(gate.get(f"job:{i}").state is eg.State.COMMITTED for i in range(60))
