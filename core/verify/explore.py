"""Exhaustive exploration of the protocol model (:mod:`effectgate.verify.model`): every
interleaving up to a bound, breadth first with state hashing (a state reached twice is explored
once, and so is a state that differs from one reached only by a permutation of interchangeable
workers: :mod:`effectgate.verify.symmetry`), so the first violation found comes with the
shortest schedule that reaches it.

Also: the bounds the suite and ``effectgate verify --exhaustive`` use, counter-examples as
numbered steps and as a regression test, schedules (every one, or a seeded sample) for replay on
the real stores, and reverted fixes of ``decide`` (and of a rule of the model's store) as
mutations.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

from .. import decide
from ..errors import ConfigError
from . import model as model_module
from .model import Action, Config, Model, ModelState, describe
from .symmetry import Symmetry
from .walk import MAX_WALK, collector_paused, path_to

__all__ = [
    "BOUNDS",
    "MUTATIONS",
    "Exploration",
    "Trace",
    "covering_schedules",
    "emit_regression_test",
    "explore",
    "mutation",
    "run_schedule",
    "sample_schedules",
    "schedules",
    "trace_of",
]

_TWO = (("a", "refund"), ("a", "refund"))
BOUNDS: dict[str, tuple[Config, ...]] = {
    "2-worker": (
        Config(workers=_TWO, faults=1, ops=0, name="2 workers, one namespace, lost replies"),
        Config(workers=_TWO, faults=0, ops=1, name="2 workers, one namespace, an operator"),
        Config(workers=(("a", "refund"), ("b", "refund")), begins=(2, 1), faults=0, ops=0,
               name="2 workers, two namespaces"),
        Config(workers=(("a", "refund"), ("a", "payout")), name="2 workers, two effect types"),
        Config(workers=_TWO, begins=(2, 2), faults=1, ops=1, approval=True, forgery=False,
               name="2 workers, approvals"),
        Config(workers=_TWO, begins=(1, 1), faults=1, ops=1, budget=True, forgery=False,
               name="2 workers, a spend ceiling"),
        Config(workers=_TWO, keys=("k", "j"), begins=(2, 2), faults=0, ops=2, approval=True,
               budget=True, forgery=False, prune=False,
               name="2 workers, two keys, approvals and a spend ceiling"),
        Config(workers=_TWO, keys=("k", "j"), begins=(1, 1), faults=1, ops=1, budget=True,
               forgery=False, prune=False, name="2 workers, two keys under one ceiling"),
        Config(workers=_TWO, payloads=(1, 2), begins=(2, 1), faults=0, ops=1, memo=True,
               forgery=False, name="2 workers, two payloads on one key, a memo"),
        Config(workers=_TWO, begins=(1, 1), faults=0, ops=1, unsure=True, inferred=True,
               forgery=False, prune=False, name="2 workers, a holder unsure of its outcome"),
        Config(workers=_TWO, begins=(2, 1), faults=0, ops=0, max_attempts=2, hook=False,
               forgery=False, prune=False, ticks=3, name="2 workers, max_attempts reached"),
        Config(workers=_TWO, begins=(2, 1), faults=1, ops=1, deny=True, forgery=False,
               name="2 workers, a type the policy denies"),
        Config(workers=_TWO, begins=(1, 1), faults=0, ops=1, block=True, forgery=False,
               prune=False, name="2 workers, on_ambiguous block"),
        Config(workers=_TWO, agents=("bot0", "bot1"), begins=(2, 1), faults=0, ops=1,
               approval=True, self_approve=True, forgery=False, prune=False,
               name="2 workers on two agents, a requester approving its own request"),
        Config(workers=_TWO, agents=("bot0", "bot1"), begins=(2, 1), faults=0, ops=1,
               approval=True, self_approve=True, allow_self_approval=True, forgery=False,
               prune=False, name="2 workers on two agents, self-approval allowed"),
        Config(workers=_TWO, keys=("k", "j"), agents=("bot", "bot"), begins=(1, 1), faults=1,
               ops=1, budget=True, budget_scopes=("agent",), forgery=False, prune=False,
               name="2 workers, two keys, one agent under a per-agent ceiling"),
        Config(workers=_TWO, keys=("k", "j"), agents=("bot0", "bot1"), runs=("r", "r"),
               begins=(2, 1), faults=0, ops=2, approval=True, budget=True,
               budget_scopes=("run", "agent"), forgery=False, prune=False,
               name="2 workers on two agents, one run, per-run and per-agent ceilings"),
        Config(workers=_TWO, keys=("k", "j"), begins=(1, 1), faults=0, ops=1, ticks=1,
               budget=True, budget_scopes=("day",), days=1, forgery=False, prune=False,
               name="2 workers, two keys under a per-day ceiling, a midnight"),
        Config(workers=_TWO, begins=(1, 1), faults=2, ops=2, approval=True, lost_ops=True,
               forgery=False, prune=True, name="2 workers, approvals, the operator's lost "
               "replies repeated"),
        Config(workers=_TWO, begins=(1, 1), faults=0, ops=1, hook_fails=True, hook_lies=True,
               forgery=False, prune=False, name="2 workers, a reconcile hook that raises or "
               "lies"),
    ),
    "3-worker": (
        Config(workers=(*_TWO, ("a", "refund")), begins=(1, 1, 1), faults=1, ops=0,
               forgery=False, name="3 workers, one namespace, lost replies"),
        Config(workers=(*_TWO, ("a", "refund")), begins=(1, 1, 1), faults=0, ops=1,
               forgery=False, name="3 workers, one namespace, an operator"),
        Config(workers=(*_TWO, ("a", "payout")), begins=(1, 1, 1), faults=0, ops=0,
               name="3 workers, two effect types"),
    ),
    "replay": (
        Config(workers=_TWO, begins=(1, 1), faults=0, ops=0, forgery=False, prune=False,
               name="2 workers, one begin each, no faults"),
    ),
    "over-alone": (
        Config(workers=_TWO, keys=("k", "j"), runs=("r", "r"), costs=(150, 60),
               begins=(2, 2), faults=0, ops=1, approval=True, budget=True,
               budget_scopes=("run",), forgery=False, prune=False,
               name="2 workers, approvals, one cost alone over a per-run ceiling"),
    ),
}
"""The bounds: the 2-worker bound runs in the normal suite, the 3-worker bound is slow;
``replay`` is small enough that every one of its schedules is replayed on the real stores;
``over-alone`` (a call whose cost alone is over its ceiling: refused before any approval is
asked) is explored by ``tests/test_cost_over_a_ceiling.py``, outside the 2-worker bound whose
replay covers are kept in a file."""


@dataclass(frozen=True)
class Trace:
    """A schedule and what each step did, ending in the violations it reached."""

    config: Config
    actions: tuple[Action, ...]
    texts: tuple[str, ...]
    violations: tuple[str, ...]

    def format(self) -> str:
        """The schedule as numbered steps a person can read."""
        lines = [f"counter-example ({self.config.name or 'bound'}), {len(self.actions)} steps:"]
        for n, (action, text) in enumerate(zip(self.actions, self.texts, strict=True), 1):
            lines.append(f"  {n:>2}. {describe(action, self.config)}: {text}")
        lines += [f"  VIOLATED {v}" for v in self.violations]
        return "\n".join(lines)


@dataclass(frozen=True)
class Exploration:
    """What one exploration found: distinct states, transitions, time, the first violation."""

    config: Config
    states: int
    transitions: int
    seconds: float
    violation: Trace | None

    def summary(self) -> str:
        """One line: the bound, states explored and time."""
        found = "no violation" if self.violation is None else "VIOLATION"
        return (f"{self.config.name}: {self.states} states, {self.transitions} transitions, "
                f"{self.seconds:.2f}s, {found}")


def explore(config: Config, *, max_states: int | None = None,
            symmetry: bool = True) -> Exploration:
    """Every state reachable within ``config``, breadth first; stops at the first violation
    (found with a shortest schedule). ``max_states``: raise if the bound is larger.

    ``symmetry``: states that differ only by a permutation of interchangeable workers
    (:mod:`effectgate.verify.symmetry`) are explored once, from the first of them reached (so
    ``states`` counts those classes, and a counter-example is a schedule of real actions from
    the initial state, as short as without the reduction)."""
    with collector_paused():
        return _explore(config, max_states, symmetry)


def _explore(config: Config, max_states: int | None, symmetry: bool) -> Exploration:
    model = Model(config)
    key: Callable[[ModelState], Any] = Symmetry(config).key if symmetry else _same
    started = time.perf_counter()
    root = model.initial()
    parent: dict[Any, tuple[Any, Action] | None] = {key(root): None}
    queue = deque([(root, key(root))])
    transitions = 0
    while queue:
        s, at = queue.popleft()
        ends = True  # a complete schedule ends here: nothing enabled changes the state
        for action in model.actions(s):
            step = model.transition(s, action)
            transitions += 1
            if step.violations:
                path = [*path_to(parent, at), action]
                return Exploration(config, len(parent), transitions,
                                   time.perf_counter() - started, _trace(config, path))
            after = step.state
            if after == s:
                continue
            ends = False
            seen = key(after)
            if seen not in parent:
                parent[seen] = (at, action)
                queue.append((after, seen))
                if max_states is not None and len(parent) > max_states:
                    raise RuntimeError(f"{config.name}: more than {max_states} states")
        stuck = model.final(s) if ends else []
        if stuck:
            trace = _trace(config, path_to(parent, at))
            return Exploration(config, len(parent), transitions, time.perf_counter() - started,
                               Trace(config, trace.actions, trace.texts, tuple(stuck)))
    return Exploration(config, len(parent), transitions, time.perf_counter() - started, None)


def _same(s: ModelState) -> ModelState:
    return s


def trace_of(config: Config, actions: list[Action] | tuple[Action, ...]) -> Trace:
    """A schedule's :class:`Trace` (every action must be enabled when it comes)."""
    return _trace(config, list(actions))


