"""Red team, round 6, the async paths: a direct ``abegin`` whose reserving write waits on a
lock on Postgres and is cancelled twice (two cancels in a row, or anyio's cancel scope, which
cancels again on every turn of the loop). psycopg then gives up on its own cancel and closes
the connection, and the statement still running on the server commits after the caller's
release has stopped looking. Real Postgres, real locks."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

import effectgate as eg

from .test_cancelled_begins import _settled, write_lock

# psycopg's native async connection: Postgres only, on a schema of its own (the lock below
# must not hold up the rest of the suite's writes).
_POSTGRES_ONLY = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


@_POSTGRES_ONLY
def test_a_reservation_cancelled_twice_while_it_waits_on_a_lock_is_released(
        own_store_url: str) -> None:
    """A begin whose reserving write waits on a lock is cancelled, and cancelled again while
    psycopg is sending the server its cancel request (a timeout, then a TaskGroup or the
    closing loop): psycopg gives up on the connection and the statement, still waiting on the
    server, commits once the lock goes, after the caller's release looked for it (twice in
    its first second) and gave up. The reservation must still be released FAILED, not left
    IN_FLIGHT for nobody, to lapse into AMBIGUOUS and wait for an operator."""
    gate = eg.Gate(own_store_url, policy=False)
    key = "refund:twice"

    async def main() -> None:
        task = asyncio.create_task(gate.abegin(effect_type="payment.refund", key=key,
                                               payload={"txn": key}))
        await asyncio.sleep(0.3)  # sent: it waits behind the lock
        task.cancel()
        await asyncio.sleep(0)  # psycopg is now sending the server its cancel request
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        with write_lock(gate, 2.5):
            asyncio.run(main())
        time.sleep(0.5)  # the orphaned statement has had its chance to commit
        record = _settled(gate, key)
    finally:
        gate.close()
    assert record is None or record.state is eg.State.FAILED, record


@_POSTGRES_ONLY
def test_an_anyio_cancel_scope_around_a_waiting_reservation_leaves_it_released(
        own_store_url: str) -> None:
    """The same under anyio (the MCP server's tool calls run in its task groups, and a client's
    ``notifications/cancelled`` cancels one): anyio delivers a scope's cancellation again on
    every turn of the loop until the task leaves it, so psycopg's own cancel of a reservation
    waiting on a lock is interrupted as a rule, not by chance."""
    import anyio

    gate = eg.Gate(own_store_url, policy=False)
    key = "refund:scope"

    async def main() -> None:
        with anyio.move_on_after(0.3):
            await gate.abegin(effect_type="payment.refund", key=key, payload={"txn": key})

    try:
        with write_lock(gate, 2.5):
            anyio.run(main)
        time.sleep(0.5)
        record = _settled(gate, key)
    finally:
        gate.close()
    assert record is None or record.state is eg.State.FAILED, record
