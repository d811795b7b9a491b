"""``effectgate mcp serve`` (the gate as MCP tools for agents in any language) and
``effectgate mcp gateway`` (a gated proxy in front of another MCP server). Both need the
``mcp`` extra. Both read the policy from ``--policy``, else ``./effectgate.toml`` if present;
``--gate MODULE:ATTR`` uses your own Gate (its policy and compensators) instead."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ._common import Command, fail, gate_options, handle_errors, open_gate

__all__ = ["mcp"]


@contextlib.contextmanager
def _gate(url: str | None, namespace: str, gate_ref: str | None,
          policy: Path | None) -> Iterator[Any]:
    try:
        import mcp as _mcp  # noqa: F401
    except ImportError:
        fail('effectgate mcp needs the mcp package: pip install "effectgate[mcp]"')
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


@click.group()
def mcp() -> None:
    """The gate over MCP: a server for agents, and a gateway in front of MCP servers."""


@mcp.command(cls=Command)
@gate_options
@_policy
@click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio",
              show_default=True, help="stdio, or streamable HTTP at http://HOST:PORT/mcp.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--allow-resolve", is_flag=True,
              help="Offer resolve_effect to the agent (off: resolving is an operator's act).")
@handle_errors
def serve(url: str | None, namespace: str, gate_ref: str | None, policy: Path | None,
          transport: str, host: str, port: int, allow_resolve: bool) -> None:
    """Serve begin_effect, report_effect, extend_lease and unwind_group as MCP tools."""
    with _gate(url, namespace, gate_ref, policy) as gate:
        from ..integrations.mcp import serve as run

        run(gate, transport="http" if transport == "http" else "stdio", host=host, port=port,
            allow_resolve=allow_resolve)


@mcp.command(cls=Command)
@click.option("--upstream", required=True, metavar="COMMAND|URL",
              help='The upstream MCP server: a command ("python server.py", run over stdio) '
                   "or an http(s) URL (streamable HTTP).")
@gate_options
@_policy
@click.option("--strict", is_flag=True,
              help="Refuse calls to tools with no effect declared (also: strict = true in the "
                   "policy).")
@click.option("--tool-errors", type=click.Choice(["ambiguous", "failed"]), default="ambiguous",
              show_default=True,
              help="What an upstream tool error means for a gated call: ambiguous (it may have "
                   "acted) or failed (this upstream's errors mean nothing happened).")
@handle_errors
def gateway(upstream: str, url: str | None, namespace: str, gate_ref: str | None,
            policy: Path | None, strict: bool, tool_errors: str) -> None:
    """Serve (over stdio) every tool of an upstream MCP server; gate the ones the policy
    declares. Prints each ungated tool on stderr at start."""
    with _gate(url, namespace, gate_ref, policy) as gate:
        from ..integrations.mcp.gateway import run_gateway

        rules = gate.policy if gate.policy is not None else {}
        code = run_gateway(gate, upstream, rules, tool_errors=tool_errors,
                           strict=strict or bool(getattr(gate.policy, "strict", False)))
    sys.exit(code)
