"""Helpers for testing your own gated tools: a throw-away gate, and a way to make leases lapse
without waiting."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .gate import Gate

__all__ = ["lapse_leases", "temporary_gate"]


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
