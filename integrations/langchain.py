"""LangChain: gated tools, and ``EffectGateMiddleware`` for ``langchain.agents.create_agent``.

Two forms, one guarantee — the same consequence executes at most once:

* ``gate_tool(tool, "refund:{txn_id}", gate=gate)`` returns a ``BaseTool`` with the tool's own
  name, description and argument schema (``convert_to_openai_tool`` gives the same JSON), so the
  model sees nothing new. It works wherever a tool runs: ``tool.invoke``/``ainvoke``, a LangGraph
  ``ToolNode``, ``create_agent``, a hand-written loop. ``gate_tools(tools, effects)`` wraps a
  list and reports every tool left ungated.
* ``EffectGateMiddleware(effects, gate=gate)`` (LangChain v1 agents) sees every tool call of
  ``create_agent``: it answers a repeat without running the tool and records the outcome of a
  call it let through. It reports ungated tools at the first model call, when it first sees
  them. It covers only tools called through that agent.

Either way: arguments are validated through the tool's schema before the key and payload hash
are computed (``"500"`` and ``500`` are one refund); injected arguments (``ToolRuntime``,
``InjectedToolCallId``, state) are not part of the payload. A duplicate gets the stored result,
as though the tool had just run; every other answer reaches the model as a
``ToolMessage(status="error")`` saying what to do (wait, do not retry, ask a human). With
``on_refusal="raise"`` they are raised instead — they are not ``ToolException`` s, so they stop
the run. The LangGraph ``thread_id`` becomes the effect's ``run_id`` and the agent's name its
``agent_id``.

Callbacks (``on_tool_start``) are not offered as a form: they can abort a call but never answer
it with the stored result, nor record its outcome.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from effectgate import ConfigError, EffectSpec, Gate

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
    from langchain_core.messages import ToolMessage
    from langchain_core.messages.tool import ToolOutputMixin
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, ToolException
    from pydantic import PrivateAttr, ValidationError
except ImportError as _err:  # pragma: no cover - depends on the environment
    from ._common import missing_extra

    raise missing_extra("langchain", "langchain", _err) from _err

__all__ = [
    "EffectGateMiddleware",
    "EffectRefusedToolError",
    "GatedTool",
    "ToolReportedError",
    "UngatedToolWarning",
    "gate_tool",
    "gate_tools",
]

if TYPE_CHECKING:
    EffectGateMiddleware: Any  # built on first use by __getattr__ below


class EffectRefusedToolError(ToolException):
    """A gated call that produced no result; the tool turns it into a ``ToolMessage`` with
    ``status="error"`` and the text in ``refused.message``."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.message)
        self.refused = refused


class ToolReportedError(Exception):
    """The tool answered with an error message (``status="error"``) instead of raising: its
    outcome is unknown to the gate, so it is recorded AMBIGUOUS unless a classifier knows."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(str(message.content))
        self.tool_message = message


def _visible_fields(tool: BaseTool) -> frozenset[str] | None:
    """The argument names the model sends (injected ones left out); None when unknown."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        props = schema.get("properties")
        return frozenset(props) if isinstance(props, dict) else None
    fields = getattr(schema, "model_fields", None)
    return frozenset(fields) if fields is not None else None


