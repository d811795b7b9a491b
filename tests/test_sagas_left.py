"""Sagas, on both backends: unwind never undoes an older step while a newer step's undo is left
unsettled (AMBIGUOUS, IN_FLIGHT, waiting for approval) — it holds the older ones back until
that undo is settled — and an undo key shared by two steps (a hashed long key, a step keyed
like an undo, a user's own effect) never answers one step's undo from another's result."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

import effectgate as eg
from effectgate.keys import MAX_KEY_LENGTH
from effectgate.sagas import compensation_key, compensation_request

GROUP = "trip:1"


def _trip(gate: eg.Gate, undone: list[str], *, lost: str | None = None,
          types: str = "booking.*") -> None:
    """flight (oldest), hotel, car (newest), each committed with an undo; the compensator for
    ``types`` records what it undid, its reply lost for ``lost`` (an AMBIGUOUS undo)."""
    @gate.compensator(types)
    def cancel(record: eg.EffectRecord, compensation: Any) -> dict[str, Any]:
        undone.append(compensation["cancel"])
        if compensation["cancel"] == lost:
            raise TimeoutError(f"the {lost} cancel got no reply")
        return {"cancelled": compensation["cancel"]}

    for step in ("flight", "hotel", "car"):
        d = gate.begin(effect_type=f"booking.{step}", key=f"{step}:trip_1", payload={},
                       group_key=GROUP, compensation={"cancel": step})
        gate.report(d, "committed", result={"booked": step})


def _keys(report: eg.UnwindReport, name: str) -> list[str]:
    return [s.key for s in getattr(report, name)]


def _undos(gate: eg.Gate) -> list[str]:
    return sorted(e.key for e in gate.list_effects() if e.key.startswith("compensate:"))


# -- an unsettled undo holds the older steps back ----------------------------------------------

def test_an_ambiguous_undo_holds_back_every_older_step(make_gate: Any) -> None:
    """The hotel's undo ran but its reply was lost: the flight is not undone while the hotel
    may still stand (no undo of it is even begun). Once an operator settles the hotel's undo,
    the next unwind undoes the flight."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []
    _trip(gate, undone, lost="hotel")
    report = gate.unwind(GROUP)
    assert undone == ["car", "hotel"] and not report.complete
    assert _keys(report, "compensated") == ["car:trip_1"]
    assert _keys(report, "unresolved") == ["hotel:trip_1", "flight:trip_1"]
    held = report.unresolved[1]
    assert held.detail.startswith("held back: the undo of the newer step hotel:trip_1 is "
                                  "ambiguous"), held.detail
    assert held.compensation_effect_id is None
    assert _undos(gate) == ["compensate:car:trip_1", "compensate:hotel:trip_1"]

    again = gate.unwind(GROUP)  # still unsettled: still nothing older
    assert undone == ["car", "hotel"] and _keys(again, "unresolved") == [
        "hotel:trip_1", "flight:trip_1"]

    gate.resolve("compensate:hotel:trip_1", "committed", by="ops", note="the hotel cancelled")
    last = gate.unwind(GROUP)
    assert undone == ["car", "hotel", "flight"] and last.complete
    assert [s.key for s in last.compensated_now] == ["flight:trip_1"]
    assert [s.key for s in last.compensated_earlier] == ["car:trip_1", "hotel:trip_1"]


