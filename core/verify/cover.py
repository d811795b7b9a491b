"""A small set of schedules that takes every *kind* of transition of a bound, for replay on
the real stores (:mod:`effectgate.verify.replay`).

Every transition of a 2-worker config is far too many to replay: the symmetry-reduced graphs
of the 2-worker bound hold some 1.5 million transitions, and :func:`~effectgate.verify.explore.
covering_schedules` (every transition of the unreduced graph) gives 90,000 and more schedules
for one config. What a replay checks is what each step does on the store, so transitions are
grouped in classes (:func:`transition_class`): the action (its kind and arguments, the acting
worker's index dropped), the store call the flow makes at it, what the model says the step did
(its text: the decision, the SQL outcome, lost reply, refusal...) and whether it changed
nothing. Not the context it happened in (the other rows' states, the other workers' phases):
a class with the context is some twenty times as many schedules, past what a test suite can
replay, so a step that misbehaves only in a context no cover schedule reaches can escape.

:func:`class_cover` explores the bound breadth first (with the symmetry reduction) and then
builds schedules greedily: a shortest path to a state where a class not yet taken is enabled,
that transition, then on to the end of the schedule preferring transitions of classes not yet
taken. Together the schedules take every class the bound reaches, each at least once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from .model import Action, Config, Model, ModelState
from .model_state import Step
from .symmetry import Symmetry
from .walk import MAX_WALK, collector_paused, path_to

__all__ = ["Cover", "class_cover", "transition_class"]

TransitionClass = tuple[Hashable, ...]


def transition_class(s: ModelState, action: Action, step: Step) -> TransitionClass:
    """The class of transition ``action`` from ``s`` (``step`` is the model's): what the step
    did and the context it did it in, with no worker index (interchangeable workers' steps are
    one class)."""
    worker = action[1] if action[0] in _WORKER_ACTIONS else None
    args = tuple(a for n, a in enumerate(action[1:], 1) if not (worker is not None and n == 1))
    if action[0] == "borrow":
        args = ()  # ("borrow", i, j): two worker indices
    me = s.workers[worker] if worker is not None else None
    return (action[0], args, me.call if me else None, step.text, step.state == s)


_WORKER_ACTIONS = frozenset(("begin", "step", "send", "land", "report", "die", "guess",
                             "borrow"))


@dataclass(frozen=True)
class Cover:
    """Schedules that take every transition class of ``config`` (:attr:`classes` of them)."""

    config: Config
    schedules: tuple[tuple[Action, ...], ...]
    classes: int
    states: int
    transitions: int

    @property
    def steps(self) -> int:
        """The schedules' steps, all told."""
        return sum(map(len, self.schedules))


def class_cover(config: Config) -> Cover:
    """Schedules of ``config`` that take every :func:`transition_class` it reaches (breadth
    first over the symmetry-reduced graph, then greedily; see the module)."""
    with collector_paused():
        return _class_cover(config)


def _class_cover(config: Config) -> Cover:
    model = Model(config)
    key = Symmetry(config).key
    root = model.initial()
    parent: dict[object, tuple[object, Action] | None] = {key(root): None}
    first: dict[TransitionClass, tuple[object, ModelState, Action]] = {}
    queue = deque([(root, key(root))])
    transitions = 0
    while queue:
        s, at = queue.popleft()
        for action in model.actions(s):
            step = model.transition(s, action)
            transitions += 1
            first.setdefault(transition_class(s, action, step), (at, s, action))
            seen = key(step.state)
            if seen not in parent:
                parent[seen] = (at, action)
                queue.append((step.state, seen))
    taken: set[TransitionClass] = set()
    out: list[tuple[Action, ...]] = []
    for cls, (at, _, action) in first.items():
        if cls in taken:
            continue
        path = [*path_to(parent, at), action]
        cur = root
        for a in path:
            step = model.transition(cur, a)
            taken.add(transition_class(cur, a, step))
            cur = step.state
        while len(path) < MAX_WALK:
            moves = []
            for a in model.actions(cur):
                step = model.transition(cur, a)
                c = transition_class(cur, a, step)
                if step.state != cur:
                    moves.append((c not in taken, a, c, step.state))
                elif c not in taken:  # a step that changes nothing: taken here, on we go
                    taken.add(c)
                    path.append(a)
            if not moves:
                break
            _, a, c, cur = max(moves, key=lambda m: m[0])  # the first untaken, if any
            taken.add(c)
            path.append(a)
        out.append(tuple(path))
    return Cover(config, tuple(out), len(first), len(parent), transitions)
