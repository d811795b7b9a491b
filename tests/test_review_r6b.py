"""Review of round 6b: the CrewAI strict ``before_tool_call`` hook, driven through CrewAI's
real loop offline (a crew with a scripted model), and the flow's refusal of an early undo."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

pytest.importorskip("crewai")

from crewai.tools import BaseTool
from pydantic import BaseModel

import effectgate as eg
from effectgate.integrations import crewai as eg_crew

from .adapter_drivers import crew_llm, crewai_env


class _Txn(BaseModel):
    txn_id: str


def _tool(name: str, ledger: list[str]) -> BaseTool:
    class Tool(BaseTool):
        description: str = f"The {name} tool."
        args_schema: type[BaseModel] = _Txn

        def _run(self, txn_id: str) -> str:
            ledger.append(f"{name}:{txn_id}")
            return f"{name} done {txn_id}"

    return Tool(name=name)


def _kickoff(tools: list[Any], calls: list[tuple[str, str, dict[str, Any]]]) -> dict[str, str]:
    crewai_env()
    from crewai import Agent, Crew, Task

    seen: dict[str, str] = {}
    agent = Agent(role="ops", goal="Handle the incident", backstory="An operator.",
                  llm=crew_llm(calls, seen), tools=tools, verbose=False)
    task = Task(description="handle it", expected_output="done", agent=agent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eg_crew.UngatedToolWarning)
        Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
    return seen


def test_a_read_declared_in_a_non_strict_list_runs_beside_a_strict_list(gate: eg.Gate) -> None:
    """An agent holding a strict list (refund, gated) and a second, non-strict list that
    declares ``lookup`` read-only: ``lookup`` went through gate_tools and is declared, so the
    strict hook (which refuses only tools CrewAI adds at kickoff) must let it run."""
    ledger: list[str] = []
    strict = eg_crew.gate_tools([_tool("refund", ledger)], {"refund": "refund:{txn_id}"},
                                gate=gate, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eg_crew.UngatedToolWarning)
        reads = eg_crew.gate_tools([_tool("lookup", ledger), _tool("wire_b_r6b", ledger)],
                                   {"lookup": None}, gate=gate)
    seen = _kickoff(strict + reads, [("c0", "lookup", {"txn_id": "T1"}),
                                     ("c1", "refund", {"txn_id": "T1"}),
                                     ("c2", "wire_b_r6b", {"txn_id": "T1"})])
    assert ledger == ["lookup:T1", "refund:T1"], seen
    assert "blocked" not in seen["c0"], seen
    # a tool that list left ungated (not declared) is still refused beside the strict list
    assert "blocked" in seen["c2"], seen


def test_a_read_of_a_strict_reads_only_list_runs_beside_a_strict_list(gate: eg.Gate) -> None:
    """The same with the reads in a strict list of their own (reads only, no gated tool):
    both lists are strict and declared every tool, so nothing may be refused."""
    ledger: list[str] = []
    writes = eg_crew.gate_tools([_tool("refund", ledger)], {"refund": "refund:{txn_id}"},
                                gate=gate, strict=True)
    reads = eg_crew.gate_tools([_tool("lookup", ledger)], {}, gate=gate, strict=True,
                               read_only=["lookup"])
    seen = _kickoff([*writes, *reads, _tool("wire_r6b", ledger)],
                    [("c0", "lookup", {"txn_id": "T2"}), ("c1", "wire_r6b", {"txn_id": "T2"})])
    assert ledger == ["lookup:T2"], seen
    # what the fix keeps: a tool no list held (as CrewAI hands mcps tools) is refused
    assert "blocked" in seen["c1"], seen


def test_a_raising_hook_registered_earlier_does_not_let_an_undeclared_tool_run(
        gate: eg.Gate) -> None:
    """CrewAI runs its ``before_tool_call`` hooks in one ``try``: a hook that raises is
    logged and the tool RUNS, the hooks after it skipped. A user's hook registered before the
    first strict list (a ``@CrewBase`` crew registers its hooks when it is made) that raises
    for a call skipped the strict refusal, and the undeclared tool ran ungated."""
    from crewai.hooks import (
        clear_before_tool_call_hooks,
        get_before_tool_call_hooks,
        register_before_tool_call_hook,
    )

    def faulty(context: Any) -> None:
        raise RuntimeError("a user's hook that fails on this call")

    kept = get_before_tool_call_hooks()
    clear_before_tool_call_hooks()
    register_before_tool_call_hook(faulty)
    try:
        ledger: list[str] = []
        strict = eg_crew.gate_tools([_tool("refund", ledger)], {"refund": "refund:{txn_id}"},
                                    gate=gate, strict=True)
        seen = _kickoff([*strict, _tool("page_r6b", ledger)],
                        [("c0", "page_r6b", {"txn_id": "T4"})])
        assert ledger == [], seen
        assert "blocked" in seen["c0"], seen
    finally:
        clear_before_tool_call_hooks()
        for hook in kept:
            register_before_tool_call_hook(hook)
