"""The official MCP conformance suite (npm ``@modelcontextprotocol/conformance``, server
scenarios) against ``mcp serve``, the gateway, and beside them the reference everything server
and a server with the suite's own fixtures (``tests/mcp_conformance_upstream.py``), directly
and through the gateway.

Run it for the table: ``python -m tests.mcp_conformance`` (needs the Node tools ``.ci/run``
installs); ``tests/test_mcp_conformance.py`` runs it in the suite and checks the differences.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from .mcp_helpers import CLI, NPM_BIN, gateway_args, npm_command, npm_env, serving

FIXTURES = [sys.executable, str(Path(__file__).with_name("mcp_conformance_upstream.py"))]


@dataclass(frozen=True)
class Check:
    """One check of the suite: its scenario, status and message."""

    scenario: str
    check: str
    status: str
    message: str


LEGACY = "2025-11-25"
MODERN = "2026-07-28"


def run_suite(url: str, out: Path, revision: str = LEGACY) -> dict[str, Check]:
    """Every check the suite runs against ``url`` for a protocol revision, by check id: the
    active scenarios of 2025-11-25 (and before), or exactly the scenarios 2026-07-28 requires
    (``--requirements``, the extensions it lists included)."""
    which = (["--spec-version", revision] if revision == LEGACY
             else ["--requirements", revision])
    subprocess.run([str(NPM_BIN / "conformance"), "server", "--url", url, *which,
                    "-o", str(out)],
                   env=npm_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                   timeout=600)
    checks: dict[str, Check] = {}
    for path in sorted(out.glob("*/checks.json")):
        scenario = path.parent.name.removeprefix("server-").rsplit("-", 5)[0]
        for item in json.loads(path.read_text(encoding="utf-8")):
            checks[item["id"]] = Check(scenario, item["id"], item["status"],
                                       item.get("errorMessage") or "")
    if not checks:
        raise RuntimeError(f"the conformance suite produced no results against {url}")
    return checks


def score(checks: dict[str, Check]) -> str:
    """``passed/total``."""
    passed = sum(c.status == "SUCCESS" for c in checks.values())
    return f"{passed}/{len(checks)}"


TARGETS = ("everything (reference)", "gateway -> everything", "mcp serve", "fixtures (direct)",
           "gateway -> fixtures")


@contextmanager
def targets(store: str, names: tuple[str, ...] = TARGETS) -> Iterator[dict[str, str]]:
    """The servers under test (all of :data:`TARGETS`, or those ``names``), each over
    streamable HTTP on a free loopback port, by name."""
    gw = ["--url", store, "--transport", "http", "--port", "0", "--no-auth"]
    runs = {
        "everything (reference)": [str(NPM_BIN / "mcp-server-everything"), "streamableHttp"],
        "gateway -> everything": [sys.executable, *gateway_args(
            npm_command("mcp-server-everything", "stdio"), *gw)],
        "mcp serve": [*CLI, "mcp", "serve", "--url", store, "--transport", "http", "--port", "0",
                      "--no-auth"],
        "fixtures (direct)": [*FIXTURES, "--http", "0"],
        "gateway -> fixtures": [sys.executable, *gateway_args(
            " ".join(FIXTURES), *gw, "--namespace", "conformance-fixtures")],
    }
    with ExitStack() as stack:
        urls = {}
        for name in names:
            # PORT: the everything server's; the fixtures' sleeps capped (their upstream's
            # env is the gateway's)
            env = npm_env(PORT=str(_free_port()), FIXTURE_MAX_SECONDS="2")
            served = stack.enter_context(serving(runs[name], env=env))
            urls[name] = served.url
        yield urls


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_all(store: str, out: Path) -> dict[str, dict[str, Check]]:
    """The suite against every target, at 2025-11-25 (target name) and, for the targets that
    speak it, at 2026-07-28 (``name @ 2026-07-28``; the reference everything server speaks
    only the handshake protocol): target → check id → result."""
    with targets(store) as urls:
        found = {name: run_suite(url, out / f"t{i}") for i, (name, url) in
                 enumerate(urls.items())}
        for i, name in enumerate(MODERN_TARGETS):
            found[f"{name} @ {MODERN}"] = run_suite(urls[name], out / f"m{i}", MODERN)
        return found


def run_each(store: str, out: Path, names: tuple[str, ...],
             revision: str = LEGACY) -> dict[str, dict[str, Check]]:
    """The suite at ``revision`` against each of the targets ``names`` (on a store of their
    own: give each call its own ``store``), the runs side by side (each target is a server of
    its own, so they share no effect key): target (``name @ 2026-07-28`` at that revision) →
    check id → result."""
    suffix = "" if revision == LEGACY else f" @ {revision}"
    with targets(store, names) as urls, ThreadPoolExecutor(len(urls)) as pool:
        runs = {name: pool.submit(run_suite, url, out / f"r{i}", revision)
                for i, (name, url) in enumerate(urls.items())}
        return {f"{name}{suffix}": run.result() for name, run in runs.items()}


MODERN_TARGETS = ("mcp serve", "gateway -> everything", "gateway -> fixtures")


def table(results: dict[str, dict[str, Check]]) -> str:
    """A text table: one row per check, one column per target."""
    names = list(results)
    checks = sorted({c for r in results.values() for c in r})
    width = max(len(c) for c in checks)
    lines = ["check".ljust(width) + " | " + " | ".join(names),
             "score".ljust(width) + " | " + " | ".join(
                 score(results[n]).ljust(len(n)) for n in names)]
    for check in checks:
        cells = []
        for n in names:
            found = results[n].get(check)
            mark = "-" if found is None else ("pass" if found.status == "SUCCESS" else "FAIL")
            cells.append(mark.ljust(len(n)))
        lines.append(check.ljust(width) + " | " + " | ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        found = run_all(f"sqlite:///{folder}/effects.db", Path(folder))
        print(table(found))
        for name, checks in found.items():
            for check in checks.values():
                if check.status != "SUCCESS":
                    print(f"{name}: {check.check}: {check.message[:140]}")
