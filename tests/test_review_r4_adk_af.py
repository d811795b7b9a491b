"""Google ADK and Microsoft Agent Framework, review of the fourth red-team round's fixes.

* ADK ``gate_tools(strict=True)`` let a toolset (an ``McpToolset`` with write tools) through,
  unreported: its tools are listed only as the agent runs and none of them can be gated. It is
  now reported by its class name, refused when strict, accepted when that name is read-only.
* ADK: a ``def`` returning a coroutine was awaited on the loop by a thread of the loop's
  default executor, blocked until it finished. With as many such calls in one turn as that
  executor has threads, and coroutines that need it (``asyncio.to_thread``), none finished:
  the run hung for good (ungated, ADK awaits them on the loop and the run ends).
* Agent Framework: a twin of a call whose run was cancelled before its function ran (another
  run in the same process) raised that ``CancelledError`` in its own run, which nobody had
  cancelled; a twin of a call whose function never ran is now gated again as its own call.
* Agent Framework: the check that the function is entered with the arguments the call was
  keyed on hashed the keyed arguments again on every call; it compares with the payload hash
  the store recorded (one hash per call), as the store hashed them (a normalising template).

Real ADK ``InMemoryRunner`` and Agent Framework ``Agent`` loops, scripted models.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg

from .conftest import snapshot

ARGS = {"txn_id": "T1", "amount_cents": 500}


# -- Google ADK: toolsets under strict ---------------------------------------------------------


def _mcp_toolset() -> Any:
    pytest.importorskip("google.adk")
    pytest.importorskip("mcp")
    from google.adk.tools.mcp_tool.mcp_session_manager import StdioConnectionParams
    from google.adk.tools.mcp_tool.mcp_toolset import McpToolset
    from mcp import StdioServerParameters

    # Built, never connected: its tools are listed only when an agent runs.
    return McpToolset(connection_params=StdioConnectionParams(
        server_params=StdioServerParameters(command=sys.executable, args=["-c", "pass"])))


def _refund(txn_id: str, amount_cents: int) -> str:
    """Refund a transaction."""
    return f"refunded {amount_cents} on {txn_id}"


def test_adk_strict_refuses_a_toolset_it_cannot_gate(gate: eg.Gate) -> None:
    """An ``McpToolset`` beside a declared tool passed ``strict=True`` unreported; now strict
    refuses it by its class name, and nothing is written to the store."""
    from effectgate.integrations.google_adk import gate_tools

    toolset = _mcp_toolset()
    before = snapshot(gate)
    with pytest.raises(eg.ConfigError, match="McpToolset"):
        gate_tools([_refund, toolset], {"_refund": "refund:{txn_id}"}, gate=gate, strict=True)
    assert snapshot(gate) == before
    accepted = gate_tools([_refund, toolset], {"_refund": "refund:{txn_id}"}, gate=gate,
                          strict=True, read_only=["McpToolset"])
    assert accepted[1] is toolset


def test_adk_reports_a_toolset_it_cannot_gate(gate: eg.Gate) -> None:
    """Not strict, a toolset is reported once, by its class name, and passed through."""
    pytest.importorskip("google.adk")
    from google.adk.tools.base_toolset import BaseToolset

    from effectgate.integrations.google_adk import UngatedToolWarning, gate_tools

    async def get_tools(self: Any, readonly_context: Any = None) -> list[Any]:
        return []

    name = f"LedgerWrites{gate.namespace.replace('-', '')}"  # reported once per process
    toolset = type(name, (BaseToolset,), {"get_tools": get_tools})()
    with pytest.warns(UngatedToolWarning, match=name):
        out = gate_tools([toolset], {}, gate=gate)
    assert out == [toolset]


def test_adk_a_declared_toolset_is_refused_typed(gate: eg.Gate) -> None:
    """Declaring a key for a toolset is a clear ``ConfigError`` (it is no function)."""
    from effectgate.integrations.google_adk import gate_tools

    with pytest.raises(eg.ConfigError, match="FunctionTool or a function"):
        gate_tools([_mcp_toolset()], {"McpToolset": "x:{y}"}, gate=gate)


# -- Google ADK: many defs returning coroutines in one turn ------------------------------------

_PARALLEL = """
import asyncio, sys, time
sys.path.insert(0, {root!r})
import effectgate as eg
from effectgate.integrations.google_adk import gate_tool
from tests.adapter_drivers import adk_run

done = []

async def _refund(txn_id: str) -> str:
    await asyncio.to_thread(time.sleep, 0.02)  # the loop's default executor
    done.append(txn_id)
    return "refunded " + txn_id

def refund(txn_id: str) -> str:
    \"\"\"Refund a transaction.\"\"\"
    return _refund(txn_id)  # type: ignore[return-value]

gate = eg.Gate({url!r}, policy=False)
turn = [("c%d" % i, {{"txn_id": "T%d" % i}}, "refund") for i in range({n})]
out = asyncio.run(adk_run([gate_tool(refund, "refund:{{txn_id}}", gate=gate)], [turn],
                          run_id="s"))
