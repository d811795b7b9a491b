"""A stdio client that closes the server's stdin (how an MCP client shuts its server down)
while an approval is elicited from it (URL mode, ``--console-url``) can answer nothing more.
The call waiting for that answer used to wait on, for the decision or the approval wait (300
s), and the server did not exit on EOF. Now the wait ends at once with one read of the
approval: the call is answered as for a client that never answers (approval_required, nothing
begun: it may be gone), or, after an ``accept``, as the store says (approved: the gateway's
call proceeds, once; ``mcp serve`` hands an execute lease only to a client still there), and
the server exits 0. ``mcp serve`` and the gateway (a gated upstream tool), as real processes
fed raw JSON-RPC lines. Also: a client that dies (both pipes closed) while another gated call
runs upstream, and an upstream's own question to a client that has left.

SQLite only: the store plays no part in the fault (the wait reads the approval through the
gate, as on any store)."""

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
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from effectgate.integrations.mcp.elicit import ApprovalElicitor

from . import mcp_conformance_upstream
from .mcp_helpers import stop
from .test_mcp_gateway import UPSTREAM, Upstream

CLI = [sys.executable, "-m", "effectgate.cli"]
CONSOLE = "http://127.0.0.1:8765"
EXIT_WITHIN = 8.0  # seconds after stdin closes; the approval wait is 300
SERVE_POLICY = '[effects."payment.refund"]\napproval = "always"\n'
GATEWAY_POLICY = ('[effects."sms.send"]\nkey = "sms:{to}:{text}"\ntools = ["send_message"]\n'
                  'approval = "always"\n')
REFUND = {"effect_type": "payment.refund", "key": "refund:T1", "payload": {"txn_id": "T1"}}


