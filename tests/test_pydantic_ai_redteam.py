"""pydantic-ai, attacked: resumes replayed with other arguments, edits racing, bodies that ask
for approval or defer themselves, tools whose arguments the key could not name. Real agent
loops driven offline by ``FunctionModel``, on SQLite and Postgres; every refund is counted in a
ledger."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Annotated, Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic import BaseModel, Field
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    Tool,
    ToolApproved,
)
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.toolsets import FunctionToolset

import effectgate as eg
from effectgate.integrations import pydantic_ai as eg_pa

BIG = {"txn_id": "T1", "amount_cents": 50_000}  # above the approval threshold
SMALL = {"txn_id": "T1", "amount_cents": 500}
POLICY = {"effects": {"refund": {"approval": {"at_or_above_micros": 100_000_000}}}}


def cost(amount_cents: int) -> int:
    return amount_cents * 10_000


def model_calling(*calls: dict[str, Any], name: str = "refund") -> FunctionModel:
    """Calls the tool with each of ``calls`` (one turn), then answers once it sees a result."""

    def answer(messages: Any, info: Any) -> ModelResponse:
        if any(isinstance(p, (ToolReturnPart, RetryPromptPart)) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart("All done.")])
        return ModelResponse(parts=[ToolCallPart(name, dict(a), tool_call_id=f"call_{i + 1}")
                                    for i, a in enumerate(calls)])

    return FunctionModel(answer)


def refund_into(ledger: list[Any]) -> Callable[..., str]:
    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    return refund


def paused_agent(gate: eg.Gate, ledger: list[Any], *calls: dict[str, Any]) -> Agent[Any, Any]:
    toolset = eg_pa.EffectGateToolset(
        FunctionToolset([refund_into(ledger)]),
        {"refund": {"key": "refund:{txn_id}", "cost_micros": cost}}, gate=gate)
    return Agent(model_calling(*(calls or (BIG,))), toolsets=[toolset], name="billing",
                 output_type=[str, DeferredToolRequests])


def pause(agent: Agent[Any, Any]) -> dict[str, Any]:
    """Run to the pause; what a client saves of it (history as JSON, and the metadata)."""
    return saved_of(agent.run_sync("refund T1"))


def saved_of(result: Any) -> dict[str, Any]:
    """What a client saves of a run that paused: its history as JSON, and the metadata."""
    assert isinstance(result.output, DeferredToolRequests)
    return {"history": result.all_messages_json(), "metadata": result.output.metadata}


def results_of(saved: dict[str, Any], answer: Any) -> DeferredToolResults:
    return DeferredToolResults(approvals={"call_1": answer}, metadata=saved["metadata"])


def resume(agent: Agent[Any, Any], saved: dict[str, Any], answer: Any = True) -> list[str]:
    """Resume the saved pause with ``answer`` for call_1; the tool results it produced."""
    history = ModelMessagesTypeAdapter.validate_json(saved["history"])
    result = agent.run_sync(message_history=history,
                            deferred_tool_results=results_of(saved, answer))
    return tool_results(result)


def tool_results(result: Any) -> list[str]:
    return [str(p.content) for m in result.new_messages() for p in m.parts
            if isinstance(p, ToolReturnPart)]


def edit(amount_cents: int) -> ToolApproved:
    return ToolApproved(override_args={"txn_id": "T1", "amount_cents": amount_cents})


# -- one paused request answers once -----------------------------------------------------------


def _approved_and_ran(gate: eg.Gate, agent: Agent[Any, Any], saved: dict[str, Any]) -> None:
    assert resume(agent, saved) == ["refunded 50000 on T1"]


def _rejected(gate: eg.Gate, agent: Agent[Any, Any], saved: dict[str, Any]) -> None:
    [said] = resume(agent, saved, eg_pa.reject(saved["metadata"]["call_1"], gate=gate,
                                               by="dave", reason="no"))
    assert said.startswith("DENIED")


def _denied_in_the_cli(gate: eg.Gate, agent: Agent[Any, Any], saved: dict[str, Any]) -> None:
    gate.deny(saved["metadata"]["call_1"]["effectgate"]["approval_id"], by="dave")


def _replaced_by_an_edit(gate: eg.Gate, agent: Agent[Any, Any], saved: dict[str, Any]) -> None:
    assert resume(agent, saved, edit(5_000)) == ["refunded 5000 on T1"]


@pytest.mark.parametrize("decide", [_approved_and_ran, _rejected, _denied_in_the_cli,
                                    _replaced_by_an_edit])
def test_a_decided_request_takes_no_new_edit(make_gate: Any, decide: Any) -> None:
    """The pause for refund T1 was decided; the same pause resumed again with other arguments
    (an override below the approval threshold, or the history edited) once ran each of them
    as a fresh ``~edit:`` effect: T1 refunded again and again, even after a human rejected it.
    Now it is told the request was decided, and nothing more runs."""
    gate = make_gate(policy=eg.Policy.from_dict(POLICY))
    ledger: list[Any] = []
    agent = paused_agent(gate, ledger)
    saved = pause(agent)
    decide(gate, agent, saved)
    before = list(ledger)
    for amount in (4_000, 3_000):
        [said] = resume(agent, saved, edit(amount))
        assert said.startswith("DENIED") and "already decided" in said
    assert ledger == before and len(ledger) <= 1


def test_a_replayed_edit_still_answers_what_it_did(make_gate: Any) -> None:
    """The edit that replaced the request, replayed (as an override or plainly), is answered
    from the store: its stored result, nothing run again."""
    gate = make_gate(policy=eg.Policy.from_dict(POLICY))
    ledger: list[Any] = []
    agent = paused_agent(gate, ledger)
    saved = pause(agent)
    assert resume(agent, saved, edit(5_000)) == ["refunded 5000 on T1"]
    assert resume(agent, saved, edit(5_000)) == ["refunded 5000 on T1"]
    assert resume(agent, saved) == ["refunded 5000 on T1"]
    assert ledger == [("T1", 5_000)]


def test_two_resumes_editing_one_request_at_once_run_one_edit(make_gate: Any) -> None:
    """Two resumes of one pending pause, each with its own override below the threshold: both
    read the request pending, both denied it "replaced", and both edits ran (T1 refunded
    twice, every time). Only the edit the denial names runs."""
    gate = make_gate(policy=eg.Policy.from_dict(POLICY))
    ledger: list[Any] = []
    agent = paused_agent(gate, ledger)

    async def one(saved: dict[str, Any], amount: int) -> list[str]:
        history = ModelMessagesTypeAdapter.validate_json(saved["history"])
        result = await agent.run(message_history=history,
                                 deferred_tool_results=results_of(saved, edit(amount)))
        return tool_results(result)

    async def both() -> list[list[str]]:
        # The pause runs on this loop too: ``run_sync`` would leave its own loop as the
        # thread's default, and ``asyncio.run`` then unsets it without closing it.
        saved = saved_of(await agent.run("refund T1"))
        return list(await asyncio.gather(one(saved, 5_000), one(saved, 4_000)))

    answers = asyncio.run(both())
    assert len(ledger) == 1
    ran = [said for [said] in answers if said.startswith("refunded")]
    assert ran == [f"refunded {ledger[0][1]} on T1"]


def test_an_edit_meeting_an_approval_given_meanwhile_runs_nothing(make_gate: Any) -> None:
    """A human approves 50,000 in the CLI just as a resume edits the call to 99,999. The
    approval stands — but the kernel then runs "the original" while pydantic-ai hands the
    body the edited arguments: 99,999 was refunded under the approval of 50,000, and recorded
    as 50,000 committed. Now the body never gets arguments other than the ones keyed.

    The CLI's approval is interleaved deterministically: it lands right before the resume's
    own write (its denial of the request as replaced)."""
    gate = make_gate(policy=eg.Policy.from_dict(POLICY))
    ledger: list[Any] = []
    agent = paused_agent(gate, ledger)
    saved = pause(agent)
    approval_id = saved["metadata"]["call_1"]["effectgate"]["approval_id"]
    deny = gate.deny

    def approved_first(request_id: str, **options: Any) -> Any:
        gate.approve(approval_id, by="bob")  # the CLI, a moment earlier
        return deny(request_id, **options)

    gate.deny = approved_first
    try:
        [said] = resume(agent, saved, edit(99_999))
    finally:
        gate.deny = deny
    assert said.startswith("DENIED") and ledger == []
    assert gate.approval(approval_id).state is eg.ApprovalState.APPROVED
    assert resume(agent, saved) == ["refunded 50000 on T1"]  # what bob approved, once
    assert ledger == [("T1", 50_000)]


# -- a body that asks or defers itself ----------------------------------------------------------


def _own_check(ledger: list[Any]) -> FunctionToolset[Any]:
    def refund(ctx: RunContext[Any], txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        if not ctx.tool_call_approved:
            raise ApprovalRequired(metadata={"why": "the tool asks"})
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    return FunctionToolset([refund])


def _approval_toolset(ledger: list[Any]) -> Any:
    return FunctionToolset([refund_into(ledger)]).approval_required()


@pytest.mark.parametrize("inner", [_own_check, _approval_toolset])
@pytest.mark.parametrize("on_refusal", ["message", "raise"])
def test_a_body_asking_for_approval_pauses_and_runs_once_approved(
        gate: eg.Gate, inner: Any, on_refusal: Any) -> None:
    """pydantic-ai's own approval inside the gate (the tool raising ``ApprovalRequired``, or
    ``toolset.approval_required()``) was recorded AMBIGUOUS and told to the model as "outcome
    unknown": the run never paused, and the approved call was blocked for good. It asked
    before it acted: FAILED, the run pauses, the approved resume runs it once."""
    ledger: list[Any] = []
    agent = Agent(model_calling(SMALL, SMALL), toolsets=[eg_pa.EffectGateToolset(
        inner(ledger), {"refund": "refund:{txn_id}"}, gate=gate, on_refusal=on_refusal)],
        output_type=[str, DeferredToolRequests])
    first = agent.run_sync("refund T1")
    assert isinstance(first.output, DeferredToolRequests)
    assert [c.tool_call_id for c in first.output.approvals] == ["call_1", "call_2"]
    assert ledger == [] and gate.get("refund:T1").state is eg.State.FAILED
    answers = DeferredToolResults(approvals={"call_1": True, "call_2": True})
    done = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=answers)
    assert tool_results(done) == ["refunded 500 on T1"] * 2
    assert ledger == [("T1", 500)] and gate.get("refund:T1").state is eg.State.COMMITTED
    again = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=answers)
    assert tool_results(again) == ["refunded 500 on T1"] * 2 and len(ledger) == 1


def test_a_body_deferring_its_call_defers_the_run(gate: eg.Gate) -> None:
    """A tool that hands its call to an executor outside the run (``CallDeferred``) was
    answered "outcome unknown" and the run went on without it. The deferral reaches
    pydantic-ai; the effect stays AMBIGUOUS (the hand-off may have happened), so a repeat is
    refused rather than handed off again."""
    handed: list[Any] = []

    def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction, in the background."""
        handed.append(txn_id)
        raise CallDeferred(metadata={"job": f"job-{txn_id}"})

    agent = Agent(model_calling(SMALL), toolsets=[eg_pa.EffectGateToolset(
        FunctionToolset([refund]), {"refund": "refund:{txn_id}"}, gate=gate)],
        output_type=[str, DeferredToolRequests])
    result = agent.run_sync("refund T1")
    assert isinstance(result.output, DeferredToolRequests)
    assert [c.tool_call_id for c in result.output.calls] == ["call_1"]
    assert result.output.metadata == {"call_1": {"job": "job-T1"}}
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS
    repeat = agent.run_sync("refund T1 again")
    assert repeat.output == "All done." and handed == ["T1"]


