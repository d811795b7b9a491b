"""Every error effectgate raises, under one root.

::

    EffectGateError                 root: catch this to catch everything effectgate raises
    ├── EffectKeyError              a key template cannot be resolved (raised before anything runs)
    ├── PayloadError                a payload or result that cannot be made canonical JSON
    ├── PayloadMismatch             a key reused with another payload (a key collision)
    ├── StaleLease                  a report or heartbeat from a holder that no longer holds
    ├── UnknownEffect               no effect with that id, key or approval id
    ├── InvalidTransition           an outcome or resolution the state machine does not allow
    ├── ConfigError                 bad arguments to a Gate, an effect or a policy
    │   └── PolicyError             a malformed policy file, with the field and what is wrong
    ├── StoreError                  the store failed (connection lost, server down); see state
    ├── NotExecuted                 raised by user code: the action certainly did not happen
    ├── Unauthenticated             a token (or a principal) missing, malformed, unknown or revoked
    ├── Forbidden                   the principal's role (or holding) does not allow the action
    └── EffectRefused               begin answered something other than ``execute``
        ├── EffectInFlight          another holder is executing it; retry after a while
        ├── EffectAmbiguous         nobody knows whether it happened; do not retry blindly
        ├── ApprovalRequired        a human must approve it first (carries ``approval_id``)
        └── EffectDenied            policy, budget or max_attempts refused it

Every error carries structured fields (``key``, ``state``, ``decision``, ``reason``) besides
its message, so callers branch on attributes rather than on text.

Every warning effectgate issues (through :mod:`warnings`, besides its log line) has one root
too, so ``warnings.simplefilter("error", eg.EffectGateWarning)`` makes them all fatal::

    EffectGateWarning               root (a UserWarning): something a person should look at
    ├── BudgetWarning               a spend ceiling applies but the call declared no cost
    ├── OverspendWarning            an actual cost pushed a spend counter past its ceiling
    ├── ResultNotStoredWarning      a committed result had no JSON form: a duplicate gets None
    └── UngatedToolWarning          a wrapped tool has no effect declared: no reservation
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ApprovalRequired",
    "BudgetWarning",
    "ConfigError",
    "EffectAmbiguous",
    "EffectDenied",
    "EffectGateError",
    "EffectGateWarning",
    "EffectInFlight",
    "EffectKeyError",
    "EffectRefused",
    "Forbidden",
    "InvalidTransition",
    "NotExecuted",
    "OverspendWarning",
    "PayloadError",
    "PayloadMismatch",
    "PolicyError",
    "ResultNotStoredWarning",
    "StaleLease",
    "StoreError",
    "Unauthenticated",
    "UngatedToolWarning",
    "UnknownEffect",
]


class EffectGateError(Exception):
    """Root of every effectgate error. Structured fields are ``None`` where they do not apply."""

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        state: str | None = None,
        decision: str | None = None,
        reason: str | None = None,
        effect_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.state = state
        self.decision = decision
        self.reason = reason
        self.effect_id = effect_id

    def fields(self) -> dict[str, Any]:
        """The structured fields, for logs and JSON answers."""
        return {
            "error": type(self).__name__,
            "message": self.message,
            "key": self.key,
            "state": self.state,
            "decision": self.decision,
            "reason": self.reason,
            "effect_id": self.effect_id,
        }


class EffectKeyError(EffectGateError):
    """An effect key template cannot be resolved from the call's arguments, or the key is bad."""


class PayloadError(EffectGateError):
    """A payload or result that cannot be made canonical JSON (NaN, bytes as a whole, cycles...)."""


class PayloadMismatch(EffectGateError):
    """The key exists with a different payload hash: two different actions share one key."""


class StaleLease(EffectGateError):
    """A report or heartbeat whose fencing token or lease no longer holds the effect."""


class UnknownEffect(EffectGateError):
    """No effect (or approval) with that id or key in this gate's namespace."""


class InvalidTransition(EffectGateError):
    """An outcome the state machine does not allow (e.g. resolving a COMMITTED effect)."""


class ConfigError(EffectGateError):
    """Bad configuration: arguments to ``Gate``, ``gate.effect`` or ``Policy``."""


class PolicyError(ConfigError):
    """A malformed policy: names the file, the field and what is wrong."""


class StoreError(EffectGateError):
    """The store could not complete an operation (connection lost, server restarting).

    ``outcome_unknown`` is true when a write may or may not have reached the store.
    """

    def __init__(self, message: str, *, outcome_unknown: bool = False, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.outcome_unknown = outcome_unknown


class NotExecuted(EffectGateError):
    """Raise from an effect body when the action certainly did not happen: the effect is FAILED
    and a later call may try again."""

    def __init__(self, message: str = "the action did not happen", **fields: Any) -> None:
        super().__init__(message, **fields)


class Unauthenticated(EffectGateError):
    """No valid token: missing, malformed, unknown or revoked. The message never says which
    of the last three (an attacker learns nothing from it). Also a principal the store no
    longer vouches for when an ``Acting`` acts (revoked, of another namespace, never issued);
    ``reason`` says which."""


class Forbidden(EffectGateError):
    """An authenticated principal may not do this: an agent approving, denying, resolving or
    unwinding, or acting on an effect another agent holds."""


class EffectRefused(EffectGateError):
    """``begin`` answered something other than ``execute``; the action must not run."""

    def __init__(
        self,
        message: str,
        *,
        retry_after_seconds: float | None = None,
        approval_id: str | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(message, **fields)
        self.retry_after_seconds = retry_after_seconds
        self.approval_id = approval_id

    def fields(self) -> dict[str, Any]:
        out = super().fields()
        out["retry_after_seconds"] = self.retry_after_seconds
        out["approval_id"] = self.approval_id
        return out


class EffectInFlight(EffectRefused):
    """Another holder with a live lease is executing this effect; ask again after a while."""


class EffectAmbiguous(EffectRefused):
    """Nobody knows whether the effect happened; refused until an operator or reconciler resolves
    it. Never retry this blindly."""


class ApprovalRequired(EffectRefused):
    """A human must approve this exact payload first; ``approval_id`` names the request."""


class EffectDenied(EffectRefused):
    """Policy, a spend ceiling or ``max_attempts`` refused the effect; ``reason`` says which."""


class EffectGateWarning(UserWarning):
    """Root of every warning effectgate issues."""


class BudgetWarning(EffectGateWarning):
    """A spend ceiling applies to this effect but the call declared no cost: it cannot fire."""


class OverspendWarning(EffectGateWarning):
    """A committed effect's actual cost exceeded its estimate and pushed a spend counter past
    its ceiling: the money was spent (recorded as the effect's ``reason``)."""


class ResultNotStoredWarning(EffectGateWarning):
    """The effect committed, but its result had no JSON form, so a duplicate returns None."""


class UngatedToolWarning(EffectGateWarning):
    """A tool was wrapped with no effect declared: it gets no reservation, so a repeat of it
    runs again. Declare it (or list it as read-only) to silence this."""
