"""Schema versions and migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate.store.version import SCHEMA_VERSION


def test_fresh_store_is_at_the_latest_version(tmp_path: Path) -> None:
    gate = eg.Gate(f"sqlite:///{tmp_path / 'e.db'}")
    assert gate.store.meta["schema_version"] == str(SCHEMA_VERSION)
    assert len(gate.store.meta["vendor_secret"]) == 64
    gate.close()


_V1 = """
    DROP TABLE effectgate_principals;
    DROP TABLE effectgate_sessions;
    DROP TABLE effectgate_audit;
    ALTER TABLE effectgate_effects DROP COLUMN history;
    ALTER TABLE effectgate_effects DROP COLUMN lease_secret;
    ALTER TABLE effectgate_effects DROP COLUMN vendor_attempt;
    ALTER TABLE effectgate_effects DROP COLUMN vendor_since;
    ALTER TABLE effectgate_effects DROP COLUMN vendor_ref;
    ALTER TABLE effectgate_approvals DROP COLUMN arguments;
    CREATE TABLE effectgate_history (id INTEGER PRIMARY KEY, effect_id INTEGER NOT NULL,
        from_state VARCHAR(20), to_state VARCHAR(20) NOT NULL, at FLOAT NOT NULL,
        by VARCHAR(256), note TEXT, token BIGINT NOT NULL);
    CREATE TRIGGER effectgate_history_insert AFTER INSERT ON effectgate_effects BEGIN
      INSERT INTO effectgate_history (effect_id, to_state, at, token)
      VALUES (new.id, new.state, new.updated_at, new.token); END;
    UPDATE effectgate_meta SET value = '1' WHERE name = 'schema_version';
