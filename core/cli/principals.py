"""``effectgate principals add|ls|revoke``: named operators and agents with tokens.

``add`` prints the token once (the store keeps only its salted hash): on stdout alone with
``--plain``, inside the JSON with ``--json``. Exit codes as in :mod:`effectgate.cli._common`.
"""

from __future__ import annotations

import datetime

import click

from ._common import (
    Command,
    actor,
    by_option,
    console,
    gate_options,
    handle_errors,
    note_action,
    open_gate,
    output_options,
    print_json,
)
from ._layout import emit_table
from ._safe import plain, safe

__all__ = ["principals"]


def _when(value: datetime.datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


@click.group("principals")
def principals() -> None:
    """Named operators and agents, each with a token (shown once, stored hashed)."""


@principals.command("add", cls=Command)
@click.argument("name")
@click.option("--role", required=True, type=click.Choice(["operator", "agent"]),
              help="operator: approves, denies, resolves, reconciles, unwinds (the console). "
                   "agent: begins, reports and extends what it holds (MCP over HTTP).")
@by_option
@gate_options
@output_options
@handle_errors
def add(name: str, role: str, by: str | None, url: str | None, namespace: str,
        gate_ref: str | None, output: str) -> None:
    """Add a principal and print its token, once: keep it safe, it cannot be shown again."""
    with open_gate(url, namespace, gate_ref) as gate:
        principal, token = gate.add_principal(name, role)
        note_action(gate, actor(by), "principal.add", subject=principal.name,
                    detail=f"role {principal.role}")
    if output == "json":
        print_json(principal.as_dict() | {"token": token})
    elif output == "plain":
        click.echo(token)
    else:
        out = console()
        out.print(f"added {principal.role} {safe(principal.name)}; its token (shown once, "
                  "stored only as a hash):", soft_wrap=True)
        click.echo(token)


@principals.command("ls", cls=Command)
@gate_options
@output_options
@handle_errors
def ls(url: str | None, namespace: str, gate_ref: str | None, output: str) -> None:
    """List the principals of the namespace (revoked ones too)."""
    with open_gate(url, namespace, gate_ref) as gate:
        found = gate.list_principals()
    if output == "json":
        print_json([p.as_dict() for p in found])
        return
    if output == "plain":
        for p in found:
            click.echo("\t".join(plain(v) for v in (
                p.name, p.role, _when(p.created_at), _when(p.last_used_at),
                _when(p.revoked_at))))
        return
    if not found:
        console().print("no principals (add one: effectgate principals add NAME --role "
                        "operator)")
        return
    out = console()
    rows = [[safe(p.name), p.role, _when(p.created_at), _when(p.last_used_at) or "never",
             _when(p.revoked_at) or "-"] for p in found]
    if not emit_table(out, ["name", "role", "created", "last used", "revoked"], rows):
        for row in rows:
            out.print(row[0], soft_wrap=True)
            out.print(f"    {row[1]}  created {row[2]}  last used {row[3]}  revoked {row[4]}",
                      soft_wrap=True)


@principals.command("revoke", cls=Command)
@click.argument("name")
@by_option
@gate_options
@output_options
@handle_errors
def revoke(name: str, by: str | None, url: str | None, namespace: str, gate_ref: str | None,
           output: str) -> None:
    """Revoke a principal: its token stops working at once."""
    with open_gate(url, namespace, gate_ref) as gate:
        principal = gate.revoke_principal(name)
        note_action(gate, actor(by), "principal.revoke", subject=principal.name,
                    detail=f"role {principal.role}")
    if output == "json":
        print_json(principal.as_dict())
    elif output == "plain":
        click.echo("\t".join(plain(v) for v in (principal.name, _when(principal.revoked_at))))
    else:
        console().print(f"revoked {safe(principal.name)} at {_when(principal.revoked_at)}",
                        soft_wrap=True)
