"""The demo's scenario as a library: an agent with a refund tool and a trip-booking saga, a
fake payments vendor that counts every call that reaches it, and an operator.

Five scenes, offline, on any store: a retried refund (duplicate refused with the stored
result), a lost reply (AMBIGUOUS, a blind retry refused, an operator resolves it), a large
refund that waits for approval, a spend ceiling, and a trip unwound. :func:`run_demo` calls
``show`` with each :class:`Line` as it happens and returns a :class:`DemoSummary`; it prints
nothing itself (the ``effectgate demo`` command renders the lines). Nothing in it depends on
the date or on randomness, except the store's own vendor-key secret, which is never shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .decorator import current_effect
from .errors import EffectRefused, NotExecuted
from .gate import Gate

__all__ = ["DOLLAR", "SCENES", "DecoratorAgent", "DemoSummary", "FakeVendor", "Line",
           "demo_policy", "make_tools", "register_undo", "run_demo"]

DOLLAR = 1_000_000
Actor = Literal["scene", "agent", "gate", "vendor", "operator", "note"]


@dataclass(frozen=True, slots=True)
class Line:
    """One thing that happened: who (``actor``) did or saw what (``text``)."""

    actor: Actor
    text: str


@dataclass
class DemoSummary:
    """Per scene: how many tool calls the agent made and how many reached the vendor."""

    agent: str
    scenes: list[tuple[str, int, int]] = field(default_factory=list)
    vendor_log: list[str] = field(default_factory=list)

    @property
    def agent_calls(self) -> int:
        """Tool calls the agent made, in all."""
        return sum(s[1] for s in self.scenes)

    @property
    def vendor_calls(self) -> int:
        """Calls that reached the vendor, in all."""
        return sum(s[2] for s in self.scenes)


class VendorTimeout(Exception):
    """The vendor did the work but its reply never arrived."""


class FakeVendor:
    """A payments-and-bookings vendor in memory. Every call that reaches it is counted."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.by_idempotency_key: dict[str, dict[str, Any]] = {}
        self.lose_next_reply = False

    def refund(self, txn_id: str, amount_cents: int, idempotency_key: str | None) -> dict[
            str, Any]:
        """Refund; with ``lose_next_reply`` set, the refund happens and the reply is lost."""
        self.calls.append(f"refund {txn_id}")
        receipt = {"refund_id": f"re_{len(self.calls):04d}", "txn_id": txn_id,
                   "amount_cents": amount_cents}
        if idempotency_key:
            self.by_idempotency_key[idempotency_key] = receipt
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise VendorTimeout("the vendor did not answer within 10s")
        return receipt

    def book(self, what: str, trip_id: str) -> dict[str, Any]:
        """Book a flight, hotel or car; there are no cars."""
        self.calls.append(f"book {what} {trip_id}")
        if what == "car":
            raise NotExecuted("no cars available: the vendor refused the booking")
        return {"booking_id": f"{what[:2]}_{len(self.calls):04d}", "trip_id": trip_id}

    def cancel(self, booking_id: str) -> dict[str, Any]:
        """Cancel a booking."""
        self.calls.append(f"cancel {booking_id}")
        return {"cancelled": booking_id}


def demo_policy() -> Any:
    """Refunds of $500 or more need a human; refunds in one run may total $1,000."""
    from .policy import Policy

    return Policy.from_dict({"effects": {"payment.refund": {
        "vendor": "stripe",
        "approval": {"at_or_above_micros": 500 * DOLLAR},
        "budget": {"per_run_micros": 1000 * DOLLAR},
    }}})


def register_undo(gate: Gate, vendor: FakeVendor) -> None:
    """The compensator for every booking: cancel it at the vendor."""

    @gate.compensator("booking.*")
    def cancel(record: Any, compensation: Any) -> dict[str, Any]:
        booked = record.result
        if isinstance(booked, str):  # a framework tool stores its text output
            booked = json.loads(booked)
        return vendor.cancel(booked["booking_id"])


