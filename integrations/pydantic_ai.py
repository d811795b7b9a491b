"""pydantic-ai: a gating toolset, and gated tools.

Two forms, one guarantee — the same consequence executes at most once:

* ``EffectGateToolset(toolset, effects, gate=gate)`` is a ``WrapperToolset`` around any toolset
  (a ``FunctionToolset``, an MCP server, a combination): its ``call_tool`` gates every call of a
  declared tool; its ``get_tools`` passes the tool definitions through untouched, so the model
  sees exactly what it would see without the gate. Tools it does not declare are reported once
  by name when the agent first lists them; ``strict=True`` (or ``policy.strict``) refuses to
  start the run instead.
* ``gate_tool(tool, "refund:{txn_id}", gate=gate)`` returns a pydantic-ai ``Tool`` with the same
  name, description and parameter schema whose every call passes through the gate; put it in
  ``Agent(tools=[...])`` or a ``FunctionToolset`` like the original.

Arguments reach the gate as pydantic-ai validated them against the tool's schema (``"500"`` is
``500``, defaults filled in), so the key and payload hash see what the function sees; a key
template names them as the function does (an aliased parameter by its Python name, a function
taking one model by that parameter: ``"refund:{order.txn_id}"``). A duplicate gets the
stored result, as though the tool had just run; two identical calls in one turn run once and
both get the result. Every other answer is a failed tool result the model
reads (``ToolFailed``: it does not spend the tool's retries): wait, do not retry, ask a human —
the same words as every other adapter; arguments that cannot name an effect are a
``ModelRetry`` (correct them). With ``on_refusal="raise"`` refusals and ambiguous outcomes are
raised instead, ending the run. The run's ``run_id`` becomes the effect's ``run_id`` and the
agent's name its ``agent_id``.

Errors the body raises are the gate's to record: one the outcome of which is unknown is never
handed back to pydantic-ai as a ``ModelRetry`` (a retry is what must not happen); ``ModelRetry``
and ``ToolFailed`` raised by the body itself are FAILED only when a declared classifier says so
(``classifiers=``), AMBIGUOUS otherwise. pydantic-ai's own deferrals are handed back to it, so
the run defers the call as the tool asked: ``ApprovalRequired`` (the tool's own check, or a
wrapped ``toolset.approval_required()``) is FAILED — it asked before it acted, and pydantic-ai
calls it again once approved; ``CallDeferred`` (the call handed to an executor outside the run)
is recorded as classified, AMBIGUOUS by default, so a repeat is never handed off again.

**Approvals pause the run** through pydantic-ai's deferred tools: when the run's output
types include ``DeferredToolRequests`` (or ``pause=True``), a call the policy sends for
approval raises ``ApprovalRequired`` with ``metadata={"effectgate": {approval_id,
payload_hash, key, ...}, "arguments": <the normalised arguments that would execute>}``, so the
run ends with ``DeferredToolRequests``. Resume with ``message_history=...`` and
``deferred_tool_results=DeferredToolResults(approvals={call_id: True},
metadata={call_id: <that metadata>})`` (in any process: the pause is message history):

* ``True`` — the approval is recorded in the store for that payload hash (read from the store
  by the approval id the metadata names; the metadata itself is not trusted) and the call
  executes once. A replayed resume gets the stored result. A call whose request is still
  pending after the resume (the metadata named another approval) pauses again on it.
* Arguments other than the ones the approval binds — ``ToolApproved(override_args={...})``,
  or the call's arguments changed in the saved history (pydantic-ai passes both to the tool
  alike, so they cannot be told apart) — are an edit no human has approved yet: they are their
  own effect (their template key, or ``<key>~edit:<hash16>``) with their own approval request,
  left **pending**, and the run pauses again on it (``metadata["arguments"]`` shows the edited
  arguments). The original request is denied ("replaced by an edit"). Approving that second
  pause — resume it with the same ``override_args``, or ``effectgate approve`` / the console,
  then resume with them — executes the edited arguments once. A replayed resume of the first
  pause gets what the edit's effect answers (its stored result once it ran). A request decided
  already (approved and run, rejected, expired, or replaced by an edit) takes no new edit:
  other arguments are denied, never run under a fresh edit key; of two resumes editing one
  request at once, only the edit its denial names runs.
* a rejection — pydantic-ai never calls a denied tool, so record it through the adapter:
  ``DeferredToolResults(approvals={call_id: reject(metadata[call_id], by=..., reason=...)})``
  (:func:`reject` returns the ``ToolDenied``). A replayed rejection is the same answer and
  writes nothing; a request the store approved, or an edit replaced, is not rejected:
  ``InvalidTransition``, nothing written.

Who approves: ``approver=`` (default :data:`DEFAULT_APPROVER`). The store comes first: a
request approved or denied in the CLI or the console meanwhile is executed or refused (an
edit resumed just as the original was approved runs nothing: the tool would get the edited
arguments). This is **prevention**: the arguments that execute are the ones whose payload hash
a human's approval binds.

A sync function tool's reservation, body and outcome run in one hop off the event loop, through
pydantic-ai's own executor (so its thread settings hold), where pydantic-ai would run the body
alone; this reads ``FunctionSchema._call_args`` and falls back to the plain path without it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from effectgate import (
    ApprovalState,
    ConfigError,
    EffectAmbiguous,
    EffectGateError,
    EffectRefused,
    EffectSpec,
    Gate,
    InvalidTransition,
    NotExecuted,
    payload_hash,
    validate,
)

from ._kernel import (
    GatedCall,
    OnRefusal,
    Refused,
    UngatedToolWarning,
    framework_context,
    read_declarations,
    report_ungated,
    requires_extra,
    resolve_gate,
)
from ._kernel.call import keep_refusal
from ._kernel.review import (
    Review,
    Verdict,
    aapply,
    areplacement,
    decided,
    edited_call,
    keyed_as,
    replaced,
    replaced_by,
    review_of,
)
from ._kernel.vocabulary import model_message

with requires_extra("pydantic_ai", "pydantic-ai"):
    from pydantic import PlainValidator, TypeAdapter
    from pydantic_ai import (
        ApprovalRequired,
        CallDeferred,
        ModelRetry,
        RunContext,
        Tool,
        ToolDenied,
        ToolFailed,
    )
    from pydantic_ai._function_schema import FunctionSchema
    from pydantic_ai.messages import ToolReturn
    from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, WrapperToolset
    from pydantic_ai.toolsets.abstract import ToolsetTool
    from pydantic_ai.toolsets.function import FunctionToolsetTool

__all__ = ["DEFAULT_APPROVER", "EffectGateToolset", "UngatedToolWarning", "gate_tool",
           "is_gated", "reject"]

DEFAULT_APPROVER = "pydantic-ai-resume"
"""Who a resumed approval is recorded as approved by unless ``approver=`` says."""


async def _hop(function: Callable[[], Any]) -> Any:
    """Off the event loop pydantic-ai's own way (its executor; no thread where it runs none)."""
    try:
        from pydantic_ai._utils import run_in_executor
    except ImportError:  # pragma: no cover - another pydantic-ai layout
        return await asyncio.to_thread(function)
    return await run_in_executor(function)


