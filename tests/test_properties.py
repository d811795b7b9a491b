"""Property tests (hypothesis) for key templates and canonical payloads.

Pure functions, no store. Derandomised (the same examples on every run, no example database)
so that the suite is deterministic; the search still covers hundreds of cases per property.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import hashlib
import json
import string
import unicodedata
import uuid
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import effectgate as eg
from effectgate.keys import MAX_KEY_LENGTH
from effectgate.payload import canonical_json, payload_hash
from effectgate.redact import BLANK

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None)
NESTED = settings(PROPERTY, max_examples=120)  # nested payloads are costly to generate

# -- strategies ------------------------------------------------------------------------------

json_scalars = (
    st.none() | st.booleans() | st.integers(-(10**40), 10**40)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20,
)
payloads = st.dictionaries(st.text(max_size=8), json_values, max_size=6)
# Anything at all, including what has no canonical form.
junk_scalars = (
    json_scalars | st.floats() | st.decimals() | st.binary(max_size=8)
    | st.datetimes() | st.datetimes(timezones=st.timezones()) | st.dates() | st.uuids()
    | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1,
              max_size=3)
    | st.integers(10**4299, 10**4301) | st.builds(object) | st.sets(st.integers(), max_size=3)
)
junk = st.recursive(
    junk_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=3),
    max_leaves=8,
)
# Text that may appear in a key: no braces, no control or invisible format characters, no
# line or paragraph separators, no space but U+0020 (see effectgate.keys).
key_text = st.text(  # printable text: what a key may hold (BLANK draws nothing: refused)
    st.characters(blacklist_categories=("Cc", "Cs", "Cf", "Zl", "Zp", "Zs"),
                  blacklist_characters="{}" + "".join(sorted(BLANK))) | st.just(" "),
    min_size=1, max_size=30,
).filter(lambda s: s.strip() != "")
field_values = key_text | st.integers() | st.uuids() | st.dates()
names = st.from_regex(r"[a-z_][a-z0-9_]{0,7}", fullmatch=True)


def tagged(value: Any) -> Any:
    """``value`` with every scalar tagged by its JSON kind, so that ``True != 1`` and a list
    is not a tuple: equality of tagged values is equality of JSON documents."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, (list, tuple)):
        return ("array", tuple(tagged(v) for v in value))
    return ("object", tuple(sorted((k, tagged(v)) for k, v in value.items())))


def expected(value: Any) -> Any:
    """What the canonical form stands for: integral floats below 2**53 become ints."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, (list, tuple)):
        return [expected(v) for v in value]
    if isinstance(value, dict):
        return {k: expected(v) for k, v in value.items()}
    return value


def shuffled(value: Any, rng: Any) -> Any:
    """The same value with every mapping's keys inserted in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


# -- canonical payloads ----------------------------------------------------------------------


@NESTED
@given(payloads)
def test_canonical_json_round_trips_to_the_same_document(payload: dict[str, Any]) -> None:
    text = canonical_json(payload)
    assert tagged(json.loads(text)) == tagged(expected(payload))
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"),
                              ensure_ascii=False)


@NESTED
@given(payloads, st.randoms(use_true_random=False))
def test_key_order_never_changes_the_payload_hash(payload: dict[str, Any], rng: Any) -> None:
    other = shuffled(payload, rng)
    assert payload_hash(other) == payload_hash(payload)
    assert canonical_json(other) == canonical_json(payload)
    assert payload_hash(collections.OrderedDict(reversed(list(payload.items())))) == (
        payload_hash(payload)
    )


@NESTED
@given(payloads, payloads)
def test_distinct_payloads_have_distinct_canonical_forms(a: dict[str, Any],
                                                         b: dict[str, Any]) -> None:
    same_document = tagged(expected(a)) == tagged(expected(b))
    assert (canonical_json(a) == canonical_json(b)) is same_document
    assert (payload_hash(a) == payload_hash(b)) is same_document


@NESTED
@given(payloads)
def test_payload_hash_is_sha256_of_canonical_json(payload: dict[str, Any]) -> None:
    """The fast path for flat payloads and the general path agree."""
    digest = hashlib.sha256(canonical_json(payload).encode()).hexdigest()
    assert payload_hash(payload) == digest
    assert payload_hash(collections.OrderedDict(payload)) == digest


@PROPERTY
@given(st.integers(-(2**53) + 1, 2**53 - 1))
@example(500)
def test_integral_float_is_the_same_payload_as_the_int(n: int) -> None:
    """500.0 == 500 == Decimal("500") == Decimal("5E+2"), at any depth."""
    as_int = payload_hash({"amount": n, "lines": [{"cents": n}]})
    assert payload_hash({"amount": float(n), "lines": [{"cents": float(n)}]}) == as_int
    assert payload_hash({"amount": decimal.Decimal(n),
                         "lines": [{"cents": decimal.Decimal(n).normalize(
                             decimal.Context(prec=60))}]}) == as_int


