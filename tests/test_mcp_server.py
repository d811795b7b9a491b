"""``effectgate mcp serve``: the gate's tools driven by the mcp package's own client, over a real
stdio (and streamable HTTP) server process, on SQLite and Postgres."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

CLI = ["-m", "effectgate.cli"]


@asynccontextmanager
async def serve(*args: str) -> AsyncIterator[ClientSession]:
    """A client session on ``effectgate mcp serve ARGS`` over stdio."""
    params = StdioServerParameters(command=sys.executable, args=[*CLI, "mcp", "serve", *args],
                                   env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """(is_error, the JSON answer) of one tool call."""
    result = await session.call_tool(tool, arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    if result.is_error:
        text = text.split(": ", 1)[1]  # "Error executing tool NAME: {json}"
    return result.is_error, json.loads(text)


async def ok(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    is_error, answer = await call(session, tool, **arguments)
    assert not is_error, answer
    return answer


POLICY = """
[effects."payment.refund"]
approval = "always"

[effects."db.drop"]
deny = "never drop a database"

[effects."sms.*"]
budget = { per_day_micros = 1_000_000 }
"""


async def test_server_tools_drive_begin_report_and_duplicate(store_url: str, namespace: str,
                                                             tmp_path: Path) -> None:
    """begin → execute, extend, report committed → the repeat is a duplicate with the stored
    result; a second holder, another payload under the key, a stale report, an approval and a
    denial are answered in terms a model can act on; resolve_effect is not offered by
    default."""
    policy = tmp_path / "effectgate.toml"
    policy.write_text(POLICY, encoding="utf-8")
    with anyio.fail_after(60):
        async with serve("--url", store_url, "--namespace", namespace,
                         "--policy", str(policy)) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == {"begin_effect", "report_effect", "extend_lease",
                                  "unwind_group"}
            assert "IMMEDIATELY BEFORE" in (tools["begin_effect"].description or "")
            assert tools["begin_effect"].input_schema["required"] == ["effect_type", "key"]

            begin = {"effect_type": "sms.send", "key": "sms:order_1",
                     "payload": {"to": "+100", "text": "shipped"}}
            first = await ok(s, "begin_effect", **begin, vendor="stripe",
                             estimated_cost_micros=5_000)
            assert first["decision"] == "execute" and first["attempt"] == 1
            assert first["vendor_key"]["field"] == "Idempotency-Key"
            assert "vendor_idempotency_key" in first["instruction"]
            assert "Idempotency-Key" in first["instruction"]
            holder = {"key": first["key"], "lease_token": first["lease_token"],
                      "lease_secret": first["lease_secret"]}

            extended = await ok(s, "extend_lease", **holder, seconds=30)
            assert extended["lease_expires_at"].endswith("Z")

            busy = await ok(s, "begin_effect", **begin, vendor="stripe",
                            estimated_cost_micros=5_000)
            assert busy["decision"] == "in_flight" and busy["retry_after_seconds"] > 0
            assert "Do NOT perform" in busy["instruction"]

            await ok(s, "report_effect", **holder, outcome="committed",
                     result={"sid": "SM1"})
            again = await ok(s, "begin_effect", **begin, vendor="stripe",
                             estimated_cost_micros=5_000)
            assert again["decision"] == "duplicate" and again["result"] == {"sid": "SM1"}
            assert "Do NOT perform" in again["instruction"]

            is_error, clash = await call(s, "begin_effect", **{**begin, "payload": {"to": "+2"}})
            assert is_error and clash["error"] == "PayloadMismatch"
            assert "own key" in clash["what_to_do"]

            is_error, stale = await call(s, "report_effect", **holder, outcome="failed")
            assert is_error and stale["error"] == "StaleLease"
            assert "Do NOT perform" in stale["what_to_do"]

            is_error, bad_key = await call(s, "begin_effect", effect_type="x", key=" ")
            assert is_error and bad_key["error"] == "EffectKeyError"

            unpriced = await ok(s, "begin_effect", effect_type="sms.send", key="sms:order_2")
            assert unpriced["budget_warning"] and "budget_warning" in unpriced["instruction"]
            approval = await ok(s, "begin_effect", effect_type="payment.refund",
                                key="refund:txn_1", payload={"cents": 100})
            assert approval["decision"] == "approval_required" and approval["approval_id"]
            assert "approval_id" in approval["instruction"]
            denied = await ok(s, "begin_effect", effect_type="db.drop", key="drop:prod")
            assert denied["decision"] == "denied"
            assert denied["reason"] == "never drop a database"

    gate = eg.Gate(store_url, namespace=namespace)
    try:
        record = gate.get("sms:order_1")
        assert record.state is eg.State.COMMITTED and record.result == {"sid": "SM1"}
        assert record.estimated_cost_micros == 5_000 and record.attempt == 1
    finally:
        gate.close()


async def test_unwind_group_hands_undos_to_the_agent_once(store_url: str,
                                                          namespace: str) -> None:
    """Unwind sorts a group's steps: the declared undo goes to the agent with the exact
    begin_effect arguments, a step with no compensation is irreversible, an ambiguous one
    unresolved; once the agent has undone it, unwind reports it compensated and a second undo
    of it is a duplicate."""
    group = {"group_key": "trip:8812"}
    with anyio.fail_after(60):
        async with serve("--url", store_url, "--namespace", namespace) as s:
            for key, compensation, outcome in [
                ("flight:BA1", {"cancel": "BA1"}, "committed"),
                ("hotel:H9", None, "committed"),
                ("car:C3", {"cancel": "C3"}, "ambiguous"),
            ]:
                d = await ok(s, "begin_effect", effect_type="booking.create", key=key,
                             payload={"ref": key}, compensation=compensation, **group)
                assert d["decision"] == "execute"
                await ok(s, "report_effect", key=d["key"],
                         lease_token=d["lease_token"], lease_secret=d["lease_secret"],
                         outcome=outcome, result={"ok": key})

            report = await ok(s, "unwind_group", **group)
            assert not report["complete"]
            assert [st["key"] for st in report["irreversible"]] == ["hotel:H9"]
            assert [st["key"] for st in report["unresolved"]] == ["car:C3"]
            (todo,) = report["to_compensate"]
            assert todo["key"] == "flight:BA1" and todo["compensation"] == {"cancel": "BA1"}
            assert "to_compensate" in report["instruction"]

            undo = await ok(s, "begin_effect", **todo["begin_effect"])
            assert undo["decision"] == "execute"
            await ok(s, "report_effect", key=undo["key"],
                     lease_token=undo["lease_token"], lease_secret=undo["lease_secret"],
                     outcome="committed",
                     result={"cancelled": "BA1"})

            after = await ok(s, "unwind_group", **group)
            assert after["to_compensate"] == []
            (done,) = after["compensated"]
            assert done["key"] == "flight:BA1" and done["result"] == {"cancelled": "BA1"}
            repeat = await ok(s, "begin_effect", **todo["begin_effect"])
            assert repeat["decision"] == "duplicate"

    gate = eg.Gate(store_url, namespace=namespace)
    try:
        undo_record = gate.get("compensate:flight:BA1")
        assert undo_record.compensates_effect_id == todo["effect_id"]
        assert undo_record.state is eg.State.COMMITTED
    finally:
        gate.close()


async def test_unwind_group_counts_only_the_steps_own_undo(store_url: str,
                                                            namespace: str) -> None:
    """An effect that merely sits at a step's undo key (compensate:<key>) is not its undo.
    One not marked as compensating the step is refused (the key is reserved for undos), and so
    is one of the undo's type naming the step with another payload (red team, round 10: it
    took the key, and the step's own undo was refused there for ever): nothing is written,
    and unwind hands out every step's own undo to perform."""
    group = {"group_key": "trip:decoy"}
    with anyio.fail_after(60):
        async with serve("--url", store_url, "--namespace", namespace) as s:
            steps = {}
            for ref in ("A", "B", "C"):
                d = await ok(s, "begin_effect", effect_type="booking.create",
                             key=f"booking:{ref}", payload={"ref": ref},
                             compensation={"cancel": ref}, **group)
                await ok(s, "report_effect", key=d["key"], lease_token=d["lease_token"],
                         lease_secret=d["lease_secret"], outcome="committed",
                         result={"ref": ref})
                steps[ref] = d["effect_id"]
            for begin in [  # not an undo at an undo key: refused (the key is reserved)
                {"effect_type": "email.send", "key": "compensate:booking:A",
                 "payload": {"to": "a@b"}},
                {"effect_type": "booking.create.compensate", "key": "compensate:booking:C",
                 "payload": {"effect_id": steps["C"], "compensation": {"cancel": "C"}}},
            ]:
                is_error, refused = await call(s, "begin_effect", **begin)
                assert is_error and refused["error"] == "EffectKeyError", refused
            is_error, refused = await call(
                s, "begin_effect", effect_type="booking.create.compensate",
                key="compensate:booking:B", payload={"cancel": "something else"},
                compensates_effect_id=steps["B"])
            assert is_error and refused["error"] == "ConfigError", refused

            report = await ok(s, "unwind_group", **group)
            assert not report["complete"] and report["compensated"] == []
            assert report["unresolved"] == [], report
            assert [st["key"] for st in report["to_compensate"]] == [
                "booking:C", "booking:B", "booking:A"]
            assert [st["begin_effect"]["key"] for st in report["to_compensate"]] == [
                "compensate:booking:C", "compensate:booking:B", "compensate:booking:A"]


