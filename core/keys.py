"""Effect key templates: ``"refund:{txn_id}"`` rendered from a call's bound arguments.

A field is a parameter name, optionally followed by attribute or item access
(``{order.id}``, ``{order[id]}``, ``{items[0]}``) and a format spec (``{n:05d}``).
Attributes are plain names (no ``_`` prefix, so no dunders: ``{order.__class__}`` is refused
when the template is parsed, in code and in policy files alike) and a step may never land on a
module, a class or anything callable: a template reads the call's data, it cannot walk into the
program (``{order.__init__.__globals__[...]}``) or call anything. A field must resolve to a
non-empty ``str``, an ``int`` (not ``bool``), a ``uuid.UUID``, a
``datetime.date`` (not a datetime: its timezone would be a guess) or an ``Enum`` whose value is
one of those. ``None``, empty strings, floats, containers and anything else raise
:class:`~effectgate.EffectKeyError` before anything runs. Keys are NFC-normalised, at most
:data:`MAX_KEY_LENGTH` characters, and printable: control characters, line and paragraph
separators (U+2028, U+2029, U+0085), invisible format characters (zero-width space,
bidirectional overrides, BOM) and spaces other than U+0020 are refused, so no character that
shows as nothing makes two keys that look alike distinct. What shows is the key as written:
a leading or trailing space is part of it (the ``strip`` filter below drops it from a field),
and full-width or other compatibility forms are characters of their own (NFC, not NFKC: text
in a key stays as its language writes it; ``lower``, ``casefold`` or a filter of your own
merge more). (Unassigned and private-use code points pass: which code points are assigned
depends on the Python's Unicode version, and a key must mean the same on every host.)

**Reserved:** keys starting ``compensate:`` (:data:`UNDO_PREFIX`) are the undos' of saga
steps (:func:`compensation_key`); any other effect begun at one is refused
(:class:`~effectgate.EffectKeyError`), so no effect takes a step's one undo key.

**Filters** turn a large or messy argument into a key part: ``{field|filter}``, chained left to
right (``{path|path|sha256}``), before the format spec (``{content|sha256:.16}``):

- ``sha256``: the SHA-256 hex digest (64 characters) of the value: a ``str`` as its exact UTF-8
  bytes (not normalised: other bytes are other content), ``bytes`` as they are, anything else
  (a container, a number) as its canonical JSON. ``"write:{path}:{content|sha256}"`` keys a
  write of any size. An empty string has a digest; ``None`` and a bare ``bool`` do not.
- ``path``: a POSIX path with only the spellings that name one file merged: ``fs/./a.txt``,
  ``fs//a.txt`` and ``./fs/a.txt`` are all ``fs/a.txt``. ``..`` is kept as written
  (``fs/b/../a.txt`` is ``fs/a.txt`` only when ``fs/b`` is not a symlink, which only the
  filesystem knows), and so is a trailing ``/`` after a name (``fs/a/``: on a symlink it
  names the directory, not the link). It never touches the filesystem (relative stays
  relative), so the key is the same on every host, and the normalised path names the same
  file as the caller's. Register your own (e.g. one that resolves against a root) for more.
- ``lower``: lower-cased, as :meth:`str.lower` (``Alice@Example.com`` and
  ``alice@example.com`` are one key; ``STRASSE`` and ``Straße`` are not).
- ``casefold``: case-folded, as :meth:`str.casefold`, for caseless matching: ``ß`` becomes
  ``ss``, so ``Straße`` and ``STRASSE`` are one key.
- ``strip``: surrounding whitespace removed.

:func:`register_filter` adds your own; a filter is a function of the field's value that returns
a ``str`` or ``int`` (then checked like any field). :meth:`KeyTemplate.normalise` applies the
normalising filters (``path``, ``lower``, ``casefold``, ``strip``, and yours registered with
``normalises=True``) to the arguments themselves, for the payload hash; the MCP gateway sends
the upstream those normalised arguments, so what was keyed, hashed and approved is what runs.
An unknown filter is an :class:`~effectgate.EffectKeyError` when the template is parsed (at
decoration, at policy load), never at the first call, so register filters before declaring
the effects that use them.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import string
import types
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, EffectKeyError
from .payload import canonical_json, instance_of
from .redact import BLANK, UNSEEN
from .utf8 import is_utf8

if TYPE_CHECKING:
    from uuid import UUID

__all__ = ["MAX_KEY_LENGTH", "UNDO_PREFIX", "KeyTemplate", "check_key", "compensation_key",
           "effect_key_template", "filter_names", "is_utf8", "legacy_compensation_key",
           "lookup_key", "register_filter"]

MAX_KEY_LENGTH = 512
_FORMATTER = string.Formatter()
_BIG = 10**100  # an int field past this takes the careful path (and its clear errors)


_ATTRIBUTE = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_MAX_WALK = 8  # attribute and item steps in one field
_OWN_FORMAT = frozenset({"builtins", "datetime", "uuid"})  # a format error's text: ours to show


def lookup_key(key: object) -> str:
    """:func:`check_key` for a key to find, report on or resolve rather than make: a key
    holding a character that prints as nothing (refused in new keys, once accepted) may name an
    effect stored before that, which must stay readable, reportable and resolvable."""
    return check_key(key, refuse_blank=False)


def check_key(key: object, *, refuse_blank: bool = True) -> str:
    """Validate and NFC-normalise a literal key; raise :class:`EffectKeyError` if it is
    unusable (``refuse_blank=False``: see :func:`lookup_key`)."""
    if type(key) is not str:
        if not isinstance(key, str):
            raise EffectKeyError(f"an effect key must be a str, not {type(key).__name__}")
        key = str.__str__(key)  # its text, never what a subclass's __str__ makes of it
    if not key.isascii():
        key = unicodedata.normalize("NFC", key)
        if not is_utf8(key):
            raise EffectKeyError(
                "an effect key must be valid Unicode (it has a lone surrogate)", key=repr(key)
            )
        blank = next((ch for ch in key if ch in BLANK), None) if refuse_blank else None
        if blank is not None:
            raise EffectKeyError(
                f"an effect key must be printable; it has a character that shows as nothing "
                f"(U+{ord(blank):04X}), which would make look-alike keys distinct",
                key=repr(key), reason="a blank character")
    if not key.strip():
        raise EffectKeyError("an effect key must not be empty", key=key)
    if len(key) > MAX_KEY_LENGTH:
        raise EffectKeyError(
            f"an effect key is at most {MAX_KEY_LENGTH} characters; this one has {len(key)}",
            key=key[:80] + "…",
        )
    if not key.isprintable():
        bad = next((ch for ch in key if ch != " " and unicodedata.category(ch) in UNSEEN), "")
        if not bad:  # unassigned or private-use code points only: accepted (they are visible,
            return key  # and which are unassigned depends on this Python's Unicode version)
        kind = unicodedata.category(bad)
        what = {"Cc": "a control character", "Cf": "an invisible format character",
                "Zl": "a line separator", "Zp": "a paragraph separator",
                "Zs": "a space other than U+0020"}.get(kind, "a character that is not printable")
        raise EffectKeyError(
            f"an effect key must be printable; it has {what} (U+{ord(bad):04X}), which would "
            "make look-alike keys distinct or break a record", key=repr(key), reason=what)
    return key


UNDO_PREFIX = "compensate:"
"""The start of every undo's key (:func:`compensation_key`), reserved: only an undo (a begin
with ``compensates_effect_id``) may have a key that starts with it."""


def compensation_key(key: str) -> str:
    """The key of ``key``'s undo: ``compensate:<key>``, or ``compensate:sha256:<digest of
    key>`` when that would be too long or ``key`` itself starts with ``sha256:`` (so no step
    key spells another step's hashed undo key: one undo key per step)."""
    if len(key) <= MAX_KEY_LENGTH - len(UNDO_PREFIX) and not key.startswith("sha256:"):
        return UNDO_PREFIX + key
    return UNDO_PREFIX + "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def legacy_compensation_key(key: str) -> str | None:
    """The undo key an older effectgate gave a step keyed ``sha256:…`` (short enough for
    ``compensate:<key>``), where an undo begun then still is; None for any other key (its undo
    key did not change). Such an effect is the step's undo only if it compensates that step,
    with the undo's type (:func:`effectgate.sagas.unwind` checks both)."""
    if key.startswith("sha256:") and len(key) <= MAX_KEY_LENGTH - len(UNDO_PREFIX):
        return UNDO_PREFIX + key
    return None


def reserved_key(key: str) -> EffectKeyError:
    """The error for an effect that is not an undo at ``key`` (which starts with
    :data:`UNDO_PREFIX`): it would take a step's one undo key, and that step's undo would be
    refused at every unwind."""
    return EffectKeyError(
        f"effect key {key[:80]!r} starts with {UNDO_PREFIX!r}, which is reserved for undos "
        "(an effect begun with compensates_effect_id, of type '<step type>.compensate', at "
        "its step's compensation_key): choose another key", key=key[:80],
        reason="reserved prefix")


def effect_key_template(template: str) -> KeyTemplate:
    """:class:`KeyTemplate` of an effect's key (not a group's): refused
    (:class:`EffectKeyError`) when its literal start already is the reserved
    :data:`UNDO_PREFIX`, so every key it rendered would be refused at ``begin``."""
    parsed = KeyTemplate(template)
    if parsed.prefix.startswith(UNDO_PREFIX):
        raise reserved_key(parsed.prefix)
    return parsed


def _field_value(value: Any, field: str) -> str | int | datetime.date | UUID:
    if isinstance(value, Enum):
        value = value.value
    if value is None:
        raise EffectKeyError(f"key field {{{field}}} is None")
    if isinstance(value, bool):
        raise EffectKeyError(f"key field {{{field}}} is a bool; name the consequence, not a flag")
    if isinstance(value, str):
        text: str = str.__str__(value)  # a subclass's own text, not its __str__ / __format__
        if not text.strip():
            raise EffectKeyError(f"key field {{{field}}} is an empty string")
        return text
    if isinstance(value, int):
        return int.__int__(value)  # likewise
    if instance_of(value, "uuid", "UUID"):
        return value  # type: ignore[no-any-return]
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value
    kind = type(value).__name__
    hint = " (a float is not an identity: 0.1 + 0.2 is not 0.3)" if isinstance(value, float) else ""
    raise EffectKeyError(f"key field {{{field}}} is a {kind}, which cannot name an effect{hint}")


KeyFilter = Callable[[Any], Any]
_FILTER_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def _sha256(value: Any) -> str:
    if value is None or isinstance(value, bool):
        raise ValueError(f"a {type(value).__name__} has no content to digest")
    if isinstance(value, str):
        if not is_utf8(value):
            raise ValueError("the str has a lone surrogate (not valid Unicode)")
        data = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        data = canonical_json(value, "value", as_dumped=True).encode("utf-8")  # (as it was)
    return hashlib.sha256(data).hexdigest()


def _path(value: Any) -> str:
    """Only the spellings that name one file whatever the filesystem holds become one: ``.``
    components and repeated ``/`` go, ``..`` stays (``b/../a`` is ``a`` only if ``b`` is not
    a symlink), and so does one trailing ``/`` after a name (on a symlink to a directory it
    means the directory, not the link). ``/..`` is ``/``: the root has no symlink above it."""
    if not isinstance(value, str):
        raise ValueError(f"a path is a str, not {type(value).__name__}")
    if not value.strip():
        raise ValueError("the path is empty")
    absolute = value.startswith("/")
    parts: list[str] = []
    for part in value.split("/"):
        if part in ("", "."):
            continue
        if part == ".." and absolute and not parts:
            continue  # the root's parent is the root
        parts.append(part)
    last = value.rstrip("/").rsplit("/", 1)[-1]
    directory = value.endswith("/") or last == "."
    if not parts:
        return "/" if absolute else "."
    tail = "/" if directory and parts[-1] != ".." else ""
    return ("/" if absolute else "") + "/".join(parts) + tail


def _text(method: str) -> KeyFilter:
    def apply(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{method} applies to a str, not {type(value).__name__}")
        return str(getattr(value, method)())

    return apply


_FILTERS: dict[str, KeyFilter] = {
    "casefold": _text("casefold"), "lower": _text("lower"), "path": _path, "sha256": _sha256,
    "strip": _text("strip"),
}
_NORMALISERS = {"casefold", "lower", "path", "strip"}


def register_filter(name: str, func: KeyFilter, *, normalises: bool = False,
                    replace: bool = False) -> None:
    """Make ``{field|name}`` available in key templates: ``func(value)`` returns the key part
    (a ``str`` or ``int``; raise ``ValueError`` or ``TypeError`` to refuse a value, which
    becomes an :class:`~effectgate.EffectKeyError` before anything runs).

    ``normalises=True`` says the filter maps spellings of one value to one spelling (as
    ``path``, ``lower``, ``casefold`` and ``strip`` do), so :meth:`KeyTemplate.normalise`
    applies it to the argument itself and two spellings are one payload, not only one key.
    Merge only spellings that mean the same thing to the tool: a decorated body still
    receives the caller's spelling, and the MCP gateway sends the upstream the normalised one;
    the filter must give its own output back unchanged. Replacing an existing filter changes
    the keys of effects already recorded, so it needs ``replace=True``; templates parsed
    before keep the filter they were parsed with."""
    if not isinstance(name, str) or not _FILTER_NAME.match(name):
        raise ConfigError(f"a key filter name is lower-case letters, digits and _, not {name!r}")
    if not callable(func):
        raise ConfigError(f"key filter {name!r} must be callable, not {type(func).__name__}")
    if name in _FILTERS and not replace:
        raise ConfigError(f"key filter {name!r} exists; pass replace=True to replace it "
                          "(the keys of recorded effects change with it)")
    _FILTERS[name] = func
    if normalises:
        _NORMALISERS.add(name)
    else:
        _NORMALISERS.discard(name)


def filter_names() -> list[str]:
    """The key filters available to templates, sorted."""
    return sorted(_FILTERS)


def _split_filters(template: str, field: str) -> tuple[str, tuple[tuple[str, KeyFilter], ...]]:
    name, *names = field.split("|")
    if not name:
        raise EffectKeyError(
            f"bad key template {template!r}: positional '{{}}' fields are not allowed; name the "
            "argument"
        )
    found = []
    for raw in names:
        filter_name = raw.strip()
        func = _FILTERS.get(filter_name)
        if func is None:
            raise EffectKeyError(
                f"bad key template {template!r}: unknown filter {raw!r} in {{{field}}}; known: "
                + ", ".join(filter_names()), reason="unknown filter")
        found.append((filter_name, func))
    return name, tuple(found)


def _normalising_prefix(
        filters: tuple[tuple[str, KeyFilter], ...]) -> tuple[tuple[str, KeyFilter], ...]:
    for i, (name, _) in enumerate(filters):
        if name not in _NORMALISERS:
            return filters[:i]
    return filters


def _filtered(template: str, field: str, value: Any,
              filters: tuple[tuple[str, KeyFilter], ...]) -> Any:
    for name, func in filters:
        try:
            value = func(value)
        except EffectKeyError:
            raise
        except Exception as err:
            raise EffectKeyError(
                f"key template {template!r}: filter {name!r} refused {{{field}}}: {err}"
            ) from None
    return value


class KeyTemplate:
    """A parsed key template. ``render(arguments)`` gives the key for one call.

    ``fields`` are the field expressions without their filters (``{content|sha256}`` gives
    ``content``); ``roots`` the argument names they start from."""

    __slots__ = ("_literal", "_normalisers", "_one", "_parts", "_walks", "fields",
                 "normalises", "prefix", "roots", "template")

    def __init__(self, template: str) -> None:
        if not isinstance(template, str):
            raise EffectKeyError(f"a key template must be a str, not {type(template).__name__}")
        self.template = template
        parts: list[tuple[str, str | None, str, tuple[tuple[str, KeyFilter], ...]]] = []
        walks: list[tuple[str, tuple[tuple[bool, Any], ...]] | None] = []
        try:
            parsed = list(_FORMATTER.parse(template))
        except ValueError as err:
            raise EffectKeyError(f"bad key template {template!r}: {err}") from None
        for literal, field, spec, conversion in parsed:
            filters: tuple[tuple[str, KeyFilter], ...] = ()
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
                if "|" in field:
                    field, filters = _split_filters(template, field)
                root, steps = _walk_of(template, field)
                walks.append((root, tuple(steps)))
            else:
                walks.append(None)
            parts.append((literal, field, spec or "", filters))
        self._parts = tuple(parts)
        self._walks = tuple(walks)
        self.fields = tuple(f for _, f, _, _ in parts if f is not None)
        normal: dict[str, tuple[tuple[str, KeyFilter], ...]] = {}
        for _, field, _, filters in parts:
            prefix = _normalising_prefix(filters)
            if field is not None and prefix and field == _root(field):
                normal.setdefault(field, prefix)
        self._normalisers = normal
        self.normalises = bool(normal)
        """Whether :meth:`normalise` changes anything (else it hands the arguments back)."""
        self.roots = frozenset(_root(f) for f in self.fields)
        # A template without fields is one key: its text with "{{" and "}}" unescaped.
        self._literal = check_key("".join(p[0] for p in parts)) if not self.fields else ""
        self.prefix = _literal_start(parts)
        """The text every key it renders starts with (its literal start, NFC)."""
        # The common template, text around one plain {name}: (prefix, name, suffix).
        self._one: tuple[str, str, str] | None = None
        if len(self.fields) == 1:
            at = next(i for i, part in enumerate(parts) if part[1] is not None)
            _, name, spec, filters = parts[at]
            if name is not None and not spec and not filters and name == _root(name):
                self._one = ("".join(p[0] for p in parts[:at + 1]), name,
                             "".join(p[0] for p in parts[at + 1:]))

    def check_names(self, names: Iterable[str], where: str) -> None:
        """Raise :class:`EffectKeyError` if a field's root is not among ``names``."""
        missing = sorted(self.roots - set(names))
        if missing:
            raise EffectKeyError(
                f"key template {self.template!r} names {', '.join(missing)}, "
                f"which {where} does not have"
            )

    def normalise(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """``arguments`` with each field that the template normalises (``{path|path}``, and
        the normalising start of a chain such as ``{path|path|sha256}``) replaced by its
        normalised value: what the payload hash should see, so that ``fs/./a.txt`` and
        ``fs/a.txt`` are one effect, not one key with two payloads. The same mapping when
        there is nothing to normalise; :class:`EffectKeyError` when a value is refused."""
        if not self._normalisers:
            return arguments
        out = dict(arguments)
        for field, filters in self._normalisers.items():
            if field in out:
                out[field] = _filtered(self.template, field, out[field], filters)
        return out

    def render(self, arguments: Mapping[str, Any]) -> str:
        """Render the key from ``arguments``; raise :class:`EffectKeyError` if it cannot."""
        if not self.fields:
            return self._literal
        one = self._one
        if one is not None and one[1] in arguments:
            prefix, name, suffix = one
            raw = arguments[name]
            kind = type(raw)
            if (kind is str and raw.strip()) or (kind is int and -_BIG < raw < _BIG):
                key = prefix + (raw if kind is str else str(raw)) + suffix
                if key.isascii() and key.isprintable() and len(key) <= MAX_KEY_LENGTH:
                    return key  # what check_key would answer: nothing to normalise or refuse
                return check_key(key)
        out: list[str] = []
        for (literal, field, spec, filters), walk in zip(self._parts, self._walks, strict=True):
            out.append(literal)
            if field is None:
                continue
            if not spec and not filters and field in arguments:  # the common case: {name}
                raw = arguments[field]
                kind = type(raw)
                if (kind is str and raw.strip()) or (kind is int and -_BIG < raw < _BIG):
                    out.append(raw if kind is str else str(raw))
                    continue
            assert walk is not None
            try:  # (free while nothing raises) the caller's objects' own code runs here
                raw = _resolve(self.template, field, walk, arguments)
                if filters:
                    raw = _filtered(self.template, field, raw, filters)
                value = _field_value(raw, field)
                try:
                    text = format(value, spec)
                except (ValueError, TypeError) as err:  # the spec does not fit the value
                    said = f": {err}" if type(value).__module__ in _OWN_FORMAT else (
                        f" ({type(err).__name__})")  # a __format__ of theirs: its type only
                    raise EffectKeyError(
                        f"key template {self.template!r}: bad format for {{{field}}}{said}"
                    ) from None
            except EffectKeyError:
                raise
            except Exception as err:  # an Enum's value, a __format__, a __class__ of theirs
                raise EffectKeyError(  # its type only: its text may hold anything
                    f"key template {self.template!r}: reading {{{field}}} raised "
                    f"{type(err).__name__}", reason="the argument's own code raised") from None
            out.append(text)
        return check_key("".join(out))

    def __repr__(self) -> str:
        return f"KeyTemplate({self.template!r})"


def _literal_start(parts: Iterable[tuple[str, str | None, str, Any]]) -> str:
    """The text before a template's first field (all of it when it has none), NFC."""
    start = []
    for literal, field, _, _ in parts:
        start.append(literal)
        if field is not None:
            break
    return unicodedata.normalize("NFC", "".join(start))


def _walk_of(template: str, field: str) -> tuple[str, list[tuple[bool, Any]]]:
    """The root name and the (is attribute, name or index) steps of ``field``; an
    :class:`EffectKeyError` for anything but plain attribute names and item indexes."""
    root, steps = _split_field(template, field)
    if not isinstance(root, str) or not root or not root.isprintable():
        raise EffectKeyError(
            f"bad key template {template!r}: {{{field}}} must start with an argument name")
    if len(steps) > _MAX_WALK:
        raise EffectKeyError(
            f"bad key template {template!r}: {{{field}}} has more than {_MAX_WALK} steps")
    for is_attribute, name in steps:
        if is_attribute and not _ATTRIBUTE.match(name):
            raise EffectKeyError(
                f"bad key template {template!r}: {{{field}}}: attribute {name!r} is not "
                "allowed (plain names only: no _private or __dunder__ attributes)",
                reason="attribute not allowed")
        if not is_attribute and isinstance(name, str) and (
                not name or len(name) > 128 or not name.isprintable()):
            raise EffectKeyError(
                f"bad key template {template!r}: {{{field}}}: bad item index {name!r}")
    return root, steps


def _split_field(template: str, field: str) -> tuple[str, list[tuple[bool, Any]]]:
    """``name.attr[item][0]`` as ``name`` and its steps, read as ``str.format`` reads them
    (an all-digit item is an int index)."""
    cut = min((i for i in (field.find("."), field.find("[")) if i >= 0), default=len(field))
    root, rest = field[:cut], field[cut:]
    steps: list[tuple[bool, Any]] = []
    while rest:
        if rest[0] == ".":
            end = min((i for i in (rest.find(".", 1), rest.find("[", 1)) if i >= 0),
                      default=len(rest))
            name = rest[1:end]
            if not name:
                raise EffectKeyError(f"bad key template {template!r}: {{{field}}}: empty "
                                     "attribute")
            steps.append((True, name))
            rest = rest[end:]
        elif rest[0] == "[":
            end = rest.find("]")
            if end < 0:
                raise EffectKeyError(f"bad key template {template!r}: {{{field}}}: missing ']'")
            item = rest[1:end]
            if not item:
                raise EffectKeyError(f"bad key template {template!r}: {{{field}}}: empty "
                                     "item")
            steps.append((False, int(item) if item.isdigit() and item.isascii() else item))
            rest = rest[end + 1:]
        else:
            raise EffectKeyError(f"bad key template {template!r}: {{{field}}}: only '.' or "
                                 "'[' may follow an item")
    return root, steps


def _walkable(value: Any) -> bool:
    """False for what a template must never step onto: modules, classes, functions, methods
    and any other callable (a template reads data; it never calls or walks the program)."""
    if isinstance(value, (str, int, float, bool, type(None), Mapping, list, tuple)):
        return True
    return not (callable(value) or isinstance(value, (types.ModuleType, type)))


def _resolve(template: str, field: str, walk: tuple[str, tuple[tuple[bool, Any], ...]],
             arguments: Mapping[str, Any]) -> Any:
    """The value of ``field`` (``name``, ``name.attr``, ``name[item]``...) in ``arguments``:
    items of mappings and sequences, plain attributes of data objects; nothing else."""
    root, steps = walk

    def refuse(why: str) -> EffectKeyError:
        return EffectKeyError(f"key template {template!r}: cannot resolve {{{field}}} ({why})")

    if root not in arguments:
        raise refuse(f"no argument {root!r}")
    value = arguments[root]
    for is_attribute, name in steps:
        if not _walkable(value):
            raise refuse(f"it steps onto a {type(value).__name__}, which a key cannot read")
        try:
            value = getattr(value, name) if is_attribute else value[name]
        except (KeyError, AttributeError, IndexError, TypeError) as err:
            raise refuse(f"{type(err).__name__}: {err}") from None
        except Exception as err:  # a property or __getitem__ of the caller's that raised
            raise refuse(f"{type(err).__name__} while reading {name!r}") from None
    if not _walkable(value):
        raise refuse(f"it is a {type(value).__name__}, which a key cannot read")
    return value


def _root(field: str) -> str:
    for i, ch in enumerate(field):
        if ch in ".[":
            return field[:i]
    return field
