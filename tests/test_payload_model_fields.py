"""A pydantic argument is canonicalised (and its payload hashed) from its data, not from its
``model_dump()`` (red team, round 9, H3).

``model_dump()`` leaves out ``Field(exclude=True)`` fields and applies ``@field_serializer`` /
``@model_serializer``: a payload hash made from it ignored what the function really receives,
so an approval given for ``from_account="petty-cash"`` let the call run with ``"treasury"``,
and ``amount=1`` and ``amount=10**6`` shared one hash. The hash is now of every field (by
name) and the extra ones; an ordinary model's canonical form is what it was (stored hashes do
not move). A result is still stored as ``model_dump()`` makes it: its exclusions are a
redaction the user asked for.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import uuid
from typing import Any

import pytest
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    RootModel,
    computed_field,
    field_serializer,
    model_serializer,
)

import effectgate as eg
from effectgate.payload import canonical_json, payload_hash, result_json, to_canonical

from .conftest import snapshot

ALWAYS = {"effects": {"payment.*": {"approval": "always"}}}


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str
    zip_code: str = Field(alias="zip")


@dataclasses.dataclass
class Line:
    sku: str
    qty: int


class Order(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    order_id: uuid.UUID
    amount: decimal.Decimal
    at: datetime.datetime
    colour: Colour
    ship_to: Address
    lines: list[Line]
    tags: set[str]
    note: str | None = None
    blob: bytes = b""
    meta: dict[str, Any] = Field(default_factory=dict)


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")

    a: int


class Ids(RootModel[list[int]]):
    pass


class Wrapped(BaseModel):
    ids: Ids
    orders: list[Order]


def _order(**changes: Any) -> Order:
    fields: dict[str, Any] = {
        "order_id": uuid.UUID(int=7), "amount": decimal.Decimal("12.50"),
        "at": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "colour": Colour.BLUE, "ship_to": Address(street="1 Main St", zip="12345"),
        "lines": [Line("a", 1), Line("b", 2)], "tags": {"y", "x"},
        "meta": {"k": [1, 2.0, None]},
    }
    return Order(**{**fields, **changes})


ORDINARY = [
    Address(street="s", zip="z"),
    _order(),
    _order(note="n", blob=b"\x00\xff", colour=Colour.RED),
    Loose.model_validate({"a": 1, "dest": "A", "more": {"x": [1]}}),
    Ids([3, 1, 2]),
    Wrapped(ids=Ids([1]), orders=[_order(), _order(note="two")]),
]


@pytest.mark.parametrize("model", ORDINARY, ids=lambda m: type(m).__name__)
def test_an_ordinary_model_keeps_its_canonical_form_and_hash(model: BaseModel) -> None:
    """No exclusion, no serializer of its own: the canonical JSON (field names, not aliases;
    enums by value; nested models and dataclasses as objects; a RootModel as its root) is the
    one ``model_dump()`` made before, byte for byte, so no stored hash moves."""
    before = {"v": model.model_dump(), "n": [model.model_dump()]}
    now = {"v": model, "n": [model]}
    assert canonical_json(now) == canonical_json(before)
    assert payload_hash(now) == payload_hash(before)


def test_the_canonical_form_of_an_ordinary_model_is_pinned() -> None:
    assert canonical_json({"o": _order()}) == (
        '{"o":{"amount":"12.5","at":"2026-01-02T03:04:05Z","blob":{"$bytes":""},'
        '"colour":"blue","lines":[{"qty":1,"sku":"a"},{"qty":2,"sku":"b"}],'
        '"meta":{"k":[1,2,null]},"note":null,"order_id":"00000000-0000-0000-0000-000000000007",'
        '"ship_to":{"street":"1 Main St","zip_code":"12345"},"tags":["x","y"]}}')


class Transfer(BaseModel):
    ref: str
    amount_cents: int
    from_account: str = Field(exclude=True)


class Serialised(BaseModel):
    amount: int

    @field_serializer("amount")
    def _hide(self, value: int) -> str:
        return "hidden"


class WholeSerialised(BaseModel):
    amount: int
    to: str

    @model_serializer
    def _summary(self) -> dict[str, Any]:
        return {"summary": "a transfer"}


class Outer(BaseModel):
    inner: Transfer


@pytest.mark.parametrize(("one", "other"), [
    (Transfer(ref="r", amount_cents=1, from_account="petty-cash"),
     Transfer(ref="r", amount_cents=1, from_account="treasury")),
    (Serialised(amount=1), Serialised(amount=10**6)),
    (WholeSerialised(amount=1, to="a"), WholeSerialised(amount=1, to="b")),
    (Outer(inner=Transfer(ref="r", amount_cents=1, from_account="a")),
     Outer(inner=Transfer(ref="r", amount_cents=1, from_account="b"))),
    (Ids([1]), Ids([2])),
], ids=["exclude", "field_serializer", "model_serializer", "nested_exclude", "root"])
def test_what_model_dump_hides_is_in_the_hash(one: BaseModel, other: BaseModel) -> None:
    assert payload_hash({"v": one}) != payload_hash({"v": other})


def test_the_canonical_form_is_the_data_by_field_name() -> None:
    assert json.loads(canonical_json({"t": Transfer(ref="r", amount_cents=5,
                                                    from_account="x")})) == {
        "t": {"ref": "r", "amount_cents": 5, "from_account": "x"}}
    assert json.loads(canonical_json({"v": Serialised(amount=3)})) == {"v": {"amount": 3}}
    assert json.loads(canonical_json({"v": WholeSerialised(amount=3, to="b")})) == {
        "v": {"amount": 3, "to": "b"}}


class WithComputed(BaseModel):
    a: int
    _secret: str = PrivateAttr(default="s")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def doubled(self) -> int:
        return self.a * 2


class ByAlias(BaseModel):
    model_config = ConfigDict(serialize_by_alias=True)

    account_id: str = Field(alias="accountId")


def test_computed_fields_and_aliases_are_named_as_the_dump_names_them() -> None:
    """Review of the fix: a model with a computed field, or one that serialises by alias,
    hashed otherwise than its dump did: an effect begun before the upgrade was refused as a
    mismatch after it. Both are made as their dump makes them (the computed field is a
    function of the fields), and a private attribute changes nothing."""
    one, other = WithComputed(a=1), WithComputed(a=1)
    other._secret = "other"
    assert canonical_json({"v": one}) == '{"v":{"a":1,"doubled":2}}'
    assert payload_hash({"v": one}) == payload_hash({"v": other})
    for model in (one, ByAlias(accountId="acct_1")):
        assert payload_hash({"v": model}) == payload_hash({"v": model.model_dump()})


class Money:
    """A type of the application's own, with no canonical form."""

    def __init__(self, cents: int) -> None:
        self.cents = cents


