"""A streamable-HTTP MCP server that runs ``send_message`` (one ``$LEDGER`` line per call) and
then answers with a reply the mcp client cannot read: a JSON string holding a lone UTF-16
surrogate escape (``"\\ud83d"``), as JavaScript's ``JSON.stringify`` writes a string cut inside
an emoji. Valid JSON; the client makes up a PARSE_ERROR for it, after the call ran.

``MODE=sse`` answers the same as a server-sent event. Run:
``python tests/mcp_unreadable_upstream.py PORT`` (a raw ASGI app on uvicorn)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import uvicorn

SEND_MESSAGE = {"name": "send_message", "description": "Send a text message. Irreversible.",
                "inputSchema": {"type": "object", "required": ["to", "text"],
                                "properties": {"to": {"type": "string"},
                                               "text": {"type": "string"}}}}


async def _body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["method"] != "POST":
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    request = json.loads(await _body(receive))

    async def reply(text: str, kind: bytes = b"application/json") -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", kind)]})
        await send({"type": "http.response.body", "body": text.encode()})

    if "id" not in request:  # a notification
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    rid, method = json.dumps(request["id"]), request["method"]
    params = request.get("params") or {}
    if method == "initialize":
        result = json.dumps({"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                             "capabilities": {"tools": {}},
                             "serverInfo": {"name": "unreadable", "version": "1"}})
    elif method == "tools/list":
        result = json.dumps({"tools": [SEND_MESSAGE]})
    elif method == "tools/call":
        arguments = params.get("arguments") or {}
        with open(os.environ["LEDGER"], "a", encoding="utf-8") as ledger:
            ledger.write(f"sms:{arguments.get('to')}:{arguments.get('text')}\n")
        result = '{"content":[{"type":"text","text":"sent \\ud83d"}]}'  # a lone surrogate
    elif method == "ping":
        result = "{}"
    else:
        await reply(f'{{"jsonrpc":"2.0","id":{rid},"error":{{"code":-32601,"message":"no"}}}}')
        return
    answer = f'{{"jsonrpc":"2.0","id":{rid},"result":{result}}}'
    if os.environ.get("MODE") == "sse":
        await reply(f"event: message\ndata: {answer}\n\n", b"text/event-stream")
    else:
        await reply(answer)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
