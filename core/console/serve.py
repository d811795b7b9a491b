"""Where the console may listen, and serving it with uvicorn.

Localhost by default. Any other address only with TLS settings (a certificate and its key)
or an explicit ``insecure_bind``: off localhost a session cookie or an operator's token would
otherwise cross the network in clear. Cookies are marked ``Secure`` whenever the console is
served over TLS or off localhost.

While it serves, the console also sweeps for leases that lapse with nobody calling ``begin``
(:class:`effectgate.sweep.Sweeper`, every ``sweep_interval`` seconds) and sends their
AMBIGUOUS webhook, when the gate has webhooks; every console and ``effectgate watch`` on the
store may sweep at once, and each lapse is still announced once.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, TextIO

from ..errors import ConfigError
from ..net import is_loopback, listen

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..gate import Gate

__all__ = ["check_console_bind", "serve"]


def check_console_bind(host: str, port: int, *, tls_cert: str | None = None,
                       tls_key: str | None = None, insecure_bind: bool = False) -> bool:
    """Refuse (:class:`~effectgate.ConfigError`) an address the console must not listen on;
    return whether its cookies must be ``Secure``."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"--port must be 0..65535, not {port!r}")
    if not isinstance(host, str) or not host.strip() or any(ord(c) < 33 for c in host):
        raise ConfigError(f"--host must be an address or a host name, not {host!r}")
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    for path in (tls_cert, tls_key):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"no such file: {path}")
    tls = tls_cert is not None
    if not is_loopback(host) and not tls and not insecure_bind:
        raise ConfigError(
            f"refusing to listen on {host!r} without TLS: off localhost an operator's token "
            "and session would cross the network in clear. Give --tls-cert and --tls-key, "
            "listen on 127.0.0.1, or pass --insecure-bind if a TLS proxy you trust fronts it.")
    return tls or not is_loopback(host)


def serve(gate: Gate, *, host: str = "127.0.0.1", port: int = 8765,
          tls_cert: str | None = None, tls_key: str | None = None,
          insecure_bind: bool = False, out: TextIO | None = None,
          sweep_interval: float = 10.0, allow_hosts: Sequence[str] = ()) -> None:
    """Serve the console for ``gate`` until interrupted; print where it listens. With
    webhooks on the gate, sweep for lapsed leases every ``sweep_interval`` seconds (0: not).
    On loopback it answers only to loopback host names and ``allow_hosts`` (the name a
    reverse proxy on this machine passes on in ``Host``; see :func:`build_app`)."""
    import uvicorn

    from ..sweep import Sweeper, gate_observer
    from .routes import build_app

    out = out if out is not None else sys.stderr
    secure = check_console_bind(host, port, tls_cert=tls_cert, tls_key=tls_key,
                                insecure_bind=insecure_bind)
    app = build_app(gate, secure_cookies=secure, host=host, allow_hosts=allow_hosts)
    sweeper = None
    if sweep_interval and gate_observer(gate) is not None:
        sweeper = Sweeper(gate, interval=sweep_interval)
        print(f"effectgate: sweeping for lapsed leases every {sweep_interval:g}s (their "
              "AMBIGUOUS webhook, once each)", file=out, flush=True)
    sock = listen(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    scheme = "https" if tls_cert else "http"
    print(f"effectgate: console listening on {scheme}://{shown}:{bound_port}/ "
          f"(namespace {gate.namespace!r}; sign in with an operator's token)", file=out,
          flush=True)
    config = uvicorn.Config(app, log_level="warning",
                            lifespan="off", access_log=False, ssl_certfile=tls_cert,
                            ssl_keyfile=tls_key)
    try:
        if sweeper is not None:
            sweeper.start()
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if sweeper is not None:
            sweeper.stop()
        sock.close()
