"""Red-team findings against the MCP gateway, each reproduced with the real gateway in front of
a real upstream process (written to the test's tmp dir below) and driven by the mcp package's
own ``Client``, as tests/test_mcp_tasks.py does.

Every test states what the gateway should do. Each was ``xfail(strict=True)`` while it did not;
all are fixed now (tests/test_mcp_redteam_fixes.py covers what the fixes changed beyond these).
"""

from __future__ import annotations

import io
import os
import shlex
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import Client, types
from mcp.shared.exceptions import MCPError

from effectgate.integrations.mcp.gateway import Gateway, tool_specs
from effectgate.integrations.mcp.identity import UpstreamIdentity
from effectgate.integrations.mcp.multiround import RoundKeys
from effectgate.integrations.mcp.upstream import Upstream

from . import mcp_upstream
from .mcp_helpers import serving

KEYS = RoundKeys(b"r" * 32)

# -- upstreams -----------------------------------------------------------------------------------

SDK_UPSTREAMS = '''
import asyncio, os, secrets, sys
from typing import Any
import anyio
from pydantic import BaseModel


def append(line):
    with open(os.environ["LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(line + "\\n")


class Booking(BaseModel):
    booking_id: int


def lowlevel():
    """book: books, then parses the vendor's reply into a model that rejects it: a pydantic
    ValidationError after the side effect (the SDK answers any handler ValidationError -32602)."""
    from mcp import types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    tool = types.Tool(name="book", description="Book a room.", input_schema={
        "type": "object", "properties": {"room": {"type": "string"}}, "required": ["room"]})

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx, params):
        append("book:" + params.arguments["room"])
        booking = Booking.model_validate({"booking_id": "BK-12"})
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(booking))])

    server = Server("booking", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main():
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def mcpserver():
    """invoice: sends, then asks the user (form elicitation) whether to email a copy;
    issue_token: 1.5 s, then a fresh secret."""
    from mcp.server import MCPServer
    from mcp.server.mcpserver import Context

    server = MCPServer("office")

    class CopyWanted(BaseModel):
        email_copy: bool

    @server.tool()
    async def invoice(customer: str, ctx: Context) -> str:
        """Send an invoice."""
        append("invoice:" + customer)
        answer = await ctx.elicit("Invoice sent. Email a copy too?", CopyWanted)
        return "invoiced " + customer + "; copy: " + answer.action

    @server.tool()
    async def issue_token(name: str) -> dict[str, str]:
        """Issue an API token."""
        await asyncio.sleep(1.5)
        append("issue:" + name)
        return {"name": name, "token": "sk_" + secrets.token_hex(8)}

    server.run()


{"lowlevel": lowlevel, "mcpserver": mcpserver}[sys.argv[1]]()
'''

RAW_UPSTREAM = '''
"""JSON-RPC by hand over stdio. tools/call appends a $LEDGER line, then: garbage -> an
unparseable line and no answer; block -> $BLOCK_SECONDS without reading, then the answer;
any other tool -> the answer."""
import json, os, sys, time

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}


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
        res = {"tools": [{"name": n, "inputSchema": SCHEMA} for n in ("ok", "garbage", "block")]}
    elif method == "tools/call":
        name = msg["params"]["name"]
        with open(os.environ["LEDGER"], "a", encoding="utf-8") as ledger:
            ledger.write(name + "\\n")
        if name == "garbage":
            out(b"{not json")
            continue
        if name == "block":
            time.sleep(float(os.environ["BLOCK_SECONDS"]))
            with open(os.environ["LEDGER"], "a", encoding="utf-8") as ledger:
                ledger.write("block finished\\n")
        res = {"content": [{"type": "text", "text": "did " + name}]}
    elif method == "ping":
        res = {}
    else:
        out({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})
        continue
    out({"jsonrpc": "2.0", "id": rid, "result": res})
'''

HTTP_TASKS_UPSTREAM = '''
"""Streamable HTTP, declares the Tasks extension; charge answers directly with structured
content whose amount is a string where its outputSchema says number."""
import os, socket, sys
import anyio
from mcp import types
from mcp.server.lowlevel import Server

TOOL = types.Tool(name="charge", description="Charge.", input_schema={
    "type": "object", "properties": {"ref": {"type": "string"}}, "required": ["ref"]},
    output_schema={"type": "object", "properties": {"amount": {"type": "number"}}})


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[TOOL])


async def call_tool(ctx, params):
    with open(os.environ["LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write("charge:" + params.arguments["ref"] + "\\n")
    return types.CallToolResult(content=[types.TextContent(type="text", text="charged")],
                                structured_content={"amount": "12.00"})


server = Server("charging", version="1", on_list_tools=list_tools, on_call_tool=call_tool)
server.extensions["io.modelcontextprotocol/tasks"] = {}


async def main(sock):
    import uvicorn
    app = server.streamable_http_app(host="127.0.0.1")
    await uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock])


sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(16)
print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", file=sys.stderr, flush=True)
anyio.run(main, sock)
'''


