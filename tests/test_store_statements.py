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
from effectgate.store import Store, embedded
from effectgate.store.connections import make_engine
from effectgate.store.sql import NAMES, rendered_postgres
from effectgate.store.statements import (
    build,
    pg_texts_source,
    render_sqlite,
    sqlite_texts_source,
)

_TEXTS_FILE = Path(__file__).parent.parent / "core" / "store" / "sqlite_texts.py"
_PG_TEXTS_FILE = _TEXTS_FILE.with_name("pg_texts.py")
_WORKER = Path(__file__).with_name("first_begin_worker.py")


def _both() -> list[tuple[Any, str]]:
    return [(sqlite_dialect(paramstyle="named"), "sqlite"), (psycopg.dialect(), "postgresql")]


@pytest.mark.parametrize("durability", ["reserve", "relaxed"])
def test_every_statement_compiles_on_both_dialects(durability: str) -> None:
    """Each statement compiles (no literal bind slips in) for each dialect and durability."""
    for dialect, name in _both():
        sql = build(dialect, name, durability)
        sql.compile_all()
        assert set(NAMES) <= set(vars(sql))
        assert all(getattr(sql, n).text for n in NAMES)


def test_a_statement_is_compiled_when_first_used_and_kept() -> None:
    """A new set compiles nothing up front; the first read compiles, the next reuses it."""
    sql = build(psycopg.dialect(), "postgresql")
    assert not set(NAMES) & set(vars(sql))
    first = sql.fetch
    assert "fetch" in vars(sql) and sql.fetch is first
    assert "resolve" not in vars(sql)
    with pytest.raises(AttributeError):
        _ = sql.no_such_statement  # type: ignore[attr-defined]


def test_lazy_texts_are_the_eager_ones() -> None:
    """The relaxed and the default durability differ where they must (Postgres: the outcome
    rides on the next sync only at the default)."""
    pg = {d: build(psycopg.dialect(), "postgresql", d) for d in ("reserve", "relaxed")}
    assert "set_config" in pg["reserve"].report.text
    assert "set_config" not in pg["relaxed"].report.text
    assert pg["reserve"].fetch.text == pg["relaxed"].fetch.text


def test_the_rendered_sqlite_texts_are_sqlalchemys() -> None:
    """``store/sqlite_texts.py`` holds exactly what SQLAlchemy compiles now, for every
    statement and every table's columns, and SQLite's texts are the same at every
    durability (the file holds one set)."""
    expected = sqlite_texts_source()
    assert _TEXTS_FILE.read_text(encoding="utf-8") == expected, (
        "core/store/sqlite_texts.py is stale; write it again with: python -c \"from "
        "effectgate.store.statements import sqlite_texts_source as s; print(s(), end='')\" "
        "> core/store/sqlite_texts.py")
    from effectgate.store.sqlite_texts import COLUMNS, TEXTS

    assert render_sqlite() == TEXTS and set(TEXTS) == set(NAMES)
    dialect = sqlite_dialect(paramstyle="named")
    for durability in ("all", "relaxed"):
        other = build(dialect, "sqlite", durability)
        assert {n: getattr(other, n).text for n in NAMES} == TEXTS
    from effectgate.store.schema import metadata

    assert {t.name: frozenset(c.name for c in t.c) for t in metadata.sorted_tables} == COLUMNS


def test_the_rendered_postgres_texts_are_sqlalchemys() -> None:
    """``store/pg_texts.py`` holds exactly what SQLAlchemy compiles now for psycopg: every
    statement at every durability, and the two generated functions."""
    assert _PG_TEXTS_FILE.read_text(encoding="utf-8") == pg_texts_source(), (
        "core/store/pg_texts.py is stale; write it again with: python -c \"from "
        "effectgate.store.statements import pg_texts_source as s; print(s(), end='')\" "
        "> core/store/pg_texts.py")
    for durability in ("reserve", "all", "relaxed"):
        compiled = build(psycopg.dialect(), "postgresql", durability)
        rendered = rendered_postgres(durability)
        assert {n: getattr(rendered, n).text for n in NAMES} == {
            n: getattr(compiled, n).text for n in NAMES}
        assert (rendered.reserve_function, rendered.governed_function) == (
            compiled.reserve_function, compiled.governed_function)
    assert rendered_postgres("reserve").report.text != rendered_postgres("all").report.text
    rendered = rendered_postgres("reserve")
    for version in ((11, 0), (13, 2), (14, 0), (16, 1), (17, 0), (18, 0)):
        dialect = psycopg.dialect()
        dialect.server_version_info = version  # a server met, of each supported version
        compiled = build(dialect, "postgresql")
        assert {n: getattr(rendered, n).text for n in NAMES} == {
            n: getattr(compiled, n).text for n in NAMES}, version
        assert rendered.reserve_function == compiled.reserve_function, version


