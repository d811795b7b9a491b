"""Every option a caller passes to ``Gate()`` is checked before the store is opened: a bad one
is a typed ``ConfigError`` that creates no store (no SQLite file or folder, no Postgres table)
and changes nothing in an existing one (its rows, and the policy it records as in force for
the namespace, which a refused gate used to replace)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg

REAL = {"effects": {"payment.*": {"approval": "always"}}}
OTHER = {"effects": {"payment.*": {"deny": "not today"}}}

BAD: list[Any] = [
    pytest.param({"webhooks": 42}, {}, id="webhooks-int"),
    pytest.param({"webhooks": True}, {}, id="webhooks-true"),
    pytest.param({}, {"EFFECTGATE_WEBHOOK_URL": "https://hooks.example.com/x"},
                 id="webhooks-env-without-secret"),
    pytest.param({"telemetry": "yes please"}, {}, id="telemetry-str"),
    pytest.param({"telemetry": 1}, {}, id="telemetry-int"),
    pytest.param({"memo_size": "abc"}, {}, id="memo-str"),
    pytest.param({"memo_size": None}, {}, id="memo-none"),
    pytest.param({"memo_size": math.nan}, {}, id="memo-nan"),
    pytest.param({"memo_size": -1}, {}, id="memo-negative"),
    pytest.param({"memo_size": True}, {}, id="memo-bool"),
    pytest.param({"memo_size": 1.5}, {}, id="memo-float"),
    pytest.param({"durability": "sometimes"}, {}, id="durability"),
    pytest.param({"read_only": "no"}, {}, id="read-only-str"),
    pytest.param({"text_redactor": 42}, {}, id="text-redactor"),
    # checked before the store by their own owners already: kept so
    pytest.param({"namespace": ""}, {}, id="namespace"),
    pytest.param({"lease_seconds": 0}, {}, id="lease-seconds"),
    pytest.param({"max_attempts": 0}, {}, id="max-attempts"),
    pytest.param({"classifiers": (42,)}, {}, id="classifiers"),
    pytest.param({"async_pool_size": 0}, {}, id="async-pool-size"),
    pytest.param({"policy": 42}, {}, id="policy"),
]


def _everything(url: str) -> dict[str, list[tuple[Any, ...]]] | None:
    """Every ``effectgate_*`` table of the store at ``url`` and all its rows (None: there is
    no SQLite file, which reading it must not create)."""
    from sqlalchemy import create_engine, inspect, text

    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        return None
    engine = create_engine(url)
    try:
        tables = sorted(t for t in inspect(engine).get_table_names() if t.startswith("effectgate"))
        with engine.connect() as conn:
            return {t: sorted((tuple(row) for row in conn.execute(text(f"SELECT * FROM {t}"))),
                              key=repr) for t in tables}
    finally:
        engine.dispose()


@pytest.fixture
def fresh_url(backend: str, pg_schema: str | None, tmp_path: Path) -> str:
    """A store not created yet: a SQLite file in a folder not made yet, or an empty Postgres
    schema."""
    return pg_schema or f"sqlite:///{tmp_path / 'sub' / 'effects.db'}"


@pytest.mark.parametrize(("options", "env"), BAD)
def test_a_bad_option_creates_no_store(options: dict[str, Any], env: dict[str, str],
                                       fresh_url: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("EFFECTGATE_WEBHOOK_SECRET", raising=False)
    before = _everything(fresh_url)
    with pytest.raises(eg.ConfigError):
        eg.Gate(fresh_url, **{"policy": OTHER, **options})
    assert _everything(fresh_url) == before
    if fresh_url.startswith("sqlite"):
        assert before is None and not (tmp_path / "sub").exists()  # not even the folder
    else:
        assert before == {}  # the schema is still empty


@pytest.mark.parametrize(("options", "env"), BAD)
def test_a_bad_option_changes_nothing_in_an_existing_store(
        options: dict[str, Any], env: dict[str, str], own_store_url: str, namespace: str,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Nor the policy recorded for the namespace: the next gate with the real policy finds
    it as it left it, and says nothing about a change."""
    with eg.Gate(own_store_url, namespace=namespace, policy=REAL) as gate:
        gate.begin(effect_type="payment.refund", key="refund:1", payload={"amount": 5})
    before = _everything(own_store_url)
    assert before and any(f"policy:{namespace}" in map(str, row)
                          for row in before["effectgate_meta"])
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("EFFECTGATE_WEBHOOK_SECRET", raising=False)
    with pytest.raises(eg.ConfigError):
        eg.Gate(own_store_url, **{"namespace": namespace, "policy": OTHER, **options})
    assert _everything(own_store_url) == before
    for name in env:
        monkeypatch.delenv(name)
    caplog.clear()
    with caplog.at_level("WARNING", logger="effectgate"):
        eg.Gate(own_store_url, namespace=namespace, policy=REAL).close()
    assert not [r for r in caplog.records if "polic" in r.getMessage().lower()]


def test_a_url_that_is_no_string_is_a_config_error() -> None:
    with pytest.raises(eg.ConfigError, match="url must be a str"):
        eg.Gate(42, policy=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("memo_size", [0, 1, 4096])
def test_good_memo_sizes_are_kept(memo_size: int, store_url: str, namespace: str) -> None:
    with eg.Gate(store_url, namespace=namespace, policy=False, memo_size=memo_size) as gate:
        assert gate._memo.size == memo_size
