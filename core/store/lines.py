"""An effect's history lines as text: framing and parsing, no SQL (the statement that
appends a line is :func:`effectgate.store.history.append`).

A line is ``from TAB to TAB at TAB token TAB by TAB note LF``. ``from``/``to`` are state names,
``at`` the store's clock and ``token`` the fencing token, all written by the statement that
makes the transition; ``by`` and ``note`` are JSON with every non-ASCII character escaped, so no
text an agent or operator sends (a tab, a line feed, U+2028, U+0085, an escape sequence) can
break a line or be mistaken for the framing. Lines are split on LF only, never on the other
characters :meth:`str.splitlines` treats as line ends.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from ..states import State

__all__ = ["Line", "encode_line", "encode_text", "parse"]

_encode = json.JSONEncoder(ensure_ascii=True).encode
_STATES = frozenset(s.value for s in State)


class Line(NamedTuple):
    """One transition, as stored."""

    from_state: str | None
    to_state: str
    at: float
    token: int
    by: str | None
    note: str | None


def encode_text(value: str | None) -> str:
    """``by`` or ``note`` as it is framed in a line: ASCII-only JSON (``null`` for None)."""
    return "null" if value is None else _encode(value)


def encode_line(from_state: str | None, to_state: str, at: float, token: int, by: str | None,
                note: str | None) -> str:
    """A whole line written by Python (the v1 → v2 migration carries old rows this way)."""
    return "\t".join((from_state or "", to_state, repr(float(at)), str(int(token)),
                      encode_text(by), encode_text(note))) + "\n"


def parse(text: str | None) -> list[Line]:
    """The lines of a ``history`` column, oldest first. A line that cannot be read (written by
    hand, or cut by a bug) is kept as a note rather than lost or raised."""
    out: list[Line] = []
    for raw in (text or "").split("\n"):
        if not raw:
            continue
        parts = raw.split("\t", 5)
        try:
            from_state, to_state, at, token, by, note = parts
            if to_state not in _STATES or (from_state and from_state not in _STATES):
                raise ValueError(to_state)
            out.append(Line(from_state or None, to_state, float(at), int(token),
                            _decode(by), _decode(note)))
        except ValueError:
            last = out[-1] if out else None
            state = last.to_state if last else State.AMBIGUOUS.value
            out.append(Line(state, state, last.at if last else 0.0, last.token if last else 0,
                            None, f"unreadable history line: {raw[:200]!r}"))
    return out


def _decode(text: str) -> str | None:
    value = json.loads(text)
    if value is not None and not isinstance(value, str):
        return json.dumps(value)
    return value