"""


def test_version_1_store_migrates_and_keeps_its_effects_and_history(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    gate = eg.Gate(f"sqlite:///{path}")
    d = gate.begin(effect_type="x", key="k:1", payload={})
    gate.report(d, "committed", result=7)
    gate.close()
    # Turn it back into what version 1 made: no history column, a trigger-fed history table,
    # holding the audit trail of k:1 (with text no line framing may break).
    conn = sqlite3.connect(path)
    conn.executescript(_V1)
    conn.executemany(
        "INSERT INTO effectgate_history (effect_id, from_state, to_state, at, by, note, token) "
        "VALUES (1, ?, ?, ?, ?, ?, 1)",
        [(None, "in_flight", 1000.0, "agent\u2028x", None),
         ("in_flight", "committed", 1001.5, None, "done\ttab\nline")])
    conn.commit()
    conn.close()
    gate = eg.Gate(f"sqlite:///{path}", memo_size=0)
    assert gate.store.meta["schema_version"] == str(SCHEMA_VERSION)
    assert gate.begin(effect_type="x", key="k:1", payload={}).result == 7
    carried = gate.get("k:1").history
    assert [(h.from_state, h.to_state, h.by, h.note) for h in carried] == [
        (None, eg.State.IN_FLIGHT, "agent\u2028x", None),
        (eg.State.IN_FLIGHT, eg.State.COMMITTED, None, "done\ttab\nline")]
    assert carried[1].at.timestamp() == 1001.5
    d = gate.begin(effect_type="x", key="k:2", payload={})
    gate.report(d, "committed")
    assert [h.to_state for h in gate.get("k:2").history] == [eg.State.IN_FLIGHT,
                                                             eg.State.COMMITTED]
    gate.close()
    conn = sqlite3.connect(path)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "effectgate_history" not in names and "effectgate_history_insert" not in names


def _as_version_3(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript("""
        DROP TABLE effectgate_principals;
        DROP TABLE effectgate_sessions;
        DROP TABLE effectgate_audit;
        ALTER TABLE effectgate_effects DROP COLUMN vendor_ref;
        UPDATE effectgate_meta SET value = '3' WHERE name = 'schema_version';
    """)
    conn.commit()
    conn.close()


def test_version_3_store_gains_principals_and_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    policy = {"effects": {"payment.refund": {"approval": {"always": True}}}}
    gate = eg.Gate(f"sqlite:///{path}", policy=policy)
    d = gate.begin(effect_type="x", key="k:1", payload={})
    gate.report(d, "committed", result=7)
    asked = gate.begin(effect_type="payment.refund", key="r:1", payload={"amount": 3},
                       agent_id="bot")
    gate.close()
    _as_version_3(path)
    gate = eg.Gate(f"sqlite:///{path}", policy=policy, memo_size=0)
    assert gate.store.meta["schema_version"] == str(SCHEMA_VERSION) == "6"
    assert gate.begin(effect_type="x", key="k:1", payload={}).result == 7
    assert gate.approval(asked.approval_id or "").arguments == {"amount": 3}
    operator, token = gate.add_principal("alice", "operator")
    assert gate.authenticate(token).name == "alice"
    assert gate.acting_as(operator).approve(asked.approval_id or "").decided_by == "alice"
    gate.close()


def test_version_3_store_of_an_unknown_shape_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "odd.db"
    eg.Gate(f"sqlite:///{path}").close()
    _as_version_3(path)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE effectgate_effects ADD COLUMN surprise TEXT")
    conn.commit()
    conn.close()
    with pytest.raises(eg.ConfigError, match="unexpected: surprise"):
        eg.Gate(f"sqlite:///{path}")
    conn = sqlite3.connect(path)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    version = conn.execute(
        "SELECT value FROM effectgate_meta WHERE name = 'schema_version'").fetchone()[0]
    conn.close()
    assert "effectgate_principals" not in names and version == "3"


def _as_version_4(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript("""
        DROP TABLE effectgate_sessions;
        DROP TABLE effectgate_audit;
        ALTER TABLE effectgate_effects DROP COLUMN vendor_ref;
        UPDATE effectgate_meta SET value = '4' WHERE name = 'schema_version';
    """)
    conn.commit()
    conn.close()


def test_version_4_store_gains_sessions_and_the_audit_and_keeps_every_row(
        tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    gate = eg.Gate(f"sqlite:///{path}")
    d = gate.begin(effect_type="x", key="k:1", payload={})
    gate.report(d, "committed", result=7)
    gate.add_principal("alice", "operator")
    gate.close()
    _as_version_4(path)
    gate = eg.Gate(f"sqlite:///{path}", memo_size=0)
    assert gate.store.meta["schema_version"] == str(SCHEMA_VERSION) == "6"
    assert gate.begin(effect_type="x", key="k:1", payload={}).result == 7
    assert [p.name for p in gate.list_principals()] == ["alice"]
    from effectgate.audit import list_actions, record_action

    record_action(gate, "alice", "login", via="console")
    assert [(a.actor, a.action) for a in list_actions(gate)] == [("alice", "login")]
    gate.close()


def test_version_4_store_with_a_sessions_table_already_is_refused_unchanged(
        tmp_path: Path) -> None:
    path = tmp_path / "odd4.db"
    eg.Gate(f"sqlite:///{path}").close()
    _as_version_4(path)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE effectgate_sessions (id TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(eg.ConfigError, match="already has a effectgate_sessions"):
        eg.Gate(f"sqlite:///{path}")
    conn = sqlite3.connect(path)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    version = conn.execute(
        "SELECT value FROM effectgate_meta WHERE name = 'schema_version'").fetchone()[0]
    conn.close()
    assert "effectgate_audit" not in names and version == "4"


def _as_version_5(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("ALTER TABLE effectgate_effects DROP COLUMN vendor_ref"))
            conn.execute(text("UPDATE effectgate_meta SET value = '5' "
                              "WHERE name = 'schema_version'"))
    finally:
        engine.dispose()


def test_version_5_store_gains_vendor_refs_and_keeps_every_row(own_store_url: str) -> None:
    """From version 5, on both backends: every row is kept, an effect held across the
    migration is still its holder's, and its heartbeat then records what the vendor calls
    it."""
    gate = eg.Gate(own_store_url)
    d = gate.begin(effect_type="x", key="k:1", payload={})
    gate.report(d, "committed", result=7)
    held = gate.begin(effect_type="x", key="k:2", payload={})
    gate.close()
    _as_version_5(own_store_url)
    before = _tables(own_store_url)
    gate = eg.Gate(own_store_url, memo_size=0)
    try:
        assert gate.store.meta["schema_version"] == str(SCHEMA_VERSION) == "6"
        after = _tables(own_store_url)
        assert {t: len(rows) for t, rows in after.items()} == {
            t: len(rows) for t, rows in before.items()}
        assert gate.begin(effect_type="x", key="k:1", payload={}).result == 7
        assert gate.get("k:2").vendor_ref is None
        gate.extend_lease(held, 30, vendor_ref="task-1")
        assert gate.get("k:2").vendor_ref == "task-1"
        with pytest.raises(eg.ConfigError, match="vendor_ref"):
            gate.extend_lease(held, 30, vendor_ref="\x00")
        assert gate.get("k:2").vendor_ref == "task-1"
    finally:
        gate.close()


def test_version_5_store_of_an_unknown_shape_is_refused_unchanged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'odd5.db'}"
    eg.Gate(url).close()
    _as_version_5(url)
    conn = sqlite3.connect(tmp_path / "odd5.db")
    conn.execute("ALTER TABLE effectgate_effects ADD COLUMN surprise TEXT")
    conn.commit()
    conn.close()
    before = _tables(url)
    with pytest.raises(eg.ConfigError, match="unexpected: surprise"):
        eg.Gate(url)
    assert _tables(url) == before


def _set_version(url: str, version: int) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("UPDATE effectgate_meta SET value = :v "
                              "WHERE name = 'schema_version'"), {"v": str(version)})
    finally:
        engine.dispose()


def _tables(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every effectgate table, with the columns each has."""
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            names = sorted(n for n in inspect(conn).get_table_names()
                           if n.startswith("effectgate_"))
            return {n: sorted(map(tuple, conn.execute(text(f"SELECT * FROM {n}"))))
                    for n in names}
    finally:
        engine.dispose()


