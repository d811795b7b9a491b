"""Reads behind the gate's facade: listing effects and approvals, and the AMBIGUOUS queue,
every filter validated before the store is asked (rows come back; the gate turns them into
records, a lapsed IN_FLIGHT effect reading as AMBIGUOUS)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import validate
from .errors import ConfigError
from .states import ApprovalState, State

if TYPE_CHECKING:
    from .store import Store
    from .store.queue import QueuePage
    from .store.rows import ApprovalRow, EffectRow

__all__ = ["ambiguous_rows", "approval_rows", "effect_rows", "parse_state"]


def parse_state(state: State | str) -> State:
    """``state`` as a :class:`State` (any case); :class:`ConfigError` naming the states."""
    try:
        return State(state.lower() if isinstance(state, str) else state)
    except ValueError:
        names = ", ".join(s.value for s in State)
        raise ConfigError(f"state must be one of {names}, not {state!r}") from None


def effect_rows(store: Store, namespace: str, *, state: State | str | None,
                effect_type: str | None, run_id: str | None, agent_id: str | None,
                group_key: str | None, key_prefix: str | None, limit: int | None,
                before_id: int | None) -> list[EffectRow]:
    """The rows :meth:`Gate.list_effects <effectgate.Gate.list_effects>` lists."""
    wanted = None if state is None else parse_state(state)
    if limit is not None:
        limit = validate.whole(limit, "limit", minimum=1)
    if before_id is not None:
        before_id = validate.whole(before_id, "before_id", minimum=1)
    return store.effects(
        namespace, state=wanted,
        effect_type=validate.text(effect_type, "effect_type", 200),
        run_id=validate.text(run_id, "run_id", 256),
        agent_id=validate.text(agent_id, "agent_id", 256),
        group_key=validate.text(group_key, "group_key", 512),
        key_prefix=validate.text(key_prefix, "key_prefix", 512),
        limit=limit, before_id=before_id)


def approval_rows(store: Store, namespace: str, state: ApprovalState | str | None,
                  ) -> tuple[list[ApprovalRow], ApprovalState | None]:
    """Every approval row of ``namespace`` and the state asked for (None: all)."""
    wanted = None
    if state is not None:
        try:
            wanted = ApprovalState(state.lower() if isinstance(state, str) else state)
        except ValueError:
            names = ", ".join(s.value for s in ApprovalState)
            raise ConfigError(f"state must be one of {names}, not {state!r}") from None
    return store.approvals(namespace), wanted


def ambiguous_rows(store: Store, namespace: str, *, before_id: int | None,
                   limit: int) -> QueuePage:
    """One page of the AMBIGUOUS queue (see :mod:`effectgate.store.queue`)."""
    from .store.queue import ambiguous_page

    limit = validate.whole(limit, "limit", minimum=1)
    if limit > 500:
        raise ConfigError("limit is at most 500")
    if before_id is not None:
        before_id = validate.whole(before_id, "before_id", minimum=1)
    return ambiguous_page(store.engine, namespace, before_id=before_id, limit=limit)
