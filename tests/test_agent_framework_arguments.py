"""Microsoft Agent Framework: the arguments a gated call is keyed on are the ones the function
runs with, and a call the gate cannot key never runs.

The framework validates a call against the tool's input model and hands the middleware the
result by field name; a model with aliases sends them by alias. Before, the middleware
validated that dict again by alias only, failed, and let the call through ungated: a refund
ran on every retry with no record. Real ``Agent`` loop, scripted chat client, both backends.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Annotated, Any

import pytest

pytest.importorskip("agent_framework")

from agent_framework import Agent, FunctionTool
from pydantic import BaseModel, BeforeValidator, Field

import effectgate as eg
from effectgate.integrations.agent_framework import EffectGateMiddleware

from .adapter_drivers import af_client, af_results
from .conftest import snapshot


class AliasedArgs(BaseModel):
    txn_id: str = Field(alias="txnId")
    amount_cents: int = Field(alias="amountCents")


class PlainArgs(BaseModel):
    txn_id: str
    amount_cents: int


def _refund_tool(ledger: list[tuple[str, int]], model: type[BaseModel]) -> Any:
    def refund(txn_id: str, amount_cents: int) -> str:
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    return FunctionTool(func=refund, name="refund", description="Refund. Irreversible.",
                        input_model=model)


def _run(gate: eg.Gate, tool: Any, session_id: str,
         calls: list[tuple[str, dict[str, Any]]], **options: Any) -> dict[str, str]:
    middleware = EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate, **options)

    async def one() -> dict[str, str]:
        agent = Agent(client=af_client([calls]), name="billing", tools=[tool],
                      middleware=[middleware])
        response = await agent.run("refund T1",
                                   session=agent.create_session(session_id=session_id))
        return af_results(response.messages)

    return asyncio.run(one())


@pytest.mark.parametrize("model", [AliasedArgs, PlainArgs], ids=["aliases", "names"])
def test_an_input_model_with_aliases_is_gated_like_one_without(
        gate: eg.Gate, model: type[BaseModel]) -> None:
    ledger: list[tuple[str, int]] = []
    tool = _refund_tool(ledger, model)
    args = ({"txnId": "T1", "amountCents": 500} if model is AliasedArgs
            else {"txn_id": "T1", "amount_cents": 500})
    first = _run(gate, tool, "run-1", [("c1", args)])
    again = _run(gate, tool, "run-2", [("c2", args)])
    twins = _run(gate, tool, "run-3", [("c3", args), ("c4", args)])
    assert ledger == [("T1", 500)]
    assert first["c1"] == again["c2"] == twins["c3"] == twins["c4"] == "refunded 500 on T1"
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED and record.attempt == 1


@pytest.mark.parametrize("args", [
    {"txnId": "T1", "amountCents": "lots"},  # a value the model does not take
    {"txnId": "T1"},  # a field missing
    {"txn_id": "T1", "amountCents": "lots"},  # a name and an alias, one of them bad
], ids=["bad value", "missing field", "mixed, bad value"])
def test_arguments_the_input_model_refuses_never_run_and_write_nothing(
        gate: eg.Gate, args: dict[str, Any]) -> None:
    ledger: list[tuple[str, int]] = []
    before = snapshot(gate)
    out = _run(gate, _refund_tool(ledger, AliasedArgs), "run-bad", [("c1", args)])
    assert ledger == []
    assert "invalid argument" in out["c1"] and "refunded" not in out["c1"]
    assert snapshot(gate) == before


def test_refused_arguments_raise_with_on_refusal_raise(gate: eg.Gate) -> None:
    ledger: list[tuple[str, int]] = []
    before = snapshot(gate)
    with pytest.raises(eg.EffectKeyError, match="invalid argument"):
        _run(gate, _refund_tool(ledger, AliasedArgs), "run-raise",
             [("c1", {"txnId": "T1", "amountCents": "lots"})], on_refusal="raise")
    assert ledger == [] and snapshot(gate) == before


@pytest.mark.filterwarnings(r"ignore:\[FIDES\]:FutureWarning")  # the framework's: experimental
def test_a_variable_of_the_security_middleware_is_never_a_key(gate: eg.Gate) -> None:
    """With ``SecureAgentConfig``, untrusted content reaches the model as a variable id that
    the security middleware replaces with the value only after every function middleware
    has run. Keyed on the id, the same refund got a new key on every read of the same
    content, and ran again; the gate refuses such a call instead."""
    import json
    import re

    from agent_framework import (
        BaseChatClient,
        ChatResponse,
        Content,
        FunctionInvocationLayer,
        Message,
        tool,
    )
    from agent_framework.security import SecureAgentConfig

    variable = re.compile(r"var_[0-9a-f]{8,}")

    class Scripted(FunctionInvocationLayer, BaseChatClient):  # type: ignore[misc]
        """Reads the ticket, then refunds the transaction it names by its variable."""

        def __init__(self) -> None:
            super().__init__()
            self.turn = 0

        async def _answer(self, messages: Any) -> Any:
            self.turn += 1
            if self.turn == 1:
                calls = [Content.from_function_call(call_id="c1", name="read_ticket",
                                                    arguments="{}")]
            elif self.turn == 2:
                seen = json.dumps([m.to_dict() for m in messages], default=str)
                args = {"txn_id": f"[{variable.findall(seen)[-1]}]", "amount_cents": 500}
                calls = [Content.from_function_call(call_id="c2", name="refund",
                                                    arguments=json.dumps(args))]
            else:
                return ChatResponse(messages=[Message(role="assistant",
                                                      contents=["All done."])])
            return ChatResponse(messages=[Message(role="assistant", contents=calls)])

        def _inner_get_response(self, *, messages: Any, stream: bool, options: Any,
                                **kwargs: Any) -> Any:
            return self._answer(messages)

    ledger: list[tuple[str, int]] = []

    @tool(additional_properties={"source_integrity": "untrusted"})
    def read_ticket() -> str:
        """Read the customer's ticket (external, untrusted)."""
        return "T1"

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    middleware = EffectGateMiddleware({"refund": "refund:{txn_id}", "read_ticket": None},
                                      gate=gate)
    before = snapshot(gate)

    async def one(session_id: str) -> dict[str, str]:
        agent = Agent(client=Scripted(), name="billing", tools=[read_ticket, refund],
                      middleware=[middleware], context_providers=[
                          SecureAgentConfig(allow_untrusted_tools={"refund"},
                                            block_on_violation=True)])
        response = await agent.run("refund the ticket's transaction",
                                   session=agent.create_session(session_id=session_id))
        return af_results(response.messages)

    for n in range(2):  # the same request, retried
        out = asyncio.run(one(f"run-{n}"))
        assert "variable of agent_framework.security" in out["c2"], out
    assert ledger == [] and snapshot(gate) == before


