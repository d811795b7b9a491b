"""Hostile input at the MCP transports, for ``mcp serve`` and the gateway alike, as real
processes on a real store: an HTTP body over the mcp SDK's limit (its session manager's
``max_request_body_size``, 4 MiB by default: effectgate keeps it) is 413 whether it says its
length or streams it chunked, and a stdio line with invalid UTF-8 is a -32700 parse error, never
replaced with U+FFFD (two calls differing only in their bad bytes would share a key, and the
second be answered as the first's duplicate). Neither reaches a tool or writes to the store,
and the server goes on serving."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE as MAX_BODY_BYTES

from .mcp_helpers import SharedUpstream, serving, stop, tag
from .test_mcp_gateway import UPSTREAM, Upstream, scoped

CLI = [sys.executable, "-m", "effectgate.cli"]
VERSION = "2025-06-18"
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": VERSION, "capabilities": {},
    "clientInfo": {"name": "probe", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    return Upstream(tmp_path)


def serve_argv(store_url: str, namespace: str, *extra: str) -> list[str]:
    return [*CLI, "mcp", "serve", "--url", store_url, "--namespace", namespace, *extra]


def gateway_argv(upstream: Upstream, store_url: str, namespace: str, *extra: str,
                 target: str = UPSTREAM) -> list[str]:
    return [*CLI, "mcp", "gateway", "--upstream", target, "--url", store_url, "--namespace",
            namespace, "--policy", str(upstream.policy), *extra]


def begin(request_id: int, key: bytes) -> bytes:
    """A ``begin_effect`` call of ``mcp serve`` whose key is the raw bytes ``key``."""
    return (b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"begin_effect",'
            b'"arguments":{"effect_type":"email.send","key":"' % request_id
            + key + b'","payload":{"to":"x"}}}}')


def send_message(request_id: int, text: bytes, to: str = "+1") -> bytes:
    """A gated ``send_message`` call through the gateway whose text is the raw bytes ``text``."""
    return (b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"send_message",'
            b'"arguments":{"to":"%s","text":"' % (request_id, to.encode()) + text + b'"}}}')


class Stdio:
    """A server process spoken to in raw bytes on stdin, its stdout read line by line."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def answer(self, request_id: int | None, timeout: float = 60) -> dict[str, Any]:
        """The next message on stdout that answers ``request_id`` (notifications skipped)."""
        while True:
            message = json.loads(self.lines.get(timeout=timeout))
            if "method" not in message and message.get("id") == request_id:
                return message  # type: ignore[no-any-return]

    def ask(self, line: bytes, request_id: int | None) -> dict[str, Any]:
        self.send(line)
        return self.answer(request_id)


