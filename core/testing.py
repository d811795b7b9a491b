"""Helpers for testing your own gated tools: a throw-away gate, and a way to make leases lapse
without waiting."""

from __future__ import annotations

import contextlib
import copy
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .errors import ConfigError
from .gate import Gate

__all__ = ["in_namespace", "lapse_leases", "temporary_gate"]


@contextlib.contextmanager
def temporary_gate(**options: Any) -> Iterator[Gate]:
    """A gate on a fresh SQLite file that is deleted afterwards."""
    with tempfile.TemporaryDirectory(prefix="effectgate-") as folder:
        gate = Gate(f"sqlite:///{Path(folder) / 'effects.db'}", **options)
        try:
            yield gate
        finally:
            gate.close()


def lapse_leases(gate: Gate, key: str | None = None) -> int:
    """Move the lease of every IN_FLIGHT effect (or just ``key``) into the past, as if its
    holder had died long ago. Returns how many leases lapsed. For tests only."""
    sql = (
        "UPDATE effectgate_effects SET lease_expires_at = lease_expires_at - 1000000 "
        "WHERE namespace = :ns AND state = 'in_flight'"
    )
    params: dict[str, Any] = {"ns": gate.namespace}
    if key is not None:
        sql += " AND key = :key"
        params["key"] = key
    with gate.store.engine.connect() as conn:
        return conn.execute(text(sql), params).rowcount


def in_namespace(gate: Gate, namespace: str) -> Gate:
    """A gate like ``gate`` (same store and connections, policy, options, reconcilers and
    compensators) in another ``namespace``, without opening the store again: for property and
    state-machine tests that need a fresh namespace per example. Close only ``gate``."""
    if not isinstance(namespace, str) or not namespace.strip() or len(namespace) > 128:
        raise ConfigError("namespace must be a non-empty str of at most 128 characters")
    other = copy.copy(gate)
    other.namespace = namespace
    other._memo = OrderedDict()
    other._memo_lock = threading.Lock()
    other._reconcilers = dict(gate._reconcilers)
    other._compensators = dict(gate._compensators)
    return other
