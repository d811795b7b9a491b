"""The model checker's in-memory store: it answers the real flow's commands
(:mod:`effectgate._commands`) from a :class:`~effectgate.verify.model_state.ModelState`, with the
semantics of the store's SQL — each write all or nothing, in the store's order (consume the
approval, forget one set aside, charge, then the compare-and-set or the insert), a refused one
writing nothing but, for an approved move a ceiling refused, why on its effect.

Every rule a write needs is the product's (:mod:`effectgate.decide`); what is written is the
columns the statements write.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import decide
from .._commands import Examine, Fetch, GetApproval, Lapse, Reserve, Resolve, Write
from ..governance import waits_for_room
from ..states import ApprovalState, State
from ..store.rows import Moved
from .model_rows import (
    MApproval,
    MRow,
    adjust,
    approval_row,
    committed,
    dated,
    full,
    head,
    put,
    put_approval,
    resolved_vendor_attempt,
)
from .model_state import ModelState

if TYPE_CHECKING:
    from .._commands import Command
    from ..store.rows import EffectHead

__all__ = ["CALLS", "ModelStore", "Performed", "resolved"]

CALLS: dict[type, str] = {Reserve: "reserve", Fetch: "fetch", Write: "move", Lapse: "lapse",
                          GetApproval: "approval", Examine: "get", Resolve: "resolve"}
"""Each store command's name: the store method the real drivers call for it."""


class Performed(NamedTuple):
    """A command performed: the state after it, its answer, what happened (words), whether a
    lost reply of it is modelled (something was written, or a reservation's read), and the
    approval a successful move consumed."""

    state: ModelState
    answer: Any
    text: str
    lossy: bool = False
    consumed: str | None = None


