"""``effectgate watch``: announce leases that lapse with nobody calling ``begin``.

Every ``--interval`` seconds it finds IN_FLIGHT effects of the namespace whose lease has
passed, marks each AMBIGUOUS (the compare-and-set a ``begin`` uses: one winner per lapse,
across every watcher, console and agent on the store) and sends the AMBIGUOUS webhook for
those it won, once each (:mod:`effectgate.sweep`). It prints one line per lapse it announced.
Needs webhooks: ``$EFFECTGATE_WEBHOOK_URL`` and ``$EFFECTGATE_WEBHOOK_SECRET``, or ``--gate``
naming a Gate made with ``webhooks=``. Exit codes as in :mod:`effectgate.cli._common`.
"""

from __future__ import annotations

import contextlib
import time

import click

from ._common import Command, fail, gate_options, handle_errors, open_gate
from ._safe import plain

__all__ = ["watch"]


@click.command("watch", cls=Command)
@gate_options
@click.option("--interval", default=10.0, show_default=True, type=click.FloatRange(0.05, 86400),
              help="Seconds between two sweeps.")
@click.option("--once", is_flag=True, help="Sweep once, wait for the webhooks, and exit.")
@handle_errors
def watch(url: str | None, namespace: str, gate_ref: str | None, interval: float,
          once: bool) -> None:
    """Send the AMBIGUOUS webhook for leases that lapse with nobody calling begin (once per
    lapse, however many watchers run). Runs until interrupted, or --once."""
    from ..notices import Notice
    from ..sweep import Sweeper, gate_observer

    with open_gate(url, namespace, gate_ref) as gate:
        hooks = gate.webhooks
        observer = gate_observer(gate)
        if observer is None or hooks is None:
            fail("nothing to notify: set $EFFECTGATE_WEBHOOK_URL and "
                 "$EFFECTGATE_WEBHOOK_SECRET, or pass --gate with a Gate made with webhooks=")
        forward = observer

        def announce(told: Notice) -> None:
            forward(told)
            click.echo(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\tlapsed\t"
                       f"{plain(told.key)}\teffect {told.effect_id}\tattempt {told.attempt}")

        sweeper = Sweeper(gate, announce, interval=interval)
        click.echo(f"effectgate: watching namespace {plain(gate.namespace)!s} for lapsed leases "
                   f"every {interval:g}s (webhooks to {hooks!r})", err=True)
        if once:
            sweeper.run_once()
            hooks.flush(10.0)
            return
        with contextlib.suppress(KeyboardInterrupt):
            sweeper.start()
            while True:
                time.sleep(3600)
        sweeper.stop()
        hooks.flush(5.0)
