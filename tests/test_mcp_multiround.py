"""MCP 2026-07-28: approvals through multi-round-trip requests, and the call a client re-issues
after a broken stream. ``mcp serve`` runs in-process under the mcp package's own ``Client``
(``mode="auto"`` speaks 2026-07-28, ``mode="legacy"`` the handshake), the gateway in front of
a real upstream process; both store backends."""

from __future__ import annotations

import io
import json
import shlex
import sys
import time
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

from effectgate.integrations.mcp.multiround import APPROVAL_INPUT, RoundKeys
from effectgate.integrations.mcp.reissue import NEVER_REACHED, begin_unlost
from effectgate.integrations.mcp.server import build_server

from . import mcp_upstream
from .conftest import snapshot

CONSOLE = "http://127.0.0.1:8765"
POLICY = {"effects": {"payment.refund": {"approval": "always"}}}
BEGIN = {"effect_type": "payment.refund", "key": "refund:T1",
         "payload": {"txn_id": "T1", "amount_cents": 50_000}, "agent_id": "billing"}
KEYS = RoundKeys(b"k" * 32)


def answer_of(result: Any) -> dict[str, Any]:
    return json.loads(result.content[0].text)  # type: ignore[no-any-return]


class Person:
    """A client's elicitation callback: records what it was asked and answers ``action``;
    with ``console`` (a second gate on the same store) a person decides there first."""

    def __init__(self, action: str = "accept", console: eg.Gate | None = None,
                 decide: str | None = None, content: dict[str, Any] | None = None) -> None:
        self.action, self.console, self.decide, self.content = action, console, decide, content
        self.asked: list[Any] = []

    async def __call__(self, context: Any, params: Any) -> types.ElicitResult:
        self.asked.append(params)
        if self.console is not None and self.decide is not None:
            [pending] = self.console.list_approvals()
            if self.decide == "approve":
                self.console.approve(pending.approval_id, by="alice")
            else:
                self.console.deny(pending.approval_id, by="alice", reason="no")
        return types.ElicitResult(action=self.action,  # type: ignore[arg-type]
                                  content=self.content)


@asynccontextmanager
async def serve(gate: eg.Gate, person: Person | None = None, *, mode: str = "auto",
                keys: RoundKeys = KEYS, **options: Any) -> AsyncIterator[Client]:
    server = build_server(gate, state_keys=keys, **{"console_url": CONSOLE, **options})
    kw: dict[str, Any] = {"mode": mode}
    if person is not None:
        kw["elicitation_callback"] = person
    with anyio.fail_after(30):
        async with Client(server, **kw) as client:
            yield client


@pytest.fixture
def pgate(make_gate: Any) -> eg.Gate:
    return make_gate(policy=POLICY)  # type: ignore[no-any-return]


async def first_round(client: Client, arguments: dict[str, Any] = BEGIN) -> Any:
    return await client.session.call_tool("begin_effect", arguments, allow_input_required=True)


# -- mcp serve -----------------------------------------------------------------------------------

async def test_a_2026_client_is_sent_to_the_console_inside_the_input_required_result(
        pgate: eg.Gate, make_gate: Any) -> None:
    person = Person("accept", make_gate(policy=POLICY), decide="approve")
    async with serve(pgate, person, approval_wait_seconds=5) as client:
        first = await first_round(client)
        [approval] = pgate.list_approvals()
        assert first.result_type == "input_required" and first.request_state
        asked = first.input_requests[APPROVAL_INPUT].params
        assert asked.mode == "url" and asked.url == f"{CONSOLE}/approvals/{approval.approval_id}"
        # the SDK's client drives the rounds: opens the page, a person approves, it retries
        answer = answer_of(await client.call_tool("begin_effect", BEGIN))
    assert answer["decision"] == "execute" and len(person.asked) == 1
    assert pgate.approval(approval.approval_id).decided_by == "alice"


