"""The decide ↔ store loop of ``begin``, written twice and small: :meth:`BeginFlow.begin` for
sync callers and :meth:`BeginFlow.abegin` for async ones perform the same steps that the pure
state machine (:mod:`effectgate.decide`) returns — answer, lapse, read the approval, ask the
reconcile hook, move — against the store, until an answer (at most a bounded number of steps:
a key that keeps changing under contention is a :class:`StoreError`, never a guess).

The COMMITTED memo (:class:`~effectgate.memo.CommittedMemo`) answers repeats before the store
is asked; reconcile hooks are called here (a sync hook, or an ``async def`` one awaited on the
caller's loop), their verdicts settled through :func:`effectgate.decide.resolution`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from . import decide, validate
from .decide import Answer, Move, ReadApproval
from .errors import ConfigError, InvalidTransition, PayloadError, StoreError
from .memo import CommittedMemo, MemoEntry
from .notices import AMBIGUOUS, APPROVAL_REQUIRED, BUDGET_WARNING, Observer, notice
from .payload import canonical_json, result_json
from .reconcile import Reconciler, verdict
from .records import BeginDecision
from .redact import describe, redact_text
from .registry import Registry
from .request import LeaseSecret, Request
from .states import ApprovalState, Decision, Outcome, State
from .store import NewApproval, Store
from .store.rows import ApprovalRow, EffectHead, EffectRow, Moved
from .translate import decision, effect_record, loads

__all__ = ["BeginFlow"]

log = logging.getLogger("effectgate")
_MAX_STEPS = 16
_REDACTED = "[redacted]"


class BeginFlow:
    """One namespace's way through ``begin``: the store, the memo and the reconcile hooks."""

    def __init__(self, store: Store, memo: CommittedMemo, reconcilers: Registry[Reconciler],
                 redact: Callable[[str | None], str | None],
                 observe: Observer | None = None,
                 kept: Callable[[str | None, Any], Any] = lambda _type, result: result) -> None:
        self._store = store
        self.observe = observe  # told of approvals requested, lapses, budget warnings
        self._kept = kept
        self.astore = store.async_face()
        self.memo = memo
        self._reconcilers = reconcilers
        self._redact = redact

    def _reconcilable(self, row: EffectHead | None, req: Request) -> bool:
        """Whether a reconcile hook may be asked (looked up only for an AMBIGUOUS row)."""
        return row is not None and row.state is State.AMBIGUOUS and bool(self._reconcilers) and (
            req.effect_type in self._reconcilers)

    def remember(self, key: str, payload: str, effect_type: str, effect_id: int, attempt: int,
                 token: int, result: str | None) -> None:
        """Keep a COMMITTED effect in the memo."""
        self.memo.put(key, MemoEntry(payload, effect_type, effect_id, attempt, token, result))

    def from_memo(self, req: Request) -> BeginDecision | None:
        """A duplicate answered from memory, or None (ask the store)."""
        if not self.memo.size:
            return None
        hit = self.memo.get(req.key)
        if hit is None or hit.payload_hash != req.payload_hash or (
            hit.effect_type != req.effect_type
        ):
            return None  # a mismatch is for the store to refuse, with its own reason
        return BeginDecision(
            decision=Decision.DUPLICATE, effect_id=hit.effect_id, key=req.key,
            effect_type=hit.effect_type, namespace=req.namespace, state=State.COMMITTED,
            attempt=hit.attempt, lease_token=hit.token, result=loads(hit.result),
            payload_hash=req.payload_hash,
        )

    def begin(self, req: Request) -> BeginDecision:
        """The decide ↔ store loop, for sync callers."""
        store, secret = self._store, LeaseSecret()
        first = self._first_move(req)
        try:
            if first is not None:  # governed, one round trip: read, else charge and insert
                done = self._move(None, first, req, secret)
                if isinstance(done, BeginDecision):
                    return done
                row = done if done is not None else store.fetch(req.namespace, req.key)
            else:
                row = store.reserve(req, secret) if req.governance is None else store.fetch(
                    req.namespace, req.key)
        except StoreError as err:
            row = self._recover(req, secret, err)
        if row is not None and row.inserted:
            return self._decision(row, Decision.EXECUTE, secret=secret)
        approval: ApprovalRow | None = None
        for _ in range(_MAX_STEPS):
            step = decide.begin_step(row, req, approval,
                                     reconcilable=self._reconcilable(row, req))
            if isinstance(step, Answer):
                assert row is not None
                return self._answer(row, step)
            if isinstance(step, Move):
                done = self._move(row, step, req, secret)
                if isinstance(done, BeginDecision):
                    return done
                row = done if done is not None else store.fetch(req.namespace, req.key)
            elif isinstance(step, ReadApproval):
                approval = None if step.approval_id is None else store.approval(
                    req.namespace, step.approval_id)
                if approval is None:  # gone: treat as expired
                    approval = _gone(row, step.approval_id)
            elif step is decide.LAPSE:
                assert row is not None
                row = self._lapsed(row) or store.fetch(req.namespace, req.key)
            else:
                assert row is not None
                settled = self._reconcile(row, req)
                if settled is None:
                    return self._answer(row, Answer(Decision.BLOCKED,
                                                    row.reason or "the outcome is unknown"))
                row = settled
        raise StoreError("the effect kept changing under contention; try again", key=req.key)

    async def abegin(self, req: Request) -> BeginDecision:
        """The decide ↔ store loop, for async callers (the same steps, awaited)."""
        store, secret = self.astore, LeaseSecret()
        first = self._first_move(req)
        try:
            if first is not None:
                done = await self._afirst_move(first, req, secret)
                if isinstance(done, BeginDecision):
                    return done
                row = done if done is not None else await store.fetch(req.namespace, req.key)
            else:
                row = await (store.reserve(req, secret) if req.governance is None
                             else store.fetch(req.namespace, req.key))
        except StoreError as err:
            row = await asyncio.to_thread(self._recover, req, secret, err)
        if row is not None and row.inserted:
            return self._decision(row, Decision.EXECUTE, secret=secret)
        approval: ApprovalRow | None = None
        for _ in range(_MAX_STEPS):
            step = decide.begin_step(row, req, approval,
                                     reconcilable=self._reconcilable(row, req))
            if isinstance(step, Answer):
                assert row is not None
                return self._answer(row, step)
            if isinstance(step, Move):
                done = await asyncio.to_thread(self._move, row, step, req, secret)
                if isinstance(done, BeginDecision):
                    return done
                row = done if done is not None else await store.fetch(req.namespace, req.key)
            elif isinstance(step, ReadApproval):
                approval = None if step.approval_id is None else await store.approval(
                    req.namespace, step.approval_id)
                if approval is None:
                    approval = _gone(row, step.approval_id)
            elif step is decide.LAPSE:
                assert row is not None
                row = await asyncio.to_thread(self._lapsed, row) or await store.fetch(
                    req.namespace, req.key)
            else:
                assert row is not None
                settled = await self._areconcile(row, req)
                if settled is None:
                    return self._answer(row, Answer(Decision.BLOCKED,
                                                    row.reason or "the outcome is unknown"))
                row = settled
        raise StoreError("the effect kept changing under contention; try again", key=req.key)

    def _recover(self, req: Request, secret: LeaseSecret, err: StoreError) -> EffectHead | None:
        """A reservation whose reply was lost may have committed: read the key once more;
        the reservation is ours only if nobody has acted on it since
        (:func:`effectgate.decide.adopts_lost_reservation`); any other row is decided on."""
        if not err.outcome_unknown:
            raise err
        try:
            row = self._store.fetch(req.namespace, req.key)
        except StoreError:
            raise StoreError(
                f"the reservation of {req.key!r} may or may not have been written (the store's "
                "reply was lost); the body has not run", outcome_unknown=True, key=req.key,
            ) from err
        if row is not None and secret._raw is not None and decide.adopts_lost_reservation(
                row, secret.hash):
            return row._replace(inserted=True)
        return row

    def _first_move(self, req: Request) -> Move | None:
        """A governed begin's move for a new key, when the store makes it in one round trip
        that reads first (Postgres): no separate read of the key before it."""
        if req.governance is None:
            return None
        step = decide.begin_step(None, req)
        if isinstance(step, Move) and self._store.one_call(step):
            return step
        return None

    def _move(self, row: EffectHead | None, step: Move, req: Request,
              secret: LeaseSecret) -> BeginDecision | EffectHead | None:
        """Perform a move; its answer, or the row to decide on again (None: read it again)."""
        approval = None
        if step.request_approval:
            gov = req.governance
            assert gov is not None and gov.approval is not None
            approval = NewApproval(
                "apr_" + secrets.token_hex(10), gov.approval.expires_seconds,
                gov.approval.allow_self_approval, _arguments(req))
        moved = self._store.move(row, step, req, secret, approval)
        if moved.over_ceiling is not None:
            step = decide.over_ceiling(step, moved.over_ceiling)
            moved = self._store.move(row, step, req, secret)
        return self._after_move(row, step, req, secret, approval, moved)

    async def _afirst_move(self, step: Move, req: Request,
                           secret: LeaseSecret) -> BeginDecision | EffectHead | None:
        """:meth:`_move` of a :meth:`_first_move`, awaited (natively on Postgres)."""
        moved = await self.astore.move_new(step, req, secret)
        if moved.over_ceiling is not None:
            step = decide.over_ceiling(step, moved.over_ceiling)
            moved = await self.astore.move_new(step, req, secret)
        return self._after_move(None, step, req, secret, None, moved)

    def _after_move(self, row: EffectHead | None, step: Move, req: Request,
                    secret: LeaseSecret, approval: NewApproval | None,
                    moved: Moved) -> BeginDecision | EffectHead | None:
        new = moved.row
        if new is None or (row is None and not new.inserted):
            return new  # another writer's row (or None: read it again), to decide on
        if step.budget_warning:
            log.warning("%s: %s", req.key, step.budget_warning,
                        extra={"key": req.key, "reason": step.budget_warning})
        if self.observe is not None and (step.budget_warning or (
                approval is not None and step.decision is Decision.APPROVAL_REQUIRED)):
            self._tell(step, new, req, approval)
        return self._decision(
            new, step.decision, reason=step.reason,
            approval_id=approval.approval_id if approval else None,
            secret=secret if step.decision is Decision.EXECUTE else None,
            budget_warning=step.budget_warning,
        )

    def _tell(self, step: Move, row: EffectHead, req: Request,
              approval: NewApproval | None) -> None:
        """Tell the observer of a new approval request or a budget warning."""
        asked = approval is not None and step.decision is Decision.APPROVAL_REQUIRED
        assert self.observe is not None
        self.observe(notice(
            APPROVAL_REQUIRED if asked else BUDGET_WARNING, row, self._store,
            reason=step.reason if asked else step.budget_warning, run_id=req.run_id,
            agent_id=req.agent_id, approval_id=approval.approval_id if approval else None))

    def _lapsed(self, row: EffectHead) -> EffectHead | None:
        lapsed = self._store.lapse(row)
        if lapsed is not None:
            log.info("lease lapsed: %s is AMBIGUOUS", row.key,
                     extra={"key": row.key, "decision": Decision.BLOCKED.value,
                            "reason": "lease lapsed"})
            if self.observe is not None:
                self.observe(notice(AMBIGUOUS, lapsed, self._store, reason="lease lapsed"))
        return lapsed

    def _answer(self, row: EffectHead, answer: Answer) -> BeginDecision:
        if answer.decision is Decision.DUPLICATE:
            if self.memo.size:
                self.remember(row.key, row.payload_hash, row.effect_type, row.id, row.attempt,
                              row.token, row.result)
            return self._decision(row, Decision.DUPLICATE, reason=answer.reason,
                                  result=loads(row.result))
        return self._decision(row, answer.decision, reason=answer.reason,
                              retry_after_seconds=answer.retry_after_seconds,
                              approval_id=answer.approval_id)

    def _decision(self, row: EffectHead, kind: Decision, *, secret: LeaseSecret | None = None,
                  **extra: Any) -> BeginDecision:
        return decision(row, kind, self._store.secret,
                        None if secret is None else secret.raw, **extra)

    def preview(self, req: Request) -> BeginDecision:
        """What :meth:`begin` would answer now, writing nothing (no reservation, no approval
        request, no charge; spend ceilings are not consulted). For a framework's "does this
        call need approval?" question before it runs anything."""
        row = self._store.fetch(req.namespace, req.key)
        approval = None
        for _ in range(3):
            step = decide.begin_step(row, req, approval,
                                     reconcilable=self._reconcilable(row, req))
            if isinstance(step, ReadApproval):
                approval = (None if step.approval_id is None
                            else self._store.approval(req.namespace, step.approval_id))
                if approval is None:
                    approval = _gone(row, step.approval_id)
                continue
            break
        base = row if row is not None else _unsaved(req, self._store.now())
        if isinstance(step, Answer):
            return self._answer(base, step) if step.decision is not Decision.DUPLICATE else (
                self._decision(base, Decision.DUPLICATE, result=loads(base.result),
                               reason=step.reason))
        if isinstance(step, Move):
            return self._decision(base, step.decision, reason=step.reason,
                                  budget_warning=step.budget_warning)
        return self._decision(base, Decision.BLOCKED, reason=base.reason or "lease lapsed")

    def _reconcile(self, row: EffectHead, req: Request | None, *,
                   by: str | None = None) -> EffectHead | None:
        """Ask the hook (sync callers); the row after its verdict, or None (still unknown).
        ``by``: the operator who asked for it now (recorded with the hook's name)."""
        fn = self._reconcilers.find(row.effect_type)
        full = self._store.get(row.namespace, row.key)
        if fn is None or full is None:
            return None
        try:
            answer: Any = fn(effect_record(full, self._store.secret, with_history=False))
        except Exception as err:
            self._hook_failed(fn, row, err)
            return None
        if asyncio.iscoroutine(answer):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                answer = _run_hook(fn, row, answer)
            else:
                answer.close()
                raise ConfigError(
                    f"the reconcile hook for {row.effect_type} is async, and a sync begin was "
                    "called inside a running event loop: use await gate.abegin(...) (or the "
                    "async decorator) there", key=row.key)
            if answer is None:
                return None
        return self._settle(fn, row, answer, by=by)

    async def _areconcile(self, row: EffectHead, req: Request) -> EffectHead | None:
        """Ask the hook (async callers): an ``async def`` hook on this loop, a sync one on a
        worker thread."""
        fn = self._reconcilers.find(row.effect_type)
        full = await self.astore.get(row.namespace, row.key)
        if fn is None or full is None:
            return None
        record = effect_record(full, self._store.secret, with_history=False)
        try:
            if asyncio.iscoroutinefunction(fn):
                answer: Any = await fn(record)
            else:
                answer = await asyncio.to_thread(fn, record)
                if asyncio.iscoroutine(answer):
                    answer = await answer
        except Exception as err:
            self._hook_failed(fn, row, err)
            return None
        return await asyncio.to_thread(self._settle, fn, row, answer)

    def _hook_failed(self, fn: Reconciler, row: EffectHead, err: BaseException) -> None:
        log.warning("reconcile hook %s failed on %s: %s", _name(fn), row.key,
                    self._redact(describe(err)),
                    extra={"key": row.key, "reason": "reconcile hook raised"})
        return None

    def _settle(self, fn: Reconciler, row: EffectHead, answer: Any, *,
                by: str | None = None) -> EffectHead | None:
        try:
            found = verdict(answer)
            if found is None:
                return None
            outcome = Outcome(found.outcome)
            text = result_json(self._kept(row.effect_type, found.result)) if (
                outcome is Outcome.COMMITTED and found.result is not None) else None
            note = self._redact(validate.text(found.note, "note", validate.MAX_TEXT))
            res = decide.resolution(row, outcome)
        except (ConfigError, PayloadError, InvalidTransition) as err:
            self._hook_failed(fn, row, err)
            return None
        name = (f"{by} via " if by else "") + f"reconciler:{_name(fn)}"
        name = name[:256]
        done = self._store.resolve(row, res, result=text, reason=f"reconciled {outcome.value}",
                                   actor=name, note=note)
        log.info("reconciled %s: %s", row.key, outcome.value,
                 extra={"key": row.key, "state": outcome.value, "reason": note})
        return self._store.fetch(row.namespace, row.key) if done is None else done_head(done)


def _arguments(req: Request) -> str | None:
    """What an approver sees: the normalised arguments, with the policy's names redacted."""
    payload: Mapping[str, Any] = req.payload
    if req.redact_arguments:
        payload = {k: (_REDACTED if k in req.redact_arguments else v) for k, v in payload.items()}
    try:
        return canonical_json(payload, "arguments")
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


def _run_hook(fn: Reconciler, row: EffectHead, coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except Exception as err:
        log.warning("reconcile hook %s failed on %s: %s", _name(fn), row.key,
                    redact_text(describe(err)),
                    extra={"key": row.key, "reason": "reconcile hook raised"})
        return None


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


