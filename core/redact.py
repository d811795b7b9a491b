"""What text may be stored: errors, reasons and notes pass a redactor before they reach the
store, the log or a model.

The default (:func:`redact_text`) removes URL credentials, query strings and fragments — where
tokens, card numbers and API keys travel in error messages (``httpx.HTTPStatusError`` names the
whole URL) — and bounds the text. Pass ``Gate(text_redactor=...)`` to add your own rules; the
bound is applied after it either way.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any

from .utf8 import is_utf8

__all__ = [
    "BLANK", "REDACTED", "UNSEEN", "TextRedactor", "bound", "describe", "redact_fields",
    "redact_text", "redact_with",
    "unsafe_char", "visible",
]

REDACTED = "[redacted]"

TextRedactor = Callable[[str], str]
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]{1,15}://[^\s'\"<>`]+")
_LIMIT = 2000


def _clean_url(match: re.Match[str]) -> str:
    from urllib.parse import urlsplit  # with ipaddress, 4 ms of a worker's start: on first use

    raw = match.group(0)
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError:
        return "[url]"
    has_credentials = parts.username is not None or parts.password is not None
    if not (has_credentials or parts.query or parts.fragment):
        return raw  # nothing to remove: the URL as it was written (sqlite:////abs/path)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    if port is not None:
        host = f"{host}:{port}"
    if has_credentials:
        host = "[credentials]@" + host
    return (f"{parts.scheme}://{host}{parts.path}" + ("?[redacted]" if parts.query else "")
            + ("#[redacted]" if parts.fragment else ""))


def bound(text: str, limit: int = _LIMIT) -> str:
    """``text`` made storable: valid Unicode (lone surrogates escaped) and at most ``limit``
    characters (an ellipsis marks a cut)."""
    if not text.isascii() and not is_utf8(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    text = text.replace("\x00", "\\x00")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def redact_with(redactor: TextRedactor | None, text: str | None) -> str | None:
    """``text`` through the user's ``redactor`` (when given), then :func:`redact_text`. A
    redactor that raises or returns no ``str`` stores a placeholder, never what it did not
    see."""
    if text is None:
        return None
    if redactor is not None:
        try:
            mine = redactor(text)
        except Exception as err:  # never store what the user's redactor did not see
            mine = f"[redacted: the text_redactor raised {type(err).__name__}]"
        if not isinstance(mine, str):
            mine = "[redacted: the text_redactor did not return a str]"
        text = mine
    return redact_text(text)


def redact_text(text: str) -> str:
    """The default redactor: URL credentials, query strings and fragments removed, bounded."""
    if "://" in text:
        text = _URL.sub(_clean_url, text)
    return bound(text)


def redact_fields(value: Any, names: Iterable[str]) -> Any:
    """``value`` in its JSON form with every mapping entry named in ``names`` (at any depth)
    replaced by ``"[redacted]"``: the policy's ``redact_result``. That includes the entries of
    a string that is itself a JSON object or array (a tool that answers JSON as text, as MCP
    servers do beside their structured content): such a string comes back as the redacted
    JSON, re-serialised; any other string is kept as it is. :class:`PayloadError` when
    ``value`` has no JSON form."""
    from .errors import PayloadError
    from .payload import to_canonical  # payload builds on keys, as this does

    try:
        return _replace(to_canonical(value, "result"), frozenset(names))
    except PayloadError:
        raise
    except RecursionError:
        raise PayloadError("result: nested too deeply to be stored") from None
    except Exception as err:  # a 4301-digit int, a datetime out of range, a getter that raised
        raise PayloadError(f"result: its JSON form could not be made "
                           f"({type(err).__name__} raised)") from None


def _replace(value: Any, names: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: (REDACTED if k in names else _replace(v, names)) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, names) for v in value]
    if isinstance(value, str) and names and _JSON_TEXT.match(value):
        return _replace_in_json_text(value, names)
    return value


_JSON_TEXT = re.compile(r"\s*[\[{]")


def _replace_in_json_text(text: str, names: frozenset[str]) -> str:
    """``text`` with the named entries of the JSON it holds redacted (re-serialised); as it
    was when it is not JSON or has nothing to redact. Every entry of an object counts, even
    one a later duplicate name would hide from a parser."""
    named: list[bool] = []

    def entries(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if any(k in names for k, _ in pairs):
            named.append(True)
        return dict(pairs)

    try:
        parsed = json.loads(text, object_pairs_hook=entries)
    except ValueError:
        return text
    redacted = _replace(parsed, names)
    if not named and redacted == parsed:
        return text
    return json.dumps(redacted, ensure_ascii=False, indent=2 if "\n" in text else None)


def describe(exc: BaseException) -> str:
    """``"TypeName: message"`` for an exception, even one whose ``__str__`` raises (the
    outcome must still be recorded); redact before storing it."""
    try:
        text = str(exc)
    except Exception:
        text = "(its message could not be read)"
    return f"{type(exc).__name__}: {text}"


# Characters that draw nothing or move their neighbours: the Unicode categories of controls,
# format characters (bidi overrides and isolates, zero-width space and joiners, BOM, tags),
# surrogates, private use, unassigned, line and paragraph separators and spaces other than
# U+0020 (NBSP, thin, ideographic spaces); plus letters and marks that render blank.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})
BLANK = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0"  # grapheme joiner, fillers, blank braille
    + "".join(chr(c) for c in range(0xFE00, 0xFE10))  # variation selectors
    + "".join(chr(c) for c in range(0xE0100, 0xE01F0)))
"""Characters that are printable yet show as nothing: refused in keys, escaped when shown."""
UNSEEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Zs"})
"""The Unicode categories a key or a name may not hold (but U+0020): controls, format
characters, surrogates, line and paragraph separators and other spaces. (Private-use and
unassigned code points pass: which are unassigned depends on the Python's Unicode version,
and a key must mean the same on every host.)"""
_OPEN, _CLOSE = "\u27e8", "\u27e9"  # ⟨ ⟩


def unsafe_char(ch: str) -> bool:
    """True for a character that must never reach a reader raw (see :func:`visible`); the
    ASCII space is the only space that is not."""
    return ch != " " and (unicodedata.category(ch) in _HIDDEN_CATEGORIES or ch in BLANK)


def visible(text: object, *, newlines: bool = False) -> str:
    """``text`` as a person may safely read it: every character for which :func:`unsafe_char`
    is true becomes ``⟨U+XXXX⟩`` (``⟨U+202E⟩``, ``⟨U+200B⟩``, ``⟨U+000A⟩``), and a literal
    ``⟨`` becomes ``⟨U+27E8⟩``, so an escape shown is never the same as text typed to look like
    one. ``newlines=True`` keeps line feeds (a block of indented JSON). ``None`` is ``""``;
    anything else is ``str()`` first. The one rendering the console, the CLI and webhooks use
    wherever someone reads arguments, keys or other agent-supplied text."""
    if text is None:
        return ""
    if not isinstance(text, str):
        text = str(text)
    if text.isprintable() and _OPEN not in text and BLANK.isdisjoint(text):
        return text
    out = []
    for ch in text:
        if ch == "\n" and newlines:
            out.append(ch)
        elif ch == _OPEN or unsafe_char(ch):
            out.append(f"{_OPEN}U+{ord(ch):04X}{_CLOSE}")
        else:
            out.append(ch)
    return "".join(out)
