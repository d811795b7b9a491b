"""The class covers of the 2-worker bound (:func:`effectgate.verify.cover.class_cover`) the
replay tests take, kept in ``tests/data/replay_cover.json``: exploring every 2-worker config
in both store shapes takes minutes, far more than replaying the schedules found.

Written by ``python -m tests.replay_cover [config-index ...]``, checked by ``python -m
tests.replay_cover --check [config-index ...]`` (a slow test checks its six smallest entries
against a fresh exploration); a schedule the model no longer enables fails the replay
("the model does not enable this action"): write the file again."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Any

from effectgate.verify.cover import class_cover
from effectgate.verify.explore import BOUNDS
from effectgate.verify.model import Config

PATH = Path(__file__).parent / "data" / "replay_cover.json"


def entry_name(config: Config) -> str:
    """The file's name for ``config`` (its name, store shape and memo)."""
    return f"{config.name} | one_call={config.one_call} | memo={config.memo}"


def variants() -> list[Config]:
    """Every 2-worker config in both store shapes, with the COMMITTED memo as the config has
    it and flipped (memo on and off)."""
    return [dataclasses.replace(c, one_call=oc, memo=memo) for c in BOUNDS["2-worker"]
            for oc in (False, True) for memo in (c.memo, not c.memo)]


def load() -> dict[str, Any]:
    """The file's covers by :func:`entry_name`."""
    doc: dict[str, Any] = json.loads(PATH.read_text())
    return doc


_kept = functools.cache(load)
"""The file as read once a process (the replays' reads of it; never written to)."""


def schedules(config: Config) -> list[tuple[Any, ...]]:
    """The kept cover of ``config`` (actions as tuples again)."""
    entry = _kept()[entry_name(config)]
    return [tuple(tuple(a) for a in schedule) for schedule in entry["schedules"]]


def smallest(count: int) -> list[Config]:
    """The ``count`` variants whose kept entries explored the fewest states (the cheapest to
    explore again)."""
    kept = load()
    return sorted(variants(), key=lambda c: (kept[entry_name(c)]["states"], entry_name(c)))[
        :count]


def stale(configs: list[Config]) -> list[str]:
    """The names of the ``configs`` whose kept cover is not what the bound explores to now."""
    kept = load()
    found = []
    for config in configs:
        fresh = class_cover(config)
        entry = kept.get(entry_name(config))
        if entry is None or entry["classes"] != fresh.classes or (
                schedules(config) != list(fresh.schedules)):
            found.append(entry_name(config))
    return found


def write(configs: list[Config]) -> None:
    doc = load() if PATH.exists() else {}
    for config in configs:
        cover = class_cover(config)
        doc[entry_name(config)] = {
            "classes": cover.classes, "states": cover.states,
            "transitions": cover.transitions, "steps": cover.steps,
            "schedules": [list(map(list, s)) for s in cover.schedules]}
        print(f"{entry_name(config)}: {cover.classes} classes, {len(cover.schedules)} "
              f"schedules, {cover.steps} steps", flush=True)
        PATH.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
    _kept.cache_clear()


if __name__ == "__main__":
    every = variants()
    if sys.argv[1:2] == ["--check"]:  # every entry against a fresh exploration
        names = stale([every[int(i)] for i in sys.argv[2:]] if sys.argv[2:] else every)
        print("\n".join(f"stale: {name}" for name in names) or "the kept covers are fresh")
        sys.exit(1 if names else 0)
    write([every[int(i)] for i in sys.argv[1:]] if sys.argv[1:] else every)