class ModelStore:
    """The store of one bound; ``one_call``: it inserts a new key in one call that reads
    first (the Postgres shape)."""

    def __init__(self, one_call: bool) -> None:
        self.one_call = one_call

    def perform(self, s: ModelState, command: Command) -> Performed:
        """Answer ``command`` in ``s``."""
        now = float(s.now)
        if isinstance(command, Reserve):
            return self._reserve(s, command, now)
        if isinstance(command, Fetch):
            row = _row(s, command.namespace, command.key)
            return Performed(s, None if row is None else head(row, now), "fetched")
        if isinstance(command, Write):
            if command.row is None:
                return self._insert(s, command, now)
            return self._move(s, command, now)
        if isinstance(command, Lapse):
            return self._lapse(s, command, now)
        if isinstance(command, GetApproval):
            found = next((a for a in s.approvals if a.namespace == command.namespace
                          and a.id == command.approval_id), None)
            return Performed(s, None if found is None else approval_row(found, now),
                             f"read approval {command.approval_id}"
                             + ("" if found is None else f" ({found.state})"))
        if isinstance(command, Examine):
            row = _row(s, command.row.namespace, command.row.key)
            return Performed(s, None if row is None else full(row, now),
                             "read the row for the reconcile hook")
        assert isinstance(command, Resolve), command
        return self._resolve(s, command, now)

    def _reserve(self, s: ModelState, c: Reserve, now: float) -> Performed:
        req = c.req
        row = _row(s, req.namespace, req.key)
        if row is not None:  # a lost reply: the flow cannot tell a lost read from a lost insert
            # SQLite's first read hands up a COMMITTED effect as a repeat reads it.
            found = committed(row, now) if not self.one_call and (
                row.state is State.COMMITTED) else head(row, now)
            return Performed(s, found, "read the existing key", True)
        new = MRow(s.next_id, req.namespace, req.key, req.effect_type, State.IN_FLIGHT, 1, 1,
                   now + req.lease_seconds, now, now, None, None, 1, now, None, c.secret.hash,
                   req.agent_id, payload_hash=req.payload_hash)
        s = s._replace(rows=put(s.rows, new), next_id=s.next_id + 1)
        return Performed(s, head(new, now, inserted=True), "reserved", True)

    def _insert(self, s: ModelState, c: Write, now: float) -> Performed:
        req, move = c.req, c.move
        if self.one_call and decide.reads_first(move):  # one call: it reads first
            existing = _row(s, req.namespace, req.key)
            if existing is not None:
                return Performed(s, Moved(head(existing, now)), "read the existing key", True)
        charged, keys, over = charge(s, req.namespace, move)
        if over is not None:
            return Performed(s, Moved(None, over), f"over the ceiling ({over})")
        if _row(s, req.namespace, req.key) is not None:
            return Performed(s, Moved(None), "insert: the key exists")
        s = charged
        starts = move.to is State.IN_FLIGHT
        new_approval = None
        if c.approval is not None:
            new_approval = MApproval(c.approval.approval_id, req.namespace, s.next_id,
                                     req.effect_type, req.key, ApprovalState.PENDING, now,
                                     req.agent_id, bool(c.approval.allow_self_approval),
                                     estimated=req.estimated_cost_micros)
            s = s._replace(approvals=(*s.approvals, new_approval))
        new = MRow(s.next_id, req.namespace, req.key, req.effect_type, move.to, 1, 1,
                   now + req.lease_seconds if starts else None, now, now, None, move.reason, 1,
                   now if starts else None, None, c.secret.hash if starts else None,
                   req.agent_id, new_approval.id if new_approval else None, keys,
                   req.estimated_cost_micros, req.payload_hash, s.day if keys else None)
        s = s._replace(rows=put(s.rows, new), next_id=s.next_id + 1)
        return Performed(s, Moved(head(new, now, inserted=True)),
                         f"inserted as {move.to.value}", True)

    @staticmethod
    def _move(s: ModelState, c: Write, now: float) -> Performed:
        req, move, seen = c.req, c.move, c.row
        assert seen is not None
        row = _row(s, req.namespace, req.key)
        base = s
        if move.consume_approval is not None:
            used = next((a for a in s.approvals if a.namespace == req.namespace
                         and a.id == move.consume_approval), None)
            if used is None or used.state is not ApprovalState.APPROVED or (
                used.ended is not None or used.effect_type != req.effect_type
                or used.key != req.key
            ):
                return Performed(base, Moved(None), "consume: it moved")
            s = s._replace(approvals=put_approval(s.approvals, used._replace(
                state=ApprovalState.CONSUMED)))
        if move.forget_approval is not None:
            s = _forget(s, req.namespace, move.forget_approval, now)
        s, keys, over = charge(s, req.namespace, move)
        if over is not None:
            if move.consume_approval is not None:  # the refusal written on the effect
                base = _note(base, seen, waits_for_room(over))
            return Performed(base, Moved(None, over), f"over the ceiling ({over})")
        if row is None or row.id != seen.id or row.token != seen.token or (
            row.state is not seen.state
        ):
            return Performed(base, Moved(None), "move: it moved")
        new_approval = None
        if c.approval is not None:
            new_approval = MApproval(c.approval.approval_id, req.namespace, row.id,
                                     req.effect_type, req.key, ApprovalState.PENDING, now,
                                     req.agent_id, bool(c.approval.allow_self_approval),
                                     estimated=req.estimated_cost_micros)
            s = s._replace(approvals=(*s.approvals, new_approval))
        starts = move.to is State.IN_FLIGHT
        new = row._replace(
            state=move.to, attempt=row.attempt + move.attempt_increment,
            token=row.token + 1, lease=now + req.lease_seconds if starts else None,
            started=now, result=None, reason=move.reason,
            vendor_since=(row.vendor_since if row.vendor_since is not None else now)
            if starts else row.vendor_since,
            secret=c.secret.hash if starts else None, pruned=None, actor=req.agent_id,
            approval_id=new_approval.id if new_approval else move.consume_approval,
            budget_keys=keys, estimated=req.estimated_cost_micros, day=s.day if keys else None)
        s = s._replace(rows=put(s.rows, new))
        return Performed(s, Moved(head(new, now)), f"moved to {move.to.value}", True,
                         move.consume_approval)

    @staticmethod
    def _lapse(s: ModelState, c: Lapse, now: float) -> Performed:
        seen = c.row
        row = _row(s, seen.namespace, seen.key)
        if row is None or row.id != seen.id or row.token != seen.token or (
                row.state is not State.IN_FLIGHT) or row.lease is None or row.lease >= now:
            return Performed(s, None, "lapse: it moved")
        new = row._replace(state=State.AMBIGUOUS, reason="lease lapsed", actor="lease")
        return Performed(s._replace(rows=put(s.rows, new)), head(new, now),
                         "lapsed to AMBIGUOUS", True)

    @staticmethod
    def _resolve(s: ModelState, c: Resolve, now: float) -> Performed:
        seen, res = c.row, c.resolution
        row = _row(s, seen.namespace, seen.key)
        if row is None or row.id != seen.id or row.token != seen.token or (
            row.state is not res.expected
        ) or (not res.forced and row.state is State.IN_FLIGHT and row.lease is not None
              and row.lease >= now):  # (the statement's: not on a live lease, unless forced)
            return Performed(s, None, "reconcile: it moved")
        new = resolved(row, res, c.result, "reconcile", c.reason)
        s = s._replace(rows=put(s.rows, new),
                       spend=adjust(s.spend, row.namespace, row.budget_keys, res.spend_delta))
        return Performed(s, full(new, now), f"reconciled {res.to.value}", True)


