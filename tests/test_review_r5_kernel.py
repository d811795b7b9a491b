"""Round-5 kernel review: the async face's finalizer for a gone event loop never waits on
the pool's own lock."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest

import effectgate as eg

from .conftest import PG_URL, TEST_PREFIX, require_postgres


def test_a_gone_loop_s_finalizer_never_waits_on_its_pool_lock_held_by_its_own_thread() -> None:
    """A collection can run inside ``_taken_idle`` (``Store.close`` closing idle
    connections: an allocation under the pool's lock) and collect the loop of that very
    pool: its finalizer then ran on the thread holding the (non-reentrant) lock and waited
    for it forever — ``close()`` hung. It now leaves the pool to the holder, which is
    closing those connections anyway."""
    require_postgres()
    with eg.Gate(PG_URL, namespace=f"{TEST_PREFIX}finalize", policy=False) as gate:
        astore = gate.store.async_face()
        loop = asyncio.new_event_loop()
        loop.run_until_complete(astore.fetch(f"{TEST_PREFIX}finalize", "nothing"))
        pool = astore._pools[loop]
        assert len(pool.idle) == 1
        done = threading.Event()

        def collect_under_the_lock(held: list[Any]) -> None:
            with pool.lock:  # as _taken_idle holds it while it allocates
                held.clear()  # the last reference to the loop goes here
                gc.collect()
            done.set()

        loop.close()
        held = [loop]
        del loop
        worker = threading.Thread(target=collect_under_the_lock, args=(held,), daemon=True)
        worker.start()
        assert done.wait(5), "the finalizer waited on a lock its own thread holds"
        # The holder closes them (as _taken_idle's caller does); nothing was lost.
        with pool.lock:
            taken, pool.idle = pool.idle, []
        for conn in taken:
            conn.pgconn.finish()


@pytest.fixture(autouse=True)
def _no_leftover_loop() -> Any:
    yield
    gc.collect()
