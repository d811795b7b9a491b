"""Microsoft Agent Framework (``agent-framework-core``, package ``agent_framework``): function
middleware that gates declared tools, and approvals through the framework's own function
approval requests.

``EffectGateMiddleware(effects, gate=gate)`` goes where agent middleware goes
(``Agent(..., middleware=[...])`` or ``agent.run(..., middleware=[...])``). It is a
``MiddlewareBundle`` of two members that only work together:

* a **function middleware** that sees every tool call: a declared tool's call is reserved in the
  store before ``call_next()`` runs the function and its outcome recorded after; a duplicate is
  answered from the store **without calling the function**, as though it had just run; two
  identical calls in one turn run once and both get the result. Every other answer is the
  tool result the model reads (wait, do not retry, ask a human). Tools are not wrapped, so the
  model is sent exactly the tool definitions it would be sent without the gate;
* an **agent middleware** that, as each run starts, reports once by name every function tool of
  the agent (and of the run) that has no effect declared, or with ``strict=True`` (or
  ``policy.strict``) refuses the run with ``ConfigError`` before any tool runs; it also hands the
  agent's name to the function middleware (the effect's ``agent_id``). The session id becomes
  the effect's ``run_id``.

Arguments reach the gate as the framework validated them against the tool's input model
(``"500"`` is ``500``, defaults filled in; an input model's fields by name or by alias).
Arguments the input model does not validate are refused (the model is told which, and the
function never runs): a middleware that repairs arguments goes before this one. So are
arguments that name a variable of the experimental ``agent_framework.security`` (untrusted
content the model sees only as an id, replaced with its value after every function middleware
has run: an effect is never keyed on the id). The result stored is the function's: a single
text result as its text (so a duplicate proposed through another adapter reads the same), any
other result as its serialized contents. With ``on_refusal="raise"`` refusals and unknown
outcomes raise a ``MiddlewareFailure`` that is also the matching effectgate error (``except
eg.EffectAmbiguous`` works): the framework never turns it into a tool result, and the run
stops. (An ordinary exception from function middleware would become a tool error and the loop
would run on.)

**Approvals pause the run** through the framework's function approval: a call the policy sends
for approval answers with a ``function_approval_request`` content (``additional_properties``:
``{"effectgate": {approval_id, payload_hash, key, ...}, "arguments": <the normalised arguments
that would execute>, "description": ...}``), so the run returns with
``response.user_input_requests`` — the same pause ``approval_mode="always_require"`` gives, for
the calls the policy names only. The framework records the pending request in the session
(``session.to_dict()`` / ``AgentSession.from_dict`` carry it to another process) and binds an
answer to it. Resume with ``agent.run(Message(role="user", contents=[response]),
session=session)``:

* ``response = gate_mw.approve(request, by="alice")`` records the approval in the store (for the
  payload hash of the request's arguments, checked) and returns the
  ``function_approval_response``; ``gate_mw.reject(request, by=..., reason=...)`` records the
  denial (it stays denied) and returns the rejecting response. The framework never calls a
  rejected function, nor its middleware: a bare ``request.to_function_approval_response(False)``
  leaves the store's request pending (nothing runs; it expires);
* a bare ``request.to_function_approval_response(True)`` is the framework's own approval: when
  the call resumes, the store comes first (``_kernel/resume.py``) — a request already decided
  in the store (the CLI, the console, :meth:`approve` / :meth:`reject`, an earlier resume) is
  executed once or refused whatever the response says; a pending one is approved (by
  ``approver=``, default :data:`DEFAULT_APPROVER`) for the arguments the call brings, and only
  when the response names the store's own pending request (approval id and payload hash);
* a replayed resume (the same session snapshot restored and answered again: the framework's
  binding is per session) gets the stored result, not a second execution.

This is **prevention**: the framework re-validates the approved call's arguments against the
request it recorded, and the gate binds the approval to their payload hash when the call
begins. The approval response carries no edit: to change the arguments, reject and let the
model call again. ``pause=False`` keeps the plain answer (text with the approval id). A tool's
own ``approval_mode="always_require"`` still applies first.

It rests on ``MiddlewareBundle``, which agent-framework-core 1.23 marks experimental; install
the bundle at the agent (a chat client installs only chat and function middleware and refuses
a bundle with an agent member).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import re
import sys
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from effectgate import (
    ApprovalState,
    ConfigError,
    EffectGateError,
    EffectSpec,
    Gate,
    InvalidTransition,
)

from ._kernel import (
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
from ._kernel.call import keep_refusal
from ._kernel.raising import as_framework_error
from ._kernel.resume import Answer, aresume, claimed
from ._kernel.review import review_of

with requires_extra("agent_framework", "agent-framework"):
    import pydantic
    from agent_framework import (
        AgentMiddleware,
        Content,
        FunctionMiddleware,
        FunctionTool,
        MiddlewareBundle,
        MiddlewareFailure,
    )

__all__ = ["DEFAULT_APPROVER", "EffectGateMiddleware", "UngatedToolWarning"]

DEFAULT_APPROVER = "agent-framework-resume"
"""Who a bare approval response is recorded as approved by unless ``approver=`` says; and who
:meth:`EffectGateMiddleware.approve` / :meth:`~EffectGateMiddleware.reject` record by
default."""

_agent: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "effectgate_agent_framework_agent", default=None)


def _raise_as(error: BaseException) -> BaseException:
    return as_framework_error(error, MiddlewareFailure, module=__name__)


def _tool_names(tools: Any) -> list[str]:
    """The names of the function tools in a tool list (tools of other kinds run elsewhere)."""
    if tools is None:
        return []
    items = tools if isinstance(tools, Sequence) and not isinstance(tools, str) else [tools]
    return [t.name for t in items if isinstance(t, FunctionTool)]


# -- results in and out of the store --------------------------------------------------------


def _stored(result: Any) -> Any:
    """What the store keeps of a function result: a single text as its text, other contents
    as their dicts, anything else as it is."""
    if isinstance(result, list) and all(isinstance(c, Content) for c in result):
        if len(result) == 1 and result[0].type == "text":
            return result[0].text
        return [c.to_dict() for c in result]
    return result


def _given(value: Any, tool: Any) -> Any:
    """A stored result as the function result the framework expects."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, dict) and "type" in v
                                                 for v in value):
        with contextlib.suppress(Exception):
            return [Content.from_dict(v) for v in value]
    return tool.parse_result(value)  # stored by another adapter, or by a raw result


