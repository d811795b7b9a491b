"""Google ADK (``google-adk``): gated function tools, paused for approval by ADK's own tool
confirmation.

* ``gate_tool(tool, "refund:{txn_id}", gate=gate)`` takes a ``FunctionTool`` (or a plain
  function, as ``LlmAgent(tools=[...])`` does) and returns a ``FunctionTool`` of the same class
  with the same name, description and function declaration — the model is sent the same
  tool — whose ``run_async`` passes through the gate: the key is reserved before the function
  runs and the outcome recorded after it. ``gate_tools(tools, effects)`` wraps a list and
  reports every tool left ungated — a toolset too, by its class name (an ``McpToolset``'s
  tools are listed only as the agent runs, and cannot be gated); ``strict=True`` refuses them.

Arguments are validated through the function's own signature (pydantic, as ADK builds the
declaration from it) before the key and payload hash are computed, so ``"500"`` and ``500``
are one refund and the function receives ``500``; arguments that fail validation are answered
``INVALID ARGUMENTS`` and nothing runs; so are arguments with no canonical form (a naive
datetime). A duplicate gets the stored result, as though the tool had just run; two identical
calls in one turn run once and both get the result. Every other answer is the tool's
``{"error": ...}`` response telling the model what to do (wait, do not retry, ask a human).
With ``on_refusal="raise"`` refusals and unknown outcomes are raised: ADK hands them to the
``on_tool_error`` callbacks and, unanswered, ends the run. The session id becomes the effect's
``run_id`` and the agent's name its ``agent_id``. A sync function's reservation, call and
outcome run on one worker thread (the event loop is never blocked by the store); an async one
(or a ``def`` wrapping one, as ADK tells them apart) is awaited on the loop, and so is an
awaitable a ``def`` returns (ADK awaits it too) before the outcome is recorded.

What the tool's answer means: the gated tool's ``func`` is its function wrapped so that
every call of it is seen, whoever makes it (ADK's ``run_async``, a subclass's own, on ADK's
tool threads), with the same declaration. The answer is the result (COMMITTED) when the
function was called and answered. A call that asked the user first (``request_confirmation``
or ``request_credential``: ADK's own ``require_confirmation``, or the function itself, as
ADK's confirmation sample does) has done nothing: FAILED, ADK's answer goes to the model as
it would, and the call ADK makes again once answered runs. When that answer is no, the
function itself decides what the no means, so its answer is its result (COMMITTED) unless it
says nothing happened (raise ``NotExecuted``): a no is no proof that a function did nothing,
and FAILED would let its retry act again. An answer with
no call of the function seen is FAILED for ADK's own tool classes (an
``AuthenticatedFunctionTool`` asking for credentials: every path of theirs calls ``func``)
and AMBIGUOUS for a subclass's ``run_async`` (it may have reached the function another way).
A function error the tool swallowed (``GoogleTool`` answers any exception ``{"status":
"ERROR", ...}``) is classified as the body's error — AMBIGUOUS unless it says nothing
happened (``NotExecuted``, a classifier) — and an answer the tool's class flags as an error
(it defines its own ``_detect_error_in_response``, as GoogleTool does) is AMBIGUOUS: the
write may have happened.

**Approvals pause the run** through ADK's tool confirmation: a call the policy sends for
approval calls ``tool_context.request_confirmation(hint=..., payload={"effectgate":
{approval_id, payload_hash, key, ...}, "arguments": <the normalised arguments that would
execute>})`` and skips summarization, so the run ends with an ``adk_request_confirmation``
function call (ADK's ``long_running_tool_ids``). The client answers with a
``FunctionResponse(name="adk_request_confirmation", id=<that call's id>, response={"confirmed":
True | False, "payload": ...})`` in a later ``run_async`` on the same session — in any process,
with a persistent session service (``DatabaseSessionService``). ADK checks the confirmed call's
name and arguments against the session history and calls the tool again with
``tool_context.tool_confirmation``; then, against the store first (``_kernel/resume.py``):

* a request already decided in the store (``gate.approve`` / the CLI / the console, or an
  earlier resume) executes once or stays refused, whatever the confirmation says;
* otherwise ``confirmed=True`` records the approval (by ``approver=``, default
  :data:`DEFAULT_APPROVER`) for the payload hash of the arguments the call brings and executes
  them once; ``confirmed=False`` records the denial (``gate.deny``), and it stays denied;
* a confirmation payload whose ``arguments`` differ from those the pause showed (an edit)
  approves nothing: the model is told so, and the request waits;
* the answer is bound to the request its pause showed, as the session recorded it (the
  ``adk_request_confirmation`` call's payload, kept server-side): a pending request other than
  that one (opened after the shown one expired, by this resume or a replay of it) is not
  approved, and the model is told it waits; a confirmation payload that echoes an
  ``effectgate`` approval id or payload hash must name that request too;
* a no in the reply to a request refuses it, whatever the same reply says to another pause
  on that request (two identical calls in one turn each pause on it);
* a replayed resume (the same session snapshot restored elsewhere: ADK drops a consumed
  confirmation only within one session) gets the stored result, not a second refund.

This is **prevention**: the approval binds the payload hash of the arguments that execute.
ADK's confirmation carries no edit (one in the payload's ``arguments`` is refused, never
executed): to change the arguments, reject and let the model call again. ``pause=False``
keeps the plain answer (text with the approval id). A tool's own ``require_confirmation``
still applies: ADK asks first, before the gate can show its request, so that yes answers the
gate's request only if the run had been told of that request before ADK asked (a "WAITING
FOR APPROVAL … approval id …" answer earlier in the same session, in the session's own
order: no clock is compared, and the client's payload is not asked): the first yes meets the
request its own call opens, which waits (the model is told so); the call made again is asked
again, and that yes approves it.

Not offered, and why: ``before_tool_callback`` can answer a duplicate from the store, and
``after_tool_callback`` / ``on_tool_error_callback`` can record the outcome, but between the
reservation and the body sit ADK's own confirmation gate (a reservation would be held across a
human's pause and lapse to AMBIGUOUS) and every later callback, any of which may answer the call
instead of the tool — then the callbacks would record as committed what never ran. Wrapping
the tool puts the reservation around the function and nothing else.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from effectgate import ConfigError, EffectSpec, Gate, NotExecuted, PayloadError

from ._kernel import (
    Framework,
    GatedCall,
    OnRefusal,
    Refused,
    UngatedToolWarning,
    framework_context,
    invalid_arguments,
    model_arguments,
    model_message,
    requires_extra,
    resolve_gate,
)
from ._kernel import gate_tools as _gate_tools
from ._kernel.call import keep_refusal
from ._kernel.resume import Answer, aresume, claimed, other_request
from ._kernel.review import review_of

with requires_extra("google_adk", "google-adk"):
    import pydantic
    from google.adk.tools._function_tool_declarations import get_callable_name
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.base_toolset import BaseToolset
    from google.adk.tools.function_tool import FunctionTool
    from google.adk.tools.tool_confirmation import ToolConfirmation
    from google.adk.tools.tool_context import ToolContext
    from google.adk.utils._callable_utils import get_callable_doc, unwrap_callable

__all__ = ["DEFAULT_APPROVER", "UngatedToolWarning", "gate_tool", "gate_tools", "is_gated"]

DEFAULT_APPROVER = "google-adk-resume"
"""Who a confirmed resume is recorded as approved (or rejected) by unless ``approver=`` says."""


def _arguments_model(tool: FunctionTool) -> type[pydantic.BaseModel] | None:
    """A pydantic model of the function's parameters (what the model's arguments are validated
    by); None for a callable without a usable signature (keyed on the arguments as sent)."""
    func = tool.func
    try:
        signature = inspect.signature(func)
        hints = typing.get_type_hints(func)
    except (TypeError, ValueError, NameError):
        return None
    ignored = set(getattr(tool, "_ignore_params", ("tool_context", "input_stream")))
    fields: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        if name in ignored or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(name, Any)
        if annotation is ToolContext:
            continue
        default = ... if param.default is param.empty else param.default
        fields[name] = (annotation, default)
    try:
        return pydantic.create_model(f"{tool.name}_arguments", **fields)
    except Exception:  # an annotation pydantic cannot build a model for
        return None


class _Gated:
    """What the wrapped tool's class adds to its own (copied into a subclass of it, see
    :func:`_gated_class`): ``run_async`` passes through the gate."""

    _effectgate_base: type[FunctionTool]
    _effectgate: GatedCall
    _effectgate_func: Callable[..., Any]
    _effectgate_watched: Callable[..., Any] | None
    _effectgate_model: type[pydantic.BaseModel] | None
    _effectgate_pause: bool
    _effectgate_approver: str
    _effectgate_plain: bool
    func: Callable[..., Any]  # the tool's function, watched (:func:`_watched`)

    @property
    def gated_call(self) -> GatedCall:
        """The gated call: its ``spec`` and ``on_refusal``."""
        return self._effectgate

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        """Validate, gate, answer (see the module docstring)."""
        gated = self._effectgate
        arguments = self._arguments(args)
        if isinstance(arguments, Refused):
            return {"error": gated.refuse(arguments).message}
        session = getattr(tool_context, "session", None)
        with framework_context(getattr(session, "id", None),
                               getattr(tool_context, "agent_name", None)):
            confirmation = getattr(tool_context, "tool_confirmation", None)
            said_no = confirmation is not None and not confirmation.confirmed
            run = self._runner(tool_context)
            try:
                if confirmation is not None and self._effectgate_pause:
                    shown, told, nays = _paused_on(tool_context)
                    try:
                        approval_id, digest = claimed(confirmation.payload)
                        shown_id, shown_digest = claimed(shown)
                    except ConfigError as err:
                        return {"error": model_message("invalid", None, err)}
                    if (shown_id is not None and approval_id not in (None, shown_id)) or (
                            shown_digest is not None and digest not in (None, shown_digest)):
                        out = other_request(None)  # the session showed another request
                    elif shown_id is not None and not said_no and \
                            _edited(confirmation.payload, shown):
                        out = Refused.of("denied", "the answer changes the arguments its "
                                         "request showed; nothing was approved: to change them, "
                                         "reject it and call the tool again")
                    else:  # the session's record binds the answer, never the client's say
                        # A no to the same request in the same reply (twin calls) wins.
                        answer = Answer(not said_no and shown_id not in nays,
                                        self._effectgate_approver,
                                        approval_id=shown_id, payload_hash=shown_digest,
                                        told=None if shown_id else told)
                        out = await aresume(gated, arguments, answer, run)
                else:
                    out = await run(gated, arguments)
            except _NothingDone as unrun:  # (on_refusal="raise" raises a FAILED body's error)
                return unrun.answer
            except PayloadError as err:  # no canonical form: refused before anything was stored
                refused = Refused("invalid", model_message("invalid", None, err), err, None)
                return {"error": gated.refuse(refused).message}
            if isinstance(out, Refused) and isinstance(out.error, _NothingDone):
                return out.error.answer  # recorded FAILED: the tool's own answer stands
            if isinstance(out, Refused) and out.kind == "approval_required" \
                    and self._effectgate_pause:
                return await self._pause(out, arguments, tool_context)
        if isinstance(out, Refused):
            return {"error": gated.refuse(out).message}
        return out

    def _arguments(self, args: Mapping[str, Any]) -> dict[str, Any] | Refused:
        model = self._effectgate_model
        if model is None:
            return dict(args)
        try:
            return model_arguments(model, args)
        except pydantic.ValidationError as err:
            return invalid_arguments(self._effectgate.tool_name, err)

    def _runner(self, tool_context: ToolContext) -> Callable[[GatedCall, Any], Awaitable[Any]]:
        """``run(gated, arguments)``: one gated call of the function with these arguments."""
        direct = _direct_call(self, tool_context)

        async def run(one: GatedCall, arguments: Any) -> Any:
            if direct is not None:
                return await one.arun_sync(arguments, lambda: direct(arguments), hop=_hop)
            return await one.arun(arguments, lambda: self._run_watched(arguments, tool_context))

        return run

    async def _run_watched(self, arguments: Mapping[str, Any], tool_context: ToolContext) -> Any:
        """The tool's own ``run_async``, its calls of its function watched: its result, or
        raised when it is not one (see :func:`_outcome`)."""
        watch = _Watch(self._effectgate_watched)
        token = _watch.set(watch)
        try:
            base = self._effectgate_base
            answer = await base.run_async(self, args=dict(arguments),  # type: ignore[arg-type]
                                          tool_context=tool_context)
        finally:
            _watch.reset(token)
        return _outcome(self, watch, answer, tool_context)

    async def _pause(self, refused: Refused, arguments: Mapping[str, Any],
                     tool_context: ToolContext) -> Any:
        """Ask ADK to pause the run for a human (its tool confirmation)."""
        review = await self._effectgate.spec.gate.store.on_worker(
            review_of, self._effectgate, refused, arguments)
        tool_context.request_confirmation(
            hint=review.description(),
            payload={"effectgate": review.as_dict(), "arguments": review.arguments})
        tool_context.actions.skip_summarization = True
        return {"error": refused.message}


_APPROVAL_ID = re.compile(r"\bapr_[0-9a-f]{20}\b")


def _paused_on(tool_context: ToolContext) -> tuple[Any, frozenset[str] | None, frozenset[str]]:
    """(the payload of the confirmation this call paused on, the approval ids the run was
    told of before it was asked, the approval ids the reply resuming it says no to), as the
    session recorded them: the ``adk_request_confirmation`` call ADK made for this function
    call id — written by the pause and kept server-side, never the client's say — the tool
    answers before it, and the last user reply's answers to the confirmations that showed a
    request (a no to one of twin pauses on one request refuses it for both). (None, None,
    ...) when there is none. A confirmation ADK asked for itself (a tool's own
    ``require_confirmation``) carries no effectgate payload: what the run had been told (a
    "WAITING FOR APPROVAL … approval id …" answer) is then all that ties the human's yes to a
    request — in the session's own order, no clock compared."""
    call_id = getattr(tool_context, "function_call_id", None)
    session = getattr(tool_context, "session", None)
    found: tuple[Any, frozenset[str]] | None = None
    told: set[str] = set()
    showed: dict[str, str] = {}  # confirmation call id -> the approval id it showed
    nays: frozenset[str] = frozenset()
    for event in getattr(session, "events", None) or ():
        for call in event.get_function_calls() or ():
            args = call.args if call.name == "adk_request_confirmation" else None
            original = args.get("originalFunctionCall") if isinstance(args, dict) else None
            shown = args.get("toolConfirmation") if isinstance(args, dict) else None
            payload = shown.get("payload") if isinstance(shown, dict) else None
            gate_said = payload.get("effectgate") if isinstance(payload, dict) else None
            if isinstance(gate_said, dict) and isinstance(gate_said.get("approval_id"), str):
                showed[str(call.id)] = gate_said["approval_id"]
            if isinstance(original, dict) and call_id is not None and \
                    original.get("id") == call_id:
                found = (payload, frozenset(told))
        responses = event.get_function_responses() or ()
        if event.author == "user" and responses:
            nays = frozenset(showed[str(r.id)] for r in responses
                             if str(r.id) in showed and not _confirmed(r))
        for response in responses:
            told.update(_APPROVAL_ID.findall(str(getattr(response, "response", ""))))
    shown, before = found if found is not None else (None, None)
    return shown, before, nays


