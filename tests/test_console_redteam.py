"""The console and CLI against a careless operator and a hostile caller, on SQLite and
Postgres: a verdict made on one attempt is never recorded on the next; a bad page cursor is
refused before the store is asked; a store URL is printed without the secrets it carries."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import effectgate as eg
from effectgate.cli import main
from effectgate.cli._common import shown_url
from effectgate.console import build_app

from .conftest import snapshot
from .console_helpers import console_gate, sign_in


@pytest.fixture
def cgate(store_url: str, namespace: str) -> Iterator[eg.Gate]:
    gate = console_gate(store_url, namespace)
    yield gate
    gate.close()


@pytest.fixture
def client(cgate: eg.Gate) -> Iterator[TestClient]:
    with TestClient(build_app(cgate), base_url="http://127.0.0.1") as c:
        yield c


def _resolve_form(page: str, effect_id: int) -> dict[str, str]:
    """The hidden fields of the page's Resolve… form (a GET) for ``effect_id``."""
    match = re.search(rf'<form[^>]*method="get" action="/effects/{effect_id}/resolve">'
                      r"(.*?)</form>", page, re.S)
    assert match, "no Resolve… form on the page"
    return {name: html.unescape(value) for name, value in re.findall(
        r'<input type="hidden" name="([^"]+)" value="([^"]*)">', match.group(1))}


@pytest.mark.parametrize("where", ["/effects/{id}", "/ambiguous"])
def test_a_verdict_made_on_one_attempt_is_not_confirmed_on_the_next(
        cgate: eg.Gate, client: TestClient, where: str) -> None:
    """Alice reads attempt 1 (AMBIGUOUS), checks the vendor, and picks "failed". Before she
    submits, Bob resolves it failed and attempt 2 runs and is lost too (AMBIGUOUS again, same
    effect). Her form leads to a confirmation that refuses: "failed" was about attempt 1;
    recording it on attempt 2 would let a third attempt run what may have happened."""
    _, token = cgate.add_principal("alice", "operator")
    sign_in(client, token)
    first = cgate.begin(effect_type="payment.charge", key="charge:1", payload={"a": 1})
    cgate.report(first, "ambiguous", error="timeout")
    page = client.get(where.format(id=first.effect_id)).text
    form = _resolve_form(page, first.effect_id)
    cgate.resolve("charge:1", "failed", by="bob", note="not in the ledger yet")
    second = cgate.begin(effect_type="payment.charge", key="charge:1", payload={"a": 1})
    assert second.decision is eg.Decision.EXECUTE and second.attempt == 2
    cgate.report(second, "ambiguous", error="timeout again")
    before = snapshot(cgate)
    r = client.get(f"/effects/{first.effect_id}/resolve",
                   params={**form, "outcome": "failed", "note": "not at the vendor"})
    assert r.status_code == 200
    assert "changed since you reviewed it" in r.text and "attempt 2" in r.text
    assert 'method="post"' not in r.text.split("</header>", 1)[1]  # nothing to confirm
    assert snapshot(cgate) == before
    # Reviewed again, the same form on the fresh page confirms as before.
    fresh = _resolve_form(client.get(where.format(id=first.effect_id)).text, first.effect_id)
    ok = client.get(f"/effects/{first.effect_id}/resolve", params={**fresh, "outcome": "failed"})
    assert "what will be recorded" in ok.text and "attempt 2" in ok.text
    assert snapshot(cgate) == before