states = {{gate.get("refund:T%d" % i).state.value for i in range({n})}}
print(len(done), sorted(states), sorted(set(out.values()))[:1])
"""


def test_adk_many_defs_returning_coroutines_in_one_turn_do_not_hang(tmp_path: Path) -> None:
    """More such calls in one turn than the default executor has threads: every thread
    waited for a coroutine that waited for a thread. Now each runs once and is COMMITTED
    (a real process, so a hang is a timeout, not a stuck test run)."""
    pytest.importorskip("google.adk")
    n = min(32, (os.cpu_count() or 1) + 4) + 2  # asyncio's default executor size, and more
    code = _PARALLEL.format(root=str(Path(__file__).resolve().parents[1]),
                            url=f"sqlite:///{tmp_path / 'effects.db'}", n=n)
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], timeout=60,
                              capture_output=True, text=True, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung: the coroutines never finished")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == f"{n} ['committed'] ['refunded T0']"


# -- Agent Framework: twins and the keyed-on check ---------------------------------------------


def _af_tool(ledger: list[str]) -> Any:
    pytest.importorskip("agent_framework")
    from agent_framework import FunctionTool

    def refund(txn_id: str, amount_cents: int) -> str:
        ledger.append(txn_id)
        return f"refunded {amount_cents} on {txn_id}"

    return FunctionTool(func=refund, name="refund", description="Refund. Irreversible.")


def test_af_twin_of_a_cancelled_call_runs_as_its_own(gate: eg.Gate) -> None:
    """Run A's refund(T1) waits in a middleware after the gate; run B's identical call
    waits for it (its twin). A is cancelled: B, never cancelled, raised A's CancelledError.
    Now B is gated again as its own call: it refunds once and is COMMITTED."""
    from agent_framework import Agent, FunctionMiddleware

    from effectgate.integrations.agent_framework import EffectGateMiddleware

    from .adapter_drivers import af_client, af_results

    ledger: list[str] = []
    tool = _af_tool(ledger)

    class HoldFirst(FunctionMiddleware):
        def __init__(self) -> None:
            self.held: asyncio.Event | None = None

        async def process(self, context: Any, call_next: Any) -> None:
            if self.held is not None and not self.held.is_set():
                self.held.set()
                await asyncio.sleep(60)
            await call_next()

    async def main() -> Any:
        hold = HoldFirst()
        hold.held = asyncio.Event()
        middleware = [EffectGateMiddleware({"refund": "refund:{txn_id}"}, gate=gate), hold]

        def run(session_id: str) -> Any:
            agent = Agent(client=af_client([[("c1", ARGS)]]), name="billing", tools=[tool],
                          middleware=middleware)
            return agent.run("refund", session=agent.create_session(session_id=session_id))

        first = asyncio.ensure_future(run("A"))
        await hold.held.wait()
        second = asyncio.ensure_future(run("B"))
        await asyncio.sleep(0.3)  # B's call waits for A's
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await asyncio.wait_for(second, 30)

    answer = asyncio.run(main())
    assert af_results(answer.messages) == {"c1": "refunded 500 on T1"}
    assert ledger == ["T1"]
    assert gate.get("refund:T1").state is eg.State.COMMITTED


def _af_run(gate: eg.Gate, tool: Any, effects: Any, arguments: dict[str, Any]) -> dict[str, str]:
    from agent_framework import Agent

    from effectgate.integrations.agent_framework import EffectGateMiddleware

    from .adapter_drivers import af_client, af_results

    async def one() -> Any:
        agent = Agent(client=af_client([[("c1", arguments)]]), name="billing", tools=[tool],
                      middleware=[EffectGateMiddleware(effects, gate=gate)])
        return await agent.run("go", session=agent.create_session(session_id="s1"))

    return af_results(asyncio.run(one()).messages)


def test_af_keyed_on_hashes_the_arguments_once(gate: eg.Gate,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The function's arguments are compared with the payload hash the store recorded: one
    hash of them per call, where two were computed (the keyed arguments again each time)."""
    import effectgate.integrations.agent_framework as adapter

    hashed: list[Any] = []

    def counting(value: Any) -> str:
        hashed.append(value)
        return eg.payload_hash(value)

    ledger: list[str] = []
    tool = _af_tool(ledger)
    monkeypatch.setattr(adapter, "payload_hash", counting)
    assert _af_run(gate, tool, {"refund": "refund:{txn_id}"}, ARGS) == {
        "c1": "refunded 500 on T1"}
    assert len(hashed) == 1 and ledger == ["T1"]


def test_af_a_normalising_template_still_runs(gate: eg.Gate) -> None:
    """The keyed-on check hashes as the store hashed (``{path|path}`` normalises the path):
    a call the middleware did not change runs, and its repeat is a duplicate."""
    pytest.importorskip("agent_framework")
    from agent_framework import FunctionTool

    wrote: list[str] = []

    def refund(txn_id: str, amount_cents: int) -> str:
        wrote.append(txn_id)
        return f"wrote {txn_id}"

    tool = FunctionTool(func=refund, name="refund", description="Write a file.")
    effects = {"refund": "write:{txn_id|path}"}
    arguments = {"txn_id": "docs/./a.txt", "amount_cents": 1}
    assert _af_run(gate, tool, effects, arguments) == {"c1": "wrote docs/./a.txt"}
    assert _af_run(gate, tool, effects, {**arguments, "txn_id": "docs/a.txt"}) == {
        "c1": "wrote docs/./a.txt"}
    assert wrote == ["docs/./a.txt"]


def test_adk_a_sync_call_reads_no_signature(gate: eg.Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a function may be called on the gate's worker thread is read once, when it is
    gated: each call read its signature again (``inspect.signature``, most of the adapter's
    own time per call)."""
    pytest.importorskip("google.adk")
    import effectgate.integrations.google_adk as adapter

    from .adapter_drivers import adk_run

    tool = adapter.gate_tool(_refund, "refund:{txn_id}", gate=gate)
    read: list[Any] = []
    monkeypatch.setattr(adapter, "_positional_only", lambda func: read.append(func) or False)
    out = asyncio.run(adk_run([tool], [[("c1", ARGS, "_refund")]], run_id="s1"))
    assert out == {"c1": "refunded 500 on T1"} and read == []
    assert gate.get("refund:T1").state is eg.State.COMMITTED
