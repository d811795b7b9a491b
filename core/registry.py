"""Hooks registered per effect type (reconcilers, compensators): an exact name, else the most
specific glob pattern that matches."""

from __future__ import annotations

import fnmatch
from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


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
            if fnmatch.fnmatchcase(effect_type, pattern):
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
