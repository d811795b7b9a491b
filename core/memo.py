"""The COMMITTED memo: COMMITTED is terminal, so a process may answer a repeat of a committed
key (same effect type and payload hash) from memory, with no round trip.

Bounded (the earliest remembered go first: a hit does not refresh an entry, so a read
takes no lock) and thread-safe. A gate forgets its memo when it prunes;
another process's memo keeps the result it saw until that process forgets it (``memo_size=0``
turns the memo off where results must leave memory with the store's copy).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["CommittedMemo", "MemoEntry"]


class MemoEntry(NamedTuple):
    """What a duplicate from memory answers with."""

    payload_hash: str
    effect_type: str
    effect_id: int
    attempt: int
    token: int
    result: str | None


_new_entry = tuple.__new__


class CommittedMemo:
    """Key → :class:`MemoEntry` of COMMITTED effects, at most ``size`` of them."""

    __slots__ = ("_entries", "_lock", "find", "size")

    def __init__(self, size: int) -> None:
        self.size = max(0, int(size))
        self._entries: OrderedDict[str, MemoEntry] = OrderedDict()
        self._lock = threading.Lock()
        self.find: Callable[[str], MemoEntry | None] = self._entries.get
        """The entry for a key, or None: the dict's own ``get`` (every begin asks; a lock-free
        read: a dict lookup is atomic; a memo of size 0 holds nothing)."""

    def put(self, key: str, entry: MemoEntry) -> None:
        """Remember a COMMITTED effect."""
        self.remember(key, *entry)

    def remember(self, key: str, payload: str, effect_type: str, effect_id: int, attempt: int,
                 token: int, result: str | None) -> None:
        """Remember a COMMITTED effect from its fields (an executed effect's report, a
        duplicate read from the store: its entry built here, in one call, as the tuple it
        is)."""
        if not self.size:
            return
        entry = _new_entry(MemoEntry, (payload, effect_type, effect_id, attempt, token, result))
        with self._lock:
            self._entries[key] = entry
            if len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (after a prune)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
