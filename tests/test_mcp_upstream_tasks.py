"""An upstream's own tasks (the Tasks extension, MCP 2026-07-28) as the gateway's way to run a
gated call and as its reconciler after a crash: the suite's fixture server over streamable HTTP
(it passes the official suite's tasks scenarios, ``tests/test_mcp_conformance.py``; one process
shared by the tests that only call it, each with labels of its own), the gateway as a real
process killed with SIGKILL mid-call (and in this process where it is not), both store
backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import types

from effectgate.integrations.mcp.upstream_tasks import (
    UpstreamTasks,
    task_ref,
    task_ref_of,
)

from .mcp_helpers import (
    SharedUpstream,
    gateway_args,
    gateway_in_process,
    http_session,
    serving,
    tag,
)

FIXTURES = [sys.executable, str(Path(__file__).with_name("mcp_conformance_upstream.py"))]
POLICY = """
[effects."compute.run"]
key = "compute:{label}"
tools = ["slow_compute"]
lease_seconds = 1
reconcile_grace_seconds = 0.5
"""


@contextmanager
def upstream(tmp: Path) -> Iterator[tuple[str, Path]]:
    """The fixture server over HTTP (it outlives any gateway) and the file of its runs."""
    runs = tmp / "runs.txt"
    with serving([*FIXTURES, "--http", "0"], env={**os.environ, "FIXTURE_RUNS": str(runs)}) as s:
        yield s.url, runs


def _gateway(url: str, tmp: Path, store_url: str, namespace: str) -> list[str]:
    policy = tmp / "policy.toml"
    policy.write_text(POLICY, encoding="utf-8")
    return [sys.executable, *gateway_args(url, "--policy", str(policy), "--url", store_url,
                                          "--namespace", namespace, "--transport", "http",
                                          "--port", "0", "--no-auth")]


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def _call(url: str, label: str, seconds: float) -> types.CallToolResult:
    async with http_session(url) as s:
        return await s.call_tool("slow_compute", {"seconds": seconds, "label": label})


def _key(namespace_scope: str, label: str) -> str:
    return f"{namespace_scope}:compute:{label}"


def _find(gate: eg.Gate, label: str) -> eg.EffectRecord | None:
    found = [r for r in gate.list_effects(effect_type="compute.run")
             if r.key.endswith(f"compute:{label}")]
    return found[0] if found else None


async def test_a_gateway_killed_mid_task_is_reconciled_by_the_upstream_task(
        tmp_path: Path, store_url: str, namespace: str,
        shared_task_upstream: SharedUpstream) -> None:
    """SIGKILL on the gateway while its upstream runs the call as a task: the task id is in
    the store, the effect AMBIGUOUS once the lease lapses; after the task completes, a new
    gateway process answers the repeat from the upstream's ``tasks/get`` (COMMITTED with the
    task's result, through the reconcile hook), and the upstream ran the call once."""
    gate = eg.Gate(store_url, namespace=namespace)
    up, once = shared_task_upstream, f"once-{tag()}"
    with anyio.fail_after(120):
        args = _gateway(up.url, tmp_path, store_url, namespace)
        with serving(args) as first:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call, first.url, once, 3.5)  # outlasts kill + lease
                deadline = time.monotonic() + 30
                while (record := _find(gate, once)) is None or not record.vendor_ref:
                    assert time.monotonic() < deadline, first.stderr()
                    await anyio.sleep(0.05)
                assert task_ref_of(record) is not None, record.vendor_ref
                first.proc.send_signal(signal.SIGKILL)
                first.proc.wait(timeout=10)
                tg.cancel_scope.cancel()
        key = record.key
        while gate.get(key).state is not eg.State.AMBIGUOUS:
            await anyio.sleep(0.1)
        lapsed = time.monotonic()  # the lease lapsed by now
        assert not up.lines(once)  # the upstream task is still working
        while not up.lines(once):
            await anyio.sleep(0.1)
        assert gate.get(key).state is eg.State.AMBIGUOUS  # nobody asked yet
        # the reconcile grace (0.5 s) after the lapse: usually over while the task ran
        await anyio.sleep(max(0.0, lapsed + 0.6 - time.monotonic()))
        with serving(args) as second:
            answer = await _call(second.url, once, 3.5)
        assert not answer.is_error, _text(answer)
        assert _text(answer) == f"computed {once}"
        assert (answer.meta or {})["effectgate"]["decision"] == "duplicate"
    done = gate.get(key)
    assert done.state is eg.State.COMMITTED
    assert done.result["structuredContent"] == {"label": once}
    assert [h.by for h in done.history][-1].startswith("reconciler:")
    assert up.lines(once) == [once]
    gate.close()


