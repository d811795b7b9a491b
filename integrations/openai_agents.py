"""OpenAI Agents SDK (``agents``): gated function tools, and run hooks that refuse ungated ones.

* ``gate_tool(tool, "refund:{txn_id}", gate=gate)`` returns a ``FunctionTool`` with the same
  name, description and parameter schema (strict or not) — the tool definition sent to the model
  is unchanged — whose invocation passes through the gate. This is the form that guarantees at
  most one execution: it reserves the key before the body runs and records the outcome after.
  ``gate_tools(tools, effects)`` wraps a list and reports every tool left ungated.
  ``tool.__wrapped__`` is still the Python function behind it.
* ``EffectGateRunHooks(strict=...)``, passed as ``Runner.run(..., hooks=...)``, looks at each
  agent's tools when the agent starts (its MCP servers' tools too, as the SDK lists them, and
  the tools of an agent used as a tool, whose nested run these hooks never see): ungated
  function tools, and tools that run here but are no function tools (a ``CustomTool``, a
  local shell), are reported once by name, or, strict, the run stops before any tool is
  called. Hooks can only abort, so they enforce coverage; they do not gate a call
  themselves.

The model's JSON arguments are validated through the function's own parameter model (the one
``@function_tool`` built) before the key and payload hash are computed, so ``"500"`` and ``500``
are one refund; a hand-built ``FunctionTool`` (no Python function behind it) is keyed on its
JSON arguments as sent. Arguments that fail validation go to the tool's own invocation, which
answers them as it would ungated (its failure handler, or its ``ModelBehaviorError``); nothing
runs, and no exception the gate raises carries the validation error (it holds the arguments,
which ``OPENAI_AGENTS_DONT_LOG_TOOL_DATA`` keeps out of logs and traces).

A duplicate gets the stored result, as though the tool had just run; two identical calls in one
turn run once and both get the result. Every other answer becomes the tool's output text,
telling the model what to do. With ``on_refusal="raise"`` refusals are raised as
:class:`EffectGateAgentsError` subclasses of the matching effectgate error (``except
eg.EffectAmbiguous`` works): being ``AgentsException`` s, the SDK neither wraps them in
``UserError`` nor turns them into a "please try again" message, so the run stops.

The tool's ``failure_error_function`` — what the model is told when the body raises:

* a body error classified FAILED (``NotExecuted``, a declared classifier: nothing happened) is
  answered by the tool's own failure function, default or custom, as it would be ungated;
* ``failure_error_function=None`` (errors raise) is honoured: a FAILED error is raised as is, an
  AMBIGUOUS one as :class:`EffectGateAgentsError` / ``EffectAmbiguous`` (stopping the run);
* **overridden**: a body error whose outcome is unknown (AMBIGUOUS) is never given to a default
  or custom failure function. Its text cannot know that the effect may have happened, and the
  default one says "Please try again" — the wrong advice: the model is told the outcome is
  unknown and not to retry.

An agent used as a tool (``agent.as_tool``) answers every error of its nested run with the
``failure_error_function`` given to ``as_tool`` (default: "Please try again"), a raised
refusal too: pass ``failure_error_function=None`` there for ``on_refusal="raise"`` to stop the
outer run.

A sync tool's reservation, body and outcome run on one worker thread (the SDK would run the body
on a thread anyway), so gating adds no thread hop.

The agent's name becomes the effect's ``agent_id``; ``RunConfig.trace_id`` (or the current
trace's id, or ``RunConfig.group_id``) its ``run_id``.

**Approvals pause the run** through the SDK's own ``needs_approval``: a gated tool's
``needs_approval`` asks the policy (``gate.preview``, a dry run that reserves nothing; for an
effect type whose policy has no approval rule the tool's own setting is kept and nothing is
read) and, when the call needs a human, records the approval request in the store and answers
True, so ``Runner.run`` returns with ``result.interruptions``. Decide each with
:func:`approve` / :func:`reject` (not bare ``state.approve``): they record the decision in
the store (``gate.approve`` for the payload hash of the call's arguments, checked;
``gate.deny``) and then tell the ``RunState``. They decide only the request the pause
recorded, while it waits: once it expired (or an attempt failed since) :func:`approve` raises
:class:`RequestGone` and records nothing (:func:`ask_again` then lets the model call again,
which records a new request for a human), and :func:`reject` tells the state only; a request
the store approved (the CLI, the console) is not rejected: :func:`reject` raises
``InvalidTransition`` and records nothing, as that approval stands. The state survives
``to_json`` / ``RunState.from_json`` in another process; ``Runner.run(agent, state)`` executes
the approved call once. A human who decided in the CLI or the console instead:
:func:`apply_store_decisions` moves those decisions into the state (an interruption the store
has no decision for — pending, or raised by the tool's own ``needs_approval`` — stays waiting:
only a human's approval in the store approves it there). A ``RunState``
approved without the store (bare ``state.approve``) does not execute: the gate still answers
"waiting for approval"; a replayed approved state (the SDK's snapshots are not single-use)
gets the stored result, not a second refund. The SDK offers no edit: to change the arguments,
reject and let the model call again. ``pause=False`` keeps the old answer (text with the
approval id). A ``needs_approval`` of the tool's own (True or a function) still applies, and
pauses alongside the policy: the policy's request is recorded whichever asked first.

This is **prevention**: the SDK binds the approval to the call id and an arguments
fingerprint, and the gate binds it to the payload hash it checks when the call begins.

Not offered, and why: tool input guardrails run only before the call, so they can refuse a
repeat of a settled effect but cannot reserve it nor record the outcome.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from effectgate import (
    ApprovalState,
    ConfigError,
    Decision,
    EffectGateError,
    EffectSpec,
    Gate,
    InvalidTransition,
    Outcome,
)
from effectgate.gatelike import GateLike

from ._kernel import (
    Framework,
    GatedCall,
    OnRefusal,
    Refused,
    UngatedToolWarning,
    framework_context,
    recorded_failed,
    report_ungated,
    requires_extra,
    resolve_gate,
)
from ._kernel import gate_tools as _gate_tools
from ._kernel.review import store_decision

with requires_extra("openai_agents", "openai-agents"):
    from agents import (
        AgentsException,
        ApplyPatchTool,
        ComputerTool,
        CustomTool,
        FunctionTool,
        LocalShellTool,
        RunHooks,
        ShellTool,
    )
    from agents import tool as agents_tool
    from agents.function_schema import FuncSchema, function_schema
    from agents.tool import (
        maybe_invoke_function_tool_failure_error_function,
        resolve_function_tool_failure_error_function,
    )
    from agents.tool_context import ToolContext
    from pydantic import ValidationError

__all__ = [
    "ASK_AGAIN",
    "DEFAULT_APPROVER",
    "EffectGateAgentsError",
    "EffectGateRunHooks",
    "GatedFunctionTool",
    "RequestGone",
    "UngatedToolWarning",
    "apply_store_decisions",
    "approve",
    "ask_again",
    "gate_tool",
    "gate_tools",
    "is_gated",
    "reject",
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


@dataclass
class GatedFunctionTool(FunctionTool):
    """A ``FunctionTool`` whose invocation passes through an effect gate (see :func:`gate_tool`).

    ``__wrapped__`` is the wrapped tool's Python function (as ``@function_tool`` gives it);
    ``gated_call.spec`` the :class:`effectgate.EffectSpec`.
    """

    _effectgate_inner: FunctionTool | None = field(default=None, kw_only=True, repr=False)

    @property
    def __wrapped__(self) -> Any:  # type: ignore[override]
        """The Python function behind the wrapped tool (AttributeError if there is none)."""
        inner = self._effectgate_inner
        if inner is None:
            raise AttributeError("FunctionTool has no wrapped Python callable")
        return inner.__wrapped__

    @property
    def gated_call(self) -> GatedCall:
        """The gated call: its ``spec`` and ``on_refusal``."""
        call: GatedCall = getattr(self.on_invoke_tool, _MARK)
        return call


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


def _sdk_callable(func: Any) -> Any:
    """What the SDK calls for ``func``: a callable instance's bound ``__call__`` (as
    ``@function_tool`` adapts an instance with a plain ``__call__``: through the SDK's own
    adapter where it has one, whose annotations are resolved in the class too, as the SDK
    validates with them), else ``func`` itself."""
    if inspect.isroutine(func) or inspect.isclass(func):
        return func
    adapt = getattr(agents_tool, "_normalize_function_tool_callable", None)
    if adapt is not None:
        with contextlib.suppress(Exception):  # refused by the SDK: read as below
            return adapt(func, None, "tool", False)[0]
    call = next((owner.__dict__["__call__"] for owner in type(func).__mro__
                 if "__call__" in owner.__dict__), None)  # found as the SDK finds it
    return call.__get__(func, type(func)) if inspect.isfunction(call) else func


def _function_schema(tool: FunctionTool) -> tuple[Any, FuncSchema | None]:
    """(the Python function, the schema ``@function_tool`` validates with), rebuilt from it;
    (None, None) for a hand-built tool or an unusual callable (keyed on its JSON as sent).

    A callable instance is read through its ``__call__``, as the SDK reads it: keyed on its
    JSON as sent, ``" T1"`` and ``"T1"`` (or ``"500"`` and ``500``) were two effects while
    the body got one validated refund for both."""
    try:
        func = _sdk_callable(tool.__wrapped__)
    except AttributeError:
        return None, None
    try:
        return func, function_schema(func, use_docstring_info=False)
    except Exception:
        return None, None


class _Invocation:
    """One gated tool's ``on_invoke_tool``: validate, gate, answer."""

    def __init__(self, tool: FunctionTool, gated: GatedCall) -> None:
        self.tool = tool
        self.gated = gated
        self.original = tool.on_invoke_tool
        func, schema = _function_schema(tool)
        self.schema = schema
        self.model = schema.params_pydantic_model if schema is not None else None
        # A sync function the SDK would run on a thread: begin, body and report in one hop.
        self.direct: Callable[..., Any] | None = func if (
            schema is not None and not inspect.iscoroutinefunction(func)
            and tool._output_type_adapter is None and not tool.needs_approval
        ) else None
        # The same tool without the SDK's failure handler, so the gate sees the body's error.
        self.raw = dataclasses.replace(tool, _failure_error_function=None,
                                       _use_default_failure_error_function=False).on_invoke_tool

    def validate(self, input_json: str | None) -> tuple[dict[str, Any], Any] | None:
        """(arguments by name, the validated model or None); None when invalid."""
        try:
            data = json.loads(input_json) if input_json else {}
        except ValueError:
            return None
        return self.validate_data(data)

    def validate_data(self, data: Any) -> tuple[dict[str, Any], Any] | None:
        """:meth:`validate` for arguments already parsed."""
        if not isinstance(data, dict):
            return None
        if self.model is None:
            return data, None
        try:
            validated = self.model.model_validate(data)
        except ValidationError:
            return None
        return {name: getattr(validated, name) for name in type(validated).model_fields}, \
            validated

    async def __call__(self, ctx: ToolContext[Any], input_json: str) -> Any:
        checked = self.validate(input_json)
        if checked is None:  # outside any except block: nothing chains the validation error
            return await self.original(ctx, input_json)
        arguments, validated = checked
        direct, schema = self.direct, self.schema
        try:
            with framework_context(*_context(ctx)):
                if direct is not None and schema is not None:
                    args, kwargs = schema.to_call_args(validated)
                    if schema.takes_context:
                        args = [ctx, *args]

                    out = await self.gated.arun_sync(arguments,
                                                     lambda: direct(*args, **kwargs))
                else:
                    out = await self.gated.arun(arguments, lambda: self.raw(ctx, input_json))
        except Exception as exc:
            if not recorded_failed(exc) or self.gated.raise_body_errors:
                raise
            return await self._failed(ctx, exc)
        return out.message if isinstance(out, Refused) else out

    async def _failed(self, ctx: ToolContext[Any], exc: Exception) -> Any:
        """A body error recorded FAILED: the tool's own failure function answers (or, with
        ``failure_error_function=None``, it is raised)."""
        answer = await maybe_invoke_function_tool_failure_error_function(
            function_tool=self.tool, context=ctx, error=exc)  # as ungated: with the run's
        if answer is None:  # tool_error_formatter, and marked as the SDK's own error output
            raise exc
        return answer


