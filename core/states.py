"""The states an effect moves through and the decisions ``begin`` answers."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Decision", "Outcome", "State"]


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