def _edited(answered: Any, shown: Any) -> bool:
    """Whether a confirmation's payload carries arguments other than those its pause showed
    (``{"arguments": ...}``, as the pause's payload has them): ADK executes the call's own."""
    return isinstance(answered, Mapping) and "arguments" in answered and \
        answered["arguments"] != (shown.get("arguments") if isinstance(shown, Mapping) else None)


def _confirmed(response: Any) -> bool:
    """Whether a reply to ``adk_request_confirmation`` says yes (read as ADK reads it)."""
    try:
        return bool(ToolConfirmation.from_response_dict(response.response or {}).confirmed)
    except (ValueError, TypeError):  # ADK refuses the reply: no yes
        return False


class _Watch:
    """What one gated call's ``run_async`` did with the tool's function (``watched``, the
    wrapper :func:`_watched` put in ``tool.func``): whether it was called, and the error its
    last call raised, if any."""

    __slots__ = ("called", "raised", "watched")

    def __init__(self, watched: Callable[..., Any] | None) -> None:
        self.watched = watched
        self.called = False
        self.raised: Exception | None = None


_watch: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar(
    "effectgate_adk_watch", default=None)


def _watched(func: Callable[..., Any], unwrapped: Any) -> Callable[..., Any]:
    """``func`` (sync, async, a generator or an async generator, as ``unwrapped`` is, the
    way ADK tells them apart) with every call noted in the current :class:`_Watch`: whoever
    calls ``tool.func`` — ADK's ``run_async``, a subclass's own, on any thread ADK runs it
    on (it copies the context) — is seen."""

    def started() -> _Watch | None:
        watch = _watch.get()
        if watch is None or watch.watched is not watched:
            return None  # another tool's call, or none gated: nothing to note
        watch.called, watch.raised = True, None
        return watch

    def failed(watch: _Watch | None, err: Exception) -> None:
        if watch is not None:
            watch.raised = err

    watched: Callable[..., Any]
    if inspect.isasyncgenfunction(unwrapped):
        async def watched(*args: Any, **kwargs: Any) -> Any:
            watch = started()
            try:
                async for item in func(*args, **kwargs):
                    yield item
            except Exception as err:
                failed(watch, err)
                raise
    elif inspect.isgeneratorfunction(unwrapped):
        def watched(*args: Any, **kwargs: Any) -> Any:
            watch = started()
            try:
                return (yield from func(*args, **kwargs))
            except Exception as err:
                failed(watch, err)
                raise
    elif inspect.iscoroutinefunction(unwrapped):
        async def watched(*args: Any, **kwargs: Any) -> Any:
            watch = started()
            try:
                return await func(*args, **kwargs)
            except Exception as err:
                failed(watch, err)
                raise
    else:
        def watched(*args: Any, **kwargs: Any) -> Any:
            watch = started()
            try:
                return func(*args, **kwargs)
            except Exception as err:
                failed(watch, err)
                raise
    functools.wraps(func)(watched)
    # Named and described as ADK names and describes ``func`` (a callable object, a partial):
    # the declaration built from the wrapper is the one built from ``func``.
    watched.__name__ = watched.__qualname__ = get_callable_name(func)
    if not inspect.isroutine(func):
        watched.__doc__ = get_callable_doc(func)
        try:  # the hints ADK reads, resolved where they were written
            watched.__annotations__ = typing.get_type_hints(
                unwrap_callable(func, follow_wrapped=True), include_extras=True)
        except Exception:  # ADK finds none either
            watched.__annotations__ = {}
    return watched


