"""The store commands a ``begin`` flow yields (:func:`effectgate.flow.begin_steps`), each a
small immutable value naming one call and its arguments, and what it is answered with.

Three performers answer them: the sync driver against a :class:`~effectgate.store.Store`, the
async driver against its async face (:mod:`effectgate._drive`), and the model checker's
in-memory store (:mod:`effectgate.verify.model_store`). A store's failure is thrown into the
flow at the command that met it (the flow decides what a lost reply means).

:class:`Tell` and :class:`CallHook` are not store calls: a log line or notice, and a reconcile
hook's call (its failure answered as :class:`HookFailed`, never thrown).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .decide import Move, Resolution
    from .notices import Notice
    from .reconcile import Reconciler
    from .request import LeaseSecret, Request
    from .store import NewApproval
    from .store.rows import EffectHead

__all__ = [
    "CallHook",
    "Command",
    "Examine",
    "Fetch",
    "GetApproval",
    "HookFailed",
    "Lapse",
    "Reserve",
    "Resolve",
    "Tell",
    "Write",
]


class Reserve(NamedTuple):
    """Insert an ungoverned key as IN_FLIGHT, or read the row there (→ ``EffectHead``, its
    ``inserted`` telling which)."""

    req: Request
    secret: LeaseSecret


class Fetch(NamedTuple):
    """Read the head of the effect at a key (→ ``EffectHead | None``)."""

    namespace: str
    key: str


class Write(NamedTuple):
    """Make ``move``: insert the key (``row`` None) or compare-and-set ``row`` on, with the
    approval it consumes or creates and the spend it charges, all or nothing (→ ``Moved``)."""

    row: EffectHead | None
    move: Move
    req: Request
    secret: LeaseSecret
    approval: NewApproval | None = None


class Lapse(NamedTuple):
    """Compare-and-set an IN_FLIGHT row past its lease to AMBIGUOUS (→ ``EffectHead | None``,
    None: it moved)."""

    row: EffectHead


class GetApproval(NamedTuple):
    """Read an approval request (→ ``ApprovalRow | None``)."""

    namespace: str
    approval_id: str


class Examine(NamedTuple):
    """Read every column of ``row``'s effect, for a reconcile hook (→ ``EffectRow | None``)."""

    row: EffectHead


class Resolve(NamedTuple):
    """Compare-and-set ``row`` as a reconcile hook's verdict says (→ ``EffectRow | None``)."""

    row: EffectHead
    resolution: Resolution
    result: str | None
    reason: str
    actor: str
    note: str | None


class CallHook(NamedTuple):
    """Call a reconcile hook with an effect's record (→ its answer, or :class:`HookFailed`)."""

    fn: Reconciler
    record: Any


class HookFailed(NamedTuple):
    """A reconcile hook raised (or its coroutine could not be run)."""

    error: BaseException


class Tell(NamedTuple):
    """Log ``message % args`` at ``level`` with ``extra``; and tell the observer ``notice``
    (the driver adds the store to it). Answered with None."""

    level: int
    message: str
    args: tuple[Any, ...]
    extra: dict[str, Any]
    notice: Notice | None = None


Command = Reserve | Fetch | Write | Lapse | GetApproval | Examine | Resolve | CallHook | Tell
"""Everything a flow may yield."""
