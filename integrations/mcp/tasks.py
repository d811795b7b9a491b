"""The MCP Tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663, MCP 2026-07-28) as an
outcome path of a gated call.

A 2026-07-28 client that declares the extension on a ``tools/call`` may be answered with a task
handle (``resultType: "task"``) instead of the result. Here a gated call becomes a task only
once it **holds the effect's lease** (the gate answered ``execute`` and the body started); a
duplicate, a refusal or an approval round is answered at once, as without the extension.

* while the task runs, the body keeps the lease alive by heartbeating (the gateway extends it
  every third of the lease while the upstream works), so a long call is ``working``, never
  AMBIGUOUS;
* its outcome is recorded by the gate as for any call (COMMITTED with its result, FAILED,
  AMBIGUOUS); ``tasks/get`` answers ``working`` while it runs and then ``completed`` with
  exactly the result the call would have returned without a task (a refusal or an upstream
  error is a tool result with ``isError``, as the extension asks); a repeat of the same call
  afterwards is answered from the store (the duplicate);
* ``tasks/cancel``: a task cancelled before its call provably started (the upstream request
  was never sent) is FAILED and may run again; one cancelled after that is **AMBIGUOUS**,
  never FAILED: the upstream may have acted, and a person resolves it (or the upstream's own
  ``tasks/get`` does, below). Its ``tasks/get`` then says ``cancelled`` and which it was.

Task ids are 192 random bits (the extension lets them act as bearer tokens). Tasks live in the
serving process for ``ttl_ms`` after they end; the effect itself lives in the store, so after a
restart an unknown task id is ``-32602`` while a repeat of its call still gets the duplicate.

The types below are the extension's wire shapes as SDK models (``mcp_types.Result``; the SDK
carries the 2025-11-25 task types only, whose fields differ): the server returns them from
handlers the SDK routes (``Server.add_request_handler``), and :class:`TasksExtension` is the
SDK's own client-extension claim for ``resultType: "task"``, which polls ``tasks/get`` until
the task ends and hands back its ``CallToolResult``.
"""

from __future__ import annotations

import datetime
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc

import effectgate as eg

from .transport import caller

try:
    from mcp import types
    from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
    from mcp.shared.exceptions import MCPError
    from mcp_types import MISSING_REQUIRED_CLIENT_CAPABILITY, RequestParams
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
except ImportError as err:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        'effectgate.integrations.mcp.tasks needs the mcp package: pip install "effectgate[mcp]"'
    ) from err

__all__ = [
    "NOT_SENT", "TASKS_EXTENSION", "CancelTaskParams", "CancelTaskRequest", "DetailedTask",
    "GetTaskParams", "GetTaskRequest", "NotSent", "TaskBoard", "TaskHandle", "TaskRun",
    "TasksExtension", "UpdateTaskParams", "poll", "serve_tasks", "state_reader", "wants_task",
]

log = logging.getLogger("effectgate")

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""The extension's identifier (client and server capabilities, ``extensions``)."""

NOT_SENT = "cancelled (tasks/cancel) before the call was sent: it never started"
"""The error of an effect whose task was cancelled before its call left."""

class NotSent(eg.NotExecuted):
    """A task's call cancelled (``tasks/cancel``) before it left for the upstream: FAILED."""

    def __init__(self, message: str = NOT_SENT, **fields: Any) -> None:
        super().__init__(message, **fields)


TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]


