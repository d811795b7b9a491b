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
  tool result the model reads (wait, do not retry, ask a human). The outcome is the function's:
  a call whose function never ran — a later middleware answered for it (a rate limiter, a
  guardrail), the framework refused it first (``max_invocations`` reached), or it was
  cancelled first (the framework cancels a turn's other calls on a ``MiddlewareFailure``) —
  is recorded FAILED and answered as it would be without the gate (an identical call that
  waited for it is gated again as its own call); to see that, a gated
  tool's function is wrapped in place, once (as ``agent_framework.security`` wraps functions
  to label results). The wrapper also checks that the function is entered with the arguments
  the call was keyed on: a call whose arguments a later middleware changed does not run
  (FAILED). A function that returned is the call's outcome (COMMITTED) even when a later
  middleware then raises; that error is raised on as without the gate, and so are the
  framework's own signals (``MiddlewareFailure``, ``UserInputRequiredException``) from the
  function, once its outcome is recorded.
  The tool definitions are untouched: the model is sent exactly what it would be sent without
  the gate. Installed twice on one call (at the agent and again at the run) the middleware
  gates it once; two different ``EffectGateMiddleware`` gating one call are refused
  (``ConfigError``, raised as ``MiddlewareFailure``: the run stops before the function runs);
* an **agent middleware** that, as each run starts, reports once by name every function tool of
  the agent (and of the run) that has no effect declared, or with ``strict=True`` (or
  ``policy.strict``) refuses the run with ``ConfigError`` before any tool runs; it also hands the
  agent's name to the function middleware (the effect's ``agent_id``). The session id becomes
  the effect's ``run_id``.