async def test_http_server_offers_resolve_only_when_allowed(store_url: str,
                                                            namespace: str) -> None:
    """Over streamable HTTP with --allow-resolve: an effect reported ambiguous is blocked for
    the next begin, resolve_effect settles it, and the repeat is then a duplicate."""
    from .mcp_helpers import serving

    argv = [sys.executable, *CLI, "mcp", "serve", "--url", store_url, "--namespace", namespace,
            "--transport", "http", "--port", "0", "--allow-resolve", "--no-auth"]
    with serving(argv) as served:
        assert served.url.startswith("http://127.0.0.1:")
        assert any(f"namespace {namespace!r}" in line for line in served.lines)
        with anyio.fail_after(60):
            async with streamable_http_client(served.url) as streams, \
                    ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                names = {t.name for t in (await s.list_tools()).tools}
                assert "resolve_effect" in names
                begin = {"effect_type": "payment.refund", "key": "refund:txn_9",
                         "payload": {"cents": 500}}
                d = await ok(s, "begin_effect", **begin)
                await ok(s, "report_effect", key=d["key"],
                         lease_token=d["lease_token"], lease_secret=d["lease_secret"],
                         outcome="ambiguous", error="timeout")
                blocked = await ok(s, "begin_effect", **begin)
                assert blocked["decision"] == "blocked"
                assert "do not retry" in blocked["instruction"]
                resolved = await ok(s, "resolve_effect", key="refund:txn_9",
                                    outcome="committed", by="alice", result={"id": "re_1"},
                                    note="seen in the dashboard")
                assert resolved["state"] == "committed"
                again = await ok(s, "begin_effect", **begin)
                assert again["decision"] == "duplicate" and again["result"] == {"id": "re_1"}


