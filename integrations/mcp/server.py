"""The gate as an MCP server: any agent that speaks MCP gets ``begin`` / ``report`` without a
Python decorator.

Tools: ``begin_effect``, ``report_effect``, ``extend_lease``, ``unwind_group`` and, only when the
operator allows it, ``resolve_effect`` (deciding what happened to an AMBIGUOUS effect is a
person's call, not the agent's). Answers are JSON; every effectgate error comes back as a tool
error whose text is JSON with the error's fields and ``what_to_do``.

::

    from effectgate.integrations.mcp import build_server

    build_server(eg.Gate("sqlite:///effects.db")).run()      # stdio

or ``effectgate mcp serve --url ... [--transport http]``: both run stdio the same way
(:meth:`GateServer.run_stdio_async`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any, Literal, TextIO

import anyio
from pydantic import Field

import effectgate as eg
from effectgate import sagas
from effectgate.net import loopback_host_names
from effectgate.principals import require_holder

from .._kernel.vocabulary import DEFAULT_HINT, ERROR_HINTS, INSTRUCTIONS
from .elicit import ApprovalElicitor, check_console_url
from .multiround import ApprovalRounds, RoundKeys
from .reissue import begin_unlost
from .stdio import check_stdio_free, run_stdio
from .transport import (
    HttpGuard,
    agent_for,
    caller,
    check_bind,
    http_auth,
    listen,
    operator_only,
    require_holds,
    serve_http,
)

try:
    from mcp.server import MCPServer
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.transport_security import TransportSecuritySettings
    from mcp.shared.exceptions import MCPError
    from mcp_types import INVALID_PARAMS, InputRequiredResult
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp needs the mcp package: pip install ".[mcp]"'
    ) from err

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "GateServer", "build_server", "decision_answer", "error_answer", "is_undo",
    "rebinding_protection", "serve", "tool_error", "unwind_answer",
]

def decision_answer(d: eg.BeginDecision) -> dict[str, Any]:
    """A decision as JSON for a model: ``as_dict()`` plus ``instruction`` (what to do now)."""
    out = {k: v for k, v in d.as_dict().items()
           if v is not None or (k == "result" and d.decision is eg.Decision.DUPLICATE)}
    text = INSTRUCTIONS[d.decision.value]
    if d.vendor_key is not None and d.decision is eg.Decision.EXECUTE:
        where = "header" if d.vendor_key.location == "header" else "request body field"
        text += (
            f" Send vendor_idempotency_key to {d.vendor_key.vendor} as its own idempotency key "
            f"(the {where} {d.vendor_key.field!r}), so the vendor also refuses a repeat."
        )
    if d.budget_warning:
        text += " Tell the user about budget_warning: a spending limit could not count this."
    out["instruction"] = text
    return out


def error_answer(err: eg.EffectGateError) -> dict[str, Any]:
    """An effectgate error as JSON for a model: its fields plus ``what_to_do``."""
    out = {k: v for k, v in err.fields().items() if v is not None}
    hint = next((ERROR_HINTS[c.__name__] for c in type(err).__mro__
                 if c.__name__ in ERROR_HINTS), DEFAULT_HINT)
    out["what_to_do"] = hint
    return out


def tool_error(err: eg.EffectGateError) -> ToolError:
    """The :class:`ToolError` a model reads for ``err`` (JSON text)."""
    return ToolError(json.dumps(error_answer(err), ensure_ascii=False, default=str))


# -- the tools ---------------------------------------------------------------------------------

BEGIN = """\
Ask permission IMMEDIATELY BEFORE an action that changes something outside this conversation \
(sends a message, moves money, creates, changes or deletes a resource, deploys). Not for reads. \
The answer's `decision` tells you what to do, and `instruction` repeats it; only "execute" lets \
you act:
- execute: you hold this effect. Perform the action now, exactly once, then call report_effect. \
If the answer has vendor_idempotency_key, send it to the vendor as the vendor's own idempotency \
key (vendor_key.location and vendor_key.field say where), so the vendor refuses a repeat too.
- duplicate: it ALREADY HAPPENED. Do NOT perform it. Use `result` as though you had just done it.
- in_flight: someone is doing it right now. Do NOT perform it. Wait retry_after_seconds and ask \
again with the same arguments.
- blocked: an earlier attempt may or may not have happened. Do NOT perform it or retry it. Tell \
the user it is unresolved; a person checks and resolves it.
- approval_required: a person must approve it. Do NOT perform it. Tell the user (approval_id); \
ask again after approval.
- denied: policy or a spending limit refused it (reason). Do NOT perform it. Tell the user.
The key must name the action itself, built from the work's own identifiers \
("refund:txn_8812", "welcome-email:user_123"), so that a retry of the same action gives the same \
key. Never build it from the current time, a counter or a random value. If the action costs \
money, ALWAYS send estimated_cost_micros. If the answer has budget_warning, tell the user."""

