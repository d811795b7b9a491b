"""Governance under attack, on both backends: workers racing on one budget and killed with
SIGKILL mid-effect, a webhook receiver that answers one byte at a time, and a receiver's
signature check given a window that is not a number of seconds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate.testing import lapse_leases
from effectgate.webhooks import Webhooks, sign, verify_signature

DOLLAR = 1_000_000
CEILING = {"effects": {"payment.*": {"budget": {"per_effect_type_micros": 10 * DOLLAR}}}}
SECRET = "whsec_" + "k" * 32

# One racer: begins six $1 charges (some refused by the ceiling); commits each it may run at
# half its estimate, except its fourth: that one it performs (a line in the file) and hangs in
# the body until killed.
_RACER = """
import sys, time, effectgate as eg
url, ns, worker, side = sys.argv[1:5]
gate = eg.Gate(url, namespace=ns, policy=eg.Policy.from_dict(
    {"effects": {"payment.*": {"budget": {"per_effect_type_micros": 10_000_000}}}}))
for i in range(6):
    d = gate.begin(effect_type="payment.charge", key=f"charge:{worker}:{i}", payload={},
                   estimated_cost_micros=1_000_000, lease_seconds=600)
    if d.decision is not eg.Decision.EXECUTE:
        continue
    with open(side, "a") as f:
        f.write(f"{worker}:{i}\\n")
    if i == 3:
        time.sleep(3600)  # mid-effect: killed here
    gate.report(d, "committed", actual_cost_micros=500_000)
with open(side, "a") as f:
    f.write(f"done:{worker}\\n")
time.sleep(3600)
"""


def _spent(gate: eg.Gate) -> int:
    from sqlalchemy import text

    with gate.store.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT coalesce(sum(spent_micros), 0) FROM effectgate_budgets WHERE namespace = :ns"),
            {"ns": gate.namespace}).scalar_one())


@pytest.mark.xdist_group("processes")
def test_killed_racers_on_one_budget_hold_their_spend_until_resolved_failed(
        store_url: str, namespace: str, tmp_path: Path) -> None:
    """Six OS processes race $1 charges on a $10 ceiling, committing at half the estimate;
    those in a body are SIGKILLed. The counter is exactly what the effects hold (a committed
    one its actual cost, an AMBIGUOUS one its estimate, a refusal nothing) and within the
    ceiling; resolving the killed ones FAILED releases exactly their estimates, and the freed
    budget can be spent, to the dollar."""
    side = tmp_path / "ran.txt"
    side.touch()
    script = tmp_path / "racer.py"
    script.write_text(_RACER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, str(script), store_url, namespace, str(w),
                               str(side)], env=env) for w in range(6)]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            lines = side.read_text().splitlines()
            settled = [w for w in range(6) if f"done:{w}" in lines or f"{w}:3" in lines]
            if len(settled) == 6:  # each racer finished, or hangs in its fourth body
                break
            time.sleep(0.1)
        else:
            pytest.fail("the racers did not settle")
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    ran = [line for line in side.read_text().splitlines() if not line.startswith("done:")]
    gate = eg.Gate(store_url, namespace=namespace, policy=eg.Policy.from_dict(CEILING))
    try:
        assert lapse_leases(gate) >= 1
        records = [gate.get(f"charge:{line}") for line in ran]
        committed = [r for r in records if r.state is eg.State.COMMITTED]
        held = [r for r in records if r.state is eg.State.AMBIGUOUS]
        assert len(committed) + len(held) == len(ran)
        assert _spent(gate) == len(committed) * DOLLAR // 2 + len(held) * DOLLAR
        assert _spent(gate) <= 10 * DOLLAR  # never past the ceiling
        for record in held:
            gate.resolve(record.key, "failed", by="ops", note="worker killed; vendor: none")
        assert _spent(gate) == len(committed) * DOLLAR // 2
        room = (10 * DOLLAR - _spent(gate)) // DOLLAR
        fresh = [gate.begin(effect_type="payment.charge", key=f"fresh:{i}", payload={},
                            estimated_cost_micros=DOLLAR) for i in range(room + 1)]
        assert [d.decision for d in fresh].count(eg.Decision.EXECUTE) == room
        assert fresh[-1].decision is eg.Decision.DENIED
    finally:
        gate.close()


# -- webhooks --------------------------------------------------------------------------------

class Dripper:
    """A receiver that accepts, answers ``200 OK``, then sends one header line every 0.2 s
    for ever: every read returns within any socket timeout, the answer never ends."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.connections = 0
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not self.stop.is_set():
                    conn.sendall(b"X-Drip: 1\r\n")
                    time.sleep(0.2)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def dripper() -> Iterator[Dripper]:
    server = Dripper()
    yield server
    server.close()


