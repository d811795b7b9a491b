"""The call a 2026-07-28 client re-issues after a broken stream runs at most once.

On 2026-07-28 streamable HTTP a broken response stream is the request's cancellation, and the
client MUST re-issue the request as a new one (SEP-2575): the server sees the same call twice,
the first one cancelled midway.

* ``mcp serve``: ``begin_effect`` reserves in a shielded step (:func:`begin_unlost`). If the
  request is cancelled before its answer left, the agent never received the lease, so it
  cannot have acted: an ``execute`` is released as FAILED ("the answer never reached the
  agent"), and the re-issued call is answered ``execute`` again (the next attempt) instead of
  ``in_flight`` and, after the lease, ``blocked``.
* the gateway: a gated call of a 2026-07-28 client runs detached from the request
  (:func:`detached`): once sent upstream it finishes, holding and heartbeating the lease, and
  its outcome is recorded whether or not the client is still there. A re-issued call with the
  same arguments joins that execution while it runs (the twins of one process) or is answered
  from the store afterwards: never a second upstream call, and no AMBIGUOUS left by a
  cancellation that only meant "the stream broke".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

import effectgate as eg

__all__ = ["NEVER_REACHED", "begin_unlost", "detached"]

log = logging.getLogger("effectgate")
T = TypeVar("T")

NEVER_REACHED = "the answer never reached the agent: its request was cancelled (broken stream)"


async def begin_unlost(gate: eg.Gate, fields: dict[str, Any]) -> eg.BeginDecision:
    """``gate.abegin(**fields)`` that cannot lose its answer to a cancellation: the begin
    finishes shielded, and when the request was cancelled meanwhile an ``execute`` is
    released as FAILED before the cancellation goes on."""
    with anyio.CancelScope(shield=True):
        d = await gate.abegin(**fields)
    try:
        await anyio.lowlevel.checkpoint()
    except anyio.get_cancelled_exc_class():
        if d.decision is eg.Decision.EXECUTE:
            with anyio.CancelScope(shield=True):
                try:
                    await gate.areport(d, eg.Outcome.FAILED, error=NEVER_REACHED)
                except eg.EffectGateError as err:  # it lapses to AMBIGUOUS, as before
                    log.warning("could not release %s: %s", d.key, err.message)
        raise
    return d


async def detached(tg: anyio.abc.TaskGroup, work: Callable[[], Awaitable[T]]) -> T:
    """``await work()`` run as a task of ``tg`` (the server's own), so that cancelling the
    caller (the client's request) does not cancel it; the caller gets its answer or error."""
    done = anyio.Event()
    box: dict[str, Any] = {}

    async def run() -> None:
        try:
            box["value"] = await work()
        except Exception as err:
            box["error"] = err
        finally:
            done.set()

    tg.start_soon(run)
    await done.wait()
    if "error" in box:
        raise box["error"]
    if "value" not in box:  # the server is stopping: its task group was cancelled
        raise ConnectionError("the server stopped during the call")
    return box["value"]  # type: ignore[no-any-return]
