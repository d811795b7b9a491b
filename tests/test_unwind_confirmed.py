"""An unwind confirmed by an operator runs only the undos the operator confirmed, on SQLite and
Postgres: a saga that moves between the confirmation and the run (a step committed by an
agent, an undo settled elsewhere, an approval decided) has the undos it makes runnable listed,
not begun, and holding back the older steps (sagas, the CLI without ``--yes``, the console's
POST); and the plan and its digest come from one read of each undo key and approval."""

from __future__ import annotations

import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import effectgate as eg
from effectgate import sagas
from effectgate.cli import main
from effectgate.console import build_app
from effectgate.sagas import compensation_key, compensation_request, unwind_plan

from .conftest import snapshot
from .console_helpers import sign_in

NOT_CONFIRMED = "not in the confirmed plan"
ASKS = {"effects": {"trip.spa.compensate": {"approval": "always"}}}  # a spa's undo asks a person


class MovingGate(eg.Gate):
    """A gate whose store reads can be counted, and that runs ``meanwhile`` (another gate's
    writes: the saga moving) just before a chosen read of the group's steps, so the window
    between a confirmation and its unwind is hit every time, not by luck of timing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.meanwhile: Callable[[], None] | None = None
        self.skip = 0  # reads of the group's steps to let pass before ``meanwhile`` runs
        self.gets: list[str] = []
        self.approvals: list[str] = []
        self.ran: list[str] = []  # the steps whose undo this gate's compensator ran

        @self.compensator("trip.*")
        def cancel(record: eg.EffectRecord, compensation: Any) -> dict[str, Any]:
            self.ran.append(record.key)
            return {"cancelled": record.key}

    def move_before(self, reads: int, meanwhile: Callable[[], None]) -> None:
        """Run ``meanwhile`` once, just before the ``reads``-th next read of the steps."""
        self.skip, self.meanwhile = reads - 1, meanwhile

    def group_steps(self, group_key: str) -> list[eg.EffectRecord]:
        if self.meanwhile is not None:
            if self.skip:
                self.skip -= 1
            else:
                run, self.meanwhile = self.meanwhile, None
                run()
        return super().group_steps(group_key)

    def get(self, key: str) -> eg.EffectRecord:
        self.gets.append(key)
        return super().get(key)

    def approval(self, approval_id: str) -> eg.ApprovalRecord:
        self.approvals.append(approval_id)
        return super().approval(approval_id)


@pytest.fixture
def other(make_gate: Any) -> eg.Gate:
    """Another gate on the same store and namespace: an agent, or another operator."""
    return make_gate(policy=eg.Policy.from_dict(ASKS))  # type: ignore[no-any-return]



@pytest.fixture
def moving(store_url: str, namespace: str) -> Iterator[MovingGate]:
    gate = MovingGate(store_url, namespace=namespace, policy=eg.Policy.from_dict(ASKS))
    yield gate
    gate.close()


def _step(gate: eg.Gate, group: str, name: str) -> eg.BeginDecision:
    d = gate.begin(effect_type=f"trip.{name}", key=f"{group}:{name}", payload={},
                   group_key=group, compensation={"cancel": name})
    gate.report(d, "committed")
    return d


def _undo(gate: eg.Gate, group: str, name: str) -> eg.BeginDecision:
    """An agent begins the step's undo (over MCP, say)."""
    return gate.begin(**compensation_request(gate.get(f"{group}:{name}")), agent_id="agent")


def _outcomes(report: sagas.UnwindReport) -> dict[str, tuple[str, str]]:
    return {s.key.rsplit(":", 1)[1]: (name, s.detail) for name in
            ("compensated", "unresolved", "irreversible", "failed", "skipped")
            for s in getattr(report, name)}


# -- the window, as it is without a confirmed plan ---------------------------------------------


def test_an_unwind_run_after_its_plan_undoes_a_step_no_one_confirmed(
        moving: MovingGate, other: eg.Gate) -> None:
    """Why the unwind takes the plan: the plan names the hotel and the flight; an agent
    commits the car before the unwind runs; a plain unwind (``--yes``, ``Gate.unwind``)
    undoes the car too, as it always did."""
    _step(moving, "g", "flight")
    _step(moving, "g", "hotel")
    runs, _ = unwind_plan(moving, "g")
    assert [r.key for r in runs] == ["g:hotel", "g:flight"]
    _step(other, "g", "car")
    moving.unwind("g")
    assert moving.ran == ["g:car", "g:hotel", "g:flight"]


# -- sagas.unwind(confirmed=...) ---------------------------------------------------------------


