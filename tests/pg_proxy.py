"""A loopback TCP proxy to Postgres that can go silent, for the tests of connect timeouts and
of connections the server closed (``tests/test_pg_connect_timeout.py``,
``tests/test_pg_read_reconnect.py``)."""

from __future__ import annotations

import contextlib
import socket
import threading


class WedgingProxy:
    """A loopback TCP proxy to ``target`` (None: to nowhere) that, once wedged (or always,
    without a target), accepts each new connection and never sends a byte on it: a server
    that cannot be reached, whose client waits out its connect timeout. :meth:`wedge` also
    cuts every connection open through it, as a restart does; ``wedged_attempts`` counts the
    connections accepted and left silent."""

    def __init__(self, target: tuple[str, int] | None) -> None:
        self.target = target
        self.wedged = threading.Event()
        self.wedged_attempts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
                if self.target is None or self.wedged.is_set():
                    self.wedged_attempts += 1
                    continue  # held open, silent
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets.append(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(src, dst), daemon=True).start()

    def wedge(self) -> None:
        """From now on, silent; and every connection open through it cut (each end sees it
        closed, as after a server restart)."""
        with self._lock:
            self.wedged.set()
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def url(self, query: str = "", password: str = "") -> str:
        """The test database's URL, through this proxy."""
        login = f"postgres:{password}" if password else "postgres"
        return f"postgresql+psycopg://{login}@127.0.0.1:{self.port}/test{query}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
