"""What each per-call write sends: the bind parameters of a reservation, a move, a holder's
report and a heartbeat, built from a validated request or lease — one definition for the sync
store and its async face (:mod:`effectgate.store.async_pg`), so the two cannot drift.

Also the approval request a move creates (:class:`NewApproval`), and the reading of the
governed reservation's ceiling refusal (:func:`over_ceiling`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from ..request import secret_hash
from ..states import State
from .lines import encode_text

if TYPE_CHECKING:
    from ..decide import Move
    from ..request import Lease, LeaseSecret, Request
    from ..states import Outcome
    from .rows import EffectHead
    from .sql import Sql

__all__ = [
    "BARE_NAMES", "BARE_OMITS", "COMMITTED_NAMES", "NULL_NOTE", "NewApproval", "bare_binds",
    "begin_binds", "committed_binds", "extend_binds", "is_bare", "late_binds", "move_binds",
    "outcome_binds", "over_ceiling",
]

NULL_NOTE = "null"
"""A history line's note when there is none (the encoded JSON ``null``)."""

BARE_OMITS = frozenset({
    "actor", "agent_id", "approval_id", "budget_keys", "compensates_effect_id", "compensation",
    "estimated_cost_micros", "group_key", "note", "reason", "run_id", "vendor",
})
"""The columns a plain reservation of a bare request (:func:`is_bare`) leaves out of its
insert: every one of them would be NULL."""


class NewApproval:
    """An approval request a move creates: its id, lifetime, and what the approver sees."""

    __slots__ = ("allow_self_approval", "approval_id", "arguments", "expires_seconds")

    def __init__(self, approval_id: str, expires_seconds: float, allow_self_approval: bool,
                 arguments: str | None) -> None:
        self.approval_id = approval_id
        self.expires_seconds = expires_seconds
        self.allow_self_approval = allow_self_approval
        self.arguments = arguments


def _late(note: str | None) -> str:
    return "late report" + (f": {note}" if note else "")


_LATE = encode_text(_late(None))


def begin_binds(req: Request, state: State, lease_secret: str | None) -> dict[str, Any]:
    """The binds of an insert (or take) of ``req`` into ``state``."""
    return {
        "namespace": req.namespace, "key": req.key, "effect_type": req.effect_type,
        "payload_hash": req.payload_hash, "state": state.value,
        "lease_seconds": req.lease_seconds, "reason": None, "run_id": req.run_id,
        "agent_id": req.agent_id, "group_key": req.group_key,
        "compensation": req.compensation, "compensates_effect_id": req.compensates_effect_id,
        "vendor": req.vendor, "estimated_cost_micros": req.estimated_cost_micros,
        "approval_id": None, "budget_keys": None, "actor": req.agent_id, "note": None,
        "lease_secret": lease_secret, "h_by": encode_text(req.agent_id),
        "h_note": NULL_NOTE,
    }


def is_bare(req: Request) -> bool:
    """Whether ``req`` carries none of the optional fields (no run, agent, group,
    compensation, vendor or cost): its plain reservation is the bare insert."""
    return (req.run_id is None and req.agent_id is None and req.group_key is None
            and req.compensation is None and req.compensates_effect_id is None
            and req.vendor is None and req.estimated_cost_micros is None)


BARE_NAMES = ("namespace", "key", "effect_type", "payload_hash", "lease_seconds",
              "lease_secret")
"""The binds of the bare insert, in the order :func:`bare_binds` makes them (its numbered
text's order: ``tests/test_store_statements.py`` holds the two together)."""
COMMITTED_NAMES = ("result", "namespace", "key", "token", "lease_secret")
"""The binds of the plain COMMITTED report, in the order :func:`committed_binds` makes them."""


