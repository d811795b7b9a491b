"""An MCP server for the gateway's call timeout, run as its own process: one tool never answers.

``hang`` (and ``stall``, the same under another name) appends ``started:REF`` to the ledger
(the file named by the first argument), then waits for ever; when its request is cancelled
(``notifications/cancelled`` on stdio, the closed response stream on streamable HTTP) it
appends ``cancelled:REF``. So does reading the resource ``hang://forever`` (REF ``resource``).
``send`` appends ``sent:REF`` and answers at once.

Run: ``python tests/mcp_hanging_upstream.py LEDGER`` (stdio) or ``... LEDGER --http PORT``;
``... LEDGER --http PORT --tasks`` also declares the Tasks extension (2026-07-28), so a gateway
sends it gated calls as calls that may be answered with a task (``hang`` never answers even
that).
"""

from __future__ import annotations

import sys

import anyio
from mcp.server import MCPServer

server = MCPServer("hanging-upstream")


def _append(line: str) -> None:
    with open(sys.argv[1], "a", encoding="utf-8") as ledger:
        ledger.write(line + "\n")


async def _never_answer(ref: str) -> str:
    _append(f"started:{ref}")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        _append(f"cancelled:{ref}")
        raise
    return "unreachable"


@server.tool()
async def hang(ref: str) -> str:
    """Start an action and never answer."""
    return await _never_answer(ref)


@server.tool()
async def stall(ref: str) -> str:
    """Start another action and never answer."""
    return await _never_answer(ref)


@server.resource("hang://forever")
async def forever() -> str:
    """A resource whose read never answers."""
    return await _never_answer("resource")


@server.tool()
def send(ref: str) -> str:
    """Send at once."""
    _append(f"sent:{ref}")
    return f"sent {ref}"


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[2] == "--http":
        if sys.argv[4:] == ["--tasks"]:
            server._lowlevel_server.extensions["io.modelcontextprotocol/tasks"] = {}
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    else:
        server.run()
