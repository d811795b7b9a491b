"""Programs the multi-process tests run as separate OS processes, and how tests start and stop
them (each in its own process group, so cleanup also reaches the processes they fork)."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["TIMEOUT", "WORKERS", "executions", "spawn", "stop"]

WORKERS = Path(__file__).parent
TIMEOUT = 180.0  # generous: other suites share the machine's two cores


def spawn(script: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """Start ``python tests/workers/<script> args...`` with pipes, in a new process group."""
    return subprocess.Popen(
        [*prefix, sys.executable, str(WORKERS / script), *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def stop(procs: list[subprocess.Popen[str]]) -> None:
    """Kill what is left of each worker's process group (a hung run's forked children too)."""
    for proc in procs:
        if proc.returncode is None:  # not reaped yet, so its group id is still ours
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=TIMEOUT)


def executions(effects_file: Path) -> collections.Counter[str]:
    """How many times each key's side effect happened: the first word of each line."""
    lines = effects_file.read_text().splitlines() if effects_file.exists() else []
    return collections.Counter(line.split()[0] for line in lines)
