"""A forked child starts its store's count of worker calls afresh, exactly at the fork (in the
forking thread, before ``fork()`` returns: the only thread the child has), never lazily from
whichever thread comes first. Lazily, two threads of the child could both find the count
stale, both start it afresh, and lose one's call: that child's ``close()`` would then not
wait for a write still running on a worker, and could close the connection under it."""

from __future__ import annotations

import os
import select
import threading
import time
from typing import Any

import effectgate as eg
from effectgate.store import workers


def _in_child(check: Any) -> str:
    """Fork; run ``check()`` in the child (its answer, or its error's text) and hand the text
    back to the parent through a pipe; the child never returns to pytest."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            text = str(check())
        except BaseException as err:  # reported to the parent, whatever it is
            text = f"error: {type(err).__name__}: {err}"
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 60)
        assert ready, "the child did not answer within 60 s"
        return os.read(read, 4096).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def test_two_threads_of_a_child_handing_calls_at_once_both_count(gate: eg.Gate) -> None:
    """The window a lazy reset leaves between its check and its reset is held open (each
    reset waits a moment first): both threads' calls must still be counted."""
    calls = gate.store._worker_calls

    def check() -> str:
        fresh = workers.WorkerCalls._reset

        def slow_reset(self: workers.WorkerCalls) -> None:
            time.sleep(0.2)  # two threads that both found the count stale are both here
            fresh(self)

        workers.WorkerCalls._reset = slow_reset  # type: ignore[method-assign]
        tickets: list[list[int]] = []

        def hand() -> None:
            tickets.append(calls.handed())

        threads = [threading.Thread(target=hand) for _ in range(2)]
        for thread in threads:
            thread.start()
            time.sleep(0.05)
        for thread in threads:
            thread.join()
        return f"{len(tickets)} {calls._total}"

    assert _in_child(check) == "2 2"


def test_a_child_does_not_wait_for_its_parents_calls(gate: eg.Gate) -> None:
    """A call the parent had handed to a worker when it forked is the parent's: the child's
    count starts at nothing, and its close does not wait for a call it will never see end."""
    calls = gate.store._worker_calls
    ticket = calls.handed()  # the parent's call, handed and not yet started
    try:
        def check() -> str:
            counted = calls._total
            deadline = time.monotonic() + 60
            with calls.quiet(deadline):  # what close() waits in: the child has nothing to wait for
                waited_out = time.monotonic() >= deadline
            return f"{counted} {waited_out}"

        assert _in_child(check) == "0 False"
        assert calls._total == 1  # the parent's count is its own
    finally:
        calls.withdraw(ticket)
    assert calls._total == 0