# -- the arguments the function runs with, not a second validation of them -----------------

APPROVE_FROM_1000_USD = {"effects": {"refund": {"approval": {
    "at_or_above_micros": 1_000 * 1_000_000}}}}

DollarsFromCents = Annotated[Decimal, BeforeValidator(lambda v: Decimal(v) / 100)]
"""An amount the API takes in cents and the function works with in dollars."""


def _paused(gate: eg.Gate, tool: Any, args: dict[str, Any], cost: Any) -> tuple[Any, Any]:
    """Run one call of ``tool`` through a middleware pricing it with ``cost``: (the run's
    approval requests, the function results)."""
    middleware = EffectGateMiddleware({"refund": {"key": "refund:{txn_id}",
                                                  "cost_micros": cost}}, gate=gate)

    async def one() -> tuple[Any, Any]:
        agent = Agent(client=af_client([[("c1", args)]]), name="billing", tools=[tool],
                      middleware=[middleware])
        response = await agent.run("refund T1", session=agent.create_session(session_id="s1"))
        return response.user_input_requests, af_results(response.messages)

    return asyncio.run(one())


def test_a_value_changing_validator_runs_once_for_the_key_the_hash_and_the_price(
        make_gate: Any) -> None:
    """The framework validates the arguments once and calls the function with the result.
    Validating that result again applied a cents-to-dollars validator twice: a $50,000 refund
    was priced, hashed and approved as $500, under the $1,000 approval rule."""
    from agent_framework import tool

    gate = make_gate(policy=APPROVE_FROM_1000_USD)
    ledger: list[tuple[str, Decimal]] = []

    @tool
    def refund(txn_id: str, amount: DollarsFromCents) -> str:
        """Refund a transaction; ``amount`` in cents."""
        ledger.append((txn_id, amount))
        return f"refunded ${amount} on {txn_id}"

    requests, results = _paused(gate, refund, {"txn_id": "T1", "amount": 5_000_000},
                                lambda amount: int(amount * 1_000_000))
    assert ledger == []
    [approval] = gate.list_approvals()
    assert approval.estimated_cost_micros == 50_000 * 1_000_000
    assert approval.payload_hash == eg.payload_hash({"txn_id": "T1", "amount": Decimal(50000)})
    # Shown as JSON (50000), the framework would validate the request back to $500 when it
    # resumes: the run is not paused on it; the model is told to wait for the approval.
    assert requests == [] and approval.approval_id in results["c1"]
    gate.approve(approval.approval_id, by="alice")
    _, results = _paused(gate, refund, {"txn_id": "T1", "amount": 5_000_000},
                         lambda amount: int(amount * 1_000_000))
    assert results["c1"] == "refunded $50000 on T1" and ledger == [("T1", Decimal(50000))]