def _context(ctx: RunContext[Any]) -> tuple[Any, Any]:
    return ctx.run_id, getattr(ctx.agent, "name", None)


def _answer(refused: Refused) -> Exception:
    """A refusal as the tool result the model reads."""
    if refused.kind == "invalid":
        return ModelRetry(refused.message)
    return ToolFailed(refused.message)


def _direct(schema: FunctionSchema, args: dict[str, Any],
            ctx: RunContext[Any]) -> Callable[[], Any] | None:
    """The sync function called with its arguments, to run on one thread with the gate; None
    when the function is async or the schema does not offer its argument binding.

    A plain ``def`` wrapping an async function (a sync decorator, marked by
    ``functools.wraps``) hands back its coroutine: None too, so pydantic-ai's own call awaits
    it on the loop and no thread waits for it (a worker of a bounded executor held while the
    coroutine needs that executor hung the run; with threads disabled the coroutine was left
    unawaited and recorded AMBIGUOUS). Any other plain ``def`` that returns an awaitable is
    awaited on the run's event loop from the worker thread, before the gate records the
    outcome."""
    bind = getattr(schema, "_call_args", None)
    if schema.is_async or bind is None or _wraps_async(schema.function):
        return None
    positional, named = bind(args, ctx)
    function = schema.function
    loop = asyncio.get_running_loop()

    def call() -> Any:
        value = function(*positional, **named)
        if inspect.isawaitable(value) and not _on_a_loop():
            return asyncio.run_coroutine_threadsafe(_awaited(value), loop).result()
        return value  # no thread (pydantic-ai's disable_threads): the gate refuses it

    return call