class TaskHandle(types.Result):
    """``CreateTaskResult``: the answer to a call that became a task (``resultType: "task"``)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class DetailedTask(types.Result):
    """``tasks/get``'s answer: the task, with ``result`` once completed (the call's own
    ``CallToolResult``) or ``error`` once failed (a JSON-RPC error)."""

    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class GetTaskParams(RequestParams):
    """``tasks/get`` params."""

    task_id: str


class CancelTaskParams(RequestParams):
    """``tasks/cancel`` params."""

    task_id: str


class UpdateTaskParams(RequestParams):
    """``tasks/update`` params (this server's tasks never ask for input)."""

    task_id: str
    input_responses: dict[str, Any] | None = None


class GetTaskRequest(types.Request[GetTaskParams, Literal["tasks/get"]]):
    """A ``tasks/get`` request (the routing header ``Mcp-Name`` carries the task id)."""

    method: Literal["tasks/get"] = "tasks/get"
    params: GetTaskParams
    name_param = "taskId"


class CancelTaskRequest(types.Request[CancelTaskParams, Literal["tasks/cancel"]]):
    """A ``tasks/cancel`` request."""

    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: CancelTaskParams
    name_param = "taskId"


def wants_task(ctx: Any) -> bool:
    """True when this request is a 2026-07-28 call whose client declared the Tasks extension
    on it (the only client a task handle may be sent to)."""
    if ctx is None or getattr(ctx, "protocol_version", None) not in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = getattr(ctx, "client_capabilities", None)
    if caps is None:
        caps = getattr(getattr(ctx, "session", None), "client_capabilities", None)
    extensions = getattr(caps, "extensions", None) or {}
    return TASKS_EXTENSION in extensions


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class TaskRun:
    """One gated call run as a task: what the body reports (:meth:`holding`,
    :meth:`sending`) and what a ``tasks/cancel`` asked."""

    task_id: str
    held: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    pre_send: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    raised: BaseException | None = None
    key: str | None = None
    sent: bool = False
    cancel_requested: bool = False
    answer: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    created_at: str = field(default_factory=_now)
    updated_at: str = field(default_factory=_now)
    ended: float | None = None
    note: str | None = None
    owner: str | None = None
    """The authenticated agent that started it (None without authentication): only it may
    read, cancel or update the task."""

    def holding(self, key: str) -> None:
        """The body started: the call holds the lease of effect ``key``."""
        self.key = key
        self.held.set()

    def may_send(self) -> bool:
        """Just before the call leaves for the upstream: False when a ``tasks/cancel`` came
        first (the call then provably never started), else marks it sent."""
        if self.cancel_requested:
            return False
        self.sent = True
        return True

    def status(self) -> TaskStatus:
        if not self.done.is_set():
            return "working"
        if self.cancel_requested:
            return "cancelled"
        return "failed" if self.error is not None else "completed"


class TaskBoard:
    """The tasks of one server process: started in its task group, answered by ``tasks/get``
    and cancelled by ``tasks/cancel``. ``state_of(key)`` says what the store holds for an
    effect (its state's name), for a cancelled task's status message."""

    def __init__(self, state_of: Callable[[str], Awaitable[str | None]], *,
                 ttl_ms: int = 3_600_000, poll_interval_ms: int = 250) -> None:
        self.state_of = state_of
        self.ttl_ms, self.poll_interval_ms = ttl_ms, poll_interval_ms
        self._runs: dict[str, TaskRun] = {}

    def new(self) -> TaskRun:
        """A run, not yet started (its id unguessable)."""
        self._forget_expired()
        who = caller()
        return TaskRun(secrets.token_urlsafe(24), owner=None if who is None else who.name)

    async def offer(self, tg: anyio.abc.TaskGroup, run: TaskRun,
                    work: Callable[[], Awaitable[types.CallToolResult]]
                    ) -> types.CallToolResult | TaskHandle:
        """Run ``work`` in ``tg`` under ``run``; answer with its result when it ends before
        holding a lease (duplicate, refusal, approval round: no task), else with a handle."""

        async def go() -> None:
            try:
                with run.scope:
                    result = await work()
                    run.answer = result.model_dump(mode="json", by_alias=True,
                                                   exclude_none=True)
            except Exception as err:  # work() answers every gate outcome itself
                run.raised = err
                if run.key is not None:
                    log.warning("task %s failed: %s", run.task_id, err)
                    run.error = {"code": types.INTERNAL_ERROR, "message": "the call failed"}
            finally:
                run.updated_at, run.ended = _now(), time.monotonic()
                run.done.set()
                run.held.set()

        tg.start_soon(go)
        await run.held.wait()
        if run.done.is_set() and run.key is None:
            if run.raised is not None:
                raise run.raised  # e.g. an approval round (multiround.AskClient)
            assert run.answer is not None
            return types.CallToolResult.model_validate(run.answer)
        self._runs[run.task_id] = run
        return TaskHandle(task_id=run.task_id, status=run.status(),
                          status_message=f"effect {run.key} is executing; its lease is held",
                          created_at=run.created_at, last_updated_at=run.updated_at,
                          ttl_ms=self.ttl_ms, poll_interval_ms=self.poll_interval_ms)

    def _run(self, task_id: str) -> TaskRun:
        self._forget_expired()
        run = self._runs.get(task_id)
        who = caller()
        if run is None or (run.owner is not None and (who is None or who.name != run.owner)):
            # Another agent's task is not found (the spec: bound to its authorisation).
            raise MCPError(types.INVALID_PARAMS, "Failed to retrieve task: Task not found")
        return run

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for task_id, run in list(self._runs.items()):
            if run.ended is not None and now - run.ended > self.ttl_ms / 1000:
                del self._runs[task_id]

    async def get(self, task_id: str) -> DetailedTask:
        """``tasks/get``: ``-32602`` for an unknown (or expired) task."""
        run = self._run(task_id)
        status = run.status()
        message = run.note
        if status == "working":
            message = f"effect {run.key} is executing; its lease is held"
        return DetailedTask(
            task_id=run.task_id, status=status, status_message=message,
            created_at=run.created_at, last_updated_at=run.updated_at, ttl_ms=self.ttl_ms,
            poll_interval_ms=self.poll_interval_ms,
            result=run.answer if status == "completed" else None,
            error=run.error if status == "failed" else None)

    async def cancel(self, task_id: str, *, wait: float = 5.0) -> types.EmptyResult:
        """``tasks/cancel``: stop the call. Before its request left, the effect is released
        (FAILED: it provably never started); after, it is AMBIGUOUS (the upstream may have
        acted). Waits (at most ``wait`` seconds) until the outcome is recorded."""
        run = self._run(task_id)
        if run.done.is_set():
            return types.EmptyResult()  # it ended first: its status stays what it ended as
        run.cancel_requested = True
        (run.scope if run.sent else run.pre_send).cancel()
        state = None
        with anyio.move_on_after(wait):
            await run.done.wait()
            # the gate records a cancelled body's outcome shielded, maybe after the body ended
            while run.key is not None and (state := await self.state_of(run.key)) == "in_flight":
                await anyio.sleep(0.02)
        run.note = (f"cancelled; effect {run.key} is {state}" + (
            ": the call may have acted upstream, so it is not retried; a person resolves it"
            if state == "ambiguous" else
            ": it never left for the upstream, so a new call may run it"
            if state == "failed" else ""))
        return types.EmptyResult()

    async def update(self, task_id: str) -> types.EmptyResult:
        """``tasks/update``: acknowledged (these tasks never ask for input)."""
        self._run(task_id)
        return types.EmptyResult()


def state_reader(gate: Any) -> Callable[[str], Awaitable[str | None]]:
    """``key -> the effect's state`` (its value, e.g. ``"ambiguous"``) read from ``gate``'s
    store off the event loop; None for an unknown key."""

    async def state_of(key: str) -> str | None:
        try:
            record = await gate.store.on_worker(gate.get, key)
        except eg.UnknownEffect:
            return None
        return str(record.state.value)

    return state_of


def _declared(ctx: Any) -> None:
    """``-32021`` (missing required client capability) unless the request declared the
    extension: the ``tasks/*`` methods are the extension's."""
    if not wants_task(ctx):
        raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability",
                       {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}})


