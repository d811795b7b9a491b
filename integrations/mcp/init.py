"""``effectgate mcp init``: a starter policy for an MCP server, for a human to review.

It connects to the upstream the way the gateway does, lists its tools and writes:

- ``strict = true`` (a tool the server adds later is refused until someone decides about it);
- ``[upstreams.NAME]`` with the ``command`` (or ``url``) it was given — what the gateway matches
  the rule to, never the name a server reports — and ``read_only = [...]``: every tool the
  server annotates ``readOnlyHint: true``, listed by name, so a tool the server marks
  read-only later is not trusted silently;
- one ``[effects."NAME.TOOL"]`` per other tool, with a proposed key template over its
  identifying required parameters: path-like ones through ``|path``, names and ids as they
  are, integers as they are, everything else (free text such as ``content``, arrays, objects,
  numbers) through ``|sha256`` so the key stays short whatever the size of the argument.
  Booleans and optional parameters are left out (they are still in the payload hash, so a
  repeat that differs in them is refused as a mismatch, never run twice); a comment says so,
  and says where no key could be guessed.

The result loads as a :class:`~effectgate.Policy` (checked before it is written); an existing
file is never overwritten without ``force``.
"""

from __future__ import annotations

import datetime
import re
import textwrap
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

import effectgate as eg

from .upstream import ALL_CAPABILITIES, StartupPeer, Upstream, _describe, redacted

try:
    from mcp import types
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.init needs the mcp package: pip install "effectgate[mcp]"'
    ) from err

