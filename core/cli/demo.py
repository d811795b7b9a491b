"""``effectgate demo``: the main job, offline, in a few seconds, on a fresh store — each scene
played without the gate and then with it, and what reached the vendor counted side by side."""

from __future__ import annotations

import contextlib
import logging
import shlex
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ._common import (
    Command,
    console,
    fail,
    handle_errors,
    normalise_url,
    print_json,
    shown_url,
)

__all__ = ["demo"]

_ACTOR_STYLE = {"agent": "cyan", "gate": "bold green", "operator": "yellow",
                "vendor": "magenta", "model": "blue", "note": "dim"}
_INDENT = 15


@contextlib.contextmanager
def _store(url: str | None) -> Iterator[tuple[str, str]]:
    """(url, namespace): a fresh SQLite file in a temporary folder, or a fresh namespace on
    the store the user named."""
    if url:
        yield url, f"demo-{uuid.uuid4().hex[:8]}"
        return
    with tempfile.TemporaryDirectory(prefix="effectgate-demo-") as folder:
        yield f"sqlite:///{Path(folder) / 'effects.db'}", "demo"


@click.command(cls=Command)
@click.option("--url", default=None, metavar="URL",
              callback=lambda ctx, param, value: normalise_url(value),
              help="Run on this store (in a fresh namespace) instead of a throw-away SQLite file.")
@click.option("--agent", type=click.Choice(["auto", "langchain", "plain", "decorator"]),
              default="auto", show_default=True,
              help="The agent: a LangChain loop with a scripted model (auto: when the "
                   "langchain extra is installed) or a plain tool loop.")
@click.option("--json", "as_json", is_flag=True, help="Print what happened as JSON.")
@handle_errors
def demo(url: str | None, agent: str, as_json: bool) -> None:
    """An agent refunds and books through a fake vendor that counts every call reaching it:
    a retried refund, a lost reply, a large refund, an overspend and a half-booked trip —
    each played without the gate, then with it. Offline."""
    from ..demo import Line, demo_policy, run_demo
    from ..gate import Gate

    logging.getLogger("effectgate").addHandler(logging.NullHandler())
    logging.getLogger("effectgate").propagate = False
    started = time.perf_counter()
    out = console()
    lines: list[Line] = []
    scene = 0

    def show(line: Line) -> None:
        nonlocal scene
        lines.append(line)
        if as_json:
            return
        if line.actor == "scene":
            scene += 1
            title, _, setting = line.text.partition(": ")
            out.print(f"\n[bold]{scene}. {_esc(title)}[/]")
            _wrap(out, setting, indent=3, style="dim")
        elif line.actor == "pass":
            out.print(f"   [bold underline]{_esc(line.text)}[/]")
        else:
            _line(out, line.actor, line.text)

    with _store(url) as (store_url, namespace):
        gate = Gate(store_url, policy=demo_policy(), namespace=namespace)
        try:
            if not as_json:
                _header(out, store_url if url else None, namespace)
            try:
                report = run_demo(gate, show, agent=agent)
            except ImportError as err:
                fail('the LangChain agent needs the langchain extra: pip install ".[langchain]" '
                     f"in the effectgate clone ({err})")
        finally:
            gate.close()
    if as_json:
        print_json({**report.as_dict(), "namespace": namespace,
                    "seconds": round(time.perf_counter() - started, 3),
                    "lines": [{"actor": ln.actor, "text": ln.text} for ln in lines]})
        return
    _footer(out, report, store_url if url else None, namespace, hint=agent == "auto")


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _wrap(out: Any, text: str, *, indent: int, style: str = "") -> None:
    width = max(out.width, 60)
    for ln in textwrap.wrap(text, width=width - indent, break_long_words=False,
                            break_on_hyphens=False):
        out.print(" " * indent + _esc(ln), style=style or None, soft_wrap=True)


def _line(out: Any, actor: str, text: str) -> None:
    from rich.text import Text

    width = max(out.width, 60)
    body = textwrap.wrap(text, width=width - _INDENT, break_on_hyphens=False,
                         break_long_words=False) or [""]
    label = Text(f"     {actor:<{_INDENT - 5}}", style=_ACTOR_STYLE.get(actor, ""))
    out.print(label + Text(body[0]), soft_wrap=True)
    for rest in body[1:]:
        out.print(Text(" " * _INDENT + rest), soft_wrap=True)


def _header(out: Any, url: str | None, namespace: str) -> None:
    out.print("[bold]effectgate demo[/] — one agent, its tools and a fake payments vendor "
              "that counts every call reaching it, each scene played twice: without the "
              "gate, then with it.")
    where = f"{shown_url(url)} (namespace {namespace})" if url else "a fresh throw-away SQLite file"
    out.print(f"[dim]store: {_esc(where)}[/]", soft_wrap=True)
    out.print("[dim]policy: refunds of $500 or more need approval; $1,000 of refunds per "
              "run[/]")


def _footer(out: Any, report: Any, url: str | None, namespace: str, *, hint: bool) -> None:
    from ..demo import money

    without, with_gate = report.total("without"), report.total("with_gate")
    rows = [
        ("refunds that reached the vendor", without.refunds, with_gate.refunds),
        ("  of them a second refund", without.duplicate_refunds,
         with_gate.duplicate_refunds),
        ("money refunded", money(without.refunded_cents), money(with_gate.refunded_cents)),
        ("refunds nobody approved", without.unapproved_refunds,
         with_gate.unapproved_refunds),
        ("refunded past the $1,000 ceiling", money(without.over_ceiling_cents),
         money(with_gate.over_ceiling_cents)),
        ("bookings left on the failed trip", without.bookings_left, with_gate.bookings_left),
        ("cancellations (undoing bookings)", without.cancellations, with_gate.cancellations),
        ("vendor calls in all", without.vendor_calls, with_gate.vendor_calls),
        ("tool calls the agent made", without.agent_calls, with_gate.agent_calls),
    ]
    out.print("\n[bold]What happened at the vendor[/]")
    out.print(f"{'':<35}{'without the gate':<19}with the gate")
    for label, a, b in rows:
        out.print(f"{_esc(label):<35}{a!s:<19}{b!s}")
    per_scene = "; ".join(f"{n}. {s.without.vendor_calls} → {s.with_gate.vendor_calls}"
                          for n, s in enumerate(report.scenes, 1))
    _wrap(out, f"vendor calls per scene, without → with: {per_scene}. With the gate the "
               "only extra calls are the two cancellations that undo the half-booked trip.",
          indent=0, style="dim")
    out.print(f"\nagent: {_esc(report.agent)}")
    if hint and "LangChain" not in report.agent:
        out.print('[dim]for the same run in a LangChain loop, in the effectgate clone:[/]')
        out.print('  pip install ".[langchain]"', soft_wrap=True)
    if url:
        out.print("[dim]look around:[/]")
        out.print(f"  effectgate ls --url {shlex.quote(url)} --namespace {namespace}",
                  soft_wrap=True, markup=False)
