"""A step's undo key is its undo's alone, on both backends: no other effect may begin at a key
starting ``compensate:`` (whichever way it comes: ``begin``, ``request``, ``preview``, the
decorator, MCP), no step key spells another step's hashed undo key, an undo an older
effectgate began at the old key of a step keyed ``sha256:…`` is still that step's one undo
(never run twice), and a key field whose own code raises is an :class:`EffectKeyError`."""

from __future__ import annotations

import datetime
import enum
import hashlib
import uuid
from typing import Any

import anyio
import pytest

import effectgate as eg
from effectgate import flow, keys, sagas
from effectgate.keys import MAX_KEY_LENGTH
from effectgate.sagas import compensation_key, compensation_request

from .test_mcp_server import call, serve


def _step(gate: eg.Gate, key: str, group: str = "g") -> eg.EffectRecord:
    d = gate.begin(effect_type="booking.hotel", key=key, payload={}, group_key=group,
                   compensation={"cancel": key[:20]})
    gate.report(d, "committed", result={})
    return gate.get(key)


def _keys(gate: eg.Gate) -> list[tuple[str, str]]:
    return sorted((e.key, e.state.value) for e in gate.list_effects())


def _old_key(key: str) -> str:
    """compensation_key as it was: only a key too long was hashed."""
    candidate = f"compensate:{key}"
    if len(candidate) <= MAX_KEY_LENGTH:
        return candidate
    return "compensate:sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def _as_old_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo keys as an older effectgate made them (and no look-up of the old key)."""
    monkeypatch.setattr(sagas, "compensation_key", _old_key)
    monkeypatch.setattr(flow, "compensation_key", _old_key)
    monkeypatch.setattr(sagas, "legacy_compensation_key", lambda key: None)


# -- M2: compensate:<key> is an undo's only ------------------------------------------------------

@pytest.mark.parametrize("way", ["begin", "request", "preview", "decorator", "undo_id"])
def test_no_effect_but_an_undo_begins_at_an_undo_key(make_gate: Any, way: str) -> None:
    """An effect that is not an undo at ``compensate:<step key>`` (every way a request is
    made, and one naming the step with a type not its undo's) is refused before the store is
    touched; the step's own undo then runs at its key."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []
    gate.compensator("booking.hotel")(lambda record, c: undone.append(record.key))
    step = _step(gate, "hotel:H1")
    before = _keys(gate)
    fields: dict[str, Any] = {"effect_type": "email.send", "key": "compensate:hotel:H1",
                              "payload": {"to": "x"}}

    @gate.effect("{to}", effect_type="email.send")
    def send(to: str) -> None:
        raise AssertionError("never runs")

    with pytest.raises(eg.EffectKeyError, match="reserved for undos") as err:
        if way == "begin":
            gate.begin(**fields)
        elif way == "request":
            gate.request(**fields)
        elif way == "preview":
            gate.preview(**fields)
        elif way == "decorator":
            send("compensate:hotel:H1")
        else:
            gate.begin(**fields, compensates_effect_id=step.effect_id)
    assert "EffectKeyError" in type(err.value).__name__
    assert _keys(gate) == before
    report = gate.unwind("g")
    assert report.complete and undone == ["hotel:H1"]


def test_a_template_that_starts_like_an_undo_key_is_refused_when_parsed() -> None:
    """:func:`effect_key_template` refuses a template whose literal start is ``compensate:``
    (every key it rendered would be refused); a group's template is not an effect key."""
    for template in ("compensate:{x}", "compensate:x", "compensate:{{x}}:{y}"):
        with pytest.raises(eg.EffectKeyError, match="reserved for undos"):
            keys.effect_key_template(template)
    for template in ("{x}", "undo:{x}", "compensate{x}", "x:compensate:{y}"):
        assert keys.effect_key_template(template).template == template
    assert eg.KeyTemplate("compensate:{x}").prefix == "compensate:"


