"""``effectgate mcp serve`` (the gate as MCP tools for agents in any language),
``effectgate mcp gateway`` (a gated proxy in front of another MCP server) and ``effectgate mcp
init`` (a starter policy for an MCP server, to review). They need the ``mcp`` extra. serve and
gateway read the policy from ``--policy``, else ``./effectgate.toml`` if present; ``--gate
MODULE:ATTR`` uses your own Gate (its policy and compensators) instead. Both serve stdio or
streamable HTTP (``--transport http``: on 127.0.0.1 unless ``--allow-remote``)."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ._common import Command, fail, gate_options, handle_errors, open_gate, shown_url

__all__ = ["mcp"]


@contextlib.contextmanager
def _gate(url: str | None, namespace: str, gate_ref: str | None,
          policy: Path | None) -> Iterator[Any]:
    try:
        import mcp as _mcp  # noqa: F401
    except ImportError:
        fail('effectgate mcp needs the mcp extra: pip install ".[mcp]" in the effectgate clone')
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="effectgate: %(levelname)s: %(message)s")
    if policy is None and gate_ref is None and Path("effectgate.toml").is_file():
        policy = Path("effectgate.toml")
    if policy is None or gate_ref is not None:
        if policy is not None:
            fail("--policy and --gate exclude each other: your gate carries its own policy")
        with open_gate(url, namespace, gate_ref) as gate:
            yield gate
        return
    from ..gate import Gate

    gate = Gate(url, policy=policy, namespace=namespace)
    try:
        yield gate
    finally:
        gate.close()


_policy = click.option(
    "--policy", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="Policy file (default: ./effectgate.toml if present).")


def _http_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio",
                     show_default=True, help="stdio, or streamable HTTP at http://HOST:PORT/mcp."),
        click.option("--host", default="127.0.0.1", show_default=True,
                     help="Address to listen on with --transport http (loopback only, unless "
                          "--allow-remote)."),
        click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
                     help="Port for --transport http (0: a free one, printed at start)."),
        click.option("--allow-remote", is_flag=True,
                     help="Listen off localhost (plain HTTP). Only behind a network boundary you "
                          "trust: mcp serve asks every request for an agent's token, the "
                          "gateway does not."),
    ]):
        fn = option(fn)
    return fn


_console_url = click.option(
    "--console-url", default=None, metavar="URL", envvar="EFFECTGATE_CONSOLE_URL",
    help="Where the console runs (http://127.0.0.1:8765): an approval is sent to a client "
         "that supports URL elicitation as a link to its page there. Off: answered in text.")


def _describe(gate: Any, policy: Path | None) -> str:
    """Which store (password hidden), namespace and policy are in force."""
    store = shown_url(gate.url)
    source = str(policy) if policy is not None else (gate.policy_source or "none")
    return f"store {store}, namespace {gate.namespace!r}, policy {source}"


def _uncovered(gate: Any) -> str | None:
    """Why the policy in force may not govern what an agent proposes over ``mcp serve``, or
    None: there the agent names each effect's type itself, so a policy whose rules name only
    some types (and no ``*`` rule) lets a type none of them matches past every approval and
    every ceiling but the policy's own ``budget``."""
    policy = gate.policy
    if policy is None or not policy.effects or "*" in policy.effects:
        return None
    return ("the policy has no '*' rule: an agent that names an effect type none of its rules "
            "matches (globs, case-sensitive) needs no approval and is counted by no ceiling of "
            "a rule; add a '*' rule for what the agent may propose")


@click.group()
def mcp() -> None:
    """The gate over MCP: a server for agents, and a gateway in front of MCP servers."""


@mcp.command(cls=Command)
@gate_options
@_policy
@_http_options
@click.option("--allow-resolve", is_flag=True,
              help="Offer resolve_effect to the agent (off: resolving is an operator's act).")
@click.option("--no-auth", is_flag=True,
              help="With --transport http on localhost only: accept requests without a bearer "
                   "token (by default each needs a token of an agent principal).")
@_console_url
@handle_errors
def serve(url: str | None, namespace: str, gate_ref: str | None, policy: Path | None,
          transport: str, host: str, port: int, allow_remote: bool,
          allow_resolve: bool, no_auth: bool, console_url: str | None) -> None:
    """Serve begin_effect, report_effect, extend_lease and unwind_group as MCP tools. Says on
    stderr which store, namespace and policy are in force, and where it listens."""
    from ..integrations.mcp.transport import check_bind, is_loopback

    if transport == "http":
        check_bind(host, port, allow_remote=allow_remote)
        if no_auth and not is_loopback(host):
            fail("--no-auth only on localhost: off it, any client could report, extend or "
                 "unwind another's effects")
    with _gate(url, namespace, gate_ref, policy) as gate:
        from ..integrations.mcp import serve as run

        click.echo(f"effectgate: mcp serve: {_describe(gate, policy)}", err=True)
        if (warning := _uncovered(gate)) is not None:
            click.echo(f"effectgate: mcp serve: warning: {warning}", err=True)
        run(gate, transport="http" if transport == "http" else "stdio", host=host, port=port,
            allow_resolve=allow_resolve, allow_remote=allow_remote, auth=not no_auth,
            console_url=console_url)


