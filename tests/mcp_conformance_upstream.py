"""An MCP server with the fixtures the official conformance suite's server scenarios call
(``test_simple_text``, ``test_tool_with_logging``, ``test_sampling``, ``test://static-text``,
``test_prompt_with_arguments``, ...), after the suite's own example server, so that running
the suite against it directly and through the gateway shows what the gateway passes on:
logging, progress, sampling and elicitation during a call, resources, prompts, completions.

It also serves the Tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663, 2026-07-28)
server-side, with the fixtures the suite's tasks scenarios call (``greet``, ``slow_compute``,
``failing_job``, ``protocol_error_job``): a 2026-07-28 request that declares the extension on a
task-supporting tool is answered with a task, run in this process and answered by
``tasks/get`` / ``tasks/cancel`` (``tasks/update`` is acknowledged). This is the upstream the
gateway's upstream tasks are tested against (``tests/test_mcp_upstream_tasks.py``): with
``FIXTURE_RUNS`` set, each ``slow_compute`` that finishes appends its ``label`` to that file;
``FIXTURE_MAX_SECONDS`` caps how long one sleeps.

Run: ``python tests/mcp_conformance_upstream.py`` (stdio) or ``... --http PORT`` (0: a free
port, printed on stderr).
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import sys
import warnings
from typing import Any

import anyio
import anyio.abc
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import MISSING_REQUIRED_CLIENT_CAPABILITY, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict

warnings.simplefilter("ignore")  # the logging capability's deprecation, on purpose

IMAGE = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJ"
         "RU5ErkJggg==")
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
EMPTY: dict[str, Any] = {"type": "object", "properties": {}}


def _tool(name: str, schema: dict[str, Any] | None = None) -> types.Tool:
    return types.Tool(name=name, description=f"conformance fixture {name}",
                      input_schema=schema or EMPTY)


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


TOOLS = [_tool(n) for n in (
    "test_simple_text", "test_image_content", "test_audio_content", "test_embedded_resource",
    "test_multiple_content_types", "test_tool_with_logging", "test_tool_with_progress",
    "test_error_handling", "test_elicitation_sep1034_defaults",
    "test_elicitation_sep1330_enums")] + [
    _tool("test_sampling", {"type": "object", "properties": {"prompt": {"type": "string"}},
                            "required": ["prompt"]}),
    _tool("test_elicitation", {"type": "object", "properties": {"message": {"type": "string"}},
                               "required": ["message"]}),
    _tool("greet", {"type": "object", "properties": {"name": {"type": "string"}}}),
    _tool("slow_compute", {"type": "object", "properties": {
        "seconds": {"type": "number"}, "label": {"type": "string"}}}),
    _tool("failing_job"), _tool("protocol_error_job"),
]
TASK_TOOLS = {"slow_compute", "failing_job", "protocol_error_job"}
TASKS = "io.modelcontextprotocol/tasks"
DEFAULTS = {"type": "object", "required": [], "properties": {
    "name": {"type": "string", "description": "User name", "default": "John Doe"},
    "age": {"type": "integer", "description": "User age", "default": 30},
    "score": {"type": "number", "description": "User score", "default": 95.5},
    "status": {"type": "string", "description": "User status",
               "enum": ["active", "inactive", "pending"], "default": "active"},
    "verified": {"type": "boolean", "description": "Verification status", "default": True}}}
ENUMS = {"type": "object", "required": [], "properties": {
    "untitledSingle": {"type": "string", "description": "Select one option",
                       "enum": ["option1", "option2", "option3"]},
    "titledSingle": {"type": "string", "description": "Select one option with titles",
                     "oneOf": [{"const": "value1", "title": "First Option"},
                               {"const": "value2", "title": "Second Option"},
                               {"const": "value3", "title": "Third Option"}]},
    "legacyEnum": {"type": "string", "description": "Select one option (legacy)",
                   "enum": ["opt1", "opt2", "opt3"],
                   "enumNames": ["Option One", "Option Two", "Option Three"]},
    "untitledMulti": {"type": "array", "description": "Select multiple options", "minItems": 1,
                      "maxItems": 3,
                      "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
    "titledMulti": {"type": "array", "description": "Select multiple options with titles",
                    "minItems": 1, "maxItems": 3,
                    "items": {"anyOf": [{"const": "value1", "title": "First Choice"},
                                        {"const": "value2", "title": "Second Choice"},
                                        {"const": "value3", "title": "Third Choice"}]}}}}


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def _elicit(ctx: Any, message: str, schema: dict[str, Any]) -> types.ElicitResult:
    request = types.ElicitRequest(params=types.ElicitRequestFormParams(
        message=message, requested_schema=schema))
    return await ctx.session.send_request(  # type: ignore[no-any-return]
        request, types.ElicitResult,
        metadata=ServerMessageMetadata(related_request_id=ctx.request_id))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def _declared(ctx: Any) -> bool:
    """A 2026-07-28 request whose client declared the Tasks extension (on the request)."""
    caps = getattr(ctx, "client_capabilities", None) or getattr(
        getattr(ctx, "session", None), "client_capabilities", None)
    return (getattr(ctx, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS
            and TASKS in (getattr(caps, "extensions", None) or {}))


class Task:
    """One task of this process: its status, and its result or error once it ends."""

    def __init__(self) -> None:
        self.id = secrets.token_urlsafe(18)
        self.status = "working"
        self.created = self.updated = _now()
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.scope = anyio.CancelScope()

    def wire(self, *, detailed: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"taskId": self.id, "status": self.status,
                               "createdAt": self.created, "lastUpdatedAt": self.updated,
                               "ttlMs": 600_000, "pollIntervalMs": 200}
        if detailed and self.status == "completed":
            out["result"] = self.result
        if detailed and self.status == "failed":
            out["error"] = self.error
        return out


class Wire(types.Result):
    """A result given as its wire fields (a task handle, a task)."""

    model_config = ConfigDict(**types.Result.model_config, extra="allow")
    result_type: str = "complete"


class TaskParams(RequestParams):
    task_id: str
    input_responses: dict[str, Any] | None = None


MAX_SECONDS = float(os.environ.get("FIXTURE_MAX_SECONDS") or "inf")
"""The longest a ``slow_compute`` sleeps (``$FIXTURE_MAX_SECONDS``; unset: as long as asked).
The conformance runs set it: a client the gateway answers only when its upstream's task ends
would otherwise wait out the suite's 60-second sleeps until its own 10-second timeout."""