def test_a_step_committed_after_the_plan_is_not_undone_and_holds_back_the_older(
        moving: MovingGate, other: eg.Gate) -> None:
    """The car, committed after the plan, would be undone first: it is not in the plan, so
    it is listed (unwind again to review it), not begun; undos run newest first, so the
    hotel and flight wait for it. Nothing is written; the next plan names all three."""
    _step(moving, "g", "flight")
    _step(moving, "g", "hotel")
    runs, _ = unwind_plan(moving, "g")
    _step(other, "g", "car")
    before = snapshot(moving)
    report = sagas.unwind(moving, "g", "alice", confirmed={r.effect_id for r in runs})
    assert moving.ran == [] and snapshot(moving) == before
    seen = _outcomes(report)
    assert seen["car"][0] == "unresolved" and NOT_CONFIRMED in seen["car"][1]
    assert "unwind again to review it" in seen["car"][1]
    for name in ("hotel", "flight"):
        assert seen[name][0] == "unresolved" and "held back" in seen[name][1], seen
        assert "g:car" in seen[name][1]
    assert not report.complete
    runs, _ = unwind_plan(moving, "g")
    report = sagas.unwind(moving, "g", "alice", confirmed={r.effect_id for r in runs})
    assert report.complete and moving.ran == ["g:car", "g:hotel", "g:flight"]


@pytest.mark.parametrize("move", ["failed", "approved"])
def test_an_undo_settled_or_approved_after_the_plan_runs_nothing_unconfirmed(
        moving: MovingGate, other: eg.Gate, move: str) -> None:
    """The middle step's undo waited (AMBIGUOUS, or the spa's for a person's approval),
    holding the flight back: the plan named the car only. Meanwhile it is resolved FAILED
    elsewhere (so it would be begun again) or approved: the car is undone as confirmed; the
    middle undo is listed, not begun, and the flight stays held back."""
    middle = "room" if move == "failed" else "spa"
    _step(moving, "g", "flight")
    _step(moving, "g", middle)
    _step(moving, "g", "car")
    undo = _undo(other, "g", middle)
    if move == "failed":
        other.report(undo, "ambiguous", error="timeout")
    runs, _ = unwind_plan(moving, "g")
    assert [r.key for r in runs] == ["g:car"]
    if move == "failed":
        other.resolve(compensation_key("g:room"), "failed", by="bob")
    else:
        other.approve(undo.approval_id or "", by="bob")
    report = sagas.unwind(moving, "g", "alice", confirmed={r.effect_id for r in runs})
    assert moving.ran == ["g:car"]
    seen = _outcomes(report)
    assert seen["car"][0] == "compensated"
    assert seen[middle][0] == "unresolved" and NOT_CONFIRMED in seen[middle][1]
    assert seen["flight"][0] == "unresolved" and "held back" in seen["flight"][1]
    assert sagas.unwind(moving, "g", "alice").complete  # a plain unwind: as today
    assert moving.ran == ["g:car", f"g:{middle}", "g:flight"]


def test_undos_no_longer_needed_are_reported_and_a_taken_key_holds_nothing_back(
        moving: MovingGate, other: eg.Gate) -> None:
    """The plan named all four undos; meanwhile an agent committed the hotel's undo: it is
    reported compensated earlier, the rest run. A step whose undo key another effect took is
    never planned (its undo's begin is refused): it is listed failed, as without a plan,
    and holds nothing back."""
    _step(moving, "g", "flight")
    taken = _step(moving, "g", "taken")
    _step(moving, "g", "hotel")
    _step(moving, "g", "car")
    with pytest.raises(eg.ConfigError):  # not its payload: refused (red team, round 10)
        other.begin(effect_type="trip.taken.compensate", key=compensation_key("g:taken"),
                    payload={"n": 1}, compensates_effect_id=taken.effect_id)
    _taken_as_an_older_effectgate_let_it_be(other, taken.effect_id)
    runs, _ = unwind_plan(moving, "g")
    assert [r.key for r in runs] == ["g:car", "g:hotel", "g:flight"]
    other.report(_undo(other, "g", "hotel"), "committed", result={"by": "agent"})
    report = sagas.unwind(moving, "g", "alice", confirmed={r.effect_id for r in runs})
    assert moving.ran == ["g:car", "g:flight"]
    seen = _outcomes(report)
    assert seen["hotel"] == ("compensated", "compensated earlier")
    assert seen["taken"][0] == "failed" and seen["flight"][0] == "compensated"
    assert [s.key for s in report.compensated_earlier] == ["g:hotel"]


