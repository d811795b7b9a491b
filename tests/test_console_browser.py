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


def test_resolve_an_ambiguous_effect_with_a_note(page: Any, live: Live, shot: Any) -> None:
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
    shot(page, "ambiguous")
    row.get_by_role("combobox", name="outcome").select_option("failed")
    row.get_by_label("note").fill("no charge in the Stripe dashboard")
    row.get_by_role("button", name="Resolve").click()
    expect(page.get_by_role("status")).to_have_text("Resolved charge:77: failed")
    shot(page, "resolved")
    record = gate.get("charge:77")
    assert record.state is eg.State.FAILED
    assert (record.history[-1].by, record.history[-1].note) == (
        "alice", "no charge in the Stripe dashboard")
    page.goto("/ambiguous")
    other = page.get_by_role("row").filter(has_text="check:1")
    other.get_by_role("button", name="Reconcile now").click()
    expect(page.get_by_role("status")).to_have_text("Reconciled check:1: committed")
    assert gate.get("check:1").history[-1].by.startswith("alice via reconciler:")
    page.goto("/ambiguous")
    expect(page.get_by_text("No ambiguous effects")).to_be_visible()


def test_a_live_lease_refuses_resolve_and_shows_its_expiry(page: Any, live: Live,
                                                           shot: Any) -> None:
    gate = live.gate
    d = gate.begin(effect_type="email.send", key="welcome:u1", payload={}, lease_seconds=900)
    sign_in(page, live, shot)
    page.goto(f"/effects/{d.effect_id}")
    expect(page.get_by_role("heading", name=f"Effect #{d.effect_id}")).to_be_visible()
    shot(page, "effect")
    page.get_by_role("button", name="Resolve").click()
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("lease is live")
    expiry = d.lease_expires_at
    assert expiry is not None
    expect(alert).to_contain_text(f"until {expiry:%Y-%m-%d %H:%M}")
    shot(page, "resolve_refused")
    assert gate.get("welcome:u1").state is eg.State.IN_FLIGHT


def test_unwind_a_saga(page: Any, live: Live, shot: Any) -> None:
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
    shot(page, "saga")
    page.get_by_role("button", name="Unwind").click()
    expect(page.get_by_role("status")).to_have_text("Unwound trip:9: 2 compensated")
    shot(page, "unwound")
    assert gate.undone == ["trip:9:hotel", "trip:9:flight"]  # type: ignore[attr-defined]
    page.get_by_role("button", name="Unwind").click()  # again: nothing runs twice
    expect(page.get_by_role("status")).to_contain_text("Unwound trip:9")
    assert gate.undone == ["trip:9:hotel", "trip:9:flight"]  # type: ignore[attr-defined]


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
