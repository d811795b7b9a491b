"""The adapter kernel on its own: identical calls in one turn (threads and asyncio), the reader
of effect declarations, and the vocabulary shared with the MCP server."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import effectgate as eg
from effectgate.integrations._kernel import (
    GatedCall,
    Refused,
    read_declarations,
    twin_registry,
)
from effectgate.integrations._kernel import vocabulary as words

ARGS = {"txn_id": "T1", "amount_cents": 500}


def gated(gate: eg.Gate, **options: Any) -> GatedCall:
    return GatedCall(eg.EffectSpec(gate, "refund:{txn_id}", effect_type="refund", **options),
                     "refund")


def test_identical_calls_on_two_threads_execute_once(gate: eg.Gate) -> None:
    call, ran, out = gated(gate), [], []

    def body() -> str:
        ran.append(1)
        time.sleep(0.3)
        return "refunded"

    threads = [threading.Thread(target=lambda: out.append(call.run(dict(ARGS), body)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ran == [1] and out == ["refunded"] * 3
    assert len(twin_registry) == 0


async def test_identical_calls_in_one_event_loop_execute_once(gate: eg.Gate) -> None:
    call, ran = gated(gate), []

    async def body() -> str:
        ran.append(1)
        await asyncio.sleep(0.3)
        return "refunded"

    def sync_body() -> str:
        ran.append(1)
        time.sleep(0.3)
        return "refunded"

    out = await asyncio.gather(call.arun(dict(ARGS), body), call.arun(dict(ARGS), body),
                               call.arun_sync(dict(ARGS), sync_body))
    assert ran == [1] and out == ["refunded"] * 3


async def test_a_twin_of_a_lost_reply_is_told_the_same(gate: eg.Gate) -> None:
    call, ran = gated(gate), []

    async def body() -> str:
        ran.append(1)
        await asyncio.sleep(0.2)
        raise TimeoutError("the reply was lost")

    first, second = await asyncio.gather(call.arun(dict(ARGS), body), call.arun(dict(ARGS), body))
    assert ran == [1]
    assert isinstance(first, Refused) and first is second and first.kind == "ambiguous"


def test_a_call_inside_the_call_it_repeats_does_not_wait_for_itself(gate: eg.Gate) -> None:
    call = gated(gate)
    inner: list[Any] = []

    def body() -> str:
        inner.append(call.run(dict(ARGS), lambda: "nested"))
        return "outer"

    assert call.run(dict(ARGS), body) == "outer"
    [nested] = inner
    assert isinstance(nested, Refused) and nested.kind == "in_flight"


def test_a_twin_waits_at_most_the_lease_then_asks_the_store(make_gate: Any) -> None:
    gate = make_gate(lease_seconds=0.5)
    call = gated(gate)
    started, out = threading.Event(), []

    def slow() -> str:
        started.set()
        time.sleep(1.5)
        return "late"

    leader = threading.Thread(target=lambda: out.append(call.run(dict(ARGS), slow)))
    leader.start()
    started.wait(5)
    t0 = time.monotonic()
    twin = call.run(dict(ARGS), lambda: "twin ran")
    waited = time.monotonic() - t0
    leader.join()
    assert 0.4 <= waited < 1.4
    assert isinstance(twin, Refused) and twin.kind in ("in_flight", "blocked")


def test_a_call_with_other_arguments_is_not_a_twin(gate: eg.Gate) -> None:
    call, out = gated(gate), []
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.3)
        return "refunded"

    leader = threading.Thread(target=lambda: out.append(call.run(dict(ARGS), slow)))
    leader.start()
    started.wait(5)
    other = call.run({"txn_id": "T1", "amount_cents": 9}, lambda: "other ran")
    leader.join()
    assert out == ["refunded"]
    assert isinstance(other, Refused) and other.kind == "conflict"
    assert isinstance(other.error, eg.PayloadMismatch)


def test_a_body_that_changes_its_arguments_makes_no_later_call_its_twin(gate: eg.Gate) -> None:
    """The leader's payload hash is pinned as its body begins: a body that changes its
    argument objects in place does not make a call with those changed arguments a twin."""
    call = GatedCall(eg.EffectSpec(gate, "order:{order_id}", effect_type="order"), "order")
    started, out = threading.Event(), []

    def place() -> str:
        items.append("bread")  # the body changes the list it was given
        started.set()
        time.sleep(0.3)
        return "placed"

    items = ["milk"]
    leader = threading.Thread(target=lambda: out.append(
        call.run({"order_id": "O1", "items": items}, place)))
    leader.start()
    started.wait(5)
    other = call.run({"order_id": "O1", "items": ["milk", "bread"]}, lambda: "other ran")
    leader.join()
    assert out == ["placed"]
    assert isinstance(other, Refused) and other.kind == "conflict"


def test_a_twin_under_a_normalising_template_still_gets_the_answer(gate: eg.Gate) -> None:
    """The pinned hash is the store's (over the template's normal form): a same-argument call
    arriving after the body began is still a twin, not told "in flight"."""
    call = GatedCall(eg.EffectSpec(gate, "mail:{to|lower}", effect_type="mail"), "mail")
    started, out = threading.Event(), []

    def send() -> str:
        started.set()
        time.sleep(0.3)
        return "sent"

    leader = threading.Thread(target=lambda: out.append(call.run({"to": "Bob@X.com"}, send)))
    leader.start()
    started.wait(5)
    twin = call.run({"to": "Bob@X.com"}, lambda: "twin ran")
    leader.join()
    assert out == ["sent"] and twin == "sent"


def test_a_twin_of_another_run_is_not_handed_the_leaders_denial(make_gate: Any) -> None:
    """A denial may be the leader's own (its run's ceiling): a twin asks the store for its own
    answer instead of being told "do not retry"."""
    gate = make_gate(policy=eg.Policy.from_dict({"effects": {"refund": {"budget": {
        "per_run_micros": 1_000_000}}}}))
    call = GatedCall(eg.EffectSpec(gate, "refund:{txn_id}", effect_type="refund",
                                   cost_micros=lambda txn_id, amount_cents: 800_000), "refund")
    with eg.effect_context(run_id="A"):
        assert call.run({"txn_id": "T0", "amount_cents": 1}, lambda: "T0") == "T0"
    held, out = threading.Event(), {}

    def as_run(run: str) -> None:
        with eg.effect_context(run_id=run):
            if run == "A":  # A's call leads, and is denied by A's ceiling after a pause
                real = gate.store.move

                def slow(*args: Any, **kwargs: Any) -> Any:
                    held.set()
                    time.sleep(0.4)
                    return real(*args, **kwargs)

                gate.store.move = slow  # type: ignore[method-assign]
            out[run] = call.run({"txn_id": "T1", "amount_cents": 1}, lambda: f"ran for {run}")

    a = threading.Thread(target=as_run, args=("A",))
    a.start()
    held.wait(5)
    as_run("B")
    a.join()
    assert isinstance(out["A"], Refused) and out["A"].kind == "denied"
    assert out["B"] == "ran for B"  # its own run's ceiling has room


async def test_a_cancelled_leader_leaves_its_twin_to_the_store(gate: eg.Gate) -> None:
    call = gated(gate)

    async def body() -> str:
        await asyncio.sleep(5)
        return "never"

    leader = asyncio.create_task(call.arun(dict(ARGS), body))
    await asyncio.sleep(0.2)
    twin = asyncio.create_task(call.arun(dict(ARGS), body))
    await asyncio.sleep(0.1)
    leader.cancel()
    answer = await asyncio.wait_for(twin, 5)
    assert isinstance(answer, Refused) and answer.kind == "blocked"  # cancelled mid-body
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


def test_declarations_from_a_mapping(sqlite_only_gate: eg.Gate) -> None:
    gate = sqlite_only_gate
    spec = eg.EffectSpec(gate, "mail:{to}", effect_type="mail")
    rule = eg.EffectRule(effect_type="payment.refund", key="refund:{txn_id}", lease_seconds=9)
    read = read_declarations({"a": "a:{x}", "b": {"key": "b:{y}", "vendor": "stripe"},
                              "c": None, "d": spec, "e": rule}, gate=gate, read_only=["z"])
    assert set(read.effects) == {"a", "b", "d", "e"} and read.read_only == {"c", "z"}
    assert read.effects["b"].effect_options() == {"vendor": "stripe"}
    specs = read.specs(gate)
    assert specs["d"] is spec and specs["a"].effect_type == "a"
    assert specs["e"].effect_type == "payment.refund" and specs["e"].lease_seconds == 9
    assert read.ungated(["a", "c", "q"]) == ["q"] and not read.strict
    for bad in ({"a": 3}, {"a": {"vendor": "x"}}, {"a": {"key": "k", "colour": 1}}, [1], {1: "k"}):
        with pytest.raises(eg.ConfigError):
            read_declarations(bad, gate=gate)
    with pytest.raises(eg.ConfigError, match="not in the list"):
        read_declarations({"refnud": "r:{x}"}, gate=gate, tool_names=["refund"])


def test_declarations_from_a_policy(make_gate: Any) -> None:
    policy = eg.Policy.from_dict({"strict": True, "effects": {
        "payment.refund": {"key": "refund:{txn_id}", "tools": ["refund"], "vendor": "stripe"},
        "payment.capture": {"key": "capture:{txn_id}", "tools": ["capture"]}}})
    read = read_declarations(policy, gate=make_gate(policy=policy))
    assert read.strict and set(read.effects) == {"refund", "capture"}
    assert read.effects["refund"].effect_options() == {"effect_type": "payment.refund",
                                                       "vendor": "stripe"}
    with pytest.raises(eg.ConfigError, match="without it"):
        read_declarations(policy, gate=make_gate())


@pytest.fixture
def sqlite_only_gate(tmp_path: Any) -> Any:
    with eg.Gate(f"sqlite:///{tmp_path / 'e.db'}") as gate:
        yield gate


def test_the_model_is_told_what_to_do_for_each_answer() -> None:
    refused = eg.EffectInFlight("x", key="k", retry_after_seconds=2.0, decision="in_flight")
    assert "Wait about 2 seconds" in words.model_message("in_flight", "k", refused)
    assert "approval id apr_1" in words.model_message(
        "approval_required", "k", eg.ApprovalRequired("x", approval_id="apr_1"))
    assert "try again" in words.model_message("failed", "k", ValueError("no")).lower()
    long = words.model_message("ambiguous", "k", TimeoutError("x" * 5000))
    assert "OUTCOME UNKNOWN" in long and len(long) < 1000
    assert words.error_hint(eg.StaleLease("x")) == words.ERROR_HINTS["StaleLease"]
    assert words.error_hint(KeyError("x")) == words.DEFAULT_HINT


def test_the_protocol_vocabulary_is_the_mcp_servers() -> None:
    """The MCP server and gateway speak the adapters' words: one copy of every text."""
    import effectgate.integrations.mcp.gateway as gateway
    import effectgate.integrations.mcp.server as server

    assert server.INSTRUCTIONS is words.INSTRUCTIONS and server.ERROR_HINTS is words.ERROR_HINTS
    assert gateway._AMBIGUOUS_HINT is words.UPSTREAM_AMBIGUOUS
    assert gateway._FAILED_HINT is words.UPSTREAM_FAILED
    refused = server.error_answer(eg.StaleLease("stale", key="k"))
    assert refused["what_to_do"] == words.ERROR_HINTS["StaleLease"]


