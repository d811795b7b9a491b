"""What never gets stored, on SQLite and Postgres: distinctive secrets planted in payloads, error
texts (a real httpx error with a token in its URL), notes, reasons and results, with redaction
on (the default text redactor, a ``text_redactor`` of the user's, the policy's
``redact_result`` / ``store_result`` / ``redact_arguments``), must appear nowhere: not in the
SQLite file or its WAL, not in a ``pg_dump`` of the tables, not in DEBUG logs, not in
OpenTelemetry attributes, not in the CLI's output, not in the MCP server's answers."""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import effectgate as eg
from effectgate.cli import main
from effectgate.testing import lapse_leases

from .conftest import PG_URL

RUN = uuid.uuid4().hex[:10]
SECRETS = {
    # never stored: only the payload's hash is
    "payload": f"4111-1111-{RUN}-PAYLOAD",
    # in the query string of a real httpx error's URL (removed by the default redactor)
    "error_url": f"tok_{RUN}_ERRURL",
    # a password in a URL (removed by the default redactor)
    "url_password": f"pw{RUN}URLPASS",
    # free text the user's text_redactor removes (sk_live_...)
    "note": f"sk_live_{RUN}NOTE",
    "reason": f"sk_live_{RUN}REASON",
    "hook": f"sk_live_{RUN}HOOK",
    "undo": f"sk_live_{RUN}UNDO",
    # results: a field the policy redacts, and a whole result the policy keeps out
    "result_field": f"+1-555-{RUN}-RESULT",
    "unstored": f"{RUN}-UNSTORED-RESULT",
    # an argument the approver sees as "[redacted]"
    "argument": f"{RUN}-CARD-ARGUMENT",
}
SECRET_PATTERN = re.compile(r"sk_live_\w+")

POLICY_TOML = """
[effects."sms.send"]
redact_result = ["phone"]

[effects."kyc.lookup"]
store_result = false

[effects."payment.big"]
approval = "always"
redact_arguments = ["card"]
"""
POLICY = {
    "effects": {
        "sms.send": {"redact_result": ["phone"]},
        "kyc.lookup": {"store_result": False},
        "payment.big": {"approval": "always", "redact_arguments": ["card"]},
    }
}


def _redactor(text: str) -> str:
    return SECRET_PATTERN.sub("sk_live_[redacted]", text)


def _http_error() -> httpx.HTTPStatusError:
    """A real httpx error: its message names the whole URL, query string included."""
    request = httpx.Request(
        "POST", f"https://api.vendor.test/v1/charges?token={SECRETS['error_url']}&x=1")
    response = httpx.Response(502, request=request)
    try:
        response.raise_for_status()
    except httpx.HTTPStatusError as err:
        assert SECRETS["error_url"] in str(err)  # the raw text does carry it
        return err
    raise AssertionError("raise_for_status did not raise")


def leaks(text: str | bytes) -> list[str]:
    """The names of the planted secrets found in ``text``."""
    data = text.encode("utf-8", "backslashreplace") if isinstance(text, str) else text
    return [name for name, secret in SECRETS.items() if secret.encode() in data]


