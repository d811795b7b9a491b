"""``effectgate verify`` on SQLite and Postgres: it passes on a sound store, leaves the user's
data alone, and fails — naming the guarantee — on a store that was broken on purpose."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

import effectgate as eg
from effectgate.cli import main
from effectgate.verify import GUARANTEES, run_checks

from .conftest import snapshot


def verify(*args: str, timeout: float = 120) -> tuple[int, Any, str]:
    """Run ``effectgate verify --json ...`` through the real entry point."""
    proc = subprocess.run(
        [sys.executable, "-m", "effectgate.cli", "verify", "--json", *args],
        capture_output=True, text=True, timeout=timeout,
    )
    try:
        body = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        body = None
    return proc.returncode, body, proc.stderr


def by_id(body: Any) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in body["results"]}


def rows_in(url: str, namespace: str) -> int:
    with eg.Gate(url, namespace=namespace) as gate, gate.store.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT COUNT(*) FROM effectgate_effects WHERE namespace = :ns"),
            {"ns": namespace}).scalar() or 0)


@pytest.mark.xdist_group("processes")
def test_verify_passes_every_guarantee_and_leaves_user_data_alone(
        gate: eg.Gate, store_url: str, tmp_path: Path) -> None:
    d = gate.begin(effect_type="payment.refund", key="refund:user", payload={"a": 1})
    gate.report(d, "committed", result={"mine": True})
    before = snapshot(gate)
    junit = tmp_path / "verify.xml"
    code, body, err = verify("--url", store_url, "--junit", str(junit))
    assert code == 0, (err, body)
    assert body["passed"] is True
    assert {r["id"]: r["status"] for r in body["results"]} == {g: "passed" for g in GUARANTEES}
    assert "8 processes" in by_id(body)["G2"]["detail"]
    assert "SIGKILL" in by_id(body)["G12"]["detail"]
    assert snapshot(gate) == before
    assert rows_in(store_url, body["namespace"]) == 0  # the scratch namespace is gone
    suite = ElementTree.parse(junit).getroot()
    assert suite.get("tests") == str(len(GUARANTEES)) and suite.get("failures") == "0"


def _drop_unique_sqlite(path: Path) -> str:
    """A SQLite store whose effects table lost its unique (namespace, key) constraint."""
    url = f"sqlite:///{path}"
    eg.Gate(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        ddl = conn.execute(text(
            "SELECT sql FROM sqlite_master WHERE name = 'effectgate_effects'")).scalar()
        broken = ddl.replace("effectgate_effects", "effectgate_effects_broken", 1)
        start = broken.index("CONSTRAINT uq_effectgate_effects_key")
        end = broken.index(")", start) + 1
        broken = broken[:start].rstrip().rstrip(",") + broken[end:]
        assert "UNIQUE" not in broken.upper()
        conn.execute(text(broken))
        conn.execute(text("INSERT INTO effectgate_effects_broken SELECT * FROM effectgate_effects"))
        conn.execute(text("DROP TABLE effectgate_effects"))
        conn.execute(text("ALTER TABLE effectgate_effects_broken RENAME TO effectgate_effects"))
    engine.dispose()
    return url


@pytest.mark.xdist_group("processes")
def test_verify_fails_naming_the_guarantee_when_the_unique_index_is_dropped(
        backend: str, pg_schema: str | None, tmp_path: Path) -> None:
    if pg_schema is None:
        url = _drop_unique_sqlite(tmp_path / "broken.db")
    else:
        url = pg_schema
        eg.Gate(url).close()
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(
                "ALTER TABLE effectgate_effects DROP CONSTRAINT uq_effectgate_effects_key"))
        engine.dispose()
    code, body, err = verify("--url", url, "--only", "G1,G2")
    assert code == 1, (err, body)
    results = by_id(body)
    assert results["G1"]["status"] == "failed" and results["G2"]["status"] == "failed"
    assert "ON CONFLICT" in results["G1"]["detail"] or "constraint" in results["G1"]["detail"]
    text_run = CliRunner().invoke(main, ["verify", "--url", url, "--only", "G1"])
    assert text_run.exit_code == 1
    assert "FAIL G1" in text_run.stdout and "FAILED G1" in text_run.stdout


def test_verify_fails_g3_when_leases_never_lapse(backend: str, pg_schema: str | None,
                                                 tmp_path: Path) -> None:
    """A store that quietly pushes every lease a million seconds out: G3 must notice."""
    url = pg_schema or f"sqlite:///{tmp_path / 'lease.db'}"
    eg.Gate(url).close()
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        if backend == "sqlite":
            conn.execute(text(
                "CREATE TRIGGER eg_broken_lease AFTER INSERT ON effectgate_effects BEGIN "
                "UPDATE effectgate_effects SET lease_expires_at = lease_expires_at + 1000000 "
                "WHERE id = new.id; END"))
        else:
            conn.execute(text(
                "CREATE FUNCTION eg_broken_lease() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN NEW.lease_expires_at := NEW.lease_expires_at + 1000000; RETURN NEW; "
                "END $$"))
            conn.execute(text(
                "CREATE TRIGGER eg_broken_lease BEFORE INSERT ON effectgate_effects "
                "FOR EACH ROW EXECUTE FUNCTION eg_broken_lease()"))
    engine.dispose()
    results = {r.id: r for r in run_checks(url, only="G3,G5")}
    assert results["G3"].status == "failed"
    assert "reads in_flight" in results["G3"].detail
    assert results["G5"].status == "passed"


def test_a_guarantee_that_does_not_apply_says_why_and_is_not_a_pass(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(eg.Gate, "approve")
    results = run_checks(store_url, only=["G8", "G1"])
    assert [r.id for r in results] == ["G1", "G8"]
    g8 = results[1]
    assert g8.status == "not_applicable" and not g8.passed
    assert "approve" in g8.detail


@pytest.mark.xdist_group("processes")
def test_process_checks_run_in_fresh_interpreters_when_fork_is_unsafe(tmp_path: Path) -> None:
    """With another thread alive, the process checks start workers with ``python -m``
    instead of forking; the caller's ``__main__`` is never re-imported."""
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    try:
        results = run_checks(f"sqlite:///{tmp_path / 'e.db'}", only="G2")
    finally:
        stop.set()
    assert [(r.id, r.status) for r in results] == [("G2", "passed")], results


