"""The typed rows the store hands up. Field order is column order: the statements select
exactly these fields (``HEAD_COLUMNS``, ``ROW_COLUMNS``), and every row carries the store's
clock at the read as ``now`` — the decision module never reads a clock of its own."""

# No ``from __future__ import annotations`` here: typing.NamedTuple compiles every string
# annotation (a ForwardRef per field), ~3 ms of every start for these rows; every name in
# them exists at run time.

from typing import Any, ClassVar, NamedTuple

from ..errors import StoreError
from ..states import ApprovalState, State

__all__ = [
    "BRIEF_COLUMNS", "FOUND_COLUMNS", "HEAD_COLUMNS", "ROW_COLUMNS", "ApprovalRow",
    "CommittedHead", "EffectHead", "EffectRow", "Moved", "PrincipalRow", "Recorded",
    "approval_row", "committed_head", "effect_head", "effect_row", "found_head",
    "principal_row", "unknown_state",
]

_STATE = {s.value: s for s in State}
_APPROVAL_STATE = {s.value: s for s in ApprovalState}


def unknown_state(value: Any, what: str, key: Any, effect_id: Any) -> StoreError:
    """The error for a stored state text no state of this version is (a row effectgate did not
    write, or a newer version's): typed and named, never a bare KeyError from the lookup
    (each lookup is in a ``try``, free while nothing is raised). Raised by reads, before
    anything is written."""
    return StoreError(
        f"the store holds {value!r} as the state of {what}, which is no state this version "
        "of effectgate knows: a row effectgate did not write (or a newer version's)",
        key=key if isinstance(key, str) else None, reason="unknown state",
        effect_id=effect_id if isinstance(effect_id, int) else None)


class EffectHead(NamedTuple):
    """What the per-call path decides on: no history and no audit fields."""

    id: int
    namespace: str
    key: str
    effect_type: str
    payload_hash: str
    state: State
    attempt: int
    token: int
    lease_expires_at: float | None
    attempt_started_at: float | None
    created_at: float
    result: str | None
    reason: str | None
    vendor: str | None
    vendor_attempt: int | None
    vendor_since: float | None
    approval_id: str | None
    budget_keys: str | None
    estimated_cost_micros: int | None
    pruned_at: float | None
    lease_secret: str | None
    now: float
    inserted: bool = False


class _CommittedFields(NamedTuple):
    id: int
    namespace: str
    key: str
    effect_type: str
    payload_hash: str
    attempt: int
    token: int
    result: str | None
    pruned_at: float | None
    vendor: str | None = None
    vendor_attempt: int | None = None
    vendor_age: float | None = None


class CommittedHead(_CommittedFields):
    """A COMMITTED effect as a repeat of it reads it (SQLite's first read of a reservation):
    what a duplicate answers with, and nothing else. COMMITTED is terminal, so none of the
    columns an attempt in flight is decided on (lease, clock, secret, approval, spend) can
    matter any more.

    ``vendor`` and ``vendor_attempt`` name the vendor key the committed attempt used, and
    ``vendor_age`` is the store's clock minus when that key was first issued (None without a
    vendor)."""

    __slots__ = ()
    state: ClassVar[State] = State.COMMITTED
    """What a committed head always is (a class attribute, not a field)."""
    inserted: ClassVar[bool] = False
    """A committed head was read, never inserted by the call that read it."""


class EffectRow(NamedTuple):
    """Every column of an effect (history included), and the store's clock."""

    id: int
    namespace: str
    key: str
    effect_type: str
    payload_hash: str
    state: State
    attempt: int
    token: int
    lease_expires_at: float | None
    attempt_started_at: float | None
    created_at: float
    updated_at: float
    result: str | None
    error: str | None
    reason: str | None
    run_id: str | None
    agent_id: str | None
    group_key: str | None
    compensation: str | None
    compensates_effect_id: int | None
    vendor: str | None
    vendor_attempt: int | None
    vendor_since: float | None
    estimated_cost_micros: int | None
    actual_cost_micros: int | None
    approval_id: str | None
    actor: str | None
    note: str | None
    pruned_at: float | None
    budget_keys: str | None
    lease_secret: str | None
    vendor_ref: str | None
    history: str | None
    now: float


class ApprovalRow(NamedTuple):
    """A request for a human's approval, and the store's clock."""

    id: str
    namespace: str
    effect_id: int
    effect_type: str
    key: str
    payload_hash: str
    state: ApprovalState
    requested_by: str | None
    run_id: str | None
    estimated_cost_micros: int | None
    allow_self_approval: int
    created_at: float
    expires_at: float
    decided_by: str | None
    decided_at: float | None
    reason: str | None
    arguments: str | None
    now: float


