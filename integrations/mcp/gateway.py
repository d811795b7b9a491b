"""A gated proxy in front of an existing MCP server.

Every capability of the upstream passes through: its tools (name, description, schemas,
annotations, unchanged), resources (list, read, templates, subscriptions), prompts,
completions, logging, progress, cancellation and list-changed notifications. Each client gets
its own upstream session that declares the client's own capabilities (roots, sampling,
elicitation), so the upstream's requests for roots, a sampled message or an elicitation reach
that client, and the upstream offers it the tools it would offer it directly.

Tools (see :mod:`.writes`): a tool the policy declares (``tools = [...]`` with a ``key``) is
gated like a decorated function: the key is rendered from the call's arguments before anything
is sent, the upstream receives the arguments as keyed, hashed and approved (normalised by the
template's filters), a repeat is answered with the stored result (``redact_result`` applied to
its structured content and to the text that carries it, :mod:`.results`), and a refusal comes
back as a tool error the model can act on, naming no tool but this one. A read (the policy's
``read_only``, or a trusted ``readOnlyHint``) passes. Every other tool is a write with no effect
declared: listed on stderr at start and refused with ``strict``.

Which ``[upstreams]`` rule applies, and the scope every gated key begins with, come from the
upstream's identity as configured — its command line or URL — never from the name the server
reports (:mod:`.identity`).

Outcomes of a gated call: the upstream's result → COMMITTED; an upstream that cannot be reached
before the call is sent, or a call cancelled before it left → FAILED; an upstream that answers
the call "method not found" (``-32601``) without having asked the client anything during it →
FAILED; any other error answer (``-32602`` included: the arguments were validated against the
tool's input schema before sending, and an SDK server answers a tool's own validation error
so), an upstream that dies, disconnects, times out or sends what cannot be read after the call
left, or a client that cancels it then → AMBIGUOUS; a tool error reported by the upstream →
AMBIGUOUS (it may have acted), or FAILED with ``tool_errors="failed"``. A repeat of an
identical call in flight (a twin) gets the answer the store would give it.

No request the gateway sends upstream for a client waits longer than ``call_timeout_seconds``
(default :data:`DEFAULT_CALL_TIMEOUT_SECONDS`; None: no limit), the MCP SDK's own per-request
timeout (``request_read_timeout_seconds``): the SDK then cancels the request the MCP way
(``notifications/cancelled``; on 2026-07-28 streamable HTTP, the closed response stream) and
the client is answered ``UpstreamTimeout``. A gated call cut so is AMBIGUOUS, never
FAILED (the upstream may have acted before the cancellation reached it): a retry is refused
until an operator or a reconcile hook resolves it. The limit counts the whole call, progress
notifications and the upstream's own questions to the client (a person answering an
elicitation) included. A call an upstream runs as its own task (:mod:`.upstream_tasks`) may
take longer: the limit bounds the call until the upstream answers it with the task, and each
``tasks/get`` after it (one unanswered ends the call AMBIGUOUS), not the task.

::

    effectgate mcp gateway --upstream "npx @modelcontextprotocol/server-filesystem ./data" \\
        --policy effectgate.toml --strict [--transport http --port 8765]
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TextIO, TypeVar

import anyio
import anyio.abc
from pydantic import BaseModel

import effectgate as eg
from effectgate.validate import seconds as checked_seconds

from .._kernel.context import framework_context
from .._kernel.twins import registry as twins
from .._kernel.vocabulary import UPSTREAM_AMBIGUOUS, UPSTREAM_FAILED, gateway_hint
from .identity import UpstreamIdentity, choose_rule
from .multiround import ApprovalRounds, AskClient, RoundKeys, is_modern
from .reissue import detached
from .relay import (
    Ctx,
    Link,
    RelayServer,
    UpstreamFactory,
    clean_meta,
    clean_params,
    connection_of,
    forwarded_capabilities,
    progress_relay,
)
from .results import stored_result
from .stdio import run_stdio
from .tasks import NotSent, TaskBoard, TaskRun, serve_tasks, state_reader, wants_task
from .transport import caller
from .upstream import ALL_CAPABILITIES, StartupPeer, Upstream, _describe
from .upstream_tasks import UpstreamTasks, task_ref
from .writes import Kind, Verdict, classify

try:
    from mcp import types
    from mcp.server.lowlevel import NotificationOptions, Server
    from mcp.shared.exceptions import MCPError
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.gateway needs the mcp package: pip install "effectgate[mcp]"'
    ) from err

__all__ = ["DEFAULT_CALL_TIMEOUT_SECONDS", "Gateway", "UpstreamFactory", "UpstreamTimeout",
           "UpstreamToolError", "run_gateway", "tool_specs"]

log = logging.getLogger("effectgate")
# How long the start waits for an HTTP upstream's server/discover (does it declare tasks?).
_DISCOVER_SECONDS = 10.0
DEFAULT_CALL_TIMEOUT_SECONDS = 300.0
"""How long a request sent upstream for a client may go unanswered: five minutes, beyond the
usual client-side limits (the TypeScript SDK's 60 s), so the gateway does not cut what a
client still waits for; short enough that a wedged upstream's effect reaches an operator as
AMBIGUOUS the same hour (its heartbeat would keep it IN_FLIGHT for ever)."""
R = TypeVar("R", bound=BaseModel)

# The one upstream answer to a gated ``tools/call`` taken as "it did not run": the method is
# not served (``-32601``), and only when the upstream asked the client nothing during the call
# (a request of its own means the tool had started, and an error the client answered it with
# may come back as the call's). Not INVALID_PARAMS: the gateway has validated the arguments
# against the tool's input schema before sending, and the Python SDK answers any pydantic
# ValidationError a tool raises (after acting, reading a vendor's reply) with ``-32602``. Not
# PARSE_ERROR or INVALID_REQUEST: the gateway sends well-formed requests, and the mcp client
# makes those two up itself when it cannot read a reply. A task's failure proves nothing
# either: the upstream had taken the call.
_REJECTED_BEFORE_RUN = frozenset({types.METHOD_NOT_FOUND})
_NOT_RUN = "__effectgate_gateway_not_run__"
_AMBIGUOUS_HINT = UPSTREAM_AMBIGUOUS
_FAILED_HINT = UPSTREAM_FAILED
_LINK = "effectgate.gateway.link"


def _not_run(exc: BaseException, why: Literal["refused", "unsent"]) -> None:
    """Note on ``exc`` that the gated call it ends provably did not run upstream (FAILED,
    :meth:`Gateway._classify`): ``refused`` (the upstream's :data:`_REJECTED_BEFORE_RUN`) or
    ``unsent`` (it ended before the call left, e.g. a client's cancellation while the
    upstream was being reached)."""
    with contextlib.suppress(AttributeError, TypeError):  # an exception without a __dict__
        setattr(exc, _NOT_RUN, why)


def _why_not_run(exc: BaseException) -> str | None:
    why = getattr(exc, _NOT_RUN, None)
    return why if isinstance(why, str) else None


def _still_held(beat: asyncio.Task[None]) -> None:
    """Just before a call leaves: :class:`NotSent` (FAILED: it never left) once the heartbeat
    has ended, which it does only when it could not extend the lease (lapsed, or resolved by
    an operator) — a lapsed holder must not send."""
    if beat.done():
        raise NotSent("the lease could not be kept while the upstream was reached; the call "
                      "was not sent")


class UpstreamTimeout(Exception):
    """The upstream did not answer a request within the gateway's call timeout; the request
    was cancelled there (the SDK's ``notifications/cancelled``, or the closed stream)."""

    def __init__(self, method: str, seconds: float) -> None:
        super().__init__(f"the upstream did not answer {method} within {seconds:g} s; the "
                         "request was cancelled there, but it may have acted")
        self.method = method
        self.seconds = seconds


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



def _jsonschema() -> Any:
    """The jsonschema module, imported without ``rfc3987_syntax`` when nothing imported either
    yet: that optional IRI checker builds a grammar at import (about 3 s of CPU, which a
    gated call — or a client's timeout — would pay), and the gateway checks no formats."""
    if "jsonschema" not in sys.modules and "rfc3987_syntax" not in sys.modules:
        sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # ImportError inside
        try:
            import jsonschema  # type: ignore[import-untyped]
        finally:
            del sys.modules["rfc3987_syntax"]
    import jsonschema

    return jsonschema


class _InvalidArguments(ValueError):
    """A gated call's arguments do not fit the tool's input schema (nothing ran)."""

class Gateway:
    """The proxy: the upstream's capabilities, its tools gated by ``specs`` (tool name →
    EffectSpec) and classified by ``rule`` (the policy's :class:`~effectgate.UpstreamRule`;
    default: the ``policy``'s entry for this upstream, :func:`.identity.choose_rule`, with
    ``upstream_name`` as the operator's ``--upstream-name``).

    ``upstream`` is a command line or URL, or an :data:`UpstreamFactory`. ``identity`` is the
    upstream's :class:`~.identity.UpstreamIdentity` (default: that of the command line or URL;
    none for a factory): it picks the policy's rule and scopes every gated key
    (:attr:`key_scope`). ``call_timeout_seconds``: how long a request sent upstream for a
    client may go unanswered (None: no limit; see the module's docstring).
    ``await start(tg)`` probes the upstream (its tools, what it serves);
    ``server()`` is the MCP server to run; each client connection then gets its own upstream
    session.
    """

    def __init__(self, gate: eg.Gate, upstream: str | UpstreamFactory,
                 specs: Mapping[str, eg.EffectSpec], *, strict: bool = False,
                 tool_errors: Literal["ambiguous", "failed"] = "ambiguous",
                 rule: eg.UpstreamRule | None = None, policy: eg.Policy | None = None,
                 upstream_name: str | None = None, out: TextIO | None = None,
                 console_url: str | None = None, approval_wait_seconds: float = 300.0,
                 identity: UpstreamIdentity | None = None,
                 state_keys: RoundKeys | None = None,
                 call_timeout_seconds: float | None = DEFAULT_CALL_TIMEOUT_SECONDS) -> None:
        from .elicit import ApprovalElicitor, check_console_url

        self.gate = gate
        self.call_timeout_seconds = _call_timeout(call_timeout_seconds)
        """How long a request sent upstream may go unanswered (None: no limit)."""
        console = check_console_url(console_url)
        self.elicitor = (ApprovalElicitor(gate, console, wait_seconds=approval_wait_seconds)
                         if console is not None else None)
        self.input_ended: anyio.Event | None = None
        """Set when the client's input has ended (stdio); None where that cannot be known."""
        self.state_keys = state_keys if state_keys is not None else RoundKeys.from_env()
        self.rounds = ApprovalRounds(self.state_keys, console, self._decided)
        self.target = upstream.strip() if isinstance(upstream, str) else None
        self.upstream_tasks: UpstreamTasks | None = None
        if isinstance(upstream, str):
            target = upstream
            Upstream(target)  # a bad command line fails now, not at the first client

            def factory(caps: types.ClientCapabilities, peer: Any) -> Upstream:
                return Upstream(target, capabilities=caps, peer=peer)

            self.factory: UpstreamFactory = factory
            identity = identity or UpstreamIdentity.of(target)
        else:
            self.factory = upstream
        self.identity = identity
        self.key_scope = identity.key_scope if identity is not None else None
        self.strict = strict
        self.tool_errors = tool_errors
        choice = choose_rule(policy, identity, upstream_name) if rule is None else None
        self.rule = rule if choice is None else choice.rule
        self.rule_why = (choice.why if choice is not None
                         else f"policy rule for upstream {rule.name!r}" if rule is not None
                         else "no policy rule for this upstream")
        self.rule_warnings = choice.warnings if choice is not None else ()
        self.policy = policy
        self.upstream_name = upstream_name
        self.out = out if out is not None else sys.stderr
        self.tools: dict[str, types.Tool] = {}
        self.verdicts: dict[str, Verdict] = {}
        self.described = ""
        self.init: types.InitializeResult | None = None
        self._announced: set[str] = set()
        self._validators: dict[str, Any] = {}
        self._checked: set[str] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        self.tasks = TaskBoard(state_reader(gate))
        self._shared: Link | None = None
        self._lock = anyio.Lock()
        self.declared = dict(specs)
        self.specs = {name: self._own(spec) for name, spec in specs.items()}

    def _own(self, spec: eg.EffectSpec) -> eg.EffectSpec:
        """The gateway's copy of a declared effect: its key scoped to this upstream, upstream
        errors classified, and ``redact_result`` applied to what an MCP result carries
        (:func:`.results.stored_result`) rather than to its envelope."""
        own = copy.copy(spec)
        if self.key_scope is not None:
            own.template = eg.KeyTemplate(f"{self.key_scope}:{spec.template.template}")
        own.classifiers = (self._classify, *spec.classifiers)
        if spec.redact_result:
            names, then = tuple(spec.redact_result), spec.redact

            def redact(result: Any) -> Any:
                return stored_result(then(result) if then is not None else result, names)

            own.redact, own.redact_result = redact, ()
        return own

    # -- start ---------------------------------------------------------------------------------

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Probe the upstream (declaring every client capability, so it shows every tool it
        can), classify its tools by the policy's rule for it and check every key template
        against its tool's arguments. Raises ``ConnectionError`` or an effectgate error."""
        self._tg = tg
        probe = self.factory(ALL_CAPABILITIES, StartupPeer())
        self.described = probe.describe()
        try:
            await probe.start(tg)
            tools = await probe.list_tools()
        finally:
            probe.close()  # it ends in the background (a server may linger after stdin closes)
        self.init = probe.init
        await self._adopt_upstream_tasks()
        self.tools = {tool.name: tool for tool in tools}
        for tool in tools:
            self._verdict(tool)
            self._check(tool)

    async def _adopt_upstream_tasks(self) -> None:
        """An HTTP upstream that declares the Tasks extension (in its 2026-07-28
        ``server/discover``: a legacy ``initialize`` does not carry extensions) runs gated calls
        as its tasks, and its ``tasks/get`` is the reconcile hook of every gated effect type
        here (:mod:`.upstream_tasks`). Any other upstream, or no answer, changes nothing."""
        if self.target is None or not self.target.startswith(("http://", "https://")):
            return
        by_type = {spec.effect_type: spec for spec in self.specs.values()}
        if not by_type:
            return

        def redact(effect_type: str, result: Any) -> Any:
            spec = by_type.get(effect_type)
            return spec.redact(result) if spec is not None and spec.redact else result

        tasks = UpstreamTasks(self.target, tool_errors=self.tool_errors, redact=redact,
                              call_timeout=self.call_timeout_seconds)
        try:
            with anyio.fail_after(_DISCOVER_SECONDS):
                async with tasks.session():
                    pass
        except Exception as err:  # no 2026-07-28 answer or no Tasks extension: plain calls
            log.debug("upstream tasks not used: %s", err)
            return
        self.upstream_tasks = tasks
        for effect_type in sorted(by_type):
            self.gate.reconciler(effect_type)(self.upstream_tasks.reconcile)

    def _verdict(self, tool: types.Tool) -> Verdict:
        verdict = classify(tool, self.specs, self.rule)
        if verdict.kind is Kind.GATED and self.rule is not None and (
                self.rule.is_read_only(tool.name)):
            raise eg.PolicyError(
                f"tool {tool.name!r} is gated and also read_only in the policy for "
                f"{self.rule.name!r}; it is one or the other")
        self.verdicts[tool.name] = verdict
        return verdict

    def _check(self, tool: types.Tool) -> None:
        """Check a gated tool's key template against its arguments (once per schema)."""
        spec = self.specs.get(tool.name)
        if spec is None:
            return
        schema = tool.input_schema
        mark = f"{tool.name}\x00{json.dumps(schema, sort_keys=True, default=str)}"
        if mark in self._checked:
            return
        if schema.get("additionalProperties", True) is False or "properties" in schema:
            spec.check_names(list(schema.get("properties", {})), f"upstream tool {tool.name!r}")
        self._checked.add(mark)

    @property
    def ungated(self) -> list[str]:
        """Upstream tools that write with no effect declared, in the upstream's order."""
        return [n for n in self.tools if self.verdicts[n].kind is Kind.WRITE]

    @property
    def reads(self) -> list[str]:
        """Upstream tools that pass as reads, in the upstream's order."""
        return [n for n in self.tools if self.verdicts[n].kind is Kind.READ]

    @property
    def missing(self) -> list[str]:
        """Declared tools the upstream does not offer (a typo in the policy?)."""
        return sorted(set(self.specs) - set(self.tools))

    def print_start(self) -> None:
        """The start lines: what is gated, what reads, every write with no effect (each once),
        and what the policy says about this upstream."""
        info = self.init.server_info if self.init else None
        who = f"{info.name} {info.version}".strip() if info else "the upstream"
        if self.rule is None:
            rule = f"{self.rule_why}: readOnlyHint not trusted"
        else:
            trust = "trusted" if self.rule.trust_read_only_hint else "not trusted"
            rule = (f"{_shown(self.rule_why)}: {len(self.rule.read_only)} read_only, "
                    f"readOnlyHint {trust}")
        self._say(f"effectgate: gateway for {_shown(who)} ({_shown(self.described)}); {rule}")
        for warning in self.rule_warnings:
            self._say(f"effectgate: warning: {_shown(warning)}")
        if self.key_scope is not None:
            self._say(f"effectgate: gated keys begin with {self.key_scope}: (this upstream's "
                      "command or URL), so another upstream's effects on this store are others")
        what = "refused (strict)" if self.strict else "ungated"
        for name in self.tools:
            verdict = self.verdicts[name]
            if verdict.kind is Kind.GATED:
                spec = self.specs[name]
                self._say(f"effectgate: gated tool {_shown(name)}: {spec.effect_type} key "
                          f"{self.declared[name].template.template!r}")
            elif verdict.kind is Kind.WRITE:
                self._announced.add(name)
                self._say(f"effectgate: {what} tool, no effect declared: {_shown(name)}")
        for name in self.missing:
            self._say(f"effectgate: warning: the policy gates {name!r}, which the upstream does "
                      "not offer")
        gated = len(self.tools) - len(self.reads) - len(self.ungated)
        self._say(f"effectgate: {len(self.tools)} tools: {gated} gated, {len(self.reads)} read, "
                  f"{len(self.ungated)} {what}")

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def _announce(self, tool: types.Tool) -> Verdict:
        """A tool's verdict; a write first seen after start is printed then, once."""
        known = self.verdicts.get(tool.name)
        verdict = self._verdict(tool) if known is None or tool.name not in self.tools else known
        if verdict.kind is Kind.WRITE and tool.name not in self._announced:
            self._announced.add(tool.name)
            what = "refused (strict)" if self.strict else "ungated"
            self._say(f"effectgate: {what} tool, no effect declared: {_shown(tool.name)} "
                      "(offered after start)")
        return verdict

    # -- the server ----------------------------------------------------------------------------

    def server(self) -> Server[Any]:
        """The MCP server (low level: the upstream's results are served as they come), offering
        exactly what the upstream serves."""
        caps = self.init.capabilities if self.init else types.ServerCapabilities()
        info = self.init.server_info if self.init else None
        handlers: dict[str, Any] = {}
        if caps.tools is not None:
            handlers.update(on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        if caps.resources is not None:
            handlers.update(
                on_list_resources=self._relay(types.ListResourcesRequest,
                                              types.ListResourcesResult),
                on_list_resource_templates=self._relay(types.ListResourceTemplatesRequest,
                                                       types.ListResourceTemplatesResult),
                on_read_resource=self._relay(types.ReadResourceRequest, types.ReadResourceResult))
            if caps.resources.subscribe:
                handlers.update(
                    on_subscribe_resource=self._relay(types.SubscribeRequest, types.EmptyResult),
                    on_unsubscribe_resource=self._relay(types.UnsubscribeRequest,
                                                        types.EmptyResult))
        if caps.prompts is not None:
            handlers.update(
                on_list_prompts=self._relay(types.ListPromptsRequest, types.ListPromptsResult),
                on_get_prompt=self._relay(types.GetPromptRequest, types.GetPromptResult))
        if caps.completions is not None:
            handlers.update(on_completion=self._relay(types.CompleteRequest, types.CompleteResult))
        name = f"{info.name} (gated by effectgate)" if info else "effectgate-gateway"
        server = RelayServer(
            name, version=info.version if info else "", title=info.title if info else None,
            instructions=self.init.instructions if self.init else None, **handlers)
        server.middleware.append(self.state_keys.boundary(name))  # 2026-07-28 requestState
        if caps.tools is not None:
            serve_tasks(server, self.tasks)  # the Tasks extension, for gated calls (.tasks)
        server.notification_options = NotificationOptions(
            prompts_changed=bool(caps.prompts and caps.prompts.list_changed),
            resources_changed=bool(caps.resources and caps.resources.list_changed),
            tools_changed=bool(caps.tools and caps.tools.list_changed))
        if caps.logging is not None:
            server.add_request_handler("logging/setLevel", types.SetLevelRequestParams,
                                       self._relay(types.SetLevelRequest, types.EmptyResult))
        server.add_notification_handler("notifications/roots/list_changed",
                                        types.NotificationParams, self._roots_changed)
        server.add_notification_handler("notifications/initialized",
                                        types.NotificationParams, self._initialized)
        return server

    async def _link(self, ctx: Ctx) -> Link:
        """This client's link, opened on its first request with its own capabilities."""
        assert self._tg is not None, "Gateway.start() first"
        connection = connection_of(ctx)
        if connection is None:  # 2026-07-28 clients: one stateless link, no back-channel
            async with self._lock:
                if self._shared is None:
                    self._shared = Link(self.factory, types.ClientCapabilities(), None)
                    self._shared.upstream.attach(self._tg)
                return self._shared
        link = connection.state.get(_LINK)
        if isinstance(link, Link):
            return link
        lock = connection.state.setdefault(_LINK + ".lock", anyio.Lock())
        async with lock:
            link = connection.state.get(_LINK)
            if not isinstance(link, Link):
                caps = ctx.session.client_capabilities or types.ClientCapabilities()
                link = Link(self.factory, forwarded_capabilities(caps), ctx.session,
                            self.input_ended)
                link.upstream.attach(self._tg)
                connection.state[_LINK] = link
                connection.exit_stack.push_async_callback(link.upstream.aclose)
        return link

    async def _send(self, link: Link, ctx: Ctx, request: Any, result_type: type[R]) -> R:
        session = await link.upstream.session()
        sent_at = anyio.current_time()
        try:
            return await session.send_request(
                request, result_type, request_read_timeout_seconds=self.call_timeout_seconds,
                progress_callback=progress_relay(ctx))
        except MCPError as err:
            timeout = self._timed_out(err, request, sent_at)
            if timeout is not None:
                raise MCPError(types.REQUEST_TIMEOUT, str(timeout)) from err
            raise
        except Exception as err:
            link.upstream.close()
            raise MCPError(types.INTERNAL_ERROR, f"the upstream failed: {_describe(err)}") from err

    def _relay(self, request_type: type[Any], result_type: type[R]) -> Any:
        """A handler that forwards a request of ``request_type`` and returns the answer."""

        async def handle(ctx: Ctx, params: Any) -> R:
            link = await self._link(ctx)
            with link.serving(ctx):
                try:
                    return await self._send(link, ctx, request_type(params=clean_params(params)),
                                            result_type)
                except ConnectionError as err:
                    raise MCPError(types.INTERNAL_ERROR, str(err)) from err
                except MCPError as err:
                    if request_type is types.ReadResourceRequest:
                        raise _resource_not_found(err, ctx, params) from err
                    raise

        return handle

    async def _list_tools(self, ctx: Ctx,
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        link = await self._link(ctx)
        with link.serving(ctx):
            try:
                request = types.ListToolsRequest(params=clean_params(params))
                page = await self._send(link, ctx, request, types.ListToolsResult)
            except ConnectionError as err:
                raise MCPError(types.INTERNAL_ERROR, str(err)) from err
        link.absorb(page.tools, first_page=not (params and params.cursor))
        for tool in page.tools:
            try:
                self._announce(tool)
            except eg.EffectGateError as err:  # its calls are refused with this error
                log.warning("tool %r: %s", tool.name, err.message)
        return page

    async def _call_tool(self, ctx: Ctx,
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        link = await self._link(ctx)
        with link.serving(ctx):
            return await self.call(link, params.name, dict(params.arguments or {}),
                                   ctx=ctx, meta=clean_meta(params.meta))

    async def _initialized(self, ctx: Ctx, params: Any) -> None:
        """The client is ready: open its upstream session now (in the background: the upstream
        may ask this client for roots while it starts), so that what the upstream announces
        from its start (list changes, logs) reaches the client as it would directly."""
        assert self._tg is not None

        async def open_link() -> None:
            try:
                link = await self._link(ctx)
                await link.upstream.session()
            except Exception as err:  # the first request will try again and report it
                log.warning("could not open the upstream session: %s", _describe(err))

        self._tg.start_soon(open_link)

    async def _roots_changed(self, ctx: Ctx, params: Any) -> None:
        connection = connection_of(ctx)
        link = connection.state.get(_LINK) if connection is not None else None
        session = link.upstream.current if isinstance(link, Link) else None
        if session is not None:
            await session.send_roots_list_changed()

    # -- one call ------------------------------------------------------------------------------

    async def call(self, link: Link, name: str, arguments: dict[str, Any], *,
                   ctx: Ctx | None = None,
                   meta: dict[str, Any] | None = None) -> types.CallToolResult:
        """Answer one tool call: forwarded, gated, or refused."""
        try:
            tool = await link.tool(name)
        except Exception as err:
            return _error({"error": "UpstreamLost", "message": (
                f"cannot list the upstream's tools: {_describe(err)}"),
                "what_to_do": "The upstream server is unavailable; try again later."})
        if tool is None:
            return _error({"error": "UnknownTool", "message": f"no tool named {_short(name)}",
                           "what_to_do": "Call one of the listed tools."})
        try:
            verdict = self._announce(tool)
            self._check(tool)
        except eg.EffectGateError as err:
            return _error(_refused(err))
        if verdict.kind is Kind.WRITE and self.strict:
            return _error({"error": "UngatedTool", "message": (
                f"tool {name!r} writes and has no effect declared, and this gateway is strict"),
                "what_to_do": "Do not call this tool; tell the user it is not enabled."})
        request = _call_request(name, arguments, meta)
        if verdict.kind is not Kind.GATED:
            return await self._forward(link, ctx, request)
        return await self._gated(link, ctx, tool, self.specs[name], arguments, meta)

    async def _gated(self, link: Link, ctx: Ctx | None, tool: types.Tool, spec: eg.EffectSpec,
                     arguments: dict[str, Any],
                     meta: dict[str, Any] | None) -> types.CallToolResult:
        try:
            arguments = self._normalise(tool, arguments)
            keyed = dict(spec.template.normalise(arguments))  # what is hashed, approved, sent
            if keyed != arguments:
                self._validate(tool, keyed)
        except _InvalidArguments as err:
            return _error({"error": "InvalidArguments", "message": str(err),
                           "what_to_do": "Fix the arguments and call again; nothing ran."})
        except eg.EffectGateError as err:
            return _error(_refused(err))
        retry = self.rounds.retry(ctx, tool=tool.name, arguments=arguments)  # before any write
        ran: list[eg.BeginDecision] = []
        lease = spec.lease_seconds or self.gate.lease_seconds
        request = _call_request(tool.name, keyed, meta)
        run = self.tasks.new() if self._tg is not None and wants_task(ctx) else None

        async def body() -> dict[str, Any]:
            ran.append(eg.current_effect())
            if run is not None:
                run.holding(ran[0].key)
            return await self._execute(link, None if run else ctx, request, lease, run)

        async def attempt() -> Any:
            try:
                with framework_context(agent_id=_agent_name()):
                    return await spec.arun(keyed, body)
            except eg.ApprovalRequired as err:
                asked = await self.rounds.answer(ctx, retry, tool=tool.name,
                                                 arguments=arguments, key=err.key or "",
                                                 approval_id=err.approval_id)
                if isinstance(asked, types.InputRequiredResult):
                    raise AskClient(asked) from err
                if not asked and not await self._elicit(ctx, err):
                    raise
                with framework_context(agent_id=_agent_name()):  # decided on the console
                    return await spec.arun(keyed, body)

        async def answer() -> types.CallToolResult:
            return await self._answer(spec, keyed, lease, attempt, ran, modern=(
                run is None and is_modern(getattr(ctx, "protocol_version", None))),
                structured=tool.output_schema is not None)

        if run is not None:  # a task once it holds the lease (.tasks); else answered at once
            assert self._tg is not None
            try:
                return await self.tasks.offer(self._tg, run, answer)  # type: ignore[return-value]
            except AskClient as ask:
                return ask.result  # type: ignore[return-value]
        try:
            return await answer()
        except AskClient as ask:
            return ask.result  # type: ignore[return-value]

    async def _answer(self, spec: eg.EffectSpec, keyed: dict[str, Any], lease: float,
                      attempt: Callable[[], Awaitable[Any]], ran: list[eg.BeginDecision], *,
                      modern: bool, structured: bool = False) -> types.CallToolResult:
        """The gated call's answer: its result (recorded), or the refusal or error a model
        reads. ``AskClient`` for an approval round. ``structured``: the tool declares an
        output schema (a result without structured content is then an error to a client)."""
        try:
            if self._tg is not None and modern:
                # a broken 2026-07-28 stream cancels the request, not the call (.reissue)
                stored = await detached(self._tg, lambda: self._once(spec, keyed, lease, attempt))
            else:
                stored = await self._once(spec, keyed, lease, attempt)
        except AskClient:
            raise
        except NotSent as err:
            return _error({"error": "NotSent", "key": ran[0].key if ran else None,
                           "message": err.message,
                           "what_to_do": "Nothing happened; call again if it is still wanted."})
        except UpstreamToolError as err:
            return _with_note(err.result, _FAILED_HINT if self.tool_errors == "failed"
                              else _AMBIGUOUS_HINT, ran)
        except eg.EffectGateError as err:
            return _error(_refused(err))
        except UpstreamTimeout as err:
            return _error({"error": "UpstreamTimeout", "key": ran[0].key if ran else None,
                           "message": str(err), "what_to_do": _AMBIGUOUS_HINT})
        except Exception as err:
            key = ran[0].key if ran else None
            why = _why_not_run(err)
            if why is not None:
                said = ("the upstream refused the call before running it" if why == "refused"
                        else "the call was not sent to the upstream")
                return _error({"error": "UpstreamRefused" if why == "refused" else "NotSent",
                               "key": key, "message": f"{said}: {_describe(err)}",
                               "what_to_do": "Nothing happened; fix the call or try again."})
            return _error({"error": "UpstreamLost", "key": key, "message": (
                f"the upstream failed during the call: {_describe(err)}"),
                "what_to_do": _AMBIGUOUS_HINT})
        if ran:
            result = types.CallToolResult.model_validate(stored)
            note = {"decision": "execute", "key": ran[0].key, "effect_id": ran[0].effect_id,
                    "attempt": ran[0].attempt}
        else:
            key = spec.template.render(keyed)
            result = _duplicate(stored, key, structured=structured)
            note = {"decision": "duplicate", "key": key}
        return result.model_copy(update={"meta": {**(result.meta or {}), "effectgate": note}})

    async def _once(self, spec: eg.EffectSpec, keyed: dict[str, Any], lease: float,
                    attempt: Callable[[], Awaitable[Any]]) -> Any:
        """``await attempt()``, once for identical calls in flight in this process: a twin
        (same effect, same payload, e.g. a model's parallel tool calls in one turn) waits for
        the call it repeats, at most the lease, and gets its answer (:mod:`.._kernel.twins`)
        rather than the store's "in flight"."""
        try:
            key = spec.template.render(keyed)
        except Exception:  # the gated call itself reports it
            return await attempt()
        slot, leading = twins.claim(
            (self.gate.url, self.gate.namespace, spec.effect_type, key), keyed)
        if slot is None:
            return await attempt()
        if leading:
            return await twins.alead(slot, attempt, _shared_with(spec))
        answer = await slot.await_answer(lease)
        return answer.give() if answer is not None else await attempt()

    async def _decided(self, approval_id: str) -> bool:
        """Wait for a decision on the console (2026-07-28 retries, :mod:`.multiround`)."""
        return self.elicitor is not None and await self.elicitor.wait_decided(approval_id)

    async def _elicit(self, ctx: Ctx | None, err: eg.ApprovalRequired) -> bool:
        """Send the client to the console's approval page (URL-mode elicitation) and wait for
        the decision there; False when there is nothing to elicit with (:mod:`.elicit`)."""
        if self.elicitor is None or ctx is None or err.approval_id is None:
            return False
        return await self.elicitor.ask(getattr(ctx, "session", None), err.approval_id, err.key,
                                       related_request_id=getattr(ctx, "request_id", None))

    def _normalise(self, tool: types.Tool, arguments: dict[str, Any]) -> dict[str, Any]:
        """Schema defaults filled in (so the key and hash see what the tool sees), then the
        arguments validated against the tool's input schema."""
        schema = tool.input_schema
        for prop, sub in schema.get("properties", {}).items():
            if prop not in arguments and isinstance(sub, Mapping) and "default" in sub:
                arguments[prop] = sub["default"]
        self._validate(tool, arguments)
        return arguments

    def _validate(self, tool: types.Tool, arguments: dict[str, Any]) -> None:
        """:class:`_InvalidArguments` unless ``arguments`` fit the tool's input schema.

        jsonschema is imported at the first gated call, not at start, and without its
        optional IRI syntax checker (see :func:`_jsonschema`)."""
        jsonschema = _jsonschema()
        schema = tool.input_schema
        mark = json.dumps(schema, sort_keys=True, default=str)
        validator = self._validators.get(mark)
        if validator is None:
            validator = self._validators[mark] = jsonschema.validators.validator_for(schema)(
                schema)
        try:
            validator.validate(arguments)
        except jsonschema.ValidationError as err:
            where = "/".join(str(p) for p in err.absolute_path)
            raise _InvalidArguments(f"{where}: {err.message}" if where else err.message) from err

    async def _execute(self, link: Link, ctx: Ctx | None, request: types.CallToolRequest,
                       lease: float, run: TaskRun | None = None) -> dict[str, Any]:
        if self.upstream_tasks is not None:
            return await self._as_upstream_task(self.upstream_tasks, request, lease, run)
        # The heartbeat from the start: a slow (re)connect must not outlast the lease, or the
        # call would leave after an operator may have resolved the lapsed effect.
        beat = asyncio.create_task(self._heartbeat(eg.current_effect(), lease))
        try:
            try:
                if run is None:
                    session = await link.upstream.ready()  # NotExecuted: never sent
                else:  # a task: a tasks/cancel before the request leaves releases it (.tasks)
                    with run.pre_send:
                        session = await link.upstream.ready()
                    if not run.may_send():
                        raise NotSent
                _still_held(beat)
            except BaseException as exc:  # cancelled or failed before the call left
                _not_run(exc, "unsent")
                raise
            asked = link.upstream.asked
            sent_at = anyio.current_time()
            try:
                result = await session.send_request(
                    request, types.CallToolResult,
                    request_read_timeout_seconds=self.call_timeout_seconds,
                    progress_callback=progress_relay(ctx))
            except MCPError as err:
                if err.code in _REJECTED_BEFORE_RUN and link.upstream.asked == asked:
                    _not_run(err, "refused")
                timeout = self._timed_out(err, request, sent_at)
                if timeout is not None:
                    raise timeout from err  # AMBIGUOUS: it may have acted (_classify)
                raise
        finally:
            beat.cancel()
        if result.is_error:
            raise UpstreamToolError(result)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)

    async def _as_upstream_task(self, tasks: UpstreamTasks, request: types.CallToolRequest,
                                lease: float, run: TaskRun | None) -> dict[str, Any]:
        """The call on a 2026-07-28 request that lets the upstream answer with a task: its id
        is recorded with the effect at once (with the heartbeat), then ``tasks/get`` is polled
        until it ends, the lease kept alive meanwhile (:mod:`.upstream_tasks`)."""
        d = eg.current_effect()
        beat = asyncio.create_task(self._heartbeat(d, lease))

        def sending() -> None:
            if run is not None and not run.may_send():
                raise NotSent
            _still_held(beat)

        async def started(handle: Any) -> None:
            await self.gate.aextend_lease(d, lease, vendor_ref=task_ref(d.attempt,
                                                                        handle.task_id))

        result: types.CallToolResult | None = None
        sent_at = anyio.current_time()
        try:
            if run is None:
                result = await tasks.call(request.params, sending, started)
            else:  # a tasks/cancel before the request leaves releases it (.tasks)
                with run.pre_send:
                    result = await tasks.call(request.params, sending, started)
        except MCPError as err:  # the call's own answer (a task's end is a TaskCall); on
            # 2026-07-28 the upstream cannot have asked the client anything during it
            if err.code in _REJECTED_BEFORE_RUN:
                _not_run(err, "refused")
            timeout = self._timed_out(err, request, sent_at)
            if timeout is not None:
                raise timeout from err  # no answer, not even a task: it may have acted
            raise
        finally:
            beat.cancel()
        if result is None:
            raise NotSent  # cancelled while connecting: the call never left
        if result.is_error:
            raise UpstreamToolError(result)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)

    async def _heartbeat(self, d: eg.BeginDecision, lease: float) -> None:
        """Extend the lease while a long upstream call runs (a live call is not ambiguous);
        it ends only when the lease can no longer be extended (:func:`_still_held`)."""
        while True:
            await asyncio.sleep(lease / 3)
            try:
                await self.gate.aextend_lease(d, lease)
            except eg.EffectGateError as err:
                log.warning("could not extend the lease of %s: %s", d.key, err.message)
                return

    def _timed_out(self, err: MCPError, request: Any,
                   sent_at: float) -> UpstreamTimeout | None:
        """The :class:`UpstreamTimeout` ``err`` is when the SDK raised it for the call
        timeout (an upstream's own ``-32001`` answer, sooner, is not)."""
        limit = self.call_timeout_seconds
        if (limit is None or err.code != types.REQUEST_TIMEOUT
                or anyio.current_time() - sent_at < limit):
            return None
        name = getattr(getattr(request, "params", None), "name", None)
        method = f"{request.method} {name!r}" if isinstance(name, str) else request.method
        return UpstreamTimeout(method, limit)

    def _classify(self, exc: BaseException) -> eg.Outcome | None:
        if _why_not_run(exc) is not None:
            return eg.Outcome.FAILED  # provably never ran upstream (:func:`_not_run`)
        if isinstance(exc, UpstreamToolError):
            return eg.Outcome.FAILED if self.tool_errors == "failed" else eg.Outcome.AMBIGUOUS
        return None  # AMBIGUOUS: whatever else the upstream said, it may have acted

    async def _forward(self, link: Link, ctx: Ctx | None,
                       request: types.CallToolRequest) -> types.CallToolResult:
        sent_at = anyio.current_time()
        try:
            session = await link.upstream.ready()
            return await session.send_request(
                request, types.CallToolResult,
                request_read_timeout_seconds=self.call_timeout_seconds,
                progress_callback=progress_relay(ctx))
        except MCPError as err:
            timeout = self._timed_out(err, request, sent_at)
            if timeout is None:
                raise
            return _error({"error": "UpstreamTimeout", "message": str(timeout), "what_to_do": (
                "It may or may not have happened; check before calling this tool again.")})
        except Exception as err:
            return _error({"error": "UpstreamLost", "message": (
                f"the upstream failed: {_describe(err)}"),
                "what_to_do": "The upstream server is unavailable; try again later."})

    async def aclose(self) -> None:
        """Close the shared (stateless) link, if one was opened."""
        if self._shared is not None:
            await self._shared.upstream.aclose()


_OLD_RESOURCE_NOT_FOUND = -32002  # before 2026-07-28 (SEP-2164 moved it to -32602)


def _resource_not_found(err: MCPError, ctx: Ctx, params: Any) -> MCPError:
    """The upstream's error for a ``resources/read``, in the client's revision: a missing
    resource is ``-32602`` carrying its ``uri`` at 2026-07-28 (SEP-2164), whatever revision
    the upstream speaks; any other error, and any error to an older client, as it came."""
    uri = getattr(params, "uri", None)
    modern = is_modern(getattr(ctx, "protocol_version", None))
    if not modern or uri is None or err.code not in (_OLD_RESOURCE_NOT_FOUND,
                                                    types.INVALID_PARAMS):
        return err
    data = err.error.data
    if isinstance(data, dict) and "uri" in data:
        return err if err.code == types.INVALID_PARAMS else MCPError(
            types.INVALID_PARAMS, err.message, data)
    if err.code == types.INVALID_PARAMS and data is not None:
        return err  # an invalid-params error about something else
    return MCPError(types.INVALID_PARAMS, err.message, {"uri": str(uri)})


def _shared_with(spec: eg.EffectSpec) -> Callable[[Any], bool]:
    """Which of a leader's answers its twins get as theirs (:mod:`.._kernel.twins`): what the
    store would give them. A twin may be another agent's call: not the leader's own denial
    (its run's or agent's ceiling) or approval round with its client, and not the upstream's
    answer when the store keeps another form of it (``redact_result``, ``redact``) or none
    (``store_result = false``): then the twin asks the store, as any repeat does."""
    verbatim = spec.store_result and spec.redact is None and not spec.redact_result

    def shared(answer: Any) -> bool:
        if isinstance(answer, (eg.EffectDenied, AskClient)):
            return False
        if isinstance(answer, UpstreamToolError) or not isinstance(answer, BaseException):
            return verbatim
        return True

    return shared


def _duplicate(stored: Any, key: str, *, structured: bool) -> types.CallToolResult:
    """A repeat's answer from what the store keeps of the call's result: the result itself;
    a note that it ran when nothing was kept (``store_result = false``, or a result with no
    stored form), marked ``isError`` when the tool declares an output schema (a client
    refuses a result without the structured content it promises); what was kept, as JSON,
    when a ``redact`` function made it something else than a tool result."""
    if stored is not None:
        try:
            return types.CallToolResult.model_validate(stored)
        except ValueError:
            text = json.dumps(stored, ensure_ascii=False, default=str)
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)],
                structured_content=stored if isinstance(stored, dict) else None)
    note = {"effectgate": "duplicate", "key": key, "message": (
        "this call already ran; its result was not kept"),
        "what_to_do": "Do NOT call it again: it is done. Its result is not available."}
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(note))],
                                is_error=structured)


