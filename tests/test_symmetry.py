"""Symmetry reduction of the exhaustive exploration (``effectgate.verify.symmetry``): a
permutation of interchangeable workers, with their lease secrets, approval ids and requests in
transit renamed, is a symmetry of the model (every enabled action and every transition maps
across it), the reduced exploration visits one state of each class and no fewer, and it finds a
reverted fix with a counter-example as short as without it, that replays from the initial
state."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import replace

import pytest

from effectgate.verify.explore import (
    BOUNDS,
    explore,
    mutation,
    run_schedule,
    sample_schedules,
    trace_of,
)
from effectgate.verify.model import Config, Model, ModelState
from effectgate.verify.symmetry import Symmetry, interchangeable

_TWO = {c.name: c for c in BOUNDS["2-worker"]}
_SYMMETRIC = [
    BOUNDS["replay"][0],
    _TWO["2 workers, approvals"],
    replace(_TWO["2 workers, approvals"], one_call=True, name="approvals, one call"),
    _TWO["2 workers, a spend ceiling"],
    _TWO["2 workers, a holder unsure of its outcome"],
    replace(_TWO["2 workers, one namespace, lost replies"], begins=(2, 2), name="lost, 2+2"),
    Config(workers=(("a", "refund"), ("a", "refund")), begins=(2, 2), faults=1, ops=1,
           memo=True, forgery=False, name="memo, 2+2"),
    *BOUNDS["3-worker"],
    _TWO["2 workers, on_ambiguous block"],
    _TWO["2 workers, approvals, the operator's lost replies repeated"],
    _TWO["2 workers, a reconcile hook that raises or lies"],
    replace(_TWO["2 workers, a reconcile hook that raises or lies"], begins=(2, 2),
            name="a hook that raises or lies, 2+2"),
]


def _reachable(config: Config, limit: int) -> list[ModelState]:
    """Up to ``limit`` states breadth first (no reduction), then the states of a seeded
    sample of schedules (deeper ones)."""
    model = Model(config)
    root = model.initial()
    seen, queue = {root}, deque([root])
    while queue and len(seen) < limit:
        s = queue.popleft()
        for action in model.actions(s):
            after = model.transition(s, action).state
            if after not in seen:
                seen.add(after)
                queue.append(after)
    for schedule in sample_schedules(config, 30, seed=5):
        s = root
        for action in schedule:
            s = model.transition(s, action).state
            seen.add(s)
    return sorted(seen, key=repr)


def _asymmetries(config: Config, sym: Symmetry, states: list[ModelState]) -> list[str]:
    """Where a permutation is not a symmetry of the model on ``states``: the actions it
    enables, the state, violations and answer of each transition, the end-of-schedule checks
    and the key, compared across each permutation."""
    model = Model(config)
    found: list[str] = []
    for s in states:
        actions = model.actions(s)
        steps = {a: model.transition(s, a) for a in actions}
        for perm in sym.permutations()[1:]:
            ps = sym.permute(s, perm)
            moved = Counter(sym.permute_action(a, perm) for a in actions)
            if Counter(model.actions(ps)) != moved:
                found.append(f"actions differ under {perm}: {sorted(map(repr, moved))} vs "
                             f"{sorted(map(repr, model.actions(ps)))}")
                continue
            for a, step in steps.items():
                other = model.transition(ps, sym.permute_action(a, perm))
                if other.state != sym.permute(step.state, perm):
                    found.append(f"{a} then {perm} differs from {perm} then "
                                 f"{sym.permute_action(a, perm)}")
                if [v.split(":")[0] for v in other.violations] != [
                        v.split(":")[0] for v in step.violations] or other.answer != step.answer:
                    found.append(f"{a} under {perm}: other violations or answer")
            if len(model.final(ps)) != len(model.final(s)) or sym.key(ps) != sym.key(s):
                found.append(f"{perm}: another end check or key")
    return found


@pytest.mark.parametrize("config", _SYMMETRIC, ids=lambda c: c.name)
def test_a_permutation_of_interchangeable_workers_is_a_symmetry_of_the_model(
        config: Config) -> None:
    sym = Symmetry(config)
    assert sym.classes  # the bound has interchangeable workers
    states = _reachable(config, 1500)
    assert len(states) > 1000
    assert not _asymmetries(config, sym, states)[:5]
    # Not vacuous: the permutations really rename and move (some state is not its own image).
    assert any(sym.permute(s, p) != s for s in states for p in sym.permutations()[1:])


def test_a_permutation_without_the_renaming_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Moving workers without renaming their secrets and approval ids is no symmetry (a
    worker's flow draws its lease secret from its index): the check above sees it."""
    from effectgate.verify import symmetry

    config = _TWO["2 workers, approvals"]
    states = _reachable(config, 1500)
    monkeypatch.setattr(symmetry._Renamer, "name", lambda self, x: x)
    monkeypatch.setattr(symmetry._Renamer, "text", lambda self, x: x)
    assert _asymmetries(config, Symmetry(config), states)