# -- arguments as the tool receives them -------------------------------------------------------


def _sync_wrapper(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)  # a sync decorator: hands back the coroutine

    return wrapper


@pytest.mark.parametrize("form", ["toolset", "gate_tool"])
def test_a_sync_function_returning_an_awaitable_runs_once(gate: eg.Gate, form: str) -> None:
    """pydantic-ai awaits what a plain def returns; the gate's one-hop path closed it unrun
    and recorded AMBIGUOUS (blocked for good, the refund never made)."""
    ledger: list[Any] = []

    @_sync_wrapper
    async def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        await asyncio.sleep(0)
        ledger.append(txn_id)
        return f"refunded {txn_id} under {eg.current_effect().key}"

    model = model_calling(SMALL, SMALL)
    if form == "toolset":
        agent = Agent(model, toolsets=[eg_pa.EffectGateToolset(
            FunctionToolset([refund]), {"refund": "refund:{txn_id}"}, gate=gate)])
    else:
        agent = Agent(model, tools=[eg_pa.gate_tool(Tool(refund), "refund:{txn_id}",
                                                    gate=gate)])
    result = agent.run_sync("refund T1")
    assert tool_results(result) == ["refunded T1 under refund:T1"] * 2
    assert ledger == ["T1"] and gate.get("refund:T1").state is eg.State.COMMITTED


