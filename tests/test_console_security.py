"""The console over plain HTTP (Starlette's TestClient), on SQLite and Postgres: who may see
and do what, CSRF, cookies from another store, binds off localhost."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import effectgate as eg
from effectgate.cli import main
from effectgate.console import SESSION_COOKIE, build_app, check_console_bind

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


def _ask(gate: eg.Gate, key: str = "refund:1", agent: str = "bot") -> str:
    d = gate.begin(effect_type="payment.refund", key=key, payload={"amount": 5},
                   agent_id=agent)
    assert d.approval_id
    return d.approval_id


def _pending(gate: eg.Gate, approval_id: str) -> bool:
    return gate.approval(approval_id).state is eg.ApprovalState.PENDING


def test_without_a_session_pages_redirect_and_actions_are_401(cgate: eg.Gate,
                                                             client: TestClient) -> None:
    approval_id = _ask(cgate)
    for path in ("/", "/approvals", f"/approvals/{approval_id}", "/ambiguous", "/effects",
                 "/effects/1", "/groups"):
        r = client.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login?next=")
    r = client.post(f"/approvals/{approval_id}/approve", data={"csrf_token": "x"},
                    follow_redirects=False)
    assert r.status_code == 401
    assert _pending(cgate, approval_id)


def test_wrong_and_revoked_tokens_do_not_sign_in(cgate: eg.Gate, client: TestClient) -> None:
    _, token = cgate.add_principal("alice", "operator")
    page = client.get("/login")
    r = client.post("/login", data={"token": "egp_" + "x" * 43, "csrf_token": csrf_of(page.text)})
    assert r.status_code == 401 and "Invalid or revoked token." in r.text
    csrf = sign_in(client, token)
    cgate.revoke_principal("alice")
    r = client.get("/approvals", follow_redirects=False)  # the session dies with the token
    assert r.status_code == 303
    assert client.post("/logout", data={"csrf_token": csrf},
                       follow_redirects=False).status_code == 401


def test_an_agent_token_cannot_sign_in_or_approve(cgate: eg.Gate, client: TestClient) -> None:
    _, token = cgate.add_principal("bot-1", "agent")
    approval_id = _ask(cgate)
    page = client.get("/login")
    r = client.post("/login", data={"token": token, "csrf_token": csrf_of(page.text)},
                    follow_redirects=False)
    assert r.status_code == 403 and SESSION_COOKIE not in client.cookies
    r = client.post(f"/approvals/{approval_id}/approve", data={"csrf_token": "x"},
                    follow_redirects=False)
    assert r.status_code == 401
    assert _pending(cgate, approval_id)


def test_login_needs_its_csrf_nonce(cgate: eg.Gate, client: TestClient) -> None:
    _, token = cgate.add_principal("alice", "operator")
    client.get("/login")
    for data in ({"token": token}, {"token": token, "csrf_token": "forged"}):
        r = client.post("/login", data=data, follow_redirects=False)
        assert r.status_code == 403
    assert SESSION_COOKIE not in client.cookies


def test_missing_or_forged_csrf_is_refused(cgate: eg.Gate, client: TestClient) -> None:
    _, token = cgate.add_principal("alice", "operator")
    approval_id = _ask(cgate)
    csrf = sign_in(client, token)
    for data in ({}, {"csrf_token": ""}, {"csrf_token": "forged"},
                 {"csrf_token": csrf[:-1] + ("A" if csrf[-1] != "A" else "B")}):
        r = client.post(f"/approvals/{approval_id}/approve", data=data,
                        follow_redirects=False)
        assert r.status_code == 403 and "CSRF token missing or invalid" in r.text
    assert _pending(cgate, approval_id)
    r = client.post(f"/approvals/{approval_id}/approve", data={"csrf_token": csrf},
                    follow_redirects=False)
    assert r.status_code == 303
    assert cgate.approval(approval_id).decided_by == "alice"


def test_a_session_cookie_from_another_store_is_refused(cgate: eg.Gate, client: TestClient,
                                                        tmp_path: Path) -> None:
    other = console_gate(f"sqlite:///{tmp_path / 'other.db'}", cgate.namespace)
    _, token = other.add_principal("alice", "operator")
    cgate.add_principal("alice", "operator")  # the same name here, another token
    approval_id = _ask(cgate)
    with TestClient(build_app(other), base_url="http://127.0.0.1") as elsewhere:
        csrf = sign_in(elsewhere, token)
        stolen = elsewhere.cookies[SESSION_COOKIE]
    other.close()
    client.cookies.set(SESSION_COOKIE, stolen)
    assert client.get("/approvals", follow_redirects=False).status_code == 303
    r = client.post(f"/approvals/{approval_id}/approve", data={"csrf_token": csrf},
                    follow_redirects=False)
    assert r.status_code == 401
    assert _pending(cgate, approval_id)


def test_an_operator_cannot_approve_its_own_request(cgate: eg.Gate,
                                                    client: TestClient) -> None:
    _, token = cgate.add_principal("alice", "operator")
    approval_id = _ask(cgate, agent="alice")
    csrf = sign_in(client, token)
    r = client.post(f"/approvals/{approval_id}/approve", data={"csrf_token": csrf})
    assert r.status_code == 200 and "cannot approve its own request" in r.text
    assert 'role="alert"' in r.text
    assert _pending(cgate, approval_id)


def test_deny_with_a_reason_and_pages_escape_agent_text(cgate: eg.Gate,
                                                        client: TestClient) -> None:
    _, token = cgate.add_principal("alice", "operator")
    d = cgate.begin(effect_type="payment.refund", key="refund:<b>x</b>",
                    payload={"note": "<script>alert(1)</script>"}, agent_id="bot")
    assert d.approval_id
    csrf = sign_in(client, token)
    page = client.get(f"/approvals/{d.approval_id}")
    assert "<script>alert(1)" not in page.text and "&lt;script&gt;alert(1)" in page.text
    assert "script-src 'none'" in page.headers["content-security-policy"]
    r = client.post(f"/approvals/{d.approval_id}/deny",
                    data={"csrf_token": csrf, "reason": "not this one"})
    assert r.status_code == 200 and "Denied: refund:&lt;b&gt;x&lt;/b&gt;" in r.text
    record = cgate.approval(d.approval_id)
    assert record.state is eg.ApprovalState.DENIED and record.decided_by == "alice"
    assert record.reason == "not this one"


def test_cookies_are_httponly_strict_and_secure_off_localhost(cgate: eg.Gate) -> None:
    _, token = cgate.add_principal("alice", "operator")
    with TestClient(build_app(cgate, secure_cookies=True), base_url="https://console.example") as c:
        page = c.get("/login")
        r = c.post("/login", data={"token": token, "csrf_token": csrf_of(page.text)},
                   follow_redirects=False)
    cookie = next(v for k, v in r.headers.multi_items()
                  if k == "set-cookie" and v.startswith(SESSION_COOKIE))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" in cookie


def test_bad_ids_and_hostile_next_are_harmless(cgate: eg.Gate, client: TestClient) -> None:
    _, token = cgate.add_principal("alice", "operator")
    csrf = sign_in(client, token)
    assert client.get("/effects/999999999").status_code == 404
    assert client.get("/effects/-1").status_code == 400
    assert client.get("/approvals/" + "x" * 300).status_code == 400
    assert client.get("/effects?state=nonsense").status_code == 400
    r = client.post("/effects/999999/resolve", data={"csrf_token": csrf, "outcome": "failed"})
    assert r.status_code == 404
    page = client.get("/login?next=//evil.example/")
    assert 'value="/"' in page.text


def test_binding_off_localhost_needs_tls_or_the_flag(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "192.0.2.1", "::"):
        with pytest.raises(eg.ConfigError, match="without TLS"):
            check_console_bind(host, 8765)
    assert check_console_bind("127.0.0.1", 8765) is False
    assert check_console_bind("0.0.0.0", 8765, insecure_bind=True) is True
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    assert check_console_bind("0.0.0.0", 0, tls_cert=str(cert), tls_key=str(key)) is True
    with pytest.raises(eg.ConfigError, match="go together"):
        check_console_bind("0.0.0.0", 0, tls_cert=str(cert))
    runner = CliRunner()
    started = time.perf_counter()
    out = runner.invoke(main, ["console", "--url", f"sqlite:///{tmp_path / 'e.db'}",
                               "--host", "0.0.0.0", "--port", "0"])
    assert out.exit_code == 2 and "without TLS" in out.output
    assert time.perf_counter() - started < 5
    assert not (tmp_path / "e.db").exists()  # refused before the store was opened


def test_effectgate_console_serves_and_says_where(tmp_path: Path) -> None:
    import sys

    import httpx

    from .mcp_helpers import serving

    url = f"sqlite:///{tmp_path / 'e.db'}"
    with eg.Gate(url) as gate:
        _, token = gate.add_principal("alice", "operator")
    argv = [sys.executable, "-m", "effectgate.cli", "console", "--url", url, "--port", "0"]
    with serving(argv) as served:
        assert served.url.startswith("http://127.0.0.1:") and served.url.endswith("/")
        with httpx.Client(base_url=served.url.rstrip("/"), timeout=20) as http:
            assert http.get("/", follow_redirects=False).status_code == 303
            sign_in(http, token)
            assert "Overview" in http.get("/").text


def test_the_cli_lists_console_and_principals() -> None:
    out = CliRunner().invoke(main, ["--help"])
    assert "  console " in out.output and "  principals " in out.output
    helped = CliRunner().invoke(main, ["console", "--help"])
    assert "--insecure-bind" in helped.output and "Exit codes: 0" in helped.output


def test_oversized_forms_are_refused_before_they_are_read(cgate: eg.Gate,
                                                          client: TestClient) -> None:
    _, token = cgate.add_principal("alice", "operator")
    page = client.get("/login")
    r = client.post("/login", content=b"token=" + b"a" * 70_000 + b"&csrf_token="
                    + csrf_of(page.text).encode(),
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413
    csrf = sign_in(client, token)
    approval_id = _ask(cgate)
    r = client.post(f"/approvals/{approval_id}/deny",
                    content=f"csrf_token={csrf}&reason=".encode() + b"x" * 70_000,
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413
    assert _pending(cgate, approval_id)


def test_the_overview_counts_states_ambiguous_age_approvals_and_spend(
        store_url: str, namespace: str) -> None:
    policy = {"budget": {"per_run_micros": 50_000_000},
              "effects": {"payment.refund": {"approval": {"always": True}}}}
    with eg.Gate(store_url, policy=policy, namespace=namespace) as gate:
        _, token = gate.add_principal("alice", "operator")
        d = gate.begin(effect_type="payment.charge", key="c:1", payload={}, run_id="r1",
                       estimated_cost_micros=2_500_000)
        gate.report(d, "ambiguous", error="timeout")
        d = gate.begin(effect_type="email.send", key="m:1", payload={})
        gate.report(d, "committed")
        _ask(gate)
        with TestClient(build_app(gate), base_url="http://127.0.0.1") as client:
            sign_in(client, token)
            page = client.get("/").text
    cards = re.findall(r'<div class="card"><span>([^<]+)</span><b>([^<]+)</b>', page)
    assert dict(cards) == {"Ambiguous": "1", "Oldest ambiguous": dict(cards)[
        "Oldest ambiguous"], "Pending approvals": "1"}
    assert re.fullmatch(r"\d+s", dict(cards)["Oldest ambiguous"])
    assert "<td>committed</td><td>1</td>" in page
    assert "<td>pending_approval</td><td>1</td>" in page
    assert "*|run|r1" in page and "$2.50" in page


def test_a_nul_in_the_approvals_cursor_is_refused_before_the_store(cgate: eg.Gate,
                                                                   client: TestClient) -> None:
    from .conftest import snapshot

    _, token = cgate.add_principal("alice", "operator")
    sign_in(client, token)
    _ask(cgate)
    before = snapshot(cgate)
    for query in ("before=1.0~a%00b", "before=1.0%00~apr_1", "before=" + "1" * 101 + "~a"):
        r = client.get("/approvals?" + query)
        assert r.status_code == 400, (query, r.text)
        assert "before" in r.text and "Traceback" not in r.text
    assert client.get("/approvals?before=1.0~apr_1").status_code == 200
    assert snapshot(cgate) == before


def test_a_store_that_cannot_answer_is_a_503_page(own_store_url: str) -> None:
    from sqlalchemy import create_engine, text

    with console_gate(own_store_url, "default") as gate:
        _, token = gate.add_principal("alice", "operator")
        _ask(gate)
        with TestClient(build_app(gate), base_url="http://127.0.0.1") as client:
            sign_in(client, token)
            broken = create_engine(own_store_url)
            with broken.begin() as conn:  # the approvals table is gone for a moment
                conn.execute(text("ALTER TABLE effectgate_approvals RENAME TO eg_away"))
            try:
                r = client.get("/approvals")
            finally:
                with broken.begin() as conn:
                    conn.execute(text("ALTER TABLE eg_away RENAME TO effectgate_approvals"))
                broken.dispose()
            assert r.status_code == 503 and r.headers["retry-after"] == "5"
            assert "Store unavailable" in r.text and "Traceback" not in r.text
            assert "alice" in r.text  # still the console's page, signed in
            assert client.get("/approvals").status_code == 200


def test_acting_as_refuses_a_stale_principal_and_does_not_claim_to_catch_a_forged_one(
        cgate: eg.Gate) -> None:
    import datetime

    import effectgate.principals

    alice, _ = cgate.add_principal("alice", "operator")
    approval_id = _ask(cgate)
    elsewhere = alice._replace(created_at=alice.created_at + datetime.timedelta(seconds=1))
    with pytest.raises(eg.Unauthenticated) as refused:  # not the alice this store holds
        cgate.acting_as(elsewhere).approve(approval_id)
    assert refused.value.reason == "not as issued" and _pending(cgate, approval_id)
    cgate.revoke_principal("alice")
    with pytest.raises(eg.Unauthenticated):
        cgate.acting_as(alice).approve(approval_id)
    assert _pending(cgate, approval_id)
    doc = " ".join((effectgate.principals.__doc__ or "").split())
    assert "built by hand) is refused" not in doc  # no Principal carries a secret
    assert "catches a stale principal, not a forged one" in doc