The gate keys, hashes and prices exactly the arguments the function is called with: the
framework's own preparation of the call (its input model validates the arguments once —
``"500"`` is ``500``, a validator that changes a value runs once — and only the fields the model
sent are handed on), with the function's own defaults for the fields left out, as they apply
when it runs (not the input model's defaults). Arguments the framework would refuse (a value
the input model does not validate; a field's name where the model takes only its alias) are
refused before anything is reserved: the model is told which, and the function never runs. A
middleware that repairs arguments goes before this one. So are
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
  payload hash of the request's arguments, checked: validated by the tool's input model as the
  call's are — pass ``tool=`` in a process where this middleware has not gated a call of it
  and its arguments are not plain JSON) and returns the
  ``function_approval_response``; ``gate_mw.reject(request, by=..., reason=...)`` records the
  denial (it stays denied) and returns the rejecting response (``InvalidTransition`` for a
  request the store approved: that approval stands). The framework never calls a
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
begins. The request carries the arguments as JSON, which the framework validates again on the
resume: a call whose JSON would not validate back to the same arguments (a validator that
changes its value) is not paused but answered in text with the approval id, to be approved in
the CLI or the console. The approval response carries no edit: to change the arguments, reject
and let the model call again. ``pause=False`` keeps the plain answer (text with the approval
id). A tool's own ``approval_mode="always_require"`` still applies first. Where a
``ToolApprovalMiddleware`` runs, whose standing rules and ``auto_approval_rules`` answer
requests with no human (indistinguishably from a person's answer), only the store's decision
counts (:meth:`approve`, the CLI, the console): a request answered otherwise is told in text
and waits.

It rests on ``MiddlewareBundle``, which agent-framework-core 1.23 marks experimental; install
the bundle at the agent (a chat client installs only chat and function middleware and refuses
a bundle with an agent member). It reads the framework's preparation of a call's arguments
through private names of ``agent_framework._tools`` (those its own ``agent_framework.security``
reads), as they are from 1.23 on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from effectgate import (
    ApprovalState,
    ConfigError,
    EffectGateError,
    EffectSpec,
    Gate,
    InvalidTransition,
    KeyTemplate,
    NotExecuted,
    current_effect,
    payload_hash,
)

from ._kernel import (
    GatedCall,
    OnRefusal,
    Refused,
    UngatedToolWarning,
    framework_context,
    invalid_arguments,
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
        FunctionInvocationContext,
        FunctionMiddleware,
        FunctionTool,
        MiddlewareBundle,
        MiddlewareFailure,
        UserInputRequiredException,
    )

    # How the framework prepares a call's arguments for the function (its own
    # agent_framework.security reads the same names): the gate keys on exactly those.
    from agent_framework._tools import (
        _PARENT_TOOL_APPROVAL_SOURCE_IDS_CONTEXT_KEY,
        _PREPARED_ARGUMENTS_CONTEXT_KEY,
        _argument_comparison_token,
        _FunctionArgumentValidationError,
        _PreparedArgumentsState,
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

_SIGNALS = (MiddlewareFailure, UserInputRequiredException)
"""What a function (or a later middleware) raises to stop the run, never made a tool result
by the framework: recorded, then raised on."""

_GATED_BY = "effectgate_gated_by"
"""The call's ``context.metadata`` key naming the :class:`EffectGateMiddleware` that gates it."""


class _FunctionGate(FunctionMiddleware):
    """Gates each call of a declared tool (see the module docstring)."""

    def __init__(self, owner: EffectGateMiddleware) -> None:
        self.owner = owner

    async def process(self, context: Any, call_next: Callable[[], Awaitable[None]]) -> None:
        tool = context.function
        declared = self.owner._declared(tool)
        if declared is None:
            await call_next()  # not a declared effect
            return
        gated = declared.gated
        holder = context.metadata.get(_GATED_BY)
        if holder is self.owner:  # installed twice (the agent's and the run's): gated outside
            await call_next()
            return
        if holder is not None:
            raise _raise_as(ConfigError(
                f"two EffectGateMiddleware gate this call of {gated.tool_name!r}: install one"))
        context.metadata[_GATED_BY] = self.owner
        arguments = _arguments(tool, context.arguments, context.metadata, declared.defaults)
        if not isinstance(arguments, Refused) and (named := _variables(arguments)):
            arguments = invalid_arguments(gated.tool_name, (
                f"{', '.join(named)} name(s) a variable of agent_framework.security, whose value "
                "replaces it only after the gate: an effect is never keyed on a placeholder"))
        if isinstance(arguments, Refused):  # never let through a call the gate cannot key
            context.result = gated.refuse(arguments).message
            return
        watched = _watch(tool)
        invocation = _Invocation(gated.spec.template, declared.defaults)

        async def body() -> Any:
            invocation.digest = current_effect().payload_hash
            token = _invocation.set(invocation)
            try:
                await call_next()
            except (Exception, asyncio.CancelledError) as err:  # a sibling's failure cancels
                if watched and not invocation.close():
                    raise FunctionNotRun(gated.tool_name, invocation, err) from err
                if isinstance(err, asyncio.CancelledError) or not invocation.returned:
                    raise
                invocation.after = err  # a later middleware's, once the function returned
            finally:
                _invocation.reset(token)
            if watched and not invocation.close():
                raise FunctionNotRun(gated.tool_name, invocation, None)
            return _stored(context.result)

        out = await self._settled(gated, arguments, body, context, invocation)
        if invocation.after is not None:  # recorded as the function's: raised as without us
            raise invocation.after
        if isinstance(out, Refused) and isinstance(out.error, _SIGNALS):
            raise out.error  # recorded (AMBIGUOUS): the framework's own signal stops the run
        if isinstance(out, FunctionNotRun):  # recorded FAILED: the framework answers
            if out.__cause__ is not None:  # its own refusal, or another middleware's error
                raise out.__cause__
            return  # the answer of the middleware that answered instead of the function
        if isinstance(out, Refused) and out.kind == "approval_required" and self.owner.pause \
                and not (_auto_approving(context) and "approval_response" in context.metadata):
            context.result = await _approval_request(declared, out, arguments, context)
        elif isinstance(out, Refused):
            context.result = gated.refuse(out).message
        else:
            context.result = _given(out, tool)

    async def _settled(self, gated: GatedCall, arguments: Mapping[str, Any],
                       body: Callable[[], Awaitable[Any]], context: Any,
                       invocation: _Invocation) -> Any:
        """:meth:`_gated`, a :class:`FunctionNotRun` returned. A twin of a call whose function
        never ran (a middleware of that call's answered, its run was cancelled) was not
        answered: it is gated again, as its own call."""
        while True:
            try:
                out = await self._gated(gated, arguments, body, context)
            except FunctionNotRun as not_run:
                out = not_run
            if not isinstance(out, FunctionNotRun) or out.invocation is invocation:
                return out

    async def _gated(self, gated: GatedCall, arguments: Mapping[str, Any],
                     body: Callable[[], Awaitable[Any]], context: Any) -> Any:
        """The gated call's answer: a result, or a :class:`Refused`; a paused call resumed
        with the framework's approval response is decided against the store first."""
        owner = self.owner

        async def run(one: GatedCall, args: Any) -> Any:
            return await one.arun(args, body)

        session = getattr(context, "session", None)
        with framework_context(getattr(session, "session_id", None), _agent.get()):
            response = context.metadata.get("approval_response")
            if response is None or not owner.pause or _auto_approving(context):
                return await run(gated, arguments)  # the store decides
            try:
                approval_id, digest = claimed(getattr(response, "additional_properties", None))
            except ConfigError as err:
                raise _raise_as(err) from None
            answer = Answer(bool(getattr(response, "approved", False)), owner.approver,
                            approval_id=approval_id, payload_hash=digest)
            return await aresume(gated, arguments, answer, run)


def _auto_approving(context: Any) -> bool:
    """Whether a ``ToolApprovalMiddleware`` runs on the call's agent: its standing rules (one
    "always approve" of a tool) and ``auto_approval_rules`` answer approval requests with no
    human, indistinguishably from a person's answer. There only the store's decision counts;
    a request it answered is told in text (pausing again would have it answered again)."""
    return bool(context.metadata.get(_PARENT_TOOL_APPROVAL_SOURCE_IDS_CONTEXT_KEY))


_VARIABLE = re.compile(r"\bvar_[0-9a-fA-F]{8,}\b")  # agent_framework.security's variable ids


def _variables(arguments: Mapping[str, Any]) -> list[str]:
    """The arguments that name a variable of ``agent_framework.security`` (its stand-in for
    untrusted content the model never sees), which the security middleware resolves after
    every function middleware, this one included, has run."""
    if "agent_framework.security" not in sys.modules:
        return []
    return sorted(name for name, value in arguments.items()
                  if _VARIABLE.search(value if isinstance(value, str) else repr(value)))


# -- the arguments the function is called with ------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Declared:
    """A declared tool as :class:`EffectGateMiddleware` gates it: its gated call, and the
    defaults its function gives the fields a call leaves out."""

    gated: GatedCall
    defaults: Mapping[str, Any]


def _function_defaults(tool: Any) -> dict[str, Any]:
    """The defaults of the tool function's parameters that are fields of its input model: the
    framework leaves out the fields the model did not send, so that these apply."""
    func: Any = tool.func.func if isinstance(tool.func, FunctionTool) else tool.func
    model = tool.input_model
    fields = model.model_fields if model is not None else tool.parameters().get("properties", {})
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # no function (declaration only), or one inspect cannot read
        return {}
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p.default for p in parameters
            if p.name in fields and p.kind in by_name and p.default is not p.empty}


def _arguments(tool: Any, raw: Any, metadata: Mapping[str, Any],
               defaults: Mapping[str, Any]) -> dict[str, Any] | Refused:
    """The arguments the function will be called with, by name.

    The framework prepares a call's arguments once (its input model validates them, and the
    fields the model sent are handed on) and reuses that preparation while the arguments are
    unchanged; otherwise (it could not validate them, or an earlier middleware changed them) it
    prepares them again just before the function runs. This reads the same preparation, or
    makes the one the framework will make, then adds the function's own ``defaults`` for the
    fields left out. Arguments the framework would refuse are refused here: the function never
    runs, and nothing is reserved.
    """
    current = FunctionTool._arguments_as_mapping(raw)
    state = metadata.get(_PREPARED_ARGUMENTS_CONTEXT_KEY)
    if (current is not None and isinstance(state, _PreparedArgumentsState)
            and _argument_comparison_token(current) == state.token):
        prepared = state.arguments
    else:
        try:
            prepared = tool._prepare_arguments(raw)
        except _FunctionArgumentValidationError as err:
            cause = err.__cause__
            return invalid_arguments(str(tool.name), cause if isinstance(
                cause, pydantic.ValidationError) else str(err))
    return dict(prepared) | {name: value for name, value in defaults.items()
                             if name not in prepared}


# -- did the function run? ------------------------------------------------------------------


class _Invocation:
    """A gated call's watch on its function: entered or not. Once the call is settled (closed)
    the function can no longer be entered under it, so "never entered" stays true. It keeps
    the payload hash the store recorded for the call (``digest``, set as its body begins),
    with the key template and the function's defaults that hash was computed through, to
    check the arguments the function is entered with; whether it returned, and the error a
    later middleware raised after that (the call is recorded as the function's, then the
    error raised)."""

    __slots__ = ("_lock", "after", "closed", "defaults", "digest", "entered", "returned",
                 "template")

    def __init__(self, template: KeyTemplate, defaults: Mapping[str, Any]) -> None:
        self._lock = threading.Lock()
        self.entered = False
        self.closed = False
        self.returned = False
        self.after: Exception | None = None
        self.template = template
        self.defaults = defaults
        self.digest: str | None = None

    def keyed_on(self, called: Mapping[str, Any]) -> bool:
        """Whether the function is called with the arguments the call was keyed on (a
        middleware after the gate may have changed them): hashed as the store hashed them."""
        arguments = {name: value for name, value in called.items()
                     if not isinstance(value, FunctionInvocationContext)}
        try:
            return payload_hash(self.template.normalise(dict(self.defaults) | arguments)) \
                == self.digest
        except (EffectGateError, TypeError, ValueError):  # not keyed as the call was
            return False

    def enter(self) -> bool:
        """Mark the function entered; False once the call is settled."""
        with self._lock:
            self.entered = self.entered or not self.closed
            return not self.closed

    def close(self) -> bool:
        """Settle the call: whether its function was entered."""
        with self._lock:
            self.closed = True
            return self.entered


_invocation: contextvars.ContextVar[_Invocation | None] = contextvars.ContextVar(
    "effectgate_agent_framework_invocation", default=None)

_WATCHING = "__effectgate_watching__"


class FunctionNotRun(NotExecuted):
    """A gated call whose function was never entered: a later middleware answered instead,
    or the framework refused the call first (that error is the ``__cause__``). Recorded
    FAILED, then answered as the framework would answer without the gate."""

    def __init__(self, tool_name: str, invocation: _Invocation,
                 error: BaseException | None) -> None:
        reason = (f"{type(error).__name__} before it started" if error is not None
                  else "another middleware answered for it")
        super().__init__(f"the function of {tool_name!r} did not run: {reason}",
                         key=current_effect().key)
        self.invocation = invocation


def _enter(invocation: _Invocation | None,
           called: Mapping[str, Any]) -> contextvars.Token[_Invocation | None]:
    """Mark ``invocation`` (the current gated call's) entered: refused once that call is
    settled, or when ``called``, its function's arguments, are not the ones the call was keyed
    on; the body runs outside the mark (the calls it makes are its own)."""
    if invocation is not None and not invocation.keyed_on(called):
        raise NotExecuted("the function's arguments were changed after the gate keyed the "
                          "call (a middleware after EffectGateMiddleware): not run")
    if invocation is not None and not invocation.enter():
        raise NotExecuted("the gate has already recorded this call as not run")
    return _invocation.set(None)


def _watching(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, marking the gated call that enters it (:func:`_enter`); a coroutine function
    when ``func`` is one, so the framework runs it as it would run ``func``."""
    target = func.func if isinstance(func, FunctionTool) else func
    watched: Callable[..., Any]
    if inspect.iscoroutinefunction(target):
        @functools.wraps(func)
        async def watched(*args: Any, **kwargs: Any) -> Any:
            invocation = _invocation.get()
            token = _enter(invocation, kwargs)
            try:
                result = func(*args, **kwargs)
                result = await result if inspect.isawaitable(result) else result
            finally:
                _invocation.reset(token)
            if invocation is not None:
                invocation.returned = True
            return result
    else:
        @functools.wraps(func)
        def watched(*args: Any, **kwargs: Any) -> Any:
            invocation = _invocation.get()
            token = _enter(invocation, kwargs)
            try:
                result = func(*args, **kwargs)
            finally:
                _invocation.reset(token)
            if invocation is not None and not inspect.isawaitable(result):
                invocation.returned = True
            return result
    setattr(watched, _WATCHING, True)
    return watched


_RUNS_FUNC = ("invoke", "__call__", "_invoke_function")


def _watch(tool: Any) -> bool:
    """Whether entering ``tool``'s function is seen: its ``func`` wrapped in place, once (as
    the framework's own security labels wrap it; the tool's definition is untouched). False
    for a ``FunctionTool`` subclass that may run something else: its outcome is recorded as
    its call ends, as for any function."""
    if tool.func is None or any(getattr(type(tool), name) is not getattr(FunctionTool, name)
                                for name in _RUNS_FUNC):
        return False
    if not getattr(tool.func, _WATCHING, False):
        tool.func = _watching(tool.func)
    return True


async def _approval_request(declared: _Declared, refused: Refused,
                            arguments: Mapping[str, Any], context: Any) -> Any:
    """The framework's function approval request for a call the store holds for approval.

    Its function call carries the arguments as JSON, which the framework validates again when
    the approved call resumes: when that would not give back these arguments (a validator that
    changes its value), the call is answered in text instead, as with ``pause=False``."""
    gated = declared.gated
    shown = pydantic.TypeAdapter(Any).dump_python(dict(arguments), mode="json")
    again = _arguments(context.function, shown, {}, declared.defaults)
    if isinstance(again, Refused) or payload_hash(again) != payload_hash(arguments):
        return gated.refuse(refused).message
    review = await gated.spec.gate.store.on_worker(review_of, gated, refused, arguments)
    call_id = str(context.metadata.get("call_id") or review.approval_id)
    occurrence = context.metadata.get("function_call_occurrence_id")
    request_id = str(occurrence) if occurrence else f"{review.approval_id}:{call_id}"
    call = Content.from_function_call(call_id=call_id, name=gated.tool_name, id=request_id,
                                      arguments=json.dumps(shown))
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
        self._calls: weakref.WeakKeyDictionary[Any, _Declared] = weakref.WeakKeyDictionary()
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
        declared = self._declared(tool)
        return None if declared is None else declared.gated

    def _declared(self, tool: Any) -> _Declared | None:
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not isinstance(tool, FunctionTool):
            return None
        entry = self.declarations.effects.get(name)
        if entry is None:
            return None
        declared = self._calls.get(tool)
        if declared is None or declared.gated.tool_name != name:
            spec = entry.spec or entry.build(self.gate)
            model = tool.input_model
            if model is not None and entry.spec is None:
                spec.check_names(model.model_fields, f"tool {name!r}")
            on_refusal = entry.adapter_options().get("on_refusal", self.on_refusal)
            gated = GatedCall(spec, name, on_refusal=on_refusal, raise_as=_raise_as,
                              reraise_failed=(FunctionNotRun,), pause=keep_refusal)
            declared = self._calls[tool] = _Declared(gated, _function_defaults(tool))
        return declared

    def _tool_named(self, name: str) -> Any:
        """The last tool of that name this middleware gated a call of (None if none)."""
        return next((t for t in reversed(list(self._calls.keys())) if t.name == name), None)

    # -- deciding a paused run's requests -----------------------------------------------------

    def approve(self, request: Any, *, by: str = DEFAULT_APPROVER, note: str | None = None,
                tool: Any = None) -> Any:
        """Approve a paused call: recorded in the store (``gate.approve``, for the payload
        hash of the request's arguments, checked), then the framework's approving response.

        The request's arguments are validated as the call's are, by the tool's input model:
        ``tool`` is the ``FunctionTool`` the request is for, needed only when this middleware
        has not gated a call of it in this process and its arguments are not plain JSON (a
        ``Decimal``, a date). A request already decided in the store stays as decided.
        ``ConfigError`` when ``request`` is not a pending request of a gated tool;
        ``InvalidTransition`` when ``by`` may not approve it (a self-approval the policy
        forbids).
        """
        record = self._record(request, tool)
        if record is not None and record.state is ApprovalState.PENDING:
            try:
                self.gate.approve(record.approval_id, by=by, note=note)
            except InvalidTransition:
                if self.gate.approval(record.approval_id).state is ApprovalState.PENDING:
                    raise
        return request.to_function_approval_response(True)

    def reject(self, request: Any, *, by: str = DEFAULT_APPROVER, reason: str | None = None,
               tool: Any = None) -> Any:
        """Reject a paused call: denied in the store (``gate.deny``; it stays denied), then the
        framework's rejecting response (the function never runs). ``tool`` as for
        :meth:`approve`. A request the store denied or that expired is answered the same;
        :class:`effectgate.InvalidTransition` when the store approved it (the CLI, the
        console, :meth:`approve`): that approval stands — the next call with these arguments
        executes — and nothing is recorded."""
        record = self._record(request, tool)
        if record is not None and record.state is ApprovalState.PENDING:
            try:
                record = self.gate.deny(record.approval_id, by=by, reason=reason)
            except InvalidTransition:  # decided meanwhile: that decision stands
                record = self.gate.approval(record.approval_id)
        if record is not None and record.state in (ApprovalState.APPROVED,
                                                   ApprovalState.CONSUMED):
            raise InvalidTransition(
                f"approval {record.approval_id} was approved by {record.decided_by}; it "
                "cannot be rejected now", key=record.key, state=record.state.value,
                effect_id=record.effect_id)
        return request.to_function_approval_response(False)

    def _record(self, request: Any, tool: Any) -> Any:
        """The store's approval request ``request`` names, checked against its call: the
        tool's effect type, and the key and payload hash of its arguments as the call
        validates them. None for a request the gate did not make (a tool's own
        ``approval_mode``)."""
        if getattr(request, "type", None) != "function_approval_request":
            raise ConfigError("approve / reject take a function_approval_request content")
        approval_id, digest = claimed(getattr(request, "additional_properties", None))
        if approval_id is None:
            return None
        call = getattr(request, "function_call", None)
        name = getattr(call, "name", None)
        if not isinstance(name, str) or (entry := self.declarations.effects.get(name)) is None:
            raise ConfigError(f"the request is for {name!r}, which is not a gated tool")
        tool = self._tool_named(name) if tool is None else tool
        declared = None if tool is None else self._declared(tool)
        if tool is not None and (declared is None or tool.name != name):
            raise ConfigError(f"tool= must be the gated FunctionTool {name!r}, not {tool!r}")
        try:
            raw = getattr(call, "arguments", None)
            args = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
            if not isinstance(args, dict):
                raise ValueError("not an object")
            if declared is not None:
                args = _arguments(tool, args, {}, declared.defaults)
                if isinstance(args, Refused):
                    raise args.error
            spec: EffectSpec = entry.spec or entry.build(self.gate)
            wanted = spec.request(args)
            record = self.gate.approval(approval_id)
        except (ValueError, TypeError, EffectGateError) as err:
            raise ConfigError(f"the request names no approval of its call ({err})") from None
        if (record.effect_type, record.key, record.payload_hash) != (
                spec.effect_type, wanted.key, wanted.payload_hash) or \
                (digest is not None and digest != record.payload_hash):
            hint = "" if declared is not None else (
                f" (read as plain JSON: pass tool=, the FunctionTool {name!r}, to validate "
                "them as the call does)")
            raise ConfigError(f"approval {record.approval_id} is for other arguments{hint}")
        return record
