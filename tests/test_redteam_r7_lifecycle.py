"""Red team, round 7: the store's lifecycle — schema versions and the meta rows, listings by
prefix and glob, hand-written rows, the sweeper's arguments. Each test names what it caught;
every store here is a real SQLite file or a real Postgres schema of its own."""

from __future__ import annotations

import datetime
import hashlib
import logging
from typing import Any

import pytest

import effectgate as eg
from effectgate.store.queue import approvals_page
from effectgate.store.version import policy_meta_name
from effectgate.sweep import Sweeper

from .conftest import snapshot
from .test_schema import _tables


def _sql(url: str, *statements: str, **binds: Any) -> None:
    """Run ``statements`` on ``url`` in autocommit, as a person at a SQL prompt would."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(text(statement), binds)
    finally:
        engine.dispose()


def _committed(url: str, key: str = "k:1") -> None:
    gate = eg.Gate(url, namespace="n", policy=False)
    try:
        d = gate.begin(effect_type="x", key=key, payload={})
        gate.report(d, "committed", result={"ok": 1})
    finally:
        gate.close()


# -- schema versions and meta rows ------------------------------------------------------------


@pytest.mark.parametrize("version", ["-1", "0"])
def test_a_schema_version_below_one_is_refused_unchanged(own_store_url: str,
                                                         version: str) -> None:
    """A store whose version row says -1 (or 0) on a version-5 shape was 'migrated' from
    the last migration backwards (MIGRATIONS[-1]) until an assertion stopped it; it is a
    ConfigError naming the value, read-write and read-only, and the store is unchanged."""
    _committed(own_store_url)
    _sql(own_store_url, "ALTER TABLE effectgate_effects DROP COLUMN vendor_ref",
         "UPDATE effectgate_meta SET value = :v WHERE name = 'schema_version'", v=version)
    before = _tables(own_store_url)
    for read_only in (False, True):
        with pytest.raises(eg.ConfigError, match=f"schema version '{version}' is not a "
                           "version"):
            eg.Gate(own_store_url, namespace="n", policy=False, read_only=read_only)
    assert _tables(own_store_url) == before


def test_a_store_without_its_vendor_secret_is_refused_unchanged(own_store_url: str) -> None:
    """A store whose vendor_secret row is gone failed at open with a bare KeyError. It is a
    ConfigError that says why the secret is not made anew (a new one would give an effect's
    next attempt another vendor key than its earlier holder may still send), read-write and
    read-only, and the store is unchanged."""
    _committed(own_store_url)
    _sql(own_store_url, "DELETE FROM effectgate_meta WHERE name = 'vendor_secret'")
    before = _tables(own_store_url)
    for read_only in (False, True):
        with pytest.raises(eg.ConfigError, match="vendor_secret is missing"):
            eg.Gate(own_store_url, namespace="n", policy=False, read_only=read_only)
    assert _tables(own_store_url) == before


def test_a_bad_vendor_secret_is_refused_where_the_schema_is_read(tmp_path: Any) -> None:
    """A vendor_secret that is not hex failed with a bare ValueError; a store opened through
    the schema module (a URL with options) refuses it with a ConfigError, unchanged."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _committed(url)
    _sql(url, "UPDATE effectgate_meta SET value = 'not hex' WHERE name = 'vendor_secret'")
    before = _tables(url)
    with pytest.raises(eg.ConfigError, match="not 32 or more hex digits"):
        eg.Gate(url + "?timeout=5", namespace="n", policy=False)
    assert _tables(url) == before


