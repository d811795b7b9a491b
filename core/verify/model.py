"""A model of the protocol for exhaustive exploration: an in-memory store (no SQL) whose every
decision is the real :mod:`effectgate.decide`'s, the actors that use it, a simulated vendor,
and the invariants checked in every reachable state.

A worker's ``begin`` is the real flow (:func:`effectgate.flow.begin_steps`), walked one store
command at a time: the model store (:mod:`effectgate.verify.model_store`) answers each command
from the model's state, so other actors interleave between any two of the flow's calls, and a
change in the flow's sequence is a change in what is explored. A worker's state keeps the
answers its flow was given; the flow is re-run on them to resume it (it is deterministic: its
lease secret and approval ids are drawn from the worker and the begin). The model store holds
rows and applies what ``decide`` returns: ``resolution`` for an operator's settlement. The
rules that live only in the store's SQL (who may report, how a report or a resolve moves the
vendor key) are stated once in :mod:`effectgate.verify.model_rows` (``report_standing``,
``reported_vendor_attempt``, ``resolved_vendor_attempt``); the replay holds the SQL to them.

Actors: workers (each ``begin`` → send to the vendor → the vendor answers → ``report``; or
dying at any point; the clock moving while one waits is a stall; with ``Config.inferred``, once
it has sent, reporting the FAILED a built-in exception classifier infers from a connection
error, whatever the vendor did: it keeps the vendor key for the next attempt), a forger (a
worker that reports FAILED with a token it saw, or with another namespace's lease), one operator
(``resolve`` committed or failed, with or without ``force``; ``prune``), a reconcile hook that
answers truthfully from the vendor's ledger (committed, failed, or unknown), the database clock
in ticks and its UTC date (a midnight: a per-day ceiling's new counter), and lost replies (the
write happened, the caller sees an error).

Time: a lease lasts ``lease_ticks - 0.5`` ticks, so a lease never ends on a tick (the real
stores' clocks keep moving by milliseconds; no decision may hinge on an exact tie). A request
sent to the vendor while its lease was live reaches the vendor before that lease's grace period
ends (the assumption the grace period encodes): the clock does not pass that point first.

The model's data (the bound, the states, a step) is :mod:`effectgate.verify.model_state`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from .. import decide
from .. import flow as flows
from .._commands import CallHook, Command, HookFailed, Tell
from ..errors import EffectGateError, InvalidTransition, StoreError, UnknownEffect
from ..flow import Flow, Parts
from ..memo import CommittedMemo
from ..records import BeginDecision
from ..registry import Registry
from ..request import LeaseSecret, Request, secret_hash
from ..states import ApprovalState, Decision, Outcome, State
from ..store.rows import ApprovalRow, EffectHead, Moved
from .model_rows import (
    KEY,
    PAYLOAD,
    VENDOR,
    MApproval,
    MRow,
    adjust,
    approval_row,
    head,
    put,
    put_approval,
    report_standing,
    reported_vendor_attempt,
    resolved_vendor_attempt,
)
from .model_state import (
    COST,
    LIMIT,
    LOST,
    Action,
    Config,
    ModelState,
    Step,
    Worker,
    describe,
)
from .model_store import CALLS, ModelStore, resolved

__all__ = [
    "COST",
    "KEY",
    "LIMIT",
    "LOST",
    "PAYLOAD",
    "VENDOR",
    "Action",
    "Config",
    "Model",
    "ModelState",
    "Step",
    "describe",
    "report_standing",
    "reported_vendor_attempt",
    "resolved_vendor_attempt",
]

MAX_CALLS = 24
"""A begin answers within this many store calls (liveness; the real flow gives up after 16
steps, each at most one write and one read)."""
class _Run(NamedTuple):
    """A run of a worker's flow: ``kind`` wait (``value`` its next store command), done
    (``value`` its decision) or error (``value`` the error's type name); the answers it was
    given (the hook's and the log lines' included), and whether the hook was called."""

    kind: str
    value: Any
    answers: tuple[Any, ...]
    hooked: bool


def _lost() -> StoreError:
    return StoreError("the reply was lost (model)", outcome_unknown=True)


_HOOK_ERROR = HookFailed(RuntimeError("the reconcile hook raised (model)"))
"""What the flow is answered when the hook raises (one object: states compare equal)."""
_VERDICTS = ("committed", "failed", "unknown")
_HELD = (State.IN_FLIGHT, State.AMBIGUOUS, State.COMMITTED)
"""The states of an effect that holds its charge."""


def _ids(prefix: str) -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter)}"


def _no_hook(record: Any) -> str:
    raise AssertionError("the model answers the reconcile hook's call itself")


@dataclass
class Model:
    """The protocol model for one :class:`Config`."""

    config: Config
    requests: tuple[Request, ...] = field(init=False)

    def __post_init__(self) -> None:
        c = self.config
        self.requests = tuple(c.request(i) for i in range(len(c.workers)))
        self.store = ModelStore(c.one_call)
        hooks = Registry({"*": _no_hook}) if c.hook else Registry[Any]()
        self.parts = Parts(lambda move: c.one_call and decide.reads_first(move), b"model",
                           hooks, CommittedMemo(0))
        self._runs: dict[tuple[Any, ...], _Run] = {}

    # -- states ------------------------------------------------------------------------------

    def initial(self) -> ModelState:
        """Nothing stored, every worker idle, the clock at 0."""
        c = self.config
        return ModelState(0, (), tuple(Worker("idle", c.begins[i] if i < len(c.begins) else 1)
                                       for i in range(len(c.workers))), (), (),
                          c.faults, c.ops, (), (), 1)

    def actions(self, s: ModelState) -> list[Action]:
        """Every action enabled in ``s``, in a fixed order."""
        c = self.config
        out: list[Action] = []
        lost = (False, True) if s.faults else (False,)
        for i, w in enumerate(s.workers):
            if w.phase == "idle" and w.begins and not (
                    c.inferred and any(e[0] == i for e in s.transit)):
                out.append(("begin", i))
            elif w.phase == "begin":
                verdicts: tuple[str | None, ...] = (None,)
                if w.call == "get":
                    verdicts = self._verdicts(s, w)
                writes = w.call in ("reserve", "lapse", "move", "resolve")
                for v in verdicts:
                    for x in (lost if writes else (False,)):
                        out.append(("step", i, x, v))
            elif w.phase == "held":
                out.append(("send", i))
                for x in lost:
                    out.append(("report", i, "failed", x))  # NotExecuted: never sent
            elif w.phase == "replied":
                outcome = "committed" if w.reply == "executed" else "failed"
                for x in lost:
                    out.append(("report", i, outcome, x))
                if c.unsure:
                    out.append(("report", i, "ambiguous", False))
            elif w.phase == "unsure":  # it reported AMBIGUOUS, then learnt the outcome
                out.append(("report", i, "committed" if w.reply == "executed" else "failed",
                            False))
            if c.inferred and w.phase in ("sent", "replied"):  # what the vendor did or not
                for x in lost:
                    out.append(("report", i, "inferred", x))
            if w.phase in ("begin", "held", "sent", "replied", "unsure"):
                out.append(("die", i))
            if c.forgery and not w.forged and w.phase in ("idle", "done"):
                row = self.row_of(s, i)
                if row is not None and row.state is State.IN_FLIGHT and w.seen_token is not None:
                    out.append(("guess", i))
                for j, other in enumerate(s.workers):
                    if other.lease is not None and c.workers[j][0] != c.workers[i][0] and (
                        other.phase in ("held", "sent", "replied")
                    ):
                        out.append(("borrow", i, j))
        for entry in s.transit:
            out.append(("land", entry[0], "executed"))
            out.append(("land", entry[0], "refused"))
        if s.ops:
            row = self.row_of(s, 0)
            if row is not None:
                for outcome in ("committed", "failed"):
                    for x in lost:
                        out.append(("resolve", outcome, False, x))
                        if self._may_force(s, row):
                            out.append(("resolve", outcome, True, x))
                if c.prune and row.state in (State.COMMITTED, State.FAILED, State.DENIED) and (
                    row.pruned is None
                ):
                    out.append(("prune",))
                    if c.lost_ops and s.faults:
                        out.append(("prune", True))
            if any(a.state is ApprovalState.PENDING and a.namespace == c.workers[0][0]
                   for a in s.approvals):
                out += [("approve",), ("deny",)]
                if c.lost_ops and s.faults:
                    out += [("approve", True), ("deny", True)]
                if c.self_approve and self._pending(s).requested_by is not None:
                    out.append(("self_approve",))
        if s.repeat:
            out.append(("again",))
            if c.lost_ops and s.faults:
                out.append(("again", True))
        if s.now < c.ticks and not self._transit_due(s):
            out.append(("tick",))
        if s.day < c.days:
            out.append(("midnight",))
        return out

    def _verdicts(self, s: ModelState, w: Worker) -> tuple[str, ...]:
        """What a truthful hook may answer about the row ``w`` read: what the vendor knows of
        its current vendor key, or unknown."""
        assert w.row is not None
        vk = _vk(w.row)
        known = next((entry[1] for entry in s.ledger if entry[0] == vk), None)
        extra = ("raise",) if self.config.hook_fails else ()
        if known == "executed":
            return ("committed", "unknown", *extra)
        return ("failed", "unknown", *extra, *(("committed",) if self.config.hook_lies else ()))

    def truthful(self) -> bool:
        """Whether the bound's reconcile hook tells the truth (the invariants that trust its
        verdict are checked only then)."""
        return not self.config.hook_lies

    def _may_force(self, s: ModelState, row: MRow) -> bool:
        """An operator forces only when the holder is gone (``force`` is for that)."""
        if row.state is not State.IN_FLIGHT or row.lease is None or row.lease < s.now:
            return False
        for i, w in enumerate(s.workers):
            if w.lease is not None and w.lease[0] == row.token and (
                self.config.workers[i][0] == row.namespace
            ) and w.phase in ("held", "sent", "replied"):
                return False
        return True

    def _transit_due(self, s: ModelState) -> bool:
        """A request sent under a live lease must reach the vendor before that lease's grace
        period ends: the clock waits for it."""
        for _, _, timely, lease_end in s.transit:
            if timely and lease_end + self.config.grace_ticks <= s.now + 1:
                return True
        return False

    @staticmethod
    def _row(s: ModelState, ns: str, key: str = KEY) -> MRow | None:
        return next((r for r in s.rows if r.namespace == ns and r.key == key), None)

    def row_of(self, s: ModelState, worker: int) -> MRow | None:
        """The stored row of worker ``worker``'s key (None: not written)."""
        return self._row(s, self.config.workers[worker][0], self.config.key(worker))

    def head(self, r: MRow, now: float) -> EffectHead:
        """The row as the store hands it up (with the clock)."""
        return head(r, float(now))

    # -- transitions -------------------------------------------------------------------------

    def apply(self, s: ModelState, action: Action) -> Step:
        """Perform ``action`` in ``s`` (which must enable it); the next state and what it
        broke."""
        kind = action[0]
        handler = getattr(self, f"_do_{kind}")
        step: Step = handler(s, *action[1:])
        after = step.state
        if after.rows is s.rows and after.ledger is s.ledger and after.transit is s.transit and (
            after.spend is s.spend
        ):
            return step  # nothing the state invariants read has changed (checked before)
        found = list(step.violations) + self.check(after)
        return Step(after, step.text, tuple(found), step.answer)

    def _do_tick(self, s: ModelState) -> Step:
        return Step(s._replace(now=s.now + 1), f"now = {s.now + 1}", ())

    def _do_midnight(self, s: ModelState) -> Step:
        return Step(s._replace(day=s.day + 1), f"the database's date is day {s.day + 1}", ())

    def _do_begin(self, s: ModelState, i: int) -> Step:
        w = s.workers[i]
        nw = Worker("begin", w.begins - 1, w.forged, seen_token=w.seen_token)
        step = self._waits(s, i, nw, self._run(i, nw.begins, (), None).value, "")
        return step._replace(text=f"begin starts: {step.state.workers[i].call}")

    def _flow(self, i: int, begins: int) -> Flow:
        """Worker ``i``'s flow for the begin that leaves it ``begins`` more: the real one,
        with a lease secret and approval ids of its own (the same on every run)."""
        parts = self.parts._replace(approval_ids=_ids(f"apr{i}.{begins}."))
        return flows.begin_steps(parts, self.requests[i], LeaseSecret(f"w{i}b{begins}"))

    def _run(self, i: int, begins: int, answers: tuple[Any, ...], verdict: str | None) -> _Run:
        """Worker ``i``'s flow run on ``answers`` up to its next store call or its end, the
        hook's call (if it comes) answered ``verdict``. The flow is deterministic, so a run is
        a function of its arguments: each is made once (from the flow's start) and kept."""
        key = (i, begins, answers, verdict)
        done = self._runs.get(key)
        if done is not None:
            return done
        flow = self._flow(i, begins)
        given, hooked = list(answers), False
        try:
            command = next(flow)
            for answer in answers:
                command = flow.throw(_lost()) if answer is LOST else flow.send(answer)
            while isinstance(command, (Tell, CallHook)):
                answer = None if isinstance(command, Tell) else (
                    _HOOK_ERROR if verdict == "raise" else verdict)
                hooked = hooked or isinstance(command, CallHook)
                given.append(answer)
                command = flow.send(answer)
            done = _Run("wait", command, tuple(given), hooked)
        except StopIteration as stop:
            done = _Run("done", stop.value, tuple(given), hooked)
        except EffectGateError as err:
            done = _Run("error", type(err).__name__, tuple(given), hooked)
        self._runs[key] = done
        return done

    def _secret(self, s: ModelState, i: int) -> str:
        return secret_hash(f"w{i}b{s.workers[i].begins}")

    def _do_step(self, s: ModelState, i: int, lost: bool, verdict: str | None) -> Step:
        """The model store answers worker ``i``'s flow's pending command (its reply lost,
        when ``lost``); the flow runs on to its next store call or its answer."""
        w = s.workers[i]
        hooked = [a for a in w.answers if a is _HOOK_ERROR or a in _VERDICTS]
        raised: tuple[str, ...] = ()
        if w.call == "resolve" and hooked and hooked[-1] is _HOOK_ERROR:
            raised = (f"A FAILING HOOK SETTLES NOTHING: worker {i}'s begin settles "
                      f"{self.requests[i].key} after its reconcile hook raised",)
        done = self.store.perform(s, self._run(i, w.begins, w.answers, None).value)
        if isinstance(done.answer, Moved) and done.answer.over_ceiling is not None:
            raised += self._refused(s, i, done.answer.over_ceiling)
        s, text, answer = done.state, done.text, done.answer
        if lost and done.lossy:
            s, answer, text = s._replace(faults=s.faults - 1), LOST, f"{text} (reply lost)"
        run = self._run(i, w.begins, (*w.answers, answer), verdict)
        w = w._replace(answers=run.answers, consumed=done.consumed or w.consumed)
        found: tuple[str, ...] = ()
        if run.hooked:
            text = f"{text}; the hook answers {verdict}"
            if self.config.block and self.config.governed(i):
                found = (f"NO HOOK WHEN BLOCKED: worker {i}'s begin called the reconcile hook "
                         f"for {self.requests[i].effect_type}, whose policy blocks on "
                         "AMBIGUOUS",)
        step = self._stepped(s, i, w, run, text)
        found += raised
        return step._replace(violations=step.violations + found) if found else step

    def _stepped(self, s: ModelState, i: int, w: Worker, run: _Run, text: str) -> Step:
        """Worker ``i``'s flow after a store call: it answered, failed, or waits again."""
        if run.kind == "done":
            return self._finish(s, i, w, run.value, text)
        if run.kind == "error":
            return self._error(s, i, text, run.value)
        return self._waits(s, i, w, run.value, text)

    @staticmethod
    def _waits(s: ModelState, i: int, w: Worker, command: Command, text: str) -> Step:
        """Worker ``i``'s flow waits for the store to answer ``command``."""
        w = w._replace(call=CALLS[type(command)], row=getattr(command, "row", None))
        return Step(_set_worker(s, i, w), f"{text} (next: {w.call})", ())

    def _error(self, s: ModelState, i: int, text: str, error: str = "StoreError") -> Step:
        w = s.workers[i]
        nw = Worker("idle" if w.begins else "done", w.begins, w.forged,
                    seen_token=w.seen_token)
        return Step(_set_worker(s, i, nw), f"{text}: the caller sees {error}", (),
                    ("error", error))

    def _finish(self, s: ModelState, i: int, w: Worker, d: BeginDecision, text: str) -> Step:
        """A begin's answer: EXECUTE holds the lease; anything else leaves the worker idle."""
        kind = d.decision
        req = self.requests[i]
        found: list[str] = []
        if kind not in (Decision.IN_FLIGHT, Decision.BLOCKED) and (
            d.effect_type != req.effect_type or d.namespace != req.namespace
            or d.payload_hash != req.payload_hash
        ):  # a result, an execution, an approval or a denial never crosses types or payloads
            found.append(f"IDENTITY: worker {i} ({req.namespace}/{req.effect_type}) answered "
                         f"{kind.value} for an effect of {d.namespace}/{d.effect_type}"
                         + ("" if d.payload_hash == req.payload_hash
                            else " with another payload"))
        if self.config.deny and self.config.governed(i) and kind is not Decision.DENIED:
            found.append(f"POLICY DENY: worker {i}'s begin of {req.effect_type}, which the "
                         f"policy denies, answered {kind.value}")
        if self.config.over_alone(i) and (kind is not Decision.DENIED or any(
                a.namespace == d.namespace and a.key == d.key for a in s.approvals)):
            found.append(f"OVER ALONE: worker {i}'s cost alone is over a ceiling that counts "
                         f"it, yet its begin answered {kind.value} or asked for an approval "
                         "(no window ever makes room: it is refused before a human is asked)")
        if kind is Decision.EXECUTE:
            found += self._check_grant(s, i, d)
            consumed = w.consumed
            if consumed is not None:
                if any(c[0] == consumed for c in s.consumed):
                    found.append(f"APPROVAL ONCE: approval {consumed} executed twice")
                used = next(a for a in s.approvals if a.id == consumed)
                if used.effect_type != req.effect_type or used.namespace != req.namespace:
                    found.append(f"APPROVAL PAYLOAD: approval {consumed} for {used.effect_type} "
                                 f"executed {req.effect_type}")
                s = s._replace(consumed=(*s.consumed, (consumed, req.effect_type,
                                                       req.namespace)))
            denied = self._row(s, d.namespace, d.key)
            if any(a.state is ApprovalState.DENIED and a.namespace == d.namespace
                   and a.key == d.key for a in s.approvals) and denied is not None:
                found.append(f"DENIAL IS FINAL: {d.namespace}/{d.key} executed after an "
                             "approver denied it")
            row = self._row(s, d.namespace, d.key)  # the row the flow just wrote or adopted
            lease = (d.lease_token, self._secret(s, i), d.attempt,
                     None if row is None else row.vendor_attempt, d.lease_expires_epoch)
            nw = Worker("held", w.begins, w.forged, lease=lease, seen_token=1)
            s = s._replace(grants=tuple(sorted({*s.grants, (d.namespace, d.key,
                                                            d.attempt)})))
        else:
            nw = Worker("idle" if w.begins else "done", w.begins, w.forged,
                        seen_token=1)
        return Step(_set_worker(s, i, nw), f"{text}: {kind.value} (attempt {d.attempt}, "
                    f"token {d.lease_token}, {d.state.value})", tuple(found),
                    (kind.value, d.attempt, d.lease_token))

    def _check_grant(self, s: ModelState, i: int, d: BeginDecision) -> list[str]:
        found = []
        for ns, key, attempt in s.grants:
            if (ns, key, attempt) == (d.namespace, d.key, d.attempt):
                found.append(f"ONCE PER ATTEMPT: attempt {attempt} of {ns}/{key} granted "
                             f"EXECUTE again (token {d.lease_token})")
        for j, v in enumerate(s.workers):
            if j == i or v.lease is None or v.phase not in ("held", "sent", "replied"):
                continue
            if self.config.workers[j][0] != d.namespace or self.config.key(j) != d.key:
                continue  # another effect
            end = v.lease[4]
            if end is not None and end >= s.now:
                found.append(f"EXCLUSIVE: worker {i} granted EXECUTE on {d.namespace}/"
                             f"{d.key} while worker {j}'s lease is live (until {end})")
        return found

    def _do_send(self, s: ModelState, i: int) -> Step:
        w = s.workers[i]
        assert w.lease is not None
        ns, et = self.config.workers[i]
        vk = (ns, et, self.config.key(i), w.lease[3] or w.lease[2])
        end = w.lease[4] if w.lease[4] is not None else 0.0
        timely = end >= s.now
        s = s._replace(transit=(*s.transit, (i, vk, timely, end)))
        return Step(_set_worker(s, i, w._replace(phase="sent")),
                    f"sent under vendor key #{vk[3]}" + ("" if timely else " (lease lapsed)"), ())

    def _do_land(self, s: ModelState, i: int, fresh: str) -> Step:
        entry = next(e for e in s.transit if e[0] == i)
        _, vk, timely, _ = entry
        transit = tuple(e for e in s.transit if e is not entry)
        known = next((e for e in s.ledger if e[0] == vk), None)
        if known is not None:
            answer, text = known[1], f"deduplicated by vendor key #{vk[3]}: {known[1]}"
            ledger = s.ledger
        else:
            answer, text = fresh, f"{fresh} under vendor key #{vk[3]}"
            ledger = tuple(sorted((*s.ledger, (vk, fresh, timely))))
        s = s._replace(transit=transit, ledger=ledger)
        w = s.workers[i]
        if w.phase == "sent":
            s = _set_worker(s, i, w._replace(phase="replied", reply=answer))
        found = []
        executed = {e[0] for e in ledger if e[1] == "executed" and e[0][:3] == vk[:3]}
        if len(executed) > 1:
            found.append(f"AT MOST ONCE: {vk[0]}/{vk[2]} ({vk[1]}) executed at the vendor "
                         f"under {len(executed)} vendor keys")
        return Step(s, text, tuple(found))

    def _do_report(self, s: ModelState, i: int, outcome: str, lost: bool) -> Step:
        w = s.workers[i]
        assert w.lease is not None
        ns = self.config.workers[i][0]
        key = self.config.key(i)
        result = json.dumps(f"v{w.lease[3]}") if outcome == "committed" else None
        inferred = outcome == "inferred"  # a built-in classifier's FAILED: keeps the key
        s, text, found = self._record(s, i, ns, key, w.lease[0], w.lease[1],
                                      Outcome.FAILED if inferred else Outcome(outcome),
                                      result, holder=True, keeps_vendor_key=inferred)
        if lost:  # the write happened, its reply lost: the gate sends it once more and
            text += " (the reply is lost: sent again, and answered as the first)"
        elif outcome == "committed" and self.config.memo and _written(text) == "written":
            row = self._row(s, ns, key)
            assert row is not None  # the gate remembers what its holder committed
            s = _remember(s, row, w.lease[0], w.lease[2], result)
        if outcome == "ambiguous":  # it keeps its proof, and may report what it learns
            nw = w._replace(phase="unsure")
        else:
            nw = Worker("idle" if w.begins else "done", w.begins, w.forged,
                        seen_token=w.seen_token)
        return Step(_set_worker(s, i, nw), text, tuple(found), _written(text))

    def _record(self, s: ModelState, i: int, ns: str, key: str, token: int, secret: str,
                outcome: Outcome, result: str | None, *, holder: bool,
                keeps_vendor_key: bool = False) -> tuple[ModelState, str, list[str]]:
        """What the store's ``record_outcome`` must do (the replay holds its SQL to this):
        every row the proof holds for is written. ``keeps_vendor_key``: the FAILED a built-in
        classifier inferred (the store's bind of that name)."""
        found: list[str] = []
        written = []
        rows = list(s.rows)
        for n, row in enumerate(rows):
            head = self.head(row, float(s.now))
            standing = report_standing(head, ns, key, token, secret)
            if standing is None:
                continue
            vendor_attempt = reported_vendor_attempt(head, outcome, keeps_vendor_key)
            rows[n] = row._replace(
                state=State(outcome.value), result=result, lease=None,
                actor="late" if standing == "late" else None,
                reason=None if outcome is not Outcome.AMBIGUOUS else "reported ambiguous",
                vendor_attempt=vendor_attempt,  # a new vendor key is as young as its attempt
                vendor_since=None if vendor_attempt != row.vendor_attempt else row.vendor_since)
            written.append(f"{row.namespace}/{row.key} {standing}")
            spend_after = adjust(s.spend, row.namespace, row.budget_keys,
                                  decide.outcome_spend_delta(outcome, row.estimated, None))
            s = s._replace(spend=spend_after)
            lease = s.workers[i].lease
            if not holder or lease is None or row.namespace != ns or row.token != lease[0] or (
                row.secret != lease[1]
            ):
                found.append(f"STALE WRITE: worker {i}'s report changed {row.namespace}/"
                             f"{row.key}, which it does not hold")
        s = s._replace(rows=tuple(rows))
        what = outcome.value + (" (inferred by a built-in classifier)" if keeps_vendor_key
                                else "")
        text = (f"report {what}: written to {', '.join(written)}" if written
                else f"report {what}: refused (StaleLease), nothing written")
        return s, text, found

    def _do_die(self, s: ModelState, i: int) -> Step:
        # A request it already sent still reaches the vendor; its lease lapses in time.
        return Step(_set_worker(s, i, Worker("dead", 0, True, lease=s.workers[i].lease)),
                    "dies", ())

    def _do_guess(self, s: ModelState, i: int) -> Step:
        w = s.workers[i]
        ns = self.config.workers[i][0]
        row = self.row_of(s, i)
        assert row is not None
        before = s
        s, text, found = self._record(s, i, ns, row.key, row.token, secret_hash(f"guess{i}"),
                                      Outcome.FAILED, None, holder=False)
        if s.rows == before.rows:  # refused: nothing changed (it may try again)
            return Step(s, text, tuple(found), "refused")
        return Step(_set_worker(s, i, w._replace(forged=True)), text, tuple(found), "written")

    def _do_borrow(self, s: ModelState, i: int, j: int) -> Step:
        w, v = s.workers[i], s.workers[j]
        assert v.lease is not None
        before = s
        s, text, found = self._record(s, i, self.config.workers[i][0], self.config.key(j),
                                      v.lease[0], v.lease[1],
                                      Outcome.FAILED, None, holder=False)
        if s.rows == before.rows:  # refused: nothing changed (it may try again)
            return Step(s, text, tuple(found), "refused")
        return Step(_set_worker(s, i, w._replace(forged=True)), text, tuple(found), "written")

    def _do_resolve(self, s: ModelState, outcome: str, force: bool, lost: bool) -> Step:
        row = self.row_of(s, 0)
        assert row is not None
        try:
            res = decide.resolution(self.head(row, float(s.now)), Outcome(outcome), force=force)
        except InvalidTransition as err:  # nothing written (and the operator may try again)
            return Step(s, f"refused: {str(err).split(':')[0]}", (), "refused")
        s = s._replace(ops=s.ops - 1)  # a lost reply: the same write, an error for the operator
        result = json.dumps("op") if outcome == "committed" else None
        new = resolved(row, res, result, "operator")
        s = s._replace(spend=adjust(s.spend, row.namespace, row.budget_keys, res.spend_delta))
        if self.config.memo and outcome == "committed" and not lost:
            s = _remember(s, new, new.token, new.attempt, result)
        return Step(s._replace(rows=put(s.rows, new)),
                    f"resolved {row.state.value} -> {res.to.value}", (), "resolved")

    def _pending(self, s: ModelState) -> MApproval:
        ns = self.config.workers[0][0]
        return next(a for a in s.approvals if a.namespace == ns
                    and a.state is ApprovalState.PENDING)

    def _do_approve(self, s: ModelState, lost: bool = False) -> Step:
        a = self._pending(s)
        decide.check_approval(self.approval_row(a, float(s.now)), a.id, "operator",
                              approving=True)
        s = s._replace(ops=s.ops - 1, approvals=put_approval(s.approvals, a._replace(
            state=ApprovalState.APPROVED, decided_by="operator")))
        if lost:
            return Step(_lose(s, "approve", a.id), f"approved {a.id} (reply lost)", (), "lost")
        return Step(s, f"approved {a.id}", (), "approved")

    def _do_again(self, s: ModelState, lost: bool = False) -> Step:
        """The operator repeats the action whose reply it lost: through the real check, a
        decided request is refused (nothing written); a prune prunes what is left. When
        ``lost``, this reply is lost too (a fault): the operator may repeat again."""
        kind, ref = s.repeat
        s = s._replace(repeat=())
        if kind == "prune":
            step = self._do_prune(s._replace(ops=s.ops + 1), lost)
            return step._replace(text=f"again: {step.text}")
        a = next((x for x in s.approvals if x.id == ref), None)
        after = _lose(s, kind, ref) if lost else s
        try:
            decide.check_approval(None if a is None else self.approval_row(a, float(s.now)),
                                  ref, "operator", approving=kind == "approve")
        except (InvalidTransition, UnknownEffect):
            return Step(after, f"again: refused ({ref} is "
                        f"{'pruned' if a is None else a.state.value})"
                        + (" (reply lost)" if lost else ""), (),
                        "lost" if lost else "refused")
        assert a is not None
        return Step(after, f"again: {kind} of {a.id} accepted", (
            f"A DECISION IS MADE ONCE: the operator's repeated {kind} of {a.id} was accepted "
            f"although it is {a.state.value}",), "lost" if lost else "accepted")

    def _do_self_approve(self, s: ModelState) -> Step:
        """The requester approves its own request through the real check (as the gate's
        ``approve`` does); refused (nothing written) where the policy forbids it."""
        a = self._pending(s)
        by = a.requested_by
        assert by is not None
        try:
            decide.check_approval(self.approval_row(a, float(s.now)), a.id, by, approving=True)
        except InvalidTransition:
            return Step(s, f"refused: {by} cannot approve its own request {a.id}", (), "refused")
        found = () if a.allow_self else (
            f"NO SELF-APPROVAL: {by} approved its own request {a.id}, which the policy "
            "forbids",)
        s = s._replace(ops=s.ops - 1, approvals=put_approval(s.approvals, a._replace(
            state=ApprovalState.APPROVED, decided_by=by)))
        return Step(s, f"{by} approved its own request {a.id}", found, "approved")

    def _do_deny(self, s: ModelState, lost: bool = False) -> Step:
        a = self._pending(s)
        decide.check_approval(self.approval_row(a, float(s.now)), a.id, "operator",
                              approving=False)
        s = s._replace(ops=s.ops - 1, approvals=put_approval(s.approvals, a._replace(
            state=ApprovalState.DENIED)))
        row = next((r for r in s.rows if r.id == a.effect_id), None)
        if row is not None and row.state is State.PENDING_APPROVAL and row.approval_id == a.id:
            row = row._replace(state=State.DENIED, token=row.token + 1, lease=None,
                               reason=f"{decide.APPROVER_DENIED} by operator", actor="operator",
                               pruned=None, result=None)
            s = s._replace(rows=put(s.rows, row))
        if lost:
            return Step(_lose(s, "deny", a.id), f"denied {a.id} (reply lost)", (), "lost")
        return Step(s, f"denied {a.id}", (), "denied")

    def approval_row(self, a: MApproval, now: float) -> ApprovalRow:
        """An approval as the store hands it up."""
        return approval_row(a, now)

    def _do_prune(self, s: ModelState, lost: bool = False) -> Step:
        ns = self.config.workers[0][0]
        settled = (State.COMMITTED, State.FAILED, State.DENIED)
        rows = tuple(r._replace(result=None, pruned=float(s.now)) if (
            r.namespace == ns and r.state in settled and r.pruned is None) else r
            for r in s.rows)
        count = sum(a != b for a, b in zip(rows, s.rows, strict=True))
        # The gate forgets its memo whether or not the store's reply came (a lost reply
        # may have pruned).
        memo = tuple(m for m in s.memo if m[0] != ns)
        gone = {r.id for r in rows if r.namespace == ns and r.pruned is not None}
        approvals = tuple(a for a in s.approvals if a.namespace != ns or (
            a.effect_id not in gone))  # the approval requests of pruned effects are dropped
        s = s._replace(rows=rows, ops=s.ops - 1, memo=memo, approvals=approvals)
        if lost:
            return Step(_lose(s, "prune", ""), f"pruned {count} (reply lost)", (), "lost")
        return Step(s, f"pruned {count}", (), count)

    # -- invariants --------------------------------------------------------------------------

    def check(self, s: ModelState) -> list[str]:
        """The invariants that hold in every reachable state (violations, if any)."""
        found = []
        for ns, scope, spent in s.spend:
            held = sum(r.estimated or 0 for r in s.rows if r.namespace == ns and r.budget_keys
                       and scope in json.loads(r.budget_keys) and r.state in (
                           State.IN_FLIGHT, State.AMBIGUOUS, State.COMMITTED))
            # (The ceiling itself is checked where an attempt is admitted: an operator's
            # COMMITTED after FAILED counts the money spent, ceiling or not.)
            if spent < 0 or spent != held:
                found.append(f"SPEND: {ns} {scope} counts {spent} (ceiling {LIMIT}) while the "
                             f"effects holding a charge estimate {held}")
        committed = dict(((ns, key), res) for ns, key, res in s.committed)
        for row in s.rows:
            ident = (row.namespace, row.key)
            if ident in committed:
                if row.state is not State.COMMITTED:
                    found.append(f"COMMITTED IS FINAL: {ident[0]}/{ident[1]} left COMMITTED "
                                 f"for {row.state.value}")
                elif row.result != committed[ident] and row.pruned is None:
                    found.append(f"COMMITTED IS FINAL: {ident[0]}/{ident[1]}'s result changed "
                                 f"from {committed[ident]} to {row.result}")
            if row.state is State.COMMITTED and row.actor == "reconcile" and (
                    self.truthful()):
                vk = (row.namespace, row.effect_type, row.key, row.vendor_attempt)
                if not any(e[0][:3] == vk[:3] and e[1] == "executed" for e in s.ledger):
                    found.append(f"RECONCILED COMMITTED IS TRUE: {row.namespace}/{row.key} was "
                                 "reconciled COMMITTED although the vendor never executed it")
            if row.state is State.FAILED and row.actor == "reconcile":
                vk = (row.namespace, row.effect_type, row.key, row.vendor_attempt)
                answered = next((e for e in s.ledger if e[0] == vk), None)
                if (answered is not None and answered[1] == "executed" and answered[2]) or (
                    answered is None and any(t[1] == vk and t[2] for t in s.transit)
                ):  # (one on its way under a key the vendor has answered gets that answer)
                    found.append(f"RECONCILED FAILED IS TRUE: {row.namespace}/{row.key} was "
                                 "reconciled FAILED while a request sent under its live lease "
                                 "was executed or still on its way")
        return found

    def record_committed(self, s: ModelState) -> ModelState:
        """Remember the results of effects newly COMMITTED (for 'COMMITTED is final')."""
        known = {(ns, key) for ns, key, _ in s.committed}
        new = [(r.namespace, r.key, r.result) for r in s.rows
               if r.state is State.COMMITTED and (r.namespace, r.key) not in known]
        if not new:
            return s
        return s._replace(committed=tuple(sorted((*s.committed, *new),
                                                 key=lambda t: (t[0], t[1]))))

    def ambiguous_moves(self, before: ModelState, after: ModelState,
                        action: Action) -> list[str]:
        """AMBIGUOUS moves only by resolve, reconcile, or the lapsed holder's late report."""
        found = []
        old = {(r.namespace, r.key): r for r in before.rows}
        for row in after.rows:
            prev = old.get((row.namespace, row.key))
            if prev is None or prev.state is not State.AMBIGUOUS or row.state is State.AMBIGUOUS:
                continue
            blocked = self.config.block and row.effect_type == self.config.workers[0][1]
            ok = (action[0] == "resolve" or (row.actor == "reconcile" and not blocked)
                  or (action[0] == "report" and row.actor == "late"))
            if not ok:
                found.append(f"AMBIGUOUS MOVES ONLY BY RESOLVE, RECONCILE OR A LATE REPORT: "
                             f"{row.namespace}/{row.key} became {row.state.value} by "
                             f"{describe(action, self.config)}")
        return found

    def transition(self, s: ModelState, action: Action) -> Step:
        """:meth:`apply` plus the invariants that compare two states, those of the answer a
        begin gave (:meth:`execute_violations`), the memo, and a begin's liveness (it answers
        within :data:`MAX_CALLS` store calls)."""
        if action[0] == "begin" and self.config.memo:
            hit = self._memo_answer(s, action[1])
            if hit is not None:
                return hit
        step = self.apply(s, action)
        after, extra = step.state, list[str]()
        answer = step.answer if isinstance(step.answer, tuple) else ()
        if action[0] == "step":
            w = after.workers[action[1]]
            if w.phase == "begin":
                after = _set_worker(after, action[1], w._replace(calls=w.calls + 1))
                if w.calls + 1 > MAX_CALLS:
                    extra.append(f"LIVENESS: worker {action[1]}'s begin made {w.calls + 1} "
                                 "store calls without an answer")
            elif self.config.memo and answer[:1] == ("duplicate",):
                row = self.row_of(after, action[1])
                assert row is not None
                after = _remember(after, row, row.token, row.attempt, row.result)
        if answer[:1] == ("execute",):
            extra += self.execute_violations(after, action[1], s)
        if action[0] == "step":
            extra += self._gave_up(s, after, action, step, answer)
        if after.rows is not s.rows:
            extra += self.ambiguous_moves(s, after, action)
            after = self.record_committed(after)
        if after is step.state and not extra:
            return step
        return Step(after, step.text, step.violations + tuple(extra), step.answer)

    def _gave_up(self, s: ModelState, after: ModelState, action: Action, step: Step,
                 answer: tuple[Any, ...]) -> list[str]:
        """Liveness of one begin: it does not give up (StoreError) unless a reply was lost,
        and it does not answer BLOCKED on an AMBIGUOUS effect whose grace period is over
        without asking the reconcile hook the bound registers."""
        i, w, c = action[1], s.workers[action[1]], self.config
        if answer == ("error", "StoreError") and not action[2] and LOST not in w.answers:
            return [f"LIVENESS: worker {i}'s begin gave up (StoreError) with no reply lost"]
        row = self.row_of(after, i)
        if answer[:1] == ("blocked",) and c.hook and not (c.block and c.governed(i)) and (
                row is not None) and (
                row.state is State.AMBIGUOUS) and "the hook answers" not in step.text and (
                row.lease is None or row.lease + c.grace_ticks <= after.now):
            return [f"RECONCILE WHEN DUE: worker {i} was answered BLOCKED on {row.namespace}/"
                    f"{row.key} without asking the reconcile hook"]
        return []

    def execute_violations(self, s: ModelState, i: int, before: ModelState) -> list[str]:
        """What an EXECUTE answered to worker ``i`` must satisfy in the state ``s`` it left
        (``before``: the state it came from): the row is IN_FLIGHT under the token and secret
        just handed out, with a live lease, within max_attempts, charged against its ceilings
        (approved or not) and within them when charged by this step, and with an approval
        consumed where the policy asks for one."""
        c, w, req = self.config, s.workers[i], self.requests[i]
        row, lease = self.row_of(s, i), w.lease
        where = f"{req.namespace}/{req.key}"
        if row is None or lease is None:
            return [f"EXECUTE ONLY ON A STORED ROW: worker {i} answered EXECUTE for {where}, "
                    "which the store does not hold"]
        found = []
        if row.state is not State.IN_FLIGHT:
            found.append(f"EXECUTE ONLY ON IN_FLIGHT: worker {i} answered EXECUTE for {where}, "
                         f"which is {row.state.value}")
        elif row.token != lease[0] or row.secret != lease[1]:
            found.append(f"EXECUTE ONLY UNDER THE CURRENT TOKEN: worker {i} answered EXECUTE "
                         f"with token {lease[0]} for {where}, held under token {row.token}"
                         + ("" if row.secret == lease[1] else " and another lease secret"))
        elif row.lease is None or row.lease < s.now:
            found.append(f"EXECUTE ONLY UNDER A LIVE LEASE: worker {i} answered EXECUTE for "
                         f"{where}, whose lease ended at {row.lease}")
        if row.attempt > req.max_attempts:
            found.append(f"MAX ATTEMPTS: {where} executed attempt {row.attempt} (max_attempts "
                         f"{req.max_attempts})")
        governed = c.policy_rule() and req.effect_type == c.workers[0][1]
        if governed and c.budget:
            scopes = json.loads(row.budget_keys) if row.budget_keys else []
            spend = {(n, k): v for n, k, v in s.spend}
            old = {(n, k): v for n, k, v in before.spend}
            if not scopes:
                found.append(f"SPEND WITHIN CEILINGS: {where} executed (attempt {row.attempt}) "
                             "without a charge against its ceiling")
            for scope in scopes:
                at = (row.namespace, scope)
                if spend.get(at, 0) != old.get(at) and spend.get(at, 0) > LIMIT:
                    found.append(f"SPEND WITHIN CEILINGS: {where} executed with {scope} at "
                                 f"{spend[(row.namespace, scope)]} (ceiling {LIMIT})")
        if governed and c.budget and s.spend != before.spend:
            found += self._shared_ceilings(s, i)
        if governed and c.approval and not any(
                u[0] == row.approval_id for u in s.consumed):
            found.append(f"APPROVAL REQUIRED: {where} executed without consuming an approval")
        return found

    def _shared_ceilings(self, s: ModelState, i: int) -> list[str]:
        """When worker ``i``'s EXECUTE was charged: what the effects of every worker sharing
        its agent (or run, or namespace on the database's date) hold, this one's included, is
        within that agent's (run's, day's) ceiling — counted from the rows, not from the
        counters the store keeps."""
        c, found = self.config, []
        for scope in ("agent", "run", "day"):
            if scope not in c.budget_scopes or self._held(s, i, scope) is None:
                continue
            held = self._held(s, i, scope) or 0
            if held > LIMIT:
                whose = f"day {s.day}" if scope == "day" else f"{scope} {self._who(i, scope)}"
                found.append(f"SPEND WITHIN CEILINGS: {whose}'s effects hold {held} "
                             f"(its ceiling {LIMIT}) once worker {i} executed")
        return found

    def _who(self, i: int, scope: str) -> str | None:
        """Worker ``i``'s agent or run id (``scope``)."""
        return self.config.agent(i) if scope == "agent" else self.config.run(i)

    def _held(self, s: ModelState, i: int, scope: str) -> int | None:
        """What the effects a ceiling of ``scope`` counts for worker ``i`` estimate, counted
        from the rows that hold a charge (IN_FLIGHT, AMBIGUOUS, COMMITTED): an agent's or a
        run's across the workers that carry its id, an effect type's in the namespace, a day's
        in the namespace charged on the database's current date. None: the ceiling does not
        count worker ``i`` (it carries no such id)."""
        c = self.config
        ns = c.workers[i][0]
        if scope in ("agent", "run"):
            me = self._who(i, scope)
            if me is None:
                return None
            keys = {(c.workers[j][0], c.key(j)) for j in range(len(c.workers))
                    if self._who(j, scope) == me and c.governed(j)}
        else:
            keys = {(ns, c.key(j)) for j in range(len(c.workers))
                    if c.workers[j][0] == ns and c.governed(j)}
        return sum(r.estimated or 0 for r in s.rows
                   if (r.namespace, r.key) in keys and r.state in _HELD
                   and (scope != "day" or r.day == s.day))

    def _refused(self, s: ModelState, i: int, label: str) -> tuple[str, ...]:
        """A ceiling refuses worker ``i``'s charge in ``s`` only when the effects it counts
        (from the rows) leave no room for one more."""
        scope = label.split(" ", 1)[0]
        held = self._held(s, i, scope) or 0
        cost = self.config.cost(i) or 0
        if held + cost <= LIMIT:
            return (f"A CEILING REFUSES ONLY WHEN REACHED: worker {i}'s charge was refused by "
                    f"the {label} while the effects it counts hold {held}"
                    + (f" on day {s.day}" if scope == "day" else "")
                    + f" ({cost} more fits its {LIMIT})",)
        return ()

    def _memo_answer(self, s: ModelState, i: int) -> Step | None:
        """A begin the real :meth:`effectgate.flow.BeginFlow.from_memo` answers from this
        namespace's memo (None: it asks the store)."""
        from ..flow import BeginFlow
        from ..memo import CommittedMemo, MemoEntry

        req = self.requests[i]
        memo = CommittedMemo(64)
        for ns, key, ph, et, eid, attempt, token, result in s.memo:
            if ns == req.namespace:
                memo.put(key, MemoEntry(ph, et, eid, attempt, token, result))
        hit = BeginFlow.from_memo(cast(BeginFlow, _MemoOnly(memo)), req)
        if hit is None:
            return None
        w = s.workers[i]
        left = w.begins - 1
        after = _set_worker(s, i, Worker("idle" if left else "done", left, w.forged,
                                         seen_token=w.seen_token))
        row = self.row_of(s, i)
        found = []
        if row is None or row.state is not State.COMMITTED or (
                row.payload_hash, row.effect_type) != (req.payload_hash, req.effect_type):
            found.append(f"IDENTITY: worker {i} was answered duplicate from the memo for "
                         f"{req.namespace}/{req.key}, stored as "
                         + ("nothing" if row is None else f"{row.state.value} of another "
                            "payload or type" if row.state is State.COMMITTED
                            else row.state.value))
        return Step(after, f"answered from the memo: duplicate (attempt {hit.attempt})",
                    tuple(found), (Decision.DUPLICATE.value, hit.attempt, hit.lease_token))

    def final(self, s: ModelState) -> list[str]:
        """Liveness at the end of a complete schedule (nothing left changes the state):
        every effect settled, AMBIGUOUS, waiting for a human, or IN_FLIGHT under a lease that
        ends (it lapses to AMBIGUOUS); no worker stuck inside a begin."""
        found = []
        for i, w in enumerate(s.workers):
            if w.phase == "begin":
                found.append(f"LIVENESS: worker {i} is stuck in its begin (next: {w.call})")
        for row in s.rows:
            where = f"{row.namespace}/{row.key}"
            if row.state is State.IN_FLIGHT and row.lease is None:
                found.append(f"LIVENESS: {where} is IN_FLIGHT under no lease: nobody holds it "
                             "and it never lapses")
        return found


