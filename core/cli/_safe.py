"""Agent-supplied text shown to an operator: escaped so it can never drive the terminal.

Keys, effect types, run and agent ids, error texts and notes come from agents and tools, and
every one of them is hostile. :func:`safe` turns every character that is not printable text —
C0 and C1 controls (ESC, CSI, BEL, NEL...), DEL, line and paragraph separators, and format
characters (zero-width spaces, bidirectional overrides, BOM) — into a visible escape
(``\\x1b``, ``\\u202e``), and a backslash into ``\\\\`` so an escape shown is never ambiguous
with the same text typed literally. Rich markup is escaped as well. :func:`dumps` is JSON whose
strings carry the same characters as ``\\uXXXX`` escapes (still the same JSON value).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

__all__ = ["dumps", "plain", "safe", "unsafe_char"]

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def unsafe_char(ch: str) -> bool:
    """True for a character that must not reach a terminal raw."""
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\t":
        return "\\t"
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def plain(value: Any) -> str:
    """``value`` as one line of text with every unsafe character escaped (no markup escaping:
    for ``--plain`` output and for text that rich does not interpret)."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False, default=str)
    text = str(value)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escape(ch) if unsafe_char(ch) else ("\\\\" if ch == "\\" else ch)
                   for ch in text)


def safe(value: Any) -> str:
    """``value`` for a rich console: unsafe characters escaped, then rich markup escaped."""
    from rich.markup import escape

    return escape(plain(value))


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def dumps(value: Any) -> str:
    """Indented JSON for scripts; unsafe characters inside strings as ``\\u`` escapes.

    Outside strings JSON has only ASCII punctuation, digits and letters, so replacing each
    unsafe character by its escape yields the same JSON value."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if text.isprintable() or all(not unsafe_char(ch) or ch == "\n" for ch in text):
        return text
    return "".join(_json_escape(ch) if unsafe_char(ch) and ch != "\n" else ch for ch in text)
