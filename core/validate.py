"""Checks on what callers pass in, made before the store is touched: every error here is a
typed :class:`~effectgate.ConfigError` (or :class:`~effectgate.InvalidTransition` for an
outcome), and nothing has been written when one is raised."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable
from typing import NamedTuple

from .errors import ConfigError, InvalidTransition
from .redact import BLANK, UNSEEN
from .states import Outcome
from .utf8 import is_utf8

__all__ = ["MAX_INT", "MAX_LEASE_SECONDS", "MAX_TEXT", "GateOptions", "gate_options", "micros",
           "name", "parse_outcome", "seconds", "text", "whole"]

MAX_LEASE_SECONDS = 7 * 24 * 3600.0
MAX_TEXT = 2000
MAX_INT = 2**63 - 1  # what a BIGINT column holds


def text(value: object, name: str, limit: int, *, required: bool = False) -> str | None:
    """A caller's string, NFC-normalised: non-empty, valid Unicode, no NUL, at most ``limit``
    characters (None passes unless ``required``)."""
    if value is None:
        if required:
            raise ConfigError(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a str, not {type(value).__name__}")
    if not value.isascii():
        if not is_utf8(value):
            raise ConfigError(f"{name} must be valid Unicode (it has a lone surrogate)")
        value = unicodedata.normalize("NFC", value)
    if not value.strip():
        raise ConfigError(f"{name} must not be empty")
    if len(value) > limit:
        raise ConfigError(f"{name} is at most {limit} characters; this one has {len(value)}")
    if "\x00" in value:
        raise ConfigError(f"{name} must not contain NUL characters")
    return value


_CONTROL = frozenset({"Cc", "Cf", "Zl", "Zp"})  # what names were refused for before spaces
_WHAT = {"Cc": "a control character", "Cf": "an invisible format character",
         "Zl": "a line separator", "Zp": "a paragraph separator",
         "Zs": "a space other than U+0020"}


def name(value: object, what: str, limit: int, *, required: bool = False,
         stored: bool = False) -> str | None:
    """A name the store keys on (a namespace, an effect type, a group key): :func:`text`,
    refused as a key is (:func:`effectgate.keys.check_key`) when it holds a control, invisible
    format or line-breaking character, a space other than U+0020 or a character that shows as
    nothing, so that no two names look alike (``payment.refund`` and the same with a
    no-break space after it) and none can carry a separator (the vendor key's fields are
    joined by U+001F).

    ``stored``: a name to read what a store already holds under it (a read-only gate's
    namespace), which may have been written before spaces and blank characters were
    refused: only a control, format or line-breaking character is refused, as then."""
    checked = text(value, what, limit, required=required)
    if checked is None or (checked.isprintable() and checked.isascii()):
        return checked
    bad = next((ch for ch in checked if unicodedata.category(ch) in _CONTROL)
               if stored else (ch for ch in checked if ch in BLANK or (
                   ch != " " and unicodedata.category(ch) in UNSEEN)), None)
    if bad is not None:
        kind = _WHAT.get(unicodedata.category(bad), "a character that shows as nothing")
        raise ConfigError(f"{what} must be printable; it has {kind} (U+{ord(bad):04X}), "
                          "which would make look-alike names distinct")
    return checked


def whole(value: object, name: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """A caller's int (not a bool) from ``minimum`` up to ``maximum`` (by default what the
    store can hold)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name} must be from {minimum} to {maximum}, not {value}")
    return value


def micros(value: object, name: str) -> int | None:
    """A cost in micro-units (1_000_000 = $1), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int of micro-units (1_000_000 = $1)")
    if value < 0:
        raise ConfigError(f"{name} must not be negative")
    if value > MAX_INT:
        raise ConfigError(f"{name} is at most {MAX_INT} micro-units")
    return value


def seconds(value: object, name: str) -> float:
    """A lease or grace length in seconds: more than 0, at most a week."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number of seconds")
    try:
        span = float(value)
    except OverflowError:
        raise ConfigError(f"{name} is too large") from None
    if not (math.isfinite(span) and 0 < span <= MAX_LEASE_SECONDS):
        raise ConfigError(f"{name} must be more than 0 and at most {MAX_LEASE_SECONDS:.0f} "
                          "seconds")
    return span


def parse_outcome(outcome: object, allowed: tuple[Outcome, ...] = tuple(Outcome)) -> Outcome:
    """``outcome`` as an :class:`Outcome`; :class:`InvalidTransition` if it is not one."""
    parsed = None
    if type(outcome) is Outcome:
        parsed = outcome
    elif isinstance(outcome, str):
        try:
            parsed = Outcome(outcome.lower())
        except ValueError:
            parsed = None
    if parsed is None or parsed not in allowed:
        names = ", ".join(repr(o.value) for o in allowed)
        raise InvalidTransition(f"outcome must be one of {names}, not {outcome!r}")
    return parsed


class GateOptions(NamedTuple):
    """A gate's options as :func:`gate_options` checked them."""

    namespace: str
    lease_seconds: float
    max_attempts: int
    memo_size: int
    text_redactor: Callable[[str], str] | None


def gate_options(
    *, url: str | None, namespace: str, durability: str, lease_seconds: float,
    max_attempts: int, memo_size: int, read_only: bool,
    text_redactor: Callable[[str], str] | None,
) -> GateOptions:
    """``Gate()``'s options, checked before its store is opened: a bad one must neither
    create the store's file or schema nor replace the policy the store records for the
    namespace. (The gate resolves ``webhooks`` and ``telemetry``, and ``classifiers``,
    ``policy`` and ``async_pool_size`` are checked by their owners, before the store too.)"""
    # (read-only: a namespace an older effectgate let in can still be read)
    namespace = name(namespace, "namespace", 128, required=True,
                     stored=read_only is True) or "default"
    lease = seconds(lease_seconds, "lease_seconds")
    max_attempts = whole(max_attempts, "max_attempts", minimum=1)
    memo_size = whole(memo_size, "memo_size")
    if url is not None and not isinstance(url, str):
        raise ConfigError(f"url must be a str, not {type(url).__name__}")
    if durability not in ("reserve", "all", "relaxed"):  # (the store's own words)
        raise ConfigError(f"durability must be 'reserve', 'all' or 'relaxed', not {durability!r}")
    if not isinstance(read_only, bool):
        raise ConfigError(f"read_only must be a bool, not {type(read_only).__name__}")
    if text_redactor is not None and not callable(text_redactor):
        raise ConfigError("text_redactor must be a function of a str")
    return GateOptions(namespace, lease, max_attempts, memo_size, text_redactor)