async def test_the_same_state_replayed_after_the_effect_ran_is_answered_from_the_store(
        pgate: eg.Gate, make_gate: Any) -> None:
    """A requestState is not a ticket to run again: the replay gets the duplicate."""
    async with serve(pgate, Person("accept"), approval_wait_seconds=5) as client:
        first = await first_round(client)
        make_gate(policy=POLICY).approve(pgate.list_approvals()[0].approval_id, by="alice")
        accept = {APPROVAL_INPUT: types.ElicitResult(action="accept")}
        ran = answer_of(await client.session.call_tool(
            "begin_effect", BEGIN, input_responses=accept, request_state=first.request_state))
        assert ran["decision"] == "execute"
        await client.call_tool("report_effect", {
            "key": "refund:T1", "lease_token": ran["lease_token"],
            "lease_secret": ran["lease_secret"], "outcome": "committed",
            "result": {"refund_id": "re_1"}})
        again = answer_of(await client.session.call_tool(
            "begin_effect", BEGIN, input_responses=accept, request_state=first.request_state))
    assert again["decision"] == "duplicate" and again["result"] == {"refund_id": "re_1"}
    assert pgate.get("refund:T1").attempt == 1


@pytest.mark.parametrize("spoil", ["tamper", "other-arguments", "other-server", "expired"])
async def test_a_state_this_server_did_not_mint_for_this_call_is_a_protocol_error(
        pgate: eg.Gate, spoil: str) -> None:
    keys = RoundKeys(b"s" * 32, ttl=0.5) if spoil == "expired" else KEYS
    async with serve(pgate, Person("accept"), keys=keys) as client:
        first = await first_round(client)
    state, arguments = first.request_state, BEGIN
    if spoil == "tamper":
        state = state[:-6] + ("AAAAAA" if not state.endswith("AAAAAA") else "BBBBBB")
    elif spoil == "other-arguments":
        arguments = {**BEGIN, "payload": {"txn_id": "T1", "amount_cents": 99_999}}
    elif spoil == "expired":
        time.sleep(0.6)
    before = snapshot(pgate)
    other = RoundKeys(b"o" * 32) if spoil == "other-server" else keys
    accept = {APPROVAL_INPUT: types.ElicitResult(action="accept")}
    async with serve(pgate, keys=other) as client:  # a restart: the same key unless said
        with pytest.raises(MCPError) as caught:
            await client.session.call_tool("begin_effect", arguments, input_responses=accept,
                                           request_state=state)
    assert caught.value.error.code == types.INVALID_PARAMS
    assert snapshot(pgate) == before


async def test_a_state_survives_a_restart_that_keeps_the_key(pgate: eg.Gate,
                                                              make_gate: Any) -> None:
    async with serve(pgate, Person("accept"), keys=RoundKeys(b"r" * 32)) as client:
        first = await first_round(client)
    make_gate(policy=POLICY).approve(pgate.list_approvals()[0].approval_id, by="alice")
    async with serve(pgate, keys=RoundKeys(b"r" * 32), approval_wait_seconds=5) as client:
        ran = answer_of(await client.session.call_tool(
            "begin_effect", BEGIN, input_responses={APPROVAL_INPUT: types.ElicitResult(
                action="accept")}, request_state=first.request_state))
    assert ran["decision"] == "execute"


@pytest.mark.parametrize("content", [{"approve": True}, {"decision": "approve", "by": "alice"},
                                     None])
async def test_nothing_a_2026_client_answers_is_taken_as_an_approval(
        pgate: eg.Gate, content: dict[str, Any] | None) -> None:
    person = Person("accept", content=content)
    async with serve(pgate, person, approval_wait_seconds=0.3) as client:
        answer = answer_of(await client.call_tool("begin_effect", BEGIN))
    assert answer["decision"] == "approval_required" and len(person.asked) == 1
    [approval] = pgate.list_approvals()
    assert approval.state is eg.ApprovalState.PENDING and approval.decided_by is None


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_a_declined_page_answers_in_text_at_once(pgate: eg.Gate, action: str) -> None:
    person = Person(action)
    started = time.monotonic()
    async with serve(pgate, person, approval_wait_seconds=30) as client:
        answer = answer_of(await client.call_tool("begin_effect", BEGIN))
    assert answer["decision"] == "approval_required" and len(person.asked) == 1
    assert time.monotonic() - started < 20


async def test_a_denial_on_the_console_is_what_a_2026_agent_hears(pgate: eg.Gate,
                                                                 make_gate: Any) -> None:
    person = Person("accept", make_gate(policy=POLICY), decide="deny")
    async with serve(pgate, person, approval_wait_seconds=5) as client:
        assert answer_of(await client.call_tool("begin_effect", BEGIN))["decision"] == "denied"


