"""An upstream's own tasks (the Tasks extension, ``io.modelcontextprotocol/tasks``, SEP-2663,
MCP 2026-07-28) as the way a gated call runs and, after a crash, as its reconciler.

When the upstream is reached over streamable HTTP (a process that outlives the gateway) and
declares the extension, the gateway sends each gated call on a 2026-07-28 request that declares
the extension too, so the upstream may answer with a task. The task's id is then recorded with
the effect at once (``EffectRecord.vendor_ref``, written by the holder's heartbeat, fenced by its
lease: :func:`task_ref`), and the gateway polls ``tasks/get`` while it heartbeats the lease; the
task's end is the call's outcome as if it had answered at once.

If the gateway dies while the upstream works, the lease lapses and the effect is AMBIGUOUS.
:meth:`UpstreamTasks.reconcile` is then its reconcile hook (the gateway registers it for its
gated effect types, so a repeat of the call in a new gateway process asks it, as does
``gate.reconcile``): it asks the upstream's ``tasks/get`` for the recorded id and

* ``completed`` → COMMITTED with the task's result (a tool error, ``isError``, is FAILED only
  where the gateway counts tool errors as failed, else unknown);
* ``failed`` → FAILED only when its error carries one of ``rejected_before_run`` (the gateway
  gives none: a task exists only once the upstream took the call, and its error may come from
  a tool that had acted), else unknown;
* ``cancelled``, ``working``, ``input_required``, an id the upstream does not know (or no
  longer keeps), a record without a task id of this attempt, or no answer → unknown: the
  effect stays AMBIGUOUS (the extension does not say a cancelled task never acted).

A stdio upstream is never asked for tasks: it ends with the gateway that started it, and its
tasks with it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio

import effectgate as eg
from effectgate.validate import seconds as checked_seconds

from .tasks import TASKS_EXTENSION, DetailedTask, GetTaskParams, GetTaskRequest, TaskHandle

try:
    from mcp import ClientSession, types
    from mcp.client.extension import ClaimContext, ResultClaim
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.upstream_tasks needs the mcp package: '
        'pip install "effectgate[mcp]"') from err

__all__ = ["REF_KIND", "TaskCall", "UpstreamTasks", "declares_tasks", "get_task", "task_ref",
           "task_ref_of"]

log = logging.getLogger("effectgate")

REF_KIND = "mcp-task"
"""The ``kind`` of a vendor ref that names an upstream task."""

_MAX_TASK_ID = 512


def declares_tasks(capabilities: types.ServerCapabilities | None) -> bool:
    """True when an upstream's capabilities declare the Tasks extension."""
    return TASKS_EXTENSION in (getattr(capabilities, "extensions", None) or {})


def task_ref(attempt: int, task_id: str) -> str:
    """The vendor ref recorded for attempt ``attempt`` run as the upstream task ``task_id``."""
    return json.dumps({"kind": REF_KIND, "attempt": attempt, "task_id": task_id},
                      separators=(",", ":"))


def task_ref_of(record: eg.EffectRecord) -> str | None:
    """The upstream task id a record names for its current attempt; None when it names none,
    names another attempt's, or is not a task ref."""
    if not record.vendor_ref:
        return None
    try:
        ref = json.loads(record.vendor_ref)
    except ValueError:
        return None
    if not isinstance(ref, dict) or ref.get("kind") != REF_KIND:
        return None
    task_id, attempt = ref.get("task_id"), ref.get("attempt")
    if (not isinstance(task_id, str) or not task_id or len(task_id) > _MAX_TASK_ID
            or isinstance(attempt, bool) or attempt != record.attempt):
        return None
    return task_id


class TaskCall(Exception):
    """A call run as an upstream task that did not complete (failed, cancelled, asked for
    input the gateway cannot relay): its status and the upstream's error, if any."""

    def __init__(self, status: str, error: dict[str, Any] | None = None) -> None:
        self.status, self.error = status, error
        detail = (error or {}).get("message")
        super().__init__(f"the upstream task ended {status}" + (f": {detail}" if detail else ""))


