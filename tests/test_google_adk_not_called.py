"""Google ADK: a tool whose ``run_async`` answers without calling its function has done
nothing, and the gate records it so.

An ``AuthenticatedFunctionTool`` with no credential yet asks the user for one and answers
"Pending User Authorization." without calling the function. The gate used to store that
answer as the COMMITTED result: once the user had authorized, the same call was answered from
the store and the refund never ran, while the store said it had. Now the effect is FAILED,
ADK's own answer still reaches the model (its credential request goes out as before), and the
call made again runs once. Real ``InMemoryRunner`` loop, scripted model, both backends.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("google.adk")

from fastapi.openapi.models import OAuth2, OAuthFlowAuthorizationCode, OAuthFlows
from google.adk.auth.auth_credential import AuthCredential, AuthCredentialTypes, OAuth2Auth
from google.adk.auth.auth_tool import AuthConfig
from google.adk.tools.authenticated_function_tool import AuthenticatedFunctionTool
from google.adk.tools.function_tool import FunctionTool

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

    scheme = OAuth2(flows=OAuthFlows(authorizationCode=OAuthFlowAuthorizationCode(
        authorizationUrl="https://example.invalid/auth",
        tokenUrl="https://example.invalid/token", scopes={})))
    raw = AuthCredential(auth_type=AuthCredentialTypes.OAUTH2,
                         oauth2=OAuth2Auth(client_id="id", client_secret="secret"))
    return AuthenticatedFunctionTool(func=refund, auth_config=AuthConfig(
        auth_scheme=scheme, raw_auth_credential=raw))


def _authorize(tool: Any) -> None:
    """The user has completed the OAuth flow: the tool's credential manager now has one."""
    async def credential(_context: Any) -> AuthCredential:
        return AuthCredential(auth_type=AuthCredentialTypes.OAUTH2,
                              oauth2=OAuth2Auth(access_token="token"))

    tool._credentials_manager.get_auth_credential = credential


def _call(tool: Any, call_id: str, run_id: str) -> str:
    return asyncio.run(adk_run([tool], [[(call_id, ARGS, "refund")]], run_id=run_id))[call_id]


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