def _refused(err: eg.EffectGateError) -> dict[str, Any]:
    """An effectgate error as JSON for the agent: its fields and what to do, in the gateway's
    voice (the agent has this upstream's tools, not ``mcp serve``'s)."""
    out = {k: v for k, v in err.fields().items() if v is not None}
    out["what_to_do"] = gateway_hint(err)
    return out


def _call_request(name: str, arguments: dict[str, Any],
                  meta: dict[str, Any] | None) -> types.CallToolRequest:
    params = types.CallToolRequestParams.model_validate(
        {"name": name, "arguments": arguments, **({"_meta": meta} if meta else {})})
    return types.CallToolRequest(params=params)


def _shown(text: str, limit: int = 200) -> str:
    """Text from the upstream made safe for a terminal line: no control characters, bounded."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in text)
    return clean if len(clean) <= limit else clean[:limit] + "…"


def _short(text: str, limit: int = 80) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit] + "…"


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))



def _call_timeout(seconds: object) -> float | None:
    """``call_timeout_seconds`` checked: None, or more than 0 and at most a week."""
    return None if seconds is None else checked_seconds(seconds, "call_timeout_seconds")


def _agent_name() -> str | None:
    """The agent a gated call is recorded for: the authenticated caller over HTTP (its bearer
    token's principal); None over stdio or ``--no-auth``, where nobody proved a name."""
    who = caller()
    return None if who is None else who.name


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


def run_gateway(gate: eg.Gate, upstream: str | UpstreamFactory, effects: Any, *,
                strict: bool = False,
                tool_errors: Literal["ambiguous", "failed"] | str = "ambiguous",
                out: TextIO | None = None, transport: Literal["stdio", "http"] = "stdio",
                host: str = "127.0.0.1", port: int = 8000, allow_remote: bool = False,
                upstream_name: str | None = None, guard: Any = None, max_sessions: int = 64,
                session_idle_timeout: float = 300.0, console_url: str | None = None,
                auth: bool = True,
                call_timeout_seconds: float | None = DEFAULT_CALL_TIMEOUT_SECONDS) -> int:
    """Run the gateway until the client leaves (stdio) or it is stopped (HTTP); the exit status
    (0, or 2 when it could not start). Prints the start lines on ``out`` (stderr): where it
    listens, and every upstream tool that writes with no effect declared, one per line.

    Over HTTP every client session has its own upstream session (for a stdio upstream: its own
    process), so at most ``max_sessions`` are open at once and one idle for
    ``session_idle_timeout`` seconds is closed. ``call_timeout_seconds``: how long a request
    sent upstream may go unanswered (:class:`Gateway`). ``console_url``: approvals are elicited
    (URL mode) to the console's approval page (:mod:`.elicit`). HTTP requires a bearer token
    of an agent principal (:func:`.transport.bearer_guard`) unless ``auth=False``, which only
    a loopback address may use."""
    from .transport import check_bind, http_auth, listen

    out = out if out is not None else sys.stderr
    sock = None
    try:
        said = None
        if transport == "http":
            check_bind(host, port, allow_remote=allow_remote, guard=guard)
            guard, said = http_auth(gate, host, auth=auth, guard=guard,
                                    what="call the upstream's tools through the gate")
            sock = listen(host, port)
        errors: Literal["ambiguous", "failed"] = (
            "failed" if tool_errors == "failed" else "ambiguous")
        policy = effects if isinstance(effects, eg.Policy) else None
        gw = Gateway(gate, upstream, tool_specs(gate, effects), strict=strict,
                     tool_errors=errors, policy=policy, upstream_name=upstream_name, out=out,
                     console_url=console_url, call_timeout_seconds=call_timeout_seconds)
    except eg.EffectGateError as err:
        print(f"effectgate: error: {err.message}", file=out, flush=True)
        if sock is not None:
            sock.close()
        return 2
    if not isinstance(max_sessions, int) or max_sessions < 1:
        print("effectgate: error: --max-sessions must be at least 1", file=out, flush=True)
        return 2
    limits = {"max_sessions": max_sessions, "session_idle_timeout": session_idle_timeout}
    return anyio.run(_serve, gw, transport, sock, host, guard, out, limits, said)


async def _serve(gw: Gateway, transport: str, sock: Any, host: str, guard: Any,
                 out: TextIO, limits: dict[str, Any], said: str | None = None) -> int:
    from .server import rebinding_protection
    from .transport import serve_http

    async with anyio.create_task_group() as tg:
        try:
            await gw.start(tg)
        except (eg.EffectGateError, ConnectionError) as err:
            print(f"effectgate: error: {getattr(err, 'message', err)}", file=out, flush=True)
            tg.cancel_scope.cancel()
            if sock is not None:
                sock.close()
            return 2
        gw.print_start()
        server = gw.server()
        if transport == "http":
            app = server.streamable_http_app(
                host=host, transport_security=rebinding_protection(host), **limits)
            try:
                await serve_http(app, sock, what="gateway", out=out, guard=guard, auth=said)
            finally:
                sock.close()
        else:
            print("effectgate: gateway listening on stdio", file=out, flush=True)
            with anyio.CancelScope() as scope:
                tg.start_soon(_stop_on_signal, scope)
                gw.input_ended = anyio.Event()  # an upstream's question to the client, too
                if gw.elicitor is not None:  # stdin closed: no answer can come (.elicit)
                    gw.elicitor = dataclasses.replace(gw.elicitor, input_ended=gw.input_ended)
                await run_stdio(server, gw.input_ended)
        await gw.aclose()
        tg.cancel_scope.cancel()
    return 0


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    """SIGTERM or SIGHUP (a client closing its stdio server sends SIGTERM after a grace
    period) ends the gateway the orderly way, so its upstream processes are stopped too
    instead of being left behind."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for _ in signals:
            scope.cancel()
            return
