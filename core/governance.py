"""What a policy asks of one ``begin``: deny, approval, spend ceilings — evaluated once, before
the store is touched, and carried on the request.

Spend is counted in ``effectgate_budgets``, one row per ceiling scope (``pattern|run|run_42``,
``*|day|2026-11-30``), by a conditional upsert that never lets a counter pass its limit — in the
same transaction as the reservation, so a refused charge reserves nothing and a lost race
charges nothing. The counters an attempt was charged to travel with the effect
(``budget_keys``), so ``report`` and ``resolve`` correct or release exactly those.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .policy import ApprovalRule, Policy

__all__ = ["Governance", "dump_keys", "evaluate", "load_keys", "release_delta"]


@dataclass(frozen=True, slots=True)
class Governance:
    """The policy's verdict inputs for one request."""

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

    def scope_keys(self, effect_type: str, run_id: str | None,
                   agent_id: str | None) -> list[tuple[str, bool, int, str]]:
        """(scope key, per-day?, limit, label) for each ceiling that can count this call.

        A run or agent ceiling does not apply to a call with no run or agent id."""
        out = []
        for pattern, scope, limit in self.ceilings:
            label = f"{scope} ceiling of {dollars(limit)} on {pattern}"
            if scope == "run":
                if run_id is None:
                    continue
                out.append((f"{pattern}|run|{run_id}", False, limit, label))
            elif scope == "agent":
                if agent_id is None:
                    continue
                out.append((f"{pattern}|agent|{agent_id}", False, limit, label))
            elif scope == "effect_type":
                out.append((f"{pattern}|effect_type|{effect_type}", False, limit, label))
            else:
                out.append((f"{pattern}|day|", True, limit, label))
        return out


def evaluate(policy: Policy, effect_type: str, cost: int | None) -> Governance | None:
    """What ``policy`` asks of a call of ``effect_type`` costing ``cost``; None when nothing."""
    rule = policy.rule_for(effect_type)
    ceilings = tuple(policy.ceilings_for(effect_type))
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
    """Micro-units as dollars for people: 1_500_000 -> "$1.50"."""
    return f"${micros / 1_000_000:,.2f}"


def dump_keys(keys: list[str]) -> str | None:
    """The counters an attempt was charged to, as stored on the effect."""
    return json.dumps(keys) if keys else None


def load_keys(text: str | None) -> list[str]:
    """The inverse of :func:`dump_keys`."""
    return list(json.loads(text)) if text else []


def release_delta(outcome: str, estimated: int | None, actual: int | None) -> int:
    """How a counter moves when an attempt ends: FAILED releases what it held, COMMITTED
    corrects the estimate by the actual cost, AMBIGUOUS holds."""
    held = estimated or 0
    if outcome == "failed":
        return -held
    if outcome == "committed" and actual is not None:
        return actual - held
    return 0

