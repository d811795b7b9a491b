"""Review of the MCP stdio answer to unreadable lines, the elicitation race and undos over
HTTP (r4): an unreadable line is answered at once whatever it holds, under the request's own
id or null, never an id found inside one of its values; an approval is waited for once,
whoever answers first; an agent cannot undo another agent's step."""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import Client, types

from effectgate.integrations.mcp.multiround import RoundKeys
from effectgate.integrations.mcp.server import build_server
from effectgate.sagas import compensation_request

from .conftest import snapshot
from .mcp_helpers import serving
from .test_mcp_http_auth import _argv, call, session
from .test_mcp_server_r4 import BEGIN, POLICY, RawClient


def test_a_long_unreadable_line_is_answered_at_once(store_url: str, namespace: str) -> None:
    """An open string of escaped quotes (120 kB) took the id reader quadratic time: about a
    minute with the event loop held, every other request waiting behind it."""
    with eg.Gate(store_url, namespace=namespace) as gate:
        before = snapshot(gate)
        client = RawClient(store_url, namespace)
        try:
            started = time.monotonic()
            client.send('{"jsonrpc":"2.0","id":3,"method":"ping","params":{"a":"'
                        + '\\"' * 60_000)
            first = client.receive(timeout=10)
            assert time.monotonic() - started < 5
            assert first["id"] == 3 and first["error"]["code"] == -32700, first
            client.send('{"jsonrpc":"2.0","id":4,"method":"ping"}')
            assert client.receive() == {"jsonrpc": "2.0", "id": 4, "result": {}}
        finally:
            client.close()
        assert snapshot(gate) == before


def test_an_invalid_message_is_not_answered_under_an_id_one_of_its_values_holds(
        store_url: str, namespace: str) -> None:
    """JSON that is no JSON-RPC message is answered under id null, as over HTTP: the SDK's
    error shows one value inside it, and a string value shaped like a request (its id 99)
    answered request 99 — another call's id — with this line's error."""
    with eg.Gate(store_url, namespace=namespace) as gate:
        before = snapshot(gate)
        client = RawClient(store_url, namespace)
        try:
            client.send('{"jsonrpc":"{\\"id\\":99,\\"method\\":\\"m\\"}","id":1,'
                        '"method":"tools/list"}')
            assert client.receive() == {"jsonrpc": "2.0", "id": None, "error": {
                "code": -32600, "message": "Invalid request: not a JSON-RPC message"}}
        finally:
            client.close()
        assert snapshot(gate) == before


def test_an_unreadable_line_is_answered_under_its_id_however_json_spells_the_key(
        store_url: str, namespace: str) -> None:
    """The SDK reads a key spelt with escapes (``"\\u0069d"``) as ``id``; the id reader did not,
    and answered such a request under null: its caller waited for ever."""
    client = RawClient(store_url, namespace)
    try:
        client.send('{"jsonrpc":"2.0","\\u0069d":8,"\\u006dethod":"tools/call","params":'
                    '{"name":"begin_effect","arguments":{"effect_type":"t.x","key":"k",'
                    '"payload":{"a":"\\ud800"}}}}')
        answer = client.receive()
        assert answer["id"] == 8 and answer["error"]["code"] == -32700, answer
    finally:
        client.close()


class Late:
    """A client that accepts the elicitation after ``seconds`` (its user was slow to click)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def __call__(self, context: Any, params: Any) -> types.ElicitResult:
        await anyio.sleep(self.seconds)
        return types.ElicitResult(action="accept")


async def test_a_late_accept_does_not_start_a_second_approval_wait(make_gate: Any) -> None:
    """The store is watched from the elicitation on; an accept that comes late waits only
    what is left of ``approval_wait_seconds`` (it waited all of it again: up to twice)."""
    gate = make_gate(policy=POLICY)
    server = build_server(gate, console_url="http://127.0.0.1:8765", approval_wait_seconds=4,
                          state_keys=RoundKeys(b"k" * 32))
    with anyio.fail_after(30):
        async with Client(server, mode="legacy", elicitation_callback=Late(3)) as client:
            started = time.monotonic()
            result = await client.call_tool("begin_effect", BEGIN)
            took = time.monotonic() - started
    answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert answer["decision"] == "approval_required", answer
    assert 4 <= took < 5.5, took


async def test_an_agent_cannot_undo_another_agents_step(store_url: str,
                                                        namespace: str) -> None:
    """Over HTTP bot-b began the undo of bot-a's step and reported it committed, and unwind
    counted bot-a's step compensated with nothing undone. An undo acts on its step: only the
    step's holder may begin it (Forbidden, nothing written); an effect id that names nothing
    is UnknownEffect, nothing written."""
    with eg.Gate(store_url, namespace=namespace) as gate:
        _, token_a = gate.add_principal("bot-a", "agent")
        _, token_b = gate.add_principal("bot-b", "agent")
        step = dict(effect_type="trip.book", key="book:T1", payload={"trip": "T1"},
                    group_key="trip:T1", compensation={"tool": "cancel", "ref": "BK-1"},
                    agent_id="bot-a")
        lease = gate.begin(**step).lease
        assert lease is not None
        gate.report(lease, "committed", result={"ref": "BK-1"})
        undo = compensation_request(gate.get("book:T1"))
        before = snapshot(gate)
        with serving(_argv(store_url, namespace)) as served:
            with anyio.fail_after(60):
                async with session(served.url, token_b) as b, \
                        session(served.url, token_a) as a:
                    failed, d = await call(b, "begin_effect", **undo)
                    assert failed and d["error"] == "Forbidden", d
                    assert "another agent holds it" in d["message"], d
                    failed, d = await call(b, "begin_effect", **{
                        **undo, "key": "compensate:other", "compensates_effect_id": 10**9})
                    assert failed and d["error"] == "UnknownEffect", d
                    assert snapshot(gate) == before
                    failed, d = await call(a, "begin_effect", **undo)  # its holder may
                    assert not failed and d["decision"] == "execute", d