def _script(tmp: Path, name: str, source: str, *args: str) -> str:
    path = tmp / name
    path.write_text(source, encoding="utf-8")
    return shlex.join([sys.executable, str(path), *args])


def _ledger(tmp: Path) -> list[str]:
    path = tmp / "ledger"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _key(target: str, key: str) -> str:
    return f"{UpstreamIdentity.of(target).key_scope}:{key}"


@asynccontextmanager
async def _gateway(gate: eg.Gate, target: str, monkeypatch: pytest.MonkeyPatch, tmp: Path,
                   **client: Any) -> AsyncIterator[Client]:
    monkeypatch.setenv("LEDGER", str(tmp / "ledger"))
    policy = gate.policy
    assert policy is not None
    gw = Gateway(gate, target, tool_specs(gate, policy), policy=policy, out=io.StringIO(),
                 state_keys=KEYS)
    async with anyio.create_task_group() as tg:
        await gw.start(tg)
        async with Client(gw.server(), **client) as session:
            yield session
        await gw.aclose()
        tg.cancel_scope.cancel()


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


# -- runs an effect twice ------------------------------------------------------------------------

async def test_invalid_params_raised_after_the_tool_acted_never_allows_a_second_run(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _script(tmp_path, "sdk.py", SDK_UPSTREAMS, "lowlevel")
    gate = make_gate(policy={"effects": {"room.book": {"key": "book:{room}",
                                                       "tools": ["book"]}}})
    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path) as client:
            await client.call_tool("book", {"room": "101"})
            await client.call_tool("book", {"room": "101"})
    assert gate.get(_key(target, "book:101")).attempt == 1
    assert _ledger(tmp_path) == ["book:101"]


async def test_a_clients_error_to_a_mid_call_elicitation_never_allows_a_second_run(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _script(tmp_path, "sdk.py", SDK_UPSTREAMS, "mcpserver")
    gate = make_gate(policy={"effects": {"billing.invoice": {"key": "invoice:{customer}",
                                                             "tools": ["invoice"]}}})

    async def refuse(ctx: Any, params: Any) -> types.ErrorData:  # the spec's code for a mode
        return types.ErrorData(code=types.INVALID_PARAMS, message="unsupported elicitation")

    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path, mode="legacy",
                            elicitation_callback=refuse) as client:
            await client.call_tool("invoice", {"customer": "acme"})
            await client.call_tool("invoice", {"customer": "acme"})
    assert gate.get(_key(target, "invoice:acme")).state is not eg.State.FAILED
    assert _ledger(tmp_path) == ["invoice:acme"]


# -- reaches another caller's result -------------------------------------------------------------

