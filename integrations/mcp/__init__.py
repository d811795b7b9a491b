"""effectgate over MCP: ``mcp serve`` (the gate as MCP tools, :mod:`.server`) and the gateway in
front of an existing MCP server (:mod:`.gateway`, reaching it through :mod:`.upstream`).

::

    from effectgate.integrations.mcp import build_server
    from effectgate.integrations.mcp.gateway import Gateway, run_gateway

Needs the ``mcp`` extra: ``pip install "effectgate[mcp]"``.
"""

from __future__ import annotations

from .server import build_server, decision_answer, error_answer, serve, tool_error, unwind_answer

__all__ = [
    "build_server", "decision_answer", "error_answer", "serve", "tool_error", "unwind_answer",
]
