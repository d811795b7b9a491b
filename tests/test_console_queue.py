"""The AMBIGUOUS queue over 100,000 effects: an index-backed, paged query (shown by
``EXPLAIN``) that renders in under 200 ms, on SQLite and Postgres."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

import effectgate as eg
from effectgate.console import build_app
from effectgate.store.queue import WINDOW, ambiguous_statement

from .console_helpers import sign_in

N = 100_000
EVERY = 1_000  # one AMBIGUOUS effect in a thousand: 100 in all

_BULK_SQLITE = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :n)
INSERT INTO effectgate_effects (namespace, key, effect_type, payload_hash, state, attempt,
    token, created_at, updated_at, history, error)
SELECT :ns, 'bulk:' || i, 'bulk.write', :hash,
       CASE WHEN i % :every = 0 THEN 'ambiguous' ELSE 'committed' END, 1, 1, :now, :now, '',
       CASE WHEN i % :every = 0 THEN 'timeout talking to the vendor' END
FROM n
"""
_BULK_PG = """
INSERT INTO effectgate_effects (namespace, key, effect_type, payload_hash, state, attempt,
    token, created_at, updated_at, history, error)
SELECT :ns, 'bulk:' || i, 'bulk.write', :hash,
       CASE WHEN i % :every = 0 THEN 'ambiguous' ELSE 'committed' END, 1, 1, :now, :now, '',
       CASE WHEN i % :every = 0 THEN 'timeout talking to the vendor' END
FROM generate_series(1, :n) AS i
"""


@pytest.fixture
def big(store_url: str, namespace: str, backend: str) -> Iterator[eg.Gate]:
    gate = eg.Gate(store_url, namespace=namespace)
    bulk = _BULK_PG if backend == "postgres" else _BULK_SQLITE
    with gate.store.engine.begin() as conn:
        conn.execute(text(bulk), {"ns": namespace, "hash": "0" * 64, "every": EVERY,
                                  "n": N, "now": time.time() - 3600})
    if backend == "postgres":
        with gate.store.engine.begin() as conn:
            conn.execute(text("ANALYZE effectgate_effects"))
    yield gate
    gate.close()


def _plan(gate: eg.Gate, backend: str) -> str:
    engine = gate.store.engine
    with engine.connect() as conn:
        hi = int(conn.execute(text("SELECT max(id) FROM effectgate_effects")).scalar() or 0) + 1
    stmt = ambiguous_statement(engine.dialect.name).params(
        namespace=gate.namespace, hi=hi, lo=hi - WINDOW, limit=50)
    sql = str(stmt.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    prefix = "EXPLAIN " if backend == "postgres" else "EXPLAIN QUERY PLAN "
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(prefix + sql.replace("%", "%%") if backend == "postgres"
                                    else prefix + sql)
        return "\n".join(" ".join(str(c) for c in r) for r in rows)


def test_the_queue_is_a_primary_key_range_scan(big: eg.Gate, backend: str) -> None:
    plan = _plan(big, backend)
    print(f"\nEXPLAIN ({backend}):\n{plan}")
    if backend == "postgres":
        assert "effectgate_effects_pkey" in plan and "Seq Scan" not in plan, plan
    else:
        assert re.search(r"SEARCH effectgate_effects USING INTEGER PRIMARY KEY "
                         r"\(rowid>\? AND rowid<\?\)", plan), plan
        assert "TEMP B-TREE" not in plan, plan  # no sort: the key gives the order


def test_queue_page_over_100k_effects_renders_under_200ms(big: eg.Gate, backend: str) -> None:
    _, token = big.add_principal("alice", "operator")
    with TestClient(build_app(big), base_url="http://127.0.0.1") as client:
        sign_in(client, token)
        client.get("/ambiguous")  # warm: connections, templates
        times, page = [], None
        for _ in range(5):
            started = time.perf_counter()
            page = client.get("/ambiguous")
            times.append(time.perf_counter() - started)
        assert page is not None and page.status_code == 200
        median = statistics.median(times)
        print(f"\n/ambiguous over {N:,} effects ({backend}): median {median * 1000:.1f} ms, "
              f"max {max(times) * 1000:.1f} ms")
        assert median < 0.2, times
        # Page through the whole queue: every AMBIGUOUS effect exactly once, newest first.
        seen: list[int] = []
        path: str | None = "/ambiguous"
        while path is not None:
            body = client.get(path).text
            seen += [int(i) for i in re.findall(r'<a href="/effects/(\d+)">#', body)]
            more = re.search(r'href="(/ambiguous\?before=\d+)"', body)
            path = more.group(1) if more else None
    assert len(seen) == N // EVERY == len(set(seen)) and seen == sorted(seen, reverse=True)
    assert {r.effect_id for r in big.list_effects(state="ambiguous", limit=None)} == set(seen)
