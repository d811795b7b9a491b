"""Approvals over MCP elicitation: the server's ``begin_effect`` and the gateway's gated tools
send a client that declared URL-mode elicitation to the console's approval page and wait for
the decision made there; nothing the client answers is taken as an approval. The server runs
in-process (the mcp package's ``Client``), the gateway as a real process in front of a real
upstream; both store backends."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import Client, types

from effectgate.integrations.mcp.elicit import approval_url, check_console_url
from effectgate.integrations.mcp.server import build_server

from . import mcp_upstream

CONSOLE = "http://127.0.0.1:8765"
POLICY = {"effects": {"payment.refund": {"approval": "always"}}}
BEGIN = {"effect_type": "payment.refund", "key": "refund:T1",
         "payload": {"txn_id": "T1", "amount_cents": 50_000}, "agent_id": "billing"}


def decision(result: Any) -> dict[str, Any]:
    import json

    return json.loads(result.content[0].text)  # type: ignore[no-any-return]


class Human:
    """A client's elicitation callback: records what it was asked, and answers as told —
    optionally after a person decides on the console (a separate gate on the same store)."""

    def __init__(self, answer: types.ElicitResult, console: eg.Gate | None = None,
                 decide: str | None = None) -> None:
        self.answer, self.console, self.decide = answer, console, decide
        self.asked: list[Any] = []

    async def __call__(self, context: Any, params: Any) -> types.ElicitResult:
        self.asked.append(params)
        if self.console is not None and self.decide is not None:
            [pending] = self.console.list_approvals()
            if self.decide == "approve":
                self.console.approve(pending.approval_id, by="alice")
            else:
                self.console.deny(pending.approval_id, by="alice", reason="no")
        return self.answer


async def begin(gate: eg.Gate, human: Human | None, **server: Any) -> dict[str, Any]:
    app = build_server(gate, **server)
    options: dict[str, Any] = {"mode": "legacy"}
    if human is not None:
        options["elicitation_callback"] = human
    with anyio.fail_after(20):
        async with Client(app, **options) as client:
            return decision(await client.call_tool("begin_effect", BEGIN))


@pytest.fixture
def pgate(make_gate: Any) -> eg.Gate:
    return make_gate(policy=POLICY)  # type: ignore[no-any-return]


async def test_url_elicitation_sends_the_client_to_the_console_and_waits_for_the_decision(
        pgate: eg.Gate, make_gate: Any) -> None:
    human = Human(types.ElicitResult(action="accept"), make_gate(), decide="approve")
    answer = await begin(pgate, human, console_url=CONSOLE + "/")
    [asked] = human.asked
    [approval] = pgate.list_approvals(state=None)
    assert asked.mode == "url" and asked.url == f"{CONSOLE}/approvals/{approval.approval_id}"
    assert asked.elicitation_id == approval.approval_id
    assert answer["decision"] == "execute" and approval.decided_by == "alice"


async def test_a_denial_on_the_console_is_what_the_agent_hears(pgate: eg.Gate,
                                                              make_gate: Any) -> None:
    human = Human(types.ElicitResult(action="accept"), make_gate(), decide="deny")
    answer = await begin(pgate, human, console_url=CONSOLE)
    assert answer["decision"] == "denied"


@pytest.mark.parametrize("answer", [
    types.ElicitResult(action="accept", content={"approve": True}),
    types.ElicitResult(action="accept", content={"decision": "approve", "by": "alice"}),
    types.ElicitResult(action="accept"),
])
async def test_nothing_the_client_answers_is_taken_as_an_approval(
        pgate: eg.Gate, answer: types.ElicitResult) -> None:
    """The client (or the agent behind it) could approve its own call: its answer, form
    content included, approves nothing; only the console's decision in the store counts."""
    human = Human(answer)
    out = await begin(pgate, human, console_url=CONSOLE, approval_wait_seconds=0.3)
    assert len(human.asked) == 1 and out["decision"] == "approval_required"
    [approval] = pgate.list_approvals()
    assert approval.state is eg.ApprovalState.PENDING and approval.decided_by is None
    assert pgate.get("refund:T1").state is eg.State.PENDING_APPROVAL


