"""The per-call statements: compiled on first use, shared by every store of one dialect and
durability, and one lease-secret hash per begin (the holder's report reuses it)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.dialects.postgresql import psycopg
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

import effectgate as eg
from effectgate import request as request_module
from effectgate.store import Store
from effectgate.store.statements import _NAMES, Statements


def _both() -> list[tuple[Any, str]]:
    return [(sqlite_dialect(paramstyle="named"), "sqlite"), (psycopg.dialect(), "postgresql")]


@pytest.mark.parametrize("durability", ["reserve", "relaxed"])
def test_every_statement_compiles_on_both_dialects(durability: str) -> None:
    """Each statement compiles (no literal bind slips in) for each dialect and durability."""
    for dialect, name in _both():
        sql = Statements(dialect, name, durability)
        sql.compile_all()
        assert set(_NAMES) <= set(vars(sql))
        assert all(getattr(sql, n).text for n in _NAMES)


def test_a_statement_is_compiled_when_first_used_and_kept() -> None:
    """A new set compiles nothing up front; the first read compiles, the next reuses it."""
    sql = Statements(sqlite_dialect(paramstyle="named"), "sqlite")
    assert not set(_NAMES) & set(vars(sql))
    first = sql.fetch
    assert "fetch" in vars(sql) and sql.fetch is first
    assert "resolve" not in vars(sql)
    with pytest.raises(AttributeError):
        _ = sql.no_such_statement  # type: ignore[attr-defined]


def test_lazy_texts_are_the_eager_ones() -> None:
    """The relaxed and the default durability differ where they must (Postgres: the outcome
    rides on the next sync only at the default)."""
    pg = {d: Statements(psycopg.dialect(), "postgresql", d) for d in ("reserve", "relaxed")}
    assert "set_config" in pg["reserve"].report.text
    assert "set_config" not in pg["relaxed"].report.text
    assert pg["reserve"].fetch.text == pg["relaxed"].fetch.text


def test_stores_of_one_dialect_and_durability_share_their_statements(
        store_url: str, tmp_path: Path) -> None:
    """A second store on the same kind of database compiles nothing again; another
    durability has its own statements."""
    if store_url.startswith("sqlite"):
        other_url = f"sqlite:///{tmp_path / 'other.db'}"
    else:
        other_url = store_url
    one, two = Store(store_url), Store(other_url)
    relaxed = Store(other_url, durability="relaxed")
    try:
        assert one.sql is two.sql
        assert relaxed.sql is not one.sql
    finally:
        for store in (one, two, relaxed):
            store.close()


class _CountingSha256:
    """hashlib with its sha256 calls counted (the real digest is returned)."""

    def __init__(self) -> None:
        self.calls = 0

    def sha256(self, data: bytes = b"") -> Any:
        self.calls += 1
        return hashlib.sha256(data)


def test_one_lease_secret_hash_per_begin(make_gate: Any, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    """begin, a heartbeat and the report hash the lease secret once between them."""
    gate: eg.Gate = make_gate(policy=False)
    counting = _CountingSha256()
    monkeypatch.setattr(request_module, "hashlib", counting)
    d = gate.begin(effect_type="t.hash", key="hash:1", payload={"n": 1})
    assert d.decision is eg.Decision.EXECUTE
    gate.extend_lease(d, seconds=30)
    gate.report(d, outcome="committed", result={"ok": True})
    assert counting.calls == 1
    record = gate.get("hash:1")
    assert record is not None and record.state is eg.State.COMMITTED


def test_a_borrowed_secret_is_still_refused(make_gate: Any) -> None:
    """The remembered hashes are only a shortcut: a wrong secret is hashed and refused."""
    gate: eg.Gate = make_gate(policy=False)
    d = gate.begin(effect_type="t.hash", key="hash:2", payload={"n": 2})
    lease = d.lease
    assert lease is not None
    forged = lease._replace(secret=lease.secret[:-1] + ("A" if lease.secret[-1] != "A" else "B"))
    with pytest.raises(eg.StaleLease):
        gate.report(forged, outcome="committed", result=None)
    gate.report(lease, outcome="committed", result=None)
    record = gate.get("hash:2")
    assert record is not None and record.state is eg.State.COMMITTED
