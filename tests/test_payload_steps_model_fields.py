"""An async caller's payload hash of a large payload holding pydantic models (made by steps,
:mod:`effectgate._payload_steps`) is the sync one: every field, not ``model_dump()`` (red
team, round 9, H3); a large result is still stored as ``model_dump()`` makes it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel, Field, field_serializer

import effectgate as eg
from effectgate._payload_steps import apayload_hash, aresult_json, is_small
from effectgate.payload import payload_hash, result_json


class Transfer(BaseModel):
    ref: str
    from_account: str = Field(exclude=True)
    rows: list[Any]

    @field_serializer("ref")
    def _ref(self, value: str) -> str:
        return "hidden"


def _big(account: str, ref: str = "r1") -> Transfer:
    return Transfer(ref=ref, from_account=account, rows=[{"i": i} for i in range(5_000)])


@pytest.mark.parametrize("wrap", [lambda t: {"t": t}, lambda t: {"t": [t, t]}],
                         ids=["model", "list-of-models"])
def test_a_large_payload_is_hashed_by_its_fields_by_steps_as_at_once(wrap: Any) -> None:
    one, other = wrap(_big("petty-cash")), wrap(_big("treasury"))
    third = wrap(_big("petty-cash", "r2"))
    assert not is_small(one)
    hashed = [asyncio.run(apayload_hash(p)) for p in (one, other, third)]
    assert hashed == [payload_hash(p) for p in (one, other, third)]
    assert len(set(hashed)) == 3


def test_a_large_result_is_stored_by_steps_as_model_dump_makes_it() -> None:
    result = {"t": _big("petty-cash")}
    text = asyncio.run(aresult_json(result))
    assert text == result_json(result)
    assert text is not None and "petty-cash" not in text
    assert json.loads(text)["t"]["ref"] == "hidden"


def test_an_async_approval_binds_a_field_model_dump_leaves_out(make_gate: Any) -> None:
    gate = make_gate(policy={"effects": {"payment.*": {"approval": "always"}}})
    ran: list[str] = []

    @gate.effect("transfer:{key}", effect_type="payment.transfer")
    async def transfer(key: str, t: Transfer) -> str:
        ran.append(t.from_account)
        return "ok"

    with pytest.raises(eg.ApprovalRequired) as asked:
        asyncio.run(transfer("k", _big("petty-cash")))
    gate.approve(asked.value.approval_id, by="boss")
    with pytest.raises(eg.PayloadMismatch):
        asyncio.run(transfer("k", _big("treasury")))
    assert ran == []
    assert asyncio.run(transfer("k", _big("petty-cash"))) == "ok"
    assert ran == ["petty-cash"]
