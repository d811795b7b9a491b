"""Listening sockets for the servers effectgate runs (the console, ``mcp serve``, the
gateway): which hosts are loopback, the names a client may call a loopback server by, and a
listening socket with errors a person can act on."""

from __future__ import annotations

import ipaddress
import socket

from .errors import ConfigError

__all__ = ["LOOPBACK_NAMES", "is_loopback", "listen", "loopback_host_names"]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""The names every loopback server answers to in a request's ``Host`` header."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``): where a
    server may listen without authentication or TLS."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_host_names(host: str) -> tuple[str, ...]:
    """The names (no port) a client may put in its ``Host`` header to reach a server listening
    on ``host``: ``host`` itself (an IPv6 address in brackets, as given and in its short form)
    and :data:`LOOPBACK_NAMES`. Empty when ``host`` is not loopback (:func:`is_loopback`): a
    server there is reached by names this machine cannot know."""
    if not is_loopback(host):
        return ()
    names: list[str] = []
    if host != "localhost":
        bare = host.strip("[]")
        address = ipaddress.ip_address(bare)
        names = [f"[{form}]" if address.version == 6 else form
                 for form in (bare, address.compressed)]
    return tuple(dict.fromkeys([*names, *LOOPBACK_NAMES]))


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
