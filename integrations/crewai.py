"""CrewAI (``crewai``): gated tools.

* ``gate_tool(tool, "refund:{txn_id}", gate=gate)`` returns a CrewAI ``BaseTool`` with the same
  name, description (the text CrewAI renders into the agent's prompt, byte for byte) and
  ``args_schema`` (the same class), whose every call passes through the gate: the key is
  reserved before the tool's own ``_run`` runs and the outcome recorded after.
  ``gate_tools(tools, effects)`` wraps a list and reports every tool left ungated.

The tool itself is wrapped because CrewAI's tool hooks cannot answer for it: a
``before_tool_call`` hook may only let the call through or block it (the model is told "Tool
execution blocked by hook"), so it can neither hand back a stored result nor record the
outcome of the call it let through.

Arguments reach the gate as CrewAI validated them against the ``args_schema`` (``"500"`` is
``500``, defaults filled in), once, and the tool gets them as it would ungated (a nested model
as the dict CrewAI passes: a key template names its parts ``{order[id]}``). CrewAI's own
``security_context`` (its agent's and task's fingerprints, new in every crew), which a schema
allowing extra fields hands on to the tool, reaches the tool but is not part of the effect.
An async ``_run`` is run to its end, on a thread of its own when the crew was kicked off
inside a running event loop (where ``asyncio.run`` would refuse it). A duplicate gets
the stored result, as though the tool had just run. Every other answer is the tool's text
telling the model what to do (wait, do not retry, ask a human); such texts are never put in
CrewAI's tool cache (``cache_function``, carried to the structured tool CrewAI's agents call),
so an approval given later is not hidden behind a cached "waiting for approval". Only
``on_refusal="message"`` is offered: CrewAI catches every exception a tool raises, calls the
tool again and then tells the model the error text, so a raised refusal would not stop the
crew — it would only be asked again.

CrewAI's loop makes one tool call per model turn, and it refuses an immediate repeat of the
same tool and input itself ("I tried reusing the same input…") before the tool is called; a
repeat after another step reaches the gate, which answers it from the store. A CrewAI tool is
called with its arguments only: no run or agent reaches it. To record them, wrap the kickoff:
``with eg.effect_context(run_id=..., agent_id=...): crew.kickoff()``. The context does not
reach a ``Task(async_execution=True)`` or an agent with ``max_execution_time``: CrewAI runs
those on threads of its own without copying it, so their calls record no run or agent, and a
per-run or per-agent ceiling cannot count them (each logs and warns its ``budget_warning``).

**Tools CrewAI adds at kickoff** (``Agent(mcps=[...])``, ``Agent(apps=[...])``: CrewAI
connects and builds them when the crew or ``Agent.kickoff`` starts) never pass through
:func:`gate_tools`: they cannot be gated, and naming one in ``effects`` is refused ("not in the
list"). Without ``strict`` they run ungated and unrecorded, like any tool left out of the list.
Under ``strict=True`` (or ``policy.strict``) each call of such a tool is refused at the call —
not before the run: the list cannot see the agent it is given to — by a CrewAI
``before_tool_call`` hook this module registers (once, process-wide): nothing reaches the MCP
server or the app, the model is told "Tool execution blocked by hook", and each refusal is
logged and warned (``UngatedToolWarning``). CrewAI's own delegation tools are let through: they
hand work to another agent, whose tools its own list gates. The hook finds the strict list
through the gated tools of the agent or the task, so a strict list with no gated tool (only
reads) refuses nothing; beside a strict list, a read any list declared (``None``,
``read_only``) runs, a tool a list without strict left ungated does not. The hook is put first
among CrewAI's hooks (CrewAI skips the rest once one raises, and runs the tool), and
``crewai.hooks.clear_before_tool_call_hooks()`` removes it until the next strict
:func:`gate_tools`. To gate an MCP server's writes, put effectgate's
MCP gateway in front of it (``effectgate mcp gateway``) and point ``mcps`` at the gateway.

**Approvals**: CrewAI 1.6 has no pause that survives a process: ``Task(human_input=True)`` asks
for feedback on a task's final answer at the console (``input()``), and a tool hook's
``request_human_input`` prompts the console too; neither can stop a run and resume it
elsewhere. So a call the policy sends for approval is answered with its approval request
("WAITING FOR APPROVAL … approval id …"): the request is in the store with the exact
arguments that would execute, the agent tells the user, and a human decides in the CLI or the
console (``effectgate approve``). The next kickoff that makes the same call — in any process —
executes it once, with the approved arguments only (the approval binds their payload hash:
**prevention**); a denial is what the model hears instead; a repeat after that gets the stored
result.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from effectgate import ConfigError, EffectSpec, Gate, Policy

from ._kernel import (
    Framework,
    GatedCall,
    OnRefusal,
    Refused,
    UngatedToolWarning,
    read_declarations,
    requires_extra,
    resolve_gate,
)
from ._kernel import gate_tools as _gate_tools

with requires_extra("crewai", "crewai"):
    from crewai.hooks import (
        clear_before_tool_call_hooks,
        get_before_tool_call_hooks,
        register_before_tool_call_hook,
    )
    from crewai.tools import BaseTool
    from pydantic import PrivateAttr

__all__ = ["GatedCrewTool", "UngatedToolWarning", "gate_tool", "gate_tools", "is_gated"]


class _Refusal(str):
    """A refusal's text as the tool's result: a ``str``, marked so it is never cached."""

    __slots__ = ()


def _cache(inner: Callable[..., Any]) -> Callable[..., bool]:
    """The wrapped tool's ``cache_function``, refusing to cache a refusal."""

    def cache_function(args: Any = None, result: Any = None) -> bool:
        return not isinstance(result, _Refusal) and bool(inner(args, result))

    return cache_function


