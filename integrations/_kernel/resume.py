"""A paused call resumed with a human's yes or no, decided against the store first.

For frameworks whose pause carries only a confirmation (Google ADK's ``ToolConfirmation``,
Microsoft Agent Framework's function approval response): the resumed call brings the same
arguments and an answer — approved or not, who says so, and, when the framework echoed what
the pause showed, the approval id and payload hash. :func:`aresume`:

1. gates the call first: a request already decided in the store (approved or denied in the
   CLI or the console, or by an earlier resume) is executed once or refused, whatever the
   answer says; a replayed resume of a call that ran gets its stored result;
2. only while the request is still pending is the answer applied (:func:`.review.aapply`),
   and only when what it names is the store's own request for these arguments: an approval id
   or payload hash other than the pending request's is refused and changes nothing;
3. an answer is bound to the request its pause showed: one that meets a request the resumed
   call's own begin opened (the one shown expired meanwhile), or names no approval id and
   came before the run was told of this request (``Answer.told``), was not given to this
   request; it is not applied, and the call answers ``approval_required`` (the request
   waits; the adapter pauses on it again where the framework can).

The arguments the approval binds are the ones the call brings (their payload hash), so what
executes is what was approved: prevention, not attribution.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from effectgate import ConfigError
from effectgate.decide import APPROVAL_REQUESTED

from .call import GatedCall, Refused
from .review import Verdict, aapply, review_of

__all__ = ["Answer", "aresume", "claimed", "other_request"]

Run = Callable[[GatedCall, Mapping[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Answer:
    """A human's answer to a paused call: approved or not, by whom, and what it names."""

    approved: bool
    by: str
    message: str | None = None
    approval_id: str | None = None
    payload_hash: str | None = None
    told: frozenset[str] | None = None
    """For an answer that names no approval: the approval ids the run had been told of before
    the question was put (the framework's own server-side record, in its own order). It
    answers one of those requests, never one opened since."""


def claimed(payload: Any) -> tuple[str | None, str | None]:
    """(approval id, payload hash) an echoed pause payload names: ``{"effectgate":
    {"approval_id": ..., "payload_hash": ...}}``; ``None`` for what it does not name. A
    malformed one (not str ids) raises :class:`effectgate.ConfigError`."""
    inner = payload.get("effectgate") if isinstance(payload, Mapping) else None
    if not isinstance(inner, Mapping):
        return None, None
    approval_id, digest = inner.get("approval_id"), inner.get("payload_hash")
    for value in (approval_id, digest):
        if value is not None and (not isinstance(value, str) or len(value) > 128):
            raise ConfigError("a resumed call's approval id and payload hash must be the "
                              "strings its pause showed")
    return approval_id, digest


def other_request(key: str | None) -> Refused:
    return Refused.of("denied", "the answer names another approval request than this "
                      "call's; nothing was approved", key)


async def aresume(gated: GatedCall, arguments: Mapping[str, Any], answer: Answer,
                  run: Run) -> Any:
    """The answer of a paused call resumed with ``answer`` (see the module docstring).

    ``run(gated, arguments)`` gates one call and returns its answer (a result or a
    :class:`Refused`); ``approval_required`` comes back when the request is still waiting
    (a self-approval the policy forbids, say): the adapter pauses again.
    """
    out = await run(gated, arguments)
    if not (isinstance(out, Refused) and out.kind == "approval_required"):
        return out
    if getattr(out.error, "reason", None) == APPROVAL_REQUESTED:
        return out  # this resume's own begin opened the request: the answer was to another
    review = await gated.spec.gate.store.on_worker(review_of, gated, out, arguments)
    if answer.approval_id is None and review.approval_id not in (answer.told or ()):
        return out  # it names no request, and the run was not told of this one before
    if answer.approval_id is not None and answer.approval_id != review.approval_id:
        return other_request(review.key)
    verdict = Verdict("approve" if answer.approved else "reject", by=answer.by,
                      message=answer.message, payload_hash=answer.payload_hash)
    return await aapply(gated, review, verdict, arguments, run)