class _NothingDone(NotExecuted):
    """A call that did nothing: the tool's ``run_async`` answered without calling its function
    (an ``AuthenticatedFunctionTool`` asking the user for credentials), or the call asked the
    user for a confirmation or a credential and returned, to be called again once answered
    (ADK's own ``require_confirmation``, a function calling
    ``tool_context.request_confirmation``). The effect is FAILED, the tool's own answer goes to
    the model, and the call made again runs."""

    def __init__(self, answer: Any, what: str) -> None:
        super().__init__(what)
        self.answer = answer


class UnseenCall(Exception):
    """The tool's own ``run_async`` (a subclass's) answered without calling ``tool.func``:
    it may have reached the function another way, so the outcome is unknown (AMBIGUOUS)."""


class ErrorAnswer(Exception):
    """The tool answered in its own error form (its ``_detect_error_in_response`` flags it, as
    ``GoogleTool``'s ``{"status": "ERROR"}``, the form of an exception it caught): the outcome
    is unknown (AMBIGUOUS)."""


def _asked_user(tool_context: ToolContext) -> bool:
    """True when this call asked the user for a confirmation or a credential (ADK then ends
    the turn and calls it again with the answer)."""
    call_id = getattr(tool_context, "function_call_id", None)
    actions = getattr(tool_context, "actions", None)
    return call_id is not None and any(
        call_id in (getattr(actions, requests, None) or ())
        for requests in ("requested_tool_confirmations", "requested_auth_configs"))