def test_a_store_of_a_newer_schema_is_refused_at_open(own_store_url: str) -> None:
    """A newer effectgate migrated the store: this one refuses it — read-write and read-only
    alike — with a StoreError naming both versions, and writes nothing."""
    eg.Gate(own_store_url, namespace="n").close()
    _set_version(own_store_url, SCHEMA_VERSION + 1)
    before = _tables(own_store_url)
    for read_only in (False, True):
        with pytest.raises(eg.StoreError) as info:
            eg.Gate(own_store_url, namespace="n", read_only=read_only,
                    policy={"effects": {"x": {"approval": "always"}}})
        message = info.value.message
        assert f"schema version {SCHEMA_VERSION + 1}" in message, message
        assert f"version {SCHEMA_VERSION}:" in message and "upgrade effectgate" in message
    assert _tables(own_store_url) == before


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_a_store_migrated_under_an_open_gate_refuses_its_writes(
        own_store_url: str, caller: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate opened before a newer effectgate migrated the store writes nothing more: the
    schema version is read again on the connection that writes (every write here: the
    recheck interval set to 0); begin and report refuse with a StoreError naming both
    versions, reads still answer, and once the version is this one again writes go on."""
    import asyncio

    from effectgate.store import version

    monkeypatch.setattr(version, "RECHECK_SECONDS", 0.0)
    gate = eg.Gate(own_store_url, namespace="n", policy=False)
    loop = asyncio.new_event_loop()

    def call(name: str, *args: Any, **kw: Any) -> Any:
        if caller == "sync":
            return getattr(gate, name)(*args, **kw)
        return loop.run_until_complete(getattr(gate, "a" + name)(*args, **kw))

    try:
        held = call("begin", effect_type="x", key="k:1", payload={})
        assert held.decision is eg.Decision.EXECUTE
        _set_version(own_store_url, SCHEMA_VERSION + 1)
        before = _tables(own_store_url)
        for write in (lambda: call("begin", effect_type="x", key="k:2", payload={}),
                      lambda: call("report", held, "committed", result={"ok": 1})):
            with pytest.raises(eg.StoreError, match=f"schema version {SCHEMA_VERSION + 1}, "
                               f"newer than this effectgate's version {SCHEMA_VERSION}"):
                write()
        assert _tables(own_store_url) == before
        assert gate.get("k:1").state is eg.State.IN_FLIGHT  # reads still answer
        _set_version(own_store_url, SCHEMA_VERSION)
        call("report", held, "committed", result={"ok": 1})
        assert gate.get("k:1").state is eg.State.COMMITTED
    finally:
        gate.close()
        if caller == "async" and hasattr(gate.store.async_face(), "close"):
            loop.run_until_complete(gate.store.async_face().close())  # type: ignore[union-attr]
        loop.close()


def test_a_connection_opened_after_the_migration_refuses_at_once(own_store_url: str) -> None:
    """Without any recheck interval: a thread that opens its own connection after the store
    was migrated reads the version before its first write, and refuses."""
    import threading

    gate = eg.Gate(own_store_url, namespace="n", policy=False)
    try:
        assert gate.begin(effect_type="x", key="k:1", payload={}).decision is (
            eg.Decision.EXECUTE)
        _set_version(own_store_url, SCHEMA_VERSION + 1)
        seen: list[BaseException] = []

        def other_thread() -> None:
            try:
                gate.begin(effect_type="x", key="k:2", payload={})
            except BaseException as err:
                seen.append(err)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert len(seen) == 1 and isinstance(seen[0], eg.StoreError), seen
        assert "newer than this effectgate" in str(seen[0])
        with pytest.raises(eg.UnknownEffect):
            gate.get("k:2")
    finally:
        gate.close()


def test_bad_urls_are_config_errors(tmp_path: Path) -> None:
    for url in ("sqlite://", "sqlite:///:memory:", "mysql://x/y", "not a url"):
        with pytest.raises(eg.ConfigError):
            eg.Gate(url)


def test_a_fresh_store_has_the_partial_group_index(store_url: str) -> None:
    """The saga index (namespace, group_key) WHERE group_key IS NOT NULL, on both backends,
    written as SQL rather than as dialect arguments."""
    from sqlalchemy import inspect

    gate = eg.Gate(store_url, namespace="schema-index")
    try:
        indexes = {ix["name"]: ix for ix in inspect(gate.store.engine).get_indexes(
            "effectgate_effects")}
        group = indexes["ix_effectgate_effects_group"]
        assert group["column_names"] == ["namespace", "group_key"]
        with gate.store.connection() as conn:
            if gate.store.is_sqlite:
                sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?",
                                   ("ix_effectgate_effects_group",)).fetchone()[0]
            else:
                sql = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s "
                                   "AND schemaname = current_schema()",
                                   ("ix_effectgate_effects_group",)).fetchone()[0]
        assert "group_key IS NOT NULL" in sql, sql
    finally:
        gate.close()


def test_opening_a_sqlite_store_imports_no_postgres_dialect(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys, effectgate as eg\n"
            f"eg.Gate('sqlite:///{tmp_path / 'x.db'}', namespace='n', policy=False).close()\n"
            "print(sorted(m for m in sys.modules if 'dialects.postgresql' in m))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "[]", out
