"""The console driven in a real headless Chromium (Debian's ``/usr/bin/chromium`` through
Playwright's ``executable_path``; never ``playwright install``), served by uvicorn on a free
port, on SQLite and Postgres. Screenshots of every page land in the run's temporary folder
(``console-shots``)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectgate as eg
from effectgate.console import build_app

from .conftest import snapshot
from .console_helpers import console_gate

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect


def _require_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _require_chromium()
    scratch = Path(tempfile.mkdtemp(prefix="eg-chromium-"))
    pw = playwright_api.sync_playwright().start()
    try:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
            env={**os.environ, "TMPDIR": str(scratch), "XDG_CONFIG_HOME": str(scratch),
                 "XDG_CACHE_HOME": str(scratch)},
            timeout=30_000)
    except Exception:
        pw.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    yield chromium
    chromium.close()
    pw.stop()
    shutil.rmtree(scratch, ignore_errors=True)


class Live:
    """A console served by uvicorn in a thread, for one gate."""

    def __init__(self, gate: eg.Gate) -> None:
        import uvicorn

        self.gate = gate
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(build_app(gate), log_level="warning",
                                                    lifespan="off", access_log=False))
        self.thread = threading.Thread(target=self.server.run,
                                       kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
        assert not self.thread.is_alive()


@pytest.fixture
def live(store_url: str, namespace: str) -> Iterator[Live]:
    gate = console_gate(store_url, namespace)
    server = Live(gate)
    yield server
    server.stop()
    gate.close()


@pytest.fixture
def page(browser: Any, live: Live) -> Iterator[Any]:
    context = browser.new_context(base_url=live.url, viewport={"width": 1200, "height": 800})
    context.set_default_timeout(8_000)
    pg = context.new_page()
    yield pg
    context.close()


@pytest.fixture
def shot(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.getbasetemp() / "console-shots"
    folder.mkdir(exist_ok=True)
    counter = iter(range(1, 100))
    taken: list[Path] = []

    def take(pg: Any, label: str) -> Path:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
        path = folder / f"{name}__{next(counter):02d}_{label}.png"
        pg.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000
        taken.append(path)
        return path

    take.taken = taken  # type: ignore[attr-defined]
    return take


def sign_in(page: Any, live: Live, shot: Any, name: str = "alice") -> None:
    _, token = live.gate.add_principal(name, "operator")
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login\?next=%2F$"))
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    shot(page, "login")
    page.get_by_label("Operator token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    cookie = next(c for c in page.context.cookies() if c["name"] == "eg_session")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # HttpOnly, as the browser enforces it


def test_approve_in_the_browser_then_the_agents_retry_runs_once(page: Any, live: Live,
                                                              shot: Any) -> None:
    gate, sent = live.gate, []

    @gate.effect("refund:{txn}", effect_type="payment.refund")
    def refund(txn: str, amount_cents: int) -> dict[str, Any]:
        sent.append(txn)  # the side effect
        return {"refunded": amount_cents}

    with pytest.raises(eg.ApprovalRequired):
        refund("txn_8812", 4200)
    sign_in(page, live, shot)
    expect(page.locator(".card").filter(has_text="Pending approvals")).to_contain_text("1")
    shot(page, "overview")
    page.get_by_role("link", name="Approvals").click()
    row = page.get_by_role("row").filter(has_text="refund:txn_8812")
    expect(row).to_have_count(1)
    expect(row).to_contain_text('"amount_cents": 4200')  # what will execute
    expect(row).to_contain_text('"txn": "txn_8812"')
    shot(page, "approvals")
    row.get_by_role("link").first.click()
    expect(page).to_have_url(re.compile(r"/approvals/[^/]+$"))
    shot(page, "approval")
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.get_by_role("status")).to_have_text("Approved: refund:txn_8812")
    expect(page.get_by_role("row").filter(has_text="refund:txn_8812")).to_have_count(0)
    shot(page, "approved")
    assert refund("txn_8812", 4200) == {"refunded": 4200}
    assert refund("txn_8812", 4200) == {"refunded": 4200}  # a repeat: answered, not run
    assert sent == ["txn_8812"]
    approval = gate.list_approvals(state=None)[0]
    assert approval.decided_by == "alice"


def test_resolve_has_no_default_and_confirms_what_it_records(page: Any, live: Live,
                                                              shot: Any) -> None:
    """Resolve is two steps with no default outcome: the form (which writes nothing) leads to
    a confirmation naming outcome, key and note; only its button writes, and the answer is a
    redirect, so a reload records nothing again."""
    gate = live.gate
    d = gate.begin(effect_type="payment.charge", key="charge:77", payload={"amount": 9},
                   vendor="stripe")
    gate.report(d, "ambiguous", error="read timeout after 30s")
    checked = gate.begin(effect_type="vendor.checked", key="check:1", payload={})
    gate.report(checked, "ambiguous", error="lost reply")
    sign_in(page, live, shot)
    page.get_by_role("link", name="Ambiguous").click()
    row = page.get_by_role("row").filter(has_text="charge:77")
    expect(row).to_contain_text("read timeout after 30s")
    expect(row).to_contain_text("vendor window still covers it")
    outcome = row.get_by_role("combobox", name="outcome")
    expect(outcome).to_have_value("")  # no default verdict
    shot(page, "ambiguous")
    row.get_by_role("button", name="Resolve…").click()  # nothing chosen: the browser refuses
    expect(page).to_have_url(re.compile(r"/ambiguous$"))
    before = snapshot(gate)
    outcome.select_option("failed")
    row.get_by_label("note").fill("no charge in the Stripe dashboard")
    row.get_by_role("button", name="Resolve…").click()
    expect(page.get_by_role("heading", name=re.compile("Confirm: resolve effect"))).to_be_visible()
    told = page.get_by_role("region", name="what will be recorded")
    expect(told).to_contain_text("failed")
    expect(told).to_contain_text("charge:77")
    expect(told).to_contain_text("no charge in the Stripe dashboard")
    expect(told).to_contain_text("alice")
    shot(page, "confirm")
    assert snapshot(gate) == before  # the confirmation wrote nothing
    assert gate.get("charge:77").state is eg.State.AMBIGUOUS
    page.get_by_role("button", name="Record failed").click()
    expect(page).to_have_url(re.compile(r"/ambiguous$"))
    expect(page.get_by_role("status")).to_have_text("Resolved charge:77: failed")
    shot(page, "resolved")
    record = gate.get("charge:77")
    assert record.state is eg.State.FAILED
    assert (record.history[-1].by, record.history[-1].note) == (
        "alice", "no charge in the Stripe dashboard")
    page.reload()  # a GET: nothing is sent again
    assert len(gate.get("charge:77").history) == len(record.history)
    other = page.get_by_role("row").filter(has_text="check:1")
    other.get_by_role("button", name="Reconcile now").click()
    expect(page.get_by_role("status")).to_have_text("Reconciled check:1: committed")
    assert gate.get("check:1").history[-1].by.startswith("alice via reconciler:")
    page.goto("/ambiguous")
    expect(page.get_by_text("No ambiguous effects")).to_be_visible()


def test_a_live_lease_is_offered_only_an_explicit_forced_resolve(page: Any, live: Live,
                                                                 shot: Any) -> None:
    """An effect whose holder's lease is live has no Resolve form; a forced resolve is
    offered apart, says what it risks and the lease's expiry, and is confirmed as forced."""
    gate = live.gate
    d = gate.begin(effect_type="email.send", key="welcome:u1", payload={}, lease_seconds=900)
    sign_in(page, live, shot)
    page.goto(f"/effects/{d.effect_id}")
    expect(page.get_by_role("heading", name=f"Effect #{d.effect_id}")).to_be_visible()
    expect(page.get_by_role("button", name="Resolve…", exact=True)).to_have_count(0)
    expect(page.get_by_role("heading", name="Resolve", exact=True)).to_have_count(0)
    expect(page.get_by_role("heading", name="Force a resolve")).to_be_visible()
    expiry = d.lease_expires_at
    assert expiry is not None
    expect(page.locator(".warning")).to_contain_text(f"live until {expiry:%Y-%m-%d %H:%M}")
    expect(page.locator(".warning")).to_contain_text("it may still be running")
    shot(page, "effect")
    page.get_by_role("combobox", name="outcome").select_option("failed")
    page.get_by_role("button", name="Force resolve…").click()
    told = page.get_by_role("region", name="what will be recorded")
    expect(told).to_contain_text("forced")
    expect(told).to_contain_text(f"{expiry:%Y-%m-%d %H:%M}")
    shot(page, "confirm_forced")
    assert gate.get("welcome:u1").state is eg.State.IN_FLIGHT
    page.get_by_role("button", name="Record failed (forced)").click()
    expect(page.get_by_role("status")).to_have_text("Resolved welcome:u1: failed")
    record = gate.get("welcome:u1")
    assert record.state is eg.State.FAILED
    assert "force-resolved" in (record.reason or "")


