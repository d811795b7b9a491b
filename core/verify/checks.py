"""The guarantees one process can check: G1, G3–G7 (the core protocol) and G13–G16 (who may
act on an effect, and what identifies it)."""

from __future__ import annotations

import time
from typing import Any

from ..errors import (
    EffectAmbiguous,
    EffectGateError,
    EffectKeyError,
    InvalidTransition,
    PayloadMismatch,
    StaleLease,
    UnknownEffect,
)
from ..request import Lease
from ..states import Decision, State
from .harness import LEASE, CheckFailed, VerifyContext, count_keys, expect, key_for

__all__ = [
    "check_g1", "check_g3", "check_g4", "check_g5", "check_g6", "check_g7", "check_g13",
    "check_g14", "check_g15", "check_g16",
]


def check_g1(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    runs: list[str] = []

    @gate.effect("verify:G1:{ref}", effect_type="verify.g1")
    def act(ref: str) -> dict[str, str]:
        runs.append(ref)
        return {"receipt": f"r-{ref}"}

    first = act("a")
    again = [act("a") for _ in range(3)]
    fresh = ctx.gate().begin(effect_type="verify.g1", key=key_for("G1", "a"), payload={"ref": "a"})
    expect(len(runs) == 1, f"the body ran {len(runs)} times for one committed key")
    expect(all(r == first for r in again), f"a duplicate returned {again[0]!r}, not {first!r}")
    expect(fresh.decision is Decision.DUPLICATE,
           f"a second gate was answered {fresh.decision.value!r}, not 'duplicate'")
    expect(fresh.result == first, f"the store returned {fresh.result!r}, not {first!r}")
    return "3 repeats and a second gate got the stored result; the body ran once"


def check_g3(ctx: VerifyContext) -> str:
    gate = ctx.gate(lease_seconds=LEASE)
    key = key_for("G3", "lapse")
    payload = {"ref": "lapse", "n": 1}
    d = gate.begin(effect_type="verify.g3", key=key, payload=payload)
    expect(d.decision is Decision.EXECUTE, f"first begin answered {d.decision.value!r}")
    time.sleep(LEASE + 0.15)
    state = gate.get(key).state
    expect(state is State.AMBIGUOUS,
           f"past its lease the effect reads {state.value}, not ambiguous")
    again = ctx.gate().begin(effect_type="verify.g3", key=key, payload=payload)
    expect(again.decision is Decision.BLOCKED,
           f"a blind retry was answered {again.decision.value!r}, not 'blocked'")
    ran: list[int] = []

    @ctx.gate().effect("verify:G3:{ref}", effect_type="verify.g3")
    def act(ref: str, n: int) -> None:
        ran.append(n)

    try:
        act("lapse", 1)
    except EffectAmbiguous:
        pass
    else:
        raise CheckFailed("the decorator ran a retry of an AMBIGUOUS effect")
    expect(not ran, "the body of a retry ran")
    return f"after a {LEASE}s lease: reads ambiguous, begin answers blocked, the body is not run"


def check_g4(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    key = key_for("G4", "retry")
    first = gate.begin(effect_type="verify.g4", key=key, payload={"n": 1}, vendor="stripe")
    gate.report(first, "failed", error="connection refused")
    second = gate.begin(effect_type="verify.g4", key=key, payload={"n": 1}, vendor="stripe")
    expect(second.decision is Decision.EXECUTE,
           f"after FAILED, begin answered {second.decision.value!r}, not 'execute'")
    expect(second.attempt == first.attempt + 1, f"the new attempt is {second.attempt}, not 2")
    expect(second.vendor_idempotency_key != first.vendor_idempotency_key,
           "the new attempt reused the failed attempt's vendor key")
    gate.report(second, "committed", result={"ok": True})
    return "attempt 2 executed with a new vendor key"


def check_g5(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    key = key_for("G5", "collide")
    d = gate.begin(effect_type="verify.g5", key=key, payload={"amount": 500})
    gate.report(d, "committed", result={"ok": True})
    before = gate.get(key)
    try:
        ctx.gate().begin(effect_type="verify.g5", key=key, payload={"amount": 900})
    except PayloadMismatch:
        pass
    else:
        raise CheckFailed("the same key with another payload was not refused")
    after = gate.get(key)
    expect(before == after, "the refused begin changed the stored effect")
    return "PayloadMismatch; the stored effect unchanged"


def check_g6(ctx: VerifyContext) -> str:
    gate = ctx.gate(lease_seconds=LEASE)
    key = key_for("G6", "zombie")
    zombie = gate.begin(effect_type="verify.g6", key=key, payload={"n": 1})
    time.sleep(LEASE + 0.15)
    gate.resolve(key, "failed", by="effectgate-verify", note="G6")
    holder = gate.begin(effect_type="verify.g6", key=key, payload={"n": 1})
    expect(holder.decision is Decision.EXECUTE and holder.lease_token > zombie.lease_token,
           f"the new attempt got {holder.decision.value!r} with token {holder.lease_token}")
    for outcome in ("committed", "failed", "ambiguous"):
        try:
            gate.report(zombie, outcome, result={"from": "zombie"})
        except StaleLease:
            continue
        raise CheckFailed(f"a report {outcome!r} with stale token {zombie.lease_token} was taken")
    try:
        gate.extend_lease(zombie, 30)
    except StaleLease:
        pass
    else:
        raise CheckFailed("a stale holder extended its lease")
    gate.report(holder, "committed", result={"from": "holder"})
    stored = gate.get(key)
    expect(stored.result == {"from": "holder"}, f"the stored result is {stored.result!r}")
    return "reports and a heartbeat with the old token refused; the new holder's result kept"


def check_g7(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    ran: list[object] = []

    @gate.effect("verify:G7:{order.id}", effect_type="verify.g7")
    def act(order: Any) -> None:
        ran.append(order)

    bad: list[Any] = [None, {"id": None}, {"id": ""}, {"id": 1.5}, {"id": [1]}]
    for order in bad:
        try:
            act(order)
        except EffectKeyError:
            continue
        raise CheckFailed(f"the template rendered from {order!r}")
    try:
        gate.effect("verify:G7:{missing}", effect_type="verify.g7")(lambda order: None)
    except EffectKeyError:
        pass
    else:
        raise CheckFailed("a template naming a missing argument was accepted")
    expect(not ran, "a body ran with an unresolvable key")
    written = count_keys(gate, "verify:G7:%")
    expect(written == 0, f"{written} effects were written for unresolvable keys")
    return f"{len(bad) + 1} unresolvable templates refused; nothing ran, nothing written"


def _refused(what: str, call: Any, *errors: type[EffectGateError]) -> None:
    try:
        call()
    except errors:
        return
    raise CheckFailed(f"{what} was accepted")


def check_g13(ctx: VerifyContext) -> str:
    mine = ctx.gate(lease_seconds=LEASE)
    theirs = ctx.gate(namespace=ctx.other_namespace())
    key = key_for("G13", "isolated")
    d = mine.begin(effect_type="verify.g13", key=key, payload={"n": 1})
    before = mine.get(key)
    lease = d.lease
    assert lease is not None
    _refused("another namespace reading the effect", lambda: theirs.get(key), UnknownEffect)
    _refused("another namespace reporting with the holder's decision",
             lambda: theirs.report(d, "failed"), InvalidTransition, StaleLease, UnknownEffect)
    _refused("another namespace reporting with the holder's full proof",
             lambda: theirs.report(lease, "failed"), StaleLease, UnknownEffect)
    _refused("another namespace extending the lease",
             lambda: theirs.extend_lease(lease, 30), StaleLease, UnknownEffect)
    time.sleep(LEASE + 0.15)
    _refused("another namespace resolving the effect",
             lambda: theirs.resolve(key, "failed", by="effectgate-verify"), UnknownEffect)
    expect(mine.get(key) == before or mine.get(key).state is State.AMBIGUOUS,
           "another namespace changed the effect")
    own = theirs.begin(effect_type="verify.g13", key=key, payload={"n": 1})
    expect(own.decision is Decision.EXECUTE, "the same key in another namespace is not its own "
           f"effect (answered {own.decision.value!r})")
    return "get, report (decision or full proof), extend and resolve from another namespace " \
        "refused; the same key there is a separate effect"


def check_g14(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    key = key_for("G14", "holder")
    d = gate.begin(effect_type="verify.g14", key=key, payload={"n": 1})
    lease = d.lease
    assert lease is not None
    before = gate.get(key)
    forged = [
        Lease(key, lease.token, "guessed-" + "0" * 14),
        Lease(key, lease.token + 1, lease.secret),
        Lease(key_for("G14", "other"), lease.token, lease.secret),
    ]
    other = gate.begin(effect_type="verify.g14", key=key_for("G14", "other"), payload={"n": 2})
    for proof in forged:
        _refused(f"a report with a forged proof {proof.token}", lambda p=proof: gate.report(
            p, "failed"), StaleLease, UnknownEffect)
        _refused("a heartbeat with a forged proof", lambda p=proof: gate.extend_lease(p, 30),
                 StaleLease, UnknownEffect)
    expect(gate.get(key) == before, "a forged proof changed the effect")
    gate.report(lease, "committed", result={"ok": True})
    gate.report(other, "committed", result={"ok": 2})
    expect(gate.get(key).state is State.COMMITTED, "the holder's own proof was refused")
    return "guessed secret, borrowed token and another key's secret refused; the holder's taken"


def check_g15(ctx: VerifyContext) -> str:
    asked: list[str] = []
    gate = ctx.gate(lease_seconds=LEASE)

    @gate.reconciler("verify.g15")
    def ask(record: Any) -> str:
        asked.append(record.key)
        return "failed"

    key = key_for("G15", "slow")
    d = gate.begin(effect_type="verify.g15", key=key, payload={"n": 1}, vendor="stripe",
                   lease_seconds=LEASE)
    _refused("resolving a live lease without force",
             lambda: gate.resolve(key, "failed", by="effectgate-verify"), InvalidTransition)
    time.sleep(LEASE + 0.1)
    early = gate.begin(effect_type="verify.g15", key=key, payload={"n": 1}, vendor="stripe",
                       lease_seconds=LEASE)
    expect(early.decision is Decision.BLOCKED and not asked,
           f"inside the grace period: answered {early.decision.value!r}, hook asked {asked}")
    time.sleep(LEASE + 0.1)
    late = gate.begin(effect_type="verify.g15", key=key, payload={"n": 1}, vendor="stripe",
                      lease_seconds=LEASE)
    expect(bool(asked), "the reconcile hook was never asked after the grace period")
    expect(late.decision is Decision.EXECUTE and late.attempt == 2,
           f"after a reconciled failure: {late.decision.value!r}, attempt {late.attempt}")
    expect(late.vendor_idempotency_key == d.vendor_idempotency_key,
           "a reconciled failure moved the next attempt to a new vendor key")
    gate.report(late, "committed", result={"ok": True})
    return "live lease refused; hook asked only after the grace period; attempt 2 kept the " \
        "vendor key"


def check_g16(ctx: VerifyContext) -> str:
    gate = ctx.gate()
    key = key_for("G16", "typed")
    d = gate.begin(effect_type="verify.g16.refund", key=key, payload={"n": 1})
    gate.report(d, "committed", result={"refund": 1})
    before = gate.get(key)
    _refused("the same key and payload under another effect type",
             lambda: ctx.gate().begin(effect_type="verify.g16.payout", key=key,
                                      payload={"n": 1}), PayloadMismatch)
    expect(gate.get(key) == before, "the refused begin changed the stored effect")
    return "PayloadMismatch naming both types; the stored effect unchanged"
