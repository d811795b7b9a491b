"""One agent in its own OS process, for the two-process integration tests.

    python -m tests.agent_worker FRAMEWORK STORE_URL NAMESPACE LEDGER READY GO

Builds the framework's real agent loop, driven offline by a scripted model that calls
``refund(txn_id="T1", amount_cents=500)`` twice (two call ids) and then answers. The refund body
appends one line to LEDGER (the side effect the parent counts) and takes a moment, so the two
processes overlap. The worker touches READY when it is set up, waits for GO, runs, and prints
the tool results as one JSON list on stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import effectgate as eg

ARGS = {"txn_id": "T1", "amount_cents": 500}
BODY_SECONDS = 0.4


def _body(ledger: Path) -> str:
    with ledger.open("a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(BODY_SECONDS)
    return f"refunded 500 on T1 by {os.getpid()}"


def langchain_run(gate: eg.Gate, ledger: Path) -> list[Any]:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from effectgate.integrations.langchain import gate_tool

    class Model(FakeMessagesListChatModel):
        def bind_tools(self, tools: Any, **kw: Any) -> Any:
            return self.bind(tools=[convert_to_openai_tool(t) for t in tools])

    @tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        return _body(ledger)

    calls = [AIMessage("", tool_calls=[{"name": "refund", "args": ARGS, "id": f"c{i}",
                                        "type": "tool_call"}]) for i in (1, 2)]
    agent = create_agent(Model(responses=[*calls, AIMessage("done")]),
                         tools=[gate_tool(refund, "refund:{txn_id}", gate=gate)])
    wait_for_go()
    result = agent.invoke({"messages": [{"role": "user", "content": "refund T1"}]})
    return [m.content for m in result["messages"] if isinstance(m, ToolMessage)]


def openai_agents_run(gate: eg.Gate, ledger: Path) -> list[Any]:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import ToolCallOutputItem
    from agents.testing import ScriptedModel, assistant_message, function_call

    from effectgate.integrations.openai_agents import gate_tool

    set_tracing_disabled(True)

    @function_tool
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        return _body(ledger)

    model = ScriptedModel([[function_call("refund", ARGS, call_id="c1")],
                           [function_call("refund", ARGS, call_id="c2")],
                           [assistant_message("done")]])
    agent = Agent(name="billing", model=model,
                  tools=[gate_tool(refund, "refund:{txn_id}", gate=gate)])
    wait_for_go()
    result = Runner.run_sync(agent, "refund T1")
    return [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]


def llama_index_run(gate: eg.Gate, ledger: Path) -> list[Any]:
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.core.tools import FunctionTool

    from effectgate.integrations.llama_index import gate_tool

    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction."""
        return _body(ledger)

    turns = iter([
        *(ChatMessage(role=MessageRole.ASSISTANT, blocks=[
            ToolCallBlock(tool_call_id=f"c{i}", tool_name="refund", tool_kwargs=dict(ARGS))])
          for i in (1, 2)),
        ChatMessage(role=MessageRole.ASSISTANT, content="done"),
    ])
    llm = MockFunctionCallingLLM(response_generator=lambda messages, **kw: next(turns))
    tool = gate_tool(FunctionTool.from_defaults(fn=refund), "refund:{txn_id}", gate=gate)
    agent = FunctionAgent(name="billing", tools=[tool], llm=llm)

    async def run() -> list[Any]:
        handler = agent.run(user_msg="refund T1")
        outputs = [ev.tool_output.content async for ev in handler.stream_events()
                   if isinstance(ev, ToolCallResult)]
        await handler
        return outputs

    wait_for_go()
    return asyncio.run(run())


_ready = _go = Path()


def wait_for_go() -> None:
    _ready.touch()
    deadline = time.monotonic() + 60
    while not _go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.01)


def run_two_agents(framework: str, url: str, namespace: str,
                   folder: Path) -> tuple[list[str], list[list[Any]]]:
    """Run two worker processes on one store at once: (ledger lines, each one's results)."""
    ledger, go = folder / "ledger.txt", folder / "go"
    ready = [folder / f"ready{i}" for i in (1, 2)]
    root = Path(__file__).resolve().parent.parent
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.agent_worker", framework, url, namespace, str(ledger),
             str(r), str(go)],
            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in ready
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(r.exists() for r in ready):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        go.touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            if p.returncode != 0:
                raise AssertionError(f"worker failed ({p.returncode}):\n{err[-3000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return lines, results


def main() -> None:
    global _ready, _go
    framework, url, namespace, ledger, ready, go = sys.argv[1:7]
    _ready, _go = Path(ready), Path(go)
    gate = eg.Gate(url, namespace=namespace, lease_seconds=30)
    run = {"langchain": langchain_run, "openai_agents": openai_agents_run,
           "llama_index": llama_index_run}[framework]
    with eg.effect_context(run_id=f"worker-{uuid.uuid4().hex[:6]}"):
        outputs = run(gate, Path(ledger))
    gate.close()
    print(json.dumps(outputs))


if __name__ == "__main__":
    main()
