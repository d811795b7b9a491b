"""The official MCP conformance suite against ``mcp serve`` and the gateway, beside the
reference everything server (see ``tests/mcp_conformance.py``; run it for the table).

What must hold: the gateway passes every check its upstream passes, through HTTP — all 40 of
the suite's own fixtures (logging, progress, sampling and elicitation during a call,
resources, prompts, completions) and whatever the everything server passes — and it adds the
DNS-rebinding protection the everything server lacks. ``mcp serve`` passes the lifecycle,
transport and tool checks; each check it fails asks for a fixture or a capability it does not
offer (it serves only the gate's tools), never a protocol error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason='needs the mcp extra: pip install "effectgate[mcp]"')

from .mcp_conformance import run_all, score, table
from .mcp_helpers import require_npm

DNS_REBINDING = {"localhost-host-rebinding-rejected"}
NOT_OFFERED = re.compile(r"Method not found|Unknown (prompt|resource)|not found|No \w+ content "
                         r"found|Missing \w+ content|did not request|No (progress|log) "
                         r"notifications")


def test_conformance_of_mcp_serve_and_the_gateway(tmp_path: Path) -> None:
    require_npm("conformance", "mcp-server-everything")
    results = run_all(f"sqlite:///{tmp_path / 'effects.db'}", tmp_path)
    (tmp_path / "table.txt").write_text(table(results), encoding="utf-8")
    print(table(results))

    fixtures, through = results["fixtures (direct)"], results["gateway -> fixtures"]
    assert all(c.status == "SUCCESS" for c in fixtures.values()), score(fixtures)
    assert {k: c.status for k, c in through.items()} == {k: c.status for k, c in fixtures.items()}

    everything, gw = results["everything (reference)"], results["gateway -> everything"]
    assert set(gw) == set(everything)
    for check, found in everything.items():
        if check in DNS_REBINDING:
            assert gw[check].status == "SUCCESS", gw[check]
        else:
            assert gw[check].status == found.status, (check, found, gw[check])

    serve = results["mcp serve"]
    for check in ("server-initialize", "ping", "tools-list", "tools-call-error",
                  "server-sse-streams-functional", "server-accepts-multiple-post-streams",
                  *DNS_REBINDING):
        assert serve[check].status == "SUCCESS", serve[check]
    for found in serve.values():
        if found.status != "SUCCESS":
            assert NOT_OFFERED.search(found.message), found