def test_verify_refuses_a_namespace_that_holds_data(gate: eg.Gate, store_url: str) -> None:
    d = gate.begin(effect_type="x", key="k", payload={})
    gate.report(d, "committed")
    with pytest.raises(eg.ConfigError, match="already holds effects"):
        run_checks(store_url, only="G1", namespace=gate.namespace)
    assert gate.get("k").state is eg.State.COMMITTED



def test_verify_refuses_a_namespace_whose_only_row_is_its_recorded_policy(
        make_gate: Any, store_url: str, namespace: str) -> None:
    """A namespace that ran with a policy (its effects pruned, or none yet) is not empty:
    verify would delete the recorded policy with its scratch rows, and a later gate there
    with another policy would no longer be warned."""
    from effectgate.store.version import policy_meta_name

    policy = {"effects": {"payment.*": {"approval": "always"}}}
    make_gate(policy=policy)
    name = policy_meta_name(namespace)
    recorded = make_gate(policy=False).store.meta.get(name)
    assert recorded is not None
    with pytest.raises(eg.ConfigError, match="recorded policy"):
        run_checks(store_url, only="G1", namespace=namespace)
    assert make_gate(policy=False).store.meta.get(name) == recorded

def test_verify_in_a_chosen_namespace_never_touches_its_neighbours_or_its_principals(
        make_gate: Any, store_url: str, namespace: str) -> None:
    """A namespace holding only principals is not empty; and the further namespaces a check
    uses are new ones, never ``<namespace>-other``, which may hold real effects."""
    own = make_gate()
    own.add_principal("alice", "operator")
    with pytest.raises(eg.ConfigError, match="already holds"):
        run_checks(store_url, only="G13", namespace=namespace)
    assert [p.name for p in own.list_principals()] == ["alice"]
    own.revoke_principal("alice")
    neighbour = make_gate(namespace=f"{namespace}-other")
    d = neighbour.begin(effect_type="payment.refund", key="refund:txn_1", payload={})
    neighbour.report(d, "committed", result={"refunded": 1})
    neighbour.add_principal("carol", "operator")
    fresh = f"{namespace}-v"
    results = run_checks(store_url, only="G13", namespace=fresh)
    assert [(r.id, r.status) for r in results] == [("G13", "passed")]
    assert neighbour.get("refund:txn_1").state is eg.State.COMMITTED
    assert [p.name for p in neighbour.list_principals()] == ["carol"]
    again = make_gate(namespace=f"{namespace}-other").begin(
        effect_type="payment.refund", key="refund:txn_1", payload={})
    assert again.decision is eg.Decision.DUPLICATE


