"""Principals: tokens stored hashed, roles, revocation, last use, and ``by`` from the
principal (on SQLite and Postgres)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

import effectgate as eg
from effectgate.cli import main
from effectgate.store.schema import principals as principals_table

from .conftest import snapshot

POLICY = {"effects": {"payment.refund": {"approval": {"always": True}}}}


def test_token_is_shown_once_and_stored_only_hashed(gate: eg.Gate) -> None:
    principal, token = gate.add_principal("alice", "operator")
    assert principal.name == "alice" and principal.role == "operator"
    assert principal.last_used_at is None and principal.revoked_at is None
    assert token.startswith("egp_") and len(token) == 47
    with gate.store.engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(principals_table.select().where(
            principals_table.c.namespace == gate.namespace))]
    assert len(rows) == 1
    stored = json.dumps(rows, default=str)
    assert token not in stored and token[4:] not in stored  # only the id prefix and a hash
    assert rows[0]["token_id"] == token[4:16] and len(rows[0]["salt"]) == 32
    seen = gate.authenticate(token)
    assert seen.name == "alice" and seen.last_used_at is not None
    assert gate.list_principals()[0].last_used_at is not None  # stamped in the store


def test_authenticate_refuses_bad_tokens_with_one_message(gate: eg.Gate) -> None:
    _, token = gate.add_principal("bot-1", "agent")
    forged = token[:16] + ("A" if token[16] != "A" else "B") + token[17:]  # right id, bad secret
    for bad in (None, "", "egp_", token + "x", token[:-1], forged, "Bearer " + token, 7,
                "egp_" + "A" * 43, token.replace("egp_", "egq_")):
        with pytest.raises(eg.Unauthenticated) as info:
            gate.authenticate(bad)  # type: ignore[arg-type]
        assert info.value.message == "invalid or revoked token"
    assert gate.authenticate(token).name == "bot-1"


def test_revoked_token_never_authenticates_again(gate: eg.Gate) -> None:
    _, token = gate.add_principal("carol", "operator")
    assert gate.authenticate(token).last_used_at is not None
    revoked = gate.revoke_principal("carol")
    assert revoked.revoked and revoked.revoked_at is not None
    with pytest.raises(eg.Unauthenticated):
        gate.authenticate(token)  # the verified-token cache never outlives a revocation
    assert gate.revoke_principal("carol").revoked_at == revoked.revoked_at  # idempotent
    with pytest.raises(eg.ConfigError, match="exists already"):
        gate.add_principal("carol", "operator")  # a revoked name stays taken
    with pytest.raises(eg.UnknownEffect):
        gate.revoke_principal("nobody")


def test_names_and_roles_are_checked(gate: eg.Gate) -> None:
    for bad in ("", "Alice", "al ice", "a\u200bb", "ａlice", "-x", "x" * 65, None, "a/b"):
        with pytest.raises(eg.ConfigError):
            gate.add_principal(bad, "operator")  # type: ignore[arg-type]
    with pytest.raises(eg.ConfigError, match="role"):
        gate.add_principal("dave", "admin")
    assert gate.list_principals() == []


def test_a_token_authenticates_only_in_its_namespace(gate: eg.Gate) -> None:
    _, token = gate.add_principal("erin", "operator")
    other = gate.in_namespace(gate.namespace + "-other")
    with pytest.raises(eg.Unauthenticated):
        other.authenticate(token)
    assert other.list_principals() == []


def _approval(gate: eg.Gate, agent: str) -> str:
    d = gate.begin(effect_type="payment.refund", key="refund:1", payload={"amount": 5},
                   agent_id=agent)
    assert d.decision is eg.Decision.APPROVAL_REQUIRED and d.approval_id
    return d.approval_id


def test_an_agent_may_not_decide_anything(make_gate: Any) -> None:
    gate = make_gate(policy=POLICY)
    agent, _ = gate.add_principal("bot", "agent")
    approval_id = _approval(gate, "someone")
    acting = gate.acting_as(agent)
    for call in (lambda: acting.approve(approval_id), lambda: acting.deny(approval_id),
                 lambda: acting.resolve("refund:1", "failed"), lambda: acting.unwind("g"),
                 lambda: acting.reconcile("refund:1")):
        with pytest.raises(eg.Forbidden):
            call()
    assert gate.approval(approval_id).state is eg.ApprovalState.PENDING


def test_an_operator_decides_as_itself(make_gate: Any) -> None:
    gate = make_gate(policy=POLICY)
    alice, _ = gate.add_principal("alice", "operator")
    approval_id = _approval(gate, "bot")
    record = gate.acting_as(alice).approve(approval_id)
    assert record.decided_by == "alice"


def test_self_approval_is_judged_on_principal_names(make_gate: Any) -> None:
    gate = make_gate(policy=POLICY)
    alice, _ = gate.add_principal("alice", "operator")
    approval_id = _approval(gate, "Alice")  # the requester, as the agent spelled it
    with pytest.raises(eg.InvalidTransition, match="own request"):
        gate.acting_as(alice).approve(approval_id)
    assert gate.approval(approval_id).state is eg.ApprovalState.PENDING


def test_resolve_and_unwind_record_the_principal(gate: eg.Gate) -> None:
    alice, _ = gate.add_principal("alice", "operator")
    d = gate.begin(effect_type="x", key="k:1", payload={}, lease_seconds=60)
    gate.report(d, "ambiguous", error="timeout")
    done = gate.acting_as(alice).resolve("k:1", "committed", note="seen at vendor")
    assert done.history[-1].by == "alice" and done.state is eg.State.COMMITTED


def test_reconcile_now_records_who_asked(gate: eg.Gate) -> None:
    alice, _ = gate.add_principal("alice", "operator")

    @gate.reconciler("x")
    def ask(record: eg.EffectRecord) -> str:
        return "committed"

    d = gate.begin(effect_type="x", key="k:2", payload={})
    gate.report(d, "ambiguous", error="timeout")
    done = gate.acting_as(alice).reconcile("k:2")
    assert done.state is eg.State.COMMITTED
    assert done.history[-1].by is not None and done.history[-1].by.startswith("alice via ")
    with pytest.raises(eg.InvalidTransition):
        gate.acting_as(alice).reconcile("k:2")  # not ambiguous any more


def test_cli_principals_add_ls_revoke(store_url: str, namespace: str) -> None:
    runner = CliRunner()
    base = ["--url", store_url, "--namespace", namespace]
    out = runner.invoke(main, ["principals", "add", "ops-1", "--role", "operator", *base,
                               "--json"])
    assert out.exit_code == 0, out.output
    token = json.loads(out.output)["token"]
    plain = runner.invoke(main, ["principals", "add", "bot-1", "--role", "agent", *base,
                                 "--plain"])
    assert plain.exit_code == 0 and plain.output.strip().startswith("egp_")
    listed = runner.invoke(main, ["principals", "ls", *base, "--json"])
    assert [p["name"] for p in json.loads(listed.output)] == ["bot-1", "ops-1"]
    assert token not in listed.output
    assert runner.invoke(main, ["principals", "revoke", "ops-1", *base]).exit_code == 0
    with eg.Gate(store_url, namespace=namespace) as gate, pytest.raises(eg.Unauthenticated):
        gate.authenticate(token)
    bad = runner.invoke(main, ["principals", "add", "X Y", "--role", "operator", *base])
    assert bad.exit_code == 2
    bad = runner.invoke(main, ["principals", "add", "z", "--role", "root", *base])
    assert bad.exit_code == 2


# -- an Acting asks the store before each act (red team, round 3) ------------------------------

def _acts(gate: eg.Gate, acting: Any) -> dict[str, Any]:
    """One call of each of an Acting's decisions, on effects and an approval made for it."""
    approval_id = _approval(gate, "bot")
    d = gate.begin(effect_type="x", key="k:settle", payload={}, group_key="g")
    gate.report(d, "ambiguous", error="timeout")
    gate.reconciler("x")(lambda record: "failed")
    return {
        "approve": lambda: acting.approve(approval_id),
        "deny": lambda: acting.deny(approval_id, reason="no"),
        "resolve": lambda: acting.resolve("k:settle", "failed", note="seen"),
        "reconcile": lambda: acting.reconcile("k:settle"),
        "unwind": lambda: acting.unwind("g"),
    }


