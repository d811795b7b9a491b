"""Microsoft Agent Framework: what the gate records is what the function did. A call whose
function never ran is FAILED (it may run later), never COMMITTED with another middleware's
answer nor AMBIGUOUS for a refusal of the framework's own; and a middleware installed twice
gates a call once.

Before, whatever ``call_next()`` left in ``context.result`` was stored as the committed result,
whether the function ran or not: a rate limiter after the gate, or the same gate installed at
the agent and again at the run, made the refund "done" for good without running it. Real
``Agent`` loop, scripted chat client, both backends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("agent_framework")

from agent_framework import Agent, FunctionMiddleware, FunctionTool, MiddlewareFailure

import effectgate as eg
from effectgate.integrations.agent_framework import EffectGateMiddleware

from .adapter_drivers import af_client, af_results

Ledger = list[tuple[str, int]]


def _refund_tool(ledger: Ledger, **options: Any) -> Any:
    def refund(txn_id: str, amount_cents: int) -> str:
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    return FunctionTool(func=refund, name="refund", description="Refund. Irreversible.",
                        **options)


def _run(tool: Any, session_id: str, middleware: list[Any], txn_id: str = "T1",
         run_middleware: list[Any] | None = None) -> dict[str, str]:
    async def one() -> dict[str, str]:
        agent = Agent(client=af_client([[("c1", {"txn_id": txn_id, "amount_cents": 500})]]),
                      name="billing", tools=[tool], middleware=middleware)
        response = await agent.run("refund", session=agent.create_session(
            session_id=session_id), middleware=run_middleware)
        return af_results(response.messages)

    return asyncio.run(one())


class RateLimit(FunctionMiddleware):
    """Answers for the function, without calling it, while ``busy``."""

    def __init__(self) -> None:
        self.busy = True

    async def process(self, context: Any, call_next: Callable[[], Awaitable[None]]) -> None:
        if self.busy:
            context.result = "Rate limited: nothing was done, try again in a minute."
            return
        await call_next()


def test_a_later_middleware_that_answers_for_the_function_records_failed(
        gate: eg.Gate) -> None:
    ledger: Ledger = []
    tool, limiter = _refund_tool(ledger), RateLimit()
    middleware = [EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate), limiter]
    out = _run(tool, "s1", middleware)
    assert out["c1"].startswith("Rate limited") and ledger == []
    record = gate.get("refund:T1")
    assert record.state is eg.State.FAILED and record.result is None
    limiter.busy = False
    assert _run(tool, "s2", middleware) == {"c1": "refunded 500 on T1"}
    assert ledger == [("T1", 500)]
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED and record.attempt == 2


def test_the_same_middleware_at_the_agent_and_the_run_gates_once(gate: eg.Gate) -> None:
    ledger: Ledger = []
    tool = _refund_tool(ledger)
    middleware = EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate)
    out = _run(tool, "s1", [middleware], run_middleware=[middleware])
    assert out == {"c1": "refunded 500 on T1"} and ledger == [("T1", 500)]
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED and record.result == "refunded 500 on T1"
    assert _run(tool, "s2", [middleware]) == {"c1": "refunded 500 on T1"}
    assert ledger == [("T1", 500)]


def test_two_middlewares_gating_one_call_are_refused_and_nothing_runs(gate: eg.Gate) -> None:
    ledger: Ledger = []
    tool = _refund_tool(ledger)
    agent_level = EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate)
    run_level = EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate)
    with pytest.raises(MiddlewareFailure, match="install one"):
        _run(tool, "s1", [agent_level], run_middleware=[run_level])
    assert ledger == [] and gate.get("refund:T1").state is eg.State.FAILED


def test_a_call_the_framework_refuses_before_the_function_is_failed(gate: eg.Gate) -> None:
    """``max_invocations`` reached: the framework raises ``ToolException`` inside
    ``call_next`` before the function runs. Recorded AMBIGUOUS, that refund was blocked for
    good; it is FAILED, and runs once the tool may be called again."""
    ledger: Ledger = []
    tool = _refund_tool(ledger, max_invocations=1)
    middleware = [EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate)]
    assert _run(tool, "s1", middleware, "T1") == {"c1": "refunded 500 on T1"}
    out = _run(tool, "s2", middleware, "T2")
    assert "refunded" not in out["c1"] and "OUTCOME UNKNOWN" not in out["c1"]
    record = gate.get("refund:T2")
    assert record.state is eg.State.FAILED and ledger == [("T1", 500)]
    assert "T2" not in str(record.history)  # the stored error names no argument
    tool.invocation_count = 0
    assert _run(tool, "s3", middleware, "T2") == {"c1": "refunded 500 on T2"}
    assert ledger == [("T1", 500), ("T2", 500)]