@contextmanager
def stdio(argv: list[str], env: dict[str, str] | None = None) -> Iterator[Stdio]:
    """``argv`` over stdio, initialized."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env or dict(os.environ))
    try:
        server = Stdio(proc)
        assert "result" in server.ask(json.dumps(INIT).encode(), 0)
        server.send(json.dumps(INITIALIZED).encode())
        yield server
    finally:
        stop(proc, close_stdin=True)


def assert_parse_error(answer: dict[str, Any], request_id: int | None) -> None:
    assert answer.get("id") == request_id and "result" not in answer, answer
    assert answer["error"]["code"] == -32700, answer


BAD_UTF8 = [b"\xff", b"\xfe", b"\xc0\xa2", b"\xed\xa0\x80", b"\xe2\x82"]
"""A stray byte, an overlong form, an encoded surrogate, a cut sequence."""


def test_invalid_utf8_on_stdio_is_a_parse_error_and_never_reaches_a_tool(
        store_url: str, namespace: str) -> None:
    with stdio(serve_argv(store_url, namespace)) as server:
        for at, bad in enumerate(BAD_UTF8):
            first, second = 2 * at + 1, 2 * at + 2  # two keys U+FFFD would have merged
            assert_parse_error(server.ask(begin(first, b"mail:" + bad), first), first)
            line = begin(second, b"mail:" + bad + b"\xfd")
            assert_parse_error(server.ask(line, second), second)
        with eg.Gate(store_url, namespace=namespace) as gate:
            assert gate.list_effects() == []
        answer = server.ask(begin(99, b"mail:ok"), 99)
        assert answer["result"]["isError"] is False, answer
    with eg.Gate(store_url, namespace=namespace) as gate:
        assert [e.key for e in gate.list_effects()] == ["mail:ok"]


def test_invalid_utf8_in_the_id_is_answered_with_a_null_id(
        store_url: str, namespace: str) -> None:
    with stdio(serve_argv(store_url, namespace)) as server:
        line = begin(7, b"mail:1").replace(b'"id":7', b'"id":"r\xff"')
        assert_parse_error(server.ask(line, None), None)
        assert server.ask(b'{"jsonrpc":"2.0","id":8,"method":"ping"}', 8)["result"] == {}
    with eg.Gate(store_url, namespace=namespace) as gate:
        assert gate.list_effects() == []


def test_invalid_utf8_through_the_gateway_on_stdio_is_a_parse_error(
        upstream: Upstream, shared_upstream: SharedUpstream, store_url: str,
        namespace: str) -> None:
    to, target = f"+1-{tag()}", shared_upstream.url
    with stdio(gateway_argv(upstream, store_url, namespace, target=target)) as gateway:
        assert_parse_error(gateway.ask(send_message(1, b"hi\xff", to), 1), 1)
        assert_parse_error(gateway.ask(send_message(2, b"hi\xfe", to), 2), 2)
        with eg.Gate(store_url, namespace=namespace) as gate:
            assert gate.list_effects() == []
        assert shared_upstream.lines(to) == []
        answer = gateway.ask(send_message(3, b"hi", to), 3)
        assert answer["result"].get("isError") is not True, answer
    assert shared_upstream.lines(to) == [f"sms:{to}:hi"]
    with eg.Gate(store_url, namespace=namespace) as gate:
        assert [e.key for e in gate.list_effects()] == [scoped(f"sms:{to}:hi", target)]


def big_call(request_id: int, tool: str, arguments: dict[str, Any], pad: str) -> bytes:
    """A ``tools/call`` of ``tool`` with a string argument ``pad`` bytes over the limit."""
    huge = "x" * (MAX_BODY_BYTES + 1024)
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments | {pad: huge}}}).encode()


async def chunks(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]


async def oversized_is_413(url: str, body: bytes, *, chunked: bool) -> None:
    """POST ``body`` to an initialized session at ``url``, its length said or streamed
    chunked: 413, with a JSON-RPC error."""
    async with httpx.AsyncClient(timeout=60) as http:
        hello = await http.post(url, json=INIT, headers=HEADERS)
        assert hello.status_code == 200, hello.text
        session = HEADERS | {"mcp-session-id": hello.headers["mcp-session-id"],
                             "mcp-protocol-version": VERSION}
        await http.post(url, json=INITIALIZED, headers=session)
        content = chunks(body) if chunked else body
        r = await http.post(url, content=content, headers=session)
        assert r.status_code == 413, (r.status_code, r.text[:300])


async def small_call_works(url: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60) as http:
        hello = await http.post(url, json=INIT, headers=HEADERS)
        session = HEADERS | {"mcp-session-id": hello.headers["mcp-session-id"],
                             "mcp-protocol-version": VERSION}
        await http.post(url, json=INITIALIZED, headers=session)
        r = await http.post(url, headers=session, json={
            "jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}})
        assert r.status_code == 200, r.text
        data = [line[len("data:"):] for line in r.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1] if data else r.text)  # type: ignore[no-any-return]


async def test_an_oversized_body_to_mcp_serve_is_413_and_writes_nothing(
        store_url: str, namespace: str) -> None:
    argv = serve_argv(store_url, namespace, "--transport", "http", "--port", "0", "--no-auth")
    with serving(argv) as served:
        body = big_call(1, "begin_effect", {"effect_type": "email.send", "key": "mail:big"},
                        "payload")
        for chunked in (False, True):
            await oversized_is_413(served.url, body, chunked=chunked)
        with eg.Gate(store_url, namespace=namespace) as gate:
            assert gate.list_effects() == []
        answer = await small_call_works(served.url, "begin_effect", {
            "effect_type": "email.send", "key": "mail:small", "payload": {"to": "x"}})
        assert answer["result"]["isError"] is False, answer
    with eg.Gate(store_url, namespace=namespace) as gate:
        assert [e.key for e in gate.list_effects()] == ["mail:small"]


async def test_an_oversized_body_to_the_gateway_is_413_and_writes_nothing(
        upstream: Upstream, shared_upstream: SharedUpstream, store_url: str,
        namespace: str) -> None:
    to = f"+1-{tag()}"
    argv = gateway_argv(upstream, store_url, namespace, "--transport", "http", "--port", "0",
                        "--no-auth", target=shared_upstream.url)
    with serving(argv) as served:
        body = big_call(1, "send_message", {"to": to}, "text")
        for chunked in (False, True):
            await oversized_is_413(served.url, body, chunked=chunked)
        with eg.Gate(store_url, namespace=namespace) as gate:
            assert gate.list_effects() == []
        assert shared_upstream.lines(to) == []
        answer = await small_call_works(served.url, "send_message", {"to": to, "text": "hi"})
        assert answer["result"].get("isError") is not True, answer
    assert shared_upstream.lines(to) == [f"sms:{to}:hi"]


def test_a_gateway_told_to_stop_while_its_client_holds_stdin_open_stops(
        upstream: Upstream, store_url: str, namespace: str) -> None:
    """SIGTERM from a supervisor that keeps the pipe open (systemd, ``docker stop``): the
    gateway stops the orderly way (exit status 0, its upstream stopped), rather than waiting
    on a stdin reader blocked for a line that never comes."""
    proc = subprocess.Popen(gateway_argv(upstream, store_url, namespace), env=upstream.env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        server = Stdio(proc)
        assert "result" in server.ask(json.dumps(INIT).encode(), 0)
        server.send(json.dumps(INITIALIZED).encode())
        assert server.ask(b'{"jsonrpc":"2.0","id":1,"method":"ping"}', 1)["result"] == {}
        proc.terminate()  # stdin still open
        assert proc.wait(timeout=15) == 0
    finally:
        stop(proc)


def test_serve_started_with_stdin_closed_ends_cleanly(store_url: str, namespace: str) -> None:
    """Started with fd 0 closed (``<&-``, as some supervisors do): ``sys.stdin`` is None. The
    server ends as at end of input (exit status 0), not with an AttributeError's traceback."""
    argv = serve_argv(store_url, namespace)
    proc = subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", *argv], capture_output=True,
                          timeout=60, env=dict(os.environ))
    assert b"Traceback" not in proc.stderr, proc.stderr[-1500:].decode()
    assert proc.returncode == 0, proc.stderr[-1500:].decode()


