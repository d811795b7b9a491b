"""Canonical JSON and the payload hash.

The raw payload is never stored: only ``sha256(canonical_json(payload))``. The canonical form is
JSON with sorted keys and no whitespace, after these rules:

==================  ==========================================================================
``str``             as is (not normalised: a payload is the exact action)
``int``, ``bool``   as JSON numbers and ``true``/``false``; ``None`` as ``null``
``float``           finite only (NaN and infinities are refused); a float equal to an integer
                    below 2**53 is written as that integer (``500.0`` == ``500``), others by the
                    shortest repr that round-trips
``Decimal``         finite only; an integral one as that integer, others as the exact decimal
                    text in a string (``Decimal("1.10")`` -> ``"1.1"``; no float rounding)
``datetime``        timezone-aware only, as ISO 8601 in UTC (``...Z``); naive ones are refused
``date``, ``time``  ISO 8601
``bytes``           ``{"$bytes": "<base64>"}`` (the same as that mapping given as is)
``Enum``            its value
``UUID``            its string
pydantic models     their data, not their serialisation: every field of ``model_fields`` read
                    as an attribute, the computed ones and the extra ones (``extra="allow"``),
                    named as ``model_dump()`` names them, then these rules; fields left out of
                    ``model_dump()`` (``Field(exclude=True)``) and custom serializers
                    (``@field_serializer``, ``@model_serializer``) do not hide a value, for the
                    payload hash binds what the function receives. A field whose value has no
                    form here (a type of the application's) is taken as the dump makes it, or
                    left out when the dump leaves it out. A ``RootModel`` is its ``root``. A
                    result, an undo's description and an approver's view of the arguments are
                    as ``model_dump()`` makes them (the user's exclusions and serializers
                    kept), and so is any other object with a ``model_dump()`` method
dataclasses         their fields, then these rules
mappings            string keys only (``{1: x}`` and ``{"1": x}`` would collide)
lists, tuples       arrays; sets and frozensets as arrays sorted by canonical form
==================  ==========================================================================

Anything else, cycles, numbers of more than 4,300 digits and strings with lone surrogates
raise :class:`~effectgate.PayloadError` naming the path.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any

from .errors import PayloadError
from .utf8 import is_utf8

if TYPE_CHECKING:
    import decimal

__all__ = ["MAX_RESULT_DEPTH", "SHORT", "canonical_json", "payload_hash", "result_json",
           "short_sha256", "to_canonical"]

# SHA-256 of the short texts every ``begin`` hashes (its lease secret; a tool call's few
# arguments as canonical JSON, :func:`payload_hash`): CPython's own
# implementation (``_sha2`` from 3.12, ``_sha256`` before) for a short text, else OpenSSL's
# (``hashlib.sha256``). The digest is the same. For a few dozen bytes the built-in one skips
# OpenSSL's per-call set-up, which, right after a store write has left the caches cold, costs
# several times the hashing itself; for longer texts OpenSSL's vectorised code is faster.
SHORT = 128
"""The longest text (in bytes) to hash with :data:`short_sha256`."""
short_sha256: Callable[[bytes], Any]
try:
    from _sha2 import sha256 as short_sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
except ImportError:  # before 3.12
    try:
        from _sha256 import sha256 as short_sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
    except ImportError:  # a Python built without it
        short_sha256 = hashlib.sha256

_EXACT_FLOAT_LIMIT = 2**53
_MAX_DIGITS = 4300  # Python's own limit for int <-> str conversion
_dumps = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


def _float(value: float, path: str) -> int | float:
    if not math.isfinite(value):
        raise PayloadError(f"{path}: {value!r} has no canonical JSON form")
    if value.is_integer() and abs(value) < _EXACT_FLOAT_LIMIT:
        return int(value)
    return value


def instance_of(value: Any, module: str, name: str) -> bool:
    """Whether ``value`` is an instance of ``module.name``, without importing ``module``: no
    instance of its classes can exist before it is imported (so ``import effectgate`` need not
    import ``uuid`` or ``decimal``; the code that makes a UUID or a Decimal has)."""
    found = sys.modules.get(module)
    return found is not None and isinstance(value, getattr(found, name))


def _decimal(value: decimal.Decimal, path: str) -> int | str:
    import decimal

    if not value.is_finite():
        raise PayloadError(f"{path}: Decimal {value} has no canonical JSON form")
    # Normalise exactly: the default context would round to 28 digits, and two different
    # amounts would share one canonical form.
    digits = len(value.as_tuple().digits)
    exact = decimal.Context(prec=digits, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
    value = value.normalize(exact)
    exponent = int(value.as_tuple().exponent)
    if max(exponent, -exponent) > _MAX_DIGITS:  # written out, it would be absurdly long
        raise PayloadError(f"{path}: Decimal {value} is too large or too precise to be written")
    if exponent >= 0:
        return int(value)
    return format(value, "f")


def model_data(value: Any, path: str = "payload") -> Any:
    """What a pydantic (v2) model is made canonical from in a payload: a ``RootModel`` its
    ``root``; any other its fields (each read as an attribute), its computed fields and its
    extra fields, named as its ``model_dump()`` names them. A field whose value has no
    canonical form of its own (a type of the application's, a lock) is taken as the dump
    makes it (its serializer's output), or left out when the dump leaves it out. So an
    ordinary model, and one whose serializers only make such values plain, is what it was; a
    field the dump hides or disguises is in it. :data:`_NOT_PYDANTIC` for a value whose class
    has no ``model_fields`` (an object with a ``model_dump()`` of its own)."""
    cls = type(value)
    fields = getattr(cls, "model_fields", None)
    if not isinstance(fields, dict):
        return _NOT_PYDANTIC
    if getattr(cls, "__pydantic_root_model__", False) is True:
        return value.root
    config = getattr(cls, "model_config", None)
    by_alias = isinstance(config, dict) and bool(config.get("serialize_by_alias"))
    decorators = getattr(cls, "__pydantic_decorators__", None)
    served = decorators is not None and bool(getattr(decorators, "field_serializers", None) or
                                              getattr(decorators, "model_serializers", None))
    data: dict[str, Any] = {}
    dumped: Any = None  # the model's own dump (a model serializer's: any value), made once
    for name, info in fields.items():
        field_value = getattr(value, name)
        named = _dumped_name(name, info) if by_alias else name
        if not _has_form(field_value) or (served and _holds_formless(field_value)):
            if dumped is None:
                dumped = value.model_dump()
            if isinstance(dumped, dict) and named in dumped:
                field_value = dumped[named]
            elif getattr(info, "exclude", None) is True:
                continue  # excluded, and nothing of it could be written: as the dump had it
            else:  # reshaped by the model's own serializer: all that it shows of it
                field_value = dumped
        _put(data, named, field_value, path)
    computed = getattr(cls, "model_computed_fields", None)
    for name, info in (computed.items() if isinstance(computed, dict) else ()):
        _put(data, _dumped_name(name, info) if by_alias else name, getattr(value, name), path)
    extra = getattr(value, "__pydantic_extra__", None)
    if extra:
        for name, item in extra.items():
            if name in data:
                raise PayloadError(f"{path}: extra field {name!r} has the name of a field")
            data[name] = item
    return data


def _put(data: dict[str, Any], named: str, value: Any, path: str) -> None:
    """``data[named] = value``; :class:`PayloadError` when two of a model's fields (a field,
    a computed field) are named alike in its dump, and one would hide the other from the
    hash."""
    if named in data:
        raise PayloadError(f"{path}: two of its fields are named {named!r} in its dump")
    data[named] = value


def _holds_formless(value: Any, seen: frozenset[int] = frozenset()) -> bool:
    """Whether a list, tuple, set or mapping holds, at any depth, a value with no canonical
    form of its own (a field serializer may make it plain)."""
    if len(seen) > MAX_RESULT_DEPTH or id(value) in seen:
        return False  # (too deep, or a cycle: to_canonical says so)
    if isinstance(value, Mapping):
        items: Any = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return False
    inner = seen | {id(value)}
    return any(not _has_form(v) or _holds_formless(v, inner) for v in items)


def _dumped_name(name: str, info: Any) -> str:
    """A field's name in a dump by alias."""
    alias = getattr(info, "serialization_alias", None) or getattr(info, "alias", None)
    return alias if isinstance(alias, str) else name


_FORMED = (str, int, float, Enum, Mapping, list, tuple, set, frozenset, datetime.date,
           datetime.time, bytes, bytearray, memoryview)


def _has_form(value: Any) -> bool:
    """Whether :func:`to_canonical` has a rule for ``value``'s kind (not whether every part
    of it is well formed: that is for the rule to say)."""
    return value is None or isinstance(value, _FORMED) or instance_of(
        value, "decimal", "Decimal") or instance_of(value, "uuid", "UUID") or callable(
        getattr(value, "model_dump", None)) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type))


