"""The ``begin`` flow, written once, sans I/O: :func:`begin_steps` is a generator that yields
store commands (:mod:`effectgate._commands`) and receives their answers, performing the steps
the pure state machine (:mod:`effectgate.decide`) returns — answer, lapse, read the approval,
ask the reconcile hook, move — until an answer (at most a bounded number of steps: a key that
keeps changing under contention is a :class:`StoreError`, never a guess).

Its drivers (:mod:`effectgate._drive`) perform the commands against the sync store or its
async face; the model checker performs them against its in-memory store, so it explores this
very sequence (the httpx ``auth_flow`` shape). :class:`BeginFlow` is the gate's face on it:
the COMMITTED memo (answering repeats before the store is asked), ``begin`` / ``abegin`` as
thin calls of the drivers, ``preview``, and an operator's ``reconcile``.

The lease secret and the approval id are drawn through injectable sources, so a schedule
replays deterministically.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _drive, decide, validate
from ._commands import (
    CallHook,
    Command,
    Examine,
    Fetch,
    GetApproval,
    HookFailed,
    Lapse,
    Reserve,
    Resolve,
    Tell,
    Write,
)
from .decide import Answer, Move, ReadApproval
from .errors import ConfigError, InvalidTransition, PayloadError, StoreError, UnknownEffect
from .governance import dollars
from .keys import compensation_key, legacy_compensation_key
from .memo import CommittedMemo
from .notices import AMBIGUOUS, APPROVAL_REQUIRED, BUDGET_WARNING, Observer, notice
from .payload import canonical_json, payload_hash, result_json
from .reconcile import Reconciler, verdict
from .records import BeginDecision
from .redact import describe
from .registry import UNDO_SUFFIX, Registry
from .request import LeaseSecret, Request
from .states import ApprovalState, Decision, Outcome, State
from .store import NewApproval, Store
from .store.rows import ApprovalRow, CommittedHead, EffectHead, EffectRow
from .translate import committed_decision, decision, effect_record, loads, remembered

if TYPE_CHECKING:
    from .store.async_pg import AsyncPostgres
    from .store.threaded import ThreadedStore

__all__ = ["BeginFlow", "Flow", "Parts", "begin_steps", "done_head", "reconcile_steps"]

log = logging.getLogger("effectgate")
_MAX_STEPS = 16
_REDACTED = "[redacted]"
_AMBIGUOUS, _EXECUTE = State.AMBIGUOUS, Decision.EXECUTE
_LOST = "the reservation's reply was lost and the key could not be read back: never ran"

_new = tuple.__new__
Flow = Generator[Command, Any, Any]
"""A flow: yields commands, is sent their answers (or thrown the store's errors)."""


def _approval_id() -> str:
    return "apr_" + secrets.token_hex(10)


def _keep(_type: str | None, result: Any) -> Any:
    return result


def _same(text: str | None) -> str | None:
    return text


class Parts(NamedTuple):
    """What a flow knows besides the request: the store's shape and vendor secret, the
    reconcile hooks, the memo, and the gate's redaction and result-keeping rules."""

    one_call: Callable[[Move], bool]
    """Whether the store inserts a new key by this move in one call that reads first."""
    vendor_secret: bytes
    reconcilers: Registry[Reconciler]
    memo: CommittedMemo
    redact: Callable[[str | None], str | None] = _same
    kept: Callable[[str | None, Any], Any] = _keep
    approval_ids: Callable[[], str] = _approval_id


def begin_steps(parts: Parts, req: Request,
                secret: LeaseSecret) -> Generator[Command, Any, BeginDecision]:
    """The decide ↔ store loop of one ``begin`` of ``req``, issuing ``secret`` with a lease."""
    first = None if req.governance is None else _first_move(parts, req)
    row: EffectHead | CommittedHead | None
    try:
        if first is not None:  # governed, one round trip: read, else charge and insert
            done = yield from _move(parts, None, first, req, secret)
            if isinstance(done, BeginDecision):
                return done
            row = done if done is not None else (yield Fetch(req.namespace, req.key))
        elif req.governance is None:
            row = yield _new(Reserve, (req, secret))  # the tuple itself: every begin makes one
        else:
            row = yield Fetch(req.namespace, req.key)
    except StoreError as err:
        row = yield from _recover(req, secret, err)
    if isinstance(row, CommittedHead):  # a repeat of a COMMITTED effect, as SQLite reads it
        repeat = decide.begin_step(row, req)
        if isinstance(repeat, Answer) and repeat.decision is Decision.DUPLICATE:
            return _duplicate(parts, row, repeat)
        full: EffectHead | None = yield Fetch(req.namespace, req.key)  # the rules ask more
        row = full
    elif row is not None and row.inserted:  # every executed effect: the decision itself
        return decision(row, _EXECUTE, parts.vendor_secret, secret.raw)
    approval: ApprovalRow | None = None
    for _ in range(_MAX_STEPS):
        step = decide.begin_step(row, req, approval, reconcilable=row is not None and (
            row.state is _AMBIGUOUS) and _reconcilable(parts, row, req))
        if isinstance(step, Answer):
            assert row is not None
            return _answer(parts, row, step)
        if isinstance(step, Move):
            done = yield from _move(parts, row, step, req, secret)
            if isinstance(done, BeginDecision):
                return done
            row = done if done is not None else (yield Fetch(req.namespace, req.key))
        elif isinstance(step, ReadApproval):
            approval = None if step.approval_id is None else (
                yield GetApproval(req.namespace, step.approval_id))
            if approval is None:  # gone: treat as expired
                approval = _gone(row, step.approval_id)
        elif step is decide.LAPSE:
            assert row is not None
            row = (yield from _lapse(row)) or (yield Fetch(req.namespace, req.key))
        else:
            assert row is not None
            settled = yield from reconcile_steps(parts, row)
            if settled is None:
                return _answer(parts, row, Answer(Decision.BLOCKED,
                                                  row.reason or "the outcome is unknown"))
            row = settled
    raise StoreError("the effect kept changing under contention; try again", key=req.key)


def _recover(req: Request, secret: LeaseSecret,
             err: StoreError) -> Generator[Command, Any, EffectHead | None]:
    """A reservation whose reply was lost may have committed: read the key once more; the
    reservation is ours only if nobody has acted on it since
    (:func:`effectgate.decide.adopts_lost_reservation`); any other row is decided on."""
    if not err.outcome_unknown:
        raise err
    row = yield from _read_back(req, err)
    if row is not None and secret.issued and decide.adopts_lost_reservation(row, secret.hash):
        return row._replace(inserted=True)
    return row


def _read_back(req: Request, err: StoreError) -> Generator[Command, Any, EffectHead | None]:
    """The key read once more after a write whose reply was lost (``err``)."""
    try:
        row: EffectHead | None = yield Fetch(req.namespace, req.key)
    except StoreError:
        raise StoreError(
            f"the reservation of {req.key!r} may or may not have been written (the store's "
            "reply was lost); the body has not run", outcome_unknown=True, key=req.key,
        ) from err
    return row


def _reconcilable(parts: Parts, row: EffectHead | None, req: Request) -> bool:
    """Whether a reconcile hook may be asked (looked up only for an AMBIGUOUS row)."""
    return row is not None and row.state is State.AMBIGUOUS and bool(parts.reconcilers) and (
        req.effect_type in parts.reconcilers)


def _first_move(parts: Parts, req: Request) -> Move | None:
    """A governed begin's move for a new key, when the store makes it in one round trip that
    reads first (Postgres): no separate read of the key before it."""
    if req.governance is None:
        return None
    step = decide.begin_step(None, req)
    if isinstance(step, Move) and parts.one_call(step):
        return step
    return None


def _move(parts: Parts, row: EffectHead | None, step: Move, req: Request,
          secret: LeaseSecret) -> Generator[Command, Any, BeginDecision | EffectHead | None]:
    """Perform a move; its answer, or the row to decide on again (None: read it again)."""
    approval = None
    if step.request_approval:
        gov = req.governance
        assert gov is not None and gov.approval is not None
        approval = NewApproval(parts.approval_ids(), gov.approval.expires_seconds,
                               gov.approval.allow_self_approval, _arguments(req))
    try:
        moved = yield Write(row, step, req, secret, approval)
    except StoreError as err:  # its reply lost: the move may have been written
        if not (err.outcome_unknown and secret.issued and step.to is State.IN_FLIGHT):
            raise
        found = yield from _read_back(req, err)
        if found is not None and decide.adopts_lost_move(
                found, secret.hash, 1 if row is None else row.token + 1):
            return _decision(parts, found, Decision.EXECUTE, secret=secret,
                             budget_warning=step.budget_warning)
        return found  # not ours: decided on again
    if moved.over_ceiling is not None:
        instead = decide.over_ceiling(step, moved.over_ceiling)
        if isinstance(instead, Answer):  # an approved request waits, unconsumed (see decide)
            assert row is not None
            return _answer(parts, row, instead)
        step = instead
        moved = yield Write(row, step, req, secret)
    new: EffectHead | None = moved.row
    if new is None or (row is None and not new.inserted):
        return new  # another writer's row (or None: read it again), to decide on
    asked = approval is not None and step.decision is Decision.APPROVAL_REQUIRED
    if step.budget_warning or asked:
        yield Tell(logging.WARNING if step.budget_warning else logging.NOTSET, "%s: %s",
                   (req.key, step.budget_warning or step.reason),
                   {"key": req.key, "reason": step.budget_warning or step.reason}, notice(
                       APPROVAL_REQUIRED if asked else BUDGET_WARNING, new,
                       reason=step.reason if asked else step.budget_warning,
                       run_id=req.run_id, agent_id=req.agent_id,
                       approval_id=approval.approval_id if approval else None))
    return _decision(
        parts, new, step.decision, reason=step.reason,
        approval_id=approval.approval_id if approval else None,
        secret=secret if step.decision is Decision.EXECUTE else None,
        budget_warning=step.budget_warning,
    )


def _lapse(row: EffectHead) -> Generator[Command, Any, EffectHead | None]:
    lapsed: EffectHead | None = yield Lapse(row)
    if lapsed is not None:
        yield Tell(logging.INFO, "lease lapsed: %s is AMBIGUOUS", (row.key,),
                   {"key": row.key, "decision": Decision.BLOCKED.value,
                    "reason": "lease lapsed"}, notice(AMBIGUOUS, lapsed, reason="lease lapsed"))
    return lapsed


def reconcile_steps(parts: Parts, row: EffectHead, *,
                    by: str | None = None) -> Generator[Command, Any, EffectHead | None]:
    """Ask the hook for ``row``'s effect type; the row after its verdict, or None (still
    unknown). ``by``: the operator who asked for it now (recorded with the hook's name)."""
    fn = parts.reconcilers.find(row.effect_type)
    if fn is None:
        return None
    full: EffectRow | None = yield Examine(row)
    if full is None:
        return None
    answer = yield CallHook(fn, effect_record(full, parts.vendor_secret, with_history=False))
    if isinstance(answer, HookFailed):
        yield _hook_failed(parts, fn, row, answer.error)
        return None
    try:
        found = verdict(answer)
        if found is None:
            return None
        outcome = Outcome(found.outcome)
        text = result_json(parts.kept(row.effect_type, found.result)) if (
            outcome is Outcome.COMMITTED and found.result is not None) else None
        note = parts.redact(validate.text(found.note, "note", validate.MAX_TEXT))
        res = decide.resolution(row, outcome)
    except Exception as err:  # junk the hook returned, a redactor that raised: it failed
        yield _hook_failed(parts, fn, row, err)
        return None
    name = ((f"{by} via " if by else "") + f"reconciler:{_name(fn)}")[:256]
    done = yield Resolve(row, res, text, f"reconciled {outcome.value}", name, note)
    yield Tell(logging.INFO, "reconciled %s: %s", (row.key, outcome.value),
               {"key": row.key, "state": outcome.value, "reason": note})
    if done is None:
        again: EffectHead | None = yield Fetch(row.namespace, row.key)
        return again
    return done_head(done)


def _hook_failed(parts: Parts, fn: Reconciler, row: EffectHead, err: BaseException) -> Tell:
    return Tell(logging.WARNING, "reconcile hook %s failed on %s: %s",
                (_name(fn), row.key, parts.redact(describe(err))),
                {"key": row.key, "reason": "reconcile hook raised"})


def _answer(parts: Parts, row: EffectHead, answer: Answer) -> BeginDecision:
    if answer.decision is Decision.DUPLICATE:
        return _duplicate(parts, row, answer)
    return _decision(parts, row, answer.decision, reason=answer.reason,
                     retry_after_seconds=answer.retry_after_seconds,
                     approval_id=answer.approval_id)


def _undo_rows(store: Store, req: Request,
               step_id: int) -> tuple[EffectRow | None, EffectRow | None]:
    """What :func:`_undoable` reads for the undo ``req``: the step it names, and, when ``req``
    (``step_id``) is at the key an older effectgate gave that step's undo
    (:func:`~effectgate.keys.legacy_compensation_key`), the effect already there."""
    step = store.get_by_id(req.namespace, step_id)
    if step is None or req.key != legacy_compensation_key(step.key):
        return step, None
    return step, store.get(req.namespace, req.key)


def _undoable(req: Request, step: EffectRow | None, at_old_key: EffectRow | None) -> None:
    """Refuse the undo ``req`` unless the step it names (``compensates_effect_id``, read as
    ``step``) committed: begun while its step is in flight, waiting, failed or unknown, an
    undo would undo nothing the step then does, and could never run again at its key
    (:class:`UnknownEffect` for no such step in the namespace, else
    :class:`InvalidTransition`; nothing is written). A COMMITTED step never moves again, so
    the read stays true.

    An undo's own type (``<type>.compensate``) is counted by no spend ceiling, so such a
    request must be the one undo of the step it names: of that step's type plus the suffix,
    at :func:`~effectgate.keys.compensation_key` of its key, with the step's compensation as
    its payload (another payload there would take the key, and the step's own undo could
    never begin at it), declaring no more than its step
    spent (its actual cost where its holder reported one, else its estimate; what
    :func:`~effectgate.sagas.compensation_request` declares), or :class:`ConfigError`. Any
    committed effect, named as the step of a charge called an undo, would else let that
    charge past every ceiling, as many times and for as much as it liked. The key an older
    effectgate gave the undo of a step keyed ``sha256:…`` is taken only where that undo
    already is (``at_old_key``: it compensates the step, with the undo's type): the undo begun
    then is retried where it is, and no other may begin there. An undo is never undone
    itself (:class:`ConfigError`): its undo would be counted by no ceiling either, nor would
    the undo of that, and so on for as long as a type may grow."""
    if step is None:
        raise UnknownEffect(f"{req.key!r} undoes effect {req.compensates_effect_id}, which is "
                            "not in this namespace", key=req.key)
    if step.compensates_effect_id is not None:
        raise ConfigError(
            f"{req.key!r} undoes {step.key!r}, which is itself an undo (of effect "
            f"{step.compensates_effect_id}): an undo is not undone; a step that reverses it "
            "is an effect of its own, counted by the ceilings", key=req.key)
    if req.effect_type.endswith(UNDO_SUFFIX):
        undo_key, undo_type = compensation_key(step.key), step.effect_type + UNDO_SUFFIX
        begun_then = at_old_key is not None and at_old_key.key == req.key and (
            at_old_key.compensates_effect_id == step.id and at_old_key.effect_type == undo_type)
        if req.effect_type != undo_type or (req.key != undo_key and not begun_then):
            raise ConfigError(
                f"{req.key!r} ({req.effect_type}) is not the undo of {step.key!r} "
                f"({step.effect_type}): a step's one undo is of type "
                f"{step.effect_type + UNDO_SUFFIX!r} at key {undo_key!r}", key=req.key)
        if req.payload_hash != payload_hash({"effect_id": step.id,
                                             "compensation": loads(step.compensation)}):
            raise ConfigError(
                f"{req.key!r} is not the undo of {step.key!r}: its payload is not the step's "
                "compensation as the step recorded it (compensation_request of the step), so "
                "the step's own undo could never begin at its key", key=req.key)
        if (req.estimated_cost_micros or 0) > (spent := _spent(step)):
            raise ConfigError(
                f"{req.key!r} declares {dollars(req.estimated_cost_micros or 0)}, more than "
                f"its step {step.key!r} spent ({dollars(spent)}): no ceiling counts an undo, "
                "so it gives back at most what its step was charged", key=req.key)
    if step.state is not State.COMMITTED:
        state = decide.effective_state(step).value
        raise InvalidTransition(
            f"{req.key!r} undoes {step.key!r}, which is {state}, not committed: an undo runs "
            "only once its step committed (resolve the step first)", key=req.key, state=state)


def _spent(step: EffectRow) -> int:
    """What ``step`` was charged: its actual cost where its holder reported one, else its
    estimate (none: 0)."""
    cost = step.actual_cost_micros if step.actual_cost_micros is not None else (
        step.estimated_cost_micros)
    return cost or 0


def _duplicate(parts: Parts, row: EffectHead | CommittedHead, answer: Answer) -> BeginDecision:
    """The answer to a repeat of the COMMITTED ``row``: its stored result (remembered in the
    memo: COMMITTED is terminal)."""
    if parts.memo.size:
        parts.memo.remember(row.key, row.payload_hash, row.effect_type, row.id, row.attempt,
                            row.token, row.result)
    result = loads(row.result)
    if isinstance(row, CommittedHead):  # no lease, approval or spend to tell of
        return committed_decision(row, parts.vendor_secret, result, answer.reason)
    return _decision(parts, row, Decision.DUPLICATE, reason=answer.reason, result=result)


def _decision(parts: Parts, row: EffectHead, kind: Decision, *,
              secret: LeaseSecret | None = None, result: Any = None,
              retry_after_seconds: float | None = None, reason: str | None = None,
              approval_id: str | None = None,
              budget_warning: str | None = None) -> BeginDecision:
    # Every extra named, not passed on as **extra: a dictionary built and spread again on
    # every begin cost as much as the decision itself.
    return decision(row, kind, parts.vendor_secret, None if secret is None else secret.raw,
                    result=result, retry_after_seconds=retry_after_seconds, reason=reason,
                    approval_id=approval_id, budget_warning=budget_warning)


class BeginFlow:
    """One namespace's way through ``begin``: the store, the memo and the reconcile hooks.

    ``secrets``: where each begin's lease secret comes from; ``approval_ids``: where a new
    approval request's id comes from (both injectable, for deterministic replays)."""

    def __init__(self, store: Store, memo: CommittedMemo, reconcilers: Registry[Reconciler],
                 redact: Callable[[str | None], str | None],
                 observe: Observer | None = None,
                 kept: Callable[[str | None, Any], Any] = _keep, *,
                 secrets: Callable[[], LeaseSecret] = LeaseSecret,
                 approval_ids: Callable[[], str] = _approval_id) -> None:
        self._store = store
        self.observe = observe  # told of approvals requested, lapses, budget warnings
        self.memo = memo
        self._remembers, self._find = memo.size > 0, memo.find
        self.remember = memo.remember
        """Keep a COMMITTED effect in the memo (the memo's own method: one call a report)."""
        self._secrets = secrets
        self.parts = Parts(store.one_call, store.secret, reconcilers, memo, redact, kept,
                           approval_ids)

    @property
    def astore(self) -> ThreadedStore | AsyncPostgres:
        """The store's async face (made on an async caller's first call: a sync worker never
        imports asyncio)."""
        return self._store.async_face()

    def from_memo(self, req: Request) -> BeginDecision | None:
        """A duplicate answered from memory, or None (ask the store)."""
        if not self._remembers:
            return None
        hit = self._find(req.key)
        if hit is None:
            return None
        payload, effect_type, effect_id, attempt, token, result = hit
        if payload != req.payload_hash or effect_type != req.effect_type:
            return None  # a mismatch is for the store to refuse, with its own reason
        return remembered(req.namespace, req.key, effect_type, effect_id, attempt, token,
                          payload, loads(result))

    def begin(self, req: Request) -> BeginDecision:
        """The flow of ``req``, driven against the store (sync callers)."""
        if req.compensates_effect_id is not None:  # an undo: its step, read first
            _undoable(req, *_undo_rows(self._store, req, req.compensates_effect_id))
        secret = self._secrets()
        try:
            done: BeginDecision = _drive.drive(begin_steps(self.parts, req, secret),
                                               self._store, self.observe)
        except StoreError as err:
            self._release_lost(err, req, secret)
            raise
        return done

    async def abegin(self, req: Request) -> BeginDecision:
        """The flow of ``req``, driven against the store's async face (async callers)."""
        if req.compensates_effect_id is not None:  # an undo (rare): its step read off the loop
            _undoable(req, *await self._store.on_worker(_undo_rows, self._store, req,
                                                        req.compensates_effect_id))
        secret = self._secrets()
        try:
            done: BeginDecision = await _drive.adrive(
                begin_steps(self.parts, req, secret), self._store, self.astore, self.observe)
        except StoreError as err:
            self._release_lost(err, req, secret)
            raise
        return done

    def _release_lost(self, err: StoreError, req: Request, secret: LeaseSecret) -> None:
        """A begin that gave up unsure whether its reservation was written (its reply lost,
        the key unreadable after): the body never ran, so the reservation, if it was made, is
        released FAILED by a thread of its own once the key can be read (never left to lapse
        into AMBIGUOUS, for an operator). Only a row still IN_FLIGHT under ``secret``, which
        no one else holds, is released."""
        if err.outcome_unknown and secret.issued:
            from .store.abandoned import release_lost  # asyncio with it: only after a loss

            release_lost(self._store, req.namespace, req.key, secret, _LOST)

    def reconcile(self, row: EffectHead, *, by: str | None = None) -> EffectHead | None:
        """Ask the hook now (for an operator ``by``): the row after its verdict, or None."""
        settled: EffectHead | None = _drive.drive(reconcile_steps(self.parts, row, by=by),
                                                  self._store, self.observe)
        return settled

    def preview(self, req: Request) -> BeginDecision:
        """What :meth:`begin` would answer now, writing nothing (no reservation, no approval
        request, no charge; spend ceilings are not consulted). For a framework's "does this
        call need approval?" question before it runs anything."""
        if req.compensates_effect_id is not None:  # refused as begin refuses it
            _undoable(req, *_undo_rows(self._store, req, req.compensates_effect_id))
        row = self._store.fetch(req.namespace, req.key)
        approval = None
        for _ in range(3):
            step = decide.begin_step(row, req, approval,
                                     reconcilable=_reconcilable(self.parts, row, req))
            if isinstance(step, ReadApproval):
                approval = (None if step.approval_id is None
                            else self._store.approval(req.namespace, step.approval_id))
                if approval is None:
                    approval = _gone(row, step.approval_id)
                continue
            break
        base = row if row is not None else _unsaved(req, self._store.now())
        if isinstance(step, Answer):
            return _answer(self.parts, base, step) if step.decision is not (
                Decision.DUPLICATE) else _decision(self.parts, base, Decision.DUPLICATE,
                                                   result=loads(base.result),
                                                   reason=step.reason)
        if isinstance(step, Move):
            return _decision(self.parts, base, step.decision, reason=step.reason,
                             budget_warning=step.budget_warning)
        return _decision(self.parts, base, Decision.BLOCKED,
                         reason=base.reason or "lease lapsed")


def _arguments(req: Request) -> str | None:
    """What an approver sees: the normalised arguments, with the policy's names redacted."""
    payload: Mapping[str, Any] = req.payload
    if req.redact_arguments:
        payload = {k: (_REDACTED if k in req.redact_arguments else v) for k, v in payload.items()}
    try:
        return canonical_json(payload, "arguments", as_dumped=True)  # stored, shown: as dumped
    except PayloadError:
        return None


def _gone(row: EffectHead | None, approval_id: str | None) -> ApprovalRow:
    """An approval that is no longer there reads as expired."""
    assert row is not None
    return ApprovalRow(approval_id or "", row.namespace, row.id, row.effect_type, row.key,
                       row.payload_hash, ApprovalState.EXPIRED, None, None, None, 0, 0.0,
                       0.0, None, None, None, None, row.now)


def _unsaved(req: Request, now: float) -> EffectHead:
    """The row a new key would have (for a preview, which writes nothing)."""
    return EffectHead(0, req.namespace, req.key, req.effect_type, req.payload_hash,
                      State.IN_FLIGHT, 1, 0, None, None, now, None, None, req.vendor, 1, None,
                      None, None, req.estimated_cost_micros, None, None, now, False)


def done_head(row: EffectRow) -> EffectHead:
    """The head of a full row."""
    return EffectHead(
        row.id, row.namespace, row.key, row.effect_type, row.payload_hash, row.state,
        row.attempt, row.token, row.lease_expires_at, row.attempt_started_at, row.created_at,
        row.result, row.reason, row.vendor, row.vendor_attempt, row.vendor_since,
        row.approval_id, row.budget_keys, row.estimated_cost_micros, row.pruned_at,
        row.lease_secret, row.now)


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))
