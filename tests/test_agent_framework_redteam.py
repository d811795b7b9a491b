"""Microsoft Agent Framework, red-teamed: ways a gated refund could run twice, run against a
human's "no", or leave a wrong record. Real ``Agent`` loop, scripted chat client, both
backends; the refunds are counted in a list the function appends to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("agent_framework")

from agent_framework import (
    Agent,
    FunctionMiddleware,
    FunctionTool,
    MiddlewareFailure,
    MiddlewareTermination,
)

import effectgate as eg
from effectgate.integrations.agent_framework import EffectGateMiddleware

from .adapter_drivers import af_client, af_results
from .conftest import snapshot

Ledger = list[tuple[str, int]]


def _refund_tool(ledger: Ledger) -> Any:
    def refund(txn_id: str, amount_cents: int) -> str:
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    return FunctionTool(func=refund, name="refund", description="Refund. Irreversible.")


def _respond(tool: Any, session_id: str, middleware: list[Any],
             turns: list[list[tuple[str, dict[str, Any]]]]) -> Any:
    async def one() -> Any:
        agent = Agent(client=af_client(turns), name="billing", tools=[tool],
                      middleware=middleware)
        return await agent.run("refund", session=agent.create_session(session_id=session_id))

    return asyncio.run(one())


def _run(tool: Any, session_id: str, middleware: list[Any],
         calls: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    return af_results(_respond(tool, session_id, middleware, [calls]).messages)


class Normalise(FunctionMiddleware):
    """Upper-cases the transaction id, after the gate keyed the call on the model's."""

    async def process(self, context: Any, call_next: Callable[[], Awaitable[None]]) -> None:
        context.arguments = {**context.arguments, "txn_id": context.arguments["txn_id"].upper()}
        await call_next()


def test_arguments_changed_by_a_middleware_after_the_gate_never_run(gate: eg.Gate) -> None:
    """A middleware after the gate rewrote ``t1`` to ``T1``: keyed ``refund:t1``, the function
    refunded T1, and the model's next ``refund(T1)`` (a new key) refunded T1 again. The
    function is now entered only with the arguments the call was keyed on: the rewritten call
    does not run and is recorded FAILED."""
    ledger: Ledger = []
    tool = _refund_tool(ledger)
    middleware = [EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate), Normalise()]
    lower = _run(tool, "s1", middleware, [("c1", {"txn_id": "t1", "amount_cents": 500})])
    upper = _run(tool, "s2", middleware, [("c1", {"txn_id": "T1", "amount_cents": 500})])
    assert ledger == [("T1", 500)]
    assert lower["c1"].startswith("Error") and upper["c1"] == "refunded 500 on T1"
    assert gate.get("refund:t1").state is eg.State.FAILED
    assert gate.get("refund:T1").state is eg.State.COMMITTED


