"""What the console's actions answer and write, over plain HTTP (Starlette's TestClient), on
SQLite and Postgres: every form that writes answers 303 (redirect-after-POST); a resolve is
confirmed before anything is written and is offered only where the state machine allows;
sessions live in the store (a copied cookie dies at sign-out, in every console); principals
are managed behind the session and CSRF; every action lands in the audit."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from markupsafe import escape
from sqlalchemy import text
from starlette.testclient import TestClient

import effectgate as eg
from effectgate.console import SESSION_COOKIE, build_app

from .conftest import snapshot
from .console_helpers import console_gate, csrf_of, sign_in


@pytest.fixture
def cgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    gate = console_gate(store_url, namespace)
    yield gate
    gate.close()


@pytest.fixture
def client(cgate: eg.Gate) -> Iterator[TestClient]:
    with TestClient(build_app(cgate), base_url="http://127.0.0.1") as c:
        yield c


def _signed_in(gate: eg.Gate, client: TestClient, name: str = "alice") -> str:
    _, token = gate.add_principal(name, "operator")
    return sign_in(client, token)


def _seen(page: str) -> str:
    match = re.search(r'name="seen" value="([^"]+)"', page)
    assert match, "no confirmation form"
    return match.group(1)


def _post_forms(html: str) -> set[str]:
    return set(re.findall(r'<form[^>]*method="post"[^>]*action="([^"]+)"', html))


def test_every_form_that_writes_answers_with_a_redirect(cgate: eg.Gate,
                                                        client: TestClient) -> None:
    """Every POST form on every page, exercised: each answers 303 to a page to GET."""
    csrf = _signed_in(cgate, client)
    a1 = cgate.begin(effect_type="payment.refund", key="refund:1", payload={}, agent_id="bot")
    a2 = cgate.begin(effect_type="payment.refund", key="refund:2", payload={}, agent_id="bot")
    amb = cgate.begin(effect_type="vendor.checked", key="check:1", payload={})
    cgate.report(amb, "ambiguous")
    other = cgate.begin(effect_type="x.y", key="x:1", payload={})
    cgate.report(other, "ambiguous")
    step = cgate.begin(effect_type="trip.car", key="trip:1:car", payload={}, group_key="trip:1",
                       compensation={"cancel": "car"})
    cgate.report(step, "committed")
    cgate.add_principal("bob", "agent")
    pages = ["/", "/approvals", f"/approvals/{a1.approval_id}", "/ambiguous", "/effects",
             f"/effects/{other.effect_id}", "/groups", "/groups/view?group=trip%3A1",
             "/principals", "/audit",
             f"/effects/{other.effect_id}/resolve?outcome=failed&back=%2Fambiguous",
             "/groups/unwind?group=trip%3A1"]
    offered: set[str] = set()
    for path in pages:
        page = client.get(path)
        assert page.status_code == 200, path
        offered |= _post_forms(page.text)
    seen = _seen(client.get(f"/effects/{other.effect_id}/resolve?outcome=failed").text)
    saga_seen = _seen(client.get("/groups/unwind?group=trip%3A1").text)
    posts = [
        (f"/approvals/{a1.approval_id}/approve", {}),
        (f"/approvals/{a2.approval_id}/deny", {"reason": "no"}),
        (f"/effects/{amb.effect_id}/reconcile", {"back": "/ambiguous"}),
        (f"/effects/{other.effect_id}/resolve", {"outcome": "failed", "seen": seen,
                                                  "back": "/ambiguous"}),
        ("/groups/unwind", {"group": "trip:1", "seen": saga_seen}),
        ("/principals", {"name": "carol", "role": "operator"}),
        ("/principals/revoke", {"name": "bob"}),
        ("/logout", {}),
    ]
    done = {path for path, _ in posts}
    templated = {re.sub(r"/(apr_[0-9a-f]+|\d+)/", "/ID/", p) for p in offered}
    assert templated <= {re.sub(r"/(apr_[0-9a-f]+|\d+)/", "/ID/", p) for p in done}, (
        "a form this test does not exercise", templated)
    for path, data in posts:
        r = client.post(path, data={"csrf_token": csrf, **data}, follow_redirects=False)
        assert r.status_code == 303, (path, r.status_code, r.text[:300])
        assert r.headers["location"].startswith("/"), path
        assert r.headers["location"] != path or path == "/principals", path
    assert cgate.get("x:1").state is eg.State.FAILED
    assert cgate.get("compensate:trip:1:car").state is eg.State.COMMITTED
    assert [p.name for p in cgate.list_principals()] == ["alice", "bob", "carol"]


def test_the_confirmation_writes_nothing_and_a_stale_or_unchosen_resolve_is_refused(
        cgate: eg.Gate, client: TestClient) -> None:
    csrf = _signed_in(cgate, client)
    d = cgate.begin(effect_type="payment.charge", key="charge:1", payload={}, lease_seconds=1)
    cgate.report(d, "ambiguous", error="timeout")
    before = snapshot(cgate)
    page = client.get(f"/effects/{d.effect_id}/resolve?outcome=committed&note=seen+it")
    assert page.status_code == 200 and "what will be recorded" in page.text
    assert "<strong>committed</strong>" in page.text and "seen it" in page.text
    assert "charge:1" in page.text
    seen = _seen(page.text)
    for query in ("", "outcome=", "outcome=Committed", "outcome=maybe"):
        r = client.get(f"/effects/{d.effect_id}/resolve?{query}")
        assert r.status_code == 200 and "Choose what happened" in r.text
        assert 'name="seen"' not in r.text  # nothing to confirm
    for data in ({}, {"outcome": ""}, {"outcome": "maybe"}, {"outcome": "COMMITTED"}):
        r = client.post(f"/effects/{d.effect_id}/resolve",
                        data={"csrf_token": csrf, "seen": seen, **data})
        assert "choose what happened" in r.text
    assert snapshot(cgate) == before
    # The effect moves between review and confirmation: the confirmation is refused.
    again = cgate.begin(effect_type="payment.charge", key="charge:1", payload={})
    assert again.decision is eg.Decision.BLOCKED  # still ambiguous, nothing moved
    cgate.resolve("charge:1", "failed", by="bob")
    moved = snapshot(cgate)
    r = client.post(f"/effects/{d.effect_id}/resolve",
                    data={"csrf_token": csrf, "outcome": "committed", "seen": seen})
    assert "changed since you reviewed it" in r.text and 'role="alert"' in r.text
    assert snapshot(cgate) == moved
    assert cgate.get("charge:1").state is eg.State.FAILED


def test_a_confirmation_raced_by_another_verdict_is_refused(
        cgate: eg.Gate, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review is checked when the verdict is written, not only when the console reads
    the effect: another operator's verdict landing between the two (two operators confirming
    one review at once) refuses this one, and only the first is recorded."""
    csrf = _signed_in(cgate, client)
    d = cgate.begin(effect_type="payment.charge", key="charge:1", payload={})
    cgate.report(d, "ambiguous", error="timeout")
    seen = _seen(client.get(f"/effects/{d.effect_id}/resolve?outcome=committed").text)
    read = cgate.get_by_id
    raced: list[str] = []

    def read_then_raced(effect_id: int) -> eg.EffectRecord:
        record = read(effect_id)
        if not raced:  # bob's verdict lands after the console's read, once
            raced.append(cgate.resolve("charge:1", "failed", by="bob").key)
        return record

    monkeypatch.setattr(cgate, "get_by_id", read_then_raced)
    r = client.post(f"/effects/{d.effect_id}/resolve",
                    data={"csrf_token": csrf, "outcome": "committed", "seen": seen})
    assert raced and "changed since it was reviewed" in r.text and 'role="alert"' in r.text
    monkeypatch.undo()
    record = cgate.get("charge:1")
    assert record.state is eg.State.FAILED
    assert [(h.to_state, h.by) for h in record.history if h.by] == [(eg.State.FAILED, "bob")]


