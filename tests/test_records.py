"""Records that never break, leak or mislead (issue 11), on SQLite and Postgres: the policy in
force found as DESIGN says and a changed one noticed, what the policy keeps out of the store,
spend past a ceiling said out loud, literal type filters, memos that forget on prune, bodies
the decorator cannot gate, unwinds that always finish their report, reconcile hooks and
stored results that cannot break a ``begin``."""

from __future__ import annotations

import asyncio
import datetime
import gc
import logging
import os
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import effectgate as eg
from effectgate.cli import main
from effectgate.testing import lapse_leases

# -- the policy in force ---------------------------------------------------------------------


POLICY_TOML = '[effects."payment.refund"]\napproval = "always"\n'


def test_a_gate_finds_effectgate_toml_walking_up(store_url: str, namespace: str,
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """``Gate()`` with no ``policy=`` loads the nearest ``effectgate.toml`` above the working
    directory, logs its path, and its approvals are on."""
    (tmp_path / "effectgate.toml").write_text(POLICY_TOML, encoding="utf-8")
    deep = tmp_path / "app" / "jobs"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    monkeypatch.delenv("EFFECTGATE_POLICY", raising=False)
    caplog.set_level(logging.INFO, logger="effectgate")
    with eg.Gate(store_url, namespace=namespace) as gate:
        assert gate.policy_source == str(tmp_path / "effectgate.toml")
        d = gate.begin(effect_type="payment.refund", key="refund:1", payload={})
        assert d.decision is eg.Decision.APPROVAL_REQUIRED
    assert any(str(tmp_path / "effectgate.toml") in r.getMessage() for r in caplog.records)


def test_pyproject_table_env_variable_and_policy_false(store_url: str, namespace: str,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``[tool.effectgate]`` in a pyproject.toml counts (one without the table does not);
    ``$EFFECTGATE_POLICY`` wins over both; a missing file it names is a PolicyError;
    ``policy=False`` means none."""
    monkeypatch.delenv("EFFECTGATE_POLICY", raising=False)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.effectgate.effects."payment.refund"]\ndeny = "frozen"\n', encoding="utf-8")
    inner = tmp_path / "pkg"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "x"\n', encoding="utf-8")
    monkeypatch.chdir(inner)
    with eg.Gate(store_url, namespace=namespace) as gate:
        assert gate.policy_source == str(tmp_path / "pyproject.toml")
        assert gate.begin(effect_type="payment.refund", key="refund:1",
                          payload={}).decision is eg.Decision.DENIED
    named = tmp_path / "elsewhere.toml"
    named.write_text(POLICY_TOML, encoding="utf-8")
    monkeypatch.setenv("EFFECTGATE_POLICY", str(named))
    with eg.Gate(store_url, namespace=f"{namespace}-env") as gate:
        assert gate.policy_source == str(named)
    with eg.Gate(store_url, namespace=f"{namespace}-off", policy=False) as gate:
        assert gate.policy is None and gate.policy_source is None
    monkeypatch.setenv("EFFECTGATE_POLICY", str(tmp_path / "typo.toml"))
    with pytest.raises(eg.PolicyError, match=r"typo\.toml"):
        eg.Gate(store_url, namespace=namespace)


def _policy_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "last recorded" in r.getMessage()]


def test_a_gate_with_another_policy_than_its_namespace_last_ran_warns(
        store_url: str, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    """The policy each namespace last ran with is recorded in the store: a gate that starts
    with a different one (or none) says so; the same policy, spelled in another order, does
    not; another namespace is not concerned."""
    caplog.set_level(logging.WARNING, logger="effectgate")
    one = {"effects": {"a": {"max_attempts": 2}, "b": {"deny": True}}}
    same = {"effects": {"b": {"deny": True}, "a": {"max_attempts": 2}}}
    other = {"effects": {"a": {"max_attempts": 3}}}
    eg.Gate(store_url, namespace=namespace, policy=one).close()
    eg.Gate(store_url, namespace=namespace, policy=same).close()
    eg.Gate(store_url, namespace=f"{namespace}-x", policy=other).close()
    assert _policy_warnings(caplog) == []
    eg.Gate(store_url, namespace=namespace, policy=other).close()
    assert len(_policy_warnings(caplog)) == 1
    assert repr(namespace) in _policy_warnings(caplog)[0]
    eg.Gate(store_url, namespace=namespace, policy=False).close()
    assert len(_policy_warnings(caplog)) == 2 and "now: no policy" in _policy_warnings(caplog)[1]
    # No policy (an operator's CLI somewhere else) warns but never replaces the record:
    eg.Gate(store_url, namespace=namespace, policy=False).close()
    assert len(_policy_warnings(caplog)) == 3
    eg.Gate(store_url, namespace=namespace, policy=other).close()
    assert len(_policy_warnings(caplog)) == 3


# -- what the policy keeps out of the store ---------------------------------------------------


def test_policy_store_result_and_redact_result_apply_to_declared_tools(
        store_url: str, namespace: str) -> None:
    """Tools declared in a policy (what gate_tools and the MCP gateway read) follow its
    ``store_result`` and ``redact_result``: the duplicate returns what was stored."""
    from effectgate.integrations._kernel import read_declarations

    policy = eg.Policy.from_dict({"effects": {
        "sms.send": {"key": "sms:{msg_id}", "tools": ["send_sms"],
                     "redact_result": ["to", "text"]},
        "kyc.lookup": {"key": "kyc:{person}", "tools": ["lookup"], "store_result": False},
    }})
    with eg.Gate(store_url, namespace=namespace, policy=policy) as gate:
        specs = read_declarations(policy, gate=gate).specs(gate)
        sms = {"msg_id": "m1", "to": "+15550100", "text": "your code is 4242"}
        reply = {"sid": "SM1", "to": "+15550100", "echo": [{"text": "your code is 4242"}]}
        assert specs["send_sms"].run(sms, lambda: reply) == reply
        assert specs["send_sms"].run(sms, lambda: pytest.fail("ran twice")) == {
            "sid": "SM1", "to": "[redacted]", "echo": [{"text": "[redacted]"}]}
        assert specs["lookup"].run({"person": "p1"}, lambda: {"ssn": "078-05-1120"}) == {
            "ssn": "078-05-1120"}
        assert gate.get("kyc:p1").result is None
        assert "+15550100" not in str(gate.get("sms:m1").as_dict())


def test_a_redact_function_that_raises_still_commits(gate: eg.Gate) -> None:
    """The effect happened: a redactor that fails keeps the result out and commits."""
    calls: list[int] = []

    def broken(result: Any) -> Any:
        raise KeyError("card")

    @gate.effect("charge:{n}", effect_type="payment.charge", redact=broken)
    def charge(n: int) -> dict[str, int]:
        calls.append(n)
        return {"n": n}

    with pytest.warns(eg.ResultNotStoredWarning):
        assert charge(1) == {"n": 1}
    assert gate.get("charge:1").state is eg.State.COMMITTED
    assert charge(1) is None and calls == [1]


# -- spend past a ceiling ------------------------------------------------------------------------


def test_actual_cost_past_a_ceiling_is_recorded_and_warned(make_gate: Any) -> None:
    """The estimate fitted, the actual cost did not: the money was spent, so the report is
    kept, warns :class:`OverspendWarning`, and the record's reason says which ceiling; the
    next call is denied."""
    gate = make_gate(policy={"effects": {"llm.call": {"budget": {"per_run_micros": 1_000_000}}}})
    d = gate.begin(effect_type="llm.call", key="llm:1", payload={}, run_id="r1",
                   estimated_cost_micros=400_000)
    with pytest.warns(eg.OverspendWarning, match=r"run ceiling of \$1.00"):
        gate.report(d, "committed", result={"tokens": 9}, actual_cost_micros=1_700_000)
    record = gate.get("llm:1")
    assert record.state is eg.State.COMMITTED and record.actual_cost_micros == 1_700_000
    assert record.reason is not None and "overspent" in record.reason
    assert "$1.70" in record.reason
    again = gate.begin(effect_type="llm.call", key="llm:2", payload={}, run_id="r1",
                       estimated_cost_micros=1)
    assert again.decision is eg.Decision.DENIED
    # Within the ceiling: no warning, no reason.
    d = gate.begin(effect_type="llm.call", key="llm:3", payload={}, run_id="r2",
                   estimated_cost_micros=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gate.report(d, "committed", actual_cost_micros=900_000)
    assert gate.get("llm:3").reason is None


# -- reads ----------------------------------------------------------------------------------------


def test_ls_type_treats_underscore_and_percent_literally(store_url: str, gate: eg.Gate) -> None:
    for effect_type in ("a_b", "axb", "a%", "abc"):
        d = gate.begin(effect_type=effect_type, key=f"k:{effect_type}", payload={})
        gate.report(d, "committed")
    where = ["--url", store_url, "--namespace", gate.namespace, "--plain"]

    def types(pattern: str) -> set[str]:
        result = CliRunner().invoke(main, ["ls", "--type", pattern, *where])
        assert result.exit_code == 0, result.output
        return {line.split("\t")[2] for line in result.output.splitlines()}

    assert types("a_b") == {"a_b"}
    assert types("a%") == {"a%"}
    assert types("a*") == {"a_b", "axb", "a%", "abc"}
    assert types("a?b") == {"a_b", "axb"}


def test_prune_makes_every_gate_of_the_process_forget_its_memo(make_gate: Any) -> None:
    """A committed result answered from memory is forgotten on prune, by the gate that
    pruned and by every other gate of this process on that store and namespace."""
    a, b = make_gate(), make_gate()
    d = a.begin(effect_type="t", key="m:1", payload={})
    a.report(d, "committed", result={"card": "4242"})
    for gate in (a, b):
        assert gate.begin(effect_type="t", key="m:1", payload={}).result == {"card": "4242"}
    assert a.prune(datetime.timedelta(0)) == 1
    for gate in (a, b):
        again = gate.begin(effect_type="t", key="m:1", payload={})
        assert again.decision is eg.Decision.DUPLICATE and again.result is None


def test_prune_forgets_the_memo_of_a_gate_on_the_same_file_by_another_url(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with eg.Gate(f"sqlite:///{tmp_path}/e.db", policy=False) as a, \
            eg.Gate("sqlite:///e.db", policy=False) as b:
        d = a.begin(effect_type="t", key="m:1", payload={})
        a.report(d, "committed", result={"to": "alice@example.com"})
        assert b.begin(effect_type="t", key="m:1", payload={}).result == {
            "to": "alice@example.com"}  # remembered by b
        assert a.prune(datetime.timedelta(0)) == 1
        assert b.begin(effect_type="t", key="m:1", payload={}).result is None


def test_a_prune_whose_reply_is_lost_still_forgets_the_memo(make_gate: Any) -> None:
    """The store pruned, the reply never came: the memo must not keep serving what the
    store no longer holds."""
    gate = make_gate()
    d = gate.begin(effect_type="t", key="m:2", payload={})
    gate.report(d, "committed", result={"card": "4242"})
    assert gate.begin(effect_type="t", key="m:2", payload={}).result == {"card": "4242"}
    real = gate.store.prune

    def pruned_then_lost(*args: Any, **kwargs: Any) -> int:
        real(*args, **kwargs)
        raise eg.StoreError("the reply was lost (test)", outcome_unknown=True)

    gate.store.prune = pruned_then_lost
    try:
        with pytest.raises(eg.StoreError):
            gate.prune(datetime.timedelta(0))
    finally:
        del gate.store.prune
    again = gate.begin(effect_type="t", key="m:2", payload={})
    assert again.decision is eg.Decision.DUPLICATE and again.result is None


# -- bodies the decorator cannot gate ----------------------------------------------------------


def test_a_sync_function_returning_a_coroutine_is_refused_and_recorded_ambiguous(
        gate: eg.Gate) -> None:
    """What the function did before returning the coroutine happened (here nothing, but the
    gate cannot know): AMBIGUOUS, never FAILED, so no retry does it again."""
    ran: list[str] = []

    async def work() -> str:
        ran.append("work")
        return "done"

    @gate.effect("co:{n}", effect_type="t")
    def call(n: int) -> Any:
        return work()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the coroutine is closed: no "never awaited"
        with pytest.raises(eg.ConfigError, match="coroutine"):
            call(1)
        gc.collect()
    assert ran == [] and gate.get("co:1").state is eg.State.AMBIGUOUS


def test_callable_objects_are_gated_sync_and_async(gate: eg.Gate) -> None:
    calls: list[str] = []

    class Refund:
        def __call__(self, txn_id: str) -> dict[str, str]:
            calls.append(txn_id)
            return {"refund": txn_id}

    class AsyncRefund:
        async def __call__(self, txn_id: str) -> dict[str, str]:
            calls.append("a" + txn_id)
            return {"refund": txn_id}

    refund = gate.effect("refund:{txn_id}", effect_type="payment.refund")(Refund())
    assert refund("t1") == refund("t1") == {"refund": "t1"}
    arefund = gate.effect("arefund:{txn_id}", effect_type="payment.refund")(AsyncRefund())
    assert asyncio.run(arefund("t2")) == {"refund": "t2"}
    assert asyncio.run(arefund("t2")) == {"refund": "t2"}
    assert calls == ["t1", "at2"]


# -- unwind finishes its report ----------------------------------------------------------------


def test_unwind_with_a_long_key_and_results_without_json_form_finishes(gate: eg.Gate) -> None:
    """A step key of 510 characters (``compensate:<key>`` would be too long), an undo whose
    result has no JSON form and an undo that raises: every step is reported, each undo is
    recorded (none left IN_FLIGHT), and a second unwind runs nothing again."""
    undone: list[str] = []
    keys = ["a:" + "x" * 508, "b:1", "c:1"]
    for n, key in enumerate(keys):
        d = gate.begin(effect_type=f"step.{'abc'[n]}", key=key, payload={}, group_key="trip",
                       compensation={"n": n})
        gate.report(d, "committed")

    @gate.compensator("step.a")
    def undo_a(record: eg.EffectRecord, compensation: Any) -> Any:
        undone.append("a")
        return object()  # no JSON form

    @gate.compensator("step.b")
    def undo_b(record: eg.EffectRecord, compensation: Any) -> Any:
        undone.append("b")
        raise eg.NotExecuted("vendor refused the cancel")

    @gate.compensator("step.c")
    def undo_c(record: eg.EffectRecord, compensation: Any) -> Any:
        undone.append("c")
        return {"cancelled": True}

    report = gate.unwind("trip")
    assert sorted(undone) == ["a", "b", "c"]
    assert {s.key for s in report.compensated} == {keys[0], "c:1"}
    assert [s.key for s in report.failed] == ["b:1"]
    for step in report.compensated:
        assert step.compensation_effect_id is not None
        assert gate.get_by_id(step.compensation_effect_id).state is eg.State.COMMITTED
    again = gate.unwind("trip")
    assert sorted(undone) == ["a", "b", "b", "c"]  # only the failed undo may run again
    assert {s.key for s in again.compensated} == {keys[0], "c:1"}


# -- reconcile hooks and stored results that cannot break a begin -----------------------------


def test_a_reconcile_hook_answering_without_json_form_leaves_begin_working(
        make_gate: Any, caplog: pytest.LogCaptureFixture) -> None:
    gate = make_gate(lease_seconds=5)

    @gate.reconciler("payment.capture")
    def ask(record: eg.EffectRecord) -> eg.Reconciled:
        return eg.Reconciled("committed", result={"raw": object()})

    d = gate.begin(effect_type="payment.capture", key="cap:1", payload={})
    gate.report(d, "ambiguous", error="timeout")
    caplog.set_level(logging.WARNING, logger="effectgate")
    for _ in range(2):
        again = gate.begin(effect_type="payment.capture", key="cap:1", payload={})
        assert again.decision is eg.Decision.BLOCKED
    assert gate.get("cap:1").state is eg.State.AMBIGUOUS
    assert any("reconcile hook" in r.getMessage() for r in caplog.records)
    gate.resolve("cap:1", "committed", by="ops", result={"ok": 1})
    assert gate.begin(effect_type="payment.capture", key="cap:1",
                      payload={}).result == {"ok": 1}


def test_deep_results_are_refused_at_write_and_never_break_a_read(make_gate: Any) -> None:
    """A result nested past what every reader can read back is not stored (the effect still
    commits, with a warning); one nested 200 deep round-trips to a fresh gate."""
    gate = make_gate(memo_size=0)

    def nested(depth: int) -> Any:
        value: Any = "x"
        for _ in range(depth):
            value = [value]
        return value

    @gate.effect("deep:{n}", effect_type="t")
    def body(n: int) -> Any:
        return nested(n)

    with pytest.warns(eg.ResultNotStoredWarning):
        body(900)
    assert body(900) is None
    body(200)
    fresh = make_gate(memo_size=0)
    assert fresh.begin(effect_type="t", key="deep:200", payload={"n": 200}).result == (
        nested(200))
    lapse_leases(fresh)  # nothing in flight: no effect moved
    assert fresh.get("deep:900").state is eg.State.COMMITTED


# -- key templates read data, never the program ------------------------------------------------


def test_templates_read_fields_items_and_plain_attributes(gate: eg.Gate) -> None:
    from pydantic import BaseModel

    class Order(BaseModel):
        id: str
        lines: list[str]

    spec = eg.EffectSpec(gate, "o:{order.id}:{order.lines[1]}:{meta[region]}:{ids[0]}",
                         effect_type="t")
    key = spec.request({"order": Order(id="o1", lines=["a", "b"]), "meta": {"region": "eu"},
                        "ids": [7]}).key
    assert key == "o:o1:b:eu:7"


def test_store_error_text_keeps_no_written_values() -> None:
    """A driver error's message is cut to its first line and redacted before it becomes a
    StoreError: SQLAlchemy's ``[parameters: ...]`` carry the values written."""
    from sqlalchemy.exc import DBAPIError

    from effectgate.store.connections import store_error

    secret = f"sk_{uuid.uuid4().hex}"
    orig = Exception(f"value too long at https://db.test/?token={secret}\nDETAIL: {secret}")
    err = DBAPIError.instance("INSERT INTO effectgate_effects VALUES (:r)", {"r": secret},
                              orig, Exception)
    assert secret in str(err)
    wrapped = store_error(err, writing=True)
    assert isinstance(wrapped, eg.StoreError) and secret not in wrapped.message
    assert "value too long" in wrapped.message


def test_verify_on_a_url_with_no_store_is_an_error_and_creates_nothing(
        backend: str, tmp_path: Path) -> None:
    """A mistyped URL must not pass for an empty store: exit 3, nothing made; ``--create``
    makes one on purpose. The policy a gate would load here is shown."""
    if backend == "sqlite":
        path = tmp_path / "typo" / "efects.db"
        url = f"sqlite:///{path}"
    else:
        from .conftest import PG_URL

        url = PG_URL.rsplit("/", 1)[0] + f"/eg_missing_{uuid.uuid4().hex[:8]}"
    result = CliRunner().invoke(main, ["verify", "--only", "G1", "--url", url])
    assert result.exit_code == 3, result.output
    assert "--create" in result.stderr and result.stderr.count("\n") == 1
    if backend == "sqlite":
        assert not path.parent.exists()
        path.parent.mkdir()
        made = CliRunner().invoke(main, ["verify", "--only", "G1", "--url", url, "--create"])
        assert made.exit_code == 0, made.output
        assert path.exists() and "policy in force here:" in made.stdout


# -- history that no text can break -------------------------------------------------------------

SEPARATORS = "a\u2028b\u2029c\x85d\te\nf\x1b[2Jg\\h\"i"


def test_separators_in_ids_notes_and_errors_keep_every_record_readable(
        store_url: str, gate: eg.Gate) -> None:
    """U+2028, U+2029, U+0085, tab, line feed, an escape sequence, a backslash and a quote in
    an agent id, an error, a resolve's ``by`` and ``note``: ``get``, ``show``, ``ls`` and
    ``unwind`` read them back exactly (escaped on the terminal), and ``resolve`` completes."""
    d = gate.begin(effect_type="t", key="sep:1", payload={}, agent_id="agent" + SEPARATORS,
                   group_key="g", compensation={"undo": True})
    gate.report(d, "ambiguous", error="boom" + SEPARATORS)
    done = gate.resolve("sep:1", "committed", by="op" + SEPARATORS, note="n" + SEPARATORS,
                        force=True)
    assert done.state is eg.State.COMMITTED
    history = gate.get("sep:1").history
    assert [h.by for h in history] == ["agent" + SEPARATORS, None, "op" + SEPARATORS]
    assert history[-1].note == "n" + SEPARATORS
    assert history[1].note is not None and history[1].note.startswith("boom")
    where = ["--url", store_url, "--namespace", gate.namespace]
    for args in (["show", "sep:1"], ["show", "sep:1", "--json"], ["ls"], ["ls", "--plain"]):
        result = CliRunner().invoke(main, [*args, *where], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert not any(ch in result.output for ch in ("\u2028", "\u2029", "\x85", "\x1b"))
    result = CliRunner().invoke(main, ["show", "sep:1", "--json", *where])
    import json

    assert json.loads(result.output)["agent_id"] == "agent" + SEPARATORS
    report = gate.unwind("g")
    assert [s.key for s in report.failed] == ["sep:1"]  # no compensator: reported, not raised


# -- prune keeps what an unwind and an open approval still need ------------------------------


def test_prune_keeps_compensations_and_approvals_still_needed(make_gate: Any) -> None:
    gate = make_gate(policy={"effects": {"payment.big": {"approval": "always"}}})
    undone: list[Any] = []
    d = gate.begin(effect_type="booking.hotel", key="hotel:1", payload={}, group_key="trip",
                   compensation={"cancel": "H1"})
    gate.report(d, "committed", result={"booked": True})
    pending = gate.begin(effect_type="payment.big", key="big:1", payload={"cents": 5})
    stuck = gate.begin(effect_type="payment.big", key="big:2", payload={"cents": 6})
    gate.approve(stuck.approval_id or "", by="alice")
    held = gate.begin(effect_type="payment.big", key="big:2", payload={"cents": 6})
    assert held.decision is eg.Decision.EXECUTE
    gate.report(held, "ambiguous", error="timeout")
    assert gate.prune(datetime.timedelta(0)) == 1
    assert gate.get("hotel:1").compensation == {"cancel": "H1"}
    assert gate.approval(pending.approval_id or "").state.value == "pending"
    assert gate.get("big:2").state is eg.State.AMBIGUOUS
    assert gate.approval(stuck.approval_id or "")  # the AMBIGUOUS effect's approval is kept

    @gate.compensator("booking.hotel")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        undone.append(compensation)

    report = gate.unwind("trip")
    assert report.complete and undone == [{"cancel": "H1"}]
    assert [s.key for s in report.compensated] == ["hotel:1"]


# -- who may approve ----------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["agent-1", "Agent-1", "agent-1 ", "\uff41gent-1",
                                      "agent\u200b-1", "\u202eagent-1", "AGENT-1"])
def test_self_approval_is_refused_in_every_spelling(make_gate: Any, spelling: str) -> None:
    gate = make_gate(policy={"effects": {"payment.*": {"approval": "always"}}})
    d = gate.begin(effect_type="payment.refund", key="refund:1", payload={},
                   agent_id="agent-1")
    with pytest.raises(eg.InvalidTransition, match="own request"):
        gate.approve(d.approval_id or "", by=spelling)
    assert gate.approval(d.approval_id or "").state.value == "pending"
    gate.approve(d.approval_id or "", by="alice")


def test_an_unattributed_request_is_flagged_for_the_approver(make_gate: Any) -> None:
    gate = make_gate(policy={"effects": {"payment.*": {"approval": "always"}}})
    d = gate.begin(effect_type="payment.refund", key="refund:1", payload={})
    approval = gate.approval(d.approval_id or "")
    assert approval.unattributed and approval.requested_by is None
    attributed = gate.begin(effect_type="payment.refund", key="refund:2", payload={},
                            agent_id="agent-1")
    assert not gate.approval(attributed.approval_id or "").unattributed


# -- a child forked while a thread writes -------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_another_thread_writes_can_write(tmp_path: Path) -> None:
    """SQLite: a fork waits until no thread is inside a write, so the child can always take
    the write lock (it used to inherit a held lock and see "database is locked" forever)."""
    gate = eg.Gate(f"sqlite:///{tmp_path / 'e.db'}", namespace="fork", policy=False)
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            d = gate.begin(effect_type="t", key=f"w:{n}", payload={})
            gate.report(d, "committed")
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for i in range(4):
            time.sleep(0.02)
            pid = os.fork()
            if pid == 0:  # the child: one reservation and its outcome, then out
                code = 1
                try:
                    d = gate.begin(effect_type="t", key=f"child:{i}", payload={})
                    gate.report(d, "committed")
                    code = 0
                finally:
                    os._exit(code)
            deadline = time.monotonic() + 30
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    pytest.fail("the forked child could not write")
                time.sleep(0.02)
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        stop.set()
        thread.join()
    assert {gate.get(f"child:{i}").state for i in range(4)} == {eg.State.COMMITTED}
    gate.close()


def test_an_unprintable_exception_and_a_failing_redactor_still_record_the_outcome(
        make_gate: Any) -> None:
    """An exception whose ``__str__`` raises, and a ``text_redactor`` that raises: the outcome
    is still recorded (AMBIGUOUS), and nothing the redactor did not see is stored."""

    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message for you")

    def redactor(text: str) -> str:
        if "secret" in text:
            raise ValueError("cannot parse")
        return text

    gate = make_gate(text_redactor=redactor)

    @gate.effect("w:{n}", effect_type="t")
    def weird(n: int) -> None:
        raise Weird()

    @gate.effect("s:{n}", effect_type="t")
    def secret(n: int) -> None:
        raise RuntimeError("the secret is 1234")

    with pytest.raises(Weird):
        weird(1)
    with pytest.raises(RuntimeError):
        secret(1)
    first = gate.get("w:1")
    assert first.state is eg.State.AMBIGUOUS and first.error == (
        "Weird: (its message could not be read)")
    second = gate.get("s:1")
    assert second.state is eg.State.AMBIGUOUS and second.error is not None
    assert "1234" not in second.error and "text_redactor raised ValueError" in second.error


def test_mcp_serve_started_below_the_policy_finds_it_and_says_so(tmp_path: Path) -> None:
    """``mcp serve`` started in a subdirectory loads the effectgate.toml above it (it used to
    look only in ./) and names it on stderr."""
    pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')
    import subprocess
    import sys

    (tmp_path / "effectgate.toml").write_text(POLICY_TOML, encoding="utf-8")
    sub = tmp_path / "service"
    sub.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECTGATE_")}
    done = subprocess.run(
        [sys.executable, "-m", "effectgate.cli", "mcp", "serve", "--url",
         f"sqlite:///{tmp_path / 'e.db'}"], cwd=sub, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"policy {tmp_path / 'effectgate.toml'}" in done.stderr


def test_policy_result_rules_apply_to_protocol_reports_too(make_gate: Any) -> None:
    """A holder reporting over the protocol (its decision, or only its Lease as the MCP server
    does; sync and async) gets the same store_result / redact_result as the decorator."""
    gate = make_gate(policy={"effects": {"sms.send": {"redact_result": ["to"]},
                                         "kyc.lookup": {"store_result": False}}})
    d = gate.begin(effect_type="sms.send", key="sms:1", payload={})
    gate.report(d, "committed", result={"sid": "S1", "to": "+1555"})
    d = gate.begin(effect_type="sms.send", key="sms:2", payload={})
    gate.report(d.lease, "committed", result=[{"to": "+1555"}])
    d = gate.begin(effect_type="kyc.lookup", key="kyc:1", payload={})
    asyncio.run(gate.areport(d.lease, "committed", result={"dob": "1990-01-01"}))
    d = gate.begin(effect_type="other", key="other:1", payload={})
    asyncio.run(gate.areport(d, "committed", result={"to": "kept"}))
    assert gate.get("sms:1").result == {"sid": "S1", "to": "[redacted]"}
    assert gate.get("sms:2").result == [{"to": "[redacted]"}]
    assert gate.get("kyc:1").result is None
    assert gate.get("other:1").result == {"to": "kept"}


def test_policy_result_rules_apply_to_resolutions_and_reconcile_hooks(make_gate: Any) -> None:
    gate = make_gate(policy={"effects": {"sms.*": {"redact_result": ["to"]}}})

    @gate.reconciler("sms.hooked")
    def ask(record: eg.EffectRecord) -> eg.Reconciled:
        return eg.Reconciled("committed", result={"to": "+1555", "sid": "S2"})

    for effect_type, key in (("sms.send", "sms:1"), ("sms.hooked", "sms:2")):
        d = gate.begin(effect_type=effect_type, key=key, payload={})
        gate.report(d, "ambiguous", error="timeout")
    gate.resolve("sms:1", "committed", by="ops", result={"to": "+1555", "sid": "S1"})
    assert gate.get("sms:1").result == {"to": "[redacted]", "sid": "S1"}
    again = gate.begin(effect_type="sms.hooked", key="sms:2", payload={})
    assert again.decision is eg.Decision.DUPLICATE
    assert again.result == {"to": "[redacted]", "sid": "S2"}


def test_a_new_attempt_clears_the_vendors_reference_of_the_last(gate: eg.Gate) -> None:
    # The reference names the attempt it was recorded for: a reconcile hook asking the vendor
    # about the new attempt must not be handed the old attempt's task.
    first = gate.begin(effect_type="t", key="ref:1", payload={})
    gate.extend_lease(first, 30, vendor_ref="task-of-attempt-1")
    assert gate.get("ref:1").vendor_ref == "task-of-attempt-1"
    gate.report(first, "failed", error="refused before running")
    assert gate.get("ref:1").vendor_ref == "task-of-attempt-1"  # a settled attempt keeps it
    second = gate.begin(effect_type="t", key="ref:1", payload={})
    assert second.decision is eg.Decision.EXECUTE and second.attempt == 2
    assert gate.get("ref:1").vendor_ref is None
    gate.extend_lease(second, 30, vendor_ref="task-of-attempt-2")
    assert gate.get("ref:1").vendor_ref == "task-of-attempt-2"


def test_a_decision_built_as_a_tuple_is_the_keyword_built_one() -> None:
    """``translate.decision`` builds the named tuple positionally (for speed): each value must
    land in the field of its name, whatever order the fields are declared in."""
    from effectgate.states import Decision, State
    from effectgate.store.rows import EffectHead
    from effectgate.translate import decision, vendor_key_of

    row = EffectHead(
        7, "ns", "refund:1", "refund", "h" * 64, State.COMMITTED, 3, 5, 123.5, 100.0, 90.0,
        '{"ok": true}', "stored reason", "stripe", 2, 95.0, "apr_1", '["b"]', 4242, None,
        "s" * 64, 130.0, False)
    got = decision(row, Decision.APPROVAL_REQUIRED, b"v" * 32, "raw-secret", result={"r": 1},
                   retry_after_seconds=1.5, reason="why", approval_id="apr_2",
                   budget_warning="near")
    want = eg.BeginDecision(
        decision=Decision.APPROVAL_REQUIRED, effect_id=7, key="refund:1", effect_type="refund",
        namespace="ns", state=State.COMMITTED, attempt=3, lease_token=5,
        lease_expires_epoch=123.5, result={"r": 1}, retry_after_seconds=1.5, reason="why",
        approval_id="apr_2", vendor_key=vendor_key_of(row, b"v" * 32), budget_warning="near",
        payload_hash="h" * 64, lease_secret="raw-secret", spends=True,
        estimated_cost_micros=4242)
    assert got == want and type(got) is eg.BeginDecision
    assert got.vendor_key is not None


def test_a_remembered_duplicate_built_as_a_tuple_is_the_keyword_built_one() -> None:
    """The memo's answer is built positionally too: each value in the field of its name, and
    every field it does not know (lease, vendor key, spend) at its default."""
    from effectgate.states import Decision, State
    from effectgate.translate import remembered

    got = remembered("ns", "refund:1", "refund", 7, 3, 5, "h" * 64, {"ok": True})
    want = eg.BeginDecision(
        decision=Decision.DUPLICATE, effect_id=7, key="refund:1", effect_type="refund",
        namespace="ns", state=State.COMMITTED, attempt=3, lease_token=5, result={"ok": True},
        payload_hash="h" * 64)
    assert got == want and type(got) is eg.BeginDecision