PINNED = {
    "effectgate.integrations._kernel": {
        "SPEC_OPTIONS", "Declaration", "Declarations", "Framework", "GatedCall", "OnRefusal",
        "Pause", "Refused", "TwinRegistry", "UngatedToolWarning", "default_gate", "error_hint",
        "framework_context", "gate_tools", "invalid_arguments", "is_stopping", "missing_extra",
        "model_arguments", "model_message", "read_declarations", "recorded_failed",
        "report_ungated", "requires_extra", "resolve_gate", "twin_registry"},
    "effectgate.integrations.langchain": {
        "DEFAULT_APPROVER", "EffectGateMiddleware", "EffectRefusedToolError", "GatedTool",
        "ToolReportedError", "UngatedToolWarning", "classify_tool_exception", "gate_tool",
        "gate_tools", "hitl_request"},
    "effectgate.integrations.openai_agents": {
        "ASK_AGAIN", "DEFAULT_APPROVER", "EffectGateAgentsError", "EffectGateRunHooks",
        "GatedFunctionTool", "RequestGone", "UngatedToolWarning", "apply_store_decisions",
        "approve", "ask_again", "gate_tool", "gate_tools",
        "is_gated", "reject"},
    "effectgate.integrations.llama_index": {
        "DEFAULT_APPROVER", "EffectGateAgentMixin", "EffectGateFunctionAgent", "GatedFunctionTool",
        "UngatedToolAudit", "UngatedToolWarning", "gate_tool", "gate_tools"},
    "effectgate.integrations.pydantic_ai": {
        "DEFAULT_APPROVER", "EffectGateToolset", "UngatedToolWarning", "gate_tool",
        "is_gated", "reject"},
}


@pytest.mark.parametrize("module", sorted(PINNED))
def test_each_adapter_module_pins_a_sorted_documented_all(module: str) -> None:
    import importlib
    import inspect

    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        pytest.skip(str(err))
    names = list(mod.__all__)
    assert set(names) == PINNED[module]

    def rank(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert names == sorted(names, key=rank)
    for name in names:
        obj = getattr(mod, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{module}.{name} has no docstring"
