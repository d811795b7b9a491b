"""The ``effectgate`` command line through its real entry point: the operator commands on both
backends (click's runner on ``effectgate.cli.main``), output at 80 columns that never cuts an
identifier and prints hints you can copy, agent-supplied text shown escaped, read-only commands
that never create a store, bad input and conflicting flags (one line, exit 2, store unchanged),
and prune's dry run and confirmation."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, text

import effectgate as eg
from effectgate.cli import main
from effectgate.testing import lapse_leases

from .conftest import PG_URL, require_postgres, snapshot

POLICY = {"effects": {"payment.big": {"approval": "always"}}}
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/none"
LONG_KEY = "reallocate:flight:trip_2024_summer_holiday_with_the_whole_family_abroad"
HOSTILE = "\x1b[2J\x1b]0;owned\x07\u202e\u200b\x9b31m"
# U+2028 in a history field (agent id, error, note) breaks the store's history framing today
# (issue 11, the lead's); here it goes only where no history line carries it.
SEPARATOR = "\u2028\x85"
RAW = ("\x1b", "\x07", "\u202e", "\u200b", "\x9b", "\u2028", "\x85")


def cli(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, input=input, catch_exceptions=False)


@pytest.fixture
def store(make_gate: Any, store_url: str, namespace: str) -> dict[str, Any]:
    """A namespace with a committed, an ambiguous, a pending-approval effect, a saga, an effect
    whose key is longer than a column, and one whose agent-supplied text is hostile."""
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
    d = gate.begin(effect_type="booking.flight", key=LONG_KEY, payload={},
                   run_id="run_2024_summer_holiday_family")
    gate.report(d, "committed")
    d = gate.begin(effect_type="email.send", key="email:hostile",
                   payload={}, run_id="r" + HOSTILE + SEPARATOR, agent_id="a" + HOSTILE)
    gate.report(d, "ambiguous", error="smtp said" + HOSTILE)
    # A gate refuses such an effect type now; a store written before that may hold one.
    with gate.store.engine.begin() as conn:
        conn.execute(text("UPDATE effectgate_effects SET effect_type = :t WHERE namespace = :ns "
                          "AND key = 'email:hostile'"),
                     {"t": "email.send" + HOSTILE + SEPARATOR, "ns": namespace})
    return {"url": store_url, "ns": namespace, "gate": gate, "approval": pending.approval_id,
            "args": ["--url", store_url, "--namespace", namespace]}


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_ls_filters_by_state_in_any_case_type_run_and_group(store: dict[str, Any]) -> None:
    a = store["args"]
    everything = {r["key"]: r["state"] for r in as_json(cli("ls", *a, "--json"))}
    assert {k: v for k, v in everything.items() if k != "email:hostile"} == {
        "refund:a": "committed", "refund:b": "ambiguous", "big:c": "pending_approval",
        "flight:trip_1": "committed", "hotel:trip_1": "committed", LONG_KEY: "committed"}
    for spelling in ("ambiguous", "AMBIGUOUS", "Ambiguous"):
        assert {r["key"] for r in as_json(cli("ls", *a, "--json", "--state", spelling))} == {
            "refund:b", "email:hostile"}
    assert [r["key"] for r in as_json(cli("ls", *a, "--json", "--state", "Pending-Approval"))
            ] == ["big:c"]
    assert {r["key"] for r in as_json(cli("ls", *a, "--json", "--run", "r1"))} == {
        "refund:a", "big:c"}
    assert {r["key"] for r in as_json(cli("ls", *a, "--json", "--type", "payment.refund"))} == {
        "refund:a", "refund:b"}
    assert {r["key"] for r in as_json(cli("ls", *a, "--json", "--group", "trip:1"))} == {
        "flight:trip_1", "hotel:trip_1"}
    assert as_json(cli("ls", *a, "--json", "--state", "denied")) == []


def _check_80_columns(output: str, identifiers: list[str]) -> None:
    """Every identifier appears whole on one line; a line over 80 columns is one identifier
    (alone or after its label, as in ``run <id>``) or one command, never text that could have
    been wrapped."""
    lines = output.splitlines()
    for ident in identifiers:
        assert any(ident in line for line in lines), f"{ident!r} cut or missing:\n{output}"
    for line in lines:
        if len(line) > 80:
            body = line.strip()
            label, _, ident = body.partition(" ")
            assert " " not in body or body.startswith("effectgate ") or (
                label in ("run", "agent") and " " not in ident), line


def test_ls_at_80_columns_never_cuts_a_key_or_an_id(store: dict[str, Any]) -> None:
    result = cli("ls", *store["args"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    _check_80_columns(result.stdout, ["refund:a", "refund:b", LONG_KEY, "big:c",
                                      "run_2024_summer_holiday_family", "payment.refund",
                                      store["approval"]])
    assert "AMBIGUOUS" in result.stdout and "PENDING_APPROVAL" in result.stdout


def test_ls_is_a_table_when_it_fits(store: dict[str, Any]) -> None:
    result = cli("ls", *store["args"], "--type", "payment.refund", env={"COLUMNS": "100"})
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["key", "state", "type", "try", "run", "updated", "UTC"]
    assert lines[1].startswith("refund:b ") and "AMBIGUOUS" in lines[1]


def test_an_approved_effect_refused_for_spend_says_it_is_approved_and_what_runs_it(
        make_gate: Any, store_url: str, namespace: str) -> None:
    """Approved, then refused by a spend ceiling when its call came: it still waits, approved.
    ``show`` says who approved it (its reason field is still the request's) and that the next
    call runs it only if the ceilings have room then; so does ``ls``'s note."""
    gate = make_gate(policy={"effects": {"pay.*": {
        "approval": "always", "budget": {"per_effect_type_micros": 1_000}}}})
    asks = [gate.begin(effect_type="pay.card", key=f"pay:{n}", payload={"n": n},
                       estimated_cost_micros=800) for n in (1, 2)]
    for d in asks:
        gate.approve(d.approval_id, by="bob")
    assert gate.begin(effect_type="pay.card", key="pay:1", payload={"n": 1},
                      estimated_cost_micros=800).decision is eg.Decision.EXECUTE
    refused = gate.begin(effect_type="pay.card", key="pay:2", payload={"n": 2},
                         estimated_cost_micros=800)
    assert refused.decision is eg.Decision.DENIED and "$0.001" in (refused.reason or "")
    where = ["--url", store_url, "--namespace", namespace]
    shown = " ".join(cli("show", "pay:2", *where, env={"COLUMNS": "200"}).stdout.split())
    assert f"approval {asks[1].approval_id} approved" in shown, shown
    assert "by bob" in shown and "if the policy's spend ceilings have room for it then" in shown
    listed = " ".join(cli("ls", *where, env={"COLUMNS": "200"}).stdout.split())
    assert ("pay:2: approved by bob; the next call with the same arguments runs it, if the "
            "policy's spend ceilings have room for it then") in listed, listed


def test_ls_plain_is_one_tab_separated_line_per_effect(store: dict[str, Any]) -> None:
    result = cli("ls", *store["args"], "--plain", "--type", "payment.refund")
    assert result.exit_code == 0
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        ("refund:b", "ambiguous", "payment.refund", "1", "r2"),
        ("refund:a", "committed", "payment.refund", "1", "r1")]