def charge(s: ModelState, ns: str,
           move: decide.Move) -> tuple[ModelState, str | None, str | None]:
    """The store's charges of ``move``: the state after, the budget keys charged, and the label
    of a ceiling that refused (then nothing is charged). A per-day ceiling's counter is the
    one of the database's date (:func:`~effectgate.verify.model_rows.dated`)."""
    if not move.charges:
        return s, None, None
    spend = dict(((n, k), v) for n, k, v in s.spend)
    charged = []
    for c in move.charges:
        key = dated(c.scope_key, s.day) if c.per_day else c.scope_key
        got = spend.get((ns, key), 0)
        if move.cost > c.limit or ((ns, key) in spend and got + move.cost > c.limit):
            return s, None, c.label
        spend[(ns, key)] = got + move.cost
        charged.append(key)
    return (s._replace(spend=tuple(sorted((n, k, v) for (n, k), v in spend.items()))),
            json.dumps(charged), None)


def resolved(row: MRow, res: decide.Resolution, result: str | None, actor: str,
             reason: str | None = None) -> MRow:
    """``row`` settled as ``res`` says by ``actor`` (a new token: the old holder can no longer
    report)."""
    return row._replace(
        state=res.to, token=row.token + 1, result=result, lease=None, pruned=None,
        actor=actor, reason=reason or actor,
        vendor_attempt=resolved_vendor_attempt(head(row, 0.0), res.to))


def _row(s: ModelState, ns: str, key: str) -> MRow | None:
    return next((r for r in s.rows if r.namespace == ns and r.key == key), None)


def _forget(s: ModelState, namespace: str, approval_id: str, now: float) -> ModelState:
    """The store's ``approval_forget``: a request its effect was decided on again without
    ends, if it was still live (it reads EXPIRED from now on)."""
    found = next((a for a in s.approvals if a.namespace == namespace and a.id == approval_id),
                 None)
    if found is None or found.ended is not None or found.state not in (
            ApprovalState.PENDING, ApprovalState.APPROVED):
        return s
    return s._replace(approvals=put_approval(s.approvals, found._replace(ended=now - 0.001)))


def _note(s: ModelState, seen: EffectHead, reason: str) -> ModelState:
    """The store's ``note_reason``: ``reason`` on the effect ``seen`` read, if its token has
    not moved since."""
    row = _row(s, seen.namespace, seen.key)
    if row is None or row.token != seen.token:
        return s
    return s._replace(rows=put(s.rows, row._replace(reason=reason)))
