"""LlamaIndex: gated function tools in the real FunctionAgent workflow, driven offline by
MockFunctionCallingLLM, on SQLite and Postgres.

No ``from __future__ import annotations`` here: LlamaIndex reads a tool's ``ctx: Context``
annotation at runtime, and a string annotation breaks context injection.
"""

import asyncio
import json
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.core.tools import FunctionTool
    from llama_index.core.workflow import Context

import effectgate as eg
from effectgate.integrations.llama_index import (
    EffectGateFunctionAgent,
    GatedFunctionTool,
    UngatedToolAudit,
    UngatedToolWarning,
    gate_tool,
    gate_tools,
)
from effectgate.testing import temporary_gate

from .agent_worker import run_two_agents
from .conftest import PG_URL, require_postgres

ARGS = {"txn_id": "T1", "amount_cents": 500}
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def call(call_id: str, args: dict[str, Any] | None = None, name: str = "refund") -> ChatMessage:
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=[
        ToolCallBlock(tool_call_id=call_id, tool_name=name, tool_kwargs=dict(args or ARGS))])


def scripted(*calls: ChatMessage) -> MockFunctionCallingLLM:
    turns = iter([*calls, ChatMessage(role=MessageRole.ASSISTANT, content="All done.")])
    return MockFunctionCallingLLM(response_generator=lambda messages, **kw: next(turns))


def run(agent: Any, run_id: str | None = None) -> list[Any]:
    async def go() -> list[Any]:
        handler = agent.run(user_msg="refund T1", run_id=run_id or uuid.uuid4().hex)
        results = [ev.tool_output async for ev in handler.stream_events()
                   if isinstance(ev, ToolCallResult)]
        await handler
        return results

    return asyncio.run(go())


def agent(tools: list[Any], *calls: ChatMessage, cls: Any = FunctionAgent) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(name="billing", tools=tools, llm=scripted(*calls))


@pytest.fixture
def ledger() -> list[Any]:
    return []


