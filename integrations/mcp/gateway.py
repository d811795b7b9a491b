"""A gated proxy in front of an existing MCP server.

Every upstream tool is offered unchanged (name, description, schemas). A tool the policy
declares (``tools = [...]`` with a ``key`` template) is gated like a decorated function: the
key is rendered from the call's arguments before anything is sent, a repeat is answered with the
stored result, and a refusal comes back as a tool error the model can act on. The other tools
pass through, are listed on stderr at start, and are refused with ``strict``.

Outcomes: the upstream's result → COMMITTED; an upstream that cannot be reached before the call
is sent → FAILED; one that dies, disconnects or times out after it → AMBIGUOUS; a tool error
reported by the upstream → AMBIGUOUS (it may have acted), or FAILED with
``tool_errors="failed"``.

::

    effectgate mcp gateway --upstream "python my_server.py" --policy effectgate.toml
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any, Literal, TextIO

import anyio

import effectgate as eg

from .server import error_answer
from .upstream import Upstream

try:
    import jsonschema  # type: ignore[import-untyped]
    from mcp import types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.gateway needs the mcp package: pip install "effectgate[mcp]"'
    ) from err

__all__ = ["Gateway", "UpstreamToolError", "run_gateway", "tool_specs"]

log = logging.getLogger("effectgate")
_REJECTED_BEFORE_RUN = {types.PARSE_ERROR, types.INVALID_REQUEST, types.METHOD_NOT_FOUND,
                        types.INVALID_PARAMS}
_AMBIGUOUS_HINT = (
    "The upstream tool may or may not have acted; the effect is recorded as AMBIGUOUS. Do NOT "
    "call it again with these arguments: a retry is refused until a person resolves it. Tell "
    "the user this action's outcome is unknown (quote the key).")
_FAILED_HINT = "The action did not happen; calling the tool again may run it."


class UpstreamToolError(Exception):
    """The upstream answered a gated call with ``is_error``; ``result`` is its answer."""

    def __init__(self, result: types.CallToolResult) -> None:
        super().__init__(_text(result) or "the upstream tool reported an error")
        self.result = result


def tool_specs(gate: eg.Gate, effects: Any) -> dict[str, eg.EffectSpec]:
    """Tool name → :class:`~effectgate.EffectSpec`, from a policy (``tool_effects()``) or a
    mapping of tool name → an ``EffectSpec``, a policy ``EffectRule`` or a dict with ``key``,
    ``effect_type`` and other ``EffectSpec`` options."""
    if hasattr(effects, "tool_effects"):
        effects = effects.tool_effects()
    if not isinstance(effects, Mapping):
        raise eg.ConfigError("effects must be a Policy or a mapping of tool name to effect")
    specs: dict[str, eg.EffectSpec] = {}
    for tool, effect in effects.items():
        if isinstance(effect, eg.EffectSpec):
            specs[tool] = effect
        elif hasattr(effect, "effect_options"):
            specs[tool] = eg.EffectSpec(gate, effect.key, **effect.effect_options())
        elif isinstance(effect, Mapping) and "key" in effect:
            options = dict(effect)
            specs[tool] = eg.EffectSpec(gate, options.pop("key"), **options)
        else:
            raise eg.ConfigError(f"tool {tool!r}: an effect needs a key template")
    return specs


class Gateway:
    """The proxy: the upstream's tools, gated by ``specs`` (tool name → EffectSpec)."""

    def __init__(self, gate: eg.Gate, upstream: Upstream, specs: Mapping[str, eg.EffectSpec],
                 *, strict: bool = False,
                 tool_errors: Literal["ambiguous", "failed"] = "ambiguous") -> None:
        self.gate = gate
        self.upstream = upstream
        self.specs = dict(specs)
        self.strict = strict
        self.tool_errors = tool_errors
        self.tools: dict[str, types.Tool] = {}
        self._validators: dict[str, Any] = {}
        for spec in self.specs.values():
            spec.classifiers = (self._classify, *spec.classifiers)

    async def load_tools(self) -> None:
        """Read the upstream's tools; check every key template against its tool's arguments."""
        self.tools = {tool.name: tool for tool in await self.upstream.list_tools()}
        for name, spec in self.specs.items():
            tool = self.tools.get(name)
            if tool is None:
                continue
            schema = tool.input_schema
            if schema.get("additionalProperties", True) is False or "properties" in schema:
                spec.check_names(list(schema.get("properties", {})), f"upstream tool {name!r}")
            self._validators[name] = jsonschema.validators.validator_for(schema)(schema)

    @property
    def ungated(self) -> list[str]:
        """Upstream tools with no effect declared, in the upstream's order."""
        return [name for name in self.tools if name not in self.specs]

    @property
    def missing(self) -> list[str]:
        """Declared tools the upstream does not offer (a typo in the policy?)."""
        return sorted(set(self.specs) - set(self.tools))

    def server(self) -> Server[Any]:
        """The MCP server (low level: the upstream's schemas are served verbatim)."""

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=list(self.tools.values()))

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await self.call(params.name, dict(params.arguments or {}))

        info = self.upstream.server_info
        name = f"{info.name} (gated by effectgate)" if info else "effectgate-gateway"
        return Server(name, version=info.version if info else "",
                      instructions=self.upstream.instructions, on_list_tools=list_tools,
                      on_call_tool=call_tool)

    # -- one call ------------------------------------------------------------------------------

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Answer one tool call: forwarded, gated, or refused."""
        spec = self.specs.get(name)
        if name not in self.tools:
            return _error({"error": "UnknownTool", "message": f"no tool named {name!r}",
                           "what_to_do": "Call one of the listed tools."})
        if spec is None:
            if self.strict:
                return _error({"error": "UngatedTool", "message": (
                    f"tool {name!r} has no effect declared and this gateway is strict"),
                    "what_to_do": "Do not call this tool; tell the user it is not enabled."})
            return await self._forward(name, arguments)
        try:
            arguments = self._normalise(name, arguments)
        except jsonschema.ValidationError as err:
            where = "/".join(str(p) for p in err.absolute_path)
            return _error({"error": "InvalidArguments",
                           "message": f"{where}: {err.message}" if where else err.message,
                           "what_to_do": "Fix the arguments and call again; nothing ran."})
        ran: list[eg.BeginDecision] = []

        lease = spec.lease_seconds or self.gate.lease_seconds

        async def body() -> dict[str, Any]:
            ran.append(eg.current_effect())
            return await self._execute(name, arguments, lease)

        try:
            stored = await spec.arun(arguments, body)
        except UpstreamToolError as err:
            return _with_note(err.result, _FAILED_HINT if self.tool_errors == "failed"
                              else _AMBIGUOUS_HINT, ran)
        except eg.EffectGateError as err:
            return _error(error_answer(err))
        except Exception as err:
            key = ran[0].key if ran else None
            if self._classify(err) is eg.Outcome.FAILED:
                return _error({"error": "UpstreamRefused", "key": key, "message": (
                    f"the upstream refused the call before running it: {err}"),
                    "what_to_do": "Fix the call; nothing happened."})
            return _error({"error": "UpstreamLost", "key": key, "message": (
                f"the upstream failed during the call: {type(err).__name__}: {err}"),
                "what_to_do": _AMBIGUOUS_HINT})
        result = types.CallToolResult.model_validate(stored)
        meta = dict(result.meta or {})
        meta["effectgate"] = (
            {"decision": "execute", "key": ran[0].key, "effect_id": ran[0].effect_id,
             "attempt": ran[0].attempt} if ran
            else {"decision": "duplicate", "key": spec.template.render(arguments)})
        return result.model_copy(update={"meta": meta})

    def _normalise(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Schema defaults filled in (so the key and hash see what the tool sees), then the
        arguments validated against the tool's input schema."""
        for prop, schema in self.tools[name].input_schema.get("properties", {}).items():
            if prop not in arguments and isinstance(schema, Mapping) and "default" in schema:
                arguments[prop] = schema["default"]
        self._validators[name].validate(arguments)
        return arguments

    async def _execute(self, name: str, arguments: dict[str, Any],
                       lease: float) -> dict[str, Any]:
        session = await self.upstream.ready()  # NotExecuted: the call was never sent
        beat = asyncio.create_task(self._heartbeat(eg.current_effect(), lease))
        try:
            result = await session.call_tool(name, arguments)
        finally:
            beat.cancel()
        if result.is_error:
            raise UpstreamToolError(result)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)

    async def _heartbeat(self, d: eg.BeginDecision, lease: float) -> None:
        """Extend the lease while a long upstream call runs (a live call is not ambiguous)."""
        while True:
            await asyncio.sleep(lease / 3)
            try:
                await self.gate.aextend_lease(d, lease)
            except eg.EffectGateError as err:
                log.warning("could not extend the lease of %s: %s", d.key, err.message)
                return

    def _classify(self, exc: BaseException) -> eg.Outcome | None:
        if isinstance(exc, UpstreamToolError):
            return eg.Outcome.FAILED if self.tool_errors == "failed" else eg.Outcome.AMBIGUOUS
        if isinstance(exc, MCPError) and exc.code in _REJECTED_BEFORE_RUN:
            return eg.Outcome.FAILED  # the upstream answered that it did not run the call
        return None

    async def _forward(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        try:
            session = await self.upstream.ready()
            return await session.call_tool(name, arguments)
        except Exception as err:
            return _error({"error": "UpstreamLost", "message": (
                f"the upstream failed: {type(err).__name__}: {err}"),
                "what_to_do": "The upstream server is unavailable; try again later."})


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _error(answer: Mapping[str, Any]) -> types.CallToolResult:
    text = json.dumps({k: v for k, v in answer.items() if v is not None}, ensure_ascii=False,
                      default=str)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=True)