def _unless_answered(tool_context: ToolContext, answer: Any) -> None:
    """Raise :class:`_NothingDone` for a call that asked the user first."""
    if _asked_user(tool_context):
        raise _NothingDone(answer, "the call asked the user first; it runs once answered")


def _outcome(tool: Any, watch: _Watch, answer: Any, tool_context: ToolContext) -> Any:
    """``answer``, the tool's own answer, as the gate records it: the result (COMMITTED), or
    raised for a call that is not one:

    * its function's last call raised and the tool answered anyway (``GoogleTool`` turns any
      exception into ``{"status": "ERROR"}``): that error, classified as a body's (AMBIGUOUS
      unless it says nothing happened);
    * the call asked the user (:func:`_asked_user`): :class:`_NothingDone` (FAILED);
    * the function was not called: :class:`_NothingDone` where that is certain (a tool class
      of ADK's own, all its paths calling ``tool.func``, still the watched function),
      :class:`UnseenCall` (AMBIGUOUS) where not;
    * the tool flags its answer as an error and its class says what one is (it overrides
      ``_detect_error_in_response``, as ``GoogleTool`` does): :class:`ErrorAnswer` (AMBIGUOUS).

    A generator not run yet (a streaming tool in live mode, which ADK iterates after
    ``run_async`` returned) is handed on as it is: work that would run outside the gate, which
    the gate records AMBIGUOUS and refuses (never FAILED: it would run on every repeat).
    """
    if inspect.isgenerator(answer) or inspect.isasyncgen(answer):
        return answer  # a stream not run yet (live mode): the gate refuses unfinished work
    if watch.raised is not None:
        raise watch.raised
    _unless_answered(tool_context, answer)
    name = tool._effectgate.tool_name
    if not watch.called:
        if _adk_own(tool._effectgate_base) and tool.func is tool._effectgate_watched:
            raise _NothingDone(answer, "the tool answered without calling its function")
        raise UnseenCall(f"{name} answered, but its function was not seen called")
    if _flags_errors(tool._effectgate_base) and tool._detect_error_in_response(answer):
        raise ErrorAnswer(f"{name} answered an error: {_shown(answer)}")
    return answer