class PrincipalRow(NamedTuple):
    """A named operator or agent: its token only as a salted hash, and the store's clock."""

    token_id: str
    namespace: str
    name: str
    role: str
    salt: str
    token_hash: str
    created_at: float
    last_used_at: float | None
    revoked_at: float | None
    now: float


class Recorded(NamedTuple):
    """What a holder's report changed: the spend it moved, and whether it came late (after
    the lease lapsed, settling the AMBIGUOUS effect)."""

    budget_keys: str | None
    estimated_cost_micros: int | None
    late: bool
    overspent: str | None = None


class Moved(NamedTuple):
    """A move's result: the row after it, or None when another writer moved the effect first;
    ``over_ceiling`` names the spend ceiling that refused its charge (nothing was written)."""

    row: EffectHead | None
    over_ceiling: str | None = None


HEAD_COLUMNS = EffectHead._fields[:-2]
ROW_COLUMNS = EffectRow._fields[:-1]
_HEAD_STATE = HEAD_COLUMNS.index("state")
_HEAD_LEN = len(EffectHead._fields)
_new_head = tuple.__new__
_ROW_STATE = ROW_COLUMNS.index("state")
# The read by key does not read back the namespace and key it was given (each text column
# a driver hands up costs about as much as a cheap Python call).
FOUND_COLUMNS = tuple(c for c in HEAD_COLUMNS if c not in ("namespace", "key"))
assert HEAD_COLUMNS[1:3] == ("namespace", "key")
_FOUND_STATE = FOUND_COLUMNS.index("state")


def effect_head(values: Any) -> EffectHead:
    """A head from a driver row of ``HEAD_COLUMNS`` + ``now`` (+ ``inserted``)."""
    v = tuple(values)
    i = _HEAD_STATE
    try:
        fields = (*v[:i], _STATE[v[i]], *v[i + 1:])
        return _new_head(EffectHead, fields if len(fields) == _HEAD_LEN else (*fields, False))
    except KeyError:
        raise unknown_state(v[i], f"effect {v[2]!r}", v[2], v[0]) from None


def found_head(values: Any, namespace: str, key: str) -> EffectHead:
    """A head from a driver row of ``FOUND_COLUMNS`` + ``now``, read by ``namespace`` and
    ``key`` (not inserted by this call)."""
    v = tuple(values)
    i = _FOUND_STATE
    try:
        return _new_head(EffectHead, (v[0], namespace, key, *v[1:i], _STATE[v[i]], *v[i + 1:],
                                      False))
    except KeyError:
        raise unknown_state(v[i], f"effect {key!r}", key, v[0]) from None


BRIEF_COLUMNS = ("id", "effect_type", "payload_hash", "state", "attempt", "token", "result",
                 "pruned_at")
"""What a reservation's first read selects (then the vendor key's text): a COMMITTED
effect's :class:`CommittedHead`, and any other row's state (to read it again in full)."""
_COMMITTED = State.COMMITTED.value
_new_committed = tuple.__new__


def committed_head(values: Any, namespace: str, key: str) -> CommittedHead | None:
    """The :class:`CommittedHead` a driver row of ``BRIEF_COLUMNS`` + the vendor key's text
    (``vendor attempt age``) stands for, read by ``namespace`` and ``key``; None when the
    effect is not COMMITTED (its head is to be read in full)."""
    effect_id, effect_type, digest, state, attempt, token, result, pruned_at, tail = values
    if state != _COMMITTED:
        return None
    if tail is None:
        return _new_committed(CommittedHead, (
            effect_id, namespace, key, effect_type, digest, attempt, token, result, pruned_at,
            None, None, None))
    vendor, vendor_attempt, age = tail.split(" ")
    return _new_committed(CommittedHead, (
        effect_id, namespace, key, effect_type, digest, attempt, token, result, pruned_at,
        vendor, int(vendor_attempt), float(age)))


def effect_row(values: Any) -> EffectRow:
    """A full row from a driver row of ``ROW_COLUMNS`` + ``now``."""
    v = tuple(values)
    i = _ROW_STATE
    try:
        return EffectRow._make((*v[:i], _STATE[v[i]], *v[i + 1:]))
    except KeyError:
        raise unknown_state(v[i], f"effect {v[2]!r}", v[2], v[0]) from None


def approval_row(values: Any) -> ApprovalRow:
    """An approval from a driver row of its columns + ``now``."""
    v = tuple(values)
    i = _APPROVAL_STATE_AT
    try:
        return ApprovalRow._make((*v[:i], _APPROVAL_STATE[v[i]], *v[i + 1:]))
    except KeyError:
        raise unknown_state(v[i], f"approval {v[0]!r} (of effect {v[4]!r})", v[4],
                             v[2]) from None


_APPROVAL_STATE_AT = ApprovalRow._fields.index("state")


def principal_row(values: Any) -> PrincipalRow:
    """A principal from a driver row of its columns + ``now``."""
    return PrincipalRow._make(tuple(values))
