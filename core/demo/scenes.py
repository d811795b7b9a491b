"""The demo's five scenes, each played twice: without the gate, then with it.

The agent, its tools, the vendor and the agent's calls are the same in both passes; only the
gate differs, and so do the answers the agent gets (and so what it does next). Each pass keeps
a :class:`Tally` per scene of what reached the vendor and what that did: refunds and the money
they moved, duplicates among them, refunds nobody approved, money spent past the run's
ceiling, bookings left standing on a trip that failed, and cancellations (which undo, and are
never counted as duplicates).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..gate import Gate
from .agents import Answer, brief, effect_key
from .vendor import FakeVendor, VendorCall, money

__all__ = ["CEILING_CENTS", "SCENES", "Line", "Pass", "Tally", "demo_policy"]

Actor = Literal["scene", "pass", "agent", "gate", "model", "vendor", "operator", "note"]
CEILING_CENTS = 100_000  # the run may refund $1,000 in all
APPROVAL_CENTS = 50_000  # refunds of $500 or more need a human


def demo_policy() -> Any:
    """Refunds of $500 or more need a human; refunds in one run may total $1,000."""
    from ..policy import Policy

    return Policy.from_dict({"effects": {"payment.refund": {
        "vendor": "stripe",
        "approval": {"at_or_above_micros": APPROVAL_CENTS * 10_000},
        "budget": {"per_run_micros": CEILING_CENTS * 10_000},
    }}})


@dataclass(frozen=True, slots=True)
class Line:
    """One thing that happened: who (``actor``) did or saw what (``text``); with the gate, the
    effect ``key`` it concerns and the gate's ``decision`` (read by ``effectgate.viz``)."""

    actor: Actor
    text: str
    key: str | None = None
    decision: str | None = None


@dataclass
class Tally:
    """What one pass of one scene did at the vendor."""

    agent_calls: int = 0
    vendor_calls: int = 0
    refunds: int = 0
    duplicate_refunds: int = 0
    refunded_cents: int = 0
    unapproved_refunds: int = 0
    over_ceiling_cents: int = 0
    bookings_left: int = 0
    cancellations: int = 0
    states: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def add(self, other: Tally) -> None:
        """Add ``other``'s counts to this one."""
        for name in self.__dataclass_fields__:
            if name == "states":
                self.states += other.states
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))


class Pass:
    """One pass over the scenes: an agent, a vendor and (with the gate) a gate and operator."""

    def __init__(self, label: str, agent: Any, vendor: FakeVendor, gate: Gate | None,
                 show: Callable[[Line], None]) -> None:
        self.label = label
        self.agent = agent
        self.vendor = vendor
        self.gate = gate
        self.show = show
        self.tally = Tally()
        self._seen_refunds: Counter[str] = Counter()
        vendor.on_call = self._vendor_call

    def say(self, actor: Actor, text: str, *, key: str | None = None,
            decision: str | None = None) -> None:
        """Show one line."""
        self.show(Line(actor, text, key, decision))

    def _vendor_call(self, call: VendorCall) -> None:
        t = self.tally
        t.vendor_calls += 1
        if call.kind == "refund":
            before = self.vendor.refunded_cents() - call.cents
            t.refunds += 1
            t.refunded_cents += call.cents
            if self._seen_refunds[call.subject]:
                t.duplicate_refunds += 1
            self._seen_refunds[call.subject] += 1
            t.over_ceiling_cents += (max(0, before + call.cents - CEILING_CENTS)
                                     - max(0, before - CEILING_CENTS))
            if call.cents >= APPROVAL_CENTS and not self._approved(call.subject):
                t.unapproved_refunds += 1
            again = " (a second refund)" if self._seen_refunds[call.subject] > 1 else ""
            self.say("vendor", f"refunds {money(call.cents)} on {call.subject} → "
                               f"{call.receipt}{again}")
        elif call.kind == "book":
            self.say("vendor", f"books the {call.subject.replace(' ', ' of ')} → {call.receipt}")
        elif call.kind == "book_refused":
            self.say("vendor", f"refuses the {call.subject.split()[0]}: none available")
        else:
            t.cancellations += 1
            self.say("vendor", f"cancels {call.subject}")

    def _approved(self, txn_id: str) -> bool:
        if self.gate is None:
            return False
        approval_id = self.gate.get(f"refund:{txn_id}").approval_id
        return approval_id is not None and any(
            a.approval_id == approval_id and a.decided_by
            for a in self.gate.list_approvals(state=None))

    def ask(self, tool: str, note: str = "", **args: Any) -> Answer:
        """The agent calls ``tool``; the lines show the call, the vendor, the gate and what the
        model is told."""
        self.tally.agent_calls += 1
        self.say("agent", _call_text(tool, args) + (f"  ({note})" if note else ""))
        answer: Answer = self.agent.call(tool, args)
        if self.gate is not None:
            state = self.gate.get(effect_key(tool, args)).state.name
            self.tally.states.append(state)
            detail = (f"; the stored result {answer.told}, the vendor is not called"
                      if answer.decision == "duplicate" else "")
            self.say("gate", f"{answer.decision} → state {state}{detail}",
                     key=effect_key(tool, args), decision=answer.decision)
        if answer.raised:
            self.say("agent", f"the run fails with {answer.told}; it is started again")
        elif not answer.ok or self.gate is None:
            self.say("model", f"is told: {answer.told}")
        return answer

    def operator(self, text: str, key: str | None = None) -> None:
        """An operator's command (shown as typed)."""
        self.say("operator", text, key=key)