ACTS = ("approve", "deny", "resolve", "reconcile", "unwind")


@pytest.mark.parametrize("act", ACTS)
def test_an_acting_of_a_revoked_operator_is_refused(make_gate: Any, act: str) -> None:
    """Revocation is seen by an Acting made before it: every act asks the store again, is
    refused with Unauthenticated, and writes nothing."""
    gate = make_gate(policy=POLICY)
    alice, _ = gate.add_principal("alice", "operator")
    acting = gate.acting_as(alice)
    calls = _acts(gate, acting)
    gate.revoke_principal("alice")
    before = snapshot(gate)
    with pytest.raises(eg.Unauthenticated) as info:
        calls[act]()
    assert info.value.reason == "revoked"
    assert snapshot(gate) == before


@pytest.mark.parametrize("act", ACTS)
def test_an_operator_of_one_namespace_decides_nothing_in_another(make_gate: Any,
                                                                  act: str) -> None:
    """Tenant A's operator is not tenant B's, even when B has an operator of the same name."""
    gate_a = make_gate(policy=POLICY)
    gate_b = gate_a.in_namespace(gate_a.namespace + "-b")
    _, token = gate_a.add_principal("alice", "operator")
    gate_b.add_principal("alice", "operator")
    alice_a = gate_a.authenticate(token)
    assert alice_a.namespace == gate_a.namespace
    with pytest.raises(eg.Unauthenticated) as info:
        gate_b.acting_as(alice_a)
    assert info.value.reason == "another namespace"
    # An Acting made on A's gate and pointed at B's (a gate swapped under it) is refused too.
    acting = gate_a.acting_as(alice_a)
    calls = _acts(gate_b, acting)
    acting.gate = gate_b
    before = snapshot(gate_b)
    with pytest.raises(eg.Unauthenticated):
        calls[act]()
    assert snapshot(gate_b) == before


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kind", ["unknown name", "agent as operator", "other creation"])
def test_a_principal_the_store_never_issued_is_refused(make_gate: Any, act: str,
                                                       kind: str) -> None:
    """A Principal built by hand never acts: an unknown name, an agent dressed as an operator,
    or a name the store knows with another creation time."""
    import datetime

    gate = make_gate(policy=POLICY)
    alice, _ = gate.add_principal("alice", "operator")
    bot, _ = gate.add_principal("bot-9", "agent")
    invented = {
        "unknown name": alice._replace(name="mallory"),
        "agent as operator": bot._replace(role="operator"),
        "other creation": alice._replace(
            created_at=alice.created_at + datetime.timedelta(seconds=1)),
    }[kind]
    calls = _acts(gate, gate.acting_as(invented))
    before = snapshot(gate)
    with pytest.raises(eg.Unauthenticated) as info:
        calls[act]()
    assert info.value.reason == ("unknown principal" if kind == "unknown name"
                                 else "not as issued")
    assert snapshot(gate) == before
    # The principal the store did issue acts (the refusal was about the invented one).
    assert gate.acting_as(alice).resolve("k:settle", "failed").state is eg.State.FAILED