@pytest.fixture
def planted(store_url: str, namespace: str, caplog: pytest.LogCaptureFixture,
            ) -> Iterator[dict[str, Any]]:
    """A namespace where every kind of secret went through the gate, with DEBUG logging and
    OpenTelemetry counters captured."""
    caplog.set_level(logging.DEBUG, logger="effectgate")
    gate = eg.Gate(store_url, namespace=namespace, policy=POLICY, text_redactor=_redactor,
                   lease_seconds=30)
    metrics = _metrics(gate)

    @gate.effect("charge:{order_id}", effect_type="payment.charge")
    def charge(order_id: str, card: str) -> dict[str, str]:
        raise _http_error()

    with pytest.raises(httpx.HTTPStatusError):
        charge("o1", card=SECRETS["payload"])

    @gate.effect("sms:{msg_id}", effect_type="sms.send")
    def send_sms(msg_id: str, to: str, text: str) -> dict[str, Any]:
        return {"sid": "SM1", "to": {"phone": SECRETS["result_field"]}}

    assert send_sms("m1", to=SECRETS["payload"], text="hi")["to"]["phone"] == (
        SECRETS["result_field"])
    assert send_sms("m1", to=SECRETS["payload"], text="hi") == {
        "sid": "SM1", "to": {"phone": "[redacted]"}}

    @gate.effect("kyc:{person}", effect_type="kyc.lookup")
    def lookup(person: str) -> str:
        return SECRETS["unstored"]

    assert lookup("p1") == SECRETS["unstored"]
    assert lookup("p1") is None  # a duplicate: nothing was kept

    # A resolve note and a reason with the user's secret pattern and a URL with a password.
    d = gate.begin(effect_type="payment.refund", key="refund:r1", payload={})
    gate.report(d, "ambiguous",
                error=f"timeout at https://ops:{SECRETS['url_password']}@vendor.test/x")
    gate.resolve("refund:r1", "committed", by="alice",
                 note=f"checked the dashboard with key {SECRETS['note']}")

    # An approval request whose arguments carry a card, denied with a secret reason.
    pending = gate.begin(effect_type="payment.big", key="big:1",
                         payload={"card": SECRETS["argument"], "cents": 5})
    assert gate.approval(pending.approval_id or "").arguments == {
        "card": "[redacted]", "cents": 5}
    gate.deny(pending.approval_id or "", by="bob", reason=f"no: {SECRETS['reason']}")

    # A reconcile hook that raises with a secret in its message.
    @gate.reconciler("payment.capture")
    def ask_vendor(record: eg.EffectRecord) -> str:
        raise RuntimeError(f"vendor said {SECRETS['hook']} at "
                           f"https://api.vendor.test/?token={SECRETS['error_url']}")

    d = gate.begin(effect_type="payment.capture", key="capture:c1", payload={})
    lapse_leases(gate, "capture:c1")
    assert gate.begin(effect_type="payment.capture", key="capture:c1",
                      payload={}).decision is eg.Decision.BLOCKED

    # A saga whose undo raises with a secret.
    d = gate.begin(effect_type="booking.hotel", key="hotel:h1", payload={}, group_key="trip",
                   compensation={"cancel": "h1"})
    gate.report(d, "committed", result={"booked": "h1"})

    @gate.compensator("booking.hotel")
    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        raise RuntimeError(f"cancel failed: {SECRETS['undo']}")

    report = gate.unwind("trip")
    assert not report.complete and not leaks(json.dumps(report.as_dict()))

    yield {"gate": gate, "url": store_url, "ns": namespace, "metrics": metrics,
           "logs": caplog}
    gate.close()


def _metrics(gate: eg.Gate) -> Any:
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    except ImportError:
        return None
    from effectgate.telemetry import Telemetry

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    gate._telemetry = Telemetry(meter_provider=provider)
    return reader


def test_secrets_were_really_planted(planted: dict[str, Any]) -> None:
    """The secrets went through the gate (so "not found" below means something): the planted
    effects exist in the states the planting put them in."""
    gate = planted["gate"]
    states = {r.key: r.state for r in gate.list_effects(limit=50)}
    assert states["charge:o1"] is eg.State.AMBIGUOUS
    assert states["sms:m1"] is eg.State.COMMITTED and states["kyc:p1"] is eg.State.COMMITTED
    assert states["refund:r1"] is eg.State.COMMITTED and states["big:1"] is eg.State.DENIED
    assert states["hotel:h1"] is eg.State.COMMITTED
    charge = gate.get("charge:o1")
    assert charge.error and "api.vendor.test/v1/charges?[redacted]" in charge.error
    note = [h.note for h in gate.get("refund:r1").history if h.note]
    assert any("sk_live_[redacted]" in n for n in note)


def test_no_secret_in_the_store_files(planted: dict[str, Any], backend: str) -> None:
    """Not in the SQLite file or its WAL (read while the gate is open, and after it closed);
    not in a pg_dump of the effectgate tables."""
    gate = planted["gate"]
    if backend == "sqlite":
        path = Path(gate.url.removeprefix("sqlite:///"))
        files = [p for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]
        assert any(p.name.endswith("-wal") for p in files)
        for file in files:
            assert leaks(file.read_bytes()) == [], file
        gate.close()
        for file in (path, Path(f"{path}-wal")):
            if file.exists():
                assert leaks(file.read_bytes()) == [], file
        return
    database = PG_URL.rsplit("/", 1)[1]
    dump = subprocess.run(
        ["pg_dump", "-h", "127.0.0.1", "-U", "postgres", "--data-only",
         "-t", "effectgate_*", database], capture_output=True, timeout=120, check=True)
    assert planted["ns"].encode() in dump.stdout  # the dump does hold this test's rows
    assert leaks(dump.stdout) == []