def test_an_undo_in_flight_elsewhere_holds_back_the_older_steps(make_gate: Any) -> None:
    """A racing unwind (another process) holds the car's undo: this unwind begins no older
    undo until that one is recorded, so the undos still run newest first."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []
    _trip(gate, undone)
    other = gate.begin(**compensation_request(gate.get("car:trip_1")), agent_id="other")
    assert other.decision is eg.Decision.EXECUTE
    report = gate.unwind(GROUP)
    assert undone == [] and _undos(gate) == ["compensate:car:trip_1"]
    assert _keys(report, "unresolved") == ["car:trip_1", "hotel:trip_1", "flight:trip_1"]
    assert "is in flight" in report.unresolved[2].detail
    gate.report(other, "committed", result={"cancelled": "car"})
    after = gate.unwind(GROUP)
    assert undone == ["hotel", "flight"] and after.complete
    assert [s.key for s in after.compensated_earlier] == ["car:trip_1"]


def test_an_undo_waiting_for_approval_holds_back_the_older_steps(make_gate: Any) -> None:
    """The hotel's undo needs a person's approval; the flight's does not. The flight is not
    cancelled while the hotel's cancel waits (it might yet be denied); once approved, one
    unwind runs both, hotel first."""
    policy = eg.Policy.from_dict({"effects": {"booking.hotel.compensate": {
        "approval": "always"}}})
    gate: eg.Gate = make_gate(policy=policy)
    undone: list[str] = []
    _trip(gate, undone)
    report = gate.unwind(GROUP)
    assert undone == ["car"] and not report.complete
    assert _keys(report, "unresolved") == ["hotel:trip_1", "flight:trip_1"]
    assert "waiting for approval" in report.unresolved[1].detail
    (request,) = gate.list_approvals()
    gate.approve(request.approval_id, by="ops")
    after = gate.unwind(GROUP)
    assert undone == ["car", "hotel", "flight"] and after.complete


def test_an_agents_unsettled_undo_holds_back_the_steps_this_process_can_undo(
        make_gate: Any) -> None:
    """No compensator for the car here: an agent (over MCP) performs its undo. While that undo
    is in flight or ambiguous, this process does not cancel the hotel or the flight; once the
    agent's undo committed, the car is listed compensated (not failed) and the rest run."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []
    _trip(gate, undone, types="booking.[fh]*")
    agent = gate.begin(**compensation_request(gate.get("car:trip_1")), agent_id="agent")
    report = gate.unwind(GROUP)
    assert undone == [] and report.failed == []
    assert _keys(report, "unresolved") == ["car:trip_1", "hotel:trip_1", "flight:trip_1"]
    assert report.unresolved[0].compensation_effect_id == agent.effect_id
    gate.report(agent, "ambiguous", error="the agent lost the vendor's reply")
    assert undone == [] and _keys(gate.unwind(GROUP), "unresolved") == [
        "car:trip_1", "hotel:trip_1", "flight:trip_1"]
    gate.resolve("compensate:car:trip_1", "committed", by="ops", result={"cancelled": "car"})
    after = gate.unwind(GROUP)
    assert undone == ["hotel", "flight"] and after.complete
    (car,) = after.compensated_earlier
    assert car.key == "car:trip_1" and car.result == {"cancelled": "car"}


def test_a_held_step_whose_undo_committed_earlier_is_listed_compensated(
        make_gate: Any) -> None:
    """Held back or not, a step whose own undo already committed is compensated; a step with
    no undo, or one that never happened, keeps its own listing."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []
    _trip(gate, undone, lost="car")
    for step, comp in (("insurance", None), ("train", {"cancel": "train"})):
        d = gate.begin(effect_type=f"booking.{step}", key=f"{step}:trip_1", payload={},
                       group_key=GROUP, compensation=comp)
        gate.report(d, "committed" if comp is None else "failed")
    flight = gate.get("flight:trip_1")
    by_hand = gate.begin(**compensation_request(flight), agent_id="agent")
    gate.report(by_hand, "committed", result={"cancelled": "flight"})
    # newest first: train (failed), insurance (irreversible), car (its undo lost), hotel, flight
    report = gate.unwind(GROUP)
    assert undone == ["car"]
    assert _keys(report, "skipped") == ["train:trip_1"]
    assert _keys(report, "irreversible") == ["insurance:trip_1"]
    assert _keys(report, "unresolved") == ["car:trip_1", "hotel:trip_1"]
    (done,) = report.compensated
    assert (done.key, done.earlier, done.result) == ("flight:trip_1", True,
                                                     {"cancelled": "flight"})
    assert done.compensation_effect_id == by_hand.effect_id


def test_a_failed_undo_does_not_hold_back_the_older_steps(make_gate: Any) -> None:
    """A FAILED undo is settled (it did not happen, and the step is known to stand): it is
    listed failed and the older steps are still undone, as before."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        undone.append(compensation["cancel"])
        if compensation["cancel"] == "hotel":
            raise eg.NotExecuted("the hotel refused the cancel")

    for step in ("flight", "hotel"):
        d = gate.begin(effect_type=f"booking.{step}", key=f"{step}:trip_1", payload={},
                       group_key=GROUP, compensation={"cancel": step})
        gate.report(d, "committed")
    report = gate.unwind(GROUP)
    assert undone == ["hotel", "flight"]
    assert _keys(report, "failed") == ["hotel:trip_1"]
    assert _keys(report, "compensated") == ["flight:trip_1"]