def test_the_runs_output_types_decide_the_pause(make_gate: Any) -> None:
    """``run(..., output_type=...)`` overrides the agent's: a run allowing
    ``DeferredToolRequests`` pauses on an approval, one that does not is told to wait (it
    ended in pydantic-ai's UserError; the other never paused)."""
    gate = make_gate(policy=eg.Policy.from_dict(POLICY))
    ledger: list[Any] = []
    toolset = eg_pa.EffectGateToolset(
        FunctionToolset([refund_into(ledger)]),
        {"refund": {"key": "refund:{txn_id}", "cost_micros": cost}}, gate=gate)
    plain = Agent(model_calling(BIG), toolsets=[toolset])
    paused: Any = plain.run_sync("refund T1", output_type=[str, DeferredToolRequests])
    assert isinstance(paused.output, DeferredToolRequests)
    deferring = Agent(model_calling(BIG), toolsets=[toolset],
                      output_type=[str, DeferredToolRequests])
    told = deferring.run_sync("refund T1", output_type=str)
    [said] = tool_results(told)
    assert told.output == "All done." and said.startswith("WAITING FOR APPROVAL")
    assert ledger == []


@pytest.mark.parametrize("form", ["toolset", "gate_tool"])
def test_a_duplicate_of_a_tool_return_keeps_its_metadata_from_the_model(
        gate: eg.Gate, form: str) -> None:
    """A tool returning ``ToolReturn(metadata=...)``: pydantic-ai never sends the metadata to
    the model. A duplicate answered the stored JSON of the whole ``ToolReturn`` as the tool
    result, metadata included (a card number, here, read by the model). It is rebuilt as the
    ``ToolReturn`` the function's annotation names, and answered as the first call was."""
    ledger: list[Any] = []

    def refund(txn_id: str, amount_cents: int) -> ToolReturn:
        """Refund a card transaction. Irreversible."""
        ledger.append(txn_id)
        return ToolReturn(return_value=f"refunded {txn_id}", content="receipt attached",
                          metadata={"card": "4111111111111111"})

    assert _twice(refund, form, gate) == ["refunded T1", "refunded T1"] and ledger == ["T1"]


