"""The gate: ``begin`` reserves an effect key in one atomic write, ``report`` records what
happened, and a repeat of the same consequence is answered from the store.

The flow is written once, synchronously; the ``a``-prefixed twins run it on a worker thread
(``asyncio.to_thread``) so async callers never block their event loop on the database.
"""

from __future__ import annotations

import asyncio
import contextvars
import fnmatch
import json
import logging
import math
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from .errors import (
    ConfigError,
    EffectGateError,
    InvalidTransition,
    PayloadError,
    PayloadMismatch,
    StaleLease,
    StoreError,
    UnknownEffect,
)
from .keys import check_key
from .payload import canonical_json, payload_hash, to_canonical
from .records import BeginDecision, EffectRecord, HistoryEntry, epoch_to_datetime
from .states import Decision, Outcome, State
from .store import Durability, Store
from .vendors import VendorKey, rule_for, vendor_key

__all__ = ["Gate", "Reconciled", "Reconciler", "effect_context", "parse_outcome", "result_json"]

log = logging.getLogger("effectgate")
T = TypeVar("T")

_MAX_ERROR = 2000
_MAX_LEASE = 7 * 24 * 3600.0
_IN_FLIGHT, _COMMITTED, _FAILED, _AMBIGUOUS = "in_flight", "committed", "failed", "ambiguous"
_MAX_RETRY_AFTER = 1.0


class Reconciled(NamedTuple):
    """A reconcile hook's verdict: ``committed`` (with the vendor's ``result``), ``failed`` or
    ``unknown``."""

    outcome: str
    result: Any = None
    note: str | None = None


Reconciler = Callable[[EffectRecord], "Reconciled | str"]


_run_context: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "effectgate_run_context", default=(None, None)
)


class effect_context:
    """Set the default ``run_id`` and ``agent_id`` for every ``begin`` inside the block.

    Framework integrations use it to carry a run's or conversation's id and the agent's name::

        with eg.effect_context(run_id="run_42", agent_id="billing-agent"):
            refund("txn_1", 500)
    """

    def __init__(self, *, run_id: str | None = None, agent_id: str | None = None) -> None:
        self._value = (run_id, agent_id)
        self._token: contextvars.Token[tuple[str | None, str | None]] | None = None

    def __enter__(self) -> effect_context:
        outer_run, outer_agent = _run_context.get()
        run_id, agent_id = self._value
        self._token = _run_context.set((run_id or outer_run, agent_id or outer_agent))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _run_context.reset(self._token)


class _Request:
    """A validated ``begin``: everything checked before the store is touched."""

    __slots__ = ("effect_type", "key", "max_attempts", "payload_hash", "values", "vendor")

    def __init__(self, key: str, effect_type: str, payload_hash: str, vendor: str | None,
                 max_attempts: int, values: dict[str, Any]) -> None:
        self.key = key
        self.effect_type = effect_type
        self.payload_hash = payload_hash
        self.vendor = vendor
        self.max_attempts = max_attempts
        self.values = values


