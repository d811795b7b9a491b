"""State-machine tests (issue 7): random sequences of begin, report, extend_lease, lease lapse,
resolve, approve, deny, prune and unwind against a plain-Python reference model of DESIGN's
States and Decisions, on SQLite and on Postgres.

After every step the gate's answer (decision or typed error) must match the model, and so must
every stored effect (state, attempt, fencing token, result, tombstone, history length), the
spend counter, and the approvals. Along the way: a fencing token never decreases, a COMMITTED
key never executes again (nor does a COMMITTED undo), AMBIGUOUS moves only by ``resolve``, and
spend never passes the ceiling -- except where an operator resolves a FAILED attempt as
COMMITTED, which counts money already spent (the model knows when).

The kernel issue's edges are in the model too: a lapsed holder's own late report settles its
AMBIGUOUS effect (only while nobody has acted since); a caller presenting another holder's
token or secret is refused; a live lease is not resolvable; a gate in another namespace can
neither read, report, extend nor resolve; the same key under another effect type is refused;
and a reconcile hook (on ``a``, whose vendor is Stripe) is asked only once a lapsed lease's
grace period has passed, a reconciled failure keeping the vendor key.

Four keys share one saga group: ``a`` (ungoverned), ``g`` (approval always), ``p`` and ``q``
(one spend ceiling; no compensator is registered for them, so unwinding ``p`` fails, and ``q``
declares no compensation: irreversible). Two payload variants make ``PayloadMismatch`` happen.
Each example runs in a fresh namespace of one shared store (``effectgate.testing.in_namespace``).
``EFFECTGATE_STATEFUL_EXAMPLES`` and ``EFFECTGATE_STATEFUL_STEPS`` tune the size (default 1000
examples of 15 steps each, per backend). The same machine drives the gate's async twins
(``abegin``, ``areport``, ``aextend_lease``, ``aresolve``, …) on one event loop, over
``EFFECTGATE_STATEFUL_ASYNC_EXAMPLES`` examples (default 250): on Postgres that is the native
async driver, another code path to the same store, checked against the same model.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import text

import effectgate as eg
from effectgate.testing import in_namespace, lapse_leases

EXAMPLES = int(os.environ.get("EFFECTGATE_STATEFUL_EXAMPLES", "1000"))
STEPS = int(os.environ.get("EFFECTGATE_STATEFUL_STEPS", "15"))
ASYNC_EXAMPLES = int(os.environ.get("EFFECTGATE_STATEFUL_ASYNC_EXAMPLES", "250"))

IN_FLIGHT, COMMITTED, FAILED = "in_flight", "committed", "failed"
AMBIGUOUS, PENDING, DENIED = "ambiguous", "pending_approval", "denied"
D = eg.Decision
Expected = tuple[eg.Decision, str | None]  # a decision, and how its reason starts

GROUP = "trip"
CEILING = 100
MAX_ATTEMPTS = 2
PLAIN, GOV, PAY = "plain.step", "gov.x", "pay.y"
TYPES = {"a": PLAIN, "g": GOV, "p": PAY, "q": PAY}
UNDO = {"a": {"undo": "a"}, "g": {"undo": "g"}, "p": {"undo": "p"}, "q": None}
POLICY = {"effects": {GOV: {"approval": "always"},
                      PAY: {"budget": {"per_effect_type_micros": CEILING}}}}
SCOPE = f"{PAY}|effect_type|{PAY}"

# How often each of the kernel issue's edges was reached, over a whole run (each must be).
SEEN: dict[str, int] = {}


def seen(what: str) -> None:
    SEEN[what] = SEEN.get(what, 0) + 1


KEYS = st.sampled_from(sorted(TYPES))
VARIANTS = st.sampled_from((0, 0, 0, 1))
COSTS = st.sampled_from((None, 30, 60, 60, 150))
PICK = st.integers(0, 31)
# A holder's own proof (0), a wrong token (-1, 1), or its own token with another holder's
# secret (SECRET).
SECRET = 7
OFFSETS = st.sampled_from((0, 0, 0, -1, 1, SECRET))
# (key, payload variant, estimated cost, through a second gate (another process's view),
# max_attempts of this call: the gate's default, or 1)
BEGIN = st.tuples(KEYS, VARIANTS, COSTS, st.sampled_from((False, False, True)),
                  st.sampled_from((None, None, 1)))
OUTCOMES = st.sampled_from((COMMITTED, COMMITTED, FAILED, AMBIGUOUS))
VALUES = st.sampled_from((0, 1))
VERDICTS = st.sampled_from((COMMITTED, FAILED))
REPORT = st.tuples(PICK, OUTCOMES, VALUES, st.sampled_from((None, 0, 20)), OFFSETS)


@dataclass
class Eff:
    """The model of one stored effect."""

    key: str
    effect_type: str
    variant: Any
    effect_id: int | None
    state: str = IN_FLIGHT  # as stored: a lapsed lease is still stored IN_FLIGHT
    attempt: int = 1
    token: int = 0
    hist: int = 0
    lapsed: bool = False
    result: Any = None
    pruned: bool = False
    approval_id: str | None = None
    reported: bool = False  # the state was set by its holder's report (a repeat is accepted)
    charged: bool = False
    est: int | None = None
    actual: int | None = None  # the actual cost its holder reported (a new attempt clears it)
    compensation: Any = None
    compensates: int | None = None
    why: str | None = None  # reason of an AMBIGUOUS or DENIED effect
    human_denied: bool = False
    by_lease: bool = False  # AMBIGUOUS because the lease lapsed: its holder may report late
    recent: bool = False  # the lease lapsed moments ago: inside the reconcile grace period
    vendor_attempt: int = 1  # the attempt the current vendor key was first issued for
    verdict: Any = None  # (outcome, value) of the operator's resolve, while it is the last act

    @property
    def effective(self) -> str:
        """What reads say: a lapsed lease is AMBIGUOUS at once."""
        return AMBIGUOUS if self.state == IN_FLIGHT and self.lapsed else self.state

    def moved(self, state: str, *, token: int = 0, attempt: int = 0) -> None:
        """One transition: a history line; a pruned tombstone is live again."""
        self.state, self.token, self.attempt = state, self.token + token, self.attempt + attempt
        self.hist += 1
        self.lapsed = self.reported = self.pruned = self.by_lease = self.recent = False
        self.verdict = None


_TWINS = frozenset({"begin", "report", "extend_lease", "resolve", "get", "approve", "deny",
                    "unwind", "prune"})


class AsyncCaller:
    """A gate whose calls go through their async twins (``begin`` → ``await abegin``), each
    run to completion on one event loop: the async caller's path, asserted like the sync."""

    def __init__(self, gate: eg.Gate, loop: asyncio.AbstractEventLoop) -> None:
        self._gate, self._loop = gate, loop

    def __getattr__(self, name: str) -> Any:
        if name not in _TWINS:
            return getattr(self._gate, name)
        twin = getattr(self._gate, f"a{name}")
        return lambda *args, **kwargs: self._loop.run_until_complete(twin(*args, **kwargs))

    def in_namespace(self, namespace: str) -> AsyncCaller:
        return AsyncCaller(self._gate.in_namespace(namespace), self._loop)

    @property
    def gate(self) -> eg.Gate:
        return self._gate