NeedsApproval = Callable[[Any, dict[str, Any], str], Awaitable[bool]]


def _may_need_approval(spec: EffectSpec) -> bool:
    """Does the gate's policy have an approval rule for this effect type? Only then is the
    tool's ``needs_approval`` replaced (the SDK pauses on arguments it cannot parse whenever a
    ``needs_approval`` function is set, so a tool that can never need approval keeps its own
    setting)."""
    policy = spec.gate.policy
    rule = policy.rule_for(spec.effect_type) if policy is not None else None
    return rule is not None and rule.approval is not None


def _approval_bridge(invocation: _Invocation, own: Any) -> NeedsApproval:
    """The gated tool's ``needs_approval``: the tool's own setting, or the policy's answer."""
    spec = invocation.gated.spec
    gate = spec.gate

    async def needs_approval(ctx: Any, params: dict[str, Any], call_id: str) -> bool:
        # The tool's own setting pauses too; the policy's request is recorded either way, so
        # a human sees it in the CLI or the console and the store can wake the run.
        own_says = own is True or (callable(own) and bool(await own(ctx, params, call_id)))
        policy = gate.policy
        rule = policy.rule_for(spec.effect_type) if policy is not None else None
        if rule is None or rule.approval is None:
            return own_says  # no approval rule: no store read
        checked = invocation.validate_data(params)
        if checked is None:
            return own_says  # the tool's own invocation answers invalid arguments
        with framework_context(*_context(ctx)):
            try:
                request = spec.request(checked[0])
            except EffectGateError:
                return own_says  # the gated call reports it
        recorded = await gate.store.on_worker(_record_request, gate, request)
        return own_says or recorded is not None

    return needs_approval