def _shown(answer: Any) -> str:
    text = repr(answer)
    return text if len(text) <= 200 else text[:199] + "…"


def _adk_own(cls: type[FunctionTool]) -> bool:
    """True for ADK's own tool classes (every class from ``cls`` up to ``FunctionTool``
    defined in ``google.adk``): each path of their ``run_async`` to the function calls
    ``self.func``, so a call unseen there did not happen."""
    mro = cls.__mro__
    return all(c.__module__.startswith("google.adk.")
               for c in mro[: mro.index(FunctionTool) + 1])


def _flags_errors(cls: type[FunctionTool]) -> bool:
    """True when ``cls`` defines its own error answers (overrides ADK's
    ``_detect_error_in_response``, whose ``{"error": ...}`` FunctionTool answers only for
    calls it refused before the function ran)."""
    return getattr(cls, "_detect_error_in_response", None) \
        is not FunctionTool._detect_error_in_response


def _direct_call(tool: Any, tool_context: ToolContext) -> Callable[[Any], Any] | None:
    """The plain sync function called with its arguments (ADK's own context parameter
    injected), to run with the gate on one worker thread; None for anything else (async, or a
    ``def`` wrapping an async function, as ADK tells them apart; generators, a subclass's own
    ``run_async``, a tool confirmation of its own to ask). An awaitable it returns is awaited
    on the run's event loop, as ADK awaits it, before the gate records the outcome (the
    thread waiting for it is the adapter's own: :func:`_hop`)."""
    prepare = getattr(tool, "_prepare_invocation_args", None)
    if not tool._effectgate_plain or tool._require_confirmation or prepare is None:
        return None
    func = tool._effectgate_func
    loop = asyncio.get_running_loop()

    def call(arguments: Any) -> Any:
        answer = func(**prepare(dict(arguments), tool_context))
        if inspect.isawaitable(answer):
            answer = asyncio.run_coroutine_threadsafe(_awaited(answer), loop).result()
        _unless_answered(tool_context, answer)
        return answer

    return call


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