TASK_RUNS: dict[str, Task] = {}
TASK_GROUP: list[anyio.abc.TaskGroup] = []


async def _work(name: str, args: dict[str, Any]) -> types.CallToolResult:
    """What a task-supporting tool does (as a task or, undeclared, synchronously)."""
    if name == "slow_compute":
        await anyio.sleep(min(float(args.get("seconds", 1)), MAX_SECONDS))
        label = str(args.get("label", ""))
        if os.environ.get("FIXTURE_RUNS"):
            with open(os.environ["FIXTURE_RUNS"], "a", encoding="utf-8") as runs:
                runs.write(label + "\n")
        return types.CallToolResult(content=[_text(f"computed {label}")],
                                    structured_content={"label": label})
    if name == "failing_job":
        await anyio.sleep(1)
        return types.CallToolResult(is_error=True, content=[_text("the job failed")])
    raise MCPError(types.INTERNAL_ERROR, "protocol_error_job always fails with a protocol error")


async def _as_task(name: str, args: dict[str, Any]) -> Wire:
    task = Task()
    TASK_RUNS[task.id] = task

    async def run() -> None:
        with task.scope:
            try:
                result = await _work(name, args)
                task.result = result.model_dump(mode="json", by_alias=True, exclude_none=True)
                task.status = "completed"
            except MCPError as err:
                task.error = err.error.model_dump(mode="json", exclude_none=True)
                task.status = "failed"
            task.updated = _now()

    TASK_GROUP[0].start_soon(run)
    return Wire(result_type="task", **task.wire(detailed=False))


def _task(ctx: Any, params: TaskParams) -> Task:
    if not _declared(ctx):
        raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability",
                       {"requiredCapabilities": {"extensions": {TASKS: {}}}})
    task = TASK_RUNS.get(params.task_id)
    if task is None:
        raise MCPError(types.INVALID_PARAMS, "Failed to retrieve task: Task not found")
    return task


