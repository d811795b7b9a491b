"""What every framework integration shares: one gated call and its translation.

The core decides everything (``EffectSpec.run`` / ``arun``); an integration only translates
between a framework's tool call and the gate:

* arguments in: validated and normalised through the tool's own schema (:func:`model_arguments`),
  so ``"500"`` and ``500`` are one effect;
* context in: the framework's run or conversation id and agent name (:func:`framework_context`);
* the answer out: :class:`GatedCall` turns every refusal, and every failed body, into a
  :class:`Refused` whose ``message`` tells the model what to do — or, with
  ``on_refusal="raise"``, raises it;
* ungated tools reported once by name (:func:`report_ungated`, :class:`UngatedToolWarning`).

``gate=None`` anywhere in the integrations means :func:`default_gate`: one process-wide
``eg.Gate()`` (``$EFFECTGATE_URL``, else ``sqlite:///.effectgate/effects.db``), created on first
use — the same store the plain ``eg.Gate()`` a user writes would open.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from effectgate import (
    BeginDecision,
    ConfigError,
    EffectAmbiguous,
    EffectKeyError,
    EffectRefused,
    EffectSpec,
    Gate,
    Outcome,
    PayloadMismatch,
    classify,
    current_effect,
    effect_context,
)

__all__ = [
    "GatedCall",
    "OnRefusal",
    "Refused",
    "UngatedToolWarning",
    "default_gate",
    "effect_specs",
    "framework_context",
    "is_stopping",
    "missing_extra",
    "model_arguments",
    "model_message",
    "report_ungated",
    "resolve_gate",
]

log = logging.getLogger("effectgate")
OnRefusal = Literal["message", "raise"]
_MAX_ERROR_TEXT = 300


class UngatedToolWarning(UserWarning):
    """A tool was wrapped with no effect declared: it gets no reservation, so a repeat of it
    runs again. Declare it (or list it as read-only) to silence this."""


def missing_extra(framework: str, extra: str, err: ImportError) -> ImportError:
    """The ImportError raised when a framework's extra is not installed."""
    return ImportError(
        f"effectgate.integrations.{framework} needs the {extra!r} extra: "
        f'pip install ".[{extra}]" in the effectgate clone ({err})'
    )


# -- the default gate ---------------------------------------------------------------------

_default: Gate | None = None
_default_lock = threading.Lock()


def default_gate() -> Gate:
    """The process-wide gate used when an integration is given ``gate=None``."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Gate()
                log.info("effectgate integrations use the default gate on %s", _default.url)
    return _default


def resolve_gate(gate: Gate | None) -> Gate:
    """``gate``, or the process-wide default."""
    if gate is None:
        return default_gate()
    if not isinstance(gate, Gate):
        raise ConfigError(f"gate must be an effectgate.Gate, not {type(gate).__name__}")
    return gate


# -- arguments and context ------------------------------------------------------------------


def model_arguments(model: Any, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``raw`` through a pydantic model class; every field by name, defaults applied.

    Values keep their validated types (a nested model stays a model, so a key template can
    say ``{order.id}``); the payload hash makes them canonical JSON.
    """
    validated = model.model_validate(dict(raw))
    return {name: getattr(validated, name) for name in type(validated).model_fields}


def framework_context(run_id: Any = None, agent_id: Any = None) -> Any:
    """An :class:`effectgate.effect_context` that fills in ``run_id`` / ``agent_id`` from the
    framework where the caller has not set them already (the caller's own context wins)."""
    outer_run, outer_agent = effect_context.current()
    run = None if outer_run is not None or run_id is None else str(run_id)
    agent = None if outer_agent is not None or agent_id is None else str(agent_id)
    if run is None and agent is None:
        return contextlib.nullcontext()
    return effect_context(run_id=run, agent_id=agent)


# -- what the model is told -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refused:
    """A gated call that did not produce a result: what to tell the model, and why.

    ``kind`` is a refusing decision (``in_flight``, ``blocked``, ``approval_required``,
    ``denied``), the recorded outcome of a body that raised (``failed``, ``ambiguous``), or
    ``invalid`` (arguments that cannot name an effect, or a key reused with other arguments).
    """

    kind: str
    message: str
    error: BaseException
    key: str | None

    def as_dict(self) -> dict[str, Any]:
        """Structured fields (for a tool result's raw output)."""
        out: dict[str, Any] = {"effectgate": self.kind, "key": self.key, "message": self.message}
        if isinstance(self.error, EffectRefused):
            out["retry_after_seconds"] = self.error.retry_after_seconds
            out["approval_id"] = self.error.approval_id
            out["reason"] = self.error.reason
        return out


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_ERROR_TEXT else text[: _MAX_ERROR_TEXT - 1] + "…"


