"""A framework's own pause for a human, written once: what the human is shown, and what each
answer does in the store.

A gated call whose policy needs approval gets ``approval_required`` from the store, with an
approval request bound to the effect's key and payload hash. A framework that can pause a run
(LangGraph ``interrupt()``, OpenAI Agents ``needs_approval``, LlamaIndex
``ctx.wait_for_event``, pydantic-ai deferred tools) shows the human a :class:`Review` of that
request and, when the run resumes, hands this module the human's :class:`Verdict`:

* **approve** — the request is approved in the store (``gate.approve``) *for the payload hash
  the human was shown*, then the call is gated again: it executes once, and a replayed resume
  finds it done (a duplicate, answered from the store).
* **edit** — the edited arguments are another payload: they are gated as their own effect (the
  key the template gives them, or, when that is the original key or an edit of it,
  ``<key>~edit:<hash16>``) with their own approval. A reviewer's explicit edit
  (``Verdict.approves_edit``, the default) is that reviewer's approval of exactly those
  arguments, recorded so; an edit the framework cannot tell from altered history
  (pydantic-ai's resume) leaves the new request pending for a human, and the call pauses
  again on it. Either way the original request is first denied, "replaced by an edit", with
  the edit's key in the reason: the original never executes. If a human approved the
  original meanwhile (the CLI, the console), that decision stands: the original runs, once,
  and the edit does not run beside it.
* **reject** — the request is denied (``gate.deny``); nothing executes, and it stays denied.
  If a human approved it meanwhile (the CLI, the console), that decision stands, as it does
  for an edit: the call runs, once, and the model is told what ran — never "rejected" over a
  store that stays approved (the next call with these arguments would execute).

The store is the one source of truth: a resumed call is gated *before* the answer is read, so
a request a human already approved (or denied) in the CLI or the console is executed (or
refused) whatever the resume says, and the answer is applied only while the request is still
pending. An answer that names another approval id or another payload hash than the call's is
refused and changes nothing.

A replayed resume (a framework re-running the paused call after it was answered) meets its
request decided. Approved, the call is a duplicate: the stored result. Replaced by an edit,
:func:`replacement` answers with what the edit's effect answers (its stored result once it
ran), so the model is told what ran, never "denied". Frameworks that pause outside the store
(OpenAI Agents' ``RunState``) ask :func:`store_decision` what the store decided for a call: an
interruption the store has no decision for stays waiting.

Every function here reads or writes the store synchronously; the ``a``-prefixed twins run them
off the event loop.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from effectgate import (
    ApprovalRecord,
    ApprovalState,
    ConfigError,
    Decision,
    EffectGateError,
    EffectKeyError,
    Gate,
    InvalidTransition,
    PayloadError,
    PayloadMismatch,
    Request,
    State,
    UnknownEffect,
    refusal,
    validate,
)
from effectgate.gatelike import GateLike
from effectgate.keys import check_key

from .call import GatedCall, Refused
from .vocabulary import model_message

__all__ = [
    "DECISIONS",
    "REDACTED",
    "Replacement",
    "Review",
    "StoreDecision",
    "Verdict",
    "aapply",
    "apply",
    "areplacement",
    "astore_decision",
    "decided",
    "edited_call",
    "keyed_as",
    "replaced",
    "replaced_by",
    "replacement",
    "review_of",
    "store_decision",
]

DECISIONS: tuple[str, ...] = ("approve", "edit", "reject")
"""The answers a reviewer may give (LangChain's ``respond`` is not one: it would let a human
stand in for an effect that never ran)."""

REDACTED = "[redacted]"
"""What a reviewer is shown of an argument the policy redacts; an edit that leaves it so keeps
the original value."""

_EDIT_MARK = "~edit:"
_MAX_APPROVAL_ID = 64
_REPLACED = "replaced by an edit"
_REPLACED_BY = _REPLACED + " (key {key})"
_REPLACED_PATTERN = re.compile(
    r"replaced by an edit \((?:effect #([1-9][0-9]{0,17})|key (.+))\)", re.DOTALL)
"""An edit's denial of the request it replaced: naming the edit's key (an earlier version named
its effect id, after it ran)."""


@dataclass(frozen=True, slots=True)
class Review:
    """One approval request as a reviewer sees it: what would execute, and what binds it."""

    approval_id: str
    payload_hash: str
    key: str
    effect_type: str
    tool_name: str
    arguments: dict[str, Any]
    """The normalised arguments that execute if approved (redacted names read
    ``"[redacted]"``)."""
    expires_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON fields (what a framework's pause payload carries under ``effectgate``)."""
        return {"approval_id": self.approval_id, "payload_hash": self.payload_hash,
                "key": self.key, "effect_type": self.effect_type, "expires_at": self.expires_at}

    def description(self) -> str:
        """One paragraph for the reviewer."""
        return (f"effectgate: {self.tool_name} needs a human's approval before it runs "
                f"(effect {self.key!r}, approval {self.approval_id}). Approving executes "
                "exactly these arguments, once.")


