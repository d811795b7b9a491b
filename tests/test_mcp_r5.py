"""Review round 5 of the MCP server and gateway.

The library's own way to run the server on stdio — ``build_server(gate).run()``, as
:mod:`effectgate.integrations.mcp.server` shows it — used the SDK's plain stdio transport: a
client that closed stdin while an approval was elicited from it was waited for the whole
approval wait (300 s), where ``effectgate mcp serve`` answers at once and exits. Both now take
one stdio path (``run_stdio_async`` of the server :func:`build_server` returns). A real process
runs the documented entry; a raw client declares URL elicitation, is elicited, closes stdin.

SQLite only: the store plays no part in the fault."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from .mcp_helpers import stop
from .test_mcp_gateway import UPSTREAM, Upstream
from .test_mcp_stdio_gone import (
    CLI,
    CONSOLE,
    REFUND,
    SERVE_POLICY,
    Leaving,
    _call,
    _decision,
    _wait_for,
)

LIBRARY_SERVER = """\
import sys
import effectgate as eg
from effectgate.integrations.mcp import build_server

url, policy = sys.argv[1], sys.argv[2]
build_server(eg.Gate(url, namespace="gone", policy=eg.Policy.load(policy)),
             console_url={console!r}).run()
"""


def test_build_server_run_answers_and_exits_when_the_elicited_client_closes_stdin(
        tmp_path: Path) -> None:
    """``build_server(gate).run()`` (stdio): a line with invalid UTF-8 is answered ``-32700``
    (never read as U+FFFD); the elicited call is answered approval_required and the process
    exits 0 within seconds of stdin closing (the SDK's own stdio answered it "Connection
    closed"); nothing is begun (the effect still waits for approval, the next begin asks
    again)."""
    policy = tmp_path / "effectgate.toml"
    policy.write_text(SERVE_POLICY, encoding="utf-8")
    script = tmp_path / "server.py"
    script.write_text(LIBRARY_SERVER.format(console=CONSOLE), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'effects.db'}"
    raw = Leaving([sys.executable, str(script), url, str(policy)])
    try:
        assert raw.proc.stdin is not None
        raw.proc.stdin.write(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": '
                             b'{"name": "begin_effect", "arguments": {"effect_type": "x", '
                             b'"key": "k\xff"}}}\n')
        raw.proc.stdin.flush()
        unread = raw.receive()
        assert (unread["id"], unread["error"]["code"]) == (7, -32700), unread
        raw.elicited("begin_effect", REFUND)
        answer = raw.leave()
    finally:
        stop(raw.proc)
    assert _decision(answer)["decision"] == "approval_required", answer
    with eg.Gate(url, namespace="gone", policy=eg.Policy.load(policy)) as gate:
        assert gate.get("refund:T1").state is eg.State.PENDING_APPROVAL
        assert gate.begin(**REFUND).decision is eg.Decision.APPROVAL_REQUIRED


# -- red team: request ids the SDK correlates differently from the end-of-input drain ----------

SLOW_POLICY = ('[effects."sms.send"]\nkey = "sms:{to}:{text}"\ntools = ["send_message"]\n'
               '[effects."sms.slow"]\nkey = "slow:{to}"\ntools = ["slow_send"]\n'
               'lease_seconds = 5\n')


def _gateway(tmp_path: Path) -> tuple[Leaving, Upstream, str]:
    up = Upstream(tmp_path)
    up.policy.write_text(SLOW_POLICY, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'effects.db'}"
    raw = Leaving([*CLI, "mcp", "gateway", "--upstream", UPSTREAM, "--url", url,
                   "--namespace", "r5", "--policy", str(up.policy)], env=up.env())
    return raw, up, url


def test_a_reused_request_id_does_not_cut_a_running_gated_call_at_the_end_of_input(
        tmp_path: Path) -> None:
    """Two calls under one JSON-RPC id (the SDK runs both): the quick one's answer no longer
    counts as the slow one's, so closing stdin lets the slow call, already upstream, finish
    and be recorded COMMITTED (it was cancelled at the end of input and left AMBIGUOUS, its
    answer "Connection closed")."""
    raw, up, url = _gateway(tmp_path)
    try:
        _call(raw, 1, "slow_send", {"to": "A", "seconds": 1.5})
        _wait_for(up.started)
        _call(raw, 1, "send_message", {"to": "+1", "text": "hi"})
        assert raw.receive()["result"]["isError"] is False
        answers = [m for m in raw.until_exit() if m.get("id") == 1]
    finally:
        stop(raw.proc)
    assert [a.get("result", {}).get("isError") for a in answers] == [False], answers
    with eg.Gate(url, namespace="r5") as gate:
        states = sorted(e.state.value for e in gate.list_effects())
    assert states == ["committed", "committed"]
    assert up.lines() == ["sms:+1:hi", "slow:A"]


def test_a_call_cancelled_under_its_id_as_a_string_lets_the_server_exit(
        tmp_path: Path) -> None:
    """``notifications/cancelled`` naming request 1 as ``"1"``: the SDK cancels request 1 (it
    correlates the two), so the end-of-input drain must not wait for it: the server exits
    (it waited for ever)."""
    raw, up, url = _gateway(tmp_path)
    try:
        _call(raw, 1, "slow_send", {"to": "B", "seconds": 30})
        _wait_for(up.started)
        raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": "1", "reason": "user"}})
        time.sleep(0.3)
        answers = [m for m in raw.until_exit() if m.get("id") == 1]
    finally:
        stop(raw.proc)
    assert answers == []  # a cancelled request is never answered (MCP)
    with eg.Gate(url, namespace="r5") as gate:
        [effect] = gate.list_effects()
    assert effect.state is eg.State.AMBIGUOUS  # cancelled after it left: never run again
    assert up.lines() == []
