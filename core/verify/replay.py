"""Replay model schedules on a real store, through the real :class:`~effectgate.Gate`.

Two ways to run the same schedules (``Replayer(url, drive=...)``): ``"sync"``, every ``begin``
on its own thread through :meth:`Gate.begin`; ``"async"``, every begin a task on one event
loop (on a thread of its own) through :meth:`Gate.abegin`, so it reaches the store through the
store's async face (:mod:`effectgate.store.async_pg` on Postgres, the loop and worker threads
of :mod:`effectgate.store.threaded` on SQLite) as an async caller's does, and reports,
resolves, approvals and prunes go through ``areport``, ``aresolve``, ``aapprove``, ``adeny``
and ``aprune``. Everything else is one runner: the store's domain operations (the sync store's
and its async face's) are wrapped so that each call of a begin waits for the schedule's
go-ahead, which makes the interleaving of the model's schedule the real one, call by call (and
checks that the real flow makes exactly the store calls the model expects). A call of the
async face that the face makes through the sync store (a write on a worker thread) is one
call, released once. Reports, resolves and prunes are made by the replaying thread. A lost
reply is the real call followed by a :class:`StoreError` with ``outcome_unknown=True``. The
database clock advances by moving every stored timestamp of the replay's namespaces one tick
(:data:`TICK_SECONDS`) into the past: no sleeping; its UTC date changes (a per-day ceiling's
new counter) by moving every per-day counter's date one day into the past.

After every step the stored rows are compared with the model's (state, attempt, token, vendor
attempt, result, pruned), and every answer with the model's answer. A holder's inferred FAILED
is reported as the decorator reports it (:data:`~effectgate.reporting.INFERRED_FAILED`), and
each report must reach the store's ``record_outcome`` with ``keeps_vendor_key`` set for that
FAILED and for no other report. Each schedule gets its own
namespaces, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import (
    ConfigError,
    EffectGateError,
    InvalidTransition,
    StaleLease,
    StoreError,
    UnknownEffect,
)
from ..gate import Gate
from ..records import BeginDecision
from ..reporting import INFERRED_FAILED
from ..request import Lease
from ..states import Decision
from ..store.version import policy_meta_name
from .model import VENDOR, Action, Config, Model, ModelState
from .replay_drive import INSIDE, RUNNER, TIMEOUT, HeldFace, Killed, Loop, Runner, Threads

__all__ = ["TICK_SECONDS", "ReplayReport", "Replayer"]

TICK_SECONDS = 1000.0
"""One model tick on the real clock: long beside the milliseconds a replay takes, so no
decision hinges on how fast the machine is (leases end half a tick after a tick)."""
_WRAPPED = ("reserve", "fetch", "lapse", "move", "get", "resolve", "record_outcome",
            "approval", "deny", "decide_approval", "prune")
@dataclass
class ReplayReport:
    """What replaying some schedules found."""

    schedules: int = 0
    steps: int = 0
    mismatches: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No mismatch and no violation."""
        return not self.mismatches and not self.violations


