"""Adapters: a gated framework tool beside the same framework tool around the core decorator.

For each framework whose integration is installed, two tools wrap one no-op function: the
integration's ``gate_tool(tool, "bench:{txn_id}")`` and the framework's plain tool made from
the ``@gate.effect``-decorated function. Both are invoked the framework's way (LangChain
``invoke``, OpenAI Agents ``on_invoke_tool``, LlamaIndex ``call``, pydantic-ai
``toolset.call_tool`` with the arguments its validator produced, Google ADK ``run_async`` with a
``ToolContext``, CrewAI's structured tool ``invoke``, Microsoft Agent Framework's function
middleware pipeline), so the ratio is what the integration adds over the core (target 1.3x).
pydantic-ai gates a toolset (``EffectGateToolset``) rather than one tool, and Agent Framework a
function middleware (``EffectGateMiddleware``) beside the unwrapped tool: those are their
forms. A second row, without a
target, sets the gated tool beside a bare call of the decorated function (framework overhead
included).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from ..gate import Gate
from .baseline import KeySource, calling
from .measure import Ratio, Report, interleave
from .stores import Scratch

__all__ = ["TARGET", "bench_adapters"]

TARGET = 1.3
_TEMPLATE = "bench:{txn_id}"
_Run = Callable[[Awaitable[Any]], Any]
"""How an async framework's call is driven to its answer: the run's one event loop."""


def refund(txn_id: str, amount_cents: int = 500) -> dict:  # type: ignore[type-arg]
    """Refund a transaction (a no-op for the benchmark)."""
    return {"ok": True}


def _integration(name: str) -> Any:
    if name == "crewai":  # CrewAI exports telemetry by default: the bench sends nothing away
        # (not OTEL_SDK_DISABLED: it would make the telemetry rows' own providers no-ops)
        for var, value in (("CREWAI_DISABLE_TELEMETRY", "true"),
                           ("CREWAI_TRACING_ENABLED", "false")):
            os.environ.setdefault(var, value)
    try:
        module = importlib.import_module(f"effectgate.integrations.{name}")
    except ImportError:
        return None
    return module if hasattr(module, "gate_tool") or hasattr(
        module, "EffectGateMiddleware") else None


def _calls_langchain(gate: Gate, core: Callable[..., Any], module: Any,
                     run: _Run) -> tuple[Any, Any]:
    from langchain_core.tools import StructuredTool

    tool = StructuredTool.from_function(refund, name="refund")
    gated = module.gate_tool(tool, _TEMPLATE, gate=gate, effect_type="bench.effect")
    plain = StructuredTool.from_function(core, name="refund")

    def call(t: Any) -> Callable[[str], Any]:
        return lambda key: t.invoke({"txn_id": key, "amount_cents": 500})

    return call(gated), call(plain)


def _calls_openai_agents(gate: Gate, core: Callable[..., Any], module: Any,
                         run: _Run) -> tuple[Any, Any]:
    from agents import function_tool
    from agents.tool_context import ToolContext

    tool = function_tool(refund)
    gated = module.gate_tool(tool, _TEMPLATE, gate=gate, effect_type="bench.effect")
    plain = function_tool(core, name_override="refund")

    def call(t: Any) -> Callable[[str], Any]:
        def invoke(key: str) -> Any:
            args = json.dumps({"txn_id": key, "amount_cents": 500})
            ctx = ToolContext(None, tool_name="refund", tool_call_id=key, tool_arguments=args)
            return run(t.on_invoke_tool(ctx, args))

        return invoke

    return call(gated), call(plain)


def _calls_llama_index(gate: Gate, core: Callable[..., Any], module: Any,
                       run: _Run) -> tuple[Any, Any]:
    from llama_index.core.tools import FunctionTool

    tool = FunctionTool.from_defaults(fn=refund, name="refund")
    gated = module.gate_tool(tool, _TEMPLATE, gate=gate, effect_type="bench.effect")
    plain = FunctionTool.from_defaults(fn=core, name="refund")

    def call(t: Any) -> Callable[[str], Any]:
        return lambda key: t.call(txn_id=key, amount_cents=500)

    return call(gated), call(plain)


def _calls_pydantic_ai(gate: Gate, core: Callable[..., Any], module: Any,
                       run: _Run) -> tuple[Any, Any]:
    from pydantic_ai import RunContext, Tool
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_ai.usage import RunUsage

    gated = module.EffectGateToolset(
        FunctionToolset([Tool(refund)]),
        {"refund": {"key": _TEMPLATE, "effect_type": "bench.effect"}}, gate=gate)
    plain = FunctionToolset([Tool(core, name="refund")])
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())

    def call(toolset: Any) -> Callable[[str], Any]:
        tool = run(toolset.get_tools(ctx))["refund"]

        def invoke(key: str) -> Any:
            args = tool.args_validator.validate_python({"txn_id": key, "amount_cents": 500})
            return run(toolset.call_tool("refund", args, ctx, tool))

        return invoke

    return call(gated), call(plain)


def _calls_google_adk(gate: Gate, core: Callable[..., Any], module: Any,
                      run: _Run) -> tuple[Any, Any]:
    from google.adk.agents import LlmAgent
    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.sessions import InMemorySessionService, Session
    from google.adk.tools.function_tool import FunctionTool
    from google.adk.tools.tool_context import ToolContext

    gated = module.gate_tool(FunctionTool(refund), _TEMPLATE, gate=gate,
                             effect_type="bench.effect")
    plain = FunctionTool(core)
    invocation = InvocationContext(
        session_service=InMemorySessionService(), invocation_id="bench",
        agent=LlmAgent(name="bench"), session=Session(id="bench", app_name="bench",
                                                      user_id="bench"))

    def call(t: Any) -> Callable[[str], Any]:
        def invoke(key: str) -> Any:
            context = ToolContext(invocation_context=invocation, function_call_id=key)
            return run(t.run_async(
                args={"txn_id": key, "amount_cents": 500}, tool_context=context))

        return invoke

    return call(gated), call(plain)


def _calls_crewai(gate: Gate, core: Callable[..., Any], module: Any,
                  run: _Run) -> tuple[Any, Any]:
    from crewai.tools import tool

    gated = module.gate_tool(tool("refund")(refund), _TEMPLATE, gate=gate,
                             effect_type="bench.effect").to_structured_tool()
    plain = tool("refund")(core).to_structured_tool()

    def call(t: Any) -> Callable[[str], Any]:
        return lambda key: t.invoke(input={"txn_id": key, "amount_cents": 500})

    return call(gated), call(plain)


def _calls_agent_framework(gate: Gate, core: Callable[..., Any], module: Any,
                           run: _Run) -> tuple[Any, Any]:
    from agent_framework import FunctionInvocationContext, tool
    from agent_framework._middleware import FunctionMiddlewarePipeline

    gate_mw = module.EffectGateMiddleware(
        {"refund": {"key": _TEMPLATE, "effect_type": "bench.effect"}}, gate=gate)
    gated = (tool(refund), FunctionMiddlewarePipeline(gate_mw.function_middleware))
    plain = (tool(core), FunctionMiddlewarePipeline())

    def call(pair: Any) -> Callable[[str], Any]:
        function, pipeline = pair

        async def final(context: Any) -> Any:
            return await function.invoke(arguments=context.arguments)

        def invoke(key: str) -> Any:
            context = FunctionInvocationContext(function=function,
                                                arguments={"txn_id": key, "amount_cents": 500})
            return run(pipeline.execute(context, final))

        return invoke

    return call(gated), call(plain)


_FRAMEWORKS = {
    "langchain": ("langchain", _calls_langchain),
    "openai-agents": ("openai_agents", _calls_openai_agents),
    "llama-index": ("llama_index", _calls_llama_index),
    "pydantic-ai": ("pydantic_ai", _calls_pydantic_ai),
    "google-adk": ("google_adk", _calls_google_adk),
    "crewai": ("crewai", _calls_crewai),
    "agent-framework": ("agent_framework", _calls_agent_framework),
}


def bench_adapters(s: Scratch, report: Report, *, n: int, chunks: int) -> None:
    """Add one ratio per installed framework integration for the backend ``s``."""
    loop = asyncio.new_event_loop()  # the async frameworks' calls, closed when all are done
    try:
        _each_framework(s, report, loop.run_until_complete, n=n, chunks=chunks)
    finally:
        loop.close()


def _each_framework(s: Scratch, report: Report, run: _Run, *, n: int, chunks: int) -> None:
    for label, (module_name, build) in _FRAMEWORKS.items():
        module = _integration(module_name)
        if module is None:
            report.notes.append(f"adapters: effectgate.integrations.{module_name}.gate_tool "
                                "is not available; skipped")
            continue
        name = f"adapter_{module_name}"
        gate = Gate(s.url(name), namespace=s.namespace(name), policy=False)
        try:
            core = gate.effect(_TEMPLATE, effect_type="bench.effect")(refund)
            gated_call, plain_call = build(gate, core, module, run)
            keys = {k: KeySource(f"{k}-") for k in ("gated", "plain", "core")}
            runners = {"gated": calling(gated_call, keys["gated"]),
                       "plain": calling(plain_call, keys["plain"]),
                       "core": calling(core, keys["core"])}
            times = interleave(runners, total=n, chunks=chunks)
            form = "middleware" if module_name == "agent_framework" else "gate_tool"
            report.ratios.append(Ratio("adapters", s.backend, f"{label} {form}",
                                       times["gated"], times["plain"],
                                       "tool+@gate.effect", TARGET,
                                       times.spread("gated", "plain")))
            report.ratios.append(Ratio("adapters", s.backend, "  beside a bare call",
                                       times["gated"], times["core"], "bare @gate.effect",
                                       spread=times.spread("gated", "core")))
        except Exception as err:  # an integration in progress must not sink the whole run
            report.notes.append(f"adapters: {label} failed: {type(err).__name__}: {err}")
        finally:
            gate.close()

