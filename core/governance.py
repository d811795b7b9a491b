"""What a policy asks of one ``begin``: deny, approval, spend ceilings — evaluated once, before
the store is touched, and carried on the request.

Spend is counted in ``effectgate_budgets``, one row per ceiling scope (``pattern|run|run_42``,
``*|day|2026-11-30``), by a conditional upsert that never lets a counter pass its limit — in the
same transaction as the reservation, so a refused charge reserves nothing and a lost race
charges nothing. The counters an attempt was charged to travel with the effect, so ``report``
and ``resolve`` correct or release exactly those (see ``decide`` for how each moves them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .states import Decision

if TYPE_CHECKING:
    from .policy import ApprovalRule, Policy

WAITS_FOR_ROOM = "approved; refused when called, it waits for room"
"""How the reason of an approved effect that a spend ceiling refused when it was called
starts (it keeps waiting, approved, for room: :func:`waits_for_room`)."""
OVER_ITS_LIMIT = ("approved; refused when called: its cost alone is over a spend ceiling's "
                  "limit, so it will not run under that ceiling")
"""How the reason of an approved effect starts when its declared cost alone is over the
limit of the ceiling that refused it: no window ever makes room for it (:func:`waits_for_room`,
:class:`OverLimit`)."""

__all__ = [
    "OVER_ITS_LIMIT", "WAITS_FOR_ROOM", "Charge", "Governance", "OverLimit", "decided_next",
    "dollars", "evaluate", "superseded", "waits_for_room",
]


class OverLimit(str):
    """The label of a ceiling whose limit a call's declared cost alone is over (made by
    :meth:`Governance.charges`, which puts its charge first). A ``str``, so it travels wherever
    a ceiling's label does — the store's refusal, the Postgres reservation's, the model's — and
    the refusal then says the truth: no window will ever make room for that call
    (:func:`waits_for_room`; the caller's answer: :func:`effectgate.decide.over_its_limit`)."""

    __slots__ = ()


class Charge(NamedTuple):
    """One spend counter a call is charged to: its key (a per-day counter's key gets the
    store's UTC date appended), its limit, and the ceiling's name for people."""

    scope_key: str
    per_day: bool
    limit: int
    label: str


class Governance(NamedTuple):
    """The policy's verdict inputs for one request (an immutable value, like the request that
    carries it: a named tuple costs a fraction of a frozen dataclass to define and to make)."""

    deny: str | None
    approval: ApprovalRule | None
    ceilings: tuple[tuple[str, str, int], ...]
    cost: int | None
    on_ambiguous: str
    budget_warning: str | None

    @property
    def counts_spend(self) -> bool:
        """True when the call declared a cost and ceilings apply."""
        return bool(self.ceilings) and self.cost is not None

    def charges(self, effect_type: str, run_id: str | None,
                agent_id: str | None) -> tuple[Charge, ...]:
        """The counter of each ceiling that can count this call. A run or agent ceiling does
        not apply to a call with no run or agent id."""
        out: list[Charge] = []
        cost = self.cost or 0
        alone = False
        for pattern, scope, limit in self.ceilings:
            label = f"{scope} ceiling of {dollars(limit)} on {pattern}"
            if cost > limit:
                label, alone = OverLimit(label), True
            if scope == "run":
                if run_id is None:
                    continue
                out.append(Charge(f"{pattern}|run|{run_id}", False, limit, label))
            elif scope == "agent":
                if agent_id is None:
                    continue
                out.append(Charge(f"{pattern}|agent|{agent_id}", False, limit, label))
            elif scope == "effect_type":
                out.append(Charge(f"{pattern}|effect_type|{effect_type}", False, limit, label))
            else:
                out.append(Charge(f"{pattern}|day|", True, limit, label))
        if alone:  # the ceiling its cost alone is over refuses first, and is the one named
            out.sort(key=lambda charge: not isinstance(charge.label, OverLimit))
        return tuple(out)


    def unscoped(self, effect_type: str, run_id: str | None, agent_id: str | None) -> str | None:
        """The warning for a call that a run or agent ceiling cannot count, because it has no
        run or agent id (None when every ceiling counts it)."""
        missing = [(pattern, scope) for pattern, scope, _ in self.ceilings
                   if (scope == "run" and run_id is None)
                   or (scope == "agent" and agent_id is None)]
        if not missing:
            return None
        names = ", ".join(f"{scope} ({pattern})" for pattern, scope in missing)
        ids = " or ".join(sorted({f"{scope}_id" for _, scope in missing}))
        return (f"a spend ceiling applies to {effect_type} [{names}] but this call has no "
                f"{ids}: that ceiling cannot count it")


def evaluate(policy: Policy, effect_type: str, cost: int | None, *,
             spends: bool = True) -> Governance | None:
    """What ``policy`` asks of a call of ``effect_type`` costing ``cost``; None when nothing.
    ``spends=False`` (an undo): no spend ceiling counts it — an undo gives back, and a budget
    spent must never block it — while ``cost`` (its step's) still decides an approval."""
    rule = policy.rule_for(effect_type)
    ceilings = tuple(policy.ceilings_for(effect_type)) if spends else ()
    deny = rule.denied if rule else None
    approval = rule.approval if rule else None
    if approval is not None and not approval.applies(cost):
        approval = None
    on_ambiguous = rule.on_ambiguous if rule else "reconcile"
    if not (deny or approval or ceilings or on_ambiguous != "reconcile"):
        return None
    warning = None
    if ceilings and cost is None:
        names = ", ".join(f"{scope} ({pattern})" for pattern, scope, _ in ceilings)
        warning = (
            f"a spend ceiling applies to {effect_type} [{names}] but this call declared no "
            "estimated_cost_micros: the ceiling cannot fire"
        )
    return Governance(deny, approval, ceilings, cost, on_ambiguous, warning)


def dollars(micros: int) -> str:
    """Micro-units as dollars for people, exactly: 1_500_000 -> "$1.50", 4_000 -> "$0.004",
    1_234_567 -> "$1.234567". Never rounded (a model call's cost is a fraction of a cent: a
    ceiling or an estimate of $0.004 must not read "$0.00"), never through a float."""
    whole, fraction = divmod(abs(int(micros)), 1_000_000)
    digits = f"{fraction:06d}".rstrip("0").ljust(2, "0")
    return f"{'-' if micros < 0 else ''}${whole:,}.{digits}"


def waits_for_room(label: str) -> str:
    """The reason written on an approved effect whose call the spend ceiling ``label``
    refused: it still waits for its approval (unconsumed) and runs on it once there is room,
    so its state does not move, but an operator reads why it has not run. When its cost alone
    is over that ceiling's limit (``label`` an :class:`OverLimit`) no room will ever come: the
    reason says so (:data:`OVER_ITS_LIMIT`), and the approval still waits unconsumed — the
    ceiling is the operator's to raise, and then the next call runs on this yes, which a
    budget must never cost; until then it runs nothing, and its approval expires as any does."""
    if isinstance(label, OverLimit):
        return f"{OVER_ITS_LIMIT}: {label}"
    return f"{WAITS_FOR_ROOM}: spend ceiling reached: {label}"


def superseded(cost: int | None, decision: Decision, approval_id: str | None) -> str:
    """The reason written on an approved request that a call declaring another cost (a
    larger one, one where none was shown, or none where one was) set aside: its effect was
    decided again without it (``decision``; ``approval_id`` the new request it asks for), so
    it can never run anything."""
    declared = "no estimated cost" if cost is None else f"an estimated cost of {dollars(cost)}"
    if decision is Decision.APPROVAL_REQUIRED and approval_id is not None:
        then = f"asked for a new approval, {approval_id}"
    elif decision is Decision.EXECUTE:
        then = "started without one (the policy asks none at that cost)"
    else:
        then = f"was {decision.value}"
    return (f"superseded: a call declared {declared}, not the cost this approval was given "
            f"for, and {then}")


def decided_next(approval_state: str, effect_reason: str | None = None) -> str:
    """What the next call does about an effect still waiting on an approval a person decided
    (``effectgate ls`` and ``show``, the console's effect page). An approval given is no
    promise to run: a spend ceiling is checked when the call comes, so an approved effect
    refused for spend stays waiting, approved, until there is room — its ``effect_reason``
    (:func:`waits_for_room`) says which ceiling refused the last call, and so does this."""
    if approval_state == "approved":
        if effect_reason is not None and effect_reason.startswith(OVER_ITS_LIMIT):
            ceiling = effect_reason.removeprefix(OVER_ITS_LIMIT).removeprefix(": ")
            return ("the next call with the same arguments is refused too: its cost alone is "
                    f"over the {ceiling}; it runs on this approval once that ceiling is raised "
                    "(or at a cost within it), until the approval expires")
        nxt = ("the next call with the same arguments runs it, if the policy's spend ceilings "
               "have room for it then")
        if effect_reason is not None and effect_reason.startswith(WAITS_FOR_ROOM):
            refused = effect_reason.removeprefix(WAITS_FOR_ROOM).removeprefix(": ")
            return f"{nxt} (its last call was refused: {refused})"
        return nxt
    return "the next call with the same arguments asks for a new approval"
