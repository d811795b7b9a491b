"""The state machine, and nothing else: no I/O, no clock, no logging.

Given the stored row (or none) — which carries the store's clock as ``now`` — the validated
request and, where needed, the approval, :func:`begin_step` returns the next step of a
``begin``: an :class:`Answer` (the decision), :data:`LAPSE` (mark a lapsed lease AMBIGUOUS),
:data:`RECONCILE` (ask the reconcile hook), :class:`ReadApproval`, or a :class:`Move` to
IN_FLIGHT, PENDING_APPROVAL or DENIED. The gate performs the step against the store and asks
again with what it read (a bounded loop, written once: :func:`effectgate.flow.begin_steps`).

The rules of settling live here too: :func:`resolution` (what an operator or a reconcile hook
may settle, and how spend moves), :func:`outcome_spend_delta` (how a holder's report moves
spend), and the approval rules (:func:`approval_status`, :func:`check_approval`).

Transitions::

    (none) ──begin──▶ IN_FLIGHT | PENDING_APPROVAL | DENIED
    IN_FLIGHT ──report──▶ COMMITTED | FAILED | AMBIGUOUS     (the holder, with its proof)
    IN_FLIGHT ──lease lapses──▶ AMBIGUOUS                    (never free)
    AMBIGUOUS ──resolve / reconcile / the lapsed holder's late report──▶ COMMITTED | FAILED
    FAILED ──begin──▶ IN_FLIGHT (attempt n+1) | PENDING_APPROVAL | DENIED
    PENDING_APPROVAL ──approve, begin──▶ IN_FLIGHT;  ──deny──▶ DENIED (final)
    DENIED (policy or budget) ──begin──▶ asked again;  COMMITTED: terminal
"""

from __future__ import annotations

import datetime
import unicodedata
from typing import TYPE_CHECKING, NamedTuple, cast

from .errors import InvalidTransition, PayloadMismatch, UnknownEffect
from .states import ApprovalState, Decision, Outcome, State

if TYPE_CHECKING:
    from .governance import Charge
    from .request import Request
    from .store.rows import ApprovalRow, CommittedHead, EffectHead, EffectRow

__all__ = [
    "APPROVAL_REQUESTED",
    "APPROVER_DENIED",
    "LAPSE",
    "RECONCILE",
    "Answer",
    "Lapse",
    "Move",
    "ReadApproval",
    "Reconcile",
    "Resolution",
    "Step",
    "adopts_lost_move",
    "adopts_lost_reservation",
    "approval_status",
    "begin_step",
    "check_approval",
    "effective_state",
    "lapsed",
    "lease_live",
    "outcome_spend_delta",
    "over_ceiling",
    "over_its_limit",
    "reads_first",
    "reconcile_wait",
    "resolution",
    "same_principal",
]

APPROVAL_REQUESTED = "approval requested: waiting for a human"
"""The reason of the begin that opened an approval request (later begins read ``_WAITING``):
nobody can have answered a request before this begin made it."""
APPROVER_DENIED = "approval denied"  # the reason of a DENIED a person decided: final
_MAX_RETRY_AFTER = 1.0
_WAITING = "waiting for a human's approval"


# The steps are immutable values made on every begin: named tuples (a frozen dataclass costs
# a millisecond or two of every start to make, and more per instance). LAPSE and RECONCILE are
# the only instances of their classes.


class Answer(NamedTuple):
    """Answer the caller with ``decision``; nothing to write."""

    decision: Decision
    reason: str | None = None
    retry_after_seconds: float | None = None
    approval_id: str | None = None


class Lapse:
    """The row is IN_FLIGHT past its lease: compare-and-set it to AMBIGUOUS, then ask again."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Lapse()"


class Reconcile:
    """The row is AMBIGUOUS and a reconcile hook may be asked: ask it; on a verdict, settle
    the row (see :func:`resolution`) and ask again; without one, answer ``blocked``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Reconcile()"


class ReadApproval(NamedTuple):
    """The row waits for approval ``approval_id``: read it, then ask again with it."""

    approval_id: str | None