def test_an_agent_cannot_take_an_undo_key_over_mcp(store_url: str, namespace: str) -> None:
    """Over MCP the agent names the key: ``begin_effect`` at ``compensate:<key>`` without
    ``compensates_effect_id`` is answered as an error, and nothing is written."""
    gate = eg.Gate(store_url, namespace=namespace, policy=False)
    try:
        _step(gate, "hotel:H2")
        before = _keys(gate)

        async def main() -> tuple[bool, dict[str, Any]]:
            with anyio.fail_after(60):
                async with serve("--url", store_url, "--namespace", namespace) as s:
                    return await call(s, "begin_effect", effect_type="email.send",
                                      key="compensate:hotel:H2", payload={"to": "x"})

        is_error, answer = anyio.run(main)
        assert is_error and "reserved for undos" in json_text(answer), answer
        assert _keys(gate) == before
    finally:
        gate.close()


def json_text(answer: dict[str, Any]) -> str:
    return " ".join(str(v) for v in answer.values())


# -- M3: a step keyed sha256:… has an undo key of its own ----------------------------------------

def test_a_step_keyed_like_a_digest_does_not_share_a_long_keys_undo(make_gate: Any) -> None:
    """A step keyed ``sha256:<digest of another step's long key>`` had that step's undo key:
    its undo took the key and the long-keyed step could never be undone. Now each is undone."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []
    gate.compensator("booking.hotel")(lambda record, c: undone.append(record.key))
    long_key = "hotel:" + "x" * 505
    evil_key = "sha256:" + hashlib.sha256(long_key.encode()).hexdigest()
    _step(gate, long_key, "trip:victim")
    _step(gate, evil_key, "trip:evil")
    assert compensation_key(evil_key) != compensation_key(long_key)
    assert compensation_key(evil_key) == "compensate:sha256:" + hashlib.sha256(
        evil_key.encode()).hexdigest()
    assert gate.unwind("trip:evil").complete
    assert gate.unwind("trip:victim").complete
    assert undone == [evil_key, long_key]


def test_no_unhashed_undo_key_looks_hashed() -> None:
    """Only a hashed undo key starts ``compensate:sha256:``; other keys keep theirs."""
    assert compensation_key("sha256:abc") == "compensate:sha256:" + hashlib.sha256(
        b"sha256:abc").hexdigest()
    assert compensation_key("sha256") == "compensate:sha256"
    assert compensation_key("a:sha256:b") == "compensate:a:sha256:b"
    assert compensation_key("x" * 501) == "compensate:" + "x" * 501
    assert keys.legacy_compensation_key("sha256:abc") == "compensate:sha256:abc"
    assert keys.legacy_compensation_key("abc") is None
    assert keys.legacy_compensation_key("sha256:" + "y" * 500) is None  # hashed then too


# -- the upgrade: an undo begun at the old key stays the step's one undo -----------------------

def test_an_undo_committed_at_the_old_key_is_never_run_again(
        make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older effectgate undid a step keyed ``sha256:…`` at ``compensate:<key>``; unwind
    now finds that undo there (compensated earlier) and never runs the refund again, nor does
    the MCP hand-off ask an agent to."""
    gate: eg.Gate = make_gate()
    refunds: list[str] = []
    gate.compensator("booking.hotel")(lambda record, c: refunds.append(record.key))
    key = "sha256:" + "ab" * 32
    step = _step(gate, key)
    with monkeypatch.context() as old:
        _as_old_code(old)
        assert gate.unwind("g").complete
    assert refunds == [key]
    assert gate.get(f"compensate:{key}").state is eg.State.COMMITTED
    report = gate.unwind("g")
    assert refunds == [key] and report.complete
    assert [s.key for s in report.compensated_earlier] == [key]
    request, found = sagas.undo_at(gate, step)
    assert found is not None and request["key"] == f"compensate:{key}" == found.key
    with pytest.raises(eg.UnknownEffect):
        gate.get(compensation_key(key))  # nothing begun at the new key
    from effectgate.integrations.mcp.server import unwind_answer

    handed = unwind_answer(make_gate(), "g", "agent")  # no compensator: handed to the agent
    assert handed["to_compensate"] == [] and [s["key"] for s in handed["compensated"]] == [key]
    # and an operator sees it undone, in the console's saga and effect pages
    from types import SimpleNamespace

    from effectgate.console.effects import _undo_of
    from effectgate.console.sagas import steps_of

    console: Any = SimpleNamespace(gate=gate)
    [shown] = steps_of(console, "g")
    assert shown.undone and shown.undo is not None and shown.undo.key == f"compensate:{key}"
    undo = _undo_of(console, step)
    assert undo is not None and undo.key == f"compensate:{key}"