async def get_task(ctx: Any, params: TaskParams) -> Wire:
    return Wire(**_task(ctx, params).wire(detailed=True))


async def cancel_task(ctx: Any, params: TaskParams) -> types.EmptyResult:
    task = _task(ctx, params)
    if task.status == "working":
        task.scope.cancel()
        task.status, task.updated = "cancelled", _now()
    return types.EmptyResult()


async def update_task(ctx: Any, params: TaskParams) -> types.EmptyResult:
    _task(ctx, params)
    return types.EmptyResult()


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
    name, args = params.name, params.arguments or {}
    if name in TASK_TOOLS:
        return await (_as_task(name, args) if _declared(ctx) and TASK_GROUP
                      else _work(name, args))
    if name == "greet":
        return types.CallToolResult(content=[_text(f"Hello, {args.get('name', 'World')}!")])
    image = types.ImageContent(type="image", data=IMAGE, mime_type="image/png")
    if name == "test_simple_text":
        content: list[Any] = [_text("This is a simple text response for testing.")]
    elif name == "test_image_content":
        content = [image]
    elif name == "test_audio_content":
        content = [types.AudioContent(type="audio", data=AUDIO, mime_type="audio/wav")]
    elif name == "test_embedded_resource":
        content = [types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain",
            text="This is an embedded resource content."))]
    elif name == "test_multiple_content_types":
        content = [_text("Multiple content types test:"), image, types.EmbeddedResource(
            type="resource", resource=types.TextResourceContents(
                uri="test://mixed-content-resource", mime_type="application/json",
                text=json.dumps({"test": "data", "value": 123})))]
    elif name == "test_tool_with_logging":
        for step in ("Tool execution started", "Tool processing data",
                     "Tool execution completed"):
            await ctx.session.send_log_message("info", step, related_request_id=ctx.request_id)
            await anyio.sleep(0.05)
        content = [_text("Tool with logging executed successfully")]
    elif name == "test_tool_with_progress":
        for value in (0, 50, 100):
            await ctx.session.report_progress(value, 100, f"Completed step {value} of 100")
            await anyio.sleep(0.05)
        token = (ctx.meta or {}).get("progress_token", 0)
        content = [_text(str(token))]
    elif name == "test_error_handling":
        return types.CallToolResult(is_error=True, content=[
            _text("This tool intentionally returns an error for testing")])
    elif name == "test_sampling":
        request = types.CreateMessageRequest(params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=_text(str(args.get("prompt"))))],
            max_tokens=100))
        answer = await ctx.session.send_request(
            request, types.CreateMessageResult,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
        said = answer.content.text if isinstance(answer.content, types.TextContent) else ""
        content = [_text(f"LLM response: {said}")]
    elif name == "test_elicitation":
        got = await _elicit(ctx, str(args.get("message")), {
            "type": "object", "required": ["response"],
            "properties": {"response": {"type": "string", "description": "User's response"}}})
        content = [_text(f"User response: action={got.action}, content={got.content}")]
    elif name == "test_elicitation_sep1034_defaults":
        got = await _elicit(ctx, "Please review and update the form fields with defaults",
                            DEFAULTS)
        content = [_text(f"Elicitation completed: action={got.action}")]
    elif name == "test_elicitation_sep1330_enums":
        got = await _elicit(ctx, "Please select options from the enum fields", ENUMS)
        content = [_text(f"Elicitation completed: action={got.action}")]
    else:
        return types.CallToolResult(is_error=True, content=[_text(f"unknown tool {name}")])
    return types.CallToolResult(content=content)


RESOURCES = [
    types.Resource(uri="test://static-text", name="static-text", mime_type="text/plain"),
    types.Resource(uri="test://static-binary", name="static-binary", mime_type="image/png"),
    types.Resource(uri="test://watched-resource", name="watched-resource",
                   mime_type="text/plain"),
]


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=RESOURCES)


async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
        uri_template="test://template/{id}/data", name="template",
        mime_type="application/json")])


