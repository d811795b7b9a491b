"""Listening sockets for the servers effectgate runs (the console, ``mcp serve``, the
gateway): which hosts are loopback, and a listening socket with errors a person can act on."""

from __future__ import annotations

import ipaddress
import socket

from .errors import ConfigError

__all__ = ["is_loopback", "listen"]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``): where a
    server may listen without authentication or TLS."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one. :class:`ConfigError`
    when the host cannot be resolved or the address cannot be bound."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise ConfigError(f"cannot resolve --host {host!r}: {err}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    return sock