class Leaving:
    """A raw stdio client that declares elicitation (``mode``: URL, or form), makes one call
    and reads the ``elicitation/create`` it gets, then closes stdin."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, *,
                 mode: str = "url") -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env or dict(os.environ),
                                     bufsize=0)
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {"elicitation": {mode: {}}},
            "clientInfo": {"name": "leaving", "version": "1"}}})
        assert self.receive()["id"] == 0
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 20) -> dict[str, Any]:
        assert self.proc.stdout is not None
        # stdout is unbuffered (bufsize=0): a buffered reader's readline could take two
        # answers at once, and select would then see no data for the second.
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "no message from the server"
        message: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return message

    def elicited(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call tool ``name``; the elicitation request it brings."""
        self.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": name, "arguments": arguments}})
        asked = self.receive()
        assert asked["method"] == "elicitation/create", asked
        assert asked["params"]["url"].startswith(f"{CONSOLE}/approvals/"), asked
        return asked

    def leave(self) -> dict[str, Any]:
        """Close stdin; the call's answer once the server has exited 0 (within
        ``EXIT_WITHIN`` seconds)."""
        [answer] = [m for m in self.until_exit() if m.get("id") == 1]
        return answer

    def until_exit(self) -> list[dict[str, Any]]:
        """Close stdin; every message the server wrote, once it has exited 0 (within
        ``EXIT_WITHIN`` seconds)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=EXIT_WITHIN)
        except subprocess.TimeoutExpired:
            stop(self.proc)
            pytest.fail(f"the server was still running {EXIT_WITHIN} s after stdin closed")
        assert code == 0
        return [json.loads(line) for line in self.proc.stdout.read().splitlines()]


def _approve(gate: eg.Gate) -> None:
    [pending] = gate.list_approvals()
    gate.approve(pending.approval_id, by="alice")


def _decision(answer: dict[str, Any]) -> dict[str, Any]:
    decision: dict[str, Any] = json.loads(answer["result"]["content"][0]["text"])
    return decision


@pytest.mark.parametrize("client", ["silent", "accepts", "silent, approved first",
                                    "accepts, then approved"])
def test_serve_answers_and_exits_when_the_elicited_client_closes_stdin(
        tmp_path: Path, client: str) -> None:
    """``mcp serve``: the call answers approval_required (the effect waits for approval,
    nothing begun) unless the client accepted and a person approved (execute, once); the
    server exits 0 within seconds, not after the 300 s approval wait."""
    policy = tmp_path / "effectgate.toml"
    policy.write_text(SERVE_POLICY, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'effects.db'}"
    with eg.Gate(url, namespace="gone", policy=eg.Policy.load(policy)) as gate:
        raw = Leaving([*CLI, "mcp", "serve", "--url", url, "--namespace", "gone",
                       "--policy", str(policy), "--console-url", CONSOLE])
        try:
            asked = raw.elicited("begin_effect", REFUND)
            if client.startswith("accepts"):
                raw.send({"jsonrpc": "2.0", "id": asked["id"],
                          "result": {"action": "accept"}})
                time.sleep(0.3)
            if "approved" in client:
                _approve(gate)
            answer = raw.leave()
        finally:
            stop(raw.proc)
        decision = _decision(answer)
        if client == "accepts, then approved" and decision["decision"] == "execute":
            # the approval reached the call before the client left: it proceeds, once
            assert gate.get("refund:T1").state is eg.State.IN_FLIGHT
            return
        assert decision["decision"] == "approval_required", decision
        assert gate.get("refund:T1").state is eg.State.PENDING_APPROVAL
        again = gate.begin(**REFUND)  # the decision (or its absence) is kept for the next one
        # after the client left, nothing is begun for it (an execute lease it could never
        # report on would strand the effect): an approval stays for the next begin
        assert again.decision is (eg.Decision.EXECUTE if "approved" in client
                                  else eg.Decision.APPROVAL_REQUIRED)


@pytest.mark.parametrize("client", ["silent", "accepts, then approved"])
def test_the_gateway_answers_and_exits_when_the_elicited_client_closes_stdin(
        tmp_path: Path, client: str) -> None:
    """The gateway, for a gated upstream tool: a silent client's call is refused as waiting
    for approval and the upstream is never called; a client that accepted, its call approved,
    gets the tool's result (the upstream called once). Either way the gateway exits 0 within
    seconds."""
    up = Upstream(tmp_path)
    up.policy.write_text(GATEWAY_POLICY, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'effects.db'}"
    with eg.Gate(url, namespace="gone", policy=eg.Policy.load(up.policy)) as gate:
        raw = Leaving([*CLI, "mcp", "gateway", "--upstream", UPSTREAM, "--url", url,
                       "--namespace", "gone", "--policy", str(up.policy), "--console-url",
                       CONSOLE], env=up.env())
        try:
            asked = raw.elicited("send_message", {"to": "+1", "text": "hi"})
            if client != "silent":
                raw.send({"jsonrpc": "2.0", "id": asked["id"],
                          "result": {"action": "accept"}})
                time.sleep(0.3)
                _approve(gate)
            answer = raw.leave()
        finally:
            stop(raw.proc)
        [effect] = gate.list_effects()
    if client == "silent":
        assert answer["result"]["isError"] is True, answer
        assert _decision(answer)["decision"] == "approval_required", answer
        assert effect.state is eg.State.PENDING_APPROVAL
        assert up.lines() == []
    else:
        assert answer["result"]["isError"] is False, answer
        assert effect.state is eg.State.COMMITTED
        assert up.lines() == ["sms:+1:hi"]


async def test_a_retry_waiting_for_the_decision_stops_at_the_end_of_input(
        tmp_path: Path) -> None:
    """The wait for a decision (a 2026-07-28 retry's, :meth:`ApprovalElicitor.wait_decided`)
    ends when input ends: False while the approval is pending, without waiting it out."""
    policy = eg.Policy.from_dict({"effects": {"payment.refund": {"approval": "always"}}})
    with eg.Gate(f"sqlite:///{tmp_path / 'effects.db'}", namespace="gone",
                 policy=policy) as gate:
        approval_id = gate.begin(**REFUND).approval_id
        assert approval_id is not None
        ended = anyio.Event()
        elicitor = ApprovalElicitor(gate, CONSOLE, wait_seconds=60, input_ended=ended)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                started = time.monotonic()
                tg.start_soon(_end_after, ended, 0.3)
                assert await elicitor.wait_decided(approval_id) is False
        assert time.monotonic() - started < 2
        gate.approve(approval_id, by="alice")  # decided: one read says so, ended or not
        assert await elicitor.wait_decided(approval_id) is True


async def _end_after(ended: anyio.Event, seconds: float) -> None:
    await anyio.sleep(seconds)
    ended.set()


# -- found in review: a client that dies; an upstream's question to a client that left ----

SLOW_POLICY = ('[effects."sms.send"]\nkey = "sms:{to}:{text}"\ntools = ["send_message"]\n'
               'approval = "always"\n'
               '[effects."sms.slow"]\nkey = "slow:{to}"\ntools = ["slow_send"]\n'
               'lease_seconds = 5\n')
ASKING_UPSTREAM = f"{sys.executable} {Path(mcp_conformance_upstream.__file__)}"


def _call(raw: Leaving, request_id: int, name: str, arguments: dict[str, Any]) -> None:
    raw.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
              "params": {"name": name, "arguments": arguments}})


def _wait_for(path: Path, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_client_that_dies_while_elicited_leaves_no_running_gated_call_ambiguous(
        tmp_path: Path) -> None:
    """A gated ``slow_send`` is running upstream (2 s) and a ``send_message`` waits on its
    elicited approval when the client dies (both pipes closed). The running call ends and is
    recorded COMMITTED, the upstream having run it once; the gateway exits 0."""
    up = Upstream(tmp_path)
    up.policy.write_text(SLOW_POLICY, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'effects.db'}"
    raw = Leaving([*CLI, "mcp", "gateway", "--upstream", UPSTREAM, "--url", url,
                   "--namespace", "gone", "--policy", str(up.policy), "--console-url",
                   CONSOLE], env=up.env())
    try:
        _call(raw, 1, "slow_send", {"to": "A", "seconds": 2})
        _wait_for(up.started)  # the upstream is running it
        _call(raw, 2, "send_message", {"to": "+1", "text": "hi"})
        assert raw.receive()["method"] == "elicitation/create"
        assert raw.proc.stdin is not None and raw.proc.stdout is not None
        raw.proc.stdin.close()  # the client dies: neither pipe has a reader or writer
        raw.proc.stdout.close()
        try:
            code = raw.proc.wait(timeout=EXIT_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the gateway was still running {EXIT_WITHIN} s after its client died")
    finally:
        stop(raw.proc)
    with eg.Gate(url, namespace="gone") as gate:
        states = {e.key: e.state for e in gate.list_effects()}
    [slow] = [state for key, state in states.items() if ":slow:" in key]
    assert slow is eg.State.COMMITTED, states
    assert up.lines() == ["slow:A"]
    assert code == 0


def test_a_gateway_whose_upstream_asks_the_gone_client_exits(tmp_path: Path) -> None:
    """An upstream tool elicits (form mode) from the client through the gateway; the client
    closes stdin instead of answering. The gateway answers the call and exits within
    seconds."""
    policy = tmp_path / "effectgate.toml"
    policy.write_text("", encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'effects.db'}"
    raw = Leaving([*CLI, "mcp", "gateway", "--upstream", ASKING_UPSTREAM, "--url", url,
                   "--namespace", "gone", "--policy", str(policy)], mode="form")
    try:
        _call(raw, 1, "test_elicitation", {"message": "who are you?"})
        asked = raw.receive()
        assert asked["method"] == "elicitation/create", asked
        assert raw.proc.stdin is not None and raw.proc.stdout is not None
        raw.proc.stdin.close()
        try:
            code = raw.proc.wait(timeout=EXIT_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the gateway was still running {EXIT_WITHIN} s after stdin closed, "
                        "its upstream's question to the client unanswered")
        answers = [m for m in map(json.loads, raw.proc.stdout.read().splitlines())
                   if m.get("id") == 1]
    finally:
        stop(raw.proc)
    assert code == 0
    assert len(answers) == 1, answers
