"""The governance guarantees: G8 (approvals), G9 (budgets), G10 (unwind), G11 (prune).

Each check builds its own policy on the scratch namespace; the store's own policy and data
are not involved.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections import Counter
from typing import Any

from ..errors import InvalidTransition, PayloadMismatch
from ..gate import Gate
from ..states import Decision, State
from .harness import CheckFailed, NotApplicable, VerifyContext, expect

__all__ = ["check_g8", "check_g9", "check_g10", "check_g11"]

DOLLAR = 1_000_000


def _policy(data: dict[str, Any]) -> Any:
    try:
        from ..policy import Policy
    except ImportError:
        raise NotApplicable("this effectgate has no Policy (governance is not installed)") from None
    return Policy.from_dict(data)


def _needs(*names: str) -> None:
    missing = [n for n in names if not hasattr(Gate, n)]
    if missing:
        raise NotApplicable(f"this effectgate has no {', '.join(missing)}")


def check_g8(ctx: VerifyContext) -> str:
    _needs("approve")
    gate = ctx.gate(policy=_policy({"effects": {"verify.g8": {"approval": "always"}}}))
    key, payload = "verify:G8:refund", {"amount_cents": 500}

    def ask(**kw: Any) -> Any:
        return gate.begin(effect_type="verify.g8", key=key, payload=kw.pop("payload", payload),
                          agent_id="verify-agent", **kw)

    d = ask()
    expect(d.decision is Decision.APPROVAL_REQUIRED and bool(d.approval_id),
           f"an effect needing approval was answered {d.decision.value!r}")
    again = ask()
    expect(again.approval_id == d.approval_id,
           "asking again opened a second approval instead of pointing at the first")
    try:
        ask(payload={"amount_cents": 99_999})
    except PayloadMismatch:
        pass
    else:
        raise CheckFailed("a changed payload rode on the pending approval")
    try:
        gate.approve(d.approval_id or "", by="verify-agent")
    except InvalidTransition:
        pass
    else:
        raise CheckFailed("the agent approved its own request")
    gate.approve(d.approval_id or "", by="verify-operator")
    run = ask()
    expect(run.decision is Decision.EXECUTE, f"after approval: {run.decision.value!r}")
    gate.report(run, "committed", result={"refund": "re_g8"})
    replay = ask()
    expect(replay.decision is Decision.DUPLICATE,
           f"a replay after the approved run was answered {replay.decision.value!r}")
    try:
        gate.approve(d.approval_id or "", by="verify-operator")
    except InvalidTransition:
        pass
    else:
        raise CheckFailed("a consumed approval was approved again")
    _check_g8_cost(gate)
    return ("approval bound to its payload and the cost it was shown: a changed payload "
            "refused, self-approval refused, executed once, not reusable, one set aside by a "
            "larger cost ended")


def _check_g8_cost(gate: Gate) -> None:
    """An approval given at one cost does not run a call declaring a larger one: that call
    asks again, and the approval it set aside ends (never listed as approved again)."""
    def ask(cost: int) -> Any:
        return gate.begin(effect_type="verify.g8", key="verify:G8:cost", payload={},
                          agent_id="verify-agent", estimated_cost_micros=cost)

    first = ask(DOLLAR)
    gate.approve(first.approval_id or "", by="verify-operator")
    larger = ask(1_000 * DOLLAR)
    expect(larger.decision is Decision.APPROVAL_REQUIRED and larger.approval_id not in (
        None, first.approval_id), f"an approval at $1 answered a $1,000 call "
           f"{larger.decision.value!r}")
    old = gate.approval(first.approval_id or "")
    expect(old.state.value == "expired", "the approval a larger cost set aside still reads "
           f"{old.state.value!r}: it can never run anything")


def check_g9(ctx: VerifyContext) -> str:
    _needs("approve")
    gate = ctx.gate(policy=_policy(
        {"effects": {"verify.g9": {"budget": {"per_run_micros": 10 * DOLLAR}}}}))

    def spend(name: str, dollars: int) -> Any:
        return gate.begin(effect_type="verify.g9", key=f"verify:G9:{name}", payload={},
                          run_id="verify-run", estimated_cost_micros=dollars * DOLLAR)

    a = spend("a", 6)
    expect(a.decision is Decision.EXECUTE, f"$6 of $10 was answered {a.decision.value!r}")
    over = spend("b", 5)
    expect(over.decision is Decision.DENIED, f"$11 of $10 was answered {over.decision.value!r}")
    expect("ceiling" in (over.reason or ""), f"the refusal does not name the ceiling: "
           f"{over.reason!r}")
    gate.report(a, "ambiguous", error="reply lost")
    held = spend("c", 5)
    expect(held.decision is Decision.DENIED,
           "an AMBIGUOUS effect's spend was released: $5 more ran against $6 unknown")
    gate.resolve("verify:G9:a", "failed", by="verify-operator")
    freed = spend("c", 5)
    expect(freed.decision is Decision.EXECUTE,
           f"after the AMBIGUOUS spend resolved failed: {freed.decision.value!r}")
    gate.report(freed, "committed")
    return f"over the ceiling: denied ({over.reason}); AMBIGUOUS held $6 until resolved"


def check_g10(ctx: VerifyContext) -> str:
    _needs("unwind", "compensator")
    done: list[str] = []
    lock = threading.Lock()

    def gate_with_undo() -> Gate:
        gate = ctx.gate()

        @gate.compensator("verify.g10.*")
        def cancel(record: Any, compensation: Any) -> dict[str, str]:
            with lock:
                done.append(compensation["cancel"])
            return {"cancelled": compensation["cancel"]}

        return gate

    gate = gate_with_undo()
    for group in ("verify:G10:trip", "verify:G10:race"):
        for step, undo in (("flight", "flight"), ("hotel", "hotel"), ("note", None),
                           ("car", "car")):
            d = gate.begin(effect_type=f"verify.g10.{step}", key=f"{group}:{step}",
                           payload={}, group_key=group,
                           compensation={"cancel": f"{group}:{undo}"} if undo else None)
            gate.report(d, "committed", result={"booked": step})
    report = gate.unwind("verify:G10:trip", by="verify")
    order = [s.key.rsplit(":", 1)[1] for s in report.compensated]
    expect(order == ["car", "hotel", "flight"], f"compensated in the order {order}")
    expect([s.key for s in report.irreversible] == ["verify:G10:trip:note"],
           "the step with no compensation is not listed as irreversible")
    gate.unwind("verify:G10:trip", by="verify")  # re-run: nothing twice
    gates = [gate_with_undo() for _ in range(3)]
    threads = [threading.Thread(target=g.unwind, args=("verify:G10:race",)) for g in gates]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    counts = Counter(done)
    twice = sorted(k for k, n in counts.items() if n > 1)
    expect(not twice, f"compensated more than once: {twice}")
    expect(len(counts) == 6, f"compensations run: {sorted(counts)}")
    return "reverse order, each undo once across a re-run and 3 concurrent unwinds"


def check_g11(ctx: VerifyContext) -> str:
    _needs("prune")
    gate = ctx.gate()
    key = "verify:G11:refund"
    d = gate.begin(effect_type="verify.g11", key=key, payload={"amount": 5})
    gate.report(d, "committed", result={"card": "4242"})
    lost = gate.begin(effect_type="verify.g11", key="verify:G11:lost", payload={},
                      lease_seconds=0.05)
    pruned = gate.prune(datetime.timedelta(0))
    expect(pruned >= 1, "prune pruned nothing")
    record = gate.get(key)
    expect(record.state is State.COMMITTED and record.result is None,
           f"after prune: {record.state.value} with result {record.result!r}")
    fresh = ctx.gate(memo_size=0)
    dup = fresh.begin(effect_type="verify.g11", key=key, payload={"amount": 5})
    expect(dup.decision is Decision.DUPLICATE,
           f"a pruned key was answered {dup.decision.value!r}, not 'duplicate'")
    try:
        fresh.begin(effect_type="verify.g11", key=key, payload={"amount": 6})
    except PayloadMismatch:
        pass
    else:
        raise CheckFailed("a pruned key accepted another payload")
    time.sleep(0.1)
    expect(fresh.get("verify:G11:lost").state is State.AMBIGUOUS,
           "prune touched an effect whose outcome is unknown")
    gate.resolve("verify:G11:lost", "failed", by="verify")
    del lost
    return "the tombstone refused the duplicate and another payload; unknown effects kept"
