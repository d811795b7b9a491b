"""Hooks registered per effect type (reconcilers, compensators): an exact name, else the most
specific glob pattern that matches (:func:`type_matches`: a hook for a saga's steps never
answers for their undos)."""

from __future__ import annotations

import fnmatch
from typing import Generic, TypeVar

__all__ = ["UNDO_SUFFIX", "Registry", "type_matches"]

T = TypeVar("T")

UNDO_SUFFIX = ".compensate"
"""An undo's effect type is its step's type with this suffix (``booking.hotel.compensate``)."""


def type_matches(effect_type: str, pattern: str) -> bool:
    """Whether the hook pattern ``pattern`` covers ``effect_type``. An undo's type is covered
    only by a pattern written for undos (ending in :data:`UNDO_SUFFIX`): ``booking.*``'s
    reconciler asks "does the booking exist?", the opposite of what an undo's needs answered.
    (Policy rules are plain globs: ``*`` and ``booking.*`` govern undos too, so naming a type
    ``….compensate`` never escapes an approval or a ceiling.)"""
    return fnmatch.fnmatchcase(effect_type, pattern) and (
        not effect_type.endswith(UNDO_SUFFIX) or pattern.endswith(UNDO_SUFFIX))


class Registry(Generic[T]):
    """Effect type pattern → hook."""

    __slots__ = ("_hooks",)

    def __init__(self, hooks: dict[str, T] | None = None) -> None:
        self._hooks: dict[str, T] = dict(hooks or {})

    def register(self, pattern: str, hook: T) -> None:
        """Register ``hook`` for the effect types ``pattern`` matches (replacing an earlier
        one for the same pattern)."""
        self._hooks[pattern] = hook

    def find(self, effect_type: str) -> T | None:
        """The hook for ``effect_type``: its exact entry, else the matching pattern with the
        longest literal prefix."""
        found = self._hooks.get(effect_type)
        if found is not None:
            return found
        best: tuple[int, T] | None = None
        for pattern, hook in self._hooks.items():
            if type_matches(effect_type, pattern):
                prefix = len(pattern.split("*")[0].split("?")[0].split("[")[0])
                if best is None or prefix > best[0]:
                    best = (prefix, hook)
        return None if best is None else best[1]

    def __contains__(self, effect_type: object) -> bool:
        return isinstance(effect_type, str) and self.find(effect_type) is not None

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def copy(self) -> Registry[T]:
        """A registry with the same hooks (registering on one does not change the other)."""
        return Registry(self._hooks)