_upstream = click.option(
    "--upstream", required=True, metavar="COMMAND|URL",
    help='The upstream MCP server: a command ("python server.py", run over stdio) or an '
         "http(s) URL (streamable HTTP).")
_upstream_name = click.option(
    "--upstream-name", default=None, metavar="NAME",
    help="Which [upstreams.NAME] of the policy applies (default: the entry whose command or "
         "url is --upstream; the name a server reports about itself is never used).")
_init_upstream_name = click.option(
    "--upstream-name", default=None, metavar="NAME",
    help="The label of the [upstreams] entry written (default: the name the server reports); "
         "the entry is bound to --upstream either way.")


def _a_number(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """``value`` unless NaN, which every range check of ``click.FloatRange`` lets by."""
    if math.isnan(value):
        raise click.BadParameter(f"{value} is not a number of seconds", ctx, param)
    return value


@mcp.command(cls=Command)
@_upstream
@gate_options
@_policy
@_upstream_name
@_http_options
@click.option("--strict", is_flag=True,
              help="Refuse calls to tools that write with no effect declared (also: strict = "
                   "true in the policy).")
@click.option("--max-sessions", type=click.IntRange(1, 10_000), default=64, show_default=True,
              help="With --transport http: client sessions open at once (each has its own "
                   "upstream session; for a command upstream, its own process).")
@click.option("--tool-errors", type=click.Choice(["ambiguous", "failed"]), default="ambiguous",
              show_default=True,
              help="What an upstream tool error means for a gated call: ambiguous (it may have "
                   "acted) or failed (this upstream's errors mean nothing happened).")
@click.option("--no-auth", is_flag=True,
              help="With --transport http on localhost only: accept requests without a bearer "
                   "token (by default each needs a token of an agent principal).")
@click.option("--call-timeout", type=click.FloatRange(0, 7 * 24 * 3600, min_open=True),
              callback=_a_number, default=300.0, show_default=True, metavar="SECONDS",
              help="How long a request sent upstream may go unanswered; then it is cancelled "
                   "there, and a gated call is recorded ambiguous (it may have acted).")
@_console_url
@handle_errors
def gateway(upstream: str, url: str | None, namespace: str, gate_ref: str | None,
            policy: Path | None, upstream_name: str | None, transport: str, host: str,
            port: int, allow_remote: bool, strict: bool, max_sessions: int,
            tool_errors: str, no_auth: bool, call_timeout: float,
            console_url: str | None) -> None:
    """Serve everything an upstream MCP server offers (tools, resources, prompts, ...); gate
    the tools the policy declares, pass its reads, and print on stderr at start every tool that
    writes with no effect declared (refused with --strict)."""
    from ..integrations.mcp.transport import check_bind

    if transport == "http":
        check_bind(host, port, allow_remote=allow_remote)
    with _gate(url, namespace, gate_ref, policy) as gate:
        from ..integrations.mcp.gateway import run_gateway

        click.echo(f"effectgate: mcp gateway: {_describe(gate, policy)}", err=True)
        rules = gate.policy if gate.policy is not None else {}
        code = run_gateway(gate, upstream, rules, tool_errors=tool_errors,
                           strict=strict or bool(getattr(gate.policy, "strict", False)),
                           transport="http" if transport == "http" else "stdio", host=host,
                           port=port, allow_remote=allow_remote, upstream_name=upstream_name,
                           max_sessions=max_sessions, console_url=console_url,
                           auth=not no_auth, call_timeout_seconds=call_timeout)
    sys.exit(code)


@mcp.command(cls=Command)
@_upstream
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("effectgate.toml"), show_default=True,
              help="Where to write the policy.")
@click.option("--force", is_flag=True, help="Overwrite the file if it exists.")
@_init_upstream_name
@handle_errors
def init(upstream: str, output: Path, force: bool, upstream_name: str | None) -> None:
    """Write a starter policy for an MCP server, to review: its read-only tools listed, and a
    proposed key for every other tool. Never overwrites a file without --force."""
    try:
        import mcp as _mcp  # noqa: F401
    except ImportError:
        fail('effectgate mcp needs the mcp package: pip install "effectgate[mcp]"')
    from ..integrations.mcp.init import write_policy
    from ..policy import Policy

    path, _ = write_policy(upstream, output, force=force, upstream_name=upstream_name)
    policy = Policy.load(path)
    rule = next(iter(policy.upstreams.values()))
    click.echo(f"effectgate: wrote {path}: {len(rule.read_only)} read-only tools, "
               f"{len(policy.tool_effects())} gated tools, strict = true. Review every key "
               "before you use it.", err=True)
