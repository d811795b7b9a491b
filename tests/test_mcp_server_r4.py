"""``effectgate mcp serve`` red team, round 4: what a hostile or confused client does.

* A line the SDK's stdio transport cannot read (JSON nested too deep, a lone surrogate, a
  number too long) used to be dropped without an answer, leaving the caller waiting forever;
  it is now answered with the JSON-RPC error streamable HTTP gives the same body, and writes
  nothing. A real ``mcp serve`` process, fed raw JSON-RPC lines.
* An approval elicited mid-call (handshake protocols) from a client that never answers the
  elicitation used to hold the call forever, even after a person decided on the console; the
  decision now ends the wait (without one, the approval wait does), and the call answers
  approval_required: nothing is begun for a client that did not answer, since over HTTP it may
  be gone without the call being cancelled. The mcp package's own ``Client`` in-process, as
  tests/test_mcp_multiround.py does, and raw streamable HTTP to a real server process.

Both store backends."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import Client, types

from effectgate.integrations.mcp.multiround import RoundKeys
from effectgate.integrations.mcp.server import build_server

from .conftest import snapshot
from .mcp_helpers import SharedUpstream, serving, tag

CLI = [sys.executable, "-m", "effectgate.cli"]
DEEP = '{"a":' * 3000 + "{}" + "}" * 3000


class RawClient:
    """A ``mcp serve`` process spoken to line by line, as a client that builds its own JSON."""

    def __init__(self, store_url: str, namespace: str, *, argv: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv or [*CLI, "mcp", "serve", "--url", store_url, "--namespace", namespace],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env or dict(os.environ),
            bufsize=0)
        self.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}))
        assert self.receive()["id"] == 0
        self.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 20) -> dict[str, Any]:
        assert self.proc.stdout is not None
        # stdout is unbuffered (bufsize=0): a buffered reader's readline could take two
        # answers at once, and select would then see no data for the second.
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "no answer: the caller would wait forever"
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def begin_line(request_id: int | str, arguments: str) -> str:
    """A ``tools/call`` of ``begin_effect`` with ``arguments`` as raw JSON text."""
    return ('{"jsonrpc":"2.0","id":' + json.dumps(request_id) + ',"method":"tools/call",'
            '"params":{"name":"begin_effect","arguments":' + arguments + "}}")


UNREADABLE = {
    "deep payload": '{"effect_type":"t.x","key":"k1","payload":' + DEEP + "}",
    "deep compensation": ('{"effect_type":"t.x","key":"k2","group_key":"g","compensation":'
                          + DEEP + "}"),
    "lone surrogate in a payload name": ('{"effect_type":"t.x","key":"k3",'
                                         '"payload":{"\\udc00":1}}'),
    "lone surrogate in a compensation": ('{"effect_type":"t.x","key":"k4","group_key":"g",'
                                         '"compensation":{"a":"\\ud800"}}'),
    "a 5000-digit number": '{"effect_type":"t.x","key":"k5","payload":{"n":' + "7" * 5000 + "}}",
}


def test_a_line_the_sdk_cannot_read_gets_a_typed_error_and_writes_nothing(
        store_url: str, namespace: str) -> None:
    """Every unreadable request is answered ``-32700`` under its own id (a line with no
    readable id, or JSON that is no JSON-RPC message, under id null); nothing is written, and
    the server goes on serving."""
    with eg.Gate(store_url, namespace=namespace) as gate:
        before = snapshot(gate)
        client = RawClient(store_url, namespace)
        try:
            for n, (what, arguments) in enumerate(UNREADABLE.items(), 1):
                for request_id in (n, f"req-{n}"):
                    client.send(begin_line(request_id, arguments))
                    answer = client.receive()
                    assert answer["id"] == request_id, (what, answer)
                    assert answer["error"]["code"] == -32700, (what, answer)
                    assert answer["error"]["message"].startswith("Parse error: "), answer
            # the request's own id, not one nested in its arguments
            client.send('{"jsonrpc":"2.0","method":"tools/call","params":{"name":"begin_effect",'
                        '"arguments":{"id":777,"effect_type":"t.x","key":"k6","payload":'
                        '{"\\udc00":1}}},"id":"late"}')
            assert client.receive()["id"] == "late"
            client.send('{"jsonrpc":"2.0","method":"tools/call","params":' + DEEP + "}")
            client.send("not json")
            assert client.receive()["error"]["code"] == -32700  # a notification: no id to use
            answer = client.receive()
            assert answer["id"] is None and answer["error"]["code"] == -32700, answer
            client.send('{"hello": "world"}')
            assert client.receive() == {"jsonrpc": "2.0", "id": None, "error": {
                "code": -32600, "message": "Invalid request: not a JSON-RPC message"}}
            assert snapshot(gate) == before
            client.send(begin_line(99, '{"effect_type":"t.x","key":"k9"}'))
            answer = client.receive()
            assert answer["id"] == 99 and not answer["result"].get("isError"), answer
        finally:
            client.close()
        assert [r.key for r in gate.list_effects()] == ["k9"]


def test_the_gateway_answers_a_line_the_sdk_cannot_read(
        tmp_path: Any, store_url: str, namespace: str,
        shared_upstream: SharedUpstream) -> None:
    """The gateway's stdio too: a tools/call whose arguments hold a lone surrogate is answered
    ``-32700`` under its id (it got no answer: the client waited for ever), the upstream is
    never called, and the gateway goes on serving."""
    from .test_mcp_gateway import Upstream

    up, to = Upstream(tmp_path), f"+1-{tag()}"
    client = RawClient(store_url, namespace, argv=[
        *CLI, "mcp", "gateway", "--upstream", shared_upstream.url, "--url", store_url,
        "--namespace", namespace, "--policy", str(up.policy)])
    try:
        client.send('{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":'
                    '"send_message","arguments":{"to":"' + to + '","text":"\\udc00"}}}')
        answer = client.receive()
        assert answer["id"] == 5 and answer["error"]["code"] == -32700, answer
        client.send('{"jsonrpc":"2.0","id":6,"method":"tools/list"}')
        assert client.receive()["id"] == 6
    finally:
        client.close()
    assert shared_upstream.lines(to) == []


POLICY = {"effects": {"payment.refund": {"approval": "always"}}}
BEGIN = {"effect_type": "payment.refund", "key": "refund:T1", "payload": {"txn_id": "T1"}}


class Silent:
    """A client that declares URL elicitation and never answers one (its user walked away;
    or it shows the page and waits for a click that never comes)."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    async def __call__(self, context: Any, params: Any) -> types.ElicitResult:
        self.asked.append(params)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("decide", ["approve", "deny", None])
