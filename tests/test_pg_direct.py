"""Postgres opened without SQLAlchemy (``store/pg_direct.py``): a plain URL is the libpq URI
SQLAlchemy would connect with, a worker's way to its first begin on an up-to-date store does
not import SQLAlchemy, its connections are set up as the engine's are, and a store that is
not exactly at this version goes the SQLAlchemy way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate.store import Store, pg_direct
from effectgate.store.version import SCHEMA_VERSION

from .conftest import PG_URL, require_postgres


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "postgresql://postgres@127.0.0.1:5432/test",
    "postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3Dx",
    "postgresql://u:p%40ss%2Fw@h:5432/db?sslmode=disable&application_name=worker",
    "postgresql://u:p:w@h/db", "postgresql://u@[::1]:5433/db", "postgresql:///test",
    "postgresql://h", "postgresql://u:@h/db", "postgresql://h/db?host=/var/run/postgresql",
    "postgresql://u%41:pw@h/db", "postgresql://h:5432/db?port=5433",
    "postgresql://h/db?host=other", "postgresql://h/db?hostaddr=127.0.0.1",
    "postgresql://u@h/db?options=-c%20a%3Db&application_name=x%2By",
    # each of these is left to SQLAlchemy (None): it or libpq would read it differently
    "postgresql://u:p@ss@h/db", "postgresql://u:p/w@h/db", "postgresql://u:p+w@h/db",
    "postgresql://u:p%zzw@h/db", "postgresql://h/d%41", "postgresql://h/db?options=a+b",
    "postgresql://h/db?options=a=b", "postgresql://h/db?foo=1", "postgresql://h/db?sslmode",
    "postgresql://h/db?sslmode=a&sslmode=b", "postgresql://h/db#frag", "postgres://h/db",
    "postgresql+asyncpg://h/db", "postgresql+psycopg2://h/db", "POSTGRESQL://h/db",
    "postgresql://h1,h2/db", "postgresql://h/db\n", "postgresql://h/db?options=\u2028",
    "sqlite:///x.db", "",
])
def test_a_plain_postgres_url_is_the_conninfo_sqlalchemy_would_connect_with(url: str) -> None:
    """Where the store opens a URL itself, libpq reads the same connection parameters from
    it as SQLAlchemy's psycopg dialect hands psycopg, and the password is hidden in messages
    as SQLAlchemy hides it; every other form is left to SQLAlchemy (None)."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.dialects.postgresql import psycopg
    from sqlalchemy.engine import make_url

    conninfo = pg_direct.conninfo_of(url)
    if conninfo is None:
        return
    parsed = make_url(url)
    assert (parsed.get_backend_name(), parsed.get_driver_name()) == ("postgresql", "psycopg")
    cargs, cparams = psycopg.dialect().create_connect_args(parsed)  # type: ignore[no-untyped-call]
    theirs = conninfo_to_dict(cargs[0] if cargs else "", **cparams)
    mine = conninfo_to_dict(conninfo)
    assert {k: str(v) for k, v in mine.items()} == {k: str(v) for k, v in theirs.items()}
    shown = make_url(pg_direct.hidden(url) or "")
    assert shown.password == ("***" if parsed.password is not None else None)
    fields = ("drivername", "username", "host", "port", "database", "query")
    assert [getattr(shown, f) for f in fields] == [getattr(parsed, f) for f in fields]