@dataclass(frozen=True, slots=True)
class Verdict:
    """A reviewer's answer: ``approve``, ``edit`` (with ``arguments``) or ``reject``.

    ``by`` names the reviewer (recorded as the approver). ``approval_id`` and
    ``payload_hash``, when the answer carries them, must be the approval and the hash the
    reviewer was shown. ``approves_edit``: an edit is the reviewer's approval of the edited
    arguments (True); False when the framework cannot tell a reviewer's edit from arguments
    changed on the way (the edited request is then left pending for a human).
    """

    kind: Literal["approve", "edit", "reject"]
    by: str
    arguments: Mapping[str, Any] | None = None
    message: str | None = None
    payload_hash: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    approval_id: str | None = None
    approves_edit: bool = True

    def __post_init__(self) -> None:
        if self.kind not in DECISIONS:
            raise ConfigError(f"a decision is one of {', '.join(DECISIONS)}, not {self.kind!r}")
        if self.kind == "edit" and not isinstance(self.arguments, Mapping):
            raise ConfigError("an edit decision needs the edited arguments (a mapping)")
        # Checked as the store will check them, so a bad answer is refused here (and asked
        # again) rather than failing after the pause.
        object.__setattr__(self, "by", validate.text(self.by, "a decision's by", 256,
                                                     required=True))
        object.__setattr__(self, "message", validate.text(
            self.message or None, "a decision's message", validate.MAX_TEXT))
        if self.payload_hash is not None and (not isinstance(self.payload_hash, str)
                                              or len(self.payload_hash) > 128):
            raise ConfigError("a decision's payload_hash must be the hash it was shown")
        if self.approval_id is not None and (not isinstance(self.approval_id, str)
                                             or len(self.approval_id) > _MAX_APPROVAL_ID):
            raise ConfigError("a decision's approval_id must be the approval it was shown")
        if self.approves_edit not in (True, False):
            raise ConfigError("a decision's approves_edit is True or False")


def review_of(gated: GatedCall, refused: Refused, arguments: Mapping[str, Any]) -> Review:
    """The :class:`Review` of an ``approval_required`` refusal, read from the store."""
    approval_id = getattr(refused.error, "approval_id", None)
    if not approval_id:
        raise ConfigError("an approval_required refusal without an approval id")
    record = gated.spec.gate.approval(approval_id)
    shown = record.arguments
    if not isinstance(shown, dict):
        shown = dict(gated.spec.template.normalise(arguments))
    return Review(approval_id=record.approval_id, payload_hash=record.payload_hash,
                  key=record.key, effect_type=record.effect_type, tool_name=gated.tool_name,
                  arguments=shown, expires_at=record.expires_at.isoformat())


def keyed_as(key: str, call_key: str) -> bool:
    """Whether ``key`` is ``call_key`` or the key of an edit of it (``<call_key>~edit:…``)."""
    return key == call_key or key.startswith(call_key + _EDIT_MARK)


def edited_call(gated: GatedCall, original_key: str) -> GatedCall:
    """``gated`` for a reviewer's edited arguments: their own effect (see the module doc).

    The key is the template's for the edited arguments, unless that is ``original_key`` or
    ``original_key`` is itself an edit of it: then ``<key>~edit:<hash16>``, so an edit never
    shares a key with the call it replaces (nor an edit of an edit with the first edit)."""
    spec = copy.copy(gated.spec)
    base = gated.spec.request

    def request(arguments: Mapping[str, Any]) -> Any:
        req = base(arguments)
        if not keyed_as(original_key, req.key):
            return req
        return req._replace(key=check_key(f"{req.key}{_EDIT_MARK}{req.payload_hash[:16]}"))

    spec.request = request  # type: ignore[method-assign]
    clone = copy.copy(gated)
    clone.spec = spec
    return clone


def _merged(edit: Mapping[str, Any], shown: Mapping[str, Any],
            original: Mapping[str, Any]) -> dict[str, Any]:
    """The edited arguments, with every value left as ``"[redacted]"`` put back."""
    out = dict(edit)
    for name, value in edit.items():
        if value == REDACTED and shown.get(name) == REDACTED and name in original:
            out[name] = original[name]
    return out


