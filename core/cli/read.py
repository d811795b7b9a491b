"""The commands that only read: ``ls`` and ``show``.

Both open the store read-only (``eg.Gate(url, read_only=True)``): a mistyped URL or a store
that was never created is an error (exit 3), never an empty list. Output is a table when it
fits, else a key-first layout; identifiers are never cut and agent-supplied text is shown
escaped. ``--json`` and ``--plain`` are for scripts.
"""

from __future__ import annotations

import datetime
import json
import shlex
from typing import Any

import click

from ..governance import decided_next
from ._common import (
    BadInput,
    Command,
    console,
    gate_options,
    given,
    handle_errors,
    open_gate,
    output_options,
    print_json,
)
from ._layout import emit_table, parts_line, state_label, text_block
from ._safe import plain, safe

__all__ = ["ls", "parse_state", "show"]

_ALIASES = {"pending": "pending_approval", "inflight": "in_flight"}


def parse_state(ctx: click.Context | None, param: Any, value: str | None) -> str | None:
    """A state name in any case (``AMBIGUOUS``, ``ambiguous``, ``in-flight``) as the store
    spells it; a usage error naming the states otherwise."""
    from ..states import State

    if value is None:
        return None
    name = value.strip().lower().replace("-", "_")
    name = _ALIASES.get(name, name)
    if name not in {s.value for s in State}:
        names = ", ".join(s.value for s in State)
        raise BadInput(f"--state: state must be one of {names} (any case), not {value!r}")
    return name


def _when(value: datetime.datetime | None, seconds: bool = True) -> str:
    if value is None:
        return ""
    return value.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def store_args(ctx: click.Context, url: str | None, namespace: str) -> str:
    """`` --url U --namespace N`` as given on this command line, for a hint to copy."""
    out = ""
    if given(ctx, "url") and url:
        out += f" --url {shlex.quote(url)}"
    if given(ctx, "namespace") or namespace != "default":
        out += f" --namespace {shlex.quote(namespace)}"
    return out


def hint(out: Any, text: str, command: str) -> None:
    """A line saying why, then the command alone on its own line (never broken)."""
    out.print(f"[dim]{safe(text)}[/]", soft_wrap=True)
    out.print(f"  {safe(command)}", soft_wrap=True)


# -- ls ------------------------------------------------------------------------------------------


@click.command("ls", cls=Command)
@gate_options
@click.option("--state", default=None, callback=parse_state, metavar="STATE",
              help="Only effects in this state, any case: in_flight, committed, failed, "
                   "ambiguous, pending_approval, denied.")