class GatedCrewTool(BaseTool):
    """A CrewAI tool whose calls pass through an effect gate (see :func:`gate_tool`).

    ``inner`` is the wrapped tool; ``gated_call.spec`` the :class:`effectgate.EffectSpec`.
    """

    _inner: BaseTool = PrivateAttr()
    _gated: GatedCall = PrivateAttr()
    _strict_names: frozenset[str] | None = PrivateAttr(default=None)

    @property
    def inner(self) -> BaseTool:
        """The wrapped tool."""
        return self._inner

    @property
    def gated_call(self) -> GatedCall:
        """The gated call: its ``spec`` and ``on_refusal``."""
        return self._gated

    def to_structured_tool(self) -> Any:
        """CrewAI's structured form of this tool (what its agents call), carrying the
        ``cache_function`` that keeps refusals out of CrewAI's tool cache (CrewAI's own
        conversion leaves it behind, and caches every answer)."""
        structured = super().to_structured_tool()
        structured.cache_function = self.cache_function  # type: ignore[attr-defined]
        return structured

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise ConfigError(f"tool {self.name!r} takes its arguments by name")
        # CrewAI validated them against args_schema already (its tool use and its structured
        # tool both do): keyed and passed on as they are, as the ungated tool gets them. A
        # second validation would run a validator that changes values twice.
        arguments = dict(kwargs)
        keyed = _model_arguments(arguments, self.args_schema.model_fields)
        out = self._gated.run(keyed, lambda: _call(self._inner, arguments))
        if isinstance(out, Refused):
            return _Refusal(out.message)
        return out


_METADATA = "security_context"
"""What CrewAI's tool use adds to every call's arguments (the agent's and task's fingerprints:
new ids in every crew). A schema that allows extra fields hands it on to the tool."""


