"""``effectgate demo``: the main job, offline, in a few seconds, on a fresh store."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import textwrap
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ._common import Command, console, fail, handle_errors, print_json

__all__ = ["demo"]

_ACTOR_STYLE = {"agent": "cyan", "gate": "bold", "operator": "yellow", "vendor": "magenta",
                "note": "dim"}
_INDENT = 11


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
              help="Run on this store (in a fresh namespace) instead of a throw-away SQLite file.")
@click.option("--agent", type=click.Choice(["auto", "langchain", "decorator"]), default="auto",
              show_default=True,
              help="The agent: a LangChain loop with a scripted model (when installed) or the "
                   "plain decorator.")
@click.option("--json", "as_json", is_flag=True, help="Print what happened as JSON.")
@handle_errors
def demo(url: str | None, agent: str, as_json: bool) -> None:
    """An agent retries a refund, loses a reply, waits for an approval, hits a spend ceiling
    and has a trip unwound — offline, against a fake payments vendor that counts every call
    that reaches it."""
    from ..demo import Line, demo_policy, run_demo
    from ..gate import Gate

    logging.getLogger("effectgate").addHandler(logging.NullHandler())
    logging.getLogger("effectgate").propagate = False
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
            out.print(f"\n[bold]{scene}. {line.text}[/]")
            return
        _line(out, line.actor, line.text)

    with _store(url) as (store_url, namespace):
        gate = Gate(store_url, policy=demo_policy(), namespace=namespace)
        try:
            if not as_json:
                _header(out, store_url if url else None, namespace)
            try:
                summary = run_demo(gate, show, agent=agent)
            except ImportError as err:
                fail(f'the LangChain agent needs its extra: pip install "effectgate[langchain]" '
                     f"({err})")
        finally:
            gate.close()
    if as_json:
        print_json({"agent": summary.agent, "namespace": namespace,
                    "agent_calls": summary.agent_calls, "vendor_calls": summary.vendor_calls,
                    "vendor_log": summary.vendor_log,
                    "scenes": [{"title": t, "agent_calls": a, "vendor_calls": v}
                               for t, a, v in summary.scenes],
                    "lines": [{"actor": ln.actor, "text": ln.text} for ln in lines]})
        return
    _footer(out, summary, store_url if url else None, namespace, hint=agent == "auto")


def _line(out: Any, actor: str, text: str) -> None:
    from rich.text import Text

    width = max(out.width, 60)
    body = textwrap.wrap(text, width=width - _INDENT, break_on_hyphens=False) or [""]
    label = Text(f"  {actor:<{_INDENT - 2}}", style=_ACTOR_STYLE.get(actor, ""))
    out.print(label + Text(body[0]))
    for rest in body[1:]:
        out.print(Text(" " * _INDENT + rest))


def _header(out: Any, url: str | None, namespace: str) -> None:
    from rich.markup import escape

    out.print("[bold]effectgate demo[/] — an agent, its tools, a fake payments vendor")
    where = f"{url} (namespace {namespace})" if url else "a fresh throw-away SQLite file"
    out.print(f"[dim]store: {escape(where)}[/]")
    out.print("[dim]policy: refunds of $500 or more need approval; $1,000 of refunds per run[/]")


def _footer(out: Any, summary: Any, url: str | None, namespace: str, *, hint: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    out.print("\n[bold]What reached the vendor[/]")
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("scene")
    table.add_column("agent calls", justify="right")
    table.add_column("vendor calls", justify="right")
    for title, calls, reached in summary.scenes:
        table.add_row(title, str(calls), str(reached))
    table.add_row("[bold]total[/]", f"[bold]{summary.agent_calls}[/]",
                  f"[bold]{summary.vendor_calls}[/]")
    out.print(table)
    refunds = Counter(c for c in summary.vendor_log if c.startswith("refund "))
    twice = [c for c, n in refunds.items() if n > 1]
    verdict = ("[red]a refund reached the vendor twice[/]" if twice else
               f"each of {len(refunds)} refunds reached the vendor exactly once")
    out.print(f"\nagent: {summary.agent}; {verdict}.")
    if hint and "decorator" in summary.agent:
        out.print(Text('pip install "effectgate[langchain]" for the same run in a LangChain '
                       "loop.", style="dim"))
    if url:
        out.print(Text(f"look around: effectgate ls --url {url} --namespace {namespace}",
                       style="dim"))