def gate_tool(tool: FunctionTool, key: str, *, gate: Gate | None = None,
              effect_type: str | None = None, on_refusal: OnRefusal = "message",
              pause: bool = True, **effect_options: Any) -> FunctionTool:
    """Gate an Agents SDK ``FunctionTool`` under the key template ``key``.

    Returns a ``FunctionTool`` with the same definition; ``await tool.on_invoke_tool(ctx,
    json_args)`` works outside a run too. ``effect_type`` defaults to the tool's name (without
    its ``tool_namespace``: two tools of one name in two namespaces need an ``effect_type``
    each, or one answers for the other); ``effect_options`` are
    :class:`effectgate.EffectSpec` options. ``gate=None`` uses the
    process-wide default gate. ``pause``: a call the policy sends for approval pauses the run
    (``needs_approval``; see the module docstring); False: the model is told in text.
    """
    if not isinstance(tool, FunctionTool):
        raise ConfigError(f"gate_tool takes an agents FunctionTool, not {type(tool).__name__}")
    if is_gated(tool):
        raise ConfigError(f"tool {tool.name!r} is already gated")
    spec = EffectSpec(resolve_gate(gate), key, effect_type=effect_type or tool.name,
                      **effect_options)
    loud = resolve_function_tool_failure_error_function(tool) is None
    gated = GatedCall(spec, tool.name, on_refusal=on_refusal, raise_as=_as_agents_error,
                      reraise_failed=(Exception,), raise_body_errors=loud)
    invocation = _Invocation(tool, gated)
    # The names a call's arguments are keyed by: the model's fields (a parameter's alias is
    # only how the JSON names it), else the JSON schema's.
    names = invocation.model.model_fields if invocation.model is not None else \
        tool.params_json_schema.get("properties")
    if isinstance(names, dict):
        spec.check_names(names, f"tool {tool.name!r}")
    setattr(invocation, _MARK, gated)
    fields = {f.name: getattr(tool, f.name) for f in dataclasses.fields(FunctionTool)}
    fields.update(on_invoke_tool=invocation, _effectgate_inner=tool)
    if pause not in (True, False):
        raise ConfigError(f"pause must be True or False, not {pause!r}")
    if pause and _may_need_approval(spec):
        fields["needs_approval"] = _approval_bridge(invocation, tool.needs_approval)
    return GatedFunctionTool(**fields)


