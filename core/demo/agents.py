"""The demo's agent: the same tools, called the same way, with the gate in front or not.

:class:`PlainAgent` is an agent loop reduced to its tool calls (the decorator path);
:mod:`effectgate.demo.langchain` has the same agent as a LangChain ``create_agent`` loop. Both
tell the model, after a refusal or a failed call, the words every effectgate adapter uses
(``OUTCOME UNKNOWN ... Do not call this tool again ... Tell the user ...``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..decorator import current_effect
from ..errors import EffectRefused, NotExecuted
from ..gate import Gate
from .vendor import FakeVendor, VendorTimeout

__all__ = ["KEYS", "Answer", "PlainAgent", "bodies", "effect_key", "effect_options",
           "register_undo"]

KEYS = {"refund": "refund:{txn_id}", "book_flight": "flight:{trip_id}",
        "book_hotel": "hotel:{trip_id}", "book_car": "car:{trip_id}"}


@dataclass(frozen=True, slots=True)
class Answer:
    """What one tool call came to: the gate's ``decision`` (None without a gate), what the
    model is told, whether the tool gave a result (``ok``), and whether the agent's run
    itself failed instead (``raised``: a framework that lets a tool's exception end the run;
    then ``told`` is that exception)."""

    decision: str | None
    told: str
    ok: bool
    raised: bool = False


def effect_key(tool: str, args: dict[str, Any]) -> str:
    """The effect key a call of ``tool`` reserves."""
    return KEYS[tool].format(**args)


def effect_options(tool: str) -> dict[str, Any]:
    """The effect options each gated tool declares (type, vendor, cost, saga group, undo)."""
    if tool == "refund":
        return {"effect_type": "payment.refund", "vendor": "stripe",
                "cost_micros": lambda amount_cents: amount_cents * 10_000}
    what = tool.removeprefix("book_")
    return {"effect_type": f"booking.{what}", "group_key": "trip:{trip_id}",
            "compensation": lambda trip_id: {"cancel": what}}


def bodies(vendor: FakeVendor, *, gated: bool) -> dict[str, Callable[..., Any]]:
    """The tools' bodies; gated ones send the attempt's vendor idempotency key along."""

    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund a card payment."""
        key = current_effect().vendor_idempotency_key if gated else None
        return vendor.refund(txn_id, amount_cents, key)

    def booking(what: str) -> Callable[..., Any]:
        def book(trip_id: str) -> dict[str, Any]:
            return vendor.book(what, trip_id)

        book.__name__ = book.__qualname__ = f"book_{what}"
        book.__doc__ = f"Book a {what} for a trip."
        return book

    return {"refund": refund, "book_flight": booking("flight"),
            "book_hotel": booking("hotel"), "book_car": booking("car")}


def register_undo(gate: Gate, vendor: FakeVendor) -> None:
    """The compensator for every booking: ``fn(record, compensation)`` cancels it at the
    vendor (``record.result`` is what the booking returned)."""

    @gate.compensator("booking.*")
    def cancel(record: Any, compensation: Any) -> dict[str, Any]:
        booked = record.result
        if isinstance(booked, str):  # a framework tool stores its text output
            booked = json.loads(booked)
        return vendor.cancel(booked["booking_id"])


def brief(result: Any) -> str:
    """A receipt's id, for one line of output."""
    if isinstance(result, str):
        try:
            result = json.loads(result)
        except ValueError:
            return str(result)
    if isinstance(result, dict):
        for name in ("refund_id", "booking_id", "cancelled"):
            if name in result:
                return str(result[name])
    return json.dumps(result, default=str)


def told_for(kind: str, key: str, error: BaseException) -> str:
    """The words an effectgate adapter gives the model instead of a result."""
    from ..integrations._kernel.vocabulary import model_message

    return model_message(kind, key, error)


class PlainAgent:
    """An agent loop reduced to its tool calls: each call goes to the tool (gated with
    ``@gate.effect`` when ``gate`` is given) and what the model would be told comes back."""

    def __init__(self, vendor: FakeVendor, gate: Gate | None) -> None:
        self.vendor = vendor
        self.gate = gate
        self.name = "plain tool loop"
        raw = bodies(vendor, gated=gate is not None)
        if gate is None:
            self.tools = raw
            return
        self.tools = {name: gate.effect(KEYS[name], **effect_options(name))(fn)
                      for name, fn in raw.items()}
        register_undo(gate, vendor)

    def call(self, tool: str, args: dict[str, Any]) -> Answer:
        """Make one tool call; return what it came to."""
        before = len(self.vendor.calls)
        key = effect_key(tool, args)
        gated = self.gate is not None
        try:
            result = self.tools[tool](**args)
        except EffectRefused as refused:
            decision = refused.decision or "refused"
            return Answer(decision, told_for(decision, key, refused), ok=False)
        except NotExecuted as err:
            told = told_for("failed", key, err) if gated else f"Error: {err.message}"
            return Answer("execute" if gated else None, told, ok=False)
        except VendorTimeout as err:
            told = (told_for("ambiguous", key, err) if gated else
                    f"An error occurred while running the tool. Please try again. Error: {err}")
            return Answer("execute" if gated else None, told, ok=False)
        done: str | None = None
        if gated:
            done = "execute" if len(self.vendor.calls) > before else "duplicate"
        return Answer(done, brief(result), ok=True)