def test_the_rendered_postgres_texts_are_what_the_server_s_dialect_compiles() -> None:
    """Compiled by a dialect that has met the server (its version known), every text and
    function is the rendered one: what the store ran before it stopped compiling."""
    from .conftest import PG_URL, require_postgres

    require_postgres()
    engine = make_engine(PG_URL)
    try:
        with engine.connect():
            pass
        assert engine.dialect.server_version_info is not None
        for durability in ("reserve", "relaxed"):
            compiled = build(engine.dialect, "postgresql", durability)
            rendered = rendered_postgres(durability)
            assert {n: getattr(rendered, n).text for n in NAMES} == {
                n: getattr(compiled, n).text for n in NAMES}
            assert rendered.reserve_function == compiled.reserve_function
            assert rendered.governed_function == compiled.governed_function
    finally:
        engine.dispose()


@pytest.mark.parametrize("url", [
    "sqlite:///effects.db", "sqlite:////tmp/a/b.db", "sqlite+pysqlite:///x.db",
    "sqlite:///a b/c.db", "sqlite:///a@b.db", "sqlite:///./x:y.db", "sqlite:///:memory:",
    "sqlite:///a.db?mode=ro", "sqlite:///a%20b.db", "sqlite://", "sqlite:///", "sqlite:/x.db",
    "sqlite+aiosqlite:///x.db", "SQLITE:///x.db", "sqlite:///x.db#frag", "postgresql:///x",
    "sqlite://user:pw@host/x.db", "sqlite:///x.db\n", "sqlite:///\u2028.db",
])
def test_a_plain_sqlite_url_names_the_file_sqlalchemy_would_open(url: str) -> None:
    """The URLs the embedded store opens itself are read exactly as SQLAlchemy reads them;
    every other form is left to SQLAlchemy (None)."""
    from sqlalchemy.engine import make_url

    database = embedded.database_of(url)
    if database is None:
        return
    parsed = make_url(url)
    assert (parsed.get_backend_name(), parsed.get_driver_name()) == ("sqlite", "pysqlite")
    assert parsed.database == database and not parsed.query
    assert parsed.username is None and parsed.password is None and parsed.host is None


def test_the_plain_urls_are_the_common_ones() -> None:
    """Not vacuous: the default store and absolute and relative paths take the embedded way."""
    from effectgate.store import DEFAULT_URL

    assert embedded.database_of(DEFAULT_URL) == ".effectgate/effects.db"
    assert embedded.database_of("sqlite:////tmp/x.db") == "/tmp/x.db"
    assert embedded.database_of("sqlite:///a.db?mode=ro") is None


@pytest.mark.parametrize("read_only", [False, True])
def test_an_embedded_connection_is_set_up_as_the_engines(tmp_path: Path,
                                                         read_only: bool) -> None:
    """A connection the store opens itself has the settings the engine's pooled ones get."""
    url = f"sqlite:///{tmp_path / 'pragmas.db'}"
    Store(url).close()
    store = Store(url, read_only=read_only)
    try:
        with store.connection() as own:
            mine = [own.execute(f"PRAGMA {p}").fetchone()[0] for p in
                    ("busy_timeout", "journal_mode", "synchronous", "query_only")]
            assert own.isolation_level is None  # autocommit
        with store.engine.connect() as pooled:
            theirs = [pooled.exec_driver_sql(f"PRAGMA {p}").scalar() for p in
                      ("busy_timeout", "journal_mode", "synchronous", "query_only")]
        assert mine == theirs == [60000, "wal", 2, int(read_only)]
    finally:
        store.close()




