"""The operator's commands that write: ``resolve``, ``approve``, ``deny``, ``unwind``, ``prune``
(``ls`` and ``show`` are in :mod:`effectgate.cli.read`). Text on a terminal; ``--json`` and
``--plain`` for scripts. Flags that contradict each other are refused (exit 2) before the
store is opened. Exit codes as in :mod:`effectgate.cli._common`."""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

import click

from ._common import (
    EXIT_FAILED,
    BadInput,
    Command,
    actor,
    by_option,
    console,
    exclusive,
    fail,
    gate_options,
    handle_errors,
    note_action,
    open_gate,
    output_options,
    print_json,
)
from ._layout import parts_line, state_label, text_block
from ._safe import plain, safe

__all__ = ["approve", "deny", "parse_age", "prune", "resolve", "unwind"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
def parse_age(text: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (any case) as a timedelta; a usage error
    (exit 2) otherwise, and for an age past ten thousand years."""
    match = re.fullmatch(r"\s*(\d{1,12})\s*([smhdw])\s*", (text or "").lower())
    if not match:
        raise click.BadParameter(
            f"{text!r} is not an age; write a number and a unit: 45s, 90m, 12h, 30d, 2w")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds > 10_000 * 366 * 86400:
        raise click.BadParameter(f"{text!r} is more than ten thousand years")
    return datetime.timedelta(seconds=seconds)


def _needs(gate: Any, name: str) -> None:
    if not hasattr(gate, name):
        fail(f"this effectgate has no {name}() (governance is not available)")


# -- resolve -----------------------------------------------------------------------------------


@click.command("resolve", cls=Command)
@click.argument("key")
@click.option("--committed", is_flag=True, help="It happened (a repeat then returns --result).")
@click.option("--failed", is_flag=True, help="It certainly did not happen (a repeat may run).")
@click.option("--note", default=None, help="Why: what you checked.")
@click.option("--result", "result_json", default=None, metavar="JSON",
              help="With --committed: the result a repeat returns (JSON).")
@click.option("--force", is_flag=True,
              help="Resolve even though the holder's lease is still live (recorded in the "
                   "history). Only when you know the holder is gone.")
@click.option("--attempt", type=click.IntRange(1, 1_000_000), default=None, metavar="N",
              help="The attempt you checked (effectgate show prints it): refused, writing "
                   "nothing, if the effect has moved on to another attempt since.")
@click.option("--yes", "-y", is_flag=True,
              help="With --force: do not ask before overriding a live lease (for scripts).")
@by_option
@gate_options
@output_options
@handle_errors
def resolve(key: str, committed: bool, failed: bool, note: str | None,
            result_json: str | None, force: bool, attempt: int | None, yes: bool,
            by: str | None, url: str | None, namespace: str, gate_ref: str | None,
            output: str) -> None:
    """Settle an AMBIGUOUS (or stuck) effect after checking with the vendor: --committed or
    --failed (exactly one). A live lease is refused unless --force, which asks first (on
    stderr; --yes skips the question; with no terminal to ask on and no --yes, nothing is
    recorded, exit 2). With --attempt, a verdict about that attempt is never recorded on a
    later one."""
    ctx = click.get_current_context()
    exclusive(ctx, ("committed", "failed"), ("failed", "result_json"))
    if not (committed or failed):
        raise BadInput("say what happened: --committed or --failed "
                       f"(see: {ctx.command_path} --help)")
    outcome = "committed" if committed else "failed"
    result: Any = None
    if result_json is not None:
        try:
            result = json.loads(result_json)
        except ValueError as err:
            raise click.BadParameter(f"not JSON: {err}", param_hint="--result") from None
        except RecursionError:
            raise click.BadParameter("nested too deeply to store",
                                     param_hint="--result") from None
    from ..errors import InvalidTransition

    with open_gate(url, namespace, gate_ref) as gate:
        seen = gate.get(key) if attempt is not None or force else None
        if seen is not None and attempt is not None and seen.attempt != attempt:
            fail(f"{seen.key} is at attempt {seen.attempt} now ({seen.state.value}), not "
                 f"{attempt}: nothing was recorded; check it again (effectgate show)",
                 EXIT_FAILED)

        def settle(forced: bool) -> Any:
            return gate.resolve(key, outcome, by=actor(by), note=note, result=result,
                                force=forced, expected=seen)

        forced = force and seen is not None and seen.state.value == "in_flight"
        if not forced or yes:  # force only what was seen in flight, so '; forced' is true
            record = settle(forced)
        else:
            try:  # what was typed is checked first; nothing is written while the lease is live
                record = settle(False)
                forced = False
            except InvalidTransition:
                _ask_force(gate.get(key), seen, outcome)
                record = settle(True)
        note_action(gate, actor(by), "resolve", subject=record.key, effect_id=record.effect_id,
                    detail=f"outcome {record.state.value}" + ("; forced" if forced else "")
                    + (f"; note: {note}" if note else ""))
    if output == "json":
        print_json(record.as_dict())
    elif output == "plain":
        click.echo("\t".join(plain(v) for v in (record.key, record.state.value, actor(by))))
    else:
        console().print(f"resolved {safe(record.key)}: {state_label(record.state.value)} "
                        f"by {safe(actor(by))}", soft_wrap=True)


# -- approvals -----------------------------------------------------------------------------------


@click.command("approve", cls=Command)
@click.argument("approval_id")
@click.option("--note", default=None, help="Why it is approved.")
@by_option
@gate_options
@output_options
@handle_errors
def approve(approval_id: str, note: str | None, by: str | None, url: str | None,
            namespace: str, gate_ref: str | None, output: str) -> None:
    """Approve a pending request: the next call with exactly that payload runs (once).

    What runs if it is approved: effectgate show KEY."""
    with open_gate(url, namespace, gate_ref) as gate:
        _needs(gate, "approve")
        record = gate.approve(approval_id, by=actor(by), note=note)
        note_action(gate, actor(by), "approve", subject=record.key, effect_id=record.effect_id,
                    detail=f"approval {record.approval_id}" + (f"; note: {note}" if note else ""))
    _approval(record, output)


@click.command("deny", cls=Command)
@click.argument("approval_id")
@click.option("--reason", default=None, help="Why it is denied.")
@by_option
@gate_options
@output_options
@handle_errors
def deny(approval_id: str, reason: str | None, by: str | None, url: str | None,
         namespace: str, gate_ref: str | None, output: str) -> None:
    """Deny a pending request: its effect becomes DENIED."""
    with open_gate(url, namespace, gate_ref) as gate:
        _needs(gate, "deny")
        record = gate.deny(approval_id, by=actor(by), reason=reason)
        note_action(gate, actor(by), "deny", subject=record.key, effect_id=record.effect_id,
                    detail=f"approval {record.approval_id}"
                    + (f"; reason: {reason}" if reason else ""))
    _approval(record, output)


def _approval(record: Any, output: str) -> None:
    if output == "json":
        print_json(record.as_dict())
    elif output == "plain":
        click.echo("\t".join(plain(v) for v in (record.approval_id, record.key, record.state,
                                                 record.decided_by)))
    else:
        console().print(f"{safe(record.approval_id)} ({safe(record.key)}): "
                        f"{state_label(record.state)} by {safe(record.decided_by)}",
                        soft_wrap=True)


# -- unwind --------------------------------------------------------------------------------------

_OUTCOMES = ("compensated", "unresolved", "irreversible", "failed", "skipped")
_OUTCOME_STYLE = {"compensated": "green", "unresolved": "magenta", "failed": "red"}


@click.command("unwind", cls=Command)
@click.argument("group_key")
@click.option("--yes", "-y", is_flag=True,
              help="Do not ask before running the undos (for scripts).")
@by_option
@gate_options
@output_options
@handle_errors
def unwind(group_key: str, yes: bool, by: str | None, url: str | None, namespace: str,
           gate_ref: str | None, output: str) -> None:
    """Undo a saga: run the compensations of its committed steps, newest first, each once.

    The compensators live in your code: pass --gate MODULE:ATTR so they are registered.
    Asks first (on stderr), naming the undos that will run; --yes skips the question (for
    scripts). Without a terminal to ask on and without --yes, nothing runs (exit 2); if the
    saga changes while you are asked, nothing runs (exit 1). Only the undos you said yes to
    are run: one the saga gains after that is listed unresolved, not run, and holds back the
    older steps (unwind again to review it).
    Exits 1 when a step is left unresolved or its compensation failed.
    --plain prints one step per line: outcome, key, state, detail.
    """
    with open_gate(url, namespace, gate_ref) as gate:
        _needs(gate, "unwind")
        if yes:
            report = gate.unwind(group_key, by=actor(by))
        else:
            from ..sagas import unwind as unwind_confirmed

            confirmed = _confirm_unwind(gate, group_key)
            report = unwind_confirmed(gate, group_key, actor(by), confirmed=confirmed)
        if any(getattr(report, name) for name in _OUTCOMES):
            counts = {"compensated now": len(report.compensated_now),
                      "compensated earlier": len(report.compensated_earlier),
                      **{name: len(getattr(report, name)) for name in _OUTCOMES[1:]}}
            note_action(gate, actor(by), "unwind", subject=report.group_key,
                        detail=", ".join(f"{n} {name}" for name, n in counts.items() if n))
    if not any(getattr(report, name) for name in _OUTCOMES):
        fail(f"no effects in group {group_key!r}")
    steps = [(name, s) for name in _OUTCOMES for s in getattr(report, name)]
    if output == "json":
        print_json(report.as_dict())
    elif output == "plain":
        for name, step in steps:
            click.echo("\t".join(plain(v) for v in (name, step.key, step.state, step.detail)))
    else:
        out = console()
        out.print(f"[bold]unwind {safe(report.group_key)}[/]", soft_wrap=True)
        for name, step in steps:
            out.print(f"  {safe(step.key)}", soft_wrap=True)
            parts_line(out, [f"[{_OUTCOME_STYLE.get(name, 'yellow')}]{name}[/]",
                             state_label(step.state)], indent=4)
            if step.detail:
                text_block(out, safe(step.detail), indent=4, style="dim")
        if report.failed and not gate_ref:
            out.print("[dim]compensators are registered in your code: pass --gate "
                      "MODULE:ATTR[/]", soft_wrap=True)
    if not report.complete:
        raise SystemExit(EXIT_FAILED)


def _confirm_unwind(gate: Any, group_key: str) -> frozenset[int]:
    """Name the undos an unwind would run now and ask; nothing to run asks nothing. Refused
    (exit 1) if the saga moved while the question was open. The steps whose undo was named:
    the only ones the unwind may begin."""
    from ..sagas import undo_at, unwind_plan

    runs, seen = unwind_plan(gate, group_key)
    if not runs:
        return frozenset()
    undos = "; ".join(f"{undo_at(gate, r)[0]['key']} (undoes {r.key}, {r.effect_type})"
                      for r in runs)
    _confirm(f"unwind {group_key} in namespace {gate.namespace!r}: run {len(runs)} "
             f"undo{'s' if len(runs) != 1 else ''}, newest first: {undos}?", "undone",
             "pass --yes to unwind without asking")
    if unwind_plan(gate, group_key)[1] != seen:
        fail(f"{group_key} changed while you were asked: nothing was undone; run it again "
             "to see what would run now", EXIT_FAILED)
    return frozenset(r.effect_id for r in runs)


# -- prune ---------------------------------------------------------------------------------------


@click.command("prune", cls=Command)
@click.option("--older-than", "older_than", required=True, metavar="AGE",
              callback=lambda ctx, param, value: (value, parse_age(value)),
              help="Prune effects settled longer ago than this: 30d, 12h, 90m, 2w.")
@click.option("--dry-run", is_flag=True, help="Count what would be pruned; write nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@gate_options
@output_options
@handle_errors
def prune(older_than: tuple[str, datetime.timedelta], dry_run: bool, yes: bool,
          url: str | None, namespace: str, gate_ref: str | None, output: str) -> None:
    """Drop stored results and history of settled effects; keep a tombstone per key, so a
    pruned key still refuses a duplicate. Never touches in-flight, AMBIGUOUS or pending ones.

    Asks before it prunes (on stderr); --yes skips the question (for scripts), --dry-run only
    counts. Without a terminal to ask on and without --yes, nothing is pruned (exit 2)."""
    text, age = older_than
    ago = text.strip()
    with open_gate(url, namespace, gate_ref, read_only=dry_run and not gate_ref) as gate:
        _needs(gate, "prune")
        would = gate.prune(older_than=age, dry_run=True)
        count = 0
        if not dry_run and would:
            if not yes:
                _confirm(f"prune {would} effect{'s' if would != 1 else ''} of namespace "
                         f"{gate.namespace!r} settled more than {ago} ago?", "pruned",
                         "pass --yes to prune without asking (or --dry-run to count)")
            count = gate.prune(older_than=age)
    if output == "json":
        print_json({"pruned": count, "would_prune": would, "dry_run": dry_run,
                    "older_than_seconds": age.total_seconds()})
    elif output == "plain":
        click.echo(str(would if dry_run else count))
    elif dry_run:
        console().print(f"would prune {would} effect{'s' if would != 1 else ''} settled "
                        f"more than {safe(ago)} ago (dry run: nothing written)")
    else:
        console().print(f"pruned {count} effect{'s' if count != 1 else ''} settled more than "
                        f"{safe(ago)} ago")


def _ask_force(now: Any, seen: Any, outcome: str) -> None:
    """Ask before forcing a verdict over the live lease ``seen`` had, only if the effect is
    still ``now`` as seen (anything else moved it: refused, exit 1)."""
    if (now.state, now.lease_token) != (seen.state, seen.lease_token):
        fail(f"{now.key} changed while it was read ({now.state.value} at attempt "
             f"{now.attempt} now): nothing was recorded; check it again (effectgate show)",
             EXIT_FAILED)
    _confirm(f"{seen.key} is in flight (attempt {seen.attempt}): its holder's lease is live "
             f"until {_utc(seen.lease_expires_at)} and it may still be running. Record it "
             f"{outcome} anyway?", "recorded", "pass --yes to force it without asking")


def _utc(value: datetime.datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _confirm(question: str, done: str, unasked: str) -> None:
    """Ask on stderr; anything but yes stops with exit 1 (nothing ``done``), no terminal to
    ask on with exit 2 (``unasked`` says how a script goes on)."""
    try:
        answer = click.confirm(plain(question), default=False, err=True)
    except click.Abort:
        answer = None
    if answer is None:
        fail(f"{click.get_current_context().info_name} asks for confirmation and got no "
             f"answer; {unasked}")
    if not answer:
        fail(f"nothing {done}", code=EXIT_FAILED)