def test_an_undo_failed_at_the_old_key_is_retried_there(
        make_gate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An undo an older effectgate began at the old key and that FAILED is retried at that
    key (its one undo), never begun afresh at the new key; the MCP hand-off names that key.
    (Needs flow._undoable to accept the old key where the step's own undo already is.)"""
    gate: eg.Gate = make_gate()
    tries: list[str] = []

    def cancel(record: eg.EffectRecord, compensation: Any) -> None:
        tries.append(record.key)
        if len(tries) == 1:
            raise eg.NotExecuted("the vendor said no")

    gate.compensator("booking.hotel")(cancel)
    key = "sha256:" + "cd" * 32
    step = _step(gate, key)
    with monkeypatch.context() as old:
        _as_old_code(old)
        assert gate.unwind("g").failed
    old_key = f"compensate:{key}"
    assert gate.get(old_key).state is eg.State.FAILED
    from effectgate.integrations.mcp.server import unwind_answer

    handed = unwind_answer(make_gate(), "g", "agent")
    assert [s["begin_effect"]["key"] for s in handed["to_compensate"]] == [old_key]
    assert sagas.undo_at(gate, step)[0]["key"] == old_key
    report = gate.unwind("g")
    assert report.complete, report.as_dict()
    assert tries == [key, key] and gate.get(old_key).state is eg.State.COMMITTED
    with pytest.raises(eg.UnknownEffect):
        gate.get(compensation_key(key))


def test_an_undo_is_never_begun_afresh_at_the_old_key(make_gate: Any) -> None:
    """The old key of a step keyed ``sha256:<digest of a long key>`` is the long-keyed
    step's undo key: an undo begun there afresh (no undo of that step is there yet) would take
    it again, so it is refused, and the long-keyed step is still undone."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []
    gate.compensator("booking.hotel")(lambda record, c: undone.append(record.key))
    long_key = "hotel:" + "z" * 505
    evil_key = "sha256:" + hashlib.sha256(long_key.encode()).hexdigest()
    _step(gate, long_key, "trip:victim")
    evil = _step(gate, evil_key, "trip:evil")
    before = _keys(gate)
    with pytest.raises(eg.ConfigError):
        gate.begin(**{**compensation_request(evil), "key": f"compensate:{evil_key}"})
    assert _keys(gate) == before
    assert gate.unwind("trip:victim").complete and undone == [long_key]


# -- L3: a key field's own code that raises ------------------------------------------------------

class _Enum(enum.Enum):
    A = 1

    @property
    def value(self) -> Any:  # type: ignore[override]
        raise RuntimeError("secret-enum")


class _Date(datetime.date):
    def __format__(self, spec: str) -> str:
        raise RuntimeError("secret-date")


class _Uuid(uuid.UUID):
    def __format__(self, spec: str) -> str:
        raise ValueError("secret-uuid")


@pytest.mark.parametrize(("template", "value", "error"), [
    ("k:{x}", _Enum.A, "RuntimeError"), ("k:{x}", _Date(2020, 1, 1), "RuntimeError"),
    ("k:{x:>12}", _Date(2020, 1, 2), "RuntimeError"), ("k:{x}", _Uuid(int=5), "ValueError"),
    ("k:{x}:{y}", _Enum.A, "RuntimeError")])
def test_a_key_fields_own_code_that_raises_is_an_effect_key_error(
        gate: eg.Gate, template: str, value: Any, error: str) -> None:
    """An Enum whose ``value`` raises, a date or UUID whose ``__format__`` raises: an
    :class:`EffectKeyError` naming the field and the error's type (never its text), and
    nothing written."""
    @gate.effect(template, effect_type="t.a")
    def act(x: Any, y: str = "y") -> int:
        raise AssertionError("never runs")

    with pytest.raises(eg.EffectKeyError) as err:
        act(value)
    assert "{x}" in str(err.value) and error in str(err.value)
    assert "secret" not in str(err.value)
    assert gate.list_effects() == []


def test_a_policy_key_that_starts_like_an_undo_key_is_refused_when_loaded() -> None:
    """Review of the fix: a policy's key template ``compensate:{…}`` loaded, and was refused
    only when a tool was wrapped; it is a policy error at load, as a bad template is."""
    with pytest.raises(eg.PolicyError, match="compensate:"):
        eg.Policy.from_dict({"effects": {"payment.refund": {"key": "compensate:{txn_id}"}}})
    eg.Policy.from_dict({"effects": {"payment.refund": {"key": "refund:{txn_id}"}}})


def test_the_console_shows_the_undo_of_the_steps_undo_type_at_either_key(
        make_gate: Any) -> None:
    """Data an older effectgate may have left: at a step's old undo key an effect of another
    type that names the step, and its real undo, committed, at the new key. The console's saga
    and effect pages show that undo (the one of the step's undo type), not the other effect,
    whichever of the two keys sorts (and is read) first."""
    from types import SimpleNamespace

    from sqlalchemy import insert, select

    from effectgate.console.effects import _undo_of
    from effectgate.console.sagas import steps_of
    from effectgate.store.schema import effects

    gate: eg.Gate = make_gate()
    gate.compensator("booking.hotel")(lambda record, c: None)
    console: Any = SimpleNamespace(gate=gate)
    orders = set()
    for group, key in (("g1", "sha256:" + "ef" * 32), ("g2", "sha256:" + "01" * 32)):
        step = _step(gate, key, group)
        assert gate.unwind(group).complete
        new_key, old_key = compensation_key(key), f"compensate:{key}"
        orders.add(old_key < new_key)
        with gate.store.engine.begin() as conn:
            row = dict(conn.execute(select(effects).where(
                effects.c.namespace == gate.namespace, effects.c.key == new_key)).one()._mapping)
            del row["id"]
            conn.execute(insert(effects).values(**{**row, "key": old_key,
                                                   "effect_type": "email.send"}))
        [shown] = steps_of(console, group)
        assert shown.undone and shown.undo is not None, shown
        assert shown.undo.key == new_key and shown.undo.effect_type == "booking.hotel.compensate"
        found = _undo_of(console, step)
        assert found is not None and found.key == new_key
    assert orders == {True, False}  # the old key read first, and last


def test_an_undo_with_a_payload_of_its_own_is_refused_and_the_real_undo_runs(
        make_gate: Any) -> None:
    """Red team, round 10: a begin of the right undo type, key and step but with a payload of
    its own took the step's undo key, and unwind's real undo was refused there for ever
    (PayloadMismatch). It is a ConfigError now, nothing is written, and the undo runs."""
    gate: eg.Gate = make_gate()
    undone: list[str] = []
    gate.compensator("booking.hotel")(lambda record, c: undone.append(record.key))
    step = _step(gate, "hotel:H9")
    real = compensation_request(step)
    before = _keys(gate)
    with pytest.raises(eg.ConfigError, match="not the step's compensation"):
        gate.begin(**{**real, "payload": {"effect_id": step.effect_id,
                                          "compensation": {"cancel": "nothing"}}})
    assert _keys(gate) == before
    assert gate.unwind("g").complete and undone == ["hotel:H9"]
