"""What the gate's collaborators need of a gate, as a :class:`typing.Protocol`.

The decorator, sagas, principals and telemetry each work *for* a :class:`~effectgate.Gate`,
and the gate builds on them; typed against :class:`GateLike` they never import
:mod:`effectgate.gate` (not even for type checking), so the package's import graph has no
circle through the gate (``tests/test_import_cycles.py``). A module that needs more of the
gate (an operator's acts, for :mod:`effectgate.principals`) extends the protocol where it
needs it. This module imports nothing of effectgate at run time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .classify import Classifier
    from .policy import Policy
    from .records import ApprovalRecord, BeginDecision, EffectRecord
    from .request import Lease, Request
    from .request_builder import EffectKind
    from .states import Outcome
    from .store import Store

__all__ = ["BodyTracing", "GateLike"]

T = TypeVar("T")


class BodyTracing(Protocol):
    """The part of :class:`effectgate.telemetry.Telemetry` that wraps a gated body."""

    def body(self, d: BeginDecision, body: Callable[[], T]) -> T:
        """Run ``body`` (in a span when tracing)."""
        ...

    async def abody(self, d: BeginDecision, body: Callable[[], Awaitable[T]]) -> T:
        """Await ``body`` (in a span when tracing)."""
        ...


class GateLike(Protocol):
    """A gate as its collaborators see it: :class:`effectgate.Gate` is the one implementation
    (checked by mypy wherever a ``Gate`` is passed for a ``GateLike``)."""

    @property
    def namespace(self) -> str:
        """The namespace keys are unique in."""
        ...

    @property
    def url(self) -> str:
        """The store's URL."""
        ...

    @property
    def store(self) -> Store:
        """The underlying store."""
        ...

    @property
    def policy(self) -> Policy | None:
        """The policy in force, if any."""
        ...

    @property
    def classifiers(self) -> tuple[Classifier, ...]:
        """The gate's exception classifiers."""
        ...

    @property
    def lease_seconds(self) -> float:
        """The default lease."""
        ...

    @property
    def _telemetry(self) -> BodyTracing | None: ...

    def kind(self, effect_type: str, *, vendor: str | None = None,
             lease_seconds: float | None = None, max_attempts: int | None = None,
             reconcile_grace_seconds: float | None = None) -> EffectKind:
        """The effect type's validated options."""
        ...

    def _checked_request(
        self, kind: EffectKind, key: str, payload: Mapping[str, Any], *,
        run_id: str | None = None, agent_id: str | None = None, group_key: str | None = None,
        compensation: Any = None, compensates_effect_id: int | None = None,
        estimated_cost_micros: int | None = None,
    ) -> Request: ...

    def _redact(self, text: str | None) -> str | None: ...

    def begin(self, request: Request | None = None, /, **fields: Any) -> BeginDecision:
        """Propose an effect."""
        ...

    async def abegin(self, request: Request | None = None, /, **fields: Any) -> BeginDecision:
        """Propose an effect, for async callers."""
        ...

    def report(self, held: BeginDecision | Lease, outcome: Outcome | str, *,
               result: Any = None, error: str | None = None,
               actual_cost_micros: int | None = None) -> None:
        """Record what happened."""
        ...

    async def areport(self, held: BeginDecision | Lease, outcome: Outcome | str, *,
                      result: Any = None, error: str | None = None,
                      actual_cost_micros: int | None = None) -> None:
        """Record what happened, for async callers."""
        ...

    def compensator_for(self, effect_type: str) -> Callable[[EffectRecord, Any], Any] | None:
        """The registered compensator for ``effect_type``, or None."""
        ...

    def group_steps(self, group_key: str) -> list[EffectRecord]:
        """The steps of a saga group, newest first."""
        ...

    def preview(self, request: Request | None = None, /, **fields: Any) -> BeginDecision:
        """What ``begin`` would answer now, writing nothing."""
        ...

    def get(self, key: str) -> EffectRecord:
        """The effect stored under ``key``."""
        ...

    def get_by_id(self, effect_id: int) -> EffectRecord:
        """The effect with ``effect_id``."""
        ...

    def approval(self, approval_id: str) -> ApprovalRecord:
        """The approval request ``approval_id``."""
        ...

    def approve(self, approval_id: str, *, by: str, note: str | None = None
                ) -> ApprovalRecord:
        """Approve a pending request."""
        ...

    def deny(self, approval_id: str, *, by: str, reason: str | None = None) -> ApprovalRecord:
        """Deny a pending request."""
        ...