def _answers(out: bytes) -> dict[object, dict[str, Any]]:
    """The responses among stdout's lines, by request id."""
    found = {}
    for line in out.splitlines():
        message = json.loads(line)
        if "id" in message and "method" not in message:
            found[message["id"]] = message
    return found


def test_a_request_running_when_the_client_closes_stdin_is_still_answered(
        store_url: str, namespace: str) -> None:
    """``requests | effectgate mcp serve``: the last request is answered with its result, not
    ``-32000 Connection closed`` (or nothing at all) while its reservation is in the store;
    and the server then ends (exit status 0)."""
    proc = subprocess.Popen(serve_argv(store_url, namespace), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines = [json.dumps(INIT).encode(), json.dumps(INITIALIZED).encode(),
             begin(1, b"mail:last"), b'{"jsonrpc":"2.0","id":2,"method":"ping"}']
    out, _ = proc.communicate(b"\n".join(lines) + b"\n", timeout=60)
    assert proc.returncode == 0
    answers = _answers(out)
    assert answers[2]["result"] == {}, answers
    decision = json.loads(answers[1]["result"]["content"][0]["text"])  # type: ignore[index]
    assert decision["decision"] == "execute", answers[1]
    with eg.Gate(store_url, namespace=namespace) as gate:
        assert [e.key for e in gate.list_effects()] == ["mail:last"]
