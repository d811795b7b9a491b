"""A resolve without ``force`` never lands on a lease its holder extended since the resolve
read it lapsed (red team, round 10). On Postgres the holder's extend, started while its lease
was live, waited on the row's lock; the operator read the lease as lapsed and resolved; the
extend committed first, and the resolve then went through: attempt 2 could run while the
first holder acted on a lease it was told is live. The resolve's statement now asks that the
lease is not live (unless forced), and the operator is told the lease is live."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

import effectgate as eg

from .conftest import PG_URL, TEST_PREFIX, require_postgres


def _waiting_on(conn: Any, pid: int) -> int:
    """How many backends wait, directly or behind another waiter, on backend ``pid``."""
    return int(conn.execute(
        "WITH first AS (SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))) "
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE pg_blocking_pids(pid) && (ARRAY[%s] || ARRAY(SELECT pid FROM first))",
        (pid, pid)).fetchone()[0])


def _until(check: Any, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_resolve_waiting_behind_an_extend_is_refused_as_live() -> None:
    require_postgres()
    import psycopg

    namespace = f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}"
    raw = PG_URL.replace("+psycopg", "")
    holder = eg.Gate(PG_URL, namespace=namespace, policy=False, lease_seconds=3)
    operator = eg.Gate(PG_URL, namespace=namespace, policy=False)
    locker = psycopg.connect(raw)
    watcher = psycopg.connect(raw, autocommit=True)
    got: dict[str, Any] = {}
    try:
        d = holder.begin(effect_type="t.x", key="k", payload={})
        end = holder.get("k").lease_expires_at
        assert end is not None
        locker.execute("SELECT 1 FROM effectgate_effects WHERE namespace = %s AND key = 'k' "
                       "FOR UPDATE", (namespace,))  # any writer holding the row
        pid = locker.info.backend_pid

        def extend() -> None:
            got["extend"] = holder.extend_lease(d, seconds=60)

        def resolve() -> None:
            try:
                got["resolve"] = operator.resolve("k", "failed", by="ops")
            except eg.EffectGateError as err:
                got["resolve"] = err

        extending = threading.Thread(target=extend)
        extending.start()  # while the lease is live: it waits on the row's lock
        _until(lambda: _waiting_on(watcher, pid) == 1, "the extend to wait")
        _until(lambda: operator.get("k").state is eg.State.AMBIGUOUS, "the lease to lapse")
        resolving = threading.Thread(target=resolve)
        resolving.start()
        _until(lambda: _waiting_on(watcher, pid) == 2, "the resolve to wait")
        locker.rollback()  # the extend goes first, then the resolve
        extending.join(30)
        resolving.join(30)
        assert got["extend"].timestamp() > end.timestamp() + 30  # told: live for a minute
        assert isinstance(got["resolve"], eg.InvalidTransition), got["resolve"]
        assert "lease is live" in str(got["resolve"])
        holder.report(d, "committed", result={"ok": True})  # the holder's lease held
        assert operator.get("k").state is eg.State.COMMITTED
    finally:
        locker.close()
        watcher.close()
        holder.close()
        operator.close()


def test_a_forced_resolve_still_overrides_a_live_lease() -> None:
    """``force`` is for a holder known to be gone: the statement lets it through."""
    require_postgres()
    namespace = f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}"
    with eg.Gate(PG_URL, namespace=namespace, policy=False, lease_seconds=600) as gate:
        d = gate.begin(effect_type="t.x", key="k", payload={})
        with pytest.raises(eg.InvalidTransition, match="lease is live"):
            gate.resolve("k", "failed", by="ops")
        assert gate.resolve("k", "failed", by="ops", force=True).state is eg.State.FAILED
        with pytest.raises(eg.StaleLease):
            gate.report(d, "committed")
