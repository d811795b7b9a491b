"""The gate: ``begin`` reserves an effect key in one atomic write, ``report`` records what
happened, and a repeat of the same consequence is answered from the store.

The flow is written once, synchronously; the ``a``-prefixed twins run it on a worker thread
(``asyncio.to_thread``) so async callers never block their event loop on the database.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import fnmatch
import json
import logging
import math
import os
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from . import approvals, sagas
from .errors import (
    ConfigError,
    EffectGateError,
    InvalidTransition,
    PayloadMismatch,
    StaleLease,
    StoreError,
    UnknownEffect,
)
from .governance import Governance, dump_keys, evaluate, load_keys, release_delta
from .keys import check_key, is_utf8
from .payload import canonical_json, payload_hash, result_json
from .policy import Policy
from .records import (
    ApprovalRecord,
    BeginDecision,
    EffectRecord,
    HistoryEntry,
    epoch_to_datetime,
)
from .sagas import Compensator, UnwindReport
from .states import Decision, Outcome, State
from .store import Durability, Rollback, Store, parse_history
from .telemetry import telemetry
from .vendors import VendorKey, rule_for, vendor_key

__all__ = ["EffectKind", "Gate", "Reconciled", "Reconciler", "effect_context", "parse_outcome"]

log = logging.getLogger("effectgate")
T = TypeVar("T")

_MAX_ERROR = 2000
_MAX_LEASE = 7 * 24 * 3600.0
_IN_FLIGHT, _COMMITTED, _FAILED, _AMBIGUOUS = "in_flight", "committed", "failed", "ambiguous"
_PENDING, _DENIED = "pending_approval", "denied"
_STATES = {s.value: s for s in State}
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

    @staticmethod
    def current() -> tuple[str | None, str | None]:
        """The ``(run_id, agent_id)`` in force here (None where none was set)."""
        return _run_context.get()

    def __enter__(self) -> effect_context:
        outer_run, outer_agent = _run_context.get()
        run_id, agent_id = self._value
        self._token = _run_context.set((run_id or outer_run, agent_id or outer_agent))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _run_context.reset(self._token)


class EffectKind(NamedTuple):
    """An effect type's options, validated once, with the policy's defaults applied."""

    effect_type: str
    vendor: str | None
    lease_seconds: float
    max_attempts: int


class _Request:
    """A validated ``begin``: everything checked before the store is touched."""

    __slots__ = ("effect_type", "gov", "key", "max_attempts", "payload_hash", "values", "vendor")

    def __init__(self, key: str, effect_type: str, payload_hash: str, vendor: str | None,
                 max_attempts: int, values: dict[str, Any], gov: Governance | None) -> None:
        self.key = key
        self.effect_type = effect_type
        self.payload_hash = payload_hash
        self.vendor = vendor
        self.max_attempts = max_attempts
        self.values = values
        self.gov = gov


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
    if not value.isascii() and not is_utf8(value):
        raise ConfigError(f"{name} must be valid Unicode (it has a lone surrogate)")
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


_encode = json.JSONEncoder(ensure_ascii=False).encode


class Gate:
    """Reserve each effect key before its action runs; answer repeats from the store.

    ``url``: a SQLAlchemy URL (``sqlite:///path.db`` or ``postgresql+psycopg://...``); default
    ``$EFFECTGATE_URL``, else ``sqlite:///.effectgate/effects.db``. Keys are unique per
    ``namespace``. ``durability`` (SQLite): ``"reserve"`` syncs every reservation to disk and
    lets outcomes ride on the next sync (default); ``"all"`` syncs outcomes too;
    ``"relaxed"`` syncs nothing (an explicit opt-in: a power cut may forget a reservation).
    ``memo_size`` COMMITTED keys are remembered in this process (COMMITTED is terminal), so a
    repeat costs no round trip; 0 turns that off. ``read_only=True`` opens an existing store
    for reading only: it creates and migrates nothing (:class:`StoreError` when there is no
    effectgate store at ``url``) and every write is refused by the database.
    """

    def __init__(
        self,
        url: str | None = None,
        policy: Policy | str | os.PathLike[str] | Mapping[str, Any] | None = None,
        *,
        namespace: str = "default",
        durability: Durability = "reserve",
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        classifiers: tuple[Callable[[BaseException], Outcome | None], ...] = (),
        memo_size: int = 4096,
        read_only: bool = False,
    ) -> None:
        self.namespace = _text(namespace, "namespace", 128, required=True) or "default"
        self.lease_seconds = _seconds(lease_seconds, "lease_seconds")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or (
            max_attempts < 1
        ):
            raise ConfigError("max_attempts must be an int of at least 1")
        self.max_attempts = max_attempts
        self.classifiers = tuple(classifiers)
        if policy is not None and not isinstance(policy, Policy):
            if isinstance(policy, (str, os.PathLike)):
                policy = Policy.load(os.fspath(policy))
            elif isinstance(policy, Mapping):
                policy = Policy.from_dict(policy)
            else:
                raise ConfigError("policy must be an eg.Policy, a path or a mapping")
        self.policy: Policy | None = policy
        self._store = Store(url, durability=durability, read_only=read_only)
        self._memo: OrderedDict[str, tuple[str, int, str, int, int, str | None]] = OrderedDict()
        self._memo_size = max(0, int(memo_size))
        self._memo_lock = threading.Lock()
        self._reconcilers: dict[str, Reconciler] = {}
        self._compensators: dict[str, Compensator] = {}
        self._telemetry = telemetry()

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

    def kind(self, effect_type: str, *, vendor: str | None = None,
             lease_seconds: float | None = None, max_attempts: int | None = None) -> EffectKind:
        """Validate the per-type options once, with the policy's defaults applied.

        A decorator or tool wrapper prepares its kind when it is declared, so each call only
        renders its key and hashes its payload (:meth:`request`)."""
        effect_type = _text(effect_type, "effect_type", 200, required=True) or ""
        rule = self.policy.rule_for(effect_type) if self.policy is not None else None
        if rule is not None:
            vendor = vendor if vendor is not None else rule.vendor
            lease_seconds = lease_seconds if lease_seconds is not None else rule.lease_seconds
            max_attempts = max_attempts if max_attempts is not None else rule.max_attempts
        if vendor is not None:
            rule_for(vendor)
        if max_attempts is not None and (
            isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
            or max_attempts < 1
        ):
            raise ConfigError("max_attempts must be an int of at least 1")
        lease = self.lease_seconds if lease_seconds is None else _seconds(lease_seconds,
                                                                          "lease_seconds")
        return EffectKind(effect_type, vendor, lease, max_attempts or self.max_attempts)

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
    ) -> _Request:
        """Validate a ``begin`` without touching the store (every error is raised here)."""
        kind = effect_type if isinstance(effect_type, EffectKind) else self.kind(
            effect_type, vendor=vendor, lease_seconds=lease_seconds, max_attempts=max_attempts
        )
        key = check_key(key)
        digest = payload_hash(payload)
        if run_id is None or agent_id is None:
            ctx_run, ctx_agent = _run_context.get()
            run_id = run_id if run_id is not None else ctx_run
            agent_id = agent_id if agent_id is not None else ctx_agent
        if compensates_effect_id is not None and (
            isinstance(compensates_effect_id, bool) or not isinstance(compensates_effect_id, int)
        ):
            raise ConfigError("compensates_effect_id must be an effect id (int)")
        agent = None if agent_id is None else _text(agent_id, "agent_id", 256)
        cost = None if estimated_cost_micros is None else _micros(
            estimated_cost_micros, "estimated_cost_micros")
        values = {
            "namespace": self.namespace,
            "key": key,
            "effect_type": kind.effect_type,
            "payload_hash": digest,
            "state": _IN_FLIGHT,
            "lease_seconds": kind.lease_seconds,
            "reason": None,
            "run_id": None if run_id is None else _text(run_id, "run_id", 256),
            "agent_id": agent,
            "group_key": None if group_key is None else _text(group_key, "group_key", 512),
            "compensation": None if compensation is None
            else canonical_json(compensation, "compensation"),
            "compensates_effect_id": compensates_effect_id,
            "vendor": kind.vendor,
            "estimated_cost_micros": cost,
            "approval_id": None,
            "budget_keys": None,
            "actor": agent,
            "note": None,
            "h_by": _json(agent),
            "h_note": "null",
        }
        gov = None if self.policy is None else evaluate(self.policy, kind.effect_type, cost)
        return _Request(key, kind.effect_type, digest, kind.vendor, kind.max_attempts, values,
                        gov)

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
            decision = self._memo_duplicate(req, memo)
        elif req.gov is None:
            row = self._store.reserve(req.values)
            if row.inserted:
                decision = self._decide(row, Decision.EXECUTE, req)
            else:
                decision = self._settle(req, row)
        else:
            decision = self._settle(req, self._store.fetch(self.namespace, req.key))
        if decision.decision is not Decision.EXECUTE:
            if log.isEnabledFor(logging.INFO):
                log.info("refused %s: %s (%s)", req.key, decision.decision.value,
                         decision.reason or decision.state.value, extra=_extra(decision))
        elif log.isEnabledFor(logging.DEBUG):
            log.debug("begin %s: execute", req.key, extra=_extra(decision))
        if self._telemetry is not None:
            self._telemetry.decision(decision.decision.value, decision.effect_type)
        return decision

    def _settle(self, req: _Request, row: Any) -> BeginDecision:
        """Answer a key that already exists, moving it on where the rules say so."""
        for _ in range(16):
            if row is None:  # a new key (governed), or removed under us: reserve afresh
                if req.gov is None:
                    row = self._store.reserve(req.values)
                    if row.inserted:
                        return self._decide(row, Decision.EXECUTE, req)
                else:
                    decided = self._advance(req, None)
                    if decided is not None:
                        return decided
                    row = self._store.fetch(self.namespace, req.key)
                    continue
            if row.payload_hash != req.payload_hash:
                raise PayloadMismatch(
                    f"effect key {req.key!r} was first used with another payload "
                    "(a key collision, or the same key for a different action)",
                    key=req.key, state=row.state, effect_id=row.id,
                )
            state = row.state
            if state == _COMMITTED:
                self._remember(row)
                return self._decide(row, Decision.DUPLICATE, req, result=_loads(row.result),
                                    reason="its stored result was pruned" if row.pruned_at
                                    else None)
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
                gov = req.gov
                settled = None if gov and gov.on_ambiguous == "block" else self._reconcile(row)
                if settled is None:
                    return self._decide(row, Decision.BLOCKED, req,
                                        reason=row.reason or "the outcome is unknown")
                row = settled
                continue
            if state == _FAILED:
                if row.attempt >= req.max_attempts:
                    return self._decide(
                        row, Decision.DENIED, req,
                        reason=f"max_attempts ({req.max_attempts}) reached",
                    )
                decided = self._advance(req, row, attempt_increment=1)
                if decided is not None:
                    return decided
                row = self._store.fetch(self.namespace, req.key)
                continue
            if state == _PENDING:
                approval = self._store.approval(row.approval_id)
                status = approvals.status(approval)
                if status == "pending":
                    return self._decide(row, Decision.APPROVAL_REQUIRED, req,
                                        approval_id=row.approval_id,
                                        reason="waiting for a human's approval")
                decided = self._advance(
                    req, row, consume=row.approval_id if status == "approved" else None
                )
                if decided is not None:
                    return decided
                row = self._store.fetch(self.namespace, req.key)
                continue
            # DENIED: an approver's "no" holds; a policy or budget refusal is asked again.
            if (row.reason or "").startswith(approvals.DENIED_PREFIX):
                return self._decide(row, Decision.DENIED, req, reason=row.reason)
            decided = self._advance(req, row)
            if decided is not None:
                return decided
            row = self._store.fetch(self.namespace, req.key)
        raise StoreError("the effect kept changing under contention; try again", key=req.key)

    def _advance(self, req: _Request, row: Any, *, attempt_increment: int = 0,
                 consume: str | None = None) -> BeginDecision | None:
        """Move a new key (``row`` None) or an existing effect towards execution, as far as the
        policy lets it: DENIED, PENDING_APPROVAL, or IN_FLIGHT with its spend counted.

        None when another writer moved the effect first (the caller reads it again)."""
        gov = req.gov
        store = self._store
        values = {**req.values, "attempt_increment": attempt_increment}
        if row is not None:
            values.update(id=row.id, token=row.token, expected_state=row.state)

        def move(tx: Any, **changes: Any) -> Any:
            sql = store.sql.insert if row is None else store.sql.take
            if row is None:
                changes.setdefault("lease_seconds", values["lease_seconds"])
            found = tx.effect(sql, {**values, **changes})
            return found if found is None or row is not None or found.inserted else None

        if gov is not None and gov.deny:
            if row is not None and row.state == _DENIED and row.reason == gov.deny:
                return self._decide(row, Decision.DENIED, req, reason=gov.deny)
            with store.transaction() as tx:
                new = move(tx, state=_DENIED, reason=gov.deny, lease_seconds=None)
            return None if new is None else self._decide(new, Decision.DENIED, req, reason=gov.deny)
        if gov is not None and gov.approval is not None and consume is None:
            approval_id = approvals.new_id()
            with store.transaction() as tx:
                new = move(tx, state=_PENDING, approval_id=approval_id, lease_seconds=None,
                           reason="waiting for a human's approval")
                if new is not None:
                    tx.all(store.sql.approval_insert, {
                        **values, "approval_id": approval_id, "effect_id": new.id,
                        "allow_self_approval": int(gov.approval.allow_self_approval),
                        "expires_seconds": gov.approval.expires_seconds,
                    })
            if new is None:
                return None
            return self._decide(new, Decision.APPROVAL_REQUIRED, req, reason=new.reason,
                                 approval_id=approval_id)
        if consume is None and (gov is None or not gov.counts_spend):
            new = move(_Direct(store), state=_IN_FLIGHT, approval_id=None, budget_keys=None)
            if new is None:
                return None
            warning = gov.budget_warning if gov is not None else None
            if warning:
                log.warning("%s: %s", req.key, warning, extra={"key": req.key, "reason": warning})
            return self._decide(new, Decision.EXECUTE, req, budget_warning=warning)
        over: str | None = None
        try:
            with store.transaction() as tx:
                if consume is not None and tx.one(
                    store.sql.approval_consume, {"approval_id": consume}
                ) is None:
                    tx.rollback()
                charged: list[str] = []
                if gov is not None and gov.counts_spend:
                    for scope_key, per_day, limit, label in gov.scope_keys(
                        req.effect_type, values["run_id"], values["agent_id"]
                    ):
                        cost = gov.cost or 0
                        got = None if cost > limit else tx.one(
                            store.sql.charge_day if per_day else store.sql.charge,
                            {"namespace": self.namespace, "scope_key": scope_key,
                             "cost": cost, "limit": limit},
                        )
                        if got is None:
                            over = f"spend ceiling reached: {label}"
                            tx.rollback()
                        charged.append(got[0])
                new = move(tx, state=_IN_FLIGHT, approval_id=consume or None,
                           budget_keys=dump_keys(charged))
                if new is None:
                    tx.rollback()
        except Rollback:
            if over is None:
                return None
            with store.transaction() as tx:
                new = move(tx, state=_DENIED, reason=over, lease_seconds=None)
            return None if new is None else self._decide(new, Decision.DENIED, req, reason=over)
        warning = gov.budget_warning if gov is not None else None
        if warning:
            log.warning("%s: %s", req.key, warning, extra={"key": req.key, "reason": warning})
        return self._decide(new, Decision.EXECUTE, req, budget_warning=warning)

    def _decide(self, row: Any, decision: Decision, req: _Request | None = None,
                **extra: Any) -> BeginDecision:
        vkey = self._vendor_key(row) if row.vendor else None
        return BeginDecision(
            decision=decision,
            effect_id=row.id,
            key=row.key,
            effect_type=row.effect_type,
            namespace=row.namespace,
            state=_STATES[row.state],
            attempt=row.attempt,
            lease_token=row.token,
            lease_expires_epoch=row.lease_expires_at,
            vendor_key=vkey,
            payload_hash=row.payload_hash,
            budget_keys=row.budget_keys,
            estimated_cost_micros=row.estimated_cost_micros,
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

    def _remember(self, row: Any) -> None:
        """Keep a COMMITTED row in the memo."""
        if self._memo_size:
            self._memo_put(row.key, (row.payload_hash, row.id, row.effect_type, row.attempt,
                                     row.token, row.result))

    def _memo_put(self, key: str, entry: tuple[str, int, str, int, int, str | None]) -> None:
        with self._memo_lock:
            self._memo[key] = entry
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
        self.report_json(decision, effect_id, token, key, parsed, text, error,
                         _micros(actual_cost_micros, "actual_cost_micros"))

    def report_json(self, decision: BeginDecision | int, effect_id: int, token: int,
                    key: str | None, parsed: Outcome, text: str | None, error: str | None,
                    actual_cost_micros: int | None) -> None:
        """:meth:`report` with everything validated and the result already JSON text (the
        decorator's path: the result is serialised once)."""
        if error and not error.isascii() and not is_utf8(error):  # e.g. an exception's text
            error = error.encode("utf-8", "backslashreplace").decode("utf-8")
        values = {
            "id": effect_id, "token": token, "state": parsed.value, "result": text,
            "error": error[:_MAX_ERROR] if error else None,
            "reason": (error[:_MAX_ERROR] if error else "reported ambiguous")
            if parsed is Outcome.AMBIGUOUS else None,
            "actual_cost_micros": actual_cost_micros,
            "actor": None,
            "h_by": "null",
            "h_note": _json(error[:200]) if parsed is Outcome.AMBIGUOUS and error else "null",
        }
        store = self._store
        moves_spend = isinstance(decision, BeginDecision) and bool(decision.budget_keys) and bool(
            release_delta(parsed.value, decision.estimated_cost_micros, actual_cost_micros))
        if moves_spend:
            with store.transaction() as tx:  # the outcome and its spend, atomically
                done = tx.one(store.sql.report, values)
                if done is not None:
                    self._adjust(tx, done[0], parsed.value, done[1], actual_cost_micros)
        else:
            done = store.report(values)
            if done is not None and done[0] and not isinstance(decision, BeginDecision) and (
                release_delta(parsed.value, done[1], actual_cost_micros)
            ):  # reported by id: the spend it moves is known only now
                with store.transaction() as tx:
                    self._adjust(tx, done[0], parsed.value, done[1], actual_cost_micros)
        if self._telemetry is not None and done is not None:
            self._telemetry.outcome(parsed.value)
        if done is not None:
            if parsed is Outcome.COMMITTED and self._memo_size and isinstance(
                decision, BeginDecision
            ):
                self._memo_put(decision.key, (decision.payload_hash, decision.effect_id,
                                              decision.effect_type, decision.attempt,
                                              decision.lease_token, text))
            return
        if self._already(effect_id, token, parsed, text):
            return  # a repeat of a report that landed (its reply was lost): nothing to do
        raise self._stale(effect_id, token, key, f"report {parsed.value}")

    def _already(self, effect_id: int, token: int, outcome: Outcome, text: str | None) -> bool:
        """True when this holder's token already recorded exactly this outcome."""
        row = self._store.fetch_id(effect_id)
        return bool(
            row is not None and row.namespace == self.namespace and row.token == token
            and row.state == outcome.value and row.actor is None
            and (outcome is not Outcome.COMMITTED or row.result == text)
        )

    def _adjust(self, tx: Any, keys_text: str | None, outcome: str, estimated: int | None,
                actual: int | None) -> None:
        delta = release_delta(outcome, estimated, actual)
        if not delta:
            return
        for scope_key in load_keys(keys_text):
            tx.all(self._store.sql.adjust,
                   {"namespace": self.namespace, "scope_key": scope_key, "delta": delta})

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
                note: str | None = None, force: bool = False) -> EffectRecord:
        """An operator's verdict on an AMBIGUOUS (or lapsed IN_FLIGHT, or FAILED) effect:
        ``committed`` (a repeat then returns ``result``) or ``failed`` (a repeat may run).

        The fencing token grows, so the old holder can no longer report. An IN_FLIGHT effect
        whose lease is still live is refused (:class:`InvalidTransition`, with the expiry): its
        holder may still be acting. ``force=True`` overrides that, and says so in the history.
        """
        if not isinstance(force, bool):
            raise ConfigError("force must be a bool")
        key = check_key(key)
        actor = _text(by, "by", 256, required=True)
        parsed = parse_outcome(outcome, (Outcome.COMMITTED, Outcome.FAILED))
        text = result_json(result) if parsed is Outcome.COMMITTED else None
        note = _text(note, "note", _MAX_ERROR)
        for _ in range(16):
            row = self._store.fetch(self.namespace, key)
            if row is None:
                raise UnknownEffect(f"no effect with key {key!r}", key=key)
            forced = self._check_resolvable(row, parsed, force)
            how = "force-resolved" if forced else "resolved"
            done = self._resolve_row(row, parsed, text, f"{how} {parsed.value} by {actor}",
                                     actor, note)
            if done is not None:
                log.info("resolved %s: %s by %s", key, parsed.value, actor,
                         extra={"key": key, "state": parsed.value, "reason": note})
                if parsed is Outcome.COMMITTED:
                    self._remember(done)
                return self._record(done)
        raise StoreError("the effect kept changing under contention; try again", key=key)

    def _resolve_row(self, row: Any, outcome: Outcome, result_text: str | None, reason: str,
                     actor: str | None, note: str | None) -> Any:
        """Compare-and-set ``row`` to an operator's or reconciler's outcome, moving its spend:
        FAILED releases what the attempt held; COMMITTED after FAILED counts it again."""
        store = self._store
        values = {
            "id": row.id, "token": row.token, "expected_state": row.state,
            "state": outcome.value, "result": result_text, "error": None, "reason": reason,
            "actor": actor, "note": note, "h_by": _json(actor), "h_note": _json(note),
        }
        held = row.state in (_IN_FLIGHT, _AMBIGUOUS)
        delta = 0
        if row.budget_keys and row.estimated_cost_micros:
            if held and outcome is Outcome.FAILED:
                delta = -row.estimated_cost_micros
            elif not held and outcome is Outcome.COMMITTED:
                delta = row.estimated_cost_micros
        if not delta:
            return store.resolve(values)
        with store.transaction() as tx:
            done = tx.effect(store.sql.resolve, values)
            if done is not None:
                for scope_key in load_keys(row.budget_keys):
                    tx.all(store.sql.adjust, {"namespace": self.namespace,
                                              "scope_key": scope_key, "delta": delta})
        return done

    def _check_resolvable(self, row: Any, outcome: Outcome, force: bool) -> bool:
        """Raise unless ``row`` may be resolved as ``outcome``; True when only ``force`` lets
        it (an IN_FLIGHT effect whose lease is still live)."""
        state = row.state
        if state == _IN_FLIGHT and row.lease_expires_at >= row.now:
            if force:
                return True
            expiry = epoch_to_datetime(row.lease_expires_at)
            raise InvalidTransition(
                f"cannot resolve {row.key!r}: its holder's lease is live until "
                f"{expiry:%Y-%m-%d %H:%M:%S} UTC ({row.lease_expires_at - row.now:.0f}s); wait "
                "for it to lapse, or force it if you know the holder is gone",
                key=row.key, state=state, reason="lease is live",
            )
        if state in (_AMBIGUOUS, _IN_FLIGHT) or (state == _FAILED and
                                                 outcome is Outcome.COMMITTED):
            return False
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
        return _match(self._reconcilers, effect_type)

    def _reconcile(self, row: Any) -> Any:
        """Ask the registered hook; return the row after a verdict, or None (still unknown)."""
        fn = self._reconciler_for(row.effect_type)
        if fn is None:
            return None
        name = getattr(fn, "__qualname__", repr(fn))
        try:
            full = self._store.fetch_id(row.id)
            if full is None:
                return None
            verdict = fn(self._record(full, with_history=False))
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
        done = self._resolve_row(
            row, outcome,
            result_json(verdict.result) if outcome is Outcome.COMMITTED else None,
            f"reconciled {outcome.value}", f"reconciler:{name}", verdict.note,
        )
        log.info("reconciled %s: %s", row.key, outcome.value,
                 extra={"key": row.key, "state": outcome.value, "reason": verdict.note})
        return done or self._store.fetch(self.namespace, row.key)

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str) -> EffectRecord:
        """The effect stored under ``key``, with its history; :class:`UnknownEffect` if none.

        An IN_FLIGHT effect past its lease reads as AMBIGUOUS at once."""
        key = check_key(key)
        row = self._store.fetch_full(self.namespace, key)
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
                token=h[3], by=h[4], note=h[5],
            )
            for h in (parse_history(row.history) if with_history else ())
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

    # -- governance ------------------------------------------------------------------------

    def approve(self, approval_id: str, *, by: str, note: str | None = None) -> ApprovalRecord:
        """Approve a pending request: the next ``begin`` with exactly that payload executes.

        :class:`InvalidTransition` when it is not pending (approved, denied, consumed, expired)
        or when ``by`` requested it and the policy forbids self-approval."""
        actor = _text(by, "by", 256, required=True) or ""
        return approvals.approve(self, approval_id, actor, _text(note, "note", _MAX_ERROR))

    def deny(self, approval_id: str, *, by: str, reason: str | None = None) -> ApprovalRecord:
        """Deny a pending request: its effect becomes DENIED, and stays so."""
        actor = _text(by, "by", 256, required=True) or ""
        return approvals.deny(self, approval_id, actor, _text(reason, "reason", _MAX_ERROR))

    def list_approvals(self, state: str | None = "pending") -> list[ApprovalRecord]:
        """Approval requests, newest first (``state=None`` for all)."""
        return approvals.list_approvals(self, state)

    def list_effects(self, *, state: State | str | None = None, effect_type: str | None = None,
                     run_id: str | None = None, group_key: str | None = None,
                     limit: int | None = 100) -> list[EffectRecord]:
        """Effects newest first, filtered; a lapsed IN_FLIGHT effect lists as AMBIGUOUS."""
        if state is not None:
            try:
                state = State(state).value
            except ValueError:
                names = ", ".join(s.value for s in State)
                raise ConfigError(f"state must be one of {names}, not {state!r}") from None
        rows = self._store.select_effects(self.namespace, state=state, effect_type=effect_type,
                                          run_id=run_id, group_key=group_key, limit=limit)
        return [self._record(r, with_history=False) for r in rows]

    def group_steps(self, group_key: str) -> list[EffectRecord]:
        """The steps of a saga group (not their compensations), newest first."""
        group_key = _text(group_key, "group_key", 512, required=True) or ""
        rows = self._store.select_effects(self.namespace, group_key=group_key,
                                          originals_only=True)
        return [self._record(r, with_history=False) for r in rows]

    def compensator(self, effect_type: str) -> Callable[[Compensator], Compensator]:
        """Register the undo for ``effect_type`` (glob patterns allowed):
        ``fn(record, compensation) -> result``, called by :meth:`unwind` through the gate."""
        pattern = _text(effect_type, "effect_type", 200, required=True) or ""

        def register(fn: Compensator) -> Compensator:
            self._compensators[pattern] = fn
            return fn

        return register

    def compensator_for(self, effect_type: str) -> Compensator | None:
        """The registered compensator for ``effect_type``, or None."""
        return _match(self._compensators, effect_type)

    def unwind(self, group_key: str, *, by: str = "unwind") -> UnwindReport:
        """Run the compensations of the committed steps of ``group_key`` in reverse order, each
        at most once; list unresolved and irreversible steps instead of guessing."""
        group_key = _text(group_key, "group_key", 512, required=True) or ""
        return sagas.unwind(self, group_key, _text(by, "by", 256, required=True) or "unwind")

    def prune(self, older_than: datetime.timedelta, *, dry_run: bool = False) -> int:
        """Drop stored results, history and finished approvals of effects settled (COMMITTED,
        FAILED, DENIED) longer ago than ``older_than``. Each key keeps a tombstone (key, state,
        payload hash), so a pruned key still refuses a duplicate. Returns how many were pruned
        (with ``dry_run=True``: how many would be, writing nothing). Never touches an effect
        that is in flight, AMBIGUOUS or waiting for approval."""
        if not isinstance(older_than, datetime.timedelta) or older_than.total_seconds() < 0:
            raise ConfigError("older_than must be a non-negative datetime.timedelta")
        if not isinstance(dry_run, bool):
            raise ConfigError("dry_run must be a bool")
        if dry_run:
            return self._store.prune(self.namespace, older_than.total_seconds(), dry_run=True)
        count = self._store.prune(self.namespace, older_than.total_seconds())
        log.info("pruned %d effects older than %s", count, older_than)
        return count

    async def aapprove(self, approval_id: str, **kwargs: Any) -> ApprovalRecord:
        """:meth:`approve` without blocking the event loop."""
        return await asyncio.to_thread(self.approve, approval_id, **kwargs)

    async def adeny(self, approval_id: str, **kwargs: Any) -> ApprovalRecord:
        """:meth:`deny` without blocking the event loop."""
        return await asyncio.to_thread(self.deny, approval_id, **kwargs)

    async def aunwind(self, group_key: str, **kwargs: Any) -> UnwindReport:
        """:meth:`unwind` without blocking the event loop."""
        return await asyncio.to_thread(self.unwind, group_key, **kwargs)

    async def aprune(self, older_than: datetime.timedelta, **kwargs: Any) -> int:
        """:meth:`prune` without blocking the event loop."""
        return await asyncio.to_thread(self.prune, older_than, **kwargs)

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


class _Direct:
    """A single autocommit statement where a transaction is not needed."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def effect(self, sql: Any, values: Mapping[str, Any]) -> Any:
        return self.store._one(sql, values, self.store._sync_reserve)


def _match(registry: Mapping[str, T], effect_type: str) -> T | None:
    found = registry.get(effect_type)
    if found is not None:
        return found
    for pattern, candidate in registry.items():
        if fnmatch.fnmatchcase(effect_type, pattern):
            return candidate
    return None


def _effective_state(row: Any) -> str:
    if row.state == _IN_FLIGHT and row.lease_expires_at is not None and (
        row.lease_expires_at < row.now
    ):
        return _AMBIGUOUS
    return str(row.state)


def _json(value: Any) -> str:
    return "null" if value is None else _encode(value)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _extra(d: BeginDecision) -> dict[str, Any]:
    return {"key": d.key, "decision": d.decision.value, "reason": d.reason,
            "effect_id": d.effect_id}