def test_a_worker_on_an_existing_sqlite_store_imports_no_sqlalchemy_asyncio_or_otel(
        tmp_path: Path) -> None:
    """A worker's way to its first begin on an up-to-date embedded store: no SQLAlchemy (the
    statements come rendered, the connection from sqlite3), no asyncio, and no OpenTelemetry
    while the application has imported none (it is installed here). A store that must
    first be created goes through SQLAlchemy (the control: the check can see it)."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'worker.db'}"

    def run(namespace: str) -> str:
        return subprocess.run([sys.executable, str(_WORKER), url, namespace], check=True,
                              capture_output=True, text=True).stdout.strip()

    assert "'sqlalchemy'" in run("first")  # created here (SQLAlchemy imports asyncio too)
    assert run("second") == "[]"


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
    monkeypatch.setattr(request_module, "short_sha256", counting.sha256)  # a short secret's
    d = gate.begin(effect_type="t.hash", key="hash:1", payload={"n": 1})
    assert d.decision is eg.Decision.EXECUTE
    gate.extend_lease(d, seconds=30)
    gate.report(d, outcome="committed", result={"ok": True})
    assert counting.calls == 1
    record = gate.get("hash:1")
    assert record is not None and record.state is eg.State.COMMITTED


def test_the_remembered_hashes_are_the_latest_and_bounded() -> None:
    """Past a thousand begins the latest 512 secrets still resolve from memory, the memory
    stays within 1,024, and a forgotten secret is hashed again, to the same value."""
    issued = [request_module._issue()[0] for _ in range(2_500)]
    remembered = request_module._ISSUED
    assert all(remembered.get(s) is not None for s in issued[-512:])
    assert len(remembered.newer) + len(remembered.older) <= 1_024
    oldest = issued[0]
    assert remembered.get(oldest) is None
    assert request_module.secret_hash(oldest) == hashlib.sha256(oldest.encode()).hexdigest()
    assert request_module.secret_hash(issued[-1]) == hashlib.sha256(
        issued[-1].encode()).hexdigest()


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


def test_a_hostile_plain_sqlite_url_is_a_typed_error_and_writes_nothing(tmp_path: Path) -> None:
    """The embedded way meets a caller's URL before SQLAlchemy does: a NUL in the path, or a
    read-only open of a file that is not there, is a typed error, and no file or folder is
    made."""
    for url, read_only in ((f"sqlite:///{tmp_path}/a\x00b.db", False),
                           (f"sqlite:///{tmp_path}/sub/missing.db", True)):
        with pytest.raises(eg.StoreError):
            Store(url, read_only=read_only)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_bare_reservation_writes_the_row_the_full_insert_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite reserves a request with none of the optional fields by the bare insert (only
    the columns it sets): column for column the row the full insert writes for it, the
    omitted columns NULL. A request with any optional field takes the full insert."""
    import sqlite3

    from effectgate.request import LeaseSecret
    from effectgate.store.binds import BARE_OMITS, is_bare

    gate = eg.Gate(f"sqlite:///{tmp_path}/bare.db", namespace="n", policy=False)
    store = gate.store
    texts: list[str] = []
    real = store._conns.run

    def spy(sql: Any, binds: Any, sync: str | None = None, *, count: bool = False) -> Any:
        texts.append(sql.text)
        return real(sql, binds, sync, count=count)  # type: ignore[call-overload]

    monkeypatch.setattr(store._conns, "run", spy)
    bare = gate.request(effect_type="t.bare", key="k:bare", payload={"a": 1})
    assert is_bare(bare)
    assert gate.begin(bare).decision is eg.Decision.EXECUTE
    assert store.sql.insert_bare.text in texts and store.sql.insert_lean.text not in texts
    texts.clear()
    monkeypatch.setattr("effectgate.store.is_bare", lambda req: False)  # the full insert
    assert store.reserve(bare._replace(key="k:full"), LeaseSecret()).inserted
    assert store.sql.insert_lean.text in texts and store.sql.insert_bare.text not in texts
    monkeypatch.setattr("effectgate.store.is_bare", is_bare)
    conn = sqlite3.connect(tmp_path / "bare.db")
    conn.row_factory = sqlite3.Row
    rows = {r["key"]: dict(r) for r in conn.execute(
        "SELECT * FROM effectgate_effects WHERE key IN ('k:bare', 'k:full')")}
    conn.close()
    varying = {"id", "key", "lease_expires_at", "attempt_started_at", "created_at",
               "updated_at", "vendor_since", "lease_secret", "history"}
    assert {k: v for k, v in rows["k:bare"].items() if k not in varying} == {
        k: v for k, v in rows["k:full"].items() if k not in varying}
    assert all(rows["k:bare"][c] is None for c in BARE_OMITS)
    for row in rows.values():  # the history line: one arrival in flight, by nobody
        fields = row["history"].split("\t")
        assert fields[1:2] + fields[3:] == ["in_flight", "1", "null", "null\n"]
        assert row["vendor_since"] == row["created_at"] == row["attempt_started_at"]
    texts.clear()
    gate.begin(effect_type="t.bare", key="k:agent", payload={"a": 1}, agent_id="bot")
    assert store.sql.insert_lean.text in texts and store.sql.insert_bare.text not in texts
    gate.close()


