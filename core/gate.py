"""The gate: ``begin`` reserves an effect key in one atomic write, ``report`` records what
happened, and a repeat of the same consequence is answered from the store.

:class:`Gate` is a facade over collaborators that each do one job: requests are built by
:mod:`effectgate.request_builder`, the begin flow runs in :mod:`effectgate.flow` (the pure
rules in :mod:`effectgate.decide`), reports and heartbeats in :mod:`effectgate.reporting`,
operators' acts in :mod:`effectgate.operations`, reads in :mod:`effectgate.reads`, the
policy in force in :mod:`effectgate.policy_in_force`, sagas in :mod:`effectgate.sagas`. Its
collaborators see it as a :class:`~effectgate.gatelike.GateLike` and never import this module.
"""

from __future__ import annotations

import datetime
import logging
import os
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from . import operations, principals, reads, validate
from .classify import checked_classifiers
from .decorator import gate_function
from .errors import ConfigError, UnknownEffect
from .flow import BeginFlow
from .keys import check_key, lookup_key
from .memo import CommittedMemo
from .policy_in_force import load_policy, note_policy
from .reconcile import Reconciled, Reconciler
from .redact import TextRedactor, redact_with
from .registry import Registry
from .reporting import Reporter, kept, observe_decision
from .request import Lease, Request
from .request_builder import EffectKind, build_request, effect_kind
from .states import ApprovalState, Outcome, State
from .store import Durability, Store
from .store.connections import DEFAULT_ASYNC_POOL_SIZE
from .store.rows import EffectRow
from .telemetry import Telemetry
from .telemetry import telemetry as telemetry_of
from .translate import approval_record, effect_record

if TYPE_CHECKING:
    from .notices import Observer
    from .policy import Policy
    from .records import ApprovalRecord, BeginDecision, EffectRecord
    from .sagas import Compensator, UnwindReport
    from .webhooks import Webhooks

__all__ = ["EffectKind", "Gate", "Reconciled", "Reconciler"]

