"""How the records read outside Python: ISO-8601 times in their JSON-ready fields, HTML
tables in Jupyter (shared by :mod:`effectgate.records` and :mod:`effectgate.stored`)."""

from __future__ import annotations

import datetime
import json
from typing import Any

__all__ = ["html_table", "iso"]


def iso(value: datetime.datetime | None) -> str | None:
    """``value`` as ISO 8601 with ``Z`` for UTC; None stays None."""
    return value.isoformat().replace("+00:00", "Z") if value else None


def html_table(title: str, rows: list[tuple[str, Any]]) -> str:
    """A two-column table of the rows whose value is not None."""
    import html  # for notebooks only

    body = "".join(
        f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
        f"<td style='text-align:left'>{html.escape(_show(v))}</td></tr>"
        for k, v in rows
        if v is not None
    )
    return f"<table><caption>{html.escape(title)}</caption>{body}</table>"


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)