def _tool_name(tool: Any) -> str | None:
    """A tool's name for :func:`gate_tools`: a function tool's, or that of one that runs here
    though no function tool can stand for it (reported ungated unless read-only); None for
    a hosted tool or a handoff, which do not run here."""
    if isinstance(tool, FunctionTool) or _ungated_here(tool):
        return str(tool.name)
    return None


_FRAMEWORK = Framework("openai_agents", tool_name=_tool_name, is_gated=is_gated, wrap=gate_tool)


def gate_tools(tools: Iterable[Any], effects: Any, *, gate: Gate | None = None,
               strict: bool = False, read_only: Iterable[str] = (),
               on_refusal: OnRefusal = "message", pause: bool = True) -> list[Any]:
    """Gate the declared function tools of a list and pass the rest through, in order.

    ``effects``: tool name → key template, → ``{"key": ..., **options}``, or → None (read-only);
    or an :class:`effectgate.Policy` whose rules name their ``tools`` (the gate must carry that
    policy). Every function tool left ungated is reported once by name; ``strict=True`` (or
    ``policy.strict``) refuses them with ``ConfigError``. So is every tool that runs here but
    is no function tool (a ``CustomTool``, a local shell, ``ApplyPatchTool``,
    ``ComputerTool``): it cannot be gated, so list it in ``read_only`` to accept it. Hosted
    tools (web search...) and handoffs pass through unreported: they do not run here.
    ``pause``: as for :func:`gate_tool`.
    """
    return _gate_tools(_FRAMEWORK, tools, effects, gate=gate, strict=strict,
                       read_only=read_only, on_refusal=on_refusal,
                       wrap_options={"pause": pause})


