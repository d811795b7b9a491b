"""The MCP gateway red-team fixes (tests/test_mcp_redteam.py) beyond the report's own cases:
the one upstream error still taken as "never ran", and its limit; unreadable replies other than
an unparseable line; a duplicate with no stored result of a tool without an output schema; a
2026-07-28 client's progress. A real upstream process each time, driven by the mcp package's
own ``Client``, as tests/test_mcp_redteam.py does."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import Client, types

from effectgate.integrations.mcp.gateway import Gateway, tool_specs
from effectgate.integrations.mcp.upstream import Upstream

from .test_mcp_redteam import KEYS, SDK_UPSTREAMS, _gateway, _key, _ledger, _script, _text

RAW = '''
"""JSON-RPC by hand over stdio. tools/call: unserved -> -32601, nothing done; any other tool
appends a $LEDGER line, then: nonutf8 -> an answer with invalid UTF-8; deep -> an answer
nested too deep to read; progress -> a progress notification (when asked), then the answer;
ok -> the answer."""
import json, os, sys

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
NAMES = ("ok", "unserved", "nonutf8", "deep", "progress")


def out(obj):
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    sys.stdout.buffer.write(data + b"\\n")
    sys.stdout.buffer.flush()


for raw in sys.stdin.buffer:
    msg = json.loads(raw)
    rid, method = msg.get("id"), msg.get("method")
    if rid is None:
        continue
    if method == "initialize":
        res = {"protocolVersion": msg["params"]["protocolVersion"],
               "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "1"}}
    elif method == "tools/list":
        res = {"tools": [{"name": n, "inputSchema": SCHEMA} for n in NAMES]}
    elif method == "tools/call":
        name = msg["params"]["name"]
        if name == "unserved":
            out({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})
            continue
        with open(os.environ["LEDGER"], "a", encoding="utf-8") as ledger:
            ledger.write(name + "\\n")
        if name == "nonutf8":
            out(b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode()
                + b',"result":{"content":[{"type":"text","text":"bad \\xff\\xfe bytes"}]}}')
            continue
        if name == "deep":
            out(b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode() + b',"result":'
                + b'{"a":' * 300 + b'{}' + b'}' * 300 + b'}')
            continue
        token = (msg["params"].get("_meta") or {}).get("progressToken")
        if name == "progress" and token is not None:
            out({"jsonrpc": "2.0", "method": "notifications/progress",
                 "params": {"progressToken": token, "progress": 1, "total": 2}})
        res = {"content": [{"type": "text", "text": "did " + name}]}
    elif method == "ping":
        res = {}
    else:
        out({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})
        continue
    out({"jsonrpc": "2.0", "id": rid, "result": res})
'''


def _raw_gate(make_gate: Any, *tools: str) -> eg.Gate:
    return make_gate(policy={"effects": {f"t.{n}": {"key": f"{n}:{{id}}", "tools": [n]}
                                         for n in tools}})


async def test_an_unserved_tools_call_is_failed_and_may_run_again(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-32601`` to a gated call, with nothing asked of the client during it: the upstream
    does not serve the call, so it provably did not run (FAILED, the agent told so)."""
    target = _script(tmp_path, "raw.py", RAW)
    gate = _raw_gate(make_gate, "unserved")
    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path, mode="legacy") as client:
            first = await client.call_tool("unserved", {"id": "1"})
            again = await client.call_tool("unserved", {"id": "1"})
    assert first.is_error and '"UpstreamRefused"' in _text(first), _text(first)
    assert '"UpstreamRefused"' in _text(again)
    record = gate.get(_key(target, "unserved:1"))
    assert record.state is eg.State.FAILED and record.attempt == 2
    assert _ledger(tmp_path) == []