class Charge(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    amount: Money
    lock: Any = Field(default=None, exclude=True)
    memo: str = Field(default="", exclude=True)

    @field_serializer("amount")
    def _cents(self, value: Money) -> int:
        return value.cents


def test_a_field_with_no_form_of_its_own_is_taken_as_the_dump_makes_it() -> None:
    """Review of the fix: a field of the application's own type made plain by a serializer,
    or an excluded one holding a lock, made a model that hashed before a PayloadError. Such a
    value is taken as the dump makes it, or left out as the dump leaves it out; a hidden
    field with a form of its own still counts."""
    import threading

    charge = Charge(amount=Money(500), lock=threading.Lock())
    assert canonical_json({"c": charge}) == '{"c":{"amount":500,"memo":""}}'
    assert payload_hash({"c": charge}) != payload_hash(
        {"c": Charge(amount=Money(500), memo="to the treasury")})
    assert payload_hash({"c": charge}) != payload_hash({"c": Charge(amount=Money(501))})


class NotPydantic:
    """An object with a model_dump() of its own and no model_fields: made from model_dump()."""

    def __init__(self, value: int) -> None:
        self.value = value

    def model_dump(self) -> dict[str, Any]:
        return {"value": self.value, "kind": "mine"}


def test_an_object_with_its_own_model_dump_keeps_using_it() -> None:
    assert canonical_json({"v": NotPydantic(3)}) == '{"v":{"kind":"mine","value":3}}'


# -- hostile models: a typed PayloadError, nothing else ---------------------------------------


class Node(BaseModel):
    children: list[Any] = Field(default_factory=list)


class Raises(BaseModel):
    a: int

    def __getattribute__(self, name: str) -> Any:
        if name == "a":
            raise RuntimeError("no")
        return super().__getattribute__(name)


def _cycle() -> Node:
    node = Node()
    node.children.append(node)
    return node


def _deep() -> Node:
    node = Node()
    for _ in range(5_000):
        node = Node(children=[node])
    return node


@pytest.mark.parametrize("make", [
    _cycle, _deep, lambda: Raises(a=1), lambda: Transfer.model_construct(ref="r"),
], ids=["cycle", "deep", "getattr_raises", "unset_field"])
def test_a_hostile_model_is_a_payload_error(make: Any) -> None:
    with pytest.raises(eg.PayloadError):
        payload_hash({"v": make()})


def test_a_hostile_model_writes_nothing(gate: eg.Gate) -> None:
    calls: list[Any] = []

    @gate.effect("n:{ref}", effect_type="node.make")
    def make(ref: str, node: Node) -> None:
        calls.append(node)

    before = snapshot(gate)
    for node in (_cycle(), _deep()):
        with pytest.raises(eg.PayloadError):
            make("r", node)
    assert calls == []
    assert snapshot(gate) == before


# -- an approval binds every field ------------------------------------------------------------


def test_an_approval_binds_a_field_model_dump_leaves_out(make_gate: Any) -> None:
    gate: eg.Gate = make_gate(policy=ALWAYS)
    ran: list[str] = []

    @gate.effect("transfer:{t.ref}", effect_type="payment.transfer")
    def transfer(t: Transfer) -> dict[str, bool]:
        ran.append(t.from_account)
        return {"ok": True}

    with pytest.raises(eg.ApprovalRequired) as asked:
        transfer(Transfer(ref="r1", amount_cents=100, from_account="petty-cash"))
    approval_id = asked.value.approval_id
    assert approval_id is not None
    approval = gate.approval(approval_id)
    # shown (and stored) as the model dumps itself: the hidden field stays out of the store,
    # and the approval is bound to the hash of all of it
    assert approval.arguments == {"t": {"ref": "r1", "amount_cents": 100}}
    gate.approve(approval_id, by="boss")
    with pytest.raises(eg.PayloadMismatch):
        transfer(Transfer(ref="r1", amount_cents=100, from_account="treasury"))
    assert ran == []
    assert transfer(Transfer(ref="r1", amount_cents=100, from_account="petty-cash")) == {
        "ok": True}
    assert ran == ["petty-cash"]


# -- a result is stored as model_dump() makes it ----------------------------------------------


class Receipt(BaseModel):
    id: str
    card_number: str = Field(exclude=True)
    amount: int

    @field_serializer("amount")
    def _cents(self, value: int) -> str:
        return f"{value} cents"


def test_a_result_is_stored_without_its_excluded_fields() -> None:
    receipt = Receipt(id="x", card_number="4111", amount=5)
    text = result_json({"receipt": receipt, "all": [receipt]})
    assert text is not None and "4111" not in text
    assert json.loads(text) == {"receipt": {"id": "x", "amount": "5 cents"},
                                "all": [{"id": "x", "amount": "5 cents"}]}
    assert to_canonical(receipt, "result") == {"id": "x", "amount": "5 cents"}


def test_a_gated_result_is_stored_and_replayed_without_its_excluded_fields(
        gate: eg.Gate) -> None:
    calls: list[str] = []

    @gate.effect("pay:{ref}", effect_type="payment.charge")
    def pay(ref: str) -> Receipt:
        calls.append(ref)
        return Receipt(id=ref, card_number="4111", amount=5)

    assert pay("r").card_number == "4111"  # the caller gets the object itself
    again: Any = pay("r")  # a duplicate: what was stored
    assert again == {"id": "r", "amount": "5 cents"}
    assert calls == ["r"]
    stored = gate.get("pay:r").result
    assert stored == {"id": "r", "amount": "5 cents"}


def test_a_key_digest_of_a_model_is_made_as_before() -> None:
    """The ``sha256`` key filter digests a model as ``model_dump()`` makes it, as it always
    has: a key that moved when effectgate was upgraded would let a repeat of a committed
    effect run again. (Two calls that differ only in what the dump leaves out share the key,
    and their payload hashes differ: the second is refused as a mismatch, not run.)"""
    import hashlib
    import json

    from pydantic import Field

    from effectgate.keys import KeyTemplate

    class Order(BaseModel):
        ref: str
        account: str = Field(exclude=True)

    order = Order(ref="r1", account="treasury")
    dumped = json.dumps(order.model_dump(), sort_keys=True, separators=(",", ":"))
    key = KeyTemplate("order:{order|sha256}").render({"order": order})
    assert key == "order:" + hashlib.sha256(dumped.encode()).hexdigest()
    assert key == KeyTemplate("order:{order|sha256}").render(
        {"order": Order(ref="r1", account="petty-cash")})
    assert eg.payload_hash({"order": order}) != eg.payload_hash(
        {"order": Order(ref="r1", account="petty-cash")})


def test_an_undo_description_is_stored_as_the_model_dumps_itself(gate: eg.Gate) -> None:
    """Review of the fix: an undo's description (``compensation``) is stored and handed to
    the compensator, as a result is: what the user's dump leaves out stays out of the store."""

    class Refund(BaseModel):
        txn: str
        card_number: str = Field(exclude=True)

    d = gate.begin(effect_type="payment.charge", key="charge:c1", payload={"n": 1},
                   group_key="trip", compensation=Refund(txn="t1", card_number="4111"))
    gate.report(d, "committed", result={"ok": True})
    assert gate.get("charge:c1").compensation == {"txn": "t1"}


# -- red team, round 10 -------------------------------------------------------------------------

class _Account:
    """A type of the application's: no canonical form of its own."""

    def __init__(self, iban: str) -> None:
        self.iban = iban


class _Transfer(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    ref: str
    to: _Account
    amount: int

    @model_serializer
    def _shown(self) -> dict[str, Any]:  # the account under another name
        return {"ref": self.ref, "to_iban": self.to.iban, "amount": self.amount}


class _Batch(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    tos: list[_Account]

    @field_serializer("tos")
    def _ibans(self, tos: list[_Account]) -> list[str]:
        return [t.iban for t in tos]


def test_a_field_a_model_serializer_renames_is_in_the_hash(make_gate: Any) -> None:
    """A field of the application's type that the model's serializer shows under another
    name was left out of the hash: a transfer to Mallory was answered from the store as the
    one to Alice, and an approval for Alice ran Mallory's. It is hashed as the serializer
    shows it now, and the second call is a PayloadMismatch; the body ran once."""
    def transfer(iban: str) -> Any:
        return {"t": _Transfer(ref="r1", to=_Account(iban), amount=100)}

    assert payload_hash(transfer("DE-alice")) != payload_hash(transfer("DE-mallory"))
    assert payload_hash(transfer("DE-alice")) == payload_hash(transfer("DE-alice"))
    gate: eg.Gate = make_gate(policy=False)
    sent: list[str] = []

    @gate.effect("transfer:{t.ref}", effect_type="bank.transfer")
    def send(t: _Transfer) -> dict[str, str]:
        sent.append(t.to.iban)
        return {"sent_to": t.to.iban}

    assert send(**transfer("DE-alice")) == {"sent_to": "DE-alice"}
    with pytest.raises(eg.PayloadMismatch):
        send(**transfer("DE-mallory"))
    assert sent == ["DE-alice"]


def test_a_container_a_field_serializer_makes_plain_hashes_as_dumped() -> None:
    """A list of the application's objects made plain by a field serializer raised a
    PayloadError after round 9 (it hashed before): it is taken as the dump makes it again,
    with the hash it had then, and two lists differ."""
    def batch(*ibans: str) -> Any:
        return {"b": _Batch(tos=[_Account(i) for i in ibans])}

    assert payload_hash(batch("A", "B")) == payload_hash({"b": {"tos": ["A", "B"]}})
    assert payload_hash(batch("A", "B")) != payload_hash(batch("A", "C"))


def test_two_fields_named_alike_in_the_dump_are_a_payload_error() -> None:
    """A field aliased as another field's name (or a computed field named so) hid one of the
    two from the hash; it is a PayloadError now, not a silent overwrite."""
    class Clash(BaseModel):
        model_config = ConfigDict(serialize_by_alias=True)
        a: int = Field(serialization_alias="b")
        b: int

    with pytest.raises(eg.PayloadError, match="two of its fields are named 'b'"):
        payload_hash({"m": Clash(a=1, b=2)})


def test_a_model_serializer_that_returns_no_mapping_is_hashed_as_it_returns() -> None:
    """A model serializer may return any value (a string): a field of the application's type
    is then hashed as that value (it was read as a mapping: a TypeError), and a cycle in a
    container under a field serializer is the payload's cycle error, however it repeats."""
    class Shown(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        to: _Account

        @model_serializer
        def _text(self) -> str:
            return f"to {self.to.iban}"

    assert payload_hash({"m": Shown(to=_Account("A"))}) != payload_hash(
        {"m": Shown(to=_Account("B"))})
    loop: list[Any] = []
    loop += [loop, loop]
    with pytest.raises(eg.PayloadError, match="cycle"):
        payload_hash({"b": _Batch.model_construct(tos=loop)})