async def test_a_declined_elicitation_answers_at_once_in_text(pgate: eg.Gate) -> None:
    human = Human(types.ElicitResult(action="decline"))
    out = await begin(pgate, human, console_url=CONSOLE, approval_wait_seconds=30)
    assert out["decision"] == "approval_required" and len(human.asked) == 1


async def test_without_a_console_url_or_client_support_nothing_is_elicited(
        pgate: eg.Gate) -> None:
    human = Human(types.ElicitResult(action="accept"))
    assert (await begin(pgate, human))["decision"] == "approval_required"
    assert human.asked == []
    out = await begin(pgate, None, console_url=CONSOLE, approval_wait_seconds=0.3)
    assert out["decision"] == "approval_required"


@pytest.mark.parametrize("bad", ["javascript:alert(1)", "ftp://host/x", "http://",
                                 "http://h/?next=x", "http://h/#frag"])
def test_a_console_url_that_is_not_a_plain_web_address_is_refused(sqlite_gate: Any,
                                                                  bad: str) -> None:
    with pytest.raises(eg.ConfigError):
        check_console_url(bad)


def test_the_approval_page_path_is_the_console_contract() -> None:
    assert approval_url("https://ops.example/console/", "apr_1") == \
        "https://ops.example/console/approvals/apr_1"
    assert approval_url("http://h", "a/../b?c") == "http://h/approvals/a%2F..%2Fb%3Fc"


@pytest.fixture
def sqlite_gate() -> Any:
    from effectgate.testing import temporary_gate

    with temporary_gate() as gate:
        yield gate


# -- the gateway ---------------------------------------------------------------------------------

GATEWAY_POLICY_DICT = {"effects": {"sms.send": {
    "key": "sms:{to}:{text}", "tools": ["send_message"], "approval": "always"}}}


async def gateway_calls(gate: eg.Gate, human: Human, tmp: Path,
                        monkeypatch: pytest.MonkeyPatch, times: int = 2) -> list[Any]:
    """``send_message`` called ``times`` through an in-process gateway in front of a real
    upstream process, by a client with ``human`` as its elicitation callback."""
    import io

    from effectgate.integrations.mcp.gateway import Gateway, tool_specs

    for name in ("LEDGER", "STARTED", "REFUSE_START"):
        monkeypatch.setenv(name, str(tmp / name.lower()))
    policy = gate.policy
    assert policy is not None
    upstream = shlex.join([sys.executable, str(Path(mcp_upstream.__file__))])
    gw = Gateway(gate, upstream, tool_specs(gate, policy), policy=policy, out=io.StringIO(),
                 console_url=CONSOLE, approval_wait_seconds=0.3)
    answers = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await gw.start(tg)
            async with Client(gw.server(), mode="legacy", elicitation_callback=human) as client:
                for _ in range(times):
                    answers.append(await client.call_tool("send_message",
                                                          {"to": "+1", "text": "hi"}))
            await gw.aclose()
            tg.cancel_scope.cancel()
    return answers


def sent(tmp: Path) -> list[str]:
    ledger = tmp / "ledger"
    return ledger.read_text().splitlines() if ledger.exists() else []


async def test_the_gateway_elicits_the_console_page_and_forwards_once_approved(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = make_gate(policy=GATEWAY_POLICY_DICT)
    approving = Human(types.ElicitResult(action="accept"), make_gate(), decide="approve")
    first, again = await gateway_calls(gate, approving, tmp_path, monkeypatch)
    assert not first.is_error and not again.is_error  # again: the stored result
    [asked] = approving.asked
    assert asked.mode == "url" and asked.url.startswith(f"{CONSOLE}/approvals/apr_")
    assert sent(tmp_path) == ["sms:+1:hi"]


async def test_the_gateway_takes_no_client_answer_as_an_approval(
        tmp_path: Path, make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = make_gate(policy=GATEWAY_POLICY_DICT)
    says_yes = Human(types.ElicitResult(action="accept", content={"approve": True}))
    [answer] = await gateway_calls(gate, says_yes, tmp_path, monkeypatch, times=1)
    assert answer.is_error and "approval" in answer.content[0].text
    assert sent(tmp_path) == [] and len(says_yes.asked) == 1
    assert gate.list_approvals()[0].state is eg.ApprovalState.PENDING
