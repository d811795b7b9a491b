"""Google ADK: what a gated tool's answer means — a result only when its function ran and
answered; nothing done when it certainly did not run; unknown otherwise.

An ``AuthenticatedFunctionTool`` with no credential yet asks the user for one and answers
"Pending User Authorization." without calling the function. The gate used to store that
answer as the COMMITTED result: once the user had authorized, the same call was answered from
the store and the refund never ran, while the store said it had. Now the effect is FAILED,
ADK's own answer still reaches the model (its credential request goes out as before), and the
call made again runs once. So is a function's own ``tool_context.request_credential``.

The gate saw the function called only through ADK's own ``run_async``: a subclass whose
``run_async`` called ``self.func(...)`` itself had its executed refund recorded FAILED, and
the next identical call ran it again. Now every call of ``tool.func`` is seen, and an answer
with no call seen is FAILED only for ADK's own tool classes; a subclass's is AMBIGUOUS.

``GoogleTool`` (the base of the BigQuery, Bigtable, Spanner tools) turns any exception of its
function into ``{"status": "ERROR", ...}``: the gate recorded that COMMITTED, and every retry
was answered "done". Now it is AMBIGUOUS (the write may have happened), unless the function
said nothing happened (``NotExecuted``). Real ``InMemoryRunner`` loop, scripted model, both
backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("google.adk")

from fastapi.openapi.models import OAuth2, OAuthFlowAuthorizationCode, OAuthFlows
from google.adk.auth.auth_credential import AuthCredential, AuthCredentialTypes, OAuth2Auth
from google.adk.auth.auth_tool import AuthConfig
from google.adk.tools.authenticated_function_tool import AuthenticatedFunctionTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.google_tool import GoogleTool
from google.adk.tools.tool_context import ToolContext

import effectgate as eg
from effectgate.integrations.google_adk import gate_tool

from .adapter_drivers import adk_run

# ADK's own credential classes warn that they are experimental, and its AuthConfig calls its
# own deprecated method.
pytestmark = [pytest.mark.filterwarnings(r"ignore:\[EXPERIMENTAL\]:UserWarning"),
              pytest.mark.filterwarnings("ignore:This method is deprecated:DeprecationWarning")]

ARGS = {"txn_id": "T1", "amount_cents": 500}


def _authenticated(ledger: list[tuple[str, int]]) -> Any:
    def refund(txn_id: str, amount_cents: int, credential: Any = None) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    return AuthenticatedFunctionTool(func=refund, auth_config=_auth_config())


def _auth_config() -> AuthConfig:
    scheme = OAuth2(flows=OAuthFlows(authorizationCode=OAuthFlowAuthorizationCode(
        authorizationUrl="https://example.invalid/auth",
        tokenUrl="https://example.invalid/token", scopes={})))
    raw = AuthCredential(auth_type=AuthCredentialTypes.OAUTH2,
                         oauth2=OAuth2Auth(client_id="id", client_secret="secret"))
    return AuthConfig(auth_scheme=scheme, raw_auth_credential=raw)


def _authorize(tool: Any) -> None:
    """The user has completed the OAuth flow: the tool's credential manager now has one."""
    async def credential(_context: Any) -> AuthCredential:
        return AuthCredential(auth_type=AuthCredentialTypes.OAUTH2,
                              oauth2=OAuth2Auth(access_token="token"))

    tool._credentials_manager.get_auth_credential = credential


def _call(tool: Any, call_id: str, run_id: str) -> str:
    return asyncio.run(adk_run([tool], [[(call_id, ARGS, tool.name)]], run_id=run_id))[call_id]


@pytest.mark.parametrize("on_refusal", ["message", "raise"])
def test_a_call_that_asked_for_credentials_is_failed_and_runs_once_authorized(
        gate: eg.Gate, on_refusal: str) -> None:
    ledger: list[tuple[str, int]] = []
    tool = gate_tool(_authenticated(ledger), "refund:{txn_id}", gate=gate,
                     on_refusal=on_refusal)
    assert _call(tool, "c1", "s1") == "Pending User Authorization."  # ADK's own answer
    pending = gate.get("refund:T1")
    assert pending.state is eg.State.FAILED and pending.result is None and ledger == []
    _authorize(tool)
    assert _call(tool, "c2", "s2") == "refunded 500 on T1"
    assert _call(tool, "c3", "s3") == "refunded 500 on T1"  # from the store
    assert ledger == [("T1", 500)]
    done = gate.get("refund:T1")
    assert done.state is eg.State.COMMITTED and done.attempt == 2