# -- the function middleware ------------------------------------------------------------------


class _FunctionGate(FunctionMiddleware):
    """Gates each call of a declared tool (see the module docstring)."""

    def __init__(self, owner: EffectGateMiddleware) -> None:
        self.owner = owner

    async def process(self, context: Any, call_next: Callable[[], Awaitable[None]]) -> None:
        tool = context.function
        gated = self.owner.gated_call(tool)
        if gated is None:
            await call_next()  # not a declared effect
            return
        arguments = _arguments(tool, context.arguments)
        if not isinstance(arguments, Refused) and (named := _variables(arguments)):
            arguments = invalid_arguments(gated.tool_name, (
                f"{', '.join(named)} name(s) a variable of agent_framework.security, whose value "
                "replaces it only after the gate: an effect is never keyed on a placeholder"))
        if isinstance(arguments, Refused):  # never let through a call the gate cannot key
            context.result = gated.refuse(arguments).message
            return
        session = getattr(context, "session", None)
        owner = self.owner

        async def body() -> Any:
            await call_next()
            return _stored(context.result)

        async def run(one: GatedCall, args: Any) -> Any:
            return await one.arun(args, body)

        with framework_context(getattr(session, "session_id", None), _agent.get()):
            response = context.metadata.get("approval_response")
            if response is not None and owner.pause:
                try:
                    approval_id, digest = claimed(getattr(response, "additional_properties",
                                                          None))
                except ConfigError as err:
                    raise _raise_as(err) from None
                answer = Answer(bool(getattr(response, "approved", False)), owner.approver,
                                approval_id=approval_id, payload_hash=digest)
                out = await aresume(gated, arguments, answer, run)
            else:
                out = await run(gated, arguments)
            if isinstance(out, Refused) and out.kind == "approval_required" and owner.pause:
                context.result = await _approval_request(gated, out, arguments, context)
                return
        if isinstance(out, Refused):
            context.result = gated.refuse(out).message
            return
        context.result = _given(out, tool)


_VARIABLE = re.compile(r"\bvar_[0-9a-fA-F]{8,}\b")  # agent_framework.security's variable ids


def _variables(arguments: Mapping[str, Any]) -> list[str]:
    """The arguments that name a variable of ``agent_framework.security`` (its stand-in for
    untrusted content the model never sees), which the security middleware resolves after
    every function middleware, this one included, has run."""
    if "agent_framework.security" not in sys.modules:
        return []
    return sorted(name for name, value in arguments.items()
                  if _VARIABLE.search(value if isinstance(value, str) else repr(value)))


