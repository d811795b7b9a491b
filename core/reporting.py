"""The report machinery behind :meth:`Gate.report <effectgate.Gate.report>` and
:meth:`Gate.extend_lease <effectgate.Gate.extend_lease>`: the proof of holding checked, the
report's fields validated (nothing is written when that raises; the common report, the
decorator's COMMITTED with its result, has no fields but those two), the store's answer turned
into a repeat (nothing to do), a :class:`~effectgate.StaleLease` that says why, or the
notices of what was recorded (an overspend, a late report, a memo of the committed result).

:class:`Reporter` is built by the gate for its namespace; the sync and async paths share
every step but the store call. :func:`observe_decision` logs (and counts) each ``begin``'s
decision.
"""

from __future__ import annotations

import datetime
import logging
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from . import decide, validate
from ._payload_steps import aresult_json, is_small
from .classify import Classifier, judge_body
from .errors import (
    ConfigError,
    EffectGateError,
    InvalidTransition,
    OverspendWarning,
    StaleLease,
    StoreError,
    UnknownEffect,
)
from .keys import lookup_key
from .notices import reported
from .payload import result_json
from .records import BeginDecision
from .redact import bound, redact_fields
from .request import Lease, secret_hash
from .states import Decision, Outcome, State

if TYPE_CHECKING:
    from .flow import BeginFlow
    from .policy import Policy
    from .store import Store
    from .store.rows import Recorded
    from .telemetry import Telemetry

__all__ = ["INFERRED_FAILED", "Overspend", "Reporter", "failure_outcome", "kept",
           "observe_decision"]

log = logging.getLogger("effectgate")
_COMMITTED = Outcome.COMMITTED
_new_lease = tuple.__new__


class _Inferred(str):
    """``"failed"`` as an exception classifier inferred it (:data:`INFERRED_FAILED`)."""

    __slots__ = ()


INFERRED_FAILED: str = _Inferred(Outcome.FAILED.value)
"""The outcome the decorator reports for a FAILED that a built-in exception classifier inferred
from a connection error (:func:`~effectgate.classify.judge_body`), told apart by identity:
FAILED, but the next attempt keeps the vendor key. A FAILED proved by the body
(``NotExecuted``), answered by the caller's own classifier or reported by the holder itself
moves it; the vendor never saw the request a built-in judged, or, when the built-in is wrong
(the body sent another request first), it deduplicates the retry."""
T = TypeVar("T")


def failure_outcome(exc: BaseException, classifiers: Iterable[Classifier],
                    keyed: bool) -> Outcome | str:
    """What a gate reports for a body (or an undo) that raised ``exc``: AMBIGUOUS, FAILED the
    body proved (``NotExecuted``: a new vendor key), or :data:`INFERRED_FAILED`, only for an
    effect with a vendor key (``keyed``: :func:`~effectgate.classify.judge_body`)."""
    outcome, proved = judge_body(exc, classifiers, keyed=keyed)
    return INFERRED_FAILED if outcome is Outcome.FAILED and not proved else outcome


def kept(policy: Policy | None, effect_type: str | None, result: Any) -> Any:
    """What ``policy`` lets the store keep of a reported result: nothing under
    ``store_result = false``, the ``redact_result`` fields replaced — whoever reports (the
    decorator, a wrapper, a protocol caller, an agent over MCP)."""
    rule = None if effect_type is None or policy is None else policy.rule_for(effect_type)
    if rule is None:
        return result
    if not rule.store_result:
        return None
    return redact_fields(result, rule.redact_result) if rule.redact_result else result


def observe_decision(d: BeginDecision, telemetry: Telemetry | None) -> None:
    """Log a ``begin``'s decision (a refusal at INFO, an execute at DEBUG) and count it."""
    decision = d.decision
    if decision is not _EXECUTE:
        if log.isEnabledFor(_INFO):
            log.info("refused %s: %s (%s)", d.key, decision.value, d.reason or d.state.value,
                     extra=_extra(d))
    elif log.isEnabledFor(_DEBUG):
        log.debug("begin %s: execute", d.key, extra=_extra(d))
    if telemetry is not None:
        telemetry.decision(decision, d.effect_type)


_EXECUTE, _INFO, _DEBUG = Decision.EXECUTE, logging.INFO, logging.DEBUG


def _extra(d: BeginDecision) -> dict[str, Any]:
    return {"key": d.key, "decision": d.decision.value, "reason": d.reason,
            "effect_id": d.effect_id}


def has_result_rules(policy: Policy | None) -> bool:
    """Whether ``policy`` keeps any effect type's result out of the store, or part of it."""
    return policy is not None and any(
        not rule.store_result or rule.redact_result for rule in policy.effects.values())