def test_the_plain_postgres_urls_are_the_common_ones() -> None:
    """Not vacuous: the suite's own URL and its scratch schemas' take the direct way, and a
    URL with no password is hidden as itself."""
    assert pg_direct.conninfo_of(PG_URL) is not None
    assert pg_direct.conninfo_of(f"{PG_URL}?options=-csearch_path%3Deg_x") is not None
    assert pg_direct.hidden("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert pg_direct.conninfo_of("postgresql://u:p@ss@h/db") is None


@pytest.mark.parametrize("url", [
    "postgresql://u:secret@h/db", "postgresql+psycopg://u:secret@h:5432/db?sslmode=disable",
    "postgresql://u@h/db?password=secret", "postgresql://u@h/db?sslmode=disable&password=secret",
    "postgresql://u:secret@h/db?password=secret", "postgresql://u:se%40cret@h/db",
    "postgresql+psycopg2://u:secret@h/db", "postgresql://u@h/db?sslpassword=secret",
    "postgresql://u@h/db?sslpassword=secret&password=secret",
])
def test_no_message_shows_a_password(url: str) -> None:
    """However a URL carries a password (in its user part, or in its query, where libpq
    reads one too), the form messages show hides it."""
    from effectgate.store.connections import safe_url

    shown = safe_url(url)
    assert "secret" not in shown and "se%40cret" not in shown and "***" in shown


@pytest.mark.parametrize(("url", "shown"), [
    ("sqlite:////tmp/a\x1b[2J.db", "sqlite:////tmp/a⟨U+001B⟩[2J.db"),
    ("postgresql://u:secret@h/db?sslkey=/k&sslcert=/c", "postgresql://u:***@h/db?***"),
    ("postgresql+psycopg://u@h/db?options=-csearch_path%3Ds", "postgresql+psycopg://u@h/db?***"),
    ("not a url \x1b[2J", "<unprintable url>"),
])
def test_the_one_url_helper_hides_the_query_and_escapes_what_a_terminal_reads(
        url: str, shown: str) -> None:
    """The store's messages, the CLI and the console show a URL one way: its password and its
    whole query hidden (libpq reads more than passwords there), unsafe characters escaped."""
    from effectgate.cli._common import shown_url
    from effectgate.store.connections import safe_url

    assert safe_url(url) == shown_url(url) == shown


@pytest.fixture
def backend() -> str:
    """Postgres only (conftest's ``pg_schema`` then makes each test a scratch schema)."""
    require_postgres()
    return "postgres"


@pytest.fixture
def scratch_url(pg_schema: str | None) -> str:
    """A Postgres schema of this test's own (dropped afterwards): its URL."""
    assert pg_schema is not None
    return pg_schema


def _rows(url: str, sql: str) -> list[Any]:
    """``sql`` on a connection of its own to ``url``'s schema (libpq reads the URL)."""
    import psycopg

    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description is not None else []


_WORKER = Path(__file__).with_name("first_begin_worker.py")


def test_a_worker_on_an_existing_postgres_store_imports_no_sqlalchemy(scratch_url: str) -> None:
    """A worker's way to its first begin, report and read on an up-to-date Postgres store,
    sync and async: no SQLAlchemy (the statements and functions come rendered, the connection
    from psycopg). A store that must first be created goes through SQLAlchemy (the control:
    the check can see it)."""

    def run(namespace: str) -> str:
        return subprocess.run([sys.executable, str(_WORKER), scratch_url, namespace, "async"],
                              check=True, capture_output=True, text=True).stdout.strip()

    assert "'sqlalchemy'" in run("first")  # created here
    assert run("second") == "['asyncio']"  # (psycopg itself imports asyncio)


@pytest.mark.parametrize(("durability", "expected"), [("reserve", "on"), ("relaxed", "off")])
def test_a_direct_connection_is_set_up_as_the_engines(scratch_url: str, durability: str,
                                                      expected: str) -> None:
    """A connection the store opens itself has the durability the engine's pooled ones get,
    raised from a server default of ``off``; both are in autocommit mode."""
    url = scratch_url.replace("csearch_path", "csynchronous_commit%3Doff%20-csearch_path")
    Store(url).close()
    store = Store(url, durability=durability)  # type: ignore[arg-type]
    try:
        assert store._conns.conninfo is not None  # the direct way
        with store.connection() as own:
            mine = own.execute("SHOW synchronous_commit").fetchone()[0]
            idle = own.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0]
            assert own.autocommit
        with store.engine.connect() as pooled:
            theirs = pooled.exec_driver_sql("SHOW synchronous_commit").scalar()
            pooled_idle = pooled.exec_driver_sql(
                "SHOW idle_in_transaction_session_timeout").scalar()
        assert mine == theirs == expected
        assert idle == pooled_idle == "1min"
    finally:
        store.close()