def test_the_approval_hint_is_a_command_you_can_copy_and_it_goes_once_approved(
        store: dict[str, Any]) -> None:
    out = cli("ls", *store["args"], env={"COLUMNS": "80"}).stdout
    commands = [line.strip() for line in out.splitlines()
                if line.strip().startswith("effectgate approve")]
    assert len(commands) == 1 and store["approval"] in commands[0]
    copied = shlex.split(commands[0])[1:]
    done = cli(*copied, "--by", "alice")
    assert done.exit_code == 0, done.output
    assert store["gate"].list_approvals(state=None)[0].state == "approved"
    after = cli("ls", *store["args"]).stdout
    assert "effectgate approve" not in after and "big:c: approved by alice" in after
    store["gate"].begin(effect_type="payment.big", key="big:c", payload={})  # consumes it
    assert "effectgate approve" not in cli("ls", *store["args"]).stdout


def test_show_prints_the_arguments_an_approver_decides_on(store: dict[str, Any]) -> None:
    """An effect waiting for approval shows what runs if it is approved (hostile text
    escaped); once decided, the arguments are gone from the store and from the output."""
    gate = store["gate"]
    d = gate.begin(effect_type="payment.big", key="big:args", agent_id="agent-1",
                   payload={"amount_cents": 90_000, "to": "acct_7" + HOSTILE})
    assert d.decision is eg.Decision.APPROVAL_REQUIRED
    out = cli("show", "big:args", *store["args"], env={"COLUMNS": "100"}).stdout
    assert f"waiting for approval {d.approval_id}" in out and "requested by agent-1" in out
    assert "arguments that run if it is approved" in out
    assert '"amount_cents": 90000' in out and '"to": "acct_7' in out
    assert not any(ch in out for ch in RAW)
    assert "waiting for approval" not in cli("show", "refund:a", *store["args"]).stdout
    gate.approve(d.approval_id, by="alice")
    after = cli("show", "big:args", *store["args"]).stdout
    assert "waiting for approval" not in after and "90000" not in after