class Order(BaseModel):
    txn_id: str
    amount_cents: int


def _aliased(ledger: list[Any]) -> Any:
    def refund(txn_id: Annotated[str, Field(alias="txnId")], amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append(txn_id)
        return f"refunded {txn_id}"

    return refund


def _one_model(ledger: list[Any]) -> Any:
    def refund(order: Order) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append(order.txn_id)
        return f"refunded {order.txn_id}"

    return refund


@pytest.mark.parametrize(("make", "key", "call", "wrong"), [
    (_aliased, "refund:{txn_id}", {"txnId": "T1", "amount_cents": 5}, "refund:{txnId}"),
    (_one_model, "refund:{order.txn_id}", {"txn_id": "T1", "amount_cents": 5},
     "refund:{txn_id}"),
])
@pytest.mark.parametrize("form", ["toolset", "gate_tool"])
def test_a_key_names_the_arguments_the_tool_receives(sqlite_gate: eg.Gate, make: Any,
                                                     key: str, call: dict[str, Any],
                                                     wrong: str, form: str) -> None:
    """An aliased parameter, or a function taking one model: the key was checked against the
    JSON schema's names (the alias, the model's fields) while the tool — and the gate — get
    the Python names (``{"order": Order(...)}``). The right template was refused up front and
    the wrong one accepted, then failed every call. Now the names the tool receives key it."""
    ledger: list[Any] = []

    def agent(template: str) -> Agent[Any, Any]:
        model = model_calling(call, call)
        if form == "toolset":
            return Agent(model, toolsets=[eg_pa.EffectGateToolset(
                FunctionToolset([make(ledger)]), {"refund": template}, gate=sqlite_gate)])
        return Agent(model, tools=[eg_pa.gate_tool(Tool(make(ledger)), template,
                                                   gate=sqlite_gate)])

    assert tool_results(agent(key).run_sync("refund T1")) == ["refunded T1"] * 2
    assert ledger == ["T1"]
    with pytest.raises(eg.EffectKeyError):
        agent(wrong).run_sync("refund T1")


@pytest.fixture
def sqlite_gate() -> Any:
    from effectgate.testing import temporary_gate

    with temporary_gate() as gate:
        yield gate


# -- review: a sync wrapper of an async tool; a ToolReturn under a loose annotation ------------


def _wrapped_async(ledger: list[Any], inside: Any) -> Any:
    @_sync_wrapper
    async def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        await inside()
        ledger.append(txn_id)
        return f"refunded {txn_id}"

    return refund


def _agent_of(tool: Any, gate: eg.Gate, form: str, **options: Any) -> Agent[Any, Any]:
    if form == "toolset":
        return Agent(model_calling(SMALL), toolsets=[eg_pa.EffectGateToolset(
            FunctionToolset([tool]), {"refund": "refund:{txn_id}"}, gate=gate)], **options)
    return Agent(model_calling(SMALL), tools=[eg_pa.gate_tool(Tool(tool), "refund:{txn_id}",
                                                              gate=gate)], **options)


@pytest.mark.parametrize("form", ["toolset", "gate_tool"])
def test_a_sync_wrapper_of_an_async_tool_holds_no_worker_while_it_runs(
        sqlite_gate: eg.Gate, form: str) -> None:
    """A sync decorator around an async tool, under a bounded executor
    (``UseThreadExecutor``), whose coroutine needs that executor (it asks a sub-agent with a
    sync tool). Ungated it runs; gated, the gate's worker thread waited for the coroutine
    while the coroutine waited for that worker: the run hung, and the refund, never made,
    was recorded AMBIGUOUS when the run was given up. pydantic-ai's own call awaits the
    coroutine now, with no thread held."""
    from concurrent.futures import ThreadPoolExecutor

    from pydantic_ai.capabilities import UseThreadExecutor

    def lookup(txn_id: str) -> str:
        """Look a transaction up."""
        return f"{txn_id} found"

    sub = Agent(model_calling({"txn_id": "T1"}, name="lookup"), tools=[lookup])

    async def ask_the_sub_agent() -> None:
        await sub.run("look T1 up")

    ledger: list[Any] = []
    executor = ThreadPoolExecutor(max_workers=1)
    agent = _agent_of(_wrapped_async(ledger, ask_the_sub_agent), sqlite_gate, form,
                      capabilities=[UseThreadExecutor(executor)])

    async def run() -> Any:
        return await asyncio.wait_for(agent.run("refund T1"), 10)

    try:
        result = asyncio.run(run())
    finally:
        executor.shutdown(wait=False)
    assert tool_results(result) == ["refunded T1"] and ledger == ["T1"]
    assert sqlite_gate.get("refund:T1").state is eg.State.COMMITTED


@pytest.mark.parametrize("form", ["toolset", "gate_tool"])
def test_a_sync_wrapper_of_an_async_tool_runs_with_threads_disabled(
        sqlite_gate: eg.Gate, form: str) -> None:
    """pydantic-ai's ``disable_threads()`` (Temporal's sandbox) runs a sync tool inline on the
    loop. The gate's one-hop path got the coroutine back there, could not await it, and
    recorded AMBIGUOUS: the refund never made, and blocked for good."""
    from pydantic_ai._utils import disable_threads

    ledger: list[Any] = []
    agent = _agent_of(_wrapped_async(ledger, lambda: asyncio.sleep(0)), sqlite_gate, form)
    with disable_threads():
        result = agent.run_sync("refund T1")
    assert tool_results(result) == ["refunded T1"] and ledger == ["T1"]
    assert sqlite_gate.get("refund:T1").state is eg.State.COMMITTED


@pytest.mark.parametrize("annotation", [Any, dict, object, "none", str])
@pytest.mark.parametrize("form", ["toolset", "gate_tool"])
def test_a_duplicate_of_a_loosely_annotated_tool_return_keeps_its_metadata_from_the_model(
        sqlite_gate: eg.Gate, annotation: Any, form: str) -> None:
    """A ``ToolReturn`` from a tool annotated ``-> Any``, ``-> dict``, ``-> object``, not at
    all, or wrongly (``-> str``): the duplicate was rebuilt as the annotation says, which
    kept the dumped ``ToolReturn`` — its metadata, a card number, in the tool result the
    model reads. A ``ToolReturn``'s JSON is rebuilt as one whatever the annotation."""
    ledger: list[Any] = []

    def refund(txn_id: str, amount_cents: int):  # type: ignore[no-untyped-def]
        """Refund a card transaction. Irreversible."""
        ledger.append(txn_id)
        return ToolReturn(return_value=f"refunded {txn_id}", content="receipt attached",
                          metadata={"card": "4111111111111111"})

    if annotation != "none":
        refund.__annotations__["return"] = annotation
    assert _twice(refund, form, sqlite_gate) == ["refunded T1", "refunded T1"] and ledger == ["T1"]


def test_an_edit_that_cannot_be_keyed_leaves_the_request_pending(make_gate: Any) -> None:
    """A call whose key is so long that an edit's ``~edit:`` key passes the key limit: an
    override was refused as invalid only after it had denied the request "replaced by an
    edit" — nothing ran, and the approval of the original was then refused too. The request
    stays pending now, and approving it runs the original once."""
    gate = make_gate(policy=eg.Policy.from_dict(POLICY))
    ledger: list[Any] = []
    long = {**BIG, "txn_id": "L" * 500}
    agent = paused_agent(gate, ledger, long)
    saved = pause(agent)
    approval_id = saved["metadata"]["call_1"]["effectgate"]["approval_id"]
    override = ToolApproved(override_args={**long, "amount_cents": 5_000})
    [said] = resume(agent, saved, override)
    assert said.startswith("INVALID ARGUMENTS") and ledger == []
    assert gate.approval(approval_id).state is eg.ApprovalState.PENDING
    assert resume(agent, saved) == [f"refunded 50000 on {long['txn_id']}"]
    assert ledger == [(long["txn_id"], 50_000)]


def _twice(refund: Callable[..., Any], form: str, gate: eg.Gate) -> list[str]:
    """Run ``refund`` gated (as ``form``) for T1 twice in one run; what the model read of
    each answer."""
    seen: list[str] = []
    turns = iter([SMALL, SMALL])

    def answer(messages: Any, info: Any) -> ModelResponse:
        seen.append(" ".join(p.model_response_str() for p in messages[-1].parts
                             if isinstance(p, ToolReturnPart)))
        args = next(turns, None)
        if args is None:
            return ModelResponse(parts=[TextPart("All done.")])
        return ModelResponse(parts=[ToolCallPart("refund", dict(args), tool_call_id="c")])

    if form == "toolset":
        agent = Agent(FunctionModel(answer), toolsets=[eg_pa.EffectGateToolset(
            FunctionToolset([refund]), {"refund": "refund:{txn_id}"}, gate=gate)])
    else:
        agent = Agent(FunctionModel(answer), tools=[eg_pa.gate_tool(
            Tool(refund), "refund:{txn_id}", gate=gate)])
    agent.run_sync("refund T1")
    return seen[1:]


@pytest.mark.parametrize("form", ["toolset", "gate_tool"])
def test_a_tools_own_dict_saying_tool_return_is_answered_as_it_was(
        sqlite_gate: eg.Gate, form: str) -> None:
    """A tool's own dict that happens to say ``"kind": "tool-return"`` (a vendor's JSON): a
    duplicate rebuilt it as a ``ToolReturn``, dropping its other keys (``order_id``). Only a
    dict with no key but a ``ToolReturn``'s is rebuilt as one."""
    ledger: list[Any] = []

    def refund(txn_id: str, amount_cents: int) -> dict:  # type: ignore[type-arg]
        """Refund a card transaction. Irreversible."""
        ledger.append(txn_id)
        return {"kind": "tool-return", "return_value": "ok", "order_id": "O1"}

    first, again = _twice(refund, form, sqlite_gate)
    assert first == again and "O1" in again and ledger == ["T1"]