REPORT = """\
Record what happened after you performed an action that begin_effect answered "execute". Send \
key, lease_token and lease_secret from that answer and one outcome:
- committed: it happened. Send its result: a repeat of this action is answered with it.
- failed: it certainly did NOT happen (e.g. the vendor refused it before acting). A later \
begin_effect with the same key may try again.
- ambiguous: you cannot tell (timeout, lost reply, crash). The key is then blocked until a \
person resolves it. Never report failed when you are unsure.
Report before the lease ends (lease_expires_at), or call extend_lease; otherwise the outcome \
counts as unknown. An error StaleLease means you no longer hold it: do not perform it again."""

EXTEND = """\
Keep holding an effect while a long action is still running: the lease then ends `seconds` from \
now. Call it before lease_expires_at; once a lease has ended the effect counts as ambiguous and \
this call fails with StaleLease (do not perform the action again then)."""

RESOLVE = """\
Settle an effect whose outcome is unknown (decision "blocked"), after checking at the vendor \
what really happened: committed (it happened; send its result if you have it) or failed (it did \
not happen; a later begin_effect may run it). Only resolve what you have verified. `by` names \
who verified it."""

UNWIND = """\
Undo a multi-step task whose steps were begun with this group_key: committed steps are undone \
newest first, each at most once. The answer sorts every step into one list:
- compensated: undone.
- to_compensate: undo it yourself, in the order listed: call begin_effect with exactly the \
arguments under its begin_effect, perform the compensation it shows, then report_effect. Call \
unwind_group again afterwards to confirm.
- unresolved: its outcome or its undo's is unknown, or another effect took its undo's key; a \
person must check it first.
- irreversible: no compensation was declared, so it cannot be undone.
- failed: the undo itself failed. skipped: nothing happened, nothing to undo.
Tell the user about every unresolved, irreversible or failed step."""

_Key = Annotated[str, Field(description=(
    "The effect key: one logical action's idempotency key, built from the work's own "
    "identifiers, e.g. \"refund:txn_8812\" or \"invoice:2026-08:acct_88123\". The same action "
    "retried must give the same key; never use the time or a random value."))]
# A JSON value with a real schema type (object, array, string, number, boolean or null), so a
# client's tool-call generator knows what it may send.
Json = dict[str, Any] | list[Any] | str | int | float | bool | None

_Token = Annotated[int, Field(description="lease_token from begin_effect's answer.")]
_Secret = Annotated[str, Field(description=(
    "lease_secret from begin_effect's answer: the proof that you hold this effect. Keep it to "
    "yourself."))]