@pytest.mark.parametrize("setup, offered", [
    ("ambiguous", ["committed", "failed"]),
    ("failed", ["committed"]),
    ("committed", []),
    ("pending", []),
    ("live", ["force"]),
])
def test_resolve_is_offered_only_where_the_state_machine_allows(
        cgate: eg.Gate, client: TestClient, setup: str, offered: list[str]) -> None:
    _signed_in(cgate, client)
    if setup == "pending":
        d = cgate.begin(effect_type="payment.refund", key="k:1", payload={}, agent_id="bot")
    else:
        d = cgate.begin(effect_type="t.x", key="k:1", payload={}, lease_seconds=900)
        if setup != "live":
            cgate.report(d, setup)
    page = client.get(f"/effects/{d.effect_id}").text
    form = re.search(r'<form[^>]*action="/effects/\d+/resolve".*?</form>', page, re.S)
    if not offered:
        assert form is None and "Force a resolve" not in page
        return
    assert form is not None
    options = re.findall(r'<option value="([a-z]*)"', form.group(0))
    assert options[0] == ""  # "choose…": no default
    if offered == ["force"]:
        assert 'name="force" value="1"' in form.group(0) and "Force resolve…" in form.group(0)
        assert "it may still be running" in page and "<h2>Resolve</h2>" not in page
        assert options[1:] == ["committed", "failed"]
    else:
        assert 'name="force"' not in form.group(0) and "<h2>Resolve</h2>" in page
        assert options[1:] == offered


