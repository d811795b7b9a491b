"""CrewAI: a gated tool gets its arguments as the ungated tool does, and is keyed on them.

CrewAI validates a call against the tool's ``args_schema`` and hands ``_run`` the result. The
gated tool validated that result a second time: a validator that changes a value (dollars to
cents) ran twice, so the refund keyed, recorded and carried out was 100 times the one asked
for, and a nested model reached the tool as an object where CrewAI passes a dict. Real crew
loop, scripted model, both backends.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("crewai")

from crewai.tools import BaseTool
from pydantic import BaseModel, field_validator

import effectgate as eg
from effectgate.integrations.crewai import gate_tool

from .adapter_drivers import crew_run


class DollarArgs(BaseModel):
    txn_id: str
    amount: int  # the model says dollars; the tool takes cents

    @field_validator("amount")
    @classmethod
    def cents(cls, value: int) -> int:
        return value * 100


class Order(BaseModel):
    id: str
    amount: int


class ShipArgs(BaseModel):
    order: Order


def _refund(ledger: list[Any]) -> BaseTool:
    class Refund(BaseTool):
        name: str = "refund"
        description: str = "Refund dollars on a transaction."
        args_schema: type[BaseModel] = DollarArgs

        def _run(self, txn_id: str, amount: int) -> str:
            ledger.append((txn_id, amount))
            return f"refunded {amount} cents on {txn_id}"

    return Refund()


def _ship(ledger: list[Any]) -> BaseTool:
    class Ship(BaseTool):
        name: str = "ship"
        description: str = "Ship an order."
        args_schema: type[BaseModel] = ShipArgs

        def _run(self, order: Any) -> str:
            ledger.append(order)
            return f"shipped {order['id']}"

    return Ship()


def test_a_validator_that_changes_a_value_runs_once_as_it_does_ungated(
        gate: eg.Gate) -> None:
    ungated: list[Any] = []
    crew_run([_refund(ungated)], [("c0", "refund", {"txn_id": "T1", "amount": 5})])
    ledger: list[Any] = []
    tool = gate_tool(_refund(ledger), "refund:{txn_id}", gate=gate)
    for n in range(2):
        seen = crew_run([tool], [(f"c{n}", "refund", {"txn_id": "T1", "amount": 5})])
        assert "refunded 500 cents on T1" in seen[f"c{n}"], seen
    assert ledger == ungated == [("T1", 500)]
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED and record.attempt == 1


def test_a_nested_argument_reaches_the_tool_as_crewai_passes_it(gate: eg.Gate) -> None:
    ledger: list[Any] = []
    tool = gate_tool(_ship(ledger), "ship:{order[id]}", gate=gate)
    order = {"id": "O1", "amount": 3}
    for n in range(2):
        seen = crew_run([tool], [(f"c{n}", "ship", {"order": order})])
        assert "shipped O1" in seen[f"c{n}"], seen
    assert ledger == [order]  # a dict, once
    assert gate.get("ship:O1").state is eg.State.COMMITTED


def test_a_refusal_is_not_put_in_crewais_tool_cache(gate: eg.Gate) -> None:
    """CrewAI's agents call a tool's structured form, which its own conversion leaves without
    the tool's ``cache_function``: every answer was cached, a refusal too, so a later repeat
    in the same crew read the stale text instead of reaching the gate."""
    from crewai import Agent, Crew, Task

    from .adapter_drivers import crew_llm

    ledger: list[Any] = []
    tool = gate_tool(_refund(ledger), "refund:{txn_id}", gate=gate)
    seen: dict[str, str] = {}
    calls = [("c1", "refund", {"txn_id": "T1", "amount": 5}),
             ("c2", "refund", {"txn_id": "T1", "amount": 6})]  # a conflict: refused
    agent = Agent(role="billing", goal="Refund what is asked", backstory="A billing clerk.",
                  llm=crew_llm(calls, seen), tools=[tool], verbose=False)
    crew = Crew(agents=[agent], tasks=[Task(description="Refund", expected_output="done",
                                            agent=agent)], verbose=False)
    crew.kickoff()
    assert seen["c1"] == "refunded 500 cents on T1" and "CONFLICT" in seen["c2"]
    cached = crew._cache_handler._cache
    assert list(cached.values()) == ["refunded 500 cents on T1"], cached
    assert ledger == [("T1", 500)]