def test_unwind_redirects_marks_undone_steps_and_never_claims_twice(page: Any, live: Live,
                                                                    shot: Any) -> None:
    gate = live.gate
    for step in ("flight", "hotel"):
        d = gate.begin(effect_type=f"trip.{step}", key=f"trip:9:{step}", payload={},
                       group_key="trip:9", compensation={"cancel": step})
        gate.report(d, "committed", result={"booked": step})
    sign_in(page, live, shot)
    page.get_by_role("link", name="Sagas").click()
    shot(page, "sagas")
    page.get_by_role("link", name="trip:9").click()
    expect(page.get_by_role("heading", name="Saga trip:9")).to_be_visible()
    expect(page.get_by_role("row").filter(has_text="trip:9:hotel")).to_contain_text("not undone")
    shot(page, "saga")
    page.get_by_role("button", name="Unwind…").click()
    told = page.get_by_role("region", name="what will be undone")  # nothing has run yet
    expect(told.get_by_role("row")).to_have_count(3)
    expect(told.get_by_role("row").nth(1)).to_contain_text("compensate:trip:9:hotel")
    expect(told.get_by_role("row").nth(2)).to_contain_text("compensate:trip:9:flight")
    expect(told).to_contain_text('{"cancel": "hotel"}')
    shot(page, "confirm_unwind")
    assert gate.undone == []  # type: ignore[attr-defined]
    page.get_by_role("button", name="Run 2 undos").click()
    expect(page).to_have_url(re.compile(r"/groups/view\?group=trip%3A9$"))  # a GET
    expect(page.get_by_role("status")).to_have_text("Unwound trip:9: 2 compensated")
    undo = {s: gate.get(f"compensate:trip:9:{s}").effect_id for s in ("flight", "hotel")}
    for step, undo_id in undo.items():
        row = page.get_by_role("row").filter(has_text=f"trip:9:{step}")
        expect(row).to_contain_text(f"compensated by #{undo_id}")
        expect(row.get_by_role("link", name=f"#{undo_id}")).to_have_attribute(
            "href", f"/effects/{undo_id}")
    shot(page, "unwound")
    assert gate.undone == ["trip:9:hotel", "trip:9:flight"]  # type: ignore[attr-defined]
    page.reload()  # nothing is posted again
    expect(page.get_by_role("status")).to_have_count(0)
    page.get_by_role("button", name="Unwind…").click()  # again: nothing would run twice
    expect(page.get_by_role("alert")).to_contain_text("An unwind would run no undo now")
    expect(page.get_by_role("button", name=re.compile("^Run "))).to_have_count(0)
    assert gate.undone == ["trip:9:hotel", "trip:9:flight"]  # type: ignore[attr-defined]
    page.get_by_role("link", name="Back").click()
    page.get_by_role("link", name=f"#{undo['hotel']}").click()
    expect(page.get_by_text("This is the undo of")).to_be_visible()
    page.go_back()
    page.get_by_role("link", name=re.compile(r"^#\d+$")).first.click()
    expect(page.get_by_role("note")).to_contain_text("compensated by")


