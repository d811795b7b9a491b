"""What the gate answers: a :class:`BeginDecision` per ``begin``, an :class:`EffectRecord` per
``get``. Both render as HTML tables in Jupyter."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from .request import Lease
from .states import ApprovalState, Decision, State
from .vendors import VendorKey

__all__ = [
    "ApprovalRecord", "BeginDecision", "EffectRecord", "HistoryEntry", "epoch_to_datetime",
]


def epoch_to_datetime(epoch: float | None) -> datetime.datetime | None:
    """Seconds since the epoch (the store's clock) as an aware UTC datetime."""
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC)


def _html_table(title: str, rows: list[tuple[str, Any]]) -> str:
    import html  # for notebooks only

    body = "".join(
        f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
        f"<td style='text-align:left'>{html.escape(_show(v))}</td></tr>"
        for k, v in rows
        if v is not None
    )
    return f"<table><caption>{html.escape(title)}</caption>{body}</table>"


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


_new_lease = tuple.__new__


class BeginDecision(NamedTuple):
    """The answer to ``begin``: obey ``decision``; only ``execute`` runs the action.

    An immutable value (a named tuple: built on every call, it must cost next to nothing).

    ``lease_token`` is the fencing token and ``lease_secret`` the secret issued with this
    lease (``execute`` only): with the key they are the proof of holding that ``report`` and
    ``extend_lease`` need (:attr:`lease`). ``result`` is the stored result of a ``duplicate``;
    ``retry_after_seconds`` comes with ``in_flight``; ``approval_id`` with
    ``approval_required``; ``reason`` with every refusal.
    """

    decision: Decision
    effect_id: int
    key: str
    effect_type: str
    namespace: str
    state: State
    attempt: int
    lease_token: int
    lease_expires_epoch: float | None = None
    result: Any = None
    retry_after_seconds: float | None = None
    reason: str | None = None
    approval_id: str | None = None
    vendor_key: VendorKey | None = None
    budget_warning: str | None = None
    payload_hash: str = ""
    lease_secret: str | None = None
    spends: bool = False
    """True when this attempt was charged to a spend ceiling (its report moves spend)."""
    estimated_cost_micros: int | None = None

    def __repr__(self) -> str:  # the lease secret stays out of logs and tracebacks
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields
                          if name != "lease_secret")
        return f"BeginDecision({shown})"

    @property
    def lease_expires_at(self) -> datetime.datetime | None:
        """When the lease lapses, on the store's clock (UTC)."""
        return epoch_to_datetime(self.lease_expires_epoch)

    @property
    def lease(self) -> Lease | None:
        """The proof of holding this effect (``execute`` only): key, token and secret."""
        if self.lease_secret is None:
            return None
        return _new_lease(Lease, (self.key, self.lease_token, self.lease_secret))

    @property
    def vendor_idempotency_key(self) -> str | None:
        """The key to send to the vendor as its own idempotency key (see ``vendor_key``)."""
        return self.vendor_key.value if self.vendor_key else None

    @property
    def should_execute(self) -> bool:
        """True only for ``execute``."""
        return self.decision is Decision.EXECUTE

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (for MCP answers and logs)."""
        out: dict[str, Any] = {
            "decision": self.decision.value,
            "effect_id": self.effect_id,
            "key": self.key,
            "effect_type": self.effect_type,
            "state": self.state.value,
            "attempt": self.attempt,
            "lease_token": self.lease_token,
            "lease_secret": self.lease_secret,
            "lease_expires_at": _iso(self.lease_expires_at),
            "result": self.result,
            "retry_after_seconds": self.retry_after_seconds,
            "reason": self.reason,
            "approval_id": self.approval_id,
            "budget_warning": self.budget_warning,
        }
        if self.vendor_key is not None:
            out["vendor_idempotency_key"] = self.vendor_key.value
            out["vendor_key"] = self.vendor_key.as_dict()
        return out

    def _repr_html_(self) -> str:
        shown = [(k, v) for k, v in self.as_dict().items() if k != "lease_secret"]
        return _html_table(f"begin → {self.decision.value}", shown)


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One transition of an effect: from → to, when (store clock), by whom, why."""

    from_state: State | None
    to_state: State
    at: datetime.datetime
    by: str | None
    note: str | None
    token: int

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        return {
            "from": self.from_state.value if self.from_state else None,
            "to": self.to_state.value,
            "at": _iso(self.at),
            "by": self.by,
            "note": self.note,
            "token": self.token,
        }


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """An effect as the store holds it. ``state`` is what it is *now*: an IN_FLIGHT effect whose
    lease has lapsed reads as AMBIGUOUS even before anyone calls ``begin`` again."""

    effect_id: int
    namespace: str
    key: str
    effect_type: str
    state: State
    attempt: int
    lease_token: int
    payload_hash: str
    result: Any
    error: str | None
    reason: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime
    lease_expires_at: datetime.datetime | None
    run_id: str | None = None
    agent_id: str | None = None
    group_key: str | None = None
    compensation: Any = None
    compensates_effect_id: int | None = None
    vendor: str | None = None
    estimated_cost_micros: int | None = None
    actual_cost_micros: int | None = None
    approval_id: str | None = None
    pruned_at: datetime.datetime | None = None
    vendor_key: VendorKey | None = None
    history: tuple[HistoryEntry, ...] = field(default=())
    vendor_ref: str | None = None
    """What the vendor calls the current attempt, as its holder recorded it with a heartbeat
    (``extend_lease(..., vendor_ref=...)``), e.g. an MCP upstream's task id; None if never."""

    @property
    def lease_lapsed(self) -> bool:
        """True when the stored state is IN_FLIGHT but the lease has lapsed (reads AMBIGUOUS)."""
        return self.state is State.AMBIGUOUS and self.reason == "lease lapsed"

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields, history included."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, State):
                value = value.value
            elif isinstance(value, datetime.datetime):
                value = _iso(value)
            elif f.name == "history":
                value = [h.as_dict() for h in value]
            elif isinstance(value, VendorKey):
                value = value.as_dict()
            out[f.name] = value
        return out

    def _repr_html_(self) -> str:
        rows = [(k, v) for k, v in self.as_dict().items() if k != "history"]
        table = _html_table(f"effect {self.key} — {self.state.value}", rows)
        if not self.history:
            return table
        import html

        hist = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v) if v is not None else '')}</td>"
                             for v in h.as_dict().values()) + "</tr>"
            for h in self.history
        )
        head = "".join(f"<th>{h}</th>" for h in ("from", "to", "at", "by", "note", "token"))
        return f"{table}<table><caption>history</caption><tr>{head}</tr>{hist}</table>"


def _iso(value: datetime.datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """A request for a human's approval, bound to one effect's key and payload hash.

    ``state``: pending, approved, denied, consumed (an attempt started on it) or expired.
    ``arguments`` are the normalised arguments that will execute if it is approved (names the
    policy redacts read ``"[redacted]"``); they are kept only while the request is pending.
    ``unattributed`` is True when it was requested without an agent identity, so a
    self-approval could not be ruled out."""

    approval_id: str
    effect_id: int
    effect_type: str
    key: str
    payload_hash: str
    state: ApprovalState
    requested_by: str | None
    run_id: str | None
    estimated_cost_micros: int | None
    created_at: datetime.datetime
    expires_at: datetime.datetime
    decided_by: str | None
    decided_at: datetime.datetime | None
    reason: str | None
    arguments: Any = None
    unattributed: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, ApprovalState):
                value = value.value
            out[f.name] = _iso(value) if isinstance(value, datetime.datetime) else value
        return out

    def _repr_html_(self) -> str:
        return _html_table(f"approval {self.approval_id} — {self.state.value}",
                           list(self.as_dict().items()))