def test_no_secret_in_debug_logs(planted: dict[str, Any]) -> None:
    """Every log record (message and structured extras) at DEBUG and above."""
    records = [*planted["logs"].get_records("setup"), *planted["logs"].records]
    assert records and any(r.levelno == logging.DEBUG for r in records)
    for record in records:
        assert leaks(record.getMessage()) == [], record.getMessage()
        assert leaks(repr(sorted(vars(record).items(), key=lambda kv: kv[0]))) == []


def test_no_secret_in_telemetry_attributes(planted: dict[str, Any]) -> None:
    reader = planted["metrics"]
    if reader is None:
        pytest.skip("needs the otel extra")
    data = reader.get_metrics_data()
    attributes = [dict(point.attributes) for rm in data.resource_metrics
                  for sm in rm.scope_metrics for metric in sm.metrics
                  for point in metric.data.data_points]
    assert attributes
    assert leaks(json.dumps(attributes, default=str)) == []


def test_no_secret_in_cli_output(planted: dict[str, Any]) -> None:
    """``ls`` and ``show`` of every planted effect, as a table, --json and --plain."""
    where = ["--url", planted["url"], "--namespace", planted["ns"]]
    runner = CliRunner()
    keys = [r.key for r in planted["gate"].list_effects(limit=50)]
    assert "charge:o1" in keys
    for command in (["ls"], *[["show", key] for key in keys]):
        for output in ([], ["--json"], ["--plain"]):
            result = runner.invoke(main, [*command, *where, *output], catch_exceptions=False)
            assert result.exit_code == 0, result.output
            assert leaks(result.output) == [], (command, output)
    result = runner.invoke(main, ["unwind", "trip", *where, "--json"])
    assert result.exit_code == 1 and leaks(result.output) == []


def test_no_secret_in_mcp_answers(planted: dict[str, Any], tmp_path: Path) -> None:
    """The MCP server answers about the planted effects (a duplicate's stored result, a
    blocked effect's reason, a report whose error carries a token) without a secret."""
    pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')
    script = tmp_path / "client.py"
    script.write_text(_MCP_CLIENT, encoding="utf-8")
    policy = tmp_path / "effectgate.toml"
    policy.write_text(POLICY_TOML, encoding="utf-8")
    assert eg.Policy.load(policy) == eg.Policy.from_dict(POLICY)  # the gate's own policy
    env = {**os.environ, "EG_URL": planted["url"], "EG_NS": planted["ns"],
           "EG_TOKEN": SECRETS["error_url"], "EG_PASSWORD": SECRETS["url_password"],
           "EG_PAYLOAD": SECRETS["payload"], "EG_PHONE": SECRETS["result_field"],
           "EG_POLICY": str(policy)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout)
    assert answers["duplicate"]["decision"] == "duplicate"
    assert answers["duplicate"]["result"]["to"]["phone"] == "[redacted]"
    assert answers["blocked"]["decision"] == "blocked"
    assert leaks(done.stdout) == [], done.stdout
    assert "differs" not in done.stderr  # the server runs the namespace's own policy
    assert answers["report"]["recorded"] == "failed"
    assert answers["sms_again"]["result"] == {"sid": "SM9", "phone": "[redacted]"}
    assert planted["gate"].get("sms:mcp").result == {"sid": "SM9", "phone": "[redacted]"}
    record = planted["gate"].get("mcp:1")
    assert record.state is eg.State.FAILED and record.error and "[redacted]" in record.error
    assert leaks(record.error) == []


_MCP_CLIENT = '''
import asyncio, json, os, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "effectgate.cli", "mcp", "serve", "--url", os.environ["EG_URL"],
              "--namespace", os.environ["EG_NS"], "--policy", os.environ["EG_POLICY"]],
        env=dict(os.environ))
    out = {}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
        await s.initialize()

        async def call(tool, **arguments):
            result = await s.call_tool(tool, arguments)
            text = result.content[0].text
            return json.loads(text.split(": ", 1)[1] if result.is_error else text)

        card = os.environ["EG_PAYLOAD"]
        out["duplicate"] = await call("begin_effect", effect_type="sms.send", key="sms:m1",
                                      payload={"msg_id": "m1", "to": card, "text": "hi"})
        out["blocked"] = await call("begin_effect", effect_type="payment.charge",
                                    key="charge:o1", payload={"order_id": "o1", "card": card})
        first = await call("begin_effect", effect_type="mcp.test", key="mcp:1", payload={})
        out["report"] = await call(
            "report_effect", key=first["key"], lease_token=first["lease_token"],
            lease_secret=first["lease_secret"], outcome="failed",
            error="401 for https://u:" + os.environ["EG_PASSWORD"] + "@api.test/v1?token="
                  + os.environ["EG_TOKEN"])
        sms = await call("begin_effect", effect_type="sms.send", key="sms:mcp", payload={})
        out["sms"] = await call(
            "report_effect", key=sms["key"], lease_token=sms["lease_token"],
            lease_secret=sms["lease_secret"], outcome="committed",
            result={"sid": "SM9", "phone": os.environ["EG_PHONE"]})
        out["sms_again"] = await call("begin_effect", effect_type="sms.send", key="sms:mcp",
                                      payload={})
    print(json.dumps(out))

asyncio.run(main())
'''


