"""Reservations whose async caller is gone: a ``begin`` cancelled while its reserving write
was on its way (a timeout around ``abegin``, the loop closing, "cancel all tasks").

The write cannot be taken back once sent. On a worker thread it runs on after its caller is
cancelled (unless no worker had started it: then it never runs, :meth:`Store.on_worker`);
over Postgres' native async connection the server may have committed it before the cancel
arrived. Either way the body never started, so such a reservation is released at
once, FAILED — never left to lapse into AMBIGUOUS, where it would wait for an operator:

* :func:`abandonable` runs a write on a worker thread and releases what it reserved if its
  caller was cancelled before taking the answer (decided under one lock: released by the
  worker once it is written, or by a thread of its own if it was written already);
* :func:`release_lost` reads the key back (twice: a cancel can reach the server after its
  commit) and releases the reservation if the row still holds that write's secret, IN_FLIGHT
  (the secret is this begin's alone: anyone acting since would have moved the row on).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..request import Lease
from ..states import Outcome, State
from .rows import EffectHead, Moved

if TYPE_CHECKING:
    from ..request import LeaseSecret
    from . import Store

__all__ = ["ABANDONED", "abandonable", "release", "release_lost"]

log = logging.getLogger("effectgate")
T = TypeVar("T")
ABANDONED = "cancelled before the body started"
_READ_AGAIN_AFTER = 1.0  # seconds: long enough for a cancel that lost the race to its commit


class _Pending:
    __slots__ = ("done", "gone", "lock", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = self.gone = False
        self.value: Any = None


async def abandonable(store: Store, secret: LeaseSecret, write: Callable[[], T]) -> T:
    """``write`` (one that may reserve an effect with ``secret``) on a worker thread
    (:meth:`Store.on_worker`: a close waits for it, the release too), its answer awaited; a
    reservation it makes for a caller cancelled meanwhile is released."""
    pending = _Pending()

    def write_unless_abandoned() -> T:
        value = write()
        with pending.lock:
            pending.value, pending.done, gone = value, True, pending.gone
        if gone:
            release(store, secret, value)
        return value

    try:
        return await store.on_worker(write_unless_abandoned)
    except asyncio.CancelledError:
        with pending.lock:
            pending.gone, done, value = True, pending.done, pending.value
        if done:  # written before the cancel, never taken: release it off the loop
            _in_thread(release, store, secret, value)
        raise


def release(store: Store, secret: LeaseSecret, value: Any, error: str = ABANDONED) -> bool:
    """Record FAILED (with ``error``) the reservation ``value`` (a reserve's row or a move's)
    holds with ``secret``, if it holds one; whether it did. Never raises: at worst the lease
    lapses."""
    row = value.row if isinstance(value, Moved) else value
    if not (isinstance(row, EffectHead) and row.state is State.IN_FLIGHT
            and secret.issued and row.lease_secret == secret.hash):
        return False
    try:
        # A move that consumed a human's approval gives it back: the body never ran, and the
        # yes is never asked for twice.
        if row.approval_id is not None and store.unconsume(row, error):
            log.info("released %s: %s (its approval stands)", row.key, error,
                     extra={"key": row.key})
            return True
        done = store.record_outcome(
            row.namespace, Lease(row.key, row.token, secret.raw), Outcome.FAILED, result=None,
            error=error, reason=None, note=None, actual_cost_micros=None, spends=None)
    except Exception as err:  # the lease lapses to AMBIGUOUS instead: safe, only slower
        log.warning("could not release %s (%s): %s", row.key, error, err)
        return False
    if done is not None:
        log.info("released %s: %s", row.key, error, extra={"key": row.key})
    return done is not None


def release_lost(store: Store, namespace: str, key: str, secret: LeaseSecret,
                 error: str = ABANDONED) -> None:
    """On a thread of its own: release the reservation a write of ``key`` with ``secret``,
    already sent, may have committed, though its caller never got (or never took) the answer:
    a cancelled native-async write, or a ``begin`` that lost the reply and could not read the
    key back."""
    if secret.issued:
        _in_thread(_read_and_release, store, namespace, key, secret, error)


def _read_and_release(store: Store, namespace: str, key: str, secret: LeaseSecret,
                      error: str) -> None:
    for wait in (0.0, _READ_AGAIN_AFTER):
        time.sleep(wait)
        try:
            row = store.fetch(namespace, key)
        except Exception:
            continue  # the store may be back by the second look
        if row is not None and release(store, secret, row, error):
            return


def _in_thread(fn: Callable[..., Any], store: Store, *args: Any) -> None:
    """Run ``fn(store, *args)`` on a thread of its own (:meth:`Store.in_background`)."""
    store.in_background("effectgate-release", lambda: fn(store, *args))