def test_a_worker_frozen_inside_a_transaction_holds_no_lock_past_the_servers_limit(
        scratch_url: str) -> None:
    """A worker stopped inside one of the store's transactions (here: it holds the effect
    row's lock) is ended by the server once the idle-in-transaction limit passes, so another
    worker's write goes ahead instead of waiting for TCP to give up. The store sets 60 s
    where the server has no limit (above); a limit the server or the URL sets is kept, as
    here, 1 s."""
    import time

    url = scratch_url.replace("csearch_path",
                              "cidle_in_transaction_session_timeout%3D1s%20-csearch_path")
    gate = eg.Gate(url, namespace="frozen", policy=False)
    other = eg.Gate(url, namespace="frozen", policy=False)
    try:
        d = gate.begin(effect_type="t.x", key="k", payload={})
        with gate.store.connection() as own:
            assert own.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "1s"
            own.execute("BEGIN")
            own.execute("SELECT id FROM effectgate_effects WHERE key = 'k' FOR UPDATE")
            started = time.monotonic()  # then it stops: no COMMIT, no ROLLBACK
            other.report(d, "committed", result={"ok": 1})  # waits for the lock
            waited = time.monotonic() - started
        assert 0.5 < waited < 20, waited
        assert other.get("k").state is eg.State.COMMITTED
    finally:
        gate.close()
        other.close()


@pytest.mark.parametrize("change", [
    "UPDATE effectgate_meta SET value = '5' WHERE name = 'schema_version'",
    "UPDATE effectgate_meta SET value = '99' WHERE name = 'schema_version'",
    "DELETE FROM effectgate_meta WHERE name = 'vendor_secret'",
    "ALTER TABLE effectgate_effects DROP COLUMN vendor_ref",
    "DROP TABLE effectgate_audit",
    "DROP TABLE effectgate_meta",
])
def test_a_store_not_exactly_at_this_version_is_not_opened_directly(scratch_url: str,
                                                                   change: str) -> None:
    """Any doubt about the schema and the meta rows read as None (the SQLAlchemy way then
    migrates, creates or refuses); the intact store reads as its rows."""
    Store(scratch_url).close()
    conninfo = pg_direct.conninfo_of(scratch_url)
    assert conninfo is not None
    conn = pg_direct.connect(conninfo, "reserve")
    try:
        rows = pg_direct.read_meta(conn)
        assert rows is not None and rows["schema_version"] == str(SCHEMA_VERSION)
        _rows(scratch_url, change)
        assert pg_direct.read_meta(conn) is None
        assert not conn.info.transaction_status  # idle: nothing left open by the failed read
    finally:
        conn.close()


def test_a_store_newer_than_this_version_is_refused_through_sqlalchemy(scratch_url: str
                                                                      ) -> None:
    """A store a newer effectgate migrated is refused with the schema module's typed error,
    and left as it was."""
    Store(scratch_url).close()
    _rows(scratch_url, "UPDATE effectgate_meta SET value = '99' "
                       "WHERE name = 'schema_version'")
    with pytest.raises(eg.EffectGateError, match="99"):
        Store(scratch_url)
    assert _rows(scratch_url, "SELECT value FROM effectgate_meta "
                              "WHERE name = 'schema_version'") == [("99",)]


