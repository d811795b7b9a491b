"""Which upstream tools write: the rule the gateway and ``mcp init`` share.

A tool is, in this order:

1. **gated** when the policy declares an effect for it (``tools = [...]`` with a ``key``);
2. a **read** when the policy's rule for this upstream lists it in ``read_only`` (a name or a
   glob), or when the tool is annotated ``readOnlyHint: true`` *and* the policy trusts this
   upstream's hints (``trust_read_only_hint = true``);
3. otherwise a **write** with no effect declared: printed once at start, refused in strict mode.

A missing annotation counts as destructive, and ``destructiveHint`` / ``idempotentHint`` never
decide anything: an idempotent write still happens twice when it is sent twice (``write_file``
of other content between two identical ones), and only the gate makes it once.
"""

from __future__ import annotations

import enum
from collections.abc import Container
from dataclasses import dataclass

import effectgate as eg

try:
    from mcp import types
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.writes needs the mcp package: pip install "effectgate[mcp]"'
    ) from err

__all__ = ["Kind", "Verdict", "classify", "hints"]


class Kind(enum.StrEnum):
    """What the gateway does with a tool."""

    GATED = "gated"
    READ = "read"
    WRITE = "write"


@dataclass(frozen=True)
class Verdict:
    """A tool's kind and why, in words for the start lines."""

    kind: Kind
    why: str


def hints(tool: types.Tool) -> str:
    """The tool's behaviour annotations, in words (``none`` when it has none)."""
    notes = tool.annotations
    if notes is None:
        return "no annotations (counts as destructive)"
    shown = [f"{name}={value}".replace("True", "true").replace("False", "false")
             for name, value in (("readOnlyHint", notes.read_only_hint),
                                 ("destructiveHint", notes.destructive_hint),
                                 ("idempotentHint", notes.idempotent_hint))
             if value is not None]
    return ", ".join(shown) or "no behaviour hints (counts as destructive)"


def classify(tool: types.Tool, gated: Container[str], rule: eg.UpstreamRule | None) -> Verdict:
    """The :class:`Verdict` for ``tool``: ``gated`` holds the names with an effect declared,
    ``rule`` is the policy's rule for this upstream (or None)."""
    if tool.name in gated:
        return Verdict(Kind.GATED, "an effect is declared")
    if rule is not None and rule.is_read_only(tool.name):
        return Verdict(Kind.READ, f"read_only in the policy for {rule.name!r}")
    says_read = tool.annotations is not None and tool.annotations.read_only_hint is True
    if says_read and rule is not None and rule.trust_read_only_hint:
        return Verdict(Kind.READ, "readOnlyHint from a trusted upstream")
    if says_read:
        return Verdict(Kind.WRITE, "readOnlyHint, but the policy does not trust this upstream's "
                                   "hints")
    return Verdict(Kind.WRITE, hints(tool))
