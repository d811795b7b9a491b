"""The adapter contract, once for every framework (LangChain, OpenAI Agents, LlamaIndex,
pydantic-ai), each in its real agent loop driven offline by a scripted model, and for the MCP
gateway (a real upstream MCP server behind it, a real MCP client in front), on SQLite and
Postgres. A framework joins by adding a driver to ``tests/adapter_drivers.py``; where the
gateway legitimately differs (its driver's docstring says how), the contract asks the driver."""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import pytest

import effectgate as eg
from effectgate.integrations._kernel import twin_registry as twins

from .adapter_drivers import DRIVERS, Driver, refund_body, send_mail

ARGS = {"txn_id": "T1", "amount_cents": 500}
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(params=DRIVERS, ids=[d.name for d in DRIVERS])
def driver(request: pytest.FixtureRequest) -> Driver:
    d: Driver = request.param
    if not d.available():
        pytest.skip(f"{d.name} is not installed")
    return d


def gated(driver: Driver, gate: eg.Gate, ledger: list[Any], behaviour: str = "ok") -> list[Any]:
    """The refund tool in the driver's gated form (gate_tools / EffectGateToolset)."""
    tool = driver.tool(refund_body(ledger, behaviour))
    return driver.gate_tools([tool], {"refund": "refund:{txn_id}"}, gate)


def test_a_duplicate_gets_the_stored_result(driver: Driver, gate: eg.Gate) -> None:
    ledger: list[Any] = []
    tools = gated(driver, gate, ledger)
    first = driver.run(tools, [[("call_1", ARGS)]], run_id="run-1")
    if not driver.coerces_arguments:  # the gateway refuses "500" against the schema; nothing ran
        [text] = driver.run(tools, [[("call_0", {"txn_id": "T1", "amount_cents": "500"})]],
                            run_id="run-2").values()
        assert "InvalidArguments" in text and "nothing ran" in text
    again = driver.run(tools, [[("call_2", {"txn_id": "T1", "amount_cents": (
        "500" if driver.coerces_arguments else 500)})]], run_id="run-2")
    assert ledger == [("T1", 500)]
    assert first == {"call_1": "refunded 500 on T1 (#1)"}
    assert again == {"call_2": "refunded 500 on T1 (#1)"}
    assert gate.get("refund:T1").state is eg.State.COMMITTED


def test_a_body_error_is_outcome_unknown_and_not_retried(driver: Driver, gate: eg.Gate) -> None:
    ledger: list[Any] = []
    tools = gated(driver, gate, ledger, "lost")
    out = driver.run(tools, [[("call_1", ARGS)], [("call_2", ARGS)]], run_id="run-1")
    assert ledger == [("T1", 500)]
    assert all(words in out["call_1"] for words in driver.unknown_says), out["call_1"]
    assert (driver.repeat_says or driver.blocked_says) in out["call_2"], out["call_2"]
    if driver.repeat_says:  # the framework refused the immediate repeat: one step between
        later = driver.run(tools, [[("call_3", ARGS)]], run_id="run-2")
        assert driver.blocked_says in later["call_3"], later["call_3"]
        assert ledger == [("T1", 500)]
    assert "try again" not in out["call_1"].lower()
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


def test_strict_mode_refuses_ungated_tools(driver: Driver, gate: eg.Gate) -> None:
    ledger: list[Any] = []
    tools = [driver.tool(refund_body(ledger, "ok")), driver.tool(send_mail)]
    if driver.strict_refuses_at == "setup":
        with pytest.raises(eg.ConfigError, match="send_mail"):
            wrapped = driver.gate_tools(tools, {"refund": "refund:{txn_id}"}, gate, strict=True)
            driver.run(wrapped, [[("call_1", ARGS)]], run_id="run-1")
        assert ledger == []
    else:  # the gateway starts, lists send_mail, and refuses each call of it
        wrapped = driver.gate_tools(tools, {"refund": "refund:{txn_id}"}, gate, strict=True)
        out = driver.run(wrapped, [[("call_0", {"to": "a@example.com"}, "send_mail")]],
                         run_id="run-1")
        assert "UngatedTool" in out["call_0"] and "send_mail" in out["call_0"]
        assert "sent" not in out["call_0"] and ledger == []  # send_mail answers "sent"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        relaxed = driver.gate_tools(tools, {"refund": "refund:{txn_id}", "send_mail": None},
                                    gate, strict=True)  # declared read-only: allowed
    assert driver.run(relaxed, [[("call_1", ARGS)]], run_id="run-1") == {
        "call_1": "refunded 500 on T1 (#1)"}


def test_run_and_agent_ids_arrive(driver: Driver, gate: eg.Gate) -> None:
    """The framework's run id and agent name reach the record. An MCP call carries neither
    (the gateway driver's client names itself ``billing`` in ``clientInfo``, which is not an
    agent id): the gateway records none, and this says so."""
    ledger: list[Any] = []
    run_id = f"conversation-{uuid.uuid4().hex[:8]}"
    driver.run(gated(driver, gate, ledger), [[("call_1", ARGS)]], run_id=run_id)
    record = gate.get("refund:T1")
    expected = (run_id, "billing") if driver.carries_ids else (None, None)
    assert (record.run_id, record.agent_id) == expected
    assert record.state is eg.State.COMMITTED


def test_two_identical_calls_in_one_turn_execute_once_and_both_get_the_result(
        driver: Driver, gate: eg.Gate) -> None:
    if driver.one_call_per_turn:
        pytest.skip(f"{driver.name} makes one tool call per model turn: there are no twins")
    ledger: list[Any] = []
    tools = gated(driver, gate, ledger, "slow")
    out = driver.run(tools, [[("call_1", ARGS), ("call_2", ARGS)]], run_id="run-1")
    assert ledger == [("T1", 500)]
    assert out == {"call_1": "refunded 500 on T1 (#1)", "call_2": "refunded 500 on T1 (#1)"}
    assert len(twins) == 0  # nothing left behind


def test_a_twin_with_other_arguments_gets_the_stores_conflict(
        driver: Driver, gate: eg.Gate) -> None:
    ledger: list[Any] = []
    tools = gated(driver, gate, ledger, "slow")
    out = driver.run(tools, [[("call_1", ARGS), ("call_2", {"txn_id": "T1", "amount_cents": 9})]],
                     run_id="run-1")
    [(_, amount)] = ledger  # whichever reserved first ran; the other was refused
    winner, loser = ("call_1", "call_2") if amount == 500 else ("call_2", "call_1")
    assert out[winner] == f"refunded {amount} on T1 (#1)"
    assert driver.conflict_says in out[loser], out[loser]


def test_the_model_sees_byte_identical_tool_definitions(driver: Driver, gate: eg.Gate) -> None:
    ledger: list[Any] = []
    plain = [driver.tool(refund_body(ledger, "ok"))]
    assert driver.definitions(plain) == driver.definitions(
        driver.gate_tools(plain, {"refund": "refund:{txn_id}"}, gate))
    assert driver.definitions(plain) == driver.definitions(
        [driver.gate_tool(plain[0], "refund:{txn_id}", gate)])
    assert ledger == []
