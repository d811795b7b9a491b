"""A reservation whose reply was lost, or whose async caller was cancelled, is released on a
thread of its own (``effectgate.store.abandoned``). Closing the store meanwhile waits for that
thread: closing the connection it reads on from another thread once crashed the process
(a segfault in ``test_model_replay``). The report a closing loop leaves to a thread:
``test_cancelled_begins``."""

from __future__ import annotations

import threading

import effectgate as eg
from effectgate.request import LeaseSecret
from effectgate.store.abandoned import release_lost


def test_close_waits_for_a_release_thread_still_reading(gate: eg.Gate) -> None:
    store = gate.store
    before = set(threading.enumerate())
    release_lost(store, gate.namespace, "never:written", LeaseSecret("a" * 32))
    [thread] = [t for t in threading.enumerate() if t not in before]
    assert thread.name == "effectgate-release" and thread.is_alive()  # it reads twice, 1 s apart
    gate.close()
    assert not thread.is_alive()
    assert not store.background


def test_a_release_thread_that_ended_is_forgotten(gate: eg.Gate) -> None:
    store = gate.store
    before = set(threading.enumerate())
    release_lost(store, gate.namespace, "never:written", LeaseSecret("b" * 32))
    [thread] = [t for t in threading.enumerate() if t not in before]
    thread.join(10)
    assert not thread.is_alive() and not store.background
    assert store.fetch(gate.namespace, "never:written") is None  # it found none, wrote none

