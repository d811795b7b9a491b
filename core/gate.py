"""The gate: ``begin`` reserves an effect key in one atomic write, ``report`` records what
happened, and a repeat of the same consequence is answered from the store.

:class:`Gate` is a facade. It validates (``validate``, ``keys``, ``payload``), asks the pure
state machine (:mod:`effectgate.decide`) for the next step, performs it against the store
(:mod:`effectgate.store`), and turns rows into answers (:mod:`effectgate.records`). The
decide ↔ store loop is written twice, small: once for sync callers and once for async ones
(the ``a``-prefixed twins), which await each store call off the event loop and await an
``async def`` reconcile hook on the caller's own loop.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging
import os
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from . import decide, sagas, validate
from .discovery import find_policy
from .errors import (
    ConfigError,
    EffectGateError,
    InvalidTransition,
    StaleLease,
    StoreError,
    UnknownEffect,
)
from .flow import BeginFlow
from .keys import check_key
from .memo import CommittedMemo
from .notices import reported
from .payload import result_json
from .reconcile import Reconciled, Reconciler
from .records import ApprovalRecord, BeginDecision, EffectRecord
from .redact import TextRedactor, bound, redact_fields, redact_text
from .registry import Registry
from .request import Lease, Request
from .request_builder import EffectKind, build_request, effect_kind
from .sagas import Compensator, UnwindReport
from .states import ApprovalState, Decision, Outcome, State
from .store import Durability, Store
from .store.connections import DEFAULT_ASYNC_POOL_SIZE
from .store.rows import EffectHead, EffectRow, Recorded
from .store.schema import policy_meta_name
from .telemetry import Telemetry, telemetry
from .translate import approval_record, effect_record, vendor_key_of

if TYPE_CHECKING:
    from .policy import Policy
    from .principals import Acting, Principal
    from .webhooks import Webhooks

__all__ = ["EffectKind", "Gate", "Reconciled", "Reconciler"]

log = logging.getLogger("effectgate")
T = TypeVar("T")
_GATES: weakref.WeakSet[Gate] = weakref.WeakSet()  # whose memos a prune clears
_MAX_STEPS = 16
_REDACTED = "[redacted]"


class Gate:
    """Reserve each effect key before its action runs; answer repeats from the store.

    ``url``: a SQLAlchemy URL (``sqlite:///path.db`` or ``postgresql+psycopg://...``); default
    ``$EFFECTGATE_URL``, else ``sqlite:///.effectgate/effects.db``. Keys are unique per
    ``namespace``. ``policy``: an :class:`~effectgate.Policy`, a path or a mapping; by default
    ``$EFFECTGATE_POLICY``, else ``effectgate.toml`` or ``[tool.effectgate]`` found walking up
    from the working directory (``policy=False``: none). The path in force is logged and is
    :attr:`policy_source`.

    ``durability`` (SQLite): ``"reserve"`` syncs every reservation to disk and lets outcomes
    ride on the next sync (default); ``"all"`` syncs outcomes too; ``"relaxed"`` syncs nothing
    (an explicit opt-in: a power cut may forget a reservation). ``memo_size`` COMMITTED keys
    are remembered in this process (COMMITTED is terminal), so a repeat costs no round trip; 0
    turns that off. ``read_only=True`` opens an existing store for reading only: it creates and
    migrates nothing (:class:`StoreError` when there is no effectgate store at ``url``) and
    every write is refused by the database. ``text_redactor`` rewrites every error, reason and
    note before it is stored or logged (default: :func:`effectgate.redact.redact_text`).
    ``webhooks``: an :class:`effectgate.webhooks.Webhooks` told of approval requests,
    AMBIGUOUS effects and budget warnings (signed POSTs from a background thread; a ``begin``
    never waits on them); by default built from ``$EFFECTGATE_WEBHOOK_URL`` and
    ``$EFFECTGATE_WEBHOOK_SECRET`` when set (``False``: none). ``telemetry``: OpenTelemetry
    spans, counters and gauges (:mod:`effectgate.telemetry`; by default on the global
    providers when OpenTelemetry is installed; ``False``: off). ``async_pool_size``
    (Postgres): the most connections one event loop's async calls hold open at once
    (default 10); further calls wait in line for one, never blocking the loop.
    """

    def __init__(
        self,
        url: str | None = None,
        policy: Policy | str | os.PathLike[str] | Mapping[str, Any] | bool | None = None,
        *,
        namespace: str = "default",
        durability: Durability = "reserve",
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        classifiers: tuple[Callable[[BaseException], Outcome | None], ...] = (),
        memo_size: int = 4096,
        read_only: bool = False,
        text_redactor: TextRedactor | None = None,
        webhooks: Webhooks | bool | None = None,
        telemetry: Telemetry | bool | None = None,
        async_pool_size: int = DEFAULT_ASYNC_POOL_SIZE,
    ) -> None:
        self.namespace = validate.text(namespace, "namespace", 128, required=True) or "default"
        self.lease_seconds = validate.seconds(lease_seconds, "lease_seconds")
        self.max_attempts = validate.whole(max_attempts, "max_attempts", minimum=1)
        self.classifiers = tuple(classifiers)
        if text_redactor is not None and not callable(text_redactor):
            raise ConfigError("text_redactor must be a function of a str")
        self._text_redactor = text_redactor
        self.policy, self.policy_source = _load_policy(policy)
        self._result_rules = self.policy is not None and any(
            not rule.store_result or rule.redact_result for rule in self.policy.effects.values())
        if self.policy_source is not None:
            log.info("policy in force: %s", self.policy_source,
                     extra={"reason": f"policy {self.policy_source}"})
        self._store = Store(url, durability=durability, read_only=read_only,
                            async_pool_size=async_pool_size)
        self._note_policy()
        self._memo = CommittedMemo(memo_size)
        _GATES.add(self)
        self._reconcilers: Registry[Reconciler] = Registry()
        self._compensators: Registry[Compensator] = Registry()
        self._webhooks = _webhooks(webhooks)
        self._flow = BeginFlow(self._store, self._memo, self._reconcilers, self._redact,
                               None if self._webhooks is None else self._webhooks.notify,
                               self._kept)
        self._telemetry = _telemetry(telemetry)
        if self._telemetry is not None:
            self._telemetry.watch(self)

    def in_namespace(self, namespace: str) -> Gate:
        """A gate like this one — same store and connections, policy, options, reconcile
        hooks and compensators — in another ``namespace``, with its own memo. Closing either
        closes the shared store."""
        other = object.__new__(Gate)
        other.__dict__.update(self.__dict__)
        other.namespace = validate.text(namespace, "namespace", 128, required=True) or ""
        other._memo = CommittedMemo(self._memo.size)
        _GATES.add(other)
        other._reconcilers = self._reconcilers.copy()
        other._compensators = self._compensators.copy()
        other._flow = BeginFlow(other._store, other._memo, other._reconcilers, other._redact,
                                self._flow.observe, other._kept)
        return other

    # -- properties ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store's URL."""
        return self._store.url

    @property
    def store(self) -> Store:
        """The underlying store (for tools and tests)."""
        return self._store

    def __repr__(self) -> str:
        return f"Gate({self._store.dialect_name}, namespace={self.namespace!r})"

    def close(self) -> None:
        """Close the store's pooled connections."""
        if self._telemetry is not None:
            self._telemetry.forget(self)
        self._store.close()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _note_policy(self) -> None:
        """Compare the policy in force with the one last recorded for this namespace in the
        store: a difference is logged as a warning (a gate started elsewhere, or with no
        policy file, must not run with other approvals and ceilings unnoticed); a policy in
        force is then recorded (no policy never replaces the record)."""
        name = policy_meta_name(self.namespace)
        digest = policy_digest(self.policy)
        raw = self._store.meta.get(name)
        recorded: dict[str, Any] = {}
        if raw is not None:
            try:
                loaded = json.loads(raw)
                recorded = loaded if isinstance(loaded, dict) else {}
            except ValueError:
                recorded = {}
        if recorded.get("digest") == digest or (raw is None and self.policy is None):
            return
        if raw is not None:
            was = recorded.get("source") or "no policy"
            now = self.policy_source or "no policy"
            message = (f"namespace {self.namespace!r} runs with a policy that differs from the "
                       f"one last recorded for it in the store (then: {was}; now: {now}): "
                       "approvals, denials and ceilings may not be what its other gates apply")
            log.warning("%s", bound(message, 600),
                        extra={"reason": "policy differs from the one last recorded"})
        if self.policy is not None and not self._store.read_only:
            # Only a policy is recorded: an operator's CLI (no policy file where it runs) or a
            # gate started elsewhere warns, but does not replace what the application runs.
            self._store.put_meta(name, json.dumps(
                {"digest": digest, "source": self.policy_source, "namespace": self.namespace},
                sort_keys=True))

    def _redact(self, text: str | None) -> str | None:
        if text is None:
            return None
        if self._text_redactor is not None:
            try:
                mine = self._text_redactor(text)
            except Exception as err:  # never store what the user's redactor did not see
                mine = f"[redacted: the text_redactor raised {type(err).__name__}]"
            if not isinstance(mine, str):
                mine = "[redacted: the text_redactor did not return a str]"
            text = mine
        return redact_text(text)

    # -- requests ----------------------------------------------------------------------------

    def kind(self, effect_type: str, *, vendor: str | None = None,
             lease_seconds: float | None = None, max_attempts: int | None = None,
             reconcile_grace_seconds: float | None = None) -> EffectKind:
        """Validate the per-type options once, with the policy's defaults applied.

        A decorator or tool wrapper prepares its kind when it is declared, so each call only
        renders its key and hashes its payload (:meth:`request`)."""
        return effect_kind(self.policy, self.lease_seconds, self.max_attempts, effect_type,
                           vendor=vendor, lease_seconds=lease_seconds,
                           max_attempts=max_attempts,
                           reconcile_grace_seconds=reconcile_grace_seconds)

    def request(
        self,
        *,
        effect_type: str | EffectKind,
        key: str,
        payload: Mapping[str, Any],
        run_id: str | None = None,
        agent_id: str | None = None,
        group_key: str | None = None,
        compensation: Any = None,
        compensates_effect_id: int | None = None,
        lease_seconds: float | None = None,
        estimated_cost_micros: int | None = None,
        vendor: str | None = None,
        max_attempts: int | None = None,
    ) -> Request:
        """Validate a ``begin`` without touching the store (every error is raised here)."""
        kind = effect_type if isinstance(effect_type, EffectKind) else self.kind(
            effect_type, vendor=vendor, lease_seconds=lease_seconds, max_attempts=max_attempts
        )
        return self._checked_request(
            kind, check_key(key), payload, run_id=run_id, agent_id=agent_id,
            group_key=group_key, compensation=compensation,
            compensates_effect_id=compensates_effect_id,
            estimated_cost_micros=estimated_cost_micros)

    def _checked_request(
        self, kind: EffectKind, key: str, payload: Mapping[str, Any], *,
        run_id: str | None = None, agent_id: str | None = None, group_key: str | None = None,
        compensation: Any = None, compensates_effect_id: int | None = None,
        estimated_cost_micros: int | None = None,
    ) -> Request:
        """:meth:`request` for a ``key`` already checked (a key template renders checked
        keys) and a ``kind`` from :meth:`kind`: the decorator's path, without the second
        check."""
        return build_request(
            self.namespace, self.policy, kind, key, payload, run_id=run_id, agent_id=agent_id,
            group_key=group_key, compensation=compensation,
            compensates_effect_id=compensates_effect_id,
            estimated_cost_micros=estimated_cost_micros)

    # -- begin -------------------------------------------------------------------------------

    def begin(self, request: Request | None = None, /, **fields: Any) -> BeginDecision:
        """Propose an effect; obey the decision: only ``execute`` runs the action.

        Pass a :class:`~effectgate.request.Request` from :meth:`request`, or its keyword
        arguments: ``effect_type``, ``key``, ``payload`` (the action's parameters; only their
        hash is stored), and optionally ``run_id``, ``agent_id``, ``group_key``,
        ``compensation``, ``compensates_effect_id``, ``lease_seconds``,
        ``estimated_cost_micros``, ``vendor``, ``max_attempts``.
        """
        req = self._as_request(request, fields)
        if self._telemetry is not None and (tracer := self._telemetry.tracer()) is not None:
            return self._telemetry.begin(tracer, self._begin, req)
        return self._begin(req)

    def _begin(self, req: Request) -> BeginDecision:
        answer = self._flow.from_memo(req)
        if answer is None:
            answer = self._flow.begin(req)
        self._observe(answer)
        return answer

    async def abegin(self, request: Request | None = None, /, **fields: Any) -> BeginDecision:
        """:meth:`begin` for async callers: the store is reached off the event loop, and an
        ``async def`` reconcile hook is awaited on this loop."""
        req = self._as_request(request, fields)
        if self._telemetry is not None and (tracer := self._telemetry.tracer()) is not None:
            return await self._telemetry.abegin(tracer, self._abegin, req)
        return await self._abegin(req)

    async def _abegin(self, req: Request) -> BeginDecision:
        answer = self._flow.from_memo(req)
        if answer is None:
            answer = await self._flow.abegin(req)
        self._observe(answer)
        return answer

    def _as_request(self, request: Request | None, fields: Mapping[str, Any]) -> Request:
        if request is None:
            return self.request(**fields)
        if fields or not isinstance(request, Request):
            raise ConfigError("begin takes a Request from gate.request(), or keyword arguments")
        if request.namespace != self.namespace:
            raise ConfigError(
                f"this request was made for namespace {request.namespace!r}, not "
                f"{self.namespace!r}")
        return request

    def _observe(self, d: BeginDecision) -> None:
        if d.decision is not Decision.EXECUTE:
            if log.isEnabledFor(logging.INFO):
                log.info("refused %s: %s (%s)", d.key, d.decision.value,
                         d.reason or d.state.value, extra=_extra(d))
        elif log.isEnabledFor(logging.DEBUG):
            log.debug("begin %s: execute", d.key, extra=_extra(d))
        if self._telemetry is not None:
            self._telemetry.decision(d.decision, d.effect_type)

    def preview(self, request: Request | None = None, /, **fields: Any) -> BeginDecision:
        """What :meth:`begin` would answer now, writing nothing (no reservation, no approval
        request, no charge; spend ceilings are not consulted). For a framework's "does this
        call need approval?" question before it runs anything."""
        return self._flow.preview(self._as_request(request, fields))

    # -- report, extend ----------------------------------------------------------------------

    def _holder(self, held: BeginDecision | Lease) -> tuple[Lease, bool | None]:
        """The proof of holding, and whether its attempt is known to charge nothing."""
        if isinstance(held, BeginDecision):
            if held.decision is not Decision.EXECUTE or held.lease is None:
                raise InvalidTransition(
                    f"only an 'execute' decision holds the effect; this one is "
                    f"{held.decision.value!r}",
                    key=held.key, decision=held.decision.value,
                )
            if held.namespace != self.namespace:
                raise InvalidTransition(
                    f"this decision holds {held.key!r} in namespace {held.namespace!r}, not "
                    f"{self.namespace!r}", key=held.key)
            return held.lease, (False if not held.spends else None)
        if isinstance(held, Lease):
            key = check_key(held.key)
            token = validate.whole(held.token, "lease token", minimum=0)
            secret = validate.text(held.secret, "lease secret", 128, required=True) or ""
            return Lease(key, token, secret), None
        raise ConfigError("report and extend_lease take the BeginDecision (or an eg.Lease: key, "
                          f"token and secret), not {type(held).__name__}")

    def report(self, held: BeginDecision | Lease, outcome: Outcome | str, *,
               result: Any = None, error: str | None = None,
               actual_cost_micros: int | None = None) -> None:
        """Record what happened: ``committed`` (with ``result``), ``failed`` or ``ambiguous``.

        ``held`` is the ``execute`` decision, or its :class:`~effectgate.Lease` (key, token,
        secret). Raises :class:`StaleLease` when this holder no longer holds the effect (an
        operator resolved it, or a newer attempt took it): nothing is written. A holder whose
        lease lapsed while nobody acted still records its outcome, late. :class:`PayloadError`
        when ``result`` has no JSON form (nothing written).
        """
        if self._telemetry is not None and (tracer := self._telemetry.tracer()) is not None:
            with self._telemetry.report_span(tracer, held, outcome):
                return self._report(held, outcome, result, error, actual_cost_micros)
        return self._report(held, outcome, result, error, actual_cost_micros)

    def _report(self, held: BeginDecision | Lease, outcome: Outcome | str, result: Any,
                error: str | None, actual_cost_micros: int | None) -> None:
        if result is not None and self._result_rules:
            result = self._kept(self._effect_type_of(held), result)
        lease, parsed, fields = self._report_fields(held, outcome, result, error,
                                                    actual_cost_micros)
        done = self._store.record_outcome(self.namespace, lease, parsed, **fields)
        if done is None:
            if self._already(lease, parsed, fields["result"]):
                return  # a repeat of a report that landed (its reply was lost): nothing to do
            raise self._stale(lease, f"report {parsed.value}")
        self._reported(held, lease, parsed, fields["result"], done, fields["reason"])

    async def areport(self, held: BeginDecision | Lease, outcome: Outcome | str, *,
                      result: Any = None, error: str | None = None,
                      actual_cost_micros: int | None = None) -> None:
        """:meth:`report` for async callers: natively async on Postgres, on a worker thread
        on SQLite; the event loop never waits on the database."""
        if self._telemetry is not None and (tracer := self._telemetry.tracer()) is not None:
            with self._telemetry.report_span(tracer, held, outcome):
                return await self._areport(held, outcome, result, error, actual_cost_micros)
        return await self._areport(held, outcome, result, error, actual_cost_micros)

    async def _areport(self, held: BeginDecision | Lease, outcome: Outcome | str, result: Any,
                       error: str | None, actual_cost_micros: int | None) -> None:
        if result is not None and self._result_rules:
            if isinstance(held, Lease):
                row = await self._flow.astore.fetch(self.namespace, check_key(held.key))
                effect_type = None if row is None else row.effect_type
            else:
                effect_type = held.effect_type
            result = self._kept(effect_type, result)
        lease, parsed, fields = self._report_fields(held, outcome, result, error,
                                                    actual_cost_micros)
        done = await self._flow.astore.record_outcome(self.namespace, lease, parsed, **fields)
        if done is None:
            if await asyncio.to_thread(self._already, lease, parsed, fields["result"]):
                return
            raise await asyncio.to_thread(self._stale, lease, f"report {parsed.value}")
        self._reported(held, lease, parsed, fields["result"], done, fields["reason"])

    def _effect_type_of(self, held: BeginDecision | Lease) -> str | None:
        if isinstance(held, Lease):
            row = self._store.fetch(self.namespace, check_key(held.key))
            return None if row is None else row.effect_type
        return held.effect_type if isinstance(held, BeginDecision) else None

    def _kept(self, effect_type: str | None, result: Any) -> Any:
        """What the policy lets the store keep of a reported result: nothing under
        ``store_result = false``, the ``redact_result`` fields replaced — whoever reports (the
        decorator, a wrapper, a protocol caller, an agent over MCP)."""
        rule = None if effect_type is None or self.policy is None else (
            self.policy.rule_for(effect_type))
        if rule is None:
            return result
        if not rule.store_result:
            return None
        return redact_fields(result, rule.redact_result) if rule.redact_result else result

    def _report_fields(self, held: BeginDecision | Lease, outcome: Outcome | str, result: Any,
                       error: str | None, actual_cost_micros: int | None,
                       ) -> tuple[Lease, Outcome, dict[str, Any]]:
        """Everything a report writes, validated (nothing is written when this raises)."""
        lease, spends = self._holder(held)
        parsed = validate.parse_outcome(outcome)
        text = result_json(result) if parsed is Outcome.COMMITTED else None
        if error is not None and not isinstance(error, str):
            raise ConfigError("error must be a str")
        error = self._redact(error)
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
        }
        if cost is not None and spends is not False and self.policy is not None and (
                parsed is Outcome.COMMITTED):
            fields["overspend"] = _Overspend(self.policy, cost, held)
        return lease, parsed, fields

    def _reported(self, held: BeginDecision | Lease, lease: Lease, parsed: Outcome,
                  text: str | None, done: Recorded, reason: str | None = None) -> None:
        if done.overspent is not None:
            from .decorator import OverspendWarning

            log.warning("%s: %s", lease.key, done.overspent,
                        extra={"key": lease.key, "state": parsed.value,
                               "reason": done.overspent})
            warnings.warn(f"{lease.key!r}: {done.overspent}", OverspendWarning, stacklevel=3)
        if done.late:
            log.warning("late report settled %s: %s", lease.key, parsed.value,
                        extra={"key": lease.key, "state": parsed.value,
                               "reason": "late report"})
        if self._telemetry is not None:
            self._telemetry.outcome(parsed)
        if parsed is Outcome.AMBIGUOUS and self._flow.observe is not None:
            self._flow.observe(reported(held, lease.key, self.namespace, self._store, reason))
        if parsed is Outcome.COMMITTED and isinstance(held, BeginDecision):
            self._flow.remember(held.key, held.payload_hash, held.effect_type, held.effect_id,
                                held.attempt, held.lease_token, text)

    def _already(self, lease: Lease, outcome: Outcome, text: str | None) -> bool:
        """True when this holder already recorded exactly this outcome."""
        from .request import secret_hash

        row = self._store.get(self.namespace, lease.key)
        return bool(
            row is not None and row.token == lease.token
            and row.lease_secret == secret_hash(lease.secret)
            and row.state.value == outcome.value and row.actor is None
            and (outcome is not Outcome.COMMITTED or row.result == text)
        )

    def _stale(self, lease: Lease, what: str) -> EffectGateError:
        row = self._store.get(self.namespace, lease.key)
        if row is None:
            return UnknownEffect(f"no effect with key {lease.key!r}", key=lease.key)
        state = _effective_state(row).value
        from .request import secret_hash

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

    def extend_lease(self, held: BeginDecision | Lease,
                     seconds: float | None = None) -> datetime.datetime:
        """Heartbeat for a long call: the lease now ends ``seconds`` from now (store clock).

        Returns the new expiry (an aware datetime). :class:`StaleLease` if it no longer holds
        (a lapsed lease is not revived)."""
        lease, _ = self._holder(held)
        span = self.lease_seconds if seconds is None else validate.seconds(seconds, "seconds")
        expiry = self._store.extend(self.namespace, lease, span)
        if expiry is None:
            raise self._stale(lease, "extend the lease")
        return datetime.datetime.fromtimestamp(expiry, datetime.UTC)

    async def aextend_lease(self, held: BeginDecision | Lease,
                            seconds: float | None = None) -> datetime.datetime:
        """:meth:`extend_lease` without blocking the event loop."""
        lease, _ = self._holder(held)
        span = self.lease_seconds if seconds is None else validate.seconds(seconds, "seconds")
        expiry = await self._flow.astore.extend(self.namespace, lease, span)
        if expiry is None:
            raise await asyncio.to_thread(self._stale, lease, "extend the lease")
        return datetime.datetime.fromtimestamp(expiry, datetime.UTC)

    # -- resolve, reconcile ------------------------------------------------------------------

    def resolve(self, key: str, outcome: Outcome | str, *, by: str, result: Any = None,
                note: str | None = None, force: bool = False) -> EffectRecord:
        """An operator's verdict on an AMBIGUOUS (or lapsed IN_FLIGHT, or FAILED) effect:
        ``committed`` (a repeat then returns ``result``) or ``failed`` (a repeat may run, under
        the same vendor idempotency key).

        The fencing token grows, so the old holder can no longer report. An IN_FLIGHT effect
        whose lease is still live is refused (:class:`InvalidTransition`, with the expiry): its
        holder may still be acting. ``force=True`` overrides that, and says so in the history.
        A resolve that raises has written nothing.
        """
        key = check_key(key)
        actor = validate.text(by, "by", 256, required=True) or ""
        parsed = validate.parse_outcome(outcome, (Outcome.COMMITTED, Outcome.FAILED))
        if not isinstance(force, bool):
            raise ConfigError("force must be a bool")
        text = result_json(result) if parsed is Outcome.COMMITTED else None
        note = self._redact(validate.text(note, "note", validate.MAX_TEXT))
        for _ in range(_MAX_STEPS):
            row = self._store.fetch(self.namespace, key)
            if row is None:
                raise UnknownEffect(f"no effect with key {key!r}", key=key)
            res = decide.resolution(row, parsed, force=force)
            how = "force-resolved" if res.forced else "resolved"
            if text is not None and self._result_rules:
                text = result_json(self._kept(row.effect_type, result))
            done = self._store.resolve(row, res, result=text,
                                       reason=f"{how} {parsed.value} by {actor}", actor=actor,
                                       note=note)
            if done is not None:
                log.info("%s %s: %s by %s", how, key, parsed.value, actor,
                         extra={"key": key, "state": parsed.value, "reason": note})
                if parsed is Outcome.COMMITTED:
                    self._flow.remember(key, done.payload_hash, done.effect_type, done.id,
                                   done.attempt, done.token, done.result)
                return self._record(done)
        raise StoreError("the effect kept changing under contention; try again", key=key)

    async def aresolve(self, key: str, outcome: Outcome | str, **kwargs: Any) -> EffectRecord:
        """:meth:`resolve` without blocking the event loop."""
        return await asyncio.to_thread(self.resolve, key, outcome, **kwargs)

    def reconciler(self, effect_type: str) -> Callable[[Reconciler], Reconciler]:
        """Register a hook that asks the vendor what happened to an AMBIGUOUS effect of
        ``effect_type`` (glob patterns allowed): ``fn(record) -> "committed" | "failed" |
        "unknown" | eg.Reconciled`` (or ``async def``). A ``begin`` that meets such an effect
        calls it; for a lapsed lease only once the grace period has passed (see
        :mod:`effectgate.reconcile`)."""
        pattern = validate.text(effect_type, "effect_type", 200, required=True) or ""

        def register(fn: Reconciler) -> Reconciler:
            if not callable(fn):
                raise ConfigError("a reconcile hook is a function of the effect's record")
            self._reconcilers.register(pattern, fn)
            return fn

        return register

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> EffectRecord:
        """The effect stored under ``key``, with its history; :class:`UnknownEffect` if none.

        An IN_FLIGHT effect past its lease reads as AMBIGUOUS at once."""
        key = check_key(key)
        row = self._store.get(self.namespace, key)
        if row is None:
            raise UnknownEffect(f"no effect with key {key!r}", key=key)
        return self._record(row)

    async def aget(self, key: str) -> EffectRecord:
        """:meth:`get` without blocking the event loop."""
        return await asyncio.to_thread(self.get, key)

    def get_by_id(self, effect_id: int) -> EffectRecord:
        """The effect with ``effect_id``; :class:`UnknownEffect` if none in this namespace."""
        effect_id = validate.whole(effect_id, "effect_id", minimum=1)
        row = self._store.get_by_id(self.namespace, effect_id)
        if row is None:
            raise UnknownEffect(f"no effect with id {effect_id}", effect_id=effect_id)
        return self._record(row)

    def _record(self, row: EffectRow, *, with_history: bool = True) -> EffectRecord:
        return effect_record(row, self._store.secret, with_history=with_history)

    def list_effects(self, *, state: State | str | None = None, effect_type: str | None = None,
                     run_id: str | None = None, agent_id: str | None = None,
                     group_key: str | None = None, key_prefix: str | None = None,
                     limit: int | None = 100, before_id: int | None = None,
                     ) -> list[EffectRecord]:
        """Effects newest first, filtered (``effect_type`` may be a glob; ``state`` in any
        case); a lapsed IN_FLIGHT effect lists as AMBIGUOUS. ``before_id`` pages on."""
        wanted = None if state is None else _parse_state(state)
        if limit is not None:
            limit = validate.whole(limit, "limit", minimum=1)
        if before_id is not None:
            before_id = validate.whole(before_id, "before_id", minimum=1)
        rows = self._store.effects(
            self.namespace, state=wanted,
            effect_type=validate.text(effect_type, "effect_type", 200),
            run_id=validate.text(run_id, "run_id", 256),
            agent_id=validate.text(agent_id, "agent_id", 256),
            group_key=validate.text(group_key, "group_key", 512),
            key_prefix=validate.text(key_prefix, "key_prefix", 512),
            limit=limit, before_id=before_id)
        return [self._record(r, with_history=False) for r in rows]

    def count_by_state(self) -> dict[State, int]:
        """How many effects of this namespace are in each state (as reads report it)."""
        return self._store.count_by_state(self.namespace)

    def group_steps(self, group_key: str) -> list[EffectRecord]:
        """The steps of a saga group (not their compensations), newest first."""
        group = validate.text(group_key, "group_key", 512, required=True)
        rows = self._store.effects(self.namespace, group_key=group, originals_only=True)
        return [self._record(r, with_history=False) for r in rows]

    # -- approvals ---------------------------------------------------------------------------

    def approval(self, approval_id: str) -> ApprovalRecord:
        """The approval request ``approval_id``; :class:`UnknownEffect` if none here."""
        approval_id = validate.text(approval_id, "approval id", 64, required=True) or ""
        row = self._store.approval(self.namespace, approval_id)
        if row is None:
            raise UnknownEffect(f"no approval with id {approval_id!r}")
        return approval_record(row)

    def approve(self, approval_id: str, *, by: str, note: str | None = None) -> ApprovalRecord:
        """Approve a pending request: the next ``begin`` with exactly that payload executes.

        :class:`InvalidTransition` when it is not pending (approved, denied, consumed, expired)
        or when ``by`` requested it and the policy forbids self-approval (identities compared
        normalised: case, width, invisible characters)."""
        approval_id = validate.text(approval_id, "approval id", 64, required=True) or ""
        actor = validate.text(by, "by", 256, required=True) or ""
        note = self._redact(validate.text(note, "note", validate.MAX_TEXT))
        for _ in range(_MAX_STEPS):
            row = decide.check_approval(self._store.approval(self.namespace, approval_id),
                                        approval_id, actor, approving=True)
            if self._store.decide_approval(self.namespace, approval_id, ApprovalState.APPROVED,
                                           actor, note):
                log.info("approved %s (%s) by %s", row.key, approval_id, actor,
                         extra={"key": row.key, "reason": note})
                return self.approval(approval_id)
        raise StoreError("the approval kept changing under contention; try again")

    def deny(self, approval_id: str, *, by: str, reason: str | None = None) -> ApprovalRecord:
        """Deny a pending request: its effect becomes DENIED, and stays so."""
        approval_id = validate.text(approval_id, "approval id", 64, required=True) or ""
        actor = validate.text(by, "by", 256, required=True) or ""
        reason = self._redact(validate.text(reason, "reason", validate.MAX_TEXT))
        for _ in range(_MAX_STEPS):
            row = decide.check_approval(self._store.approval(self.namespace, approval_id),
                                        approval_id, actor, approving=False)
            why = f"{decide.APPROVER_DENIED} by {actor}" + (f": {reason}" if reason else "")
            if self._store.deny(row, actor, reason, why):
                log.info("denied %s (%s) by %s", row.key, approval_id, actor,
                         extra={"key": row.key, "reason": reason})
                return self.approval(approval_id)
        raise StoreError("the approval kept changing under contention; try again")

    def list_approvals(self, state: ApprovalState | str | None = "pending",
                       ) -> list[ApprovalRecord]:
        """Approval requests, newest first (``state=None`` for all)."""
        wanted = None
        if state is not None:
            try:
                wanted = ApprovalState(state.lower() if isinstance(state, str) else state)
            except ValueError:
                names = ", ".join(s.value for s in ApprovalState)
                raise ConfigError(f"state must be one of {names}, not {state!r}") from None
        out = [approval_record(r) for r in self._store.approvals(self.namespace)]
        return [a for a in out if wanted is None or a.state is wanted]

    async def aapprove(self, approval_id: str, **kwargs: Any) -> ApprovalRecord:
        """:meth:`approve` without blocking the event loop."""
        return await asyncio.to_thread(self.approve, approval_id, **kwargs)

    async def adeny(self, approval_id: str, **kwargs: Any) -> ApprovalRecord:
        """:meth:`deny` without blocking the event loop."""
        return await asyncio.to_thread(self.deny, approval_id, **kwargs)

    # -- sagas, retention ----------------------------------------------------------------------

    def compensator(self, effect_type: str) -> Callable[[Compensator], Compensator]:
        """Register the undo for ``effect_type`` (glob patterns allowed):
        ``fn(record, compensation) -> result``, called by :meth:`unwind`, each undo itself
        gated (at most once). ``record`` is the committed step's :class:`EffectRecord`;
        ``compensation`` what the step declared at ``begin``."""
        pattern = validate.text(effect_type, "effect_type", 200, required=True) or ""

        def register(fn: Compensator) -> Compensator:
            if not callable(fn):
                raise ConfigError("a compensator is a function of (record, compensation)")
            self._compensators.register(pattern, fn)
            return fn

        return register

    def compensator_for(self, effect_type: str) -> Compensator | None:
        """The registered compensator for ``effect_type``, or None."""
        return self._compensators.find(effect_type)

    def unwind(self, group_key: str, *, by: str = "unwind") -> UnwindReport:
        """Run the compensations of the committed steps of ``group_key`` in reverse order, each
        at most once; list unresolved and irreversible steps instead of guessing."""
        group = validate.text(group_key, "group_key", 512, required=True) or ""
        return sagas.unwind(self, group, validate.text(by, "by", 256, required=True) or "")

    async def aunwind(self, group_key: str, **kwargs: Any) -> UnwindReport:
        """:meth:`unwind` without blocking the event loop."""
        return await asyncio.to_thread(self.unwind, group_key, **kwargs)

    def prune(self, older_than: datetime.timedelta, *, dry_run: bool = False) -> int:
        """Drop stored results, errors and history of effects settled (COMMITTED, FAILED,
        DENIED) longer ago than ``older_than``, and the approval requests of those. Each key
        keeps a tombstone (key, type, state, payload hash) and a committed step keeps its
        compensation, so a pruned key still refuses a duplicate and can still be unwound.
        Returns how many were pruned (with ``dry_run=True``: how many would be, writing
        nothing). Never touches an effect that is in flight, AMBIGUOUS or waiting for
        approval. Every gate of this process on this store and namespace forgets its memo of
        committed results (another process's memo keeps what it saw until it prunes or
        restarts: ``memo_size=0`` where results must leave memory with the store's copy)."""
        if not isinstance(older_than, datetime.timedelta) or older_than.total_seconds() < 0:
            raise ConfigError("older_than must be a non-negative datetime.timedelta")
        if not isinstance(dry_run, bool):
            raise ConfigError("dry_run must be a bool")
        seconds = older_than.total_seconds()
        if dry_run:
            return self._store.prune(self.namespace, seconds, dry_run=True)
        count = self._store.prune(self.namespace, seconds)
        for gate in list(_GATES):  # every gate of this process on this store and namespace
            if gate.namespace == self.namespace and gate._store.url == self._store.url:
                gate._memo.clear()
        log.info("pruned %d effects older than %s", count, older_than)
        return count

    async def aprune(self, older_than: datetime.timedelta, **kwargs: Any) -> int:
        """:meth:`prune` without blocking the event loop."""
        return await asyncio.to_thread(self.prune, older_than, **kwargs)

    # -- principals, the operator's console ----------------------------------------------------

    def add_principal(self, name: str, role: str) -> tuple[Principal, str]:
        """Add a named ``operator`` or ``agent`` to this namespace; the principal and its token,
        shown this once (the store keeps only a salted hash). See :mod:`effectgate.principals`."""
        from .principals import add_principal

        return add_principal(self, name, role)

    def authenticate(self, token: str) -> Principal:
        """The principal ``token`` proves in this namespace; :class:`Unauthenticated` for a
        missing, malformed, unknown or revoked token (one indexed read)."""
        from .principals import authenticate

        return authenticate(self, token)

    def revoke_principal(self, name: str) -> Principal:
        """Revoke ``name``: its token stops authenticating at once (revoking twice is
        harmless); :class:`UnknownEffect` when there is no such principal."""
        from .principals import revoke_principal

        return revoke_principal(self, name)

    def list_principals(self) -> list[Principal]:
        """Every principal of this namespace, by name (revoked ones included)."""
        from .principals import list_principals

        return list_principals(self)

    def acting_as(self, principal: Principal) -> Acting:
        """This gate as ``principal``: approve, deny, resolve, reconcile and unwind with its name
        as ``by``, refused (:class:`Forbidden`) to an agent. The store is asked before each act:
        a principal of another namespace, revoked, or never issued by this store is refused
        (:class:`Unauthenticated`), with nothing written."""
        from .principals import Acting

        return Acting(self, principal)

    def reconcile(self, key: str, *, by: str) -> EffectRecord:
        """Ask the registered reconcile hook about the AMBIGUOUS effect ``key`` now (an
        operator's "Reconcile now"); its verdict is recorded as by ``by`` via the hook. The
        effect after it (still AMBIGUOUS when the hook could not tell).
        :class:`InvalidTransition` when the effect is not AMBIGUOUS, :class:`ConfigError` when
        no hook for its type is registered in this process."""
        key = check_key(key)
        actor = validate.text(by, "by", 256, required=True) or ""
        row = self._store.fetch(self.namespace, key)
        if row is None:
            raise UnknownEffect(f"no effect with key {key!r}", key=key)
        state = _effective_state(row)
        if state is not State.AMBIGUOUS:
            raise InvalidTransition(f"{key!r} is {state.value}, not ambiguous: nothing to "
                                    "reconcile", key=key, state=state.value)
        if self._reconcilers.find(row.effect_type) is None:
            raise ConfigError(f"no reconcile hook for {row.effect_type!r} is registered here "
                              "(give the gate your code defines, with its hooks)", key=key)
        self._flow._reconcile(row, None, by=actor)
        return self.get(key)

    def ambiguous_queue(self, *, before_id: int | None = None, limit: int = 50,
                        ) -> tuple[list[EffectRecord], int | None]:
        """One page of AMBIGUOUS (and lapsed IN_FLIGHT) effects, newest first, and the cursor
        of the next page (None when nothing older is left). A page walks the primary key in
        bounded windows, so it costs the same however many effects the store holds (see
        :mod:`effectgate.store.queue`); a page may hold fewer than ``limit`` with more
        beyond its cursor."""
        from .store.queue import ambiguous_page

        limit = validate.whole(limit, "limit", minimum=1)
        if limit > 500:
            raise ConfigError("limit is at most 500")
        if before_id is not None:
            before_id = validate.whole(before_id, "before_id", minimum=1)
        page = ambiguous_page(self._store.engine, self.namespace, before_id=before_id,
                              limit=limit)
        return [self._record(r) for r in page.rows], page.next_before_id

    # -- the decorator -----------------------------------------------------------------------

    def effect(self, key: str, **options: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Gate a function (sync or async) on the effect key template ``key``.

        ``execute`` runs the body and stores its result; ``duplicate`` returns the stored
        result; the other decisions raise :class:`EffectInFlight`, :class:`EffectAmbiguous`,
        :class:`ApprovalRequired` or :class:`EffectDenied`. Options: ``effect_type``,
        ``vendor``, ``cost_micros`` (int or a function of the arguments), ``lease_seconds``,
        ``max_attempts``, ``group_key`` (a template), ``compensation``, ``redact`` (a function
        applied to the result before it is stored), ``store_result``, ``classifiers``.
        """
        from .decorator import gate_function

        def decorate(fn: Callable[..., T]) -> Callable[..., T]:
            return gate_function(self, fn, key, **options)

        return decorate



def _webhooks(webhooks: object) -> Webhooks | None:
    if webhooks is False or (webhooks is None and "EFFECTGATE_WEBHOOK_URL" not in os.environ):
        return None
    from .webhooks import Webhooks, from_env

    if webhooks is None:
        return from_env()
    if not isinstance(webhooks, Webhooks):
        raise ConfigError("webhooks must be an effectgate.webhooks.Webhooks, or False for none")
    return webhooks


_telemetry = telemetry


def _load_policy(policy: object) -> tuple[Policy | None, str | None]:
    if policy is False:
        return None, None
    if policy is None or policy is True:
        found = find_policy()
        if found is None:
            return None, None
        policy = found
    from .policy import Policy  # pydantic: only once there is a policy

    if isinstance(policy, Policy):
        return policy, "<Policy>"
    if isinstance(policy, (str, os.PathLike)):
        return Policy.load(os.fspath(policy)), os.fspath(policy)
    if isinstance(policy, Mapping):
        return Policy.from_dict(policy), "<dict>"
    raise ConfigError("policy must be an eg.Policy, a path, a mapping, or False for none")


class _Overspend:
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


def policy_digest(policy: Policy | None) -> str:
    """A short digest of what a policy says (None: ``"none"``): equal for two policies that
    say the same thing, whatever their file's order or spelling."""
    if policy is None:
        return "none"
    text = json.dumps(policy.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _effective_state(row: EffectRow | EffectHead) -> State:
    if row.state is State.IN_FLIGHT and row.lease_expires_at is not None and (
        row.lease_expires_at < row.now
    ):
        return State.AMBIGUOUS
    return row.state


def _parse_state(state: State | str) -> State:
    try:
        return State(state.lower() if isinstance(state, str) else state)
    except ValueError:
        names = ", ".join(s.value for s in State)
        raise ConfigError(f"state must be one of {names}, not {state!r}") from None


def _loads(text: str | None) -> Any:
    from .translate import loads

    return loads(text)


def _extra(d: BeginDecision) -> dict[str, Any]:
    return {"key": d.key, "decision": d.decision.value, "reason": d.reason,
            "effect_id": d.effect_id}


__all__ += []  # vendor_key_of is re-exported by translate for tools
_ = vendor_key_of
