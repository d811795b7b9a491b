"""Review of the async large-value path (``_payload_steps``, ``EffectSpec.arequest``,
``Reporter.areport``): the stepped hash and JSON are those made at once — the same text, the
same hash, the same error — for values the first tests did not reach."""

from __future__ import annotations

import asyncio
import collections
import time
import types
from typing import Any

import pydantic
import pytest

import effectgate as eg
from effectgate._payload_steps import apayload_hash, aresult_json, is_small

from .conftest import snapshot
from .test_async_large import Ticks
from .test_async_large import _made_as_at_once as made_as_at_once

LONG = "y" * 40_000  # past INLINE_CHARS: a value holding it is large


def rows(count: int = 2_000) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"row {i}"} for i in range(count)]


def nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def released() -> memoryview:
    view = memoryview(b"abc")
    view.release()
    return view


@pytest.mark.parametrize("value", [
    {"deep": nested(650, LONG)},  # at once: recursion runs out; by steps it did not
    {"deep": nested(600, LONG)},  # a result past MAX_RESULT_DEPTH: the at-once message
    {"rows": rows(), "deep": nested(120, LONG)},
    {"rows": rows(), "deep": nested(120, "short")},  # deep inside a part made at once
], ids=["payload-650", "result-600", "120-long", "120-small-part"])
def test_a_deep_large_value_gets_the_at_once_answer(value: Any) -> None:
    """Nesting: where the at-once functions run out of recursion (or refuse a result nested
    past MAX_RESULT_DEPTH) is theirs; the steps, whose generators nest differently, once
    hashed a 650-deep payload the sync path refuses and refused a 600-deep result with
    "maximum recursion depth exceeded" instead of the depth rule's message."""
    made_as_at_once(value)


@pytest.mark.parametrize("value", [
    {"view": released()},
    {"rows": rows(), "view": released()},
], ids=["small", "large"])
def test_a_released_memoryview_is_the_payload_error_made_at_once(value: Any) -> None:
    """``len()`` of a released memoryview raises: the size check let that ValueError out of
    the async functions, where the at-once ones raise a PayloadError."""
    made_as_at_once(value)


@pytest.mark.parametrize("size", ["small", "large"])
def test_an_async_result_holding_a_released_memoryview_is_committed_unstored(
        gate: eg.Gate, size: str) -> None:
    """As the sync path does: COMMITTED with no result and a ResultNotStoredWarning — not a
    ValueError out of the call with the effect left IN_FLIGHT after its body ran."""
    ran = []

    @gate.effect("mv:{k}", effect_type="review.mv")
    async def tool(k: str) -> Any:
        ran.append(k)
        return {"rows": rows() if size == "large" else [], "view": released()}

    with pytest.warns(eg.ResultNotStoredWarning):
        asyncio.run(tool("m1"))
    record = gate.get("mv:m1")
    assert ran == ["m1"]
    assert record.state is eg.State.COMMITTED
    assert record.result is None


def test_async_arguments_holding_a_released_memoryview_are_refused_unwritten(
        gate: eg.Gate) -> None:
    """The PayloadError a sync call gets, the body never run, nothing written."""
    ran = []

    @gate.effect("mva:{k}", effect_type="review.mva")
    async def tool(k: str, data: Any) -> str:
        ran.append(k)
        return "done"

    before = snapshot(gate)
    with pytest.raises(eg.PayloadError):
        asyncio.run(tool("a1", {"rows": rows(), "view": released()}))
    assert ran == []
    assert snapshot(gate) == before


class Probe:
    """A value whose JSON form (``model_dump``, as a pydantic model's) notes how many turns
    the ticker had taken when it was made."""

    def __init__(self, ticks: Ticks) -> None:
        self.ticks = ticks
        self.seen: list[int] | None = None  # set by watched()

    def model_dump(self) -> dict[str, Any]:
        assert self.seen is not None
        self.seen.append(self.ticks.count)
        return {"probe": True}


class Rows(list[Any]):
    """A list subclass (a framework's own sequence type)."""


def watched(wrap: Any) -> tuple[list[int], list[int]]:
    """The ticker's turns each probe saw while the hash and then the result JSON of
    ``wrap(first, rows, last)`` were made by steps."""
    seen: list[list[int]] = [[], []]

    async def work(at: int, make: Any) -> None:
        ticks = Ticks()
        task = asyncio.ensure_future(ticks.run())
        await asyncio.sleep(0)
        first, last = Probe(ticks), Probe(ticks)
        first.seen = last.seen = seen[at]
        try:
            await make(wrap(first, rows(20_000), last))
        finally:
            ticks.running = False
            await task

    asyncio.run(work(0, lambda value: apayload_hash({"value": value})))
    asyncio.run(work(1, aresult_json))
    return seen[0], seen[1]