@PROPERTY
@given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()))
def test_non_integral_float_keeps_its_exact_value(value: float) -> None:
    assert json.loads(canonical_json({"x": value}))["x"] == value


decimals = st.decimals(allow_nan=False, allow_infinity=False, min_value=-(10**40),
                       max_value=10**40)


@PROPERTY
@given(decimals, decimals)
@example(decimal.Decimal("0.1") + decimal.Decimal("0.2"), decimal.Decimal("0.3"))
@example(decimal.Decimal("1.10"), decimal.Decimal("1.1"))
@example(decimal.Decimal("0.1000000000000000000000000000001"), decimal.Decimal("0.1"))
@example(decimal.Decimal("12345678901234567890123456789.5"),
         decimal.Decimal("12345678901234567890123456790"))
@example(decimal.Decimal("-0"), decimal.Decimal("0E+7"))
def test_decimals_are_one_payload_exactly_when_numerically_equal(
    a: decimal.Decimal, b: decimal.Decimal
) -> None:
    """Decimal exactness: no float rounding and no 28-digit context rounding.

    Regression: Decimals of more than 28 significant digits were rounded, so different amounts
    shared a payload hash."""
    assert (payload_hash({"amount": a}) == payload_hash({"amount": b})) is (a == b)
    for value in (a, b):
        written = json.loads(canonical_json({"amount": value}))["amount"]
        assert decimal.Decimal(written) == value  # the canonical text is the exact value


@PROPERTY
@given(junk)
def test_canonical_form_exists_or_payload_error(value: Any) -> None:
    """Anything at all: a canonical form, or PayloadError; never another exception."""
    try:
        text = canonical_json({"v": value})
    except eg.PayloadError:
        return
    json.loads(text)
    text.encode("utf-8")


# -- key templates -------------------------------------------------------------------------


def escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


@PROPERTY
@given(st.lists(st.tuples(key_text, names, field_values), min_size=1, max_size=4), key_text)
def test_rendering_is_the_literal_text_with_each_field_written_in(
    parts: list[tuple[str, str, Any]], tail: str
) -> None:
    template = "".join(f"{escape(literal)}{{{name}}}" for literal, name, _ in parts)
    template += escape(tail)
    arguments = {name: value for _, name, value in parts}
    expected_key = "".join(f"{literal}{arguments[name]}" for literal, name, _ in parts) + tail
    expected_key = unicodedata.normalize("NFC", expected_key)
    tpl = eg.KeyTemplate(template)
    if len(expected_key) > MAX_KEY_LENGTH:
        with pytest.raises(eg.EffectKeyError):
            tpl.render(arguments)
        return
    key = tpl.render(arguments)
    assert key == expected_key
    # Argument order and unrelated arguments change nothing.
    assert tpl.render({"zz_unrelated": object(), **dict(reversed(arguments.items()))}) == key


@PROPERTY
@given(key_text)
def test_escaped_literal_template_renders_back_to_itself(text: str) -> None:
    """Round trip: a literal key, braces escaped, renders to exactly that key."""
    assert eg.KeyTemplate(escape(text + "{x}")).render({}) == (
        unicodedata.normalize("NFC", text + "{x}")
    )


@PROPERTY
@given(key_text)
def test_rendered_value_round_trips_and_ignores_unicode_form(value: str) -> None:
    tpl = eg.KeyTemplate("refund:{txn_id}")
    key = tpl.render({"txn_id": value})
    assert key.removeprefix("refund:") == unicodedata.normalize("NFC", value)
    assert tpl.render({"txn_id": unicodedata.normalize("NFD", value)}) == key


@PROPERTY
@given(junk | field_values | st.text(max_size=600) | st.text(string.whitespace))
def test_rendering_gives_a_valid_key_or_effect_key_error(value: Any) -> None:
    """Any argument value: a key that check_key accepts unchanged, or EffectKeyError."""
    tpl = eg.KeyTemplate("refund:{txn_id}:{n}")
    try:
        key = tpl.render({"txn_id": value, "n": 1})
    except eg.EffectKeyError:
        return
    assert eg.keys.check_key(key) == key
    key.encode("utf-8")


@PROPERTY
@given(junk | field_values | st.text(max_size=600) | st.text(string.whitespace), key_text,
       key_text)