def _wraps_async(function: Callable[..., Any]) -> bool:
    """Whether a plain ``def`` wraps an async function (``__wrapped__``, as
    ``functools.wraps`` sets it), so that it likely returns that function's coroutine."""
    try:
        inner = inspect.unwrap(function)
    except ValueError:  # a cycle of __wrapped__
        return False
    return inner is not function and (inspect.iscoroutinefunction(inner) or
                                      inspect.iscoroutinefunction(type(inner).__call__))


def _on_a_loop() -> bool:
    """Whether this thread runs an event loop (the body then cannot wait for the run's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


def _defers(ctx: RunContext[Any], pause: bool | None) -> bool:
    """Pause through ``ApprovalRequired``? ``None``: when the run's output types include
    ``DeferredToolRequests`` (else pydantic-ai would fail the run) — the run's, which
    ``run(..., output_type=...)`` may set apart from the agent's."""
    if pause is not None:
        return pause
    schema = _run_output_schema(ctx)
    if schema is None:
        schema = getattr(getattr(ctx, "agent", None), "_output_schema", None)
    return bool(getattr(schema, "allows_deferred_tools", False))


def _run_output_schema(ctx: RunContext[Any]) -> Any:
    """The output schema of the run ``ctx`` belongs to (None where it cannot be read): held by
    the run's output submitter, read through ``__dict__`` as pydantic-ai reads it (a durable
    run's context raises for fields that do not cross its boundary)."""
    submitter = getattr(ctx, "__dict__", {}).get("_output_submitter")
    deps = getattr(submitter, "deps", None)
    run = deps() if callable(deps) else None
    return getattr(run, "output_schema", None)


def _paused_approval(ctx: RunContext[Any]) -> str | None:
    """The approval id a resumed, approved call's metadata names (None otherwise)."""
    if not getattr(ctx, "tool_call_approved", False):
        return None
    meta = getattr(ctx, "tool_call_metadata", None)
    inner = meta.get("effectgate") if isinstance(meta, dict) else None
    approval_id = inner.get("approval_id") if isinstance(inner, dict) else None
    return approval_id if isinstance(approval_id, str) else None


def _called_with(ctx: RunContext[Any]) -> dict[str, Any] | None:
    """The arguments the model called this tool call with, as the history holds them (None
    when the history does not show the call)."""
    from pydantic_ai.messages import ToolCallPart

    for message in reversed(ctx.messages or []):
        for part in getattr(message, "parts", ()):
            if isinstance(part, ToolCallPart) and part.tool_call_id == ctx.tool_call_id:
                return part.args_as_dict()
    return None


def _of_this_call(gated: GatedCall, record: Any, args: dict[str, Any],
                  called: dict[str, Any] | None) -> bool:
    """Whether the request a resume's metadata names is this call's: the one its call paused
    on (its key, or an edit of it), or the one its arguments now make. Metadata round-trips
    through the client, and another run's (another key's) would deny that run's request as
    "replaced" and answer this call with that key's result."""
    try:
        if gated.spec.request(args).payload_hash == record.payload_hash:
            return True
        if called is None:
            return True  # the history does not show the call: judged by the request alone
        key = gated.spec.request(called).key
    except EffectGateError:
        return False
    return keyed_as(record.key, key)


