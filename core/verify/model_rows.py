"""The model's stored rows (:class:`MRow`, :class:`MApproval`), and how the model store hands
them up: as the real store's :class:`~effectgate.store.rows.EffectHead`, ``EffectRow`` and
``ApprovalRow`` (the columns decisions read, with the clock)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from ..payload import payload_hash
from ..states import ApprovalState, State
from ..store.rows import ApprovalRow, EffectHead, EffectRow

__all__ = [
    "KEY",
    "PAYLOAD",
    "PAYLOAD_HASH",
    "VENDOR",
    "MApproval",
    "MRow",
    "adjust",
    "approval_row",
    "full",
    "head",
    "put",
    "put_approval",
]

KEY = "k"
PAYLOAD: dict[str, Any] = {"n": 1}
PAYLOAD_HASH = payload_hash(PAYLOAD)
VENDOR = "generic"


class MRow(NamedTuple):
    """A stored effect in the model (the columns decisions read)."""

    id: int
    namespace: str
    key: str
    effect_type: str
    state: State
    attempt: int
    token: int
    lease: float | None
    started: float | None
    created: float
    result: str | None
    reason: str | None
    vendor_attempt: int | None
    vendor_since: float | None
    pruned: float | None
    secret: str | None
    actor: str | None
    approval_id: str | None = None
    budget_keys: str | None = None
    estimated: int | None = None


class MApproval(NamedTuple):
    """A stored approval request (its clock columns: created; it never expires here)."""

    id: str
    namespace: str
    effect_id: int
    effect_type: str
    key: str
    state: ApprovalState
    created: float


def head(r: MRow, now: float, *, inserted: bool = False) -> EffectHead:
    """The row as the store hands it up (with the clock)."""
    return EffectHead(
        r.id, r.namespace, r.key, r.effect_type, PAYLOAD_HASH, r.state, r.attempt,
        r.token, r.lease, r.started, r.created, r.result, r.reason, VENDOR,
        r.vendor_attempt, r.vendor_since, r.approval_id, r.budget_keys, r.estimated,
        r.pruned, r.secret, now, inserted)


def full(r: MRow, now: float) -> EffectRow:
    """Every column of the row, as the store's ``get`` hands it up (no history)."""
    return EffectRow(
        r.id, r.namespace, r.key, r.effect_type, PAYLOAD_HASH, r.state, r.attempt, r.token,
        r.lease, r.started, r.created, now, r.result, None, r.reason, None, None, None, None,
        None, VENDOR, r.vendor_attempt, r.vendor_since, r.estimated, None, r.approval_id,
        r.actor, None, r.pruned, r.budget_keys, r.secret, None, now)


def approval_row(a: MApproval, now: float) -> ApprovalRow:
    """An approval as the store hands it up."""
    return ApprovalRow(a.id, a.namespace, a.effect_id, a.effect_type, a.key, PAYLOAD_HASH,
                       a.state, None, None, None, 0, a.created, a.created + 1e6, None, None,
                       None, None, now)


def adjust(spend: tuple[tuple[str, str, int], ...], ns: str, keys: str | None,
           delta: int) -> tuple[tuple[str, str, int], ...]:
    """The spend counters after moving each of ``keys`` by ``delta``."""
    if not delta or not keys:
        return spend
    scopes = set(json.loads(keys))
    return tuple((n, k, v + delta) if n == ns and k in scopes else (n, k, v)
                 for n, k, v in spend)


def put_approval(approvals: tuple[MApproval, ...], a: MApproval) -> tuple[MApproval, ...]:
    """``approvals`` with ``a`` replacing the one of its id."""
    return tuple(a if x.id == a.id else x for x in approvals)


def put(rows: tuple[MRow, ...], row: MRow) -> tuple[MRow, ...]:
    """``rows`` with ``row`` written (sorted by id: a canonical state)."""
    out = [r for r in rows if r.id != row.id]
    out.append(row)
    return tuple(sorted(out, key=lambda r: r.id))