class EffectGateRunHooks(RunHooks[Any]):
    """Run hooks that check, as each agent starts, that its tools are gated.

    Ungated function tools (not from :func:`gate_tool`, not in ``read_only``) are reported once
    by name, and so are tools that run here but are no function tools, which :func:`gate_tool`
    cannot wrap (a ``CustomTool``, a local ``ShellTool`` / ``LocalShellTool``, an
    ``ApplyPatchTool``, a ``ComputerTool``: list them in ``read_only`` to accept them); with
    ``strict=True`` the run stops with :class:`EffectGateAgentsError` before any tool runs.
    An agent used as a tool (``agent.as_tool``) runs in a nested run that these hooks never
    see: its agent's tools (its MCP servers' too, and those of the agents it hands off to)
    are checked here instead, whatever ``read_only`` says of the agent tool itself.
    """

    def __init__(self, *, strict: bool = False, read_only: Iterable[str] = ()) -> None:
        self.strict = strict
        self.read_only = frozenset(read_only)

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        names = await self._ungated(context, agent, nested=False, seen=set())
        try:
            report_ungated("openai_agents", list(dict.fromkeys(names)), strict=self.strict)
        except ConfigError as err:
            raise _as_agents_error(err) from None

    async def _ungated(self, context: Any, agent: Any, *, nested: bool,
                       seen: set[int]) -> list[str]:
        """The names of ``agent``'s ungated tools (every one, enabled now or not, and its MCP
        servers' as the SDK lists them); ``nested``: an agent run as a tool, whose handoffs
        start in its own run, out of these hooks' sight, so they are read here too."""
        if id(agent) in seen:
            return []
        seen.add(id(agent))
        tools = list(getattr(agent, "tools", ()))
        mcp = getattr(agent, "get_mcp_tools", None)
        if mcp is not None:
            tools += await mcp(context)
        names: list[str] = []
        for tool in tools:
            inner = _agent_of_tool(tool)
            if inner is not None:
                names += await self._ungated(context, inner, nested=True, seen=seen)
            elif _ungated_here(tool) and tool.name not in self.read_only:
                names.append(tool.name)
        if nested:
            for target in _handoff_agents(agent):
                names += await self._ungated(context, target, nested=True, seen=seen)
        return names


