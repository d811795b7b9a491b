"""The guarantees that need real OS processes: G2 (8 processes race on many keys) and G12
(workers killed with SIGKILL at every point of the protocol).

Both count executions by the side effect itself — a file each body appends one line to — not
by what the store says.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..decorator import EffectSpec
from ..errors import EffectAmbiguous, EffectInFlight, UnknownEffect
from ..gate import Gate
from ..states import Decision, State
from .harness import CheckFailed, NotApplicable, VerifyContext, expect

__all__ = ["G2_KEYS", "G2_PROCESSES", "G12_POINTS", "check_g2", "check_g12"]

G2_PROCESSES = 8
G2_KEYS = 200
G12_POINTS = ("before_reserve", "after_reserve", "mid_body", "after_body", "during_report")
G12_TRIALS = 2
G12_LEASE = 0.5
_TIMEOUT = 60.0


class _Channel:
    """The worker's side of its link to the parent: ``send`` a message, ``wait`` for "go"."""

    def __init__(self, conn: Any = None) -> None:
        self._conn = conn

    def send(self, kind: str, value: Any = None) -> None:
        if self._conn is not None:
            self._conn.send((kind, value))
        else:
            sys.stdout.write(json.dumps([kind, value]) + "\n")
            sys.stdout.flush()

    def wait(self) -> None:
        if self._conn is not None:
            self._conn.recv()
        else:
            sys.stdin.readline()


class _Worker:
    """A worker process: forked where that is safe (POSIX, no other threads in this
    process), else a fresh interpreter (``python -m effectgate.verify.procs``), so the
    caller's ``__main__`` is never re-imported."""

    def __init__(self, target: str, *args: Any) -> None:
        self.proc: Any
        if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
            mine, theirs = multiprocessing.get_context("fork").Pipe()
            self._conn: Any = mine
            self.proc = multiprocessing.get_context("fork").Process(
                target=_WORKERS[target], args=(*args, _Channel(theirs)), daemon=True)
            self.proc.start()
            theirs.close()
            self.pid = self.proc.pid
        else:
            self._conn = None
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "effectgate.verify.procs", target, json.dumps(args)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
            self.pid = self.proc.pid
        self._buffer = b""

    def recv(self, kind: str, who: str) -> Any:
        """The next message, which must be ``kind``; :class:`CheckFailed` otherwise."""
        if self._conn is not None:
            if not self._conn.poll(_TIMEOUT):
                raise CheckFailed(f"{who} sent nothing within {_TIMEOUT:.0f}s")
            got, value = self._conn.recv()
        else:
            got, value = json.loads(self._line(who))
        if got == "error":
            raise CheckFailed(f"{who} failed: {value}")
        expect(got == kind, f"{who} sent {got!r}, not {kind!r}")
        return value

    def _line(self, who: str) -> str:
        deadline = time.monotonic() + _TIMEOUT
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                raise CheckFailed(f"{who} sent nothing within {_TIMEOUT:.0f}s")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def go(self) -> None:
        """Release a worker waiting in ``channel.wait()``."""
        if self._conn is not None:
            self._conn.send("go")
        else:
            self.proc.stdin.write(b"go\n")

    def kill(self) -> None:
        """SIGKILL (a no-op if it already ended)."""
        with contextlib.suppress(ProcessLookupError, OSError):
            os.kill(self.pid, signal.SIGKILL)

    def reap(self) -> None:
        """Kill if still running, wait for it, close its pipes."""
        self.kill()
        if self._conn is not None:
            self.proc.join(5)
            self._conn.close()
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
            for stream in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()


