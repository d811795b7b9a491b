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
    waits for that one too (it looked once, and let the second run on over the connections it
    closed). The first starts the second only once close has listed the threads."""
    store = gate.store
    listed, closed = threading.Event(), threading.Event()
    seen: list[bool] = []

    class Watched(set[threading.Thread]):
        def __iter__(self) -> Any:
            listed.set()  # only close() lists them
            return super().__iter__()

    store.background = Watched()

    def second() -> None:
        time.sleep(0.3)  # long enough for a close() that did not wait to return
        seen.append(closed.is_set())

    def first() -> None:
        listed.wait(10)
        store.in_background("effectgate-second", second)

    store.in_background("effectgate-first", first)
    store.close()
    closed.set()
    for thread in threading.enumerate():
        if thread.name == "effectgate-second":
            thread.join(10)
    assert seen == [False]  # it ended before close() returned
    assert not store.background


def test_close_waits_for_a_thread_listed_but_not_started_yet(gate: eg.Gate) -> None:
    """A close() on one thread while :meth:`Store.in_background` on another has listed its
    thread but not yet started it: close waits for it to start and end (``join`` on a thread
    not started raises ``RuntimeError``, which close() let out, closing nothing)."""
    store = gate.store
    closed = threading.Event()
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(closed.is_set()),
                              name="effectgate-starting")
    store.background.add(thread)  # as in_background does, just before it starts it
    starter = threading.Timer(0.3, thread.start)
    starter.start()
    store.close()
    closed.set()
    starter.join(10)
    thread.join(10)
    assert seen == [False]  # it ran before close() returned