def test_search_effects_and_open_a_timeline(page: Any, live: Live, shot: Any) -> None:
    gate = live.gate
    for i in range(3):
        d = gate.begin(effect_type="email.send", key=f"mail:{i}", payload={}, run_id="run-7",
                       agent_id="bot")
        gate.report(d, "committed" if i else "failed", error=None if i else "bounced")
    d = gate.begin(effect_type="sms.send", key="sms:1", payload={}, run_id="run-8")
    gate.report(d, "committed")
    sign_in(page, live, shot)
    page.get_by_role("link", name="Effects").click()
    page.get_by_label("key starts with").fill("mail:")
    page.get_by_label("state").select_option("committed")
    page.get_by_label("run").fill("run-7")
    page.get_by_role("button", name="Search").click()
    rows = page.get_by_role("row").filter(has_text="mail:")
    expect(rows).to_have_count(2)
    expect(page.get_by_role("row").filter(has_text="sms:1")).to_have_count(0)
    shot(page, "search")
    page.get_by_role("link", name=re.compile(r"^#\d+$")).first.click()
    expect(page.get_by_role("heading", name="Timeline")).to_be_visible()
    expect(page.get_by_role("row").filter(has_text="in_flight")).not_to_have_count(0)
    shot(page, "timeline")
    assert len(shot.taken) >= 3