class Replayer:
    """Replays schedules against the store at ``url`` (namespaces ``prefix`` + random),
    driving each begin through the sync flow (``drive="sync"``: :meth:`Gate.begin` on a
    thread) or the async one (``"async"``: :meth:`Gate.abegin` on an event loop)."""

    def __init__(self, url: str, *, prefix: str = "replay-",
                 schedule_timeout: float = 60.0,
                 drive: Literal["sync", "async"] = "sync") -> None:
        if drive not in ("sync", "async"):
            raise ConfigError(f"drive is 'sync' or 'async', not {drive!r}")
        self.prefix = prefix
        self.url = url
        self.schedule_timeout = schedule_timeout
        """A schedule still replaying after this many seconds is a finding (a hung flow)."""
        self.driver: Threads | Loop = Loop() if drive == "async" else Threads()
        self._faces: list[Any] = []
        self.gate = self._base(False)
        self.store = self.gate.store
        self._lose: str | None = None
        self._governed: dict[str, Gate] = {}
        self._dates_moved = False
        """Whether a midnight moved stored dates (a flow's row read before holds the old)."""
        self.kept_keys: list[bool] = []
        """``keeps_vendor_key`` of each ``record_outcome`` call of the report being replayed
        (the real one, and its repeat when its reply was lost)."""

    @property
    def drive(self) -> str:
        """``"sync"`` or ``"async"``: how begins (and the operator's calls) are made."""
        return self.driver.name

    def _base(self, policy: Any, memo: bool = False) -> Gate:
        gate = Gate(self.url, namespace=f"{self.prefix}base", policy=policy,
                    memo_size=64 if memo else 0)
        for name in _WRAPPED:
            setattr(gate.store, name, self._wrap(name, getattr(gate.store, name)))
        face = gate.store.async_face()
        self._faces.append(face)
        held: Any = HeldFace(face, self._await_wrap)
        # The namespaces' gates (Gate.in_namespace) take the store's face when they are made.
        gate.store.async_face = lambda: held  # type: ignore[method-assign]
        return gate

    def base_for(self, config: Config) -> Gate:
        """The gate a config's namespaces derive from: with the config's policy when it has
        one, with a COMMITTED memo when it models one."""
        rule = config.policy_rule()
        if not rule and not config.memo:
            return self.gate
        policy: Any = {"effects": {config.workers[0][1]: rule}} if rule else False
        name = json.dumps([policy, config.memo], sort_keys=True)
        if name not in self._governed:
            self._governed[name] = self._base(policy, config.memo)
        return self._governed[name]

    def close(self) -> None:
        """Forget the policy the governed base gates recorded for their namespace (the
        replay leaves nothing in the store), and close the stores (and the async loop)."""
        if self._governed:
            from sqlalchemy import text

            with contextlib.suppress(Exception), self.store.engine.begin() as conn:
                conn.execute(text("DELETE FROM effectgate_meta WHERE name = :name"),
                             {"name": policy_meta_name(f"{self.prefix}base")})
        self.driver.close(self._faces)
        for gate in self._governed.values():
            gate.close()
        self.gate.close()

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lost(self, name: str, lose: bool) -> None:
        """Raise the lost reply of call ``name``: the schedule's, or the replaying thread's
        (:attr:`_lose`)."""
        if not lose and self._lose == name and RUNNER.get() is None:
            self._lose = None
            lose = True
        if lose:
            raise StoreError("the reply was lost (replay)", outcome_unknown=True)

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if INSIDE.get():  # a held call of the async face, made through the sync store
                return real(*args, **kwargs)
            runner = RUNNER.get()
            command, lose = ("run", False) if runner is None else runner.ask(name).result(
                timeout=TIMEOUT)
            if command == "kill":
                raise Killed()
            if name == "resolve" and self._dates_moved:
                args = (self._redated(args[0]), *args[1:])
            elif name == "record_outcome":
                self.kept_keys.append(kwargs.get("keeps_vendor_key", False))
            result = real(*args, **kwargs)
            self._lost(name, lose)
            return result

        return call

    def _await_wrap(self, name: str, real: Callable[..., Awaitable[Any]],
                    ) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            runner = RUNNER.get()
            command, lose = ("run", False) if runner is None else await asyncio.wait_for(
                asyncio.wrap_future(runner.ask(name)), TIMEOUT)
            if command == "kill":
                raise Killed()
            if name == "record_outcome":
                self.kept_keys.append(kwargs.get("keeps_vendor_key", False))
            inside = INSIDE.set(True)
            try:
                result = await real(*args, **kwargs)
            finally:
                INSIDE.reset(inside)
            self._lost(name, lose)
            return result

        return call

    def _redated(self, row: Any) -> Any:
        """A row a flow read before a midnight moved the dates of its counters (the replay's
        doing, not the store's: a real date never changes), with the counters' names now."""
        from sqlalchemy import text

        with self.store.engine.connect() as conn:
            keys = conn.execute(text(
                "SELECT budget_keys FROM effectgate_effects WHERE id = :id AND token = :token"),
                {"id": row.id, "token": row.token}).scalar()
        return row if keys is None else row._replace(budget_keys=keys)

    # -- schedules -------------------------------------------------------------------------------

    def shaped(self, config: Config) -> Config:
        """``config`` in this store's shape (:attr:`Config.one_call`): explore and replay the
        schedules of the result."""
        return dataclasses.replace(config, one_call=not self.store.is_sqlite)

    def replay_all(self, config: Config, schedules: Iterable[tuple[Action, ...]],
                   report: ReplayReport | None = None) -> ReplayReport:
        """Replay each schedule; their mismatches and violations."""
        out = report or ReplayReport()
        started = time.perf_counter()
        for schedule in schedules:
            out.schedules += 1
            problems, steps = self.replay(config, schedule)
            out.steps += steps
            for p in problems:
                (out.violations if p.startswith("VIOLATION") else out.mismatches).append(p)
        out.seconds += time.perf_counter() - started
        return out

    def replay(self, config: Config, schedule: tuple[Action, ...]) -> tuple[list[str], int]:
        """Replay one schedule: the problems found (empty: the store agreed with the model
        at every step) and the steps replayed."""
        run = _Run(self, config)
        ends = time.monotonic() + self.schedule_timeout
        try:
            for n, action in enumerate(schedule, 1):
                try:
                    problem = run.step(action)
                    if not problem and n == len(schedule) and not config.budget:
                        problem = run.compare_spend()
                except Exception as err:  # a hung or broken step is a finding, not a crash
                    problem = f"{type(err).__name__}: {err}"
                if not problem and time.monotonic() > ends:
                    problem = f"the schedule ran past its {self.schedule_timeout:.0f}s timeout"
                if problem:
                    where = config.name if self.drive == "sync" else f"{config.name} (async)"
                    return [f"{where} step {n} {action!r}: {problem}"], n
            return [], len(schedule)
        finally:
            run.finish()


