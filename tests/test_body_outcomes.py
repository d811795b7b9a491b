"""What the gate records when a body ends oddly, on SQLite and Postgres: a body that hands back
unfinished work (a generator, a coroutine, an async generator, a task) did what it did before
returning, so it is AMBIGUOUS, never FAILED; an exception that an inner gated call raised and
its own gate recorded says nothing certain about the outer body, so the outer effect is
AMBIGUOUS too. FAILED would let a retry do the work again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import effectgate as eg
from effectgate.retry import is_retryable


def _blocked(call: Any, *args: Any) -> None:
    with pytest.raises(eg.EffectAmbiguous):
        call(*args)


def test_a_sync_body_that_returns_unfinished_work_is_ambiguous(gate: eg.Gate) -> None:
    """A streaming reply after the email went out, or a charge followed by a coroutine to
    notify later: the body ran to its return, so each retry would send or charge again."""
    sent: list[str] = []

    async def notify_later() -> None:  # never awaited: closed by the gate
        sent.append("notified")

    @gate.effect("email:{to}", effect_type="email.send")
    def send(to: str) -> Iterator[str]:
        sent.append(to)
        return (line for line in ["sent"])

    @gate.effect("charge:{card}", effect_type="payment.charge")
    def charge(card: str) -> Any:
        sent.append(card)
        return notify_later()

    for call, arg, key in ((send, "bob", "email:bob"), (charge, "c1", "charge:c1")):
        with pytest.raises(eg.ConfigError, match="unfinished"):
            call(arg)
        record = gate.get(key)
        assert record.state is eg.State.AMBIGUOUS and "unfinished" in (record.error or "")
        _blocked(call, arg)
    assert sent == ["bob", "c1"]


def test_an_async_body_that_returns_unfinished_work_is_ambiguous(gate: eg.Gate) -> None:
    """An ``async def`` that returns a coroutine, an async generator or a task was recorded
    COMMITTED before that work ran, outside the gate, with no record of how it ended."""
    done: list[str] = []

    async def later(tag: str) -> None:
        done.append(f"later {tag}")

    async def stream() -> AsyncIterator[str]:
        yield "x"

    @gate.effect("job:{tag}", effect_type="job.run")
    async def job(tag: str) -> Any:
        done.append(tag)
        if tag == "coroutine":
            return later(tag)
        if tag == "agen":
            return stream()
        return asyncio.ensure_future(later(tag))

    async def main() -> None:
        for tag in ("coroutine", "agen", "task"):
            with pytest.raises(eg.ConfigError, match="unfinished"):
                await job(tag)
            assert gate.get(f"job:{tag}").state is eg.State.AMBIGUOUS
            with pytest.raises(eg.EffectAmbiguous):
                await job(tag)
        await asyncio.sleep(0)  # the task, which was already running, is left to finish

    asyncio.run(main())
    assert done[:3] == ["coroutine", "agen", "task"]
    assert "later coroutine" not in done  # closed, never run


def test_a_callable_whose_call_is_a_generator_is_refused_when_decorated(gate: eg.Gate) -> None:
    class Streamer:
        def __call__(self, to: str) -> Iterator[str]:
            yield to

    class AsyncStreamer:
        async def __call__(self, to: str) -> AsyncIterator[str]:
            yield to

    for tool in (Streamer(), AsyncStreamer()):
        with pytest.raises(eg.ConfigError, match="generator"):
            gate.effect("s:{to}", effect_type="s.send")(tool)


def test_an_inner_effects_not_executed_leaves_the_outer_effect_ambiguous(gate: eg.Gate) -> None:
    """The outer body charged the card, then its gated receipt raised NotExecuted (rightly
    FAILED for the receipt). Classified as the outer body's own, the order was FAILED and
    every retry charged the card again (3 charges in 3 calls)."""
    charged: list[str] = []

    @gate.effect("receipt:{order}", effect_type="email.receipt")
    def send_receipt(order: str) -> None:
        raise eg.NotExecuted("the mail server refused the connection")

    @gate.effect("order:{order}", effect_type="payment.order")
    def place_order(order: str) -> None:
        charged.append(order)
        send_receipt(order)

    with pytest.raises(eg.NotExecuted) as raised:
        place_order("o1")
    assert gate.get("receipt:o1").state is eg.State.FAILED
    assert gate.get("order:o1").state is eg.State.AMBIGUOUS
    assert eg.recorded_outcome(raised.value) is eg.Outcome.AMBIGUOUS
    assert not is_retryable(raised.value)  # what the outer gate recorded
    _blocked(place_order, "o1")
    assert charged == ["o1"]
    with pytest.raises(eg.NotExecuted) as alone:  # the inner effect on its own: retryable
        send_receipt("o2")
    assert is_retryable(alone.value)


def test_an_inner_effects_refused_connection_leaves_the_async_outer_ambiguous(
        gate: eg.Gate) -> None:
    """The same for an async outer body and an inner error a built-in classifier calls
    FAILED (a refused connection); a classifier of the outer effect may still judge it."""
    import httpx

    charged: list[str] = []

    @gate.effect("notify:{order}", effect_type="http.notify", vendor="stripe")
    async def notify(order: str) -> None:
        async with httpx.AsyncClient() as client:
            await client.post("http://127.0.0.1:9/notify")  # discard port: refused

    @gate.effect("order:{order}", effect_type="payment.order")
    async def place_order(order: str) -> None:
        charged.append(order)
        await notify(order)

    @gate.effect("quote:{order}", effect_type="payment.quote",
                 classifiers=(lambda exc: eg.Outcome.FAILED,))
    async def quote(order: str) -> None:  # its owner says its body never acts first
        await notify(order)

    async def main() -> None:
        with pytest.raises(httpx.ConnectError):
            await place_order("o1")
        with pytest.raises(eg.EffectAmbiguous):
            await place_order("o1")
        with pytest.raises(httpx.ConnectError):
            await quote("o2")

    asyncio.run(main())
    assert gate.get("notify:o1").state is eg.State.FAILED
    assert gate.get("order:o1").state is eg.State.AMBIGUOUS
    assert gate.get("quote:o2").state is eg.State.FAILED
    assert charged == ["o1"]


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_a_warning_raised_as_an_error_never_loses_the_record(make_gate: Any,
                                                             caller: str) -> None:
    """Under ``-W error`` the gate's own warnings raise. The budget warning (a ceiling the
    call declared no cost for) came after the reservation and before the body: the body
    never ran, the lease was left to lapse to AMBIGUOUS. The not-stored warning came before
    the COMMITTED report: the body ran and nothing recorded it."""
    import warnings

    gate = make_gate(policy=eg.Policy.from_dict(
        {"effects": {"payment.*": {"budget": {"per_effect_type_micros": 10**9}}}}))
    ran: list[str] = []

    def charge(order: str) -> None:
        ran.append(order)

    def unstorable(order: str) -> object:
        ran.append(order)
        return object()  # no JSON form

    async def acharge(order: str) -> None:
        charge(order)

    async def aunstorable(order: str) -> object:
        return unstorable(order)

    charge_fn = charge if caller == "sync" else acharge
    store_fn = unstorable if caller == "sync" else aunstorable
    gated = gate.effect("pay:{order}", effect_type="payment.charge")(charge_fn)
    kept = gate.effect("label:{order}", effect_type="label.print")(store_fn)

    def call(fn: Any, order: str) -> Any:
        out = fn(order)
        return asyncio.run(out) if caller == "async" else out

    with warnings.catch_warnings():
        warnings.simplefilter("error", eg.EffectGateWarning)
        with pytest.raises(eg.BudgetWarning):
            call(gated, "o1")
        assert ran == [] and gate.get("pay:o1").state is eg.State.FAILED
        with pytest.raises(eg.ResultNotStoredWarning):
            call(kept, "o2")
        assert ran == ["o2"] and gate.get("label:o2").state is eg.State.COMMITTED
    with pytest.warns(eg.BudgetWarning):
        call(gated, "o1")  # a new attempt: the first never ran
    assert ran == ["o2", "o1"] and gate.get("pay:o1").attempt == 2
    assert call(kept, "o2") is None  # answered from the store, not run again
    assert ran == ["o2", "o1"]