def _trace(config: Config, actions: list[Action]) -> Trace:
    model = Model(config)
    s = model.initial()
    texts: list[str] = []
    violations: tuple[str, ...] = ()
    for action in actions:
        step = model.transition(s, action)
        call = s.workers[action[1]].call if action[0] == "step" else None
        texts.append(f"[{'reserve/fetch again' if call == 'recover' else call}] {step.text}"
                     if call else step.text)
        s, violations = step.state, step.violations
    return Trace(config, tuple(actions), tuple(texts), violations)


def run_schedule(config: Config, actions: list[Action] | tuple[Action, ...]) -> list[str]:
    """Run a schedule on the model, checking the invariants at every step; an action the
    state does not enable is skipped. The violations (none on a correct protocol)."""
    model = Model(config)
    s = model.initial()
    found: list[str] = []
    for action in actions:
        action = tuple(action)
        if action not in model.actions(s):
            continue
        step = model.transition(s, action)
        found += step.violations
        s = step.state
    if all(model.transition(s, a).state == s for a in model.actions(s)):
        found += model.final(s)  # a complete schedule: liveness
    return found


def schedules(config: Config, *, limit: int = 100_000) -> Iterator[tuple[Action, ...]]:
    """Every maximal schedule of ``config`` (depth first, no state hashing: each distinct
    order is its own schedule); :class:`RuntimeError` past ``limit`` of them."""
    model = Model(config)
    count = 0
    stack: list[tuple[ModelState, tuple[Action, ...]]] = [(model.initial(), ())]
    while stack:
        s, path = stack.pop()
        nexts = []
        for action in model.actions(s):
            after = model.transition(s, action).state
            if after != s:  # an action that changes nothing is the same schedule
                nexts.append((after, (*path, action)))
        if not nexts:
            count += 1
            if count > limit:
                raise RuntimeError(f"{config.name}: more than {limit} schedules")
            yield path
            continue
        stack.extend(reversed(nexts))