async def test_every_tool_parameter_has_a_json_schema_type(tmp_path: Path) -> None:
    """Every parameter of every mcp serve tool declares its type (JSON values as object,
    array, string, number, boolean or null), so a client can generate valid calls; a result
    of each JSON kind round-trips."""
    with anyio.fail_after(60):
        async with serve("--url", f"sqlite:///{tmp_path / 'e.db'}", "--allow-resolve") as s:
            tools = (await s.list_tools()).tools
            assert {t.name for t in tools} >= {"begin_effect", "report_effect", "resolve_effect"}
            for tool in tools:
                for name, prop in tool.input_schema["properties"].items():
                    kinds = [prop] if "type" in prop else prop.get("anyOf", [])
                    assert kinds and all("type" in k for k in kinds), (tool.name, name, prop)
            report = next(t for t in tools if t.name == "report_effect")
            json_kinds = {k["type"] for k in report.input_schema["properties"]["result"]["anyOf"]}
            assert json_kinds == {"object", "array", "string", "integer", "number", "boolean",
                                  "null"}
            for n, result in enumerate([{"a": [1]}, [1, "x"], "text", 3, 2.5, True, None]):
                d = await ok(s, "begin_effect", effect_type="t.x", key=f"k:{n}",
                             compensation=result)
                await ok(s, "report_effect", key=d["key"], lease_token=d["lease_token"],
                         lease_secret=d["lease_secret"], outcome="committed", result=result)
                again = await ok(s, "begin_effect", effect_type="t.x", key=f"k:{n}",
                                 compensation=result)
                assert again["decision"] == "duplicate" and again.get("result") == result
