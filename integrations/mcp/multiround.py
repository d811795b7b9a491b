"""Approvals over MCP 2026-07-28 multi-round-trip requests (MRTR, SEP-2322).

On 2026-07-28 a server cannot send a request mid-call. When a gated call needs a person's
approval and the client declared URL-mode elicitation, ``mcp serve`` (``begin_effect``) and the
gateway (a gated upstream tool) answer the call with an ``InputRequiredResult``: one URL-mode
elicitation to the console's approval page (``{console_url}/approvals/{approval_id}``) and a
``requestState``. The client opens the page, and retries the same call with its answer and the
state echoed. The retry is answered like this:

* the state is verified first (:meth:`RoundKeys.open`): sealed by the SDK's
  :class:`~mcp.server.request_state.RequestStateBoundary` (AES-256-GCM under the server-held
  key, bound to the tool and its arguments, with an expiry) and, inside, an effectgate claim
  signed with HMAC-SHA256 under a key derived from the same secret, naming the tool, a digest
  of its arguments, the effect key and the approval. A tampered, expired, or other-request
  state is refused with a protocol error (``-32602``) before the gate is asked: nothing is
  written.
* the reservation is the gate's own: the effect waits in PENDING_APPROVAL under that approval,
  which is bound to the payload hash, so no one else can run it in the meantime, and a changed
  payload is refused by the gate.
* ``accept`` (the user opened the page; it approves nothing) → the server waits, at most the
  approval wait, for the decision in the store, then asks the gate again: approved → the call
  runs, once; denied → refused; still pending → the textual "waiting for approval" answer.
  ``decline`` or ``cancel`` → the textual answer at once. Whatever content the client sends is
  ignored: **nothing the client answers is taken as an approval**.
* a retry after the effect ran (the same state replayed) is answered from the store (the
  duplicate and its stored result): a state is not a ticket to run again.

The secret: ``EFFECTGATE_MCP_STATE_KEY`` (at least 32 characters; every worker and restart of
one deployment shares it), else a key made when the process starts (a state is then refused
after a restart, and the client simply calls again).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

try:
    from mcp import types
    from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
    from mcp.shared.exceptions import MCPError
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.multiround needs the mcp package: '
        'pip install "effectgate[mcp]"') from err

from .elicit import approval_url

__all__ = [
    "APPROVAL_INPUT", "STATE_KEY_ENV", "ApprovalClaim", "ApprovalRounds", "AskClient", "Retry",
    "RoundKeys", "approval_round", "client_answer", "is_modern", "url_capable",
]

APPROVAL_INPUT = "effectgate_approval"
"""The ``inputRequests`` key of the approval's URL elicitation."""

STATE_KEY_ENV = "EFFECTGATE_MCP_STATE_KEY"
"""The environment variable holding the server's request-state secret."""

_CLAIM_PREFIX = "eg1."
_INVALID = "Invalid or expired requestState"


def is_modern(protocol_version: str | None) -> bool:
    """True for a 2026-07-28 (stateless) request."""
    return protocol_version in MODERN_PROTOCOL_VERSIONS


def url_capable(capabilities: types.ClientCapabilities | None) -> bool:
    """True when the client declared URL-mode elicitation on this request."""
    elicitation = getattr(capabilities, "elicitation", None)
    return getattr(elicitation, "url", None) is not None


def _digest(arguments: Any) -> str:
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise ValueError("non-canonical base64url")
    return raw


def _refuse(reason: str) -> MCPError:
    import logging

    logging.getLogger("effectgate").warning("requestState refused: %s", reason)
    return MCPError(types.INVALID_PARAMS, _INVALID, {"reason": "invalid_request_state"})


@dataclass(frozen=True)
class ApprovalClaim:
    """What an approval round's state says: the tool and a digest of its arguments, the effect
    key and the approval it waits for, and when the state expires (Unix time)."""

    tool: str
    arguments: str
    key: str
    approval_id: str
    expires: float