def model_message(kind: str, key: str | None, error: BaseException) -> str:
    """The text a model gets instead of a result, saying what happened and what to do."""
    effect = f"effect {key!r}" if key else "this action"
    if kind == "in_flight":
        seconds = getattr(error, "retry_after_seconds", None) or 1
        unit = "second" if seconds == 1 else "seconds"
        return (
            f"NOT DONE YET: {effect} is being carried out right now by another worker. Wait "
            f"about {seconds:g} {unit}, then call this tool again with the same arguments to "
            "get its result. Do not change the arguments."
        )
    if kind == "blocked":
        reason = getattr(error, "reason", None) or "the outcome is unknown"
        return (
            f"OUTCOME UNKNOWN: an earlier attempt at {effect} may or may not have taken effect "
            f"({reason}). Do not call this tool again for it, and do not try another way to do "
            "the same thing. Tell the user the outcome is unknown and that an operator must "
            "check and resolve it."
        )
    if kind == "ambiguous":
        return (
            f"OUTCOME UNKNOWN: {effect} was attempted, but the tool failed with {_short(error)}, "
            "so it may or may not have taken effect. Do not call this tool again for it, and do "
            "not try another way to do the same thing. Tell the user the outcome is unknown and "
            "that an operator must check and resolve it."
        )
    if kind == "approval_required":
        approval = getattr(error, "approval_id", None)
        return (
            f"WAITING FOR APPROVAL: {effect} needs a human's approval before it can run "
            f"(approval id {approval}). It has not been carried out. Tell the user it is waiting "
            "for approval, with this id; once it is approved, call this tool again with the "
            "same arguments."
        )
    if kind == "denied":
        reason = getattr(error, "reason", None) or "denied"
        return (
            f"DENIED: {effect} was refused ({reason}). It has not been carried out. Do not "
            "retry it; tell the user why."
        )
    if kind == "failed":
        return (
            f"FAILED: {effect} did not take effect ({_short(error)}). Nothing happened, so you "
            "may try again."
        )
    if isinstance(error, PayloadMismatch):
        return (
            f"CONFLICT: {effect} was already requested with different arguments; this call "
            "was not carried out. Do not retry it with these arguments; tell the user."
        )
    detail = getattr(error, "message", None) or str(error)
    return (
        f"INVALID ARGUMENTS: {detail}. Nothing was carried out; correct the arguments and call "
        "the tool again."
    )


# -- one gated call ---------------------------------------------------------------------------


class _Attempt:
    """Set by the body wrapper: did the body start, and under which decision?"""

    __slots__ = ("decision",)

    def __init__(self) -> None:
        self.decision: BeginDecision | None = None


class GatedCall:
    """A tool's :class:`EffectSpec` plus the translation of its answers.

    ``run(arguments, body)`` returns the body's result, a duplicate's stored result, or a
    :class:`Refused` (``on_refusal="message"``); with ``on_refusal="raise"`` it raises instead:
    the refusal itself, :class:`EffectAmbiguous` for a body error recorded AMBIGUOUS (the
    original as ``__cause__``), and the original error for one recorded FAILED.
    ``raise_as`` lets a framework turn an effectgate error into its own exception type.
    """

    __slots__ = ("on_refusal", "raise_as", "spec", "tool_name")

    def __init__(self, spec: EffectSpec, tool_name: str, *, on_refusal: OnRefusal = "message",
                 raise_as: Callable[[BaseException], BaseException] | None = None) -> None:
        if on_refusal not in ("message", "raise"):
            raise ConfigError(f"on_refusal must be 'message' or 'raise', not {on_refusal!r}")
        self.spec = spec
        self.tool_name = tool_name
        self.on_refusal = on_refusal
        self.raise_as = raise_as

    def run(self, arguments: Mapping[str, Any], body: Callable[[], Any]) -> Any:
        """Gate one synchronous call."""
        attempt = _Attempt()

        def started() -> Any:
            attempt.decision = current_effect()
            return body()

        try:
            return self.spec.run(arguments, started)
        except Exception as exc:
            return self._settle(exc, attempt, arguments)

    async def arun(self, arguments: Mapping[str, Any], body: Callable[[], Awaitable[Any]]) -> Any:
        """Gate one asynchronous call."""
        attempt = _Attempt()

        async def started() -> Any:
            attempt.decision = current_effect()
            return await body()

        try:
            return await self.spec.arun(arguments, started)
        except Exception as exc:
            return self._settle(exc, attempt, arguments)

    def _settle(self, exc: Exception, attempt: _Attempt, arguments: Mapping[str, Any]) -> Refused:
        decision = attempt.decision
        if decision is None:  # refused (or broken) before the body ran
            if isinstance(exc, EffectRefused):
                kind = exc.decision or "blocked"
                return self._refuse(Refused(kind, model_message(kind, exc.key, exc), exc, exc.key))
            if isinstance(exc, (EffectKeyError, PayloadMismatch)):
                key = exc.key or self._key(arguments)
                return self._refuse(Refused("invalid", model_message("invalid", key, exc), exc,
                                            key))
            raise exc
        outcome = classify(exc, self.spec.classifiers)
        if outcome is Outcome.FAILED:
            refused = Refused("failed", model_message("failed", decision.key, exc), exc,
                              decision.key)
            if self.on_refusal == "raise":
                raise exc
            return refused
        message = model_message("ambiguous", decision.key, exc)
        if self.on_refusal == "raise":
            ambiguous = EffectAmbiguous(
                f"{decision.key!r} may or may not have happened: the body raised {_short(exc)}",
                key=decision.key, state="ambiguous", decision="execute", reason=_short(exc),
                effect_id=decision.effect_id,
            )
            raise self._convert(ambiguous) from exc
        return Refused("ambiguous", message, exc, decision.key)

    def _refuse(self, refused: Refused) -> Refused:
        if self.on_refusal == "raise":
            raise self._convert(refused.error) from None
        return refused

    def _convert(self, error: BaseException) -> BaseException:
        return self.raise_as(error) if self.raise_as is not None else error

    def _key(self, arguments: Mapping[str, Any]) -> str | None:
        try:
            return self.spec.template.render(arguments)
        except Exception:
            return None