_threads = ThreadPoolExecutor(thread_name_prefix="effectgate-google-adk")


async def _hop(function: Callable[[], Any]) -> Any:
    """``function`` (a sync function's gated call) on the adapter's own threads, in the
    caller's context: one that waits for the awaitable its ``def`` returned, awaited on the
    loop, must not hold a thread of the loop's default executor, which that awaitable may
    need (``asyncio.to_thread``): with all of them held, none would ever finish."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_threads, context.run, function)


def _plain(tool: Any) -> bool:
    """Whether the tool's function is one :func:`_direct_call` may call (read once, when
    gated): a plain ``def`` of ADK's own ``FunctionTool`` — not async, nor wrapping an async
    function as ADK tells them apart, no generator, no positional-only parameter."""
    func = tool._effectgate_func
    unwrapped = getattr(getattr(tool, "_spec", None), "unwrapped_func", func)
    return tool._effectgate_base is FunctionTool and inspect.isfunction(func) \
        and not any(check(f) for f in (func, unwrapped) for check in (
            inspect.iscoroutinefunction, inspect.isgeneratorfunction,
            inspect.isasyncgenfunction)) \
        and not _positional_only(func)


def _positional_only(func: Callable[..., Any]) -> bool:
    """Whether ``func`` has a positional-only parameter (ADK's own call path makes it take a
    keyword; a call by keywords here would raise before the body ran)."""
    return any(p.kind is p.POSITIONAL_ONLY for p in inspect.signature(func).parameters.values())


_classes: dict[type[FunctionTool], type[FunctionTool]] = {}


def _gated_class(cls: type[FunctionTool]) -> type[FunctionTool]:
    """``cls`` with the gate mixed in (one class per tool class)."""
    gated = _classes.get(cls)
    if gated is None:
        # A subclass of the tool's own class (so a copy of the tool can take it as its class;
        # a mixin base in front would change the instance layout), with _Gated's methods.
        namespace = {name: value for name, value in vars(_Gated).items()
                     if not name.startswith("__")}
        namespace.update(__module__=cls.__module__, __doc__=cls.__doc__,
                         _effectgate_base=cls)
        gated = type(cls.__name__, (cls,), namespace)
        _classes[cls] = gated
    return gated


def is_gated(tool: Any) -> bool:
    """True for a tool returned by :func:`gate_tool`."""
    return getattr(type(tool), "_effectgate_base", None) is not None


def _as_tool(tool: Any) -> FunctionTool:
    if isinstance(tool, FunctionTool):
        return tool
    if isinstance(tool, BaseTool) or not callable(tool):
        raise ConfigError("gate_tool takes a google.adk FunctionTool or a function, not "
                          f"{type(tool).__name__}")
    return FunctionTool(tool)


def gate_tool(tool: Any, key: str, *, gate: Gate | None = None,
              effect_type: str | None = None, on_refusal: OnRefusal = "message",
              pause: bool = True, approver: str = DEFAULT_APPROVER,
              **effect_options: Any) -> FunctionTool:
    """Gate an ADK ``FunctionTool`` (or a function) under the key template ``key``.

    Returns a tool of the same class with the same declaration. ``effect_type`` defaults to
    the tool's name; ``effect_options`` are :class:`effectgate.EffectSpec` options.
    ``gate=None`` uses the process-wide default gate. ``pause``: a call the policy sends for
    approval pauses the run (ADK's tool confirmation; see the module docstring); False: the
    model is told in text. ``approver``: who a confirmed resume is recorded as.
    """
    if pause not in (True, False):
        raise ConfigError(f"pause must be True or False, not {pause!r}")
    if not isinstance(approver, str) or not approver.strip():
        raise ConfigError("approver must be a non-empty str")
    inner = _as_tool(tool)
    if is_gated(inner):
        raise ConfigError(f"tool {inner.name!r} is already gated")
    spec = EffectSpec(resolve_gate(gate), key, effect_type=effect_type or inner.name,
                      **effect_options)
    model = _arguments_model(inner)
    if model is not None:
        spec.check_names(model.model_fields, f"tool {inner.name!r}")
    gated = copy.copy(inner)
    gated.__class__ = _gated_class(type(inner))
    gated._effectgate_func = inner.func  # type: ignore[attr-defined]
    gated._effectgate_watched = None  # type: ignore[attr-defined]
    if inner.func is not None:
        unwrapped = getattr(getattr(inner, "_spec", None), "unwrapped_func", None)
        gated.func = gated._effectgate_watched = _watched(  # type: ignore[attr-defined]
            inner.func, unwrapped or inner.func)
    gated._effectgate = GatedCall(  # type: ignore[attr-defined]
        spec, inner.name, on_refusal=on_refusal, pause=keep_refusal)
    gated._effectgate_model = model  # type: ignore[attr-defined]
    gated._effectgate_pause = pause  # type: ignore[attr-defined]
    gated._effectgate_approver = approver  # type: ignore[attr-defined]
    gated._effectgate_plain = _plain(gated)  # type: ignore[attr-defined]
    return gated


def _tool_name(tool: Any) -> str | None:
    """A tool's name for :func:`gate_tools`; a toolset's class name (its tools are listed only
    as the agent runs, so none of them can be gated here: reported, or refused when strict,
    unless that name is read-only)."""
    if isinstance(tool, BaseTool):
        return str(tool.name)
    if isinstance(tool, BaseToolset):
        return type(tool).__name__
    if callable(tool) and not isinstance(tool, type):
        name = getattr(tool, "__name__", None)
        return name if isinstance(name, str) else None
    return None


_FRAMEWORK = Framework("google_adk", tool_name=_tool_name, is_gated=is_gated, wrap=gate_tool)


def gate_tools(tools: Iterable[Any], effects: Any, *, gate: Gate | None = None,
               strict: bool = False, read_only: Iterable[str] = (),
               on_refusal: OnRefusal = "message", pause: bool = True,
               approver: str = DEFAULT_APPROVER) -> list[Any]:
    """Gate the declared tools of a list (``FunctionTool`` s or functions) and pass the rest
    through, in order.

    ``effects``: tool name → key template, → ``{"key": ..., **options}``, or → None
    (read-only); or an :class:`effectgate.Policy` whose rules name their ``tools`` (the gate
    must carry that policy). Every tool left ungated is reported once by name; ``strict=True``
    (or ``policy.strict``) refuses them with ``ConfigError``. So is every toolset (an
    ``McpToolset``...), by its class name: its tools are listed only as the agent runs, so
    none of them can be gated here; list that name in ``read_only`` to accept it.
    ``pause`` / ``approver``: as for :func:`gate_tool`.
    """
    return _gate_tools(_FRAMEWORK, tools, effects, gate=gate, strict=strict,
                       read_only=read_only, on_refusal=on_refusal,
                       wrap_options={"pause": pause, "approver": approver})
