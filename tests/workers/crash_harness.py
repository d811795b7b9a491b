"""The crash harness: many trials, each a forked worker SIGKILLed at one point of a gated call.

``python crash_harness.py URL NAMESPACE EFFECTS_FILE WORKER_ID TRIALS_PER_POINT LEASE SEED
[CALLER]``

This process opens one gate, closes its connections, and per trial forks a child that makes one
call through the protocol (``begin`` → body → ``report``, the sequence the decorator runs) with
its own connection. The child dies by ``SIGKILL`` (no ``finally``, no ``atexit``, no report) at
one of these points:

* ``before_reserve``  inside ``begin``, after validation, before the reserving write
* ``after_reserve``   after the reservation, before the body starts
* ``mid_body``        a timer thread kills it at a random moment of the body, before or after
                      the body's side effect
* ``after_body``      the body finished (its side effect happened); killed before ``report``
* ``during_report``   a timer thread kills it at a random moment inside ``report``
                      (``R`` is written to the status pipe if ``report`` returned first,
                      ``S`` if it was refused because the lease had already lapsed)

The side effect is one line appended (``O_APPEND``) to EFFECTS_FILE: it, not the store, counts
executions. When every child is dead and every lease has lapsed, this process reads each key's
state, then retries each call once through :class:`effectgate.EffectSpec` (the decorator's
path), as a job runner would. Prints one JSON line per trial.

CALLER is ``sync`` (the default) or ``async``: each child then makes its call as an async
caller does, on an event loop of its own (``await abegin`` → body → ``await areport``; on
Postgres the async store's own ``AsyncConnection``, on SQLite the sync store off the loop), its
``before_reserve`` kill is in the async store's reserving call, and the retries are
:meth:`effectgate.EffectSpec.arun` with an ``async def`` body.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from typing import Any

import effectgate as eg

POINTS = ("before_reserve", "after_reserve", "mid_body", "after_body", "during_report")
# Kill delays (seconds) spanning a report's duration on either backend, and the body's write.
DELAYS = (0.0, 0.00005, 0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.0032)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def side_effect(fd: int, txn_id: str, who: str) -> dict[str, Any]:
    os.write(fd, f"refund:{txn_id} {who} {os.getpid()}\n".encode())
    return {"refund_id": f"re_{txn_id}", "by": who}


def arm_killer(delay: float) -> threading.Event:
    """A thread that SIGKILLs this process ``delay`` seconds after the event is set."""
    armed = threading.Event()

    def killer() -> None:
        armed.wait()
        if delay:
            time.sleep(delay)
        die()

    threading.Thread(target=killer, daemon=True).start()
    # Let the killer preempt the main thread's Python code too, not only its waits on I/O.
    sys.setswitchinterval(1e-6)
    return armed


def block_reserve(gate: eg.Gate, caller: str) -> None:
    """Die in ``begin`` after validation, at the call that would send the reserving write."""
    gate.store.reserve = lambda *args: die()  # type: ignore[method-assign]
    if caller == "async" and not gate.store.is_sqlite:
        # On Postgres the async begin reserves on its own connection, not through the sync
        # store (on SQLite it hands the write to the sync store's reserve on a thread).
        face: Any = gate.store.async_face()
        face.reserve = lambda *args: die()


def request(txn_id: str) -> dict[str, Any]:
    return {"effect_type": "payment.refund", "key": f"refund:{txn_id}",
            "payload": {"txn_id": txn_id, "amount_cents": 500}}


def started(d: eg.BeginDecision, point: str) -> None:
    if d.decision is not eg.Decision.EXECUTE:
        raise AssertionError(f"a fresh key answered {d.decision.value}")
    if point == "after_reserve":
        die()


def call_sync(gate: eg.Gate, fd: int, txn_id: str, point: str,
              armed: threading.Event | None, status_fd: int) -> None:
    d = gate.begin(**request(txn_id))
    started(d, point)
    if armed is not None and point == "mid_body":
        armed.set()
        time.sleep(0.0004)  # preparing the request...
    result = side_effect(fd, txn_id, "child")
    if point == "mid_body":
        time.sleep(60)  # ...waiting for the vendor's reply
    if point == "after_body":  # the vendor did it; the process died before reporting
        die()
    assert armed is not None
    armed.set()
    try:
        gate.report(d, "committed", result=result)
        os.write(status_fd, b"R")  # report returned before the kill landed
    except eg.StaleLease:  # a machine so loaded that the lease lapsed before the report
        os.write(status_fd, b"S")
    die()


async def call_async(gate: eg.Gate, fd: int, txn_id: str, point: str,
                     armed: threading.Event | None, status_fd: int) -> None:
    """:func:`call_sync` as an async caller makes it."""
    d = await gate.abegin(**request(txn_id))
    started(d, point)
    if armed is not None and point == "mid_body":
        armed.set()
        await asyncio.sleep(0.0004)  # preparing the request...
    result = side_effect(fd, txn_id, "child")
    if point == "mid_body":
        await asyncio.sleep(60)  # ...waiting for the vendor's reply
    if point == "after_body":
        die()
    assert armed is not None
    armed.set()
    try:
        await gate.areport(d, "committed", result=result)
        os.write(status_fd, b"R")
    except eg.StaleLease:
        os.write(status_fd, b"S")
    die()


def child(gate: eg.Gate, effects_file: str, txn_id: str, point: str, delay: float,
          status_fd: int, caller: str) -> None:
    """Run one call and die at ``point``. Never returns."""
    try:
        fd = os.open(effects_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # Started early: the thread is up and waiting when its moment comes.
        armed = arm_killer(delay) if point in ("mid_body", "during_report") else None
        if point == "before_reserve":  # inside begin: validated, the reserving write not sent
            block_reserve(gate, caller)
        if caller == "async":
            asyncio.run(call_async(gate, fd, txn_id, point, armed, status_fd))
        else:
            call_sync(gate, fd, txn_id, point, armed, status_fd)
        raise AssertionError("the call outlived its kill point")
    except BaseException:
        os.write(status_fd, ("E:" + traceback.format_exc()[-1500:]).encode())
    os._exit(3)


def fork_trial(gate: eg.Gate, effects_file: str, txn_id: str, point: str,
               delay: float, caller: str) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        child(gate, effects_file, txn_id, point, delay, write_fd, caller)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(read_fd, 4096):
        chunks.append(chunk)
    os.close(read_fd)
    said = b"".join(chunks).decode(errors="replace")
    return {
        "killed": os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL,
        "report_returned": said == "R",
        "report_refused": said == "S",
        "error": said[2:] if said.startswith("E:") else None,
    }


def state_of(gate: eg.Gate, key: str) -> str:
    try:
        return gate.get(key).state.value
    except eg.UnknownEffect:
        return "absent"


def main() -> None:
    url, namespace, effects_file, worker, per_point, lease_s, seed = sys.argv[1:8]
    caller = sys.argv[8] if len(sys.argv) > 8 else "sync"
    lease = float(lease_s)
    rng = random.Random(int(seed))
    plan = [point for point in POINTS for _ in range(int(per_point))]
    rng.shuffle(plan)
    trials: list[dict[str, Any]] = []
    # One gate, its connections closed before each fork: every child opens its own and
    # inherits no open database connection.
    holder_gate = eg.Gate(url, namespace=namespace, lease_seconds=lease, memo_size=0)
    holder_gate.close()
    started = time.monotonic()
    timed = {"mid_body": 0, "during_report": 0}
    for i, point in enumerate(plan):
        txn_id = f"w{worker}-{i}"
        delay = 0.0
        if point in ("mid_body", "during_report"):
            delay = DELAYS[timed[point] % len(DELAYS)]
            timed[point] += 1
        trial = {"key": f"refund:{txn_id}", "txn_id": txn_id, "point": point, "delay": delay,
                 "caller": caller}
        trial.update(fork_trial(holder_gate, effects_file, txn_id, point, delay, caller))
        trials.append(trial)
    kill_seconds = time.monotonic() - started

    # Every child is dead; wait for the last lease to lapse (the store's clock decides).
    gate = eg.Gate(url, namespace=namespace, lease_seconds=30, memo_size=0)
    time.sleep(lease)
    deadline = time.monotonic() + 60
    for trial in trials:
        while (state := state_of(gate, trial["key"])) == "in_flight":
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        trial["state_after_kill"] = state

    # The job runner retries every call once (an async one on one event loop).
    fd = os.open(effects_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    spec = eg.EffectSpec(gate, "refund:{txn_id}", effect_type="payment.refund")
    runner = asyncio.Runner()
    for trial in trials:
        txn_id = trial["txn_id"]
        arguments = {"txn_id": txn_id, "amount_cents": 500}
        ran: list[bool] = []

        def body(txn_id: str = txn_id, ran: list[bool] = ran) -> dict[str, Any]:
            ran.append(True)
            return side_effect(fd, txn_id, "retry")

        async def abody(body: Any = body) -> dict[str, Any]:
            return body()  # type: ignore[no-any-return]

        try:
            if caller == "async":
                answer = runner.run(spec.arun(arguments, abody))
            else:
                answer = spec.run(arguments, body)
            trial["retry"] = "executed" if ran else "duplicate"
            trial["retry_result"] = answer
        except eg.EffectRefused as err:
            trial["retry"] = err.decision
        except Exception as err:
            trial["retry"] = f"error {type(err).__name__}: {err}"
        record = gate.get(trial["key"])
        trial["final_state"] = record.state.value
        trial["history"] = [
            [h.from_state.value if h.from_state else None, h.to_state.value]
            for h in record.history
        ]
        print(json.dumps(trial), flush=True)
    face: Any = gate.store.async_face()
    if caller == "async" and hasattr(face, "close"):  # Postgres: this loop's connections
        runner.run(face.close())
    runner.close()
    print(json.dumps({"summary": True, "trials": len(trials), "kill_seconds": kill_seconds}),
          flush=True)
    gate.close()


if __name__ == "__main__":
    main()
