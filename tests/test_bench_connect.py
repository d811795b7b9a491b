"""The bench's own Postgres connections open with the store's connect timeout: a server that
accepts and never answers fails the run with a typed error naming it, instead of hanging it."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
from click.testing import CliRunner

import effectgate as eg
from effectgate.bench import BenchConfig, run_bench
from effectgate.cli import main
from effectgate.store import pg_direct


def _silent_server() -> socket.socket:
    """A listening socket that never accepts: the kernel completes the TCP handshake and
    libpq then waits for the server's first answer."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server


def test_a_server_that_never_answers_fails_the_bench_with_its_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_direct, "CONNECT_TIMEOUT", 1)
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    server = _silent_server()
    port = server.getsockname()[1]
    url = f"postgresql+psycopg://postgres:s3cret@127.0.0.1:{port}/test"
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(run_bench(BenchConfig(urls=(url,), sections=("core",), n=10,
                                                 chunks=1)))
        except BaseException as err:  # handed to the test thread
            outcome.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(8)
    hung = worker.is_alive()
    server.close()  # resets the waiting handshake: a hung worker ends too
    worker.join(10)
    assert not hung, "the bench waited on a server that never answers"
    [err] = outcome
    assert isinstance(err, eg.StoreError), err
    assert f"127.0.0.1:{port}" in str(err) and "cannot reach" in str(err)
    assert "s3cret" not in str(err)


def test_the_cli_says_so_and_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "1")  # the user's own choice is kept
    server = _silent_server()
    try:
        port = server.getsockname()[1]
        result = CliRunner().invoke(main, [
            "bench", "--url", f"postgresql+psycopg://postgres:s3cret@127.0.0.1:{port}/test",
            "--only", "core", "--n", "10"])
    finally:
        server.close()
    assert result.exit_code == 3, result.output
    assert "cannot reach the Postgres server" in result.output
    assert "s3cret" not in result.output
