"""``effectgate mcp gateway``: a real upstream MCP server (``tests/mcp_upstream.py``, which
appends a line to a ledger file per execution) behind the gateway, both real processes, driven
by the mcp package's own client; store tests on SQLite and Postgres. Where the subject is what
the gateway decides (strict, approvals, keys, redaction, its answers), the gateway runs in
this process in front of one upstream process that the tests share (``shared_upstream``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult

from . import mcp_upstream
from .mcp_helpers import SharedUpstream, gateway_in_process, tag

CLI = ["-m", "effectgate.cli"]
UPSTREAM = shlex.join([sys.executable, str(Path(mcp_upstream.__file__))])
POLICY = """
[effects."sms.send"]
key = "sms:{to}:{text}"
tools = ["send_message"]

[effects."sms.slow"]
key = "slow:{to}"
tools = ["slow_send"]
lease_seconds = 0.3
"""


SLOW_START_SECONDS = 2.5  # a slow start: past the 1 s lease of the test that uses it


class Upstream:
    """The files the upstream process writes and reads."""

    def __init__(self, folder: Path) -> None:
        self.ledger = folder / "ledger.txt"
        self.started = folder / "started.txt"
        self.refuse = folder / "refuse-start"
        self.errlog = folder / "gateway.err"
        self.policy = folder / "effectgate.toml"
        self.policy.write_text(POLICY, encoding="utf-8")

    def env(self) -> dict[str, str]:
        return {**os.environ, "LEDGER": str(self.ledger), "STARTED": str(self.started),
                "REFUSE_START": str(self.refuse)}

    def lines(self) -> list[str]:
        return self.ledger.read_text(encoding="utf-8").splitlines() if self.ledger.exists() else []

    def stderr(self) -> str:
        return self.errlog.read_text(encoding="utf-8")


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    return Upstream(tmp_path)


@asynccontextmanager
async def gateway(up: Upstream, *args: str, target: str = UPSTREAM,
                  slow_start: Path | None = None) -> AsyncIterator[ClientSession]:
    """A client session on ``effectgate mcp gateway --upstream TARGET ARGS`` over stdio
    (``slow_start``: a file that, once it exists, makes the upstream start slowly)."""
    env = up.env() if slow_start is None else {**up.env(), "SLOW_START": str(slow_start),
                                               "SLOW_START_SECONDS": str(SLOW_START_SECONDS)}
    params = StdioServerParameters(
        command=sys.executable, env=env,
        args=[*CLI, "mcp", "gateway", "--upstream", target, *args])
    with up.errlog.open("w", encoding="utf-8") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def http_upstream(argv: list[str], env: dict[str, str]) -> AsyncIterator[str]:
    """``python ARGV PORT`` on a free port, once it accepts connections: its MCP URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, *argv, str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(60):
            while True:
                try:
                    await anyio.connect_tcp("127.0.0.1", port)
                    break
                except OSError:
                    assert proc.poll() is None
                    await anyio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def text(result: CallToolResult) -> str:
    return result.content[0].text  # type: ignore[union-attr]