class Move(NamedTuple):
    """Write the effect into state ``to`` (compare-and-set from ``expected``; None: insert a
    new key), and answer ``decision``.

    ``attempt_increment`` 1 starts attempt n+1 after FAILED; ``consume_approval`` is the
    approved request the move uses up; ``forget_approval`` an expired one it replaces;
    ``request_approval`` asks for a new one; ``charges`` count the estimated cost against
    spend ceilings (all or nothing)."""

    to: State
    decision: Decision
    expected: State | None = None
    attempt_increment: int = 0
    reason: str | None = None
    consume_approval: str | None = None
    forget_approval: str | None = None
    request_approval: bool = False
    charges: tuple[Charge, ...] = ()
    cost: int = 0
    budget_warning: str | None = None


Step = Answer | Lapse | Reconcile | ReadApproval | Move
LAPSE = Lapse()
RECONCILE = Reconcile()
_DUPLICATE = Answer(Decision.DUPLICATE)
_DUPLICATE_PRUNED = Answer(Decision.DUPLICATE, "its stored result was pruned")



# -- the lapsed-lease rule: its one Python home ------------------------------------------------
# A lease is live while its end is not before the store's clock (``lease_expires_at >= now``,
# both read in the same statement); an IN_FLIGHT effect past it is AMBIGUOUS, never free.
# The store's SQL says the same from one home, ``effectgate.store.schema.in_flight_live`` and
# ``in_flight_lapsed``, which every statement that asks builds on
# (``tests/test_lapsed_rule.py`` holds both homes to the same answers and finds any copy).


def lease_live(row: EffectHead | EffectRow) -> bool:
    """Whether ``row``'s lease has an end that the store's clock has not passed."""
    return row.lease_expires_at is not None and row.lease_expires_at >= row.now


def lapsed(row: EffectHead | EffectRow) -> bool:
    """Whether ``row`` is IN_FLIGHT past its lease (so it reads, and is, AMBIGUOUS)."""
    return row.state is State.IN_FLIGHT and row.lease_expires_at is not None and (
        not lease_live(row))


def effective_state(row: EffectHead | EffectRow) -> State:
    """The state reads report: an IN_FLIGHT effect past its lease is AMBIGUOUS at once."""
    return State.AMBIGUOUS if lapsed(row) else row.state

def begin_step(row: EffectHead | CommittedHead | None, req: Request,
               approval: ApprovalRow | None = None, *, reconcilable: bool = False) -> Step:
    """The next step of a ``begin`` of ``req`` that found ``row`` (a COMMITTED effect may be
    read as a :class:`~effectgate.store.rows.CommittedHead`: all a repeat needs).

    ``reconcilable``: a reconcile hook is registered for the effect type. Raises
    :class:`PayloadMismatch` when the key belongs to another payload or effect type."""
    if row is None:
        return _govern(req, None, None)
    if row.effect_type != req.effect_type:
        raise PayloadMismatch(
            f"effect key {req.key!r} belongs to effect type {row.effect_type!r}, not "
            f"{req.effect_type!r}: one key names one consequence (give this action its own "
            "key)",
            key=req.key, state=row.state.value, effect_id=row.id,
            reason=f"effect type {req.effect_type} proposed for a key of {row.effect_type}",
        )
    if row.payload_hash != req.payload_hash:
        raise PayloadMismatch(
            f"effect key {req.key!r} was first used with another payload "
            "(a key collision, or the same key for a different action)",
            key=req.key, state=row.state.value, effect_id=row.id,
            reason="another payload hash",
        )
    state = row.state
    if state is State.COMMITTED:
        return _DUPLICATE_PRUNED if row.pruned_at is not None else _DUPLICATE
    row = cast("EffectHead", row)  # only a COMMITTED effect is read as a CommittedHead
    if state is State.IN_FLIGHT:
        remaining = (row.lease_expires_at or 0.0) - row.now
        if lease_live(row):
            return Answer(Decision.IN_FLIGHT, "another holder is executing it",
                          retry_after_seconds=round(min(max(remaining, 0.05),
                                                        _MAX_RETRY_AFTER), 3))
        return LAPSE
    if state is State.AMBIGUOUS:
        return _ambiguous(row, req, reconcilable)
    if state is State.FAILED:
        if row.attempt >= req.max_attempts:
            return Answer(Decision.DENIED, f"max_attempts ({req.max_attempts}) reached")
        return _govern(req, row, None, attempt_increment=1)
    if state is State.PENDING_APPROVAL:
        if approval is None or approval.id != row.approval_id:
            return ReadApproval(row.approval_id)
        status = approval_status(approval)
        if status is ApprovalState.PENDING:
            return Answer(Decision.APPROVAL_REQUIRED, _WAITING, approval_id=approval.id)
        if status is ApprovalState.APPROVED:
            if _costs_more(req, approval):  # a yes to a cost, never to a larger one
                return _govern(req, row, None, forget=approval.id)
            return _govern(req, row, approval.id)
        # Expired (or gone): ask afresh, and forget what the old request showed.
        return _govern(req, row, None, forget=approval.id)
    # DENIED: an approver's "no" holds; a policy or budget refusal is asked again.
    if (row.reason or "").startswith(APPROVER_DENIED):
        return Answer(Decision.DENIED, row.reason)
    gov = req.governance
    if gov is not None and gov.deny and row.reason == gov.deny:
        return Answer(Decision.DENIED, gov.deny)
    return _govern(req, row, None)