def _ungated_here(tool: Any) -> bool:
    """A tool that runs in this process without a gate: an ungated function tool, or one
    that is no function tool but runs here (a hosted tool runs elsewhere)."""
    if isinstance(tool, FunctionTool):
        return not is_gated(tool)
    if isinstance(tool, ShellTool):
        environment: Any = tool.environment or {}  # normalised: a dict with its "type"
        return bool(environment.get("type") == "local")
    return isinstance(tool, (CustomTool, LocalShellTool, ApplyPatchTool, ComputerTool))


def _agent_of_tool(tool: Any) -> Any:
    """The agent behind an ``agent.as_tool`` tool, else None."""
    if isinstance(tool, FunctionTool) and getattr(tool, "_is_agent_tool", False):
        return getattr(tool, "_agent_instance", None)
    return None


def _handoff_agents(agent: Any) -> list[Any]:
    """The agents ``agent`` can hand off to (a ``Handoff``'s target while it is alive)."""
    out = []
    for handoff in getattr(agent, "handoffs", None) or ():
        ref = getattr(handoff, "_agent_ref", None)
        target = ref() if callable(ref) else handoff
        if hasattr(target, "tools"):
            out.append(target)
    return out


# -- deciding a paused run's approvals --------------------------------------------------------

DEFAULT_APPROVER = "openai-agents-resume"
"""Who :func:`approve` / :func:`reject` record as the decider when ``by`` is not given."""


def _gated_tool_of(item: Any) -> GatedFunctionTool:
    """The gated tool an interruption is about (on the item's agent): the one of its name in
    its namespace (``tool_namespace``: two tools may share a name), else, for an item that
    names no namespace of its own (none, or the SDK's synthetic one, the tool's name), the
    only one of its name. An item of another namespace is never decided for a gated tool of
    the same name: it is another tool's (an ungated one the SDK asks approval for)."""
    agent = getattr(item, "agent", None)
    name = getattr(item, "tool_name", None)
    namespace = getattr(item, "tool_namespace", None)
    named = [t for t in getattr(agent, "tools", None) or ()
             if isinstance(t, GatedFunctionTool) and t.name == name]
    qualified = f"{namespace}.{name}" if namespace else name
    exact = [t for t in named if t.qualified_name == qualified]
    own = not namespace or namespace == name  # no namespace of its own
    chosen = exact or (named if own and len(named) == 1 else [])
    if chosen:
        return chosen[0]
    raise ConfigError(f"interruption for {qualified!r} is not a call of a gated tool of its "
                      "agent")


def _pending(item: Any) -> tuple[GatedFunctionTool, EffectSpec, Any] | None:
    """(tool, spec, request) of an interruption; None when its arguments name no effect (the
    tool's own invocation answers them)."""
    tool = _gated_tool_of(item)
    invocation = tool.on_invoke_tool
    assert isinstance(invocation, _Invocation)
    checked = invocation.validate(getattr(item, "arguments", None))
    if checked is None:
        return None
    spec = invocation.gated.spec
    with framework_context(None, getattr(getattr(item, "agent", None), "name", None)):
        try:
            return tool, spec, spec.request(checked[0])
        except EffectGateError:
            return None