def _with_note(result: types.CallToolResult, hint: str,
               ran: list[eg.BeginDecision]) -> types.CallToolResult:
    note = {"effectgate": "the upstream tool reported an error", "what_to_do": hint,
            "key": ran[0].key if ran else None}
    content = [*result.content, types.TextContent(type="text", text=json.dumps(note))]
    return result.model_copy(update={"content": content, "is_error": True})


def run_gateway(gate: eg.Gate, upstream: str | Upstream, effects: Any, *, strict: bool = False,
                tool_errors: Literal["ambiguous", "failed"] | str = "ambiguous",
                out: TextIO | None = None) -> int:
    """Run the gateway over stdio until the client leaves; the exit status (0, or 2 when it
    could not start). Prints every ungated upstream tool on ``out`` (stderr), one per line."""
    out = out if out is not None else sys.stderr
    return anyio.run(_serve, gate, upstream, effects, strict, tool_errors, out)


async def _serve(gate: eg.Gate, upstream: str | Upstream, effects: Any, strict: bool,
                 tool_errors: str, out: TextIO) -> int:
    errors: Literal["ambiguous", "failed"] = "failed" if tool_errors == "failed" else "ambiguous"
    async with anyio.create_task_group() as tg:
        try:
            link = upstream if isinstance(upstream, Upstream) else Upstream(upstream)
            await link.start(tg)
            gw = Gateway(gate, link, tool_specs(gate, effects), strict=strict,
                         tool_errors=errors)
            await gw.load_tools()
        except (eg.EffectGateError, ConnectionError) as err:
            print(f"effectgate: error: {getattr(err, 'message', err)}", file=out, flush=True)
            tg.cancel_scope.cancel()
            return 2
        what = "refused (strict)" if strict else "ungated"
        for name in gw.ungated:
            print(f"effectgate: {what} tool, no effect declared: {name}", file=out)
        for name in gw.missing:
            print(f"effectgate: warning: the policy gates {name!r}, which the upstream does "
                  "not offer", file=out)
        out.flush()
        server = gw.server()
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
        link.close()
        tg.cancel_scope.cancel()
    return 0