class _MemoOnly:
    """What :meth:`effectgate.flow.BeginFlow.from_memo` reads of its flow: the memo."""

    def __init__(self, memo: Any) -> None:
        self.memo = memo
        self._remembers, self._find = memo.size > 0, memo.find


def _remember(s: ModelState, row: MRow, token: int, attempt: int,
              result: str | None) -> ModelState:
    """The namespace gate's memo after it remembers ``row`` COMMITTED."""
    entry = (row.namespace, row.key, row.payload_hash, row.effect_type, row.id, attempt, token,
             result)
    kept = [m for m in s.memo if (m[0], m[1]) != (row.namespace, row.key)]
    return s._replace(memo=tuple(sorted((*kept, entry), key=lambda m: (m[0], m[1]))))


def _lose(s: ModelState, kind: str, ref: str) -> ModelState:
    """``s`` after an operator's ``kind`` lost its reply: a fault spent, the action
    repeatable."""
    return s._replace(faults=s.faults - 1, repeat=(kind, ref))


def _written(text: str) -> str:
    return "refused" if "refused" in text else "written"


def _vk(head: EffectHead) -> tuple[str, str, str, int]:
    return (head.namespace, head.effect_type, head.key, head.vendor_attempt or head.attempt)


def _set_worker(s: ModelState, i: int, w: Worker) -> ModelState:
    workers = list(s.workers)
    workers[i] = w
    return s._replace(workers=tuple(workers))
