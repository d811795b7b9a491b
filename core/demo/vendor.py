"""The demo's payments-and-bookings vendor, in memory: every call that reaches it is counted,
and what it did is kept (money refunded, bookings standing, cancellations)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import NotExecuted

__all__ = ["DOLLAR", "FakeVendor", "VendorCall", "VendorTimeout", "money"]

DOLLAR = 1_000_000  # micro-units: costs in effectgate are counted in millionths


def money(cents: int) -> str:
    """``2500`` as ``$25.00``."""
    return f"${cents / 100:,.2f}"


class VendorTimeout(Exception):
    """The vendor did the work but its reply never arrived."""


@dataclass(frozen=True, slots=True)
class VendorCall:
    """One call that reached the vendor: ``kind`` is refund, book, book_refused or cancel."""

    kind: str
    subject: str
    cents: int = 0
    receipt: str = ""


@dataclass
class FakeVendor:
    """A vendor that does what it is asked, each time it is asked. ``on_call`` hears each call
    as it happens (the demo prints it)."""

    on_call: Callable[[VendorCall], None] | None = None
    calls: list[VendorCall] = field(default_factory=list)
    by_idempotency_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    bookings: dict[str, str] = field(default_factory=dict)  # booking id -> trip id
    lose_next_reply: bool = False

    def _record(self, call: VendorCall) -> None:
        self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)

    def refund(self, txn_id: str, amount_cents: int,
               idempotency_key: str | None = None) -> dict[str, Any]:
        """Refund; with ``lose_next_reply`` set the refund happens and the reply is lost."""
        refund_id = f"re_{len(self.calls) + 1:04d}"
        receipt: dict[str, Any] = {"refund_id": refund_id, "txn_id": txn_id,
                                   "amount_cents": amount_cents}
        self._record(VendorCall("refund", txn_id, amount_cents, refund_id))
        if idempotency_key:
            self.by_idempotency_key[idempotency_key] = receipt
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise VendorTimeout("the vendor did not answer within 10s")
        return receipt

    def book(self, what: str, trip_id: str) -> dict[str, Any]:
        """Book a flight, hotel or car; there are no cars (refused before anything happens)."""
        if what == "car":
            self._record(VendorCall("book_refused", f"{what} {trip_id}"))
            raise NotExecuted("no cars available: the vendor refused the booking")
        booking_id = f"{what[:2]}_{len(self.calls) + 1:04d}"
        self._record(VendorCall("book", f"{what} {trip_id}", receipt=booking_id))
        self.bookings[booking_id] = trip_id
        return {"booking_id": booking_id, "trip_id": trip_id}

    def cancel(self, booking_id: str) -> dict[str, Any]:
        """Cancel a booking."""
        self._record(VendorCall("cancel", booking_id, receipt=booking_id))
        self.bookings.pop(booking_id, None)
        return {"cancelled": booking_id}

    def refunded_cents(self) -> int:
        """Money refunded so far."""
        return sum(c.cents for c in self.calls if c.kind == "refund")
