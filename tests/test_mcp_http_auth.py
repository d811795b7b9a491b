"""MCP over streamable HTTP with bearer tokens of agent principals (``effectgate mcp serve
--transport http``), driven by the mcp package's own client, on SQLite and Postgres: no token
is 401, an agent acts only on what it began, and the start line says whether auth is on. On
every loopback address (``mcp serve`` and the gateway alike) a request naming another host, as
a DNS-rebinding web page does, is refused."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from .mcp_helpers import SharedUpstream, serving

CLI = ["-m", "effectgate.cli"]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "1"}}}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@asynccontextmanager
async def session(url: str, token: str) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session that sends ``token`` as its bearer token."""
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http, \
            streamable_http_client(url, http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as s:
        await s.initialize()
        yield s


async def call(s: ClientSession, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    result = await s.call_tool(tool, arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    if result.is_error:
        text = text.split(": ", 1)[1] if not text.startswith("{") else text
    return result.is_error, json.loads(text)


def _argv(store_url: str, namespace: str, *extra: str) -> list[str]:
    return [sys.executable, *CLI, "mcp", "serve", "--url", store_url, "--namespace", namespace,
            "--transport", "http", "--port", "0", *extra]


async def test_agents_act_only_on_what_they_hold(store_url: str, namespace: str) -> None:
    with eg.Gate(store_url, namespace=namespace) as gate:
        _, token_a = gate.add_principal("bot-a", "agent")
        _, token_b = gate.add_principal("bot-b", "agent")
        with serving(_argv(store_url, namespace)) as served:
            assert any("auth: bearer tokens of agent principals" in line
                       for line in served.lines), served.lines
            with anyio.fail_after(60):
                async with session(served.url, token_a) as a, session(served.url,
                                                                       token_b) as b:
                    failed, d = await call(a, "begin_effect", effect_type="email.send",
                                           key="mail:1", payload={"to": "x"})
                    assert not failed and d["decision"] == "execute", d
                    assert gate.get("mail:1").agent_id == "bot-a"  # the principal, recorded
                    lease = {"key": "mail:1", "lease_token": d["lease_token"],
                             "lease_secret": d["lease_secret"]}
                    # bot-b holds the whole proof of holding, and is still refused
                    failed, answer = await call(b, "report_effect", **lease,
                                                outcome="committed", result={"forged": 1})
                    assert failed and answer["error"] == "Forbidden", answer
                    failed, answer = await call(b, "extend_lease", **lease, seconds=30)
                    assert failed and answer["error"] == "Forbidden", answer
                    assert gate.get("mail:1").state is eg.State.IN_FLIGHT
                    failed, answer = await call(b, "begin_effect", effect_type="email.send",
                                                key="mail:2", payload={}, agent_id="bot-a")
                    assert failed and answer["error"] == "Forbidden", answer
                    failed, answer = await call(b, "unwind_group", group_key="g:1")
                    assert failed and answer["error"] == "Forbidden", answer
                    failed, answer = await call(a, "report_effect", **lease,
                                                outcome="committed", result={"sent": True})
                    assert not failed, answer
        record = gate.get("mail:1")
        assert record.state is eg.State.COMMITTED and record.result == {"sent": True}
        with pytest.raises(eg.UnknownEffect):
            gate.get("mail:2")


async def test_no_token_or_a_bad_one_is_401_and_sessions_stay_with_their_owner(
        store_url: str, namespace: str) -> None:
    with eg.Gate(store_url, namespace=namespace) as gate:
        _, agent = gate.add_principal("bot-a", "agent")
        _, other = gate.add_principal("bot-b", "agent")
        _, operator = gate.add_principal("alice", "operator")
        _, revoked = gate.add_principal("old-bot", "agent")
        gate.revoke_principal("old-bot")
        with serving(_argv(store_url, namespace)) as served:
            statuses: list[int] = []

            async def seen(response: Any) -> None:
                statuses.append(response.status_code)

            with anyio.fail_after(60):  # the mcp client itself, without a token, is turned away
                with pytest.raises(BaseExceptionGroup):
                    async with create_mcp_http_client() as client:
                        client.event_hooks = {"request": [], "response": [seen]}
                        async with streamable_http_client(served.url,
                                                          http_client=client) as streams, \
                                ClientSession(streams[0], streams[1]) as s:
                            await s.initialize()
            assert statuses and set(statuses) == {401}, statuses
            async with httpx.AsyncClient(timeout=20) as http:
                for auth in (None, "Bearer", "Bearer egp_nope", f"Basic {agent}",
                             f"Bearer {revoked}", f"Bearer {agent}x"):
                    headers = HEADERS | ({"authorization": auth} if auth else {})
                    r = await http.post(served.url, json=INIT, headers=headers)
                    assert r.status_code == 401, (auth, r.status_code)
                    assert r.headers["www-authenticate"].startswith("Bearer")
                r = await http.post(served.url, json=INIT,
                                    headers=HEADERS | {"authorization": f"Bearer {operator}"})
                assert r.status_code == 403
                r = await http.post(served.url, json=INIT,
                                    headers=HEADERS | {"authorization": f"Bearer {agent}"})
                assert r.status_code == 200
                sid = r.headers["mcp-session-id"]
                stolen = HEADERS | {"authorization": f"Bearer {other}", "mcp-session-id": sid,
                                    "mcp-protocol-version": "2025-06-18"}
                r = await http.post(served.url, headers=stolen, json={
                    "jsonrpc": "2.0", "id": 2, "method": "tools/list"})
                assert r.status_code == 403
        assert gate.list_effects() == []


def test_no_auth_is_only_for_localhost_and_says_so(tmp_path: Path) -> None:
    import subprocess

    store = f"sqlite:///{tmp_path / 'e.db'}"
    done = subprocess.run(
        [sys.executable, *CLI, "mcp", "serve", "--url", store, "--transport", "http",
         "--host", "0.0.0.0", "--allow-remote", "--no-auth", "--port", "0"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--no-auth only on localhost" in done.stderr
    with serving(_argv(store, "default", "--no-auth")) as served:
        assert any("auth: off" in line for line in served.lines), served.lines


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("host", [
    "127.0.0.2",
    pytest.param("[::1]", marks=pytest.mark.skipif(not _has_ipv6_loopback(),
                                                   reason="this machine has no ::1")),
])
@pytest.mark.parametrize("command", ["serve", "gateway"])
async def test_a_dns_rebinding_page_is_refused_on_every_loopback_address(
        command: str, host: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A web page that rebinds its own name (evil.example) to the loopback address a
    ``--no-auth`` server listens on sends that name as Host and its own Origin: refused (421
    for the Host, 403 for the Origin) on 127.0.0.2 and [::1] as on 127.0.0.1, so it cannot
    begin or report anything; a client naming the address itself still works."""
    store = f"sqlite:///{tmp_path / 'e.db'}"
    if command == "serve":
        argv = _argv(store, "default", "--host", host, "--no-auth")
    else:
        upstream: SharedUpstream = request.getfixturevalue("shared_upstream")
        argv = [sys.executable, *CLI, "mcp", "gateway", "--upstream", upstream.url,
                "--url", store, "--transport", "http", "--host", host, "--port", "0",
                "--no-auth"]
    with serving(argv) as served:
        port = httpx.URL(served.url).port
        assert served.url == f"http://{host}:{port}/mcp", served.url
        evil = f"evil.example:{port}"
        with anyio.fail_after(60):
            async with httpx.AsyncClient(timeout=20) as http:
                rebound = await http.post(served.url, json=INIT, headers=HEADERS | {
                    "host": evil, "origin": f"http://{evil}"})
                assert rebound.status_code == 421, rebound.text
                foreign = await http.post(served.url, json=INIT,
                                          headers=HEADERS | {"origin": f"http://{evil}"})
                assert foreign.status_code == 403, foreign.text
                own = await http.post(served.url, json=INIT, headers=HEADERS | {
                    "origin": f"http://{host}:{port}"})
                assert own.status_code == 200, own.text
            async with streamable_http_client(served.url) as streams, \
                    ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                assert (await s.list_tools()).tools
    with eg.Gate(store) as gate:
        assert gate.list_effects() == []