_NOT_PYDANTIC: Any = object()


def to_canonical(value: Any, path: str = "payload", _seen: frozenset[int] = frozenset(), *,
                 fields: bool = False) -> Any:
    """Turn ``value`` into plain JSON types by the rules above; raise :class:`PayloadError`.
    ``fields``: a pydantic model by its data (a payload, what its hash is of), not by its
    ``model_dump()`` (a result, as it is stored)."""
    # The common cases first: this runs on every gated call.
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is float:
        return _float(value, path)
    if isinstance(value, Enum):
        return to_canonical(value.value, path, _seen, fields=fields)
    if isinstance(value, (str, int)):  # subclasses of str / int: their own text or number,
        # not what an overridden __str__ or __int__ says (a masked card's "****")
        return str.__str__(value) if isinstance(value, str) else int.__int__(value)
    if isinstance(value, float):
        return _float(float(value), path)
    ident = id(value)
    if ident in _seen:
        raise PayloadError(f"{path}: the payload contains a cycle")
    seen = _seen | {ident}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise PayloadError(
                    f"{path}: mapping keys must be str; {k!r} is a {type(k).__name__}"
                )
            out[k] = to_canonical(v, f"{path}.{k}", seen, fields=fields)
        return out
    if isinstance(value, (list, tuple)):
        return [to_canonical(v, f"{path}[{i}]", seen, fields=fields) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = [to_canonical(v, f"{path}{{}}", seen, fields=fields) for v in value]
        return sorted(items, key=_dumps)
    if instance_of(value, "decimal", "Decimal"):
        return _decimal(value, path)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise PayloadError(f"{path}: a naive datetime is ambiguous; give it a timezone")
        utc = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return utc.isoformat() + "Z"
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if instance_of(value, "uuid", "UUID"):
        return str(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        data = model_data(value, path) if fields else _NOT_PYDANTIC
        return to_canonical(dump() if data is _NOT_PYDANTIC else data, path, seen, fields=fields)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        named = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return to_canonical(named, path, seen, fields=fields)
    raise PayloadError(f"{path}: a {type(value).__name__} has no canonical JSON form")


def _raised(err: Exception) -> str:
    """What a caller's code that raised is called in an error: its type (never its text,
    which may hold the values being stored)."""
    return f"{type(err).__name__} raised"


def canonical_json(value: Any, path: str = "payload", *, as_dumped: bool = False) -> str:
    """The canonical JSON text of ``value``. ``as_dumped``: a pydantic model as its
    ``model_dump()`` makes it, not by its data (what the ``sha256`` key filter digests: a key
    must not move when effectgate is upgraded, or a repeat would run again)."""
    try:
        text = _dumps(to_canonical(value, path, fields=not as_dumped))
    except PayloadError:
        raise
    except RecursionError:
        raise PayloadError(f"{path}: nested too deeply to be made canonical") from None
    except (ValueError, OverflowError) as err:  # a 4301-digit int; a datetime out of range
        raise PayloadError(f"{path}: {err}") from None
    except Exception as err:  # a model_dump() or a field getter of the caller's that raised
        raise PayloadError(f"{path}: its JSON form could not be made ({_raised(err)})") from None
    if not text.isascii() and not is_utf8(text):
        raise PayloadError(_SURROGATE.format(path))
    return text


_FLAT = frozenset((str, int, bool, type(None)))
_KEYS = frozenset((str,))


def _flat_encoder(fallback: Any, *, sort_keys: bool) -> Any:
    """``fallback`` (an encoder's ``encode``) for a flat dict of plain values, with the same
    output: the C encoder itself, without the per-call set-up of ``encode`` (there is no
    container to recurse into, so no circular check to set up)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # a Python without the _json accelerator
        return fallback
    encode = make(None, None, json.encoder.encode_basestring, None, ":", ",", sort_keys,
                  False, False)
    return lambda flat: "".join(encode(flat, 0))


def _is_flat(value: Any) -> bool:
    """A dict of str keys to str, int, bool or None values: canonical JSON as it stands."""
    if type(value) is not dict:
        return False
    if len(value) <= 4:  # a tool call's few arguments: a plain loop is the cheapest check
        for name, item in value.items():
            if type(name) is not str or type(item) not in _FLAT:
                return False
        return True
    return _FLAT.issuperset(map(type, value.values())) and _KEYS.issuperset(map(type, value))


_dumps_flat = _flat_encoder(_dumps, sort_keys=True)
_SURROGATE = "{}: a str with a lone surrogate is not valid Unicode and has no JSON form"


def payload_hash(payload: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of a payload, which must be a mapping."""
    if _is_flat(payload):  # the common tool call: flat, plain values; already canonical
        try:
            text = _dumps_flat(payload)
        except ValueError as err:  # an int of more than 4300 digits
            raise PayloadError(f"payload: {err}") from None
    elif not isinstance(payload, Mapping):
        raise PayloadError(
            f"a payload is the action's parameters by name: a mapping, not {type(payload).__name__}"
        )
    else:
        text = canonical_json(payload)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadError(_SURROGATE.format("payload")) from None
    return (short_sha256 if len(data) <= SHORT else hashlib.sha256)(data).hexdigest()


_encode_result = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"),
    default=lambda v: to_canonical(v, "result"),
).encode


_encode_flat_result = _flat_encoder(_encode_result, sort_keys=False)


def result_json(result: Any) -> str | None:
    """A result as JSON text (None stays None); :class:`PayloadError` if it has no JSON form."""
    if result is None:
        return None
    try:
        text = _encode_flat_result(result) if _is_flat(result) else _encode_result(result)
    except PayloadError:
        raise
    except (ValueError, TypeError, RecursionError, OverflowError) as err:
        raise PayloadError(f"the result cannot be stored as JSON: {err}") from None
    except Exception as err:  # its model_dump() or a field getter raised: the caller's code
        raise PayloadError(f"the result cannot be stored as JSON ({_raised(err)})") from None
    if not text.isascii() and not is_utf8(text):
        raise PayloadError(_SURROGATE.format("result"))
    if text.count("[") + text.count("{") > MAX_RESULT_DEPTH and (
            _depth(text) > MAX_RESULT_DEPTH):
        raise PayloadError(f"the result is nested more than {MAX_RESULT_DEPTH} deep; it could "
                           "be stored but not read back everywhere")
    return text


MAX_RESULT_DEPTH = 200
"""How deep a stored result may nest: what every reader (a duplicate's ``json.loads``, a
database's JSON functions) reads back without recursing out."""


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def _depth(text: str) -> int:
    """The nesting depth of JSON ``text`` (brackets inside strings not counted): its strings
    cut out in one regular-expression pass, then its brackets counted."""
    depth = deepest = 0
    for ch in _BRACKET.findall(_JSON_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest
