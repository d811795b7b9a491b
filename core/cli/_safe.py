"""Agent-supplied text shown to an operator: escaped so it can never drive the terminal or
be drawn as something it is not.

Keys, effect types, run and agent ids, error texts and notes come from agents and tools, and
every one of them is hostile. :func:`plain` shows them through the kernel's one rendering,
:func:`effectgate.redact.visible`: every character that is not plainly printable text — C0
and C1 controls (ESC, CSI, BEL, NEL...), DEL, line and paragraph separators, spaces other
than U+0020, and format characters (zero-width spaces, bidirectional overrides, BOM) — as a
visible ``⟨U+001B⟩``, ``⟨U+202E⟩``, the same escape the console and webhooks show. Rich markup
is escaped as well (:func:`safe`), so what rich prints is that text exactly — a backslash
included — and can be copied back into a command. :func:`dumps` is JSON whose strings carry the same
characters as ``\\uXXXX`` escapes (still the same JSON value).
"""

from __future__ import annotations

import json
from typing import Any

from ..redact import unsafe_char, visible

__all__ = ["dumps", "plain", "safe", "unsafe_char"]


def plain(value: Any) -> str:
    """``value`` as one line of text with every unsafe character shown as ``⟨U+XXXX⟩`` (no
    markup escaping: for ``--plain`` output and for text that rich does not interpret)."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False, default=str)
    return visible(value)


def safe(value: Any) -> str:
    """``value`` as rich markup that prints exactly :func:`plain` of it, wherever it goes in
    a line: alone, padded in a table cell, or followed by a tag (``f"[dim]{safe(x)}[/]"``).

    Rich reads backslashes as escapes only before a tag, so :func:`rich.markup.escape` must
    guess whether one follows a trailing backslash (it doubles a single one: shown twice in a
    cell). Here a trailing run of backslashes is doubled and closed by an empty tag of its own,
    so it always stands before a tag and each backslash prints once."""
    from rich.markup import escape

    text = plain(value)
    body = text.rstrip("\\")
    trailing = len(text) - len(body)
    return escape(body) + ("\\" * (2 * trailing) + _EMPTY_TAG if trailing else "")


_EMPTY_TAG = "[b][/b]"  # no character and no style on screen


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def dumps(value: Any) -> str:
    """Indented JSON for scripts; unsafe characters inside strings as ``\\u`` escapes.

    Outside strings JSON has only ASCII punctuation, digits, letters, spaces and line feeds,
    so replacing each unsafe character by its escape yields the same JSON value."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return "".join(_json_escape(ch) if ch != "\n" and unsafe_char(ch) else ch for ch in text)