@pytest.mark.parametrize("wrap", [
    lambda first, many, last: collections.OrderedDict(first=first, rows=many, last=last),
    lambda first, many, last: types.MappingProxyType({"first": first, "rows": many,
                                                      "last": last}),
    lambda first, many, last: Rows([first, *many, last]),
], ids=["OrderedDict", "MappingProxyType", "list-subclass"])
def test_a_large_mapping_or_sequence_of_another_type_is_made_by_steps(wrap: Any) -> None:
    """A large OrderedDict, mapping proxy or list subclass was made at once on the loop (60 to
    100 ms at a megabyte): now by steps, the ticker running between its first and last
    value, to the same hash and text."""
    for first, last in watched(wrap):
        assert last > first
    value = wrap({"probe": 1}, rows(), {"probe": 2})
    assert not is_small(value)
    made_as_at_once({"value": value})
    made_as_at_once(value)


class Loose(pydantic.BaseModel):
    """A model that keeps extra fields (``extra="allow"``): they are in its ``model_dump``,
    not among its attributes."""

    model_config = pydantic.ConfigDict(extra="allow", arbitrary_types_allowed=True)


class Computed(pydantic.BaseModel):
    """A model whose dump holds a computed field made from a small one."""

    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    ends: Any = pydantic.Field(exclude=True)

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def rows(self) -> list[Any]:
        return [self.ends[0], *rows(20_000), self.ends[1]]


@pytest.mark.parametrize("wrap", [
    lambda first, many, last: Loose(first=first, rows=many, last=last),
    lambda first, many, last: Computed(ends=(first, last)),
], ids=["extra-fields", "computed-field"])
def test_a_model_whose_dump_is_larger_than_its_fields_is_made_by_steps(wrap: Any) -> None:
    """The size check counted a model by its attributes: a model holding a megabyte in extra
    or computed fields passed for small and was made at once on the loop (hundreds of ms).
    Now by steps, to the same hash and text. (A computed field is not an argument: a payload
    holds only the model's fields, here two probes, made at once; its result is its dump.)"""
    hashed, stored = watched(wrap)
    assert stored[1] > stored[0]
    if "ends" not in wrap({}, [], {}).__pydantic_fields__:
        assert hashed[1] > hashed[0]
    value = wrap({"probe": 1}, rows(), {"probe": 2})
    assert not is_small(value)
    made_as_at_once({"value": value})
    made_as_at_once(value)


@pytest.mark.parametrize("rule", [{}, {"redact_result": ["name"]}, {"store_result": False}],
                         ids=["no-rule", "redact_result", "store_result-false"])
@pytest.mark.parametrize("outcome", ["committed", "failed", "ambiguous"])
def test_areport_of_a_large_result_stores_what_report_stores(
        make_gate: Any, rule: dict[str, Any], outcome: str) -> None:
    """Under each result rule of the policy and for each outcome, ``areport`` of a large
    result (made by steps) leaves the record ``report`` leaves."""
    gate = make_gate(policy=eg.Policy.from_dict({"effects": {"big.*": rule}}))
    result = {"rows": rows(20_000)}
    held = gate.begin(effect_type="big.r", key="sync:1", payload={})
    gate.report(held, outcome, result=result)

    async def report_async() -> None:
        d = await gate.abegin(effect_type="big.r", key="async:1", payload={})
        await gate.areport(d, outcome, result=result)

    asyncio.run(report_async())
    by_sync, by_async = gate.get("sync:1"), gate.get("async:1")
    assert by_async.state is by_sync.state
    assert by_async.result == by_sync.result
    assert by_async.error == by_sync.error


class Canceller:
    """A value whose JSON form, made while the result is stored by steps, cancels a task."""

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None

    def model_dump(self) -> dict[str, Any]:
        assert self.task is not None
        self.task.cancel()
        return {"cancelled": True}


@pytest.mark.parametrize("loop_ends", [False, True], ids=["loop-runs-on", "loop-ends"])
def test_a_call_cancelled_while_its_large_result_is_made_is_still_committed(
        gate: eg.Gate, loop_ends: bool) -> None:
    """The caller cancelled between two steps of its result's JSON (the body has run): the
    report goes on in its own task — or, when the loop ends first, on a thread the sync way —
    and the effect is COMMITTED with the whole result, never left IN_FLIGHT."""
    canceller = Canceller()
    many = rows(20_000)

    @gate.effect("cancel:{k}", effect_type="big.cancel")
    async def tool(k: str) -> Any:
        return {"rows": many, "cancel": canceller, "last": True}

    async def main() -> None:
        canceller.task = asyncio.ensure_future(tool("c1"))
        with pytest.raises(asyncio.CancelledError):
            await canceller.task
        while not loop_ends and gate.get("cancel:c1").state is eg.State.IN_FLIGHT:
            await asyncio.sleep(0.01)

    asyncio.run(main())
    for _ in range(1_000):  # the fallback thread's sync report, when the loop ended first
        if gate.get("cancel:c1").state is not eg.State.IN_FLIGHT:
            break
        time.sleep(0.01)
    record = gate.get("cancel:c1")
    assert record.state is eg.State.COMMITTED
    assert record.result == {"rows": many, "cancel": {"cancelled": True}, "last": True}
