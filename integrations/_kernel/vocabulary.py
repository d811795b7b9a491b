"""What a model is told: every text effectgate puts in front of a model, in one place.

Two voices, one meaning per decision:

* **Tool results** (:data:`TOOL_TEXTS`, :func:`model_message`): what a gated framework tool
  answers instead of a result. The model never sees the protocol; it called a tool, and is told
  what happened to that call and what to do next.
* **Protocol answers** (:data:`INSTRUCTIONS`, :data:`ERROR_HINTS`, :func:`error_hint`): what an
  agent that speaks the protocol itself (the MCP server's ``begin_effect`` / ``report_effect``)
  is told after each decision or error. The MCP server imports these.
* **Gateway answers** (:data:`GATEWAY_HINTS`, :func:`gateway_hint`, :data:`UPSTREAM_AMBIGUOUS`,
  :data:`UPSTREAM_FAILED`): what the MCP gateway tells an agent that called an upstream tool.
  That agent has only the upstream's tools, so these name no tool but "this tool".

Keys are decision values (``execute``, ``duplicate``, ``in_flight``, ``blocked``,
``approval_required``, ``denied``), recorded outcomes of a body that raised (``failed``,
``ambiguous``), ``invalid`` / ``conflict`` for calls that cannot name an effect, and error class
names. Change the wording here, never in an adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = [
    "DEFAULT_HINT",
    "ERROR_HINTS",
    "GATEWAY_HINTS",
    "INSTRUCTIONS",
    "TOOL_TEXTS",
    "UPSTREAM_AMBIGUOUS",
    "UPSTREAM_FAILED",
    "error_hint",
    "gateway_hint",
    "model_message",
    "short_error",
]

_MAX_ERROR_TEXT = 300

# -- tool results ----------------------------------------------------------------------------

TOOL_TEXTS: Mapping[str, str] = MappingProxyType({
    "in_flight": (
        "NOT DONE YET: {effect} is being carried out right now by another worker. Wait about "
        "{seconds} {unit}, then call this tool again with the same arguments to get its result. "
        "Do not change the arguments."
    ),
    "blocked": (
        "OUTCOME UNKNOWN: an earlier attempt at {effect} may or may not have taken effect "
        "({reason}). Do not call this tool again for it, and do not try another way to do the "
        "same thing. Tell the user the outcome is unknown and that an operator must check and "
        "resolve it."
    ),
    "ambiguous": (
        "OUTCOME UNKNOWN: {effect} was attempted, but the tool failed with {error}, so it may or "
        "may not have taken effect. Do not call this tool again for it, and do not try another "
        "way to do the same thing. Tell the user the outcome is unknown and that an operator "
        "must check and resolve it."
    ),
    "approval_required": (
        "WAITING FOR APPROVAL: {effect} needs a human's approval before it can run (approval id "
        "{approval}). It has not been carried out. Tell the user it is waiting for approval, with "
        "this id; once it is approved, call this tool again with the same arguments."
    ),
    "denied": (
        "DENIED: {effect} was refused ({reason}). It has not been carried out. Do not retry it; "
        "tell the user why."
    ),
    "failed": (
        "FAILED: {effect} did not take effect ({error}). Nothing happened, so you may try again."
    ),
    "conflict": (
        "CONFLICT: {effect} was already requested with different arguments; this call was not "
        "carried out. Do not retry it with these arguments; tell the user."
    ),
    "invalid": (
        "INVALID ARGUMENTS: {detail}. Nothing was carried out; correct the arguments and call "
        "the tool again."
    ),
    "stored_none": "Done earlier (its result was not stored).",
})


def short_error(exc: BaseException) -> str:
    """``Type: message``, bounded (what a model or a log line is shown of an exception)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_ERROR_TEXT else text[: _MAX_ERROR_TEXT - 1] + "…"


def model_message(kind: str, key: str | None, error: BaseException | None) -> str:
    """The tool result a model gets instead of a result: what happened, and what to do.

    ``kind`` is a key of :data:`TOOL_TEXTS`; ``error`` supplies the details (an
    :class:`effectgate.EffectRefused` carries ``retry_after_seconds``, ``reason`` and
    ``approval_id``; a body's exception is shown shortened).
    """
    seconds = getattr(error, "retry_after_seconds", None) or 1
    fields: dict[str, Any] = {
        "effect": f"effect {key!r}" if key else "this action",
        "seconds": f"{seconds:g}",
        "unit": "second" if seconds == 1 else "seconds",
        "reason": getattr(error, "reason", None)
        or ("denied" if kind == "denied" else "the outcome is unknown"),
        "approval": getattr(error, "approval_id", None),
        "error": short_error(error) if error is not None else "an error",
        "detail": (getattr(error, "message", None) or str(error)) if error is not None else "",
    }
    template = TOOL_TEXTS.get(kind, TOOL_TEXTS["invalid"])
    return template.format(**fields)


# -- protocol answers (MCP server / gateway) ---------------------------------------------------