def _context(config: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """(run_id, agent_id) from a runnable config: LangGraph's thread id, the agent's name."""
    if not config:
        return None, None
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    run_id = configurable.get("thread_id") or metadata.get("thread_id")
    return run_id, metadata.get("lc_agent_name")


class GatedTool(BaseTool):
    """A LangChain tool whose every call passes through an effect gate.

    Same name, description, argument schema and response format as ``inner``; built by
    :func:`gate_tool`. It parses and validates the call itself, then runs the inner tool's
    ``_run`` / ``_arun`` under the gate, so callbacks and tracing see one tool run, not two.
    ``gated_call.spec`` is the :class:`effectgate.EffectSpec`.
    """

    inner: BaseTool
    _gated: GatedCall = PrivateAttr()
    _visible: frozenset[str] | None = PrivateAttr(default=None)
    _sync_extra: tuple[bool, str | None] = PrivateAttr(default=(False, None))
    _async_extra: tuple[bool, str | None] = PrivateAttr(default=(False, None))

    @property
    def gated_call(self) -> GatedCall:
        """The gated call: its ``spec`` and ``on_refusal``."""
        return self._gated

    @property
    def func(self) -> Any:
        """The inner tool's function (LangGraph reads injected arguments from it)."""
        return getattr(self.inner, "func", None)

    @property
    def coroutine(self) -> Any:
        """The inner tool's coroutine function, if any."""
        return getattr(self.inner, "coroutine", None)

    @property
    def _injected_args_keys(self) -> frozenset[str]:
        return self.inner._injected_args_keys

    def _to_args_and_kwargs(self, tool_input: str | dict[str, Any],
                            tool_call_id: str | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = super()._to_args_and_kwargs(tool_input, tool_call_id)
        if args:
            raise ConfigError(
                f"tool {self.name!r} takes a single string; gate a tool with named arguments "
                "(a StructuredTool or @tool function) so the key can name them"
            )
        return args, kwargs

    def _arguments(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        visible = self._visible
        if visible is None:
            return dict(kwargs)
        return {k: v for k, v in kwargs.items() if k in visible}

    @staticmethod
    def _with(kwargs: dict[str, Any], extra: tuple[bool, str | None], config: Any,
              run_manager: Any) -> dict[str, Any]:
        wants_manager, config_param = extra
        call = dict(kwargs)
        if wants_manager:
            call["run_manager"] = run_manager
        if config_param is not None:
            call[config_param] = config
        return call

    def _output(self, out: Any) -> Any:
        if isinstance(out, Refused):
            raise EffectRefusedToolError(out)
        if self.response_format == "content_and_artifact" and isinstance(out, list):
            return tuple(out) if len(out) == 2 else (out, None)
        return out

    def _run(self, *args: Any, config: RunnableConfig, run_manager: Any = None,
             **kwargs: Any) -> Any:
        inner = self.inner
        if getattr(inner, "func", True) is None:  # a coroutine-only StructuredTool
            raise NotImplementedError(f"tool {self.name!r} is async only: use ainvoke")
        call = self._with(kwargs, self._sync_extra, config, run_manager)
        with framework_context(*_context(config)):
            out = self._gated.run(self._arguments(kwargs), lambda: inner._run(**call))
        return self._output(out)

    async def _arun(self, *args: Any, config: RunnableConfig, run_manager: Any = None,
                    **kwargs: Any) -> Any:
        inner = self.inner
        call = self._with(kwargs, self._async_extra, config, run_manager)
        with framework_context(*_context(config)):
            out = await self._gated.arun(self._arguments(kwargs), lambda: inner._arun(**call))
        return self._output(out)


def _extra_parameters(method: Any) -> tuple[bool, str | None]:
    """What ``BaseTool.run`` would pass ``method`` besides the arguments: does it take a
    ``run_manager``, and under which name does it take the ``RunnableConfig``?"""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False, None
    try:
        hints = typing.get_type_hints(method)
    except Exception:
        hints = {}
    config = next((name for name, hint in hints.items() if hint is RunnableConfig), None)
    return "run_manager" in params, config


def _handler(inner: BaseTool) -> Any:
    """The gated tool's ``handle_tool_error``: a refusal becomes its message; any other
    ``ToolException`` is handled as the inner tool would have handled it."""
    flag = inner.handle_tool_error

    def handle(error: ToolException) -> Any:
        if isinstance(error, EffectRefusedToolError):
            return error.refused.message
        if not flag:
            raise error
        if callable(flag):
            return flag(error)
        if isinstance(flag, str):
            return flag
        return error.args[0] if error.args else "Tool execution error"

    return handle


def _store_form(user_redact: Any) -> Any:
    """What the gate stores: a ToolMessage's content rather than the message, nothing for a
    ``Command`` (then the user's ``redact``)."""

    def redact(out: Any) -> Any:
        if isinstance(out, ToolOutputMixin):
            value = out.content if isinstance(out, ToolMessage) else None
        else:
            value = out
        return user_redact(value) if user_redact is not None else value

    return redact


def gate_tool(tool: BaseTool, key: str, *, gate: Gate | None = None,
              effect_type: str | None = None, on_refusal: OnRefusal = "message",
              **effect_options: Any) -> GatedTool:
    """Gate a LangChain tool under the key template ``key`` (``"refund:{txn_id}"``).

    Returns a ``BaseTool`` the model cannot tell apart from ``tool``. ``effect_type`` defaults
    to the tool's name; ``effect_options`` are :class:`effectgate.EffectSpec` options
    (``vendor``, ``lease_seconds``, ``max_attempts``, ``cost_micros``, ``redact``...).
    ``gate=None`` uses the process-wide default gate (``$EFFECTGATE_URL``).
    """
    if isinstance(tool, GatedTool):
        raise ConfigError(f"tool {tool.name!r} is already gated")
    if not isinstance(tool, BaseTool):
        raise ConfigError(f"gate_tool takes a LangChain BaseTool, not {type(tool).__name__}")
    redact = _store_form(effect_options.pop("redact", None))
    spec = EffectSpec(resolve_gate(gate), key, effect_type=effect_type or tool.name,
                      redact=redact, **effect_options)
    visible = _visible_fields(tool)
    if visible is not None:
        spec.check_names(visible, f"tool {tool.name!r}")
    wrapped = GatedTool(
        name=tool.name, description=tool.description, args_schema=tool.args_schema,
        return_direct=tool.return_direct, response_format=tool.response_format,
        extras=tool.extras, tags=tool.tags, metadata=tool.metadata, callbacks=tool.callbacks,
        verbose=tool.verbose, inner=tool, handle_tool_error=_handler(tool),
        handle_validation_error=tool.handle_validation_error,
    )
    wrapped._gated = GatedCall(spec, tool.name, on_refusal=on_refusal)
    wrapped._visible = visible
    wrapped._sync_extra = _extra_parameters(tool._run)
    wrapped._async_extra = _extra_parameters(tool._arun)
    return wrapped


def gate_tools(tools: Iterable[BaseTool], effects: Any, *, gate: Gate | None = None,
               strict: bool = False, read_only: Iterable[str] = (),
               on_refusal: OnRefusal = "message") -> list[BaseTool]:
    """Gate the declared tools of a list and pass the rest through, in order.

    ``effects``: tool name → key template, → ``{"key": ..., **options}``, or → None (read-only);
    or an :class:`effectgate.Policy` whose rules name their ``tools`` (the gate must carry that
    policy). Every tool left ungated is reported once by name (an :class:`UngatedToolWarning`
    and a log line); ``strict=True`` (or ``policy.strict``) refuses them with ``ConfigError``.
    """
    tools = list(tools)
    names = [t.name for t in tools]
    resolved = resolve_gate(gate)
    declared, reads, policy_strict = effect_specs(effects, names, gate=resolved,
                                                  read_only=read_only)
    out: list[BaseTool] = []
    ungated: list[str] = []
    for tool in tools:
        if isinstance(tool, GatedTool) or tool.name in reads:
            out.append(tool)
        elif tool.name in declared:
            key, options = declared[tool.name]
            options = {"on_refusal": on_refusal, **options}
            out.append(gate_tool(tool, key, gate=resolved, **options))
        else:
            ungated.append(tool.name)
            out.append(tool)
    report_ungated("langchain", ungated, strict=strict or policy_strict)
    return out


def _middleware_class() -> type:
    try:
        from langchain.agents.middleware import AgentMiddleware
    except ImportError as err:  # pragma: no cover - depends on the environment
        from ._common import missing_extra

        raise missing_extra("langchain", "langchain", err) from err

    class EffectGateMiddleware(AgentMiddleware):
        """Gate the tool calls of a ``create_agent`` agent by tool name.

        ``effects`` as for :func:`gate_tools` (mapping or Policy). Tools it does not name run
        ungated and are reported once at the first model call; ``strict=True`` refuses to
        start the agent instead. Tools already wrapped by :func:`gate_tool` pass through.
        """

        def __init__(self, effects: Any, *, gate: Gate | None = None, strict: bool = False,
                     read_only: Iterable[str] = (), on_refusal: OnRefusal = "message") -> None:
            super().__init__()
            self.effects = effects
            self.gate = resolve_gate(gate)
            self.strict = strict
            self.read_only = tuple(read_only)
            self.on_refusal = on_refusal
            self._calls: dict[str, GatedCall] | None = None
            self._declared: dict[str, tuple[str, dict[str, Any]]] = {}
            if isinstance(effects, Mapping):  # check the shape now, the names at first sight
                effect_specs(effects, list(effects), gate=self.gate, read_only=read_only)

        # -- seeing the tools --------------------------------------------------------------

        def _setup(self, tools: Sequence[Any]) -> dict[str, GatedCall]:
            if self._calls is not None:
                return self._calls
            by_name = {t.name: t for t in tools if isinstance(t, BaseTool)}
            declared, reads, policy_strict = effect_specs(
                self.effects, list(by_name), gate=self.gate, read_only=self.read_only)
            calls: dict[str, GatedCall] = {}
            ungated: list[str] = []
            for name, tool in by_name.items():
                if isinstance(tool, GatedTool) or name in reads:
                    continue
                if name not in declared:
                    ungated.append(name)
                    continue
                key, options = declared[name]
                options = dict(options)
                on_refusal = options.pop("on_refusal", self.on_refusal)
                redact = _store_form(options.pop("redact", None))
                spec = EffectSpec(self.gate, key, effect_type=options.pop("effect_type", name),
                                  redact=redact, **options)
                visible = _visible_fields(tool)
                if visible is not None:
                    spec.check_names(visible, f"tool {name!r}")
                calls[name] = GatedCall(spec, name, on_refusal=on_refusal)
            report_ungated("langchain", ungated, strict=self.strict or policy_strict)
            self._calls = calls
            return calls

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            self._setup(request.tools)
            return handler(request)

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            self._setup(request.tools)
            return await handler(request)

        # -- gating a call --------------------------------------------------------------------

        def _prepare(self, request: Any) -> tuple[GatedCall, dict[str, Any]] | None:
            tool = request.tool
            if tool is None or isinstance(tool, GatedTool):
                return None
            calls = self._setup([tool]) if self._calls is None else self._calls
            gated = calls.get(tool.name)
            if gated is None:
                return None
            raw = request.tool_call.get("args") or {}
            schema = tool.tool_call_schema
            if isinstance(schema, dict):
                return gated, dict(raw)
            try:
                return gated, model_arguments(schema, raw)
            except ValidationError:
                return None  # the tool node reports the invalid arguments; nothing runs

        def _answer(self, out: Any, request: Any) -> Any:
            call = request.tool_call
            if isinstance(out, Refused):
                return ToolMessage(content=out.message, tool_call_id=call["id"],
                                   name=call["name"], status="error")
            if not isinstance(out, (str, list)) and out is not None:
                return out  # the tool's own ToolMessage or Command, from this very call
            content = out if out is not None else "Done earlier (its result was not stored)."
            return ToolMessage(content=content, tool_call_id=call["id"], name=call["name"])

        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            prepared = self._prepare(request)
            if prepared is None:
                return handler(request)
            gated, arguments = prepared

            def body() -> Any:
                return _checked(handler(request))

            with framework_context(*_context(getattr(request.runtime, "config", None))):
                out = gated.run(arguments, body)
            return self._answer(out, request)

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            prepared = self._prepare(request)
            if prepared is None:
                return await handler(request)
            gated, arguments = prepared

            async def body() -> Any:
                return _checked(await handler(request))

            with framework_context(*_context(getattr(request.runtime, "config", None))):
                out = await gated.arun(arguments, body)
            return self._answer(out, request)

    EffectGateMiddleware.__module__ = __name__
    return EffectGateMiddleware


def _checked(out: Any) -> Any:
    if isinstance(out, ToolMessage) and out.status == "error":
        raise ToolReportedError(out)
    return out


_lazy: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    # The middleware needs `langchain` (v1 agents, ~0.8 s to import): built on first use.
    if name == "EffectGateMiddleware":
        if name not in _lazy:
            _lazy[name] = _middleware_class()
        return _lazy[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