def test_show_prints_record_history_and_vendor_key(store: dict[str, Any]) -> None:
    record = as_json(cli("show", "refund:a", *store["args"], "--json"))
    assert record["state"] == "committed" and record["result"] == {"refund_id": "re_1"}
    assert [h["to"] for h in record["history"]] == ["in_flight", "committed"]
    assert record["vendor_key"]["field"] == "Idempotency-Key"
    result = cli("show", "refund:a", *store["args"], env={"COLUMNS": "80"})
    _check_80_columns(result.stdout, [record["payload_hash"], record["vendor_key"]["value"],
                                      "Idempotency-Key", "re_1"])
    assert "IN_FLIGHT → COMMITTED" in result.stdout
    plain = dict(line.split("\t", 1) for line in cli(
        "show", "refund:a", *store["args"], "--plain").stdout.splitlines()
        if not line.startswith("history"))
    assert plain["state"] == "committed" and plain["vendor_key.field"] == "Idempotency-Key"
    long = cli("show", LONG_KEY, *store["args"], env={"COLUMNS": "80"})
    _check_80_columns(long.stdout, [LONG_KEY, "run_2024_summer_holiday_family"])


@pytest.mark.parametrize("command", [["ls"], ["ls", "--plain"], ["ls", "--json"],
                                     ["show", "email:hostile"],
                                     ["show", "email:hostile", "--plain"],
                                     ["show", "email:hostile", "--json"],
                                     ["resolve", "email:hostile", "--failed",
                                      "--note", "ok" + HOSTILE]])
