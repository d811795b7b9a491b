"""One gated tool call, and the translation of its answer for a model.

The core decides everything (:meth:`effectgate.EffectSpec.run` / ``arun``); :class:`GatedCall`
adds what every framework needs around it:

* identical calls in one turn share one execution (:mod:`.twins`);
* every refusal, and every failed body, becomes a :class:`Refused` whose ``message`` tells the
  model what to do (:mod:`.vocabulary`) — or, with ``on_refusal="raise"``, is raised;
* ``approval_required`` is answered in one place (:meth:`GatedCall.approval`), which a
  framework's own pause for a human (``pause=``) replaces; a ``denied`` answer goes to that
  pause too, since a reviewer's edit may have replaced the request (:mod:`.review`).

Three drivers: :meth:`~GatedCall.run` (sync body), :meth:`~GatedCall.arun` (async body) and
:meth:`~GatedCall.arun_sync` (an async caller with a sync body: reservation, body and report in
one thread hop instead of three).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from effectgate import (
    BeginDecision,
    ConfigError,
    EffectAmbiguous,
    EffectDenied,
    EffectKeyError,
    EffectRefused,
    EffectSpec,
    Outcome,
    PayloadError,
    PayloadMismatch,
    classify_body,
    current_effect,
    recorded_outcome,
)

from .twins import Slot
from .twins import registry as twins
from .vocabulary import model_message, short_error

__all__ = ["GatedCall", "Hop", "OnRefusal", "Pause", "Refused", "is_stopping", "keep_refusal",
           "recorded_failed"]

OnRefusal = Literal["message", "raise"]


@dataclass(frozen=True, slots=True)
class Refused:
    """A gated call that did not produce a result: what to tell the model, and why.

    ``kind`` is a refusing decision (``in_flight``, ``blocked``, ``approval_required``,
    ``denied``), the recorded outcome of a body that raised (``failed``, ``ambiguous``),
    ``invalid`` (arguments that cannot name an effect) or ``conflict`` (a key already used with
    other arguments).
    """

    kind: str
    message: str
    error: BaseException
    key: str | None

    @classmethod
    def of(cls, kind: str, text: str, key: str | None = None, *,
           approval_id: str | None = None) -> Refused:
        """A refusal the adapter kernel decides itself (a reviewer's answer for another
        request, an edit of a decided one ...): ``text`` is its reason, and the model is told
        in the words of ``kind``."""
        error = EffectRefused(text, key=key, decision=kind, reason=text,
                              approval_id=approval_id)
        return cls(kind, model_message(kind, key, error), error, key)

    def as_dict(self) -> dict[str, Any]:
        """Structured fields (for a tool result's raw output)."""
        out: dict[str, Any] = {"effectgate": self.kind, "key": self.key, "message": self.message}
        if isinstance(self.error, EffectRefused):
            out["retry_after_seconds"] = self.error.retry_after_seconds
            out["approval_id"] = self.error.approval_id
            out["reason"] = self.error.reason
        return out


Hop = Callable[[Callable[[], Any]], Awaitable[Any]]
"""Runs a function off the event loop and awaits its result (``asyncio.to_thread``)."""

Pause = Callable[[Refused], Any]
"""A framework's own pause for a human: given the ``approval_required`` refusal, return the
call's answer or raise the framework's pause signal. It is also given a ``denied`` refusal
(the request may have been replaced by a reviewer's edit: :func:`.review.replacement`), and
then returns the answer, calling :meth:`GatedCall.refuse` for a refusal that stands."""


def keep_refusal(refused: Refused) -> Refused:
    """A ``pause`` that hands the ``approval_required`` (or ``denied``) refusal back as the
    answer, in either ``on_refusal`` mode: the adapter then pauses or answers what replaced it
    (see :mod:`.review`), or calls :meth:`GatedCall.refuse`."""
    return refused


def is_stopping(error: BaseException | None) -> bool:
    """True for an error that must stop an agent run under ``on_refusal="raise"``: a refusal,
    or a body error recorded AMBIGUOUS (raised as :class:`EffectAmbiguous`)."""
    return isinstance(error, EffectRefused)


def recorded_failed(error: BaseException) -> bool:
    """True for a body error the gate recorded FAILED and raised as it was (``reraise_failed``
    or raise mode): nothing happened, so a framework's own error handling may answer it."""
    return recorded_outcome(error) is Outcome.FAILED


class _Attempt:
    """Set by the body wrapper: did the body start, and under which decision?"""

    __slots__ = ("decision",)

    def __init__(self) -> None:
        self.decision: BeginDecision | None = None


class GatedCall:
    """A tool's :class:`EffectSpec` plus the translation of its answers.

    ``run(arguments, body)`` returns the body's result, a duplicate's stored result, or a
    :class:`Refused` (``on_refusal="message"``); with ``on_refusal="raise"`` it raises instead:
    the refusal itself, :class:`EffectAmbiguous` for a body error recorded AMBIGUOUS (the
    original as ``__cause__``), and the original error for one recorded FAILED.

    ``raise_as`` turns an effectgate error into the framework's own exception type.
    ``reraise_failed``: exception types that, once classified FAILED (nothing happened), are
    raised as they are even in message mode, so the framework's own error setting answers the
    model (LangChain's ``handle_tool_error``). ``raise_body_errors``: a body error is raised
    as in raise mode even when refusals are messages (a framework told to let tool errors
    raise). ``pause``: the framework's pause for a human, used for ``approval_required`` (see
    :meth:`approval`).
    """

    __slots__ = ("_identity", "_lease", "on_refusal", "pause", "raise_as", "raise_body_errors",
                 "reraise_failed", "spec", "tool_name")

    def __init__(self, spec: EffectSpec, tool_name: str, *, on_refusal: OnRefusal = "message",
                 raise_as: Callable[[BaseException], BaseException] | None = None,
                 reraise_failed: tuple[type[BaseException], ...] = (),
                 raise_body_errors: bool = False, pause: Pause | None = None) -> None:
        if on_refusal not in ("message", "raise"):
            raise ConfigError(f"on_refusal must be 'message' or 'raise', not {on_refusal!r}")
        self.spec = spec
        self.tool_name = tool_name
        self.on_refusal = on_refusal
        self.raise_as = raise_as
        self.reraise_failed = reraise_failed
        self.raise_body_errors = raise_body_errors or on_refusal == "raise"
        self.pause = pause
        gate = spec.gate
        self._identity = (gate.url, gate.namespace, spec.effect_type)
        kind = getattr(spec, "kind", None)
        self._lease = float(getattr(kind, "lease_seconds", None) or spec.lease_seconds
                            or gate.lease_seconds)

    # -- drivers -----------------------------------------------------------------------------

    def run(self, arguments: Mapping[str, Any], body: Callable[[], Any]) -> Any:
        """Gate one synchronous call."""
        slot, leading = self._claim(arguments)
        if slot is not None:
            if leading:
                return twins.lead(slot, lambda: self._call(arguments, body, slot), _shared)
            answer = slot.wait(self._lease)
            if answer is not None:
                return answer.give()
        return self._call(arguments, body)

    async def arun(self, arguments: Mapping[str, Any],
                   body: Callable[[], Awaitable[Any]]) -> Any:
        """Gate one asynchronous call."""
        slot, leading = self._claim(arguments)
        if slot is not None:
            if leading:
                return await twins.alead(slot, lambda: self._acall(arguments, body, slot),
                                         _shared)
            answer = await slot.await_answer(self._lease)
            if answer is not None:
                return answer.give()
        return await self._acall(arguments, body)

    async def arun_sync(self, arguments: Mapping[str, Any], body: Callable[[], Any], *,
                        hop: Hop | None = None) -> Any:
        """Gate one call with a synchronous body from async code: begin, body and report run
        on one worker thread (a cancelled caller leaves it to finish and record the outcome).

        ``hop`` runs a function off the event loop (default ``asyncio.to_thread``): a framework
        passes its own, so its thread settings hold for the body as they would ungated.
        """
        run_off_loop = hop or asyncio.to_thread
        slot, leading = self._claim(arguments)
        if slot is not None:
            if leading:
                return await _lead_off_loop(run_off_loop, slot, lambda: self._call(
                    arguments, body, slot))
            answer = await slot.await_answer(self._lease)
            if answer is not None:
                return answer.give()
        return await run_off_loop(lambda: self._call(arguments, body))

    def _claim(self, arguments: Mapping[str, Any]) -> tuple[Slot | None, bool]:
        try:
            key = self.spec.template.render(arguments)
            # The arguments as the store hashes them (a normalising template's form), so a
            # slot's digest pinned from the store's hash compares like with like.
            normal = self.spec.template.normalise(arguments)
        except Exception:  # the gated call itself reports it
            return None, False
        return twins.claim((*self._identity, key), normal)

    # -- one call --------------------------------------------------------------------------

    def _call(self, arguments: Mapping[str, Any], body: Callable[[], Any],
              slot: Slot | None = None) -> Any:
        attempt = _Attempt()

        def started() -> Any:
            attempt.decision = _began(slot)
            return body()

        try:
            return self.spec.run(arguments, started)
        except Exception as exc:
            return self._settle(exc, attempt, arguments)

    async def _acall(self, arguments: Mapping[str, Any],
                     body: Callable[[], Awaitable[Any]], slot: Slot | None = None) -> Any:
        attempt = _Attempt()

        async def started() -> Any:
            attempt.decision = _began(slot)
            return await body()

        try:
            return await self.spec.arun(arguments, started)
        except Exception as exc:
            return self._settle(exc, attempt, arguments)

    def _settle(self, exc: Exception, attempt: _Attempt, arguments: Mapping[str, Any]) -> Any:
        decision = attempt.decision
        if decision is None:  # refused (or broken) before the body ran
            if isinstance(exc, EffectRefused):
                kind = exc.decision or "blocked"
                refused = Refused(kind, model_message(kind, exc.key, exc), exc, exc.key)
                if kind == "approval_required" or (kind == "denied" and self.pause is not None):
                    return self.approval(refused)
                return self._refuse(refused)
            if isinstance(exc, (EffectKeyError, PayloadError, PayloadMismatch)):
                key = exc.key or self._key(arguments)
                kind = "conflict" if isinstance(exc, PayloadMismatch) else "invalid"
                return self._refuse(Refused(kind, model_message(kind, key, exc), exc, key))
            raise exc
        # What the spec recorded for this body (it classified the error once, as its own).
        outcome = recorded_outcome(exc) or classify_body(
            exc, self.spec.classifiers, keyed=decision.vendor_key is not None)
        if outcome is Outcome.FAILED:
            if self.raise_body_errors or isinstance(exc, self.reraise_failed):
                raise exc
            return Refused("failed", model_message("failed", decision.key, exc), exc,
                           decision.key)
        if self.raise_body_errors:
            ambiguous = EffectAmbiguous(
                f"{decision.key!r} may or may not have happened: the body raised "
                f"{short_error(exc)}", key=decision.key, state="ambiguous", decision="execute",
                reason=short_error(exc), effect_id=decision.effect_id,
            )
            raise self._convert(ambiguous) from exc
        return Refused("ambiguous", model_message("ambiguous", decision.key, exc), exc,
                       decision.key)

    def approval(self, refused: Refused) -> Any:
        """The answer to an ``approval_required`` decision — the one place it is made.

        With a ``pause`` (a framework's own way to stop the run for a human), that (which a
        ``denied`` decision reaches too); else the refusal, as a message or raised like any
        other.
        """
        if self.pause is not None:
            return self.pause(refused)
        return self._refuse(refused)

    def refuse(self, refused: Refused) -> Refused:
        """``refused`` as this call answers a refusal: returned (message mode) or raised."""
        return self._refuse(refused)

    def _refuse(self, refused: Refused) -> Refused:
        if self.on_refusal == "raise":
            raise self._convert(refused.error) from None
        return refused

    def _convert(self, error: BaseException) -> BaseException:
        return self.raise_as(error) if self.raise_as is not None else error

    def _key(self, arguments: Mapping[str, Any]) -> str | None:
        try:
            return self.spec.template.render(arguments)
        except Exception:
            return None


async def _lead_off_loop(run_off_loop: Hop, slot: Slot, call: Callable[[], Any]) -> Any:
    """Lead ``slot`` on a worker thread. A caller cancelled while the thread had not started
    (a busy executor) gives the slot up, and the call never starts: left claimed, every later
    twin of it in this process waited out a whole lease before asking the store."""
    lock = threading.Lock()
    taken = [False]  # by the thread (it leads) or by a cancelled caller (it never will)

    def lead() -> Any:
        with lock:
            if taken[0]:
                return None  # nobody awaits this any more, and the slot is released
            taken[0] = True
        return twins.lead(slot, call, _shared)

    try:
        return await run_off_loop(lead)
    except BaseException:
        with lock:
            abandoned, taken[0] = not taken[0], True
        if abandoned:
            twins.release(slot, None)
        raise


def _began(slot: Slot | None) -> Any:
    """The running body's decision; its payload hash pinned on the twins' slot first."""
    decision = current_effect()
    if slot is not None and decision is not None:
        slot.pin(decision.payload_hash)
    return decision


def _shared(answer: Any) -> bool:
    """Whether a leader's answer is its twins' too: not a denial, which may be the leader's
    own (a per-run or per-agent ceiling): a twin of another run asks the store."""
    if isinstance(answer, Refused):
        return answer.kind != "denied"
    return not isinstance(answer, EffectDenied)
