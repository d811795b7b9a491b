"""The schema version a store carries, and the names of its meta rows: what a store opening
on an up-to-date database needs, without SQLAlchemy (:mod:`effectgate.store.schema` creates
and migrates, and checks that :data:`SCHEMA_VERSION` is the number of its migrations).

A store kept open while a newer effectgate migrates it stops writing (:class:`VersionWatch`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping

from ..errors import ConfigError, StoreError

__all__ = ["RECHECK_SECONDS", "SCHEMA_VERSION", "VERSION_SQL", "VersionWatch", "newer_schema",
           "policy_meta_name", "vendor_secret_of", "version_of"]

# The version this effectgate writes: schema.MIGRATIONS has exactly this many entries.
SCHEMA_VERSION = 6
VERSION_SQL = "SELECT value FROM effectgate_meta WHERE name = 'schema_version'"
# How long a kept connection writes before it reads the schema version again.
RECHECK_SECONDS = 30.0


def policy_meta_name(namespace: str) -> str:
    """The ``effectgate_meta`` row that holds a namespace's last recorded policy (at most 64
    characters: a long namespace goes by its digest, and so does one that begins with ``#``,
    which could otherwise name the row of another namespace's digest)."""
    name = f"policy:{namespace}"
    if len(name) <= 64 and name.isascii() and name.isprintable() and (
            not namespace.startswith("#")):
        return name
    return "policy:#" + hashlib.sha256(namespace.encode("utf-8")).hexdigest()[:48]


def version_of(value: object) -> int:
    """The schema version a meta row's ``value`` says (0: none); :class:`ConfigError` for
    one that is not a whole number from 1 up (a row effectgate did not write)."""
    if value is None:
        return 0
    try:
        number: int = int(value)  # type: ignore[call-overload]
    except ValueError:
        raise ConfigError(f"the store's schema version {value!r} is not a number") from None
    if number < 1:
        raise ConfigError(f"the store's schema version {value!r} is not a version (they "
                          "count from 1); it is left as it is")
    return number


def vendor_secret_of(meta: Mapping[str, str]) -> bytes:
    """The store's vendor secret, from its meta rows: :class:`ConfigError` when it is missing
    or not 32 or more hex digits (128 bits). Every vendor idempotency key derives from it, so
    it is never made anew on an existing store: an effect's next attempt would get another
    key than the one its earlier holder may still send."""
    secret = meta.get("vendor_secret")
    try:
        value = bytes.fromhex(secret) if secret is not None else b""
    except ValueError:
        value = b""
    if len(value) < 16:
        raise ConfigError(
            "the store's vendor_secret is " + ("missing" if secret is None else
                                               "not 32 or more hex digits")
            + ": every vendor idempotency key derives from it, so it is not made anew; the "
            "store is left as it is (restore the row from a backup)")
    return value


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
        opens or before a write); True when it is newer than this effectgate's, or none a
        store says (no row, not a version), and then every write reads it again first until
        it is this one again. Never raises: reads go on whatever the row says."""
        return self._take(value) is not None

    def seen(self, value: object) -> None:
        """:meth:`note` before a write: :func:`newer_schema` when the version is newer, a
        :class:`ConfigError` when the row says no version."""
        refusal = self._take(value)
        if refusal is not None:
            raise refusal

    def _take(self, value: object) -> ConfigError | StoreError | None:
        refusal = _refusal(value, self.where)
        self.next_read = 0.0 if refusal is not None else time.monotonic() + self.interval
        return refusal


def _refusal(value: object, where: str) -> ConfigError | StoreError | None:
    """Why a store whose version row says ``value`` (None: no row) takes no write from this
    effectgate, or None when it is this version or an older one."""
    if value is None:
        return ConfigError(f"the store at {where} has lost its schema version row; it "
                           "writes nothing there until it is restored")
    try:
        version = version_of(value)
    except ConfigError as err:
        return err
    return newer_schema(version, where) if version > SCHEMA_VERSION else None
