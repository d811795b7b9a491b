"""LangChain: gated tools, and ``EffectGateMiddleware`` for ``langchain.agents.create_agent``.

Two forms, one guarantee — the same consequence executes at most once:

* ``gate_tool(tool, "refund:{txn_id}", gate=gate)`` returns a ``BaseTool`` with the tool's own
  name, description and argument schema (``convert_to_openai_tool`` gives the same JSON), so the
  model sees nothing new. It works wherever a tool runs: ``tool.invoke``/``ainvoke``, a LangGraph
  ``ToolNode``, ``create_agent``, a hand-written loop. ``gate_tools(tools, effects)`` wraps a
  list and reports every tool left ungated.
* ``EffectGateMiddleware(effects, gate=gate)`` (LangChain v1 agents) sees every tool call of
  ``create_agent``: it answers a repeat without running the tool and records the outcome of a
  call it let through. It resolves each tool the first time it sees it (at a model call, or
  at a call of it: a middleware shared by agents, or behind one that changes the tool list,
  gates every declared tool) and reports each ungated one then. It covers only tools called
  through the agents it is installed in. A declaration is found by the tool's name; the
  arguments by the tool object itself, so two agents sharing one middleware may each have a
  tool of that name with its own arguments (each validated, hashed and checked against the
  key template by its own schema). They share the declaration, hence its keys: tools of one
  name whose consequences differ need different names or different middlewares.

Either way: arguments are validated through the tool's schema before the key and payload hash
are computed (``"500"`` and ``500`` are one refund) — its own ``args_schema``, with its
validators, ``model_config`` and aliases, as the tool validates them when it runs — and
arguments it does not validate are refused, never let through; injected arguments
(``ToolRuntime``, ``InjectedToolCallId``, state) are not part of the payload (the middleware
validates a tool that has them by the schema the model sees, its fields alone). A duplicate
gets the stored result, as though the tool had just run; every other answer reaches the model
as a ``ToolMessage(status="error")`` saying what to do (wait, do not retry, ask a human). With
``on_refusal="raise"`` they are raised instead — they are not ``ToolException`` s, so they stop
the run. The LangGraph ``thread_id`` becomes the effect's ``run_id`` and the agent's name its
``agent_id``.

Identical calls in one turn (a ``ToolNode`` running parallel tool calls) execute once: the second
waits for the first and answers with its result (a ``ToolMessage`` re-addressed to its own call).

**A tool that answers with a ``Command``** (``update`` holding its ``ToolMessage`` and other
state keys): the store keeps ``{"effectgate.langchain.Command": {"tool_call_id", "content",
"update"}}`` — the message's call id and content, and the other state updates when they are
plain JSON that reads back equal (else ``"update": None``; also when the command carries more
than its one tool message: other messages, ``goto``, ``graph``). A ``redact=`` receives that
form; any other result that reads like it is stored escaped and stays a plain result. A repeat
(a twin waiting on its leader, or one answered from the store) gets its message re-addressed to
its own call, plus the updates where its run's state lacks them: a twin in another run, a later
run, a replay of the very call from a checkpoint taken before it ran — once, however many
identical calls of one turn repeat it (the earliest gets them) — unless the store redacted one
of them (the policy's ``redact_result``: its placeholder is no value). In the run that applied
them (a twin in the same turn, a later turn of the same thread, a repeat of a repeat) it gets
the message alone, so an appending channel holds the effect once. That is read from the run's
state: the private ``effectgate_applied`` channel ``EffectGateMiddleware`` adds (the calls
whose updates the state holds: no summarising or trimming middleware removes it), then the
messages (the original call among its tool calls, or a tool message that answers it or repeats
it, marked ``response_metadata["effectgate_answer_of"]``). A ``gate_tool`` tool writes that
channel too, but only a state that declares it (``effectgate_applied:
Annotated[list[str], operator.add]``) keeps it: without it, a middleware that drops messages
makes a later repeat apply the updates again. A ``gate_tool`` tool that has no ``ToolRuntime``
cannot see the state and gets the message alone.

The tool's ``handle_tool_error``: honoured for a ``ToolException`` recorded FAILED (nothing
happened — declare that with ``classifiers=(classify_tool_exception,)``): it is re-raised, and the
tool's own setting answers the model or raises, as it would ungated. **Overridden** for one whose
outcome is unknown (the default, AMBIGUOUS): the model is told not to retry, whatever the tool's
handler would have said, since a retry is what must not happen.

**Approvals pause the run** (both forms). Inside a LangGraph run with a checkpointer, a call
the policy sends for approval calls ``langgraph.types.interrupt()`` with LangChain's
``HITLRequest`` payload (:func:`hitl_request`: ``action_requests`` with the tool's name, the
normalised arguments that would execute and a description; ``review_configs`` allowing
``approve`` / ``edit`` / ``reject``) plus ``"effectgate": {approval_id, payload_hash, key}``.
Resume with ``Command(resume={"decisions": [decision]})`` (on a thread with several pauses,
``{interrupt_id: {"decisions": [...]}}``); a decision may add ``"by"`` (the reviewer recorded
as approver, default the ``approver=`` option, else :data:`DEFAULT_APPROVER`),
``"payload_hash"`` and ``"approval_id"`` (checked against the call's: a UI that echoes the
``"effectgate"`` part it was shown binds its answer to that very request):

* ``{"type": "approve"}`` — recorded in the store (``gate.approve``) for that payload hash;
  the call executes once. A replayed or racing resume finds it done and gets the stored result.
* ``{"type": "edit", "edited_action": {"name": ..., "args": {...}}}`` — the edited arguments
  are validated against the tool's schema and gated as their own effect (the key their
  template gives, or ``<key>~edit:<hash16>`` when that is the original key) with their own
  approval, which is recorded as approved by the reviewer who sent the edit: sending the edit
  *is* that reviewer's approval of those arguments. They execute once and the original
  request is denied ("replaced by an edit"), so the model's arguments never run. The model
  gets the result behind a note saying a reviewer replaced its call; a replayed resume (the
  paused checkpoint resumed again, whatever it answers) gets the edit's stored result behind
  the same note, never a denial.
* ``{"type": "reject", "message": ...}`` — denied in the store; nothing executes, ever.

The store is the one source of truth: the resumed call is gated again *before* the answer is
read, so a request already approved (or denied) with ``effectgate approve`` or the console
executes (or stays refused) whatever the resume says. An answer is bound to the request its
pause showed, as the checkpoint being resumed recorded it (the task's pending interrupt): one
whose request expired before it arrived approves nothing — the resumed call opens a new
request in its place, which nobody was shown, so the model is told that it waits (a call made
again pauses on it) — and so does a second resume of the paused checkpoint, which finds that
new request pending. (A checkpointer that cannot be read from inside the run falls back to
refusing only a request the resumed call's own begin opened.)
A malformed answer (``respond`` is not
offered: no human may stand in for an effect) is asked again with a second ``interrupt()``
whose value carries ``"error"``; nothing is recorded. Without a checkpointer (nothing could
resume) the model is told in text, as before; ``pause=True`` / ``False`` forces either.

This is **prevention**: what executes is the payload whose hash the approval is bound to —
the checkpointed call's arguments or a reviewer's edit — and the store checks that hash when
the approved call begins.

Callbacks (``on_tool_start``) are not offered as a form: they can abort a call but never answer
it with the stored result, nor record its outcome.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import operator
import threading
import typing
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from effectgate import ConfigError, EffectSpec, Gate, Outcome
from effectgate.decide import APPROVAL_REQUESTED
from effectgate.redact import REDACTED

from .._kernel import (
    Framework,
    GatedCall,
    OnRefusal,
    Refused,
    UngatedToolWarning,
    framework_context,
    invalid_arguments,
    model_arguments,
    read_declarations,
    report_ungated,
    requires_extra,
    resolve_gate,
)
from .._kernel import gate_tools as _gate_tools
from .._kernel.call import keep_refusal
from .._kernel.review import (
    DECISIONS,
    Replacement,
    Review,
    Verdict,
    aapply,
    apply,
    areplacement,
    replacement,
    review_of,
)
from .._kernel.vocabulary import TOOL_TEXTS

with requires_extra("langchain", "langchain"):
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.messages.tool import ToolOutputMixin
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, ToolException
    from pydantic import PrivateAttr, ValidationError
    from pydantic.v1 import ValidationError as V1ValidationError

log = logging.getLogger("effectgate")

__all__ = [
    "DEFAULT_APPROVER",
    "EffectGateMiddleware",
    "EffectRefusedToolError",
    "GatedTool",
    "ToolReportedError",
    "UngatedToolWarning",
    "classify_tool_exception",
    "gate_tool",
    "gate_tools",
    "hitl_request",
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


# -- approvals through LangGraph's interrupt() ----------------------------------------------

DEFAULT_APPROVER = "langgraph-resume"
"""Who a resumed approval is recorded as approved by when neither the decision (``"by"``) nor
the adapter (``approver=``) names the reviewer."""

_CHECKPOINTER = "__pregel_checkpointer"  # langgraph's CONFIG_KEY_CHECKPOINTER
_TASK_ID = "__pregel_task_id"  # langgraph's CONFIG_KEY_TASK_ID
_INTERRUPT = "__interrupt__"  # the channel of a task's pending interrupts in a checkpoint
_EDITED = (
    "Note: a human reviewer replaced this tool call before it ran. The call recorded in your "
    "message is the one you produced, not the one that executed. Do not re-issue your original "
    "call. Executed instead: {name} with arguments {args}.\n\nTool response:\n"
)
_REPLAYED_EDIT = (
    "Note: a human reviewer replaced this tool call before it ran. The call recorded in your "
    "message is the one you produced, not the one that executed. Do not re-issue your original "
    "call. Executed instead: {name} as the reviewer edited it (effect {key}).\n\n"
    "Tool response:\n"
)


def _can_pause(pause: bool | None, config: Mapping[str, Any] | None) -> bool:
    """Pause through ``interrupt()``? ``pause=None``: only inside a LangGraph run with a
    checkpointer (without one the pause could never be resumed)."""
    if pause is not None:
        return pause
    configurable = (config or {}).get("configurable") or {}
    return configurable.get(_CHECKPOINTER) is not None


def hitl_request(review: Review) -> dict[str, Any]:
    """The ``interrupt()`` value for one approval: LangChain's ``HITLRequest`` shape (what
    ``HumanInTheLoopMiddleware`` emits, so Agent Inbox and Agent Chat UI render it) with the
    approval it stands for under ``"effectgate"`` (approval id, payload hash, key)."""
    return {
        "action_requests": [{"name": review.tool_name, "args": review.arguments,
                             "description": review.description()}],
        "review_configs": [{"action_name": review.tool_name,
                            "allowed_decisions": list(DECISIONS)}],
        "effectgate": review.as_dict(),
    }


def _verdict(value: Any, review: Review, approver: str) -> Verdict:
    """The human's answer, from ``Command(resume=...)``: ``{"decisions": [decision]}`` (the
    ``HITLResponse`` shape) or one decision; ``ConfigError`` for anything else."""
    decision: Any = value
    if isinstance(value, Mapping) and "decisions" in value:
        decisions = value["decisions"]
        if not isinstance(decisions, list) or len(decisions) != 1:
            raise ConfigError("resume with exactly one decision for this tool call: "
                              '{"decisions": [{"type": "approve"}]}')
        decision = decisions[0]
    if not isinstance(decision, Mapping):
        raise ConfigError('a decision is a mapping such as {"type": "approve"}, not '
                          f"{type(decision).__name__}")
    kind = decision.get("type")
    if kind not in DECISIONS:
        raise ConfigError(f"a decision's type is one of {', '.join(DECISIONS)}, not {kind!r}")
    arguments = None
    if kind == "edit":
        action = decision.get("edited_action")
        if not isinstance(action, Mapping) or not isinstance(action.get("args"), Mapping):
            raise ConfigError('an edit needs "edited_action": {"name": ..., "args": {...}}')
        if action.get("name", review.tool_name) != review.tool_name:
            raise ConfigError(f"an edit cannot switch tools: {action.get('name')!r} is not "
                              f"{review.tool_name!r}")
        arguments = dict(action["args"])
    by = decision.get("by", approver)
    stated = {name: decision.get(name, value.get(name) if isinstance(value, Mapping) else None)
              for name in ("payload_hash", "approval_id")}
    return Verdict(kind, by=by, arguments=arguments, message=decision.get("message"),
                   **stated)


def _edit_note(name: str, arguments: Mapping[str, Any]) -> str:
    return _EDITED.format(name=name, args=json.dumps(dict(arguments), default=str,
                                                     sort_keys=True))


def _noted(out: Any, note: str | None) -> Any:
    """The edited call's answer with the reviewer's note in front (text results only: a text,
    a tool message's, a ``Command``'s tool message's, a stored ``Command``'s content)."""
    if note is None or isinstance(out, Refused):
        return out
    if isinstance(out, str):
        return note + out
    if isinstance(out, ToolMessage) and isinstance(out.content, str):
        return out.model_copy(update={"content": note + out.content})
    stored = _stored_command(out)
    if stored is not None:
        content = stored["content"]
        return {_COMMAND: {**stored, "content": note + content}} if isinstance(
            content, str) else out
    update: Any = getattr(out, "update", None)
    messages = update.get("messages") if isinstance(update, Mapping) else None
    if isinstance(messages, list) and _replaceable(out):
        noted = [_noted(m, note) if isinstance(m, ToolMessage) else m for m in messages]
        return dataclasses.replace(out, update={**update, "messages": noted})
    return out


def _paused_checkpoint(config: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any], Any]:
    """(checkpointer, the config of the checkpoint this task resumes from, the task's id);
    Nones where LangGraph did not say."""
    conf = (config or {}).get("configurable") or {}
    ns = str(conf.get("checkpoint_ns") or "")
    parent = ns.rsplit("|", 1)[0] if "|" in ns else ""
    checkpoint_id = (conf.get("checkpoint_map") or {}).get(parent)
    at = {"configurable": {"thread_id": conf.get("thread_id"), "checkpoint_ns": parent,
                           "checkpoint_id": checkpoint_id}}
    return conf.get(_CHECKPOINTER), at, conf.get(_TASK_ID)


def _shown(saved: Any, task_id: Any) -> frozenset[str] | None:
    """The approval ids the task's pending interrupts showed, as the checkpoint keeps them
    (written by its pause, never the resumer's say); None when they cannot be read."""
    if saved is None or task_id is None:
        return None
    shown = set()
    for task, channel, value in getattr(saved, "pending_writes", None) or ():
        if task != task_id or channel != _INTERRUPT:
            continue
        for pause in value if isinstance(value, (list, tuple)) else (value,):
            ours = getattr(pause, "value", None)
            ours = ours.get("effectgate") if isinstance(ours, Mapping) else None
            if isinstance(ours, Mapping) and isinstance(ours.get("approval_id"), str):
                shown.add(ours["approval_id"])
    return frozenset(shown) or None


def _shown_sync(config: Mapping[str, Any] | None) -> frozenset[str] | None:
    saver, at, task_id = _paused_checkpoint(config)
    try:
        return None if saver is None else _shown(saver.get_tuple(at), task_id)
    except Exception:  # a saver that reads only asynchronously, or none to read: no binding
        return None


async def _shown_async(config: Mapping[str, Any] | None) -> frozenset[str] | None:
    saver, at, task_id = _paused_checkpoint(config)
    try:
        return None if saver is None else _shown(await saver.aget_tuple(at), task_id)
    except Exception:
        return None


def _unseen(out: Refused, review: Review, shown: frozenset[str] | None) -> bool:
    """Whether the answer ``interrupt()`` handed over was given to another request than
    ``review``'s: one the paused task's checkpoint shows it did not show, or (where the
    checkpoint cannot say) one the resumed call's own begin opened (:func:`_opened`)."""
    return _opened(out) or (shown is not None and review.approval_id not in shown)


def _opened(out: Refused) -> bool:
    """Whether the begin that answered ``out`` opened its approval request. ``interrupt()``
    returning then hands over an answer given before that request existed: to a request that
    expired meanwhile (the resumed call opened this one in its place), or to none. It approves
    nothing: the call answers that the new request waits, and the model may ask again, which
    shows the reviewer this request."""
    return getattr(out.error, "reason", None) == APPROVAL_REQUESTED


class _Pauser:
    """One adapter's pause settings: whether to pause, and who approves on resume."""

    __slots__ = ("approver", "pause")

    def __init__(self, pause: bool | None, approver: str | None) -> None:
        if pause not in (None, True, False):
            raise ConfigError(f"pause must be None, True or False, not {pause!r}")
        if approver is not None and (not isinstance(approver, str) or not approver.strip()):
            raise ConfigError("approver must be a non-empty str")
        self.pause = pause
        self.approver = approver or DEFAULT_APPROVER

    def settle(self, gated: GatedCall, out: Any, arguments: Mapping[str, Any],
               config: Mapping[str, Any] | None, run: Callable[[GatedCall, Mapping[str, Any]],
                                                             Any],
               validate: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None) -> Any:
        """``out`` as the call's answer: an ``approval_required`` refusal pauses the run
        (``interrupt``) and, once resumed, the human's decision is carried out; a request a
        reviewer's edit replaced is answered with what the edit did."""
        if isinstance(out, Refused) and out.kind == "denied":
            return self._replaced(gated, out, replacement(gated, out, arguments))
        if not isinstance(out, Refused) or out.kind != "approval_required":
            return out
        if not _can_pause(self.pause, config):
            return gated.refuse(out)
        from langgraph.types import interrupt

        review = review_of(gated, out, arguments)
        verdict = self._ask(review, interrupt)
        if _unseen(out, review, _shown_sync(config)):
            return gated.refuse(out)
        answer = apply(gated, review, verdict, arguments, run, validate=validate)
        return self._finish(gated, answer, verdict)

    async def asettle(self, gated: GatedCall, out: Any, arguments: Mapping[str, Any],
                      config: Mapping[str, Any] | None, run: Callable[..., Any],
                      validate: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None) -> Any:
        """:meth:`settle` for async callers."""
        if isinstance(out, Refused) and out.kind == "denied":
            return self._replaced(gated, out, await areplacement(gated, out, arguments))
        if not isinstance(out, Refused) or out.kind != "approval_required":
            return out
        if not _can_pause(self.pause, config):
            return gated.refuse(out)
        from langgraph.types import interrupt

        review = await gated.spec.gate.store.on_worker(review_of, gated, out, arguments)
        verdict = self._ask(review, interrupt)
        if _unseen(out, review, await _shown_async(config)):
            return gated.refuse(out)
        answer = await aapply(gated, review, verdict, arguments, run, validate=validate)
        return self._finish(gated, answer, verdict)

    def _ask(self, review: Review, interrupt: Callable[[Any], Any]) -> Verdict:
        """Pause until the answer is a decision: a malformed one is asked again (a second
        ``interrupt()`` with ``"error"`` saying what was wrong), recording nothing."""
        request = hitl_request(review)
        while True:
            try:
                return _verdict(interrupt(request), review, self.approver)
            except ConfigError as err:
                request = {**hitl_request(review), "error": str(err)}

    @staticmethod
    def _replaced(gated: GatedCall, denied: Refused, edit: Replacement | None) -> Any:
        """A denied call: what the edit that replaced it did (a replayed resume), behind the
        reviewer's note; else the denial."""
        if edit is None:
            return gated.refuse(denied)
        if isinstance(edit.answer, Refused):
            return gated.refuse(edit.answer)
        return _noted(edit.answer, _REPLAYED_EDIT.format(name=gated.tool_name, key=edit.key))

    @staticmethod
    def _finish(gated: GatedCall, answer: Any, verdict: Verdict) -> Any:
        if isinstance(answer, Refused):
            return gated.refuse(answer)
        if verdict.kind == "edit" and verdict.arguments is not None:
            return _noted(answer, _edit_note(gated.tool_name, verdict.arguments))
        return answer


def _call_arguments(tool: BaseTool, raw: Mapping[str, Any],
                    visible: frozenset[str] | None) -> dict[str, Any]:
    """The arguments a call of ``tool`` runs with, by name, validated as the tool validates
    them when it runs: by its own ``args_schema`` (its validators, its ``model_config``, its
    aliases), or, where arguments are injected after the model's (state, the call id), by the
    schema the model sees, which LangChain rebuilds from the fields alone; only the
    ``visible`` ones (:func:`_visible_fields`, read once per tool). Raises pydantic's
    ``ValidationError`` (``pydantic.v1``'s for a v1 schema)."""
    schema: Any = tool.args_schema
    if not hasattr(schema, "parse_obj") or tool._injected_args_keys:
        schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return dict(raw)
    if hasattr(schema, "model_validate"):
        arguments = model_arguments(schema, raw)
    else:  # a pydantic.v1 model, which LangChain still takes
        validated = schema.parse_obj(dict(raw))
        arguments = {name: getattr(validated, name) for name in schema.__fields__}
    return arguments if visible is None else {
        k: v for k, v in arguments.items() if k in visible}


def _by_alias(schema: Any, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` (by field name) keyed as ``schema`` reads them: a field's validation
    alias, or its alias, where it has one (a plain name where it has none)."""
    fields = getattr(schema, "model_fields", None)
    if not isinstance(fields, Mapping):
        return dict(arguments)
    out: dict[str, Any] = {}
    for name, value in arguments.items():
        field = fields.get(name)
        alias = getattr(field, "validation_alias", None)
        if not isinstance(alias, str):
            alias = getattr(field, "alias", None)
        out[alias if isinstance(alias, str) else name] = value
    return out


class _Shape(typing.NamedTuple):
    """What a gate reads of one tool object once: the argument names the model sends, read
    from the ``args_schema`` that ``schema`` returns (re-read when the tool's is another one).
    Nothing here holds the tool: its validator is made at each call (:func:`_validator`)."""

    visible: frozenset[str] | None
    schema: Callable[[], Any]


def _held(schema: Any) -> Callable[[], Any]:
    """``schema``, weakly where it can be (a model class an agent built per request made)."""
    try:
        return weakref.ref(schema)
    except TypeError:  # a dict's JSON schema, None: small, and no tool in it
        return lambda: schema


class _Shapes:
    """The :class:`_Shape` of each tool object a middleware gates, found by the object, never by
    its name: two agents sharing a middleware may each have a tool of one name with other
    arguments (the second was validated, and its payload hashed, by the first one's names).
    Tools are held weakly: an agent built per request does not keep its tools alive here. A
    tool given another ``args_schema`` since is read again."""

    def __init__(self) -> None:
        self._by_name: dict[str, list[tuple[weakref.ref[BaseTool], _Shape]]] = {}
        self._lock = threading.Lock()

    def of(self, tool: BaseTool, spec: EffectSpec) -> _Shape:
        """``tool``'s shape, read on first sight (``EffectKeyError`` when ``spec``'s key
        template names an argument the tool does not take, as :func:`gate_tool` raises)."""
        schema = tool.args_schema
        for ref, shape in self._by_name.get(tool.name, ()):
            if ref() is tool and shape.schema() is schema:
                return shape
        visible = _visible_fields(tool)
        if visible is not None:
            spec.check_names(visible, f"tool {tool.name!r}")
        shape = _Shape(visible, _held(schema))
        with self._lock:
            kept = [(r, s) for r, s in self._by_name.get(tool.name, ())
                    if r() is not None and r() is not tool]
            self._by_name[tool.name] = [*kept, (weakref.ref(tool), shape)]
        return shape


def _validator(tool: BaseTool, visible: frozenset[str] | None,
               ) -> Callable[[Mapping[str, Any]], Mapping[str, Any]]:
    """Check a reviewer's edited arguments against the schema the model sees."""

    def validate(raw: Mapping[str, Any]) -> Mapping[str, Any]:
        if visible is not None:
            unknown = sorted(set(raw) - visible)
            if unknown:
                raise ConfigError(f"unknown arguments: {', '.join(unknown)}")
        return _call_arguments(tool, raw, visible)

    return validate


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
    _sync_only: bool = PrivateAttr(default=False)
    _call_id: tuple[str, bool] | None = PrivateAttr(default=None)
    _pauser: _Pauser = PrivateAttr(default_factory=lambda: _Pauser(None, None))
    _validate: Any = PrivateAttr(default=None)

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

    def _output(self, out: Any, kwargs: Mapping[str, Any]) -> Any:
        if isinstance(out, Refused):
            raise EffectRefusedToolError(out)
        call_id = _call_id_of(self._call_id, kwargs)
        if out is not None and not isinstance(out, (str, list)):  # (a text: nothing to do)
            # A twin's answer (its leader's), or a stored one, as this call's own.
            out = _readdressed(out, call_id, _state_of(self._call_id, kwargs), self.name,
                               _same_call(self.inner, self._visible, self._gated.spec))
        if self.response_format == "content_and_artifact" and isinstance(out, list):
            return tuple(out) if len(out) == 2 else (out, None)
        return out

    def _run(self, *args: Any, config: RunnableConfig, run_manager: Any = None,
             **kwargs: Any) -> Any:
        inner = self.inner
        if getattr(inner, "func", True) is None:  # a coroutine-only StructuredTool
            raise NotImplementedError(f"tool {self.name!r} is async only: use ainvoke")
        def run(gated: GatedCall, arguments: Mapping[str, Any]) -> Any:
            call = self._with({**kwargs, **arguments}, self._sync_extra, config, run_manager)
            return gated.run(arguments, lambda: _fresh(inner._run(**call)))

        arguments = self._arguments(kwargs)
        with framework_context(*_context(config)):
            out = self._pauser.settle(self._gated, run(self._gated, arguments), arguments,
                                      config, run, self._validate)
        return self._output(out, kwargs)

    async def _arun(self, *args: Any, config: RunnableConfig, run_manager: Any = None,
                    **kwargs: Any) -> Any:
        inner = self.inner

        async def run(gated: GatedCall, arguments: Mapping[str, Any]) -> Any:
            given = {**kwargs, **arguments}
            if self._sync_only:  # LangChain would run _run on a thread: do it all in one hop
                manager = run_manager.get_sync() if run_manager is not None else None
                sync_call = self._with(given, self._sync_extra, config, manager)
                return await gated.arun_sync(arguments,
                                             lambda: _fresh(inner._run(**sync_call)))
            call = self._with(given, self._async_extra, config, run_manager)
            return await gated.arun(arguments, lambda: _afresh(inner._arun(**call)))

        arguments = self._arguments(kwargs)
        with framework_context(*_context(config)):
            out = await self._pauser.asettle(self._gated, await run(self._gated, arguments),
                                             arguments, config, run, self._validate)
        return self._output(out, kwargs)


_ANSWER_OF = "effectgate_answer_of"
"""A re-addressed tool message's ``response_metadata`` entry: the call whose answer it repeats
(whose ``Command`` updates a run holding this message holds too: :func:`_applied`)."""

_APPLIED = "effectgate_applied"
"""A state channel: the calls whose ``Command`` updates the state holds (an answer carrying
them adds its call). :class:`EffectGateMiddleware` declares it, private (in no input or
output); a ``gate_tool`` tool writes it too, which a state without it ignores. No middleware
that trims or summarises the messages removes it; a checkpoint taken before the updates lacks
it."""


def _addressed(message: ToolMessage, call_id: Any) -> ToolMessage:
    """``message`` answering the call ``call_id`` (a twin gets its leader's message, as a new
    message: LangGraph keeps one message per id, so a shared id would erase one answer),
    marked with the call it first answered (:data:`_ANSWER_OF`)."""
    if isinstance(call_id, str) and message.tool_call_id != call_id:
        metadata = {_ANSWER_OF: _origin(message), **message.response_metadata}
        return message.model_copy(update={"tool_call_id": call_id, "id": None,
                                          "response_metadata": metadata})
    return message


def _origin(message: ToolMessage) -> Any:
    """The call whose answer ``message`` is: its own, or the one it repeats."""
    return message.response_metadata.get(_ANSWER_OF, message.tool_call_id)


_Same = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
"""Whether two tool calls propose one effect (:func:`_same_call`)."""


def _readdressed(out: Any, call_id: Any, state: Any, name: str,
                 same: _Same | None = None) -> Any:
    """A tool's answer as the answer of the call ``call_id``, in a run whose state is ``state``.

    A twin's copy of its leader's ``ToolMessage`` is re-addressed. Of its leader's ``Command``:
    in the leader's own run (the leader's call is one of ``state``'s, so its updates are applied
    there once) the command's tool message alone, re-addressed; in another run the whole
    command, its tool message re-addressed, since that run's state has none of its updates
    (:func:`_applied`, which ``same`` tells a twin of the same turn). A stored ``Command``
    (:func:`_command_form`) is rebuilt the same way (:func:`_rebuilt`). Where ``state`` is
    unknown, a twin or a repeat gets the tool message alone. A command carrying updates
    records its call in :data:`_APPLIED`. A body's own plain result, or one the store kept
    escaped, is handed back as it was (:func:`_fresh`).
    """
    if isinstance(out, ToolMessage):
        return _addressed(out, call_id)
    if isinstance(out, _Fresh):
        return out.value
    if _is_form(out, _VALUE):
        return out[_VALUE]
    stored = _stored_command(out)
    if stored is not None:
        return _rebuilt(stored, call_id, state, name, same)
    update: Any = getattr(out, "update", None)
    messages = update.get("messages") if isinstance(update, Mapping) else None
    if not isinstance(call_id, str) or not isinstance(messages, list):
        return out
    answers = [m for m in messages if isinstance(m, ToolMessage)]
    if not answers:
        return out
    if any(m.tool_call_id == call_id for m in answers):  # the call's own command
        return out if state is None else _recorded(out, call_id)
    leader = answers[0]
    if _applied(state, _origin(leader), call_id, same) is not False:
        return _addressed(leader, call_id)
    own = [_addressed(m, call_id) if m is leader else m for m in messages]
    return _recorded(dataclasses.replace(out, update={**update, "messages": own}),
                     _origin(leader))


def _recorded(command: Any, origin: Any) -> Any:
    """``command`` adding ``origin`` to :data:`_APPLIED` where it updates more than the
    messages (a command that is not a dataclass, or names the channel itself, as it is)."""
    update = getattr(command, "update", None)
    if (not isinstance(origin, str) or not isinstance(update, Mapping) or _APPLIED in update
            or not _replaceable(command)
            or all(k == "messages" for k in update)):
        return command
    return dataclasses.replace(command, update={**update, _APPLIED: [origin]})


def _replaceable(command: Any) -> bool:
    """Whether ``command`` is a dataclass instance (a LangGraph ``Command``) to copy changed."""
    return dataclasses.is_dataclass(command) and not isinstance(command, type)


_COMMAND = "effectgate.langchain.Command"
"""The one key of a stored ``Command``'s form (:func:`_command_form`)."""

_VALUE = "effectgate.langchain.value"
"""The one key of a plain result stored escaped: one that reads like a stored form."""


class _Fresh:
    """A body's own result that reads like a stored form (:func:`_fresh`): handed back and
    stored as the plain value it is, never read as a ``Command``."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _fresh(value: Any) -> Any:
    """A gated tool's own result, marked :class:`_Fresh` where it reads like a stored form
    (a dict whose one key is :data:`_COMMAND` or :data:`_VALUE`): a tool passing on a vendor's
    JSON must not write the agent's state, nor lose its answer to the form's ``content``."""
    return _Fresh(value) if isinstance(value, dict) and _looks_stored(value) else value


async def _afresh(pending: typing.Awaitable[Any]) -> Any:
    """:func:`_fresh` of an awaited result."""
    return _fresh(await pending)


def _looks_stored(value: Any) -> bool:
    """Whether ``value`` reads like a stored form (its JSON is a one-key :data:`_COMMAND` or
    :data:`_VALUE` object)."""
    return (isinstance(value, Mapping) and len(value) == 1
            and (_COMMAND in value or _VALUE in value))


def _is_form(out: Any, key: str) -> bool:
    """Whether ``out`` is a stored form whose one key is ``key`` (stored JSON: a dict)."""
    return isinstance(out, dict) and len(out) == 1 and key in out


def _command_form(out: Any) -> dict[str, Any] | None:
    """What is stored of a ``Command`` a tool returned: ``{_COMMAND: {"tool_call_id",
    "content", "update"}}`` — its tool message's call id and content, and its other state
    updates where they are plain JSON that reads back equal (``None`` when they are not, or the
    command carries more than its one tool message: other messages, ``goto``, ``graph``,
    ``resume``). None for a command with no single tool message."""
    update: Any = getattr(out, "update", None)
    messages = update.get("messages") if isinstance(update, Mapping) else None
    if not isinstance(messages, list):
        return None
    answers = [m for m in messages if isinstance(m, ToolMessage)]
    if len(answers) != 1:
        return None
    rest = {k: v for k, v in update.items() if k not in ("messages", _APPLIED)}
    plain = (len(messages) == 1 and getattr(out, "graph", None) is None
             and not getattr(out, "goto", None) and getattr(out, "resume", None) is None
             and _reads_back(rest))
    return {_COMMAND: {"tool_call_id": _origin(answers[0]),
                       "content": answers[0].content, "update": rest if plain else None}}


def _reads_back(value: Any) -> bool:
    """Whether ``value`` is plain JSON that a repeat reads back equal (no tuple, model, date,
    non-string key): what it stores is what a later run's state gets."""
    try:
        return bool(json.loads(json.dumps(value, allow_nan=False)) == value)
    except (TypeError, ValueError, RecursionError):
        return False


def _redacted(value: Any) -> bool:
    """Whether ``value`` holds :data:`effectgate.redact.REDACTED` anywhere (a field the
    policy's ``redact_result`` names): a state given that would hold the placeholder."""
    if isinstance(value, Mapping):
        return any(_redacted(v) for v in value.values())
    if isinstance(value, list):
        return any(_redacted(v) for v in value)
    return bool(value == REDACTED)


def _stored_command(out: Any) -> Mapping[str, Any] | None:
    """The fields of a stored ``Command``'s form (a repeat's stored result), else None."""
    if not _is_form(out, _COMMAND):
        return None
    fields = out[_COMMAND]
    return fields if isinstance(fields, Mapping) and "content" in fields else None


def _rebuilt(stored: Mapping[str, Any], call_id: Any, state: Any, name: str,
             same: _Same | None = None) -> Any:
    """A stored ``Command`` as the answer of the call ``call_id``: its tool message, re-addressed,
    plus its stored state updates where ``state`` does not hold them yet (a later run, or a
    replay of the very call whose updates were never applied) and none was redacted in the
    store (its placeholder is no value to give). Without a call id to answer, the content
    alone (the tool's output)."""
    content = stored["content"]
    if not isinstance(call_id, str):
        return content
    origin = stored.get("tool_call_id")
    message = ToolMessage(content=content if content is not None else TOOL_TEXTS["stored_none"],
                          tool_call_id=call_id, name=name,
                          response_metadata={_ANSWER_OF: origin} if origin != call_id else {})
    update = stored.get("update")
    if (not isinstance(update, Mapping) or _redacted(update)
            or _applied(state, origin, call_id, same) is not False):
        return message
    from langgraph.types import Command  # only a tool that returned one stored this form

    return _recorded(Command(update={**update, "messages": [message]}), origin)


def _applied(state: Any, origin: Any, call_id: str, same: _Same | None = None) -> bool | None:
    """Whether ``state`` (the state the call ``call_id`` runs against) holds, or is about to
    hold, the updates of the call ``origin``: :data:`_APPLIED` names it; its answer (or a repeat
    of it, marked :data:`_ANSWER_OF`) is in the messages; (another call) it is one of their tool
    calls, answered in this very step; or an earlier call of ``call_id``'s own turn is its twin
    (``same``), which gets them. A replay of ``call_id`` itself finds its answer missing where
    its updates were never applied. None where ``state`` has no messages to read."""
    if not isinstance(origin, str):
        return None
    held = _read(state, _APPLIED)
    if isinstance(held, list) and origin in held:
        return True
    messages = _read(state, "messages")
    if not isinstance(messages, list):
        return None
    turn: AIMessage | None = None
    for message in messages:
        if isinstance(message, ToolMessage) and origin in (message.tool_call_id,
                                                          _origin(message)):
            return True
        if isinstance(message, AIMessage):
            ids = [c.get("id") for c in message.tool_calls]
            if origin != call_id and origin in ids:
                return True
            if call_id in ids:
                turn = message
    return turn is not None and same is not None and _after_twin(
        turn, call_id, same, _answered(messages, state))


def _read(state: Any, name: str) -> Any:
    """``state``'s ``name`` (a mapping's entry or an object's attribute); None without."""
    return state.get(name) if isinstance(state, Mapping) else getattr(state, name, None)


_HITL_EDITS = "hitl_edited_tool_calls"
"""``HumanInTheLoopMiddleware``'s state entry: the calls of the turn a reviewer edited (their
message keeps the model's arguments; the edited ones run)."""


def _answered(messages: list[Any], state: Any) -> frozenset[Any]:
    """The calls that will not run as the model wrote them in this step: answered before it
    (a human's rejection or response is a tool message already in the state) or edited."""
    edits = _read(state, _HITL_EDITS)
    return frozenset([m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
                     + (list(edits) if isinstance(edits, Mapping) else []))


def _after_twin(turn: AIMessage, call_id: str, same: _Same,
                answered: frozenset[Any] = frozenset()) -> bool:
    """Whether a call of ``turn`` before ``call_id`` proposes its effect: that twin, answered
    the same in this very step, gives the run the updates (never both). A call in
    ``answered`` (rejected or edited by a human: it is not that effect) is no twin."""
    calls = turn.tool_calls
    own = next(c for c in calls if c.get("id") == call_id)
    for other in calls:
        if other.get("id") == call_id:
            return False
        if other.get("id") not in answered and same(own, other):
            return True
    return False


def _same_call(tool: BaseTool, visible: frozenset[str] | None, spec: EffectSpec) -> _Same:
    """Whether two calls of ``tool`` propose one effect: one key and one payload, as the
    store reads them (a call its tool does not validate or key proposes none)."""
    template = spec.template

    def same(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
        if one.get("name") != other.get("name"):
            return False
        if one.get("args") == other.get("args"):
            return True
        try:
            a, b = (_call_arguments(tool, c.get("args") or {}, visible) for c in (one, other))
            return bool(template.render(a) == template.render(b)
                        and template.normalise(a) == template.normalise(b))
        except Exception:  # invalid or unkeyable: the gate refuses it, it gets no updates
            return False

    return same


def _call_id_parameter(tool: BaseTool) -> tuple[str, bool] | None:
    """The argument a tool learns its call's id from, if any: (its name, whether it is a
    ``ToolRuntime``, whose ``tool_call_id`` holds it, rather than an ``InjectedToolCallId``)."""
    fields = getattr(tool.args_schema, "model_fields", None) or {}
    for name, info in fields.items():
        if _is_runtime(getattr(info, "annotation", None)):
            return str(name), True
        for mark in getattr(info, "metadata", ()):
            kind = mark if isinstance(mark, type) else type(mark)
            if issubclass(kind, InjectedToolCallId):
                return str(name), False
    return None


def _is_runtime(annotation: Any) -> bool:
    """Whether ``annotation`` is LangGraph's ``ToolRuntime``, bare or parametrised
    (``ToolRuntime[Ctx]``), also inside ``Annotated`` or ``Optional``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_runtime(typing.get_args(annotation)[0])
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        return any(_is_runtime(arg) for arg in typing.get_args(annotation))
    base = origin or annotation
    return isinstance(base, type) and any(
        c.__name__ == "ToolRuntime" and c.__module__.startswith("langgraph")
        for c in base.__mro__)


def _state_of(parameter: tuple[str, bool] | None, kwargs: Mapping[str, Any]) -> Any:
    """The graph state a tool was given with its ``ToolRuntime`` (None without one)."""
    if parameter is None or not parameter[1]:
        return None
    return getattr(kwargs.get(parameter[0]), "state", None)


def _call_id_of(parameter: tuple[str, bool] | None, kwargs: Mapping[str, Any]) -> Any:
    """The id of the call a tool was given ``kwargs`` for (None when it is not told)."""
    if parameter is None:
        return None
    value = kwargs.get(parameter[0])
    return getattr(value, "tool_call_id", None) if parameter[1] else value


def _runs_on_a_thread(tool: BaseTool) -> bool:
    """True when LangChain's async path would run the tool's sync ``_run`` on a thread."""
    if isinstance(tool, StructuredTool):
        return tool.coroutine is None and tool.func is not None
    return type(tool)._arun is BaseTool._arun


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


def classify_tool_exception(exc: BaseException) -> Outcome | None:
    """A classifier for tools whose ``ToolException`` s are raised before anything happened
    (validation, a refused precondition): ``ToolException`` → FAILED, anything else no opinion.

    Declare it where that holds: ``gate_tool(tool, key, classifiers=(classify_tool_exception,))``.
    The tool's own ``handle_tool_error`` then answers the model, as it would ungated.
    """
    return Outcome.FAILED if isinstance(exc, ToolException) else None


def _handler(inner: BaseTool) -> Any:
    """The gated tool's ``handle_tool_error``: a refusal becomes its message; any other
    ``ToolException`` (one classified FAILED) is handled as the inner tool would have."""
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
    """What the gate stores: a ToolMessage's content rather than the message, a ``Command``'s
    form (:func:`_command_form`: its tool message's content, and its other state updates where
    they are plain JSON), then the user's ``redact`` of that; any other result that reads like
    a stored form, escaped (``{_VALUE: result}``)."""

    def redact(out: Any) -> Any:
        value: Any
        if isinstance(out, _Fresh):
            out = out.value
        command = False
        if isinstance(out, ToolMessage):
            value = out.content
        elif isinstance(out, ToolOutputMixin):
            value, command = _command_form(out), True
        else:
            value = out
        if user_redact is not None:
            value = user_redact(value)
        # A plain result that reads like a stored form is kept escaped (_fresh).
        return {_VALUE: value} if not command and _looks_stored(value) else value

    return redact


def gate_tool(tool: BaseTool, key: str, *, gate: Gate | None = None,
              effect_type: str | None = None, on_refusal: OnRefusal = "message",
              pause: bool | None = None, approver: str | None = None,
              **effect_options: Any) -> GatedTool:
    """Gate a LangChain tool under the key template ``key`` (``"refund:{txn_id}"``).

    Returns a ``BaseTool`` the model cannot tell apart from ``tool``. ``effect_type`` defaults
    to the tool's name; ``effect_options`` are :class:`effectgate.EffectSpec` options
    (``vendor``, ``lease_seconds``, ``max_attempts``, ``cost_micros``, ``redact``...).
    ``gate=None`` uses the process-wide default gate (``$EFFECTGATE_URL``).

    ``pause``: answer ``approval_required`` with LangGraph's ``interrupt()`` (see the module
    docstring); ``None`` (default) pauses inside a LangGraph run that has a checkpointer and
    answers with text elsewhere. ``approver``: who a resumed approval is recorded as decided
    by when the decision does not say (``"by"``); default :data:`DEFAULT_APPROVER`.
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
    wrapped._gated = GatedCall(spec, tool.name, on_refusal=on_refusal,
                               reraise_failed=(ToolException,), pause=keep_refusal)
    wrapped._pauser = _Pauser(pause, approver)
    wrapped._validate = _validator(tool, visible)
    wrapped._visible = visible
    wrapped._sync_extra = _extra_parameters(tool._run)
    wrapped._async_extra = _extra_parameters(tool._arun)
    wrapped._sync_only = _runs_on_a_thread(tool)
    wrapped._call_id = _call_id_parameter(tool)
    return wrapped


_FRAMEWORK = Framework("langchain", tool_name=lambda t: t.name,
                       is_gated=lambda t: isinstance(t, GatedTool), wrap=gate_tool)


def gate_tools(tools: Iterable[BaseTool], effects: Any, *, gate: Gate | None = None,
               strict: bool = False, read_only: Iterable[str] = (),
               on_refusal: OnRefusal = "message", pause: bool | None = None,
               approver: str | None = None) -> list[BaseTool]:
    """Gate the declared tools of a list and pass the rest through, in order.

    ``effects``: tool name → key template, → ``{"key": ..., **options}``, or → None (read-only);
    or an :class:`effectgate.Policy` whose rules name their ``tools`` (the gate must carry that
    policy). Every tool left ungated is reported once by name (an :class:`UngatedToolWarning`
    and a log line); ``strict=True`` (or ``policy.strict``) refuses them with ``ConfigError``.
    ``pause`` and ``approver``: as for :func:`gate_tool`.
    """
    return _gate_tools(_FRAMEWORK, tools, effects, gate=gate, strict=strict,
                       read_only=read_only, on_refusal=on_refusal,
                       wrap_options={"pause": pause, "approver": approver})


def _gate_state(base: type) -> type:
    """The agent state ``base`` plus the private :data:`_APPLIED` channel (a list of call ids,
    appended to), built from the objects themselves: this module's annotations are strings
    that would be read in its globals, which hold no ``langchain.agents``."""
    from langchain.agents.middleware.types import PrivateStateAttr

    channel = typing.NotRequired[typing.Annotated[list[str], PrivateStateAttr, operator.add]]
    namespace = {"__annotations__": {_APPLIED: channel}, "__module__": __name__}
    return type(base)("EffectGateState", (base,), namespace)


def _middleware_class() -> type:
    with requires_extra("langchain", "langchain"):
        from langchain.agents.middleware import AgentMiddleware, AgentState

    class EffectGateMiddleware(AgentMiddleware):
        """Gate the tool calls of a ``create_agent`` agent by tool name.

        ``effects`` as for :func:`gate_tools` (mapping or Policy). Tools it does not name run
        ungated and are reported once, when first seen; ``strict=True`` refuses to
        start the agent instead. Tools already wrapped by :func:`gate_tool` pass through.
        """

        # Where the agent's state records the calls whose Command updates it holds.
        state_schema = _gate_state(AgentState)

        def __init__(self, effects: Any, *, gate: Gate | None = None, strict: bool = False,
                     read_only: Iterable[str] = (), on_refusal: OnRefusal = "message",
                     pause: bool | None = None, approver: str | None = None) -> None:
            super().__init__()
            self._pauser = _Pauser(pause, approver)
            # A declaration is found by the tool's name; what a tool takes, by the tool itself.
            self._shapes = _Shapes()
            self.effects = effects
            self.gate = resolve_gate(gate)
            self.strict = strict
            self.read_only = tuple(read_only)
            self.on_refusal = on_refusal
            # Every tool is resolved by name the first time it is seen (a model call's tools,
            # or a call of it): never a set frozen at the first sight, which a middleware
            # shared by two agents, a dynamic tool list or a run resumed at its tools would
            # leave without the tools it did not see then.
            self._calls: dict[str, GatedCall | None] = {}  # by tool name; None: not gated
            self._lock = threading.Lock()
            # A tool the caller wrapped itself (gate_tool) passes through by what it is, never
            # by its name: another agent's plain tool of that name is still gated or reported.
            self._declared = read_declarations(effects, gate=self.gate, read_only=self.read_only)

        # -- seeing the tools --------------------------------------------------------------

        def _setup(self, tools: Sequence[Any]) -> None:
            """Resolve each tool not seen before: gated as declared, passed through (read
            only, already gated), or reported ungated once (refused with ``strict``)."""
            plain = [t for t in tools if isinstance(t, BaseTool) and not isinstance(t, GatedTool)]
            self._resolve([t for t in plain if t.name not in self._calls])
            for tool in plain:  # each tool object by its own arguments (ConfigError on a miss)
                gated = self._calls.get(tool.name)
                if gated is not None:
                    self._shapes.of(tool, gated.spec)

        def _resolve(self, new: Sequence[BaseTool]) -> None:
            """Find each new tool name's declaration (once per name); report the ungated."""
            if not new:
                return
            with self._lock:
                resolved: dict[str, GatedCall | None] = {}
                ungated: list[str] = []
                for tool in new:
                    if tool.name in self._calls or tool.name in resolved:
                        continue
                    resolved[tool.name] = gated = self._gated_call(tool)
                    if gated is None and tool.name not in self._declared.read_only:
                        ungated.append(tool.name)
                report_ungated("langchain", ungated,
                               strict=self.strict or self._declared.strict)
                self._calls.update(resolved)  # only once reported: strict refuses it again

        def _gated_call(self, tool: BaseTool) -> GatedCall | None:
            name = tool.name
            entry = self._declared.effects.get(name)
            if name in self._declared.read_only or entry is None:
                return None
            on_refusal = entry.adapter_options().get("on_refusal", self.on_refusal)
            redact = _store_form(entry.effect_options().get("redact"))
            spec = entry.build(self.gate, redact=redact)
            self._shapes.of(tool, spec)  # the first tool of this name must fit the template too
            return GatedCall(spec, name, on_refusal=on_refusal,
                             reraise_failed=(ToolException,), pause=keep_refusal)

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            self._setup(request.tools)
            return handler(request)

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            self._setup(request.tools)
            return await handler(request)

        # -- gating a call --------------------------------------------------------------------

        def _prepare(self, request: Any,
                     ) -> tuple[GatedCall, _Shape, dict[str, Any] | Refused] | None:
            """The gated call, the tool's shape and its arguments (or their refusal: a call
            the gate cannot key never runs); None for a call this middleware does not gate."""
            tool = request.tool
            if tool is None or isinstance(tool, GatedTool):
                return None
            self._setup([tool])
            gated = self._calls.get(tool.name)
            if gated is None:
                return None
            shape = self._shapes.of(tool, gated.spec)
            try:
                return gated, shape, _call_arguments(
                    tool, request.tool_call.get("args") or {}, shape.visible)
            except (ValidationError, V1ValidationError) as err:
                return gated, shape, invalid_arguments(tool.name, err)

        def _answer(self, out: Any, request: Any, gated: GatedCall | None = None,
                    visible: frozenset[str] | None = None) -> Any:
            call = request.tool_call
            if isinstance(out, Refused):
                return ToolMessage(content=out.message, tool_call_id=call["id"],
                                   name=call["name"], status="error")
            if not isinstance(out, (str, list)) and out is not None:
                # its own, a twin's leader's or a stored Command
                same = None if gated is None else _same_call(request.tool, visible,
                                                             gated.spec)
                return _readdressed(out, call["id"], getattr(request, "state", None),
                                    call["name"], same)
            content = out if out is not None else TOOL_TEXTS["stored_none"]
            return ToolMessage(content=content, tool_call_id=call["id"], name=call["name"])

        @staticmethod
        def _request_for(request: Any, original: Mapping[str, Any],
                         arguments: Mapping[str, Any]) -> Any:
            """The request to run: the model's, or one carrying a reviewer's edited args —
            those alone, by the names the tool's schema reads (an alias where it has one),
            never merged with the model's: a model's alias beside an edited field name was
            the one the tool read, so the denied arguments ran."""
            if arguments is original:
                return request
            call = request.tool_call
            args = _by_alias(request.tool.args_schema, arguments)
            return request.override(tool_call={**call, "args": args})

        def _unseen(self, request: Any) -> Any:
            """The answer to a call of a declared tool that reaches this middleware with no
            tool object (``request.tool`` None: a middleware after this one supplies it, as
            LangChain's dynamic tools do), else None. The gate cannot validate or key what it
            cannot see, and passed on, the later middleware ran it ungated — twice for two
            calls, unrecorded, even under ``strict``: it is refused, and nothing runs. Under
            ``strict``, so is an undeclared one (strict runs no tool ungated)."""
            if request.tool is not None:
                return None
            name = request.tool_call.get("name")
            if not isinstance(name, str) or name in self._declared.read_only:
                return None
            entry = self._declared.effects.get(name)
            if entry is not None:
                text = (f"tool {name!r} has an effect declared, but reached the effect gate with "
                        "no tool to gate (a later middleware supplies it); it was not run. Put "
                        "EffectGateMiddleware after the middleware that supplies the tool")
                on_refusal = entry.adapter_options().get("on_refusal", self.on_refusal)
            elif self.strict or self._declared.strict:  # undeclared: strict runs none ungated
                text = (f"strict mode: tool {name!r} has no effect declared and reached the "
                        "effect gate with no tool object (a later middleware supplies it, or "
                        "no such tool exists); it was not run. Declare a key template for it, "
                        "or list it as read_only if it only reads")
                on_refusal = self.on_refusal
            else:
                return None
            log.warning("%s", text, extra={"tool": name})
            refused = Refused.of("denied", text)
            if on_refusal == "raise":
                raise refused.error
            return self._answer(refused, request)

        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            unseen = self._unseen(request)
            if unseen is not None:
                return unseen
            prepared = self._prepare(request)
            if prepared is None:
                return handler(request)
            gated, shape, arguments = prepared
            if isinstance(arguments, Refused):
                return self._answer(gated.refuse(arguments), request)
            config = getattr(request.runtime, "config", None)

            def run(one: GatedCall, args: Mapping[str, Any]) -> Any:
                chosen = self._request_for(request, arguments, args)
                return one.run(args, lambda: _checked(handler(chosen)))

            with framework_context(*_context(config)):
                out = self._pauser.settle(gated, run(gated, arguments), arguments, config,
                                          run, _validator(request.tool, shape.visible))
            return self._answer(out, request, gated, shape.visible)

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            unseen = self._unseen(request)
            if unseen is not None:
                return unseen
            prepared = self._prepare(request)
            if prepared is None:
                return await handler(request)
            gated, shape, arguments = prepared
            if isinstance(arguments, Refused):
                return self._answer(gated.refuse(arguments), request)
            config = getattr(request.runtime, "config", None)

            async def run(one: GatedCall, args: Mapping[str, Any]) -> Any:
                chosen = self._request_for(request, arguments, args)

                async def body() -> Any:
                    return _checked(await handler(chosen))

                return await one.arun(args, body)

            with framework_context(*_context(config)):
                out = await self._pauser.asettle(gated, await run(gated, arguments), arguments,
                                                 config, run,
                                                 _validator(request.tool, shape.visible))
            return self._answer(out, request, gated, shape.visible)

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