def test_a_read_by_filter_compiles_its_statement_once_per_shape(make_gate: Any) -> None:
    """``list_effects`` builds no SQLAlchemy statement per call: one per shape of filter,
    kept; the values go in as binds (a glob's ``%`` and ``_`` stay literal)."""
    from effectgate.store import listing

    gate: eg.Gate = make_gate(policy=False)
    for key in ("ls:a_1", "ls:a%2", "ls:ab3"):
        d = gate.begin(effect_type="t.ls", key=key, payload={"k": key})
        gate.report(d, "committed")
    first = [r.key for r in gate.list_effects(key_prefix="ls:a_", limit=None)]
    kept = dict(listing._KEPT)
    again = [r.key for r in gate.list_effects(key_prefix="ls:a%", limit=None)]
    assert first == ["ls:a_1"] and again == ["ls:a%2"]
    assert kept == listing._KEPT  # the same shape: the kept statement, nothing compiled
    assert [r.key for r in gate.list_effects(key_prefix="ls:a", limit=2)] == [
        "ls:ab3", "ls:a%2"]
    limited = listing.Filters(key_prefix="ls:a", limit=2).shape()
    assert limited != listing.Filters(key_prefix="ls:a").shape()  # a limit: another shape
    assert limited in {key[-1] for key in listing._KEPT}


def test_the_read_by_key_hands_up_the_head_of_the_whole_row(make_gate: Any) -> None:
    """The read by key does not select the namespace and key back: the head it hands up (sync
    and through the async face) is still, field for field, the head of the whole row."""
    import asyncio

    from effectgate.flow import done_head

    gate = make_gate(policy=False)
    store = gate.store
    held = gate.begin(effect_type="t.read", key="read:held", payload={"a": 1}, vendor="stripe")
    done = gate.begin(effect_type="t.read", key="read:done", payload={"a": 2})
    gate.report(done, "committed", result={"ok": [1, "two"]})
    failed = gate.begin(effect_type="t.read", key="read:failed", payload={"a": 3})
    gate.report(failed, "failed", error="no")
    for d in (held, done, failed):
        whole = done_head(store.get(gate.namespace, d.key))
        for head in (store.fetch(gate.namespace, d.key),
                     asyncio.run(store.async_face().fetch(gate.namespace, d.key))):
            assert head is not None
            assert head._replace(now=0.0) == whole._replace(now=0.0), d.key
            assert head.namespace == gate.namespace and head.key == d.key
    assert store.fetch(gate.namespace, "read:absent") is None


def test_a_reservation_hands_up_the_head_it_wrote(store_url: str, namespace: str) -> None:
    """The head a new key's reservation hands up (SQLite builds it from the request and what
    the insert returned) is the head read back: field for field, but for ``inserted`` and
    the clock. Bare and with every optional field."""
    from effectgate.request import LeaseSecret

    gate = eg.Gate(store_url, namespace=namespace, policy=False)
    try:
        store = gate.store
        plain = gate.request(effect_type="t.head", key="k:plain", payload={"a": 1})
        full = gate.request(effect_type="t.head", key="k:full", payload={"a": 2},
                            run_id="run-1", agent_id="bot", group_key="g:1",
                            compensation={"undo": 1}, estimated_cost_micros=5,
                            vendor="stripe")
        for req in (plain, full):
            wrote = store.reserve(req, LeaseSecret())
            read = store.fetch(namespace, req.key)
            assert wrote.inserted and read is not None and not read.inserted
            assert wrote._replace(inserted=False, now=read.now) == read
    finally:
        gate.close()


