"""Approvals over MCP elicitation: URL mode to the console's approval page.

When a gated call needs a human's approval and the client declared URL-mode elicitation, the
server (``begin_effect``) or the gateway (a gated upstream tool) sends an
``elicitation/create`` in URL mode pointing at ``{console_url}/approvals/{approval_id}`` — the
console's page for that request, where a person signs in and presses Approve or Deny. The
client's answer only says whether its user agreed to open the page: **nothing the client sends
is ever taken as an approval** (a client, or the agent behind it, could approve its own
call). Form mode is never used for approvals, and any content an answer carries is ignored.
After an ``accept`` the call waits (at most ``wait_seconds``) for the store to record the
decision, sends ``notifications/elicitation/complete``, and asks the gate again: approved →
the call proceeds (once); denied → refused; still pending → the textual "waiting for
approval" answer, as without elicitation. Without a ``console_url``, without the client's URL
capability, or on a stateless session that cannot send requests, nothing is elicited and the
textual answer stays. On 2026-07-28, which has no mid-call requests, the same page is sent
inside the call's input-required result instead (:mod:`.multiround`).

A stdio client that closes the server's stdin (how it shuts down, per MCP) can answer nothing
more: once :attr:`ApprovalElicitor.input_ended` is set, no wait for the client or the decision
goes on. The call reads the approval once and answers as a client that never answered would
(nothing is begun for it), or, after an ``accept``, as the decision in the store says (the
gateway then runs an approved call itself and records it; ``mcp serve`` hands no execute lease
to a client that has left: the approval stays for its next begin).
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import anyio

import effectgate as eg

from .stdio import unless_ended

__all__ = ["ApprovalElicitor", "approval_url", "check_console_url", "supports_url_elicitation"]

_SAFE_SCHEMES = ("http", "https")


def approval_url(console_url: str, approval_id: str) -> str:
    """The console's page for one approval request (a contract with the console)."""
    return f"{console_url.rstrip('/')}/approvals/{urllib.parse.quote(approval_id, safe='')}"


def check_console_url(console_url: str | None) -> str | None:
    """``console_url`` validated (http or https, with a host, no query or fragment)."""
    if console_url is None:
        return None
    parsed = urllib.parse.urlsplit(console_url)
    if parsed.scheme not in _SAFE_SCHEMES or not parsed.netloc or parsed.query \
            or parsed.fragment:
        raise eg.ConfigError(f"console URL must be http(s)://host[:port][/path], not "
                             f"{console_url!r}")
    return console_url.rstrip("/")


def supports_url_elicitation(session: Any) -> bool:
    """True when the client declared URL-mode elicitation and the session can send it a
    request (a stateful session)."""
    if session is None or not getattr(session, "can_send_request", True):
        return False
    caps = getattr(session, "client_capabilities", None)
    elicitation = getattr(caps, "elicitation", None)
    return getattr(elicitation, "url", None) is not None


_ANSWER_GRACE = 2.0
"""Seconds a client gets to answer the elicitation once the store holds a decision (a person
who decides on the page, then clicks accept, answers a moment after the decision)."""


@dataclass(frozen=True)
class ApprovalElicitor:
    """Sends a URL-mode elicitation for an approval and waits for the store's decision."""

    gate: eg.Gate
    console_url: str
    wait_seconds: float = 300.0
    poll_seconds: float = 0.5
    input_ended: anyio.Event | None = None
    """Set when the client's input has ended (stdio: it closed the server's stdin); None where
    that cannot be known (HTTP). Once set, nothing waits for the client or the decision."""

    async def ask(self, session: Any, approval_id: str, key: str | None = None, *,
                  related_request_id: Any = None) -> bool:
        """Elicit the approval of ``approval_id``; True once the store holds a decision
        (approved or denied: ask the gate again), False when nothing was decided (not
        supported, declined, cancelled, or still pending after ``wait_seconds``). A client that
        has not answered is waited for until the decision, at most ``wait_seconds``, and then
        gets False: it may be gone (a dropped HTTP stream does not cancel the call), and an
        ``execute`` begun for a caller that never hears it would be stranded. Once
        :attr:`input_ended` is set the client answers nothing more: the wait ends at once, with
        one read of the store."""
        if not supports_url_elicitation(session) or self._ended():
            return False
        what = f"effect {key!r}" if key else "this action"
        message = (f"A person must approve {what} before it runs (approval {approval_id}). "
                   "Open the page to review exactly what would execute, and approve or deny it.")
        asked: dict[str, Any] = {}
        deadline = time.monotonic() + self.wait_seconds  # one wait, whoever answers first
        async with anyio.create_task_group() as tg:

            async def elicit() -> None:
                try:
                    asked["answer"] = await unless_ended(self.input_ended, lambda: (
                        session.elicit_url(
                            message=message, url=approval_url(self.console_url, approval_id),
                            elicitation_id=approval_id, related_request_id=related_request_id)))
                except Exception:  # the client cannot take it, or has gone: answer in text
                    asked["answer"] = None
                tg.cancel_scope.cancel()

            async def watch() -> None:  # a client that never answers holds nothing up
                try:
                    asked["decided"] = await self._wait(approval_id, deadline)
                except Exception as err:  # raised as it is, not in a group
                    asked["error"] = err
                else:  # decided first: a client still there answers at once, given a moment
                    if asked["decided"]:
                        await anyio.sleep(min(_ANSWER_GRACE, deadline - time.monotonic()))
                tg.cancel_scope.cancel()

            tg.start_soon(elicit)
            tg.start_soon(watch)
        if "error" in asked:
            raise asked["error"]
        answered = "answer" in asked  # else decided or timed out with no answer
        # "accept" only means the user agreed to open the page; any content is ignored.
        if answered and getattr(asked["answer"], "action", None) != "accept":
            return False
        decided = bool(asked["decided"]) if "decided" in asked else (
            await self._wait(approval_id, deadline))
        if decided:
            with contextlib.suppress(Exception):  # the decision is in the store either way
                await session.send_elicit_complete(approval_id,
                                                   related_request_id=related_request_id)
        return decided and answered

    async def wait_decided(self, approval_id: str) -> bool:
        """Wait (at most ``wait_seconds``) for a decision on ``approval_id`` in the store; True
        once it is approved or denied."""
        return await self._wait(approval_id, time.monotonic() + self.wait_seconds)

    def _ended(self) -> bool:
        return self.input_ended is not None and self.input_ended.is_set()

    async def _wait(self, approval_id: str, deadline: float) -> bool:
        """True once the store holds a decision; False at ``deadline`` or, after one more
        read, at the end of the client's input."""
        while True:
            record = await anyio.to_thread.run_sync(self.gate.approval, approval_id)
            if record.state is not eg.ApprovalState.PENDING:
                return True
            if time.monotonic() >= deadline or self._ended():
                return False
            if self.input_ended is None:
                await anyio.sleep(self.poll_seconds)
            else:
                with anyio.move_on_after(self.poll_seconds):
                    await self.input_ended.wait()
