"""``effectgate verify --exhaustive``: every interleaving of the 2-worker bound explored on the
protocol model (the real decision module, an in-memory store), then a deterministic sample of
its schedules replayed on the user's own store through the real gate, in scratch namespaces
deleted afterwards."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .explore import BOUNDS, Exploration, covering_schedules, explore, sample_schedules
from .model import Config
from .replay import Replayer, ReplayReport

__all__ = ["ExhaustiveReport", "run_exhaustive"]


@dataclass
class ExhaustiveReport:
    """States explored per bound, schedules replayed on the store, and what went wrong."""

    explorations: list[Exploration] = field(default_factory=list)
    replay: ReplayReport = field(default_factory=ReplayReport)
    seconds: float = 0.0

    @property
    def states(self) -> int:
        """Distinct states explored, over every config of the bound."""
        return sum(e.states for e in self.explorations)

    @property
    def violations(self) -> list[str]:
        """Every violation: in the model (with its trace) and on the store."""
        found = [e.violation.format() for e in self.explorations if e.violation is not None]
        return found + self.replay.violations + self.replay.mismatches

    @property
    def passed(self) -> bool:
        """True when nothing was violated and the store agreed with the model throughout."""
        return not self.violations

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-ready fields."""
        return {
            "states": self.states, "seconds": round(self.seconds, 3),
            "bounds": [{"name": e.config.name, "states": e.states,
                        "transitions": e.transitions, "seconds": round(e.seconds, 3),
                        "violation": None if e.violation is None else e.violation.format()}
                       for e in self.explorations],
            "schedules_replayed": self.replay.schedules, "steps_replayed": self.replay.steps,
            "violations": self.violations, "passed": self.passed,
        }


def run_exhaustive(url: str, *, cover: int = 120, sample: int = 30,
                   bound: tuple[Config, ...] | None = None,
                   on_progress: Callable[[str], None] | None = None) -> ExhaustiveReport:
    """Explore the 2-worker bound (or ``bound``), then replay on ``url``: ``cover`` schedules
    taken evenly from a set that takes every transition of the small replay bound, and
    ``sample`` seeded random schedules of each config of the bound. Scratch namespaces
    ``verify-<random>-…``, deleted as each schedule ends."""
    started = time.perf_counter()
    out = ExhaustiveReport()
    say = on_progress or (lambda _text: None)
    configs = BOUNDS["2-worker"] if bound is None else bound
    for config in configs:
        found = explore(config)
        out.explorations.append(found)
        say(found.summary())
    prefix = f"verify-{uuid.uuid4().hex[:8]}-"
    with Replayer(url, prefix=prefix) as replayer:
        small = replayer.shaped(BOUNDS["replay"][0])
        every = covering_schedules(small)
        step = max(1, len(every) // max(cover, 1))
        replayer.replay_all(small, every[::step][:cover], out.replay)
        for config in map(replayer.shaped, configs):
            replayer.replay_all(config, sample_schedules(config, sample), out.replay)
        say(f"replayed {out.replay.schedules} schedules ({out.replay.steps} steps) on the store")
    out.seconds = time.perf_counter() - started
    return out