def _arguments(tool: Any, raw: Any) -> dict[str, Any] | Refused:
    """The call's arguments by name, validated by the tool's input model: keyed by field
    name, as the framework hands on the arguments it validated, or by alias, as a provider
    sent them when the framework could not. Arguments that validate neither way are refused:
    the function never runs (the framework would refuse them too; a gate that assumed so
    would let through, ungated, whatever it misread)."""
    data = raw.model_dump() if isinstance(raw, pydantic.BaseModel) else raw
    if data is None:  # no arguments, as the framework reads it
        data = {}
    name = str(getattr(tool, "name", "tool"))
    if not isinstance(data, Mapping):
        return invalid_arguments(name, f"arguments by name expected, not {type(data).__name__}")
    model = getattr(tool, "input_model", None)
    if model is None:
        return dict(data)
    try:
        return model_arguments(model, data, by_name=True)
    except pydantic.ValidationError as err:
        return invalid_arguments(name, err)


async def _approval_request(gated: GatedCall, refused: Refused, arguments: Mapping[str, Any],
                            context: Any) -> Any:
    """The framework's function approval request for a call the store holds for approval."""
    review = await asyncio.to_thread(review_of, gated, refused, arguments)
    call_id = str(context.metadata.get("call_id") or review.approval_id)
    occurrence = context.metadata.get("function_call_occurrence_id")
    request_id = str(occurrence) if occurrence else f"{review.approval_id}:{call_id}"
    call = Content.from_function_call(
        call_id=call_id, name=gated.tool_name, id=request_id,
        arguments=json.dumps(pydantic.TypeAdapter(Any).dump_python(
            dict(arguments), mode="json")))
    return Content.from_function_approval_request(
        id=request_id, function_call=call,
        additional_properties={"effectgate": review.as_dict(), "arguments": review.arguments,
                               "description": review.description()})


# -- the agent middleware ---------------------------------------------------------------------


class _RunScope(AgentMiddleware):
    """As a run starts: the agent's name for the function middleware, and the coverage check
    of its function tools."""

    def __init__(self, owner: EffectGateMiddleware) -> None:
        self.owner = owner

    async def process(self, context: Any, call_next: Callable[[], Awaitable[None]]) -> None:
        agent = getattr(context, "agent", None)
        options = getattr(agent, "default_options", None) or {}
        names = _tool_names(options.get("tools")) + _tool_names(getattr(context, "tools", None))
        self.owner.check_coverage(names)
        token = _agent.set(getattr(agent, "name", None))
        try:
            await call_next()
        finally:
            _agent.reset(token)


# -- the bundle -------------------------------------------------------------------------------


# MiddlewareBundle is marked experimental in agent-framework-core 1.23 (it warns once, when
# subclassed): the two members must be installed together, which is what it is for. The warning
# would point at this module, where a user cannot act on it; the module docstring says so.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"\[AGENT_HOOKS\] MiddlewareBundle")

    class _Bundle(MiddlewareBundle):
        """``MiddlewareBundle``, subclassed where its one-time warning is silenced."""


