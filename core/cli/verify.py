"""``effectgate verify``: check the guarantees (G1–G12) against the configured store."""

from __future__ import annotations

import logging
import textwrap
import uuid
from pathlib import Path
from typing import Any

import click

from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    Command,
    console,
    handle_errors,
    print_json,
    shown_url,
)

__all__ = ["verify"]

_STYLE = {"passed": "green", "failed": "bold red", "not_applicable": "yellow"}
_LABEL = {"passed": "pass", "failed": "FAIL", "not_applicable": "n/a"}


@click.command(cls=Command)
@click.option("--url", default=None, envvar="EFFECTGATE_URL", metavar="URL",
              help="Store URL (default: $EFFECTGATE_URL, else sqlite:///.effectgate/effects.db).")
@click.option("--only", metavar="G1,G3", default=None,
              help="Check only these guarantees (comma-separated ids).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--junit", "junit", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              default=None, help="Also write a JUnit XML report to this file.")
@click.option("--exhaustive", is_flag=True,
              help="Also explore every interleaving of the 2-worker bound on the protocol "
                   "model and replay a sample of its schedules on this store.")
@click.option("--create", is_flag=True,
              help="Create the store at --url if there is none (otherwise a URL with no "
                   "effectgate store is an error: a typo must not pass for an empty store).")
@handle_errors
def verify(url: str | None, only: str | None, as_json: bool, junit: Path | None,
           exhaustive: bool, create: bool) -> None:
    """Check G1–G16 of the design against the store, in a scratch namespace.

    Your data is not touched: every check writes under a fresh namespace that is deleted
    afterwards. A guarantee that does not apply says why and is not counted as a pass.
    Exit 0 when every applicable guarantee passed, 1 when one failed, 2 for bad input,
    3 when the store cannot be reached.
    """
    from ..store import resolve_url
    from ..verify import CheckResult, junit_xml, parse_only, run_checks

    logging.getLogger("effectgate").addHandler(logging.NullHandler())
    logging.getLogger("effectgate").propagate = False
    parse_only(only)  # bad input fails before the store is opened
    out = console()
    target = resolve_url(url)
    if not create:
        _require_store(target)
    policy = _policy_in_force()
    if not as_json:
        from rich.markup import escape

        out.print(f"effectgate verify — {escape(shown_url(target))}")
        out.print(f"[dim]policy in force here: {escape(policy)}[/]")

    def show(result: CheckResult) -> None:
        if as_json:
            return
        from rich.markup import escape
        from rich.text import Text

        style = _STYLE[result.status]
        out.print(f"[{style}]{_LABEL[result.status]:>4}[/] {result.id:<4} {escape(result.title)}")
        detail = textwrap.fill(f"{result.detail} ({result.seconds:.1f}s)",
                               width=max(out.width, 40), initial_indent=" " * 10,
                               subsequent_indent=" " * 10, break_on_hyphens=False)
        out.print(Text(detail, style="dim"))

    scratch = f"verify-{uuid.uuid4().hex[:12]}"
    results = run_checks(target, only, on_result=show, namespace=scratch)
    if junit is not None:
        junit.write_text(junit_xml(results))
    failed = [r.id for r in results if r.status == "failed"]
    report = None
    if exhaustive:
        from ..verify.exhaustive import run_exhaustive

        def progress(line: str) -> None:
            from rich.text import Text

            out.print(Text(f"     model {line}", style="dim"))

        report = run_exhaustive(target, on_progress=None if as_json else progress)
        if not report.passed:
            failed.append("exhaustive")
    if as_json:
        doc: dict[str, Any] = {"url": shown_url(target), "namespace": scratch, "policy": policy,
                               "passed": not failed,
                               "results": [r.as_dict() for r in results]}
        if report is not None:
            doc["exhaustive"] = report.as_dict()
        print_json(doc)
    else:
        if report is not None:
            _exhaustive_summary(out, report)
        _summary(out, results, failed)
    raise SystemExit(EXIT_FAILED if failed else EXIT_OK)


def _exhaustive_summary(out: Any, report: Any) -> None:
    from rich.text import Text

    ok = report.passed
    out.print(Text.assemble(
        ("pass" if ok else "FAIL", "green" if ok else "bold red"),
        f" model {report.states} states explored (2-worker bound), "
        f"{report.replay.schedules} schedules replayed on the store, "
        f"{len(report.violations)} violations ({report.seconds:.1f}s)"))
    for text in report.violations[:5]:
        out.print(Text(text, style="red"))


def _summary(out: Any, results: list[Any], failed: list[str]) -> None:
    counts = {s: sum(r.status == s for r in results) for s in _STYLE}
    line = (f"{counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['not_applicable']} not applicable")
    if failed:
        out.print(f"[bold red]FAILED[/] {', '.join(failed)} — {line}")
    else:
        out.print(f"[green]OK[/] — {line}")


def _policy_in_force() -> str:
    """The policy a ``Gate()`` started here would load (the checks run without it)."""
    from ..discovery import find_policy
    from ..errors import PolicyError
    from ._safe import plain

    try:
        found = find_policy()
    except PolicyError as err:
        return plain(err.message)
    return plain(str(found)) if found is not None else "none"


def _require_store(url: str) -> None:
    """Exit 3 when ``url`` holds no effectgate store (opened read-only: nothing is made)."""
    from ..errors import StoreError
    from ..gate import Gate
    from ._common import EXIT_STORE, fail

    try:
        Gate(url, policy=False, read_only=True).close()
    except StoreError as err:
        fail(f"{err.message.splitlines()[0]} (verify checks an existing store; --create makes "
             "one)", EXIT_STORE)
