"""An effect's history, kept in its own row: one line per transition.

A line is ``from TAB to TAB at TAB token TAB by TAB note LF``. ``from``/``to`` are state names,
``at`` the store's clock and ``token`` the fencing token, all written by the statement that
makes the transition; ``by`` and ``note`` are JSON with every non-ASCII character escaped, so no
text an agent or operator sends (a tab, a line feed, U+2028, U+0085, an escape sequence) can
break a line or be mistaken for the framing. Lines are split on LF only, never on the other
characters :meth:`str.splitlines` treats as line ends.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, cast, func
from sqlalchemy import bindparam as p

from .lines import Line, encode_line, encode_text, parse
from .schema import db_now, effects, literal

__all__ = ["Line", "append", "encode_line", "encode_text", "parse"]


def append(from_state: Any, to_state: Any, token: Any, by: Any = None, *,
           first: bool = False, note: Any = None) -> Any:
    """SQL: ``history`` with one more line, written by the statement making the transition.

    ``by`` and ``note`` come from the binds ``h_by`` and ``h_note`` (already framed by
    :func:`encode_text`) unless given as expressions."""
    t = effects.c
    tab: Any = literal("\t")
    return (
        (from_state if first else func.coalesce(t.history, literal("")) + from_state)
        + tab + to_state + tab
        + cast(db_now(), String) + tab + cast(token, String) + tab
        + (p("h_by") if by is None else by) + tab + (p("h_note") if note is None else note)
        + literal("\n")
    )