def _record_request(gate: GateLike, request: Any) -> str | None:
    """The id of the approval request ``request`` waits for, recorded now (so a human sees it
    in the CLI or the console) if the policy asks for one; None when it needs no approval."""
    preview = gate.preview(request)
    if preview.decision is not Decision.APPROVAL_REQUIRED:
        return None
    if preview.approval_id is not None:
        return preview.approval_id  # already recorded, still pending
    begun = gate.begin(request)  # a new request: the move is to PENDING_APPROVAL
    if begun.decision is Decision.EXECUTE:
        # Approved in the instant between the two reads, and now held: give it back unrun
        # (FAILED: it provably did not happen); the next call asks again.
        gate.report(begun, Outcome.FAILED, error="released: the run was pausing for approval")
        return None
    return begun.approval_id if begun.decision is Decision.APPROVAL_REQUIRED else None


class RequestGone(InvalidTransition):
    """The approval request an interruption stood for is no longer waiting (it expired, or an
    attempt failed since and the next needs its own): a decision now would be about a request
    nobody was shown. Nothing was recorded and the state was not told: :func:`ask_again`
    answers the interruption so that the model calls again, which records a new request for a
    human to see and decide."""


def _approval_of(spec: EffectSpec, request: Any) -> Any:
    """The pending approval request for these arguments (None when the policy needs none, or
    the effect is already decided or settled). Never opens one: :class:`RequestGone` when the
    policy asks for approval but no request waits."""
    gate = spec.gate
    preview = gate.preview(request)
    if preview.decision is not Decision.APPROVAL_REQUIRED:
        return None
    if preview.approval_id is None:
        raise RequestGone(
            f"no approval request waits for {request.key!r}: the one this interruption stood "
            "for expired, or an attempt failed since; nothing was approved. ask_again(state, "
            "item) lets the model ask again", key=request.key,
            reason="the request shown is no longer waiting")
    approval_id = preview.approval_id
    record = gate.approval(approval_id)
    if record.payload_hash != request.payload_hash:  # bound to other arguments: never approve
        raise ConfigError(f"approval {record.approval_id} is for other arguments")
    return record


def _refuse_self_approval(spec: EffectSpec, item: Any, by: str) -> None:
    """``needs_approval`` is not told which agent asks, so the store cannot compare: the
    interruption's agent is compared here, under the same rule (``allow_self_approval``)."""
    from effectgate.decide import same_principal

    policy = spec.gate.policy
    rule = policy.rule_for(spec.effect_type) if policy is not None else None
    if rule is None or rule.approval is None or rule.approval.allow_self_approval:
        return
    agent = getattr(getattr(item, "agent", None), "name", None)
    if same_principal(by, agent):
        raise InvalidTransition(f"{by} requested {spec.effect_type!r} and cannot approve its "
                                "own request", reason="self-approval is not allowed")


def approve(state: Any, item: Any, *, by: str = DEFAULT_APPROVER,
            note: str | None = None) -> None:
    """Approve an interruption of a paused run: recorded in the store (``gate.approve``, for
    the payload hash of the call's arguments), then ``state.approve(item)``.

    A request already decided in the store stays as decided (an approval there executes, a
    denial is what the model hears when the run resumes). ``ConfigError`` when ``item`` is not
    a call of a gated tool; ``InvalidTransition`` when ``by`` may not approve (self-approval);
    :class:`RequestGone` when no request waits any more (expired, or a failed attempt since):
    nothing is approved, the state is not told.
    """
    pending = _pending(item)
    if pending is not None:
        _, spec, request = pending
        record = _approval_of(spec, request)
        if record is not None:
            _refuse_self_approval(spec, item, by)
            try:
                spec.gate.approve(record.approval_id, by=by, note=note)
            except InvalidTransition:
                if spec.gate.approval(record.approval_id).state is ApprovalState.PENDING:
                    raise  # a self-approval the policy forbids: the SDK is not told
    state.approve(item)


