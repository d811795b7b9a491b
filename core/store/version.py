"""The schema version a store carries, and the names of its meta rows: what a store opening
on an up-to-date database needs, without SQLAlchemy (:mod:`effectgate.store.schema` creates
and migrates, and checks that :data:`SCHEMA_VERSION` is the number of its migrations).

A store kept open while a newer effectgate migrates it stops writing (:class:`VersionWatch`).
"""

from __future__ import annotations

import hashlib
import time

from ..errors import ConfigError, StoreError

__all__ = ["RECHECK_SECONDS", "SCHEMA_VERSION", "VERSION_SQL", "VersionWatch", "newer_schema",
           "policy_meta_name", "version_of"]

# The version this effectgate writes: schema.MIGRATIONS has exactly this many entries.
SCHEMA_VERSION = 6
VERSION_SQL = "SELECT value FROM effectgate_meta WHERE name = 'schema_version'"
# How long a kept connection writes before it reads the schema version again.
RECHECK_SECONDS = 30.0


def policy_meta_name(namespace: str) -> str:
    """The ``effectgate_meta`` row that holds a namespace's last recorded policy (at most 64
    characters: a long namespace goes by its digest)."""
    name = f"policy:{namespace}"
    if len(name) <= 64 and name.isascii() and name.isprintable():
        return name
    return "policy:#" + hashlib.sha256(namespace.encode("utf-8")).hexdigest()[:48]


def version_of(value: object) -> int:
    """The schema version a meta row's ``value`` says (0: none)."""
    try:
        return int(value) if value is not None else 0  # type: ignore[call-overload]
    except ValueError:
        raise ConfigError(f"the store's schema version {value!r} is not a number") from None


def newer_schema(version: int, where: str) -> StoreError:
    """The refusal of a store whose schema a newer effectgate migrated: this one would write
    rows that schema may not expect."""
    return StoreError(
        f"the store at {where} has schema version {version}, newer than this effectgate's "
        f"version {SCHEMA_VERSION}: it writes nothing there; upgrade effectgate",
        reason=f"schema version {version} > {SCHEMA_VERSION}")


class VersionWatch:
    """Whether the store is still at the schema version this effectgate writes, for a store
    that stays open while a newer effectgate migrates it. The per-call paths read the version
    as each connection opens (with its other set-up, so the per-call round trips stay as
    they are), and before a write at most every :data:`RECHECK_SECONDS` (one small read on
    the connection that writes): a newer version refuses the write (:func:`newer_schema`),
    and every write after it until the version is this one again. Reads are never refused."""

    next_read: float
    """The clock (``time.monotonic``) from which the next write reads the version first
    (the per-call path compares it inline, without a call)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.interval = RECHECK_SECONDS
        self.next_read = time.monotonic() + self.interval

    def due(self) -> bool:
        """True when the next write must read the version first."""
        return time.monotonic() >= self.next_read

    def note(self, value: object) -> bool:
        """Take the version just read (the ``value`` of its meta row, read when a connection
        opens or before a write); True when it is newer than this effectgate's, and then
        every write reads it again first until it is this one again."""
        if version_of(value) > SCHEMA_VERSION:
            self.next_read = 0.0
            return True
        self.next_read = time.monotonic() + self.interval
        return False

    def seen(self, value: object) -> None:
        """:meth:`note` before a write: :func:`newer_schema` when the version is newer."""
        if self.note(value):
            raise newer_schema(version_of(value), self.where)
