"""What the gateway stores of an upstream's answer to a gated call, with the policy's
``redact_result`` applied to what the answer carries rather than to its envelope.

An MCP tool result (``CallToolResult`` as JSON) holds its data twice: ``structuredContent``,
and — as the specification asks of a server, for clients that read only text — a text
content block with the same JSON. Redacting field names over the whole result would miss the
second (it is a string) and would break the first's envelope if a field were named ``type`` or
``text``. So, for each name in ``redact_result``:

- ``structuredContent`` and ``_meta`` have the field replaced at any depth;
- a text block (or an embedded resource's text) that is JSON has it replaced inside that JSON
  (:func:`effectgate.redact.redact_fields` reads a JSON string as JSON);
- a text block that is not a JSON object or array, in a result whose structured content had a
  field redacted, may still spell that field's value out, and nothing can tell: it is stored
  as the redacted structured content's JSON instead.

Every other part of the result (images, audio, links) is stored as it came. The caller that
ran the call gets the upstream's answer as it was; only the stored copy, and so every repeat,
is redacted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from effectgate.redact import redact_fields

__all__ = ["stored_result"]


def stored_result(result: Any, names: Iterable[str]) -> Any:
    """``result`` (a ``CallToolResult`` as JSON) as it is stored: the fields named in
    ``names`` redacted in what it carries (see the module's docstring). Anything that is not
    a result object is redacted as any stored result is."""
    names = tuple(names)
    if not isinstance(result, dict) or not isinstance(result.get("content", []), list):
        return redact_fields(result, names)
    out = dict(result)
    for part in ("structuredContent", "_meta"):
        if part in out:
            out[part] = redact_fields(out[part], names)
    structured = out.get("structuredContent")
    changed = structured != result.get("structuredContent")
    out["content"] = [_block(block, names, structured if changed else None)
                      for block in result.get("content", [])]
    return out


def _block(block: Any, names: tuple[str, ...], redacted_structure: Any) -> Any:
    if not isinstance(block, dict):
        return redact_fields(block, names)
    out = dict(block)
    if "_meta" in out:
        out["_meta"] = redact_fields(out["_meta"], names)
    if out.get("type") == "text" and isinstance(out.get("text"), str):
        text = out["text"]
        out["text"] = redact_fields(text, names)
        if redacted_structure is not None and out["text"] == text and not _is_structure(text):
            out["text"] = json.dumps(redacted_structure, ensure_ascii=False, indent=2)
    elif out.get("type") == "resource" and isinstance(out.get("resource"), dict):
        resource = dict(out["resource"])
        if isinstance(resource.get("text"), str):
            resource["text"] = redact_fields(resource["text"], names)
        out["resource"] = resource
    return out


def _is_structure(text: str) -> bool:
    """True when ``text`` is a JSON object or array (a bare number or string could be the
    redacted value itself)."""
    try:
        return isinstance(json.loads(text), (dict, list))
    except (ValueError, RecursionError):
        return False
