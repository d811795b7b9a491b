"""The model's stored rows (:class:`MRow`, :class:`MApproval`), and how the model store hands
them up: as the real store's :class:`~effectgate.store.rows.EffectHead`, ``EffectRow`` and
``ApprovalRow`` (the columns decisions read, with the clock)."""

from __future__ import annotations

import json
from typing import Any, Literal, NamedTuple

from ..payload import payload_hash
from ..states import ApprovalState, Outcome, State
from ..store.rows import ApprovalRow, CommittedHead, EffectHead, EffectRow

__all__ = [
    "KEY",
    "PAYLOAD",
    "PAYLOAD_HASH",
    "VENDOR",
    "MApproval",
    "MRow",
    "adjust",
    "approval_row",
    "committed",
    "dated",
    "full",
    "head",
    "put",
    "put_approval",
    "report_standing",
    "reported_vendor_attempt",
    "resolved_vendor_attempt",
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
    payload_hash: str = PAYLOAD_HASH
    day: int | None = None
    """The database's date (the model's day, :attr:`ModelState.day`) its attempt's charges
    were made on (None: not charged): what a per-day ceiling counts, kept apart from the
    counters' names."""


class MApproval(NamedTuple):
    """A stored approval request (its clock columns: created; it never expires with time
    here, only when a begin ends it, :attr:`ended`)."""

    id: str
    namespace: str
    effect_id: int
    effect_type: str
    key: str
    state: ApprovalState
    created: float
    requested_by: str | None = None
    """The requesting begin's agent id (None: unattributed)."""
    allow_self: bool = False
    """Whether the policy let the requester approve its own request."""
    decided_by: str | None = None
    estimated: int | None = None
    """The cost the requesting begin declared: what the approver was shown."""
    ended: float | None = None
    """When a begin that decided its effect again without it ended it (its expiry then)."""


def report_standing(row: EffectHead, namespace: str, key: str, token: int,
                    secret_hash: str) -> Literal["on_time", "late"] | None:
    """Whether a report presenting (``namespace``, ``key``, ``token``, ``secret_hash``) is the
    holder's own, and when it comes: ``"on_time"`` (its lease is live), ``"late"`` (the lease
    lapsed and nobody held or resolved the effect since), or None (not this row's holder, or
    too late: refused, nothing written).

    The model's statement of the rule: no product code calls it (the store's ``report`` /
    ``report_late`` statements carry the rule in SQL, inside the compare-and-set); the replay
    (:mod:`effectgate.verify.replay`) holds the SQL to it, transition by transition."""
    if row.namespace != namespace or row.key != key or row.token != token or (
        row.lease_secret is None or row.lease_secret != secret_hash
    ):
        return None
    lease = row.lease_expires_at
    if row.state is State.IN_FLIGHT and lease is not None:
        return "on_time" if lease >= row.now else "late"
    if row.state is State.AMBIGUOUS and lease is not None:
        return "late"
    return None


def reported_vendor_attempt(row: EffectHead, outcome: Outcome,
                            keeps_vendor_key: bool = False) -> int | None:
    """The vendor attempt after the holder reports ``outcome``: a FAILED the holder proves
    moves the next attempt to a new vendor key, unless the current key was kept from an
    earlier attempt (whose holder may still send it), or the FAILED is one a built-in
    classifier inferred from a connection error (``keeps_vendor_key``, the decorator's
    :data:`~effectgate.reporting.INFERRED_FAILED`): it judged only the request that raised,
    and when an earlier request of the body reached the vendor, the retry must be deduplicated
    under the same key. The model's statement of the rule in the ``report`` statements' SQL
    (the replay holds the SQL to it)."""
    if outcome is Outcome.FAILED and row.vendor_attempt == row.attempt and (
            not keeps_vendor_key):
        return row.attempt + 1
    return row.vendor_attempt


def resolved_vendor_attempt(row: EffectHead, to: State) -> int | None:
    """The vendor attempt after a resolution to ``to``: an operator's or a hook's FAILED keeps
    the vendor key (a late request from the old holder is deduplicated); COMMITTED takes back
    a key moved past the current attempt. The model's statement of the rule in the
    ``resolve`` statement's SQL (the replay holds the SQL to it)."""
    if to is State.COMMITTED and row.vendor_attempt is not None and (
        row.vendor_attempt > row.attempt
    ):
        return row.attempt
    return row.vendor_attempt


def head(r: MRow, now: float, *, inserted: bool = False) -> EffectHead:
    """The row as the store hands it up (with the clock)."""
    return EffectHead(
        r.id, r.namespace, r.key, r.effect_type, r.payload_hash, r.state, r.attempt,
        r.token, r.lease, r.started, r.created, r.result, r.reason, VENDOR,
        r.vendor_attempt, r.vendor_since, r.approval_id, r.budget_keys, r.estimated,
        r.pruned, r.secret, now, inserted)


def committed(r: MRow, now: float) -> CommittedHead:
    """A COMMITTED row as a reservation's first read on SQLite hands it up (the vendor key's
    attempt and age as the read's SQL gives them)."""
    since = r.vendor_since if r.vendor_since is not None else (
        r.started if r.started is not None else r.created)
    return CommittedHead(r.id, r.namespace, r.key, r.effect_type, r.payload_hash, r.attempt,
                         r.token, r.result, r.pruned, VENDOR,
                         r.vendor_attempt if r.vendor_attempt is not None else r.attempt,
                         now - since)


def full(r: MRow, now: float) -> EffectRow:
    """Every column of the row, as the store's ``get`` hands it up (no history)."""
    return EffectRow(
        r.id, r.namespace, r.key, r.effect_type, r.payload_hash, r.state, r.attempt, r.token,
        r.lease, r.started, r.created, now, r.result, None, r.reason, None, None, None, None,
        None, VENDOR, r.vendor_attempt, r.vendor_since, r.estimated, None, r.approval_id,
        r.actor, None, r.pruned, r.budget_keys, r.secret, None, None, now)


def approval_row(a: MApproval, now: float) -> ApprovalRow:
    """An approval as the store hands it up."""
    return ApprovalRow(a.id, a.namespace, a.effect_id, a.effect_type, a.key, PAYLOAD_HASH,
                       a.state, a.requested_by, None, a.estimated, int(a.allow_self),
                       a.created, a.created + 1e6 if a.ended is None else a.ended,
                       a.decided_by, None, None, None, now)


def dated(scope_key: str, day: int) -> str:
    """A per-day counter's key on model day ``day``: the store appends its UTC date
    (``refund|day|2026-12-03``); the model appends ``d<day>`` (the replay maps one to the
    other)."""
    return f"{scope_key}d{day}"


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
