"""``effectgate demo``: both passes of every scene, counted at the vendor — the without/with
figures asserted, offline (its speed is measured, not asserted), readable at 80 columns with
hints you can copy, and the LangChain agent told exactly what the plain loop is told."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest
from click.testing import CliRunner

from effectgate.cli import main

from .test_cli import run_entry_point

WITHOUT = {"refunds": 6, "duplicate_refunds": 2, "refunded_cents": 118_000,
           "unapproved_refunds": 1, "over_ceiling_cents": 18_000, "bookings_left": 2,
           "cancellations": 0, "vendor_calls": 9}
WITH = {"refunds": 3, "duplicate_refunds": 0, "refunded_cents": 81_500,
        "unapproved_refunds": 0, "over_ceiling_cents": 0, "bookings_left": 0,
        "cancellations": 2, "vendor_calls": 8}


def _langchain_agent_available() -> bool:
    try:
        import effectgate.demo.langchain  # noqa: F401
    except ImportError:
        return False
    return True


def run_json(agent: str) -> dict[str, Any]:
    proc = run_entry_point("demo", "--json", "--agent", agent, guard_network=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module", params=["plain", "auto"])
def played(request: pytest.FixtureRequest) -> dict[str, Any]:
    return run_json(request.param)


def test_without_and_with_the_gate_counted_at_the_vendor(played: dict[str, Any]) -> None:
    for name, value in WITHOUT.items():
        assert played["without"][name] == value, name
    for name, value in WITH.items():
        assert played["with"][name] == value, name
    assert [s["without"]["vendor_calls"] for s in played["scenes"]] == [2, 2, 1, 1, 3]
    assert [s["with"]["vendor_calls"] for s in played["scenes"]] == [1, 1, 1, 0, 5]
    # the only vendor calls the gate adds are the cancellations that undo the trip
    assert played["with"]["vendor_calls"] - played["with"]["cancellations"] < (
        played["without"]["vendor_calls"])


def test_the_store_s_state_names_are_shown(played: dict[str, Any]) -> None:
    states = set(played["with"]["states"])
    assert {"COMMITTED", "AMBIGUOUS", "PENDING_APPROVAL", "DENIED", "FAILED"} <= states
    gate_lines = [ln["text"] for ln in played["lines"] if ln["actor"] == "gate"]
    assert any(t.startswith("blocked → state AMBIGUOUS") for t in gate_lines)
    assert played["without"]["states"] == []


def test_the_model_is_told_not_to_retry_and_to_tell_the_user(played: dict[str, Any]) -> None:
    told = [ln["text"] for ln in played["lines"] if ln["actor"] == "model"]
    unknown = [t for t in told if "OUTCOME UNKNOWN" in t]
    assert len(unknown) == 2
    for text in unknown:
        assert "Do not call this tool again" in text and "Tell the user" in text


def test_the_demo_is_offline_and_says_how_long_it_took(played: dict[str, Any]) -> None:
    """Offline: ``played`` ran with the network guarded (a connection attempt fails the run).
    Its speed is measured, not asserted (about 2 s; ``time effectgate demo``): the bound here
    only catches a hang, whatever else a shared machine is doing."""
    assert 0 < played["seconds"] < 60, played["seconds"]


@pytest.mark.skipif(not _langchain_agent_available(), reason="needs the langchain extra")
def test_the_langchain_agent_is_told_exactly_what_the_plain_loop_is_told() -> None:
    def told_with_the_gate(body: dict[str, Any]) -> list[str]:
        out, in_pass = [], False
        for ln in body["lines"]:
            if ln["actor"] == "pass":
                in_pass = ln["text"] == "with the gate"
            elif in_pass and ln["actor"] in ("model", "gate"):
                out.append(re.sub(r"apr_[0-9a-f]+", "apr_ID", ln["text"]))
        return out

    plain, chain = run_json("plain"), run_json("langchain")
    assert "LangChain" in chain["agent"] and "LangChain" not in plain["agent"]
    assert told_with_the_gate(chain) == told_with_the_gate(plain)
    assert len(told_with_the_gate(plain)) >= 15
    assert chain["with"] == plain["with"] and chain["without"] == plain["without"]


def test_the_demo_reads_at_80_columns() -> None:
    proc = run_entry_point("demo", "--agent", "plain", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    for title in ("A retried refund", "A lost reply", "A large refund", "An overspend",
                  "A half-booked trip", "without the gate", "with the gate",
                  "What happened at the vendor"):
        assert any(title in line for line in lines), title
    commands = [line.split("operator", 1)[1].strip() for line in lines
                if line.strip().startswith("operator") and "effectgate " in line]
    assert len(commands) == 4
    for command in commands:  # every command shown is whole on its line
        argv = shlex.split(command.split("   (")[0])
        assert argv[0] == "effectgate" and argv[1] in ("resolve", "approve", "unwind")
        assert len(argv) >= 3


def test_on_a_given_store_each_run_is_a_fresh_namespace_and_the_hint_works(
        store_url: str) -> None:
    runner = CliRunner()
    first = runner.invoke(main, ["demo", "--url", store_url, "--agent", "plain", "--json"])
    second = runner.invoke(main, ["demo", "--url", store_url, "--agent", "plain"],
                           env={"COLUMNS": "80"})
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    body = json.loads(first.stdout)
    assert body["with"]["vendor_calls"] == 8
    hint = [line.strip() for line in second.stdout.splitlines()
            if line.strip().startswith("effectgate ls")]
    assert len(hint) == 1 and body["namespace"] not in hint[0]
    listed = runner.invoke(main, [*shlex.split(hint[0])[1:], "--json"])
    assert listed.exit_code == 0, listed.output
    keys = {r["key"] for r in json.loads(listed.stdout)}
    assert {"refund:txn_1001", "refund:txn_1002", "flight:trip_77",
            "compensate:flight:trip_77"} <= keys
    _drop_namespaces(store_url, [body["namespace"], shlex.split(hint[0])[-1]])


def _drop_namespaces(url: str, namespaces: list[str]) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as conn:
        for table in ("effectgate_effects", "effectgate_approvals", "effectgate_budgets"):
            for ns in namespaces:
                conn.execute(text(f"DELETE FROM {table} WHERE namespace = :ns"), {"ns": ns})
    engine.dispose()


def test_the_header_never_shows_the_stores_password() -> None:
    """``--url`` with a password (the test server trusts any): the store line of the header
    shows the URL with its password hidden (it was printed whole)."""
    from .conftest import PG_URL, require_postgres

    require_postgres()
    url = PG_URL.replace("postgres@", "postgres:s3cr3t-pw@", 1)
    assert "s3cr3t-pw" in url
    result = CliRunner().invoke(main, ["demo", "--url", url, "--agent", "plain"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    [store] = [line for line in result.stdout.splitlines() if line.startswith("store: ")]
    assert "s3cr3t-pw" not in store and "postgres:***@" in store, store
    hint = [line.strip() for line in result.stdout.splitlines()
            if line.strip().startswith("effectgate ls")]
    _drop_namespaces(url, [shlex.split(hint[0])[-1]])
