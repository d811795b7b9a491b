"""The states an effect moves through, the decisions ``begin`` answers, and the states of an
approval request — each spelled once, here."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ApprovalState", "Decision", "Outcome", "State"]


class State(StrEnum):
    """Where an effect stands. ``COMMITTED`` is terminal."""

    IN_FLIGHT = "in_flight"
    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"
    PENDING_APPROVAL = "pending_approval"
    DENIED = "denied"


class Decision(StrEnum):
    """What ``begin`` answers. Only ``EXECUTE`` lets the caller run the action."""

    EXECUTE = "execute"
    DUPLICATE = "duplicate"
    IN_FLIGHT = "in_flight"
    BLOCKED = "blocked"
    APPROVAL_REQUIRED = "approval_required"
    DENIED = "denied"


class Outcome(StrEnum):
    """What a holder (``report``) or an operator (``resolve``) says happened."""

    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"


class ApprovalState(StrEnum):
    """Where a request for a human's approval stands. ``CONSUMED``: an attempt started on it;
    ``EXPIRED`` is read from the clock, never stored: past its expiry, or ended by a call
    that declared another cost than it was given for (its expiry moved to that moment, its
    reason saying it was superseded)."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    CONSUMED = "consumed"
    EXPIRED = "expired"