def test_approvals_page_searches_pages_and_shows_when_and_which_run(page: Any, live: Live,
                                                                  shot: Any) -> None:
    gate = live.gate
    asked = [gate.begin(effect_type="payment.refund", key=f"refund:{i:03d}",
                        payload={"amount": i}, agent_id="bot" if i % 2 else "other-bot",
                        run_id=f"run-{i % 3}") for i in range(55)]
    sign_in(page, live, shot)
    page.get_by_role("link", name="Approvals").click()
    rows = page.get_by_role("row").filter(has_text="refund:")
    expect(rows).to_have_count(50)  # a page
    expect(page.get_by_text("55 matches; showing 50, newest first.")).to_be_visible()
    newest = page.get_by_role("row").filter(has_text="refund:054")
    created = gate.approval(asked[54].approval_id or "").created_at
    expect(newest).to_contain_text(f"{created:%Y-%m-%d %H:%M:%S} UTC")  # requested at
    expect(newest).to_contain_text("run-0")
    header = page.get_by_role("columnheader")
    expect(header.filter(has_text="requested at")).to_have_count(1)
    expect(header.filter(has_text="run")).to_have_count(1)
    shot(page, "approvals_page_1")
    page.get_by_role("link", name="Older").click()
    expect(page.get_by_role("row").filter(has_text="refund:")).to_have_count(5)
    expect(page.get_by_role("row").filter(has_text="refund:000")).to_have_count(1)
    expect(page.get_by_role("link", name="Older")).to_have_count(0)
    page.get_by_role("link", name="Newest").click()
    expect(page.get_by_role("row").filter(has_text="refund:054")).to_have_count(1)
    page.get_by_label("run").fill("run-1")
    page.get_by_label("requested by").fill("bot")
    page.get_by_role("button", name="Search").click()
    found = page.get_by_role("row").filter(has_text="refund:")
    want = [f"refund:{i:03d}" for i in range(55) if i % 3 == 1 and i % 2]
    expect(found).to_have_count(len(want))
    shot(page, "approvals_search")
    page.get_by_label("key starts with").fill(want[0])
    page.get_by_role("button", name="Search").click()
    expect(page.get_by_role("row").filter(has_text="refund:")).to_have_count(1)
    gate.acting_as(gate.add_principal("carol", "operator")[0]).deny(
        asked[0].approval_id or "", reason="no")
    page.goto("/approvals")
    page.get_by_label("state").select_option("denied")
    page.get_by_label("key starts with").fill("")
    page.get_by_role("button", name="Search").click()
    denied = page.get_by_role("row").filter(has_text="refund:")
    expect(denied).to_have_count(1)
    expect(denied).to_contain_text("denied by carol")