class EffectGateMiddleware(_Bundle):
    """Gate an agent's declared tools (see the module docstring).

    ``effects``: tool name → key template, → ``{"key": ..., **options}``, → None (read-only); or
    an :class:`effectgate.Policy` whose rules name their ``tools`` (the gate must carry that
    policy). ``gate=None`` uses the process-wide default gate. ``pause``: a call the policy
    sends for approval pauses the run (a function approval request); False: the model is told
    in text. ``approver``: who a bare approval response is recorded as.
    """

    def __init__(self, effects: Any, *, gate: Gate | None = None, strict: bool = False,
                 read_only: Iterable[str] = (), on_refusal: OnRefusal = "message",
                 pause: bool = True, approver: str = DEFAULT_APPROVER) -> None:
        if on_refusal not in ("message", "raise"):
            raise ConfigError(f"on_refusal must be 'message' or 'raise', not {on_refusal!r}")
        if pause not in (True, False):
            raise ConfigError(f"pause must be True or False, not {pause!r}")
        if not isinstance(approver, str) or not approver.strip():
            raise ConfigError("approver must be a non-empty str")
        self.gate = resolve_gate(gate)
        self.effects = effects
        self.read_only = tuple(read_only)
        self.declarations = read_declarations(effects, gate=self.gate,
                                              read_only=self.read_only)
        self.strict = strict or self.declarations.strict
        self.on_refusal = on_refusal
        self.pause = pause
        self.approver = approver
        self._calls: dict[tuple[str, int], GatedCall] = {}
        self.function_middleware: FunctionMiddleware = _FunctionGate(self)
        """The bundle's function middleware alone (what gates a call)."""
        super().__init__([_RunScope(self), self.function_middleware])

    # -- which tool is which effect -----------------------------------------------------------

    def check_coverage(self, names: Sequence[str]) -> None:
        """Report the function tools among ``names`` that have no effect declared (once each),
        or, strict, refuse them with :class:`effectgate.ConfigError`."""
        report_ungated("agent_framework", self.declarations.ungated(list(dict.fromkeys(names))),
                       strict=self.strict)

    def gated_call(self, tool: Any) -> GatedCall | None:
        """The gated call of a declared tool (None for an undeclared or read-only one)."""
        name = getattr(tool, "name", None)
        if not isinstance(name, str):
            return None
        entry = self.declarations.effects.get(name)
        if entry is None:
            return None
        slot = (name, id(tool))
        gated = self._calls.get(slot)
        if gated is None:
            spec = entry.spec or entry.build(self.gate)
            model = getattr(tool, "input_model", None)
            if model is not None and entry.spec is None:
                spec.check_names(model.model_fields, f"tool {name!r}")
            on_refusal = entry.adapter_options().get("on_refusal", self.on_refusal)
            gated = GatedCall(spec, name, on_refusal=on_refusal, raise_as=_raise_as,
                              pause=keep_refusal)
            self._calls[slot] = gated
        return gated

    # -- deciding a paused run's requests -----------------------------------------------------

    def approve(self, request: Any, *, by: str = DEFAULT_APPROVER,
                note: str | None = None) -> Any:
        """Approve a paused call: recorded in the store (``gate.approve``, for the payload
        hash of the request's arguments, checked), then the framework's approving response.

        A request already decided in the store stays as decided. ``ConfigError`` when
        ``request`` is not a pending request of a gated tool; ``InvalidTransition`` when ``by``
        may not approve it (a self-approval the policy forbids).
        """
        record = self._record(request)
        if record is not None and record.state is ApprovalState.PENDING:
            try:
                self.gate.approve(record.approval_id, by=by, note=note)
            except InvalidTransition:
                if self.gate.approval(record.approval_id).state is ApprovalState.PENDING:
                    raise
        return request.to_function_approval_response(True)

    def reject(self, request: Any, *, by: str = DEFAULT_APPROVER,
               reason: str | None = None) -> Any:
        """Reject a paused call: denied in the store (``gate.deny``; it stays denied), then the
        framework's rejecting response (the function never runs)."""
        record = self._record(request)
        if record is not None:
            with contextlib.suppress(InvalidTransition):  # decided meanwhile: it stands
                self.gate.deny(record.approval_id, by=by, reason=reason)
        return request.to_function_approval_response(False)

    def _record(self, request: Any) -> Any:
        """The store's approval request ``request`` names, checked against its call: the
        tool's effect type, and the key and payload hash of its arguments. None for a request
        the gate did not make (a tool's own ``approval_mode``)."""
        if getattr(request, "type", None) != "function_approval_request":
            raise ConfigError("approve / reject take a function_approval_request content")
        approval_id, digest = claimed(getattr(request, "additional_properties", None))
        if approval_id is None:
            return None
        call = getattr(request, "function_call", None)
        name = getattr(call, "name", None)
        entry = self.declarations.effects.get(name) if isinstance(name, str) else None
        if entry is None:
            raise ConfigError(f"the request is for {name!r}, which is not a gated tool")
        try:
            raw = getattr(call, "arguments", None)
            args = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
            if not isinstance(args, dict):
                raise ValueError("not an object")
            spec: EffectSpec = entry.spec or entry.build(self.gate)
            wanted = spec.request(args)
            record = self.gate.approval(approval_id)
        except (ValueError, TypeError, EffectGateError) as err:
            raise ConfigError(f"the request names no approval of its call ({err})") from None
        if (record.effect_type, record.key, record.payload_hash) != (
                spec.effect_type, wanted.key, wanted.payload_hash) or \
                (digest is not None and digest != record.payload_hash):
            raise ConfigError(f"approval {record.approval_id} is for other arguments")
        return record