def is_stopping(error: BaseException | None) -> bool:
    """True for an error that must stop an agent run under ``on_refusal="raise"``: a refusal,
    or a body error recorded AMBIGUOUS (raised as :class:`EffectAmbiguous`)."""
    return isinstance(error, EffectRefused)


# -- gate_tools ---------------------------------------------------------------------------------

_SPEC_OPTIONS = frozenset({
    "effect_type", "vendor", "cost_micros", "lease_seconds", "max_attempts", "group_key",
    "compensation", "redact", "store_result", "classifiers", "result_type", "on_refusal",
})


def effect_specs(effects: Any, tool_names: Sequence[str], *, gate: Gate,
                 read_only: Iterable[str] = ()) -> tuple[dict[str, tuple[str, dict[str, Any]]],
                                                         set[str], bool]:
    """Resolve ``gate_tools``' ``effects`` into ``{tool: (key template, options)}``.

    ``effects`` is a mapping of tool name to a key template, to a dict with ``key`` and
    options, or to None (declared read-only) — or an :class:`effectgate.Policy`, whose rules
    name their tools. Returns the declared effects, the read-only names and whether the
    policy asks for strict mode.
    """
    reads = set(read_only)
    declared: dict[str, tuple[str, dict[str, Any]]] = {}
    policy_strict = False
    if hasattr(effects, "tool_effects"):  # an effectgate.Policy
        policy = gate.policy
        if policy is not effects and policy != effects:
            raise ConfigError(
                "gate_tools got a Policy, but the gate was built without it: pass "
                "gate=eg.Gate(url, policy=policy) so its approvals, denials and budgets apply"
            )
        for name, rule in effects.tool_effects().items():
            declared[name] = (rule.key, rule.effect_options())
        policy_strict = bool(getattr(effects, "strict", False))
    elif isinstance(effects, Mapping):
        unknown = sorted(set(effects) - set(tool_names))
        if unknown:
            raise ConfigError(
                f"effects name tools that are not in the list: {', '.join(unknown)} "
                f"(tools: {', '.join(tool_names)})"
            )
        for name, value in effects.items():
            if value is None:
                reads.add(name)
            elif isinstance(value, str):
                declared[name] = (value, {})
            elif isinstance(value, Mapping):
                options = dict(value)
                key = options.pop("key", None)
                if not isinstance(key, str):
                    raise ConfigError(f"effects[{name!r}] needs a 'key' template (a str)")
                bad = sorted(set(options) - _SPEC_OPTIONS)
                if bad:
                    raise ConfigError(f"effects[{name!r}]: unknown options {', '.join(bad)}")
                declared[name] = (key, options)
            else:
                raise ConfigError(
                    f"effects[{name!r}] must be a key template, a dict with 'key', or None "
                    f"(read-only), not {type(value).__name__}"
                )
    else:
        raise ConfigError(
            f"effects must be a mapping of tool name to key template, or an effectgate.Policy, "
            f"not {type(effects).__name__}"
        )
    return declared, reads, policy_strict


_reported: set[tuple[str, str]] = set()
_reported_lock = threading.Lock()


def report_ungated(framework: str, names: Sequence[str], *, strict: bool) -> None:
    """Report each ungated tool once per process (a warning and a log line), or, ``strict``,
    refuse them all with :class:`ConfigError` naming them."""
    if not names:
        return
    if strict:
        raise ConfigError(
            f"strict mode: these tools have no effect declared and would run ungated: "
            f"{', '.join(names)}. Declare a key template for each, or list reads as read_only"
        )
    for name in names:
        with _reported_lock:
            if (framework, name) in _reported:
                continue
            _reported.add((framework, name))
        text = (
            f"tool {name!r} has no effect declared: it runs ungated (a repeat runs again). "
            "Declare a key template for it, or list it as read_only if it only reads"
        )
        log.warning(text, extra={"tool": name, "framework": framework, "reason": "ungated"})
        warnings.warn(text, UngatedToolWarning, stacklevel=3)
