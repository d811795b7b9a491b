"""Whether a ``str`` can be stored as UTF-8: the one check keys, payloads, validated text and
redacted text share (a leaf module, so none of them imports another for it)."""

from __future__ import annotations

__all__ = ["is_utf8"]


def is_utf8(text: str) -> bool:
    """False when ``text`` has a lone surrogate (``"\\ud800"``, e.g. from a bad JSON escape),
    which no database can store as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