def reject(state: Any, item: Any, *, by: str = DEFAULT_APPROVER,
           reason: str | None = None) -> None:
    """Reject an interruption: denied in the store (``gate.deny``; it stays denied), then
    ``state.reject(item, rejection_message=...)``: the tool never runs. A request no longer
    waiting is left alone in the store (denying a new one would deny the effect for good);
    one the store denied is rejected with that denial. :class:`effectgate.InvalidTransition`
    when the store approved it (the CLI, the console, :func:`approve`): that approval stands
    — the next call with these arguments executes — so nothing is recorded and the state is
    not told."""
    why = f"DENIED: rejected by {by}" + (f": {reason}" if reason else "")
    pending = _pending(item)
    if pending is not None:
        _, spec, request = pending
        try:
            record = _approval_of(spec, request)
        except RequestGone:
            record = None
        denied = False
        if record is not None:
            with contextlib.suppress(InvalidTransition):  # decided meanwhile: read below
                spec.gate.deny(record.approval_id, by=by, reason=reason)
                denied = True
        decided = None if denied else store_decision(spec.gate, request)
        if decided is not None and decided.kind == "approved":
            raise InvalidTransition(
                f"{request.key!r} was approved in the store; it cannot be rejected now "
                "(apply_store_decisions(state) carries that approval)", key=request.key,
                reason="approved in the store")
        if decided is not None:
            why = f"DENIED: {decided.reason or 'denied'}"
    state.reject(item, rejection_message=why + ". It has not been carried out. Do not retry "
                 "it; tell the user why.")


ASK_AGAIN = (
    "NOT DONE: the approval request for this call expired (or an attempt failed since) before "
    "anyone decided it, so it has not been carried out. If it is still wanted, call this tool "
    "again with the same arguments: that asks a human again."
)
"""What the model is told by :func:`ask_again`."""


def ask_again(state: Any, item: Any) -> None:
    """Answer an interruption whose request no longer waits (:class:`RequestGone`): the SDK is
    told no with :data:`ASK_AGAIN`, so the model may call again — that call records a new
    request, for a human to see and decide. Nothing is written to the store.
    ``InvalidTransition`` (the state not told) while the request still waits (decide it with
    :func:`approve` / :func:`reject`) or was decided in the store (:func:`apply_store_decisions`
    carries that decision): the model must not hear "expired" then."""
    pending = _pending(item)
    if pending is not None:
        _, spec, request = pending
        if store_decision(spec.gate, request) is not None:
            raise InvalidTransition(f"{request.key!r} was decided in the store: "
                                    "apply_store_decisions(state) carries it", key=request.key)
        try:
            waiting = _approval_of(spec, request)
        except RequestGone:
            waiting = None
        if waiting is not None:
            raise InvalidTransition(f"approval {waiting.approval_id} still waits: approve() or "
                                    "reject() it", key=request.key)
    state.reject(item, rejection_message=ASK_AGAIN)


def apply_store_decisions(state: Any) -> list[Any]:
    """Move decisions made in the store (the CLI, the console) into a paused ``RunState``:
    each interruption whose request a human approved there (for exactly its arguments) is
    approved, each one the store denies is rejected. Every other interruption — pending, or
    one the store has no request for (the tool's own ``needs_approval``, a call the policy
    lets run without a human) — is left waiting for a human, never approved. Returns the
    interruptions still waiting."""
    waiting: list[Any] = []
    for item in state.get_interruptions():
        try:
            pending = _pending(item)
        except ConfigError:
            waiting.append(item)  # not ours: the caller decides it
            continue
        if pending is None:
            waiting.append(item)
            continue
        _, spec, request = pending
        decided = store_decision(spec.gate, request)
        if decided is None:
            waiting.append(item)
        elif decided.kind == "denied":
            state.reject(item, rejection_message=f"DENIED: {decided.reason or 'denied'}. It "
                         "has not been carried out. Do not retry it; tell the user why.")
        else:  # approved: executes once (or, run already, answered from the store)
            state.approve(item)
    return waiting
