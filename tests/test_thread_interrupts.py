"""An exception raised into a thread from outside (Temporal cancelling a sync activity,
``PyThreadState_SetAsyncExc``) lands wherever that thread is. Landing just after the store's
``BEGIN IMMEDIATE`` returned, it must not leave the thread's connection inside a write
transaction: that transaction would lock every other writer out and swallow, uncommitted, the
next reservation made on that thread (lost when the process dies: a second execution)."""

from __future__ import annotations

import ctypes
import sqlite3
import threading
import time
from pathlib import Path

import effectgate as eg

__all__: list[str] = []

POLICY = eg.Policy.from_dict({"effects": {"payment.*": {"budget": {"per_run_micros": 10**9}}}})


class Cancelled(Exception):
    """What the outside raises into the thread (Temporal's CancelledError is an Exception)."""


def _raise_into(thread: threading.Thread) -> None:
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident or 0),
                                                      ctypes.py_object(Cancelled))
    assert done == 1


def test_an_exception_raised_into_a_thread_waiting_on_begin_leaves_no_open_transaction(
        tmp_path: Path) -> None:
    db = tmp_path / "effects.db"
    gate = eg.Gate(f"sqlite:///{db}", policy=POLICY)
    try:
        gate.begin(effect_type="payment.warmup", key="warm:1", payload={})  # schema made
        other = sqlite3.connect(db, isolation_level=None, timeout=60, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # another worker holds the write lock a moment
        raised: list[BaseException] = []
        after: list[bool] = []

        def activity() -> None:
            try:
                gate.begin(effect_type="payment.refund", key="refund:T1", payload={},
                           estimated_cost_micros=1000, run_id="r")
            except BaseException as err:  # whatever reached the activity
                raised.append(err)
            # The same pool thread runs the next activity: its reservation must be durable.
            d = gate.begin(effect_type="email.send", key="email:E1", payload={})
            after.append(d.decision is eg.Decision.EXECUTE)
            gate.store.drop_thread_connection()  # the worker dies: an open transaction is lost

        thread = threading.Thread(target=activity)
        thread.start()
        time.sleep(0.4)  # inside BEGIN IMMEDIATE, waiting on the lock
        _raise_into(thread)  # delivered as soon as BEGIN IMMEDIATE returns
        time.sleep(0.1)
        other.execute("ROLLBACK")
        thread.join(30)
        assert raised and after == [True]
        probe = sqlite3.connect(db, isolation_level=None, timeout=2)
        probe.execute("BEGIN IMMEDIATE")  # nobody holds the write lock any more
        probe.execute("ROLLBACK")
        assert gate.get("email:E1").state is eg.State.IN_FLIGHT  # the reservation was kept
    finally:
        gate.close()