def build_server(gate: eg.Gate, *, allow_resolve: bool = False,
                 name: str = "effectgate", console_url: str | None = None,
                 approval_wait_seconds: float = 300.0,
                 state_keys: RoundKeys | None = None,
                 input_ended: anyio.Event | None = None) -> GateServer:
    """An MCP server whose tools drive ``gate``. ``allow_resolve`` offers ``resolve_effect``.

    ``console_url``: where the console runs; an ``approval_required`` answer to a client that
    declared URL-mode elicitation then sends it to the console's approval page and waits (at
    most ``approval_wait_seconds``) for a person's decision there: mid-call on the handshake
    protocols (:mod:`.elicit`), through an input-required round on 2026-07-28
    (:mod:`.multiround`, its ``requestState`` sealed under ``state_keys``, default
    :meth:`RoundKeys.from_env`). Such a wait ends at once when the client's input has ended
    (stdio: it closed stdin; :attr:`GateServer.input_ended`); ``input_ended``: an event that
    ends them when set, and the one a stdio run sets (default: a new one for each run)."""
    console = check_console_url(console_url)
    keys = state_keys if state_keys is not None else RoundKeys.from_env()
    server = GateServer(
        ApprovalElicitor(gate, console or "http://unused.invalid",
                         wait_seconds=approval_wait_seconds, input_ended=input_ended),
        input_ended, name, log_level="WARNING", request_state_security=keys.security(),
        instructions=(
        "Call begin_effect immediately before every action with a side effect and obey its "
        "decision: only 'execute' performs the action; then call report_effect."))
    rounds = ApprovalRounds(keys, console, lambda approval_id: (
        server.elicitor.wait_decided(approval_id)))
    server.middleware.append(_UnknownPrompt(server))

    @server.tool(description=BEGIN, structured_output=False)
    async def begin_effect(
        effect_type: Annotated[str, Field(description=(
            "The kind of action, namespaced: \"payment.refund\", \"email.send\", "
            "\"github.pr.create\". Approvals and spending limits are set per type."))],
        key: _Key,
        payload: Annotated[dict[str, Any] | None, Field(description=(
            "The action's parameters, exactly as you will send them. Only a hash is stored. "
            "Reusing a key with other parameters is refused, which catches two actions "
            "sharing one key."))] = None,
        estimated_cost_micros: Annotated[int | None, Field(ge=0, description=(
            "What the action will cost at the vendor, in micro-units (1000000 = $1). ALWAYS "
            "send it when the action costs money: spending limits count it, and a limit "
            "cannot stop what was never declared."))] = None,
        vendor: Annotated[str | None, Field(description=(
            "The vendor that performs it, when known: " + ", ".join(sorted(eg.VENDOR_RULES))
            + ". The answer then carries vendor_idempotency_key shaped for that vendor."))]
        = None,
        group_key: Annotated[str | None, Field(description=(
            "Set when this is one step of a multi-step task that must be undone as a whole if "
            "it fails, e.g. \"booking:trip_8812\"; unwind_group undoes the group."))] = None,
        compensation: Annotated[Json, Field(description=(
            "How to undo THIS step if its group is unwound, e.g. {\"tool\": "
            "\"cancel_booking\", \"booking_ref\": \"BK-1\"}. Declare it now, while you know; "
            "a step without one is irreversible."))] = None,
        compensates_effect_id: Annotated[int | None, Field(description=(
            "Only when this action undoes an earlier one: that effect's effect_id."))] = None,
        lease_seconds: Annotated[float | None, Field(gt=0, description=(
            "How long the action may take. Report or extend_lease before it ends, or the "
            "outcome counts as unknown."))] = None,
        run_id: Annotated[str | None, Field(description=(
            "Groups every effect of one task or conversation."))] = None,
        agent_id: Annotated[str | None, Field(description="Who you are (the agent).")] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any] | InputRequiredResult:
        fields = dict(
            effect_type=effect_type, key=key, payload=payload or {},
            estimated_cost_micros=estimated_cost_micros, vendor=vendor,
            group_key=group_key, compensation=compensation,
            compensates_effect_id=compensates_effect_id, lease_seconds=lease_seconds,
            run_id=run_id, agent_id=agent_id,
        )
        retry = rounds.retry(ctx, tool="begin_effect", arguments=fields)  # before any write
        try:
            fields["agent_id"] = agent_for(agent_id)
            await _require_step_held(gate, compensates_effect_id)
            d = await begin_unlost(gate, fields)
            if d.decision is eg.Decision.APPROVAL_REQUIRED and ctx is not None:
                asked = await rounds.answer(ctx, retry, tool="begin_effect", arguments={
                    **fields, "agent_id": agent_id}, key=d.key, approval_id=d.approval_id)
                if isinstance(asked, InputRequiredResult):
                    return asked
                decided = asked or (console is not None and d.approval_id is not None
                                    and await server.elicitor.ask(
                                        _session(ctx), d.approval_id, d.key,
                                        related_request_id=getattr(ctx, "request_id", None)))
                # Decided on the console: ask again; not for a client whose input has ended
                # (an execute lease it could never report on would strand the effect; an
                # approval stays for its next begin).
                ended = server.input_ended
                if decided and (ended is None or not ended.is_set()):
                    d = await begin_unlost(gate, fields)
        except eg.EffectGateError as err:
            raise tool_error(err) from err
        return decision_answer(d)

    @server.tool(description=REPORT, structured_output=False)
    async def report_effect(
        key: _Key,
        lease_token: _Token,
        lease_secret: _Secret,
        outcome: Literal["committed", "failed", "ambiguous"],
        result: Annotated[Json, Field(description=(
            "With committed: the action's result (JSON), returned to every repeat."))] = None,
        error: Annotated[str | None, Field(description=(
            "With failed or ambiguous: what went wrong."))] = None,
        actual_cost_micros: Annotated[int | None, Field(ge=0, description=(
            "What it really cost, in micro-units (1000000 = $1), when known."))] = None,
    ) -> dict[str, Any]:
        try:
            await require_holds(gate, key, "report")
            await gate.areport(eg.Lease(key, lease_token, lease_secret), outcome,
                               result=result, error=error,
                               actual_cost_micros=actual_cost_micros)
        except eg.EffectGateError as err:
            raise tool_error(err) from err
        return {"key": key, "recorded": outcome}

    @server.tool(description=EXTEND, structured_output=False)
    async def extend_lease(
        key: _Key,
        lease_token: _Token,
        lease_secret: _Secret,
        seconds: Annotated[float | None, Field(gt=0, description=(
            "The lease then ends this many seconds from now (default: the gate's lease)."))]
        = None,
    ) -> dict[str, Any]:
        try:
            await require_holds(gate, key, "extend the lease of")
            expires = await gate.aextend_lease(eg.Lease(key, lease_token, lease_secret),
                                               seconds)
        except eg.EffectGateError as err:
            raise tool_error(err) from err
        return {"key": key, "lease_expires_at": expires.isoformat().replace("+00:00", "Z")}

    if allow_resolve:

        @server.tool(description=RESOLVE, structured_output=False)
        async def resolve_effect(
            key: _Key,
            outcome: Literal["committed", "failed"],
            by: Annotated[str, Field(description="Who verified the outcome.")],
            result: Annotated[Json, Field(description=(
                "With committed: the action's result, if known."))] = None,
            note: Annotated[str | None, Field(description="How it was verified.")] = None,
        ) -> dict[str, Any]:
            try:
                operator_only("resolve")
                record = await gate.aresolve(key, outcome, by=by, result=result, note=note)
            except eg.EffectGateError as err:
                raise tool_error(err) from err
            return _record(record.as_dict())

    @server.tool(description=UNWIND, structured_output=False)
    async def unwind_group(
        group_key: Annotated[str, Field(description=(
            "The group_key the steps were begun with."))],
        by: Annotated[str, Field(description="Who asks for the undo.")] = "mcp-agent",
    ) -> dict[str, Any]:
        try:
            operator_only("unwind")
            return await gate.store.on_worker(unwind_answer, gate, group_key, by)
        except eg.EffectGateError as err:
            raise tool_error(err) from err

    return server