def test_a_reservations_first_read_hands_up_a_committed_effect_as_a_repeat_reads_it(
        make_gate: Any) -> None:
    """A reservation's first read (SQLite's, before it inserts) reads a COMMITTED effect
    narrowly: a ``CommittedHead`` whose every field is the whole row's, and whose vendor key
    is the one the whole row gives; any other state comes back as the head of the whole row,
    and an absent key as None."""
    from effectgate.flow import done_head
    from effectgate.store.rows import CommittedHead
    from effectgate.translate import vendor_key_of

    gate = make_gate(policy=False)
    store = gate.store
    done = gate.begin(effect_type="t.first", key="first:done", payload={"a": 1})
    gate.report(done, "committed", result={"ok": [1, "two"]})
    paid = gate.begin(effect_type="t.first", key="first:paid", payload={"a": 2},
                      vendor="stripe")
    gate.report(paid, "committed", result=None)
    held = gate.begin(effect_type="t.first", key="first:held", payload={"a": 3})
    failed = gate.begin(effect_type="t.first", key="first:failed", payload={"a": 4})
    gate.report(failed, "failed", error="no")
    for d in (done, paid):
        whole = store.get(gate.namespace, d.key)
        assert whole is not None
        read = store.first_read(gate.namespace, d.key)
        assert isinstance(read, CommittedHead) and read.state is eg.State.COMMITTED
        assert not read.inserted
        assert read[:9] == (whole.id, whole.namespace, whole.key, whole.effect_type,
                            whole.payload_hash, whole.attempt, whole.token, whole.result,
                            whole.pruned_at)
        key = vendor_key_of(done_head(whole), store.secret)
        if key is None:
            assert read.vendor is read.vendor_attempt is read.vendor_age is None
        else:
            assert (read.vendor, read.vendor_attempt) == ("stripe", 1)
            assert read.vendor_age is not None and 0 <= read.vendor_age < 60
            cold = make_gate(policy=False, memo_size=0)  # not from this gate's memo
            again = cold.begin(effect_type="t.first", key="first:paid", payload={"a": 2},
                               vendor="stripe")
            assert again.decision is eg.Decision.DUPLICATE
            assert again.vendor_key is not None and again.vendor_key.value == key.value
            assert again.vendor_key.covered is True
    for d in (held, failed):
        whole_head = done_head(store.get(gate.namespace, d.key))
        read = store.first_read(gate.namespace, d.key)
        assert not isinstance(read, CommittedHead) and read is not None
        assert read._replace(now=0.0) == whole_head._replace(now=0.0)
    assert store.first_read(gate.namespace, "first:absent") is None


def test_a_first_read_the_database_refuses_is_a_store_error_and_the_next_one_reads(
        tmp_path: Path) -> None:
    """The first read takes one row (no list), through the same error handling as every
    statement: a driver's refusal is a typed :class:`StoreError` that names the key and
    writes nothing, and once the table is back the next begin reads it as before."""
    import sqlite3

    gate = eg.Gate(f"sqlite:///{tmp_path}/first.db", namespace="n", policy=False)
    try:
        d = gate.begin(effect_type="t.first", key="first:1", payload={"a": 1})
        gate.report(d, eg.Outcome.COMMITTED, result={"ok": True})
        cold = eg.Gate(gate.url, namespace="n", policy=False, memo_size=0)
        raw = sqlite3.connect(tmp_path / "first.db", isolation_level=None)
        rows = raw.execute("SELECT * FROM effectgate_effects").fetchall()
        raw.execute("ALTER TABLE effectgate_effects RENAME TO effectgate_away")
        with pytest.raises(eg.StoreError) as err:
            cold.begin(effect_type="t.first", key="first:1", payload={"a": 1})
        assert not isinstance(err.value, eg.PayloadMismatch)
        raw.execute("ALTER TABLE effectgate_away RENAME TO effectgate_effects")
        assert raw.execute("SELECT * FROM effectgate_effects").fetchall() == rows  # unchanged
        raw.close()
        again = cold.begin(effect_type="t.first", key="first:1", payload={"a": 1})
        assert again.decision is eg.Decision.DUPLICATE and again.result == {"ok": True}
        cold.close()
    finally:
        gate.close()