def refusal(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    return json.loads(text(result))  # type: ignore[no-any-return]


def decision(result: CallToolResult) -> str:
    return str((result.meta or {})["effectgate"]["decision"])


def open_gate(store_url: str, namespace: str) -> eg.Gate:
    return eg.Gate(store_url, namespace=namespace)


def scoped(key: str, target: str = UPSTREAM) -> str:
    """``key`` as the gateway in front of ``target`` records it (its upstream's scope first)."""
    from effectgate.integrations.mcp.identity import UpstreamIdentity

    return f"{UpstreamIdentity.of(target).key_scope}:{key}"


async def test_gateway_runs_a_repeated_call_once_and_refuses_unresolvable_keys(
        upstream: Upstream, store_url: str, namespace: str) -> None:
    """Same tools as the upstream; the same call twice runs upstream once and the second answer
    is the stored result; a key that cannot be rendered fails before the upstream is called; an
    upstream tool error leaves the effect AMBIGUOUS and its retry is refused; the ungated tool
    is printed at start and passes through."""
    store = ["--url", store_url, "--namespace", namespace, "--policy", str(upstream.policy)]
    with anyio.fail_after(60):
        async with gateway(upstream, *store) as s:
            assert s.server_info is not None
            assert s.server_info.name == "test-upstream (gated by effectgate)"
            listed = [t.model_dump(by_alias=True) for t in (await s.list_tools()).tools]
            direct = [t.model_dump(by_alias=True) for t in await mcp_upstream.server.list_tools()]
            assert listed == direct

            first = await s.call_tool("send_message", {"to": "+100", "text": "shipped"})
            second = await s.call_tool("send_message", {"to": "+100", "text": "shipped",
                                                        "channel": "sms"})
            assert not first.is_error and not second.is_error
            assert text(first) == text(second) == "sent 'shipped' to +100 by sms"
            assert second.structured_content == first.structured_content
            assert (decision(first), decision(second)) == ("execute", "duplicate")
            assert upstream.lines() == ["sms:+100:shipped"]

            empty = refusal(await s.call_tool("send_message", {"to": "", "text": "x"}))
            assert empty["error"] == "EffectKeyError"
            invalid = refusal(await s.call_tool("send_message", {"to": "+1"}))
            assert invalid["error"] == "InvalidArguments"
            assert upstream.lines() == ["sms:+100:shipped"]

            rejected = await s.call_tool("send_message", {"to": "reject", "text": "x"})
            assert rejected.is_error and "carrier rejected" in text(rejected)
            assert "AMBIGUOUS" in rejected.content[-1].text  # type: ignore[union-attr]
            retry = refusal(await s.call_tool("send_message", {"to": "reject", "text": "x"}))
            assert retry["error"] == "EffectAmbiguous" and retry["decision"] == "blocked"

            looked = await s.call_tool("lookup", {"name": "alice"})
            assert text(looked) == "ALICE" and looked.meta is None

    printed = upstream.stderr().splitlines()
    assert "effectgate: ungated tool, no effect declared: lookup" in printed
    assert not any(line.endswith(("send_message", "slow_send")) for line in printed)
    gate = open_gate(store_url, namespace)
    try:
        sent = gate.get(scoped("sms:+100:shipped"))
        assert sent.state is eg.State.COMMITTED and sent.attempt == 1
        assert sent.result["content"][0]["text"] == "sent 'shipped' to +100 by sms"
        assert gate.get(scoped("sms:reject:x")).state is eg.State.AMBIGUOUS
        with pytest.raises(eg.UnknownEffect):
            gate.get(scoped("sms::x"))
    finally:
        gate.close()


async def test_upstream_killed_mid_call_leaves_the_effect_ambiguous(
        upstream: Upstream, store_url: str, namespace: str) -> None:
    """SIGKILL on the upstream while it runs a gated call: AMBIGUOUS, and the retry is refused
    without reaching the upstream. An upstream that then cannot start leaves the next call
    FAILED (never sent); once it can, that call runs as attempt 2."""
    store = ["--url", store_url, "--namespace", namespace, "--policy", str(upstream.policy)]
    with anyio.fail_after(60):
        async with gateway(upstream, *store) as s:
            answers: list[CallToolResult] = []

            async def slow() -> None:
                answers.append(await s.call_tool("slow_send", {"to": "+7", "seconds": 30}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                while not upstream.started.exists() or not upstream.started.read_text():
                    await anyio.sleep(0.05)
                os.kill(int(upstream.started.read_text()), signal.SIGKILL)
            lost = refusal(answers[0])
            assert lost["error"] == "UpstreamLost" and lost["key"] == scoped("slow:+7")
            assert "AMBIGUOUS" in lost["what_to_do"]

            upstream.started.unlink()
            retry = refusal(await s.call_tool("slow_send", {"to": "+7", "seconds": 30}))
            assert retry["error"] == "EffectAmbiguous"
            assert not upstream.started.exists()

            upstream.refuse.touch()
            refused = refusal(await s.call_tool("send_message", {"to": "+8", "text": "x"}))
            assert refused["error"] == "NotExecuted"
            upstream.refuse.unlink()
            ran = await s.call_tool("send_message", {"to": "+8", "text": "x"})
            assert not ran.is_error and (ran.meta or {})["effectgate"]["attempt"] == 2

    assert upstream.lines() == ["sms:+8:x"]
    gate = open_gate(store_url, namespace)
    try:
        assert gate.get(scoped("slow:+7")).state is eg.State.AMBIGUOUS
        record = gate.get(scoped("sms:+8:x"))
        assert record.state is eg.State.COMMITTED and record.attempt == 2
        assert [h.to_state for h in record.history] == [
            eg.State.IN_FLIGHT, eg.State.FAILED, eg.State.IN_FLIGHT, eg.State.COMMITTED]
    finally:
        gate.close()


async def test_gateway_gates_an_http_upstream(upstream: Upstream, store_url: str,
                                              namespace: str,
                                              shared_upstream: SharedUpstream) -> None:
    """An upstream over streamable HTTP is gated the same way: one execution for two calls;
    a call that outlasts its lease (0.3 s) commits, because the gateway extends the lease while
    the upstream works."""
    http, t = shared_upstream.url, tag()
    with anyio.fail_after(60):
        async with gateway(upstream, "--url", store_url, "--namespace", namespace,
                           "--policy", str(upstream.policy), target=http) as s:
            for expected in ("execute", "duplicate"):
                result = await s.call_tool("send_message", {"to": f"+9-{t}", "text": "hi"})
                assert decision(result) == expected and text(result).startswith("sent")
            slow = await s.call_tool("slow_send", {"to": f"+10-{t}", "seconds": 1.0})
            assert not slow.is_error and decision(slow) == "execute"
    assert shared_upstream.lines(t) == [f"sms:+9-{t}:hi", f"slow:+10-{t}"]
    with open_gate(store_url, namespace) as gate:
        assert gate.get(scoped(f"slow:+10-{t}", http)).state is eg.State.COMMITTED


async def test_a_slow_restart_of_the_upstream_never_outlasts_the_lease(
        upstream: Upstream, store_url: str, namespace: str) -> None:
    """The upstream died; its restart takes 2.5 s (and its imports), the lease 1 s. The
    heartbeat began only once the upstream was ready, so the lease lapsed while the gateway
    reconnected: an operator could resolve the AMBIGUOUS effect FAILED and a retry send it,
    and then the lapsed holder's call left too. The lease is kept from the start: IN_FLIGHT
    throughout, and the call leaves once, under it."""
    policy = upstream.policy.with_name("short-lease.toml")
    policy.write_text('[effects."sms.send"]\nkey = "sms:{to}:{text}"\ntools = ["send_message"]'
                      '\nlease_seconds = 1\n\n[effects."sms.slow"]\nkey = "slow:{to}"\n'
                      'tools = ["slow_send"]\n', encoding="utf-8")
    slow_start = upstream.started.with_name("slow-start")
    with anyio.fail_after(90):
        async with gateway(upstream, "--url", store_url, "--namespace", namespace,
                           "--policy", str(policy), slow_start=slow_start) as s:
            await s.call_tool("slow_send", {"to": "+0", "seconds": 0})  # its pid, in STARTED
            slow_start.touch()
            os.kill(int(upstream.started.read_text()), signal.SIGKILL)
            seen: set[eg.State] = set()
            answers: list[CallToolResult] = []

            async def send() -> None:
                answers.append(await s.call_tool("send_message", {"to": "+1", "text": "x"}))

            gate = open_gate(store_url, namespace)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send)
                    while not answers:
                        with contextlib.suppress(eg.UnknownEffect):
                            seen.add(gate.get(scoped("sms:+1:x")).state)
                        await anyio.sleep(0.1)
                assert seen <= {eg.State.IN_FLIGHT, eg.State.COMMITTED}, seen
                assert eg.State.IN_FLIGHT in seen
                [answer] = answers
                assert not answer.is_error and decision(answer) == "execute"
                assert gate.get(scoped("sms:+1:x")).attempt == 1
            finally:
                gate.close()
    assert upstream.lines() == ["slow:+0", "sms:+1:x"]


@pytest.mark.parametrize("mode", ["json", "sse"])
async def test_an_upstream_reply_the_client_cannot_read_leaves_the_effect_ambiguous(
        upstream: Upstream, store_url: str, namespace: str, mode: str) -> None:
    """The upstream ran the call, then answered with JSON the mcp client cannot validate (a
    lone surrogate escape, as a JavaScript server writes a string cut inside an emoji). The
    client makes up a PARSE_ERROR, which the gateway took for the upstream refusing the call:
    FAILED, "nothing happened", and each retry sent the message again (3 in 3 calls)."""
    unreadable = str(Path(__file__).with_name("mcp_unreadable_upstream.py"))
    async with http_upstream([unreadable], {**upstream.env(), "MODE": mode}) as http:
        with anyio.fail_after(60):
            async with gateway(upstream, "--url", store_url, "--namespace", namespace,
                               "--policy", str(upstream.policy), target=http) as s:
                lost = refusal(await s.call_tool("send_message", {"to": "+1", "text": "pay"}))
                assert lost["error"] == "UpstreamLost", lost
                for _ in range(2):
                    again = refusal(await s.call_tool("send_message",
                                                      {"to": "+1", "text": "pay"}))
                    assert again["error"] == "EffectAmbiguous", again
        assert upstream.lines() == ["sms:+1:pay"]
        gate = open_gate(store_url, namespace)
        try:
            record = gate.get(scoped("sms:+1:pay", http))
            assert record.state is eg.State.AMBIGUOUS and record.attempt == 1
        finally:
            gate.close()


async def test_strict_gateway_refuses_ungated_tools_and_can_trust_tool_errors(
        upstream: Upstream, shared_upstream: SharedUpstream, tmp_path: Path) -> None:
    """--strict: the undeclared tool is printed as refused and a call to it never reaches the
    upstream. --tool-errors failed: an upstream tool error leaves the effect FAILED, so the
    same call may run again. (The gateway in this process, in front of a shared upstream.)"""
    url = f"sqlite:///{tmp_path / 'effects.db'}"
    start = io.StringIO()
    with eg.Gate(url, policy=eg.Policy.load(upstream.policy)) as gate, anyio.fail_after(60):
        async with gateway_in_process(gate, shared_upstream.url, out=start, strict=True,
                                      tool_errors="failed") as s:
            answer = refusal(await s.call_tool("lookup", {"name": "alice"}))
            assert answer["error"] == "UngatedTool"
            for _ in range(2):
                rejected = await s.call_tool("send_message", {"to": "reject", "text": "x"})
                assert rejected.is_error and "carrier rejected" in text(rejected)
                assert "did not happen" in rejected.content[-1].text  # type: ignore[union-attr]
    assert "effectgate: refused (strict) tool, no effect declared: lookup" in (
        start.getvalue().splitlines())
    with eg.Gate(url) as gate:
        record = gate.get(scoped("sms:reject:x", shared_upstream.url))
        assert record.state is eg.State.FAILED and record.attempt == 2


def test_gateway_will_not_start_when_a_template_names_a_missing_argument(
        upstream: Upstream, tmp_path: Path) -> None:
    """A key template that names an argument the upstream tool lacks fails at start (exit 2),
    not at the first call."""
    upstream.policy.write_text(POLICY.replace("sms:{to}:{text}", "sms:{phone}"),
                               encoding="utf-8")
    done = subprocess.run(
        [sys.executable, *CLI, "mcp", "gateway", "--upstream", UPSTREAM,
         "--url", f"sqlite:///{tmp_path / 'effects.db'}", "--policy", str(upstream.policy)],
        env=upstream.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 2
    assert "phone" in done.stderr and "send_message" in done.stderr


async def test_a_2026_client_goes_through_the_gateway(upstream: Upstream, store_url: str,
                                                      namespace: str) -> None:
    """A client on the 2026-07-28 protocol (the mcp package's ``Client``, which negotiates it:
    each request carries its own envelope) lists the same tools and is gated the same way."""
    from mcp import Client

    params = StdioServerParameters(
        command=sys.executable, env=upstream.env(),
        args=[*CLI, "mcp", "gateway", "--upstream", UPSTREAM, "--url", store_url,
              "--namespace", namespace, "--policy", str(upstream.policy)])
    with anyio.fail_after(60):
        async with Client(params) as client:
            assert client.protocol_version not in (None, "2025-11-25")
            listed = [t.name for t in (await client.list_tools()).tools]
            assert listed == [t.name for t in await mcp_upstream.server.list_tools()]
            answers = [await client.call_tool("send_message", {"to": "+5", "text": "new"})
                       for _ in range(2)]
    assert [decision(a) for a in answers] == ["execute", "duplicate"]
    assert upstream.lines() == ["sms:+5:new"]


async def test_gateway_over_http_says_where_it_listens_and_gates_the_same(
        upstream: Upstream, store_url: str, namespace: str) -> None:
    """``--transport http --port 0``: the start line names the URL it listens on (loopback);
    two clients in turn, each with its own upstream session, share one store: the second
    client's repeat is answered from it."""
    import httpx

    from .mcp_helpers import serving
    from .test_mcp_http_auth import session

    with open_gate(store_url, namespace) as gate:
        _, token = gate.add_principal("gw-agent", "agent")
        _, operator = gate.add_principal("gw-operator", "operator")
    argv = [sys.executable, *CLI, "mcp", "gateway", "--upstream", UPSTREAM, "--url", store_url,
            "--namespace", namespace, "--policy", str(upstream.policy), "--transport", "http",
            "--port", "0"]
    with serving(argv, env=upstream.env()) as served:
        assert served.url.startswith("http://127.0.0.1:") and served.url.endswith("/mcp")
        assert any("auth: bearer tokens of agent principals" in line for line in served.lines)
        with anyio.fail_after(60):
            async with httpx.AsyncClient() as client:  # no token, or an operator's: refused
                hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
                bare = await client.post(served.url, json=hello)
                as_operator = await client.post(
                    served.url, json=hello, headers={"Authorization": f"Bearer {operator}"})
            assert bare.status_code == 401 and as_operator.status_code == 403
            seen = []
            for _ in range(2):
                async with session(served.url, token) as s:
                    seen.append(await s.call_tool("send_message", {"to": "+6", "text": "hi"}))
        assert "effectgate: gated tool send_message: sms.send key 'sms:{to}:{text}'" in (
            served.lines)
    assert [decision(a) for a in seen] == ["execute", "duplicate"]
    assert upstream.lines() == ["sms:+6:hi"]
    with open_gate(store_url, namespace) as gate:  # recorded for the agent its token proves
        [effect] = gate.list_effects()
        assert effect.agent_id == "gw-agent"


def test_gateway_no_auth_only_on_localhost(upstream: Upstream, store_url: str) -> None:
    proc = subprocess.run(
        [sys.executable, *CLI, "mcp", "gateway", "--upstream", UPSTREAM, "--url", store_url,
         "--transport", "http", "--host", "0.0.0.0", "--allow-remote", "--no-auth"],
        capture_output=True, text=True, timeout=60, env=upstream.env())
    assert proc.returncode == 2, proc.stderr
    assert "--no-auth only on localhost" in proc.stderr


async def test_a_cancelled_call_is_cancelled_upstream_and_left_ambiguous(
        upstream: Upstream, store_url: str, namespace: str) -> None:
    """The client gives up on a gated call while the upstream works: the cancellation reaches
    the upstream (its tool never finishes: no ledger line, even after its sleep would have
    ended) and the effect is AMBIGUOUS, so a retry is refused rather than run twice."""
    store = ["--url", store_url, "--namespace", namespace, "--policy", str(upstream.policy)]
    with anyio.fail_after(60):
        async with gateway(upstream, *store) as s:
            with anyio.move_on_after(30) as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(s.call_tool, "slow_send", {"to": "+11", "seconds": 1.5})
                    while not upstream.started.exists():
                        await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()
            assert not scope.cancelled_caught
            await anyio.sleep(2.5)  # past the upstream's sleep
            retry = refusal(await s.call_tool("slow_send", {"to": "+11", "seconds": 1.5}))
            assert retry["error"] == "EffectAmbiguous"
    assert upstream.lines() == []
    gate = open_gate(store_url, namespace)
    try:
        assert gate.get(scoped("slow:+11")).state is eg.State.AMBIGUOUS
    finally:
        gate.close()


# -- what the gateway sends, stores and keys ---------------------------------------------------

FILES_POLICY = """
[effects."fs.write"]
key = "write:{path|path}:{content|sha256}"
tools = ["write_file"]
approval = "always"

[effects."pay.charge"]
key = "charge:{ref}"
tools = ["charge"]
redact_result = ["card"]

[effects."sms.slow"]
key = "slow:{to}"
tools = ["slow_send"]
approval = "always"

[effects."sms.send"]
key = "sms:{to}:{text}"
tools = ["send_message"]
"""


def all_text(result: CallToolResult) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def files_policy(folder: Path) -> eg.Policy:
    path = folder / "files-policy.toml"
    path.write_text(FILES_POLICY, encoding="utf-8")
    return eg.Policy.load(path)


async def approved_call(s: ClientSession | Client, gate: eg.Gate, tool: str,
                        arguments: dict[str, Any]) -> tuple[CallToolResult, Any]:
    """Call ``tool``; it waits for approval: approve it (as a person would, in the store),
    call again. The answer and the arguments the approver was shown."""
    waiting = refusal(await s.call_tool(tool, arguments))
    assert waiting["error"] == "ApprovalRequired", waiting
    shown = gate.approval(waiting["approval_id"]).arguments
    gate.approve(waiting["approval_id"], by="alice")
    return await s.call_tool(tool, arguments), shown


async def test_the_upstream_receives_exactly_what_was_approved_and_keyed(
        shared_upstream: SharedUpstream, store_url: str, namespace: str,
        tmp_path: Path) -> None:
    """``{path|path}``: the approver is shown, the key is built from, and the upstream receives
    one and the same path. Where a symlink precedes ``..`` (``link/../a.txt`` is not
    ``a.txt`` on the filesystem), the path keeps its ``..``: the write lands where the path
    says, and a later write of ``a.txt`` is its own effect, not answered as a duplicate."""
    root = tmp_path / "files"
    (root / "real" / "sub").mkdir(parents=True)
    (root / "link").symlink_to(root / "real" / "sub", target_is_directory=True)
    with open_gate(store_url, namespace) as gate, eg.Gate(
            store_url, namespace=namespace, policy=files_policy(tmp_path)) as gated:
        with anyio.fail_after(60):
            async with gateway_in_process(gated, shared_upstream.url) as s:
                answers = []
                for path in (f"{root}/link/../a.txt", f"{root}/a.txt", f"{root}//./b.txt"):
                    answer, shown = await approved_call(s, gate, "write_file",
                                                        {"path": path, "content": "v"})
                    assert not answer.is_error and decision(answer) == "execute", all_text(answer)
                    answers.append((shown["path"], shared_upstream.lines(str(root))[-1]))
    assert answers == [(f"{root}/link/../a.txt", f"write:{root}/link/../a.txt"),
                       (f"{root}/a.txt", f"write:{root}/a.txt"),
                       (f"{root}/b.txt", f"write:{root}/b.txt")]
    assert (root / "real" / "a.txt").read_text() == "v"  # where link/../a.txt really is
    assert (root / "a.txt").read_text() == "v" and (root / "b.txt").read_text() == "v"


async def test_a_redacted_result_field_is_stored_nowhere_and_never_repeated(
        shared_upstream: SharedUpstream, store_url: str, namespace: str,
        tmp_path: Path) -> None:
    """``redact_result = ["card"]``: the upstream answers the card in its structured content
    and in the text that carries the same JSON. The store holds neither, and the repeat's
    answer (from the store) shows the field as redacted in both."""
    card, ref = f"4242-{os.getpid()}-CARD", f"r1-{tag()}"
    with eg.Gate(store_url, namespace=namespace, policy=files_policy(tmp_path)) as gated, \
            anyio.fail_after(60):
        async with gateway_in_process(gated, shared_upstream.url) as s:
            first = await s.call_tool("charge", {"ref": ref, "card": card})
            again = await s.call_tool("charge", {"ref": ref, "card": card})
    assert decision(first) == "execute" and card in all_text(first)  # the live answer
    assert decision(again) == "duplicate"
    assert again.structured_content == {"charge_id": f"ch_{ref}", "card": "[redacted]"}
    assert card not in all_text(again) and f"ch_{ref}" in all_text(again)
    assert json.loads(text(again)) == again.structured_content
    with open_gate(store_url, namespace) as gate:
        stored = gate.get((first.meta or {})["effectgate"]["key"]).result
    assert card not in json.dumps(stored) and f"ch_{ref}" in json.dumps(stored)
    assert shared_upstream.lines(ref) == [f"charge:{ref}"]


async def test_every_answer_names_only_tools_the_gateway_offers(
        shared_upstream: SharedUpstream, store_url: str, namespace: str,
        tmp_path: Path) -> None:
    """Waiting for approval, in flight, denied, ambiguous, a key mismatch, an unusable key:
    what the gateway tells the agent to do names this tool (or none), never a tool of
    ``mcp serve`` (``begin_effect`` ...) that the gateway does not offer."""
    from effectgate.integrations.mcp import build_server

    gate = open_gate(store_url, namespace)
    gated = eg.Gate(store_url, namespace=namespace, policy=files_policy(tmp_path))
    protocol = {t.name for t in await build_server(gate, allow_resolve=True).list_tools()}
    assert "begin_effect" in protocol
    answers: dict[str, dict[str, Any]] = {}
    try:
        with anyio.fail_after(60):
            async with gateway_in_process(gated, shared_upstream.url) as s:
                offered = {t.name for t in (await s.list_tools()).tools}
                waiting = refusal(await s.call_tool("slow_send", {"to": "+1", "seconds": 0}))
                answers["approval"] = waiting
                gate.deny(waiting["approval_id"], by="alice", reason="not today")
                answers["denied"] = refusal(
                    await s.call_tool("slow_send", {"to": "+1", "seconds": 0}))
                first = await s.call_tool("send_message", {"to": "+2", "text": "x"})
                key = (first.meta or {})["effectgate"]["key"]
                answers["mismatch"] = refusal(
                    await s.call_tool("send_message", {"to": "+2", "text": "x",
                                                       "channel": "fax"}))
                held = gate.begin(effect_type="sms.send", key=key.replace("+2", "+3"),
                                  payload={"to": "+3", "text": "x", "channel": "sms"},
                                  lease_seconds=60)
                answers["in_flight"] = refusal(
                    await s.call_tool("send_message", {"to": "+3", "text": "x"}))
                gate.report(held, "ambiguous", error="lost")
                answers["blocked"] = refusal(
                    await s.call_tool("send_message", {"to": "+3", "text": "x"}))
                answers["key"] = refusal(await s.call_tool("send_message",
                                                           {"to": " ", "text": "x"}))
    finally:
        gate.close()
        gated.close()
    assert [a["error"] for a in answers.values()] == [
        "ApprovalRequired", "EffectDenied", "PayloadMismatch", "EffectInFlight",
        "EffectAmbiguous", "EffectKeyError"]
    for what, answer in answers.items():
        said = json.dumps(answer)
        assert not {name for name in protocol - offered if name in said}, (what, said)
    for what in ("approval", "in_flight"):
        assert "call this tool again" in answers[what]["what_to_do"], answers[what]


async def test_no_gateway_text_names_a_tool_of_mcp_serve() -> None:
    """Every hint the gateway can send, not only those the test above provokes."""
    from effectgate.integrations._kernel import vocabulary
    from effectgate.integrations.mcp import build_server
    from effectgate.testing import temporary_gate

    with temporary_gate() as gate:
        protocol = {t.name for t in await build_server(gate, allow_resolve=True).list_tools()}
    texts = [*vocabulary.GATEWAY_HINTS.values(), vocabulary.UPSTREAM_AMBIGUOUS,
             vocabulary.UPSTREAM_FAILED]
    assert protocol and not [t for t in texts if any(name in t for name in protocol)]


async def test_two_instances_of_one_server_behind_two_gateways_never_share_keys(
        tmp_path: Path, store_url: str, namespace: str) -> None:
    """The reference filesystem server twice, on two roots, each behind its own gateway with
    its own ``mcp init`` policy, on one store: both report the same name and offer the same
    tools, and ``write_file`` of ``notes.txt`` means another file behind each. Each write
    runs (the second root's is not answered as the first's duplicate); each repeats once."""
    from .mcp_helpers import gateway_args, npm_command, npm_env, require_npm, stdio_session

    require_npm("mcp-server-filesystem")
    env = npm_env()
    answers: dict[str, list[str]] = {}
    bindings: list[bool] = []  # each policy's [upstreams] entry names its own server
    for name in ("a", "b"):
        root = tmp_path / name
        root.mkdir()
        target = npm_command("mcp-server-filesystem", str(root))
        policy = tmp_path / f"{name}.toml"
        done = subprocess.run([sys.executable, *CLI, "mcp", "init", "--upstream", target,
                               "-o", str(policy)], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        bindings.append(f"command = {json.dumps(target)}" in policy.read_text(encoding="utf-8"))
        args = gateway_args(target, "--policy", str(policy), "--url", store_url,
                            "--namespace", namespace)
        with anyio.fail_after(90):
            async with stdio_session(sys.executable, args, env=env) as s:
                for _ in range(2):
                    answer = await s.call_tool("write_file", {"path": "notes.txt",
                                                              "content": "hello"})
                    assert not answer.is_error, all_text(answer)
                    answers.setdefault(name, []).append(decision(answer))
    assert answers == {"a": ["execute", "duplicate"], "b": ["execute", "duplicate"]}
    assert (tmp_path / "a" / "notes.txt").read_text() == "hello"
    assert (tmp_path / "b" / "notes.txt").read_text() == "hello"
    assert bindings == [True, True]
