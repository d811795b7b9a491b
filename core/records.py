"""What the gate answers: a :class:`BeginDecision` per ``begin``, an :class:`EffectRecord` per
``get``. Both render as HTML tables in Jupyter.

:class:`EffectRecord`, :class:`HistoryEntry` and :class:`ApprovalRecord` live in
:mod:`effectgate.stored`, imported on first use (PEP 562): a worker's way to its first
``begin`` never defines them."""

# No ``from __future__ import annotations`` here (as in store/rows.py): typing.NamedTuple
# and dataclasses read string annotations slowly at every start; every name in them exists at
# run time.

import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import StoreError
from .rendering import html_table, iso
from .request import Lease
from .states import Decision, State
from .vendors import VendorKey

if TYPE_CHECKING:
    from .stored import ApprovalRecord, EffectRecord, HistoryEntry

__all__ = [
    "ApprovalRecord", "BeginDecision", "EffectRecord", "HistoryEntry", "epoch_to_datetime",
]


def epoch_to_datetime(epoch: float | None) -> datetime.datetime | None:
    """Seconds since the epoch (the store's clock) as an aware UTC datetime.
    :class:`~effectgate.StoreError` for a time no date can show (NaN, infinite, past year
    9999): a row effectgate did not write, refused by name rather than by a bare
    ``OverflowError``."""
    if epoch is None:
        return None
    try:
        return datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        raise StoreError(f"the store holds {epoch!r} as a time, which is no date: a row "
                         "effectgate did not write", reason="unreadable time") from None


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
            "lease_expires_at": iso(self.lease_expires_at),
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
        return html_table(f"begin → {self.decision.value}", shown)


def __getattr__(name: str) -> Any:
    """``EffectRecord``, ``HistoryEntry`` and ``ApprovalRecord``, from :mod:`effectgate.stored`
    on first use."""
    if name not in ("ApprovalRecord", "EffectRecord", "HistoryEntry"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import stored

    value = getattr(stored, name)
    globals()[name] = value
    return value
