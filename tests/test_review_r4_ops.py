"""Review round 4 of the operators' tools, on SQLite and Postgres: an unwind (real side
effects) is confirmed first, naming its undos, and refused if the saga moved since (console
and CLI); a webhook receiver that answers its status at once and then trickles its body no
longer holds the delivery thread; an effect-type pattern with ``|`` (which could share a spend
counter with another rule) is refused; a console on loopback serves only its own host names."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import effectgate as eg
from effectgate.cli import main
from effectgate.console import build_app
from effectgate.webhooks import Webhooks

from .conftest import snapshot
from .console_helpers import console_gate, sign_in

# -- unwind in the console ---------------------------------------------------------------------


@pytest.fixture
def cgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    gate = console_gate(store_url, namespace)
    yield gate
    gate.close()


@pytest.fixture
def client(cgate: eg.Gate) -> Iterator[TestClient]:
    with TestClient(build_app(cgate), base_url="http://127.0.0.1") as c:
        yield c


def _step(gate: eg.Gate, group: str, name: str, commit: bool = True) -> eg.BeginDecision:
    d = gate.begin(effect_type=f"trip.{name}", key=f"{group}:{name}", payload={},
                   group_key=group, compensation={"cancel": name})
    if commit:
        gate.report(d, "committed")
    return d


def _seen(html: str) -> str:
    match = re.search(r'name="seen" value="([^"]*)"', html)
    assert match, "no form carrying what was seen"
    return match.group(1)


def test_console_unwind_is_confirmed_naming_its_undos_and_refused_if_the_saga_moved(
        cgate: eg.Gate, client: TestClient) -> None:
    """Unwind was one POST from the group's page, run on whatever the saga had become. Now
    the page's form leads to a confirmation (writing nothing) that names each undo; a step
    committed meanwhile (which the operator never saw) refuses the unwind: no compensator
    runs, nothing is written; reviewed again, the confirmation names the new step too."""
    _, token = cgate.add_principal("alice", "operator")
    csrf = sign_in(client, token)
    _step(cgate, "trip:1", "flight")
    _step(cgate, "trip:1", "hotel")
    page = client.get("/groups/view?group=trip%3A1")
    assert 'action="/groups/unwind"' in page.text and 'method="post"' not in page.text.split(
        'action="/groups/unwind"')[0][-60:]
    saw = _seen(page.text)
    before = snapshot(cgate)
    confirm = client.get(f"/groups/unwind?group=trip%3A1&seen={saw}")
    assert confirm.status_code == 200
    assert "compensate:trip:1:hotel" in confirm.text and "compensate:trip:1:flight" in confirm.text
    assert "Run 2 undos" in confirm.text
    assert snapshot(cgate) == before and cgate.undone == []  # type: ignore[attr-defined]
    _step(cgate, "trip:1", "car")  # meanwhile: a step the operator never saw
    changed = snapshot(cgate)
    r = client.post("/groups/unwind", data={"csrf_token": csrf, "group": "trip:1",
                                            "seen": _seen(confirm.text)},
                    follow_redirects=False)
    assert r.status_code == 303
    assert cgate.undone == [] and snapshot(cgate) == changed  # type: ignore[attr-defined]
    assert "changed since you reviewed it" in client.get(r.headers["location"]).text
    stale = client.get(f"/groups/unwind?group=trip%3A1&seen={saw}")
    assert "changed since you reviewed it" in stale.text and "Run " not in stale.text
    again = client.get("/groups/unwind?group=trip%3A1&seen=" + _seen(
        client.get("/groups/view?group=trip%3A1").text))
    assert "compensate:trip:1:car" in again.text and "Run 3 undos" in again.text
    client.post("/groups/unwind", data={"csrf_token": csrf, "group": "trip:1",
                                        "seen": _seen(again.text)})
    assert cgate.undone == ["trip:1:car", "trip:1:hotel", "trip:1:flight"]  # type: ignore[attr-defined]


def test_console_unwind_post_without_what_was_seen_runs_nothing(
        cgate: eg.Gate, client: TestClient) -> None:
    """The old one-click form (a POST naming only the group) runs no compensator."""
    _, token = cgate.add_principal("alice", "operator")
    csrf = sign_in(client, token)
    _step(cgate, "trip:2", "flight")
    before = snapshot(cgate)
    r = client.post("/groups/unwind", data={"csrf_token": csrf, "group": "trip:2"},
                    follow_redirects=False)
    assert r.status_code == 303
    assert cgate.undone == [] and snapshot(cgate) == before  # type: ignore[attr-defined]


def test_the_confirmation_names_only_the_undos_unwind_would_run(
        cgate: eg.Gate, client: TestClient) -> None:
    """Newest first, an undo left AMBIGUOUS holds back the older steps: the confirmation
    names none of them (and offers no button), as unwind would run none."""
    _, token = cgate.add_principal("alice", "operator")
    sign_in(client, token)
    _step(cgate, "trip:3", "flight")
    hotel = _step(cgate, "trip:3", "hotel")
    undo = cgate.begin(effect_type="trip.hotel.compensate", key="compensate:trip:3:hotel",
                       payload={"effect_id": hotel.effect_id,
                                "compensation": {"cancel": "hotel"}},
                       compensates_effect_id=hotel.effect_id)
    cgate.report(undo, "ambiguous", error="timeout")
    page = client.get("/groups/unwind?group=trip%3A3")
    assert "would run no undo now" in page.text and "Run " not in page.text
    _step(cgate, "trip:3", "car")
    page = client.get("/groups/unwind?group=trip%3A3")
    assert "Run 1 undo<" in page.text and "compensate:trip:3:car" in page.text
    assert "compensate:trip:3:flight" not in page.text


# -- unwind on the command line ----------------------------------------------------------------


class _Answer(io.BytesIO):
    """A stdin whose first read runs ``meanwhile`` (what happens while a human reads the
    question), then answers ``text``."""

    def __init__(self, text: bytes, meanwhile: Callable[[], None]) -> None:
        super().__init__(text)
        self.meanwhile: Callable[[], None] | None = meanwhile

    def _first(self) -> None:
        if self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()

    def read(self, size: int | None = -1) -> bytes:
        if size != 0:  # read(0): the test runner probing the stream
            self._first()
        return super().read(size)

    def read1(self, size: int | None = -1) -> bytes:
        self._first()
        return super().read1(size)

    def readline(self, size: int | None = -1) -> bytes:
        self._first()
        return super().readline(size)


@pytest.fixture
def saga_cli(store_url: str, namespace: str, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A saga of two committed steps and a ``--gate`` module whose compensator logs."""
    name = f"gatemod_{namespace}"
    (tmp_path / f"{name}.py").write_text(
        "import os, effectgate as eg\n"
        "gate = eg.Gate(os.environ['EGT_URL'], namespace=os.environ['EGT_NS'])\n"
        "@gate.compensator('trip.*')\n"
        "def cancel(record, compensation):\n"
        "    with open(os.environ['EGT_LOG'], 'a') as f:\n"
        "        f.write(record.key + '\\n')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    log = tmp_path / "undone.log"
    gate = eg.Gate(store_url, namespace=namespace)
    for step in ("flight", "hotel"):
        _step(gate, "trip:9", step)
    yield {"gate": gate, "log": log, "ref": f"{name}:gate",
           "env": {"EGT_URL": store_url, "EGT_NS": namespace, "EGT_LOG": str(log)}}
    gate.close()
    sys.modules.pop(name, None)


def _unwind(s: dict[str, Any], *extra: str, input: Any = None) -> Any:
    return CliRunner().invoke(main, ["unwind", "trip:9", "--gate", s["ref"], *extra],
                              env=s["env"], input=input, catch_exceptions=False)


def test_cli_unwind_asks_naming_the_undos_and_a_no_or_no_terminal_runs_nothing(
        saga_cli: dict[str, Any]) -> None:
    """``effectgate unwind`` ran every compensator without a word; it now asks on stderr,
    naming the undos: no terminal and no --yes is exit 2, "n" is exit 1, nothing run or
    written either way; "y" runs them."""
    before = snapshot(saga_cli["gate"])
    unasked = _unwind(saga_cli)
    assert unasked.exit_code == 2 and "--yes" in unasked.stderr
    no = _unwind(saga_cli, input="n\n")
    assert no.exit_code == 1 and "nothing undone" in no.stderr
    assert "compensate:trip:9:hotel" in no.stderr and "compensate:trip:9:flight" in no.stderr
    assert not saga_cli["log"].exists() and snapshot(saga_cli["gate"]) == before
    yes = _unwind(saga_cli, input="y\n")
    assert yes.exit_code == 0, yes.output
    assert saga_cli["log"].read_text().split() == ["trip:9:hotel", "trip:9:flight"]


def test_cli_unwind_refuses_a_saga_that_moved_while_it_asked(
        saga_cli: dict[str, Any]) -> None:
    """A step committed while the question was open (one the operator was not told of) is
    never undone on that "y": exit 1, nothing run, nothing written."""
    gate = saga_cli["gate"]
    changed: list[Any] = []

    def meanwhile() -> None:
        _step(gate, "trip:9", "car")
        changed.append(snapshot(gate))

    answer = _unwind(saga_cli, input=_Answer(b"y\n", meanwhile))
    assert answer.exit_code == 1 and "changed while you were asked" in answer.stderr
    assert not saga_cli["log"].exists() and snapshot(gate) == changed[0]
    done = _unwind(saga_cli, "--yes")
    assert done.exit_code == 0
    assert saga_cli["log"].read_text().split() == ["trip:9:car", "trip:9:hotel",
                                                   "trip:9:flight"]


# -- webhooks: a body that trickles ---------------------------------------------------------------


class _SlowBody:
    """A receiver that answers ``200 OK`` with its headers at once, then sends its (long)
    body a byte every 0.1 s."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                while not self.stop.is_set():
                    conn.sendall(b"x")
                    time.sleep(0.1)
            except OSError:
                return


def test_a_receiver_that_trickles_its_body_never_holds_the_delivery_thread(
        make_gate: Any) -> None:
    """The deadline shut the connection's socket, but urllib hands that socket to the
    response once the headers are read: a body sent a byte at a time (each read inside the
    timeout) held the delivery thread for hours. The status arrived, so it is delivered,
    within the timeout, and the next event is not stuck behind it."""
    server = _SlowBody()
    hooks = Webhooks(server.url, "whsec_" + "k" * 32, timeout=1.0, max_attempts=1,
                     flush_on_exit=0)
    gate = make_gate(policy=eg.Policy.from_dict({"effects": {"payment.*": {
        "approval": "always"}}}), webhooks=hooks)
    try:
        started = time.monotonic()
        for txn in ("a", "b"):
            gate.begin(effect_type="payment.refund", key=f"refund:{txn}", payload={})
        assert hooks.flush(8.0)
        assert time.monotonic() - started < 6.0
        stats = hooks.stats()
        assert (stats.delivered, stats.failed, stats.waiting) == (2, 0, 0)
    finally:
        server.stop.set()
        server.sock.close()
        hooks.close(0.1)


# -- policy: one counter per ceiling ------------------------------------------------------------


def test_an_effect_type_pattern_with_a_bar_is_refused(tmp_path: Path) -> None:
    """Spend counters are ``pattern|scope|id``: rule ``a`` per run and rule ``a|run`` per
    agent counted run "agent|bob" and agent "bob" on one counter. Such a pattern is a
    PolicyError (a ConfigError) naming the field, from a dict and from a file."""
    shared = {"effects": {"a": {"budget": {"per_run_micros": 5}},
                          "a|run": {"budget": {"per_agent_micros": 5}}}}
    with pytest.raises(eg.PolicyError, match=r"effects\.a\|run\.effect_type: .*'\|'"):
        eg.Policy.from_dict(shared)
    path = tmp_path / "effectgate.toml"
    path.write_text('[effects."pay|x"]\ndeny = true\n')
    with pytest.raises(eg.ConfigError, match=r"has no '\|'"):
        eg.Policy.load(path)
    eg.Policy.from_dict({"effects": {"a": {"budget": {"per_run_micros": 5}}}})


# -- the console's host names --------------------------------------------------------------------


def test_a_loopback_console_serves_only_its_own_host_names(cgate: eg.Gate) -> None:
    """A page that DNS-rebinds its own name to 127.0.0.1 reached the console; on loopback
    it answers only to loopback names (any port): 421 otherwise, before anything runs."""
    app = build_app(cgate, host="127.0.0.1")
    for base in ("http://127.0.0.1:8765", "http://localhost", "http://[::1]:8765",
                 "http://LOCALHOST:1"):
        with TestClient(app, base_url=base) as c:
            assert c.get("/login").status_code == 200, base
    for base in ("http://evil.example:8765", "http://127.0.0.1.evil.example",
                 "http://[::2]:8765"):
        with TestClient(app, base_url=base) as c:
            r = c.get("/login")
            assert r.status_code == 421 and "127.0.0.1" in r.text, base
    with TestClient(build_app(cgate), base_url="http://console.example") as c:
        assert c.get("/login").status_code == 200  # mounted elsewhere: the host is theirs


def test_effectgate_console_refuses_a_rebound_host_name(tmp_path: Path) -> None:
    """The real ``effectgate console`` process on 127.0.0.1: a request whose Host is another
    name is refused (421); its own address is served."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectgate.cli", "console", "--port", "0", "--url",
         f"sqlite:///{tmp_path / 'c.db'}", "--sweep-interval", "0"],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        port = int(match.group(1))

        def status(host: str) -> int:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(f"GET /login HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                          .encode())
                head = s.recv(64).decode()
            return int(head.split()[1])

        assert status(f"evil.example:{port}") == 421
        assert status(f"127.0.0.1:{port}") == 200
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()  # type: ignore[union-attr]