def _text(value: object, name: str, limit: int, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise ConfigError(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a str, not {type(value).__name__}")
    value = unicodedata.normalize("NFC", value)
    if not value.strip():
        raise ConfigError(f"{name} must not be empty")
    if len(value) > limit:
        raise ConfigError(f"{name} is at most {limit} characters; this one has {len(value)}")
    if "\x00" in value:
        raise ConfigError(f"{name} must not contain NUL characters")
    return value


def _micros(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int of micro-units (1_000_000 = $1)")
    if value < 0:
        raise ConfigError(f"{name} must not be negative")
    return value


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number of seconds")
    seconds = float(value)
    if not (math.isfinite(seconds) and 0 < seconds <= _MAX_LEASE):
        raise ConfigError(f"{name} must be more than 0 and at most {_MAX_LEASE:.0f} seconds")
    return seconds


def parse_outcome(outcome: object, allowed: tuple[Outcome, ...] = tuple(Outcome)) -> Outcome:
    """``outcome`` as an :class:`Outcome`; :class:`InvalidTransition` if it is not one."""
    try:
        parsed = Outcome(outcome)  # type: ignore[arg-type]
    except ValueError:
        parsed = None
    if parsed is None or parsed not in allowed:
        names = ", ".join(repr(o.value) for o in allowed)
        raise InvalidTransition(f"outcome must be one of {names}, not {outcome!r}")
    return parsed


def result_json(result: Any) -> str | None:
    """A result as JSON text (None stays None); :class:`PayloadError` if it has no JSON form."""
    if result is None:
        return None
    try:
        return json.dumps(result, ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                          default=lambda v: to_canonical(v, "result"))
    except (ValueError, TypeError, RecursionError) as err:
        raise PayloadError(f"the result cannot be stored as JSON: {err}") from None


class Gate:
    """Reserve each effect key before its action runs; answer repeats from the store.

    ``url``: a SQLAlchemy URL (``sqlite:///path.db`` or ``postgresql+psycopg://...``); default
    ``$EFFECTGATE_URL``, else ``sqlite:///.effectgate/effects.db``. Keys are unique per
    ``namespace``. ``durability`` (SQLite): ``"reserve"`` syncs every reservation to disk and
    lets outcomes ride on the next sync (default); ``"all"`` syncs outcomes too;
    ``"relaxed"`` syncs nothing (an explicit opt-in: a power cut may forget a reservation).
    ``memo_size`` COMMITTED keys are remembered in this process (COMMITTED is terminal), so a
    repeat costs no round trip; 0 turns that off.
    """

    def __init__(
        self,
        url: str | None = None,
        policy: Any = None,
        *,
        namespace: str = "default",
        durability: Durability = "reserve",
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        classifiers: tuple[Callable[[BaseException], Outcome | None], ...] = (),
        memo_size: int = 4096,
    ) -> None:
        self.namespace = _text(namespace, "namespace", 128, required=True) or "default"
        self.lease_seconds = _seconds(lease_seconds, "lease_seconds")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or (
            max_attempts < 1
        ):
            raise ConfigError("max_attempts must be an int of at least 1")
        self.max_attempts = max_attempts
        self.classifiers = tuple(classifiers)
        self.policy = policy
        self._store = Store(url, durability=durability)
        self._memo: OrderedDict[str, tuple[str, int, str, int, int, str | None]] = OrderedDict()
        self._memo_size = max(0, int(memo_size))
        self._memo_lock = threading.Lock()
        self._reconcilers: dict[str, Reconciler] = {}

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
        self._store.dispose()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- begin ---------------------------------------------------------------------------

    def request(
        self,
        *,
        effect_type: str,
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
        payload_digest: str | None = None,
    ) -> _Request:
        """Validate a ``begin`` without touching the store (every error is raised here)."""
        key = check_key(key)
        effect_type = _text(effect_type, "effect_type", 200, required=True) or ""
        digest = payload_digest or payload_hash(payload)
        if vendor is not None:
            rule_for(vendor)
        if run_id is None or agent_id is None:
            ctx_run, ctx_agent = _run_context.get()
            run_id = run_id if run_id is not None else ctx_run
            agent_id = agent_id if agent_id is not None else ctx_agent
        if compensates_effect_id is not None and (
            isinstance(compensates_effect_id, bool) or not isinstance(compensates_effect_id, int)
        ):
            raise ConfigError("compensates_effect_id must be an effect id (int)")
        if max_attempts is not None and (
            isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
            or max_attempts < 1
        ):
            raise ConfigError("max_attempts must be an int of at least 1")
        agent = _text(agent_id, "agent_id", 256)
        values = {
            "namespace": self.namespace,
            "key": key,
            "effect_type": effect_type,
            "payload_hash": digest,
            "state": _IN_FLIGHT,
            "lease_seconds": self.lease_seconds if lease_seconds is None
            else _seconds(lease_seconds, "lease_seconds"),
            "reason": None,
            "run_id": _text(run_id, "run_id", 256),
            "agent_id": agent,
            "group_key": _text(group_key, "group_key", 512),
            "compensation": None if compensation is None
            else canonical_json(compensation, "compensation"),
            "compensates_effect_id": compensates_effect_id,
            "vendor": vendor,
            "estimated_cost_micros": _micros(estimated_cost_micros, "estimated_cost_micros"),
            "approval_id": None,
            "actor": agent,
            "note": None,
        }
        return _Request(key, effect_type, digest, vendor,
                        max_attempts or self.max_attempts, values)

    def begin(self, **request: Any) -> BeginDecision:
        """Propose an effect; obey the decision: only ``execute`` runs the action.

        Keyword arguments: ``effect_type``, ``key``, ``payload`` (the action's parameters; only
        their hash is stored), and optionally ``run_id``, ``agent_id``, ``group_key``,
        ``compensation``, ``compensates_effect_id``, ``lease_seconds``,
        ``estimated_cost_micros``, ``vendor``, ``max_attempts``.
        """
        return self.begin_request(self.request(**request))

    def begin_request(self, req: _Request) -> BeginDecision:
        """``begin`` for a request already validated by :meth:`request`."""
        memo = self._memo.get(req.key) if self._memo_size else None
        if memo is not None and memo[0] == req.payload_hash:
            return self._memo_duplicate(req, memo)
        row = self._store.reserve(req.values)
        if row.inserted:
            decision = self._decide(row, Decision.EXECUTE, req)
        else:
            decision = self._settle(req, row)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("begin %s: %s", req.key, decision.decision.value, extra=_extra(decision))
        return decision

    def _settle(self, req: _Request, row: Any) -> BeginDecision:
        """Answer a key that already exists, moving it on where the rules say so."""
        for _ in range(16):
            if row is None:  # removed under us (by an operator): reserve afresh
                row = self._store.reserve(req.values)
                if row.inserted:
                    return self._decide(row, Decision.EXECUTE, req)
            if row.payload_hash != req.payload_hash:
                raise PayloadMismatch(
                    f"effect key {req.key!r} was first used with another payload "
                    "(a key collision, or the same key for a different action)",
                    key=req.key, state=row.state, effect_id=row.id,
                )
            state = row.state
            if state == _COMMITTED:
                self._remember(row)
                return self._decide(row, Decision.DUPLICATE, req, result=_loads(row.result))
            if state == _IN_FLIGHT:
                remaining = row.lease_expires_at - row.now
                if remaining >= 0:
                    return self._decide(
                        row, Decision.IN_FLIGHT, req,
                        retry_after_seconds=round(min(max(remaining, 0.05),
                                                      _MAX_RETRY_AFTER), 3),
                        reason="another holder is executing it",
                    )
                lapsed = self._store.lapse(row.id, row.token)
                if lapsed is not None:
                    log.info("lease lapsed: %s is AMBIGUOUS", req.key,
                             extra={"key": req.key, "decision": "blocked",
                                    "reason": "lease lapsed"})
                row = lapsed or self._store.fetch(self.namespace, req.key)
                continue
            if state == _AMBIGUOUS:
                settled = self._reconcile(row)
                if settled is None:
                    decision = self._decide(
                        row, Decision.BLOCKED, req,
                        reason=row.reason or "the outcome is unknown",
                    )
                    log.info("blocked %s: %s", req.key, decision.reason, extra=_extra(decision))
                    return decision
                row = settled
                continue
            if state == _FAILED:
                if row.attempt >= req.max_attempts:
                    return self._decide(
                        row, Decision.DENIED, req,
                        reason=f"max_attempts ({req.max_attempts}) reached",
                    )
                taken = self._store.take(
                    {**req.values, "id": row.id, "token": row.token,
                     "expected_state": _FAILED, "attempt_increment": 1}
                )
                if taken is not None:
                    return self._decide(taken, Decision.EXECUTE, req)
                row = self._store.fetch(self.namespace, req.key)
                continue
            if state == State.PENDING_APPROVAL.value:
                return self._decide(row, Decision.APPROVAL_REQUIRED, req,
                                    approval_id=row.approval_id, reason=row.reason)
            return self._decide(row, Decision.DENIED, req, reason=row.reason or "denied")
        raise StoreError("the effect kept changing under contention; try again", key=req.key)

    def _decide(self, row: Any, decision: Decision, req: _Request | None = None,
                **extra: Any) -> BeginDecision:
        vkey = self._vendor_key(row) if row.vendor else None
        return BeginDecision(
            decision=decision,
            effect_id=row.id,
            key=row.key,
            effect_type=row.effect_type,
            namespace=row.namespace,
            state=State(row.state),
            attempt=row.attempt,
            lease_token=row.token,
            lease_expires_epoch=row.lease_expires_at,
            vendor_key=vkey,
            payload_hash=row.payload_hash,
            **extra,
        )

    def _vendor_key(self, row: Any) -> VendorKey:
        started = row.attempt_started_at or row.created_at
        return vendor_key(
            self._store.secret, row.vendor, namespace=row.namespace,
            effect_type=row.effect_type, key=row.key, attempt=row.attempt,
            attempt_age_seconds=max(0.0, row.now - started),
        )

    # -- the in-process memo of COMMITTED keys ---------------------------------------------

    def _remember(self, row: Any, result_text: str | None = None) -> None:
        if not self._memo_size:
            return
        entry = (row.payload_hash, row.id, row.effect_type, row.attempt, row.token,
                 row.result if result_text is None else result_text)
        with self._memo_lock:
            self._memo[row.key] = entry
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)

    def _memo_duplicate(self, req: _Request,
                        memo: tuple[str, int, str, int, int, str | None]) -> BeginDecision:
        _, effect_id, effect_type, attempt, token, result = memo
        return BeginDecision(
            decision=Decision.DUPLICATE, effect_id=effect_id, key=req.key,
            effect_type=effect_type, namespace=self.namespace, state=State.COMMITTED,
            attempt=attempt, lease_token=token, result=_loads(result),
            payload_hash=req.payload_hash,
        )

    # -- report, extend, resolve ---------------------------------------------------------

    def _holder(self, decision: BeginDecision | int,
                lease_token: int | None) -> tuple[int, int, str | None]:
        if isinstance(decision, BeginDecision):
            if decision.decision is not Decision.EXECUTE:
                raise InvalidTransition(
                    f"only an 'execute' decision holds the effect; this one is "
                    f"{decision.decision.value!r}",
                    key=decision.key, decision=decision.decision.value,
                )
            return decision.effect_id, decision.lease_token, decision.key
        if isinstance(decision, bool) or not isinstance(decision, int):
            raise ConfigError("pass the BeginDecision, or an effect id with lease_token=")
        if isinstance(lease_token, bool) or not isinstance(lease_token, int):
            raise ConfigError("an effect id needs its lease_token (an int)")
        return decision, lease_token, None

    def report(
        self,
        decision: BeginDecision | int,
        outcome: Outcome | str,
        *,
        result: Any = None,
        error: str | None = None,
        actual_cost_micros: int | None = None,
        lease_token: int | None = None,
    ) -> None:
        """Record what happened: ``committed`` (with ``result``), ``failed`` or ``ambiguous``.

        Raises :class:`StaleLease` when this holder no longer holds the effect (its lease
        lapsed, an operator resolved it, or a newer attempt took it): nothing is written.
        """
        effect_id, token, key = self._holder(decision, lease_token)
        parsed = parse_outcome(outcome)
        text = result_json(result) if parsed is Outcome.COMMITTED else None
        if error is not None and not isinstance(error, str):
            raise ConfigError("error must be a str")
        values = {
            "id": effect_id, "token": token, "state": parsed.value, "result": text,
            "error": error[:_MAX_ERROR] if error else None,
            "reason": (error[:_MAX_ERROR] if error else "reported ambiguous")
            if parsed is Outcome.AMBIGUOUS else None,
            "actual_cost_micros": _micros(actual_cost_micros, "actual_cost_micros"),
            "actor": None,
        }
        if self._store.report(values):
            if parsed is Outcome.COMMITTED and self._memo_size and isinstance(
                decision, BeginDecision
            ):
                self._memo_put(decision, text)
            return
        raise self._stale(effect_id, token, key, f"report {parsed.value}")

    def _memo_put(self, d: BeginDecision, text: str | None) -> None:
        with self._memo_lock:
            self._memo[d.key] = (d.payload_hash, d.effect_id, d.effect_type, d.attempt,
                                 d.lease_token, text)
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)

    def _stale(self, effect_id: int, token: int, key: str | None, what: str) -> EffectGateError:
        row = self._store.fetch_id(effect_id)
        if row is None or row.namespace != self.namespace:
            return UnknownEffect(f"no effect with id {effect_id}", effect_id=effect_id, key=key)
        state = _effective_state(row)
        if row.token != token:
            why = f"token {token} is stale: a newer holder has token {row.token}"
        elif row.state == _IN_FLIGHT:
            why = "the lease lapsed before this call"
        else:
            why = f"the effect is already {state}"
        log.warning("refused %s on %s: %s", what, row.key, why,
                    extra={"key": row.key, "state": state, "reason": why})
        return StaleLease(f"cannot {what} on {row.key!r}: {why}", key=row.key, state=state,
                          reason=why, effect_id=row.id)

    def extend_lease(self, decision: BeginDecision | int, seconds: float | None = None, *,
                     lease_token: int | None = None) -> Any:
        """Heartbeat for a long call: the lease now ends ``seconds`` from now (store clock).

        Returns the new expiry (an aware datetime). :class:`StaleLease` if it no longer holds.
        """
        effect_id, token, key = self._holder(decision, lease_token)
        span = self.lease_seconds if seconds is None else _seconds(seconds, "seconds")
        row = self._store.extend(effect_id, token, span)
        if row is None:
            raise self._stale(effect_id, token, key, "extend the lease")
        return epoch_to_datetime(row[0])

    def resolve(self, key: str, outcome: Outcome | str, *, by: str, result: Any = None,
                note: str | None = None) -> EffectRecord:
        """An operator's verdict on an AMBIGUOUS (or stuck IN_FLIGHT, or FAILED) effect:
        ``committed`` (a repeat then returns ``result``) or ``failed`` (a repeat may run).

        The fencing token grows, so the old holder can no longer report.
        """
        key = check_key(key)
        actor = _text(by, "by", 256, required=True)
        parsed = parse_outcome(outcome, (Outcome.COMMITTED, Outcome.FAILED))
        text = result_json(result) if parsed is Outcome.COMMITTED else None
        note = _text(note, "note", _MAX_ERROR)
        for _ in range(16):
            row = self._store.fetch(self.namespace, key)
            if row is None:
                raise UnknownEffect(f"no effect with key {key!r}", key=key)
            self._check_resolvable(row, parsed)
            done = self._store.resolve({
                "id": row.id, "token": row.token, "expected_state": row.state,
                "state": parsed.value, "result": text, "error": None,
                "reason": f"resolved {parsed.value} by {actor}", "actor": actor, "note": note,
            })
            if done is not None:
                log.info("resolved %s: %s by %s", key, parsed.value, actor,
                         extra={"key": key, "state": parsed.value, "reason": note})
                if parsed is Outcome.COMMITTED:
                    self._remember(done)
                return self._record(done)
        raise StoreError("the effect kept changing under contention; try again", key=key)

    def _check_resolvable(self, row: Any, outcome: Outcome) -> None:
        state = row.state
        if state in (_AMBIGUOUS, _IN_FLIGHT) or (state == _FAILED and
                                                 outcome is Outcome.COMMITTED):
            return
        raise InvalidTransition(
            f"cannot resolve {row.key!r} as {outcome.value}: it is {state}"
            + (" (terminal)" if state == _COMMITTED else ""),
            key=row.key, state=state,
        )

    # -- reconcile hooks -------------------------------------------------------------------

    def reconciler(self, effect_type: str) -> Callable[[Reconciler], Reconciler]:
        """Register a hook that asks the vendor what happened to an AMBIGUOUS effect of
        ``effect_type`` (glob patterns allowed). It returns ``"committed"``, ``"failed"``,
        ``"unknown"`` or a :class:`Reconciled`; it is consulted when a ``begin`` meets the
        effect."""
        pattern = _text(effect_type, "effect_type", 200, required=True) or ""

        def register(fn: Reconciler) -> Reconciler:
            self._reconcilers[pattern] = fn
            return fn

        return register

    def _reconciler_for(self, effect_type: str) -> Reconciler | None:
        fn = self._reconcilers.get(effect_type)
        if fn is not None:
            return fn
        for pattern, candidate in self._reconcilers.items():
            if fnmatch.fnmatchcase(effect_type, pattern):
                return candidate
        return None

    def _reconcile(self, row: Any) -> Any:
        """Ask the registered hook; return the row after a verdict, or None (still unknown)."""
        fn = self._reconciler_for(row.effect_type)
        if fn is None:
            return None
        name = getattr(fn, "__qualname__", repr(fn))
        try:
            verdict = fn(self._record(row, with_history=False))
            if asyncio.iscoroutine(verdict):
                verdict = asyncio.run(verdict)
            if isinstance(verdict, str):
                verdict = Reconciled(verdict)
            outcome = parse_outcome(
                verdict.outcome, (Outcome.COMMITTED, Outcome.FAILED, Outcome.AMBIGUOUS)
            ) if verdict.outcome != "unknown" else Outcome.AMBIGUOUS
        except Exception as err:
            log.warning("reconciler %s failed on %s: %s", name, row.key, err,
                        extra={"key": row.key, "reason": str(err)})
            return None
        if outcome is Outcome.AMBIGUOUS:
            return None
        done = self._store.resolve({
            "id": row.id, "token": row.token, "expected_state": _AMBIGUOUS,
            "state": outcome.value,
            "result": result_json(verdict.result) if outcome is Outcome.COMMITTED else None,
            "error": None, "reason": f"reconciled {outcome.value}", "actor": f"reconciler:{name}",
            "note": verdict.note,
        })
        log.info("reconciled %s: %s", row.key, outcome.value,
                 extra={"key": row.key, "state": outcome.value, "reason": verdict.note})
        return done or self._store.fetch(self.namespace, row.key)

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str) -> EffectRecord:
        """The effect stored under ``key``, with its history; :class:`UnknownEffect` if none.

        An IN_FLIGHT effect past its lease reads as AMBIGUOUS at once."""
        key = check_key(key)
        row = self._store.fetch(self.namespace, key)
        if row is None:
            raise UnknownEffect(f"no effect with key {key!r}", key=key)
        return self._record(row)

    def get_by_id(self, effect_id: int) -> EffectRecord:
        """The effect with ``effect_id``; :class:`UnknownEffect` if none in this namespace."""
        row = self._store.fetch_id(effect_id)
        if row is None or row.namespace != self.namespace:
            raise UnknownEffect(f"no effect with id {effect_id}", effect_id=effect_id)
        return self._record(row)

    def _record(self, row: Any, *, with_history: bool = True) -> EffectRecord:
        state = _effective_state(row)
        lapsed = row.state == _IN_FLIGHT and state == _AMBIGUOUS
        entries = tuple(
            HistoryEntry(
                from_state=State(h[0]) if h[0] else None, to_state=State(h[1]),
                at=epoch_to_datetime(h[2]),  # type: ignore[arg-type]
                by=h[3], note=h[4], token=h[5],
            )
            for h in (self._store.history(row.id) if with_history else ())
        )
        return EffectRecord(
            effect_id=row.id, namespace=row.namespace, key=row.key,
            effect_type=row.effect_type, state=State(state), attempt=row.attempt,
            lease_token=row.token, payload_hash=row.payload_hash,
            result=_loads(row.result), error=row.error,
            reason="lease lapsed" if lapsed else row.reason,
            created_at=epoch_to_datetime(row.created_at),  # type: ignore[arg-type]
            updated_at=epoch_to_datetime(row.updated_at),  # type: ignore[arg-type]
            lease_expires_at=epoch_to_datetime(row.lease_expires_at),
            run_id=row.run_id, agent_id=row.agent_id, group_key=row.group_key,
            compensation=_loads(row.compensation),
            compensates_effect_id=row.compensates_effect_id, vendor=row.vendor,
            estimated_cost_micros=row.estimated_cost_micros,
            actual_cost_micros=row.actual_cost_micros, approval_id=row.approval_id,
            pruned_at=epoch_to_datetime(row.pruned_at),
            vendor_key=self._vendor_key(row) if row.vendor else None,
            history=entries,
        )

    # -- async twins -----------------------------------------------------------------------

    async def abegin(self, **request: Any) -> BeginDecision:
        """:meth:`begin` without blocking the event loop."""
        req = self.request(**request)
        return await asyncio.to_thread(self.begin_request, req)

    async def areport(self, decision: BeginDecision | int, outcome: Outcome | str,
                      **kwargs: Any) -> None:
        """:meth:`report` without blocking the event loop."""
        await asyncio.to_thread(self.report, decision, outcome, **kwargs)

    async def aextend_lease(self, decision: BeginDecision | int, seconds: float | None = None,
                            **kwargs: Any) -> Any:
        """:meth:`extend_lease` without blocking the event loop."""
        return await asyncio.to_thread(self.extend_lease, decision, seconds, **kwargs)

    async def aresolve(self, key: str, outcome: Outcome | str, **kwargs: Any) -> EffectRecord:
        """:meth:`resolve` without blocking the event loop."""
        return await asyncio.to_thread(self.resolve, key, outcome, **kwargs)

    async def aget(self, key: str) -> EffectRecord:
        """:meth:`get` without blocking the event loop."""
        return await asyncio.to_thread(self.get, key)

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


def _effective_state(row: Any) -> str:
    if row.state == _IN_FLIGHT and row.lease_expires_at is not None and (
        row.lease_expires_at < row.now
    ):
        return _AMBIGUOUS
    return str(row.state)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _extra(d: BeginDecision) -> dict[str, Any]:
    return {"key": d.key, "decision": d.decision.value, "reason": d.reason,
            "effect_id": d.effect_id}

