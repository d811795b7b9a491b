"""Rows into answers: a stored row becomes a :class:`BeginDecision`, an
:class:`EffectRecord` or an :class:`ApprovalRecord`, with the vendor key it implies."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .decide import lapsed
from .errors import PayloadError
from .records import BeginDecision, epoch_to_datetime
from .states import Decision, State
from .store.lines import parse as parse_history
from .store.rows import ApprovalRow, CommittedHead, EffectHead, EffectRow
from .vendors import VendorKey, vendor_key

if TYPE_CHECKING:
    from .stored import ApprovalRecord, EffectRecord

__all__ = [
    "approval_record", "committed_decision", "decision", "effect_record", "loads",
    "remembered", "vendor_key_of",
]

_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads(text: str | None) -> Any:
    """A stored JSON value (None stays None). :class:`PayloadError` for a value too deeply
    nested to read back, rather than an untyped RecursionError."""
    if text is None:
        return None
    try:
        try:  # the stored text is effectgate's own compact JSON: one C call reads it
            value, end = _scan(text, 0)
        except StopIteration:
            value, end = None, -1
        return value if end == len(text) else json.loads(text)
    except RecursionError:
        raise PayloadError("the stored result is nested too deeply to be read back") from None
    except ValueError:  # a row effectgate did not write (JSONDecodeError is a ValueError)
        raise PayloadError("the stored value is not JSON: a row effectgate did not "
                           "write") from None


def vendor_key_of(row: EffectHead | EffectRow, secret: bytes) -> VendorKey | None:
    """The vendor idempotency key the row's current attempt uses (None without a vendor): the
    attempt it was first issued for, and its age since then."""
    if row.vendor is None:
        return None
    attempt = row.vendor_attempt or row.attempt
    since = row.vendor_since if row.vendor_since is not None else (
        row.attempt_started_at or row.created_at)
    return vendor_key(secret, row.vendor, namespace=row.namespace, effect_type=row.effect_type,
                      key=row.key, attempt=attempt, attempt_age_seconds=max(0.0, row.now - since))


def decision(row: EffectHead, kind: Decision, vendor_secret: bytes, lease_secret: str | None,
             *, result: Any = None, retry_after_seconds: float | None = None,
             reason: str | None = None, approval_id: str | None = None,
             budget_warning: str | None = None) -> BeginDecision:
    """The answer to a ``begin`` that found (or wrote) ``row``."""
    # Built as the tuple it is (every begin makes one; the keyword constructor costs ~8x),
    # from the row unpacked once (a named tuple's field is a descriptor call each).
    (effect_id, namespace, key, effect_type, payload_hash, state, attempt, token, lease, _,
     _, _, _, vendor, _, _, _, budget_keys, estimated, _, _, _, _) = row
    return _new_decision(BeginDecision, (
        kind, effect_id, key, effect_type, namespace, state, attempt, token, lease, result,
        retry_after_seconds, reason, approval_id,
        None if vendor is None else vendor_key_of(row, vendor_secret), budget_warning,
        payload_hash, lease_secret, bool(budget_keys), estimated))


_new_decision = tuple.__new__
_DUPLICATE, _COMMITTED = Decision.DUPLICATE, State.COMMITTED


def committed_decision(row: CommittedHead, vendor_secret: bytes, result: Any,
                       reason: str | None) -> BeginDecision:
    """The duplicate a repeat of the COMMITTED effect ``row`` is answered with: its stored
    ``result``, and the vendor key its attempt used (no lease, approval or spend)."""
    (effect_id, namespace, key, effect_type, payload_hash, attempt, token, _, _, vendor,
     vendor_attempt, age) = row
    vk = None if vendor is None else vendor_key(
        vendor_secret, vendor, namespace=namespace, effect_type=effect_type, key=key,
        attempt=vendor_attempt or attempt, attempt_age_seconds=max(0.0, age or 0.0))
    return _new_decision(BeginDecision, (
        _DUPLICATE, effect_id, key, effect_type, namespace, _COMMITTED, attempt, token, None,
        result, None, reason, None, vk, None, payload_hash, None, False, None))


def remembered(namespace: str, key: str, effect_type: str, effect_id: int, attempt: int,
               token: int, payload_hash: str, result: Any) -> BeginDecision:
    """The answer to a repeat of a COMMITTED effect that a gate remembers (no row read: no
    lease, no vendor key, no spend)."""
    return _new_decision(BeginDecision, (
        _DUPLICATE, effect_id, key, effect_type, namespace, _COMMITTED, attempt, token, None,
        result, None, None, None, None, None, payload_hash, None, False, None))


def _effective(row: EffectRow) -> tuple[State, bool]:
    gone = lapsed(row)
    return (State.AMBIGUOUS if gone else row.state), gone


def effect_record(row: EffectRow, vendor_secret: bytes, *,
                  with_history: bool = True) -> EffectRecord:
    """An effect as reads report it: a lapsed IN_FLIGHT effect is AMBIGUOUS at once."""
    from .stored import EffectRecord, HistoryEntry  # on the first read, not at start

    state, lapsed = _effective(row)
    entries = tuple(
        HistoryEntry(
            from_state=State(h.from_state) if h.from_state else None,
            to_state=State(h.to_state), at=epoch_to_datetime(h.at),  # type: ignore[arg-type]
            token=h.token, by=h.by, note=h.note,
        )
        for h in (parse_history(row.history) if with_history else ())
    )
    return EffectRecord(
        effect_id=row.id, namespace=row.namespace, key=row.key,
        effect_type=row.effect_type, state=state, attempt=row.attempt,
        lease_token=row.token, payload_hash=row.payload_hash,
        result=loads(row.result), error=row.error,
        reason="lease lapsed" if lapsed else row.reason,
        created_at=epoch_to_datetime(row.created_at),  # type: ignore[arg-type]
        updated_at=epoch_to_datetime(row.updated_at),  # type: ignore[arg-type]
        lease_expires_at=epoch_to_datetime(row.lease_expires_at),
        run_id=row.run_id, agent_id=row.agent_id, group_key=row.group_key,
        compensation=loads(row.compensation),
        compensates_effect_id=row.compensates_effect_id, vendor=row.vendor,
        estimated_cost_micros=row.estimated_cost_micros,
        actual_cost_micros=row.actual_cost_micros, approval_id=row.approval_id,
        pruned_at=epoch_to_datetime(row.pruned_at),
        vendor_key=vendor_key_of(row, vendor_secret),
        history=entries, vendor_ref=row.vendor_ref,
    )


def approval_record(row: ApprovalRow) -> ApprovalRecord:
    """An approval request as people see it (arguments only while it is pending)."""
    from .decide import approval_status
    from .stored import ApprovalRecord

    status = approval_status(row)
    return ApprovalRecord(
        approval_id=row.id, effect_id=row.effect_id, effect_type=row.effect_type, key=row.key,
        payload_hash=row.payload_hash, state=status, requested_by=row.requested_by,
        run_id=row.run_id, estimated_cost_micros=row.estimated_cost_micros,
        created_at=epoch_to_datetime(row.created_at),  # type: ignore[arg-type]
        expires_at=epoch_to_datetime(row.expires_at),  # type: ignore[arg-type]
        decided_by=row.decided_by, decided_at=epoch_to_datetime(row.decided_at),
        reason=row.reason,
        arguments=loads(row.arguments) if status.value == "pending" else None,
        unattributed=row.requested_by is None,
    )