async def test_a_redacted_field_never_reaches_a_twin_from_another_session(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _script(tmp_path, "sdk.py", SDK_UPSTREAMS, "mcpserver")
    gate = make_gate(policy={"effects": {"auth.token": {
        "key": "token:{name}", "tools": ["issue_token"], "redact_result": ["token"]}}})
    monkeypatch.setenv("LEDGER", str(tmp_path / "ledger"))
    policy = gate.policy
    gw = Gateway(gate, target, tool_specs(gate, policy), policy=policy, out=io.StringIO(),
                 state_keys=KEYS)
    answers: dict[str, Any] = {}
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await gw.start(tg)
            async with Client(gw.server()) as a, Client(gw.server()) as b:
                await a.list_tools()
                await b.list_tools()

                async def call(who: str, client: Client, delay: float) -> None:
                    await anyio.sleep(delay)
                    result = await client.call_tool("issue_token", {"name": "ci"})
                    answers[who] = result.structured_content

                async with anyio.create_task_group() as calls:
                    calls.start_soon(call, "a", a, 0)
                    calls.start_soon(call, "b", b, 0.5)  # while a's call runs
            await gw.aclose()
            tg.cancel_scope.cancel()
    assert _ledger(tmp_path) == ["issue:ci"]
    assert answers["a"]["token"].startswith("sk_")  # the caller that ran it sees it
    assert answers["b"]["token"] == "[redacted]"  # as every duplicate does


# -- wrong answers and records -------------------------------------------------------------------

async def test_a_duplicate_whose_result_is_not_stored_is_answered_as_a_duplicate(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    target = shlex.join([sys.executable, str(Path(mcp_upstream.__file__))])
    for name in ("STARTED", "REFUSE_START", "SLOW_START"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    gate = make_gate(policy={"effects": {"card.charge": {
        "key": "charge:{ref}", "tools": ["charge"], "store_result": False}}})
    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path) as client:
            await client.call_tool("charge", {"ref": "r1", "card": "4242"})
            try:
                again = await client.call_tool("charge", {"ref": "r1", "card": "4242"})
            except MCPError as err:
                pytest.fail(f"the repeat raised {err.error.code} {err.error.message}")
    assert (again.meta or {})["effectgate"]["decision"] == "duplicate"
    assert _ledger(tmp_path) == ["charge:r1"]


async def test_an_unreadable_stdio_reply_leaves_the_effect_ambiguous(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _script(tmp_path, "raw.py", RAW_UPSTREAM)
    gate = make_gate(policy={"effects": {"t.garbage": {"key": "garbage:{id}",
                                                       "tools": ["garbage"],
                                                       "lease_seconds": 1}}})
    key = _key(target, "garbage:1")
    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path) as client:  # 2026-07-28
            with anyio.move_on_after(2):  # the client gives up: its stream breaks
                await client.call_tool("garbage", {"id": "1"})
            await anyio.sleep(4)  # four leases later
            state = gate.get(key).state
    assert _ledger(tmp_path) == ["garbage"]
    assert state is eg.State.AMBIGUOUS, state


async def test_a_busy_upstream_is_not_stopped_under_a_running_call(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(Upstream.__init__.__kwdefaults__, "ping_timeout", 1.0)  # (10 s)
    monkeypatch.setenv("BLOCK_SECONDS", "3")  # past the readiness ping's timeout
    target = _script(tmp_path, "raw.py", RAW_UPSTREAM)
    gate = make_gate(policy={"effects": {"t.block": {"key": "block:{id}", "tools": ["block"]},
                                         "t.ok": {"key": "ok:{id}", "tools": ["ok"]}}})
    with anyio.fail_after(60):
        async with (_gateway(gate, target, monkeypatch, tmp_path, mode="legacy") as client,
                    anyio.create_task_group() as tg):
            tg.start_soon(client.call_tool, "block", {"id": "1"})
            await anyio.sleep(1)
            tg.start_soon(client.call_tool, "ok", {"id": "1"})
    assert "block finished" in _ledger(tmp_path)
    assert gate.get(_key(target, "block:1")).state is eg.State.COMMITTED


async def test_a_call_cancelled_before_it_left_is_failed_not_ambiguous(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    target = shlex.join([sys.executable, str(Path(mcp_upstream.__file__))])
    slow = tmp_path / "slow_start"
    for name in ("STARTED", "REFUSE_START", "SLOW_START"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("SLOW_START_SECONDS", "3")  # (and its imports after)
    gate = make_gate(policy={"effects": {
        "sms.send": {"key": "sms:{to}:{text}", "tools": ["send_message"]},
        "sms.slow": {"key": "slow:{to}", "tools": ["slow_send"]}}})
    with anyio.fail_after(60):
        async with _gateway(gate, target, monkeypatch, tmp_path, mode="legacy") as client:
            await client.call_tool("slow_send", {"to": "warm", "seconds": 0})
            slow.write_text("1")  # the upstream's restart will be slow
            os.kill(int((tmp_path / "started").read_text()), 9)  # and it dies now
            await anyio.sleep(0.5)
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "send_message", {"to": "+1", "text": "hi"})
                await anyio.sleep(2)  # the gateway is reconnecting: nothing sent yet
                tg.cancel_scope.cancel()
            slow.unlink()
            await anyio.sleep(4)  # past the slow restart: a call still held would leave now
    assert "sms:+1:hi" not in _ledger(tmp_path)
    assert gate.get(_key(target, "sms:+1:hi")).state is eg.State.FAILED


async def test_the_upstream_tasks_path_commits_what_the_plain_path_commits(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER", str(tmp_path / "ledger"))
    source = tmp_path / "http_tasks.py"
    source.write_text(HTTP_TASKS_UPSTREAM, encoding="utf-8")
    gate = make_gate(policy={"effects": {"card.charge": {"key": "charge:{ref}",
                                                         "tools": ["charge"]}}})
    with serving([sys.executable, str(source)], env=dict(os.environ)) as up, \
            anyio.fail_after(60):
        async with _gateway(gate, up.url, monkeypatch, tmp_path) as client:
            answer = await client.session.send_request(types.CallToolRequest(
                params=types.CallToolRequestParams(name="charge", arguments={"ref": "r1"})),
                types.CallToolResult)  # raw: the agent's own client does not re-validate
    assert _ledger(tmp_path) == ["charge:r1"]
    assert not answer.is_error, _text(answer)
    assert gate.get(_key(up.url, "charge:r1")).state is eg.State.COMMITTED