@click.option("--type", "effect_type", default=None, help="Only this effect type.")
@click.option("--run", "run_id", default=None, help="Only this run id.")
@click.option("--group", "group_key", default=None, help="Only this saga group.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000))
@output_options
@handle_errors
def ls(url: str | None, namespace: str, gate_ref: str | None, state: str | None,
       effect_type: str | None, run_id: str | None, group_key: str | None, limit: int,
       output: str) -> None:
    """List effects, newest first. A lapsed IN_FLIGHT effect lists as AMBIGUOUS.

    --plain prints one effect per line: key, state, effect type, attempt, run id, updated
    (UTC, ISO 8601), separated by tabs."""
    ctx = click.get_current_context()
    with open_gate(url, namespace, gate_ref, read_only=True) as gate:
        records = gate.list_effects(state=state, effect_type=effect_type, run_id=run_id,
                                    group_key=group_key, limit=limit)
        waiting = [r for r in records if r.state.value == "pending_approval" and r.approval_id]
        approvals = ({a.approval_id: a for a in gate.list_approvals(state=None)}
                     if waiting else {})
    if output == "json":
        print_json([{k: v for k, v in r.as_dict().items() if k != "history"} for r in records])
        return
    if output == "plain":
        for r in records:
            click.echo("\t".join(plain(v) for v in (
                r.key, r.state.value, r.effect_type, r.attempt, r.run_id,
                r.updated_at.isoformat().replace("+00:00", "Z"))))
        return
    out = console()
    if not records:
        out.print("no effects match")
        return
    rows = [[safe(r.key), state_label(r.state.value), safe(r.effect_type), str(r.attempt),
             safe(r.run_id), _when(r.updated_at, seconds=False)] for r in records]
    if not emit_table(out, ["key", "state", "type", "try", "run", "updated UTC"], rows):
        for r, row in zip(records, rows, strict=True):
            out.print(row[0], soft_wrap=True)
            parts_line(out, [row[1], f"attempt {r.attempt}", row[2],
                             f"run {row[4]}" if r.run_id else "",
                             f"{row[5]} UTC"], indent=4)
    where = store_args(ctx, url, namespace) if not gate_ref else f" --gate {gate_ref}"
    _approval_hints(out, waiting, approvals, where)
    if len(records) == limit:
        out.print(f"[dim](the first {limit}; --limit for more)[/]")


def _approval_hints(out: Any, waiting: list[Any], approvals: dict[str, Any], where: str) -> None:
    for r in waiting:
        a = approvals.get(r.approval_id)
        status = a.state if a is not None else "expired"
        if status == "pending":
            hint(out, f"{r.key} waits for approval; approve (or deny ... --reason) with:",
                 f"effectgate approve {r.approval_id}{where}")
        elif status == "approved":
            by = f" by {a.decided_by}" if a is not None and a.decided_by else ""
            out.print(f"[dim]{safe(r.key)}: approved{safe(by)}; "
                      f"{safe(decided_next(status, r.reason))}[/]", soft_wrap=True)
        else:
            out.print(f"[dim]{safe(r.key)}: its approval is {safe(status)}; "
                      f"{decided_next(status)}[/]", soft_wrap=True)


# -- show ----------------------------------------------------------------------------------------

_IDENTIFIERS = ("key", "namespace", "effect_type", "run_id", "agent_id", "group_key",
                "approval_id", "payload_hash", "vendor")
_LABEL = 22


@click.command("show", cls=Command)
@click.argument("key")
@gate_options
@output_options
@handle_errors
def show(key: str, url: str | None, namespace: str, gate_ref: str | None, output: str) -> None:
    """Show one effect: its record, its history, and the vendor key it carries; for an effect
    waiting for approval, the arguments that run if it is approved, or, once a person decided,
    who decided and what the next call does.

    --plain prints "field<TAB>value" lines, then one "history" line per transition: at,
    from, to, by, token, note."""
    with open_gate(url, namespace, gate_ref, read_only=True) as gate:
        record = gate.get(key)
        waiting = _waiting_on(gate, record)
    data = record.as_dict()
    if output == "json":
        print_json(data)
        return
    if output == "plain":
        _show_plain(record, data)
        return
    out = console()
    for name, value in data.items():
        if name in ("history", "vendor_key") or value is None:
            continue
        shown = state_label(value) if name == "state" else safe(value)
        _field(out, name, shown, free=name not in _IDENTIFIERS and name != "state")
    if waiting is not None and waiting.state == "pending":
        _show_waiting(out, waiting)
    elif waiting is not None:
        _show_decided(out, waiting, record.reason)
    if record.vendor_key is not None:
        out.print("\n[bold]vendor key[/]")
        for name, value in record.vendor_key.as_dict().items():
            _field(out, name, safe(value), free=False)
    out.print("\n[bold]history[/] (UTC)")
    for h in record.history:
        origin = state_label(h.from_state.value) if h.from_state else "new"
        parts_line(out, [_when(h.at), f"{origin} → {state_label(h.to_state.value)}",
                         f"token {h.token}", f"by {safe(h.by)}" if h.by else ""],
                   indent=2, hang=23)
        if h.note:
            text_block(out, safe(h.note), indent=23, style="dim")


def _waiting_on(gate: Any, record: Any) -> Any:
    """The approval request ``record`` waits for (pending, or decided and not yet taken up by
    a call), or None."""
    from ..errors import UnknownEffect

    if record.state.value != "pending_approval" or not record.approval_id:
        return None
    try:
        return gate.approval(record.approval_id)
    except UnknownEffect:
        return None


def _show_decided(out: Any, approval: Any, effect_reason: str | None) -> None:
    """An approval decided while its effect still waits (the effect's ``reason``, above, says
    which spend ceiling refused an approved one's last call): who decided, and what happens
    next — in the words ``ls`` and the console use (:func:`decided_next`)."""
    state = str(approval.state)
    out.print(f"\n[bold]approval[/] {safe(approval.approval_id)} {safe(state)}", soft_wrap=True)
    parts_line(out, [f"by {safe(approval.decided_by)}" if approval.decided_by else "",
                     f"at {_when(approval.decided_at)} UTC" if approval.decided_at else "",
                     safe(approval.reason) if approval.reason else ""], indent=2)
    text_block(out, safe(decided_next(state, effect_reason)), indent=2, style="dim")



def _show_waiting(out: Any, approval: Any) -> None:
    """What an approver decides on: the request, and the arguments that run if approved."""
    out.print(f"\n[bold]waiting for approval[/] {safe(approval.approval_id)}", soft_wrap=True)
    parts_line(out, [f"requested by {safe(approval.requested_by or 'nobody named')}",
                     f"expires {_when(approval.expires_at)} UTC"], indent=2)
    if approval.arguments is None:
        out.print("  [dim](no arguments kept)[/]")
        return
    out.print("  [bold]arguments that run if it is approved[/]")
    shown = json.dumps(approval.arguments, indent=2, sort_keys=True, ensure_ascii=False)
    for line in shown.splitlines():
        out.print("    " + safe(line), soft_wrap=True)


def _field(out: Any, name: str, shown: str, *, free: bool) -> None:
    """``name`` and its value on one line when it fits; else free text wraps at spaces under
    the label, and an identifier goes whole on the next line."""
    from rich.text import Text

    from ._layout import cells, width

    label = f"[bold]{name}[/]" + " " * max(_LABEL - len(name), 1)
    if _LABEL + cells(Text.from_markup(shown, emoji=False).plain) <= width(out):
        out.print(label + shown, soft_wrap=True)
    elif free:
        out.print(f"[bold]{name}[/]", soft_wrap=True)
        text_block(out, shown, indent=4)
    else:
        out.print(f"[bold]{name}[/]", soft_wrap=True)
        out.print(f"    {shown}", soft_wrap=True)


def _show_plain(record: Any, data: dict[str, Any]) -> None:
    for name, value in data.items():
        if name in ("history", "vendor_key") or value is None:
            continue
        click.echo(f"{name}\t{plain(value)}")
    if record.vendor_key is not None:
        for name, value in record.vendor_key.as_dict().items():
            click.echo(f"vendor_key.{name}\t{plain(value)}")
    for h in record.history:
        click.echo("\t".join(["history", *(plain(v) for v in (
            h.at.isoformat().replace("+00:00", "Z"), h.from_state.value if h.from_state
            else "", h.to_state.value, h.by, h.token, h.note))]))