def test_a_copied_session_dies_at_sign_out_in_every_console(cgate: eg.Gate,
                                                            client: TestClient) -> None:
    """Two consoles on one store (two apps: nothing shared but the store) agree on a
    session; signing out in one ends it in both; an expired session is refused too."""
    csrf = _signed_in(cgate, client)
    stolen = client.cookies[SESSION_COOKIE]
    with TestClient(build_app(cgate), base_url="http://127.0.0.1") as other:
        other.cookies.set(SESSION_COOKIE, stolen)
        assert other.get("/", follow_redirects=False).status_code == 200
        assert client.post("/logout", data={"csrf_token": csrf},
                           follow_redirects=False).status_code == 303
        assert other.get("/", follow_redirects=False).status_code == 303
        assert other.post("/logout", data={"csrf_token": csrf},
                          follow_redirects=False).status_code == 401
    client.cookies.set(SESSION_COOKIE, stolen)
    assert client.get("/approvals", follow_redirects=False).status_code == 303
    csrf = sign_in(client, cgate.add_principal("bob", "operator")[1])
    with cgate.store.engine.begin() as conn:
        conn.execute(text("UPDATE effectgate_sessions SET expires_at = expires_at - 86400 "
                          "WHERE namespace = :ns AND name = 'bob'"), {"ns": cgate.namespace})
    assert client.get("/", follow_redirects=False).status_code == 303
    with cgate.store.engine.connect() as conn:
        stored = conn.execute(text("SELECT id FROM effectgate_sessions WHERE namespace = :ns"),
                              {"ns": cgate.namespace}).scalars().all()
    assert stolen not in stored and all(len(s) == 64 for s in stored)  # hashes, not cookies


def test_a_revoked_operator_loses_every_session_at_once(cgate: eg.Gate,
                                                        client: TestClient) -> None:
    _signed_in(cgate, client)
    assert client.get("/", follow_redirects=False).status_code == 200
    cgate.revoke_principal("alice")
    assert client.get("/", follow_redirects=False).status_code == 303


