"""The ``effectgate`` command line through its real entry point: the operator commands on both
backends (click's runner on ``effectgate.cli.main``), bad input for every command (one line,
exit 2, no traceback), and ``demo`` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import effectgate as eg
from effectgate.cli import main
from effectgate.testing import lapse_leases

POLICY = {"effects": {"payment.big": {"approval": "always"}}}
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/none"


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


@pytest.fixture
def store(make_gate: Any, store_url: str, namespace: str) -> dict[str, Any]:
    """A namespace with a committed, an ambiguous, a pending-approval effect and a saga."""
    gate = make_gate(policy=eg.Policy.from_dict(POLICY))
    d = gate.begin(effect_type="payment.refund", key="refund:a", payload={"n": 1}, run_id="r1",
                   vendor="stripe")
    gate.report(d, "committed", result={"refund_id": "re_1"})
    gate.begin(effect_type="payment.refund", key="refund:b", payload={"n": 2}, run_id="r2")
    lapse_leases(gate, "refund:b")
    pending = gate.begin(effect_type="payment.big", key="big:c", payload={}, run_id="r1",
                         agent_id="agent-1")
    for step in ("flight", "hotel"):
        d = gate.begin(effect_type=f"booking.{step}", key=f"{step}:trip_1", payload={},
                       group_key="trip:1", compensation={"cancel": step})
        gate.report(d, "committed", result={"booked": step})
    return {"url": store_url, "ns": namespace, "gate": gate, "approval": pending.approval_id,
            "args": ["--url", store_url, "--namespace", namespace]}


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_ls_filters_by_state_type_run_and_group(store: dict[str, Any]) -> None:
    a = store["args"]
    everything = as_json(cli("ls", *a, "--json"))
    assert {r["key"]: r["state"] for r in everything} == {
        "refund:a": "committed", "refund:b": "ambiguous", "big:c": "pending_approval",
        "flight:trip_1": "committed", "hotel:trip_1": "committed"}
    assert [r["key"] for r in as_json(cli("ls", *a, "--json", "--state", "ambiguous"))] == [
        "refund:b"]
    assert {r["key"] for r in as_json(cli("ls", *a, "--json", "--run", "r1"))} == {
        "refund:a", "big:c"}
    assert {r["key"] for r in as_json(cli("ls", *a, "--json", "--type", "payment.refund"))} == {
        "refund:a", "refund:b"}
    assert {r["key"] for r in as_json(cli("ls", *a, "--json", "--group", "trip:1"))} == {
        "flight:trip_1", "hotel:trip_1"}
    assert as_json(cli("ls", *a, "--json", "--state", "denied")) == []


def test_ls_table_shows_states_and_the_approval_id_to_act_on(store: dict[str, Any]) -> None:
    result = cli("ls", *store["args"])
    assert result.exit_code == 0
    assert "refund:b" in result.stdout and "ambiguous" in result.stdout
    assert store["approval"] in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 100


def test_show_prints_record_history_and_vendor_key(store: dict[str, Any]) -> None:
    record = as_json(cli("show", "refund:a", *store["args"], "--json"))
    assert record["state"] == "committed" and record["result"] == {"refund_id": "re_1"}
    assert [h["to"] for h in record["history"]] == ["in_flight", "committed"]
    assert record["vendor_key"]["field"] == "Idempotency-Key"
    text = cli("show", "refund:a", *store["args"]).stdout
    assert "history" in text and "Idempotency-Key" in text and "re_1" in text


def test_resolve_settles_an_ambiguous_effect_once(store: dict[str, Any]) -> None:
    a = store["args"]
    result = cli("resolve", "refund:b", "--committed", "--result", '{"refund_id": "re_2"}',
                 "--note", "seen in the dashboard", "--by", "alice", *a)
    assert result.exit_code == 0 and "committed" in result.stdout
    record = store["gate"].get("refund:b")
    assert record.state is eg.State.COMMITTED and record.result == {"refund_id": "re_2"}
    assert record.history[-1].by == "alice" and record.history[-1].note == "seen in the dashboard"
    again = cli("resolve", "refund:b", "--failed", *a)
    assert again.exit_code == 1 and "terminal" in again.stderr
    assert store["gate"].get("refund:b").state is eg.State.COMMITTED


def test_approve_lets_the_exact_payload_run_and_cannot_be_reused(store: dict[str, Any]) -> None:
    a, approval = store["args"], store["approval"]
    self_approval = cli("approve", approval, "--by", "agent-1", *a)
    assert self_approval.exit_code == 1 and "own request" in self_approval.stderr
    done = as_json(cli("approve", approval, "--by", "alice", "--note", "ok", *a, "--json"))
    assert done["state"] == "approved" and done["decided_by"] == "alice"
    run = store["gate"].begin(effect_type="payment.big", key="big:c", payload={})
    assert run.decision is eg.Decision.EXECUTE
    again = cli("approve", approval, "--by", "alice", *a)
    assert again.exit_code == 1 and "not pending" in again.stderr


def test_deny_makes_the_effect_denied(store: dict[str, Any]) -> None:
    result = cli("deny", store["approval"], "--by", "bob", "--reason", "not today",
                 *store["args"])
    assert result.exit_code == 0 and "denied" in result.stdout
    d = store["gate"].begin(effect_type="payment.big", key="big:c", payload={})
    assert d.decision is eg.Decision.DENIED and "not today" in (d.reason or "")


def _gate_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    name = f"egcli_{uuid.uuid4().hex[:8]}"
    log = tmp_path / "undone.txt"
    (tmp_path / f"{name}.py").write_text(
        "import os\nimport effectgate as eg\n"
        "gate = eg.Gate(os.environ['EGT_URL'], namespace=os.environ['EGT_NS'])\n"
        "@gate.compensator('booking.*')\n"
        "def cancel(record, compensation):\n"
        "    with open(os.environ['EGT_LOG'], 'a') as f:\n"
        "        f.write(compensation['cancel'] + '\\n')\n"
        "    return {'cancelled': compensation['cancel']}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:gate", log


def test_unwind_runs_your_compensators_once_in_reverse(
        store: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref, log = _gate_module(tmp_path, monkeypatch)
    env = {"EGT_URL": store["url"], "EGT_NS": store["ns"], "EGT_LOG": str(log)}
    report = as_json(cli("unwind", "trip:1", "--gate", ref, "--json", env=env))
    assert [s["key"] for s in report["compensated"]] == ["hotel:trip_1", "flight:trip_1"]
    again = cli("unwind", "trip:1", "--gate", ref, env=env)
    assert again.exit_code == 0 and "compensated" in again.stdout
    assert log.read_text().split() == ["hotel", "flight"]
    sys.modules.pop(ref.split(":")[0])


def test_unwind_without_compensators_says_where_they_live(store: dict[str, Any]) -> None:
    result = cli("unwind", "trip:1", *store["args"])
    assert result.exit_code == 1
    assert "no compensator registered" in result.stdout and "--gate" in result.stdout


def test_prune_keeps_a_tombstone_that_refuses_a_duplicate(store: dict[str, Any]) -> None:
    out = as_json(cli("prune", "--older-than", "0s", *store["args"], "--json"))
    assert out["pruned"] >= 3
    record = as_json(cli("show", "refund:a", *store["args"], "--json"))
    assert record["result"] is None and record["pruned_at"]
    fresh = eg.Gate(store["url"], namespace=store["ns"], memo_size=0)
    d = fresh.begin(effect_type="payment.refund", key="refund:a", payload={"n": 1})
    fresh.close()
    assert d.decision is eg.Decision.DUPLICATE
    assert store["gate"].get("refund:b").state is eg.State.AMBIGUOUS  # never pruned


BAD_INPUT = [
    (["show"], "Missing argument"),
    (["show", "no:such:key"], "no effect with key"),
    (["show", "x" * 600], "at most 512"),
    (["resolve", "refund:a"], "--committed or --failed"),
    (["resolve", "no:such:key", "--failed"], "no effect with key"),
    (["resolve", "refund:a", "--committed", "--result", "{bad"], "not JSON"),
    (["resolve", "refund:a", "--failed", "--result", "{}"], "--result goes with --committed"),
    (["ls", "--state", "bogus"], "state must be one of"),
    (["ls", "--limit", "0"], "--limit"),
    (["ls", "--gate", "no_colon"], "MODULE:ATTRIBUTE"),
    (["ls", "--gate", "no_such_module_xyz:gate"], "cannot import"),
    (["approve", "apr_nope"], "no approval with id"),
    (["approve"], "Missing argument"),
    (["deny", "apr_nope"], "no approval with id"),
    (["unwind", "no:such:group"], "no effects in group"),
    (["prune"], "--older-than"),
    (["prune", "--older-than", "3x"], "not an age"),
    (["demo", "--agent", "bogus"], "bogus"),
    (["verify", "--only", "G0"], "unknown guarantee"),
    (["verify", "--only", ","], "unknown guarantee"),
    (["verify", "--bogus"], "No such option"),
]


@pytest.mark.parametrize("args, message", BAD_INPUT, ids=[" ".join(a)[:40] for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_without_traceback_and_exit_2(
        args: list[str], message: str, store_url: str, namespace: str) -> None:
    store = ["--url", store_url, "--namespace", namespace]
    extra = store if args[0] not in ("demo", "verify") else []
    if args[0] == "verify":
        extra = ["--url", store_url]
    result = cli(*args, *extra)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("effectgate: error:")
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["ls"], ["show", "k"], ["resolve", "k", "--failed"],
                                     ["approve", "a"], ["deny", "a"], ["unwind", "g"],
                                     ["prune", "--older-than", "1d"]])
def test_unreachable_store_exits_3(command: list[str]) -> None:
    result = cli(*command, "--url", UNREACHABLE)
    assert result.exit_code == 3
    assert result.stderr.startswith("effectgate: error: cannot open the store")


def test_a_malformed_url_is_bad_input() -> None:
    result = cli("ls", "--url", "mysql://x/y")
    assert result.exit_code == 2 and "sqlite and postgresql" in result.stderr


def run_entry_point(*args: str, env: dict[str, str] | None = None,
                    guard_network: bool = False) -> subprocess.CompletedProcess[str]:
    """``effectgate ...`` in a fresh interpreter; optionally with every socket connect failing."""
    prelude = ("import socket\n"
               "def _offline(*a, **k): raise RuntimeError('network access attempted')\n"
               "socket.socket.connect = _offline\nsocket.create_connection = _offline\n"
               if guard_network else "")
    code = prelude + "import sys\nfrom effectgate.cli import main\nmain(prog_name='effectgate')"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_entry_point_help_lists_every_command_and_the_exit_codes() -> None:
    proc = subprocess.run([sys.executable, "-m", "effectgate.cli", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for command in ("demo", "verify", "ls", "show", "resolve", "approve", "deny", "unwind",
                    "prune"):
        assert f"  {command} " in proc.stdout
    for command in ("demo", "verify", "ls", "show", "resolve", "approve", "deny", "unwind",
                    "prune"):
        assert "Exit codes: 0" in cli(command, "--help").stdout.replace("\n", " ")


def test_bad_input_through_the_real_script_is_one_line(tmp_path: Path) -> None:
    proc = run_entry_point("show", "nope", "--url", f"sqlite:///{tmp_path / 'e.db'}")
    assert proc.returncode == 2
    assert proc.stderr == "effectgate: error: no effect with key 'nope'\n"


@pytest.mark.parametrize("agent", ["decorator", "auto"])
def test_demo_runs_offline_and_each_refund_reaches_the_vendor_once(agent: str) -> None:
    proc = run_entry_point("demo", "--json", "--agent", agent, guard_network=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    refunds = [c for c in out["vendor_log"] if c.startswith("refund ")]
    assert refunds == ["refund txn_1001", "refund txn_1002", "refund txn_1003"]
    assert out["agent_calls"] == 12 and out["vendor_calls"] == 8
    assert [s["vendor_calls"] for s in out["scenes"]] == [1, 1, 1, 0, 5]
    said = [ln["text"] for ln in out["lines"] if ln["actor"] == "gate"]
    assert any("blocked" in t or "OUTCOME UNKNOWN" in t for t in said)
    assert any("ceiling" in t for t in said)
    if agent == "decorator":
        assert out["agent"] == "plain decorator"
    else:
        expected = "LangChain" if _langchain_agent_available() else "plain decorator"
        assert expected in out["agent"]


def _langchain_agent_available() -> bool:
    try:
        import effectgate.demo_langchain  # noqa: F401
    except ImportError:
        return False
    return True


def test_demo_reads_well_in_80_columns() -> None:
    proc = run_entry_point("demo", "--agent", "decorator", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    for title in ("The agent retries a refund", "A reply is lost", "waits for a human",
                  "A spend ceiling", "A trip is unwound", "What reached the vendor"):
        assert any(title in line for line in lines), title
    assert "each of 3 refunds reached the vendor exactly once" in proc.stdout


def test_demo_on_a_given_store_uses_a_fresh_namespace_each_time(store_url: str) -> None:
    first = as_json(cli("demo", "--url", store_url, "--agent", "decorator", "--json"))
    second = as_json(cli("demo", "--url", store_url, "--agent", "decorator", "--json"))
    assert first["namespace"] != second["namespace"]
    assert first["vendor_calls"] == second["vendor_calls"] == 8
