"""LlamaIndex: gated function tools, an agent mixin that stops a run, and an instrumentation audit.

* ``gate_tool(tool, "refund:{txn_id}", gate=gate)`` returns a ``FunctionTool`` sharing the
  tool's ``metadata`` (name, description, ``fn_schema``: the same tool definition), so an agent
  still injects ``ctx: Context`` into it. Every ``call`` / ``acall`` passes through the gate:
  this is the form that guarantees at most one execution. ``gate_tools(tools, effects)`` wraps a
  list and reports every tool left ungated.
* ``EffectGateAgentMixin`` (and the ready ``EffectGateFunctionAgent``): LlamaIndex agents catch
  every exception a tool raises and tell the model ``str(e)``, so the run goes on. With
  ``on_refusal="raise"``, put this mixin in front of the agent class to stop the run on a
  refusal or an ambiguous outcome (awaiting the handler raises it). It also makes the agent's
  name the effect's ``agent_id``.
* ``UngatedToolAudit``: an instrumentation span handler that sees every tool call LlamaIndex
  instruments (every call an agent makes; see the class for the one direct call it cannot
  see) and reports each ungated tool once by name, when it is first called. Instrumentation
  can only observe (the dispatcher swallows a handler's exceptions): it cannot stop a call,
  answer it, or record its outcome. Use it to find tools you forgot, not to gate them.

**Approvals pause the run** (``acall`` inside a workflow agent): a call the policy sends for
approval waits with ``ctx.wait_for_event(HumanResponseEvent, waiter_event=InputRequiredEvent(
...))``. The ``InputRequiredEvent`` (streamed by ``handler.stream_events()``) carries
``prefix`` (a description), ``tool``, ``arguments`` (the normalised arguments that would
execute), ``allowed_decisions`` and the approval's ``approval_id``, ``payload_hash``, ``key``.
Answer with ``handler.ctx.send_event(HumanResponseEvent(response="approve" | "edit" |
"reject", approval_id=..., by=..., arguments={...} for an edit, message=...))``. The adapter
checks ``approval_id`` itself (a Context restored by ``Context.from_dict`` forgets the waiter's
filter until its step runs again): an event naming another approval, or none, is not taken —
the call goes on waiting and its ``InputRequiredEvent`` is streamed again — so with two
pending approvals, approving one never executes the other. The decision is recorded in the
store and carried out as LangChain's is (approve → executes once; edit → its own effect and
approval, recorded as approved by the reviewer, the original denied; reject → denied). The
workflow ``Context`` can be serialised (``handler.ctx.to_dict()``) while it waits and restored
in another process (``Context.from_dict(agent, d)``, ``agent.run(ctx=restored)``; restore
FunctionAgent's memory yourself, see docs/adapters.md): the tool's code before the wait re-runs
on restore and on the answer — it only reads the store — and the refund executes once; a
HumanResponseEvent delivered twice gets the stored result the second time, and a replayed
edit gets the edit's stored result (not a denial of the original it replaced). The store comes
first: a request decided in the CLI or the console meanwhile is executed or refused at the
replay, whatever the answer says. The wait needs the workflow's ``Context``: the tool's own
``ctx`` parameter, or :class:`EffectGateAgentMixin` / :class:`EffectGateFunctionAgent`;
elsewhere (and with ``pause=False``) the model is told in text. An answer that is not a
decision is not taken: the model is told the call waits for approval, with its id.

This is **prevention**: the approval is bound to the payload hash of the arguments that
execute (the call's, or a reviewer's edit), checked by the store when the call begins.

``FunctionTool.call`` does not validate its arguments; the gated tool does (positional arguments
bound by name as the function binds them), through
``metadata.fn_schema``, before the key and payload hash are computed (``"500"`` and ``500`` are
one refund) and hands the validated values to the function. Invalid arguments are answered
with an error output; nothing runs. A duplicate gets the stored result, as though the tool had
just run; every other answer is an error output (``is_error=True``) telling the model what to
do. The workflow's run id (``agent.run(..., run_id=...)``, else the generated one) becomes the
effect's ``run_id``.
"""