INSTRUCTIONS: Mapping[str, str] = MappingProxyType({
    "execute": (
        "You hold this effect. Perform the action now, exactly once, then call report_effect "
        "with key, lease_token and lease_secret: committed (with the result), failed (it "
        "certainly did not happen) or ambiguous (you cannot tell)."
    ),
    "duplicate": (
        "This action already happened. Do NOT perform it again. Use `result` as the result of "
        "the action, as though you had just done it."
    ),
    "in_flight": (
        "Someone else is performing this action right now. Do NOT perform it. Wait "
        "retry_after_seconds, then call begin_effect again with the same arguments."
    ),
    "blocked": (
        "An earlier attempt may or may not have happened. Do NOT perform it and do not retry "
        "it. Tell the user that this action's outcome is unresolved (quote the key); a person "
        "must check and resolve it."
    ),
    "approval_required": (
        "A person must approve this action first. Do NOT perform it. Tell the user, quoting "
        "approval_id; once approved, call begin_effect again with the same arguments."
    ),
    "denied": (
        "Policy or a spending limit refused this action (see reason). Do NOT perform it. Tell "
        "the user why."
    ),
})

ERROR_HINTS: Mapping[str, str] = MappingProxyType({
    "EffectKeyError": "The key is unusable. Fix it and call again; nothing was recorded.",
    "PayloadMismatch": (
        "This key was already used for an action with different parameters. If it is the same "
        "action, send the same payload; if it is another action, give it its own key. Do NOT "
        "perform the action under this key."
    ),
    "StaleLease": (
        "You no longer hold this effect (the lease ran out, a person resolved it, or a newer "
        "attempt holds it); nothing was recorded. Do NOT perform the action again; call "
        "begin_effect with the same arguments to see where it stands."
    ),
    "UnknownEffect": "No such effect: check the key, lease_token and lease_secret you sent.",
    "InvalidTransition": "The effect cannot move that way; read the message and state.",
    "StoreError": (
        "The effect store could not be reached. Do NOT perform the action; try again later."
    ),
    "NotExecuted": "The action did not happen; a later attempt may run it.",
    "EffectInFlight": INSTRUCTIONS["in_flight"],
    "EffectAmbiguous": INSTRUCTIONS["blocked"],
    "ApprovalRequired": INSTRUCTIONS["approval_required"],
    "EffectDenied": INSTRUCTIONS["denied"],
})

DEFAULT_HINT = "Fix the arguments and call again; nothing was recorded."

UPSTREAM_AMBIGUOUS = (
    "The upstream tool may or may not have acted; the effect is recorded as AMBIGUOUS. Do NOT "
    "call it again with these arguments: a retry is refused until a person resolves it. Tell "
    "the user this action's outcome is unknown (quote the key)."
)
UPSTREAM_FAILED = "The action did not happen; calling the tool again may run it."


# -- gateway answers (an upstream tool called through the MCP gateway) ----------------------

GATEWAY_HINTS: Mapping[str, str] = MappingProxyType({
    "EffectKeyError": (
        "These arguments cannot name this action (see message). Fix them and call this tool "
        "again; nothing ran."
    ),
    "PayloadError": "These arguments cannot be recorded (see message). Fix them and call "
                    "this tool again; nothing ran.",
    "PayloadMismatch": (
        "This action was already requested with different arguments; this call did not run. "
        "If it is the same action, call this tool with the same arguments as before; do NOT "
        "retry it with these. Tell the user if unsure."
    ),
    "StaleLease": (
        "The gateway lost hold of this call while it ran, so its outcome was not recorded. Do "
        "NOT call this tool again for it; tell the user its outcome must be checked."
    ),
    "StoreError": "The effect store could not be reached; nothing ran. Try again later.",
    "NotExecuted": "The action did not happen; calling this tool again may run it.",
    "PolicyError": (
        "This tool is misconfigured in the gateway's policy; nothing ran. Do not call it; tell "
        "the user."
    ),
    "EffectInFlight": (
        "This action is being carried out right now; this call did not run it. Wait "
        "retry_after_seconds, then call this tool again with the same arguments to get its "
        "result."
    ),
    "EffectAmbiguous": (
        "An earlier attempt at this action may or may not have happened. Do NOT call this tool "
        "again for it, and do not try another way to do the same thing. Tell the user its "
        "outcome is unresolved (quote the key); a person must check and resolve it."
    ),
    "ApprovalRequired": (
        "A person must approve this action first; it has not run. Tell the user, quoting "
        "approval_id; once it is approved, call this tool again with the same arguments."
    ),
    "EffectDenied": (
        "Policy or a spending limit refused this action (see reason); it has not run. Do not "
        "retry it; tell the user why."
    ),
    "EffectGateError": "Nothing ran. Tell the user what the message says.",
})


def gateway_hint(error: BaseException) -> str:
    """What an agent calling an upstream tool through the gateway does after ``error``: the
    hint of its nearest class in :data:`GATEWAY_HINTS`."""
    for cls in type(error).__mro__:
        hint = GATEWAY_HINTS.get(cls.__name__)
        if hint is not None:
            return hint
    return GATEWAY_HINTS["EffectGateError"]


def error_hint(error: BaseException) -> str:
    """What to do after ``error``: the hint of its nearest class in :data:`ERROR_HINTS`."""
    for cls in type(error).__mro__:
        hint = ERROR_HINTS.get(cls.__name__)
        if hint is not None:
            return hint
    return DEFAULT_HINT
