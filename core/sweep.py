"""Lapses nobody touches: find leases that lapsed with no ``begin`` to notice, mark each
AMBIGUOUS and announce it — once.

A lease lapses on the database's clock, and reads show the effect AMBIGUOUS at once; but the
AMBIGUOUS webhook was sent only by a ``begin`` that met the lapsed lease. A holder that died
with nobody retrying told no one. :func:`sweep_lapsed` finds such effects (IN_FLIGHT, lease
past, in the gate's namespace) and moves each to AMBIGUOUS with the same compare-and-set a
``begin`` uses (``Store.lapse``: state, id and token must be as read). Exactly one writer wins
each lapse — this sweeper, another sweeper in another process, or a ``begin`` — and only the
winner notifies, so a lapse is announced once however many sweepers and agents run on the
store. The lapsed holder's own late report still settles the effect afterwards, exactly as
after a ``begin`` noticed the lapse (the token is unchanged). A notification is then at least
once while the process lives (the webhook queue retries) and lost if it dies between the
compare-and-set and the delivery: the store stays the source of truth.

:class:`Sweeper` runs it every few seconds on a daemon thread (inside ``effectgate console``);
``effectgate watch`` runs it as a process of its own.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from .errors import ConfigError, EffectGateError
from .notices import AMBIGUOUS, Notice, Observer, notice

if TYPE_CHECKING:
    from .gate import Gate

__all__ = ["Sweeper", "gate_observer", "sweep_lapsed"]

log = logging.getLogger("effectgate")


def gate_observer(gate: Gate) -> Observer | None:
    """The observer the gate itself tells of events (its webhooks' ``notify``), or None when
    the gate has no webhooks."""
    hooks = gate.webhooks
    return None if hooks is None else hooks.notify


def sweep_lapsed(gate: Gate, notify: Observer | None = None, *,
                 limit: int = 500) -> list[Notice]:
    """Lapse and announce every IN_FLIGHT effect of the gate's namespace whose lease has
    passed (at most ``limit`` a call); the notices this call sent. ``notify``: where they go
    (default: the gate's webhooks; :class:`~effectgate.ConfigError` when it has none — a
    sweep that announces to nobody would only hide the lapses from the next one)."""
    from .store.queue import lapsed_in_flight

    observer = _observer(gate, notify)
    _check_limit(limit)
    store = gate.store
    sent: list[Notice] = []
    for row in lapsed_in_flight(store.engine, gate.namespace, limit):
        lapsed = store.lapse(row)
        if lapsed is None:  # a begin or another sweeper moved it first, and announced it
            continue
        log.info("lease lapsed: %s is AMBIGUOUS (found by the sweeper)", row.key,
                 extra={"key": row.key, "state": "ambiguous", "reason": "lease lapsed"})
        told = notice(AMBIGUOUS, lapsed, store, reason="lease lapsed")
        try:
            observer(told)
        except Exception as err:  # the lapse is recorded; one bad observer stops no sweep
            log.warning("sweeper: the observer failed on %s: %s", row.key, type(err).__name__)
        sent.append(told)
    return sent


def _observer(gate: Gate, notify: Observer | None) -> Observer:
    """``notify``, else the gate's webhooks; :class:`ConfigError` when there is nothing
    callable to tell."""
    observer = notify if notify is not None else gate_observer(gate)
    if observer is None or not callable(observer):
        raise ConfigError("nothing to notify: give the gate webhooks ($EFFECTGATE_WEBHOOK_URL "
                          "and $EFFECTGATE_WEBHOOK_SECRET) or pass notify=")
    return observer


def _check_limit(limit: object) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise ConfigError("limit must be a whole number from 1 to 10000")


class Sweeper:
    """:func:`sweep_lapsed` every ``interval`` seconds on a daemon thread, from :meth:`start`
    (the first sweep at once) until :meth:`stop`. A store that fails is logged and tried again
    at the next tick. Also a context manager. Its arguments are checked here, as
    :func:`sweep_lapsed` checks them (:class:`ConfigError`): a sweeper that could never
    sweep would otherwise only log its refusal at every tick."""

    def __init__(self, gate: Gate, notify: Observer | None = None, *,
                 interval: float = 10.0, limit: int = 500) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not (
                0.05 <= interval <= 86400):
            raise ConfigError("the sweep interval is from 0.05 to 86400 seconds")
        self.gate = gate
        self.notify = _observer(gate, notify)
        _check_limit(limit)
        self.interval = float(interval)
        self.limit = limit
        self.sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[Notice]:
        """One sweep; the notices it sent (none when the store failed: logged)."""
        try:
            found = sweep_lapsed(self.gate, self.notify, limit=self.limit)
        except EffectGateError as err:
            log.warning("sweeper: %s", err.message)
            return []
        self.sent += len(found)
        return found

    def _run(self) -> None:
        while True:
            self.run_once()
            if self._stop.wait(self.interval):
                return

    def start(self) -> Sweeper:
        """Start sweeping (once; a second call does nothing)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="effectgate-sweeper",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the sweep in progress."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self) -> Sweeper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