def _current_hash(gated: GatedCall, arguments: Mapping[str, Any]) -> str | None:
    try:
        return str(gated.spec.request(arguments).payload_hash)
    except (EffectKeyError, ConfigError):
        return None


def _mismatch(review: Review, what: str) -> Refused:
    return Refused.of("denied", f"the reviewer's answer was for {what} than this call's; "
                      "nothing was approved", review.key)


def _rejected(review: Review, verdict: Verdict) -> Refused:
    why = f"rejected by {verdict.by}" + (f": {verdict.message}" if verdict.message else "")
    return Refused.of("denied", why, review.key)


def _approval_id(out: Any) -> str | None:
    if isinstance(out, Refused) and out.kind == "approval_required":
        return getattr(out.error, "approval_id", None)
    return None


def _approve(gated: GatedCall, approval_id: str, by: str, note: str | None) -> None:
    # Already decided meanwhile (the CLI, the console) or a self-approval the policy forbids:
    # the store's answer stands, and the next begin reads it.
    with contextlib.suppress(InvalidTransition, UnknownEffect):
        gated.spec.gate.approve(approval_id, by=by, note=note)


def _deny(gated: GatedCall, approval_id: str, by: str, reason: str) -> bool:
    """Deny the request; False when a human approved it meanwhile (the CLI, the console): that
    approval stands, and the call is answered as the store decided, as it would have been had
    the approval landed before the resumed call was gated."""
    gate = gated.spec.gate
    try:
        gate.deny(approval_id, by=by, reason=reason)
    except UnknownEffect:
        return True
    except InvalidTransition:
        return gate.approval(approval_id).state not in (ApprovalState.APPROVED,
                                                         ApprovalState.CONSUMED)
    return True


def _replace(gated: GatedCall, approval_id: str, by: str, other: GatedCall,
             edited: Mapping[str, Any]) -> bool | Refused:
    """Deny the original request, replaced by the edit (named by its key, so a replayed call
    of the original finds what ran instead: :func:`replacement`) — before the edit runs.

    When the request was no longer pending: False if a human approved the original meanwhile
    (the CLI, the console: the store's decision wins, and the edit must not run beside it);
    True if its denial names this very edit (a replayed resume: the edit's effect answers);
    otherwise — rejected, expired, or replaced by *another* edit (two resumes editing one
    request at once) — the refusal to answer with: an edit of a decided request would be the
    same call's effect again under a fresh key.

    An edit that cannot be keyed (its template fails on the edited arguments, or the
    ``~edit:`` key grows past the key limit) is refused as ``invalid`` and denies nothing: the
    request stays pending for an edit that can run, or for the original's approval."""
    try:
        key = other.spec.request(edited).key
    except (EffectKeyError, PayloadError) as err:
        return Refused("invalid", model_message("invalid", err.key, err), err, err.key)
    gate = gated.spec.gate
    try:
        gate.deny(approval_id, by=by, reason=_REPLACED_BY.format(key=key))
    except UnknownEffect:
        return True
    except InvalidTransition:
        record = gate.approval(approval_id)
        if record.state in (ApprovalState.APPROVED, ApprovalState.CONSUMED):
            return False
        if replaced_by(gate, record, key):
            return True
        return decided(record)
    return True


def replaced(record: ApprovalRecord) -> bool:
    """Whether the approval request ``record`` was denied as replaced by an edit (any)."""
    return record.state is ApprovalState.DENIED and \
        _REPLACED_PATTERN.fullmatch(record.reason or "") is not None


def replaced_by(gate: GateLike, record: ApprovalRecord, key: str) -> bool:
    """Whether the approval request ``record`` was denied as replaced by the edit whose effect
    key is ``key`` (named by that key, or, in an earlier version's reason, by its effect id)."""
    if record.state is not ApprovalState.DENIED:
        return False
    found = _REPLACED_PATTERN.fullmatch(record.reason or "")
    if found is None:
        return False
    if found[2] is not None:
        return bool(found[2] == key)
    try:
        return bool(gate.get(key).effect_id == int(found[1]))
    except (EffectGateError, ValueError):
        return False


def decided(record: ApprovalRecord) -> Refused:
    """The answer to arguments other than the ones a decided request binds: nothing runs."""
    return Refused.of("denied", f"approval {record.approval_id} was already decided "
                      f"({record.state.value}); arguments other than the ones it showed are "
                      "not carried out", record.key, approval_id=record.approval_id)


Run = Callable[[GatedCall, Mapping[str, Any]], Any]
ARun = Callable[[GatedCall, Mapping[str, Any]], Awaitable[Any]]


