"""An async caller's reconcile hook has a deadline and threads of its own (red team, round
10): a hook that never answered held every begin of its key for ever, and six such calls on a
two-core machine filled the event loop's default executor, so an unrelated ``areport`` waited
for them. Past :data:`effectgate._drive.HOOK_SECONDS` the hook's answer is unknown (the begin
is BLOCKED, the effect stays AMBIGUOUS, the next begin asks again); sync hooks run on their
own pool, and the store's calls go on while they hang."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import effectgate as eg
from effectgate import _drive


def _ambiguous(gate: eg.Gate, key: str) -> None:
    d = gate.begin(effect_type="pay.x", key=key, payload={})
    gate.report(d, "ambiguous", error="timeout")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_hook_that_never_answers_is_unknown_after_the_deadline(
        make_gate: Any, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    monkeypatch.setattr(_drive, "HOOK_SECONDS", 0.3)
    gate: eg.Gate = make_gate(policy=False)
    _ambiguous(gate, "k")
    release = threading.Event()
    calls: list[str] = []

    if kind == "sync":
        def hook(record: eg.EffectRecord) -> str:
            calls.append(record.key)
            release.wait(30)
            return "committed"
    else:
        async def hook(record: eg.EffectRecord) -> str:  # type: ignore[misc]
            calls.append(record.key)
            await asyncio.sleep(30)
            return "committed"

    gate.reconciler("pay.*")(hook)

    async def main() -> eg.BeginDecision:
        return await asyncio.wait_for(
            gate.abegin(effect_type="pay.x", key="k", payload={}), 20)

    try:
        d = asyncio.run(main())
    finally:
        release.set()
    assert calls == ["k"]
    assert d.decision is eg.Decision.BLOCKED
    assert gate.get("k").state is eg.State.AMBIGUOUS  # nothing settled on a guess


def test_hooks_that_hang_leave_the_default_executor_to_the_store(make_gate: Any) -> None:
    """Eight begins whose sync hook hangs (more than the default executor's six threads on two
    cores, and than the hooks' own pool): an unrelated effect's begin and report still run
    while every hook is held; then the hooks are let go and their begins answer."""
    gate: eg.Gate = make_gate(policy=False)
    _ambiguous(gate, "stuck")
    release = threading.Event()
    gate.reconciler("pay.*")(lambda record: "committed" if release.wait(60) else None)

    async def main() -> list[Any]:
        stuck = [asyncio.ensure_future(gate.abegin(effect_type="pay.x", key="stuck",
                                                   payload={})) for _ in range(8)]
        await asyncio.sleep(0.2)
        other = await asyncio.wait_for(gate.abegin(effect_type="mail.x", key="other",
                                                   payload={}), 20)
        await asyncio.wait_for(gate.areport(other, "committed", result={}), 20)
        assert gate.get("other").state is eg.State.COMMITTED
        assert not any(t.done() for t in stuck)  # every hook still held
        release.set()
        return list(await asyncio.wait_for(asyncio.gather(*stuck), 30))

    answers = asyncio.run(main())
    assert eg.Decision.DUPLICATE in {a.decision for a in answers}
    assert gate.get("stuck").state is eg.State.COMMITTED
