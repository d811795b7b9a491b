"""An ``async def`` tool's large arguments and result are made JSON without holding the event
loop (DESIGN.md, "Performance targets": the loop is never blocked more than 2 ms by the gate):
by steps, other tasks running between them, with the hash, the stored text and the errors the
at-once functions give. Proved by the mechanism (a task ran while the JSON was being made),
never by timings."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import decimal
import enum
import json
import types
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import effectgate as eg
from effectgate import _payload_steps
from effectgate._payload_steps import (
    INLINE_CHARS,
    INLINE_NODES,
    apayload_hash,
    aresult_json,
    is_small,
)
from effectgate.payload import MAX_RESULT_DEPTH, _depth, payload_hash, result_json

from .conftest import snapshot

ROWS = 20_000  # about a megabyte of JSON: tens of milliseconds to make at once


class Ticks:
    """A task that counts its turns on the loop while gated work runs."""

    def __init__(self) -> None:
        self.count = 0
        self.running = True

    async def run(self) -> None:
        while self.running:
            self.count += 1
            await asyncio.sleep(0)


class Probe:
    """A value whose JSON form (``model_dump``, as a pydantic model's) notes how many turns
    the ticker had taken when it was made."""

    def __init__(self, ticks: Ticks, seen: list[int]) -> None:
        self.ticks, self.seen = ticks, seen

    def model_dump(self) -> dict[str, Any]:
        self.seen.append(self.ticks.count)
        return {"probe": True}


def rows(count: int = ROWS) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"row {i}", "tags": ["a", "b"], "ok": True}
            for i in range(count)]


async def ticking(work: Callable[[Ticks, list[int]], Awaitable[Any]]) -> list[int]:
    """Run ``work`` beside a ticker; the ticks its probes saw."""
    ticks, seen = Ticks(), []
    task = asyncio.ensure_future(ticks.run())
    await asyncio.sleep(0)
    try:
        await work(ticks, seen)
    finally:
        ticks.running = False
        await task
    return seen


def test_a_large_result_is_stored_while_other_tasks_run(gate: eg.Gate) -> None:
    """The result's JSON is made by steps: the ticker ran between the first and the last
    value of it; the stored text is what result_json makes of it."""
    stored = rows()

    async def work(ticks: Ticks, seen: list[int]) -> None:
        @gate.effect("big:{k}", effect_type="big.result")
        async def tool(k: str) -> Any:
            return {"first": Probe(ticks, seen), "rows": stored, "last": Probe(ticks, seen)}

        await tool("r1")

    first, last = asyncio.run(ticking(work))
    assert last > first
    record = gate.get("big:r1")
    assert record.state is eg.State.COMMITTED
    assert record.result == {"first": {"probe": True}, "rows": stored, "last": {"probe": True}}


def test_large_arguments_are_hashed_while_other_tasks_run(gate: eg.Gate) -> None:
    """The arguments' hash is made by steps (the ticker ran between the first and the last
    argument's canonical form), and it is the hash a sync begin makes: the sync call of the
    same arguments is a duplicate."""
    data = rows()

    async def work(ticks: Ticks, seen: list[int]) -> None:
        @gate.effect("args:{k}", effect_type="big.args")
        async def tool(k: str, first: Any, data: Any, last: Any) -> str:
            return "done"

        await tool("a1", Probe(ticks, seen), data, Probe(ticks, seen))

    first, last, *_ = asyncio.run(ticking(work))
    assert last > first
    args = {"k": "a1", "first": {"probe": True}, "data": data, "last": {"probe": True}}
    again = gate.begin(effect_type="big.args", key="args:a1", payload=args)
    assert again.decision is eg.Decision.DUPLICATE
    assert again.result == "done"


def test_bad_large_arguments_raise_the_same_error_and_write_nothing(gate: eg.Gate) -> None:
    """A large payload with a value that has no JSON form deep inside: the PayloadError the
    sync hash raises, nothing written, the body never run."""
    ran = []

    @gate.effect("bad:{k}", effect_type="big.bad")
    async def tool(k: str, data: Any) -> str:
        ran.append(k)
        return "done"

    bad = rows()
    bad[-1]["when"] = datetime.datetime(2026, 1, 1)  # naive: refused
    before = snapshot(gate)
    with pytest.raises(eg.PayloadError) as caught:
        asyncio.run(tool("b1", bad))
    with pytest.raises(eg.PayloadError) as expected:
        payload_hash({"k": "b1", "data": bad})
    assert caught.value.message == expected.value.message
    assert f"payload.data[{ROWS - 1}].when" in caught.value.message
    assert ran == []
    assert snapshot(gate) == before


def test_a_large_result_without_json_form_is_refused_as_at_once(gate: eg.Gate) -> None:
    """A large result with a NaN deep inside: not stored (a warning, as for any result
    without a JSON form), the effect COMMITTED with no result."""
    bad = rows()
    bad[-1]["score"] = float("nan")

    @gate.effect("nan:{k}", effect_type="big.nan")
    async def tool(k: str) -> Any:
        return bad

    with pytest.warns(eg.ResultNotStoredWarning):
        asyncio.run(tool("n1"))
    record = gate.get("nan:n1")
    assert record.state is eg.State.COMMITTED
    assert record.result is None


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    label: str


def _large_values() -> list[Any]:
    long_text = "é\u2028\"\\ x" * (INLINE_CHARS // 3)
    many = rows(INLINE_NODES)
    return [
        {"text": long_text, "n": 5},
        {"rows": many, "nested": {"z": [long_text], "a": (1, 2.5, 500.0, None, True)}},
        {"mixed": [Color.RED, decimal.Decimal("1.10"), uuid.UUID(int=7), b"\x00\xff" * 40_000,
                   datetime.date(2026, 1, 2), Point(1, "p"), frozenset({3, 1})] * 200},
        {"points": [Point(i, "p" * 20) for i in range(INLINE_NODES)]},
        {"b": many, "a": many},  # the same list twice: not a cycle
    ]


@pytest.mark.parametrize("value", _large_values())
def test_by_steps_the_hash_and_text_are_those_made_at_once(value: Any) -> None:
    assert not is_small(value)
    assert asyncio.run(apayload_hash(value)) == payload_hash(value)
    assert asyncio.run(aresult_json(value)) == result_json(value)


def _cyclic() -> Any:
    value: dict[str, Any] = {"rows": rows(INLINE_NODES)}
    value["rows"].append(value)
    return value


def _too_deep() -> Any:
    value: Any = "y" * (2 * INLINE_CHARS)
    for _ in range(MAX_RESULT_DEPTH + 1):
        value = [value]
    return {"deep": value}


@pytest.mark.parametrize("value", [
    {"rows": [*rows(INLINE_NODES), {1: "not a str key"}]},
    {"rows": [*rows(INLINE_NODES), float("inf")]},
    {"rows": [*rows(INLINE_NODES), 10 ** 5000]},
    {"text": "x" * (2 * INLINE_CHARS) + "\ud800"},
    {"rows": [*rows(INLINE_NODES), object()]},
    _cyclic(),
    _too_deep(),
], ids=["key", "inf", "digits", "surrogate", "object", "cycle", "deep"])
def test_by_steps_bad_values_raise_the_errors_made_at_once(value: Any) -> None:
    _made_as_at_once(value)


def _made_as_at_once(value: Any) -> None:
    """``value``'s hash and result JSON by steps are those made at once, or the same error."""
    for at_once, by_steps in ((payload_hash, apayload_hash), (result_json, aresult_json)):
        try:
            expected = at_once(value)
        except eg.PayloadError as err:
            with pytest.raises(eg.PayloadError) as caught:
                asyncio.run(by_steps(value))
            assert caught.value.message == err.message
        else:
            assert asyncio.run(by_steps(value)) == expected


def test_is_small_stops_at_its_bounds() -> None:
    assert is_small({"txn_id": "t1", "amount_cents": 500})
    assert is_small(rows(INLINE_NODES // 20))
    assert not is_small(rows(INLINE_NODES))
    assert not is_small({"text": "x" * (INLINE_CHARS + 1)})
    assert not is_small({"custom": object()})
    assert not is_small(_cyclic())


def _reference_depth(text: str) -> int:
    """The nesting depth of JSON text, a character at a time (the definition)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


@pytest.mark.parametrize("value", [
    [], {}, "[{", ["[", {"a\\": "]"}, [[["\\\"[", []]]]], {"k\"[": [{"x": "\\\\"}]},
    [[[[[]]]], {"é": ["\u2028[", {"": [1, 2]}]}],
])
def test_depth_is_the_nesting_outside_strings(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert _depth(text) == _reference_depth(text)


def test_the_async_request_of_large_arguments_is_the_sync_request(gate: eg.Gate) -> None:
    """With a cost, a group and an undo worked out from the arguments: the same Request."""

    async def tool(order: str, lines: list[Any]) -> None:
        return None

    decorated = gate.effect("order:{order}", group_key="saga:{order}",
                            cost_micros=lambda lines: 100 * len(lines),
                            compensation=lambda order, lines: {"undo": order})(tool)
    spec = decorated.effect_spec
    arguments = {"order": "o1", "lines": rows()}
    assert not is_small(arguments)
    assert asyncio.run(spec.arequest(arguments)) == spec.request(arguments)


def test_a_cost_function_that_raises_is_the_error_before_the_hash(gate: eg.Gate) -> None:
    """Errors come in the sync order: the cost function's, before the large payload's."""

    def cost(data: Any) -> int:
        raise RuntimeError("no price")

    async def tool(k: str, data: Any) -> None:
        return None

    spec = gate.effect("c:{k}", cost_micros=cost)(tool).effect_spec
    arguments = {"k": "c1", "data": [*rows(), float("nan")]}
    with pytest.raises(eg.ConfigError):
        spec.request(arguments)
    with pytest.raises(eg.ConfigError):
        asyncio.run(spec.arequest(arguments))


class Text(str):
    """A str subclass (its own text is what counts)."""


class Number(int):
    """An int subclass."""


class Real(float):
    """A float subclass."""


class Table(dict[str, Any]):
    """A dict subclass."""


class Rows(list[Any]):
    """A list subclass."""


class Level(enum.IntEnum):
    HIGH = 3


class Mode(enum.StrEnum):
    FAST = "fast"


Pair = collections.namedtuple("Pair", "left right")


class Aliased(pydantic.BaseModel):
    """A model with an alias, a nested value of any type and extra fields."""

    model_config = pydantic.ConfigDict(populate_by_name=True, extra="allow",
                                       arbitrary_types_allowed=True)
    amount: Any = pydantic.Field(alias="Amount")
    inner: Any = None


@dataclasses.dataclass(slots=True, frozen=True)
class Slotted:
    x: Any
    hidden: Any = dataclasses.field(default=None, repr=False)


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=3),
    st.sampled_from([-0.0, 1e16, 2.0**53, 2.0**53 + 2, 9007199254740993, 5e-324]),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.builds(Text, st.text(max_size=6)), st.builds(Number, st.integers(-9, 9)),
    st.builds(Real, st.floats(allow_nan=False)),
    st.sampled_from([Color.RED, decimal.Decimal("1.10"), uuid.UUID(int=7), b"\x00\xff",
                     datetime.date(2026, 1, 2), Point(1, "p"), frozenset({3, 1}),
                     datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
                     datetime.datetime(2026, 1, 2), decimal.Decimal("-0"),
                     decimal.Decimal("1E+5000"), Level.HIGH, Mode.FAST, bytearray(b"ab"),
                     memoryview(b"cd"), datetime.time(1, 2), object()]))
_KEYS = st.one_of(st.text(max_size=6), st.integers(0, 3), st.builds(Text, st.text(max_size=3)),
                  st.sampled_from(["é", "z", "\U0001f600", 'a"\\', "\ud800", None, 1.5]))


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    plain = st.dictionaries(st.text(max_size=3), inner, max_size=3)
    return st.one_of(
        st.lists(inner, max_size=5), st.tuples(inner, inner),
        st.dictionaries(_KEYS, inner, max_size=5),
        st.builds(Table, plain), st.builds(Rows, st.lists(inner, max_size=3)),
        st.builds(collections.OrderedDict, plain), st.builds(types.MappingProxyType, plain),
        st.builds(Pair, inner, inner),
        st.frozensets(st.one_of(st.integers(-3, 3), st.text(max_size=2)), max_size=4),
        st.builds(lambda a, b, c: Aliased(Amount=a, inner=b, extra=c), inner, inner, inner),
        st.builds(pydantic.RootModel[Any], inner), st.builds(Slotted, inner, inner))


_VALUES = st.recursive(_SCALARS, _containers, max_leaves=25)


@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(st.dictionaries(st.text(max_size=6), _VALUES, max_size=5), _VALUES))
@pytest.mark.parametrize("deepest", [64, 2])
def test_by_steps_any_value_is_made_as_at_once(value: Any, deepest: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With the bounds shrunk so that nearly every value is "large", the steps take apart
    what hypothesis builds (nested mappings and sequences and their subclasses, non-str keys,
    NaN, big ints, enums, models, dataclasses; with ``deepest`` 2, most of them past the
    depth the steps go to, made at once instead) and must give the hash, the text and the
    error made at once, to the character."""
    monkeypatch.setattr(_payload_steps, "INLINE_NODES", 2)
    monkeypatch.setattr(_payload_steps, "INLINE_CHARS", 4)
    monkeypatch.setattr(_payload_steps, "_DEEPEST", deepest)
    _made_as_at_once(value)
