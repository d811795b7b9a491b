"""The built-in classifiers against real HTTP clients (httpx, requests) and real loopback sockets.

FAILED only where no byte of the request can have left (connection refused, DNS failure);
AMBIGUOUS where the server may have acted (no reply before the read timeout, a connection
closed before or in the middle of the reply). Proxies from the environment are ignored so the
requests really go where the test sends them.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import requests

import effectgate as eg

READ_TIMEOUT = 0.3


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.request.recv(65536)  # the whole request has arrived: the server could act on it
        mode = self.server.mode
        if mode == "silent":
            self.server.release.wait(30)
        elif mode == "close_mid_reply":
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"refund")
        # "close_before_reply" and the others: close without a word


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = mode
        self.release = threading.Event()


@pytest.fixture
def serve() -> Iterator[Callable[[str], str]]:
    """Start a loopback HTTP server that misbehaves in the given way; returns its URL."""
    servers: list[_Server] = []

    def start(mode: str) -> str:
        server = _Server(mode)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/refunds"

    yield start
    for server in servers:
        server.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def refused_url() -> str:
    """A loopback port with nothing listening: the kernel refuses the connection."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/refunds"


DNS_FAILURE = "http://effectgate-does-not-exist.invalid/refunds"  # RFC 6761: never resolves


def _httpx(url: str) -> None:
    with httpx.Client(trust_env=False, timeout=READ_TIMEOUT) as client:
        client.post(url, json={"txn_id": "t1"})


def _requests(url: str) -> None:
    with requests.Session() as session:
        session.trust_env = False
        session.post(url, json={"txn_id": "t1"}, timeout=READ_TIMEOUT)


def _httpx2(url: str) -> None:
    httpx2 = pytest.importorskip("httpx2")
    with httpx2.Client(trust_env=False, timeout=READ_TIMEOUT) as client:
        client.post(url, json={"txn_id": "t1"})


CLIENTS = {"httpx": _httpx, "requests": _requests, "httpx2": _httpx2}


def _raised(call: Callable[[str], None], url: str) -> BaseException:
    with pytest.raises(Exception) as info:
        call(url)
    return info.value


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_connection_refused_is_failed(client: str, refused_url: str) -> None:
    err = _raised(CLIENTS[client], refused_url)
    assert eg.classify(err) is eg.Outcome.FAILED, repr(err)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_dns_failure_is_failed(client: str) -> None:
    err = _raised(CLIENTS[client], DNS_FAILURE)
    assert eg.classify(err) is eg.Outcome.FAILED, repr(err)


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("mode", ["silent", "close_before_reply", "close_mid_reply"])
def test_server_that_got_the_request_and_gave_no_full_reply_is_ambiguous(
    client: str, mode: str, serve: Callable[[str], str]
) -> None:
    """A read timeout, a connection closed before the reply, or in the middle of it: the
    server had the whole request and may have acted."""
    err = _raised(CLIENTS[client], serve(mode))
    assert eg.classify(err) is eg.Outcome.AMBIGUOUS, repr(err)
    if mode == "silent":
        assert "timeout" in type(err).__name__.lower() or "Timeout" in repr(err)


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("mode", ["silent", "close_before_reply", "close_mid_reply"])
def test_a_sent_request_after_a_refused_fallback_is_still_ambiguous(
    client: str, mode: str, serve: Callable[[str], str], refused_url: str
) -> None:
    """The common fallback: the primary refuses the connection, the body catches that and
    sends to a second host, which gets the request and gives no full reply. The error raised
    carries the handled refusal as its ``__context__`` only: that is not what happened to the
    request in flight (it reached the server), so the outcome is not FAILED."""
    call = CLIENTS[client]

    def with_fallback(url: str) -> None:
        try:
            call(refused_url)
        except Exception:
            call(url)

    err = _raised(with_fallback, serve(mode))
    assert err.__context__ is not None  # the handled refusal rides along
    assert eg.classify(err) is eg.Outcome.AMBIGUOUS, repr(err)


def test_user_classifier_is_asked_first() -> None:
    err = httpx.ConnectError("refused")
    assert eg.classify(err, [lambda e: eg.Outcome.AMBIGUOUS]) is eg.Outcome.AMBIGUOUS
    assert eg.classify(err, [lambda e: None]) is eg.Outcome.FAILED
    assert eg.classify(ValueError("anything else")) is eg.Outcome.AMBIGUOUS


def test_gated_http_calls_record_what_the_client_knows(
    gate: eg.Gate, refused_url: str, serve: Callable[[str], str]
) -> None:
    """Through the decorator, on both backends: for an effect with a vendor key a refused
    connection is FAILED and the next call runs again (attempt 2, under the same vendor key);
    a server that never replies leaves the effect AMBIGUOUS and the next call is refused
    without sending anything."""
    silent = serve("silent")
    sent: list[str] = []
    targets = {"r1": refused_url, "r2": silent}

    @gate.effect("refund:{txn_id}", effect_type="payment.refund", vendor="stripe")
    def refund(txn_id: str) -> Any:
        sent.append(txn_id)
        _httpx(targets[txn_id])

    with pytest.raises(httpx.ConnectError):
        refund("r1")
    assert gate.get("refund:r1").state is eg.State.FAILED
    targets["r1"] = silent
    with pytest.raises(httpx.ReadTimeout):
        refund("r1")  # the retry is allowed: attempt 2, which times out
    record = gate.get("refund:r1")
    assert record.state is eg.State.AMBIGUOUS and record.attempt == 2
    assert "ReadTimeout" in (record.error or "")
    with pytest.raises(eg.EffectAmbiguous):
        refund("r1")
    assert sent == ["r1", "r1"]


async def test_async_httpx_call_classified_the_same(gate: eg.Gate, refused_url: str,
                                                    serve: Callable[[str], str]) -> None:
    closing = serve("close_mid_reply")

    @gate.effect("email:{msg}", effect_type="email.send", vendor="generic")
    async def send(msg: str, url: str) -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            await client.post(url, json={"msg": msg})

    with pytest.raises(httpx.ConnectError):
        await send("m1", refused_url)
    assert (await gate.aget("email:m1")).state is eg.State.FAILED
    with pytest.raises(httpx.RemoteProtocolError):
        await send("m2", closing)
    assert (await gate.aget("email:m2")).state is eg.State.AMBIGUOUS
