"""Hostile input to ``mcp init``, ``mcp gateway`` and ``mcp serve``: tool names, arguments and
flags. Each gets a clear typed error (one line, exit 2, or a tool error naming it), and changes
nothing: no row in the store, no call upstream, no file overwritten."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install "effectgate[mcp]"')

from . import mcp_hostile_upstream, mcp_upstream
from .conftest import snapshot
from .mcp_helpers import CLI, gateway_args, stdio_session

HOSTILE = shlex.join([sys.executable, str(Path(mcp_hostile_upstream.__file__))])
UPSTREAM = shlex.join([sys.executable, str(Path(mcp_upstream.__file__))])
POLICY = """
[effects."sms.send"]
key = "sms:{to}:{text}"
tools = ["send_message"]
"""


def run(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env or dict(os.environ),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def ledger_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "LEDGER": str(tmp_path / "ledger.txt"),
            "STARTED": str(tmp_path / "started"), "REFUSE_START": str(tmp_path / "no")}


def lines(tmp_path: Path) -> list[Any]:
    ledger = tmp_path / "ledger.txt"
    return [json.loads(x) if x.startswith("[") else x
            for x in ledger.read_text().splitlines()] if ledger.exists() else []


@pytest.fixture(scope="session")
def hostile_init(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """``mcp init`` on the hostile server, run once for both store backends (it writes no
    store), by whichever xdist worker asks first (the others wait for it): the policy file
    (read, never changed, by each test), its exit status and stderr."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's
    folder, out = shared / "hostile-init", shared / "hostile-init" / "effectgate.toml"
    with (shared / "hostile-init.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "done.json").exists():
            folder.mkdir(exist_ok=True)
            done = run("mcp", "init", "--upstream", HOSTILE, "-o", str(out),
                       env=ledger_env(folder))
            (folder / "done.json").write_text(json.dumps([done.returncode, done.stderr]),
                                              encoding="utf-8")
    returncode, stderr = json.loads((folder / "done.json").read_text(encoding="utf-8"))
    return out, returncode, stderr


async def test_init_on_a_hostile_server_writes_a_policy_that_gates_it(
        tmp_path: Path, store_url: str, namespace: str,
        hostile_init: tuple[Path, int, str]) -> None:
    """Tool names with newlines, quotes, braces, globs, 300 characters; parameters no template
    can name: the policy still loads, every write is gated under its exact name, the start
    lines cannot be forged by a name, and a gated call runs once."""
    env = ledger_env(tmp_path)
    out, returncode, stderr = hostile_init
    assert returncode == 0, stderr
    policy = eg.Policy.load(out)
    names = {t.name for t in mcp_hostile_upstream.TOOLS}
    assert set(policy.tool_effects()) == names - {"peek"}
    assert "cannot be named in a key template" in out.read_text()
    errlog = tmp_path / "gateway.err"
    args = gateway_args(HOSTILE, "--policy", str(out), "--url", store_url, "--namespace",
                        namespace)
    with anyio.fail_after(60):
        async with stdio_session(sys.executable, args, env=env, errlog=errlog) as s:
            call = {"a b": "x", "c}": "y", "content": "z" * 5000, "n": 3, "flag": True,
                    "items": [1, {"k": "v"}]}
            first = await s.call_tool("ok_tool", call)
            second = await s.call_tool("ok_tool", call)
            assert (first.meta or {})["effectgate"]["decision"] == "execute"
            assert (second.meta or {})["effectgate"]["decision"] == "duplicate"
            newline = await s.call_tool("write\nfile", {"id": "1"})
            assert (newline.meta or {})["effectgate"]["decision"] == "execute"
            assert not (await s.call_tool("peek", {})).is_error
    assert [line[0] for line in lines(tmp_path)] == ["ok_tool", "write\nfile", "peek"]
    printed = errlog.read_text(encoding="utf-8").splitlines()
    assert all(line.startswith(("effectgate: ", "Traceback")) for line in printed), printed


def test_init_never_overwrites_and_writes_nothing_it_cannot_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command as a process refuses to overwrite, and writes with --force; each upstream
    it cannot list (the same command, run in this process) is one error line, exit 2, and
    no file."""
    from click.testing import CliRunner

    from effectgate.cli import main

    env = ledger_env(tmp_path)
    out = tmp_path / "effectgate.toml"
    out.write_text("# mine\n", encoding="utf-8")
    refused = run("mcp", "init", "--upstream", HOSTILE, "-o", str(out), env=env)
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert out.read_text() == "# mine\n"
    forced = run("mcp", "init", "--upstream", HOSTILE, "-o", str(out), "--force", env=env)
    assert forced.returncode == 0 and "strict = true" in out.read_text()
    missing = tmp_path / "other.toml"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for upstream in ("", "   ", "'unclosed", f"{sys.executable} -c 'import sys; sys.exit(3)'",
                     "/nonexistent/mcp-server", "http://127.0.0.1:9/mcp"):
        done = CliRunner().invoke(main, ["mcp", "init", "--upstream", upstream, "-o",
                                         str(missing)], catch_exceptions=False)
        assert done.exit_code == 2, (upstream, done.output)
        assert done.stderr.startswith("effectgate: error: "), (upstream, done.stderr)
        assert not missing.exists()
    directory = CliRunner().invoke(main, ["mcp", "init", "--upstream", HOSTILE, "-o",
                                          str(tmp_path), "--force"], catch_exceptions=False)
    assert directory.exit_code == 2, directory.output


async def test_gateway_refuses_hostile_calls_and_changes_nothing(
        tmp_path: Path, store_url: str, namespace: str) -> None:
    """Unknown and hostile tool names, arguments of the wrong type, a key with a control
    character: each is a tool error naming what is wrong; the store and the upstream saw
    nothing."""
    env = ledger_env(tmp_path)
    policy = tmp_path / "effectgate.toml"
    policy.write_text(POLICY, encoding="utf-8")
    gate = eg.Gate(store_url, namespace=namespace)
    try:
        before = snapshot(gate)
        args = gateway_args(UPSTREAM, "--policy", str(policy), "--url", store_url,
                            "--namespace", namespace)
        with anyio.fail_after(60):
            async with stdio_session(sys.executable, args, env=env) as s:
                for name in ("nope", "send_message\n", "x" * 100_000, "\x00", "../lookup"):
                    answer = await s.call_tool(name, {})
                    assert answer.is_error
                    error = json.loads(answer.content[0].text)  # type: ignore[union-attr]
                    assert error["error"] == "UnknownTool" and len(error["message"]) < 200
                for arguments, error in [
                    ({"to": 5, "text": "x"}, "InvalidArguments"),
                    ({"to": "+1"}, "InvalidArguments"),
                    ({"to": "+1\x00", "text": "x"}, "EffectKeyError"),
                    ({"to": "\u202e+1", "text": "x" * 600}, "EffectKeyError"),
                ]:
                    answer = await s.call_tool("send_message", arguments)
                    assert answer.is_error, arguments
                    found = json.loads(answer.content[0].text)  # type: ignore[union-attr]
                    assert found["error"] == error, (arguments, found)
        assert snapshot(gate) == before
        assert lines(tmp_path) == []
    finally:
        gate.close()


@pytest.mark.parametrize("args", [
    ["mcp", "serve", "--transport", "http", "--host", "0.0.0.0"],
    ["mcp", "serve", "--transport", "http", "--host", "::"],
    ["mcp", "serve", "--transport", "http", "--port", "70000"],
    ["mcp", "serve", "--transport", "bogus"],
    ["mcp", "gateway", "--upstream", UPSTREAM, "--transport", "http", "--host", "0.0.0.0"],
    ["mcp", "gateway", "--upstream", UPSTREAM, "--transport", "http", "--host", "a b"],
    ["mcp", "gateway", "--upstream", UPSTREAM, "--transport", "http", "--port", "-5"],
    ["mcp", "gateway", "--upstream", ""],
    ["mcp", "gateway", "--upstream", "'unclosed"],
    ["mcp", "gateway", "--upstream", "/nonexistent/mcp-server"],
    ["mcp", "gateway", "--upstream", UPSTREAM, "--tool-errors", "maybe"],
    ["mcp", "init", "--upstream", UPSTREAM, "-o", ""],
])
def test_bad_flags_are_one_line_errors_with_exit_2(args: list[str], tmp_path: Path) -> None:
    done = run(*args, "--url", f"sqlite:///{tmp_path / 'effects.db'}", env=ledger_env(tmp_path))
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(("effectgate: error:", "Error:")), (
        done.stderr)
    assert not (tmp_path / "ledger.txt").exists()


def test_a_policy_that_makes_a_gated_tool_read_only_fails_at_start(tmp_path: Path) -> None:
    """A glob in read_only that matches a gated tool is a contradiction the gateway refuses
    to start with (a literal name is refused when the policy loads)."""
    policy = tmp_path / "effectgate.toml"
    policy.write_text(POLICY + '\n[upstreams.test-upstream]\nread_only = ["send_*"]\n'
                      f"command = {json.dumps(UPSTREAM)}\n", encoding="utf-8")
    done = run("mcp", "gateway", "--upstream", UPSTREAM, "--policy", str(policy), "--url",
               f"sqlite:///{tmp_path / 'effects.db'}", env=ledger_env(tmp_path))
    assert done.returncode == 2 and "one or the other" in done.stderr


VETTED = """
strict = true

[upstreams."secure-filesystem-server"]
read_only = ["read_text_file", "list_directory"]
trust_read_only_hint = true
"""


def bound_to(command: str) -> str:
    """The vetted rule, bound to the upstream ``command`` as the operator configured it."""
    return VETTED + f"command = {json.dumps(command)}\n"


async def test_an_impostor_named_like_a_vetted_server_gets_none_of_its_trust(
        tmp_path: Path, namespace: str) -> None:
    """A third-party server that reports itself as the vetted ``secure-filesystem-server``
    offers a ``read_text_file`` annotated read-only whose calls write. Under --strict it is
    refused, never run: whether the policy's entry names no command (a name proves nothing),
    or names the vetted server's command (not this one). Only an entry whose command is
    this very upstream, as the operator configured it, passes its reads.

    One store backend: nothing here is gated (a refusal and a trusted read write no row,
    checked below), so the store plays no part in what is checked."""
    store_url = f"sqlite:///{tmp_path / 'effects.db'}"
    env = {**ledger_env(tmp_path), "HOSTILE_NAME": "secure-filesystem-server"}
    policy = tmp_path / "effectgate.toml"
    vetted = shlex.join(["npx", "-y", "@modelcontextprotocol/server-filesystem",
                         str(tmp_path / "data")])
    errlog = tmp_path / "gateway.err"
    args = gateway_args(HOSTILE, "--policy", str(policy), "--url", store_url, "--namespace",
                        namespace, "--strict")
    for text in (VETTED, bound_to(vetted)):
        policy.write_text(text, encoding="utf-8")
        with anyio.fail_after(60):
            async with stdio_session(sys.executable, args, env=env, errlog=errlog) as s:
                assert s.server_info is not None
                assert s.server_info.name.startswith("secure-filesystem-server")
                for tool in ("read_text_file", "peek"):
                    for _ in range(2):
                        answer = await s.call_tool(tool, {"path": "/etc/hosts"}
                                                   if tool == "read_text_file" else {})
                        assert answer.is_error, (text, tool)
                        refusal = json.loads(answer.content[0].text)  # type: ignore[union-attr]
                        assert refusal["error"] == "UngatedTool", refusal
        assert lines(tmp_path) == [], text
        printed = errlog.read_text(encoding="utf-8")
        assert "refused (strict) tool, no effect declared: read_text_file" in printed
        assert "policy rule for upstream" not in printed, printed

    policy.write_text(bound_to(HOSTILE), encoding="utf-8")
    with anyio.fail_after(60):
        async with stdio_session(sys.executable, args, env=env, errlog=errlog) as s:
            assert not (await s.call_tool("read_text_file", {"path": "/etc/hosts"})).is_error
    assert [line[0] for line in lines(tmp_path)] == ["read_text_file"]
    assert "policy rule for upstream 'secure-filesystem-server' (its command)" in (
        errlog.read_text(encoding="utf-8"))
    with eg.Gate(store_url, namespace=namespace) as gate:
        assert gate.list_effects() == []
