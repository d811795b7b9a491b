"""Review of round 7's gateway call timeout and store lifecycle, as an outsider attacks them:
each test failed before its fix. Both store backends where the store is involved."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import effectgate as eg
from effectgate.webhooks import Webhooks

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from .mcp_helpers import gateway_in_process, serving, tag

SECRET = "s" * 32
CONFORMANCE = Path(__file__).with_name("mcp_conformance_upstream.py")
# The suite's tasks upstream, except that its tasks/get never answers.
TASKS_GET_HANGS = """
import runpy, socket, sys
import anyio
fixture = runpy.run_path(sys.argv[1], run_name="fixture")
async def never(ctx, params):
    await anyio.sleep_forever()
fixture["server"].add_request_handler("tasks/get", fixture["TaskParams"], never)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(64)
print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", file=sys.stderr, flush=True)
anyio.run(fixture["_http"], sock)
"""
TASKS_POLICY = """
[effects."compute.run"]
key = "compute:{label}"
tools = ["slow_compute"]
lease_seconds = 1
"""


@pytest.fixture(scope="module")
def tasks_get_hangs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of one upstream, shared by both backends' runs, whose tasks/get never answers."""
    script = tmp_path_factory.mktemp("upstream") / "tasks_get_hangs.py"
    script.write_text(TASKS_GET_HANGS, encoding="utf-8")
    with serving([sys.executable, str(script), str(CONFORMANCE)]) as up:
        yield up.url


async def test_an_upstream_task_whose_tasks_get_never_answers_ends_ambiguous(
        tmp_path: Path, store_url: str, namespace: str, tasks_get_hangs: str) -> None:
    """The upstream took a gated call as a task, then never answered a ``tasks/get``: the
    poll waited for ever, its heartbeat holding the effect IN_FLIGHT for ever (no retry, no
    operator ever saw it). Every poll is a request sent upstream: bounded by the call
    timeout, so the effect ends AMBIGUOUS and the client hears so."""
    policy = tmp_path / "policy.toml"
    policy.write_text(TASKS_POLICY, encoding="utf-8")
    label = f"hung-{tag()}"
    with eg.Gate(store_url, namespace=namespace, policy=eg.Policy.load(policy)) as gate, \
            anyio.fail_after(30):
        async with gateway_in_process(gate, tasks_get_hangs,
                                      call_timeout_seconds=1.0) as client:
            answer = await client.call_tool("slow_compute", {"seconds": 0.1, "label": label})
        [record] = [r for r in gate.list_effects(effect_type="compute.run")
                    if r.key.endswith(f"compute:{label}")]
    assert answer.is_error
    assert record.state is eg.State.AMBIGUOUS
    assert record.vendor_ref  # the task it was taken as, for an operator or a reconcile hook


@pytest.mark.parametrize("host", ["stra\u00dfe.example", "\uff45xample.com", "example\u3002com",
                                  "\ufb01le.example", "\u03b5\u03bb\u03bb\u03ac\u03c2.example"])
def test_a_webhook_host_idna_maps_to_another_host_is_refused(host: str) -> None:
    """Python's IDNA (2003) maps some characters to others as it encodes a host: ``ß`` to
    ``ss`` (``straße.example`` went out to ``strasse.example``, another domain), full-width
    letters and the ideographic full stop to ASCII, a ligature to its letters, a final sigma
    to a sigma. Only dropped invisible characters were refused; every host IDNA sends as
    another is now a :class:`~effectgate.ConfigError` when configured, as URL and as
    console URL."""
    assert host.encode("idna").decode("idna") != host  # where deliveries would go
    with pytest.raises(eg.ConfigError, match="another host"):
        Webhooks(url=f"https://{host}/T0", secret=SECRET, flush_on_exit=0)
    with pytest.raises(eg.ConfigError, match="another host"):
        Webhooks(url="https://hooks.example/T0", secret=SECRET, flush_on_exit=0,
                 console_url=f"https://{host}")


@pytest.mark.parametrize("host", ["b\u00fccher.example", "\u00c4bc.example",
                                  "\u4f8b\u3048.\u30c6\u30b9\u30c8", "xn--bcher-kva.example"])
def test_a_webhook_host_idna_keeps_is_accepted(host: str) -> None:
    """A host IDNA sends as itself (upper case folded, as DNS does) is kept as given."""
    hooks = Webhooks(url=f"https://{host}/T0", secret=SECRET, flush_on_exit=0)
    assert hooks._url == f"https://{host}/T0"


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_call_timeout_nan_is_refused_before_the_store_is_opened(tmp_path: Path,
                                                                value: str) -> None:
    """``--call-timeout nan`` passed click's range (every comparison with NaN is false):
    the store was created before the gateway refused it. Now click refuses it, as it
    refuses ``inf`` or ``0``, and no store is made."""
    from click.testing import CliRunner

    from effectgate.cli import main

    store = tmp_path / "never.db"
    ran = CliRunner().invoke(main, ["mcp", "gateway", "--upstream", "true", "--url",
                                    f"sqlite:///{store}", "--call-timeout", value])
    assert ran.exit_code == 2, ran.output
    assert "--call-timeout" in ran.output and "not a number" in ran.output, ran.output
    assert not store.exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e308, -1.0, 0, "5", True])
def test_upstream_tasks_refuse_a_call_timeout_that_is_no_limit(value: object) -> None:
    """``UpstreamTasks(call_timeout=...)`` took any value to the SDK, which reads it only once
    the call has left: ``"5"`` raised ``TypeError`` then and ``-1`` timed out at once, each
    call sent and recorded AMBIGUOUS; a NaN never fired. Checked when made, as the
    gateway's own ``call_timeout_seconds`` is."""
    from effectgate.integrations.mcp.upstream_tasks import UpstreamTasks

    with pytest.raises(eg.ConfigError, match="call_timeout"):
        UpstreamTasks("http://127.0.0.1:9/mcp", call_timeout=value)  # type: ignore[arg-type]
    assert UpstreamTasks("http://127.0.0.1:9/mcp", call_timeout=None).call_timeout is None
