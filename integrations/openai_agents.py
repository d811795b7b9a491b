"""OpenAI Agents SDK (``agents``): gated function tools, and run hooks that refuse ungated ones.

* ``gate_tool(tool, "refund:{txn_id}", gate=gate)`` returns a ``FunctionTool`` with the same
  name, description and parameter schema (strict or not) — the tool definition sent to the model
  is unchanged — whose invocation passes through the gate. This is the form that guarantees at
  most one execution: it reserves the key before the body runs and records the outcome after.
  ``gate_tools(tools, effects)`` wraps a list and reports every tool left ungated.
* ``EffectGateRunHooks(strict=...)``, passed as ``Runner.run(..., hooks=...)``, looks at each
  agent's tools when the agent starts: ungated function tools are reported once by name, or,
  strict, the run stops before any tool is called. Hooks can only abort, so they enforce
  coverage; they do not gate a call themselves.

The model's JSON arguments are validated through the function's own parameter model (the one
``@function_tool`` built) before the key and payload hash are computed, so ``"500"`` and ``500``
are one refund; a hand-built ``FunctionTool`` (no Python function behind it) is keyed on its
JSON arguments as sent. Arguments that fail validation go to the tool's own error handling and
nothing runs. A duplicate gets the stored result, as though the tool had just run; every other
answer becomes the tool's output text, telling the model what to do. With
``on_refusal="raise"`` refusals are raised as :class:`EffectGateAgentsError` subclasses of the
matching effectgate error (``except eg.EffectAmbiguous`` works): being ``AgentsException`` s, the
SDK neither wraps them in ``UserError`` nor turns them into a "please try again" message, so an
ambiguous effect stops the run. An exception from the tool's body is never swallowed by the SDK's
default failure handler ("An error occurred... Please try again" is the wrong advice for an
effect that may have happened): the gate records it and the model is told its real outcome.

The agent's name becomes the effect's ``agent_id``; ``RunConfig.trace_id`` (or the current
trace's id, or ``RunConfig.group_id``) its ``run_id``.

Not offered, and why: tool input guardrails run only before the call, so they can refuse a
repeat of a settled effect but cannot reserve it nor record the outcome; ``needs_approval`` is
the SDK's own human-in-the-loop, separate from the gate's policy approvals (an
``approval_required`` answer reaches the model with its approval id; approve it with
``gate.approve``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from effectgate import ConfigError, EffectGateError, EffectSpec, Gate

from ._common import (
    GatedCall,
    OnRefusal,
    Refused,
    UngatedToolWarning,
    effect_specs,
    framework_context,
    model_arguments,
    report_ungated,
    resolve_gate,
)

try:
    from agents import AgentsException, FunctionTool, RunHooks
    from agents.function_schema import function_schema
    from agents.tool_context import ToolContext
    from pydantic import ValidationError
except ImportError as _err:  # pragma: no cover - depends on the environment
    from ._common import missing_extra

    raise missing_extra("openai_agents", "openai-agents", _err) from _err

__all__ = [
    "EffectGateAgentsError",
    "EffectGateRunHooks",
    "UngatedToolWarning",
    "gate_tool",
    "gate_tools",
    "is_gated",
]

_MARK = "__effectgate_call__"


class EffectGateAgentsError(AgentsException):
    """Base of the effectgate errors raised into an agent run (``on_refusal="raise"``).

    Each concrete class also derives from the effectgate error it stands for
    (``EffectAmbiguous``, ``EffectInFlight``, ``ApprovalRequired``, ``EffectDenied``...), with
    the same fields.
    """


_dual_types: dict[type[BaseException], type[BaseException]] = {}


def _as_agents_error(error: BaseException) -> BaseException:
    if not isinstance(error, EffectGateError) or isinstance(error, AgentsException):
        return error
    kind = type(error)
    dual = _dual_types.get(kind)
    if dual is None:
        dual = type(kind.__name__, (kind, EffectGateAgentsError),
                    {"__module__": __name__, "__doc__": kind.__doc__})
        _dual_types[kind] = dual
    converted = dual.__new__(dual)
    converted.__dict__.update(error.__dict__)
    converted.args = error.args
    converted.run_data = None  # type: ignore[attr-defined]
    return converted


def is_gated(tool: Any) -> bool:
    """True for a tool returned by :func:`gate_tool`."""
    return getattr(getattr(tool, "on_invoke_tool", None), _MARK, None) is not None


def _context(ctx: Any) -> tuple[Any, Any]:
    agent = getattr(ctx, "agent", None)
    config = getattr(ctx, "run_config", None)
    run_id = getattr(config, "trace_id", None)
    if run_id is None:
        from agents.tracing import get_current_trace

        trace = get_current_trace()
        trace_id = getattr(trace, "trace_id", None)
        run_id = trace_id if trace_id and trace_id != "no-op" else None
    if run_id is None:
        run_id = getattr(config, "group_id", None)
    return run_id, getattr(agent, "name", None)


def _parameters_model(tool: FunctionTool) -> Any:
    """The pydantic model ``@function_tool`` validates with, rebuilt from its function."""
    try:
        func = tool.__wrapped__
    except AttributeError:
        return None
    try:
        return function_schema(func, use_docstring_info=False).params_pydantic_model
    except Exception:  # an unusual callable: key on the JSON as sent
        return None


def _output(out: Any) -> Any:
    return out.message if isinstance(out, Refused) else out


def gate_tool(tool: FunctionTool, key: str, *, gate: Gate | None = None,
              effect_type: str | None = None, on_refusal: OnRefusal = "message",
              **effect_options: Any) -> FunctionTool:
    """Gate an Agents SDK ``FunctionTool`` under the key template ``key``.

    Returns a ``FunctionTool`` with the same definition; ``await tool.on_invoke_tool(ctx,
    json_args)`` works outside a run too. ``effect_type`` defaults to the tool's name;
    ``effect_options`` are :class:`effectgate.EffectSpec` options. ``gate=None`` uses the
    process-wide default gate.
    """
    if not isinstance(tool, FunctionTool):
        raise ConfigError(f"gate_tool takes an agents FunctionTool, not {type(tool).__name__}")
    if is_gated(tool):
        raise ConfigError(f"tool {tool.name!r} is already gated")
    spec = EffectSpec(resolve_gate(gate), key, effect_type=effect_type or tool.name,
                      **effect_options)
    props = tool.params_json_schema.get("properties")
    if isinstance(props, dict):
        spec.check_names(props, f"tool {tool.name!r}")
    gated = GatedCall(spec, tool.name, on_refusal=on_refusal, raise_as=_as_agents_error)
    model = _parameters_model(tool)
    original = tool.on_invoke_tool
    # The same tool without the SDK's failure handler, so the gate sees the body's exception.
    raw = dataclasses.replace(tool, _failure_error_function=None,
                              _use_default_failure_error_function=False).on_invoke_tool

    def arguments(input_json: str) -> dict[str, Any]:
        data = json.loads(input_json) if input_json else {}
        if not isinstance(data, dict):
            raise ValueError("tool arguments must be a JSON object")
        return model_arguments(model, data) if model is not None else data

    async def on_invoke_tool(ctx: ToolContext[Any], input_json: str) -> Any:
        try:
            args = arguments(input_json)
        except (ValueError, ValidationError):  # JSONDecodeError is a ValueError
            return await original(ctx, input_json)  # its own error message; nothing runs
        with framework_context(*_context(ctx)):
            out = await gated.arun(args, lambda: raw(ctx, input_json))
        return _output(out)

    setattr(on_invoke_tool, _MARK, gated)
    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


def gate_tools(tools: Iterable[Any], effects: Any, *, gate: Gate | None = None,
               strict: bool = False, read_only: Iterable[str] = (),
               on_refusal: OnRefusal = "message") -> list[Any]:
    """Gate the declared function tools of a list and pass the rest through, in order.

    ``effects``: tool name → key template, → ``{"key": ..., **options}``, or → None (read-only);
    or an :class:`effectgate.Policy` whose rules name their ``tools`` (the gate must carry that
    policy). Every function tool left ungated is reported once by name; ``strict=True`` (or
    ``policy.strict``) refuses them with ``ConfigError``. Hosted tools (web search...) and
    handoffs pass through unreported: they do not run here.
    """
    tools = list(tools)
    names = [t.name for t in tools if isinstance(t, FunctionTool)]
    resolved = resolve_gate(gate)
    declared, reads, policy_strict = effect_specs(effects, names, gate=resolved,
                                                  read_only=read_only)
    out: list[Any] = []
    ungated: list[str] = []
    for tool in tools:
        if not isinstance(tool, FunctionTool) or is_gated(tool) or tool.name in reads:
            out.append(tool)
        elif tool.name in declared:
            key, options = declared[tool.name]
            options = {"on_refusal": on_refusal, **options}
            out.append(gate_tool(tool, key, gate=resolved, **options))
        else:
            ungated.append(tool.name)
            out.append(tool)
    report_ungated("openai_agents", ungated, strict=strict or policy_strict)
    return out


class EffectGateRunHooks(RunHooks[Any]):
    """Run hooks that check, as each agent starts, that its function tools are gated.

    Ungated tools (not from :func:`gate_tool`, not in ``read_only``) are reported once by name;
    with ``strict=True`` the run stops with :class:`EffectGateAgentsError` before any tool runs.
    """

    def __init__(self, *, strict: bool = False, read_only: Iterable[str] = ()) -> None:
        self.strict = strict
        self.read_only = frozenset(read_only)

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        names = [
            t.name for t in getattr(agent, "tools", ())
            if isinstance(t, FunctionTool) and not is_gated(t) and t.name not in self.read_only
        ]
        try:
            report_ungated("openai_agents", names, strict=self.strict)
        except ConfigError as err:
            raise _as_agents_error(err) from None
