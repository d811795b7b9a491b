"""Two MCP gateway paths no test covered, with real servers and clients (the gateway in this
process in front of the suite's shared upstream processes over Streamable HTTP), on both
backends:

* what the gateway records is redacted as the policy says: ``redact_arguments`` in the
  arguments kept for an approver of a gated call, and ``redact_result`` in the result stored
  for a call the upstream ran as one of its tasks — both when the gateway polled the task to
  its end and when the reconcile hook it registers (``tasks/get``) settled an AMBIGUOUS effect;
* the heartbeat of a long call over Streamable HTTP: the gateway extends the effect's lease
  while the upstream call runs, so a call longer than its lease is never AMBIGUOUS.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

import effectgate as eg

pytest.importorskip("mcp", reason='needs the mcp extra: pip install ".[mcp]"')

from sqlalchemy import text as sql

from effectgate.integrations.mcp.upstream_tasks import UpstreamTasks, task_ref

from .mcp_helpers import SharedUpstream, gateway_in_process, tag
from .test_mcp_gateway import decision, scoped


def _stored(gate: eg.Gate) -> str:
    """Every row this gate's namespace holds, effects and approvals, as one text."""
    rows: list[str] = []
    with gate.store.engine.connect() as conn:
        for table in ("effectgate_effects", "effectgate_approvals"):
            rows += [repr(tuple(r)) for r in conn.execute(
                sql(f"SELECT * FROM {table} WHERE namespace = :ns"), {"ns": gate.namespace})]
    return "\n".join(rows)


async def test_an_approver_sees_redacted_arguments_and_the_store_keeps_none(
        make_gate: Any, shared_upstream: SharedUpstream) -> None:
    """``redact_arguments = ["text"]`` on a tool that needs approval: the arguments kept for
    the approver show the text as ``[redacted]`` (the rest as called), the secret text is in
    no row of the store, and nothing ran."""
    t = tag()
    secret = f"pin-{tag()}"
    gate = make_gate(policy={"effects": {"sms.send": {
        "key": "sms:{to}", "tools": ["send_message"], "approval": "always",
        "redact_arguments": ["text"]}}})
    with anyio.fail_after(60):
        async with gateway_in_process(gate, shared_upstream.url) as client:
            asked = await client.call_tool("send_message", {"to": f"+1-{t}", "text": secret})
    assert asked.is_error and json.loads(asked.content[0].text)[  # type: ignore[union-attr]
        "decision"] == "approval_required", asked
    [approval] = gate.list_approvals()
    assert approval.key == scoped(f"sms:+1-{t}", shared_upstream.url)
    assert approval.arguments == {"to": f"+1-{t}", "text": "[redacted]", "channel": "sms"}
    assert secret not in _stored(gate)
    assert shared_upstream.lines(t) == []


async def test_a_result_run_as_an_upstream_task_is_stored_redacted(
        make_gate: Any, shared_task_upstream: SharedUpstream) -> None:
    """``redact_result = ["label"]`` on a tool the upstream runs as a task: the result the
    gateway stores after polling the task (structured content, and its free text replaced by
    the redacted structure) holds the label nowhere; the caller's first answer is the
    upstream's own, a repeat the stored one."""
    up, label = shared_task_upstream, f"secret-{tag()}"
    gate = make_gate(policy={"effects": {"compute.run": {
        "key": "compute:{seconds}", "tools": ["slow_compute"], "redact_result": ["label"]}}})
    call = {"seconds": 0, "label": label}  # keyed by seconds: the label is in no key
    with anyio.fail_after(90):
        async with gateway_in_process(gate, up.url) as client:
            first = await client.call_tool("slow_compute", call)
            again = await client.call_tool("slow_compute", call)
    assert decision(first) == "execute" and decision(again) == "duplicate"
    assert first.structured_content == {"label": label}
    assert again.structured_content == {"label": "[redacted]"}
    [record] = gate.list_effects(effect_type="compute.run")
    assert record.state is eg.State.COMMITTED
    assert record.result["structuredContent"] == {"label": "[redacted]"}
    assert json.loads(record.result["content"][0]["text"]) == {"label": "[redacted]"}
    assert label not in _stored(gate)
    assert up.lines(label) == [label]