def _costs_more(req: Request, approval: ApprovalRow) -> bool:
    """Whether ``req`` declares a larger cost than the person who approved ``approval`` saw
    (or a cost where they saw none, or none where they saw one): the payload hash binds the
    arguments, not the estimate a caller declares beside them, so an approval given at $150
    must not run the call at $9M, nor at a cost left out (which no ceiling counts)."""
    cost, seen = req.estimated_cost_micros, approval.estimated_cost_micros
    if cost is None:
        return seen is not None
    return seen is None or cost > seen


def _ambiguous(row: EffectHead, req: Request, reconcilable: bool) -> Step:
    reason = row.reason or "the outcome is unknown"
    gov = req.governance
    if not reconcilable or (gov is not None and gov.on_ambiguous == "block"):
        return Answer(Decision.BLOCKED, reason)
    wait = reconcile_wait(row, req.reconcile_grace_seconds, req.lease_seconds)
    if wait > 0:
        return Answer(Decision.BLOCKED, f"{reason}; the reconcile hook is asked once the "
                      f"grace period ends, in {wait:.0f}s")
    return RECONCILE


def reconcile_wait(row: EffectHead | EffectRow, grace: float | None,
                   lease_seconds: float = 0.0) -> float:
    """Seconds before the reconcile hook may be asked about ``row`` (none left when not
    positive). A lapsed lease's holder may be slow, not dead, and the vendor may not know of
    its request yet: the hook waits a grace period past the lapse, ``grace`` (the policy's),
    else the longer of the holder's own lease (as long as it held it) and ``lease_seconds``
    (the lease a begin of its type takes). An outcome reported AMBIGUOUS (no lease) may be
    asked at once."""
    if row.lease_expires_at is None:
        return 0.0
    if grace is None:
        grace = max(lease_seconds, row.lease_expires_at - (
            row.attempt_started_at or row.lease_expires_at))
    return row.lease_expires_at + grace - row.now


def _govern(req: Request, row: EffectHead | None, consume: str | None, *,
            attempt_increment: int = 0, forget: str | None = None) -> Move:
    """Move a new key, or an existing effect, as far towards execution as the policy lets it:
    a deny rule refuses first; then a declared cost alone over the limit of a ceiling that
    counts the call (DENIED, :func:`over_its_limit`, unless it runs on an approval already
    given: see :func:`over_ceiling`); then an approval is asked for; then the charges."""
    expected = None if row is None else row.state
    gov = req.governance
    if gov is None:
        return Move(State.IN_FLIGHT, Decision.EXECUTE, expected, attempt_increment,
                    consume_approval=consume, forget_approval=forget)
    if gov.deny:
        return Move(State.DENIED, Decision.DENIED, expected, attempt_increment,
                    reason=gov.deny, forget_approval=forget)
    charges: tuple[Charge, ...] = ()
    warning = gov.budget_warning  # a ceiling no declared cost can count
    if gov.counts_spend:
        charges = gov.charges(req.effect_type, req.run_id, req.agent_id)
        # A cost alone over the limit of a ceiling that counts this call (charges() puts
        # that ceiling first) runs under it in no window: refused here, before a human is
        # asked for a yes that could run nothing, and before the store is asked to charge.
        # A yes already given (``consume``) is the store's to refuse, keeping it unconsumed.
        if consume is None and charges and (gov.cost or 0) > charges[0].limit:
            return Move(State.DENIED, Decision.DENIED, expected, attempt_increment,
                        reason=over_its_limit(charges[0].label, approved=False),
                        forget_approval=forget)
    if gov.approval is not None and consume is None:
        return Move(State.PENDING_APPROVAL, Decision.APPROVAL_REQUIRED, expected,
                    attempt_increment, reason=APPROVAL_REQUESTED, forget_approval=forget,
                    request_approval=True)
    if gov.counts_spend:
        warning = gov.unscoped(req.effect_type, req.run_id, req.agent_id)
    return Move(State.IN_FLIGHT, Decision.EXECUTE, expected, attempt_increment,
                consume_approval=consume, forget_approval=forget, charges=charges,
                cost=gov.cost or 0, budget_warning=warning)


