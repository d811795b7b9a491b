"""The operator's commands: ``ls``, ``show``, ``resolve``, ``approve``, ``deny``, ``unwind``,
``prune``. Rich tables on a terminal; ``--json`` for scripts. Exit codes as in
:mod:`effectgate.cli._common`."""

from __future__ import annotations

import datetime
import getpass
import json
import re
from typing import Any

import click

from ._common import (
    EXIT_FAILED,
    Command,
    console,
    fail,
    gate_options,
    handle_errors,
    open_gate,
    print_json,
)

__all__ = ["approve", "deny", "ls", "parse_age", "prune", "resolve", "show", "unwind"]

_STATE_STYLE = {
    "committed": "green", "failed": "red", "ambiguous": "bold magenta",
    "in_flight": "cyan", "pending_approval": "yellow", "denied": "red",
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
by_option = click.option("--by", default=None, metavar="NAME",
                         help="Who is acting (default: your login name).")


def _actor(by: str | None) -> str:
    if by:
        return by
    try:
        return getpass.getuser()
    except Exception:
        return "operator"


def _when(value: datetime.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _short_when(value: datetime.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else ""


def _state(value: str) -> str:
    return f"[{_STATE_STYLE.get(value, 'white')}]{value}[/]"


def _text(value: Any) -> str:
    from rich.markup import escape

    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False)
    return escape(str(value))


def parse_age(text: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` as a timedelta; click's usage error otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text or "")
    if not match:
        raise click.BadParameter(
            f"{text!r} is not an age; write a number and a unit: 45s, 90m, 12h, 30d, 2w")
    return datetime.timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def _needs(gate: Any, name: str) -> None:
    if not hasattr(gate, name):
        fail(f"this effectgate has no {name}() (governance is not available)")


# -- ls / show ---------------------------------------------------------------------------------


@click.command("ls", cls=Command)
@gate_options
@click.option("--state", default=None, help="Only effects in this state (e.g. ambiguous).")
@click.option("--type", "effect_type", default=None, help="Only this effect type.")
@click.option("--run", "run_id", default=None, help="Only this run id.")
@click.option("--group", "group_key", default=None, help="Only this saga group.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000))
@json_option
@handle_errors
def ls(url: str | None, namespace: str, gate_ref: str | None, state: str | None,
       effect_type: str | None, run_id: str | None, group_key: str | None, limit: int,
       as_json: bool) -> None:
    """List effects, newest first. A lapsed IN_FLIGHT effect lists as ambiguous."""
    with open_gate(url, namespace, gate_ref) as gate:
        _needs(gate, "list_effects")
        records = gate.list_effects(state=state, effect_type=effect_type, run_id=run_id,
                                    group_key=group_key, limit=limit)
    if as_json:
        print_json([{k: v for k, v in r.as_dict().items() if k != "history"} for r in records])
        return
    from rich.table import Table

    out = console()
    if not records:
        out.print("no effects match")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("key", overflow="fold", min_width=14, ratio=3)
    table.add_column("type", overflow="fold", min_width=8, ratio=2)
    table.add_column("state", no_wrap=True)
    table.add_column("try", no_wrap=True, justify="right")
    table.add_column("run", overflow="fold", min_width=4, ratio=1)
    table.add_column("updated UTC", no_wrap=True)
    for r in records:
        table.add_row(_text(r.key), _text(r.effect_type), _state(r.state.value),
                      str(r.attempt), _text(r.run_id), _short_when(r.updated_at))
    out.print(table)
    for r in records:
        if r.state.value == "pending_approval" and r.approval_id:
            out.print(f"[yellow]{_text(r.key)}[/] waits for approval: "
                      f"effectgate approve {_text(r.approval_id)}")
    if len(records) == limit:
        out.print(f"[dim](first {limit}; --limit for more)[/]")


@click.command("show", cls=Command)
@click.argument("key")
@gate_options
@json_option
@handle_errors
def show(key: str, url: str | None, namespace: str, gate_ref: str | None,
         as_json: bool) -> None:
    """Show one effect: its record, its history, and the vendor key it carries."""
    with open_gate(url, namespace, gate_ref) as gate:
        record = gate.get(key)
    if as_json:
        print_json(record.as_dict())
        return
    from rich.table import Table

    out = console()
    fields = Table(box=None, show_header=False, pad_edge=False)
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    data = record.as_dict()
    for name, value in data.items():
        if name in ("history", "vendor_key") or value is None:
            continue
        fields.add_row(name, _state(value) if name == "state" else _text(value))
    out.print(fields)
    if record.vendor_key is not None:
        vk = record.vendor_key.as_dict()
        out.print("\n[bold]vendor key[/]")
        receipt = Table(box=None, show_header=False, pad_edge=False)
        receipt.add_column(style="bold", no_wrap=True)
        receipt.add_column(overflow="fold")
        for name, value in vk.items():
            receipt.add_row(name, _text(value))
        out.print(receipt)
    out.print("\n[bold]history[/]")
    history = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("at (UTC)", "from", "to", "by", "token", "note"):
        history.add_column(name, overflow="fold", no_wrap=name in ("at (UTC)", "token"))
    for h in record.history:
        history.add_row(_when(h.at), _text(h.from_state.value if h.from_state else ""),
                        _state(h.to_state.value), _text(h.by), str(h.token), _text(h.note))
    out.print(history)


# -- resolve -----------------------------------------------------------------------------------


@click.command("resolve", cls=Command)
@click.argument("key")
@click.option("--committed", "outcome", flag_value="committed",
              help="It happened (a repeat then returns --result).")
@click.option("--failed", "outcome", flag_value="failed",
              help="It certainly did not happen (a repeat may run).")
@click.option("--note", default=None, help="Why: what you checked.")
@click.option("--result", "result_json", default=None, metavar="JSON",
              help="With --committed: the result a repeat returns (JSON).")
@by_option
@gate_options
@json_option
@handle_errors
def resolve(key: str, outcome: str | None, note: str | None, result_json: str | None,
            by: str | None, url: str | None, namespace: str, gate_ref: str | None,
            as_json: bool) -> None:
    """Settle an AMBIGUOUS (or stuck) effect after checking with the vendor."""
    if outcome is None:
        raise click.UsageError("say what happened: --committed or --failed")
    result: Any = None
    if result_json is not None:
        if outcome != "committed":
            raise click.UsageError("--result goes with --committed")
        try:
            result = json.loads(result_json)
        except ValueError as err:
            raise click.BadParameter(f"not JSON: {err}", param_hint="--result") from None
    with open_gate(url, namespace, gate_ref) as gate:
        record = gate.resolve(key, outcome, by=_actor(by), note=note, result=result)
    if as_json:
        print_json(record.as_dict())
    else:
        console().print(f"resolved {_text(record.key)}: {_state(record.state.value)} "
                        f"by {_text(_actor(by))}")


# -- approvals -----------------------------------------------------------------------------------


@click.command("approve", cls=Command)
@click.argument("approval_id")
@click.option("--note", default=None, help="Why it is approved.")
@by_option
@gate_options
@json_option
@handle_errors
def approve(approval_id: str, note: str | None, by: str | None, url: str | None,
            namespace: str, gate_ref: str | None, as_json: bool) -> None:
    """Approve a pending request: the next call with exactly that payload runs (once)."""
    with open_gate(url, namespace, gate_ref) as gate:
        _needs(gate, "approve")
        record = gate.approve(approval_id, by=_actor(by), note=note)
    _approval(record, as_json)


@click.command("deny", cls=Command)
@click.argument("approval_id")
@click.option("--reason", default=None, help="Why it is denied.")
@by_option
@gate_options
@json_option
@handle_errors
def deny(approval_id: str, reason: str | None, by: str | None, url: str | None,
         namespace: str, gate_ref: str | None, as_json: bool) -> None:
    """Deny a pending request: its effect becomes DENIED."""
    with open_gate(url, namespace, gate_ref) as gate:
        _needs(gate, "deny")
        record = gate.deny(approval_id, by=_actor(by), reason=reason)
    _approval(record, as_json)


def _approval(record: Any, as_json: bool) -> None:
    if as_json:
        print_json(record.as_dict())
        return
    console().print(f"{_text(record.approval_id)} ({_text(record.key)}): "
                    f"{_state(record.state)} by {_text(record.decided_by)}")


# -- unwind / prune ------------------------------------------------------------------------------


@click.command("unwind", cls=Command)
@click.argument("group_key")
@by_option
@gate_options
@json_option
@handle_errors
def unwind(group_key: str, by: str | None, url: str | None, namespace: str,
           gate_ref: str | None, as_json: bool) -> None:
    """Undo a saga: run the compensations of its committed steps, newest first, each once.

    The compensators live in your code: pass --gate MODULE:ATTR so they are registered.
    Exits 1 when a step is left unresolved or its compensation failed.
    """
    with open_gate(url, namespace, gate_ref) as gate:
        _needs(gate, "unwind")
        report = gate.unwind(group_key, by=_actor(by))
    if not any(getattr(report, name) for name in ("compensated", "unresolved", "irreversible",
                                                  "failed", "skipped")):
        fail(f"no effects in group {group_key!r}")
    if as_json:
        print_json(report.as_dict())
    else:
        _unwind_table(report, gate_ref)
    if not report.complete:
        raise SystemExit(EXIT_FAILED)


def _unwind_table(report: Any, gate_ref: str | None) -> None:
    from rich.table import Table

    out = console()
    steps = [(name, s) for name in ("compensated", "unresolved", "irreversible", "failed",
                                    "skipped") for s in getattr(report, name)]
    table = Table(box=None, header_style="bold", pad_edge=False,
                  title=f"unwind {_text(report.group_key)}", title_justify="left")
    for name in ("outcome", "step", "state", "detail"):
        table.add_column(name, overflow="fold", no_wrap=name == "outcome")
    style = {"compensated": "green", "unresolved": "magenta", "failed": "red"}
    for name, s in steps:
        table.add_row(f"[{style.get(name, 'yellow')}]{name}[/]", _text(s.key),
                      _state(s.state), _text(s.detail))
    out.print(table)
    if report.failed and not gate_ref:
        out.print("[dim]compensators are registered in your code: "
                  "pass --gate MODULE:ATTR[/]")


@click.command("prune", cls=Command)
@click.option("--older-than", "older_than", required=True, metavar="AGE",
              callback=lambda ctx, param, value: (value, parse_age(value)),
              help="Prune effects settled longer ago than this: 30d, 12h, 90m, 2w.")
@gate_options
@json_option
@handle_errors
def prune(older_than: tuple[str, datetime.timedelta], url: str | None, namespace: str,
          gate_ref: str | None, as_json: bool) -> None:
    """Drop stored results and history of settled effects; keep a tombstone per key, so a
    pruned key still refuses a duplicate. Never touches in-flight, AMBIGUOUS or pending ones."""
    text, age = older_than
    with open_gate(url, namespace, gate_ref) as gate:
        _needs(gate, "prune")
        count = gate.prune(older_than=age)
    if as_json:
        print_json({"pruned": count, "older_than_seconds": age.total_seconds()})
    else:
        console().print(f"pruned {count} effect{'s' if count != 1 else ''} "
                        f"settled more than {text.strip()} ago")