from __future__ import annotations

import contextvars
import inspect
import weakref
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, NamedTuple

from effectgate import ConfigError, EffectSpec, Gate

from ._kernel import (
    Framework,
    GatedCall,
    OnRefusal,
    Refused,
    UngatedToolWarning,
    framework_context,
    is_stopping,
    model_arguments,
    report_ungated,
    requires_extra,
    resolve_gate,
)
from ._kernel import gate_tools as _gate_tools
from ._kernel.call import keep_refusal
from ._kernel.review import (
    DECISIONS,
    Review,
    Verdict,
    aapply,
    areplacement,
    replacement,
    review_of,
)
from ._kernel.vocabulary import model_message

with requires_extra("llama_index", "llama-index"):
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.base.llms.types import ContentBlock, TextBlock
    from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
    from llama_index.core.tools import BaseTool, FunctionTool, ToolOutput
    from llama_index.core.tools.types import BaseToolAsyncAdapter
    from llama_index_instrumentation import get_dispatcher
    from pydantic import PrivateAttr, TypeAdapter, ValidationError

__all__ = [
    "DEFAULT_APPROVER",
    "EffectGateAgentMixin",
    "EffectGateFunctionAgent",
    "GatedFunctionTool",
    "UngatedToolAudit",
    "UngatedToolWarning",
    "gate_tool",
    "gate_tools",
]


def _run_id() -> Any:
    try:
        from llama_index_instrumentation.dispatcher import active_instrument_tags
    except ImportError:  # pragma: no cover - older llama-index
        return None
    return active_instrument_tags.get().get("llamaindex.run_id")


_BLOCKS = "llama_index_blocks"
_blocks_adapter: TypeAdapter[list[ContentBlock]] | None = None


def _blocks() -> TypeAdapter[list[ContentBlock]]:
    global _blocks_adapter
    if _blocks_adapter is None:
        _blocks_adapter = TypeAdapter(list[ContentBlock])
    return _blocks_adapter


def _storable(out: ToolOutput) -> Any:
    """What the gate stores for a tool output: the function's return value when the model saw
    exactly its text, the text the model saw, or — for several blocks or any that is not text
    (an image, a document) — every block, so a repeat shows the model all of them."""
    blocks = out.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], TextBlock):
        return {_BLOCKS: _blocks().dump_python(list(blocks), mode="json")}
    raw = out.raw_output
    if isinstance(raw, (str, int, float, bool, dict, list)) and str(raw) == out.content:
        return raw
    return out.content


def _stored_blocks(stored: Any) -> list[ContentBlock] | None:
    """The blocks of a stored multi-block output, or None."""
    if isinstance(stored, dict) and set(stored) == {_BLOCKS}:
        try:
            return _blocks().validate_python(stored[_BLOCKS])
        except ValidationError:
            return None
    return None


DEFAULT_APPROVER = "llama-index-resume"
"""Who an answer is recorded as decided by when its ``HumanResponseEvent`` names no ``by``."""

_workflow_ctx: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "effectgate_llama_index_ctx", default=None)


def _input_required(review: Review) -> Any:
    """The ``InputRequiredEvent`` a paused call waits behind."""
    from llama_index.core.workflow import InputRequiredEvent

    fields: dict[str, Any] = {"prefix": review.description(), "tool": review.tool_name,
                              "arguments": review.arguments,
                              "allowed_decisions": list(DECISIONS), **review.as_dict()}
    return InputRequiredEvent(**fields)


def _verdict(event: Any) -> Verdict | None:
    """The decision a ``HumanResponseEvent`` carries, or None when it carries none."""
    kind: Any = getattr(event, "response", None)
    arguments = event.get("arguments") if kind == "edit" else None
    try:
        return Verdict(kind, by=event.get("by") or DEFAULT_APPROVER, arguments=arguments,
                       message=event.get("message"), payload_hash=event.get("payload_hash"),
                       approval_id=event.get("approval_id"))
    except ConfigError:
        return None