def test_an_async_function_that_is_called_still_commits_once(gate: eg.Gate) -> None:
    ledger: list[tuple[str, int]] = []

    async def refund(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    tool = gate_tool(FunctionTool(func=refund), "refund:{txn_id}", gate=gate)
    assert _call(tool, "c1", "s1") == _call(tool, "c2", "s2") == "refunded 500 on T1"
    assert ledger == [("T1", 500)]
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED and record.attempt == 1


class AuditedTool(FunctionTool):
    """A subclass whose ``run_async`` calls its function itself (not through ADK's)."""

    async def run_async(self, *, args: dict[str, Any], tool_context: Any) -> Any:
        answer = self.func(**args)
        return await answer if inspect.isawaitable(answer) else answer


class Refunder:
    """A callable object as the tool's function."""

    def __init__(self, ledger: list[tuple[str, int]]) -> None:
        self.ledger = ledger

    def __call__(self, txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        self.ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"


def _refund_function(kind: str, ledger: list[tuple[str, int]]) -> Any:
    if kind == "object":
        return Refunder(ledger)
    if kind == "async":
        async def refund(txn_id: str, amount_cents: int) -> str:
            """Refund a card transaction. Irreversible."""
            ledger.append((txn_id, amount_cents))
            return f"refunded {amount_cents} on {txn_id}"

        return refund

    def refund_sync(txn_id: str, amount_cents: int) -> str:
        """Refund a card transaction. Irreversible."""
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    refund_sync.__name__ = "refund"
    return refund_sync


@pytest.mark.parametrize("kind", ["sync", "async", "object"])
def test_a_subclass_that_calls_its_function_itself_commits_once(gate: eg.Gate,
                                                                kind: str) -> None:
    ledger: list[tuple[str, int]] = []
    ungated = AuditedTool(_refund_function(kind, ledger))
    tool = gate_tool(ungated, "refund:{txn_id}", gate=gate)
    assert tool._get_declaration() == ungated._get_declaration()  # what the model is sent
    assert [_call(tool, f"c{n}", f"s{n}") for n in (1, 2, 3)] == ["refunded 500 on T1"] * 3
    assert ledger == [("T1", 500)]
    record = gate.get("refund:T1")
    assert record.state is eg.State.COMMITTED and record.attempt == 1


def test_a_subclass_answer_with_no_call_seen_is_ambiguous(gate: eg.Gate) -> None:
    """A subclass may reach the function another way: not seen called is not "not called"."""
    ledger: list[tuple[str, int]] = []
    refund = _refund_function("sync", ledger)

    class Bypassing(FunctionTool):
        async def run_async(self, *, args: dict[str, Any], tool_context: Any) -> Any:
            return refund(**args)  # the function itself, not tool.func

    tool = gate_tool(Bypassing(refund), "refund:{txn_id}", gate=gate)
    assert _call(tool, "c1", "s1").startswith("OUTCOME UNKNOWN")
    assert _call(tool, "c2", "s2").startswith("OUTCOME UNKNOWN")  # blocked: not run again
    assert ledger == [("T1", 500)]
    assert gate.get("refund:T1").state is eg.State.AMBIGUOUS


def test_a_function_that_asks_for_a_credential_is_failed_and_runs_again(
        gate: eg.Gate) -> None:
    ledger: list[tuple[str, int]] = []
    authorized: list[bool] = []

    def refund(txn_id: str, amount_cents: int, tool_context: ToolContext) -> str:
        """Refund a card transaction. Irreversible."""
        if not authorized:
            tool_context.request_credential(_auth_config())
            return "Please sign in first."
        ledger.append((txn_id, amount_cents))
        return f"refunded {amount_cents} on {txn_id}"

    tool = gate_tool(FunctionTool(refund), "refund:{txn_id}", gate=gate)
    assert _call(tool, "c1", "s1") == "Please sign in first."
    assert gate.get("refund:T1").state is eg.State.FAILED and ledger == []
    authorized.append(True)
    assert _call(tool, "c2", "s2") == _call(tool, "c3", "s3") == "refunded 500 on T1"
    assert ledger == [("T1", 500)]
    assert gate.get("refund:T1").attempt == 2


def _google_tool(ledger: list[str], failure: Callable[[], Exception] | None,
                 answers: Any = None) -> GoogleTool:
    def insert_row(table: str, row_id: str) -> Any:
        """Insert a row."""
        ledger.append(row_id)
        if failure is not None:
            raise failure()
        return answers if answers is not None else {"status": "SUCCESS"}

    return GoogleTool(func=insert_row)


def _insert(tool: Any, call_id: str, run_id: str) -> str:
    return asyncio.run(adk_run([tool], [[(call_id, {"table": "t", "row_id": "r1"},
                                          "insert_row")]], run_id=run_id))[call_id]


@pytest.mark.parametrize(("failure", "answers"), [
    (lambda: TimeoutError("read timed out after the INSERT was sent"), None),  # caught
    (None, {"status": "ERROR", "error_details": "deadline exceeded"}),  # the function did
], ids=["raised", "answered"])
def test_a_google_tool_error_answer_is_ambiguous_and_not_retried(
        gate: eg.Gate, failure: Callable[[], Exception] | None, answers: Any) -> None:
    ledger: list[str] = []
    tool = gate_tool(_google_tool(ledger, failure, answers), "insert:{table}:{row_id}",
                     gate=gate)
    assert _insert(tool, "c1", "s1").startswith("OUTCOME UNKNOWN")
    record = gate.get("insert:t:r1")
    assert record.state is eg.State.AMBIGUOUS and record.result is None
    assert _insert(tool, "c2", "s2").startswith("OUTCOME UNKNOWN")  # blocked
    assert ledger == ["r1"]


def test_a_google_tool_whose_function_did_nothing_is_failed_and_runs_again(
        gate: eg.Gate) -> None:
    ledger: list[str] = []
    tool = gate_tool(_google_tool(ledger, lambda: eg.NotExecuted("connection refused")),
                     "insert:{table}:{row_id}", gate=gate)
    assert _insert(tool, "c1", "s1").startswith("FAILED")
    assert gate.get("insert:t:r1").state is eg.State.FAILED
    assert _insert(tool, "c2", "s2").startswith("FAILED")  # attempt 2 ran
    assert ledger == ["r1", "r1"] and gate.get("insert:t:r1").attempt == 2


def test_a_google_tool_success_commits_once(gate: eg.Gate) -> None:
    ledger: list[str] = []
    tool = gate_tool(_google_tool(ledger, None), "insert:{table}:{row_id}", gate=gate)
    assert _insert(tool, "c1", "s1") == _insert(tool, "c2", "s2") == '{"status": "SUCCESS"}'
    assert ledger == ["r1"] and gate.get("insert:t:r1").state is eg.State.COMMITTED


def test_a_streaming_tool_in_live_mode_is_never_failed_and_run_again(gate: eg.Gate) -> None:
    """In live mode ADK iterates an async-generator tool after ``run_async`` returned, outside
    the gate: that is refused as unfinished work (AMBIGUOUS), never recorded FAILED while the
    stream runs anyway, again on every repeat."""
    from google.adk.agents import LlmAgent
    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.agents.live_request_queue import LiveRequestQueue
    from google.adk.flows.llm_flows.tools._live_caller import _process_function_live_helper
    from google.adk.sessions import InMemorySessionService
    from google.genai import types

    ledger: list[str] = []

    async def refund_stream(txn_id: str, amount_cents: int) -> Any:
        """Refund, streaming progress."""
        ledger.append(txn_id)
        yield f"refunded {amount_cents} on {txn_id}"

    tool = gate_tool(FunctionTool(refund_stream), "refund:{txn_id}", gate=gate)

    async def live_call(call_id: str) -> None:
        service = InMemorySessionService()
        session = await service.create_session(app_name="a", user_id="u", session_id=call_id)
        agent = LlmAgent(name="billing", model="gemini-2.0-flash", tools=[tool])
        ic = InvocationContext(session_service=service, invocation_id="inv-" + call_id,
                               agent=agent, session=session,
                               live_request_queue=LiveRequestQueue())
        call = types.FunctionCall(id=call_id, name=tool.name,
                                  args={"txn_id": "T1", "amount_cents": 500})
        with contextlib.suppress(Exception):  # how ADK answers the refusal is its business
            await _process_function_live_helper(
                tool, ToolContext(ic, function_call_id=call_id), call, dict(call.args), ic)
        for entry in list((ic._active_background_tools or {}).values()):
            with contextlib.suppress(BaseException):
                await entry.task

    for n in range(3):
        asyncio.run(live_call(f"c{n}"))
    record = gate.get("refund:T1")
    assert record.state is eg.State.AMBIGUOUS and record.attempt == 1
    assert ledger == []