@example("a\x00b", "refund:", "")  # a control character: refused both ways
@example("\u00e9", "caf", "")  # not ASCII: normalised both ways
@example("x" * 506, "refund:", "")  # one past the longest key
@example(10**99, "", "")  # the largest int the short way takes
def test_a_one_field_template_renders_as_the_general_way_does(value: Any, prefix: str,
                                                              suffix: str) -> None:
    """The common template, text around one plain ``{name}``, takes a short way: for any
    value and any literal text around it, the same key (or the same EffectKeyError) as the
    general way, which every other template takes."""
    tpl = eg.KeyTemplate(f"{escape(prefix)}{{txn_id}}{escape(suffix)}")
    general = eg.KeyTemplate(f"{escape(prefix)}{{txn_id}}{escape(suffix)}")
    assert tpl._one is not None
    general._one = None
    results = []
    for each in (tpl, general):
        try:
            results.append(each.render({"txn_id": value, "other": 1}))
        except eg.EffectKeyError as err:
            results.append(("refused", err.message))
    assert results[0] == results[1]


def test_key_field_types_follow_the_documented_rules() -> None:
    tpl = eg.KeyTemplate("k:{v}")
    ok = {"a": "k:a", 7: "k:7", datetime.date(2026, 1, 2): "k:2026-01-02",
          uuid.UUID(int=1): "k:00000000-0000-0000-0000-000000000001"}
    for value, key in ok.items():
        assert tpl.render({"v": value}) == key
    for bad in (None, "", " ", 1.0, True, b"x", [1], {"a": 1}, datetime.datetime(2026, 1, 1)):
        with pytest.raises(eg.EffectKeyError):
            tpl.render({"v": bad})


class _Masked(str):
    """A card number that prints masked: its text is still the number."""

    def __str__(self) -> str:
        return "****"

    def __format__(self, spec: str) -> str:
        return "****"


class _Rounded(int):
    """An amount whose conversions say something else."""

    def __int__(self) -> int:
        return 0

    def __str__(self) -> str:
        return "0"

    def __format__(self, spec: str) -> str:
        return "0"


@pytest.mark.parametrize(("value", "plain"), [
    (_Masked("4111111111111111"), "4111111111111111"), (_Rounded(500), 500)])
def test_a_str_or_int_subclass_is_keyed_and_hashed_by_its_own_value(
        value: Any, plain: Any) -> None:
    """(Keyed and hashed by what its __str__, __int__ or __format__ said, two cards that print
    alike were one effect: the second was answered from the store and never charged.)"""
    assert payload_hash({"card": value}) == payload_hash({"card": plain})
    assert canonical_json({"card": value}) == canonical_json({"card": plain})
    assert eg.KeyTemplate("charge:{card}").render({"card": value}) == f"charge:{plain}"
    other = type(value)("4000000000000002") if isinstance(value, str) else type(value)(501)
    assert payload_hash({"card": value}) != payload_hash({"card": other})


_FLAT_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.text())


@settings(max_examples=400)
@given(st.dictionaries(st.text(), _FLAT_VALUES, max_size=8))
def test_the_flat_fast_paths_write_exactly_what_the_general_encoders_write(
        flat: dict[str, Any]) -> None:
    """A flat tool call is hashed, and a flat result stored, by the C encoder directly: the
    text (so every stored payload hash) is the general canonical form's, byte for byte."""
    from effectgate import payload

    try:
        canonical = canonical_json(flat)
    except eg.PayloadError:  # a lone surrogate: refused on both paths
        with pytest.raises(eg.PayloadError):
            payload_hash(flat)
        return
    assert payload_hash(flat) == hashlib.sha256(canonical.encode()).hexdigest()
    assert payload._dumps_flat(flat) == canonical
    assert payload.result_json(flat) == payload._encode_result(flat)


# -- the decorator's argument binder ---------------------------------------------------------


def _tool(a: int, b: int, c: int = 3, *, d: int = 4, e: int) -> None: ...


class _Tools:
    def method(self, a: int, b: int = 2, *, c: int = 3) -> None: ...


_BINDER_CASES = [(_tool, 0), (_Tools.method, 1)]


@PROPERTY
@given(case=st.sampled_from(_BINDER_CASES), count=st.integers(0, 5),
       names=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "self", "zz"]), unique=True))
def test_the_fast_binder_binds_as_the_signature_does(case: Any, count: int,
                                                     names: list[str]) -> None:
    """Any call, right or wrong, binds to what ``inspect.Signature.bind`` (defaults applied)
    gives, or is refused as it refuses it: the fast path never guesses."""
    import inspect

    from effectgate.decorator import _binder

    fn, skip = case
    signature = inspect.signature(fn)
    args = tuple(range(100, 100 + count))
    kwargs = {name: i for i, name in enumerate(names)}
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        with pytest.raises(eg.ConfigError):
            _binder(fn, signature, skip)(args, kwargs)
        return
    bound.apply_defaults()
    expected = dict(bound.arguments)
    if skip:
        del expected[next(iter(signature.parameters))]
    assert _binder(fn, signature, skip)(args, kwargs) == expected
