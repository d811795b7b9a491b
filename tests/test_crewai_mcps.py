"""Tools CrewAI adds to an agent at kickoff, from ``Agent(mcps=[...])`` (and ``apps=[...]``),
never pass through :func:`gate_tools`: driven through CrewAI's real loop offline (a crew with a
scripted ``BaseLLM``, and ``Agent.kickoff``) against a real stdio MCP server run as its own
process.

* under ``strict=True`` such a tool ran ungated and unrecorded: it is now refused at the call
  (CrewAI's ``before_tool_call`` hook blocks it; nothing reaches the server);
* without ``strict`` it still runs ungated (documented: it cannot be declared);
* what the docstring offers instead, ``mcps`` pointed at effectgate's MCP gateway in front of
  the server, runs the effect once across two crews.

The server's tool takes no arguments: CrewAI 1.6 reads a tool's ``inputSchema`` attribute,
which mcp 2.x renamed (``input_schema``), so every CrewAI MCP tool here is built with an empty
schema and called with no arguments.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("crewai")
pytest.importorskip("mcp")

from crewai.tools import BaseTool
from pydantic import BaseModel

import effectgate as eg
from effectgate.integrations import crewai as eg_crew

from .adapter_drivers import crew_llm, crewai_env

SERVER = '''
import os
from mcp.server import MCPServer

server = MCPServer("pager")


@server.tool()
def page_oncall() -> str:
    """Page the on-call engineer. Irreversible."""
    with open(os.environ["LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write("paged\\n")
    return "paged the on-call engineer"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
'''


class RefundArgs(BaseModel):
    txn_id: str


def _refund(ledger: list[str]) -> BaseTool:
    class Refund(BaseTool):
        name: str = "refund"
        description: str = "Refund a card transaction."
        args_schema: type[BaseModel] = RefundArgs

        def _run(self, txn_id: str) -> str:
            ledger.append(txn_id)
            return f"refunded {txn_id}"

    return Refund()


def _strict_refund(gate: eg.Gate) -> tuple[list[Any], list[str]]:
    """A strict list holding the gated refund tool, and the refunds it made."""
    refunds: list[str] = []
    return eg_crew.gate_tools([_refund(refunds)], {"refund": "refund:{txn_id}"}, gate=gate,
                              strict=True), refunds


def _server(tmp_path: Path) -> tuple[Any, str, Path]:
    """A stdio MCP server config, the name CrewAI gives its tool, and the server's ledger."""
    from crewai.mcp import MCPServerStdio

    script = tmp_path / "pager.py"
    script.write_text(SERVER, encoding="utf-8")
    ledger = tmp_path / "ledger"
    import os

    config = MCPServerStdio(command=sys.executable, args=[str(script)],
                            env={**os.environ, "LEDGER": str(ledger)})
    return config, f"{sys.executable}_{script}_page_oncall", ledger


def _crew(tools: list[Any], mcps: list[Any], calls: list[tuple[str, str, dict[str, Any]]]
          ) -> dict[str, str]:
    crewai_env()
    from crewai import Agent, Crew, Task

    seen: dict[str, str] = {}
    agent = Agent(role="ops", goal="Handle the incident", backstory="An operator.",
                  llm=crew_llm(calls, seen), tools=tools, mcps=mcps, verbose=False)
    task = Task(description="handle it", expected_output="done", agent=agent)
    Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
    return seen


def _lines(ledger: Path) -> list[str]:
    return ledger.read_text(encoding="utf-8").splitlines() if ledger.exists() else []


def _refused(caught: list[warnings.WarningMessage], name: str) -> bool:
    """True when a strict refusal of the tool ``name`` was warned."""
    return any(issubclass(w.category, eg_crew.UngatedToolWarning) and name in str(w.message)
               and "strict mode" in str(w.message) for w in caught)