async def test_a_client_that_never_answers_the_elicitation_does_not_hold_the_call(
        make_gate: Any, decide: str | None) -> None:
    """A decision on the console ends the call at once (without one, the approval wait does);
    the call answers approval_required, and the agent's next begin gets the decision. Nothing
    is begun for a client that did not answer: it may be gone."""
    gate, console = make_gate(policy=POLICY), make_gate(policy=POLICY)
    client_side = Silent()
    server = build_server(gate, console_url="http://127.0.0.1:8765", approval_wait_seconds=8,
                          state_keys=RoundKeys(b"k" * 32))

    async def person() -> None:
        while not client_side.asked:
            await anyio.sleep(0.05)
        [pending] = console.list_approvals()
        if decide == "approve":
            console.approve(pending.approval_id, by="alice")
        elif decide == "deny":
            console.deny(pending.approval_id, by="alice", reason="no")

    with anyio.fail_after(30):
        async with Client(server, mode="legacy", elicitation_callback=client_side) as client, \
                anyio.create_task_group() as tg:
            tg.start_soon(person)
            started = time.monotonic()
            result = await client.call_tool("begin_effect", BEGIN)
            took = time.monotonic() - started
    answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert not result.is_error and answer["decision"] == "approval_required", answer
    assert (took < 5) if decide else (took >= 8), took
    [asked] = client_side.asked
    assert asked.url.endswith(f"/approvals/{answer['approval_id']}")
    again = gate.begin(**BEGIN)
    assert again.decision == {"approve": "execute", "deny": "denied",
                              None: "approval_required"}[decide]


async def test_a_client_gone_during_the_elicitation_strands_no_reservation(
        tmp_path: Path, store_url: str, namespace: str) -> None:
    """Streamable HTTP, handshake protocol: the client drops its stream while the approval is
    elicited, and a person approves. The call is not cancelled by the dropped stream, so it
    must not begin the effect for a caller that will never hear the lease (it would be
    IN_FLIGHT, then AMBIGUOUS, with nobody acting): it stays approved for the next begin."""
    policy = tmp_path / "effectgate.toml"
    policy.write_text('[effects."payment.refund"]\napproval = "always"\n', encoding="utf-8")
    argv = [*CLI, "mcp", "serve", "--url", store_url, "--namespace", namespace, "--policy",
            str(policy), "--transport", "http", "--port", "0", "--no-auth", "--console-url",
            "http://127.0.0.1:8765"]
    headers = {"accept": "application/json, text/event-stream",
               "content-type": "application/json"}
    with eg.Gate(store_url, namespace=namespace, policy=eg.Policy.load(policy)) as gate, \
            serving(argv) as served, httpx.Client(timeout=20) as http:
        r = http.post(served.url, headers=headers, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {"elicitation": {"url": {}}},
                "clientInfo": {"name": "gone", "version": "1"}}})
        headers |= {"mcp-session-id": r.headers["mcp-session-id"],
                    "mcp-protocol-version": "2025-06-18"}
        http.post(served.url, headers=headers,
                  json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "begin_effect", "arguments": BEGIN}}
        with http.stream("POST", served.url, headers=headers, json=call) as stream:
            assert any("elicitation/create" in line for line in stream.iter_lines())
        # the stream is gone; a person approves on the console
        [pending] = gate.list_approvals()
        gate.approve(pending.approval_id, by="alice")
        time.sleep(3)  # the server polls the store every 0.5 s
        assert gate.get("refund:T1").state is eg.State.PENDING_APPROVAL
        assert gate.begin(**BEGIN).decision is eg.Decision.EXECUTE
