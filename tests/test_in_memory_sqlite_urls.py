"""A SQLite store only one connection (or one process) sees is refused, however its URL spells
it: each process would reserve the same key in a store of its own, and nothing would survive a
crash. Refused before anything is opened: no file and no folder is made for it. A ``file:`` URI
that names a real file keeps working, its folder made where SQLite will look for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import effectgate as eg
from effectgate.store import Store

IN_MEMORY = [
    # a file: URI asking for memory, as SQLite reads one (?uri=true)
    "sqlite:///file:effects?mode=memory&cache=shared&uri=true",
    "sqlite:///file:effects?vfs=memdb&uri=true",
    "sqlite:///file:/effects?vfs=memdb&uri=true",
    "sqlite:///file:effects?vfs=MemDB&uri=true",
    "sqlite:///file:effects?mode=MEMORY&uri=true",
    "sqlite:///file:effects?uri=true&mode=%256Demory",  # SQLite decodes what make_url passes
    "sqlite:///file:%3Amemory%3A?uri=true",
    "sqlite:///file:%253Amemory%253A?uri=true",
    "sqlite:///file::memory:?cache=shared&uri=true",
    "sqlite:///FILE::memory:",
    "sqlite:///file::memory:",
    # an empty path: a private temporary database
    "sqlite:///file:?uri=true",
    "sqlite:///file:",
    "sqlite:///file://localhost?uri=true",
    "sqlite:///?uri=true",
    # SQLAlchemy's own spellings
    "sqlite://",
    "sqlite:///:memory:",
    "sqlite+pysqlite:///:memory:",
    "sqlite:///:memory:?uri=true",
    "sqlite:///:memory:?timeout=5",
    # mode=memory given as a query parameter, whether or not SQLite is told to read URIs
    "sqlite:///file:effects?mode=memory",
    "sqlite:///effects.db?mode=memory&uri=true",
]


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("url", IN_MEMORY)
def test_an_in_memory_sqlite_url_is_refused_and_makes_nothing(
        url: str, read_only: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(eg.ConfigError, match=r"in-memory SQLite .*temporary_gate\(\)"):
        eg.Gate(url, policy=False, read_only=read_only)
    with pytest.raises(eg.ConfigError, match="in-memory SQLite"):
        Store(url, read_only=read_only)
    assert os.listdir(tmp_path) == []  # no file, no "file:" folder


def test_two_processes_on_a_shared_cache_memory_uri_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The red team's case: each process had its own memory database, so both executed the
    same key; a crash lost everything."""
    import subprocess
    import sys

    child = ("import effectgate as eg, sys\n"
             "try:\n"
             "    eg.Gate(sys.argv[1], policy=False)\n"
             "except eg.ConfigError:\n"
             "    print('refused')\n")
    url = "sqlite:///file:effects?mode=memory&cache=shared&uri=true"
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", child, url], capture_output=True,
                             text=True, cwd=tmp_path, timeout=120)
        assert out.stdout.strip() == "refused", out.stderr[-2000:]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("form", ["file:{path}?uri=true", "file://{path}?uri=true",
                                  "file:{path}?uri=true&cache=private"])
def test_a_file_uri_naming_a_real_file_keeps_working(
        form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its folder is made where SQLite opens the file (it was made under a ``file:`` folder of
    the working directory instead, and the store then failed to open)."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    path = tmp_path / "sub" / "effects.db"
    url = "sqlite:///" + form.format(path=path)
    with eg.Gate(url, policy=False) as gate:
        first = gate.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
        assert first.decision is eg.Decision.EXECUTE
        gate.report(first, "committed", result={"ok": True})
    with eg.Gate(url, policy=False) as again:
        second = again.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
        assert second.decision is eg.Decision.DUPLICATE
    assert path.is_file()
    assert os.listdir(work) == []
    with eg.Gate(url, policy=False, read_only=True) as reader:
        assert reader.get("refund:1").state is eg.State.COMMITTED


def test_a_file_name_without_uri_true_is_one_file_for_schema_and_reservations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sqlite:///file:effects.db``: SQLAlchemy creates the schema in a file of that name,
    and the reservations now go to the same file (SQLite built with ``SQLITE_USE_URI`` read
    the name as a URI, ``effects.db``, where there were no tables)."""
    monkeypatch.chdir(tmp_path)
    with eg.Gate("sqlite:///file:effects.db", policy=False) as gate:
        first = gate.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
        assert first.decision is eg.Decision.EXECUTE
        gate.report(first, "committed", result=None)
    with eg.Gate("sqlite:///file:effects.db", policy=False, memo_size=0) as again:
        second = again.begin(effect_type="payment.refund", key="refund:1", payload={"n": 1})
        assert second.decision is eg.Decision.DUPLICATE
    assert (tmp_path / "file:effects.db").is_file()