@pytest.mark.parametrize(("durability", "expected"), [("reserve", "on"), ("relaxed", "off")])
def test_async_callers_on_a_direct_store_reach_the_same_schema_and_durability(
        scratch_url: str, durability: str, expected: str) -> None:
    """The async face of a store opened directly connects with the same URI: its calls land
    in the URL's schema (its options kept), at the store's durability."""
    import asyncio

    url = scratch_url.replace("csearch_path", "csynchronous_commit%3Doff%20-csearch_path")
    gate = eg.Gate(url, namespace="direct-async", durability=durability,  # type: ignore[arg-type]
                   policy=False)
    try:
        assert gate.store._conns.conninfo is not None  # the direct way

        @gate.effect("a:{n}", effect_type="t.async")
        async def work(n: int) -> int:
            return n

        async def main() -> tuple[int, int, str]:
            first, again = await work(3), await work(3)
            face: Any = gate.store.async_face()
            conn = await face._acquire()
            try:
                row = await (await conn.execute("SHOW synchronous_commit")).fetchone()
            finally:
                face._release(conn)
            return first, again, row[0]

        first, again, synchronous = asyncio.run(main())
        assert (first, again, synchronous) == (3, 3, expected)
    finally:
        gate.close()
    assert _rows(url, "SELECT state, result FROM effectgate_effects WHERE key = 'a:3'") == [
        ("committed", "3")]


def test_a_connection_lost_while_the_meta_rows_are_read_is_not_kept(scratch_url: str) -> None:
    """The server ends the connection a direct store reads its meta rows on: the read says
    "go the SQLAlchemy way" (None), the connection is dropped, and the store's next call
    opens another and reads."""
    import psycopg

    store = Store(scratch_url)
    try:
        with store.connection() as conn:
            pid = conn.info.backend_pid
        with psycopg.connect(PG_URL.replace("+psycopg", ""), autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert store._read_meta() is None
        assert getattr(store._conns._local, "conn", None) is None  # dropped
        assert store.fetch("some-namespace", "no-such-key") is None
        with store.connection() as conn:
            assert conn.info.backend_pid != pid
    finally:
        store.close()


def _sessions(name: str) -> int:
    return int(_rows(PG_URL, "SELECT count(*) FROM pg_stat_activity "
                             f"WHERE application_name = '{name}'")[0][0])


def test_a_store_refused_when_it_opens_keeps_no_connection_open(scratch_url: str) -> None:
    """A store a newer effectgate migrated is refused; the connections the refusal opened (the
    direct one that read the meta rows, SQLAlchemy's that read the schema) are closed with
    it, not left to the garbage collector."""
    import uuid

    name = f"eg_refused_{uuid.uuid4().hex[:8]}"
    Store(scratch_url).close()
    _rows(scratch_url, "UPDATE effectgate_meta SET value = '99' "
                       "WHERE name = 'schema_version'")
    assert _sessions(name) == 0
    import gc
    import time

    gc.disable()  # a connection left to the collector stays open while this test looks
    try:
        with pytest.raises(eg.EffectGateError, match="99"):
            Store(f"{scratch_url}&application_name={name}")
        # A closed connection's server process ends a moment after the client lets go (on a
        # loaded machine, visibly later); one left open never does.
        deadline = time.monotonic() + 10
        while (left := _sessions(name)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == 0
    finally:
        gc.enable()


def test_the_idle_async_connections_of_a_finished_event_loop_are_closed(
        scratch_url: str) -> None:
    """``asyncio.run`` returns and its loop is gone: the async face's idle connections of that
    loop are closed then, not left to the garbage collector (a ResourceWarning each)."""
    import asyncio
    import gc
    import warnings

    with eg.Gate(scratch_url, namespace="dead-loop", policy=False) as gate:

        @gate.effect("a:{n}", effect_type="t.async")
        async def work(n: int) -> int:
            return n

        async def main() -> int:
            return await work(1)

        gc.collect()  # an earlier test's garbage (a pipe it left open) is not this test's
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", ResourceWarning)
            assert asyncio.run(main()) == 1
            gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []
