"""What the explorers share (:mod:`effectgate.verify.explore`, :mod:`effectgate.verify.cover`):
the longest walk a schedule is extended by, the garbage collector paused while an exploration
keeps every state it reached, and the path back from a state to the root."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

from .model import Action

__all__ = ["MAX_WALK", "collector_paused", "path_to"]

MAX_WALK = 200
"""The most actions a schedule is extended by to reach a final state."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (if it runs): an exploration keeps every
    state it reached, and the collector's passes over those (triggered by the tuples each
    transition and each symmetry key allocates) took most of a large bound's time. Nothing
    the exploration makes is cyclic garbage (states are trees of tuples); reference counting
    frees what it drops."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def path_to(parent: dict[Any, tuple[Any, Action] | None], s: Any) -> list[Action]:
    """The actions from the root to ``s`` (a state, or a state's key in ``parent``)."""
    out: list[Action] = []
    link = parent[s]
    while link is not None:
        s, action = link
        out.append(action)
        link = parent[s]
    return out[::-1]