def test_agent_supplied_text_never_reaches_the_terminal_raw(
        store: dict[str, Any], command: list[str]) -> None:
    result = cli(*command, *store["args"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    for ch in RAW:
        assert ch not in result.output, (ch, result.output)
    if "--json" in command:
        body = json.loads(result.stdout)
        rows = body if isinstance(body, list) else [body]
        hostile = next(r for r in rows if r["key"] == "email:hostile")
        assert hostile["run_id"] == "r" + HOSTILE + SEPARATOR  # escaped in the text, intact as JSON
    elif command[0] != "resolve":
        assert "⟨U+001B⟩[2J" in result.output and "⟨U+202E⟩⟨U+200B⟩" in result.output


def test_the_cli_shows_bidi_text_with_the_kernels_one_rendering(store: dict[str, Any]) -> None:
    """A run id drawn raw as ``\u202e2345-6789`` reads 9876-5432: ``ls`` and ``show`` print
    it as the console and webhooks do (effectgate.redact.visible), on every output."""
    from effectgate.cli._safe import plain
    from effectgate.redact import visible

    gate = store["gate"]
    run = "acct\u202e2345-6789\u202c"
    d = gate.begin(effect_type="payment.refund", key="refund:bidi", payload={}, run_id=run,
                   agent_id="a\u2066b\u2069")
    gate.report(d, "committed")
    shown = "acct⟨U+202E⟩2345-6789⟨U+202C⟩"
    assert plain(run) == visible(run) == shown
    for command in (["ls"], ["ls", "--plain"], ["show", "refund:bidi"],
                    ["show", "refund:bidi", "--plain"]):
        result = cli(*command, *store["args"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert shown in result.output, (command, result.output)
        assert "\u202e" not in result.output and "\u2066" not in result.output
    assert "a⟨U+2066⟩b⟨U+2069⟩" in cli("show", "refund:bidi", *store["args"]).output


def test_errors_escape_what_the_caller_typed(store: dict[str, Any]) -> None:
    result = cli("show", "no:such\x1b[2J", *store["args"])
    assert result.exit_code == 2
    assert "\x1b" not in result.stderr and result.stderr.count("\n") == 1


def test_resolve_settles_an_ambiguous_effect_once(store: dict[str, Any]) -> None:
    a = store["args"]
    result = cli("resolve", "refund:b", "--committed", "--result", '{"refund_id": "re_2"}',
                 "--note", "seen in the dashboard", "--by", "alice", *a)
    assert result.exit_code == 0 and "COMMITTED" in result.stdout
    record = store["gate"].get("refund:b")
    assert record.state is eg.State.COMMITTED and record.result == {"refund_id": "re_2"}
    assert record.history[-1].by == "alice" and record.history[-1].note == "seen in the dashboard"
    again = cli("resolve", "refund:b", "--failed", *a)
    assert again.exit_code == 1 and "terminal" in again.stderr
    assert store["gate"].get("refund:b").state is eg.State.COMMITTED


def test_resolve_refuses_a_live_lease_unless_forced(store: dict[str, Any]) -> None:
    gate = store["gate"]
    gate.begin(effect_type="payment.refund", key="refund:live", payload={}, lease_seconds=600)
    refused = cli("resolve", "refund:live", "--failed", *store["args"])
    assert refused.exit_code == 1 and "lease is live" in refused.stderr
    assert gate.get("refund:live").state is eg.State.IN_FLIGHT
    forced = cli("resolve", "refund:live", "--failed", "--force", "--yes", "--by", "bob",
                 *store["args"])
    assert forced.exit_code == 0, forced.output
    assert gate.get("refund:live").state is eg.State.FAILED


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
    assert result.exit_code == 0 and "DENIED" in result.stdout
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
    unasked = cli("unwind", "trip:1", "--gate", ref, env=env)  # no terminal to ask on
    assert unasked.exit_code == 2 and "--yes" in unasked.stderr and not log.exists()
    report = as_json(cli("unwind", "trip:1", "--gate", ref, "--yes", "--json", env=env))
    assert [s["key"] for s in report["compensated"]] == ["hotel:trip_1", "flight:trip_1"]
    again = cli("unwind", "trip:1", "--gate", ref, env={**env, "COLUMNS": "80"})  # none to run
    assert again.exit_code == 0 and "compensated" in again.stdout
    _check_80_columns(again.stdout, ["hotel:trip_1", "flight:trip_1"])
    assert log.read_text().split() == ["hotel", "flight"]
    module_name, _, attribute = ref.partition(":")
    getattr(sys.modules.pop(module_name), attribute).close()  # the CLI leaves your gate open


def test_unwind_without_compensators_says_where_they_live(store: dict[str, Any]) -> None:
    result = cli("unwind", "trip:1", *store["args"])
    assert result.exit_code == 1
    assert "no compensator registered" in result.stdout and "--gate" in result.stdout


# -- prune ---------------------------------------------------------------------------------------


def test_prune_dry_run_counts_and_writes_nothing(store: dict[str, Any]) -> None:
    before = snapshot(store["gate"])
    out = as_json(cli("prune", "--older-than", "0s", "--dry-run", *store["args"], "--json"))
    assert out["would_prune"] >= 4 and out["pruned"] == 0 and out["dry_run"] is True
    text_out = cli("prune", "--older-than", "0s", "--dry-run", *store["args"]).stdout
    assert f"would prune {out['would_prune']} effects" in text_out
    assert snapshot(store["gate"]) == before


def test_prune_asks_first_and_a_script_must_say_yes(store: dict[str, Any]) -> None:
    before = snapshot(store["gate"])
    unasked = cli("prune", "--older-than", "0s", *store["args"])  # no terminal, no answer
    assert unasked.exit_code == 2 and "--yes" in unasked.stderr
    declined = cli("prune", "--older-than", "0s", *store["args"], input="n\n")
    assert declined.exit_code == 1 and "nothing pruned" in declined.stderr
    assert snapshot(store["gate"]) == before
    agreed = cli("prune", "--older-than", "0s", *store["args"], input="y\n")
    assert agreed.exit_code == 0 and "pruned" in agreed.stdout
    assert "prune" in agreed.stderr and "?" in agreed.stderr  # the question, on stderr
    assert store["gate"].get("refund:a").pruned_at is not None


def test_prune_keeps_a_tombstone_that_refuses_a_duplicate(store: dict[str, Any]) -> None:
    out = as_json(cli("prune", "--older-than", "0s", "--yes", *store["args"], "--json"))
    assert out["pruned"] >= 4
    record = as_json(cli("show", "refund:a", *store["args"], "--json"))
    assert record["result"] is None and record["pruned_at"]
    fresh = eg.Gate(store["url"], namespace=store["ns"], memo_size=0)
    d = fresh.begin(effect_type="payment.refund", key="refund:a", payload={"n": 1})
    fresh.close()
    assert d.decision is eg.Decision.DUPLICATE
    assert store["gate"].get("refund:b").state is eg.State.AMBIGUOUS  # never pruned


# -- bad input -----------------------------------------------------------------------------------

BAD_INPUT = [
    (["show"], "Missing argument"),
    (["show", "no:such:key"], "no effect with key"),
    (["show", "x" * 600], "at most 512"),
    (["resolve", "refund:a"], "--committed or --failed"),
    (["resolve", "no:such:key", "--failed"], "no effect with key"),
    (["resolve", "refund:a", "--committed", "--result", "{bad"], "not JSON"),
    (["resolve", "refund:b", "--committed", "--failed"], "exclude each other"),
    (["resolve", "refund:b", "--failed", "--committed"], "exclude each other"),
    (["resolve", "refund:b", "--failed", "--result", "{}"], "exclude each other"),
    (["resolve", "refund:b", "--committed", "--json", "--plain"], "exclude each other"),
    (["ls", "--json", "--plain"], "exclude each other"),
    (["show", "refund:a", "--plain", "--json"], "exclude each other"),
    (["ls", "--state", "bogus"], "state must be one of"),
    (["ls", "--state", ""], "state must be one of"),
    (["ls", "--state", "AMBIGUOUS\x1b"], "state must be one of"),
    (["ls", "--limit", "0"], "--limit"),
    (["ls", "--gate", "no_colon"], "MODULE:ATTRIBUTE"),
    (["ls", "--gate", "no_such_module_xyz:gate"], "cannot import"),
    (["approve", "apr_nope"], "no approval with id"),
    (["approve"], "Missing argument"),
    (["deny", "apr_nope"], "no approval with id"),
    (["unwind", "no:such:group"], "no effects in group"),
    (["prune"], "--older-than"),
    (["prune", "--older-than", "3x"], "not an age"),
    (["prune", "--older-than", "-1d"], "not an age"),
    (["prune", "--older-than", "1.5d"], "not an age"),
    (["prune", "--older-than", "d"], "not an age"),
    (["prune", "--older-than", "99999999999w"], "ten thousand years"),
    (["prune", "--older-than", "1d", "--json", "--plain"], "exclude each other"),
    (["demo", "--agent", "bogus"], "bogus"),
    (["verify", "--only", "G0"], "unknown guarantee"),
    (["verify", "--only", ","], "unknown guarantee"),
    (["verify", "--bogus"], "No such option"),
]


@pytest.mark.parametrize("args, message", BAD_INPUT, ids=[" ".join(a)[:40] for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
        args: list[str], message: str, store: dict[str, Any]) -> None:
    extra = store["args"] if args[0] not in ("demo", "verify") and "--gate" not in args else []
    if args[0] == "verify":
        extra = ["--url", store["url"]]
    before = snapshot(store["gate"])
    result = cli(*args, *extra)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("effectgate: error:")
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert "Traceback" not in result.output
    assert snapshot(store["gate"]) == before


def test_gate_and_url_exclude_each_other(store: dict[str, Any], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ref, log = _gate_module(tmp_path, monkeypatch)
    env = {"EGT_URL": store["url"], "EGT_NS": store["ns"], "EGT_LOG": str(log)}
    before = snapshot(store["gate"])
    result = cli("unwind", "trip:1", "--gate", ref, "--url", store["url"], env=env)
    assert result.exit_code == 2 and "exclude each other" in result.stderr
    assert snapshot(store["gate"]) == before and not log.exists()
    sys.modules.pop(ref.split(":")[0], None)


@pytest.mark.parametrize("command", [["ls"], ["show", "k"], ["resolve", "k", "--failed"],
                                     ["approve", "a"], ["deny", "a"], ["unwind", "g"],
                                     ["prune", "--older-than", "1d", "--yes"],
                                     ["prune", "--older-than", "1d", "--dry-run"]])
def test_unreachable_store_exits_3(command: list[str]) -> None:
    result = cli(*command, "--url", UNREACHABLE)
    assert result.exit_code == 3
    assert result.stderr.startswith("effectgate: error: cannot open the store")


@pytest.mark.parametrize("command", [["ls"], ["show", "refund:a"], ["ls", "--json"],
                                     ["prune", "--older-than", "1d", "--dry-run"]])
def test_reading_a_store_that_does_not_exist_is_an_error_and_creates_nothing(
        backend: str, tmp_path: Path, command: list[str]) -> None:
    if backend == "sqlite":
        path = tmp_path / "typo" / "efects.db"
        result = cli(*command, "--url", f"sqlite:///{path}")
        assert not path.exists() and not path.parent.exists()
    else:  # a database that exists and holds no effectgate store
        database = f"eg_empty_{uuid.uuid4().hex[:10]}"
        engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {database}"))
        scratch = create_engine(PG_URL.rsplit("/", 1)[0] + "/" + database)
        try:
            result = cli(*command, "--url", PG_URL.rsplit("/", 1)[0] + "/" + database)
            with scratch.connect() as conn:
                made = conn.execute(text(
                    "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = "
                    "c.relnamespace WHERE n.nspname = 'public'")).scalar()
                funcs = conn.execute(text(
                    "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = "
                    "p.pronamespace WHERE n.nspname = 'public'")).scalar()
        finally:
            scratch.dispose()
            with engine.connect() as conn:
                conn.execute(text(f"DROP DATABASE {database} WITH (FORCE)"))
            engine.dispose()
        assert made == 0 and funcs == 0
    assert result.exit_code == 3, result.output
    assert "no effectgate store at" in result.stderr
    assert "no effects match" not in result.output


def test_a_postgres_url_in_the_spelling_hosts_print_is_accepted(namespace: str) -> None:
    """(Postgres only.)"""
    require_postgres()
    with eg.Gate(PG_URL, namespace=namespace) as gate:
        gate.report(gate.begin(effect_type="t", key="refund:a", payload={}), "committed")
    for prefix in ("postgres://", "postgresql://"):
        url = prefix + PG_URL.split("://", 1)[1]
        rows = as_json(cli("ls", "--url", url, "--namespace", namespace, "--json"))
        assert [r["key"] for r in rows] == ["refund:a"]


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
    eg.Gate(f"sqlite:///{tmp_path / 'e.db'}").close()
    proc = run_entry_point("show", "nope", "--url", f"sqlite:///{tmp_path / 'e.db'}")
    assert proc.returncode == 2
    assert proc.stderr == "effectgate: error: no effect with key 'nope'\n"


# -- the README's command lines ------------------------------------------------------------------

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_commands() -> list[list[str]]:
    """Every ``effectgate ...`` line of the README's bash blocks and inline code."""
    body = README.read_text(encoding="utf-8")
    found: list[list[str]] = []
    for block in re.findall(r"```bash\n(.*?)```", body, re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("effectgate "):
                found.append(shlex.split(line))
    from effectgate.cli import COMMANDS

    for inline in re.findall(r"`(effectgate [^`]+)`", body):
        if inline.split()[1] in COMMANDS:  # not prose such as `effectgate supports ...`
            found.append(shlex.split(inline))
    return found


def test_every_option_the_readme_shows_exists_on_its_command() -> None:
    import click

    from effectgate.cli import COMMANDS, LazyGroup

    commands = readme_commands()
    assert len(commands) >= 10
    group = main
    assert isinstance(group, LazyGroup)
    for argv in commands:
        ctx = click.Context(group)
        name = argv[1]
        assert name in COMMANDS, argv
        command = group.get_command(ctx, name)
        assert command is not None
        rest = argv[2:]
        if isinstance(command, click.Group):
            command = command.get_command(ctx, rest[0]) if rest else command
            rest = rest[1:]
        known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
        for word in rest:
            if word.startswith("--"):
                assert word.split("=", 1)[0] in known, (argv, word)


def test_the_cli_records_what_operators_do_in_the_audit(store: dict[str, Any]) -> None:
    from effectgate.audit import list_actions

    a, gate = store["args"], store["gate"]
    assert cli("resolve", "refund:b", "--failed", "--note", "none seen", "--by", "alice",
               *a).exit_code == 0
    assert cli("approve", store["approval"], "--by", "bob", *a).exit_code == 0
    assert cli("unwind", "trip:1", "--by", "carol", *a).exit_code == 1  # no compensators here
    assert cli("principals", "add", "ops-1", "--role", "operator", "--by", "dan",
               *a).exit_code == 0
    assert cli("principals", "revoke", "ops-1", "--by", "dan", *a).exit_code == 0
    assert cli("resolve", "refund:a", "--failed", "--by", "eve", *a).exit_code == 1  # refused
    got = [(e.actor, e.action, e.subject, e.via, e.detail) for e in list_actions(gate)]
    assert got == [
        ("dan", "principal.revoke", "ops-1", "cli", "role operator"),
        ("dan", "principal.add", "ops-1", "cli", "role operator"),
        ("carol", "unwind", "trip:1", "cli", "2 failed"),
        ("bob", "approve", "big:c", "cli", f"approval {store['approval']}"),
        ("alice", "resolve", "refund:b", "cli", "outcome failed; note: none seen"),
    ]  # the refused resolve is not there


def test_an_act_with_the_longest_note_it_takes_is_still_audited(store: dict[str, Any]) -> None:
    """A note of the 2,000 characters an act accepts, with the audit's own words around it,
    is audited: an operator could otherwise keep a verdict out of the audit on purpose."""
    from effectgate.audit import list_actions

    a, gate = store["args"], store["gate"]
    note = "x" * 2000
    done = cli("resolve", "refund:b", "--failed", "--note", note, "--by", "mallory", *a)
    assert done.exit_code == 0 and "audit" not in done.stderr, done.stderr
    [entry] = list_actions(gate, subject="refund:b")
    assert entry.actor == "mallory" and (entry.detail or "").startswith(
        "outcome failed; note: xxxxxxxx")


def test_a_result_nested_too_deeply_is_one_line_and_changes_nothing(
        store: dict[str, Any]) -> None:
    gate = store["gate"]
    before = snapshot(gate)
    deep = cli("resolve", "refund:b", "--committed", "--result", "[" * 100_000, *store["args"])
    assert deep.exit_code == 2 and "Traceback" not in deep.output + deep.stderr
    assert "nested too deeply" in deep.stderr
    assert snapshot(gate) == before


@pytest.mark.parametrize("key", ["refund:txn\\", "refund:txn\\\\", "refund:\\[b]x\\"])
def test_a_key_with_backslashes_is_shown_as_stored_so_a_copy_works(
        make_gate: Any, store_url: str, namespace: str, key: str) -> None:
    gate = make_gate()
    d = gate.begin(effect_type="t.x", key=key, payload={}, run_id="run\\")
    gate.report(d, "ambiguous", error="lost\\")
    a = ["--url", store_url, "--namespace", namespace]
    table = cli("ls", *a, env={"COLUMNS": "200"}).stdout.splitlines()
    assert table[1].split()[0] == key and table[1].split()[-3] == "run\\", table
    lines = cli("ls", *a, env={"COLUMNS": "40"}).stdout.splitlines()  # one key line each
    assert lines[0] == key and "run run\\  " in lines[1] + "  ", lines
    shown = cli("show", key, *a, env={"COLUMNS": "200"}).stdout.splitlines()
    assert f"key{' ' * 19}{key}" in shown and f"error{' ' * 17}lost\\" in shown, shown
    copied = table[1].split()[0]
    done = cli("resolve", copied, "--failed", "--note", "checked\\", "--by", "op\\", *a)
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"resolved {key}: FAILED by op\\"), done.stdout
    assert gate.get(key).state is eg.State.FAILED
    history = cli("show", key, *a, env={"COLUMNS": "200"}).stdout
    assert "by op\\\n" in history and "checked\\\n" in history, history
