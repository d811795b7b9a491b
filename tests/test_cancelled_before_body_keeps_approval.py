"""A human's yes is not used up by a call that never ran its body (red team, round 8).

An async gated call whose caller is cancelled while its ``begin`` is on its way lets the begin
finish (it cannot be taken back) and then settles what it reserved: the body never started.
It recorded FAILED, so an approved effect's approval was consumed for nothing: the next call
asked a person again (and every such cancel counted an attempt). The store already gave the
approval back when the cancel reached its own write (``abandoned.release``); the decorator now
settles the same way: the effect waits on its approval again, and the next call runs on it.
An effect without an approval is still recorded FAILED, as before. Both backends.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import effectgate as eg

ALWAYS = {"effects": {"t.appr": {"approval": "always"}}}


async def _cancel_while_beginning(call: Any) -> None:
    task = asyncio.ensure_future(call)
    await asyncio.sleep(0)  # the call is now waiting on its begin
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _settled(gate: eg.Gate, key: str) -> eg.EffectRecord:
    """The effect once the cancelled call has settled it (it is no longer IN_FLIGHT)."""
    for _ in range(500):
        record = await gate.aget(key)
        if record.state is not eg.State.IN_FLIGHT:
            return record
        await asyncio.sleep(0.02)
    raise AssertionError(f"{key} is still in flight")


def test_an_approved_call_cancelled_before_its_body_keeps_its_approval(make_gate: Any) -> None:
    gate = make_gate(policy=ALWAYS)
    ran: list[str] = []

    @gate.effect("k:{k}", effect_type="t.appr")
    async def tool(k: str) -> str:
        ran.append(k)
        return "done"

    async def main() -> None:
        with pytest.raises(eg.ApprovalRequired) as asked:
            await tool("a")
        approval_id = asked.value.approval_id
        gate.approve(approval_id, by="alice")
        await _cancel_while_beginning(tool("a"))
        record = await _settled(gate, "k:a")
        assert ran == []
        assert record.state is eg.State.PENDING_APPROVAL, record
        assert gate.approval(approval_id).state is eg.ApprovalState.APPROVED
        assert await tool("a") == "done"  # on the same yes: nobody is asked again
        assert ran == ["a"]
        assert gate.approval(approval_id).state is eg.ApprovalState.CONSUMED

    asyncio.run(main())


def test_a_plain_call_cancelled_before_its_body_is_failed_and_runs_next_time(
        make_gate: Any) -> None:
    gate = make_gate()
    ran: list[str] = []

    @gate.effect("k:{k}", effect_type="t.plain")
    async def tool(k: str) -> str:
        ran.append(k)
        return "done"

    async def main() -> None:
        await _cancel_while_beginning(tool("b"))
        record = await _settled(gate, "k:b")
        assert record.state is eg.State.FAILED and record.error is not None
        assert "cancelled before the body started" in record.error
        assert ran == []
        assert await tool("b") == "done"
        assert ran == ["b"]

    asyncio.run(main())