def test_a_namespace_cannot_take_over_another_namespaces_policy_record(
        own_store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A long or non-ASCII namespace records its policy under ``policy:#<digest>``; a
    namespace named ``#<digest>`` wrote the same row, so it could overwrite the other's
    record (a drift then warned about falsely, or a real drift hidden). Each keeps its own."""
    victim = "prod-zoné"
    squatter = "#" + hashlib.sha256(victim.encode()).hexdigest()[:48]
    assert policy_meta_name(victim) != policy_meta_name(squatter)
    mine = {"effects": {"x": {"approval": "always"}}}
    theirs = {"effects": {"y": {"approval": "always"}}}
    eg.Gate(own_store_url, namespace=victim, policy=mine).close()
    eg.Gate(own_store_url, namespace=squatter, policy=theirs).close()
    with caplog.at_level(logging.WARNING, logger="effectgate"):
        eg.Gate(own_store_url, namespace=victim, policy=mine).close()
    assert not [r for r in caplog.records if "differs" in r.getMessage()]


@pytest.mark.parametrize("tampered", ["abc", "-1", None])
def test_a_version_row_tampered_under_an_open_gate_stops_its_writes_not_its_reads(
        own_store_url: str, tampered: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The version row changed to no version (text, -1, or deleted) under open gates. A
    thread's new connection raised a ConfigError for every read and write ('abc'), or took
    it for an older store and wrote on (deleted, -1). Reads go on; writes are refused with a
    ConfigError and change nothing; once the row says this version again, writes go on."""
    import threading

    from effectgate.store import version

    monkeypatch.setattr(version, "RECHECK_SECONDS", 0.0)
    gate = eg.Gate(own_store_url, namespace="n", policy=False)
    try:
        held = gate.begin(effect_type="x", key="k:1", payload={})
        if tampered is None:
            _sql(own_store_url, "DELETE FROM effectgate_meta WHERE name = 'schema_version'")
        else:
            _sql(own_store_url, "UPDATE effectgate_meta SET value = :v "
                 "WHERE name = 'schema_version'", v=tampered)
        before = _tables(own_store_url)
        seen: list[object] = []

        def other_thread() -> None:  # a connection of its own, opened after the change
            seen.append(gate.get("k:1").state)
            for write in (lambda: gate.begin(effect_type="x", key="k:2", payload={}),
                          lambda: gate.report(held, "committed", result=1)):
                try:
                    write()
                except eg.EffectGateError as err:
                    seen.append(err)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert seen[0] is eg.State.IN_FLIGHT and len(seen) == 3, seen
        assert all(isinstance(e, eg.ConfigError) for e in seen[1:]), seen
        assert _tables(own_store_url) == before
        _sql(own_store_url, "DELETE FROM effectgate_meta WHERE name = 'schema_version'",
             "INSERT INTO effectgate_meta (name, value) VALUES ('schema_version', :v)",
             v=str(version.SCHEMA_VERSION))
        gate.report(held, "committed", result=1)
        assert gate.get("k:1").state is eg.State.COMMITTED
    finally:
        gate.close()


# -- listings ---------------------------------------------------------------------------------


def test_a_key_prefix_and_a_type_glob_tell_upper_from_lower_case(gate: eg.Gate) -> None:
    """Keys and effect types are exact names, but SQLite's LIKE is blind to ASCII case: the
    prefix ``refund:`` listed ``REFUND:2`` too, and the glob ``pay.*`` the ``PAY.refund``
    effects. Both backends now list the same, exact matches; ``%``, ``_``, ``[`` (and in a
    prefix ``*`` and ``?``) stay literal."""
    for key, effect_type in (("refund:1", "pay.refund"), ("REFUND:2", "PAY.refund"),
                             ("Refund:3", "pay.refund"), ("a_b", "t[1]"), ("axb", "t1"),
                             ("a%b", "t[1]"), ("a*[?]", "t*"), ("a?[*]", "t?")):
        d = gate.begin(effect_type=effect_type, key=key, payload={})
        gate.report(d, "committed", result=None)

    def keys(**filters: Any) -> set[str]:
        return {r.key for r in gate.list_effects(**filters)}

    before = snapshot(gate)
    assert keys(key_prefix="refund:") == {"refund:1"}
    assert keys(key_prefix="REFUND") == {"REFUND:2"}
    assert keys(key_prefix="a_") == {"a_b"}
    assert keys(key_prefix="a%") == {"a%b"}
    assert keys(key_prefix="a*[") == {"a*[?]"}
    assert keys(key_prefix="a?[*") == {"a?[*]"}
    assert keys(effect_type="pay.*") == {"refund:1", "Refund:3"}
    assert keys(effect_type="PAY.refun?") == {"REFUND:2"}
    assert keys(effect_type="t[1]") == {"a_b", "a%b"}
    assert keys(effect_type="t?") == {"axb", "a*[?]", "a?[*]"}
    assert snapshot(gate) == before


def test_a_time_no_date_can_show_is_a_store_error(gate: eg.Gate) -> None:
    """A hand-written row whose times are out of any date's range (1e300, the year 33658)
    made ``get`` and ``list_effects`` fail with a bare OverflowError or ValueError; both
    now raise a StoreError naming the value, and nothing is written."""
    d = gate.begin(effect_type="x", key="k:1", payload={})
    gate.report(d, "committed", result=1)
    for value in (1e300, -1e300, 1e12):
        _sql(gate.store.url, "UPDATE effectgate_effects SET updated_at = :v "
             "WHERE namespace = :ns", v=value, ns=gate.namespace)
        before = snapshot(gate)
        for read in (lambda: gate.get("k:1"), gate.list_effects):
            with pytest.raises(eg.StoreError, match="as a time, which is no date"):
                read()
        assert snapshot(gate) == before


# -- the sweeper ------------------------------------------------------------------------------


@pytest.mark.parametrize("arguments", [{"limit": 0}, {"limit": "500"}, {"limit": True},
                                       {"notify": "https://example.invalid/hook"}])
def test_a_sweeper_refuses_bad_arguments_when_made(tmp_path: Any,
                                                   arguments: dict[str, Any]) -> None:
    """A Sweeper made with a limit sweep_lapsed refuses (or a notify that is not callable)
    started, then only logged its refusal at every tick: no lapse was ever announced. It is
    a ConfigError when it is made."""
    gate = eg.Gate(f"sqlite:///{tmp_path / 'e.db'}", policy=False)
    try:
        options: dict[str, Any] = {"notify": lambda notice: None, **arguments}
        with pytest.raises(eg.ConfigError):
            Sweeper(gate, **options)
    finally:
        gate.close()


@pytest.mark.parametrize("column", ["result", "compensation"])
def test_a_stored_value_that_is_not_json_is_a_payload_error(gate: eg.Gate, column: str) -> None:
    """``translate.loads`` let a ``JSONDecodeError`` out of ``get`` and ``list_effects`` (one
    bad row broke the whole list) for a row effectgate did not write: a typed
    :class:`~effectgate.PayloadError` now, nothing changed."""
    d = gate.begin(effect_type="x", key="k:1", payload={}, group_key="g", compensation={"u": 1})
    gate.report(d, "committed", result={"a": 1})
    _sql(gate.store.url, f"UPDATE effectgate_effects SET {column} = '{{not json' "
         "WHERE namespace = :ns", ns=gate.namespace)
    before = snapshot(gate)
    for read in (lambda: gate.get("k:1"), gate.list_effects):
        with pytest.raises(eg.PayloadError, match="not JSON"):
            read()
    assert snapshot(gate) == before


def test_a_bad_vendor_secret_is_refused_on_every_url(tmp_path: Any) -> None:
    """The plain-URL fast path opened a store whose vendor secret is not hex with a bare
    ``ValueError``, and one whose secret is empty silently (every vendor key then made
    without a secret)."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _committed(url)
    for bad in ("not hex", ""):
        _sql(url, "UPDATE effectgate_meta SET value = :v WHERE name = 'vendor_secret'", v=bad)
        before = _tables(url)
        with pytest.raises(eg.ConfigError, match="vendor_secret"):
            eg.Gate(url, namespace="n", policy=False)
        assert _tables(url) == before


def test_prune_takes_a_timedeltas_own_seconds(make_gate: Any) -> None:
    """A ``timedelta`` subclass whose ``total_seconds`` says NaN passed the check; on Postgres
    ``updated_at <= now - NaN`` is true for every row, so ``prune(older_than=30 days)``
    pruned an effect committed a moment ago."""
    gate = make_gate(policy=False)
    d = gate.begin(effect_type="x", key="k:1", payload={})
    gate.report(d, "committed", result=1)

    class Odd(datetime.timedelta):
        def total_seconds(self) -> float:
            return float("nan")

    assert gate.prune(older_than=Odd(days=30)) == 0
    assert gate.get("k:1").result == 1


def test_the_approvals_page_tells_upper_from_lower_case(make_gate: Any) -> None:
    """The console's approvals page had the same case-blind ``LIKE`` on SQLite as the
    listing: a search for ``refund:`` listed ``REFUND:2``'s request too."""
    gate = make_gate(policy={"effects": {"pay.*": {"approval": "always"}}})
    for key, effect_type in (("refund:1", "pay.refund"), ("REFUND:2", "pay.refund")):
        assert gate.begin(effect_type=effect_type, key=key, payload={}).approval_id
    page = approvals_page(gate.store.engine, gate.namespace, state=None, key_prefix="refund:")
    assert [a.key for a in page.rows] == ["refund:1"]