def make_tools(gate: Gate, vendor: FakeVendor) -> dict[str, Callable[..., Any]]:
    """The agent's tools, each gated with one decorator, and the undo for bookings."""

    @gate.effect("refund:{txn_id}", effect_type="payment.refund", vendor="stripe",
                 cost_micros=lambda amount_cents: amount_cents * 10_000)
    def refund(txn_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund a card payment."""
        key = current_effect().vendor_idempotency_key
        return vendor.refund(txn_id, amount_cents, key)

    def booking(what: str) -> Callable[..., Any]:
        def book(trip_id: str) -> dict[str, Any]:
            return vendor.book(what, trip_id)

        book.__name__ = book.__qualname__ = f"book_{what}"
        return gate.effect(f"{what}:{{trip_id}}", effect_type=f"booking.{what}",
                           group_key="trip:{trip_id}",
                           compensation=lambda trip_id: {"cancel": what})(book)

    register_undo(gate, vendor)
    return {"refund": refund, "book_flight": booking("flight"),
            "book_hotel": booking("hotel"), "book_car": booking("car")}


def _money(cents: int) -> str:
    return f"${cents / 100:,.2f}"


def _call_text(tool: str, args: dict[str, Any]) -> str:
    if tool == "refund":
        return f"refund({args['txn_id']}, {_money(args['amount_cents'])})"
    return f"{tool}({args['trip_id']})"


def _brief(result: Any) -> str:
    if isinstance(result, dict):
        for name in ("refund_id", "booking_id", "cancelled"):
            if name in result:
                return str(result[name])
    return json.dumps(result)


class DecoratorAgent:
    """An agent loop reduced to its tool calls: each call goes through the gated function, and
    what the model would be told comes back as text."""

    name = "plain decorator"

    def __init__(self, tools: dict[str, Callable[..., Any]], vendor: FakeVendor) -> None:
        self.tools = tools
        self.vendor = vendor

    def call(self, tool: str, args: dict[str, Any]) -> str:
        """Make one tool call; return what the agent sees."""
        before = len(self.vendor.calls)
        try:
            result = self.tools[tool](**args)
        except EffectRefused as refused:
            return _refusal_text(refused)
        except NotExecuted as err:
            return f"failed: {err.message} (FAILED: nothing happened)"
        except VendorTimeout as err:
            return f"error: {err} (AMBIGUOUS: it may or may not have happened)"
        if len(self.vendor.calls) == before:
            return f"duplicate → {_brief(result)}, the stored result; the vendor was not called"
        return f"executed → {_brief(result)}"


def _refusal_text(refused: EffectRefused) -> str:
    decision = refused.decision or "refused"
    if decision == "blocked":
        return "blocked: the outcome is unknown — do not retry; tell the user"
    if decision == "approval_required":
        return f"approval required ({refused.approval_id}): a human must approve it"
    if decision == "denied":
        return f"denied: {refused.reason}"
    return f"{decision}: {refused.reason or ''}".rstrip(": ")


Ask = Callable[..., str]
Say = Callable[[Actor, str], None]


def _scene_retry(gate: Gate, vendor: FakeVendor, ask: Ask, say: Say) -> None:
    ask("refund", txn_id="txn_1001", amount_cents=2500)
    ask("refund", "the agent retries", txn_id="txn_1001", amount_cents=2500)


def _scene_lost_reply(gate: Gate, vendor: FakeVendor, ask: Ask, say: Say) -> None:
    vendor.lose_next_reply = True
    ask("refund", txn_id="txn_1002", amount_cents=4000)
    ask("refund", "a blind retry", txn_id="txn_1002", amount_cents=4000)
    record = gate.get("refund:txn_1002")
    receipt = vendor.by_idempotency_key[record.vendor_key.value] if record.vendor_key else {}
    say("operator", f"looks up the effect's idempotency key in the vendor's dashboard: "
                    f"{receipt['refund_id']} exists")
    say("operator", "effectgate resolve refund:txn_1002 --committed")
    gate.resolve("refund:txn_1002", "committed", by="alice", result=receipt,
                 note="found in the vendor dashboard")
    ask("refund", "the agent asks again", txn_id="txn_1002", amount_cents=4000)


def _scene_approval(gate: Gate, vendor: FakeVendor, ask: Ask, say: Say) -> None:
    ask("refund", txn_id="txn_1003", amount_cents=75000)
    pending = [a for a in gate.list_approvals() if a.key == "refund:txn_1003"]
    say("operator", f"effectgate approve {pending[0].approval_id}")
    gate.approve(pending[0].approval_id, by="alice", note="customer verified")
    ask("refund", "after approval", txn_id="txn_1003", amount_cents=75000)
    ask("refund", "the agent retries", txn_id="txn_1003", amount_cents=75000)


def _scene_budget(gate: Gate, vendor: FakeVendor, ask: Ask, say: Say) -> None:
    say("note", "refunds in one run may total $1,000.00; $815.00 is spent")
    ask("refund", txn_id="txn_1004", amount_cents=30000)


def _scene_saga(gate: Gate, vendor: FakeVendor, ask: Ask, say: Say) -> None:
    ask("book_flight", trip_id="trip_77")
    ask("book_hotel", trip_id="trip_77")
    ask("book_car", trip_id="trip_77")
    say("operator", "effectgate unwind trip:trip_77")
    report = gate.unwind("trip:trip_77", by="alice")
    for step in report.compensated:
        say("gate", f"compensated {step.key} → the vendor cancelled {_brief(step.result)}")
    for step in report.skipped:
        say("gate", f"nothing to undo for {step.key}: it is {step.state}")
    for step in report.unresolved + report.failed + report.irreversible:
        say("gate", f"not undone: {step.key}: {step.detail}")
    again = gate.unwind("trip:trip_77", by="alice")
    say("operator", "effectgate unwind trip:trip_77  (again)")
    say("gate", f"{len(again.compensated)} compensated earlier; nothing undone twice")


SCENES: list[tuple[str, Callable[[Gate, FakeVendor, Ask, Say], None]]] = [
    ("The agent retries a refund", _scene_retry),
    ("A reply is lost", _scene_lost_reply),
    ("A large refund waits for a human", _scene_approval),
    ("A spend ceiling", _scene_budget),
    ("A trip is unwound", _scene_saga),
]


def run_demo(gate: Gate, show: Callable[[Line], None], *, agent: str = "auto") -> DemoSummary:
    """Play the five scenes on ``gate`` (which must carry :func:`demo_policy`); ``agent``
    is ``"auto"`` (LangChain when installed), ``"langchain"`` or ``"decorator"``."""
    from .context import effect_context

    vendor = FakeVendor()
    bot = _agent(agent, vendor, gate)
    summary = DemoSummary(agent=bot.name)
    calls = 0

    def say(actor: Actor, text: str) -> None:
        show(Line(actor, text))

    def ask(tool: str, note: str = "", **args: Any) -> str:
        nonlocal calls
        calls += 1
        say("agent", _call_text(tool, args) + (f"  ({note})" if note else ""))
        answer: str = bot.call(tool, args)
        say("gate", answer)
        return answer

    with effect_context(run_id="demo-run", agent_id="support-agent"):
        for title, play in SCENES:
            say("scene", title)
            calls, before = 0, len(vendor.calls)
            play(gate, vendor, ask, say)
            summary.scenes.append((title, calls, len(vendor.calls) - before))
    summary.vendor_log = list(vendor.calls)
    return summary


def _agent(kind: str, vendor: FakeVendor, gate: Gate) -> Any:
    """The LangChain agent where asked for (``auto``: when it can be imported), else the
    decorator."""
    if kind in ("auto", "langchain"):
        import importlib

        try:
            module = importlib.import_module("effectgate.demo_langchain")
        except ImportError:
            if kind == "langchain":
                raise
        else:
            return module.LangChainAgent(gate, vendor)
    return DecoratorAgent(make_tools(gate, vendor), vendor)