class RoundKeys:
    """The server-held secret for request state: the SDK's sealing policy and effectgate's own
    signed claim, both from one secret (``secret`` ≥ 32 bytes)."""

    def __init__(self, secret: bytes, *, ttl: float = 600.0, ephemeral: bool = False) -> None:
        if len(secret) < 32:
            raise ValueError("the request-state secret must be at least 32 bytes")
        self._secret = bytes(secret)
        self._mac = hmac.new(self._secret, b"effectgate/mcp/request-state/claim", "sha256").digest()
        self.ttl = ttl
        self.ephemeral = ephemeral

    @classmethod
    def from_env(cls, *, ttl: float = 600.0) -> RoundKeys:
        """The secret from ``EFFECTGATE_MCP_STATE_KEY``, else one made now for this process.
        :class:`~effectgate.ConfigError` for a secret shorter than 32 characters."""
        import effectgate as eg

        value = os.environ.get(STATE_KEY_ENV)
        if value is None or value == "":
            return cls(secrets.token_bytes(32), ttl=ttl, ephemeral=True)
        if len(value) < 32:
            raise eg.ConfigError(f"{STATE_KEY_ENV} must be at least 32 characters of secret "
                                 "randomness (python -c 'import secrets; "
                                 "print(secrets.token_hex(32))')")
        return cls(value.encode("utf-8"), ttl=ttl)

    def security(self) -> RequestStateSecurity:
        """The SDK's sealing policy under this secret (AES-256-GCM, expiry, request binding)."""
        return RequestStateSecurity(keys=[self._secret], ttl=self.ttl)

    def boundary(self, audience: str) -> RequestStateBoundary:
        """The SDK middleware that seals and verifies ``requestState`` on a low-level server."""
        return RequestStateBoundary(self.security(), default_audience=audience)

    def seal(self, *, tool: str, arguments: Any, key: str, approval_id: str) -> str:
        """A signed claim for one approval round of ``tool`` called with ``arguments``."""
        claim = {"t": tool, "a": _digest(arguments), "k": key, "ap": approval_id,
                 "exp": time.time() + self.ttl}
        body = json.dumps(claim, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        tag = hmac.new(self._mac, body, "sha256").digest()
        return _CLAIM_PREFIX + _b64(body) + "." + _b64(tag)

    def open(self, token: object, *, tool: str, arguments: Any) -> ApprovalClaim:
        """The claim in ``token``, verified: signed by this server, not expired, minted for
        this tool and these arguments. ``MCPError`` (``-32602``) otherwise."""
        if not isinstance(token, str) or not token.startswith(_CLAIM_PREFIX):
            raise _refuse("not an effectgate claim")
        body_text, _, tag_text = token[len(_CLAIM_PREFIX):].partition(".")
        try:
            body, tag = _unb64(body_text), _unb64(tag_text)
        except ValueError:
            raise _refuse("malformed") from None
        if not hmac.compare_digest(tag, hmac.new(self._mac, body, "sha256").digest()):
            raise _refuse("signature")
        try:
            raw = json.loads(body)
            claim = ApprovalClaim(str(raw["t"]), str(raw["a"]), str(raw["k"]), str(raw["ap"]),
                                  float(raw["exp"]))
        except (ValueError, KeyError, TypeError):
            raise _refuse("malformed claim") from None
        if not time.time() < claim.expires:
            raise _refuse("expired")
        if claim.tool != tool or not hmac.compare_digest(claim.arguments, _digest(arguments)):
            raise _refuse("minted for another request")
        return claim


def approval_round(keys: RoundKeys, console_url: str, *, tool: str, arguments: Any, key: str,
                   approval_id: str) -> types.InputRequiredResult:
    """The ``InputRequiredResult`` that sends the client to the console's approval page."""
    message = (f"A person must approve effect {key!r} before it runs (approval {approval_id}). "
               "Open the page to review exactly what would execute, and approve or deny it; "
               "then this call continues.")
    request = types.ElicitRequest(params=types.ElicitRequestURLParams(
        mode="url", message=message, url=approval_url(console_url, approval_id)))
    return types.InputRequiredResult(
        input_requests={APPROVAL_INPUT: request},
        request_state=keys.seal(tool=tool, arguments=arguments, key=key,
                                approval_id=approval_id))


def client_answer(input_responses: Any) -> str | None:
    """The client's action on the approval page (``accept``, ``decline``, ``cancel``), or None
    when it sent none. Only the action is read; any content is ignored."""
    if not isinstance(input_responses, dict):
        return None
    answer = input_responses.get(APPROVAL_INPUT)
    action = getattr(answer, "action", None)
    if action is None and isinstance(answer, dict):
        action = answer.get("action")
    return action if action in ("accept", "decline", "cancel") else None


class AskClient(Exception):
    """Raised inside a gated call to answer it with ``result`` (an input-required round)."""

    def __init__(self, result: types.InputRequiredResult) -> None:
        super().__init__("input required")
        self.result = result


@dataclass(frozen=True)
class Retry:
    """A retried round: its verified claim and the client's action on the page."""

    claim: ApprovalClaim
    action: str | None


class ApprovalRounds:
    """The approval rounds of one server: its keys, the console, and how long a retry waits
    for the decision (``wait``: ``approval_id -> True once decided``)."""

    def __init__(self, keys: RoundKeys, console_url: str | None, wait: Any) -> None:
        self.keys, self.console_url, self.wait = keys, console_url, wait

    def retry(self, ctx: Any, *, tool: str, arguments: Any) -> Retry | None:
        """The verified retry of a 2026-07-28 call (None on a first round or an older
        protocol); ``MCPError`` for a state this server did not mint for this call."""
        if ctx is None or not is_modern(getattr(ctx, "protocol_version", None)):
            return None
        state, responses = _round_input(ctx)
        if state is None:
            return None
        claim = self.keys.open(state, tool=tool, arguments=arguments)
        return Retry(claim, client_answer(responses))

    async def answer(self, ctx: Any, retry: Retry | None, *, tool: str, arguments: Any,
                     key: str, approval_id: str | None
                     ) -> types.InputRequiredResult | bool:
        """What to do with an ``approval_required`` on a 2026-07-28 call: an
        ``InputRequiredResult`` (send the client to the page), True (decided on the console
        meanwhile: ask the gate again) or False (answer in text)."""
        if (approval_id is None or self.console_url is None or ctx is None
                or not is_modern(getattr(ctx, "protocol_version", None))):
            return False
        if retry is not None and retry.claim.approval_id == approval_id:
            if retry.action == "accept":
                return bool(await self.wait(approval_id))
            if retry.action in ("decline", "cancel"):
                return False
        if not url_capable(_capabilities(ctx)):
            return False
        return approval_round(self.keys, self.console_url, tool=tool, arguments=arguments,
                              key=key, approval_id=approval_id)


def _round_input(ctx: Any) -> tuple[Any, Any]:
    """``(requestState, inputResponses)`` of a call: from an ``MCPServer`` context, or from a
    low-level request context's raw params (after the SDK's boundary verified the seal)."""
    state = getattr(ctx, "request_state", None)
    if state is not None:
        return state, getattr(ctx, "input_responses", None)
    params = getattr(ctx, "params", None)
    if isinstance(params, Mapping):
        return params.get("requestState"), params.get("inputResponses")
    return None, None


def _capabilities(ctx: Any) -> types.ClientCapabilities | None:
    caps = getattr(ctx, "client_capabilities", None)
    if caps is None:
        session = getattr(ctx, "session", None)
        caps = getattr(session, "client_capabilities", None)
    return caps if isinstance(caps, types.ClientCapabilities) else None