@pytest.fixture
def refund(ledger: list[Any]) -> FunctionTool:
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id} (#{len(ledger)})"

    return FunctionTool.from_defaults(fn=refund)


@pytest.fixture
def lost_reply(ledger: list[Any]) -> FunctionTool:
    async def refund(ctx: Context, txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        raise TimeoutError("the reply was lost")

    return FunctionTool.from_defaults(async_fn=refund)


@pytest.fixture
def sqlite_gate() -> Iterator[eg.Gate]:
    with temporary_gate() as gate:
        yield gate


def test_gated_tool_definition_is_identical_and_context_still_injected(
        sqlite_gate: eg.Gate, refund: FunctionTool, lost_reply: FunctionTool) -> None:
    for original in (refund, lost_reply):
        gated = gate_tool(original, "refund:{txn_id}", gate=sqlite_gate)
        assert isinstance(gated, FunctionTool) and gated.metadata is original.metadata
        assert json.dumps(gated.metadata.to_openai_tool()) == json.dumps(
            original.metadata.to_openai_tool())
        assert (gated.requires_context, gated.ctx_param_name) == (
            original.requires_context, original.ctx_param_name)


def test_same_refund_twice_runs_once_and_second_result_is_the_stored_one(
        gate: eg.Gate, refund: FunctionTool, ledger: list[Any]) -> None:
    gated = gate_tool(refund, "refund:{txn_id}", gate=gate)
    results = run(agent([gated], call("call_1"),
                        call("call_2", {"txn_id": "T1", "amount_cents": "500"})),
                  run_id="run-42")
    assert ledger == [("T1", 500)]  # and the body got an int, not "500"
    assert [(r.content, r.is_error) for r in results] == [("refunded 500 on T1 (#1)", False)] * 2
    assert gate.get("refund:T1").run_id == "run-42"


def test_context_tool_runs_once_with_its_context(gate: eg.Gate, ledger: list[Any]) -> None:
    async def refund(ctx: Context, txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        count = await ctx.store.get("count", default=0)
        await ctx.store.set("count", count + 1)
        ledger.append(txn_id)
        return f"refunded {txn_id} (context count {count})"

    gated = gate_tool(FunctionTool.from_defaults(async_fn=refund), "refund:{txn_id}", gate=gate)
    results = run(agent([gated], call("call_1"), call("call_2")))
    assert ledger == ["T1"]
    assert [r.content for r in results] == ["refunded T1 (context count 0)"] * 2


def test_lost_reply_is_ambiguous_and_model_is_told_not_to_retry(
        gate: eg.Gate, lost_reply: FunctionTool, ledger: list[Any]) -> None:
    gated = gate_tool(lost_reply, "refund:{txn_id}", gate=gate)
    first, second = run(agent([gated], call("call_1"), call("call_2")))
    assert ledger == [("T1", 500)]
    assert first.is_error and "OUTCOME UNKNOWN" in first.content
    assert "TimeoutError" in first.content
    assert second.is_error and "Do not call this tool again" in second.content
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


def test_raise_mode_ambiguous_stops_the_run_with_the_mixin(
        gate: eg.Gate, lost_reply: FunctionTool, ledger: list[Any]) -> None:
    gated = gate_tool(lost_reply, "refund:{txn_id}", gate=gate, on_refusal="raise")
    with pytest.raises(eg.EffectAmbiguous) as err:
        run(agent([gated], call("call_1"), call("call_2"), cls=EffectGateFunctionAgent))
    assert isinstance(err.value.__cause__, TimeoutError)
    with pytest.raises(eg.EffectAmbiguous) as again:
        run(agent([gated], call("call_3"), cls=EffectGateFunctionAgent))
    assert again.value.decision == "blocked"
    assert ledger == [("T1", 500)]
    assert gate.get("refund:T1").agent_id == "billing"  # the mixin names the agent


def test_raise_mode_without_the_mixin_is_swallowed_by_the_agent(
        gate: eg.Gate, lost_reply: FunctionTool, ledger: list[Any]) -> None:
    """Documents why the mixin exists: FunctionAgent turns every exception into a message."""
    gated = gate_tool(lost_reply, "refund:{txn_id}", gate=gate, on_refusal="raise")
    first, second = run(agent([gated], call("call_1"), call("call_2")))
    assert isinstance(first.exception, eg.EffectAmbiguous)
    assert isinstance(second.exception, eg.EffectAmbiguous)
    assert ledger == [("T1", 500)]


def test_in_flight_tells_the_model_to_wait(gate: eg.Gate, refund: FunctionTool,
                                          ledger: list[Any]) -> None:
    gate.begin(effect_type="refund", key="refund:T1", payload=ARGS, lease_seconds=30)
    gated = gate_tool(refund, "refund:{txn_id}", gate=gate)
    [answer] = run(agent([gated], call("call_1")))
    assert ledger == [] and answer.is_error and "NOT DONE YET" in answer.content


def test_call_outside_an_agent(gate: eg.Gate, refund: FunctionTool, ledger: list[Any]) -> None:
    gated = gate_tool(refund, "refund:{txn_id}", gate=gate)
    assert gated.call(**ARGS).content == "refunded 500 on T1 (#1)"
    assert gated.call(txn_id="T1", amount_cents="500").content == "refunded 500 on T1 (#1)"
    assert asyncio.run(gated.acall(**ARGS)).raw_output == "refunded 500 on T1 (#1)"
    invalid = gated.call(txn_id="T2", amount_cents="not a number")
    assert invalid.is_error and "INVALID ARGUMENTS" in invalid.content
    conflict = gated.call(txn_id="T1", amount_cents=501)
    assert conflict.is_error and "CONFLICT" in conflict.content
    assert ledger == [("T1", 500)]


@pytest.mark.parametrize("convert", ["to_langchain_tool", "to_langchain_structured_tool"])
def test_a_gated_tool_is_never_converted_into_an_ungated_langchain_tool(
        gate: eg.Gate, refund: FunctionTool, ledger: list[Any], convert: str) -> None:
    # (LlamaIndex builds the LangChain tool from the bare function: it would run ungated)
    gated = gate_tool(refund, "refund:{txn_id}", gate=gate)
    with pytest.raises(eg.ConfigError, match="runs ungated"):
        getattr(gated, convert)()
    assert ledger == []
    with pytest.raises(eg.UnknownEffect):
        gate.get("refund:T1")


def test_partial_params_reach_the_function_and_only_keyed_ones_the_payload(
        gate: eg.Gate, ledger: list[Any]) -> None:
    class Client:
        """Not JSON: it must stay out of the payload hash."""

    def refund(client: Client, tenant: str, txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        ledger.append((tenant, txn_id, amount_cents))
        return f"refunded {txn_id} for {tenant}"

    tool = FunctionTool.from_defaults(fn=refund,
                                      partial_params={"client": Client(), "tenant": "acme"})
    gated = gate_tool(tool, "refund:{tenant}:{txn_id}", gate=gate)
    results = run(agent([gated], call("call_1"), call("call_2")))
    assert ledger == [("acme", "T1", 500)]
    assert [r.content for r in results] == ["refunded T1 for acme"] * 2
    assert gate.get("refund:acme:T1").state is eg.State.COMMITTED


def test_approval_required_refund_is_approved_then_runs_once(
        make_gate: Any, refund: FunctionTool, ledger: list[Any]) -> None:
    policy = eg.Policy.from_dict({"effects": {"payment.refund": {
        "key": "refund:{txn_id}", "tools": ["refund"], "approval": "always"}}})
    gate = make_gate(policy=policy)
    [gated] = gate_tools([refund], policy, gate=gate)
    [waiting] = run(agent([gated], call("call_1")))
    [approval] = gate.list_approvals()
    assert ledger == [] and waiting.is_error and approval.approval_id in waiting.content
    gate.approve(approval.approval_id, by="alice")
    results = run(agent([gated], call("call_2"), call("call_3")))
    assert ledger == [("T1", 500)]
    assert [r.content for r in results] == ["refunded 500 on T1 (#1)"] * 2


def test_gate_tools_reports_ungated_once_and_the_audit_sees_their_calls(
        sqlite_gate: eg.Gate, refund: FunctionTool) -> None:
    def li_send_mail_1(to: str) -> str:
        """Send an email."""
        return "sent"

    mail = FunctionTool.from_defaults(fn=li_send_mail_1)
    with pytest.warns(UngatedToolWarning, match="li_send_mail_1"):
        tools = gate_tools([refund, mail], {"refund": "refund:{txn_id}"}, gate=sqlite_gate)
    assert [type(t) for t in tools] == [GatedFunctionTool, FunctionTool]
    with pytest.raises(eg.ConfigError, match="li_send_mail_1"):
        gate_tools([refund, mail], {"refund": "refund:{txn_id}"}, gate=sqlite_gate, strict=True)
    audit = UngatedToolAudit().install()
    try:
        run(agent(tools, call("call_1"), call("call_2", {"to": "a@b.c"}, name="li_send_mail_1")))
    finally:
        audit.uninstall()
    assert dict(audit.calls) == {"li_send_mail_1": 1}  # the gated refund is not reported


def test_the_audit_counts_a_tool_whose_acall_runs_its_call_once() -> None:
    """An ``acall`` that runs the same tool's ``call`` is one call (its two spans had counted
    two)."""
    from llama_index.core.tools import ToolMetadata, ToolOutput
    from llama_index.core.tools.types import AsyncBaseTool

    sent: list[str] = []

    class Mailer(AsyncBaseTool):  # type: ignore[misc]
        @property
        def metadata(self) -> ToolMetadata:
            return ToolMetadata(name="li_audit_mailer", description="Send mail.")

        def call(self, input: str) -> ToolOutput:
            sent.append(input)
            return ToolOutput(content="sent", tool_name="li_audit_mailer", raw_input={},
                              raw_output="sent")

        async def acall(self, input: str) -> ToolOutput:
            return self.call(input)

    audit = UngatedToolAudit().install()
    try:
        with pytest.warns(UngatedToolWarning, match="li_audit_mailer"):
            Mailer().call("a")
        asyncio.run(Mailer().acall("b"))
    finally:
        audit.uninstall()
    assert sent == ["a", "b"] and dict(audit.calls) == {"li_audit_mailer": 2}


@pytest.mark.slow
def test_two_agents_in_two_processes_execute_the_refund_once(
        tmp_path: Path, namespace: str) -> None:
    require_postgres()
    lines, results = run_two_agents("llama_index", PG_URL, namespace, tmp_path)
    assert len(lines) == 1
    winner = f"refunded 500 on T1 by {lines[0]}"
    for outs in results:
        assert len(outs) == 2
        assert all(o == winner or "NOT DONE YET" in o for o in outs)
    assert any(winner in outs for outs in results)


def test_positional_calls_bind_by_name(gate: eg.Gate, refund: FunctionTool,
                                       ledger: list[Any]) -> None:
    gated = gate_tool(refund, "refund:{txn_id}", gate=gate)
    first = gated.call("T1", 500)
    again = gated.call(txn_id="T1", amount_cents="500")
    assert ledger == [("T1", 500)] and first.content == again.content
    assert gated.call("T1", 500, 7).is_error  # too many: refused like the function would
    assert ledger == [("T1", 500)]


def test_a_repeat_keeps_every_content_block(gate: eg.Gate, ledger: list[Any]) -> None:
    from llama_index.core.base.llms.types import ImageBlock, TextBlock

    def chart(txn_id: str) -> list[Any]:
        """A receipt and its chart."""
        ledger.append(txn_id)
        return [TextBlock(text=f"receipt {txn_id}"),
                ImageBlock(image=b"\x89PNG fake", image_mimetype="image/png")]

    gated = gate_tool(FunctionTool.from_defaults(fn=chart), "chart:{txn_id}", gate=gate)
    first, again = gated.call(txn_id="T1"), gated.call(txn_id="T1")
    assert ledger == ["T1"]
    assert again.blocks == first.blocks and len(again.blocks) == 2
    assert isinstance(again.blocks[1], ImageBlock)


@pytest.mark.parametrize("on_refusal", ["message", "raise"])
def test_a_denial_is_answered_as_the_mode_says_sync_and_async(
        make_gate: Any, ledger: list[Any], on_refusal: str) -> None:
    """A policy's denial through ``call`` and ``acall``: text in message mode, raised
    ``EffectDenied`` in raise mode — either way nothing runs. (Denials pass through the
    adapter's pause hook, which must not turn a raise into text.)"""
    deny = make_gate(policy={"effects": {"refund": {"deny": "no refunds today"}}})

    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund."""
        ledger.append((txn_id, amount_cents))
        return "ran"

    gated = gate_tool(FunctionTool.from_defaults(fn=refund), "refund:{txn_id}", gate=deny,
                      on_refusal=on_refusal)
    calls = [lambda: gated.call(txn_id="T1", amount_cents=5),
             lambda: asyncio.run(gated.acall(txn_id="T1", amount_cents=5))]
    for one in calls:
        if on_refusal == "raise":
            with pytest.raises(eg.EffectDenied, match="no refunds today"):
                one()
        else:
            out = one()
            assert out.is_error and out.content.startswith("DENIED")
    assert ledger == []


def _audited(action: Any) -> dict[str, int]:
    audit = UngatedToolAudit().install()
    try:
        action()
    finally:
        audit.uninstall()
    return dict(audit.calls)


def test_the_audit_does_not_keep_a_span_llamaindex_never_closes() -> None:
    """An ``acall`` that is not ``async def`` and returns a future that never completes: its
    span never ends (LlamaIndex closes it in the future's done callback). The audit forgot it
    only at the end, so a worker calling it held one entry per call forever; each call went
    on being counted as part of the first (LlamaIndex leaves the span current)."""
    import gc

    from llama_index.core.tools import ToolMetadata, ToolOutput
    from llama_index.core.tools.types import AsyncBaseTool

    class Pending(AsyncBaseTool):  # type: ignore[misc]
        @property
        def metadata(self) -> ToolMetadata:
            return ToolMetadata(name="li_audit_pending", description="Never answers.")

        def call(self, input: str) -> ToolOutput:
            return ToolOutput(content="x", tool_name="li_audit_pending", raw_input={},
                              raw_output="x")

        def acall(self, input: str) -> Any:  # not async: a future LlamaIndex waits on
            return asyncio.get_running_loop().create_future()

    tool = Pending()
    audit = UngatedToolAudit().install()

    async def abandon() -> None:
        for n in range(50):
            tool.acall(str(n))  # dropped, never completed

    try:
        with pytest.warns(UngatedToolWarning, match="li_audit_pending"):
            asyncio.run(abandon())
        gc.collect()
    finally:
        audit.uninstall()
    assert len(audit._open) == 0
    assert dict(audit.calls) == {"li_audit_pending": 50}


def test_a_gated_function_tool_subclass_calling_super_is_not_reported(
        sqlite_gate: eg.Gate) -> None:
    """A ``FunctionTool`` subclass whose ``call`` / ``acall`` call ``super()``: each opens a
    second span of the same tool inside the first. Gated, it was reported as ungated (with a
    warning), from ``call``, ``acall`` and an agent alike."""
    class Logged(FunctionTool):  # type: ignore[misc]
        def call(self, *args: Any, **kwargs: Any) -> Any:
            return super().call(*args, **kwargs)

        async def acall(self, *args: Any, **kwargs: Any) -> Any:
            return await super().acall(*args, **kwargs)

    ran: list[str] = []

    def li_audit_super_refund(txn_id: str) -> str:
        """Refund."""
        ran.append(txn_id)
        return f"refunded {txn_id}"

    gated = gate_tool(Logged.from_defaults(fn=li_audit_super_refund), "refund:{txn_id}",
                      gate=sqlite_gate)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UngatedToolWarning)
        seen = _audited(lambda: (
            gated.call(txn_id="T1"), asyncio.run(gated.acall(txn_id="T2")),
            run(agent([gated], call("c1", {"txn_id": "T3"}, name="li_audit_super_refund")))))
    assert ran == ["T1", "T2", "T3"] and seen == {}


def test_the_audit_sees_a_plain_basetool_called_but_not_its_own_call_method() -> None:
    """A direct ``BaseTool`` subclass: LlamaIndex spans only its ``__call__``. ``tool(...)``
    was not seen (the audit ignored ``__call__`` spans); an agent's call is seen once (through
    the adapter's ``acall``, ``call`` and the tool's ``__call__``); its own ``call`` called
    directly opens no span and is not seen — the documented limit."""
    from llama_index.core.tools import BaseTool, ToolMetadata, ToolOutput

    sent: list[str] = []

    class Mailer(BaseTool):  # type: ignore[misc]
        @property
        def metadata(self) -> ToolMetadata:
            return ToolMetadata(name="li_audit_plain_mailer", description="Send mail.")

        def __call__(self, input: str) -> ToolOutput:
            return self.call(input)

        def call(self, input: str) -> ToolOutput:
            sent.append(input)
            return ToolOutput(content="sent", tool_name="li_audit_plain_mailer",
                              raw_input={}, raw_output="sent")

    mailer = Mailer()
    with pytest.warns(UngatedToolWarning, match="li_audit_plain_mailer"):
        assert _audited(lambda: mailer("a")) == {"li_audit_plain_mailer": 1}
    assert _audited(lambda: mailer.call("b")) == {}  # no span: not seen
    by_agent = _audited(lambda: run(agent(
        [mailer], call("c1", {"input": "c"}, name="li_audit_plain_mailer"))))
    assert by_agent == {"li_audit_plain_mailer": 1} and sent == ["a", "b", "c"]


def test_the_audit_reports_a_tool_without_a_name_by_its_class() -> None:
    """``metadata.get_name()`` raises for a nameless tool; the dispatcher swallowed it and the
    call went unreported."""
    from llama_index.core.tools import ToolMetadata, ToolOutput
    from llama_index.core.tools.types import AsyncBaseTool

    class LiAuditNameless(AsyncBaseTool):  # type: ignore[misc]
        @property
        def metadata(self) -> ToolMetadata:
            return ToolMetadata(description="Send mail.")

        def call(self, input: str) -> ToolOutput:
            return ToolOutput(content="sent", tool_name="", raw_input={}, raw_output="sent")

        async def acall(self, input: str) -> ToolOutput:
            return self.call(input)

    with pytest.warns(UngatedToolWarning, match="LiAuditNameless"):
        assert _audited(lambda: LiAuditNameless().call("a")) == {"LiAuditNameless": 1}


def test_the_audit_counts_every_call_from_many_threads() -> None:
    """``calls`` was incremented without a lock: threads calling tools lost counts."""
    import sys
    import threading

    def li_audit_ping(n: int) -> int:
        """Ping."""
        return n

    ping = FunctionTool.from_defaults(fn=li_audit_ping)

    def calls_from_threads() -> None:
        threads = [threading.Thread(target=lambda: [ping.call(n=n) for n in range(400)])
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: a lost update shows in a few rounds
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UngatedToolWarning)
            rounds = [_audited(calls_from_threads) for _ in range(3)]
    finally:
        sys.setswitchinterval(interval)
    assert rounds == [{"li_audit_ping": 3200}] * 3