def covering_schedules(config: Config) -> list[tuple[Action, ...]]:
    """Schedules that together take every transition of ``config``'s state graph at least
    once, those that change nothing included (each: a shortest path to an untaken
    transition, then on to the end, preferring untaken ones): every distinct step of the
    bound, in far fewer schedules than every order."""
    model = Model(config)
    root = model.initial()
    parent: dict[ModelState, tuple[ModelState, Action] | None] = {root: None}
    order = [root]
    queue = deque([root])
    while queue:
        s = queue.popleft()
        for action in model.actions(s):
            after = model.transition(s, action).state
            if after not in parent:
                parent[after] = (s, action)
                order.append(after)
                queue.append(after)
    taken: set[tuple[ModelState, Action]] = set()
    out: list[tuple[Action, ...]] = []
    for s in order:
        for action in model.actions(s):
            # A transition that changes nothing (a refused forgery, resolve or report) is
            # taken too: the store must refuse it as well.
            if (s, action) in taken:
                continue
            path = path_to(parent, s)
            cur = root
            for a in path:
                taken.add((cur, a))
                cur = model.transition(cur, a).state
            path.append(action)
            taken.add((s, action))
            cur = model.transition(s, action).state
            while len(path) < MAX_WALK:
                moves = [a for a in model.actions(cur) if model.transition(cur, a).state != cur]
                if not moves:
                    break
                fresh = [a for a in moves if (cur, a) not in taken]
                a = (fresh or moves)[0]
                taken.add((cur, a))
                path.append(a)
                cur = model.transition(cur, a).state
            out.append(tuple(path))
    return out