def test_an_empty_confirmed_plan_begins_nothing(moving: MovingGate) -> None:
    """Confirmed to run nothing: the first step that would be undone is listed, nothing is
    begun; a confirmed set that is not a set of effect ids is refused, writing nothing."""
    _step(moving, "g", "flight")
    before = snapshot(moving)
    report = sagas.unwind(moving, "g", "alice", confirmed=frozenset())
    assert moving.ran == [] and snapshot(moving) == before
    assert NOT_CONFIRMED in _outcomes(report)["flight"][1]
    for bad in ({"1"}, {True}, [1.0], 3, "12", b"1"):
        with pytest.raises(eg.ConfigError):
            sagas.unwind(moving, "g", "alice", confirmed=bad)  # type: ignore[arg-type]
    assert snapshot(moving) == before


def test_an_operator_unwinds_a_confirmed_plan_under_its_own_name(moving: MovingGate) -> None:
    """``Acting.unwind(confirmed=...)``: the undo is begun with the operator as ``by``; an
    agent is refused, writing nothing."""
    _step(moving, "g", "flight")
    runs, _ = unwind_plan(moving, "g")
    agent, _ = moving.add_principal("bot", "agent")
    before = snapshot(moving)
    with pytest.raises(eg.Forbidden):
        moving.acting_as(agent).unwind("g", confirmed={r.effect_id for r in runs})
    assert snapshot(moving) == before
    alice, _ = moving.add_principal("alice", "operator")
    report = moving.acting_as(alice).unwind("g", confirmed={r.effect_id for r in runs})
    assert report.complete and moving.ran == ["g:flight"]
    assert moving.get(compensation_key("g:flight")).agent_id == "alice"


# -- the plan reads the saga once --------------------------------------------------------------


def test_the_plan_reads_each_undo_and_its_approval_once(moving: MovingGate,
                                                        other: eg.Gate) -> None:
    """Its digest and its choice of undos come from the same reads: each undo key is read
    once, and the approval a waiting undo asks for once."""
    for name in ("flight", "spa", "car"):
        _step(moving, "g", name)
    _undo(other, "g", "spa")  # waits for a person
    moving.gets.clear()
    moving.approvals.clear()
    runs, _ = unwind_plan(moving, "g")
    assert [r.key for r in runs] == ["g:car"]
    keys = [compensation_key(f"g:{n}") for n in ("car", "spa", "flight")]
    assert sorted(moving.gets) == sorted(keys), moving.gets
    assert moving.approvals == [other.get(keys[1]).approval_id]


# -- the callers: the CLI without --yes, the console --------------------------------------------