async def test_a_result_the_reconcile_hook_settles_is_stored_redacted(
        make_gate: Any, shared_task_upstream: SharedUpstream) -> None:
    """The gateway died after the upstream took the call as a task (its id recorded, the
    lease lapsed: AMBIGUOUS). The reconcile hook the gateway registers reads the finished
    task (``tasks/get``) and settles the effect COMMITTED with its result — redacted as the
    gateway's own answer would have been."""
    up, label = shared_task_upstream, f"secret-{tag()}"
    gate = make_gate(policy={"effects": {"compute.run": {
        "key": "compute:{seconds}", "tools": ["slow_compute"], "redact_result": ["label"],
        "reconcile_grace_seconds": 0.1}}})
    with anyio.fail_after(90):
        tasks = UpstreamTasks(up.url)
        async with tasks.session() as s:
            handle = await s.call_tool("slow_compute", {"seconds": 0, "label": label},
                                       allow_claimed=True)
        key = f"lost-{tag()}"
        held = await gate.abegin(effect_type="compute.run", key=key,
                                 payload={"label": label}, lease_seconds=0.3)
        await gate.aextend_lease(held, 0.3, vendor_ref=task_ref(1, handle.task_id))  # type: ignore[union-attr]
        async with gateway_in_process(gate, up.url):  # registers its hook, then is gone
            pass
        await anyio.sleep(0.6)  # past the lease and the grace period
        assert gate.get(key).state is eg.State.AMBIGUOUS
        record = await anyio.to_thread.run_sync(lambda: gate.reconcile(key, by="operator"))
    assert record.state is eg.State.COMMITTED, record
    assert record.result["structuredContent"] == {"label": "[redacted]"}
    assert label not in _stored(gate)
    assert up.lines(label) == [label]


async def test_a_long_call_over_streamable_http_keeps_its_lease(
        make_gate: Any, shared_upstream: SharedUpstream) -> None:
    """A call that runs 2.5 s upstream over Streamable HTTP, under a 1 s lease: the gateway's
    heartbeat extends the lease while it runs, so the effect reads IN_FLIGHT throughout (never
    AMBIGUOUS, which an operator could settle FAILED and a retry send again), its lease's end
    moves on, and it commits once, on its first attempt."""
    to = f"+2-{tag()}"
    gate = make_gate(policy={"effects": {"sms.slow": {
        "key": "slow:{to}", "tools": ["slow_send"], "lease_seconds": 1}}})
    key = scoped(f"slow:{to}", shared_upstream.url)
    seen: list[tuple[eg.State, float | None]] = []
    answers: list[Any] = []
    with anyio.fail_after(60):
        async with gateway_in_process(gate, shared_upstream.url) as client:

            async def call() -> None:
                answers.append(await client.call_tool("slow_send", {"to": to, "seconds": 2.5}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                while not answers:
                    try:
                        record = await anyio.to_thread.run_sync(gate.get, key)
                    except eg.UnknownEffect:
                        pass
                    else:
                        ends = record.lease_expires_at
                        seen.append((record.state, ends.timestamp() if ends else None))
                    await anyio.sleep(0.1)
    [answer] = answers
    assert not answer.is_error and decision(answer) == "execute", answer
    states = {state for state, _ in seen}
    assert states <= {eg.State.IN_FLIGHT, eg.State.COMMITTED}, seen
    ends = [end for state, end in seen if state is eg.State.IN_FLIGHT and end is not None]
    assert len(set(ends)) >= 3, seen  # extended, again and again, while the call ran
    record = gate.get(key)
    assert (record.state, record.attempt) == (eg.State.COMMITTED, 1)
    assert shared_upstream.lines(to) == [f"slow:{to}"]