class GateServer(MCPServer):
    """The server :func:`build_server` returns: an ``MCPServer`` whose stdio (``run()``,
    ``run("stdio")``, ``await run_stdio_async()``) is effectgate's, as under ``effectgate mcp
    serve`` (:func:`~.stdio.run_stdio`): a line the SDK cannot read is answered, calls still
    running at the end of input are answered before it exits, and :attr:`input_ended` is set
    then, so an approval elicited from a client that closed stdin is waited for no longer. Its
    ``run("streamable-http")`` and ``run("sse")`` are refused (:func:`_unguarded`)."""

    def __init__(self, elicitor: ApprovalElicitor, input_ended: anyio.Event | None,
                 *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.elicitor = elicitor
        """What elicits approvals (its ``input_ended`` that of the stdio run under way)."""
        self._given = input_ended

    @property
    def input_ended(self) -> anyio.Event | None:
        """Set when the client's input has ended; None outside a stdio run (HTTP), unless
        :func:`build_server` was given one."""
        return self.elicitor.input_ended

    async def run_stdio_async(self) -> None:
        """Serve on this process's stdin and stdout until the client closes stdin.
        :class:`~effectgate.ConfigError` while stdio is already served in this process (a
        second run at once could serve no client: :func:`~.stdio.check_stdio_free`), before
        this server's elicitor is touched."""
        check_stdio_free()
        ended = self._given if self._given is not None else anyio.Event()
        before, self.elicitor = self.elicitor, dataclasses.replace(self.elicitor,
                                                                   input_ended=ended)
        try:
            await run_stdio(self._lowlevel_server, ended)
        finally:
            self.elicitor = before

    async def run_streamable_http_async(self, **options: Any) -> None:
        """Refused (:class:`~effectgate.ConfigError`): see :func:`_unguarded`."""
        raise _unguarded("streamable-http")

    async def run_sse_async(self, **options: Any) -> None:
        """Refused (:class:`~effectgate.ConfigError`): see :func:`_unguarded`."""
        raise _unguarded("sse")


def _unguarded(transport: str) -> eg.ConfigError:
    """The SDK's own ``run(transport)`` over HTTP listened with no authentication, on any
    address it was given and with no rebinding protection: anyone who reached the port
    could begin, or (``allow_resolve``) resolve an AMBIGUOUS effect FAILED and have it run
    again. :func:`serve` serves HTTP with all three."""
    return eg.ConfigError(
        f"build_server(...).run({transport!r}) would serve the gate over HTTP with no "
        "authentication: use effectgate.integrations.mcp.serve(gate, transport='http') or "
        "'effectgate mcp serve --transport http' (bearer tokens, a loopback address unless "
        "allowed, rebinding protection), or mount server.streamable_http_app() behind your "
        "own authentication")


def unwind_answer(gate: eg.Gate, group_key: str, by: str) -> dict[str, Any]:
    """``gate.unwind(group_key)`` as JSON for an agent. A step whose effect type has no
    compensator in this process is handed to the agent under ``to_compensate``, with the exact
    ``begin_effect`` arguments of its undo: the same effect that ``unwind`` itself would begin,
    so the undo runs at most once whoever performs it. The effect found at the undo's key
    counts only when it is that undo (:func:`is_undo`); another effect there leaves the step
    unresolved."""
    # Steps handed to the agent hold back the older ones this process would undo: undos
    # run newest first, whoever performs them.
    report = sagas.unwind(gate, group_key, by, hand_off=True)
    answer = report.as_dict()
    answer["failed"], answer["to_compensate"] = [], []
    for step in report.failed:
        if gate.compensator_for(step.effect_type) is not None:  # it ran and failed
            answer["failed"].append(step.as_dict())
            continue
        record = gate.get_by_id(step.effect_id)
        undo, done = sagas.undo_at(gate, record)  # (a sha256:… step's undo: maybe the old key)
        state = done.state.value if done is not None else None
        row = step.as_dict() | {"compensation_effect_id": done.effect_id if done else None}
        if done is not None and not is_undo(done, undo):
            answer["unresolved"].append(row | {
                "compensation_effect_id": None,
                "detail": "its undo's key is taken by another effect "
                          f"({done.effect_type}, effect {done.effect_id}): a person must check it"})
        elif state == "committed" and done is not None and sagas.ran_before(
                done, gate.get(record.key)):  # begun before the step committed: undid nothing
            answer["failed"].append(step.as_dict())
        elif state == "committed":
            assert done is not None
            answer["compensated"].append(row | {"detail": "compensated by an agent",
                                                "result": done.result})
        elif state in (None, "failed"):
            answer["to_compensate"].append(row | {
                "detail": "perform this undo yourself", "compensation": record.compensation,
                "begin_effect": undo})
        else:
            answer["unresolved"].append(row | {"detail": f"its compensation is {state}"})
    answer["complete"] = not (answer["unresolved"] or answer["failed"]
                              or answer["to_compensate"])
    if answer["to_compensate"]:
        answer["instruction"] = (
            "Undo each step in to_compensate, in the order listed: call begin_effect with "
            "exactly its begin_effect arguments; on execute, perform what its compensation "
            "describes and report_effect. Then call unwind_group again to confirm.")
    return answer


is_undo = sagas.is_undo  # the one test: unwind, this server and the console apply it


class _UnknownPrompt:
    """``prompts/get`` of a prompt this server does not have is an invalid-params error, not the
    SDK's internal error (this server offers no prompts)."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        if ctx.method == "prompts/get":
            name = (ctx.params or {}).get("name")
            if name not in {p.name for p in await self.server.list_prompts()}:
                raise MCPError(INVALID_PARAMS, f"Unknown prompt: {str(name)[:100]}")
        return await call_next(ctx)


async def _require_step_held(gate: eg.Gate, effect_id: int | None) -> None:
    """:class:`~effectgate.Forbidden` unless the authenticated agent began the step an undo
    names (``compensates_effect_id``): an undo acts on that step — ``unwind`` counts the step
    compensated once it commits — and an agent acts only on what it holds."""
    who = caller()
    if who is not None and effect_id is not None:
        require_holder(who, await gate.store.on_worker(gate.get_by_id, effect_id), "compensate")


def _session(ctx: Any) -> Any:
    """The client session of a tool call's context (None outside a session)."""
    try:
        return ctx.session
    except Exception:
        return None


def _record(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != "history" and v is not None}


def rebinding_protection(host: str) -> TransportSecuritySettings | None:
    """The Host/Origin check for an HTTP server listening on ``host``. On a loopback address a
    request is served only when its ``Host`` is that address or another loopback name
    (:func:`effectgate.net.loopback_host_names`, any port; else 421) and its ``Origin``, if
    any, is ``http://`` one of them (else 403): a web page that DNS-rebinds its own name to
    this address cannot drive the server, with or without ``--no-auth``. None off loopback,
    where the bearer tokens are the protection."""
    names = loopback_host_names(host)
    if not names:
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[form for name in names for form in (name, f"{name}:*")],
        allowed_origins=[form for name in names
                         for form in (f"http://{name}", f"http://{name}:*")])


def serve(gate: eg.Gate, *, transport: Literal["stdio", "http"] = "stdio",
          host: str = "127.0.0.1", port: int = 8000, allow_resolve: bool = False,
          allow_remote: bool = False, guard: HttpGuard | None = None,
          out: TextIO | None = None, auth: bool = True,
          console_url: str | None = None) -> None:
    """Run :func:`build_server` over stdio or streamable HTTP (``http://host:port/mcp``; port
    0 picks a free one). Prints where it listens, and whether requests are authenticated, on
    ``out`` (stderr). HTTP requires a bearer token of an agent principal
    (:func:`.transport.bearer_guard`) unless ``auth=False``, which only a loopback address may
    use; it listens on a loopback address unless ``allow_remote`` or a ``guard``;
    :class:`~effectgate.ConfigError` otherwise. On a loopback address a request naming another
    host is refused (:func:`rebinding_protection`). On stdio a request line the SDK cannot read
    gets the JSON-RPC error HTTP gives it (:class:`~.stdio.Answered`). ``console_url``: see
    :func:`build_server`."""
    out = out if out is not None else sys.stderr
    server = build_server(gate, allow_resolve=allow_resolve, console_url=console_url)
    if transport == "stdio":
        print("effectgate: mcp serve listening on stdio", file=out, flush=True)
        server.run("stdio")  # GateServer.run_stdio_async, as for a library user
        return
    check_bind(host, port, allow_remote=allow_remote, guard=guard)
    guard, said = http_auth(gate, host, auth=auth, guard=guard,
                            what="report, extend or unwind another's effects")
    sock = listen(host, port)
    app = server.streamable_http_app(host=host, transport_security=rebinding_protection(host))
    try:
        anyio.run(functools.partial(serve_http, app, sock, what="mcp serve", out=out,
                                    guard=guard, auth=said))
    finally:
        sock.close()

