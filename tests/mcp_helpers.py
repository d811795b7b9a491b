"""What the MCP tests share: the Node tools (the reference servers, the Inspector CLI, the
conformance suite), client sessions over stdio and streamable HTTP, and servers started as
real processes that say on stderr where they listen.

The Node tools live in ``$EFFECTGATE_NPM_BIN`` (``.ci/run`` installs them into
``~/.cache/effectgate-ci/npm``, outside the repository). In CI (``CI=true``) a missing tool
fails the test; elsewhere it skips.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

import effectgate as eg

from .conftest import IN_CI

NPM_BIN = Path(os.environ.get("EFFECTGATE_NPM_BIN")
               or Path.home() / ".cache" / "effectgate-ci" / "npm" / "node_modules" / ".bin")
CLI = [sys.executable, "-m", "effectgate.cli"]
UPSTREAM_SCRIPT = Path(__file__).with_name("mcp_upstream.py")
_LISTENING = re.compile(r"listening on (?:(http://\S+)|port (\d+))")


def require_npm(*tools: str) -> None:
    """Skip (or, in CI, fail) unless every Node tool named is installed."""
    missing = [t for t in tools if not (NPM_BIN / t).exists()]
    if missing:
        problem = (f"Node tools missing from {NPM_BIN}: {', '.join(missing)} (.ci/run installs "
                   "them; or set EFFECTGATE_NPM_BIN)")
        if IN_CI:
            pytest.fail(problem)
        pytest.skip(problem)


def npm_env(**extra: str) -> dict[str, str]:
    """This environment with the Node tools (and their newer node) first on PATH."""
    return {**os.environ, "PATH": f"{NPM_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            **extra}


def npm_command(tool: str, *args: str) -> str:
    """A command line running a Node tool, for ``--upstream``."""
    return shlex.join([str(NPM_BIN / tool), *args])


def gateway_args(upstream: str, *args: str) -> list[str]:
    """``effectgate mcp gateway --upstream UPSTREAM ARGS`` as argv (without the python)."""
    return [*CLI[1:], "mcp", "gateway", "--upstream", upstream, *args]


class Recorder:
    """Client callbacks that answer like a person would, and remember what they saw."""

    def __init__(self, roots: list[str] | None = None) -> None:
        self.roots = roots
        self.notifications: list[Any] = []
        self.sampled: list[types.CreateMessageRequestParams] = []
        self.elicited: list[types.ElicitRequestParams] = []

    async def list_roots(self, ctx: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=Path(r).as_uri(), name=Path(r).name)
                                            for r in self.roots or []])

    async def sample(self, ctx: Any, params: types.CreateMessageRequestParams) -> Any:
        self.sampled.append(params)
        return types.CreateMessageResult(
            role="assistant", model="recorder",
            content=types.TextContent(type="text", text="a sampled answer"))

    async def elicit(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.elicited.append(params)
        return types.ElicitResult(action="decline")

    async def on_message(self, message: Any) -> None:
        self.notifications.append(message)

    def callbacks(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message_handler": self.on_message,
                               "sampling_callback": self.sample,
                               "elicitation_callback": self.elicit}
        if self.roots is not None:
            out["list_roots_callback"] = self.list_roots
        return out

    def kinds(self) -> set[str]:
        return {type(n).__name__ for n in self.notifications}


@asynccontextmanager
async def stdio_session(command: str, args: list[str], *, env: dict[str, str] | None = None,
                        errlog: Path | None = None,
                        recorder: Recorder | None = None) -> AsyncIterator[ClientSession]:
    """An initialized client session on a stdio server process."""
    params = StdioServerParameters(command=command, args=args, env=env or dict(os.environ))
    with (errlog or Path(os.devnull)).open("w", encoding="utf-8") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(
                read, write, **(recorder.callbacks() if recorder else {})) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def http_session(url: str, *,
                       recorder: Recorder | None = None) -> AsyncIterator[ClientSession]:
    """An initialized client session on a streamable HTTP server."""
    async with streamable_http_client(url) as streams, ClientSession(
            streams[0], streams[1], **(recorder.callbacks() if recorder else {})) as session:
        await session.initialize()
        yield session


class Served:
    """A server process that printed where it listens; its stderr lines so far."""

    def __init__(self, proc: subprocess.Popen[str], url: str, lines: list[str]) -> None:
        self.proc, self.url, self.lines = proc, url, lines

    def stderr(self) -> str:
        return "\n".join(self.lines)


@contextmanager
def serving(argv: list[str], *, env: dict[str, str] | None = None,
            timeout: float = 60) -> Iterator[Served]:
    """Run ``argv`` (a server given ``--transport http --port 0``); wait for its "listening
    on http://..." (or "listening on port N") line on stderr; terminate it afterwards."""
    proc = subprocess.Popen(argv, env=env or dict(os.environ), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and not url:
                url.append(match.group(1) or f"http://127.0.0.1:{match.group(2)}/mcp")
                found.set()
        found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        found.wait(timeout)
        if not url:
            raise AssertionError("the server did not say where it listens:\n" + "\n".join(lines))
        yield Served(proc, url[0], lines)
    finally:
        stop(proc)
        reader.join(timeout=5)


def stop(proc: subprocess.Popen[Any], *, close_stdin: bool = False) -> None:
    """End a server process: (``close_stdin``: its stdin closed first, as an MCP client ends a
    stdio server, and 5 s for it to go) SIGTERM, then SIGKILL after 10 s."""
    if close_stdin and proc.stdin is not None:
        proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def run_inspector(target: list[str], *args: str, env: dict[str, str] | None = None,
                  timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The official MCP Inspector's CLI (``mcp-inspector --cli ARGS -- TARGET``: after ``--``
    the target's own flags are not taken for the Inspector's)."""
    return subprocess.run([str(NPM_BIN / "mcp-inspector"), "--cli", *args, "--", *target],
                          env=env or npm_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)


async def wait_for(predicate: Any, timeout: float = 10) -> None:
    """Poll ``predicate()`` until it is true (or fail after ``timeout`` seconds)."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)


class SharedUpstream:
    """``tests/mcp_upstream.py`` over streamable HTTP, one process that many tests share (the
    ``shared_upstream`` fixture): each test brings its own gate and namespace, and its own
    argument values (a :func:`tag` in them), so the ledger lines it reads are its own."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        self.ledger = folder / "ledger.txt"
        self.started = folder / "started.txt"

    def env(self) -> dict[str, str]:
        """Its environment: its own files, and none of a test's start-up faults."""
        mine = {k: v for k, v in os.environ.items() if k not in ("REFUSE_START", "SLOW_START")}
        return {**mine, "LEDGER": str(self.ledger), "STARTED": str(self.started)}

    def lines(self, marker: str) -> list[str]:
        """The executions whose arguments held ``marker`` (a :func:`tag`), in order."""
        if not self.ledger.exists():
            return []
        return [line for line in self.ledger.read_text(encoding="utf-8").splitlines()
                if marker in line]


def tag() -> str:
    """A value no other test puts in its arguments to a shared upstream."""
    return os.urandom(4).hex()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def http_upstream_process(folder: Path) -> Iterator[SharedUpstream]:
    """``tests/mcp_upstream.py --http PORT`` on a free port, once it accepts connections."""
    shared = SharedUpstream("", folder)
    with listening([sys.executable, str(UPSTREAM_SCRIPT), "--http"], env=shared.env()) as url:
        shared.url = url
        yield shared


@contextmanager
def listening(argv: list[str], *, env: dict[str, str] | None = None,
              timeout: float = 60) -> Iterator[str]:
    """``ARGV PORT`` on a free port (a server that prints nothing useful): its MCP URL once
    it accepts connections; terminated afterwards."""
    port = _free_port()
    proc = subprocess.Popen([*argv, str(port)], env=env or dict(os.environ),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_until_listening(proc, port, timeout)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


def _wait_until_listening(proc: subprocess.Popen[Any], port: int, timeout: float) -> None:
    until = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        assert proc.poll() is None, f"the upstream exited with status {proc.returncode}"
        assert time.monotonic() < until, f"the upstream did not listen on {port}"
        time.sleep(0.05)


@contextmanager
def task_upstream_process(folder: Path) -> Iterator[SharedUpstream]:
    """``tests/mcp_conformance_upstream.py`` over streamable HTTP (its tools run as tasks of
    the Tasks extension); its ledger holds the label of each ``slow_compute`` that ran."""
    shared = SharedUpstream("", folder)
    script = Path(__file__).with_name("mcp_conformance_upstream.py")
    with serving([sys.executable, str(script), "--http", "0"],
                 env={**os.environ, "FIXTURE_RUNS": str(shared.ledger)}) as served:
        shared.url = served.url
        yield shared


@asynccontextmanager
async def gateway_in_process(gate: eg.Gate, target: str, *, out: io.StringIO | None = None,
                             mode: str = "legacy", **options: Any) -> AsyncIterator[Client]:
    """The gateway in this process in front of ``target``, gating by ``gate``'s policy (as
    ``effectgate mcp gateway`` runs it, start lines on ``out``), and the mcp package's own
    ``Client`` on the SDK's in-memory transport to it."""
    from effectgate.integrations.mcp.gateway import Gateway, tool_specs

    policy = gate.policy
    assert policy is not None
    gw = Gateway(gate, target, tool_specs(gate, policy), policy=policy,
                 out=out if out is not None else io.StringIO(), **options)
    async with anyio.create_task_group() as tg:
        await gw.start(tg)
        gw.print_start()
        async with Client(gw.server(), mode=mode) as client:
            yield client
        await gw.aclose()
        tg.cancel_scope.cancel()