def _call_text(tool: str, args: dict[str, Any]) -> str:
    if tool == "refund":
        return f"refund({args['txn_id']}, {money(args['amount_cents'])})"
    return f"{tool}({args['trip_id']})"


# -- the scenes ----------------------------------------------------------------------------------


def _scene_retry(p: Pass) -> None:
    p.ask("refund", txn_id="txn_1001", amount_cents=2500)
    p.ask("refund", "the framework retries: the first reply was slow", txn_id="txn_1001",
          amount_cents=2500)


def _scene_lost_reply(p: Pass) -> None:
    p.vendor.lose_next_reply = True
    p.ask("refund", txn_id="txn_1002", amount_cents=4000)
    p.ask("refund", "the call is retried", txn_id="txn_1002", amount_cents=4000)
    if p.gate is None:
        return
    record = p.gate.get("refund:txn_1002")
    receipt = p.vendor.by_idempotency_key[record.vendor_key.value] if record.vendor_key else {}
    p.say("operator", f"finds the effect's idempotency key in the vendor's dashboard: "
                      f"{receipt['refund_id']} exists")
    p.gate.resolve("refund:txn_1002", "committed", by="alice", result=receipt,
                   note="found in the vendor dashboard")
    p.operator("effectgate resolve refund:txn_1002 --committed", key="refund:txn_1002")
    p.ask("refund", "the agent asks again", txn_id="txn_1002", amount_cents=4000)


def _scene_approval(p: Pass) -> None:
    first = p.ask("refund", txn_id="txn_1003", amount_cents=75000)
    if p.gate is None or first.decision != "approval_required":
        return
    pending = [a for a in p.gate.list_approvals() if a.key == "refund:txn_1003"]
    p.operator(f"effectgate approve {pending[0].approval_id}")
    p.gate.approve(pending[0].approval_id, by="alice", note="customer verified")
    p.ask("refund", "after approval", txn_id="txn_1003", amount_cents=75000)


def _scene_budget(p: Pass) -> None:
    spent = p.vendor.refunded_cents()
    p.say("note", f"refunds in this run may total {money(CEILING_CENTS)}; "
                  f"{money(spent)} is refunded so far")
    p.ask("refund", txn_id="txn_1004", amount_cents=30000)


def _scene_saga(p: Pass) -> None:
    p.ask("book_flight", trip_id="trip_77")
    p.ask("book_hotel", trip_id="trip_77")
    p.ask("book_car", trip_id="trip_77")
    if p.gate is None:
        p.say("note", "the trip cannot happen; nothing records what was booked for it")
    else:
        p.operator("effectgate unwind trip:trip_77")
        report = p.gate.unwind("trip:trip_77", by="alice")
        for step in report.compensated:
            p.say("gate", f"compensated {step.key} (cancelled {brief(step.result)})",
                  key=f"compensate:{step.key}")
        for step in report.skipped:
            p.say("gate", f"nothing to undo for {step.key}: it is {step.state.upper()}")
        for step in report.unresolved + report.failed + report.irreversible:
            p.say("gate", f"not undone: {step.key}: {step.detail}")
        p.operator("effectgate unwind trip:trip_77   (again)")
        again = p.gate.unwind("trip:trip_77", by="alice")
        p.say("gate", f"{len(again.compensated)} steps were compensated before; "
                      "nothing is cancelled twice")
    p.tally.bookings_left = sum(1 for trip in p.vendor.bookings.values() if trip == "trip_77")


SCENES: list[tuple[str, str, Callable[[Pass], None]]] = [
    ("A retried refund", "the framework retries a refund whose reply was slow",
     _scene_retry),
    ("A lost reply", "the vendor refunds, but its reply is lost; the model retries",
     _scene_lost_reply),
    ("A large refund", "a $750 refund; the policy wants a human for $500 or more",
     _scene_approval),
    ("An overspend", "a $300 refund in a run allowed $1,000 of refunds", _scene_budget),
    ("A half-booked trip", "flight, hotel, then no car: the trip must be undone",
     _scene_saga),
]