def _still_waiting(waiter_id: str, requirements: dict[str, Any], timeout: float | None,
                   waiter_event: Any) -> BaseException | None:
    """The workflow's own "this step waits" signal, to go back to waiting after an event that
    was not this call's answer; None when this llama-index-workflows has none.

    A waiter restored by ``Context.from_dict`` has lost its ``requirements`` until its step
    runs again, so any ``HumanResponseEvent`` resolves it. Raising ``WaitingForEvent`` with
    the same waiter id puts the waiter back, unresolved and with its requirements (the
    workflow publishes no second ``waiter_event`` for a waiter it already has; the caller
    streams the request again). llama-index's own agent re-raises this signal the same way
    (``_get_waiting_for_event_exception`` in ``base_agent.py``)."""
    try:
        from llama_index.core.workflow import HumanResponseEvent
        from workflows.runtime.types.results import AddWaiter, WaitingForEvent
    except ImportError:  # pragma: no cover - llama-index-workflows before 2.9
        return None
    return WaitingForEvent(AddWaiter(waiter_id=waiter_id, requirements=requirements,
                                     timeout=timeout, event_type=HumanResponseEvent,
                                     waiter_event=waiter_event))


def _not_convertible(tool: FunctionTool) -> ConfigError:
    return ConfigError(
        f"tool {tool.metadata.get_name()!r} is gated: LlamaIndex would make its LangChain tool "
        "from the bare function, which runs ungated; convert the ungated tool and gate that "
        "with effectgate.integrations.langchain.gate_tool")


_JSON = (str, int, float, bool, type(None), list, dict)
"""What a model's tool call can carry (its arguments are JSON)."""