def test_principal_management_needs_the_session_and_csrf_and_bad_input_changes_nothing(
        cgate: eg.Gate, client: TestClient) -> None:
    anonymous = client.post("/principals", data={"name": "eve", "role": "operator",
                                                 "csrf_token": "x"}, follow_redirects=False)
    assert anonymous.status_code == 401
    assert client.get("/principals", follow_redirects=False).status_code == 303
    csrf = _signed_in(cgate, client)
    before = [p.name for p in cgate.list_principals()]
    for data in ({"name": "eve", "role": "operator"},
                 {"name": "eve", "role": "operator", "csrf_token": "forged"}):
        assert client.post("/principals", data=data).status_code == 403
    for data, says in (({"name": "eve"}, "choose a role"),
                       ({"name": "Eve", "role": "operator"}, "lower-case"),
                       ({"name": "eve\u202e", "role": "operator"}, "lower-case"),
                       ({"name": "eve", "role": "root"}, "role must be one of"),
                       ({"name": "alice", "role": "agent"}, "exists already")):
        r = client.post("/principals", data={"csrf_token": csrf, **data})
        assert r.status_code == 200 and says in r.text, (data, r.text[-400:])
    for data, says in (({"name": "alice"}, "cannot revoke yourself"),
                       ({"name": "nobody"}, "no principal named"),
                       ({"name": "NOT valid"}, "lower-case")):
        r = client.post("/principals/revoke", data={"csrf_token": csrf, **data})
        assert r.status_code == 200 and says in r.text, (data, r.text[-400:])
    assert [p.name for p in cgate.list_principals()] == before
    assert not cgate.list_principals()[0].revoked
    r = client.post("/principals", data={"csrf_token": csrf, "name": "eve", "role": "agent"},
                    follow_redirects=False)
    assert r.headers["location"] == "/principals/created"
    cookie = next(v for k, v in r.headers.multi_items()
                  if k == "set-cookie" and v.startswith("eg_new_token="))
    assert "Path=/principals/created" in cookie and "HttpOnly" in cookie
    assert "SameSite=strict" in cookie and "Max-Age=60" in cookie
    shown = client.get("/principals/created").text
    token = re.search(r"egp_[A-Za-z0-9_-]{43}", shown)
    assert token and cgate.authenticate(token.group(0)).name == "eve"
    assert re.search(r"egp_[A-Za-z0-9_-]{43}", client.get("/principals/created").text) is None


def test_every_console_action_is_in_the_audit_with_who_and_when(cgate: eg.Gate,
                                                                client: TestClient) -> None:
    from effectgate.audit import list_actions

    csrf = _signed_in(cgate, client)
    asked = cgate.begin(effect_type="payment.refund", key="refund:9", payload={},
                        agent_id="bot")
    client.post(f"/approvals/{asked.approval_id}/approve", data={"csrf_token": csrf})
    d = cgate.begin(effect_type="vendor.checked", key="check:9", payload={})
    cgate.report(d, "ambiguous")
    client.post(f"/effects/{d.effect_id}/reconcile", data={"csrf_token": csrf})
    client.post("/logout", data={"csrf_token": csrf})
    got = [(e.actor, e.action, e.subject, e.via) for e in list_actions(cgate)]
    assert got == [("alice", "logout", None, "console"),
                   ("alice", "reconcile", "check:9", "console"),
                   ("alice", "approve", "refund:9", "console"),
                   ("alice", "login", None, "console")]
    reconciled = list_actions(cgate, action="reconcile")[0]
    assert reconciled.detail == "verdict: committed" and reconciled.effect_id == d.effect_id
    assert list_actions(cgate, actor="bob") == []
    first_page = list_actions(cgate, limit=2)
    assert [e.action for e in first_page] == ["logout", "reconcile"]
    rest = list_actions(cgate, before_id=first_page[-1].entry_id)
    assert [e.action for e in rest] == ["approve", "login"]


