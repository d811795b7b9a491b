"""A gate opened before ``os.fork()`` and used by the forked children (the prefork pattern of
gunicorn, celery or ``multiprocessing`` with the fork start method).

``python fork_race.py URL NAMESPACE EFFECTS_FILE N_CHILDREN N_KEYS``. Phase 1: the parent opens
a gate and forks before using it; every child races on the same keys, appends one line per
execution to EFFECTS_FILE, then closes its gate. Phase 2: the parent, whose own connection
is open, forks children that use and close the gate, then uses the gate again. Prints one JSON
object: the children's exit codes and errors, and what the parent saw afterwards.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

import effectgate as eg


def child(gate: eg.Gate, effects_file: str, keys: list[str], errors_file: str) -> None:
    code = 0
    try:
        fd = os.open(effects_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for key in keys:
            d = gate.begin(effect_type="job.run", key=key, payload={"key": key})
            if d.decision is eg.Decision.EXECUTE:
                os.write(fd, f"{key} {os.getpid()}\n".encode())
                gate.report(d, "committed", result={"by": os.getpid()})
            elif d.decision is eg.Decision.IN_FLIGHT:
                continue  # a rival holds it; the parent checks the file, not the answers
        gate.close()
    except BaseException:
        code = 3
        with open(errors_file, "a") as f:
            f.write(traceback.format_exc()[-2000:] + "\n")
    os._exit(code)


def fork_children(gate: eg.Gate, n: int, effects_file: str, keys: list[str],
                  errors_file: str) -> list[int]:
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            child(gate, effects_file, keys, errors_file)
        pids.append(pid)
    return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]


def main() -> None:
    url, namespace, effects_file, n_children, n_keys = sys.argv[1:6]
    errors_file = effects_file + ".errors"
    out: dict[str, Any] = {}
    gate = eg.Gate(url, namespace=namespace, lease_seconds=30)
    keys = [f"job:{i}" for i in range(int(n_keys))]
    out["phase1_exit"] = fork_children(gate, int(n_children), effects_file, keys, errors_file)
    # Phase 2: the parent's own connection is open while children use and close the gate.
    d = gate.begin(effect_type="job.run", key="job:parent-1", payload={})
    gate.report(d, "committed", result="p1")
    out["phase2_exit"] = fork_children(gate, 2, effects_file,
                                       [f"job:phase2-{i}" for i in range(5)], errors_file)
    try:
        d = gate.begin(effect_type="job.run", key="job:parent-2", payload={})
        gate.report(d, "committed", result="p2")
        out["parent_after"] = gate.get("job:parent-2").state.value
    except Exception as err:
        out["parent_after"] = f"{type(err).__name__}: {err}"
    try:
        with open(errors_file) as f:
            out["errors"] = f.read()
    except FileNotFoundError:
        out["errors"] = ""
    gate.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