def _gate_of(gate: Any) -> eg.Gate:
    return gate.gate if isinstance(gate, AsyncCaller) else gate  # type: ignore[no-any-return]


class GateMachine(RuleBasedStateMachine):
    """The gate against the reference model, one fresh namespace per example."""

    def __init__(self, base: eg.Gate, other: eg.Gate, prefix: str, runs: list[int],
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__()
        runs[0] += 1
        self.gate: Any = in_namespace(base, f"{prefix}{runs[0]}")
        self.other: Any = in_namespace(other, self.gate.namespace)  # no memo: reads the store
        if loop is not None:
            self.gate, self.other = AsyncCaller(self.gate, loop), AsyncCaller(self.other, loop)
        self.foreign = self.gate.in_namespace(f"{self.gate.namespace}-x")  # empty, and apart
        self.gate.compensator("plain.*")(self._undo)
        self.gate.compensator("gov.*")(self._undo)
        for g in (self.gate, self.other):
            g.reconciler(PLAIN)(self._vendor)
        self.vendor_says = "unknown"
        self.verdict_index = 0
        self.asked: list[str] = []  # keys the reconcile hook was asked about
        self.expect_asked: list[str] = []
        self.vendor_keys: dict[tuple[str, int], str] = {}
        self.effects: dict[str, Eff] = {}
        self.spent = 0
        self.over_ok = False  # resolve FAILED -> COMMITTED re-counts spend past the ceiling
        self.memo: dict[str, Any] = {}  # COMMITTED results this process remembers
        self.holders: list[eg.BeginDecision] = []
        self.approvals: dict[str, str] = {}
        self.approval_ids: list[str] = []
        self.committed: set[str] = set()
        self.tokens: dict[str, int] = {}
        self.undo_mode = "ok"
        self.undone: list[str] = []
        self.undo_done: set[str] = set()  # keys COMMITTED before this unwind began
        self.violations: list[str] = []

    # -- the compensator ---------------------------------------------------------------

    def _undo(self, record: eg.EffectRecord, compensation: Any) -> Any:
        if compensation != UNDO[record.key] or f"compensate:{record.key}" in self.undo_done:
            self.violations.append(f"undo of {record.key} ran with {compensation!r}")
        self.undone.append(record.key)
        if self.undo_mode == "refused":
            raise eg.NotExecuted("the vendor refused the undo")
        if self.undo_mode == "lost":
            raise RuntimeError("connection reset mid-undo")
        return {"undone": record.key}

    # -- the vendor (reconcile hook) ---------------------------------------------------

    def _vendor(self, record: eg.EffectRecord) -> Any:
        self.asked.append(record.key)
        self._next_verdict()
        if self.vendor_says == "raise":
            raise RuntimeError("the vendor's API is down")
        if self.vendor_says == "committed":
            return eg.Reconciled("committed", {"vendor": record.key}, "seen at the vendor")
        return self.vendor_says

    # The vendor's answers come round in turn (so that every verdict is reached), from a
    # starting point each example draws; a rule can jump to another.
    VERDICTS_IN_TURN = ("committed", "failed", "unknown", "failed", "raise")

    def _upcoming_verdict(self) -> str:
        return self.VERDICTS_IN_TURN[self.verdict_index % len(self.VERDICTS_IN_TURN)]

    def _next_verdict(self) -> None:
        self.vendor_says = self._upcoming_verdict()
        self.verdict_index += 1

    @initialize(start=st.integers(0, 4))
    def vendor_says_at_first(self, start: int) -> None:
        """Where in its round of answers the vendor starts."""
        self.verdict_index = start

    @rule(start=st.integers(0, 4))
    def vendor_will_say(self, start: int) -> None:
        """The vendor's next answer changes."""
        self.verdict_index = start

    # -- begin -------------------------------------------------------------------------

    # Hypothesis orders rules by their number of arguments, then by name, and favours the
    # first and the last: rules take one argument (a tuple where they need several) so that
    # ``begin`` comes first, and ``call`` (two) last; the duplicated rules make begin and
    # report the common steps.

    @rule(call=BEGIN)
    def begin(self, call: tuple[str, int, int | None, bool, int | None]) -> None:
        self._begin(*call)

    @rule(call=BEGIN)
    def begin_again(self, call: tuple[str, int, int | None, bool, int | None]) -> None:
        self._begin(*call)

    @rule(begin=BEGIN, then=st.tuples(OUTCOMES, VALUES))
    def call(self, begin: tuple[str, int, int | None, bool, int | None],
             then: tuple[str, int]) -> None:
        """The decorator's path: begin, and on ``execute`` run and report at once."""
        d = self._begin(*begin)
        if d is not None and d.decision is D.EXECUTE:
            self._report(d, *then, begin[2], 0)

    def _begin(self, key: str, variant: int, cost: int | None, other: bool,
               limit: int | None) -> eg.BeginDecision | None:
        call = {"effect_type": TYPES[key], "key": key, "payload": {"key": key, "v": variant},
                "agent_id": "agent", "group_key": GROUP, "compensation": UNDO[key],
                "estimated_cost_micros": cost, "max_attempts": limit,
                "vendor": "stripe" if key == "a" else None}
        gate = self.other if other else self.gate
        e = self.effects.get(key)
        if e is not None and e.variant != variant:
            with pytest.raises(eg.PayloadMismatch):
                gate.begin(**call)
            self._check_get(key)
            return None
        d = gate.begin(**call)
        if e is None:
            e = self.effects[key] = Eff(key, TYPES[key], variant, d.effect_id,
                                        compensation=UNDO[key])
            expected, reason = self._advance(e, cost, d)
        else:
            expected, reason = self._settle(e, cost, d, not other, limit or MAX_ATTEMPTS)
        assert self.asked == self.expect_asked, (self.asked, self.expect_asked)
        assert d.decision is expected, (key, d, e)
        assert (d.effect_id, d.state.value, d.attempt, d.lease_token) == (
            e.effect_id, e.state, e.attempt, e.token), (d, e)
        if reason is not None:
            assert (d.reason or "").startswith(reason), (d.reason, reason)
        if expected is D.EXECUTE:
            assert key not in self.committed, f"COMMITTED {key} executed again"
            warn = e.effect_type == PAY and cost is None
            assert bool(d.budget_warning) == warn, d.budget_warning
            self.holders.append(d)
            if key == "a":
                self._check_vendor_key(e, d.vendor_idempotency_key)
        elif expected is D.IN_FLIGHT:
            assert d.retry_after_seconds is not None and d.retry_after_seconds > 0
        elif expected is D.APPROVAL_REQUIRED:
            assert d.approval_id == e.approval_id and d.approval_id is not None
        self._check_get(key)
        self._check_spend(key)
        return d

    def _settle(self, e: Eff, cost: int | None, d: eg.BeginDecision, memo: bool,
                limit: int) -> Expected:
        """A key that exists, same payload: what begin answers, and how it moves the model."""
        if e.state == COMMITTED:
            result, reason = self._duplicate(e, memo)
            assert d.result == result, (d.result, result)
            return D.DUPLICATE, reason
        if e.state == IN_FLIGHT and not e.lapsed:
            return D.IN_FLIGHT, "another holder is executing it"
        if e.state == IN_FLIGHT:  # the lease lapsed: begin records AMBIGUOUS, then blocks
            recent = e.recent
            e.moved(AMBIGUOUS)
            e.why, e.by_lease, e.recent = "lease lapsed", True, recent
        if e.state == AMBIGUOUS:
            if e.effect_type != PLAIN:  # no reconcile hook for it
                return D.BLOCKED, e.why
            if e.by_lease and e.recent:  # inside the grace period: the hook is not asked
                seen("reconcile waits out the grace period")
                return D.BLOCKED, e.why
            self.expect_asked.append(e.key)
            says = self.vendor_says  # what the hook answered during this begin
            seen(f"reconcile hook says {says}")
            if says in ("unknown", "raise"):
                return D.BLOCKED, e.why
            e.moved(says, token=1)
            e.why = None
            if e.state == COMMITTED:
                e.result = {"vendor": e.key}
                self.committed.add(e.key)
                self.memo[e.key] = e.result
                assert d.result == e.result, (d.result, e.result)
                return D.DUPLICATE, None
            # FAILED by the vendor's word: a new attempt, under the same vendor key
        if e.state == AMBIGUOUS:
            return D.BLOCKED, e.why
        if e.state == FAILED:
            if e.attempt >= limit:
                return D.DENIED, f"max_attempts ({limit}) reached"
            return self._advance(e, cost, d, attempt=1)
        if e.state == PENDING:
            assert e.approval_id is not None
            status = self.approvals[e.approval_id]
            if status == "pending":
                return D.APPROVAL_REQUIRED, "waiting for a human's approval"
            assert status == "approved", status
            if (cost is None) != (e.est is None) or (cost or 0) > (e.est or 0):
                seen("an approval given at another cost is asked again")
                # approved, never used: ended by the begin that asked again (it reads
                # EXPIRED, its reason says why); pruned with its effect
                self.approvals[e.approval_id] = "forgotten"
                answer = self._advance(e, cost, d)
                self._check_approvals()
                return answer
            self.approvals[e.approval_id] = "consumed"
            e.moved(IN_FLIGHT, token=1)
            e.est, e.charged = cost, False
            return D.EXECUTE, None
        if e.human_denied:  # an approver's "no" holds
            return D.DENIED, "approval denied by"
        return self._advance(e, cost, d)

    def _advance(self, e: Eff, cost: int | None, d: eg.BeginDecision,
                 attempt: int = 0) -> Expected:
        """A new key, a new attempt, or a budget refusal asked again: as far as policy lets."""
        e.est, e.charged, e.approval_id, e.result, e.why = cost, False, None, None, None
        e.actual = None
        if e.effect_type == GOV:
            e.moved(PENDING, token=1, attempt=attempt)
            e.approval_id = d.approval_id
            if d.approval_id is not None and d.approval_id not in self.approvals:
                self.approvals[d.approval_id] = "pending"
                self.approval_ids.append(d.approval_id)
            return D.APPROVAL_REQUIRED, "approval requested"  # this begin opened it
        if e.effect_type == PAY and cost is not None:
            if self.spent + cost > CEILING:
                e.moved(DENIED, token=1, attempt=attempt)
                # a cost no window makes room for says so (decide.over_its_limit)
                e.why = ("its estimated cost alone is over" if cost > CEILING
                         else "spend ceiling reached")
                return D.DENIED, e.why
            self.spent += cost
            e.charged = True
        e.moved(IN_FLIGHT, token=1, attempt=attempt)
        return D.EXECUTE, None

    def _duplicate(self, e: Eff, memo: bool = True) -> tuple[Any, str | None]:
        """The result a duplicate returns: remembered by this gate, else as stored (``memo``
        False: the second gate, which remembers nothing)."""
        if memo and e.key in self.memo:
            return self.memo[e.key], None
        stored = None if e.pruned else e.result
        if memo:
            self.memo[e.key] = stored
        return stored, "its stored result was pruned" if e.pruned else None

    @staticmethod
    def _newest(items: list[Any], pick: int) -> Any:
        """Mostly the newest (hypothesis favours 0), sometimes an older, stale one."""
        return items[-1 - pick % len(items)]

    # -- report and extend ------------------------------------------------------------

    def _holder(self, d: eg.BeginDecision, offset: int) -> tuple[Eff, int, bool, bool]:
        """The effect, the token presented, and whether the proof holds a live lease, or a
        lapsed one nobody has acted on since (a late report)."""
        e = self.effects[d.key]
        token = d.lease_token + (0 if offset == SECRET else offset)
        presented = (self._borrowed(d) if offset == SECRET else None) or d.lease_secret
        holder = next((h for h in self.holders if h.key == d.key and h.lease_token == e.token),
                      None)
        own = e.token == token and holder is not None and presented == holder.lease_secret
        live = own and e.state == IN_FLIGHT and not e.lapsed
        late = own and ((e.state == IN_FLIGHT and e.lapsed) or (e.state == AMBIGUOUS
                                                               and e.by_lease))
        return e, token, live, late

    def _borrowed(self, d: eg.BeginDecision) -> str | None:
        """Another holder's secret, if there is one."""
        return next((h.lease_secret for h in self.holders
                     if h.lease_secret and h.lease_secret != d.lease_secret), None)

    def _as_holder(self, d: eg.BeginDecision, token: int, offset: int) -> Any:
        """The decision itself, or a proof with a wrong token or a borrowed secret."""
        if offset == 0:
            return d
        secret = (self._borrowed(d) if offset == SECRET else None) or d.lease_secret or ""
        return eg.Lease(d.key, token, secret)

    @precondition(lambda self: self.holders)
    @rule(call=REPORT)
    def report(self, call: tuple[int, str, int, int | None, int]) -> None:
        pick, outcome, value, actual, offset = call
        self._report(self._newest(self.holders, pick), outcome, value, actual, offset)

    @precondition(lambda self: self.holders)
    @rule(call=REPORT)
    def report_again(self, call: tuple[int, str, int, int | None, int]) -> None:
        self.report(call)

    def _report(self, d: eg.BeginDecision, outcome: str, value: int, actual: int | None,
                offset: int) -> None:
        e, token, live, late = self._holder(d, offset)
        result = {"r": value, "key": d.key}
        presented = (self._borrowed(d) if offset == SECRET else None) or d.lease_secret
        own = presented == d.lease_secret and e.token == d.lease_token
        repeat = (not (live or late) and own and e.token == token and e.state == outcome
                  and e.reported
                  and (outcome != COMMITTED or (not e.pruned and e.result == result)))
        holder = self._as_holder(d, token, offset)
        if not (live or late or repeat):
            with pytest.raises(eg.StaleLease):
                self.gate.report(holder, outcome, result=result, actual_cost_micros=actual)
            if offset == SECRET and e.token == token:
                seen("a borrowed secret is refused")
            return self._check_get(d.key)
        self.gate.report(holder, outcome, result=result, actual_cost_micros=actual)
        if live or late:
            if outcome == FAILED and e.vendor_attempt == e.attempt:  # the holder proved it
                e.vendor_attempt = e.attempt + 1
            if e.charged and outcome == FAILED:
                self.spent -= e.est or 0
            elif e.charged and outcome == COMMITTED and actual is not None:
                self.spent += actual - (e.est or 0)
            e.moved(outcome)
            e.reported, e.actual = True, actual
            e.result = result if outcome == COMMITTED else None
            e.why = "reported ambiguous" if outcome == AMBIGUOUS else None
            if outcome == COMMITTED:
                self.committed.add(d.key)
                if offset == 0:
                    self.memo[d.key] = result
        self._check_get(d.key)
        self._check_spend(d.key)
        if late:
            seen("a late report settles")
            assert (self.gate.get(d.key).history[-1].note or "").startswith("late report")

    @precondition(lambda self: self.holders)
    @rule(call=st.tuples(PICK, OFFSETS))
    def extend(self, call: tuple[int, int]) -> None:
        pick, offset = call
        d = self._newest(self.holders, pick)
        _, token, live, _ = self._holder(d, offset)
        holder = self._as_holder(d, token, offset)
        if live:
            until = self.gate.extend_lease(holder, 3600)
            assert until > datetime.datetime.now(datetime.UTC)
        else:  # a lapsed lease is never revived
            with pytest.raises(eg.StaleLease):
                self.gate.extend_lease(holder, 3600)
        self._check_get(d.key)

    @rule(key=KEYS)
    def lapse(self, key: str) -> None:
        """The database clock passes the lease, long ago (past any grace period)."""
        self._lapse(key, recent=False)

    @rule(key=KEYS)
    def lapse_recent(self, key: str) -> None:
        """The lease lapsed a second ago: inside the reconcile grace period."""
        self._lapse(key, recent=True)

    @rule(call=st.tuples(KEYS, st.booleans()))
    def lapse_then_retry(self, call: tuple[str, bool]) -> None:
        """A holder stalls past its lease (a second ago, or long ago), and the call is
        retried: the path where a reconcile hook must wait out the grace period."""
        key, recent = call
        self._lapse(key, recent=recent)
        self._begin(key, 0, None, False, None)

    def _lapse(self, key: str, *, recent: bool) -> None:
        e = self.effects.get(key)
        moves = e is not None and (e.state == IN_FLIGHT or (e.state == AMBIGUOUS
                                                            and e.by_lease))
        count = lapse_leases(_gate_of(self.gate), key, seconds_ago=1.0 if recent else None)
        assert count == int(moves), (key, e, count)
        if e is not None and moves:
            e.recent = recent if e.state == IN_FLIGHT or e.recent else False
            if e.state == IN_FLIGHT:
                e.lapsed = True
                e.why = "lease lapsed"
            self._check_get(key)

    # -- other namespaces, other effect types ------------------------------------------

    @precondition(lambda self: self.holders)
    @rule(call=st.tuples(PICK, st.sampled_from(("report", "proof", "extend", "resolve",
                                                 "get"))))
    def foreign(self, call: tuple[int, str]) -> None:
        """A gate in another namespace tries the holder's decision, its full proof, or the
        key: refused every time, and nothing changes."""
        pick, what = call
        d = self._newest(self.holders, pick)
        f = self.foreign
        lease = eg.Lease(d.key, d.lease_token, d.lease_secret or "x")
        attempt: dict[str, Callable[[], Any]] = {
            "report": lambda: f.report(d, "failed"),
            "proof": lambda: f.report(lease, "failed"),
            "extend": lambda: f.extend_lease(lease, 60),
            "resolve": lambda: f.resolve(d.key, "failed", by="operator", force=True),
            "get": lambda: f.get(d.key),
        }
        with pytest.raises((eg.InvalidTransition, eg.StaleLease, eg.UnknownEffect)):
            attempt[what]()
        seen(f"another namespace's {what} is refused")
        self._check_get(d.key)

    @precondition(lambda self: self.effects)
    @rule(pick=PICK)
    def begin_as_another_type(self, pick: int) -> None:
        """The same key and payload proposed under another effect type: refused (at an undo's
        key, before the store is asked: only an undo may begin there)."""
        key = self._newest(sorted(self.effects), pick)
        e = self.effects[key]
        undo_key = key.startswith("compensate:")
        with pytest.raises(eg.EffectKeyError if undo_key else eg.PayloadMismatch) as err:
            self.other.begin(effect_type=f"{e.effect_type}.other", key=key,
                             payload={"key": key, "v": e.variant})
        if not undo_key:
            assert e.effect_type in (err.value.reason or ""), err.value.reason
        seen("another effect type is refused")
        self._check_get(key)

    # -- the operator ------------------------------------------------------------------

    @rule(call=st.tuples(st.sampled_from(("a", "g", "p", "q", "compensate:a", "compensate:g")),
                         VERDICTS, VALUES))
    def resolve(self, call: tuple[str, str, int]) -> None:
        self._resolve(*call)

    @precondition(lambda self: any(e.effective in (AMBIGUOUS, FAILED)
                                   for e in self.effects.values()))
    @rule(call=st.tuples(PICK, VERDICTS, VALUES))
    def resolve_listed(self, call: tuple[int, str, int]) -> None:
        """What an operator does: settle an effect that ``ls`` lists as AMBIGUOUS (or FAILED,
        when the vendor's dashboard shows it did happen)."""
        pick, outcome, value = call
        keys = [k for k, e in self.effects.items() if e.effective in (AMBIGUOUS, FAILED)]
        self._resolve(self._newest(keys, pick), outcome, value)

    def _resolve(self, key: str, outcome: str, value: int) -> None:
        e = self.effects.get(key)
        result = {"resolved": value}
        if e is None:
            with pytest.raises(eg.UnknownEffect):
                self.gate.resolve(key, outcome, by="operator", result=result)
            return
        if e.verdict == (outcome, value if outcome == COMMITTED else None) and not (
                outcome == COMMITTED and e.pruned):  # the same verdict again: the row, as is
            record = self.gate.resolve(key, outcome, by="operator", result=result)
            seen("a repeated verdict is answered with the row")
            return self._compare(record, e, history=True)
        live = e.state == IN_FLIGHT and e.effective == IN_FLIGHT  # its holder may be acting
        if live or not (e.state in (IN_FLIGHT, AMBIGUOUS)
                        or (e.state == FAILED and outcome == COMMITTED)):
            with pytest.raises(eg.InvalidTransition):
                self.gate.resolve(key, outcome, by="operator", result=result)
            if live:
                seen("a live lease is not resolvable")
            return self._check_get(key)
        record = self.gate.resolve(key, outcome, by="operator", result=result)
        if outcome == COMMITTED and e.vendor_attempt > e.attempt:
            e.vendor_attempt = e.attempt
        held = e.state in (IN_FLIGHT, AMBIGUOUS)
        if e.charged and e.est:
            if held and outcome == FAILED:
                self.spent -= e.est
            elif not held and outcome == COMMITTED:
                self.spent += e.est
                self.over_ok |= self.spent > CEILING
        if e.charged and held and outcome == COMMITTED and e.actual is not None:
            self.spent += e.actual - (e.est or 0)  # the cost its holder reported counts
            self.over_ok |= self.spent > CEILING
        e.moved(outcome, token=1)
        e.verdict = (outcome, value if outcome == COMMITTED else None)
        e.result = result if outcome == COMMITTED else None
        e.why = None
        if outcome == COMMITTED:
            self.committed.add(key)
            self.memo[key] = result
        self._compare(record, e, history=True)
        self._check_spend(key)

    @precondition(lambda self: self.approval_ids)
    @rule(pick=PICK, by=st.sampled_from(("alice", "alice", "agent")))
    def approve(self, pick: int, by: str) -> None:
        approval_id = self._newest(self.approval_ids, pick)
        status = self.approvals[approval_id]
        error = self._approval_error(status) or (
            eg.InvalidTransition if by == "agent" else None)  # no self-approval
        if error is not None:
            with pytest.raises(error):
                self.gate.approve(approval_id, by=by)
            return
        record = self.gate.approve(approval_id, by=by)
        assert (record.state, record.decided_by, record.requested_by) == ("approved", by, "agent")
        self.approvals[approval_id] = "approved"

    @precondition(lambda self: self.approval_ids)
    @rule(pick=PICK)
    def deny(self, pick: int) -> None:
        approval_id = self._newest(self.approval_ids, pick)
        error = self._approval_error(self.approvals[approval_id])
        if error is not None:
            with pytest.raises(error):
                self.gate.deny(approval_id, by="bob", reason="not now")
            return
        assert self.gate.deny(approval_id, by="bob", reason="not now").state == "denied"
        self.approvals[approval_id] = "denied"
        (e,) = [e for e in self.effects.values() if e.approval_id == approval_id]
        assert e.state == PENDING, e
        e.moved(DENIED, token=1)
        e.human_denied, e.why = True, "approval denied by bob"
        self._check_get(e.key)

    def _check_approvals(self) -> None:
        """Every approval request the store lists reads as the model says (a forgotten one
        as EXPIRED, saying it was superseded), and a pruned one is gone."""
        listed = {a.approval_id: a for a in self.gate.list_approvals(state=None)}
        for approval_id, status in self.approvals.items():
            if status == "gone":
                assert approval_id not in listed, approval_id
                continue
            a = listed[approval_id]
            shown = "expired" if status == "forgotten" else status
            assert a.state.value == shown, (approval_id, a.state, status)
            if status == "forgotten":
                assert (a.reason or "").startswith("superseded: a call declared"), a.reason

    @staticmethod
    def _approval_error(status: str) -> type[Exception] | None:
        if status == "gone":  # pruned
            return eg.UnknownEffect
        return None if status == "pending" else eg.InvalidTransition

    @rule(older_than=st.just(datetime.timedelta(0)))
    def prune(self, older_than: datetime.timedelta) -> None:
        eligible = {k for k, e in self.effects.items()
                    if e.state in (COMMITTED, FAILED, DENIED) and not e.pruned}
        count = self.gate.prune(older_than)
        now = self.gate.store.now()
        records = {r.key: r for r in self.gate.list_effects(limit=None)}
        newly = {k for k in eligible if records[k].pruned_at is not None}
        assert count == len(newly), (count, newly, eligible)
        for key in eligible - newly:  # SQLite's clock counts milliseconds: "now" may equal it
            assert self.gate.store.is_sqlite, f"{key} not pruned"
            assert now - records[key].updated_at.timestamp() < 0.05, key
        self.memo.clear()  # the gate that pruned forgets what it remembered
        for key in newly:
            e = self.effects[key]
            e.pruned, e.result, e.hist = True, None, 0  # a step keeps its compensation
        kept = {a.approval_id for a in self.gate.list_approvals(state=None)}
        for approval_id, status in self.approvals.items():
            if approval_id not in kept:
                assert status in ("consumed", "denied", "forgotten", "gone"), (
                    approval_id, status)
                self.approvals[approval_id] = "gone"

    @rule(mode=st.sampled_from(("ok", "ok", "refused", "lost")))
    def unwind(self, mode: str) -> None:
        self.undo_mode, self.undone, self.undo_done = mode, [], set(self.committed)
        expected: dict[str, list[str]] = {
            name: [] for name in ("compensated", "unresolved", "irreversible", "failed",
                                  "skipped")}
        undone: list[str] = []
        held = False  # a newer undo left AMBIGUOUS: no older undo is begun (newest first)
        steps = [e for e in self.effects.values() if e.compensates is None]
        for e in sorted(steps, key=lambda e: -(e.effect_id or 0)):
            state = e.effective
            if state in (AMBIGUOUS, IN_FLIGHT, PENDING):
                expected["unresolved"].append(e.key)
            elif state != COMMITTED:
                expected["skipped"].append(e.key)
            elif e.compensation is None:
                expected["irreversible"].append(e.key)
            elif held:  # read, not begun: compensated only if its undo committed earlier
                c = self.effects.get(f"compensate:{e.key}")
                done = c is not None and c.state == COMMITTED
                expected["compensated" if done else "unresolved"].append(e.key)
            elif e.effect_type == PAY:  # no compensator registered for it
                expected["failed"].append(e.key)
            else:
                expected[self._compensation(e, mode, undone)].append(e.key)
                held = self.effects[f"compensate:{e.key}"].state == AMBIGUOUS
        report = self.gate.unwind(GROUP)
        got = {name: [s.key for s in getattr(report, name)] for name in expected}
        assert got == expected, (got, expected)
        assert self.undone == undone, (self.undone, undone)
        for step in report.compensated + report.failed + report.unresolved:
            if step.compensation_effect_id is not None:
                c = self.effects[f"compensate:{step.key}"]
                if c.effect_id is None:
                    c.effect_id = step.compensation_effect_id
                assert c.effect_id == step.compensation_effect_id
                self._check_get(c.key)

    def _compensation(self, step: Eff, mode: str, undone: list[str]) -> str:
        """The undo of a committed step, itself an effect: where unwind lists the step."""
        key = f"compensate:{step.key}"
        c = self.effects.get(key)
        if c is None:
            # The undo declares its step's cost, actual where reported, else its estimate
            # (an approval rule judges it by that; no ceiling counts an undo).
            c = self.effects[key] = Eff(
                key, f"{step.effect_type}.compensate", None, None,
                est=step.est if step.actual is None else step.actual, compensation=None,
                compensates=step.effect_id)
            c.moved(IN_FLIGHT, token=1)
        elif c.state == COMMITTED:
            self._duplicate(c)
            return "compensated"
        elif c.state == AMBIGUOUS or c.attempt >= MAX_ATTEMPTS:
            return "unresolved"
        else:  # FAILED: a new attempt
            assert c.state == FAILED, c
            c.moved(IN_FLIGHT, token=1, attempt=1)
        undone.append(step.key)
        outcome = {"ok": COMMITTED, "refused": FAILED, "lost": AMBIGUOUS}[mode]
        c.moved(outcome)
        c.reported = True
        c.result = {"undone": step.key} if outcome == COMMITTED else None
        c.why = "RuntimeError: connection reset mid-undo" if outcome == AMBIGUOUS else None
        if outcome == COMMITTED:
            self.committed.add(key)
            self.memo[key] = c.result
        return {COMMITTED: "compensated", FAILED: "failed", AMBIGUOUS: "unresolved"}[outcome]

    # -- checks ------------------------------------------------------------------------

    def _check_get(self, key: str) -> None:
        if key in self.effects:
            self._compare(self.gate.get(key), self.effects[key], history=True)
        else:
            with pytest.raises(eg.UnknownEffect):
                self.gate.get(key)

    def _compare(self, record: eg.EffectRecord, e: Eff, *, history: bool = False) -> None:
        got = (record.effect_id, record.state.value, record.attempt, record.lease_token,
               record.result, record.pruned_at is not None, record.approval_id,
               record.estimated_cost_micros, record.compensation, record.compensates_effect_id,
               record.group_key)
        want = (e.effect_id, e.effective, e.attempt, e.token, None if e.pruned else e.result,
                e.pruned, e.approval_id, e.est, e.compensation, e.compensates,
                GROUP if e.compensates is None else None)
        assert got == want, (e.key, got, want)
        if e.effective in (AMBIGUOUS, DENIED):
            assert (record.reason or "").startswith(e.why or ""), (record.reason, e.why)
        assert record.lease_token >= self.tokens.get(e.key, 0), "the fencing token went down"
        self.tokens[e.key] = record.lease_token
        if history:
            assert len(record.history) == e.hist, (e.key, record.history, e.hist)
            tokens = [h.token for h in record.history]
            assert tokens == sorted(tokens), tokens
            if record.history:
                assert record.history[-1].to_state.value == e.state

    def _check_vendor_key(self, e: Eff, value: str | None) -> None:
        """One vendor key per (key, the attempt it was first issued for); never one shared by
        two such attempts."""
        assert value is not None
        seen = self.vendor_keys.setdefault((e.key, e.vendor_attempt), value)
        assert seen == value, f"{e.key}: vendor attempt {e.vendor_attempt} changed its key"
        for (key, attempt), other in self.vendor_keys.items():
            assert key != e.key or attempt == e.vendor_attempt or other != value

    @invariant()
    def store_matches_model(self) -> None:
        records = {r.key: r for r in self.gate.list_effects(limit=None)}
        assert set(records) == set(self.effects), (set(records), set(self.effects))
        for key, e in self.effects.items():
            self._compare(records[key], e)
        assert not self.violations, self.violations

    def _check_spend(self, key: str) -> None:
        """The spend counter (only a step on a key with a ceiling can move it)."""
        if TYPES.get(key) != PAY:
            return
        with self.gate.store.engine.connect() as conn:
            spent = conn.execute(
                text("SELECT spent_micros FROM effectgate_budgets "
                     "WHERE namespace = :ns AND scope_key = :scope"),
                {"ns": self.gate.namespace, "scope": SCOPE},
            ).scalar()
        assert (spent or 0) == self.spent, (spent, self.spent)
        assert self.spent <= CEILING or self.over_ok, "spend passed the ceiling"


def _run(url: str, runs: list[int], *, caller: str = "sync", examples: int = EXAMPLES) -> None:
    prefix = f"sm-{uuid.uuid4().hex[:12]}-"  # this run's namespaces: one per example
    loop = asyncio.new_event_loop() if caller == "async" else None
    base = eg.Gate(url, policy=POLICY, namespace=f"{prefix}base", lease_seconds=3600,
                   max_attempts=MAX_ATTEMPTS)
    other = eg.Gate(url, policy=POLICY, namespace=f"{prefix}base", lease_seconds=3600,
                    max_attempts=MAX_ATTEMPTS, memo_size=0)
    factory: Callable[[], GateMachine] = lambda: GateMachine(  # noqa: E731
        base, other, prefix, runs, loop)
    log = logging.getLogger("effectgate")
    level = log.level
    log.setLevel(logging.ERROR)  # thousands of expected refusals: keep them out of the capture
    try:
        run_state_machine_as_test(factory, settings=settings(  # type: ignore[arg-type]
            max_examples=examples, stateful_step_count=STEPS, deadline=None,
            derandomize=True, database=None, print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                   HealthCheck.data_too_large],
        ))
    finally:
        log.setLevel(level)
        with base.store.engine.connect() as conn:
            for table in ("effectgate_approvals", "effectgate_budgets", "effectgate_effects"):
                conn.execute(text(f"DELETE FROM {table} WHERE namespace LIKE :prefix"),
                             {"prefix": f"{prefix}%"})
            conn.execute(text("DELETE FROM effectgate_meta WHERE name = :name"),
                         {"name": f"policy:{prefix}base"})  # the policy the base recorded
        base.close()  # the async callers' connections too
        other.close()
        if loop is not None:
            loop.close()


EDGES = (
    "reconcile waits out the grace period", "reconcile hook says committed",
    "reconcile hook says failed", "reconcile hook says unknown", "a borrowed secret is refused",
    "a late report settles", "another namespace's report is refused",
    "another namespace's proof is refused", "another namespace's resolve is refused",
    "another effect type is refused", "a live lease is not resolvable",
)


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_random_sequences_match_the_reference_model(store_url: str, caller: str) -> None:
    """Random begin/report/extend/lapse/resolve/approve/deny/prune/unwind sequences — with
    late reports, borrowed proofs, other namespaces and effect types, live-lease resolves and
    reconcile inside and after the grace period — zero divergences from the reference model,
    over EXAMPLES sequences; and every one of those edges was reached."""
    examples = EXAMPLES if caller == "sync" else ASYNC_EXAMPLES
    runs = [0]
    SEEN.clear()
    _run(store_url, runs, caller=caller, examples=examples)
    assert runs[0] >= examples
    print(f"edges reached: {dict(sorted(SEEN.items()))}")
    if examples >= 250:
        missed = [edge for edge in EDGES if not SEEN.get(edge)]
        assert not missed, f"never reached: {missed} ({SEEN})"
