"""The MCP Tasks extension (2026-07-28) as an outcome path of the gateway's gated calls: a
real upstream process (one shared over HTTP, or a stdio one of the test's own where its start
matters), the mcp package's own ``Client`` declaring the extension (its result claim resolves
a task handle), both store backends."""

from __future__ import annotations

import io
import json
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

from effectgate.integrations.mcp.tasks import (
    NOT_SENT,
    CancelTaskParams,
    CancelTaskRequest,
    DetailedTask,
    GetTaskParams,
    GetTaskRequest,
    TaskHandle,
    TasksExtension,
    poll,
)

from .conftest import snapshot
from .mcp_helpers import SharedUpstream, tag
from .test_mcp_multiround import KEYS, ledger, scoped, upstream_command

POLICY = {"effects": {
    "sms.slow": {"key": "slow:{to}", "tools": ["slow_send"], "lease_seconds": 1},
    "sms.send": {"key": "sms:{to}:{text}", "tools": ["send_message"]}}}


@asynccontextmanager
async def gateway(gate: eg.Gate, target: str, *, tasks: bool = True, mode: str = "auto",
                  warm: bool = True) -> AsyncIterator[Client]:
    """The gateway in this process in front of ``target``, and a client of it."""
    from effectgate.integrations.mcp.gateway import Gateway, tool_specs

    policy = gate.policy
    assert policy is not None
    gw = Gateway(gate, target, tool_specs(gate, policy), policy=policy,
                 out=io.StringIO(), state_keys=KEYS)
    kw: dict[str, Any] = {"mode": mode}
    if tasks:
        kw["extensions"] = [TasksExtension()]
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            await gw.start(tg)
            async with Client(gw.server(), **kw) as client:
                if warm:
                    await client.call_tool("lookup", {"name": "warm"})  # the upstream is up
                yield client
            await gw.aclose()
            tg.cancel_scope.cancel()


async def get(client: Client, task_id: str) -> DetailedTask:
    return await client.session.send_request(  # type: ignore[no-any-return]
        GetTaskRequest(params=GetTaskParams(task_id=task_id)), DetailedTask)


async def cancel(client: Client, task_id: str) -> None:
    await client.session.send_request(CancelTaskRequest(params=CancelTaskParams(
        task_id=task_id)), types.EmptyResult)


async def as_task(client: Client, tool: str, arguments: dict[str, Any]) -> TaskHandle:
    handle = await client.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(handle, TaskHandle), handle
    return handle


async def test_a_long_gated_call_answers_with_a_task_that_holds_the_lease_and_commits(
        shared_upstream: SharedUpstream, make_gate: Any) -> None:
    gate = make_gate(policy=POLICY)
    to = f"+1-{tag()}"
    key = scoped(f"slow:{to}", shared_upstream.url)
    async with gateway(gate, shared_upstream.url) as client:
        handle = await as_task(client, "slow_send", {"to": to, "seconds": 2.5})
        assert handle.status == "working" and len(handle.task_id) >= 32
        await anyio.sleep(1.6)  # past the 1 s lease: the heartbeat holds it
        working = await get(client, handle.task_id)
        assert working.status == "working" and working.result is None
        assert gate.get(key).state is eg.State.IN_FLIGHT
        done = await poll(client.session, handle.task_id, timeout=10)
        again = await client.call_tool("slow_send", {"to": to, "seconds": 2.5})
    assert done.status == "completed" and done.result is not None
    result = types.CallToolResult.model_validate(done.result)
    assert not result.is_error and result.content[0].text == f"sent to {to}"  # type: ignore[union-attr]
    assert (result.meta or {})["effectgate"]["decision"] == "execute"
    record = gate.get(key)
    assert record.state is eg.State.COMMITTED and record.attempt == 1
    assert (again.meta or {})["effectgate"]["decision"] == "duplicate"  # from the store
    assert shared_upstream.lines(to) == [f"slow:{to}"]


async def test_the_sdk_client_resolves_the_task_into_the_tool_result(
        shared_upstream: SharedUpstream, make_gate: Any) -> None:
    gate = make_gate(policy=POLICY)
    to = f"+2-{tag()}"
    async with gateway(gate, shared_upstream.url) as client:
        result = await client.call_tool("slow_send", {"to": to, "seconds": 0.3})
        repeat = await client.session.call_tool("slow_send", {"to": to, "seconds": 0.3},
                                                allow_claimed=True)
    assert not result.is_error and result.content[0].text == f"sent to {to}"  # type: ignore[union-attr]
    # a repeat holds no lease: answered at once from the store, not as a task
    assert isinstance(repeat, types.CallToolResult)
    assert (repeat.meta or {})["effectgate"]["decision"] == "duplicate"
    assert shared_upstream.lines(to) == [f"slow:{to}"]


async def test_a_task_cancelled_after_its_call_left_is_ambiguous_never_failed(
        shared_upstream: SharedUpstream, make_gate: Any) -> None:
    gate = make_gate(policy=POLICY)
    key = scoped("slow:+3", shared_upstream.url)
    started = shared_upstream.started
    async with gateway(gate, shared_upstream.url) as client:
        started.unlink(missing_ok=True)  # an earlier test's call
        handle = await as_task(client, "slow_send", {"to": "+3", "seconds": 3})
        with anyio.fail_after(10):
            while not started.exists():  # the upstream is running it
                await anyio.sleep(0.02)
        await cancel(client, handle.task_id)
        seen = await get(client, handle.task_id)
        blocked = await client.call_tool("slow_send", {"to": "+3", "seconds": 3})
    record = gate.get(key)
    assert record.state is eg.State.AMBIGUOUS, record
    assert seen.status == "cancelled" and "ambiguous" in (seen.status_message or "")
    assert blocked.is_error and json.loads(blocked.content[0].text)["state"] == "ambiguous"  # type: ignore[union-attr]