async def test_without_url_elicitation_or_a_console_a_2026_call_answers_in_text(
        pgate: eg.Gate) -> None:
    async with serve(pgate) as client:  # no elicitation callback: no capability declared
        first = await first_round(client)
    assert first.result_type == "complete"
    assert answer_of(first)["decision"] == "approval_required"
    person = Person("accept")
    async with serve(pgate, person, console_url=None) as client:
        assert answer_of(await first_round(client))["decision"] == "approval_required"
    assert person.asked == []


async def test_the_handshake_protocol_keeps_its_mid_call_elicitation(pgate: eg.Gate,
                                                                    make_gate: Any) -> None:
    person = Person("accept", make_gate(policy=POLICY), decide="approve")
    async with serve(pgate, person, mode="legacy", approval_wait_seconds=5) as client:
        answer = answer_of(await client.call_tool("begin_effect", BEGIN))
    assert answer["decision"] == "execute" and person.asked[0].elicitation_id


async def test_a_begin_cancelled_before_its_answer_left_releases_what_it_reserved(
        gate: eg.Gate) -> None:
    """The re-issued begin after a broken stream runs (attempt 2), instead of meeting an
    in-flight effect whose lease nobody received and, after the lease, a blocked one."""
    fields = {"effect_type": "email.send", "key": "email:1", "payload": {"to": "a"}}
    with anyio.CancelScope() as scope:
        scope.cancel()  # the stream broke while the begin was under way
        await begin_unlost(gate, dict(fields))
    record = gate.get("email:1")
    assert record.state is eg.State.FAILED and record.error == NEVER_REACHED
    again = await begin_unlost(gate, dict(fields))
    assert again.decision is eg.Decision.EXECUTE and again.attempt == 2


def test_round_keys_sign_and_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    args = {"to": "+1"}
    token = KEYS.seal(tool="send", arguments=args, key="sms:+1", approval_id="apr_1")
    claim = KEYS.open(token, tool="send", arguments={"to": "+1"})
    assert (claim.key, claim.approval_id) == ("sms:+1", "apr_1")
    body, _, tag = token.partition(".")[2].partition(".")
    for bad in (token + "x", "eg1." + body + "." + tag[::-1], "v1.x", 7, None,
                "eg1.!!!.###"):
        with pytest.raises(MCPError):
            KEYS.open(bad, tool="send", arguments=args)
    for tool, other in (("other", args), ("send", {"to": "+2"})):
        with pytest.raises(MCPError):
            KEYS.open(token, tool=tool, arguments=other)
    with pytest.raises(MCPError):
        RoundKeys(b"z" * 32).open(token, tool="send", arguments=args)
    monkeypatch.setenv("EFFECTGATE_MCP_STATE_KEY", "short")
    with pytest.raises(eg.ConfigError):
        RoundKeys.from_env()
    monkeypatch.setenv("EFFECTGATE_MCP_STATE_KEY", "q" * 40)
    assert not RoundKeys.from_env().ephemeral
    monkeypatch.delenv("EFFECTGATE_MCP_STATE_KEY")
    assert RoundKeys.from_env().ephemeral


# -- the gateway ---------------------------------------------------------------------------------

GATED = {"effects": {
    "sms.send": {"key": "sms:{to}:{text}", "tools": ["send_message"], "approval": "always"},
    "sms.slow": {"key": "slow:{to}", "tools": ["slow_send"]}}}


@asynccontextmanager
async def gateway(gate: eg.Gate, tmp: Path, monkeypatch: pytest.MonkeyPatch,
                  person: Person | None = None, mode: str = "auto") -> AsyncIterator[Client]:
    from effectgate.integrations.mcp.gateway import Gateway, tool_specs

    for name in ("LEDGER", "STARTED", "REFUSE_START"):
        monkeypatch.setenv(name, str(tmp / name.lower()))
    policy = gate.policy
    assert policy is not None
    upstream = upstream_command()
    gw = Gateway(gate, upstream, tool_specs(gate, policy), policy=policy, out=io.StringIO(),
                 console_url=CONSOLE, approval_wait_seconds=5, state_keys=KEYS)
    kw: dict[str, Any] = {"mode": mode}
    if person is not None:
        kw["elicitation_callback"] = person
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await gw.start(tg)
            async with Client(gw.server(), **kw) as client:
                await client.call_tool("lookup", {"name": "warm"})  # the upstream is up
                yield client
            await gw.aclose()
            tg.cancel_scope.cancel()