@pytest.mark.parametrize("bad", [
    {"actor": ""}, {"actor": None}, {"actor": "x" * 257}, {"action": "drop"},
    {"action": "LOGIN"}, {"via": "Console"}, {"via": ""}, {"via": "x" * 17},
    {"subject": "s" * 513}, {"effect_id": 0}, {"effect_id": True}, {"detail": "a\x00b"},
])
def test_audit_bad_input_is_a_config_error_and_writes_nothing(gate: eg.Gate,
                                                              bad: dict[str, Any]) -> None:
    from effectgate.audit import list_actions, record_action

    args: dict[str, Any] = {"actor": "alice", "action": "login", "via": "cli", **bad}
    actor, action = args.pop("actor"), args.pop("action")
    with pytest.raises(eg.ConfigError):
        record_action(gate, actor, action, **args)
    assert list_actions(gate) == []
    with pytest.raises(eg.ConfigError):
        list_actions(gate, limit=501)
    with pytest.raises(eg.ConfigError):
        list_actions(gate, action="drop")


def test_the_login_page_and_redirects_keep_no_session_for_anonymous_visitors(
        cgate: eg.Gate, client: TestClient) -> None:
    page = client.get("/login")
    assert SESSION_COOKIE not in page.cookies
    assert csrf_of(page.text)
    with cgate.store.engine.connect() as conn:
        count = conn.execute(text("SELECT count(*) FROM effectgate_sessions WHERE "
                                  "namespace = :ns"), {"ns": cgate.namespace}).scalar()
    assert count == 0


def test_the_effect_page_names_a_decided_approval_the_effect_still_waits_on(
        store_url: str, namespace: str) -> None:
    """Approved, then refused by a spend ceiling when its call came: the effect still waits,
    approved. Its page names the approval, who decided it and when, and says — in ``show``'s
    words — that the next call runs it only if the ceilings have room then. The request's old
    reason is not all it shows."""
    from effectgate.cli.read import decided_next

    with eg.Gate(store_url, namespace=namespace, policy={"effects": {"pay.*": {
            "approval": "always", "budget": {"per_effect_type_micros": 1_000}}}}) as gate:
        asks = [gate.begin(effect_type="pay.card", key=f"pay:{n}", payload={"n": n},
                           estimated_cost_micros=800) for n in (1, 2, 3)]
        for d in asks[:2]:
            gate.approve(d.approval_id, by="bob")
        gate.deny(asks[2].approval_id, by="carol", reason="not this one")
        assert gate.begin(effect_type="pay.card", key="pay:1", payload={"n": 1},
                          estimated_cost_micros=800).decision is eg.Decision.EXECUTE
        refused = gate.begin(effect_type="pay.card", key="pay:2", payload={"n": 2},
                             estimated_cost_micros=800)
        assert refused.decision is eg.Decision.DENIED
        waiting = gate.get("pay:2")
        assert waiting.state is eg.State.PENDING_APPROVAL
        approved = gate.approval(asks[1].approval_id)
        with TestClient(build_app(gate), base_url="http://127.0.0.1") as client:
            _signed_in(gate, client)
            page = " ".join(client.get(f"/effects/{waiting.effect_id}").text.split())
            denied = " ".join(client.get(f"/effects/{asks[2].effect_id}").text.split())
            pending = gate.begin(effect_type="pay.card", key="pay:4", payload={"n": 4},
                                 estimated_cost_micros=1)
            asked = client.get(f"/effects/{pending.effect_id}").text
        assert f"<code>{approved.approval_id}</code></a> <strong>approved</strong> by bob at " \
               f"{approved.decided_at:%Y-%m-%d %H:%M:%S} UTC" in page, page
        assert str(escape(decided_next("approved"))) in page
        assert "if the policy&#39;s spend ceilings have room for it then" in page
        # a denial ends the effect (DENIED: it waits on nothing); a pending request: nothing
        # decided to name
        assert 'class="decided"' not in denied and 'class="decided"' not in asked