__all__ = ["KeyProposal", "propose_key", "render_policy", "write_policy"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PATHLIKE = re.compile(r"(path|file|dir|directory|folder|source|destination|dest|src)s?\Z",
                       re.IGNORECASE)
_IDLIKE = re.compile(r"(id|ids|key|name|slug|email|to|from|url|uri|ref|branch|repo|owner|"
                     r"user|username|account|channel|number|tag|sku|code)\Z", re.IGNORECASE)


@dataclass
class KeyProposal:
    """A proposed key template for one tool, and what a reviewer should know about it."""

    template: str
    notes: list[str] = field(default_factory=list)


def _type_of(schema: Any) -> str:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else "unknown"


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[_\W]+", spaced) if w]


def _literal(text: str) -> str:
    """``text`` as the literal part of a key template (braces doubled, no control chars)."""
    clean = "".join(ch if ch.isprintable() else "_" for ch in text)
    return clean.replace("{", "{{").replace("}", "}}")


def propose_key(tool: types.Tool) -> KeyProposal:
    """A key template over ``tool``'s identifying required parameters."""
    schema: Mapping[str, Any] = tool.input_schema if isinstance(tool.input_schema, Mapping) \
        else {}
    raw_props = schema.get("properties")
    props: Mapping[str, Any] = raw_props if isinstance(raw_props, Mapping) else {}
    raw_required = schema.get("required")
    required = [r for r in raw_required if isinstance(r, str)] \
        if isinstance(raw_required, list) else []
    parts, notes, left_out = [_literal(tool.name)], [], []
    for name in required:
        if not _NAME.match(name):
            notes.append(f"parameter {name!r} cannot be named in a key template")
            continue
        kind = _type_of(props.get(name))
        words = {w.lower() for w in _words(name)}
        last = _words(name)[-1] if _words(name) else name
        if kind == "boolean":
            left_out.append(name)
        elif kind == "string" and _PATHLIKE.search(last):
            parts.append(f"{{{name}|path}}")
        elif kind == "integer" or (kind == "string" and (_IDLIKE.match(last) or "id" in words)):
            parts.append(f"{{{name}}}")
        else:
            parts.append(f"{{{name}|sha256}}")
    optional = sorted(k for k in props if isinstance(k, str) and k not in required)
    if left_out:
        notes.append(f"left out (flags): {', '.join(left_out)}")
    if optional:
        notes.append(f"optional parameters left out of the key: {', '.join(optional)}. A "
                     "repeat that differs only in them is refused as a mismatch, not run again; "
                     "add those that make it another action.")
    if len(parts) == 1:
        notes.append("REVIEW: no required parameter to key on; as written, this tool runs at "
                     "most once ever (add the arguments that name one call)")
    return KeyProposal(":".join(parts), notes)


def _toml_string(text: str) -> str:
    """A TOML basic string (escapes every control character; no lone surrogates)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\uFFFD")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _comment(text: str, limit: int = 96) -> str:
    clean = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")
    return slug or "mcp"


def render_policy(tools: Iterable[types.Tool], *, server: str, version: str = "",
                  source: str = "", upstream: str | None = None) -> str:
    """The starter policy's TOML text (checked: it loads as a Policy). ``upstream`` is the
    command line or URL the tools were listed from: the ``[upstreams]`` entry is bound to it
    (a URL without credentials, query or fragment)."""
    tools = list(tools)
    reads = [t for t in tools if t.annotations is not None and t.annotations.read_only_hint]
    writes = [t for t in tools if t not in reads]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    lines = [
        f"# effectgate policy for the MCP server {_comment(server)} {_comment(version)}".rstrip(),
        f"# written by `effectgate mcp init` on {when}"
        + (f" from {_comment(source, 60)}" if source else "") + ".",
        "# REVIEW IT BEFORE USE. Every tool below that is not read_only is gated: a call whose",
        "# key was recorded is answered from the store instead of running again. Check that each",
        "# key names one consequence: the same key means the same action (two calls to write the",
        "# same content to the same path are one effect, even with another write in between).",
        "",
        "# A tool not listed here (e.g. one the server adds later) is refused.",
        "strict = true",
        "",
        f"[upstreams.{_toml_string(server)}]",
        *_bound_to(upstream),
        "# tools the server annotates readOnlyHint: true; they pass without a reservation",
        "read_only = [" + ("" if reads else "]"),
    ]
    lines += [f"    {_toml_string(t.name)},  # {_comment(t.description or '', 60)}".rstrip(" #")
              for t in reads]
    if reads:
        lines.append("]")
    lines += ["# true would also pass any tool the server marks read-only later, unreviewed",
              "trust_read_only_hint = false"]
    seen: set[str] = set()
    for tool in writes:
        effect = f"{_slug(server)[:60]}.{_slug(tool.name)[:120]}"  # types are <= 200 chars
        base, n = effect, 1
        while effect in seen:
            n += 1
            effect = f"{base}_{n}"
        seen.add(effect)
        proposal = propose_key(tool)
        notes = tool.annotations
        hinted = "no annotations (counts as destructive)" if notes is None else ", ".join(
            f"{k}={str(v).lower()}" for k, v in (("destructiveHint", notes.destructive_hint),
                                                 ("idempotentHint", notes.idempotent_hint))
            if v is not None) or "no behaviour hints (counts as destructive)"
        lines += ["", f"# {_comment(tool.name, 60)}: {_comment(tool.description or '', 80)}",
                  f"# {hinted}; idempotentHint never skips the gate"]
        lines += [f"# {line}" for note in proposal.notes
                  for line in textwrap.wrap(_comment(note, 400), 94)]
        lines += [f"[effects.{_toml_string(effect)}]",
                  f"key = {_toml_string(proposal.template)}",
                  f"tools = [{_toml_string(tool.name)}]"]
    text = "\n".join(lines) + "\n"
    eg.Policy.from_dict(tomllib.loads(text), source="the generated policy", text=text)
    return text


def _bound_to(upstream: str | None) -> list[str]:
    """The lines that bind the ``[upstreams]`` entry to the server it was written from."""
    if upstream is None:
        return []
    target = upstream.strip()
    kind = "url" if target.startswith(("http://", "https://")) else "command"
    return ["# this rule applies to this upstream only (a server's own name proves nothing);",
            "# a gateway started with another command or URL does not trust it",
            f"{kind} = {_toml_string(redacted(target))}"]


async def _list(target: str) -> tuple[list[types.Tool], types.Implementation | None]:
    upstream = Upstream(target, capabilities=ALL_CAPABILITIES, peer=StartupPeer())
    found: list[tuple[list[types.Tool], types.Implementation | None]] = []
    try:
        async with anyio.create_task_group() as tg:
            try:
                await upstream.start(tg)
                found.append((await upstream.list_tools(), upstream.server_info))
            finally:
                await upstream.aclose()
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise _first(group) from None
    except Exception as err:
        raise ConnectionError(f"cannot list the upstream's tools: {_describe(err)}") from err
    return found[0]


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    """The error inside an exception group that says what went wrong."""
    err: BaseException = group
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    if isinstance(err, (ConnectionError, eg.EffectGateError)):
        return err
    return ConnectionError(f"cannot list the upstream's tools: {_describe(err)}")


def write_policy(target: str, path: str | Path, *, force: bool = False,
                 upstream_name: str | None = None) -> tuple[Path, str]:
    """Connect to the upstream ``target``, write its starter policy to ``path`` and return
    (path, text). :class:`~effectgate.ConfigError` if ``path`` exists (without ``force``) or
    the upstream cannot be reached."""
    path = Path(path)
    if path.exists() and not force:
        raise eg.ConfigError(f"{path} exists; pass --force to overwrite it")
    if path.exists() and not path.is_file():
        raise eg.ConfigError(f"{path} is not a file")
    try:
        tools, info = anyio.run(_list, target)
    except ConnectionError as err:
        raise eg.ConfigError(str(err)) from None
    name = upstream_name or (info.name if info else "") or "mcp"
    text = render_policy(tools, server=name, version=info.version if info else "",
                         source=redacted(target), upstream=target)
    mode = "w" if force else "x"
    try:
        with path.open(mode, encoding="utf-8") as out:
            out.write(text)
    except FileExistsError:
        raise eg.ConfigError(f"{path} exists; pass --force to overwrite it") from None
    except OSError as err:
        raise eg.ConfigError(f"cannot write {path}: {err.strerror}") from None
    return path, text
