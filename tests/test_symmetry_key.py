"""The symmetry key (``effectgate.verify.symmetry.Symmetry.key``) against its definition: two
states get one key exactly when one is the other with interchangeable workers permuted
(:meth:`Symmetry.permute`). Checked by brute force on reachable states of bounds with two and
three interchangeable workers, their permuted images and states that differ from them in one
field; and the check is shown to catch a key that drops a field or renames nothing."""

from __future__ import annotations

import operator
import random
from dataclasses import replace
from typing import Any

import pytest

from effectgate.verify.explore import BOUNDS
from effectgate.verify.model import Config, ModelState
from effectgate.verify.symmetry import KEPT, Symmetry

from .test_symmetry import _reachable

_TWO = {c.name: c for c in BOUNDS["2-worker"]}
_CONFIGS = [
    _TWO["2 workers, approvals"],
    replace(_TWO["2 workers, one namespace, lost replies"], begins=(2, 2), name="lost, 2+2"),
    _TWO["2 workers, approvals, the operator's lost replies repeated"],
    BOUNDS["3-worker"][0],
    BOUNDS["3-worker"][1],
]


def _states(config: Config, limit: int = 600) -> list[ModelState]:
    """Reachable states (breadth first up to ``limit``, then those of a seeded sample of
    schedules), each with a random image under a permutation, and states made from them
    that are no image of any (one field of ``KEPT`` moved: the clock or the faults left)."""
    sym = Symmetry(config)
    seen = _reachable(config, limit)
    rng = random.Random(7)
    perms = sym.permutations()
    states = sorted(seen, key=repr)
    images = [sym.permute(s, rng.choice(perms)) for s in states]
    others = [s._replace(now=s.now + 7) for s in states[::5]]
    others += [s._replace(faults=s.faults + 3) for s in states[1::5]]
    return states + images + others


def _partition(keys: list[Any]) -> list[int]:
    """Each position's first position with an equal key."""
    first: dict[Any, int] = {}
    return [first.setdefault(k, n) for n, k in enumerate(keys)]


def _wrong_keys(config: Config, states: list[ModelState], keys: list[Any]) -> list[str]:
    """Where ``keys`` (of ``states``) disagree with the key's definition: two states with one
    key that are no permutation of each other, or permutations of each other with two keys
    (the permutations of :meth:`Symmetry.permute`, by brute force)."""
    sym = Symmetry(config)
    perms = sym.permutations()
    orbits = [frozenset(sym.permute(s, p) for p in perms) for s in states]
    by_key, by_orbit = _partition(keys), _partition(orbits)
    found = []
    for n, (k, o) in enumerate(zip(by_key, by_orbit, strict=True)):
        if k != o:
            found.append(f"{config.name}: state {n} keyed with state {k}, a permutation of "
                         f"state {o}")
    return found


@pytest.mark.parametrize("config", _CONFIGS, ids=lambda c: c.name)
def test_one_key_exactly_for_the_states_that_are_permutations_of_each_other(
        config: Config) -> None:
    states = _states(config)
    sym = Symmetry(config)
    keys = [sym.key(s) for s in states]
    assert not _wrong_keys(config, states, keys)[:5]
    # Not vacuous: classes of several distinct states.
    assert len(set(keys)) < len(set(states))
    # The key does not depend on what the Symmetry saw before: another one, fed the states in
    # another order, partitions them alike.
    again = Symmetry(config)
    for s in reversed(states):
        again.key(s)
    assert _partition([again.key(s) for s in states]) == _partition(keys)


def test_the_same_key_for_every_permutation_of_a_state_with_three_workers() -> None:
    config = BOUNDS["3-worker"][1]
    sym = Symmetry(config)
    states = _states(config, 300)
    perms = sym.permutations()
    assert len(perms) == 6
    for s in states:
        key = sym.key(s)
        assert all(sym.key(sym.permute(s, p)) == key for p in perms)
    # Some state whose images differ from it: the permutations really move workers.
    assert any(sym.permute(s, p) != s for s in states for p in perms[1:])


def test_a_key_that_drops_a_field_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key without the clock merges states that differ in it: the check sees it."""
    from effectgate.verify import symmetry

    config = _CONFIGS[0]
    states = _states(config)
    kept = sorted(KEPT - {"now"})
    monkeypatch.setattr(symmetry, "_kept", operator.itemgetter(
        *(ModelState._fields.index(f) for f in kept)))
    broken = Symmetry(config)
    assert _wrong_keys(config, states, [broken.key(s) for s in states])


def test_a_key_that_renames_nothing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sorting the workers without renaming their secrets and approval ids splits a class
    (a state and its image no longer share a key): the check sees it."""
    from effectgate.verify import symmetry

    config = _CONFIGS[0]
    states = _states(config)
    monkeypatch.setattr(symmetry._Renamer, "text", lambda self, x: x)
    monkeypatch.setattr(symmetry._Renamer, "name", lambda self, x: x)
    broken = Symmetry(config)
    keys = [broken.key(s) for s in states]
    monkeypatch.undo()  # (the orbits are made with the real renaming)
    assert _wrong_keys(config, states, keys)