def test_a_receiver_that_drips_its_answer_never_holds_the_delivery_thread(
        make_gate: Any, dripper: Dripper) -> None:
    """An approval request's webhook to a receiver that sends a byte every 0.2 s (each read
    inside the 0.5 s timeout): each attempt is cut at the timeout and counted failed, never
    delivered, and the queue drains, so later events are not stuck behind it."""
    hooks = Webhooks(dripper.url, SECRET, timeout=0.5, max_attempts=2, backoff_seconds=0.05,
                     flush_on_exit=0)
    gate = make_gate(policy=eg.Policy.from_dict({"effects": {"payment.*": {
        "approval": "always"}}}), webhooks=hooks)
    try:
        for txn in ("a", "b"):
            d = gate.begin(effect_type="payment.refund", key=f"refund:{txn}", payload={})
            assert d.decision is eg.Decision.APPROVAL_REQUIRED
        assert hooks.flush(6.0)
        stats = hooks.stats()
        assert (stats.delivered, stats.failed, stats.waiting) == (0, 2, 0)
        assert dripper.connections == 4
    finally:
        hooks.close(0.1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1, "300", None, True])
def test_a_signature_window_that_is_not_seconds_is_a_config_error(bad: Any) -> None:
    """``tolerance=nan`` or ``inf`` compared False with any age, so a request signed years
    ago was accepted (a replay for ever); a window, or ``now``, that is not a finite
    non-negative number is the receiver's bug: a ConfigError, never True."""
    body = b'{"event":"ambiguous"}'
    old = sign(SECRET, body, timestamp=1)
    with pytest.raises(eg.ConfigError, match="tolerance"):
        verify_signature(SECRET, old, body, tolerance=bad)
    if bad is not None:
        with pytest.raises(eg.ConfigError, match="now"):
            verify_signature(SECRET, old, body, now=bad)
    assert not verify_signature(SECRET, old, body)
    assert verify_signature(SECRET, old, body, tolerance=0, now=1)


def test_a_webhook_url_with_credentials_is_refused_before_anything_is_sent() -> None:
    """``https://user:password@host/``: urllib took ``user:password@host`` for the host name,
    so the password went to the DNS resolver and no delivery ever arrived; it is a
    ConfigError naming the way that works (an ``Authorization`` header)."""
    for url in ("http://user:hunter2@127.0.0.1:9/hook", "https://token@hooks.example.com/x"):
        with pytest.raises(eg.ConfigError, match="credentials") as caught:
            Webhooks(url, SECRET)
        assert "hunter2" not in str(caught.value)
    with pytest.raises(eg.ConfigError, match="port"):
        Webhooks("http://127.0.0.1:99999/hook", SECRET)
    with pytest.raises(eg.ConfigError, match="credentials"):
        Webhooks("https://hooks.example.com/x", SECRET, console_url="https://a:b@ops.example")


# -- approvals by cost -----------------------------------------------------------------------

THRESHOLD = {"effects": {"payment.*": {"approval": {"at_or_above_micros": 100 * DOLLAR}}}}


def test_a_call_that_declares_no_cost_cannot_skip_a_cost_threshold_approval(
        make_gate: Any) -> None:
    """"Refunds of $100 or more need approval": a tool that declares no cost (its author
    forgot ``cost_micros``, or an MCP agent left ``estimated_cost_micros`` out) ran any
    amount at once, with no approval and no warning. It is asked for approval, like a call
    at the threshold; one that declares a cost below it still runs."""
    gate = make_gate(policy=eg.Policy.from_dict(THRESHOLD))
    ran: list[int] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, amount_cents: int) -> dict[str, int]:
        ran.append(amount_cents)
        return {"refunded": amount_cents}

    with pytest.raises(eg.ApprovalRequired) as asked:
        refund("txn_1", 5_000_000)
    assert ran == []
    assert gate.get("refund:txn_1").state is eg.State.PENDING_APPROVAL
    bare = gate.begin(effect_type="payment.refund", key="refund:txn_2", payload={})
    assert bare.decision is eg.Decision.APPROVAL_REQUIRED
    small = gate.begin(effect_type="payment.refund", key="refund:txn_3", payload={},
                       estimated_cost_micros=DOLLAR)
    assert small.decision is eg.Decision.EXECUTE
    gate.approve(asked.value.approval_id, by="alice")
    assert refund("txn_1", 5_000_000) == {"refunded": 5_000_000}
    assert ran == [5_000_000]