def test_arguments_with_bidi_and_invisible_characters_are_shown_visibly(
        page: Any, live: Live, shot: Any) -> None:
    """U+202E drawn raw turns 2345-6789 into 9876-5432 on screen: the approver sees each
    such character as an escape instead, on the queue and on the approval's page."""
    gate = live.gate
    d = gate.begin(effect_type="payment.refund", key="refund:acct",
                   payload={"to_account": "\u202e2345-6789\u202c", "memo": "pay\u200bme"},
                   agent_id="bot\u2066x\u2069", run_id="r\u200f1")
    sign_in(page, live, shot)
    page.goto("/approvals")
    row = page.get_by_role("row").filter(has_text="refund:acct")
    expect(row).to_contain_text('"to_account": "⟨U+202E⟩2345-6789⟨U+202C⟩"')
    expect(row).to_contain_text('"memo": "pay⟨U+200B⟩me"')
    expect(row).to_contain_text("bot⟨U+2066⟩x⟨U+2069⟩")
    expect(row).to_contain_text("r⟨U+200F⟩1")
    shot(page, "approvals_bidi")
    for path in ("/approvals", f"/approvals/{d.approval_id}", f"/effects/{d.effect_id}"):
        page.goto(path)
        html = page.content()
        for raw in ("\u202e", "\u202c", "\u200b", "\u2066", "\u200f"):
            assert raw not in html, (path, hex(ord(raw)))
    expect(page.get_by_role("cell", name="bot⟨U+2066⟩x⟨U+2069⟩", exact=True)).to_have_count(2)
    shot(page, "effect_bidi")  # the agent id, and the timeline's "by"


def _sign_out(page: Any) -> None:
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.get_by_role("status")).to_have_text("Signed out.")


@pytest.mark.slow
def test_a_copied_session_cookie_is_refused_after_sign_out_by_every_console(
        browser: Any, page: Any, live: Live, shot: Any, store_url: str) -> None:
    """Sessions live in the store: a second console process on it accepts the session, and
    after sign-out in one, a copy of the cookie is refused by both."""
    import sys

    from .mcp_helpers import serving

    sign_in(page, live, shot)
    cookies = page.context.cookies()
    argv = [sys.executable, "-m", "effectgate.cli", "console", "--url", store_url,
            "--namespace", live.gate.namespace, "--port", "0"]
    with serving(argv) as other:
        other_url = other.url.rstrip("/")
        thief = browser.new_context(base_url=live.url)
        thief.add_cookies([{**c, "domain": "127.0.0.1"} for c in cookies])
        stolen = thief.new_page()
        stolen.goto("/")
        expect(stolen.get_by_role("heading", name="Overview")).to_be_visible()
        stolen.goto(other_url + "/")  # the other process: same session (cookies are per host)
        expect(stolen.get_by_role("heading", name="Overview")).to_be_visible()
        _sign_out(page)
        shot(page, "signed_out")
        for url in (live.url + "/", other_url + "/", live.url + "/approvals"):
            stolen.goto(url)
            expect(stolen.get_by_role("heading", name="Sign in")).to_be_visible()
        r = stolen.request.post(live.url + "/logout", form={"csrf_token": "x"},
                                max_redirects=0)
        assert r.status == 401
        thief.close()


def test_principals_add_shows_the_token_once_and_revoke_ends_it(page: Any, live: Live,
                                                                shot: Any) -> None:
    gate = live.gate
    sign_in(page, live, shot)
    page.get_by_role("link", name="Principals").click()
    expect(page.get_by_role("row").filter(has_text="alice")).to_contain_text("you")
    page.get_by_label("name").fill("billing-bot")
    page.get_by_role("button", name="Add principal").click()  # no role chosen: refused
    expect(page).to_have_url(re.compile(r"/principals$"))
    assert [p.name for p in gate.list_principals()] == ["alice"]
    page.get_by_label("role").select_option("agent")
    page.get_by_role("button", name="Add principal").click()
    expect(page).to_have_url(re.compile(r"/principals/created$"))
    token = page.get_by_label("token").inner_text().strip()
    assert gate.authenticate(token).name == "billing-bot"
    shot(page, "token_once")
    page.reload()  # shown once: never again
    expect(page.get_by_role("alert")).to_contain_text("cannot be shown again")
    assert token not in page.content()
    page.goto("/principals")
    page.get_by_label("name").fill("Not A Name!")
    page.get_by_label("role").select_option("operator")
    page.get_by_role("button", name="Add principal").click()
    expect(page.get_by_role("alert")).to_contain_text("lower-case letters")
    assert [p.name for p in gate.list_principals()] == ["alice", "billing-bot"]
    row = page.get_by_role("row").filter(has_text="billing-bot")
    expect(row).to_contain_text("active")
    row.get_by_role("button", name="Revoke billing-bot").click()
    expect(page.get_by_role("status")).to_have_text("Revoked billing-bot")
    expect(page.get_by_role("row").filter(has_text="billing-bot")).to_contain_text("revoked")
    shot(page, "revoked")
    with pytest.raises(eg.Unauthenticated):
        gate.authenticate(token)
    expect(page.get_by_role("button", name="Revoke alice")).to_have_count(0)  # not yourself