async def test_a_call_run_as_an_upstream_task_commits_its_result(
        tmp_path: Path, store_url: str, namespace: str,
        shared_task_upstream: SharedUpstream) -> None:
    """No crash: the call runs as an upstream task (its id recorded), the gateway (in this
    process) polls it to its end, and the repeat is the stored duplicate."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY, encoding="utf-8")
    up, plain = shared_task_upstream, f"plain-{tag()}"
    call = {"seconds": 0.2, "label": plain}
    with eg.Gate(store_url, namespace=namespace, policy=eg.Policy.load(policy)) as gate, \
            anyio.fail_after(90):
        async with gateway_in_process(gate, up.url) as client:
            first = await client.call_tool("slow_compute", call)
            again = await client.call_tool("slow_compute", call)
        record = _find(gate, plain)
    assert _text(first) == _text(again) == f"computed {plain}"
    assert (again.meta or {})["effectgate"]["decision"] == "duplicate"
    assert record is not None and record.state is eg.State.COMMITTED
    assert task_ref_of(record) is not None
    assert up.lines(plain) == [plain]


async def test_a_task_the_upstream_lost_while_polled_is_unknown_never_refused(
        tmp_path: Path) -> None:
    """The upstream took the call as a task, then a new instance on its address (a restart,
    a load balancer's other instance) answered the poll "task not found" (``-32602``). That
    error was raised as the upstream's own, which the gateway reads as "refused before it
    ran": FAILED, and the retry ran the call again. Once a task was taken, a poll that fails
    is an unknown outcome (AMBIGUOUS), whatever it says."""
    import socket
    from contextlib import ExitStack

    from mcp.shared.exceptions import MCPError

    from effectgate.integrations.mcp.upstream_tasks import TaskCall

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fixture = [*FIXTURES, "--http", str(port)]
    env = {**os.environ, "FIXTURE_RUNS": str(tmp_path / "runs.txt")}
    with serving(fixture, env=env) as up, ExitStack() as later, anyio.fail_after(60):
        tasks = UpstreamTasks(up.url, rejected_before_run=frozenset({-32602}))
        taken: list[str] = []

        async def started(handle: Any) -> None:  # no request in flight: between two polls
            taken.append(handle.task_id)
            up.proc.send_signal(signal.SIGKILL)
            up.proc.wait(timeout=10)
            later.enter_context(serving(fixture, env=env))  # it never heard of the task

        params = types.CallToolRequestParams(name="slow_compute",
                                             arguments={"seconds": 5, "label": "lost"})
        with pytest.raises(TaskCall) as lost:
            await tasks.call(params, lambda: None, started)
    assert taken and lost.value.status == "unknown", lost.value
    assert not isinstance(lost.value, MCPError) and "could not be followed" in str(lost.value)


async def _ambiguous(gate: eg.Gate, key: str, ref: str | None) -> eg.EffectRecord:
    """An effect of ``compute.run`` whose holder recorded ``ref`` and then lapsed."""
    held = await gate.abegin(effect_type="compute.run", key=key, payload={"label": key},
                             lease_seconds=0.3)
    if ref is not None:
        await gate.aextend_lease(held, 0.3, vendor_ref=ref)
    await anyio.sleep(0.4)
    record = gate.get(key)
    assert record.state is eg.State.AMBIGUOUS
    return record


def _rows(gate: eg.Gate, key: str) -> tuple[Any, ...]:
    r = gate.get(key)
    return (r.state, r.attempt, r.lease_token, r.result, r.vendor_ref, len(r.history))


async def test_forged_or_unknown_task_ids_leave_the_effect_ambiguous(
        tmp_path: Path, store_url: str, namespace: str) -> None:
    """The hook asked about a task id the upstream never issued, another attempt's id, a
    malformed ref or none: unknown, the effect AMBIGUOUS and its row unchanged; a ref the
    store cannot hold is refused (``ConfigError``) with nothing written."""
    gate = eg.Gate(store_url, namespace=namespace)
    with upstream(tmp_path) as (url, runs), anyio.fail_after(60):
        tasks = UpstreamTasks(url)
        cases = {"forged": task_ref(1, "forged-" + "x" * 30), "other-attempt": task_ref(2, "t"),
                 "malformed": '{"kind": "mcp-task", "attempt": 1, "task_id": 5}',
                 "not-json": "mcp-task:1:abc", "none": None}
        for name, ref in cases.items():
            record = await _ambiguous(gate, name, ref)
            assert task_ref_of(record) is None or name == "forged"
            before = _rows(gate, name)
            verdict = await tasks.reconcile(record)
            assert verdict.outcome == "unknown", (name, verdict)
            assert _rows(gate, name) == before
        held = await gate.abegin(effect_type="compute.run", key="bad", payload={})
        before = _rows(gate, "bad")
        for bad in ("", "\x00", "x" * 5000, 7):
            with pytest.raises(eg.ConfigError, match="vendor_ref"):
                await gate.aextend_lease(held, 5, vendor_ref=bad)  # type: ignore[arg-type]
        assert _rows(gate, "bad") == before
        with pytest.raises(eg.ConfigError, match="HTTP"):
            UpstreamTasks("python server.py")
    assert not runs.exists()
    gate.close()


async def test_upstream_task_outcomes_map_to_what_the_protocol_says(
        store_url: str, namespace: str, shared_task_upstream: SharedUpstream) -> None:
    """Real tasks of the fixture server, read by the hook: completed → committed with its
    result; a tool error (completed, ``isError``) → unknown (the gateway's default reading);
    a protocol failure (``-32603``) → unknown; cancelled mid-run → unknown, never failed."""
    from effectgate.integrations.mcp.tasks import CancelTaskParams, CancelTaskRequest

    gate = eg.Gate(store_url, namespace=namespace)
    with anyio.fail_after(60):
        tasks = UpstreamTasks(shared_task_upstream.url, rejected_before_run=frozenset({-32602}))
        ids: dict[str, str] = {}
        async with tasks.session() as s:
            for name, tool, args in (("done", "slow_compute", {"seconds": 0, "label": "d"}),
                                     ("tool-error", "failing_job", {}),
                                     ("protocol", "protocol_error_job", {}),
                                     ("cancelled", "slow_compute", {"seconds": 30})):
                handle = await s.call_tool(tool, args, allow_claimed=True)
                ids[name] = handle.task_id  # type: ignore[union-attr]
            await s.send_request(CancelTaskRequest(params=CancelTaskParams(
                task_id=ids["cancelled"])), types.EmptyResult)
        await anyio.sleep(1.3)  # failing_job answers after ~1 s
        verdicts = {}
        for name, task_id in ids.items():
            record = await _ambiguous(gate, name, task_ref(1, task_id))
            verdicts[name] = await tasks.reconcile(record)
    assert {n: v.outcome for n, v in verdicts.items()} == {
        "done": "committed", "tool-error": "unknown", "protocol": "unknown",
        "cancelled": "unknown"}
    assert verdicts["done"].result["structuredContent"] == {"label": "d"}
    assert "cancelled" in (verdicts["cancelled"].note or "")
    gate.close()


def test_task_refs_name_their_attempt() -> None:
    ref = json.loads(task_ref(3, "abc"))
    assert ref == {"kind": "mcp-task", "attempt": 3, "task_id": "abc"}
    assert subprocess is not None  # (the module's processes are real ones)
