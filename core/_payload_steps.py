"""Canonical JSON and the payload hash by steps, for async callers (:mod:`effectgate.payload`).

Making JSON of a large value takes time in proportion to its size (a megabyte: tens of
milliseconds of pure Python), and an event loop must not be held that long. A small value (the
common tool call, the common result) is made JSON at once, as ever; a large one is made by
steps of bounded work (a small part handed to :mod:`~effectgate.payload` whole, a long string a
slice at a time), and the loop runs other tasks between them. The text, the hash and every error are
those of :func:`payload_hash` and :func:`result_json`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import time
from collections.abc import Callable, Generator, Mapping
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from .errors import PayloadError
from .payload import (
    _KEYS,
    _NOT_PYDANTIC,
    _SURROGATE,
    MAX_RESULT_DEPTH,
    _depth,
    _dumps,
    _encode_result,
    _raised,
    instance_of,
    model_data,
    payload_hash,
    result_json,
    to_canonical,
)
from .utf8 import is_utf8

__all__ = ["INLINE_CHARS", "INLINE_NODES", "apayload_hash", "aresult_json", "is_small"]

INLINE_NODES = 500
"""The most values (containers, keys, items, scalars) a value may hold to be made JSON at once
on an event loop."""
INLINE_CHARS = 32_768
"""The most characters of text (and bytes) a value may hold to be made JSON at once on an event
loop; a longer string is encoded a slice of this many characters at a time."""
_DEEPEST = min(64, MAX_RESULT_DEPTH)
"""The deepest a value is made by steps. A deeper one (rare) is made at once, by the at-once
function itself: where recursion runs out (and the error it then raises) is its own, and the
steps' generators nest otherwise; a result deeper than :data:`MAX_RESULT_DEPTH` is refused
there."""
_SLICE_SECONDS = 0.0005  # work done between two returns to the event loop
_LEAVES = frozenset((int, float, bool, type(None)))
_NATIVE = (str, int, float, list, tuple, dict)  # what the JSON encoder writes without default=
_SCALAR = (Enum, str, int, float)  # to_canonical's rules before its cycle check and mappings
_CONVERTED = (str, int, float, Enum, Mapping, list, tuple, set, frozenset, datetime.date,
              datetime.time, bytes, bytearray, memoryview)  # to_canonical's rules before models
_escape = json.encoder.encode_basestring
T = TypeVar("T")
Steps = Generator[None, None, T]
"""Work done in bounded steps: each ``yield`` is a point where the event loop may run."""


def is_small(value: Any) -> bool:
    """Whether ``value`` holds at most :data:`INLINE_NODES` values and :data:`INLINE_CHARS`
    characters, so that making its JSON takes well under a millisecond. A walk that stops as
    soon as either is passed (its own cost is bounded too); a value of a type it does not know,
    and a model (its ``model_dump`` is made on the way by steps), counts as large."""
    nodes, chars = INLINE_NODES, INLINE_CHARS
    stack = [value]
    while stack:
        item = stack.pop()
        nodes -= 1
        t = type(item)
        if t is str:
            chars -= len(item)
        elif t is dict:
            if 2 * len(item) > nodes:
                return False
            stack.extend(item)
            stack.extend(item.values())
        elif t is list or t is tuple or t is set or t is frozenset:
            if len(item) > nodes:
                return False
            stack.extend(item)
        elif t not in _LEAVES:
            try:
                size = _leaf_size(item, stack)
            except Exception:  # a released memoryview: the at-once functions raise their error
                return False
            if size < 0:
                return False
            chars -= size
        if nodes < 0 or chars < 0:
            return False
    return True


def _leaf_size(item: Any, stack: list[Any]) -> int:
    """For :func:`is_small`: the characters ``item``, of a less common type, stands for (its
    parts pushed on ``stack`` when it has any); -1 for a type it does not know."""
    if isinstance(item, (str, bytes, bytearray, memoryview)):
        return len(item)
    if isinstance(item, Enum):
        stack.append(item.value)
        return 0
    if isinstance(item, (int, float, datetime.date, datetime.time)) or instance_of(
            item, "decimal", "Decimal") or instance_of(item, "uuid", "UUID"):
        return 0
    if dataclasses.is_dataclass(item) and not hasattr(type(item), "model_dump"):
        try:
            stack.extend(vars(item).values())
        except TypeError:
            return -1
        return 0
    return -1  # a model among them: what its model_dump makes (extra fields, computed ones,
    # a serializer of its own) is known only once it has been made


class _TooDeep(Exception):
    """The value nests deeper than :data:`_DEEPEST`: it is made at once instead."""


def _check_depth(level: int, piece: str) -> None:
    """Raise :class:`_TooDeep` when the JSON ``piece``, written at ``level``, nests deeper than
    :data:`_DEEPEST` (its depth worked out only when its brackets could take it there)."""
    if level + piece.count("[") + piece.count("{") > _DEEPEST and (
            level + _depth(piece) > _DEEPEST):
        raise _TooDeep


class _Text:
    """JSON text made a piece at a time, never deeper than :data:`_DEEPEST`
    (:class:`_TooDeep`)."""

    __slots__ = ("level", "pieces")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.level = 0

    def value(self, piece: str) -> None:
        """Add the JSON of a whole value, at the current level."""
        _check_depth(self.level, piece)
        self.pieces.append(piece)

    def open(self, bracket: str) -> None:
        """Start an array or an object."""
        if self.level >= _DEEPEST:
            raise _TooDeep
        self.pieces.append(bracket)
        self.level += 1

    def close(self, bracket: str) -> None:
        """End the array or object last opened."""
        self.pieces.append(bracket)
        self.level -= 1


def _fields_source(value: Any, path: str, *, fields: bool) -> Callable[[], Any] | None:
    """What :func:`to_canonical` makes a model or a dataclass from (a pydantic model's data
    when ``fields``, else its ``model_dump``; a dataclass's fields), or None for a value of any
    other type."""
    if isinstance(value, _CONVERTED) or instance_of(value, "decimal", "Decimal") or (
            instance_of(value, "uuid", "UUID")):
        return None
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        if fields:
            return lambda: _model_source(value, path, dump)
        return dump  # type: ignore[no-any-return]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return lambda: {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return None


def _model_source(value: Any, path: str, dump: Callable[[], Any]) -> Any:
    """A model's data (:func:`~effectgate.payload.model_data`), or its ``model_dump()`` when
    it is not a pydantic model."""
    data = model_data(value, path)
    return dump() if data is _NOT_PYDANTIC else data


class _Part(NamedTuple):
    """A large part of a value made canonical by steps: an object (``items``: key and part),
    an array (``items``: its parts) or a long string (``text``). A small part is its JSON
    text already; an error its encoder raised is kept (:class:`_Failed`) to be raised where
    the encoder would have met it. Only these few nodes stay alive while the text is made,
    never a canonical copy of the whole value (the garbage collector's pauses grow with the
    objects alive)."""

    bracket: str
    items: list[Any]
    text: str = ""


class _Failed(NamedTuple):
    """An error the encoder raised on a small part, raised when the text reaches it."""

    error: Exception


def _canonical_steps(value: Any, path: str, seen: frozenset[int],
                     encode: Callable[[Any], str], level: int, fields: bool) -> Steps[Any]:
    """:func:`to_canonical` by steps, each small part written by ``encode`` at once: a large
    mapping, list, tuple, model or dataclass is taken apart here (its parts in the same order,
    with the same paths and checks), anything else handed to :func:`to_canonical` whole.
    Its JSON text, a :class:`_Part` or a :class:`_Failed`; :class:`_TooDeep` past
    :data:`_DEEPEST` (``level``: how deep ``value`` sits; ``fields``: a pydantic model by its
    data, for a payload, not by its ``model_dump()``, for a result)."""
    t = type(value)
    if t is str and len(value) > INLINE_CHARS:
        yield
        return _Part('"', [], value)
    if t is not str and t not in _LEAVES and not isinstance(value, _SCALAR) and (
            not is_small(value)):
        if isinstance(value, (Mapping, list, tuple)):
            return (yield from _container_steps(value, path, seen, encode, level, fields))
        source = _fields_source(value, path, fields=fields)
        if source is not None:
            if level >= _DEEPEST:
                raise _TooDeep
            if id(value) in seen:
                raise PayloadError(f"{path}: the payload contains a cycle")
            data = source()
            yield
            return (yield from _canonical_steps(data, path, seen | {id(value)}, encode,
                                                level + 1, fields))
    canonical = to_canonical(value, path, seen, fields=fields)
    yield
    try:
        piece = encode(canonical)
    except RecursionError:
        raise
    except Exception as err:  # raised when the text reaches it, as the encoder would
        return _Failed(err)
    _check_depth(level, piece)
    return piece


def _container_steps(value: Mapping[Any, Any] | list[Any] | tuple[Any, ...], path: str,
                     seen: frozenset[int], encode: Callable[[Any], str],
                     level: int, fields: bool) -> Steps[_Part]:
    """:func:`_canonical_steps` of a large mapping, list or tuple: an item at a time."""
    if level >= _DEEPEST:
        raise _TooDeep
    ident = id(value)
    if ident in seen:
        raise PayloadError(f"{path}: the payload contains a cycle")
    inner = seen | {ident}
    if not isinstance(value, Mapping):
        parts = []
        for i, item in enumerate(list(value)):
            parts.append((yield from _canonical_steps(item, f"{path}[{i}]", inner, encode,
                                                      level + 1, fields)))
        return _Part("[", parts)
    named = []
    for k, item in list(value.items()):
        if not isinstance(k, str):
            raise PayloadError(
                f"{path}: mapping keys must be str; {k!r} is a {type(k).__name__}")
        named.append((k, (yield from _canonical_steps(item, f"{path}.{k}", inner, encode,
                                                      level + 1, fields))))
    return _Part("{", named)


def _written_steps(part: Any, text: _Text, *, sort: bool) -> Steps[None]:
    """Add the JSON of ``part`` (from :func:`_canonical_steps`) to ``text`` by steps, an
    object's entries sorted by key when ``sort``."""
    if type(part) is str:
        text.value(part)
    elif isinstance(part, _Failed):
        raise part.error
    elif part.bracket == '"':
        yield from _long_string_steps(part.text, text)
    elif part.bracket == "[":
        text.open("[")
        for at, item in enumerate(part.items):
            if at:
                text.pieces.append(",")
            yield from _written_steps(item, text, sort=sort)
        text.close("]")
    else:
        text.open("{")
        for at, (k, item) in enumerate(sorted(part.items, key=_first) if sort else part.items):
            text.pieces.append(("," if at else "") + _escape(k) + ":")
            yield from _written_steps(item, text, sort=sort)
        text.close("}")
    yield


def _long_string_steps(value: str, text: _Text) -> Steps[None]:
    """Add a long string's JSON to ``text`` a slice at a time (the same escapes)."""
    text.pieces.append('"')
    for at in range(0, len(value), INLINE_CHARS):
        text.pieces.append(_escape(value[at:at + INLINE_CHARS])[1:-1])
        yield
    text.pieces.append('"')


def _first(item: tuple[str, Any]) -> str:
    return item[0]


def _json_steps(value: Any, text: _Text, markers: set[int]) -> Steps[None]:
    """Add ``value``'s JSON, as :func:`result_json` writes it, to ``text`` by steps: a long
    string a slice at a time, a large list, tuple (or a subclass: the encoder iterates it) or
    dict of str keys an item at a time (``markers``: the containers being written, as the
    encoder's own cycle check), a large model, dataclass or other mapping made canonical by
    steps (the encoder's ``default`` would make it canonical whole), anything else by the
    encoder at once."""
    t = type(value)
    if t is str and len(value) > INLINE_CHARS:
        yield from _long_string_steps(value, text)
        return
    if isinstance(value, (list, tuple, dict)) and not is_small(value):
        entries = _str_entries(value) if isinstance(value, dict) else value
        if entries is not None:
            yield from _container_json_steps(value, entries, text, markers)
            return
    if value is not None and not isinstance(value, _NATIVE) and not is_small(value):
        part = yield from _canonical_steps(value, "result", frozenset(), _encode_result,
                                           text.level, False)
        yield from _written_steps(part, text, sort=False)
        return
    text.value(_encode_result(value))
    yield


def _str_entries(value: dict[Any, Any]) -> list[tuple[str, Any]] | None:
    """A dict's entries as the encoder reads them (a subclass's ``items()``) when every key is
    a str, which it writes as it is; None for any other (made at once)."""
    if type(value) is dict:
        return list(value.items()) if _KEYS.issuperset(map(type, value)) else None
    entries = list(value.items())
    for entry in entries:
        if type(entry) is not tuple or len(entry) != 2 or type(entry[0]) is not str:
            return None
    return entries


def _container_json_steps(value: Any, entries: Any, text: _Text, markers: set[int],
                          ) -> Steps[None]:
    """:func:`_json_steps` of a large list or tuple (``entries``: the value itself), or of a
    dict (``entries``: its key and value pairs, every key a str): an item at a time."""
    ident = id(value)
    if ident in markers:
        raise ValueError("Circular reference detected")
    markers.add(ident)
    if isinstance(value, dict):
        text.open("{")
        for at, (k, item) in enumerate(entries):
            text.pieces.append(("," if at else "") + _escape(k) + ":")
            yield from _json_steps(item, text, markers)
        text.close("}")
    else:
        text.open("[")
        for at, item in enumerate(list(entries)):
            if at:
                text.pieces.append(",")
            yield from _json_steps(item, text, markers)
        text.close("]")
    markers.discard(ident)


def _hash_steps(payload: Mapping[str, Any]) -> Steps[str]:
    """:func:`payload_hash` of a mapping, by steps."""
    text = _Text()
    try:
        part = yield from _canonical_steps(payload, "payload", frozenset(), _dumps, 0, True)
        yield from _written_steps(part, text, sort=True)
    except (PayloadError, _TooDeep, RecursionError):
        raise
    except (ValueError, OverflowError) as err:
        raise PayloadError(f"payload: {err}") from None
    except Exception as err:
        raise PayloadError(f"payload: its JSON form could not be made ({_raised(err)})"
                           ) from None
    digest = hashlib.sha256()
    for piece in text.pieces:
        try:
            digest.update(piece.encode("utf-8"))
        except UnicodeEncodeError:
            raise PayloadError(_SURROGATE.format("payload")) from None
        yield
    return digest.hexdigest()


def _result_steps(result: Any) -> Steps[str]:
    """:func:`result_json` of a result that is not None, by steps."""
    text = _Text()
    try:
        yield from _json_steps(result, text, set())
    except (PayloadError, _TooDeep, RecursionError):
        raise
    except (ValueError, TypeError, OverflowError) as err:
        raise PayloadError(f"the result cannot be stored as JSON: {err}") from None
    except Exception as err:
        raise PayloadError(f"the result cannot be stored as JSON ({_raised(err)})") from None
    for piece in text.pieces:
        if not piece.isascii() and not is_utf8(piece):
            raise PayloadError(_SURROGATE.format("result"))
        yield
    return "".join(text.pieces)  # never deeper than _DEEPEST: within MAX_RESULT_DEPTH


async def _run_by_steps(steps: Steps[T]) -> T:
    """Run ``steps`` on the running event loop, letting other tasks run after each half
    millisecond of work."""
    import asyncio

    clock = time.perf_counter
    due = clock() + _SLICE_SECONDS
    try:
        while True:
            next(steps)
            if clock() >= due:
                await asyncio.sleep(0)
                due = clock() + _SLICE_SECONDS
    except StopIteration as stop:
        done: T = stop.value
        return done


async def apayload_hash(payload: Any) -> str:
    """:func:`payload_hash` for an async caller: the same hash (or error), never holding the
    event loop more than a fraction of a millisecond at a time (:func:`is_small` values, and
    those nested deeper than :data:`_DEEPEST`, at once)."""
    if not isinstance(payload, Mapping) or is_small(payload):
        return payload_hash(payload)
    try:
        return await _run_by_steps(_hash_steps(payload))
    except (_TooDeep, RecursionError):
        return payload_hash(payload)


async def aresult_json(result: Any) -> str | None:
    """:func:`result_json` for an async caller: the same text (or error), never holding the
    event loop more than a fraction of a millisecond at a time (:func:`is_small` values, and
    those nested deeper than :data:`_DEEPEST`, at once)."""
    if result is None or is_small(result):
        return result_json(result)
    try:
        return await _run_by_steps(_result_steps(result))
    except (_TooDeep, RecursionError):
        return result_json(result)
