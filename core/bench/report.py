"""Printing a :class:`~effectgate.bench.measure.Report`: rich tables that fit 80 columns."""

from __future__ import annotations

from typing import Any

from .measure import Figure, Ratio, Report

__all__ = ["render"]

_SECTIONS = {"core": "Core paths", "async": "Async paths", "governance": "Governance",
             "ops": "Webhooks and telemetry", "adapters": "Adapters", "scale": "Scale"}


def _ok(passed: bool | None) -> str:
    if passed is None:
        return ""
    return "[green]pass[/]" if passed else "[bold red]MISS[/]"


def _target(text: str, passed: bool | None) -> str:
    return f"{text} {_ok(passed)}".strip()


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e9:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _ratio_table(title: str, rows: list[Ratio]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
                  collapse_padding=True, show_edge=False)
    table.add_column("measure", width=16, overflow="fold")
    table.add_column("gate µs", justify="right")
    table.add_column("baseline", width=13, overflow="fold")
    table.add_column("base µs", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("IQR", justify="right")
    table.add_column("target", justify="right", min_width=9)
    for r in rows:
        target = "" if r.target is None else f"{r.target:g}x {_ok(r.passed)}"
        spread = "" if r.spread is None else f"{r.spread[0]:.2f}-{r.spread[1]:.2f}"
        table.add_row(r.name, _number(r.gate_us), r.base, _number(r.base_us), f"{r.ratio:.2f}x",
                      spread, target)
    return table


def _figure_table(rows: list[Figure]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    table.add_column("counted", max_width=40, overflow="fold")
    table.add_column("value", justify="right")
    table.add_column("unit")
    table.add_column("target", justify="right", min_width=11)
    for f in rows:
        table.add_row(f.name, _number(f.value), f.unit, _target(f.target, f.passed))
    return table


def render(report: Report, console: Any) -> None:
    """Print ``report`` on a rich ``console``: per section and backend, the ratios, then the
    counted figures, then the notes and a verdict."""
    meta = report.meta
    console.print(f"[bold]effectgate bench[/]  effectgate {meta.get('version', '?')}, "
                  f"python {meta.get('python', '?')}, n={meta.get('n', '?')}, "
                  f"chunks={meta.get('chunks', '?')} (medians)")
    for where in meta.get("stores", []):
        console.print(f"  {where}")
    backends = list(dict.fromkeys([r.backend for r in report.ratios] +
                                  [f.backend for f in report.figures]))
    for section, heading in _SECTIONS.items():
        for backend in backends:
            ratios = [r for r in report.ratios if r.section == section and r.backend == backend]
            figures = [f for f in report.figures
                       if f.section == section and f.backend == backend]
            if not ratios and not figures:
                continue
            title = f"[bold]{heading} — {backend}[/]"
            if ratios:
                console.print(_ratio_table(title, ratios))
            else:
                console.print(title)
            if figures:
                console.print(_figure_table(figures))
    for note in report.notes:
        console.print(f"note: {note}", style="dim")
    missed = report.missed
    if missed:
        console.print(f"[bold red]missed {len(missed)} target(s):[/] " + "; ".join(missed))
    else:
        console.print("[bold green]every target met[/]")