def test_verify_bad_input_is_one_line_and_exit_2() -> None:
    """(Every command's bad input is covered in-process in test_cli; this is the real script.)"""
    proc = subprocess.run([sys.executable, "-m", "effectgate.cli", "verify", "--only", "G99"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown guarantee G99" in proc.stderr
    assert proc.stderr.startswith("effectgate: error:") and "Traceback" not in proc.stderr


def test_verify_unreachable_store_exits_3() -> None:
    proc = subprocess.run([sys.executable, "-m", "effectgate.cli", "verify", "--url",
                           "postgresql+psycopg://postgres@127.0.0.1:1/none", "--only", "G1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stderr.startswith("effectgate: error: cannot open the store")
    assert "Traceback" not in proc.stderr


def _meta_rows(url: str) -> dict[str, str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {str(name): str(value) for name, value in conn.execute(
                text("SELECT name, value FROM effectgate_meta"))}
    finally:
        engine.dispose()


def test_verify_leaves_no_row_behind_not_even_in_effectgate_meta(store_url: str,
                                                                 namespace: str) -> None:
    """The checks that run under a policy record it for their scratch namespace in
    ``effectgate_meta``; verify deletes that row with the rest (on a shared Postgres database
    only the rows naming the scratch namespace are compared: other tests write theirs)."""
    from effectgate.store.version import policy_meta_name

    eg.Gate(store_url, namespace=namespace, policy=False).close()
    before = _meta_rows(store_url)
    scratch = namespace + "-verify"
    results = run_checks(store_url, only="G8,G9", namespace=scratch)
    assert [r.status for r in results] == ["passed", "passed"], results
    after = _meta_rows(store_url)
    assert policy_meta_name(scratch) not in after
    assert not [name for name, value in after.items() if scratch in name + value]
    if store_url.startswith("sqlite"):
        assert after == before
    assert rows_in(store_url, scratch) == 0


def test_the_exhaustive_replay_leaves_no_policy_row_behind(store_url: str,
                                                           namespace: str) -> None:
    """``verify --exhaustive`` replays approval and ceiling configs through a governed base
    gate, which records its policy; closing the replayer deletes that row."""
    from effectgate.store.version import policy_meta_name
    from effectgate.verify.explore import BOUNDS
    from effectgate.verify.replay import Replayer

    prefix = namespace + "-r-"
    with Replayer(store_url, prefix=prefix) as replayer:
        for config in BOUNDS["2-worker"]:
            replayer.base_for(replayer.shaped(config))
        assert policy_meta_name(prefix + "base") in _meta_rows(store_url)
    assert not [name for name, value in _meta_rows(store_url).items()
                if prefix in name + value]
