"""The context variables, in one place: the run and agent a ``begin`` is attributed to
(:class:`effect_context`), and the effect whose body is running (:func:`current_effect`)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .errors import EffectGateError

if TYPE_CHECKING:
    from .records import BeginDecision

__all__ = ["current_effect", "current_effect_scope", "effect_context", "run_context"]

_run: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "effectgate_run_context", default=(None, None)
)
_current: contextvars.ContextVar[BeginDecision | None] = contextvars.ContextVar(
    "effectgate_current_effect", default=None
)


def run_context() -> tuple[str | None, str | None]:
    """The ``(run_id, agent_id)`` in force here (None where none was set)."""
    return _run.get()


class effect_context:
    """Set the default ``run_id`` and ``agent_id`` for every ``begin`` inside the block.

    Framework integrations use it to carry a run's or conversation's id and the agent's name::

        with eg.effect_context(run_id="run_42", agent_id="billing-agent"):
            refund("txn_1", 500)
    """

    def __init__(self, *, run_id: str | None = None, agent_id: str | None = None) -> None:
        self._value = (run_id, agent_id)
        self._token: contextvars.Token[tuple[str | None, str | None]] | None = None

    @staticmethod
    def current() -> tuple[str | None, str | None]:
        """The ``(run_id, agent_id)`` in force here (None where none was set)."""
        return _run.get()

    def __enter__(self) -> effect_context:
        outer_run, outer_agent = _run.get()
        run_id, agent_id = self._value
        self._token = _run.set((run_id or outer_run, agent_id or outer_agent))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _run.reset(self._token)
            self._token = None


def current_effect() -> BeginDecision:
    """The effect whose body is running: ``key``, ``attempt``, ``vendor_idempotency_key``...

    Raises :class:`EffectGateError` outside an effect body.
    """
    decision = _current.get()
    if decision is None:
        raise EffectGateError("current_effect() is only available inside an effect's body")
    return decision


@contextlib.contextmanager
def current_effect_scope(d: BeginDecision) -> Iterator[BeginDecision]:
    """Make ``d`` the :func:`current_effect` inside the block (for hand-written gated calls)."""
    token = _current.set(d)
    try:
        yield d
    finally:
        _current.reset(token)