def _model_arguments(arguments: dict[str, Any], fields: Any) -> dict[str, Any]:
    """The arguments an effect is keyed and hashed by: the model's, without CrewAI's own
    ``security_context`` (unless the schema declares it). Hashed with it, a repeat in the
    next crew was another payload under the same key: refused as a conflict instead of
    answered, and an approval could never be used."""
    if _METADATA in arguments and _METADATA not in fields:
        return {name: value for name, value in arguments.items() if name != _METADATA}
    return arguments


def _call(tool: BaseTool, arguments: dict[str, Any]) -> Any:
    """The wrapped tool's own ``_run`` (a coroutine run to its end, as ``BaseTool.run`` does)."""
    result = tool._run(**arguments)
    if asyncio.iscoroutine(result):
        result = _finish(result)
    return result


def _finish(coroutine: Any) -> Any:
    """Run a coroutine to its end: with ``asyncio.run``, or, when this thread already runs an
    event loop (a crew kicked off inside async code), on a thread of its own with this
    context (the running effect's). ``asyncio.run`` refuses a running loop before the
    coroutine starts: the body raised, and the effect read as possibly done when nothing ran."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    context = contextvars.copy_context()
    with ThreadPoolExecutor(1, thread_name_prefix="effectgate-crewai") as pool:
        return pool.submit(context.run, asyncio.run, coroutine).result()


def is_gated(tool: Any) -> bool:
    """True for a tool returned by :func:`gate_tool`."""
    return isinstance(tool, GatedCrewTool)


def gate_tool(tool: BaseTool, key: str, *, gate: Gate | None = None,
              effect_type: str | None = None, on_refusal: OnRefusal = "message",
              **effect_options: Any) -> GatedCrewTool:
    """Gate a CrewAI ``BaseTool`` (``@tool``, a ``BaseTool`` subclass) under the key template
    ``key``.

    Returns a :class:`GatedCrewTool` with the same name, description and ``args_schema``.
    ``effect_type`` defaults to the tool's name; ``effect_options`` are
    :class:`effectgate.EffectSpec` options. ``gate=None`` uses the process-wide default gate.
    ``on_refusal`` must be ``"message"`` (see the module docstring).
    """
    if not isinstance(tool, BaseTool):
        raise ConfigError(f"gate_tool takes a crewai BaseTool, not {type(tool).__name__}")
    if is_gated(tool):
        raise ConfigError(f"tool {tool.name!r} is already gated")
    if on_refusal != "message":
        raise ConfigError("CrewAI catches a tool's exceptions and calls it again: only "
                          "on_refusal='message' stops the model from acting on a refusal")
    spec = EffectSpec(resolve_gate(gate), key, effect_type=effect_type or tool.name,
                      **effect_options)
    spec.check_names(tool.args_schema.model_fields, f"tool {tool.name!r}")
    gated = GatedCrewTool(
        name=tool.name, description=tool.description, args_schema=tool.args_schema,
        env_vars=list(tool.env_vars), result_as_answer=tool.result_as_answer,
        max_usage_count=tool.max_usage_count, cache_function=_cache(tool.cache_function))
    gated.description = tool.description  # BaseTool rewrote it on construction
    gated.description_updated = tool.description_updated
    gated._inner = tool
    gated._gated = GatedCall(spec, tool.name, on_refusal="message")
    return gated


_FRAMEWORK = Framework(
    "crewai", tool_name=lambda t: t.name if isinstance(t, BaseTool) else None,
    is_gated=is_gated, wrap=gate_tool)


def gate_tools(tools: Iterable[Any], effects: Any, *, gate: Gate | None = None,
               strict: bool = False, read_only: Iterable[str] = ()) -> list[Any]:
    """Gate the declared tools of a list and pass the rest through, in order.

    ``effects``: tool name → key template, → ``{"key": ..., **options}``, or → None
    (read-only); or an :class:`effectgate.Policy` whose rules name their ``tools`` (the gate
    must carry that policy). Every tool left ungated is reported once by name;
    ``strict=True`` (or ``policy.strict``) refuses them with ``ConfigError``, and refuses at
    the call every tool CrewAI adds at kickoff (``mcps``, ``apps``) to an agent or task holding
    this list's gated tools (see the module docstring).
    """
    read_only = tuple(read_only)
    gated = _gate_tools(_FRAMEWORK, tools, effects, gate=gate, strict=strict,
                        read_only=read_only)
    listed = [t.name for t in gated if isinstance(t, BaseTool)]
    reads = read_declarations(effects, gate=resolve_gate(gate), read_only=read_only,
                              tool_names=listed).read_only
    with _hook_lock:  # every list's declared reads, strict or not (see _listed)
        _listed.update(name for name in listed if name in reads)
    if strict or (isinstance(effects, Policy) and effects.strict):
        # Tools CrewAI adds at kickoff (``mcps``, ``apps``) never come through here: the
        # strict list's gated tools carry its names, and a tool hook refuses the others.
        names = frozenset(t.name for t in gated if isinstance(t, BaseTool))
        for tool in gated:
            if is_gated(tool):
                tool._strict_names = names
        _register_strict_hook()
    return gated


log = logging.getLogger("effectgate")
_hook_lock = threading.Lock()
_listed: set[str] = set()
"""The names of the tools every :func:`gate_tools` list of this process declared read-only
(strict or not): under a strict list, such a read of another list beside it (a list of reads
of its own, or one without strict) is declared, not one CrewAI added at kickoff; a tool another
list left ungated is still refused."""

_CREWAI_OWN = "crewai.tools.agent_tools."
"""CrewAI's own agent tools (delegate work, ask a coworker, add an image): they hand work to
another agent, whose tools are gated by its own list, and run no effect of their own."""


def _strict_names(*lists: Any) -> frozenset[str] | None:
    """The names a strict :func:`gate_tools` list declared, if one of ``lists`` holds its
    gated tools; None when none does (the agent is not strict)."""
    names: frozenset[str] | None = None
    for tools in lists:
        for tool in tools or ():
            if isinstance(tool, GatedCrewTool) and tool._strict_names is not None:
                names = (names or frozenset()) | tool._strict_names
    return names


def _refuse_undeclared(context: Any) -> bool | None:
    """CrewAI's ``before_tool_call`` hook: under a strict list, block a tool no list held
    (one CrewAI added at kickoff from ``mcps`` or ``apps``), so it cannot run ungated.

    A hook's exception is logged by CrewAI and the tool runs anyway: this hook never raises."""
    agent, task = getattr(context, "agent", None), getattr(context, "task", None)
    names = _strict_names(getattr(agent, "tools", None), getattr(task, "tools", None))
    if names is None:
        return None
    try:
        tool = getattr(context.tool, "_original_tool", None) or context.tool
        if (is_gated(tool) or tool.name in names or tool.name in _listed
                or type(tool).__module__.startswith(_CREWAI_OWN)):
            return None
        text = (f"strict mode: CrewAI tool {tool.name!r} was added to agent "
                f"{getattr(agent, 'role', '?')!r} outside gate_tools (Agent(mcps=...) or "
                f"Agent(apps=...)) and would run ungated: refused")
    except Exception:  # strict fails closed: a call it cannot read is refused
        log.exception("effectgate: could not check a CrewAI tool call under strict; refused")
        return False
    log.error("%s", text)
    warnings.warn(text, UngatedToolWarning, stacklevel=2)
    return False


def _register_strict_hook() -> None:
    """Register :func:`_refuse_undeclared` with CrewAI, first in line (again if it was
    cleared, or hooks were registered before it): CrewAI runs its hooks in one ``try``, and a
    hook that raises skips those after it while the tool runs anyway."""
    with _hook_lock:
        hooks = get_before_tool_call_hooks()
        if hooks[:1] == [_refuse_undeclared]:
            return
        clear_before_tool_call_hooks()
        for hook in (_refuse_undeclared, *(h for h in hooks if h is not _refuse_undeclared)):
            register_before_tool_call_hook(hook)
