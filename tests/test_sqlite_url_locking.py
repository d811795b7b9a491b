"""A SQLite URL whose options open the store without the file locks every other process takes
is refused, however it spells them: ``nolock`` or ``immutable`` with anything but a false
value, a VFS other than the default one (``unix-none`` does not lock, ``unix-dotfile`` locks
where processes on the default VFS do not look, ``unix-excl`` keeps every other process out),
a shared cache (table locks the busy timeout does not wait on). Several processes on such a
store each won the same key (red team, round 9). Refused before anything is opened (no file,
no folder), by ``Gate`` and ``Store``, read-write and read-only; an existing store is left as
it was. Options that keep the locks (``nolock=0``, ``vfs=unix``, ``psow``, ``mode=rwc``)
still open the store."""

from __future__ import annotations

import os
import sqlite3
import warnings
from pathlib import Path

import pytest

import effectgate as eg
from effectgate.store import Store

UNLOCKED = [
    # nolock: every value SQLite reads as true (digits, on/yes/true in any case), and any
    # value that is not an explicit false one
    "sqlite:///file:sub/effects.db?nolock=1&uri=true",
    "sqlite:///file:sub/effects.db?nolock=yes&uri=true",
    "sqlite:///file:sub/effects.db?nolock=TRUE&uri=true",
    "sqlite:///file:sub/effects.db?nolock=on&uri=true",
    "sqlite:///file:sub/effects.db?nolock=2&uri=true",
    "sqlite:///file:sub/effects.db?nolock=maybe&uri=true",
    "sqlite:///file:sub/effects.db?nolock=%31&uri=true",  # escaped: SQLite decodes it
    "sqlite:///file:sub/effects.db?nolock=0&nolock=1&uri=true",  # any occurrence
    "sqlite:///file:sub/effects.db%3Fnolock?uri=true",  # in the path, with no value
    "sqlite:///file:sub/effects.db%3Fnolock%3D1?uri=true",
    "sqlite:///file:sub/effects.db?a=%26nolock%3D1&uri=true",  # SQLAlchemy joins "a=&nolock=1"
    "sqlite:///file:sub/effects.db?NOLOCK=1&uri=true",
    "sqlite:///sub/effects.db?nolock=1",  # without uri=true too (SQLite may read URIs anyway)
    # immutable: SQLite assumes nobody writes the file, and neither locks nor looks for changes
    "sqlite:///file:sub/effects.db?immutable=1&uri=true",
    "sqlite:///file:sub/effects.db?immutable=true&uri=true",
    "sqlite:///file:sub/effects.db%3Fimmutable%26nolock=0?uri=true",
    # a VFS other than the default
    "sqlite:///file:sub/effects.db?vfs=unix-none&uri=true",
    "sqlite:///file:sub/effects.db?vfs=unix-dotfile&uri=true",
    "sqlite:///file:sub/effects.db?vfs=unix-excl&uri=true",
    "sqlite:///file:sub/effects.db?vfs=unix%2Dnone&uri=true",
    "sqlite:///file:sub/effects.db?vfs=win32-none&uri=true",
    "sqlite:///file:sub/effects.db?vfs=nosuch&uri=true",
    "sqlite:///file:sub/effects.db%3Fvfs=?uri=true",
    # a shared cache
    "sqlite:///file:sub/effects.db?cache=shared&uri=true",
]


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("url", UNLOCKED)
def test_a_sqlite_url_that_weakens_locking_is_refused_and_makes_nothing(
        url: str, read_only: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():  # SQLAlchemy's note on a query it drops (no uri=true)
        warnings.simplefilter("ignore")
        with pytest.raises(eg.ConfigError, match="SQLite") as refused:
            eg.Gate(url, policy=False, read_only=read_only)
        with pytest.raises(eg.ConfigError, match="SQLite"):
            Store(url, read_only=read_only)
    assert type(refused.value) is eg.ConfigError
    assert os.listdir(tmp_path) == []  # no file, no folder


def _dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.mark.parametrize("option", ["nolock=1", "immutable=1", "vfs=unix-none",
                                    "vfs=unix-dotfile", "cache=shared"])
def test_an_existing_store_opened_with_such_a_url_is_left_as_it_was(
        option: str, tmp_path: Path) -> None:
    path = tmp_path / "effects.db"
    with eg.Gate(f"sqlite:///{path}", policy=False, namespace="locks") as gate:
        first = gate.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
        gate.report(first, "committed", result={"ok": True})
    before = _dump(path)
    url = f"sqlite:///file:{path}?{option}&uri=true"
    for read_only in (False, True):
        with pytest.raises(eg.ConfigError, match="SQLite"):
            eg.Gate(url, policy=False, namespace="locks", read_only=read_only)
    assert _dump(path) == before
    assert sorted(os.listdir(tmp_path)) == ["effects.db"]


def test_mode_ro_is_refused_for_a_store_opened_to_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write would fail (``attempt to write a readonly database``) after the gate
    opened; read-only, ``mode=ro`` is what was asked for and opens the store."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "effects.db"
    with eg.Gate(f"sqlite:///{path}", policy=False) as gate:
        first = gate.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
        gate.report(first, "committed", result=None)
    before = _dump(path)
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    with pytest.raises(eg.ConfigError, match=r"mode=ro .*read_only=True"):
        eg.Gate(url, policy=False)
    with pytest.raises(eg.ConfigError, match="mode=ro"):
        Store(url)
    assert _dump(path) == before
    with eg.Gate(url, policy=False, read_only=True) as reader:
        assert reader.get("refund:1").state is eg.State.COMMITTED


@pytest.mark.parametrize(("kept", "refused"), [
    ("nolock=0", "nolock=1"), ("nolock=false", "nolock=true"), ("nolock=OFF", "nolock=ON"),
    ("immutable=no", "immutable=yes"), ("vfs=unix", "vfs=unix-none"),
    ("cache=private", "cache=shared"), ("psow=0", "psow=0&nolock=1"),
    ("psow=1", "psow=1&vfs=unix-excl"), ("mode=rwc", "mode=rwc&immutable=1"),
    ("nolock=0&immutable=0&vfs=unix&mode=rw", "nolock=0&immutable=0&vfs=unix-dotfile&mode=rw"),
    ("timeout=5", "timeout=5&nolock=1"),
    ("check_same_thread=true", "check_same_thread=true&nolock=1"),
    ("isolation_level=DEFERRED", "isolation_level=DEFERRED&nolock=1"),
])
def test_options_that_keep_the_locks_open_the_store_and_their_opposites_do_not(
        kept: str, refused: str, tmp_path: Path) -> None:
    """(SQLAlchemy's own ``timeout`` and ``check_same_thread`` give way to the store's
    connect arguments, and its ``isolation_level`` to the engine's autocommit.)"""
    path = tmp_path / "effects.db"
    eg.Gate(f"sqlite:///{path}", policy=False).close()  # mode=rw needs the file
    before = _dump(path)
    with pytest.raises(eg.ConfigError, match="SQLite"):
        eg.Gate(f"sqlite:///file:{path}?{refused}&uri=true", policy=False)
    assert _dump(path) == before
    url = f"sqlite:///file:{path}?{kept}&uri=true"
    with eg.Gate(url, policy=False) as gate:
        first = gate.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
        assert first.decision is eg.Decision.EXECUTE
        gate.report(first, "committed", result={"ok": True})
    with eg.Gate(f"sqlite:///{path}", policy=False, memo_size=0) as again:
        second = again.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
        assert second.decision is eg.Decision.DUPLICATE
    with eg.Gate(url, policy=False, read_only=True) as reader:
        assert reader.get("refund:1").state is eg.State.COMMITTED


def test_a_store_file_with_two_names_is_refused_by_either_and_a_symlink_opens(
        tmp_path: Path) -> None:
    """Red team, round 10: SQLite keeps the write-ahead log and the locks beside the name it
    opens, so two processes opening one file by two hard links each won the same key (10 of
    10 races). A file with more than one name is refused by each name, on every path and
    read-only too, and nothing is written; a symbolic link (resolved to the one name) opens."""
    path, other, link = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "c.db"
    eg.Gate(f"sqlite:///{path}", policy=False).close()
    os.link(path, other)
    before = _dump(path)
    for url in (f"sqlite:///{path}", f"sqlite:///{other}",
                f"sqlite:///file:{other}?mode=rw&uri=true"):
        for read_only in (False, True):
            with pytest.raises(eg.ConfigError, match="hard links"):
                eg.Gate(url, policy=False, read_only=read_only)
    assert _dump(path) == before
    os.unlink(other)
    os.symlink(path, link)
    with eg.Gate(f"sqlite:///{link}", policy=False) as gate:
        assert gate.begin(effect_type="a.b", key="k", payload={}).decision is eg.Decision.EXECUTE