def test_workers_are_interchangeable_only_when_the_bound_treats_them_alike() -> None:
    two = (("a", "refund"), ("a", "refund"))
    assert interchangeable(Config(workers=two, begins=(1, 1))) == ((0, 1),)
    assert interchangeable(Config(workers=two, begins=(1, 2))) == ()
    assert interchangeable(Config(workers=two, begins=(1, 1), keys=("k", "j"))) == ()
    assert interchangeable(Config(workers=two, begins=(1, 1), payloads=(1, 2))) == ()
    # another agent or run is another requester (self-approval, per-agent ceilings)
    assert interchangeable(Config(workers=two, begins=(1, 1), agents=("x", "y"))) == ()
    assert interchangeable(Config(workers=two, begins=(1, 1), runs=("r", "s"))) == ()
    assert interchangeable(Config(workers=two, begins=(1, 1), agents=("x", "x"))) == ((0, 1),)
    assert interchangeable(Config(workers=(*two, ("b", "refund")), begins=(1, 1, 1))) == (
        (0, 1),)
    assert interchangeable(Config(workers=(*two, ("a", "refund")), begins=(1, 1, 1))) == (
        (0, 1, 2),)
    assert len(Symmetry(Config(workers=(*two, ("a", "refund")),
                               begins=(1, 1, 1))).permutations()) == 6


@pytest.mark.parametrize("config", [BOUNDS["replay"][0], replace(
    _TWO["2 workers, approvals"], begins=(1, 1), name="approvals, 1+1")], ids=lambda c: c.name)
def test_the_reduced_exploration_visits_one_state_of_every_class(config: Config) -> None:
    """As many states as the full state space has classes (by key), and fewer than it."""
    model, sym = Model(config), Symmetry(config)
    root = model.initial()
    seen, queue = {root}, deque([root])
    while queue:
        s = queue.popleft()
        for action in model.actions(s):
            after = model.transition(s, action).state
            if after not in seen:
                seen.add(after)
                queue.append(after)
    classes = {sym.key(s) for s in seen}
    reduced = explore(config)
    assert reduced.states == len(classes) < len(seen) == explore(config,
                                                                 symmetry=False).states
    assert reduced.states * 2 >= len(seen)  # two workers: at most two states a class


_THREE = BOUNDS["3-worker"][2]  # 3 workers, two effect types (two interchangeable)
_MUTANTS = [("live-resolve", replace(_TWO["2 workers, one namespace, an operator"],
                                     begins=(2, 2))),
            ("grace", replace(_TWO["2 workers, one namespace, lost replies"], begins=(2, 2))),
            ("adopt-by-secret", replace(_TWO["2 workers, one namespace, lost replies"],
                                        begins=(2, 2))),
            ("grace", _THREE), ("effect-type", _THREE)]


@pytest.mark.parametrize(("name", "config"), _MUTANTS,
                         ids=[f"{m}, {len(c.workers)} workers" for m, c in _MUTANTS])
def test_a_reverted_fix_is_found_as_soon_and_the_trace_replays(name: str,
                                                               config: Config) -> None:
    """With interchangeable workers, the reduced exploration finds the reverted fix with a
    schedule as short as the full one, of real actions from the initial state."""
    assert interchangeable(config)
    with mutation(name):
        reduced, full = explore(config), explore(config, symmetry=False)
        assert reduced.violation is not None and full.violation is not None
        assert len(reduced.violation.actions) == len(full.violation.actions)
        assert reduced.states < full.states
        replayed = trace_of(config, reduced.violation.actions)
        assert replayed.violations == reduced.violation.violations
        assert run_schedule(config, reduced.violation.actions)
    assert run_schedule(config, reduced.violation.actions) == []


def test_every_field_of_the_state_is_renamed_or_holds_no_worker() -> None:
    from effectgate.verify.symmetry import KEPT, RENAMED

    assert not KEPT & RENAMED
    assert set(ModelState._fields) == KEPT | RENAMED, (
        "a new ModelState field: rename it in symmetry.py if it can name a worker")