def sample_schedules(config: Config, count: int, *, seed: int = 17) -> list[tuple[Action, ...]]:
    """``count`` random maximal schedules of ``config`` (a seeded, repeatable sample)."""
    model = Model(config)
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        s, path = model.initial(), list[Action]()
        idle: set[Action] = set()  # actions that changed nothing: each at most once a walk
        while len(path) < MAX_WALK:
            actions = [a for a in model.actions(s) if a not in idle]
            if not actions:
                break
            action = rng.choice(actions)
            path.append(action)
            after = model.transition(s, action).state
            if after == s:
                idle.add(action)
            s = after
        out.append(tuple(path))
    return out


# -- reverted fixes of decide (the mutation suite, tests/test_mutations.py, patches the product's
# source itself: decide, flow and the store's SQL) -------------------------------------------

_real_resolution = decide.resolution
_real_begin_step = decide.begin_step
_real_adopts = decide.adopts_lost_reservation


def _live_resolvable(row: Any, outcome: Any, *, force: bool = False) -> Any:
    return _real_resolution(row, outcome, force=True)


def _no_grace(row: Any, req: Any, approval: Any = None, *, reconcilable: bool = False) -> Any:
    return _real_begin_step(row, req._replace(reconcile_grace_seconds=-1e9), approval,
                            reconcilable=reconcilable)


def _type_not_identity(row: Any, req: Any, approval: Any = None, *,
                       reconcilable: bool = False) -> Any:
    if row is not None and row.effect_type != req.effect_type:
        row = row._replace(effect_type=req.effect_type)
    return _real_begin_step(row, req, approval, reconcilable=reconcilable)


def _secret_only(row: Any, secret_hash: str) -> bool:
    return row.lease_secret is not None and row.lease_secret == secret_hash


_real_reported = model_module.reported_vendor_attempt


def _inferred_moves_key(row: Any, outcome: Any, keeps_vendor_key: bool = False) -> Any:
    return _real_reported(row, outcome)


MUTATIONS: dict[str, tuple[str, Callable[..., Any], str]] = {
    "live-resolve": ("resolution", _live_resolvable,
                     "a live lease resolved without force"),
    "grace": ("begin_step", _no_grace, "reconcile asked without a grace period"),
    "effect-type": ("begin_step", _type_not_identity, "the effect type not part of identity"),
    "adopt-by-secret": ("adopts_lost_reservation", _secret_only,
                        "a lost reservation reply recovered by the lease secret alone (an "
                        "operator's resolve keeps the secret)"),
    "inferred-moves-key": ("model.reported_vendor_attempt", _inferred_moves_key,
                           "a FAILED a built-in classifier inferred moves the vendor key (as "
                           "before 1c27d55): the retry of a body whose earlier request the "
                           "vendor executed runs again under a new key"),
}
"""Fixes reverted: the name of the function replaced (in ``decide``; ``model.``: the model's
statement of a rule the store's SQL keeps, :mod:`effectgate.verify.model_rows` as the model
calls it), its pre-fix behaviour, and what it lets happen (the model and the real flow both
call ``decide`` through the module, so both see the mutant; a rule of the model's store is
the model's alone: the mutation suite breaks the SQL that keeps it,
``tests/test_mutations.py``)."""


@contextlib.contextmanager
def mutation(name: str) -> Iterator[None]:
    """Run with fix ``name`` (a key of :data:`MUTATIONS`) reverted in :mod:`effectgate.decide`
    (or in the model, :mod:`effectgate.verify.model`); :class:`ConfigError` for an unknown
    name."""
    if name not in MUTATIONS:
        raise ConfigError(f"unknown mutation {name!r}; choose from {', '.join(MUTATIONS)}")
    attr, fn, _ = MUTATIONS[name]
    owner: Any = decide
    if attr.startswith("model."):
        owner, attr = model_module, attr.removeprefix("model.")
    with mock.patch.object(owner, attr, fn):
        yield


def emit_regression_test(trace: Trace, *, mutation_name: str | None = None,
                         name: str = "counter_example") -> str:
    """Pytest source that replays ``trace`` on the model and asserts no invariant breaks
    (it fails while the bug the trace found is present)."""
    steps = ",\n".join(f"    {a!r}" for a in trace.actions)
    comment = "\n".join(f"# {line}" for line in trace.format().splitlines())
    why = f" (found with the {mutation_name!r} fix reverted)" if mutation_name else ""
    return (
        f'"""Regression test from a model-checker counter-example{why}."""\n\n'
        "from effectgate.verify.explore import run_schedule\n"
        "from effectgate.verify.model import Config\n\n"
        f"{comment}\n"
        f"CONFIG = {trace.config.as_source()}\n"
        f"SCHEDULE = [\n{steps},\n]\n\n\n"
        f"def test_{name}() -> None:\n"
        "    assert run_schedule(CONFIG, SCHEDULE) == []\n"
    )