def serve_tasks(server: Any, board: TaskBoard) -> None:
    """Route ``tasks/get``, ``tasks/cancel`` and ``tasks/update`` of a low-level ``Server``
    to ``board`` and advertise the extension."""
    server.extensions[TASKS_EXTENSION] = {}

    async def get(ctx: Any, params: GetTaskParams) -> DetailedTask:
        _declared(ctx)
        return await board.get(params.task_id)

    async def cancel(ctx: Any, params: CancelTaskParams) -> types.EmptyResult:
        _declared(ctx)
        return await board.cancel(params.task_id)

    async def update(ctx: Any, params: UpdateTaskParams) -> types.EmptyResult:
        _declared(ctx)
        return await board.update(params.task_id)

    server.add_request_handler("tasks/get", GetTaskParams, get)
    server.add_request_handler("tasks/cancel", CancelTaskParams, cancel)
    server.add_request_handler("tasks/update", UpdateTaskParams, update)


# -- the client side -----------------------------------------------------------------------------

async def poll(session: Any, task_id: str, *, timeout: float | None = None,
               every: float = 0.25) -> DetailedTask:
    """``tasks/get`` on ``session`` until the task ends (or ``timeout`` seconds pass: the last
    answer, still working)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        task: DetailedTask = await session.send_request(
            GetTaskRequest(params=GetTaskParams(task_id=task_id)), DetailedTask)
        if task.status in ("completed", "failed", "cancelled"):
            return task
        if deadline is not None and time.monotonic() >= deadline:
            return task
        pause = (task.poll_interval_ms or every * 1000) / 1000
        await anyio.sleep(min(max(pause, 0.05), 5.0))


class TasksExtension(ClientExtension):
    """The Tasks extension for an SDK ``Client`` / ``ClientSession``: declares it on every
    2026-07-28 request and, through the SDK's result claim, resolves a task handle by polling
    ``tasks/get`` into the call's ``CallToolResult`` (a failed or cancelled task raises
    ``MCPError``)."""

    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=TaskHandle, resolve=self._resolve),)

    @staticmethod
    async def _resolve(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
        task = await poll(ctx.session, handle.task_id)
        if task.status == "completed" and task.result is not None:
            return types.CallToolResult.model_validate(task.result)
        error = task.error or {}
        raise MCPError(int(error.get("code", types.INTERNAL_ERROR)),
                       str(error.get("message") or task.status_message or task.status))