def test_sqlite_binds_by_position_what_sqlalchemy_names() -> None:
    """SQLite's rendered texts run with numbered placeholders (``?1``: one number per name,
    however often it occurs; nothing inside a string literal taken for one), bound by
    position; the statements a caller binds by position name their binds in that order."""
    from effectgate.store import binds
    from effectgate.store.sql import numbered, rendered

    sql = numbered("SELECT ':no', 'it''s :not' FROM t WHERE a = :a AND b = :b OR c = :a")
    assert sql.text == "SELECT ':no', 'it''s :not' FROM t WHERE a = ?1 AND b = ?2 OR c = ?1"
    assert sql.names == ("a", "b") and sql.order is not None
    assert sql.order({"b": 2, "a": 1, "z": 0}) == (1, 2)
    statements = rendered()
    # The orders the per-call binds are built in (store/binds.py and Store.first_read).
    assert statements.fetch_brief.names == ("namespace", "key")
    assert statements.insert_bare.names == binds.BARE_NAMES
    assert statements.report_committed.names == binds.COMMITTED_NAMES
    for name in NAMES:
        text = getattr(statements, name).text
        assert ":" not in text.replace("':'", ""), name  # every name became a number


async def test_postgres_reserves_a_bare_request_by_its_bare_function(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Postgres reserves a request with none of the optional fields by the generated bare
    function (six binds by position), from a sync and from an async caller: column for
    column the row the full function writes for it; a repeat is refused from it unchanged. A
    request with any optional field takes the full function."""
    import uuid

    import psycopg as pg

    from effectgate.request import LeaseSecret
    from effectgate.store.binds import BARE_OMITS, is_bare

    from .conftest import PG_URL, TEST_PREFIX, require_postgres

    require_postgres()
    gate = eg.Gate(PG_URL, namespace=f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}", policy=False)
    store = gate.store
    texts: list[str] = []
    real, areal = store._conns.run, store.async_face().run  # type: ignore[union-attr]

    def spy(sql: Any, binds: Any, sync: str | None = None, *, count: bool = False) -> Any:
        texts.append(sql.text)
        return real(sql, binds, sync, count=count)  # type: ignore[call-overload]

    async def aspy(sql: Any, binds: Any, **options: Any) -> Any:
        texts.append(sql.text)
        return await areal(sql, binds, **options)

    monkeypatch.setattr(store._conns, "run", spy)
    monkeypatch.setattr(store.async_face(), "run", aspy)
    try:
        bare = gate.request(effect_type="t.bare", key="k:bare", payload={"a": 1})
        assert is_bare(bare)
        assert gate.begin(bare).decision is eg.Decision.EXECUTE
        assert texts == [store.sql.reserve_bare.text]
        texts.clear()
        assert (await gate.abegin(bare._replace(key="k:abare"))).decision is eg.Decision.EXECUTE
        assert texts == [store.sql.reserve_bare.text]
        texts.clear()
        again = gate.begin(bare)  # the repeat: read, nothing written
        assert again.decision is eg.Decision.IN_FLIGHT
        assert texts == [store.sql.reserve_bare.text]
        monkeypatch.setattr("effectgate.store.is_bare", lambda req: False)  # the full one
        assert store.reserve(bare._replace(key="k:full"), LeaseSecret()).inserted
        assert texts[-1] == store.sql.reserve.text
        monkeypatch.setattr("effectgate.store.is_bare", is_bare)
        texts.clear()
        gate.begin(effect_type="t.bare", key="k:agent", payload={"a": 1}, agent_id="bot")
        assert texts == [store.sql.reserve.text]
        with pg.connect(PG_URL.replace("+psycopg", ""), autocommit=True) as conn:
            cur = conn.execute("SELECT * FROM effectgate_effects WHERE namespace = %s "
                               "AND key IN ('k:bare', 'k:abare', 'k:full')", (gate.namespace,))
            names = [c.name for c in cur.description or ()]
            rows = {r[names.index("key")]: dict(zip(names, r, strict=True)) for r in cur}
    finally:
        gate.close()
    varying = {"id", "key", "lease_expires_at", "attempt_started_at", "created_at",
               "updated_at", "vendor_since", "lease_secret", "history"}
    assert {k: v for k, v in rows["k:bare"].items() if k not in varying} == {
        k: v for k, v in rows["k:full"].items() if k not in varying} == {
        k: v for k, v in rows["k:abare"].items() if k not in varying}
    assert all(rows["k:bare"][c] is None for c in BARE_OMITS)
    for row in rows.values():  # the history line: one arrival in flight, by nobody
        fields = row["history"].split("\t")
        assert fields[1:2] + fields[3:] == ["in_flight", "1", "null", "null\n"]
        assert row["vendor_since"] == row["created_at"] == row["attempt_started_at"]