def reads_first(move: Move) -> bool:
    """Whether a store that can insert a new key in one call reading first (Postgres) does so
    for ``move``: a move that consumes, forgets or requests an approval needs a transaction."""
    return not (move.consume_approval or move.forget_approval or move.request_approval)


def over_ceiling(move: Move, label: str) -> Move | Answer:
    """The step instead of ``move`` when the ceiling ``label`` refused its charge: the refusal
    recorded (DENIED; the next begin asks again), or, for a move that would have consumed an
    approval, only answered: the approved request keeps waiting, unconsumed, for room to run
    (a human's yes is never asked for twice, and never lost to a budget). When the move's
    cost alone is over that ceiling's limit no room will ever come, and the reason says so
    (:func:`over_its_limit`) instead of "reached"."""
    reason = _refused_by(move, label)
    if move.consume_approval is not None:
        return Answer(Decision.DENIED, reason, approval_id=move.consume_approval)
    return Move(State.DENIED, Decision.DENIED, move.expected, move.attempt_increment,
                reason=reason, forget_approval=move.forget_approval)


def _refused_by(move: Move, label: str) -> str:
    """Why the ceiling ``label`` refused ``move``'s charge."""
    for charge in move.charges:
        if charge.label == label and move.cost > charge.limit:
            return over_its_limit(label, approved=move.consume_approval is not None)
    return f"spend ceiling reached: {label}"


def over_its_limit(label: str, *, approved: bool) -> str:
    """What a call whose declared cost alone is over the limit of the ceiling ``label`` is
    told: no window ever makes room for it (``approved``: its approval is kept, unconsumed —
    the ceiling is the operator's to raise, and then the next call runs on that yes)."""
    said = (f"its estimated cost alone is over the {label}: it will not run under that "
            "ceiling")
    if approved:
        return (f"{said}; its approval is kept, unconsumed, and the next call runs on it once "
                "the ceiling is raised (or at a cost within it)")
    return said


class Resolution(NamedTuple):
    """A settlement an operator or reconcile hook may make: compare-and-set from
    ``expected`` to ``to``, moving the spend counters by ``spend_delta``; ``forced`` when only
    ``force=True`` allowed it."""

    expected: State
    to: State
    spend_delta: int
    forced: bool


def resolution(row: EffectHead, outcome: Outcome, *, force: bool = False) -> Resolution:
    """What settling ``row`` as ``outcome`` (committed or failed) does, or
    :class:`InvalidTransition` when it may not be settled so.

    AMBIGUOUS and lapsed IN_FLIGHT effects may be settled either way; a FAILED one may be found
    to have happened after all (committed). A live lease is refused unless ``force``: its
    holder may still be acting. FAILED releases the spend a held attempt counted; COMMITTED
    after FAILED counts it again (the money was spent, ceiling or not)."""
    state = row.state
    forced = False
    if state is State.IN_FLIGHT and lease_live(row):
        if not force:
            assert row.lease_expires_at is not None  # a live lease has an end
            until = datetime.datetime.fromtimestamp(row.lease_expires_at, datetime.UTC)
            raise InvalidTransition(
                f"cannot resolve {row.key!r}: its holder's lease is live for another "
                f"{row.lease_expires_at - row.now:.0f}s (until {until:%Y-%m-%d %H:%M:%S} UTC "
                "on the store's clock); wait for it to lapse, or force it if you know the "
                "holder is gone",
                key=row.key, state=state.value, reason="lease is live", effect_id=row.id,
            )
        forced = True
    elif not (state in (State.IN_FLIGHT, State.AMBIGUOUS)
              or (state is State.FAILED and outcome is Outcome.COMMITTED)):
        raise InvalidTransition(
            f"cannot resolve {row.key!r} as {outcome.value}: it is {state.value}"
            + (" (terminal)" if state is State.COMMITTED else ""),
            key=row.key, state=state.value, effect_id=row.id,
        )
    held = state in (State.IN_FLIGHT, State.AMBIGUOUS)
    delta = 0
    if row.budget_keys and row.estimated_cost_micros:
        if held and outcome is Outcome.FAILED:
            delta = -row.estimated_cost_micros
        elif not held and outcome is Outcome.COMMITTED:
            delta = row.estimated_cost_micros
    to = State.COMMITTED if outcome is Outcome.COMMITTED else State.FAILED
    return Resolution(state, to, delta, forced)