def test_pruned_effects_keep_no_result_error_or_note(planted: dict[str, Any]) -> None:
    """After prune, what was stored (redacted) is gone too: only tombstones remain, and a
    duplicate from this process's memo no longer hands back the result."""
    gate = planted["gate"]
    assert gate.prune(datetime.timedelta(0)) >= 3
    for key in ("sms:m1", "refund:r1", "big:1"):
        record = gate.get(key)
        assert record.result is None and record.error is None and record.history == ()
    d = gate.begin(effect_type="sms.send", key="sms:m1",
                   payload={"msg_id": "m1", "to": SECRETS["payload"], "text": "hi"})
    assert d.decision is eg.Decision.DUPLICATE and d.result is None


def test_a_redacted_field_inside_a_json_text_result_is_not_stored(make_gate: Any) -> None:
    """A tool that answers JSON as text (as MCP servers and many framework tools do):
    ``redact_result`` reaches the field inside it, at any depth, and the duplicate returns
    the redacted text; text that is not JSON, or holds no such field, is kept as it was."""
    gate = make_gate(policy=POLICY)
    phone = SECRETS["result_field"]

    @gate.effect("sms:{msg_id}", effect_type="sms.send")
    def send_sms(msg_id: str) -> dict[str, Any]:
        return {"text": json.dumps({"sid": "SM2", "to": {"phone": phone}}, indent=2),
                "list": json.dumps([{"phone": phone}]), "plain": "{not json",
                "other": '{"sid":  "SM2"}', "nested": json.dumps({"t": json.dumps(
                    {"phone": phone})})}

    assert phone in send_sms("m2")["text"]  # the live answer is the tool's own
    again = send_sms("m2")
    assert not leaks(json.dumps(again)) and not leaks(json.dumps(gate.get("sms:m2").result))
    assert json.loads(again["text"]) == {"sid": "SM2", "to": {"phone": "[redacted]"}}
    assert json.loads(again["list"]) == [{"phone": "[redacted]"}]
    assert json.loads(json.loads(again["nested"])["t"]) == {"phone": "[redacted]"}
    assert (again["plain"], again["other"]) == ("{not json", '{"sid":  "SM2"}')


def test_an_expired_requests_arguments_go_when_the_next_request_is_made(
        make_gate: Any) -> None:
    """An approval request keeps the arguments an approver must see only while someone may
    decide on it. Expiry is judged on read, so an expired request's arguments stayed in the
    table (a card number in the clear) until a prune: now the next request removes them."""
    from sqlalchemy import text

    gate = make_gate(policy={"effects": {"payment.*": {
        "approval": {"always": True, "expires_seconds": 0.2}}}})
    first = gate.begin(effect_type="payment.charge", key="charge:1",
                       payload={"card": "4111111111111111"})
    assert first.decision is eg.Decision.APPROVAL_REQUIRED

    def kept() -> list[Any]:
        with gate.store.engine.connect() as conn:
            return [row[0] for row in conn.execute(text(
                "SELECT arguments FROM effectgate_approvals WHERE namespace = :ns "
                "ORDER BY created_at"), {"ns": gate.namespace})]

    assert "4111111111111111" in kept()[0]
    import time

    time.sleep(0.3)  # expired: nobody can decide on it now
    second = gate.begin(effect_type="payment.charge", key="charge:2",
                        payload={"card": "4222222222222222"})
    assert second.decision is eg.Decision.APPROVAL_REQUIRED
    first_args, second_args = kept()
    assert first_args is None and "4222222222222222" in second_args