def test_the_functions_own_defaults_are_what_is_keyed_and_priced(make_gate: Any) -> None:
    """The framework leaves out the fields the model did not send, so the function's own
    defaults apply; the gate keyed and priced the input model's default instead (a full
    $50,000 refund priced as $0)."""
    gate = make_gate(policy=APPROVE_FROM_1000_USD)
    ledger: list[tuple[str, int]] = []

    class RefundArgs(BaseModel):
        txn_id: str
        amount_cents: int = Field(0, description="cents; leave out for a full refund")

    def refund(txn_id: str, amount_cents: int = 5_000_000) -> str:
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    tool = FunctionTool(func=refund, name="refund", description="Refund.",
                        input_model=RefundArgs)
    requests, _ = _paused(gate, tool, {"txn_id": "T1"},
                          lambda amount_cents: amount_cents * 10_000)
    assert ledger == [] and len(requests) == 1
    [approval] = gate.list_approvals()
    assert approval.estimated_cost_micros == 50_000 * 1_000_000
    assert approval.payload_hash == eg.payload_hash({"txn_id": "T1", "amount_cents": 5_000_000})


def test_field_names_the_framework_refuses_are_refused_before_the_store(gate: eg.Gate) -> None:
    """An input model with aliases only: the framework refuses the fields' names inside
    ``call_next``, before the function runs. The gate accepted them, reserved the key, and
    recorded the refusal AMBIGUOUS, blocking the refund for good."""
    ledger: list[tuple[str, int]] = []
    tool = _refund_tool(ledger, AliasedArgs)
    before = snapshot(gate)
    out = _run(gate, tool, "run-names", [("c1", {"txn_id": "T1", "amount_cents": 500})])
    assert "invalid argument" in out["c1"] and ledger == [] and snapshot(gate) == before
    again = _run(gate, tool, "run-aliases", [("c1", {"txnId": "T1", "amountCents": 500})])
    assert again["c1"] == "refunded 500 on T1" and ledger == [("T1", 500)]
    assert gate.get("refund:T1").state is eg.State.COMMITTED