async def read_resource(ctx: Any,
                        params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    uri = str(params.uri)
    if uri == "test://static-binary":
        item: Any = types.BlobResourceContents(uri=uri, mime_type="image/png", blob=IMAGE)
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        ident = uri.removeprefix("test://template/").removesuffix("/data")
        item = types.TextResourceContents(uri=uri, mime_type="application/json", text=json.dumps(
            {"id": ident, "templateTest": True, "data": f"Data for ID: {ident}"}))
    elif uri in ("test://static-text", "test://watched-resource"):
        item = types.TextResourceContents(
            uri=uri, mime_type="text/plain",
            text="This is the content of the static text resource.")
    else:
        from mcp.shared.exceptions import MCPError

        raise MCPError(-32002, f"Resource {uri} not found")
    return types.ReadResourceResult(contents=[item])


async def subscribe(ctx: Any, params: Any) -> types.EmptyResult:
    return types.EmptyResult()


PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A simple prompt without arguments"),
    types.Prompt(name="test_prompt_with_arguments", description="A prompt with arguments",
                 arguments=[
        types.PromptArgument(name="arg1", required=True),
        types.PromptArgument(name="arg2", required=True)]),
    types.Prompt(name="test_prompt_with_embedded_resource",
                 description="A prompt with an embedded resource", arguments=[
        types.PromptArgument(name="resourceUri", required=True)]),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image"),
]


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=PROMPTS)


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    args = params.arguments or {}

    def user(content: Any) -> types.PromptMessage:
        return types.PromptMessage(role="user", content=content)

    if params.name == "test_simple_prompt":
        messages = [user(_text("This is a simple prompt for testing."))]
    elif params.name == "test_prompt_with_arguments":
        messages = [user(_text(f"Prompt with arguments: arg1='{args.get('arg1')}', "
                               f"arg2='{args.get('arg2')}'"))]
    elif params.name == "test_prompt_with_embedded_resource":
        embedded = types.TextResourceContents(
            uri=args.get("resourceUri", "test://example-resource"), mime_type="text/plain",
            text="Embedded resource content for testing.")
        messages = [user(types.EmbeddedResource(type="resource", resource=embedded)),
                    user(_text("Please process the embedded resource above."))]
    elif params.name == "test_prompt_with_image":
        messages = [user(types.ImageContent(type="image", data=IMAGE, mime_type="image/png")),
                    user(_text("Please analyze the image above."))]
    else:
        from mcp.shared.exceptions import MCPError

        raise MCPError(types.INVALID_PARAMS, f"Prompt {params.name} not found")
    return types.GetPromptResult(messages=messages)


async def complete(ctx: Any, params: Any) -> types.CompleteResult:
    return types.CompleteResult(completion=types.Completion(values=[], total=0, has_more=False))


async def set_level(ctx: Any, params: Any) -> types.EmptyResult:
    return types.EmptyResult()


server: Server[Any] = Server(
    "conformance-fixtures", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool,
    on_list_resources=list_resources, on_list_resource_templates=list_templates,
    on_read_resource=read_resource, on_subscribe_resource=subscribe,
    on_unsubscribe_resource=subscribe, on_list_prompts=list_prompts, on_get_prompt=get_prompt,
    on_completion=complete)
server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
server.add_request_handler("tasks/get", TaskParams, get_task)
server.add_request_handler("tasks/cancel", TaskParams, cancel_task)
server.add_request_handler("tasks/update", TaskParams, update_task)
server.extensions[TASKS] = {}


async def _stdio() -> None:
    async with anyio.create_task_group() as tg, stdio_server() as (read, write):
        TASK_GROUP.append(tg)  # where tasks run
        await server.run(read, write, server.create_initialization_options())
        tg.cancel_scope.cancel()


async def _http(sock: Any) -> None:
    import uvicorn

    config = uvicorn.Config(server.streamable_http_app(host="127.0.0.1"), log_level="warning")
    async with anyio.create_task_group() as tg:
        TASK_GROUP.append(tg)
        await uvicorn.Server(config).serve(sockets=[sock])
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        import socket

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart on its address
        sock.bind(("127.0.0.1", int(sys.argv[2])))
        sock.listen(64)
        print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", file=sys.stderr,
              flush=True)
        anyio.run(_http, sock)
    else:
        anyio.run(_stdio)
