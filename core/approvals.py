"""Approvals: a human's yes or no, bound to (effect type, key, payload hash), single use, and
expiring.

``begin`` on an effect whose policy asks for approval records a request and answers
``approval_required`` with its id; the effect waits in PENDING_APPROVAL. ``approve`` marks the
request approved; the next ``begin`` with exactly that payload consumes it (in the same
transaction that starts the attempt) and executes. A changed payload on the same key is a
``PayloadMismatch``; another key is another approval. ``deny`` ends the effect as DENIED, and
that "no" holds. An expired request is replaced by a new one at the next ``begin``.
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, InvalidTransition, UnknownEffect
from .records import ApprovalRecord, epoch_to_datetime

if TYPE_CHECKING:
    from .gate import Gate

__all__ = ["DENIED_PREFIX", "approve", "deny", "list_approvals", "new_id", "status"]

DENIED_PREFIX = "approval denied"


def new_id() -> str:
    """A fresh approval id."""
    return "apr_" + secrets.token_hex(10)


def status(row: Any) -> str:
    """pending, approved, denied, consumed or expired (None reads as expired)."""
    if row is None:
        return "expired"
    if row.state in ("pending", "approved") and row.expires_at < row.now:
        return "expired"
    return str(row.state)


def record(row: Any) -> ApprovalRecord:
    """An approvals row as an :class:`ApprovalRecord`."""
    return ApprovalRecord(
        approval_id=row.id, effect_id=row.effect_id, effect_type=row.effect_type, key=row.key,
        payload_hash=row.payload_hash, state=status(row), requested_by=row.requested_by,
        run_id=row.run_id, estimated_cost_micros=row.estimated_cost_micros,
        created_at=epoch_to_datetime(row.created_at),  # type: ignore[arg-type]
        expires_at=epoch_to_datetime(row.expires_at),  # type: ignore[arg-type]
        decided_by=row.decided_by, decided_at=epoch_to_datetime(row.decided_at),
        reason=row.reason,
    )


def _pending(gate: Gate, approval_id: str, by: str) -> Any:
    if not isinstance(approval_id, str) or not approval_id:
        raise ConfigError("an approval id is a non-empty str")
    row = gate.store.approval(approval_id)
    if row is None or row.namespace != gate.namespace:
        raise UnknownEffect(f"no approval with id {approval_id!r}")
    state = status(row)
    if state != "pending":
        raise InvalidTransition(f"approval {approval_id} is {state}, not pending",
                                key=row.key, state=state, effect_id=row.effect_id)
    return row


def approve(gate: Gate, approval_id: str, by: str, note: str | None) -> ApprovalRecord:
    """Approve a pending request (see :meth:`Gate.approve`)."""
    row = _pending(gate, approval_id, by)
    if not row.allow_self_approval and row.requested_by is not None and by == row.requested_by:
        raise InvalidTransition(
            f"{by} requested {row.key!r} and cannot approve its own request",
            key=row.key, state="pending", reason="self-approval is not allowed",
        )
    if gate.store.decide_approval(approval_id, "approved", by, note) is None:
        return approve(gate, approval_id, by, note)  # it changed: report what it is now
    return record(gate.store.approval(approval_id))


def deny(gate: Gate, approval_id: str, by: str, reason: str | None) -> ApprovalRecord:
    """Deny a pending request; its effect becomes DENIED for good (see :meth:`Gate.deny`)."""
    row = _pending(gate, approval_id, by)
    why = f"{DENIED_PREFIX} by {by}" + (f": {reason}" if reason else "")
    store = gate.store
    with store.transaction() as tx:
        if tx.one(store.sql.approval_decide, {"approval_id": approval_id, "state": "denied",
                                              "by": by, "reason": reason}) is None:
            tx.rollback()
        effect = store.fetch_id(row.effect_id)
        if effect is not None and effect.state == "pending_approval" and (
            effect.approval_id == approval_id
        ):
            tx.effect(store.sql.resolve, {
                "id": effect.id, "token": effect.token, "expected_state": "pending_approval",
                "state": "denied", "result": None, "error": None, "reason": why, "actor": by,
                "note": reason, "h_by": json.dumps(by), "h_note": json.dumps(reason),
            })
    return record(store.approval(approval_id))


def list_approvals(gate: Gate, state: str | None) -> list[ApprovalRecord]:
    """Approval requests of this namespace, newest first, optionally of one state."""
    rows = gate.store.approvals(gate.namespace)
    out = [record(r) for r in rows]
    return [a for a in out if state is None or a.state == state]