async def _resumed(gated: GatedCall, approval_id: str, args: dict[str, Any],
                   run: Callable[[GatedCall, Any], Awaitable[Any]], approver: str,
                   called: dict[str, Any] | None = None) -> Any:
    """A call a human approved through ``DeferredToolResults``: decided against the store.

    The approval the metadata names binds a payload hash. Arguments with that hash are the
    approved call (approved now, by ``approver``, if still pending). Other arguments — a
    ``ToolApproved(override_args=...)`` edit, or the call's arguments changed in the history:
    pydantic-ai cannot tell them apart — are an edit no human has approved: their own request,
    left pending (the run pauses again on it), and the original denied, replaced.

    A request decided already takes no new edit: only a replay of the edit that replaced it
    runs (under that edit's key). A new edit of a request that was approved and ran, rejected,
    expired or replaced would be the same call's effect again under a fresh key."""
    gate = gated.spec.gate
    try:
        record = await gate.store.on_worker(gate.approval, approval_id)
    except EffectGateError:
        record = None
    if record is None or record.effect_type != gated.spec.effect_type or not _of_this_call(
            gated, record, args, called):
        return await run(gated, args)  # not this call's request: the store answers the call
    try:
        same = gated.spec.request(args).payload_hash == record.payload_hash
        original = args if same or not isinstance(record.arguments, dict) else record.arguments
        # The call whose key is the request's: the tool's own, or an edit's (~edit:).
        own = gated if gated.spec.request(original).key == record.key else \
            edited_call(gated, record.key)
    except EffectGateError:
        return await run(gated, args)  # arguments that name no effect: the call says so
    if record.state is not ApprovalState.PENDING:
        # Decided already (the CLI, the console, an earlier resume): the store answers — the
        # approved arguments under their key, the edit that replaced the request under its own.
        if same:
            return await run(own, args)
        edit = edited_call(gated, record.key)
        try:
            key = edit.spec.request(args).key
        except EffectGateError:
            return decided(record)
        if await gate.store.on_worker(replaced_by, gate, record, key):
            return await run(edit, args)
        return decided(record)
    review = Review(approval_id=record.approval_id, payload_hash=record.payload_hash,
                    key=record.key, effect_type=record.effect_type, tool_name=gated.tool_name,
                    arguments=original)
    verdict = Verdict("approve" if same else "edit", by=approver,
                      arguments=None if same else args, approves_edit=False)
    return await aapply(own, review, verdict, original, run)


def _pause(review: Review) -> ApprovalRequired:
    """The pause on one approval request: what the human is shown, and what binds it."""
    return ApprovalRequired(metadata={"effectgate": review.as_dict(),
                                      "arguments": review.arguments,
                                      "description": review.description()})


class _AskedFirst(NotExecuted):
    """The body raised pydantic-ai's ``ApprovalRequired`` (the tool's own check, or a wrapped
    ``ApprovalRequiredToolset``): it asked before it acted, and pydantic-ai calls it again
    once approved, so the attempt is FAILED (AMBIGUOUS would block the approved call for
    good) and the run pauses on the tool's request."""

    def __init__(self, deferral: ApprovalRequired) -> None:
        super().__init__("the tool asked for approval before it ran")
        self.deferral = deferral