def bare_binds(sql: Sql, req: Request,
               lease_secret: str) -> dict[str, Any] | tuple[Any, ...]:
    """The binds of ``sql``, the bare insert of a plain reservation of ``req``
    (:func:`is_bare`): by position where its text is numbered (every executed effect binds
    them: no mapping built to be taken apart again), else by name."""
    values = (req.namespace, req.key, req.effect_type, req.payload_hash, req.lease_seconds,
              lease_secret)
    return values if sql.order is not None else dict(zip(BARE_NAMES, values, strict=True))


def move_binds(row: EffectHead | None, move: Move, req: Request, secret: LeaseSecret,
               approval: NewApproval | None) -> dict[str, Any]:
    """The binds of ``move`` (an insert when ``row`` is None, else a compare-and-set)."""
    starts = move.to is State.IN_FLIGHT
    binds = begin_binds(req, move.to, secret.hash if starts else None)
    binds["reason"] = move.reason
    binds["lease_seconds"] = req.lease_seconds if starts else None
    binds["approval_id"] = move.consume_approval if approval is None else approval.approval_id
    binds["attempt_increment"] = move.attempt_increment
    if row is not None:
        binds.update(id=row.id, token=row.token, expected_state=row.state.value)
    if move.charges:  # the governed reservation's arrays (Postgres)
        binds.update(cost=move.cost, scope_keys=[c.scope_key for c in move.charges],
                     limits=[c.limit for c in move.charges],
                     per_day=[c.per_day for c in move.charges])
    return binds


def outcome_binds(namespace: str, lease: Lease, outcome: Outcome, *, result: str | None,
                  error: str | None, reason: str | None, note: str | None,
                  actual_cost_micros: int | None,
                  keeps_vendor_key: bool = False) -> dict[str, Any]:
    """The binds of a holder's report, on time (:func:`late_binds` makes the late form, only
    when the report came late). ``keeps_vendor_key``: a FAILED a built-in classifier inferred
    from a connection error, which leaves the next attempt the vendor key it has."""
    return {
        "namespace": namespace, "key": lease.key, "token": lease.token,
        "lease_secret": secret_hash(lease.secret), "state": str(outcome), "result": result,
        "error": error, "reason": reason, "actual_cost_micros": actual_cost_micros,
        "h_note": NULL_NOTE if note is None else encode_text(note),
        "keeps_vendor_key": keeps_vendor_key,
    }


def committed_binds(sql: Sql, namespace: str, lease: Lease,
                    result: str | None) -> dict[str, Any] | tuple[Any, ...]:
    """The binds of ``sql``, the report of a COMMITTED outcome with nothing but its
    result (by position or by name, as :func:`bare_binds`)."""
    values = (result, namespace, lease.key, lease.token, secret_hash(lease.secret))
    return values if sql.order is not None else dict(zip(COMMITTED_NAMES, values, strict=True))


def late_binds(binds: dict[str, Any], note: str | None) -> dict[str, Any]:
    """The binds of the late form of the report whose on-time binds are ``binds``."""
    return {**binds, "h_note": _LATE if note is None else encode_text(_late(note))}


def extend_binds(namespace: str, lease: Lease, seconds: float,
                 vendor_ref: str | None = None) -> dict[str, Any]:
    """The binds of a heartbeat."""
    return {"namespace": namespace, "key": lease.key, "token": lease.token,
            "lease_secret": secret_hash(lease.secret), "lease_seconds": seconds,
            "vendor_ref": vendor_ref}


def over_ceiling(err: StoreError, move: Move) -> str | None:
    """The label of the ceiling whose refusal ``err`` (from the governed reservation) reports;
    None when it found the key taken by another writer since its read (its charges rolled
    back: read the key again); any other error is raised again."""
    cause = err.__cause__
    state = getattr(cause, "sqlstate", None)
    if state == "EGDUP":
        return None
    if state != "EGOVR":
        raise err
    diag = getattr(cause, "diag", None)
    message = str(getattr(diag, "message_primary", "") or "")
    position = message.rsplit(" ", 1)[-1]
    if not position.isdigit() or not 1 <= int(position) <= len(move.charges):
        raise err
    return move.charges[int(position) - 1].label
