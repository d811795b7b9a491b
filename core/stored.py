"""What the gate reads back from the store: an :class:`EffectRecord` per ``get`` (with its
:class:`HistoryEntry` transitions) and an :class:`ApprovalRecord` per approval request. Both
render as HTML tables in Jupyter.

Apart from :mod:`effectgate.records` (a ``begin``'s answer), so that a worker's start does not
define these three frozen dataclasses (each a few ms of generated code) before it reads one.
"""

# No ``from __future__ import annotations`` here (as in store/rows.py): dataclasses read
# string annotations slowly at every start; every name in them exists at run time.

import datetime
from dataclasses import dataclass, field, fields
from typing import Any

from .rendering import html_table, iso
from .states import ApprovalState, State
from .vendors import VendorKey

__all__ = ["ApprovalRecord", "EffectRecord", "HistoryEntry"]


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
            "at": iso(self.at),
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

    @property
    def vendor_idempotency_key(self) -> str | None:
        """The key sent to the vendor as its own idempotency key (``vendor_key.value``), as
        :attr:`~effectgate.BeginDecision.vendor_idempotency_key` names it: what a reconcile
        hook asks the vendor about. None for an effect without a vendor."""
        return self.vendor_key.value if self.vendor_key else None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields, history included."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, State):
                value = value.value
            elif isinstance(value, datetime.datetime):
                value = iso(value)
            elif f.name == "history":
                value = [h.as_dict() for h in value]
            elif isinstance(value, VendorKey):
                value = value.as_dict()
            out[f.name] = value
        return out

    def _repr_html_(self) -> str:
        rows = [(k, v) for k, v in self.as_dict().items() if k != "history"]
        table = html_table(f"effect {self.key} — {self.state.value}", rows)
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


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """A request for a human's approval, bound to one effect's key and payload hash.

    ``state``: pending, approved, denied, consumed (an attempt started on it) or expired
    (past its expiry, or set aside by a call declaring another cost: ``reason`` says so).
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
            out[f.name] = iso(value) if isinstance(value, datetime.datetime) else value
        return out

    def _repr_html_(self) -> str:
        return html_table(f"approval {self.approval_id} — {self.state.value}",
                           list(self.as_dict().items()))
