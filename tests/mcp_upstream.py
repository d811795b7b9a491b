"""A real MCP server for the gateway tests, run as its own process.

``send_message`` appends one line to ``$LEDGER`` per execution: the side effect the tests count.
``slow_send`` writes ``$STARTED`` (with this process's id), sleeps, then sends: the tests kill
the process while it sleeps. ``write_file`` writes a file through the operating system (so a
symlink in the path is followed, as a real file server's write would) and appends the path it
received; ``charge`` answers structured content (and its JSON as text) holding the card it was
given. ``lookup`` is a read. With ``$REFUSE_START`` naming a file that
exists, the server exits before answering anything (an upstream that cannot start); with
``$SLOW_START`` naming a file that exists, it waits ``$SLOW_START_SECONDS`` (5 unless set)
before it answers (a slow start).

Run: ``python tests/mcp_upstream.py`` (stdio) or ``python tests/mcp_upstream.py --http PORT``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

if __name__ == "__main__" and Path(os.environ.get("REFUSE_START") or "/nonexistent").exists():
    sys.exit(3)  # an upstream that cannot start: exits before reading a byte
if __name__ == "__main__" and Path(os.environ.get("SLOW_START") or "/nonexistent").exists():
    import time

    time.sleep(float(os.environ.get("SLOW_START_SECONDS") or 5))  # nothing is read meanwhile

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test-upstream")


def _append(line: str) -> None:
    with open(os.environ["LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(line + "\n")


@server.tool()
def send_message(to: str, text: str, channel: str = "sms") -> str:
    """Send a text message to a phone number. Irreversible."""
    if to == "reject":
        raise ToolError("the carrier rejected the number")
    _append(f"{channel}:{to}:{text}")
    return f"sent {text!r} to {to} by {channel}"


@server.tool()
async def slow_send(to: str, seconds: float) -> str:
    """Send a message after a delay."""
    Path(os.environ["STARTED"]).write_text(str(os.getpid()), encoding="utf-8")
    await asyncio.sleep(seconds)
    _append(f"slow:{to}")
    return f"sent to {to}"


@server.tool()
def write_file(path: str, content: str) -> str:
    """Write a file (the path exactly as received)."""
    _append(f"write:{path}")
    with open(path, "w", encoding="utf-8") as out:
        out.write(content)
    return f"wrote {len(content)} characters to {path}"


@server.tool()
def charge(ref: str, card: str) -> dict[str, str]:
    """Charge a card; the answer names the card."""
    _append(f"charge:{ref}")
    return {"charge_id": f"ch_{ref}", "card": card}


@server.tool()
def lookup(name: str) -> str:
    """Look a contact up (read-only)."""
    return name.upper()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