async def test_a_task_cancelled_before_its_call_left_is_failed_and_runs_again(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own stdio upstream, whose next start is made slow."""
    gate = make_gate(policy=POLICY)
    key = scoped("sms:+4:hi", upstream_command())
    for name in ("LEDGER", "STARTED", "REFUSE_START", "SLOW_START"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    async with gateway(gate, upstream_command(), warm=False) as client:
        (tmp_path / "slow_start").write_text("1")  # the upstream session opens slowly
        handle = await as_task(client, "send_message", {"to": "+4", "text": "hi"})
        await cancel(client, handle.task_id)  # while the gateway still waits to send
        seen = await get(client, handle.task_id)
        record = gate.get(key)
        (tmp_path / "slow_start").unlink()
        again = await client.call_tool("send_message", {"to": "+4", "text": "hi"})
    assert record.state is eg.State.FAILED and NOT_SENT in (record.error or "")
    assert seen.status == "cancelled" and "failed" in (seen.status_message or "")
    assert not again.is_error and (again.meta or {})["effectgate"]["attempt"] == 2
    assert ledger(tmp_path) == ["sms:+4:hi"]


async def test_an_unknown_task_is_invalid_params_and_changes_nothing(
        shared_upstream: SharedUpstream, make_gate: Any) -> None:
    gate = make_gate(policy=POLICY)
    async with gateway(gate, shared_upstream.url) as client:
        before = snapshot(gate)
        for ask in (get, cancel):
            with pytest.raises(MCPError) as caught:
                await ask(client, "not-a-task")
            assert caught.value.error.code == types.INVALID_PARAMS
        assert snapshot(gate) == before


@pytest.mark.parametrize("how", ["no-extension", "legacy"])
async def test_a_client_without_the_extension_gets_the_result_itself(
        shared_upstream: SharedUpstream, make_gate: Any, how: str) -> None:
    gate = make_gate(policy=POLICY)
    async with gateway(gate, shared_upstream.url, tasks=how == "legacy",
                       mode="legacy" if how == "legacy" else "auto") as client:
        result = await client.session.call_tool("slow_send", {"to": "+5", "seconds": 0.2},
                                                allow_claimed=True)
    assert isinstance(result, types.CallToolResult) and not result.is_error
    assert (result.meta or {})["effectgate"]["decision"] == "execute"


async def test_tasks_methods_need_the_extension_declared(
        shared_upstream: SharedUpstream, make_gate: Any) -> None:
    from mcp_types import MISSING_REQUIRED_CLIENT_CAPABILITY

    gate = make_gate(policy=POLICY)
    async with gateway(gate, shared_upstream.url, tasks=False) as client:
        for ask in (get, cancel):
            with pytest.raises(MCPError) as caught:
                await ask(client, "any")
            assert caught.value.error.code == MISSING_REQUIRED_CLIENT_CAPABILITY


async def test_a_task_is_its_agents_alone(tmp_path: Path, store_url: str, namespace: str,
                                          shared_upstream: SharedUpstream) -> None:
    """Over HTTP with bearer tokens: another agent asking for a task is told it does not
    exist. Agent B read A's result and cancelled A's call after it left for the upstream,
    leaving A's effect AMBIGUOUS (the spec: tasks are bound to their authorisation)."""
    import sys

    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from .mcp_helpers import gateway_args, serving

    policy = tmp_path / "policy.toml"
    policy.write_text('[effects."sms.slow"]\nkey = "slow:{to}"\ntools = ["slow_send"]\n'
                      'lease_seconds = 5\n', encoding="utf-8")
    with eg.Gate(store_url, namespace=namespace, policy=False) as gate:
        _, token_a = gate.add_principal("bot-a", "agent")
        _, token_b = gate.add_principal("bot-b", "agent")
    argv = [sys.executable, *gateway_args(shared_upstream.url, "--policy", str(policy),
                                          "--url", store_url, "--namespace", namespace,
                                          "--transport", "http", "--port", "0")]

    @asynccontextmanager
    async def agent(url: str, token: str) -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {token}"}
        async with create_mcp_http_client(headers=headers) as http, Client(
                streamable_http_client(url, http_client=http),
                extensions=[TasksExtension()]) as client:
            yield client

    with serving(argv) as gw, anyio.fail_after(90):
        async with agent(gw.url, token_a) as a, agent(gw.url, token_b) as b:
            handle = await as_task(a, "slow_send", {"to": "+1", "seconds": 0.8})  # > B's asks
            for intrude in (get, cancel):
                with pytest.raises(MCPError) as refused:
                    await intrude(b, handle.task_id)
                assert refused.value.error.code == types.INVALID_PARAMS
            done = await poll(a.session, handle.task_id, timeout=30)
            assert done.status == "completed"
    with eg.Gate(store_url, namespace=namespace, policy=False) as gate:
        [record] = [r for r in gate.list_effects() if r.key.endswith("slow:+1")]
        assert record.state is eg.State.COMMITTED
