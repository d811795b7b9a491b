"""Review round 7 of the MCP gateway and server: robustness gaps.

* The gateway's call timeout: an upstream (a real process, ``tests/mcp_hanging_upstream.py``)
  that never answers one tool held a gated call IN_FLIGHT for ever (its heartbeat kept the
  lease) and its client waiting. The SDK's own per-request timeout now ends the wait: the
  request is cancelled upstream (``notifications/cancelled``: the tool's handler sees it), the
  effect is AMBIGUOUS with the reason, a retry is refused, and the client reads
  ``UpstreamTimeout``. The same for an HTTP upstream that declares the Tasks extension and
  answers a gated call with neither a result nor a task. The gateway runs in this process (its
  client over the SDK's in-memory transport), its upstream as a process of its own.
* ``GateServer.run_stdio_async`` run twice at once: the second run read the null device the
  first leaves on fd 0, ended at once as though its client had left and, with the
  ``input_ended`` event given to ``build_server``, set it: the first run's client was no
  longer elicited for approvals. A second run at once is now refused (a process has one
  stdin); a real process runs both.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import Client, types
from mcp.shared.exceptions import MCPError

from effectgate.integrations.mcp.gateway import (
    DEFAULT_CALL_TIMEOUT_SECONDS,
    Gateway,
    tool_specs,
)

from .conftest import snapshot
from .mcp_helpers import stop, wait_for

HANGING = Path(__file__).with_name("mcp_hanging_upstream.py")
EFFECTS = {
    "hang": {"key": "hang:{ref}", "effect_type": "test.hang", "lease_seconds": 0.5},
    "send": {"key": "send:{ref}", "effect_type": "test.send"},
}


def _upstream(ledger: Path) -> str:
    return shlex.join([sys.executable, str(HANGING), str(ledger)])


def _lines(ledger: Path) -> list[str]:
    return ledger.read_text(encoding="utf-8").splitlines() if ledger.exists() else []


def _answer(result: types.CallToolResult) -> dict[str, Any]:
    text = result.content[0].text  # type: ignore[union-attr]
    return json.loads(text)  # type: ignore[no-any-return]


@asynccontextmanager
async def _through_gateway(gate: eg.Gate, target: str, call_timeout: float, *,
                           upstream_tasks: bool = False) -> AsyncIterator[Client]:
    """A client on a gateway (in this process) in front of ``target``, the hanging upstream
    (``upstream_tasks``: run as the upstream's tasks)."""
    gw = Gateway(gate, target, tool_specs(gate, EFFECTS), out=io.StringIO(),
                 call_timeout_seconds=call_timeout)
    async with anyio.create_task_group() as tg:
        await gw.start(tg)
        assert (gw.upstream_tasks is not None) is upstream_tasks
        try:
            async with Client(gw.server(), mode="legacy") as client:
                yield client
        finally:
            await gw.aclose()
            tg.cancel_scope.cancel()


def test_a_call_the_upstream_never_answers_ends_at_the_call_timeout_cancelled_upstream(
        gate: eg.Gate, tmp_path: Path) -> None:
    """With ``call_timeout_seconds=1``: a gated call the upstream never answers (its lease
    0.5 s, kept by the heartbeat meanwhile) is answered ``UpstreamTimeout``, its request is
    cancelled upstream (the tool's handler sees the cancellation), the effect is AMBIGUOUS
    with "did not answer ... within 1 s" (never FAILED), and the same call again is refused
    without reaching the upstream. An ungated call and a resource read that never answer end
    the same way; a gated call after all that still runs (COMMITTED)."""
    ledger = tmp_path / "ledger.txt"

    async def play() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        with anyio.fail_after(60):  # it waited for ever
            async with _through_gateway(gate, _upstream(ledger), call_timeout=1) as client:
                seen["hang"] = await client.call_tool("hang", {"ref": "A"})
                await wait_for(lambda: "cancelled:A" in _lines(ledger))
                seen["again"] = await client.call_tool("hang", {"ref": "A"})
                seen["stall"] = await client.call_tool("stall", {"ref": "U"})
                with pytest.raises(MCPError) as read:
                    await client.read_resource("hang://forever")
                seen["read"] = read.value
                await wait_for(lambda: "cancelled:resource" in _lines(ledger))
                seen["send"] = await client.call_tool("send", {"ref": "B"})
        return seen

    seen = anyio.run(play)
    hang = _answer(seen["hang"])
    assert seen["hang"].is_error and hang["error"] == "UpstreamTimeout", hang
    assert "did not answer tools/call 'hang' within 1 s" in hang["message"]
    assert "AMBIGUOUS" in hang["what_to_do"]
    [hung] = [e for e in gate.list_effects() if e.key == hang["key"]]
    assert hung.state is eg.State.AMBIGUOUS
    assert hung.error is not None and "did not answer tools/call 'hang' within 1 s" in hung.error
    again = _answer(seen["again"])
    assert seen["again"].is_error and again["decision"] == "blocked", again
    stall = _answer(seen["stall"])
    assert seen["stall"].is_error and stall["error"] == "UpstreamTimeout", stall
    assert seen["read"].error.code == types.REQUEST_TIMEOUT
    assert "did not answer resources/read within 1 s" in seen["read"].error.message
    assert not seen["send"].is_error
    assert _lines(ledger) == ["started:A", "cancelled:A", "started:U", "cancelled:U",
                              "started:resource", "cancelled:resource", "sent:B"]
    assert sorted(e.state.value for e in gate.list_effects()) == ["ambiguous", "committed"]


@contextmanager
def _hanging_over_http(ledger: Path) -> Iterator[str]:
    """The hanging upstream over streamable HTTP, declaring the Tasks extension: its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(HANGING), str(ledger), "--http", str(port),
                             "--tasks"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        until = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert proc.poll() is None and time.monotonic() < until, "the upstream never listened"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


def test_a_call_a_tasks_upstream_never_answers_ends_at_the_call_timeout(
        gate: eg.Gate, tmp_path: Path) -> None:
    """An HTTP upstream that declares the Tasks extension gets gated calls as calls it may
    answer with a task; one that answers neither a result nor a task held the effect IN_FLIGHT
    for ever. Now, at the call timeout, the call is cancelled upstream (the closed stream), the
    effect is AMBIGUOUS with the reason, and the client reads ``UpstreamTimeout``."""
    ledger = tmp_path / "ledger.txt"

    async def play(url: str) -> types.CallToolResult:
        with anyio.fail_after(60):  # it waited for ever
            async with _through_gateway(gate, url, call_timeout=1,
                                        upstream_tasks=True) as client:
                answer = await client.call_tool("hang", {"ref": "T"})
                await wait_for(lambda: "cancelled:T" in _lines(ledger))
                return answer

    with _hanging_over_http(ledger) as url:
        result = anyio.run(play, url)
    answer = _answer(result)
    assert result.is_error and answer["error"] == "UpstreamTimeout", answer
    assert "did not answer tools/call 'hang' within 1 s" in answer["message"]
    [hung] = gate.list_effects()
    assert hung.state is eg.State.AMBIGUOUS and hung.key == answer["key"]
    assert hung.error is not None and "within 1 s" in hung.error
    assert _lines(ledger) == ["started:T", "cancelled:T"]


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "5", True, 8 * 86400])
def test_a_bad_call_timeout_is_refused_before_anything_starts(gate: eg.Gate, tmp_path: Path,
                                                              bad: Any) -> None:
    """``call_timeout_seconds`` must be a number of seconds, more than 0 and at most a week
    (None: no limit): anything else is a ConfigError naming it, and the store is unchanged."""
    before = snapshot(gate)
    with pytest.raises(eg.ConfigError, match="call_timeout_seconds"):
        Gateway(gate, _upstream(tmp_path / "ledger.txt"), tool_specs(gate, EFFECTS),
                out=io.StringIO(), call_timeout_seconds=bad)
    assert snapshot(gate) == before


def test_run_gateway_refuses_a_bad_call_timeout_with_exit_status_2(gate: eg.Gate,
                                                                   tmp_path: Path) -> None:
    """``run_gateway(..., call_timeout_seconds=0)`` prints the error and returns 2 before
    starting anything."""
    from effectgate.integrations.mcp.gateway import run_gateway

    out = io.StringIO()
    assert run_gateway(gate, _upstream(tmp_path / "ledger.txt"), EFFECTS, out=out,
                       call_timeout_seconds=0) == 2
    assert "call_timeout_seconds must be more than 0" in out.getvalue()
    assert not (tmp_path / "ledger.txt").exists()


def test_the_call_timeout_defaults_to_five_minutes_and_none_means_no_limit(
        gate: eg.Gate, tmp_path: Path) -> None:
    """The default limit is 300 s; None is accepted as "no limit"."""
    target = _upstream(tmp_path / "ledger.txt")
    specs = tool_specs(gate, EFFECTS)
    assert Gateway(gate, target, specs, out=io.StringIO()).call_timeout_seconds == 300.0
    assert DEFAULT_CALL_TIMEOUT_SECONDS == 300.0
    unlimited = Gateway(gate, target, specs, out=io.StringIO(), call_timeout_seconds=None)
    assert unlimited.call_timeout_seconds is None


def test_the_cli_gateway_passes_its_call_timeout_and_refuses_a_bad_one(
        store_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``effectgate mcp gateway --call-timeout SECONDS`` reaches :func:`run_gateway` (300 by
    default); 0 or a negative is a usage error (exit status 2) before any gate is opened."""
    from click.testing import CliRunner

    from effectgate.cli import main
    from effectgate.integrations.mcp import gateway

    seen: list[Any] = []
    monkeypatch.setattr(gateway, "run_gateway",
                        lambda *a, **kw: seen.append(kw["call_timeout_seconds"]) or 0)
    base = ["mcp", "gateway", "--upstream", "python up.py", "--url", store_url,
            "--namespace", namespace]
    for extra, code in (([], 0), (["--call-timeout", "2.5"], 0), (["--call-timeout", "0"], 2),
                        (["--call-timeout", "-1"], 2)):
        assert CliRunner().invoke(main, base + extra).exit_code == code, extra
    assert seen == [300.0, 2.5]


# -- GateServer.run_stdio_async run twice at once ------------------------------------------------

TWICE_SERVER = """\
import sys
import anyio
import effectgate as eg
from effectgate.integrations.mcp import build_server

url, policy, report = sys.argv[1:4]


async def second_run(server):
    try:
        await server.run_stdio_async()
    except eg.EffectGateError as err:
        return f"{{type(err).__name__}}: {{err.message}}"
    return "returned"


async def main():
    gate = eg.Gate(url, namespace="twice", policy=eg.Policy.load(policy))
    server = build_server(gate, console_url={console!r}, input_ended=anyio.Event())
    said = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.run_stdio_async)
        await anyio.sleep(0.3)
        said.append(await second_run(server))  # while the first serves
        with open(report + ".during", "w") as out:
            out.write(said[0])
    said.append(await second_run(server))  # after it: stdin at its end
    with open(report, "w") as out:
        out.write("\\n".join(said))


anyio.run(main)
"""


def test_a_second_stdio_run_at_once_is_refused_and_leaves_the_first_ones_approvals_alone(
        tmp_path: Path) -> None:
    """``build_server(gate, input_ended=event)``: a second ``run_stdio_async`` while the first
    serves is refused (ConfigError: a process has one stdin). It used to read the null device
    the first leaves on fd 0, end at once as though its client had left, and set the shared
    event: the first run's client, still there, was then never elicited for an approval
    (answered approval_required at once). A run after the first has ended is not refused.
    SQLite only: the store plays no part."""
    from .test_mcp_stdio_gone import (
        CONSOLE,
        REFUND,
        SERVE_POLICY,
        Leaving,
        _call,
        _decision,
        _wait_for,
    )

    policy = tmp_path / "effectgate.toml"
    policy.write_text(SERVE_POLICY, encoding="utf-8")
    script = tmp_path / "server.py"
    script.write_text(TWICE_SERVER.format(console=CONSOLE), encoding="utf-8")
    report = tmp_path / "said.txt"
    url = f"sqlite:///{tmp_path / 'effects.db'}"
    raw = Leaving([sys.executable, str(script), url, str(policy), str(report)])
    try:
        _wait_for(Path(f"{report}.during"))
        _call(raw, 1, "begin_effect", REFUND)
        asked = raw.receive()
        assert asked.get("method") == "elicitation/create", asked
        [answer] = [m for m in raw.until_exit() if m.get("id") == 1]
    finally:
        stop(raw.proc)
    assert _decision(answer)["decision"] == "approval_required"
    during, after = report.read_text(encoding="utf-8").splitlines()
    assert during.startswith("ConfigError: stdio is already being served in this process")
    assert after == "returned"