async def _unresolved(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
    raise RuntimeError("a task handle is resolved by UpstreamTasks.call")  # allow_claimed


class _AsAnswered(ClientSession):
    """A session that hands back a tool's result as the upstream answered it, as the
    gateway's plain path does: no check of its structured content against the tool's output
    schema (which lists the tools again, and raises after the tool acted)."""

    async def validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
        """Nothing to check: the gateway forwards (and records) the answer as it came."""


class UpstreamTasks:
    """The Tasks extension of the upstream at ``url`` (streamable HTTP), on 2026-07-28 requests
    that declare it: each use opens its own connection (so it works in any event loop, e.g. a
    reconcile hook run by a sync ``gate.reconcile``).

    ``rejected_before_run`` are the JSON-RPC error codes that mean the upstream refused a call
    before running it; ``tool_errors`` is the gateway's reading of a tool error;
    ``call_timeout``: how long the call may wait for its answer (a result or a task), and each
    ``tasks/get`` for its own, the SDK's request timeout (None: no limit; else more than 0 and
    at most a week, or :class:`~effectgate.ConfigError`, checked here: the SDK reads it only
    once the call has left). A task the upstream says is working is followed for as long as
    it says so."""

    def __init__(self, url: str, *, rejected_before_run: frozenset[int] = frozenset(),
                 tool_errors: Literal["ambiguous", "failed"] = "ambiguous",
                 redact: Callable[[str, Any], Any] | None = None,
                 connect_timeout: float = 30.0, poll_every: float = 0.25,
                 call_timeout: float | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise eg.ConfigError("upstream tasks need a streamable HTTP upstream")
        self.url = url
        self.rejected_before_run = rejected_before_run
        self.tool_errors = tool_errors
        self.redact = redact
        self.connect_timeout = connect_timeout
        self.poll_every = poll_every
        self.call_timeout = (None if call_timeout is None
                             else checked_seconds(call_timeout, "call_timeout"))

    @asynccontextmanager
    async def session(self) -> AsyncIterator[ClientSession]:
        """A 2026-07-28 session that declares the extension (``server/discover`` answered)."""
        claim = ResultClaim(result_type="task", model=TaskHandle, resolve=_unresolved)
        failure: Exception | None = None
        async with streamable_http_client(self.url) as streams, _AsAnswered(
                streams[0], streams[1], extensions={TASKS_EXTENSION: {}},
                result_claims={TASKS_EXTENSION: [claim]}) as session:
            with anyio.fail_after(self.connect_timeout):
                found = await session.discover()
            if not declares_tasks(found.capabilities):
                raise ConnectionError("the upstream does not declare the Tasks extension")
            try:
                yield session
            except Exception as err:  # raised as itself, not in the transport's group
                failure = err
        if failure is not None:
            raise failure

    async def call(self, params: types.CallToolRequestParams,
                   sending: Callable[[], None],
                   started: Callable[[TaskHandle], Awaitable[None]]) -> types.CallToolResult:
        """Send the call (``sending()`` just before it leaves; :class:`~effectgate.NotExecuted`
        when the upstream cannot be reached first), and when the upstream answers with a task,
        ``await started(handle)`` and poll ``tasks/get`` until it ends. Its result; a task that
        did not complete raises :class:`TaskCall`."""
        async with self._opened() as session:
            sending()
            answer = await session.call_tool(params.name, params.arguments,
                                             read_timeout_seconds=self.call_timeout,
                                             meta=params.meta, allow_claimed=True)
            if isinstance(answer, types.CallToolResult):
                return answer
            if not isinstance(answer, TaskHandle):
                raise MCPError(types.INTERNAL_ERROR, "the upstream answered with neither a "
                               "result nor a task")
            if not answer.task_id or len(answer.task_id) > _MAX_TASK_ID:
                raise TaskCall("unusable", {"message": "the upstream's task id is unusable"})
            await started(answer)
            try:
                task = await self._poll(session, answer.task_id)
            except Exception as err:  # the upstream took the call: never "nothing happened"
                raise TaskCall("unknown", {"message": "the upstream's task could not be "
                                           f"followed: {type(err).__name__}: {err}"}) from err
        if task.status == "completed" and task.result is not None:
            return types.CallToolResult.model_validate(task.result)
        raise TaskCall(task.status, task.error)

    @asynccontextmanager
    async def _opened(self) -> AsyncIterator[ClientSession]:
        entered = False
        try:
            async with self.session() as session:
                entered = True
                yield session
        except Exception as err:
            if entered:
                raise
            raise eg.NotExecuted(f"the upstream refused before receiving the call: {err}",
                                 reason=str(err)) from err

    async def _poll(self, session: ClientSession, task_id: str) -> DetailedTask:
        while True:
            task = await get_task(session, task_id, self.call_timeout)
            if task.status in ("completed", "failed", "cancelled"):
                return task
            if task.status == "input_required":
                return task  # not relayed: the call ends AMBIGUOUS (it may have acted)
            pause = (task.poll_interval_ms or self.poll_every * 1000) / 1000
            await anyio.sleep(min(max(pause, 0.05), 5.0))

    async def get(self, task_id: str) -> DetailedTask:
        """``tasks/get`` of one task (``MCPError`` for a task the upstream does not know)."""
        async with self.session() as session:
            return await get_task(session, task_id, self.call_timeout)

    async def reconcile(self, record: eg.EffectRecord) -> eg.Reconciled:
        """The reconcile hook of an AMBIGUOUS effect the gateway ran as an upstream task: the
        upstream's ``tasks/get`` of the recorded task decides (see the module)."""
        task_id = task_ref_of(record)
        if task_id is None:
            return eg.Reconciled("unknown", note="no upstream task recorded for this attempt")
        try:
            task = await self.get(task_id)
        except MCPError as err:
            return eg.Reconciled("unknown", note=f"the upstream does not know task: "
                                 f"{err.error.message}"[:500])
        if task.task_id != task_id:
            return eg.Reconciled("unknown", note="the upstream answered for another task")
        if task.status == "completed" and task.result is not None:
            try:
                result = types.CallToolResult.model_validate(task.result)
            except ValueError:
                return eg.Reconciled("unknown", note="the upstream task's result is malformed")
            if result.is_error:
                return eg.Reconciled("failed" if self.tool_errors == "failed" else "unknown",
                                     note="the upstream task completed with a tool error")
            stored: Any = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            if self.redact is not None:
                stored = self.redact(record.effect_type, stored)
            return eg.Reconciled("committed", stored, note="upstream task completed")
        code = (task.error or {}).get("code")
        if task.status == "failed" and isinstance(code, int) and (
                code in self.rejected_before_run):
            return eg.Reconciled("failed", note=f"the upstream refused the call before running "
                                 f"it ({code})")
        return eg.Reconciled("unknown", note=f"the upstream task is {task.status}")


async def get_task(session: ClientSession, task_id: str,
                   timeout: float | None = None) -> DetailedTask:
    """One ``tasks/get``, answered within ``timeout`` seconds (None: no limit) or
    ``MCPError`` ``-32001``."""
    return await session.send_request(
        GetTaskRequest(params=GetTaskParams(task_id=task_id)), DetailedTask,
        request_read_timeout_seconds=timeout)