class After(FunctionMiddleware):
    """Raises ``error`` once the function has returned (an audit log that is down; a policy
    that ends the run after one refund)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def process(self, context: Any, call_next: Callable[[], Awaitable[None]]) -> None:
        await call_next()
        raise self.error


ARGS = {"txn_id": "T1", "amount_cents": 500}


@pytest.mark.parametrize("error", [MiddlewareTermination("one refund per run"),
                                   RuntimeError("audit log down")], ids=["stop", "error"])
def test_a_later_middleware_raising_after_the_function_returned_leaves_it_committed(
        gate: eg.Gate, error: Exception) -> None:
    """The function returned, then a middleware after the gate raised: the refund was
    recorded AMBIGUOUS (blocked until an operator resolves it) and the model was told the
    outcome is unknown, which also swallowed the framework's ``MiddlewareTermination``: the
    loop ran on. It is COMMITTED with the function's result, then the error is raised on as
    without the gate (a termination ends the run)."""
    ledger: Ledger = []
    tool = _refund_tool(ledger)
    middleware = [EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate), After(error)]
    first = _respond(tool, "s1", middleware, [[("c1", ARGS)], [("c2", ARGS)]])
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED and record.result == "refunded 500 on T1"
    said = af_results(first.messages)
    if isinstance(error, MiddlewareTermination):
        assert said == {"c1": "refunded 500 on T1"} and "All done." not in first.text
    else:
        assert said["c1"].startswith("Error") and said["c2"] == "refunded 500 on T1"
    again = _run(tool, "s2", middleware[:1], [("c1", ARGS)])
    assert again == {"c1": "refunded 500 on T1"} and ledger == [("T1", 500)]


def test_a_function_that_stops_the_run_fail_closed_still_stops_it(gate: eg.Gate) -> None:
    """A function raising ``MiddlewareFailure`` (the framework's fail-closed escape) aborts
    the run without the gate; gated, the error became an "outcome unknown" tool result and the
    loop ran on. It is recorded AMBIGUOUS (the function started) and raised on."""
    ledger: Ledger = []

    def refund(txn_id: str, amount_cents: int) -> str:
        ledger.append((txn_id, amount_cents))
        raise MiddlewareFailure("fraud check tripped: stop the run")

    tool = FunctionTool(func=refund, name="refund", description="Refund. Irreversible.")
    middleware = [EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate)]
    with pytest.raises(MiddlewareFailure, match="fraud check"):
        _respond(tool, "s1", middleware, [[("c1", ARGS)], [("c2", ARGS)]])
    assert ledger == [("T1", 500)]
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


def test_reject_of_a_request_the_store_approved_raises_and_changes_nothing(
        make_gate: Any) -> None:
    """Alice approved the paused refund in the CLI; Carol then rejected it through
    ``reject``, which swallowed the store's refusal and returned a rejecting response: Carol
    was shown a "no" that was never recorded, and the model's next call of the same refund
    executed on Alice's approval. ``reject`` now raises ``InvalidTransition`` (the approval
    stands) and writes nothing; a request the store denied is still answered quietly."""
    gate = make_gate(policy={"effects": {"refund": {"approval": {"always": True}}}})
    tool = _refund_tool([])
    middleware = EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate)
    paused = _respond(tool, "s1", [middleware], [[("c1", ARGS)]])
    [request] = paused.user_input_requests
    approval_id = request.additional_properties["effectgate"]["approval_id"]
    gate.approve(approval_id, by="alice")
    before = snapshot(gate)
    with pytest.raises(eg.InvalidTransition, match="approved by alice"):
        middleware.reject(request, by="carol", reason="no")
    assert snapshot(gate) == before

    second = _respond(tool, "s2", [middleware], [[("c2", {**ARGS, "txn_id": "T2"})]])
    [other] = second.user_input_requests
    gate.deny(other.additional_properties["effectgate"]["approval_id"], by="dave")
    assert not middleware.reject(other, by="carol").approved


def test_a_standing_tool_approval_does_not_approve_the_policys_requests(
        make_gate: Any) -> None:
    """``ToolApprovalMiddleware`` (agent_framework's standing approvals): Alice approved a
    5-cent refund and, as its prompt offers, "always approve refund". That rule then answered
    the policy's request for a 50,000-dollar refund on its own, with a response no different
    from a person's, and the gate recorded it approved: it ran with no human. Where that
    middleware runs, only the store's decision counts; the auto-approved request is told in
    text and waits for a human (the CLI, the console), and the run does not loop."""
    from agent_framework import (
        Message,
        ToolApprovalMiddleware,
        create_always_approve_tool_response,
    )

    gate = make_gate(policy={"effects": {"refund": {"approval": {"always": True}}}})
    ledger: Ledger = []
    tool = _refund_tool(ledger)
    standing = ToolApprovalMiddleware()
    middleware = EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate)

    async def flow() -> tuple[Any, Any]:
        def agent(turns: list[list[tuple[str, dict[str, Any]]]]) -> Any:
            return Agent(client=af_client(turns), name="billing", tools=[tool],
                         middleware=[standing, middleware])

        session = agent([]).create_session(session_id="s1")
        paused = await agent([[("c1", ARGS)]]).run("refund T1", session=session)
        [request] = paused.user_input_requests
        middleware.approve(request, by="alice")
        reply = create_always_approve_tool_response(request)
        small = await agent([]).run(Message(role="user", contents=[reply]), session=session)
        big = {"txn_id": "T2", "amount_cents": 5_000_000}
        return small, await agent([[("c2", big)]]).run("refund T2", session=session)

    small, big = asyncio.run(flow())
    assert af_results(small.messages) == {"c1": "refunded 500 on T1"}
    [said] = af_results(big.messages).values()
    assert said.startswith("WAITING FOR APPROVAL") and big.user_input_requests == []
    assert ledger == [("T1", 500)]
    [pending] = gate.list_approvals()
    assert pending.key == "refund:T2" and pending.state is eg.ApprovalState.PENDING


class Guard(FunctionMiddleware):
    """After the gate: stops the run fail-closed on a ``BAD`` transaction (which cancels the
    turn's other calls), and waits half a second before letting any other call on."""

    async def process(self, context: Any, call_next: Callable[[], Awaitable[None]]) -> None:
        if context.arguments["txn_id"] == "BAD":
            await asyncio.sleep(0.1)
            raise MiddlewareFailure("guardrail: stop the run")
        await asyncio.sleep(0.5)
        await call_next()


def test_a_call_cancelled_before_its_function_ran_is_failed_not_ambiguous(
        gate: eg.Gate) -> None:
    """A sibling's ``MiddlewareFailure`` makes the framework cancel the turn's other calls.
    A refund cancelled while a later middleware still held it (its function never entered)
    was recorded AMBIGUOUS: blocked until an operator resolved what provably never happened.
    It is FAILED now (it may run later), and a function entered after that is refused."""
    ledger: Ledger = []
    tool = _refund_tool(ledger)
    middleware = [EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate), Guard()]
    with pytest.raises(MiddlewareFailure, match="guardrail"):
        _respond(tool, "s1", middleware,
                 [[("c1", ARGS), ("c2", {"txn_id": "BAD", "amount_cents": 1})]])
    assert ledger == []
    assert gate.get("refund:T1").state is eg.State.FAILED
    again = _run(tool, "s2", middleware[:1], [("c1", ARGS)])
    assert again == {"c1": "refunded 500 on T1"} and ledger == [("T1", 500)]