# -- undo keys: a shared key is refused, never answered from the other's result ----------------

def _step(gate: eg.Gate, key: str, effect_type: str = "booking.x") -> None:
    d = gate.begin(effect_type=effect_type, key=key, payload={"k": key[:40]}, group_key="g",
                   compensation={"cancel": key[:40]})
    gate.report(d, "committed")


def test_no_two_steps_share_an_undo_key(make_gate: Any) -> None:
    """The undo of a key too long for ``compensate:<key>`` is ``compensate:sha256:<digest>``;
    a step keyed ``sha256:<digest>`` has its own undo key (its key is hashed too), and a step
    keyed like an undo (``compensate:a`` next to ``a``) is refused: no step takes another's
    undo key, so every step is undone by its own undo."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        undone.append(record.key)

    long_key = "x" * (MAX_KEY_LENGTH - len("compensate:") + 1)
    short_key = "sha256:" + hashlib.sha256(long_key.encode()).hexdigest()
    assert compensation_key(long_key) != compensation_key(short_key)
    assert compensation_key("y" * (len(long_key) - 1)) == "compensate:" + "y" * 501
    for key in (long_key, short_key, "a"):
        _step(gate, key)
    with pytest.raises(eg.EffectKeyError, match="reserved for undos"):
        _step(gate, "compensate:a")
    report = gate.unwind("g")
    assert undone == ["a", short_key, long_key] and report.complete
    assert _keys(report, "compensated") == ["a", short_key, long_key]
    assert gate.unwind("g").complete and len(undone) == 3


@pytest.mark.parametrize(("effect_type", "payload", "undoes"), [
    ("email.send", {"to": "a@b"}, False), ("booking.x.compensate", {"cancel": "a"}, False),
    ("booking.x.compensate", {"cancel": "a"}, True)])
def test_a_users_effect_at_an_undo_key_is_not_the_undo(
        make_gate: Any, effect_type: str, payload: dict[str, Any], undoes: bool) -> None:
    """An effect of the user's own at ``compensate:<key>`` is refused unless it undoes that
    step (the key is reserved for undos); one that names the step, of its undo type, but with
    another payload, is refused too (red team, round 10: it took the key, and the step's own
    undo was refused there for ever): nothing is written, and the step is undone."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []

    @gate.compensator("booking.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        undone.append(record.key)

    _step(gate, "a")
    step = gate.get("a").effect_id
    if not undoes:
        with pytest.raises(eg.EffectKeyError, match="reserved for undos"):
            gate.begin(effect_type=effect_type, key="compensate:a", payload=payload)
        assert gate.unwind("g").complete and undone == ["a"]
        return
    with pytest.raises(eg.ConfigError, match="not the step's compensation"):
        gate.begin(effect_type=effect_type, key="compensate:a", payload=payload,
                   compensates_effect_id=step)
    with pytest.raises(eg.UnknownEffect):
        gate.get("compensate:a")
    report = gate.unwind("g")
    assert undone == ["a"] and _keys(report, "compensated") == ["a"] and report.complete
