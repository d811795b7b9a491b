"""Postgres only: a server that accepts the connection and never answers.

libpq without a ``connect_timeout`` waits on such a server forever, so every connection
effectgate opens itself gets one (:data:`effectgate.store.pg_direct.CONNECT_TIMEOUT`) unless
the user's URL (or ``$PGCONNECT_TIMEOUT``) chose their own. The server here is a loopback
socket that accepts and never writes; for the async path, a proxy to the real server that goes
silent for new connections once the gate is open. The tests lower the default (a module
constant, read as each connection opens) to 2 seconds, libpq's least, so that each takes
seconds.

A store opened by a plain URL connects without SQLAlchemy first; a server that does not answer
is reported at once, not asked a second time through SQLAlchemy (which would wait out the
timeout again): the bound is one timeout and a margin for a busy machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy.engine import make_url

import effectgate as eg
from effectgate.store import Store, pg_direct

from .conftest import PG_URL, require_postgres
from .pg_proxy import WedgingProxy

MARGIN = 3.0


@pytest.fixture
def silent() -> Iterator[WedgingProxy]:
    server = WedgingProxy(None)
    yield server
    server.close()


@pytest.fixture
def wedging() -> Iterator[WedgingProxy]:
    require_postgres()
    url = make_url(PG_URL)
    server = WedgingProxy((url.host or "127.0.0.1", url.port or 5432))
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _no_timeout_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)


def store_error_within(seconds: float, opening: Callable[[], Any]) -> tuple[eg.StoreError, float]:
    """The StoreError ``opening`` raises, and how long it took; fails if it is still
    waiting after ``seconds`` (left on a daemon thread, which the server's close ends)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            opened = opening()
        except BaseException as err:
            outcome.append(err)
        else:
            outcome.append(None)
            with contextlib.suppress(Exception):
                opened.close()

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    elapsed = time.monotonic() - start
    assert outcome, f"still waiting on a silent server after {elapsed:.1f}s"
    assert isinstance(outcome[0], eg.StoreError), outcome[0]
    return outcome[0], elapsed


def test_the_users_connect_timeout_is_kept(silent: WedgingProxy,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_direct, "CONNECT_TIMEOUT", 60)
    url = silent.url("?connect_timeout=2", password="sekrit")
    err, elapsed = store_error_within(2 + MARGIN, lambda: eg.Gate(url, namespace="t"))
    assert 2 * 0.9 <= elapsed < 2 * 2 * 0.85  # one wait, not two
    assert str(err).startswith("cannot open the store at ")
    assert "sekrit" not in str(err) and "***" in str(err)


def test_pgconnect_timeout_is_the_users_choice_too(silent: WedgingProxy,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_direct, "CONNECT_TIMEOUT", 60)
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    store_error_within(2 + MARGIN, lambda: eg.Gate(silent.url(), namespace="t"))


def test_a_gate_on_a_silent_server_gives_up_after_the_default(
        silent: WedgingProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_direct, "CONNECT_TIMEOUT", 2)
    url = silent.url(password="sekrit")
    err, elapsed = store_error_within(2 + MARGIN, lambda: eg.Gate(url, namespace="t"))
    assert elapsed < 2 * 2 * 0.85, elapsed  # one wait, not two
    assert str(err).startswith("cannot open the store at ") and "timeout" in str(err)
    assert "sekrit" not in str(err) and "***" in str(err)


def test_the_sqlalchemy_engine_gives_up_after_the_default(
        silent: WedgingProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only store opens through SQLAlchemy's engine alone."""
    monkeypatch.setattr(pg_direct, "CONNECT_TIMEOUT", 2)
    store_error_within(2 + MARGIN, lambda: Store(silent.url(), read_only=True))


def test_an_async_begin_gives_up_when_the_server_stops_answering(
        wedging: WedgingProxy, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate opens through the proxy; then the server goes silent for new connections, and
    ``abegin`` opens the first one of the async pool."""
    monkeypatch.setattr(pg_direct, "CONNECT_TIMEOUT", 2)
    gate = eg.Gate(wedging.url(), namespace=namespace)
    try:
        wedging.wedged.set()
        store_error_within(2 + MARGIN, lambda: asyncio.run(
            gate.abegin(effect_type="t", key="k:1", payload={})))
    finally:
        gate.close()


def test_an_empty_connect_timeout_is_no_choice_on_either_way_in() -> None:
    """``?connect_timeout=`` (no value): SQLAlchemy's parser drops it, so a read-only store
    (opened through SQLAlchemy) got the default; the direct way handed ``''`` to psycopg,
    which refused it. Both ways now open, with the default."""
    require_postgres()
    url = PG_URL + ("&" if "?" in PG_URL else "?") + "connect_timeout="
    Store(url, read_only=True).close()
    Store(url).close()
    assert pg_direct.with_connect_timeout("host=x connect_timeout=", {}) == {
        "connect_timeout": pg_direct.CONNECT_TIMEOUT}