class _Run:
    """One schedule in flight: the model beside the real gates."""

    def __init__(self, replayer: Replayer, config: Config) -> None:
        self.r = replayer
        self.config = config
        base = replayer.base_for(config)
        if config.one_call == base.store.is_sqlite:
            raise ValueError(f"{config.name or 'this config'} was explored for the other store "
                             "shape: replay the schedules of replayer.shaped(config)")
        self.model = Model(config)
        self.state: ModelState = self.model.initial()
        tag = uuid.uuid4().hex[:10]
        spaces = sorted({ns for ns, _ in config.workers})
        self.names = {ns: f"{replayer.prefix}{tag}-{ns}" for ns in spaces}
        self.gates = {ns: base.in_namespace(name) for ns, name in self.names.items()}
        # The replay's own reads and writes of its namespaces, on the driver connection the
        # store keeps for this thread (no pool checkout, no statement compiled per step).
        self._spaces = tuple(self.names.values())
        mark = "?" if replayer.store.is_sqlite else "%s"
        self._in = f"({', '.join([mark] * len(self._spaces))})"
        shift = ", ".join(f"{c} = {c} - {TICK_SECONDS!r}" for c in (
            "lease_expires_at", "attempt_started_at", "created_at", "updated_at",
            "vendor_since", "pruned_at"))
        self._tick_sql = f"UPDATE effectgate_effects SET {shift} WHERE namespace IN {self._in}"
        lease = (config.lease_ticks - 0.5) * TICK_SECONDS
        grace = config.grace_ticks * TICK_SECONDS
        types = sorted({et for _, et in config.workers})
        for gate in self.gates.values():
            if config.hook:
                # The async flow awaits the first type's hook (an async def) on its loop and
                # runs any other type's (a plain function) on a worker thread.
                for n, et in enumerate(types):
                    gate.reconciler(et)(_ahook if replayer.drive == "async" and n == 0
                                        else _hook)
        self.requests = []
        for i, (ns, et) in enumerate(config.workers):
            gate = self.gates[ns]
            kind = gate.kind(et, vendor=VENDOR, lease_seconds=lease,
                             max_attempts=config.max_attempts, reconcile_grace_seconds=grace)
            self.requests.append(gate.request(
                effect_type=kind, key=config.key(i), payload=config.payload(i),
                estimated_cost_micros=config.cost(i),
                agent_id=config.agent(i), run_id=config.run(i)))
        self.runners: dict[int, Runner] = {}
        self.leases: dict[int, Lease | BeginDecision] = {}
        self.grants: set[tuple[str, str, int]] = set()
        self.committed: dict[tuple[str, str], str | None] = {}
        self._read: dict[tuple[str, str], Any] = {}
        """The stored rows the last comparison read (namespace, key), for the invariants."""
        self.last_approval = ""
        """The real id of the approval the operator last decided (for a repeat)."""
        self.today = _db_day(replayer) if config.budget and (
            "day" in config.budget_scopes) else None
        """The store's UTC date when the schedule began (the model's day 0 until a midnight)."""

    def finish(self) -> None:
        for runner in self.runners.values():
            runner.release("kill")
        for runner in self.runners.values():
            runner.join()
        with self.r.store.connection() as conn:
            for table in ("effectgate_approvals", "effectgate_budgets", "effectgate_effects"):
                conn.execute(f"DELETE FROM {table} WHERE namespace IN {self._in}",
                             self._spaces)

    def call(self, gate: Gate, method: str, *args: Any, **kwargs: Any) -> Any:
        """The operator's (or a holder's) call ``method`` on ``gate``: its sync form, or its
        async one (``areport``...) on the replay's loop."""
        return self.r.driver.call(gate, method, *args, **kwargs)

    def step(self, action: Action) -> str | None:
        if action not in self.model.actions(self.state):
            return "the model does not enable this action"
        before = self.state
        expected = self.model.transition(before, action)
        self.state = expected.state
        kind = action[0]
        problem = getattr(self, f"_{kind}")(action, before, expected)
        return problem or self._compare() or self._invariants()

    # -- actions ---------------------------------------------------------------------------------

    def _tick(self, action: Action, before: ModelState, expected: Any) -> str | None:
        with self.r.store.connection() as conn:
            conn.execute(self._tick_sql, self._spaces)
        return None

    def _midnight(self, action: Action, before: ModelState, expected: Any) -> str | None:
        """The store's clock cannot be moved: every per-day counter of the replay's
        namespaces, and every effect's record of the counters it was charged, moves one day
        into the past instead (the oldest first: the keys stay distinct)."""
        from sqlalchemy import bindparam, text

        names = {"ns": list(self.names.values())}
        with self.r.store.engine.begin() as conn:
            counters = conn.execute(text(
                "SELECT namespace, scope_key FROM effectgate_budgets WHERE namespace IN :ns")
                .bindparams(bindparam("ns", expanding=True)), names).all()
            for ns, key in sorted(counters, key=lambda c: c[1]):
                if _DAY in key:
                    conn.execute(text("UPDATE effectgate_budgets SET scope_key = :new WHERE "
                                      "namespace = :ns AND scope_key = :old"),
                                 {"new": _day_before(key), "ns": ns, "old": key})
            charged = conn.execute(text(
                "SELECT id, budget_keys FROM effectgate_effects WHERE namespace IN :ns AND "
                "budget_keys IS NOT NULL").bindparams(bindparam("ns", expanding=True)),
                names).all()
            for effect_id, keys in charged:
                if _DAY in keys:
                    conn.execute(text("UPDATE effectgate_effects SET budget_keys = :keys "
                                      "WHERE id = :id"), {"id": effect_id, "keys": json.dumps(
                                          [_day_before(k) if _DAY in k else k
                                           for k in json.loads(keys)])})
        self.r._dates_moved = True
        return None

    def _stored(self, key: str) -> str:
        """A model counter's key as the store names it: a per-day counter of model day ``d``
        (``...|day|d<d>``) bears the date that many midnights before the store's today."""
        if _DAY not in key or self.today is None:
            return key
        head, day = key.rsplit(_DAY, 1)
        date = datetime.date.fromisoformat(self.today) - datetime.timedelta(
            days=self.state.day - int(day.removeprefix("d")))
        return f"{head}{_DAY}{date.isoformat()}"

    def _begin(self, action: Action, before: ModelState, expected: Any) -> str | None:
        i = action[1]
        runner = self.runners[i] = Runner()
        self.r.driver.start(runner, self.gates[self.config.workers[i][0]], self.requests[i])
        return self._expect_call(i, runner.next(), expected.answer)

    def _step(self, action: Action, before: ModelState, expected: Any) -> str | None:
        i, lost, verdict = action[1], action[2], action[3]
        runner = self.runners[i]
        if verdict is not None:
            runner.verdict = verdict
        # The model loses only the reply of a call that wrote (or a reservation's read): a
        # write that changed nothing answers as it is (the model spent no fault on it).
        runner.release("run", lost and expected.state.faults < before.faults)
        return self._expect_call(i, runner.next(), expected.answer)

    def _expect_call(self, i: int, event: tuple[str, Any], answer: Any = None) -> str | None:
        w = self.state.workers[i]
        kind, value = event
        if w.phase == "begin":
            want = {"recover": "fetch", "first": "move"}.get(w.call or "", w.call)
            if kind != "call" or value != want:
                return f"the model's next store call is {want}, the real flow's {event!r}"
            return None
        self.runners.pop(i).join()
        if kind != "done":
            return f"the model's begin answered {answer!r}, the real one is at {event!r}"
        if isinstance(value, BeginDecision):
            got: tuple[Any, ...] = (value.decision.value, value.attempt, value.lease_token)
            if value.decision is Decision.EXECUTE:
                assert value.lease is not None
                # With a memo the gate remembers what a decision's holder commits (a bare
                # lease proves the same, and is remembered by nobody). The async replay always
                # reports with the decision, as the async decorator does: a report that moves
                # no spend is then one native statement on Postgres.
                self.leases[i] = value if self.config.memo or self.r.drive == "async" else (
                    value.lease)
                grant = (value.namespace, value.key, value.attempt)
                if grant in self.grants:
                    return f"VIOLATION: attempt {value.attempt} executed twice on the store"
                self.grants.add(grant)
                real = self.r.store.get(value.namespace, value.key)
                if real is None or real.state.value != "in_flight" or (
                        real.token != value.lease_token):
                    return ("VIOLATION: EXECUTE ONLY ON IN_FLIGHT UNDER ITS TOKEN: the store "
                            f"answered EXECUTE (token {value.lease_token}) for a row that is "
                            + ("missing" if real is None
                               else f"{real.state.value} under token {real.token}"))
        elif isinstance(value, EffectGateError):
            got = ("error", type(value).__name__)
        else:
            return f"the real begin raised {type(value).__name__}: {value}"
        if got != answer:
            return f"the model answered {answer!r}, the real gate {got!r}"
        return None

    def _report(self, action: Action, before: ModelState, expected: Any) -> str | None:
        i, outcome, lost = action[1], action[2], action[3]
        lease = before.workers[i].lease
        assert lease is not None
        result = f"v{lease[3]}" if outcome == "committed" else None
        if outcome == "inferred":  # what the decorator reports for a built-in classifier's
            # FAILED: the store is told to keep the vendor key (``keeps_vendor_key``)
            outcome = INFERRED_FAILED
        return self._reported(i, self.leases[i], outcome, result, lost, expected.answer)

    def _reported(self, i: int, lease: Lease | BeginDecision, outcome: str, result: Any, lost: bool,
                  answer: Any) -> str | None:
        gate = self.gates[self.config.workers[i][0]]
        if lost:
            self.r._lose = "record_outcome"
        self.r.kept_keys.clear()
        try:
            self.call(gate, "report", lease, outcome, result=result)
            got = "written"
        except (StaleLease, UnknownEffect):  # refused: nothing written
            got = "refused"
        except StoreError:
            got = "lost" if lost else "error"
        finally:
            self.r._lose = None
        # A report whose reply was lost is sent again by the gate, which answers as though
        # the first reply had come (a repeat of the holder's own report is found done).
        if got != answer:
            return f"the model's report was {answer}, the real one {got}"
        # The store is told to keep the vendor key for an inferred FAILED, and only then.
        kept, keeps = self.r.kept_keys, outcome is INFERRED_FAILED
        if (keeps and not (kept and all(kept))) or (not keeps and any(kept)):
            return (f"the report ({'inferred' if keeps else outcome}) reached the store's "
                    f"record_outcome with keeps_vendor_key {kept}, not {keeps}")
        return None

    def _guess(self, action: Action, before: ModelState, expected: Any) -> str | None:
        i = action[1]
        row = self.model.row_of(before, i)
        assert row is not None
        forged = Lease(row.key, row.token, "guessed-" + uuid.uuid4().hex)
        return self._reported(i, forged, "failed", None, False, expected.answer)

    def _borrow(self, action: Action, before: ModelState, expected: Any) -> str | None:
        held = self.leases[action[2]]  # another holder's lease, as a worker would have it
        lease = held.lease if isinstance(held, BeginDecision) else held
        assert lease is not None
        return self._reported(action[1], lease, "failed", None, False, expected.answer)

    def _die(self, action: Action, before: ModelState, expected: Any) -> str | None:
        runner = self.runners.pop(action[1], None)
        if runner is not None:
            runner.release("kill")
            kind, _ = runner.next()
            runner.join()
            if kind != "killed":
                return f"the dying begin ended with {kind}"
        return None

    def _send(self, action: Action, before: ModelState, expected: Any) -> str | None:
        return None  # the vendor is the model's

    _land = _send

    def _resolve(self, action: Action, before: ModelState, expected: Any) -> str | None:
        outcome, force, lost = action[1], action[2], action[3]
        gate = self.gates[self.config.workers[0][0]]
        if lost:
            self.r._lose = "resolve"
        try:
            self.call(gate, "resolve", self.config.key(0), outcome, by="operator", force=force,
                      result="op" if outcome == "committed" else None)
            got = "resolved"
        except InvalidTransition:
            got = "refused"
        except StoreError:
            got = "lost" if lost else "error"
        finally:
            self.r._lose = None
        want = expected.answer if not lost or expected.answer == "refused" else "lost"
        return None if got == want else f"the model's resolve was {want}, the real one {got}"

    def _approve(self, action: Action, before: ModelState, expected: Any) -> str | None:
        gate = self.gates[self.config.workers[0][0]]
        want = self.model._pending(before)
        pending = [a for a in gate.list_approvals("pending") if a.key == want.key]
        if len(pending) != 1:
            return f"the store has {len(pending)} pending approvals of {want.key}, the model one"
        lost = action[1:] == (True,)
        self.last_approval = pending[0].approval_id
        if lost:
            self.r._lose = "decide_approval" if action[0] == "approve" else "deny"
        try:
            if action[0] == "approve":
                self.call(gate, "approve", pending[0].approval_id, by="operator")
            else:
                self.call(gate, "deny", pending[0].approval_id, by="operator")
        except StoreError as err:
            if not lost:
                return f"the model {expected.answer} it, the real gate raised {err!r}"
            return None
        except EffectGateError as err:
            return f"the model {expected.answer} it, the real gate raised {err!r}"
        finally:
            self.r._lose = None
        return "the model lost the reply, the real gate answered" if lost else None

    def _again(self, action: Action, before: ModelState, expected: Any) -> str | None:
        """The operator repeats the action whose reply was lost, as the model does (its reply
        lost too: the read of the request, or the prune)."""
        kind = before.repeat[0]
        if kind == "prune":
            return self._prune(("prune", *action[1:]), before, expected)
        gate = self.gates[self.config.workers[0][0]]
        if action[1:] == (True,):
            self.r._lose = "approval"
        try:
            if kind == "approve":
                self.call(gate, "approve", self.last_approval, by="operator")
            else:
                self.call(gate, "deny", self.last_approval, by="operator")
            got = "accepted"
        except (InvalidTransition, UnknownEffect):
            got = "refused"
        except StoreError:
            got = "lost" if self.r._lose is None else "error"
        finally:
            self.r._lose = None
        return None if got == expected.answer else (
            f"the model's repeated {kind} was {expected.answer}, the real gate's {got}")

    _deny = _approve

    def _self_approve(self, action: Action, before: ModelState, expected: Any) -> str | None:
        gate = self.gates[self.config.workers[0][0]]
        want = self.model._pending(before)
        pending = [a for a in gate.list_approvals("pending") if a.key == want.key]
        if len(pending) != 1:
            return f"the store has {len(pending)} pending approvals of {want.key}, the model one"
        if pending[0].requested_by != want.requested_by:
            return (f"the store's request was made by {pending[0].requested_by}, the model's "
                    f"by {want.requested_by}")
        try:
            self.call(gate, "approve", pending[0].approval_id, by=want.requested_by or "")
            got = "approved"
        except InvalidTransition:
            got = "refused"
        return None if got == expected.answer else (
            f"the model's self-approval was {expected.answer}, the real gate's {got}")

    def _prune(self, action: Action, before: ModelState, expected: Any) -> str | None:
        gate = self.gates[self.config.workers[0][0]]
        if action[1:] == (True,):
            self.r._lose = "prune"
            try:
                self.call(gate, "prune", datetime.timedelta(0))
            except StoreError:
                return None
            finally:
                self.r._lose = None
            return "the model lost the prune's reply, the real gate answered"
        count = self.call(gate, "prune", datetime.timedelta(0))
        return None if count == expected.answer else (
            f"the model pruned {expected.answer}, the real store {count}")

    # -- comparisons -----------------------------------------------------------------------------

    def _compare(self) -> str | None:
        self._read = {}
        for ns, key in self._keys():
            name = self.names[ns]
            row = self.model._row(self.state, ns, key)
            real = self._read[(ns, key)] = self.r.store.get(name, key)
            if row is None or real is None:
                if (row is None) != (real is None):
                    return f"{ns}/{key}: the model has {row}, the store {real}"
                continue
            want = (row.state.value, row.attempt, row.token, row.vendor_attempt, row.result,
                    row.pruned is not None)
            got = (real.state.value, real.attempt, real.token, real.vendor_attempt,
                   real.result, real.pruned_at is not None)
            if want != got:
                return (f"{ns}/{key}: the model's row (state, attempt, token, vendor attempt, "
                        f"result, pruned) is {want}, the store's {got}")
        return self.compare_spend() if self.config.budget else None

    def compare_spend(self) -> str | None:
        """The store's spend counters against the model's. Every step of a config with a
        ceiling; once, after its last step, for a config without one (whose model never
        spends: a counter the store wrote anyway shows up then)."""
        # Every namespace's counters in one read (one round trip, not one a namespace).
        with self.r.store.connection() as conn:
            stored = conn.execute("SELECT namespace, scope_key, spent_micros FROM "
                                  f"effectgate_budgets WHERE namespace IN {self._in}",
                                  self._spaces).fetchall()
        for ns, name in self.names.items():
            real_spend = sorted((k, v) for n, k, v in stored if n == name)
            model_spend = sorted((self._stored(k), v) for n, k, v in self.state.spend
                                 if n == ns)
            if real_spend != model_spend:
                return f"{ns}: the model's spend is {model_spend}, the store's {real_spend}"
        return None

    def _keys(self) -> list[tuple[str, str]]:
        return sorted({(ns, self.config.key(i)) for i, (ns, _) in enumerate(
            self.config.workers)})

    def _invariants(self) -> str | None:
        """The model's state invariants on the store's own rows and counters (those that read
        the model's vendor are the model's), and COMMITTED is final on the store."""
        for ns, key in self._keys():
            name = self.names[ns]
            # The rows _compare read this step (nothing wrote since): the same store read.
            real = self._read[(ns, key)] if (ns, key) in self._read else self.r.store.get(
                name, key)
            if real is None:
                continue
            if (name, key) in self.committed:
                if real.state.value != "committed" or (
                    real.result != self.committed[(name, key)] and real.pruned_at is None
                ):
                    return f"VIOLATION: {ns}/{key}'s COMMITTED effect changed on the store"
            elif real.state.value == "committed":
                self.committed[(name, key)] = real.result
        found = self.model.check(self.state)
        return f"VIOLATION: {found[0]}" if found else None


_DAY = "|day|"
"""What a per-day counter's key holds before its date."""


def _day_before(key: str) -> str:
    """A per-day counter's key one day earlier."""
    head, date = key.rsplit(_DAY, 1)
    return f"{head}{_DAY}{datetime.date.fromisoformat(date) - datetime.timedelta(days=1)}"


def _db_day(replayer: Replayer) -> str:
    """The store's UTC date (its ``db_day``)."""
    from sqlalchemy import select

    from ..store.schema import db_day

    with replayer.store.engine.connect() as conn:
        return str(conn.execute(select(db_day())).scalar())


def _hook(record: Any) -> str:
    """The reconcile hook of a replay: the verdict the schedule chose for this begin."""
    runner = RUNNER.get()
    found = (runner.verdict if runner is not None else None) or "unknown"
    if found == "raise":
        raise RuntimeError("the reconcile hook raised (replay)")
    return found


async def _ahook(record: Any) -> str:
    """The async replay's reconcile hook (an ``async def``, awaited on the loop)."""
    return _hook(record)