class Reporter:
    """Reports and heartbeats of one gate's namespace."""

    def __init__(self, namespace: str, store: Store, flow: BeginFlow, policy: Policy | None,
                 redact: Callable[[str | None], str | None],
                 telemetry: Telemetry | None) -> None:
        self.namespace, self.store, self.flow, self.policy = namespace, store, flow, policy
        self.redact, self.telemetry = redact, telemetry
        self.result_rules = has_result_rules(policy)

    def holder(self, held: BeginDecision | Lease) -> tuple[Lease, bool | None]:
        """The proof of holding, and whether its attempt is known to charge nothing."""
        if isinstance(held, BeginDecision):
            lease = held.lease
            if held.decision is not Decision.EXECUTE or lease is None:
                raise InvalidTransition(
                    f"only an 'execute' decision holds the effect; this one is "
                    f"{held.decision.value!r}",
                    key=held.key, decision=held.decision.value,
                )
            if held.namespace != self.namespace:
                raise InvalidTransition(
                    f"this decision holds {held.key!r} in namespace {held.namespace!r}, not "
                    f"{self.namespace!r}", key=held.key)
            return lease, (False if not held.spends else None)
        if isinstance(held, Lease):
            key = lookup_key(held.key)
            token = validate.whole(held.token, "lease token", minimum=0)
            secret = validate.text(held.secret, "lease secret", 128, required=True) or ""
            return Lease(key, token, secret), None
        raise ConfigError("report and extend_lease take the BeginDecision (or an eg.Lease: key, "
                          f"token and secret), not {type(held).__name__}")

    # -- report ------------------------------------------------------------------------------

    def report(self, held: BeginDecision | Lease, outcome: Outcome | str, result: Any,
               error: str | None, actual_cost_micros: int | None) -> None:
        """Record ``outcome`` for the holder ``held`` (see :meth:`Gate.report`)."""
        if result is not None and self.result_rules:
            result = kept(self.policy, self._effect_type_of(held), result)
        lease, parsed, text, reason, fields = self.written(held, outcome, result, error,
                                                           actual_cost_micros)
        try:
            done = _record(self.store.record_outcome, self.namespace, lease, parsed, text,
                           fields)
        except StoreError as err:  # the connection broke (idle through a long body, say):
            if not err.outcome_unknown:  # once more on a new one; one that landed is
                raise  # found done (already)
            done = _record(self.store.record_outcome, self.namespace, lease, parsed, text,
                           fields)
        if done is None:
            if self.already(lease, parsed, text):
                return  # a repeat of a report that landed (its reply was lost): nothing to do
            raise self.stale(lease, f"report {parsed.value}")
        news = parsed is Outcome.AMBIGUOUS and self.flow.observe is not None and (
            not done.late or self.unmarked(lease))
        self.reported(held, lease, parsed, text, done, reason, news)

    async def areport(self, held: BeginDecision | Lease, outcome: Outcome | str, result: Any,
                      error: str | None, actual_cost_micros: int | None) -> None:
        """:meth:`report`, the store awaited (natively on Postgres)."""
        if result is not None and self.result_rules:
            if isinstance(held, Lease):
                row = await self.flow.astore.fetch(self.namespace, lookup_key(held.key))
                effect_type = None if row is None else row.effect_type
            else:
                effect_type = held.effect_type
            result = kept(self.policy, effect_type, result)
        encode: Callable[[Any], str | None] = result_json
        if result is not None and not is_small(result):
            self.holder(held)  # its errors and the outcome's first, as :meth:`written` has them
            if validate.parse_outcome(outcome) is _COMMITTED:
                encode = _encoded(await aresult_json(result))
        lease, parsed, text, reason, fields = self.written(held, outcome, result, error,
                                                           actual_cost_micros, encode)
        try:
            done = await _record(self.flow.astore.record_outcome, self.namespace, lease,
                                 parsed, text, fields)
        except StoreError as err:  # as in :meth:`report`: once more on a new connection
            if not err.outcome_unknown:
                raise
            done = await _record(self.flow.astore.record_outcome, self.namespace, lease,
                                 parsed, text, fields)
        if done is None:
            if await self.store.on_worker(self.already, lease, parsed, text):
                return
            raise await self.store.on_worker(self.stale, lease, f"report {parsed.value}")
        news = parsed is Outcome.AMBIGUOUS and self.flow.observe is not None and (
            not done.late or await self.store.on_worker(self.unmarked, lease))
        self.reported(held, lease, parsed, text, done, reason, news)

    def _effect_type_of(self, held: BeginDecision | Lease) -> str | None:
        if isinstance(held, Lease):
            row = self.store.fetch(self.namespace, lookup_key(held.key))
            return None if row is None else row.effect_type
        return held.effect_type if isinstance(held, BeginDecision) else None

    def written(self, held: BeginDecision | Lease, outcome: Outcome | str, result: Any,
                error: str | None, actual_cost_micros: int | None,
                encode: Callable[[Any], str | None] = result_json,
                ) -> tuple[Lease, Outcome, str | None, str | None, dict[str, Any] | None]:
        """What a report writes: the proof, the outcome, the stored JSON (``encode`` of the
        result), the reason, and the rest of :meth:`fields` — None for the common report, the
        decorator's (a COMMITTED outcome, the member itself, with nothing but its result, by an
        ``execute`` decision charged to no ceiling), whose fields are only those: none are
        built for it."""
        if outcome is _COMMITTED and error is None and actual_cost_micros is None and (
                type(held) is BeginDecision and not held.spends):
            # :meth:`holder`'s checks of an ``execute`` decision, inline (every executed
            # effect reports so); one that fails them goes on to :meth:`fields` (its error).
            secret = held.lease_secret
            if held.decision is _EXECUTE and secret is not None and (
                    held.namespace == self.namespace):
                return (_new_lease(Lease, (held.key, held.lease_token, secret)), _COMMITTED,
                        encode(result), None, None)
        lease, parsed, fields = self.fields(held, outcome, result, error, actual_cost_micros,
                                            encode)
        return lease, parsed, fields["result"], fields["reason"], fields

    def fields(self, held: BeginDecision | Lease, outcome: Outcome | str, result: Any,
               error: str | None, actual_cost_micros: int | None,
               encode: Callable[[Any], str | None] = result_json,
               ) -> tuple[Lease, Outcome, dict[str, Any]]:
        """Everything a report writes, validated (nothing is written when this raises);
        ``encode`` makes the stored JSON of a COMMITTED result."""
        lease, spends = self.holder(held)
        parsed = validate.parse_outcome(outcome)
        text = encode(result) if parsed is Outcome.COMMITTED else None
        if error is not None and not isinstance(error, str):
            raise ConfigError("error must be a str")
        error = self.redact(error)
        cost = None if actual_cost_micros is None else validate.micros(
            actual_cost_micros, "actual_cost_micros")
        if spends is None and isinstance(held, BeginDecision) and not decide.outcome_spend_delta(
                parsed, held.estimated_cost_micros, cost):
            spends = False  # the counters stay as charged: one statement, no transaction
        ambiguous = parsed is Outcome.AMBIGUOUS
        fields: dict[str, Any] = {
            "result": text, "error": error,
            "reason": (error or "reported ambiguous") if ambiguous else None,
            "note": bound(error, 200) if ambiguous and error else None,
            "actual_cost_micros": cost, "spends": spends,
            "keeps_vendor_key": outcome is INFERRED_FAILED,
        }
        if cost is not None and spends is not False and self.policy is not None and (
                parsed is Outcome.COMMITTED):
            fields["overspend"] = Overspend(self.policy, cost, held)
        return lease, parsed, fields

    def reported(self, held: BeginDecision | Lease, lease: Lease, parsed: Outcome,
                 text: str | None, done: Recorded, reason: str | None, news: bool) -> None:
        """Tell of what a report recorded: an overspend (logged and warned), a late report,
        telemetry, an AMBIGUOUS notice when ``news`` (this report moved the effect into
        AMBIGUOUS); a committed result is remembered."""
        if done.overspent is not None:
            log.warning("%s: %s", lease.key, done.overspent,
                        extra={"key": lease.key, "state": parsed.value,
                               "reason": done.overspent})
            warnings.warn(f"{lease.key!r}: {done.overspent}", OverspendWarning, stacklevel=3)
        if done.late:
            log.warning("late report settled %s: %s", lease.key, parsed.value,
                        extra={"key": lease.key, "state": parsed.value,
                               "reason": "late report"})
        if self.telemetry is not None:
            self.telemetry.outcome(parsed)
        if news and self.flow.observe is not None:
            self.flow.observe(reported(held, lease.key, self.namespace, self.store, reason))
        if parsed is Outcome.COMMITTED and isinstance(held, BeginDecision):
            self.flow.remember(held.key, held.payload_hash, held.effect_type, held.effect_id,
                               held.attempt, held.lease_token, text)

    def unmarked(self, lease: Lease) -> bool:
        """Whether the late report ``lease`` just recorded is what moved the effect into
        AMBIGUOUS: its lapse was not marked before (a ``begin`` or a sweeper that marks a lapse
        announces it, in whichever process). Read from the history line the report wrote;
        True when that cannot be read (people hear of it twice rather than never)."""
        from .store.lines import parse

        try:
            row = self.store.get(self.namespace, lease.key)
        except EffectGateError:
            return True
        mine = [line for line in parse(None if row is None else row.history)
                if line.token == lease.token and line.by is None
                and (line.note or "").startswith("late report")]
        return not mine or mine[-1].from_state != State.AMBIGUOUS.value

    def already(self, lease: Lease, outcome: Outcome, text: str | None) -> bool:
        """True when this holder already recorded exactly this outcome."""
        row = self.store.get(self.namespace, lease.key)
        return bool(
            row is not None and row.token == lease.token
            and row.lease_secret == secret_hash(lease.secret)
            and row.state.value == outcome.value and row.actor is None
            and (outcome is not Outcome.COMMITTED or row.result == text)
        )

    def stale(self, lease: Lease, what: str) -> EffectGateError:
        """The error for a holder that no longer holds (logged), saying why."""
        row = self.store.get(self.namespace, lease.key)
        if row is None:
            return UnknownEffect(f"no effect with key {lease.key!r}", key=lease.key)
        state = decide.effective_state(row).value
        if row.token != lease.token:
            why = f"token {lease.token} is stale: a newer holder has token {row.token}"
        elif row.lease_secret != secret_hash(lease.secret):
            why = "the lease secret does not match"
        elif row.state is State.IN_FLIGHT:
            why = "the lease lapsed before this call"
        else:
            why = f"the effect is already {state}"
        log.warning("refused %s on %s: %s", what, row.key, why,
                    extra={"key": row.key, "state": state, "reason": why})
        return StaleLease(f"cannot {what} on {row.key!r}: {why}", key=row.key, state=state,
                          reason=why, effect_id=row.id)

    # -- extend ------------------------------------------------------------------------------

    def extend(self, held: BeginDecision | Lease, span: float,
               vendor_ref: str | None = None) -> datetime.datetime:
        """The lease of ``held`` now ends ``span`` seconds from now (store clock)."""
        lease, _ = self.holder(held)
        expiry = self.store.extend(self.namespace, lease, span, vendor_ref)
        if expiry is None:
            raise self.stale(lease, "extend the lease")
        return datetime.datetime.fromtimestamp(expiry, datetime.UTC)

    async def aextend(self, held: BeginDecision | Lease, span: float,
                      vendor_ref: str | None = None) -> datetime.datetime:
        """:meth:`extend`, the store awaited."""
        lease, _ = self.holder(held)
        expiry = await self.flow.astore.extend(self.namespace, lease, span, vendor_ref)
        if expiry is None:
            raise await self.store.on_worker(self.stale, lease, "extend the lease")
        return datetime.datetime.fromtimestamp(expiry, datetime.UTC)


