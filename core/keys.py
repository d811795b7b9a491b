"""Effect key templates: ``"refund:{txn_id}"`` rendered from a call's bound arguments.

A field is a parameter name, optionally followed by attribute or item access
(``{order.id}``, ``{order[id]}``, ``{items[0]}``) and a format spec (``{n:05d}``).
A field must resolve to a non-empty ``str``, an ``int`` (not ``bool``), a ``uuid.UUID``, a
``datetime.date`` (not a datetime: its timezone would be a guess) or an ``Enum`` whose value is
one of those. ``None``, empty strings, floats, containers and anything else raise
:class:`~effectgate.EffectKeyError` before anything runs. Keys are NFC-normalised, at most
:data:`MAX_KEY_LENGTH` characters, and may not contain control characters.
"""

from __future__ import annotations

import datetime
import re
import string
import unicodedata
import uuid
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from .errors import EffectKeyError

__all__ = ["MAX_KEY_LENGTH", "KeyTemplate", "check_key", "is_utf8"]

MAX_KEY_LENGTH = 512
_FORMATTER = string.Formatter()
_BIG = 10**100  # an int field past this takes the careful path (and its clear errors)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def is_utf8(text: str) -> bool:
    """False when ``text`` has a lone surrogate (``"\\ud800"``, e.g. from a bad JSON escape),
    which no database can store as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_key(key: object) -> str:
    """Validate and NFC-normalise a literal key; raise :class:`EffectKeyError` if it is unusable."""
    if type(key) is not str:
        if not isinstance(key, str):
            raise EffectKeyError(f"an effect key must be a str, not {type(key).__name__}")
        key = str(key)
    if not key.isascii():
        key = unicodedata.normalize("NFC", key)
        if not is_utf8(key):
            raise EffectKeyError(
                "an effect key must be valid Unicode (it has a lone surrogate)", key=repr(key)
            )
    if not key.strip():
        raise EffectKeyError("an effect key must not be empty", key=key)
    if len(key) > MAX_KEY_LENGTH:
        raise EffectKeyError(
            f"an effect key is at most {MAX_KEY_LENGTH} characters; this one has {len(key)}",
            key=key[:80] + "…",
        )
    if _CONTROL.search(key):
        raise EffectKeyError("an effect key must not contain control characters", key=repr(key))
    return key


def _field_value(value: Any, field: str) -> str | int | datetime.date | uuid.UUID:
    if isinstance(value, Enum):
        value = value.value
    if value is None:
        raise EffectKeyError(f"key field {{{field}}} is None")
    if isinstance(value, bool):
        raise EffectKeyError(f"key field {{{field}}} is a bool; name the consequence, not a flag")
    if isinstance(value, str):
        if not value.strip():
            raise EffectKeyError(f"key field {{{field}}} is an empty string")
        return value
    if isinstance(value, (int, uuid.UUID)):
        return value
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value
    kind = type(value).__name__
    hint = " (a float is not an identity: 0.1 + 0.2 is not 0.3)" if isinstance(value, float) else ""
    raise EffectKeyError(f"key field {{{field}}} is a {kind}, which cannot name an effect{hint}")


class KeyTemplate:
    """A parsed key template. ``render(arguments)`` gives the key for one call."""

    __slots__ = ("_literal", "_parts", "fields", "roots", "template")

    def __init__(self, template: str) -> None:
        if not isinstance(template, str):
            raise EffectKeyError(f"a key template must be a str, not {type(template).__name__}")
        self.template = template
        parts: list[tuple[str, str | None, str, str | None]] = []
        try:
            parsed = list(_FORMATTER.parse(template))
        except ValueError as err:
            raise EffectKeyError(f"bad key template {template!r}: {err}") from None
        for literal, field, spec, conversion in parsed:
            if field is not None:
                if not field:
                    raise EffectKeyError(
                        f"bad key template {template!r}: positional '{{}}' fields are not "
                        "allowed; name the argument"
                    )
                if conversion is not None:
                    raise EffectKeyError(
                        f"bad key template {template!r}: conversions (!r, !s) are not allowed"
                    )
            parts.append((literal, field, spec or "", conversion))
        self._parts = tuple(parts)
        self.fields = tuple(f for _, f, _, _ in parts if f is not None)
        self.roots = frozenset(_root(f) for f in self.fields)
        # A template without fields is one key: its text with "{{" and "}}" unescaped.
        self._literal = check_key("".join(p[0] for p in parts)) if not self.fields else ""

    def check_names(self, names: Iterable[str], where: str) -> None:
        """Raise :class:`EffectKeyError` if a field's root is not among ``names``."""
        missing = sorted(self.roots - set(names))
        if missing:
            raise EffectKeyError(
                f"key template {self.template!r} names {', '.join(missing)}, "
                f"which {where} does not have"
            )

    def render(self, arguments: Mapping[str, Any]) -> str:
        """Render the key from ``arguments``; raise :class:`EffectKeyError` if it cannot."""
        if not self.fields:
            return self._literal
        out: list[str] = []
        for literal, field, spec, _ in self._parts:
            out.append(literal)
            if field is None:
                continue
            if not spec and field in arguments:  # the common case: {name} of a plain value
                raw = arguments[field]
                kind = type(raw)
                if (kind is str and raw.strip()) or (kind is int and -_BIG < raw < _BIG):
                    out.append(raw if kind is str else str(raw))
                    continue
            try:
                raw, _ = _FORMATTER.get_field(field, (), arguments)
            except (KeyError, AttributeError, IndexError, TypeError) as err:
                raise EffectKeyError(
                    f"key template {self.template!r}: cannot resolve {{{field}}} "
                    f"({type(err).__name__}: {err})"
                ) from None
            value = _field_value(raw, field)
            try:
                out.append(format(value, spec))
            except (ValueError, TypeError) as err:
                raise EffectKeyError(
                    f"key template {self.template!r}: bad format for {{{field}}}: {err}"
                ) from None
        return check_key("".join(out))

    def __repr__(self) -> str:
        return f"KeyTemplate({self.template!r})"


def _root(field: str) -> str:
    for i, ch in enumerate(field):
        if ch in ".[":
            return field[:i]
    return field
