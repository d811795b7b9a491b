"""Review of the confirmed unwind, the console's Host check and ``resolve --force``, on SQLite
and Postgres: the confirmation's plan is unwind's own choice of undos; a confirmation is
refused when an agent began an undo meanwhile or the digest is hostile; ``localhost.`` and a
reverse proxy's name (``allow_hosts``) reach a loopback console; ``resolve --force`` asks no
false "in flight" question and audits "forced" only when it forced."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import effectgate as eg
from effectgate.audit import list_actions
from effectgate.cli import main
from effectgate.console import build_app
from effectgate.sagas import compensation_request, unwind_plan

from .conftest import snapshot
from .console_helpers import console_gate, sign_in


def _step(gate: eg.Gate, group: str, name: str, commit: bool = True) -> eg.BeginDecision:
    d = gate.begin(effect_type=f"trip.{name}", key=f"{group}:{name}", payload={},
                   group_key=group, compensation={"cancel": name})
    if commit:
        gate.report(d, "committed")
    return d


def _undo(gate: eg.Gate, step: eg.BeginDecision, outcome: str | None) -> None:
    record = gate.get(step.key)
    d = gate.begin(**compensation_request(record), agent_id="agent")
    if outcome == "approved":
        gate.approve(d.approval_id or "", by="alice")
    elif outcome not in (None, "asked"):
        gate.report(d, outcome, error=None if outcome == "committed" else "x")


@pytest.mark.parametrize("undos", [
    {}, {"hotel": "ambiguous"}, {"hotel": "failed"}, {"hotel": "committed"},
    {"car": "committed", "hotel": "ambiguous"}, {"car": None}, {"flight": "failed"},
    {"hotel": "asked"}, {"hotel": "approved"}])
def test_the_plan_is_exactly_the_undos_unwind_runs(make_gate: Any, undos: dict[str, Any]
                                                     ) -> None:
    """Steps flight, hotel, car (newest), plus one with no compensator here and one still in
    flight, with undos already begun by an agent in various states (the hotel's undo needs
    a person's approval: still asked, or approved since): the plan names exactly the undos
    the unwind then runs, in its order. (An approved undo was planned as held back, and the
    approval did not change the digest: the unwind confirmed for the car undid all three.)"""
    asks = {"effects": {"trip.hotel.compensate": {"approval": "always"}}}
    gate: eg.Gate = make_gate(policy=eg.Policy.from_dict(
        asks if {"asked", "approved"} & set(undos.values()) else {}))
    ran: list[str] = []

    @gate.compensator("trip.*")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        ran.append(record.key)

    steps = {name: _step(gate, "g", name) for name in ("flight", "hotel")}
    gate.begin(effect_type="other.x", key="g:other", payload={}, group_key="g",
               compensation={"c": 1})
    _step(gate, "g", "live", commit=False)
    steps["car"] = _step(gate, "g", "car")
    for name, outcome in undos.items():
        _undo(gate, steps[name], outcome)
    runs, _ = unwind_plan(gate, "g")
    gate.unwind("g")
    assert [r.key for r in runs] == ran


def test_an_approval_given_after_the_confirmation_refuses_the_unwind(make_gate: Any) -> None:
    """The confirmation named the car's undo only (the hotel's waits for a person, holding
    the flight back); a person approves the hotel's undo meanwhile: the saga as seen has
    moved, so the digest differs (the unwind would run three undos, not the one confirmed)."""
    gate: eg.Gate = make_gate(policy=eg.Policy.from_dict(
        {"effects": {"trip.hotel.compensate": {"approval": "always"}}}))
    gate.compensator("trip.*")(lambda record, compensation: None)
    _step(gate, "g", "flight")
    hotel = _step(gate, "g", "hotel")
    _step(gate, "g", "car")
    _undo(gate, hotel, "asked")
    runs, seen = unwind_plan(gate, "g")
    assert [r.key for r in runs] == ["g:car"]
    gate.approve(gate.get("compensate:g:hotel").approval_id or "", by="alice")
    runs, now = unwind_plan(gate, "g")
    assert now != seen and [r.key for r in runs] == ["g:car", "g:hotel", "g:flight"]


@pytest.fixture
def cgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    gate = console_gate(store_url, namespace)
    yield gate
    gate.close()


@pytest.fixture
def client(cgate: eg.Gate) -> Iterator[TestClient]:
    with TestClient(build_app(cgate), base_url="http://127.0.0.1") as c:
        yield c


def _seen(html: str) -> str:
    match = re.search(r'name="seen" value="([^"]*)"', html)
    assert match
    return match.group(1)


def test_an_undo_an_agent_began_after_the_confirmation_refuses_the_unwind(
        cgate: eg.Gate, client: TestClient) -> None:
    """Between the confirmation and its button an agent (MCP) begins the newest step's undo
    and leaves it in flight: the POST runs nothing; hostile digests run nothing either."""
    _, token = cgate.add_principal("alice", "operator")
    csrf = sign_in(client, token)
    _step(cgate, "t", "flight")
    hotel = _step(cgate, "t", "hotel")
    confirm = client.get("/groups/unwind?group=t&seen=" + _seen(
        client.get("/groups/view?group=t").text))
    assert "Run 2 undos" in confirm.text
    _undo(cgate, hotel, None)
    moved = snapshot(cgate)
    for seen in (_seen(confirm.text), "", "x" * 100_000, "\u202e'\"<", _seen(confirm.text)[:-1]):
        r = client.post("/groups/unwind", data={"csrf_token": csrf, "group": "t",
                                                "seen": seen}, follow_redirects=False)
        assert r.status_code in (303, 413)  # 413: a form too large is refused whole
        assert snapshot(cgate) == moved and cgate.undone == []  # type: ignore[attr-defined]


def test_a_huge_saga_is_confirmed_and_unwound(cgate: eg.Gate, client: TestClient) -> None:
    """300 steps: the confirmation names them all and its digest unwinds them all."""
    _, token = cgate.add_principal("alice", "operator")
    csrf = sign_in(client, token)
    for i in range(300):
        _step(cgate, "big", f"s{i}")
    confirm = client.get("/groups/unwind?group=big")
    assert "Run 300 undos" in confirm.text
    client.post("/groups/unwind", data={"csrf_token": csrf, "group": "big",
                                        "seen": _seen(confirm.text)})
    assert len(cgate.undone) == 300  # type: ignore[attr-defined]


def test_host_names_with_a_final_dot_or_a_proxys_name(cgate: eg.Gate) -> None:
    """``localhost.`` (a fully qualified name) is localhost; a reverse proxy on this machine
    that passes its public Host on is served once that name is allowed; garbage after an
    IPv6 literal is not its name; a bad allowed name is refused up front."""
    app = build_app(cgate, host="127.0.0.1", allow_hosts=["Console.Example.COM"])
    for base in ("http://localhost.:8765", "http://console.example.com",
                 "http://console.example.com.:443", "http://[::1]:1"):
        with TestClient(app, base_url=base) as c:
            assert c.get("/login").status_code == 200, base
    for host in ("[::1]evil.example", "evil.example", "console.example.com.evil"):
        with TestClient(app, base_url="http://127.0.0.1") as c:
            assert c.get("/login", headers={"host": host}).status_code == 421, host
    with TestClient(build_app(cgate, host="127.0.0.1"),
                    base_url="http://console.example.com") as c:
        assert c.get("/login").status_code == 421
    for bad in ("a:80", "a/b", "", "a b", "[::1]:8"):
        with pytest.raises(eg.ConfigError):
            build_app(cgate, host="127.0.0.1", allow_hosts=[bad])


def _cli(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_resolve_force_asks_nothing_false_when_the_effect_moved(
        make_gate: Any, store_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder commits between the CLI's read and its first try: it was asked "in flight
    ... anyway?" about an effect no longer in flight. Now: refused, saying it changed."""
    gate: eg.Gate = make_gate()
    d = gate.begin(effect_type="payment.refund", key="r:1", payload={}, lease_seconds=600)
    read = eg.Gate.get

    def get_then_commit(self: eg.Gate, key: str) -> eg.EffectRecord:
        record = read(self, key)
        if self is not gate and gate.get("r:1").state is eg.State.IN_FLIGHT:
            gate.report(d, "committed")  # the holder, right after the CLI read
        return record

    monkeypatch.setattr(eg.Gate, "get", get_then_commit)
    r = _cli("resolve", "r:1", "--failed", "--force", "--url", store_url, "--namespace",
             namespace, input="y\n")
    monkeypatch.undo()
    assert r.exit_code == 1 and "changed while it was read" in r.stderr, r.output
    assert "is in flight" not in r.output
    assert gate.get("r:1").state is eg.State.COMMITTED


def test_resolve_force_audits_forced_only_when_it_forced(
        make_gate: Any, store_url: str, namespace: str) -> None:
    gate: eg.Gate = make_gate()
    gate.begin(effect_type="payment.refund", key="r:2", payload={}, lease_seconds=600)
    d = gate.begin(effect_type="payment.refund", key="r:3", payload={})
    gate.report(d, "ambiguous", error="x")
    args = ("--url", store_url, "--namespace", namespace, "--force", "--yes")
    assert _cli("resolve", "r:2", "--failed", *args).exit_code == 0
    assert _cli("resolve", "r:3", "--failed", *args).exit_code == 0
    details = {e.subject: e.detail for e in list_actions(gate, action="resolve")}
    assert "forced" in details["r:2"] and "forced" not in details["r:3"], details