def _append(path: str, line: str) -> None:
    """The side effect: one line, one ``write`` on an ``O_APPEND`` file (atomic)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _lines(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(path.read_text().splitlines())


def _reap(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.reap()


# -- G2 ---------------------------------------------------------------------------------------


def _g2_worker(url: str, namespace: str, refs: list[str], side: str, chan: _Channel) -> None:
    try:
        gate = Gate(url, namespace=namespace, policy=False)
        spec = EffectSpec(gate, "verify:G2:{ref}", effect_type="verify.g2")
        counts = {"executed": 0, "duplicate": 0, "in_flight": 0}
        chan.send("ready")
        chan.wait()
        for ref in refs:
            ran: list[bool] = []

            def body(ref: str = ref, ran: list[bool] = ran) -> dict[str, str]:
                _append(side, ref)
                ran.append(True)
                return {"ref": ref}

            try:
                spec.run({"ref": ref}, body)
                counts["executed" if ran else "duplicate"] += 1
            except EffectInFlight:
                counts["in_flight"] += 1
        gate.close()
        chan.send("done", counts)
    except BaseException as err:
        chan.send("error", f"{type(err).__name__}: {err}")


def check_g2(ctx: VerifyContext) -> str:
    side = ctx.folder / "side-effects.txt"
    refs = [f"k{i:04d}" for i in range(G2_KEYS)]
    workers: list[_Worker] = []
    totals: Counter[str] = Counter()
    try:
        for n in range(G2_PROCESSES):
            order = refs[:]
            random.Random(n).shuffle(order)
            workers.append(_Worker("g2", ctx.url, ctx.namespace, order, str(side)))
        for worker in workers:
            worker.recv("ready", "a G2 worker")
        for worker in workers:  # all connected: start the race
            worker.go()
        for worker in workers:
            totals.update(worker.recv("done", "a G2 worker"))
    finally:
        _reap(workers)
    lines = _lines(side)
    twice = sorted(ref for ref, n in lines.items() if n > 1)
    missing = sorted(set(refs) - set(lines))
    expect(not twice, f"{len(twice)} keys executed more than once (e.g. {twice[:3]})")
    expect(not missing, f"{len(missing)} keys never executed (e.g. {missing[:3]})")
    gate = ctx.gate()
    states = Counter(gate.get(f"verify:G2:{ref}").state.value for ref in refs)
    expect(states == Counter({"committed": len(refs)}), f"stored states: {dict(states)}")
    return (f"{G2_PROCESSES} processes × {G2_KEYS} keys: {len(lines)} executions, "
            f"{totals['duplicate']} duplicates, {totals['in_flight']} in flight")


# -- G12 --------------------------------------------------------------------------------------


def _g12_worker(url: str, namespace: str, point: str, trial: int, side: str,
                chan: _Channel) -> None:
    key = f"verify:G12:{point}:{trial}"

    def pause(at: str) -> None:
        if point == at:
            chan.send(at)
            time.sleep(_TIMEOUT)

    try:
        gate = Gate(url, namespace=namespace, lease_seconds=G12_LEASE, policy=False)
        pause("before_reserve")
        d = gate.begin(effect_type="verify.g12", key=key,
                       payload={"point": point, "trial": trial})
        if d.decision is not Decision.EXECUTE:
            chan.send("error", f"{key}: begin answered {d.decision.value}")
            return
        pause("after_reserve")
        pause("mid_body")  # inside the body: the vendor has not acted yet
        _append(side, key)  # the vendor acts
        pause("after_body")
        if point == "during_report":
            chan.send(point)
        gate.report(d, "committed", result={"key": key})
        time.sleep(_TIMEOUT)
    except BaseException as err:
        chan.send("error", f"{type(err).__name__}: {err}")


_WORKERS: dict[str, Callable[..., None]] = {"g2": _g2_worker, "g12": _g12_worker}


def _predicted(point: str, state: State | None, lines: int) -> bool:
    if point == "before_reserve":
        return state is None and lines == 0
    if point in ("after_reserve", "mid_body"):
        return state is State.AMBIGUOUS and lines == 0
    if point == "after_body":
        return state is State.AMBIGUOUS and lines == 1
    return lines == 1 and state in (State.COMMITTED, State.AMBIGUOUS)


def check_g12(ctx: VerifyContext) -> str:
    if sys.platform == "win32" or not hasattr(signal, "SIGKILL"):
        raise NotApplicable("this platform has no SIGKILL to kill a worker with")
    side = ctx.folder / "side-effects.txt"
    trials = [(point, n) for point in G12_POINTS for n in range(G12_TRIALS)]
    workers: list[_Worker] = []
    try:
        for point, n in trials:
            workers.append(_Worker("g12", ctx.url, ctx.namespace, point, n, str(side)))
        for worker, (point, _) in zip(workers, trials, strict=True):
            worker.recv(point, f"the G12 worker for {point}")
            worker.kill()
    finally:
        _reap(workers)
    time.sleep(G12_LEASE + 0.2)
    return _after_kills(ctx, side, trials)


def _after_kills(ctx: VerifyContext, side: Path, trials: list[tuple[str, int]]) -> str:
    gate = ctx.gate()
    spec = EffectSpec(gate, "verify:G12:{point}:{trial}", effect_type="verify.g12")
    states: Counter[str] = Counter()  # "point:state" -> trials
    lines = _lines(side)
    ambiguous = []
    for point, n in trials:
        key = f"verify:G12:{point}:{n}"
        try:
            state: State | None = gate.get(key).state
        except UnknownEffect:
            state = None
        expect(_predicted(point, state, lines[key]),
               f"killed {point.replace('_', ' ')}: the effect is "
               f"{state.value if state else 'absent'} with {lines[key]} executions")
        states[f"{point}:{state.value if state else 'absent'}"] += 1
        ran = _retry(spec, side, point, n)
        expect(ran == (state is None),
               f"killed {point.replace('_', ' ')}: a blind retry "
               f"{'ran' if ran else 'did not run'} the body")
        if state is State.AMBIGUOUS:
            ambiguous.append((point, n, key))
    for point, n, key in ambiguous:  # the operator looks at the vendor's side
        happened = _lines(side)[key] == 1
        gate.resolve(key, "committed" if happened else "failed", by="effectgate-verify")
        _retry(spec, side, point, n)
    final = _lines(side)
    twice = [k for k, c in final.items() if c > 1]
    expect(not twice, f"executed twice after resolution: {twice}")
    keys = {f"verify:G12:{p}:{n}" for p, n in trials}
    expect(set(final) == keys, f"never executed: {sorted(keys - set(final))}")
    seen: dict[str, list[str]] = {p: [] for p in G12_POINTS}
    for point_state, count in sorted(states.items()):
        point, state_name = point_state.split(":")
        seen[point].append(f"{count} {state_name}")
    report = "; ".join(f"{p.replace('_', ' ')}: {', '.join(v)}" for p, v in seen.items())
    return f"{len(trials)} SIGKILLs, no second execution ({report})"


def _retry(spec: EffectSpec, side: Path, point: str, trial: int) -> bool:
    ran: list[bool] = []
    key = f"verify:G12:{point}:{trial}"

    def body() -> dict[str, str]:
        _append(str(side), key)
        ran.append(True)
        return {"key": key}

    with contextlib.suppress(EffectAmbiguous):
        spec.run({"point": point, "trial": trial}, body)
    return bool(ran)


def _main(argv: list[str]) -> None:
    """A worker in a fresh interpreter: ``python -m effectgate.verify.procs NAME ARGS-JSON``."""
    logging.getLogger("effectgate").addHandler(logging.NullHandler())
    _WORKERS[argv[0]](*json.loads(argv[1]), _Channel())


if __name__ == "__main__":
    _main(sys.argv[1:])