async def test_a_method_not_found_the_client_gave_a_mid_call_elicitation_is_ambiguous(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool acted, then elicited; the client answered ``-32601`` (an elicitation it does
    not serve), and the upstream raised it as the call's error: the upstream had asked the
    client something during the call, so it had started — AMBIGUOUS, never run again."""
    target = _script(tmp_path, "sdk.py", SDK_UPSTREAMS, "mcpserver")
    gate = make_gate(policy={"effects": {"billing.invoice": {"key": "invoice:{customer}",
                                                             "tools": ["invoice"]}}})

    async def unserved(ctx: Any, params: Any) -> types.ErrorData:
        return types.ErrorData(code=types.METHOD_NOT_FOUND, message="no elicitation here")

    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path, mode="legacy",
                            elicitation_callback=unserved) as client:
            first = await client.call_tool("invoice", {"customer": "acme"})
            again = await client.call_tool("invoice", {"customer": "acme"})
    assert first.is_error and '"UpstreamLost"' in _text(first), _text(first)
    assert '"EffectAmbiguous"' in _text(again), _text(again)
    assert gate.get(_key(target, "invoice:acme")).state is eg.State.AMBIGUOUS
    assert _ledger(tmp_path) == ["invoice:acme"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_invalid_utf8_or_too_deep_replies_end_the_call_ambiguous_and_reconnect(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Invalid UTF-8 used to end the SDK's stdio reader (every pending call then waited
    forever, a later call too: the ping unanswered); a reply nested too deep was dropped as
    unparseable. Either ends the call at once, AMBIGUOUS, and the next call reconnects."""
    target = _script(tmp_path, "raw.py", RAW)
    gate = _raw_gate(make_gate, "nonutf8", "deep", "ok")
    answers = {}
    with anyio.fail_after(30):
        async with _gateway(gate, target, monkeypatch, tmp_path, mode=mode) as client:
            for name in ("nonutf8", "deep", "ok"):
                answers[name] = await client.call_tool(name, {"id": "1"})
    for name in ("nonutf8", "deep"):
        assert answers[name].is_error and '"UpstreamLost"' in _text(answers[name])
        assert gate.get(_key(target, f"{name}:1")).state is eg.State.AMBIGUOUS, name
    assert _text(answers["ok"]) == "did ok"
    assert gate.get(_key(target, "ok:1")).state is eg.State.COMMITTED
    assert _ledger(tmp_path) == ["nonutf8", "deep", "ok"]


async def test_a_duplicate_whose_result_is_not_stored_says_it_ran(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``store_result = false`` and a tool without an output schema: the repeat is a plain
    (not an error) answer that says the call already ran and its result was not kept."""
    target = _script(tmp_path, "raw.py", RAW)
    gate = make_gate(policy={"effects": {"t.ok": {"key": "ok:{id}", "tools": ["ok"],
                                                  "store_result": False}}})
    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path, mode="legacy") as client:
            first = await client.call_tool("ok", {"id": "1"})
            again = await client.call_tool("ok", {"id": "1"})
    assert _text(first) == "did ok"
    assert not again.is_error and "not kept" in _text(again)
    assert (again.meta or {})["effectgate"]["decision"] == "duplicate"
    assert _ledger(tmp_path) == ["ok"]


async def test_a_twin_of_a_call_whose_result_is_not_stored_gets_the_duplicate(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A twin gets what the store gives it: with ``store_result = false``, the duplicate's
    note, not the answer the leader got."""
    target = _script(tmp_path, "sdk.py", SDK_UPSTREAMS, "mcpserver")
    gate = make_gate(policy={"effects": {"auth.token": {
        "key": "token:{name}", "tools": ["issue_token"], "store_result": False}}})
    monkeypatch.setenv("LEDGER", str(tmp_path / "ledger"))
    policy = gate.policy
    gw = Gateway(gate, target, tool_specs(gate, policy), policy=policy, out=io.StringIO(),
                 state_keys=KEYS)
    answers: dict[str, types.CallToolResult] = {}
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await gw.start(tg)
            async with Client(gw.server()) as a, Client(gw.server()) as b:
                async def call(who: str, client: Client, delay: float) -> None:
                    await anyio.sleep(delay)
                    answers[who] = await client.session.send_request(types.CallToolRequest(
                        params=types.CallToolRequestParams(name="issue_token",
                                                           arguments={"name": "ci"})),
                        types.CallToolResult)

                async with anyio.create_task_group() as calls:
                    calls.start_soon(call, "a", a, 0)
                    calls.start_soon(call, "b", b, 0.5)
            await gw.aclose()
            tg.cancel_scope.cancel()
    assert _ledger(tmp_path) == ["issue:ci"]
    assert "sk_" in _text(answers["a"])
    assert "sk_" not in _text(answers["b"]) and "not kept" in _text(answers["b"])
    assert (answers["b"].meta or {})["effectgate"]["decision"] == "duplicate"


async def test_a_2026_client_gets_the_upstreams_progress(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2026-07-28 request's progress token is not in the handler's ``ctx.meta``: the
    gateway relayed no progress to such a client, as it does to a handshake client."""
    target = _script(tmp_path, "raw.py", RAW)
    gate = _raw_gate(make_gate, "progress")
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path) as client:  # 2026-07-28
            answer = await client.call_tool("progress", {"id": "1"},
                                            progress_callback=progress)
    assert _text(answer) == "did progress"
    assert seen == [1]


EDGE = '''
"""JSON-RPC by hand over stdio. tools/call appends a $LEDGER line, then: asks -> asks the
client a method it does not serve and answers the call with the client's error; chatty ->
prints a line of plain text to stdout, then the answer; hang -> never answers (nor reads);
ok -> the answer."""
import json, os, sys, time

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
NAMES = ("asks", "chatty", "hang", "ok")


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\\n")
    sys.stdout.flush()


lines = iter(sys.stdin)
for raw in lines:
    msg = json.loads(raw)
    rid, method = msg.get("id"), msg.get("method")
    if rid is None:
        continue
    if method == "initialize":
        res = {"protocolVersion": msg["params"]["protocolVersion"],
               "capabilities": {"tools": {}}, "serverInfo": {"name": "edge", "version": "1"}}
    elif method == "tools/list":
        res = {"tools": [{"name": n, "inputSchema": SCHEMA} for n in NAMES]}
    elif method == "tools/call":
        name = msg["params"]["name"]
        with open(os.environ["LEDGER"], "a", encoding="utf-8") as ledger:
            ledger.write(name + "\\n")
        if name == "asks":
            out({"jsonrpc": "2.0", "id": "srv-1", "method": "x/confirm", "params": {}})
            reply = {}
            for line in lines:
                reply = json.loads(line)
                if reply.get("id") == "srv-1":
                    break
            out({"jsonrpc": "2.0", "id": rid, "error": reply.get("error") or {
                "code": -32603, "message": "unexpected"}})
            continue
        if name == "chatty":
            print("charging the card...", flush=True)
            time.sleep(0.5)
        if name == "hang":
            time.sleep(3600)
        res = {"content": [{"type": "text", "text": "did " + name}]}
    elif method == "ping":
        res = {}
    else:
        out({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})
        continue
    out({"jsonrpc": "2.0", "id": rid, "result": res})
'''


async def test_a_method_not_found_the_sdk_gave_an_unknown_mid_call_request_is_ambiguous(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool acted, then asked the client a method the mcp client does not know: the SDK
    answers that ``-32601`` itself, no callback involved, and the upstream raised it as the
    call's error. It had asked the client something during the call (every request of the
    upstream's counts, not only those a callback answers): AMBIGUOUS, never run again."""
    target = _script(tmp_path, "edge.py", EDGE)
    gate = _raw_gate(make_gate, "asks")
    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path, mode="legacy") as client:
            first = await client.call_tool("asks", {"id": "1"})
            again = await client.call_tool("asks", {"id": "1"})
    assert first.is_error and '"UpstreamLost"' in _text(first), _text(first)
    assert '"EffectAmbiguous"' in _text(again), _text(again)
    assert gate.get(_key(target, "asks:1")).state is eg.State.AMBIGUOUS
    assert _ledger(tmp_path) == ["asks"]


async def test_a_line_of_plain_text_on_stdout_during_a_call_is_skipped_not_fatal(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that prints a log line to stdout while it runs a call: that line is no
    answer to anything, so the connection is kept (it used to be dropped, the upstream
    stopped in the middle of the call and the call AMBIGUOUS) and the call commits."""
    target = _script(tmp_path, "edge.py", EDGE)
    gate = _raw_gate(make_gate, "chatty")
    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path, mode="legacy") as client:
            answer = await client.call_tool("chatty", {"id": "1"})
    assert _text(answer) == "did chatty", _text(answer)
    assert gate.get(_key(target, "chatty:1")).state is eg.State.COMMITTED
    assert _ledger(tmp_path) == ["chatty"]


async def test_a_call_is_never_sent_to_a_wedged_upstream_that_has_a_call_in_flight(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream wedged in a call answers no ping. A later call used to be sent anyway
    (the session "busy"), and waited there for good: AMBIGUOUS, never run. It now waits
    for a ping before it leaves, and once the wedged call is given up (nothing in flight)
    the upstream is restarted and the later call runs."""
    monkeypatch.setitem(Upstream.__init__.__kwdefaults__, "ping_timeout", 1.0)
    target = _script(tmp_path, "edge.py", EDGE)
    gate = _raw_gate(make_gate, "hang", "ok")
    answers: dict[str, types.CallToolResult] = {}

    async def call(client: Client, name: str, delay: float, give_up: float) -> None:
        await anyio.sleep(delay)
        with anyio.move_on_after(give_up):
            answers[name] = await client.call_tool(name, {"id": "1"})

    with anyio.fail_after(60):
        async with (_gateway(gate, target, monkeypatch, tmp_path, mode="legacy") as client,
                    anyio.create_task_group() as tg):
            tg.start_soon(call, client, "hang", 0, 4)  # its client gives up at 4 s
            tg.start_soon(call, client, "ok", 1, 20)
    assert _text(answers["ok"]) == "did ok"
    assert gate.get(_key(target, "ok:1")).state is eg.State.COMMITTED
    assert gate.get(_key(target, "hang:1")).state is eg.State.AMBIGUOUS
    assert _ledger(tmp_path) == ["hang", "ok"]