def upstream_command() -> str:
    return shlex.join([sys.executable, str(Path(mcp_upstream.__file__))])


def scoped(key: str, target: str) -> str:
    """``key`` as the gateway in front of ``target`` records it (its upstream's scope first)."""
    from effectgate.integrations.mcp.identity import UpstreamIdentity

    return f"{UpstreamIdentity.of(target).key_scope}:{key}"


def ledger(tmp: Path) -> list[str]:
    path = tmp / "ledger"
    return path.read_text().splitlines() if path.exists() else []


async def test_the_gateway_asks_a_2026_client_through_the_round_and_sends_once(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = make_gate(policy=GATED)
    person = Person("accept", make_gate(policy=GATED), decide="approve")
    async with gateway(gate, tmp_path, monkeypatch, person) as client:
        call = {"to": "+1", "text": "hi"}
        first = await client.call_tool("send_message", call)
        again = await client.call_tool("send_message", call)
    assert not first.is_error and (first.meta or {})["effectgate"]["decision"] == "execute"
    assert (again.meta or {})["effectgate"]["decision"] == "duplicate"
    assert person.asked[0].mode == "url" and person.asked[0].url.startswith(CONSOLE)
    assert ledger(tmp_path) == ["sms:+1:hi"]


async def test_the_gateway_refuses_a_tampered_state_before_anything_runs(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = make_gate(policy=GATED)
    async with gateway(gate, tmp_path, monkeypatch, Person("accept")) as client:
        call = {"to": "+1", "text": "hi"}
        first = await client.session.call_tool("send_message", call,
                                                allow_input_required=True)
        assert first.result_type == "input_required"
        make_gate(policy=GATED).approve(gate.list_approvals()[0].approval_id, by="alice")
        before = snapshot(gate)
        for state, args in ((first.request_state[:-4] + "AAAA", call),
                            (first.request_state, {"to": "+2", "text": "hi"})):
            with pytest.raises(MCPError) as caught:
                await client.session.call_tool("send_message", args, request_state=state,
                                               input_responses={APPROVAL_INPUT: types.ElicitResult(
                                                   action="accept")})
            assert caught.value.error.code == types.INVALID_PARAMS
        assert snapshot(gate) == before
    assert ledger(tmp_path) == []


async def test_a_call_re_issued_after_a_broken_stream_joins_the_running_one(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """2026-07-28: the stream breaks (the request is cancelled) while the upstream works; the
    call still finishes and is recorded, and the client's re-issue is answered with its
    result: one upstream execution, nothing AMBIGUOUS."""
    gate = make_gate(policy=GATED)
    async with gateway(gate, tmp_path, monkeypatch) as client:
        call = {"to": "+1", "seconds": 2}
        started = tmp_path / "started"
        with anyio.move_on_after(30):  # the stream breaks once the upstream has begun
            async with anyio.create_task_group() as calling:
                calling.start_soon(client.call_tool, "slow_send", call)
                while not started.exists():
                    await anyio.sleep(0.02)
                calling.cancel_scope.cancel()
        assert started.exists() and ledger(tmp_path) == []
        key = scoped("slow:+1", upstream_command())
        assert gate.get(key).state is eg.State.IN_FLIGHT
        again = await client.call_tool("slow_send", call)
    assert not again.is_error, again
    assert (again.meta or {})["effectgate"]["decision"] == "duplicate"
    assert gate.get(key).state is eg.State.COMMITTED
    assert ledger(tmp_path) == ["slow:+1"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_prompt_mcp_serve_does_not_have_is_invalid_params_not_an_internal_error(
        gate: eg.Gate, mode: str) -> None:
    async with serve(gate, mode=mode) as client:
        with pytest.raises(MCPError) as caught:
            await client.get_prompt("test_simple_prompt")
    assert caught.value.error.code == types.INVALID_PARAMS