def test_the_audit_page_says_who_did_what_and_when(page: Any, live: Live, shot: Any) -> None:
    gate = live.gate
    asked = [gate.begin(effect_type="payment.refund", key=f"refund:{i}", payload={"i": i},
                        agent_id="bot") for i in range(2)]
    d = gate.begin(effect_type="payment.charge", key="charge:5", payload={})
    gate.report(d, "ambiguous", error="timeout")
    step = gate.begin(effect_type="trip.car", key="trip:5:car", payload={}, group_key="trip:5",
                      compensation={"cancel": "car"})
    gate.report(step, "committed")
    sign_in(page, live, shot)
    page.goto(f"/approvals/{asked[0].approval_id}")
    page.get_by_role("button", name="Approve", exact=True).click()
    page.goto(f"/approvals/{asked[1].approval_id}")
    page.get_by_label("reason").fill("too much")
    page.get_by_role("button", name="Deny", exact=True).click()
    page.goto(f"/effects/{d.effect_id}")
    page.get_by_role("combobox", name="outcome").select_option("committed")
    page.get_by_label("note").fill("in the ledger")
    page.get_by_role("button", name="Resolve…").click()
    page.get_by_role("button", name="Record committed").click()
    page.goto("/groups/view?group=trip%3A5")
    page.get_by_role("button", name="Unwind…").click()
    page.get_by_role("button", name="Run 1 undo").click()
    page.goto("/principals")
    page.get_by_label("name").fill("dave")
    page.get_by_label("role").select_option("operator")
    page.get_by_role("button", name="Add principal").click()
    page.goto("/principals")
    page.get_by_role("button", name="Revoke dave").click()
    page.get_by_role("link", name="Audit").click()
    rows = page.get_by_role("row")
    want = [("principal.revoke", "dave"), ("principal.add", "dave"), ("unwind", "trip:5"),
            ("resolve", "charge:5"), ("deny", "refund:1"), ("approve", "refund:0"),
            ("login", "")]
    expect(rows).to_have_count(len(want) + 1)
    for i, (action, subject) in enumerate(want, start=1):
        row = rows.nth(i)
        expect(row.get_by_role("cell").nth(1)).to_have_text("alice")
        expect(row.get_by_role("cell").nth(2)).to_have_text(action)
        expect(row.get_by_role("cell").nth(3)).to_have_text(subject)
        expect(row.get_by_role("cell").nth(4)).to_have_text("console")
    expect(rows.nth(4)).to_contain_text("outcome committed; note: in the ledger")
    expect(rows.nth(5)).to_contain_text("reason: too much")
    expect(rows.nth(3)).to_contain_text("1 compensated now")
    shot(page, "audit")
    page.get_by_label("action").select_option("resolve")
    page.get_by_role("button", name="Search").click()
    expect(page.get_by_role("row")).to_have_count(2)
    page.get_by_role("link", name="charge:5").click()
    expect(page.get_by_role("heading", name=f"Effect #{d.effect_id}")).to_be_visible()
    _sign_out(page)
    from effectgate.audit import list_actions

    entries = list_actions(gate)
    assert [(e.action, e.actor) for e in entries[:2]] == [("logout", "alice"), (
        "principal.revoke", "alice")]
    assert all(e.at.tzinfo is not None for e in entries)