log = logging.getLogger("effectgate")
T = TypeVar("T")
_GATES: weakref.WeakSet[Gate] = weakref.WeakSet()  # whose memos a prune clears


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
        (self.namespace, self.lease_seconds, self.max_attempts, memo_size,
         self._text_redactor) = validate.gate_options(  # every option, before the store opens
            url=url, namespace=namespace, durability=durability, read_only=read_only,
            lease_seconds=lease_seconds, max_attempts=max_attempts, memo_size=memo_size,
            text_redactor=text_redactor)
        self._webhooks, self._telemetry = _webhooks(webhooks), telemetry_of(telemetry)
        self.classifiers = checked_classifiers(classifiers)
        self.policy, self.policy_source = load_policy(policy)
        self._store = Store(url, durability=durability, read_only=read_only,
                            async_pool_size=async_pool_size)
        try:
            note_policy(self._store, self.namespace, self.policy, self.policy_source)
            self._memo = CommittedMemo(memo_size)
            self._reconcilers: Registry[Reconciler] = Registry()
            self._compensators: Registry[Compensator] = Registry()
            self._wire(None if self._webhooks is None else self._webhooks.notify)
        except BaseException:
            self._store.close()
            raise
        _GATES.add(self)
        if self._telemetry is not None:
            self._telemetry.watch(self)

    def in_namespace(self, namespace: str) -> Gate:
        """A gate like this one — same store and connections, policy, options, reconcile
        hooks and compensators — in another ``namespace``, with its own memo. Closing either
        closes the shared store."""
        other = object.__new__(Gate)
        other.__dict__.update(self.__dict__)
        other.namespace = validate.name(namespace, "namespace", 128, required=True) or ""
        other._memo = CommittedMemo(self._memo.size)
        _GATES.add(other)
        other._reconcilers = self._reconcilers.copy()
        other._compensators = self._compensators.copy()
        other._wire(self._flow.observe)
        return other

    def _wire(self, observe: Observer | None) -> None:
        """The begin flow and the reporter of this gate's namespace and memo."""
        self._flow = BeginFlow(self._store, self._memo, self._reconcilers, self._redact,
                               observe, self._kept)
        self._reports = Reporter(self.namespace, self._store, self._flow, self.policy,
                                 self._redact, self._telemetry)

    # -- properties ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store's URL."""
        return self._store.url

    @property
    def store(self) -> Store:
        """The underlying store (for tools and tests)."""
        return self._store

    @property
    def webhooks(self) -> Webhooks | None:
        """The webhooks told of approvals, AMBIGUOUS effects and budget warnings, or None."""
        return self._webhooks

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

    def _redact(self, text: str | None) -> str | None:
        return redact_with(self._text_redactor, text)

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
        """:meth:`request` for a ``key`` already checked (a key template renders checked keys)
        and a ``kind`` from :meth:`kind`: the decorator's path, without the second check."""
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
        observe_decision(answer, self._telemetry)
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
        observe_decision(answer, self._telemetry)
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

    def preview(self, request: Request | None = None, /, **fields: Any) -> BeginDecision:
        """What :meth:`begin` would answer now, writing nothing (no reservation, no approval
        request, no charge; the spend counters are not read). For a framework's "does this
        call need approval?" question before it runs anything."""
        return self._flow.preview(self._as_request(request, fields))

    # -- report, extend ----------------------------------------------------------------------

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
                return self._reports.report(held, outcome, result, error, actual_cost_micros)
        return self._reports.report(held, outcome, result, error, actual_cost_micros)

    async def areport(self, held: BeginDecision | Lease, outcome: Outcome | str, *,
                      result: Any = None, error: str | None = None,
                      actual_cost_micros: int | None = None) -> None:
        """:meth:`report` for async callers: natively async on Postgres, on a worker thread
        on SQLite; the event loop never waits on the database."""
        if self._telemetry is not None and (tracer := self._telemetry.tracer()) is not None:
            with self._telemetry.report_span(tracer, held, outcome):
                return await self._reports.areport(held, outcome, result, error,
                                                   actual_cost_micros)
        return await self._reports.areport(held, outcome, result, error, actual_cost_micros)

    def _kept(self, effect_type: str | None, result: Any) -> Any:
        return kept(self.policy, effect_type, result)

    def extend_lease(self, held: BeginDecision | Lease, seconds: float | None = None, *,
                     vendor_ref: str | None = None) -> datetime.datetime:
        """Heartbeat for a long call: the lease now ends ``seconds`` from now (store clock).

        ``vendor_ref`` records what the vendor calls this attempt (e.g. the id of the task an
        MCP upstream runs it as): kept with the effect (``EffectRecord.vendor_ref``) for a
        reconcile hook to ask the vendor about after a crash; None leaves it as it is.
        Returns the new expiry (an aware datetime). :class:`StaleLease` if it no longer holds
        (a lapsed lease is not revived)."""
        span = self.lease_seconds if seconds is None else validate.seconds(seconds, "seconds")
        ref = validate.text(vendor_ref, "vendor_ref", validate.MAX_TEXT)
        return self._reports.extend(held, span, ref)

    async def aextend_lease(self, held: BeginDecision | Lease, seconds: float | None = None, *,
                            vendor_ref: str | None = None) -> datetime.datetime:
        """:meth:`extend_lease` without blocking the event loop."""
        span = self.lease_seconds if seconds is None else validate.seconds(seconds, "seconds")
        ref = validate.text(vendor_ref, "vendor_ref", validate.MAX_TEXT)
        return await self._reports.aextend(held, span, ref)

    # -- resolve, reconcile ------------------------------------------------------------------

    def resolve(self, key: str, outcome: Outcome | str, *, by: str, result: Any = None,
                note: str | None = None, force: bool = False,
                expected: EffectRecord | None = None) -> EffectRecord:
        """An operator's verdict on an AMBIGUOUS (or lapsed IN_FLIGHT, or FAILED) effect:
        ``committed`` (a repeat then returns ``result``) or ``failed`` (a repeat may run, under
        the same vendor idempotency key).

        The fencing token grows, so the old holder can no longer report. An IN_FLIGHT effect
        whose lease is still live is refused (:class:`InvalidTransition`, with the expiry): its
        holder may still be acting; ``force=True`` overrides that, and says so in the history.
        ``expected``: the record the verdict was made on; refused if the effect has left its
        state or fencing token since. A resolve that raises has written nothing."""
        return self._record(operations.resolve(self._reports, key, outcome, by=by, result=result,
                                               note=note, force=force, expected=expected))

    async def aresolve(self, key: str, outcome: Outcome | str, **kwargs: Any) -> EffectRecord:
        """:meth:`resolve` without blocking the event loop."""
        return await self._store.on_worker(self.resolve, key, outcome, **kwargs)

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
        key = lookup_key(key)
        row = self._store.get(self.namespace, key)
        if row is None:
            raise UnknownEffect(f"no effect with key {key!r}", key=key)
        return self._record(row)

    async def aget(self, key: str) -> EffectRecord:
        """:meth:`get` without blocking the event loop."""
        return await self._store.on_worker(self.get, key)

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
        rows = reads.effect_rows(
            self._store, self.namespace, state=state, effect_type=effect_type, run_id=run_id,
            agent_id=agent_id, group_key=group_key, key_prefix=key_prefix, limit=limit,
            before_id=before_id)
        return [self._record(r, with_history=False) for r in rows]

    def count_by_state(self) -> dict[State, int]:
        """How many effects of this namespace are in each state (as reads report it)."""
        return self._store.count_by_state(self.namespace)

    def group_steps(self, group_key: str) -> list[EffectRecord]:
        """The steps of a saga group, newest first (an undo is never one: it has no group)."""
        group = validate.text(group_key, "group_key", 512, required=True)
        rows = self._store.effects(self.namespace, group_key=group)
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
        return self.approval(operations.approve(self._store, self.namespace, self._redact,
                                                approval_id, by=by, note=note))

    def deny(self, approval_id: str, *, by: str, reason: str | None = None) -> ApprovalRecord:
        """Deny a pending request: its effect becomes DENIED, and stays so."""
        return self.approval(operations.deny(self._store, self.namespace, self._redact,
                                             approval_id, by=by, reason=reason))

    def list_approvals(self, state: ApprovalState | str | None = "pending",
                       ) -> list[ApprovalRecord]:
        """Approval requests, newest first (``state=None`` for all)."""
        rows, wanted = reads.approval_rows(self._store, self.namespace, state)
        out = [approval_record(r) for r in rows]
        return [a for a in out if wanted is None or a.state is wanted]

    async def aapprove(self, approval_id: str, **kwargs: Any) -> ApprovalRecord:
        """:meth:`approve` without blocking the event loop."""
        return await self._store.on_worker(self.approve, approval_id, **kwargs)

    async def adeny(self, approval_id: str, **kwargs: Any) -> ApprovalRecord:
        """:meth:`deny` without blocking the event loop."""
        return await self._store.on_worker(self.deny, approval_id, **kwargs)

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
        from . import sagas  # on first use: a worker's start does not load it
        return sagas.unwind(self, group_key, by)

    async def aunwind(self, group_key: str, **kwargs: Any) -> UnwindReport:
        """:meth:`unwind` without blocking the event loop."""
        return await self._store.on_worker(self.unwind, group_key, **kwargs)

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
        if not isinstance(older_than, datetime.timedelta) or (  # its own seconds, not a
                seconds := datetime.timedelta.total_seconds(older_than)) < 0:  # subclass's
            raise ConfigError("older_than must be a non-negative datetime.timedelta")
        if not isinstance(dry_run, bool):
            raise ConfigError("dry_run must be a bool")
        if dry_run:
            return self._store.prune(self.namespace, seconds, dry_run=True)
        try:
            count = self._store.prune(self.namespace, seconds)
        finally:  # a prune whose reply was lost may have pruned: forget either way
            for gate in list(_GATES):  # this process's gates on this store, by any URL
                if gate.namespace == self.namespace and gate._store.secret == self._store.secret:
                    gate._memo.clear()
        log.info("pruned %d effects older than %s", count, older_than)
        return count

    async def aprune(self, older_than: datetime.timedelta, **kwargs: Any) -> int:
        """:meth:`prune` without blocking the event loop."""
        return await self._store.on_worker(self.prune, older_than, **kwargs)

    # -- principals, the operator's console ----------------------------------------------------

    def add_principal(self, name: str, role: str) -> tuple[principals.Principal, str]:
        """Add a named ``operator`` or ``agent`` to this namespace; the principal and its token,
        shown this once (the store keeps only a salted hash). See :mod:`effectgate.principals`."""
        return principals.add_principal(self, name, role)

    def authenticate(self, token: str) -> principals.Principal:
        """The principal ``token`` proves in this namespace; :class:`Unauthenticated` for a
        missing, malformed, unknown or revoked token (one indexed read)."""
        return principals.authenticate(self, token)

    def revoke_principal(self, name: str) -> principals.Principal:
        """Revoke ``name``: its token stops authenticating at once (revoking twice is
        harmless); :class:`UnknownEffect` when there is no such principal."""
        return principals.revoke_principal(self, name)

    def list_principals(self) -> list[principals.Principal]:
        """Every principal of this namespace, by name (revoked ones included)."""
        return principals.list_principals(self)

    def acting_as(self, principal: principals.Principal) -> principals.Acting:
        """This gate as ``principal``: approve, deny, resolve, reconcile and unwind with its name
        as ``by``, refused (:class:`Forbidden`) to an agent. The store is asked before each act:
        a principal of another namespace, revoked, or never issued by this store is refused
        (:class:`Unauthenticated`), with nothing written."""
        return principals.Acting(self, principal)

    def reconcile(self, key: str, *, by: str) -> EffectRecord:
        """Ask the registered reconcile hook about the AMBIGUOUS effect ``key`` now (an
        operator's "Reconcile now"); its verdict is recorded as by ``by`` via the hook. The
        effect after it (still AMBIGUOUS when the hook could not tell). :class:`InvalidTransition`
        when it is not AMBIGUOUS or a lapsed lease's grace period runs (as for a ``begin``),
        :class:`ConfigError` when no hook for its type is registered in this process."""
        return self.get(operations.reconcile(self._store, self.namespace, self._flow,
                                             self._reconcilers, key, by=by, kind=self.kind))

    def ambiguous_queue(self, *, before_id: int | None = None, limit: int = 50,
                        ) -> tuple[list[EffectRecord], int | None]:
        """One page of AMBIGUOUS (and lapsed IN_FLIGHT) effects, newest first, and the cursor
        of the next page (None when nothing older is left). A page walks the primary key in
        bounded windows, so it costs the same however many effects the store holds (see
        :mod:`effectgate.store.queue`); a page may hold fewer than ``limit`` with more
        beyond its cursor."""
        page = reads.ambiguous_rows(self._store, self.namespace, before_id=before_id,
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
        def decorate(fn: Callable[..., T]) -> Callable[..., T]:
            return gate_function(self, fn, key, **options)

        return decorate


def _webhooks(webhooks: object) -> Webhooks | None:
    if webhooks is False or (webhooks is None and "EFFECTGATE_WEBHOOK_URL" not in os.environ):
        return None
    from .webhooks import from_option  # threads and HMAC: only once there are webhooks

    return from_option(webhooks)
