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


def lapse_leases(gate: Gate, key: str | None = None, *,
                 seconds_ago: float | None = None) -> int:
    """Make the lease of every IN_FLIGHT effect (or just ``key``) lapse, as if its holder had
    stopped long ago; a lease that already lapsed (an AMBIGUOUS effect its holder may still
    report on) moves further into the past, as time passing would move it. ``seconds_ago``:
    the lease lapsed that many seconds before now (inside a reconcile grace period, say), or
    earlier if it already had; default: a million seconds earlier than it was. Returns how
    many leases moved. For tests only."""
    params: dict[str, Any] = {"ns": gate.namespace}
    if seconds_ago is None:
        change = "lease_expires_at - 1000000"
    else:  # never later than it was: time passing only moves a lapse further back
        change = "CASE WHEN lease_expires_at < :at THEN lease_expires_at ELSE :at END"
        params["at"] = gate.store.now() - float(seconds_ago)
    sql = (
        f"UPDATE effectgate_effects SET lease_expires_at = {change} "
        "WHERE namespace = :ns AND lease_expires_at IS NOT NULL "
        "AND state IN ('in_flight', 'ambiguous')"
    )
    if key is not None:
        sql += " AND key = :key"
        params["key"] = key
    with gate.store.engine.connect() as conn:
        return int(conn.execute(text(sql), params).rowcount)


def in_namespace(gate: Gate, namespace: str) -> Gate:
    """:meth:`Gate.in_namespace` (kept for tests written before it existed)."""
    return gate.in_namespace(namespace)