def test_a_store_url_is_printed_without_its_password_or_query(cgate: eg.Gate,
                                                              store_url: str) -> None:
    """libpq takes ``?password=`` in the query string: ``mcp serve`` (on stderr, at start)
    and ``verify`` (its report) show the store without it — stderr lands in logs."""
    url = f"{store_url}{'&' if '?' in store_url else '?'}password=hunter2"
    serve = subprocess.run([sys.executable, "-m", "effectgate.cli", "mcp", "serve", "--url",
                            url, "-n", cgate.namespace], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60)
    assert "effectgate: mcp serve: store " in serve.stderr and "?***" in serve.stderr
    checked = subprocess.run([sys.executable, "-m", "effectgate.cli", "verify", "--url", url,
                              "--only", "G1", "--json"], capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["url"].endswith("?***")
    for out in (serve.stdout, serve.stderr, checked.stdout, checked.stderr):
        assert "hunter2" not in out
    assert shown_url("postgresql://u:pw@h/db?sslpassword=s") == "postgresql://u:***@h/db?***"
    assert shown_url("not a url \x1b[2J") == "<unprintable url>"


@pytest.mark.parametrize("path", ["/effects", "/ambiguous", "/audit"])
@pytest.mark.parametrize("before", ["abc", "-3", "0", "1.5", "9" * 30, "\uff11", "1\x00"])
def test_a_bad_page_cursor_is_refused_not_ignored(cgate: eg.Gate, client: TestClient,
                                                  path: str, before: str) -> None:
    """``before=`` that is not a positive id is a 400 naming it — not the first page shown
    as though it were the one asked for — and writes nothing."""
    _, token = cgate.add_principal("alice", "operator")
    sign_in(client, token)
    d = cgate.begin(effect_type="x.y", key="x:1", payload={})
    cgate.report(d, "ambiguous")
    before_rows = snapshot(cgate)
    r = client.get(path, params={"before": before})
    assert r.status_code == 400 and "before: not a cursor" in r.text
    assert snapshot(cgate) == before_rows
    assert client.get(path, params={"before": str(d.effect_id + 1)}).status_code == 200


def test_cli_resolve_attempt_refuses_a_verdict_about_an_earlier_attempt(
        cgate: eg.Gate, store_url: str) -> None:
    """``effectgate show`` said attempt 1; by the time the operator types the verdict, Bob has
    resolved it failed and attempt 2 was lost too. ``resolve --failed --attempt 1`` refuses
    (exit 1) and writes nothing; ``--attempt 2`` (checked again) records it."""
    args = ["--url", store_url, "--namespace", cgate.namespace]
    first = cgate.begin(effect_type="payment.charge", key="charge:1", payload={"a": 1})
    cgate.report(first, "ambiguous", error="timeout")
    shown = CliRunner().invoke(main, ["show", "charge:1", "--json", *args])
    assert json.loads(shown.stdout)["attempt"] == 1
    cgate.resolve("charge:1", "failed", by="bob")
    second = cgate.begin(effect_type="payment.charge", key="charge:1", payload={"a": 1})
    assert second.attempt == 2
    cgate.report(second, "ambiguous", error="timeout again")
    before = snapshot(cgate)
    stale = CliRunner().invoke(main, ["resolve", "charge:1", "--failed", "--attempt", "1",
                                      "--by", "alice", *args])
    assert stale.exit_code == 1, stale.output
    assert "at attempt 2 now (ambiguous), not 1: nothing was recorded" in stale.stderr
    assert snapshot(cgate) == before
    for bad in ("0", "-1", "x", "9" * 40):
        refused = CliRunner().invoke(main, ["resolve", "charge:1", "--failed", "--attempt",
                                            bad, *args])
        assert refused.exit_code == 2 and "--attempt" in refused.stderr
    assert snapshot(cgate) == before
    done = CliRunner().invoke(main, ["resolve", "charge:1", "--failed", "--attempt", "2",
                                     "--by", "alice", *args])
    assert done.exit_code == 0, done.output
    assert cgate.get("charge:1").state is eg.State.FAILED


def test_cli_force_asks_before_overriding_a_live_lease(cgate: eg.Gate, store_url: str) -> None:
    """``resolve --force`` on a live lease may let a new attempt run while the holder still
    runs: it asks first, saying until when the lease is live. No terminal and no --yes:
    nothing recorded (exit 2); "n": nothing recorded (exit 1); --yes or "y": recorded. A
    holder that reports while the question is open wins: the forced verdict is refused."""
    args = ["--url", store_url, "--namespace", cgate.namespace]
    held = cgate.begin(effect_type="payment.charge", key="charge:1", payload={},
                       lease_seconds=600)
    before = snapshot(cgate)
    unasked = CliRunner().invoke(main, ["resolve", "charge:1", "--failed", "--force", *args])
    assert unasked.exit_code == 2 and "--yes" in unasked.stderr, unasked.output
    declined = CliRunner().invoke(main, ["resolve", "charge:1", "--failed", "--force", *args],
                                  input="n\n")
    assert declined.exit_code == 1 and "nothing recorded" in declined.stderr
    assert "lease is live until" in declined.stderr and "?" in declined.stderr
    assert snapshot(cgate) == before

    def report_while_asked(prompt: str, **kwargs: object) -> bool:
        cgate.report(held, "committed", result={"id": "ch_1"})  # the holder was alive
        return True

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("click.confirm", report_while_asked)
        raced = CliRunner().invoke(main, ["resolve", "charge:1", "--failed", "--force", *args])
    assert raced.exit_code == 1, raced.output
    assert cgate.get("charge:1").state is eg.State.COMMITTED
    cgate.begin(effect_type="payment.charge", key="charge:2", payload={}, lease_seconds=600)
    done = CliRunner().invoke(main, ["resolve", "charge:2", "--failed", "--force", "--yes",
                                     "--by", "bob", *args])
    assert done.exit_code == 0, done.output
    assert cgate.get("charge:2").state is eg.State.FAILED