class GatedFunctionTool(FunctionTool):
    """A ``FunctionTool`` whose every call passes through an effect gate (see :func:`gate_tool`).

    ``inner`` is the wrapped tool; ``gated_call.spec`` the :class:`effectgate.EffectSpec`.
    """

    def __init__(self, inner: FunctionTool, gated: GatedCall, *, pause: bool = True,
                 pause_timeout: float | None = None) -> None:
        super().__init__(fn=inner.fn, async_fn=inner.async_fn, metadata=inner.metadata,
                         partial_params=inner.partial_params)
        self.pause = pause
        self.pause_timeout = pause_timeout
        # Derived from fn's signature by FunctionTool; an async-only tool's sync shim hides it.
        self.requires_context = inner.requires_context
        self.ctx_param_name = inner.ctx_param_name
        self.inner = inner
        self.gated_call = gated
        self._schema = inner.metadata.fn_schema
        self._signature = _plain_signature(inner)

    def _named(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | str:
        """The call's arguments by name (positional ones bound as the function would bind
        them), or an invalid-arguments text."""
        if not args:
            return kwargs
        if self._signature is None:
            return _invalid_text(f"tool {self.metadata.get_name()!r} takes keyword arguments")
        try:
            bound = self._signature.bind_partial(*args, **{**self.partial_params, **kwargs})
        except TypeError as err:
            return _invalid_text(str(err))
        return {k: v for k, v in bound.arguments.items()
                if k not in self.partial_params or k in kwargs}

    def _prepare(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | str:
        """(arguments for the key, kwargs for the function), or an invalid-arguments text."""
        ctx_name = self.ctx_param_name
        passed = {k: v for k, v in kwargs.items() if k != ctx_name}
        visible = {k: v for k, v in passed.items() if k not in self.partial_params}
        if self._schema is None:
            values = visible
        else:
            try:
                values = model_arguments(self._schema, visible)
            except ValidationError as err:
                return _invalid_text(str(err))
            # A bound partial param the schema also declares (a given fn_schema) is the
            # partial's, never the schema's default: that default overrode the bound value,
            # and the call ran with another payload than it would ungated (USD for EUR).
            values = {k: v for k, v in values.items() if k not in self.partial_params}
        call_kwargs = {**{k: v for k, v in passed.items() if k in self.partial_params}, **values}
        if ctx_name is not None and ctx_name in kwargs:
            call_kwargs[ctx_name] = kwargs[ctx_name]
        # Bound partial params (a client, a tenant) are in the payload only when the key names
        # them, the schema declares them or the call gives them as JSON: others may not be
        # JSON, and they are the same for every call anyway. One a model can send (a schema
        # field, or any name it passes: LlamaIndex lets a call's value beat the bound one) runs
        # as sent, so the payload, and an approval bound to it, must carry it: left out, an
        # approval given for EUR ran a refund in USD.
        roots = self.gated_call.spec.template.roots
        declared = getattr(self._schema, "model_fields", None) or {}
        arguments = {**{k: passed.get(k, v) for k, v in self.partial_params.items()
                        if k in roots or k in declared
                        or (k in passed and isinstance(passed[k], _JSON))}, **values}
        return arguments, call_kwargs

    def _answer(self, out: Any, raw_input: dict[str, Any]) -> ToolOutput:
        name = self.metadata.get_name()
        if isinstance(out, ToolOutput):
            return out
        if isinstance(out, Refused):
            return ToolOutput(content=out.message, tool_name=name, raw_input=raw_input,
                              raw_output=out.as_dict(), is_error=True)
        blocks = _stored_blocks(out)
        if blocks is not None:
            return ToolOutput(blocks=blocks, tool_name=name, raw_input=raw_input,
                              raw_output=None)
        return ToolOutput(content=str(out), tool_name=name, raw_input=raw_input, raw_output=out)

    def _invalid(self, text: str, kwargs: dict[str, Any]) -> ToolOutput:
        return ToolOutput(content=text, tool_name=self.metadata.get_name(),
                          raw_input={"kwargs": kwargs}, raw_output=None, is_error=True)

    def _ready(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        named = self._named(args, kwargs)
        if isinstance(named, str):
            return self._invalid(named, kwargs)
        prepared = self._prepare(named)
        if isinstance(prepared, str):
            return self._invalid(prepared, named)
        return prepared

    def to_langchain_tool(self, **langchain_tool_kwargs: Any) -> Any:
        """Refused: LlamaIndex builds the LangChain tool from the bare function, which would
        run ungated. Gate the LangChain tool itself (:mod:`effectgate.integrations.langchain`)."""
        raise _not_convertible(self)

    def to_langchain_structured_tool(self, **langchain_tool_kwargs: Any) -> Any:
        """Refused, as :meth:`to_langchain_tool`."""
        raise _not_convertible(self)

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Gated sync call (keyword or positional arguments)."""
        prepared = self._ready(args, kwargs)
        if isinstance(prepared, ToolOutput):
            return prepared
        arguments, call_kwargs = prepared
        inner = self.inner
        gated = self.gated_call
        with framework_context(_run_id()):
            out = gated.run(arguments, lambda: _Output(inner.call(**call_kwargs)))
            if isinstance(out, Refused):  # the pause hook hands refusals back: no wait here
                edit = replacement(gated, out, arguments)
                if edit is not None:
                    out = edit.answer
                if isinstance(out, Refused):
                    out = gated.refuse(out)
        return self._answer(_unwrap(out), {"args": (), "kwargs": arguments})

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Gated async call (keyword or positional arguments)."""
        prepared = self._ready(args, kwargs)
        if isinstance(prepared, ToolOutput):
            return prepared
        arguments, call_kwargs = prepared
        inner = self.inner
        ctx_name = self.ctx_param_name
        workflow = call_kwargs.get(ctx_name) if ctx_name else None
        if workflow is None:
            workflow = _workflow_ctx.get()

        async def run(gated: GatedCall, args: Mapping[str, Any]) -> Any:
            given = {**call_kwargs, **args}

            async def body() -> Any:
                return _Output(await inner.acall(**given))

            return await gated.arun(args, body)

        with framework_context(_run_id()):
            out = await run(self.gated_call, arguments)
            out = await self._settle(out, arguments, workflow, run)
        return self._answer(_unwrap(out), {"args": (), "kwargs": arguments})

    async def _settle(self, out: Any, arguments: Mapping[str, Any], workflow: Any,
                      run: Any) -> Any:
        """An ``approval_required`` answer waits for a human's ``HumanResponseEvent``; a
        request a reviewer's edit replaced is answered with what the edit did."""
        gated = self.gated_call
        if isinstance(out, Refused) and out.kind == "denied":
            edit = await areplacement(gated, out, arguments)
            answer = out if edit is None else edit.answer
            return gated.refuse(answer) if isinstance(answer, Refused) else answer
        if not isinstance(out, Refused) or out.kind != "approval_required":
            return out
        if not self.pause or workflow is None or not hasattr(workflow, "wait_for_event"):
            return gated.refuse(out)
        from llama_index.core.workflow import HumanResponseEvent

        review = await gated.spec.gate.store.on_worker(review_of, gated, out, arguments)
        waiter_id = f"effectgate:{review.approval_id}"
        requirements = {"approval_id": review.approval_id}
        asked = _input_required(review)
        event = await workflow.wait_for_event(
            HumanResponseEvent, waiter_id=waiter_id, waiter_event=asked,
            requirements=requirements, timeout=self.pause_timeout)
        if event.get("approval_id") != review.approval_id:
            # Not this call's answer (a restored waiter forgets its filter): wait on, and
            # show the request again so whoever answered sees which one still waits.
            waiting = _still_waiting(waiter_id, requirements, self.pause_timeout, asked)
            if waiting is None:
                return gated.refuse(out)
            if hasattr(workflow, "write_event_to_stream"):
                workflow.write_event_to_stream(asked)
            raise waiting
        verdict = _verdict(event)
        if verdict is None:
            return gated.refuse(out)
        answer = await aapply(gated, review, verdict, arguments, run, validate=self._validate)
        return gated.refuse(answer) if isinstance(answer, Refused) else answer

    def _validate(self, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        """A reviewer's edited arguments, checked against the tool's schema."""
        if self._schema is None:
            return dict(raw)
        return model_arguments(self._schema, raw)


def _invalid_text(detail: str) -> str:
    return model_message("invalid", None, ValueError(detail))


def _plain_signature(tool: FunctionTool) -> inspect.Signature | None:
    """The signature positional arguments bind to, or None (``*args`` / ``**kwargs``)."""
    try:
        fn = tool.real_fn
    except ValueError:
        fn = tool.fn
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    kinds = {p.kind for p in signature.parameters.values()}
    if kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
        return None
    return signature


class _Output:
    """A fresh tool output: returned to the caller whole, stored as :func:`_storable`."""

    __slots__ = ("output",)

    def __init__(self, output: ToolOutput) -> None:
        self.output = output


def _unwrap(out: Any) -> Any:
    return out.output if isinstance(out, _Output) else out


def _store_form(user_redact: Any) -> Any:
    def redact(out: Any) -> Any:
        value = _storable(out.output) if isinstance(out, _Output) else out
        return user_redact(value) if user_redact is not None else value

    return redact


def gate_tool(tool: FunctionTool, key: str, *, gate: Gate | None = None,
              effect_type: str | None = None, on_refusal: OnRefusal = "message",
              pause: bool = True, pause_timeout: float | None = None,
              **effect_options: Any) -> GatedFunctionTool:
    """Gate a LlamaIndex ``FunctionTool`` under the key template ``key``.

    Returns a ``FunctionTool`` with the same metadata; ``tool.call(**kwargs)`` and
    ``await tool.acall(**kwargs)`` work outside an agent too. ``effect_type`` defaults to the
    tool's name; ``effect_options`` are :class:`effectgate.EffectSpec` options. ``gate=None``
    uses the process-wide default gate. ``pause``: wait for a human's ``HumanResponseEvent``
    on ``approval_required`` (see the module docstring); ``pause_timeout`` seconds (None:
    no limit; the request itself expires as the policy says).
    """
    if pause not in (True, False):
        raise ConfigError(f"pause must be True or False, not {pause!r}")
    if isinstance(tool, GatedFunctionTool):
        raise ConfigError(f"tool {tool.metadata.get_name()!r} is already gated")
    if not isinstance(tool, FunctionTool):
        raise ConfigError(
            f"gate_tool takes a llama_index FunctionTool, not {type(tool).__name__}"
        )
    name = tool.metadata.get_name()
    redact = _store_form(effect_options.pop("redact", None))
    spec = EffectSpec(resolve_gate(gate), key, effect_type=effect_type or name, redact=redact,
                      **effect_options)
    schema = tool.metadata.fn_schema
    fields = getattr(schema, "model_fields", None)
    if fields is not None:
        spec.check_names([*fields, *tool.partial_params], f"tool {name!r}")
    return GatedFunctionTool(tool, GatedCall(spec, name, on_refusal=on_refusal,
                                             pause=keep_refusal),
                             pause=pause, pause_timeout=pause_timeout)


_FRAMEWORK = Framework("llama_index", tool_name=lambda t: t.metadata.get_name(),
                       is_gated=lambda t: isinstance(t, GatedFunctionTool), wrap=gate_tool)


def gate_tools(tools: Iterable[BaseTool], effects: Any, *, gate: Gate | None = None,
               strict: bool = False, read_only: Iterable[str] = (),
               on_refusal: OnRefusal = "message") -> list[BaseTool]:
    """Gate the declared tools of a list and pass the rest through, in order.

    ``effects``: tool name → key template, → ``{"key": ..., **options}``, or → None (read-only);
    or an :class:`effectgate.Policy` whose rules name their ``tools`` (the gate must carry that
    policy). Every tool left ungated is reported once by name; ``strict=True`` (or
    ``policy.strict``) refuses them with ``ConfigError``.
    """
    return _gate_tools(_FRAMEWORK, tools, effects, gate=gate, strict=strict,
                       read_only=read_only, on_refusal=on_refusal)


class EffectGateAgentMixin:
    """Put in front of a LlamaIndex workflow agent class to stop the run when a gated tool
    raises a refusal or an ambiguous outcome (``on_refusal="raise"``), and to make the agent's
    name the effect's ``agent_id``::

        class MyAgent(EffectGateAgentMixin, FunctionAgent): ...
    """

    async def _call_tool(self, ctx: Any, tool: Any, tool_input: dict[str, Any]) -> Any:
        token = _workflow_ctx.set(ctx)  # a gated tool pauses for approval on this Context
        try:
            with framework_context(_run_id(), getattr(self, "name", None)):
                out = await super()._call_tool(ctx, tool, tool_input)  # type: ignore[misc]
        finally:
            _workflow_ctx.reset(token)
        error = getattr(out, "exception", None)
        if is_stopping(error):
            raise error  # type: ignore[misc]
        return out


class EffectGateFunctionAgent(EffectGateAgentMixin, FunctionAgent):
    """A ``FunctionAgent`` that stops its run on a refused or ambiguous effect."""


class _OpenCall(NamedTuple):
    """An open tool span: the tool that runs (an adapter's base tool, a gated tool's inner
    tool), whether a gated tool covers it, and a weak reference to the span's arguments."""

    tool: int
    gated: bool
    alive: Any


_SPANNED = frozenset({"__call__", "call", "acall"})


def _runs(instance: BaseTool) -> BaseTool:
    """The tool a span's instance runs: through ``BaseToolAsyncAdapter`` (how an agent calls
    a plain ``BaseTool``) to the tool it adapts."""
    while isinstance(instance, BaseToolAsyncAdapter):
        instance = instance.base_tool
    return instance


def _forget(open_calls: dict[str, _OpenCall], id_: str, _ref: Any) -> None:
    open_calls.pop(id_, None)


class UngatedToolAudit(BaseSpanHandler[Any]):
    """Instrumentation: report each ungated tool once by name, when it is first called.

    Register with :meth:`install` (the root dispatcher). ``calls`` counts calls per ungated
    tool name. It observes only: it cannot stop a call.

    **What it sees** is what LlamaIndex instruments: ``call``, ``acall`` and ``__call__`` of
    a ``FunctionTool`` and of every ``AsyncBaseTool`` subclass, but only ``__call__`` of a
    direct ``BaseTool`` subclass (LlamaIndex spans the abstract methods a subclass implements,
    and ``BaseTool``'s only one is ``__call__``). So it sees every call an agent makes (an agent
    calls ``acall``, through an adapter for a plain ``BaseTool``) and ``tool(...)`` on any
    tool; it does **not** see ``tool.call(...)`` / ``tool.acall(...)`` called directly on a
    direct ``BaseTool`` subclass, which opens no span, unless that method goes through
    ``tool(...)``. Make such a tool an ``AsyncBaseTool``, or call it as ``tool(...)``.

    A call is counted once: spans opened inside a span of the same tool (``acall`` running
    ``call``, ``__call__`` running ``call``, an override calling ``super()``) are that call,
    and the inner tool's spans inside a gated tool's span are the gated call. Another tool the
    gated function calls is a call of its own, reported if ungated. A tool without a name is
    reported by its class name.

    It holds one entry per open tool span, dropped when the span ends or when the span's
    arguments are freed: a span LlamaIndex never closes (an ``acall`` that is not
    ``async def`` and returns a future that never completes) is not kept. Such an ``acall``
    also leaves its span current in the caller's context: another call of the same tool there,
    while that future is pending, is taken for part of it.
    """

    read_only: frozenset[str] = frozenset()
    _calls: dict[str, int] = PrivateAttr(default_factory=dict)
    _open: dict[str, _OpenCall] = PrivateAttr(default_factory=dict)  # open span -> its call

    @property
    def calls(self) -> Mapping[str, int]:
        """Calls seen per ungated tool name."""
        return self._calls

    def install(self) -> UngatedToolAudit:
        """Add this handler to LlamaIndex's root dispatcher; returns self."""
        get_dispatcher().add_span_handler(self)
        return self

    def uninstall(self) -> None:
        """Remove this handler from the root dispatcher."""
        handlers = get_dispatcher().span_handlers
        if self in handlers:
            handlers.remove(self)

    def new_span(self, id_: str, bound_args: Any, instance: Any = None,
                 parent_span_id: str | None = None, tags: Any = None, **kwargs: Any) -> None:
        if not isinstance(instance, BaseTool):
            return None
        if id_.split("-")[0].rsplit(".", 1)[-1] not in _SPANNED:
            return None
        tool = _runs(instance)
        if isinstance(tool, GatedFunctionTool):  # its inner tool's spans are not ungated
            self._remember(id_, bound_args, id(tool.inner), gated=True)
            return None
        parent = self._open.get(parent_span_id) if parent_span_id is not None else None
        if parent is not None and parent.tool == id(tool):  # the same call, counted once
            self._remember(id_, bound_args, id(tool), gated=parent.gated)
            return None
        self._remember(id_, bound_args, id(tool), gated=False)
        name = tool.metadata.name or type(tool).__name__
        if name in self.read_only:
            return None
        with self.lock:
            self._calls[name] = self._calls.get(name, 0) + 1
        report_ungated("llama_index", [name], strict=False)
        return None

    def _remember(self, id_: str, bound_args: Any, tool: int, *, gated: bool) -> None:
        """Keep an open tool span until it ends, or until its arguments are freed (a span
        LlamaIndex never ends: this handler must not keep it forever)."""
        try:
            alive = weakref.ref(bound_args, partial(_forget, self._open, id_))
        except TypeError:  # pragma: no cover - LlamaIndex always passes BoundArguments
            alive = None
        self._open[id_] = _OpenCall(tool, gated, alive)

    def prepare_to_exit_span(self, id_: str, bound_args: Any, instance: Any = None,
                             result: Any = None, **kwargs: Any) -> None:
        self._open.pop(id_, None)
        return None

    def prepare_to_drop_span(self, id_: str, bound_args: Any, instance: Any = None,
                             err: BaseException | None = None, **kwargs: Any) -> None:
        self._open.pop(id_, None)
        return None