def test_without_strict_an_mcps_tool_runs_ungated(tmp_path: Path, gate: eg.Gate) -> None:
    config, name, ledger = _server(tmp_path)
    refunds: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eg_crew.UngatedToolWarning)
        tools = eg_crew.gate_tools([_refund(refunds)], {"refund": "refund:{txn_id}"}, gate=gate)
    seen = _crew(tools, [config], [("c0", name, {})])
    assert _lines(ledger) == ["paged"], seen
    assert "paged the on-call engineer" in seen["c0"]


def test_strict_refuses_an_mcps_tool_at_the_call(tmp_path: Path, gate: eg.Gate) -> None:
    config, name, ledger = _server(tmp_path)
    tools, refunds = _strict_refund(gate)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = _crew(tools, [config], [("c0", name, {}),
                                       ("c1", "refund", {"txn_id": "T1"})])
    assert _lines(ledger) == [], seen  # nothing reached the server
    assert _refused(caught, "page_oncall")
    assert "blocked" in seen["c0"]
    # the gated tool beside it still runs, once, gated
    assert refunds == ["T1"]
    assert "refunded T1" in seen["c1"]


def test_strict_refuses_an_mcps_tool_when_the_list_is_the_tasks(tmp_path: Path,
                                                                gate: eg.Gate) -> None:
    crewai_env()
    from crewai import Agent, Crew, Task

    config, name, ledger = _server(tmp_path)
    tools, _ = _strict_refund(gate)
    seen: dict[str, str] = {}
    agent = Agent(role="ops", goal="Handle the incident", backstory="An operator.",
                  llm=crew_llm([("c0", name, {})], seen), mcps=[config], verbose=False)
    task = Task(description="handle it", expected_output="done", agent=agent, tools=tools)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
    assert _lines(ledger) == [], seen
    assert _refused(caught, "page_oncall")


def test_strict_refuses_an_mcps_tool_in_agent_kickoff(tmp_path: Path, gate: eg.Gate) -> None:
    crewai_env()
    from crewai import Agent

    config, name, ledger = _server(tmp_path)
    tools, _ = _strict_refund(gate)
    seen: dict[str, str] = {}
    agent = Agent(role="ops", goal="Handle the incident", backstory="An operator.",
                  llm=crew_llm([("c0", name, {})], seen), tools=tools, mcps=[config],
                  verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agent.kickoff("handle it")
    assert _lines(ledger) == [], seen
    assert _refused(caught, "page_oncall")
    assert "blocked" in seen["c0"]


def test_an_mcps_server_behind_the_gateway_runs_its_effect_once(tmp_path: Path) -> None:
    """What the module docstring tells a user to do instead: ``mcps`` pointed at effectgate's
    MCP gateway in front of the server. Two crews make the same call: the page goes out once.
    (The server runs once, over HTTP: each of CrewAI's connections starts a gateway, and each
    gateway would start a stdio server twice.)"""
    import os
    import shutil

    from crewai.mcp import MCPServerStdio

    from .mcp_helpers import listening

    _, _, ledger = _server(tmp_path)
    pager = [sys.executable, str(tmp_path / "pager.py"), "--http"]
    with listening(pager, env={**os.environ, "LEDGER": str(ledger)}) as upstream:
        policy = tmp_path / "effectgate.toml"
        policy.write_text(f'[upstreams.pager]\nurl = "{upstream}"\n\n'
                          '[effects."pager.page_oncall"]\nkey = "page:oncall"\n'
                          'tools = ["page_oncall"]\n', encoding="utf-8")
        cli = shutil.which("effectgate", path=str(Path(sys.executable).parent))
        assert cli is not None
        args = ["mcp", "gateway", "--upstream", upstream, "--url",
                f"sqlite:///{tmp_path / 'effects.db'}", "--policy", str(policy), "--strict"]
        config = MCPServerStdio(command=cli, args=args, env=dict(os.environ))
        name = f"{cli}_{'_'.join(args)}_page_oncall"
        first = _crew([], [config], [("c0", name, {})])
        second = _crew([], [config], [("c1", name, {})])
    assert _lines(ledger) == ["paged"], (first, second)
    assert "paged the on-call engineer" in first["c0"]
    assert "paged the on-call engineer" in second["c1"], second
