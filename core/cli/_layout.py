"""Output that never cuts what an operator must copy.

Rich's tables fold or truncate a column that does not fit; a key folded across two lines
(``compensate:fligh`` / ``t:t1``) cannot be copied. Here, lines are built from *parts* (an
identifier, a state, a time) joined by two spaces and broken only between parts; a part is
never broken, and lines are printed with ``soft_wrap`` so rich inserts no line break either.
Free text (errors, notes) wraps at spaces only. A table is used only when every column fits
at its natural width; otherwise each row becomes a key line and an indented detail line.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

__all__ = ["STATE_STYLE", "emit_table", "parts_line", "state_label", "text_block", "width"]

STATE_STYLE = {
    "committed": "green", "failed": "red", "ambiguous": "bold magenta",
    "in_flight": "cyan", "pending_approval": "yellow", "denied": "red",
    "approved": "green", "consumed": "dim", "expired": "dim", "pending": "yellow",
}
GAP = "  "


def width(out: Any) -> int:
    """The console's width (80 in a pipe, ``$COLUMNS`` when set)."""
    return max(int(out.width), 40)


def cells(text: str) -> int:
    """Terminal cells ``text`` takes (wide characters count twice)."""
    from rich.cells import cell_len

    return int(cell_len(text))


def state_label(value: str) -> str:
    """A state as the README and ``eg.State`` name it (``AMBIGUOUS``), styled, for a console."""
    return f"[{STATE_STYLE.get(value, 'white')}]{value.upper()}[/]"


def _markup_len(markup: str) -> int:
    from rich.text import Text

    return cells(Text.from_markup(markup, emoji=False).plain)


def parts_line(out: Any, parts: Sequence[str], *, indent: int = 0,
               hang: int | None = None) -> None:
    """Print ``parts`` (rich markup, already escaped) joined by two spaces, broken only between
    parts; continuation lines are indented by ``hang`` (default ``indent``)."""
    limit = width(out)
    hang = indent if hang is None else hang
    line, used = " " * indent, indent
    first = True
    for part in parts:
        if not part:
            continue
        size = _markup_len(part)
        if not first and used + len(GAP) + size > limit:
            out.print(line, soft_wrap=True)
            line, used, first = " " * hang, hang, True
        if not first:
            line += GAP
            used += len(GAP)
        line += part
        used += size
        first = False
    if not first:
        out.print(line, soft_wrap=True)


def text_block(out: Any, text: str, *, indent: int, first_indent: int | None = None,
               style: str = "") -> None:
    """Free text wrapped at spaces only (a long word is never broken), already escaped for
    rich; the first line indented by ``first_indent`` (default ``indent``)."""
    limit = width(out)
    lead = " " * (indent if first_indent is None else first_indent)
    lines = textwrap.wrap(text, width=max(limit, indent + 20), initial_indent=lead,
                          subsequent_indent=" " * indent, break_long_words=False,
                          break_on_hyphens=False) or [lead]
    for ln in lines:
        out.print(ln, style=style or None, soft_wrap=True)


def emit_table(out: Any, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> bool:
    """Print ``rows`` (rich markup, escaped) as an aligned table if every column fits at its
    natural width; return False (printing nothing) when it does not."""
    natural = [max([cells(h)] + [_markup_len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    if sum(natural) + len(GAP) * (len(headers) - 1) > width(out):
        return False
    out.print(GAP.join(f"[bold]{h}[/]" + " " * (natural[i] - cells(h))
                       for i, h in enumerate(headers)).rstrip(), soft_wrap=True)
    for row in rows:
        out.print(GAP.join(cell + " " * (natural[i] - _markup_len(cell))
                           for i, cell in enumerate(row)).rstrip(), soft_wrap=True)
    return True
