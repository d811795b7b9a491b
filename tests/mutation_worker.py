"""Runs the model checker and the replay against a mutated copy of effectgate (the copy is
first on ``PYTHONPATH``; see tests/test_mutations.py). One JSON line out: which layer caught
the mutant and its shortest trace.

    python tests/mutation_worker.py '<spec json>'

spec: {"explore": [config kwargs...], "replay": [config kwargs...], "pg_url": url | null,
"all": bool (run every layer, not only until one catches it), "drive": "sync" | "async" (how
the replay drives its begins), "sqlite": bool (false: replay on Postgres only)}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _config(kwargs: dict[str, Any]) -> Any:
    from effectgate.verify.model import Config

    fields = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v)
              if isinstance(v, list) else v for k, v in kwargs.items()}
    return Config(**fields)


def _explore(configs: list[dict[str, Any]]) -> dict[str, Any] | None:
    from effectgate.verify.explore import explore

    for kwargs in configs:
        found = explore(_config(kwargs))
        if found.violation is not None:
            return {"layer": "checker", "config": found.config.name, "states": found.states,
                    "trace": found.violation.format()}
    return None


def _replay(configs: list[dict[str, Any]], url: str,
            drive: str = "sync") -> dict[str, Any] | None:
    from effectgate.verify.explore import covering_schedules, trace_of
    from effectgate.verify.replay import Replayer

    with Replayer(url, prefix=f"mut-{os.getpid()}-", schedule_timeout=30.0,
                  drive=drive) as replayer:
        for kwargs in configs:
            config = replayer.shaped(_config(kwargs))
            # Every transition of the bound, shortest schedules first: the first problem
            # found comes with the shortest schedule that shows it.
            for schedule in sorted(covering_schedules(config), key=len):
                problems, steps = replayer.replay(config, schedule)
                if problems:
                    trace = trace_of(config, schedule[:steps]).format().splitlines()
                    return {"layer": f"{drive} replay", "store": replayer.store.dialect_name,
                            "config": config.name,
                            "trace": "\n".join([*trace, f"  ON THE STORE {problems[0]}"])}
    return None


def main() -> None:
    import effectgate

    spec = json.loads(sys.argv[1])
    root = Path(sys.argv[2]).resolve()
    if not Path(effectgate.__file__).resolve().is_relative_to(root):
        raise SystemExit(f"effectgate imported from {effectgate.__file__}, not the mutant")
    started = time.perf_counter()
    out: dict[str, Any] = {"caught": []}
    found = _explore(spec.get("explore", []))
    if found:
        out["caught"].append(found)
    if spec.get("replay") and (spec.get("all") or not out["caught"]):
        folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        urls = [f"sqlite:///{folder}/mutant.db"] if spec.get("sqlite", True) else []
        if spec.get("pg_url"):
            urls.append(spec["pg_url"])
        for url in urls:
            found = _replay(spec["replay"], url, spec.get("drive", "sync"))
            if found:
                out["caught"].append(found)
                if not spec.get("all"):
                    break
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
