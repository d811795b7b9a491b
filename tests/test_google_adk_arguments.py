"""Google ADK: a gated tool gets every argument the model is shown, and arguments that cannot
name an effect are answered, not raised.

The gate's argument model skipped parameters named ``self`` or ``cls``, though ADK declares
them to the model: ``book(trip_id, cls="economy")`` always got ``economy``, and two bookings
that differed only in the cabin were one effect. And a naive datetime sent by the model (it
has no canonical form: which timezone?) raised ``PayloadError`` out of the whole run in
message mode; now it is answered ``INVALID ARGUMENTS`` and nothing is stored. Real
``InMemoryRunner`` loop, scripted model, both backends.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.tools.function_tool import FunctionTool

import effectgate as eg
from effectgate.integrations.google_adk import gate_tool

from .adapter_drivers import adk_run
from .conftest import snapshot


def _call(tool: Any, call_id: str, args: dict[str, Any], run_id: str) -> str:
    return asyncio.run(adk_run([tool], [[(call_id, args, tool.name)]], run_id=run_id))[call_id]


def test_a_parameter_named_cls_reaches_the_function_and_keys_the_effect(
        gate: eg.Gate) -> None:
    booked: list[tuple[str, str]] = []

    def book(trip_id: str, cls: str = "economy") -> str:
        """Book a seat; cls is the cabin class."""
        booked.append((trip_id, cls))
        return f"booked {trip_id} in {cls}"

    tool = gate_tool(FunctionTool(book), "book:{trip_id}:{cls}", gate=gate)
    assert _call(tool, "c1", {"trip_id": "TR1", "cls": "first"}, "s1") == "booked TR1 in first"
    assert _call(tool, "c2", {"trip_id": "TR1"}, "s2") == "booked TR1 in economy"
    assert booked == [("TR1", "first"), ("TR1", "economy")]
    assert gate.get("book:TR1:first").state is eg.State.COMMITTED


@pytest.mark.parametrize("on_refusal", ["message", "raise"])
def test_a_naive_datetime_is_invalid_and_changes_nothing(gate: eg.Gate,
                                                         on_refusal: str) -> None:
    ran: list[datetime.datetime] = []

    def schedule(job: str, at: datetime.datetime) -> str:
        """Schedule a payout."""
        ran.append(at)
        return f"scheduled {job} at {at}"

    tool = gate_tool(FunctionTool(schedule), "schedule:{job}", gate=gate,
                     on_refusal=on_refusal)
    before = snapshot(gate)
    naive = {"job": "J1", "at": "2027-01-01T09:00:00"}
    if on_refusal == "raise":  # raised to ADK's on_tool_error callbacks, as any refusal
        with pytest.raises(eg.PayloadError, match="naive datetime"):
            _call(tool, "c1", naive, "s1")
    else:
        assert _call(tool, "c1", naive, "s1").startswith("INVALID ARGUMENTS")
    assert snapshot(gate) == before and ran == []
    aware = {"job": "J1", "at": "2027-01-01T09:00:00Z"}
    assert _call(tool, "c2", aware, "s2").startswith("scheduled J1 at 2027-01-01 09:00:00")
    assert len(ran) == 1


def test_a_function_with_a_positional_only_parameter_runs_once(gate: eg.Gate) -> None:
    """ADK calls it with the parameter as a keyword (it makes it keyword-compatible); the
    gate's own call path must too, or the call raised before the body and was AMBIGUOUS."""
    ledger: list[str] = []

    def refund(txn_id: str, /, amount_cents: int) -> str:
        """Refund a card transaction."""
        ledger.append(txn_id)
        return f"refunded {amount_cents} on {txn_id}"

    tool = gate_tool(FunctionTool(refund), "refund:{txn_id}", gate=gate)
    args = {"txn_id": "T1", "amount_cents": 500}
    assert _call(tool, "c1", args, "s1") == "refunded 500 on T1"
    assert _call(tool, "c2", args, "s2") == "refunded 500 on T1"  # the stored result
    assert ledger == ["T1"] and gate.get("refund:T1").state is eg.State.COMMITTED
