"""``effectgate console``: the web console (extra ``console``). Exit codes as in
:mod:`effectgate.cli._common`."""

from __future__ import annotations

import contextlib

import click

from ._common import Command, fail, gate_options, handle_errors, open_gate

__all__ = ["console"]


@click.command("console", cls=Command)
@gate_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Off localhost only with --tls-cert/--tls-key or "
                   "--insecure-bind.")
@click.option("--port", default=8765, show_default=True, type=int, help="Port (0: any free).")
@click.option("--tls-cert", default=None, metavar="PEM", help="TLS certificate (HTTPS).")
@click.option("--tls-key", default=None, metavar="PEM", help="The certificate's private key.")
@click.option("--insecure-bind", is_flag=True,
              help="Listen off localhost without TLS (only behind a TLS proxy you trust).")
@click.option("--sweep-interval", default=10.0, show_default=True,
              type=click.FloatRange(0, 86400),
              help="With webhooks: seconds between sweeps for leases that lapse with nobody "
                   "calling begin (their AMBIGUOUS webhook, once each); 0: no sweeping.")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="On localhost, also answer to this Host name (the one a reverse proxy on "
                   "this machine passes on); repeatable. Other names are refused (421).")
@handle_errors
def console(url: str | None, namespace: str, gate_ref: str | None, host: str, port: int,
            tls_cert: str | None, tls_key: str | None, insecure_bind: bool,
            sweep_interval: float, allow_hosts: tuple[str, ...]) -> None:
    """Serve the operators' web console: approvals, the AMBIGUOUS queue, effects, sagas,
    principals and the audit.

    Sign in with an operator's token (effectgate principals add NAME --role operator). Pass
    --gate MODULE:ATTR so Reconcile now and Unwind find your hooks and compensators. With
    webhooks ($EFFECTGATE_WEBHOOK_URL), it also announces leases that lapse unnoticed.
    On localhost it answers only to localhost's names (a page that DNS-rebinds its own name
    here is refused): behind a reverse proxy that passes the public Host on, --allow-host it."""
    try:
        from ..console import check_console_bind, serve
    except ImportError as err:
        fail(f'the console needs its extra: pip install "effectgate[console]" ({err})')
    check_console_bind(host, port, tls_cert=tls_cert, tls_key=tls_key,
                       insecure_bind=insecure_bind)  # before the store is opened
    with open_gate(url, namespace, gate_ref) as gate, contextlib.suppress(KeyboardInterrupt):
        serve(gate, host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
              insecure_bind=insecure_bind, sweep_interval=sweep_interval,
              allow_hosts=allow_hosts)