Validate = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def _prepare(gated: GatedCall, review: Review, verdict: Verdict, arguments: Mapping[str, Any],
             validate: Validate | None) -> tuple[Refused | None, dict[str, Any] | None]:
    """(a refusal to answer with, or None; the edited arguments for an edit)."""
    if verdict.approval_id is not None and verdict.approval_id != review.approval_id:
        return _mismatch(review, "another approval"), None
    if verdict.payload_hash is not None and verdict.payload_hash != review.payload_hash:
        return _mismatch(review, "other arguments"), None
    if _current_hash(gated, arguments) != review.payload_hash:
        return _mismatch(review, "other arguments"), None
    if verdict.kind != "edit":
        return None, None
    assert verdict.arguments is not None
    edited = _merged(verdict.arguments, review.arguments, arguments)
    if validate is not None:
        try:
            edited = dict(validate(edited))
        except Exception as err:  # the framework's validation error, whatever its type
            text = f"the reviewer's edited arguments are invalid ({type(err).__name__})"
            error = EffectKeyError(text, key=review.key)
            return Refused("invalid", model_message("invalid", review.key, error), error,
                           review.key), None
        if not _settled(gated, edited, validate):
            text = ("the tool's schema changes the edited arguments again each time it "
                    "validates them (a validator that is not idempotent), so an edit cannot "
                    "bind what would run; reject the call and let the model call again")
            error = EffectKeyError(text, key=review.key)
            return Refused("invalid", model_message("invalid", review.key, error), error,
                           review.key), None
    return None, edited


def _settled(gated: GatedCall, edited: Mapping[str, Any], validate: Validate) -> bool:
    """Whether validating the validated edit again leaves it as it is. The reviewer edits the
    arguments as shown (validated), and a framework may validate what it runs once more: a
    validator that converts (dollars to cents) would then run another payload than the one
    the edit's approval binds, or than the one the reviewer saw (an edit is refused)."""
    try:
        again = validate(edited)
    except Exception:  # the framework's validation error, whatever its type
        return False
    return _current_hash(gated, again) == _current_hash(gated, edited)


def apply(gated: GatedCall, review: Review, verdict: Verdict, arguments: Mapping[str, Any],
          run: Run, *, validate: Validate | None = None) -> Any:
    """Carry out ``verdict`` on the paused call (``arguments``); ``run(gated, args)`` gates a
    call and returns its answer (a result, or a :class:`Refused`). Returns the answer: for an
    edit that leaves its request pending (``approves_edit=False``), that request's
    ``approval_required`` refusal, for the framework to pause on.

    ``validate`` checks an edit's arguments the framework's way (its tool schema) and returns
    them validated; an error refuses the edit as ``invalid`` (nothing recorded)."""
    refused, edited = _prepare(gated, review, verdict, arguments, validate)
    if refused is not None:
        return refused
    if verdict.kind == "reject":
        if not _deny(gated, review.approval_id, verdict.by, verdict.message or "rejected"):
            return run(gated, arguments)  # approved meanwhile: that decision stands
        return _rejected(review, verdict)
    if edited is None or _current_hash(gated, edited) == review.payload_hash:
        _approve(gated, review.approval_id, verdict.by, verdict.message)
        return run(gated, arguments)
    other = edited_call(gated, review.key)
    replaced = _replace(gated, review.approval_id, verdict.by, other, edited)
    if isinstance(replaced, Refused):
        return replaced  # decided otherwise meanwhile, or an edit that cannot be keyed
    if not replaced:
        return run(gated, arguments)  # approved meanwhile: that decision stands
    out = run(other, edited)
    wanted = _approval_id(out)
    if wanted is not None and verdict.approves_edit:
        _approve(other, wanted, verdict.by, f"edited from approval {review.approval_id}")
        out = run(other, edited)
    return out


async def aapply(gated: GatedCall, review: Review, verdict: Verdict,
                 arguments: Mapping[str, Any], run: ARun, *,
                 validate: Validate | None = None) -> Any:
    """:func:`apply` for async callers (``run`` is awaited; store calls leave the loop)."""
    refused, edited = _prepare(gated, review, verdict, arguments, validate)
    if refused is not None:
        return refused
    if verdict.kind == "reject":
        if not await gated.spec.gate.store.on_worker(
                _deny, gated, review.approval_id, verdict.by, verdict.message or "rejected"):
            return await run(gated, arguments)  # approved meanwhile: that decision stands
        return _rejected(review, verdict)
    if edited is None or _current_hash(gated, edited) == review.payload_hash:
        await gated.spec.gate.store.on_worker(_approve, gated, review.approval_id,
                                              verdict.by, verdict.message)
        return await run(gated, arguments)
    other = edited_call(gated, review.key)
    replaced = await gated.spec.gate.store.on_worker(
        _replace, gated, review.approval_id, verdict.by, other, edited)
    if isinstance(replaced, Refused):
        return replaced  # decided otherwise meanwhile, or an edit that cannot be keyed
    if not replaced:
        return await run(gated, arguments)  # approved meanwhile: that decision stands
    out = await run(other, edited)
    wanted = _approval_id(out)
    if wanted is not None and verdict.approves_edit:
        await other.spec.gate.store.on_worker(_approve, other, wanted, verdict.by,
                                             f"edited from approval {review.approval_id}")
        out = await run(other, edited)
    return out