def _asking(body: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        try:
            return body()
        except ApprovalRequired as exc:
            raise _AskedFirst(exc) from exc

    return call


def _aasking(body: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        try:
            return await body()
        except ApprovalRequired as exc:
            raise _AskedFirst(exc) from exc

    return call


def _deferral(error: BaseException | None) -> BaseException | None:
    """The pydantic-ai deferral a gated body raised, found in the gate's answer (its recorded
    error, or the error raise mode raised): ``ApprovalRequired`` (recorded FAILED) or
    ``CallDeferred`` (the call handed to an executor outside the run: recorded as classified,
    AMBIGUOUS by default). pydantic-ai is handed it back, so the run defers the call as the
    tool asked, instead of the model reading "outcome unknown"."""
    if isinstance(error, _AskedFirst):
        return error.deferral
    if isinstance(error, CallDeferred):
        return error
    if isinstance(error, EffectAmbiguous) and isinstance(error.__cause__, CallDeferred):
        return error.__cause__  # raise mode
    return None


def _carries(gated: GatedCall, keyed: Any, given: Mapping[str, Any]) -> bool:
    """Whether a body handed ``given`` does what the gate keys as ``keyed``: one payload."""
    if keyed is given:
        return True
    template = gated.spec.template
    try:
        return bool(payload_hash(template.normalise(keyed))
                    == payload_hash(template.normalise(given)))
    except EffectGateError:
        return False


def _not_carried() -> Refused:
    """The answer when the arguments the gate would key are not the ones the tool would get
    (a request approved meanwhile for the arguments it showed, the call edited since)."""
    return Refused.of("denied", "the call's arguments are not the ones the approval binds; "
                      "nothing was carried out")


async def _gated(gated: GatedCall, args: dict[str, Any], ctx: RunContext[Any],
                 forward: Callable[[], Awaitable[Any]],
                 direct: Callable[[], Any] | None, *, pause: bool | None = None,
                 approver: str = DEFAULT_APPROVER) -> Any:
    forward = _aasking(forward)
    direct = None if direct is None else _asking(direct)

    async def run(one: GatedCall, arguments: Any) -> Any:
        if one is gated and arguments is args:
            if direct is not None:
                return await one.arun_sync(arguments, direct, hop=_hop)
            return await one.arun(arguments, forward)
        if not _carries(gated, arguments, args):
            return _not_carried()  # the body would get pydantic-ai's args, not these
        return await one.arun(arguments, forward)  # an edit: pydantic-ai passed its args

    with framework_context(*_context(ctx)):
        approval_id = _paused_approval(ctx)
        try:
            if approval_id is not None:
                out = await _resumed(gated, approval_id, args, run, approver,
                                     _called_with(ctx))
            else:
                out = await run(gated, args)
        except EffectGateError as exc:  # raise mode: a body's deferral, recorded
            deferral = _deferral(exc)
            if deferral is None:
                raise
            raise deferral from None
        deferral = _deferral(out.error) if isinstance(out, Refused) else None
        if deferral is not None:
            raise deferral
        edit = await areplacement(gated, out, args)  # a request a reviewer's edit replaced
        if edit is not None:
            out = edit.answer
        if isinstance(out, Refused) and out.kind == "approval_required" \
                and _defers(ctx, pause):
            raise _pause(await gated.spec.gate.store.on_worker(review_of, gated, out, args))
    if isinstance(out, Refused):
        out = gated.refuse(out)
        raise _answer(out)
    return out


def reject(metadata: Any, *, by: str, reason: str | None = None,
           gate: Gate | None = None) -> ToolDenied:
    """Record a human's rejection of a paused call and return the ``ToolDenied`` to resume
    with (``DeferredToolResults(approvals={call_id: reject(metadata[call_id], by=...)})``):
    pydantic-ai never calls a denied tool, so the store hears of it here.

    ``metadata`` is the call's ``DeferredToolRequests.metadata`` entry. A replayed rejection
    is the same answer and changes nothing; a request the store denied otherwise (the CLI,
    the console) answers with that denial. :class:`InvalidTransition` when the store approved
    it (the approval stands; nothing recorded) or a reviewer's edit replaced it (the edit is
    its own request, with its own pause, and may have run: rejecting the original would tell
    the model nothing was done), :class:`UnknownEffect` for an approval that is not there,
    :class:`ConfigError` for metadata that names none."""
    actor = validate.text(by, "by", 256, required=True) or ""
    why = validate.text(reason, "reason", validate.MAX_TEXT)
    inner = metadata.get("effectgate") if isinstance(metadata, dict) else None
    approval_id = inner.get("approval_id") if isinstance(inner, dict) else None
    if not isinstance(approval_id, str):
        raise ConfigError("reject takes the paused call's metadata, as DeferredToolRequests "
                          'gave it: {"effectgate": {"approval_id": ...}, ...}')
    store = resolve_gate(gate)
    record = store.approval(approval_id)
    if record.state is ApprovalState.PENDING:
        try:
            record = store.deny(approval_id, by=actor, reason=why)
        except InvalidTransition:  # decided meanwhile: that decision stands
            record = store.approval(approval_id)
    if record.state in (ApprovalState.APPROVED, ApprovalState.CONSUMED):
        raise InvalidTransition(
            f"approval {approval_id} was approved by {record.decided_by}; it cannot be "
            "rejected now", key=record.key, state=record.state.value,
            effect_id=record.effect_id)
    if replaced(record):  # the edit is the decision now: a "not carried out" would be false
        raise InvalidTransition(
            f"approval {approval_id} was {record.reason}; it cannot be rejected now: reject "
            "the edit's own pause", key=record.key, state=record.state.value,
            effect_id=record.effect_id)
    if record.state is ApprovalState.DENIED:
        text = f"rejected by {record.decided_by}" + (f": {record.reason}" if record.reason
                                                      else "")
    else:
        text = "the approval request expired"
    error = EffectRefused(text, key=record.key, decision="denied", reason=text)
    return ToolDenied(model_message("denied", record.key, error))


def _spec(gate: Gate, key: str, name: str, parameters: Mapping[str, Any],
          options: Mapping[str, Any], schema: Any = None) -> EffectSpec:
    options = dict(options)
    if options.get("result_type") is None:
        function = schema.function if isinstance(schema, FunctionSchema) else None
        options["result_type"] = Annotated[Any, PlainValidator(_Rebuilt(
            None if function is None else _returns(function)))]
    spec = EffectSpec(gate, key, effect_type=options.pop("effect_type", None) or name, **options)
    props = parameters.get("properties")
    if isinstance(props, dict):
        spec.check_names(_argument_names(props, schema), f"tool {name!r}")
    return spec


def _returns(function: Callable[..., Any]) -> Any:
    """A function tool's return annotation (None when it cannot be resolved): a duplicate's
    stored JSON is rebuilt as it (:class:`_Rebuilt`), as the tool returned it."""
    try:
        annotation = inspect.signature(function).return_annotation
        if isinstance(annotation, str):
            annotation = typing.get_type_hints(function).get("return")
    except Exception:  # a callable without a signature, a name that does not resolve
        return None
    return annotation


_TOOL_RETURN_FIELDS = frozenset(f.name for f in dataclasses.fields(ToolReturn))
"""The fields of a ``ToolReturn``'s JSON: a stored dict with any other key is a tool's own
dict (one that happens to say ``"kind": "tool-return"``), kept as it is."""


class _Rebuilt:
    """A duplicate's stored JSON as the tool returned it: as the function's return annotation
    says where that takes it, and a ``ToolReturn``'s JSON as a ``ToolReturn`` whatever the
    annotation (``-> Any``, ``-> dict``, none, a tool that is no function): its ``metadata``
    is never sent to the model, and a duplicate answered with the dumped ``ToolReturn``
    handed it to the model. Anything else stays the stored JSON."""

    def __init__(self, annotation: Any) -> None:
        plain = annotation is None or annotation is inspect.Signature.empty or annotation is Any
        self._annotation = None if plain else annotation
        self._adapters: dict[str, Any] = {}  # built at the first duplicate, not at startup

    def __call__(self, stored: Any) -> Any:
        value = stored
        if self._annotation is not None:
            value = self._validated("stated", self._annotation, value)
        if isinstance(value, dict) and value.get("kind") == "tool-return" \
                and "return_value" in value and value.keys() <= _TOOL_RETURN_FIELDS:
            value = self._validated("tool_return", ToolReturn, value)
        return value

    def _validated(self, name: str, annotation: Any, stored: Any) -> Any:
        """``stored`` validated as ``annotation``; ``stored`` itself where pydantic cannot
        take the annotation (``Awaitable[str]``) or the JSON does not fit it."""
        if name not in self._adapters:
            try:
                self._adapters[name] = TypeAdapter(annotation)
            except Exception:  # no schema for this annotation: the JSON as stored
                self._adapters[name] = None
        adapter = self._adapters[name]
        if adapter is None:
            return stored
        try:
            return adapter.validate_python(stored)
        except Exception:  # the stored JSON is still the truth
            return stored


def _argument_names(props: Mapping[str, Any], schema: Any) -> list[str]:
    """The names a tool's validated arguments carry — what the key is rendered from. A
    function's (``schema``, its ``FunctionSchema``) are its parameters' Python names: an
    aliased parameter's, not the alias its JSON schema shows; a function taking one model,
    that parameter (``{order.txn_id}``), not the model's fields. Otherwise the JSON schema's
    properties, as the model sends them (an MCP tool's)."""
    if not isinstance(schema, FunctionSchema):
        return list(props)
    if schema.single_arg_name is not None:
        return [schema.single_arg_name]
    aliases = getattr(schema, "parameter_names", {})
    return [aliases.get(name, name) for name in props]


# -- gate_tool -----------------------------------------------------------------------------------


@dataclass
class _GatedSchema(FunctionSchema):
    """The tool's function schema (same JSON schema, validator and description) whose ``call``
    passes through the gate."""

    gated: GatedCall | None = None
    pause: bool | None = None
    approver: str = DEFAULT_APPROVER

    async def call(self, args_dict: dict[str, Any], ctx: RunContext[Any]) -> Any:
        gated = self.gated
        assert gated is not None
        return await _gated(gated, args_dict, ctx, lambda: super(_GatedSchema, self).call(
            args_dict, ctx), _direct(self, args_dict, ctx), pause=self.pause,
            approver=self.approver)


def is_gated(tool: Any) -> bool:
    """True for a tool returned by :func:`gate_tool`."""
    return isinstance(getattr(tool, "function_schema", None), _GatedSchema)


def gate_tool(tool: Tool[Any], key: str, *, gate: Gate | None = None,
              effect_type: str | None = None, on_refusal: OnRefusal = "message",
              pause: bool | None = None, approver: str = DEFAULT_APPROVER,
              **effect_options: Any) -> Tool[Any]:
    """Gate a pydantic-ai ``Tool`` under the key template ``key`` (``"refund:{txn_id}"``).

    Returns a ``Tool`` with the same definition. ``effect_type`` defaults to the tool's name;
    ``effect_options`` are :class:`effectgate.EffectSpec` options. ``gate=None`` uses the
    process-wide default gate. ``pause`` / ``approver``: approvals through deferred tools
    (see the module docstring; ``None``: when the agent's output allows them).
    """
    _check_pause(pause, approver)
    if not isinstance(tool, Tool):
        raise ConfigError(f"gate_tool takes a pydantic_ai Tool, not {type(tool).__name__}")
    if is_gated(tool):
        raise ConfigError(f"tool {tool.name!r} is already gated")
    schema = tool.function_schema
    spec = _spec(resolve_gate(gate), key, tool.name, schema.json_schema,
                 {"effect_type": effect_type, **effect_options}, schema)
    values = {f.name: getattr(schema, f.name) for f in dataclasses.fields(FunctionSchema)}
    gated = copy.copy(tool)
    gated.function_schema = _GatedSchema(
        **values, gated=GatedCall(spec, tool.name, on_refusal=on_refusal, pause=keep_refusal),
        pause=pause, approver=approver)
    return gated


def _check_pause(pause: Any, approver: Any) -> None:
    if pause not in (None, True, False):
        raise ConfigError(f"pause must be None, True or False, not {pause!r}")
    if not isinstance(approver, str) or not approver.strip():
        raise ConfigError("approver must be a non-empty str")


# -- EffectGateToolset ---------------------------------------------------------------------------


class _Seen:
    """What a toolset learnt about its tools (shared by the copies pydantic-ai makes per run)."""

    def __init__(self) -> None:
        self.calls: dict[str, GatedCall | None] = {}


@dataclass
class EffectGateToolset(WrapperToolset[Any]):
    """Gate the calls of a toolset's declared tools (see the module docstring).

    ``effects``: tool name → key template, → ``{"key": ..., **options}``, → None (read-only); or
    an :class:`effectgate.Policy` whose rules name their ``tools`` (the gate must carry that
    policy). ``gate=None`` uses the process-wide default gate. ``pause`` / ``approver``: as for
    :func:`gate_tool`.
    """

    effects: Any = None
    gate: Gate | None = None
    strict: bool = False
    read_only: tuple[str, ...] = ()
    on_refusal: OnRefusal = "message"
    pause: bool | None = None
    approver: str = DEFAULT_APPROVER
    _seen: _Seen = field(default_factory=_Seen, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.wrapped, AbstractToolset):
            raise ConfigError(
                f"EffectGateToolset wraps a pydantic_ai toolset, not {type(self.wrapped).__name__}"
            )
        if self.on_refusal not in ("message", "raise"):
            raise ConfigError(f"on_refusal must be 'message' or 'raise', not {self.on_refusal!r}")
        _check_pause(self.pause, self.approver)
        self.gate = resolve_gate(self.gate)
        self.read_only = tuple(self.read_only)
        read_declarations(self.effects, gate=self.gate, read_only=self.read_only)

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The wrapped toolset's tools, unchanged; new ones are matched to their effects."""
        tools = await self.wrapped.get_tools(ctx)
        if any(name not in self._seen.calls for name in tools):
            self._learn(tools)
        return tools

    def _learn(self, tools: Mapping[str, ToolsetTool[Any]]) -> None:
        gate = self.gate
        assert gate is not None
        declared = read_declarations(self.effects, gate=gate, read_only=self.read_only)
        ungated: list[str] = []
        calls = dict(self._seen.calls)
        for name, tool in tools.items():
            if name in calls:
                continue
            entry = declared.effects.get(name)
            if entry is None or _gated_function(tool):
                calls[name] = None
                if entry is None and name not in declared.read_only and not _gated_function(tool):
                    ungated.append(name)
                continue
            on_refusal = entry.adapter_options().get("on_refusal", self.on_refusal)
            spec = _spec(gate, entry.key, name, tool.tool_def.parameters_json_schema,
                         entry.effect_options(), _function_schema(tool)) \
                if entry.spec is None else entry.spec
            calls[name] = GatedCall(spec, name, on_refusal=on_refusal, pause=keep_refusal)
        report_ungated("pydantic_ai", ungated, strict=self.strict or declared.strict)
        self._seen.calls = calls

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        """Call the tool through the gate when it is declared; else forward the call."""
        gated = self._seen.calls.get(name)
        if gated is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        return await _gated(gated, tool_args, ctx,
                            lambda: self.wrapped.call_tool(name, tool_args, ctx, tool),
                            self._direct(tool, tool_args, ctx), pause=self.pause,
                            approver=self.approver)

    def _direct(self, tool: ToolsetTool[Any], args: dict[str, Any],
                ctx: RunContext[Any]) -> Callable[[], Any] | None:
        """One thread hop for a plain sync function straight from a ``FunctionToolset`` (no
        timeout, nothing in between that would see the call)."""
        wrapped = self.wrapped
        if type(wrapped) is not FunctionToolset or not isinstance(tool, FunctionToolsetTool):
            return None
        if tool.toolset is not wrapped or tool.is_async or wrapped.timeout is not None \
                or tool.tool_def.timeout is not None:
            return None
        call = tool.call_func
        schema = getattr(call, "__self__", None)
        if type(schema) is not FunctionSchema or getattr(call, "__func__", None) is not \
                FunctionSchema.call:
            return None
        return _direct(schema, args, ctx)


def _function_schema(tool: ToolsetTool[Any]) -> FunctionSchema | None:
    """The function schema behind a ``FunctionToolset`` tool (None for any other tool)."""
    if not isinstance(tool, FunctionToolsetTool):
        return None
    schema = getattr(tool.call_func, "__self__", None)
    return schema if isinstance(schema, FunctionSchema) else None


def _gated_function(tool: ToolsetTool[Any]) -> bool:
    """A tool of a FunctionToolset that :func:`gate_tool` already gated."""
    schema = getattr(getattr(tool, "call_func", None), "__self__", None)
    return isinstance(schema, _GatedSchema)