def outcome_spend_delta(outcome: Outcome, estimated: int | None, actual: int | None) -> int:
    """How the counters an attempt was charged to move when its holder reports: FAILED
    releases what it held, COMMITTED corrects the estimate by the actual cost, AMBIGUOUS
    holds."""
    held = estimated or 0
    if outcome is Outcome.FAILED:
        return -held
    if outcome is Outcome.COMMITTED and actual is not None:
        return actual - held
    return 0


def adopts_lost_reservation(row: EffectHead, secret_hash: str) -> bool:
    """Whether a begin whose reserving insert's reply was lost may take ``row`` as its own
    reservation: the row still carries the secret issued with that insert, and nobody has
    acted since — it is IN_FLIGHT at the attempt and token the insert wrote (1 and 1), under
    a live lease. An operator's resolve or a lapse keeps the secret but moves the row on (a
    new token, another state, or the lease past its end): such a row is decided on afresh,
    never executed as though the lost insert still held it."""
    return (row.lease_secret is not None and row.lease_secret == secret_hash
            and row.state is State.IN_FLIGHT and row.attempt == 1 and row.token == 1
            and lease_live(row))


def adopts_lost_move(row: EffectHead, secret_hash: str, token: int) -> bool:
    """Whether a begin whose move into IN_FLIGHT (a new attempt, an approval consumed) lost
    its reply may take ``row`` as that move's: the row carries the secret issued with it, at
    the ``token`` the move wrote, IN_FLIGHT under a live lease (nobody has acted since)."""
    return (row.state is State.IN_FLIGHT and row.token == token
            and row.lease_secret is not None and row.lease_secret == secret_hash
            and lease_live(row))


def approval_status(approval: ApprovalRow) -> ApprovalState:
    """The state of an approval request now: a pending or approved one past its expiry reads
    as EXPIRED."""
    if approval.state in (ApprovalState.PENDING, ApprovalState.APPROVED) and (
        approval.expires_at < approval.now
    ):
        return ApprovalState.EXPIRED
    return approval.state


def same_principal(a: str | None, b: str | None) -> bool:
    """True when two names are one identity: compared after NFKC, case folding, and removing
    format characters (zero-width, bidi controls) and surrounding white space."""
    if a is None or b is None:
        return False
    return _identity(a) == _identity(b)


def _identity(name: str) -> str:
    text = unicodedata.normalize("NFKC", name)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return " ".join(text.casefold().split())


def check_approval(approval: ApprovalRow | None, approval_id: str, by: str, *,
                   approving: bool) -> ApprovalRow:
    """The pending request ``approval_id``, or the error that says why ``by`` may not decide
    it: :class:`UnknownEffect` (no such request here), :class:`InvalidTransition` (not pending,
    or the requester approving its own request where the policy forbids it)."""
    if approval is None:
        raise UnknownEffect(f"no approval with id {approval_id!r}")
    status = approval_status(approval)
    if status is not ApprovalState.PENDING:
        raise InvalidTransition(f"approval {approval_id} is {status.value}, not pending",
                                key=approval.key, state=status.value,
                                effect_id=approval.effect_id)
    # An unattributed request (no agent identity) cannot be judged here: its record says so
    # (``ApprovalRecord.unattributed``), for the approver to weigh.
    if approving and not approval.allow_self_approval and same_principal(
        by, approval.requested_by
    ):
        raise InvalidTransition(
            f"{by} requested {approval.key!r} and cannot approve its own request",
            key=approval.key, state=status.value, reason="self-approval is not allowed",
            effect_id=approval.effect_id,
        )
    return approval