# -- a replayed call whose request an edit replaced ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Replacement:
    """What ran instead of a request a reviewer replaced by an edit.

    ``key``: the edit's effect. ``answer``: what that effect answers now — its stored result
    (as a duplicate returns it), or a :class:`Refused` while it is in flight, blocked, waiting
    for approval or denied."""

    key: str
    answer: Any


def replacement(gated: GatedCall, out: Any, arguments: Mapping[str, Any]) -> Replacement | None:
    """For ``out``, a call's ``denied`` answer: the edit that replaced its request, if a
    reviewer's edit did (see the module doc); None otherwise, and None while the edit has not
    run (its arguments are not kept, so it cannot be run from here)."""
    if not isinstance(out, Refused) or out.kind != "denied" or not out.key:
        return None
    gate = gated.spec.gate
    try:
        request = gated.spec.request(arguments)
        record = gate.get(out.key)
        if (record.state is not State.DENIED or record.approval_id is None
                or record.payload_hash != request.payload_hash):
            return None
        denial = gate.approval(record.approval_id)
        found = _REPLACED_PATTERN.fullmatch(denial.reason or "")
        if denial.state is not ApprovalState.DENIED or found is None:
            return None
        edit = gate.get_by_id(int(found[1])) if found[1] else gate.get(found[2])
        if edit.effect_type != record.effect_type or edit.effect_id == record.effect_id:
            return None
        head = gate.preview(request._replace(key=edit.key, payload_hash=edit.payload_hash))
    except (EffectGateError, ValueError):  # a link that leads nowhere: the denial stands
        return None
    return _answer_of(gated, head)


def _answer_of(gated: GatedCall, head: Any) -> Replacement | None:
    if head.decision is Decision.DUPLICATE:
        return Replacement(head.key, gated.spec.answer(head))
    if head.decision is Decision.EXECUTE:
        return None
    error = refusal(head)
    kind = head.decision.value
    return Replacement(head.key, Refused(kind, model_message(kind, head.key, error), error,
                                         head.key))


async def areplacement(gated: GatedCall, out: Any,
                       arguments: Mapping[str, Any]) -> Replacement | None:
    """:func:`replacement` off the event loop (nothing is read for any other answer)."""
    if not isinstance(out, Refused) or out.kind != "denied":
        return None
    return await gated.spec.gate.store.on_worker(replacement, gated, out, arguments)


# -- what the store decided for a call (frameworks that pause outside it) ----------------------


@dataclass(frozen=True, slots=True)
class StoreDecision:
    """What the store decided for one call: ``approved`` (a human approved exactly this
    payload: it may run, and runs once) or ``denied`` (``reason``: why)."""

    kind: Literal["approved", "denied"]
    reason: str | None = None


def store_decision(gate: GateLike, request: Request) -> StoreDecision | None:
    """What the store decided for ``request``, or None: no decision yet (pending, or no
    request for a human at all — a framework's own pause is not the store's to answer).

    ``approved`` only when an approval request bound to exactly this payload hash was
    approved (or already consumed by the attempt that ran it): an effect the policy lets run
    without a human is never "approved" here."""
    try:
        head = gate.preview(request)
    except PayloadMismatch:
        return None  # the key belongs to other arguments: the gated call answers that
    if head.decision is Decision.DENIED:
        return StoreDecision("denied", head.reason)
    if head.decision is Decision.APPROVAL_REQUIRED:
        return None
    try:
        record = gate.get(request.key)
        if record.payload_hash != request.payload_hash or record.approval_id is None:
            return None
        approval = gate.approval(record.approval_id)
    except UnknownEffect:
        return None
    if approval.payload_hash == request.payload_hash and approval.state in (
            ApprovalState.APPROVED, ApprovalState.CONSUMED):
        return StoreDecision("approved")
    return None


async def astore_decision(gate: Gate, request: Request) -> StoreDecision | None:
    """:func:`store_decision` off the event loop."""
    return await gate.store.on_worker(store_decision, gate, request)