@pytest.fixture
def gate_module(store_url: str, namespace: str, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A ``--gate`` module holding a :class:`MovingGate`; (its name, the ``--gate`` ref)."""
    name = f"moving_{namespace}"
    (tmp_path / f"{name}.py").write_text(
        "import effectgate as eg\n"
        "from tests.test_unwind_confirmed import MovingGate\n"
        f"gate = MovingGate({store_url!r}, namespace={namespace!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, f"{name}:gate"
    module = sys.modules.pop(name, None)
    if module is not None:
        module.gate.close()


def test_the_cli_unwinds_only_what_the_operator_said_yes_to(
        gate_module: tuple[str, str], other: eg.Gate) -> None:
    """The car is committed after the second plan of the question (whose digest matched)
    and before the unwind: "y" undoes nothing the operator was not asked about; ``--yes``
    undoes all three, as it always did."""
    import importlib

    _step(other, "g", "flight")
    _step(other, "g", "hotel")
    gate: MovingGate = importlib.import_module(gate_module[0]).gate
    gate.move_before(3, lambda: _step(other, "g", "car"))  # plan, plan again, unwind
    r = CliRunner().invoke(main, ["unwind", "g", "--gate", gate_module[1], "--plain"],
                           input="y\n", catch_exceptions=False)
    assert gate.meanwhile is None, "the saga did not move in the window"
    assert "compensate:g:car" not in r.stderr and "compensate:g:hotel" in r.stderr
    assert gate.ran == [] and r.exit_code == 1, r.output
    assert f"unresolved\tg:car\tcommitted\t{NOT_CONFIRMED}" in r.stdout
    done = CliRunner().invoke(main, ["unwind", "g", "--gate", gate_module[1], "--yes"],
                              catch_exceptions=False)
    assert done.exit_code == 0 and gate.ran == ["g:car", "g:hotel", "g:flight"]


def _seen(html: str) -> str:
    match = re.search(r'name="seen" value="([^"]*)"', html)
    assert match, "no form carrying what was seen"
    return match.group(1)


def test_the_console_unwinds_only_what_its_confirmation_named(
        moving: MovingGate, other: eg.Gate) -> None:
    """The POST's digest still matches (the car is committed after its check, before the
    unwind): the car is listed, not undone, and the older steps wait for it."""
    _, token = moving.add_principal("alice", "operator")
    _step(moving, "g", "flight")
    _step(moving, "g", "hotel")
    with TestClient(build_app(moving), base_url="http://127.0.0.1") as client:
        csrf = sign_in(client, token)
        confirm = client.get("/groups/unwind?group=g")
        assert "Run 2 undos" in confirm.text
        moving.move_before(2, lambda: _step(other, "g", "car"))  # the POST's plan, unwind
        r = client.post("/groups/unwind", data={"csrf_token": csrf, "group": "g",
                                                "seen": _seen(confirm.text)},
                        follow_redirects=False)
        assert r.status_code == 303 and moving.meanwhile is None
        assert moving.ran == []
        page = client.get(r.headers["location"]).text
        assert "compensated nothing" in page and "3 unresolved" in page


# -- found in review: bad `confirmed` values, and an id SQLite gave again ------------------


def _trip_gate(tmp_path: Path) -> tuple[eg.Gate, list[str]]:
    """A SQLite gate (memo off) with a compensator for ``trip.*`` that notes what it undid."""
    gate = eg.Gate(f"sqlite:///{tmp_path / 'effects.db'}", namespace="review", memo_size=0)
    ran: list[str] = []

    @gate.compensator("trip.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> dict[str, Any]:
        ran.append(compensation["cancel"])
        return {}

    return gate, ran


def _hotel(gate: eg.Gate, cancel: str) -> eg.BeginDecision:
    d = gate.begin(effect_type="trip.hotel", key="trip:hotel", payload={}, group_key="trip",
                   compensation={"cancel": cancel})
    gate.report(d, "committed")
    return d


def _raises_midway() -> Iterator[int]:
    yield 1
    raise ValueError("the caller's own bug")


@pytest.mark.parametrize("confirmed", [
    pytest.param(lambda: bytearray([1]), id="bytearray"),  # bytes is refused; its twins not
    pytest.param(lambda: memoryview(bytes([1])), id="memoryview"),
    pytest.param(_raises_midway, id="a generator that raises"),
])
def test_confirmed_that_is_not_a_collection_of_ids_is_refused_typed(
        tmp_path: Path, confirmed: Any) -> None:
    """``confirmed`` is refused with ConfigError, nothing begun, when it is bytes-like (as
    ``bytes`` already is: its items are byte values, not effect ids) or raises while read
    (an untyped ValueError escaped)."""
    gate, ran = _trip_gate(tmp_path)
    try:
        d = _hotel(gate, "A")
        assert d.effect_id == 1
        with pytest.raises(eg.ConfigError):
            sagas.unwind(gate, "trip", "op", confirmed=confirmed())
        assert ran == []
        assert gate.get("trip:hotel").state is eg.State.COMMITTED
        with pytest.raises(eg.UnknownEffect):
            gate.get(sagas.compensation_key("trip:hotel"))
    finally:
        gate.close()


def test_a_step_made_again_under_the_same_id_changes_the_plans_digest(tmp_path: Path) -> None:
    """SQLite reuses the id of the newest row once it is deleted (the effects table has no
    AUTOINCREMENT). A step deleted out of band and made again under the same key gets the
    same id, state, attempt and token, so ``unwind_plan``'s digest does not change: the
    console's POST and the CLI's re-check accept it, and the confirmed ids name the new step,
    whose undo (a different compensation) no one was shown. The digest must tell them apart."""
    gate, ran = _trip_gate(tmp_path)
    try:
        first = _hotel(gate, "booking A")
        runs, seen = sagas.unwind_plan(gate, "trip")
        assert [r.compensation for r in runs] == [{"cancel": "booking A"}]
        with sqlite3.connect(tmp_path / "effects.db") as db:  # out of band (no API deletes)
            db.execute("DELETE FROM effectgate_effects WHERE id = ?", (first.effect_id,))
        time.sleep(0.01)
        again = _hotel(gate, "booking B")
        assert again.effect_id == first.effect_id  # the id is reused
        assert sagas.unwind_plan(gate, "trip")[1] != seen  # fails: the same digest
        assert ran == []
    finally:
        gate.close()


def _taken_as_an_older_effectgate_let_it_be(gate: eg.Gate, step_id: int) -> None:
    """An effect in flight at the undo key of step ``step_id``, of its undo's type but not its
    payload: what an effectgate before round 10's check let any caller begin there."""
    from sqlalchemy import insert, select

    from effectgate.store.schema import effects

    with gate.store.engine.begin() as conn:
        row = dict(conn.execute(select(effects).where(effects.c.id == step_id)).one()._mapping)
        del row["id"]
        conn.execute(insert(effects).values(**{
            **row, "key": compensation_key(row["key"]),
            "effect_type": row["effect_type"] + ".compensate", "payload_hash": "0" * 64,
            "compensates_effect_id": step_id, "group_key": None, "compensation": None,
            "state": "in_flight"}))
