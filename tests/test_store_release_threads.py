"""A reservation whose reply was lost, or whose async caller was cancelled, is released on a
thread of its own (``effectgate.store.abandoned``). Closing the store meanwhile waits for that
thread: closing the connection it reads on from another thread once crashed the process
(a segfault in ``test_model_replay``). The report a closing loop leaves to a thread:
``test_cancelled_begins``."""

from __future__ import annotations

import threading
import time
from typing import Any

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



def test_close_waits_for_a_thread_a_background_thread_starts_while_it_waits(
        gate: eg.Gate) -> None:
    """A background thread that starts another after :meth:`Store.close` began waiting: close
    waits for that one too (it once looked once, and let the second run on over the
    connections it closed). The first is still counted when it hands the second over."""
    store = gate.store
    closed = threading.Event()
    seen: list[bool] = []

    def second() -> None:
        time.sleep(0.3)  # long enough for a close() that did not wait to return
        seen.append(closed.is_set())

    def first() -> None:
        time.sleep(0.2)  # close() is waiting by now
        store.in_background("effectgate-second", second)

    store.in_background("effectgate-first", first)
    store.close()
    closed.set()
    for thread in threading.enumerate():
        if thread.name == "effectgate-second":
            thread.join(10)
    assert seen == [False]  # it ended before close() returned
    assert not store.background


def test_close_waits_for_a_thread_handed_over_but_not_started_yet(
        gate: eg.Gate, monkeypatch: Any) -> None:
    """A close() while :meth:`Store.in_background` has handed its thread over but the thread
    has not started yet: close waits for it to start and end (it once found nothing to join,
    or raised ``RuntimeError`` joining a thread not started, closing nothing)."""
    store = gate.store
    closed = threading.Event()
    seen: list[bool] = []
    real_start = threading.Thread.start

    def late_start(self: threading.Thread) -> None:
        if self.name == "effectgate-starting":
            threading.Timer(0.3, real_start, (self,)).start()
        else:
            real_start(self)

    monkeypatch.setattr(threading.Thread, "start", late_start)
    store.in_background("effectgate-starting", lambda: seen.append(closed.is_set()))
    store.close()
    closed.set()
    for thread in threading.enumerate():
        if thread.name == "effectgate-starting":
            thread.join(10)
    assert seen == [False]  # it ran before close() returned