def _encoded(text: str | None) -> Callable[[Any], str | None]:
    """An ``encode`` for :meth:`Reporter.written` whose JSON is already made: ``text``."""
    def encode(_result: Any) -> str | None:
        return text

    return encode


def _record(record: Callable[..., T], namespace: str, lease: Lease, outcome: Outcome,
            text: str | None, fields: dict[str, Any] | None) -> T:
    """``record`` (a store's ``record_outcome``, sync or async) called with what
    :meth:`Reporter.written` made: the common report's text and nothing else, or the
    fields."""
    if fields is None:
        return record(namespace, lease, outcome, result=text, error=None, reason=None,
                      note=None, actual_cost_micros=None, spends=False)
    return record(namespace, lease, outcome, **fields)


class Overspend:
    """Asked by the store after an actual cost above the estimate raised spend counters: the
    text recorded (and warned) when one of them is now past its ceiling, else None."""

    __slots__ = ("_actual", "_held", "_policy")

    def __init__(self, policy: Policy, actual: int, held: BeginDecision | Lease) -> None:
        self._policy, self._actual, self._held = policy, actual, held

    def __call__(self, spent: list[tuple[str, int]]) -> str | None:
        from .governance import dollars

        ceilings = [(pattern, scope, limit)
                    for pattern, rule in self._policy.effects.items() if rule.budget
                    for scope, limit in rule.budget.ceilings()]
        if self._policy.budget is not None:
            ceilings += [("*", scope, limit) for scope, limit in self._policy.budget.ceilings()]
        over = []
        for scope_key, total in spent:
            for pattern, scope, limit in ceilings:
                if scope_key.startswith(f"{pattern}|{scope}|") and total > limit:
                    over.append(f"the {scope} ceiling of {dollars(limit)} on {pattern} is at "
                                f"{dollars(total)}")
                    break
        if not over:
            return None
        estimate = getattr(self._held, "estimated_cost_micros", None)
        than = f" (estimated {dollars(estimate)})" if estimate is not None else ""
        return bound(f"overspent: the actual cost {dollars(self._actual)}{than} was spent, and "
                     + "; ".join(over), 1000)
