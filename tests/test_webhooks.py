"""Signed webhooks on both backends: a real local HTTP receiver checks every signature and the
Slack body; retries after a 500; a dead or sleeping receiver never delays a ``begin``."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import effectgate as eg
from effectgate.notices import Notice
from effectgate.webhooks import Webhooks, sign, verify_signature

SECRET = "whsec_" + "k" * 32
APPROVE = {"effects": {"payment.*": {"approval": "always"}}}
CEILING = {"effects": {"payment.*": {"budget": {"per_run_micros": 10_000_000}}}}


class Receiver:
    """An HTTP server on a free local port, in a thread; answers with ``statuses`` in turn
    (then 200), each with the header lines ``headers`` holds for it, after ``delay`` seconds,
    and keeps what it got."""

    def __init__(self, statuses: tuple[int, ...] = (), delay: float = 0.0,
                 headers: tuple[tuple[tuple[str, str], ...], ...] = ()) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.statuses = list(statuses)
        self.headers = list(headers)
        self.delay = delay
        self.arrived = threading.Condition()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                time.sleep(owner.delay)
                status = owner.statuses.pop(0) if owner.statuses else 200
                extra = owner.headers.pop(0) if owner.headers else ()
                with owner.arrived:
                    owner.got.append((dict(self.headers.items()), body))
                    owner.arrived.notify_all()
                self.send_response(status)
                for name, value in extra:
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0/B0/abc"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait(self, count: int, timeout: float = 10.0) -> list[tuple[dict[str, str], bytes]]:
        end = time.monotonic() + timeout
        with self.arrived:
            while len(self.got) < count and time.monotonic() < end:
                self.arrived.wait(0.05)
        return list(self.got)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def hooks(url: str, **options: Any) -> Webhooks:
    options.setdefault("console_url", "https://console.example.com/eg/")
    options.setdefault("backoff_seconds", 0.05)
    options.setdefault("flush_on_exit", 0)
    return Webhooks(url, SECRET, **options)


def bodies(got: list[tuple[dict[str, str], bytes]]) -> list[dict[str, Any]]:
    return [json.loads(body) for _, body in got]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- what is sent ------------------------------------------------------------------------------


def test_approval_required_posts_a_signed_slack_message_linking_to_the_console(
        make_gate: Any, receiver: Receiver) -> None:
    wh = hooks(receiver.url)
    gate = make_gate(policy=APPROVE, webhooks=wh)
    d = gate.begin(effect_type="payment.refund", key="refund:txn_1",
                   payload={"amount_cents": 500, "card": "4242424242424242"},
                   agent_id="bot-1", estimated_cost_micros=5_000_000)
    again = gate.begin(effect_type="payment.refund", key="refund:txn_1",
                       payload={"amount_cents": 500, "card": "4242424242424242"},
                       agent_id="bot-1", estimated_cost_micros=5_000_000)
    assert d.decision is again.decision is eg.Decision.APPROVAL_REQUIRED
    assert wh.flush(10)
    got = receiver.wait(1)
    assert len(got) == 1  # once per approval request, not once per retry
    headers, raw = got[0]
    assert verify_signature(SECRET, headers, raw)
    assert not verify_signature("x" * 32, headers, raw)
    assert headers["Effectgate-Event"] == "approval_required"
    body = json.loads(raw)
    assert body["event"] == "approval_required"
    assert (body["key"], body["effect_type"], body["effect_id"], body["approval_id"]) == (
        "refund:txn_1", "payment.refund", d.effect_id, d.approval_id)
    assert body["url"] == f"https://console.example.com/eg/approvals/{d.approval_id}"
    assert body["namespace"] == gate.namespace and body["agent_id"] == "bot-1"
    # Slack's incoming webhooks: a text fallback and blocks of known types
    assert isinstance(body["text"], str) and "Approval needed" in body["text"]
    assert [b["type"] for b in body["blocks"]] == ["section", "context"]
    section = body["blocks"][0]["text"]
    assert section["type"] == "mrkdwn" and f"<{body['url']}|" in section["text"]
    assert "$5.00" in section["text"]
    # No payload: neither its card number nor its names (a "4242" alone can be the effect
    # id a shared Postgres sequence has reached, as it was once: 424208).
    assert "4242424242424242" not in raw.decode() and "amount_cents" not in raw.decode()
    assert "card" not in raw.decode()
    assert wh.stats().delivered == 1


def test_a_lapsed_lease_posts_ambiguous_with_the_effect_page(make_gate: Any,
                                                             receiver: Receiver) -> None:
    wh = hooks(receiver.url)
    gate = make_gate(webhooks=wh)
    d = gate.begin(effect_type="payment.refund", key="refund:lapse", payload={},
                   lease_seconds=0.2, run_id="run-7", agent_id="bot-2")
    time.sleep(0.35)
    blocked = gate.begin(effect_type="payment.refund", key="refund:lapse", payload={})
    assert blocked.decision is eg.Decision.BLOCKED
    assert wh.flush(10)
    (body,) = bodies(receiver.wait(1))
    assert body["event"] == "ambiguous" and body["reason"] == "lease lapsed"
    assert body["url"] == f"https://console.example.com/eg/effects/{d.effect_id}"
    assert body["state"] == "ambiguous" and body["attempt"] == 1
    assert (body["run_id"], body["agent_id"]) == ("run-7", "bot-2")  # the lapsed attempt's
    gate.report(d, "ambiguous", error="the late holder does not know either")
    assert wh.flush(10) and len(receiver.got) == 1  # one event for people, not two


def test_a_body_error_of_unknown_outcome_posts_ambiguous_with_a_redacted_error(
        make_gate: Any, receiver: Receiver) -> None:
    wh = hooks(receiver.url)
    gate = make_gate(webhooks=wh)

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str) -> dict[str, Any]:
        raise TimeoutError("read timed out: https://api.example.com/v1/refunds?token=SECRET42")

    with pytest.raises(TimeoutError):
        refund("t9")
    assert wh.flush(10)
    (body,) = bodies(receiver.wait(1))
    assert body["event"] == "ambiguous" and body["key"] == "refund:t9"
    assert "TimeoutError" in body["reason"] and "SECRET42" not in json.dumps(body)
    assert body["effect_type"] == "payment.refund"
    assert body["run_id"] is None and body["agent_id"] is None  # none were given


async def test_async_report_over_a_bare_lease_is_filled_in_off_the_callers_thread(
        make_gate: Any, receiver: Receiver) -> None:
    wh = hooks(receiver.url)
    gate = make_gate(webhooks=wh)
    d = await gate.abegin(effect_type="payment.refund", key="refund:lease", payload={})
    assert d.lease is not None
    await gate.areport(d.lease, "ambiguous", error="vendor 502")
    assert wh.flush(10)
    (body,) = bodies(receiver.wait(1))
    assert (body["event"], body["effect_id"], body["effect_type"]) == (
        "ambiguous", d.effect_id, "payment.refund")


def test_one_ambiguous_attempt_is_announced_once_across_processes(
        make_gate: Any, receiver: Receiver) -> None:
    from effectgate.sweep import sweep_lapsed

    worker_hooks, console_hooks = hooks(receiver.url), hooks(receiver.url)  # a queue each
    worker = make_gate(webhooks=worker_hooks)
    console = make_gate(webhooks=console_hooks)
    d = worker.begin(effect_type="mail.send", key="mail:dup", payload={}, lease_seconds=0.2)
    e = worker.begin(effect_type="mail.send", key="mail:quiet", payload={}, lease_seconds=0.2)
    time.sleep(0.35)
    assert [n.key for n in sweep_lapsed(console)] == ["mail:dup", "mail:quiet"]
    worker.report(d, "ambiguous", error="timeout talking to vendor")  # late: already marked
    worker.report(e.lease, "ambiguous", error="timeout again")  # a bare lease, the same
    assert (worker.get("mail:dup").history[-1].note or "").startswith("late report")
    assert worker_hooks.flush(10) and console_hooks.flush(10)
    got = bodies(receiver.wait(2))
    time.sleep(0.2)
    assert len(receiver.got) == 2
    assert sorted((b["key"], b["reason"]) for b in got) == [
        ("mail:dup", "lease lapsed"), ("mail:quiet", "lease lapsed")]


async def test_a_late_ambiguous_report_announces_only_a_lapse_nobody_marked(
        make_gate: Any, receiver: Receiver) -> None:
    from effectgate.sweep import sweep_lapsed

    worker_hooks, console_hooks = hooks(receiver.url), hooks(receiver.url)
    worker = make_gate(webhooks=worker_hooks)
    console = make_gate(webhooks=console_hooks)
    marked = await worker.abegin(effect_type="mail.send", key="mail:marked", payload={},
                                 lease_seconds=0.2)
    await asyncio.sleep(0.35)
    assert [n.key for n in sweep_lapsed(console)] == ["mail:marked"]
    unmarked = await worker.abegin(effect_type="mail.send", key="mail:unmarked", payload={},
                                   lease_seconds=0.2)
    await asyncio.sleep(0.35)  # lapsed, but nobody swept or began: nobody announced it
    await worker.areport(marked, "ambiguous", error="late, already announced")
    await worker.areport(unmarked.lease, "ambiguous", error="late, news")
    assert worker_hooks.flush(10) and console_hooks.flush(10)
    got = bodies(receiver.wait(2))
    await asyncio.sleep(0.2)
    assert len(receiver.got) == 2
    assert sorted((b["key"], b["reason"]) for b in got) == [
        ("mail:marked", "lease lapsed"), ("mail:unmarked", "late, news")]


def test_budget_warning_is_sent_once_per_type_not_per_call(make_gate: Any,
                                                           receiver: Receiver) -> None:
    wh = hooks(receiver.url, events=("budget_warning",))
    gate = make_gate(policy=CEILING, webhooks=wh)
    for i in range(3):
        d = gate.begin(effect_type="payment.refund", key=f"refund:b{i}", payload={},
                       run_id="run-1")
        assert d.decision is eg.Decision.EXECUTE and d.budget_warning
    assert wh.flush(10)
    (body,) = bodies(receiver.wait(1))
    assert body["event"] == "budget_warning" and "cannot fire" in body["reason"]
    time.sleep(0.2)
    assert len(receiver.got) == 1


def test_a_gate_in_another_namespace_posts_too_and_a_closed_queue_starts_again(
        make_gate: Any, receiver: Receiver) -> None:
    wh = hooks(receiver.url)
    other = make_gate(webhooks=wh).in_namespace(make_gate().namespace + "-b")
    d = other.begin(effect_type="payment.refund", key="refund:ns", payload={})
    other.report(d, "ambiguous")
    assert wh.flush(10)
    wh.close(1)
    wh.notify(Notice("ambiguous", "default", "after-close"))
    assert wh.flush(10)
    got = bodies(receiver.wait(2))
    assert [(b["namespace"], b["key"]) for b in got] == [
        (other.namespace, "refund:ns"), ("default", "after-close")]


def test_unsubscribed_events_are_not_sent(make_gate: Any, receiver: Receiver) -> None:
    wh = hooks(receiver.url, events=["ambiguous"])
    gate = make_gate(policy=APPROVE, webhooks=wh)
    gate.begin(effect_type="payment.refund", key="refund:x", payload={})
    assert wh.flush(5) and wh.stats() == (0, 0, 0, 0, 0)
    assert receiver.got == []


def test_a_hostile_key_cannot_make_a_slack_link_or_mention(receiver: Receiver) -> None:
    wh = hooks(receiver.url)
    key = "refund:<https://evil.example|click> <!channel> `x`"
    body = wh.message(Notice("ambiguous", "default", key, "payment.refund", 7, 1, "ambiguous",
                             "boom <!here>"))
    text = body["blocks"][0]["text"]["text"] + body["text"]
    assert "<https://evil" not in text and "<!channel>" not in text and "<!here>" not in text
    assert "&lt;!channel&gt;" in text
    assert body["key"] == key  # the machine field is the key as it is


def test_bidi_and_invisible_characters_are_shown_visibly_to_people(
        make_gate: Any, receiver: Receiver) -> None:
    """The text people read shows U+202E, U+200B... as ⟨U+202E⟩ (the one rendering the
    console and CLI use): a reversed run cannot be drawn as another number. The machine
    fields stay as stored."""
    wh = hooks(receiver.url)
    gate = make_gate(policy=APPROVE, webhooks=wh)
    agent, run = "bot\u202e2345-6789\u202c", "r\u200b1"
    d = gate.begin(effect_type="payment.refund", key="refund:9", payload={}, agent_id=agent,
                   run_id=run)
    assert d.decision is eg.Decision.APPROVAL_REQUIRED and wh.flush(10)
    body = bodies(receiver.wait(1))[0]
    people = body["text"] + json.dumps(body["blocks"], ensure_ascii=False)
    assert "bot⟨U+202E⟩2345-6789⟨U+202C⟩" in people and "r⟨U+200B⟩1" in people
    assert not any(ch in people for ch in ("\u202e", "\u202c", "\u200b"))
    assert (body["agent_id"], body["run_id"]) == (agent, run)  # as stored
    reason = "timeout \u2067at\u2069 vendor\u00a0x ⟨U+1⟩"
    shown = wh.message(Notice("ambiguous", "ns\u200d", "refund:9", "payment.refund", 7, 1,
                              "ambiguous", reason))
    text = shown["blocks"][0]["text"]["text"] + shown["blocks"][1]["elements"][0]["text"]
    assert "timeout ⟨U+2067⟩at⟨U+2069⟩ vendor⟨U+00A0⟩x ⟨U+27E8⟩U+1⟩" in text
    assert "ns⟨U+200D⟩" in text and shown["namespace"] == "ns\u200d"


# -- retries, dead receivers ---------------------------------------------------------------


def test_a_500_is_retried_with_a_fresh_signature_and_the_same_delivery_id(
        make_gate: Any) -> None:
    flaky = Receiver(statuses=(500, 503))
    try:
        wh = hooks(flaky.url)
        gate = make_gate(webhooks=wh)
        d = gate.begin(effect_type="payment.refund", key="refund:r", payload={})
        gate.report(d, "ambiguous", error="lost reply")
        assert wh.flush(10)
        got = flaky.wait(3)
        assert len(got) == 3
        assert all(verify_signature(SECRET, h, b) for h, b in got)
        assert len({h["Effectgate-Delivery"] for h, _ in got}) == 1
        assert wh.stats()[:3] == (1, 2, 0)
    finally:
        flaky.close()


def test_a_4xx_is_not_retried(make_gate: Any) -> None:
    refusing = Receiver(statuses=(400,))
    try:
        wh = hooks(refusing.url)
        gate = make_gate(webhooks=wh)
        d = gate.begin(effect_type="payment.refund", key="refund:4", payload={})
        gate.report(d, "ambiguous")
        assert wh.flush(10)
        assert len(refusing.wait(1)) == 1 and wh.stats().failed == 1
    finally:
        refusing.close()


def _median_begin_ms(plain: eg.Gate, hooked: eg.Gate, prefix: str,
                     n: int = 50) -> tuple[float, float]:
    """The median of ``n`` begins on each gate, taking turns; each begin requests an approval
    (an event for the webhook)."""
    took: dict[str, list[float]] = {"plain": [], "hooked": []}
    for i in range(n):
        for name, gate in (("plain", plain), ("hooked", hooked)):
            start = time.perf_counter()
            d = gate.begin(effect_type="payment.refund", key=f"{prefix}{i}", payload={"i": i})
            took[name].append(time.perf_counter() - start)
            assert d.decision is eg.Decision.APPROVAL_REQUIRED
    return statistics.median(took["plain"]) * 1000, statistics.median(took["hooked"]) * 1000


@pytest.mark.parametrize("dead", ["closed port", "sleeping receiver"])
def test_a_dead_receiver_never_delays_a_begin(make_gate: Any, dead: str) -> None:
    """A begin whose webhook cannot be delivered costs no more than one without (the median of
    50, within 10 ms). A begin that delivered its event itself would wait for every one: the
    receiver's 2 s timeout, or three refused connections with backoffs of at least 15 ms in
    all between them, each time, so the median moves by more than the margin; a loaded
    machine's spikes (tens of ms, now and then) move the slowest begin, not the median. Three
    rounds are allowed."""
    sleeper = Receiver(delay=3.0) if dead == "sleeping receiver" else None
    url = sleeper.url if sleeper else f"http://127.0.0.1:{closed_port()}/hook"
    wh = hooks(url, timeout=2.0, backoff_seconds=0.01, max_attempts=3)
    try:
        plain = make_gate(policy=APPROVE, namespace=make_gate().namespace + "-plain")
        hooked = make_gate(policy=APPROVE, webhooks=wh)
        _median_begin_ms(plain, hooked, "warm:", 5)
        rounds = []
        for attempt in range(3):
            without, with_hooks = _median_begin_ms(plain, hooked, f"k{attempt}:")
            rounds.append((round(with_hooks, 1), round(without, 1)))
            if with_hooks < without + 10:
                break
        else:
            pytest.fail(f"begin with a dead webhook receiver was slower: {rounds}")
        assert wh.stats().waiting > 0 or wh.stats().failed > 0  # it really was trying
    finally:
        wh.close(0.1)
        if sleeper:
            sleeper.close()


def test_a_full_queue_drops_the_oldest_and_counts_it() -> None:
    wh = hooks(f"http://127.0.0.1:{closed_port()}/hook", max_queue=3, backoff_seconds=5)
    try:
        for i in range(10):
            wh.notify(Notice("ambiguous", "default", f"k{i}"))
        stats = wh.stats()
        # At most 3 wait in the queue, plus the one the sender may hold right now; every
        # notice is accounted for (nothing can be delivered to a closed port).
        assert stats.waiting <= 3 + 1 and stats.dropped >= 10 - (3 + 1), stats
        assert stats.dropped + stats.waiting + stats.failed == 10 and stats.delivered == 0
    finally:
        wh.close(0.1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_delivery_thread(receiver: Receiver) -> None:
    wh = hooks(receiver.url)
    wh.notify(Notice("ambiguous", "default", "parent"))
    assert wh.flush(10)
    pid = os.fork()
    if pid == 0:  # the child: its own thread, its own queue
        ok = False
        try:
            wh.notify(Notice("ambiguous", "default", "child"))
            ok = wh.flush(10) and wh.stats().delivered >= 1
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sorted(b["key"] for b in bodies(receiver.wait(2))) == ["child", "parent"]


# -- verify_signature ------------------------------------------------------------------------


def test_verify_signature_refuses_replays_tampering_and_garbage() -> None:
    body = b'{"event":"ambiguous"}'
    now = 1_800_000_000
    headers = sign(SECRET, body, timestamp=now)
    assert verify_signature(SECRET, headers, body, now=now + 299)
    assert verify_signature(SECRET, {k.lower(): v for k, v in headers.items()}, body, now=now)
    assert verify_signature(SECRET, list(headers.items()), body.decode(), now=now)
    assert not verify_signature(SECRET, headers, body, now=now + 301)  # too old: a replay
    assert not verify_signature(SECRET, headers, body, now=now - 301)  # from the future
    assert not verify_signature(SECRET, headers, body + b" ", now=now)  # tampered body
    forged = {**headers, "Effectgate-Timestamp": str(now + 100)}  # a re-dated old request
    assert not verify_signature(SECRET, forged, body, now=now + 100)
    assert verify_signature(["old" * 8, SECRET], headers, body, now=now)  # rotation
    for bad in ({}, {"Effectgate-Timestamp": "x", "Effectgate-Signature": "v1=00"},
                {"Effectgate-Timestamp": str(now)},
                {"Effectgate-Timestamp": "9" * 40, "Effectgate-Signature": "v1=00"},
                {"Effectgate-Timestamp": str(now), "Effectgate-Signature": "v0=abc"}):
        assert not verify_signature(SECRET, bad, body, now=now)
    with pytest.raises(eg.ConfigError):
        verify_signature("", headers, body)


def test_verify_signature_never_raises_on_non_ascii_or_undecodable_input() -> None:
    from starlette.datastructures import Headers

    body = b'{"event":"ambiguous"}'
    now = 1_800_000_000
    stamp = sign(SECRET, body, timestamp=now)["Effectgate-Timestamp"]
    good = sign(SECRET, body, timestamp=now)["Effectgate-Signature"]
    for offered in (b"v1=\xe9", b"v1=\xff" * 30, b"v1=" + "é".encode() * 32,
                    b"v1=\xe9, " + good.encode()):
        raw = [(b"effectgate-timestamp", stamp.encode()), (b"effectgate-signature", offered)]
        expected = offered.endswith(good.encode())  # a good signature beside a hostile one
        assert verify_signature(SECRET, Headers(raw=raw), body, now=now) is expected
        assert verify_signature(SECRET, raw, body, now=now) is expected
    for text in ("v1=é", "v1=\udce9", "v1=" + "٣" * 64, "v1=ＡＢ"):
        headers = {"Effectgate-Timestamp": stamp, "Effectgate-Signature": text}
        assert verify_signature(SECRET, headers, body, now=now) is False
    signed = sign(SECRET, body, timestamp=now)
    assert verify_signature(SECRET, signed, "\udce9", now=now) is False  # a lone surrogate


def test_receivers_route_and_de_duplicate_on_the_signed_body_not_the_headers(
        make_gate: Any) -> None:
    import effectgate.webhooks

    flaky = Receiver(statuses=(500,))
    try:
        wh = hooks(flaky.url)
        gate = make_gate(webhooks=wh)
        d = gate.begin(effect_type="payment.refund", key="refund:replay", payload={})
        gate.report(d, "ambiguous", error="lost reply")
        assert wh.flush(10)
        got = flaky.wait(2)
    finally:
        flaky.close()
    assert len(got) == 2 and all(verify_signature(SECRET, h, b) for h, b in got)
    first, retry = bodies(got)
    assert first["delivery_id"] and first["delivery_id"] == retry["delivery_id"]
    assert [h["Effectgate-Delivery"] for h, _ in got] == [first["delivery_id"]] * 2
    assert [h["Effectgate-Event"] for h, _ in got] == [first["event"]] * 2 == ["ambiguous"] * 2
    # The headers are outside the signature: a replay with fresh ones still verifies, so a
    # receiver must take the id and the event from the body it verified.
    headers, raw = got[0]
    replay = {**headers, "Effectgate-Delivery": "fresh", "Effectgate-Event": "budget_warning"}
    assert verify_signature(SECRET, replay, raw)
    assert json.loads(raw)["delivery_id"] == first["delivery_id"]
    edited = raw.replace(first["delivery_id"].encode(), b"f" * 32)
    assert not verify_signature(SECRET, headers, edited)  # the body's id is signed
    doc = " ".join((effectgate.webhooks.__doc__ or "").split())
    assert "de-duplicate on the body's ``delivery_id``" in doc
    assert "route on the body's ``event``" in doc


@pytest.mark.parametrize("options", [
    {"url": "ftp://example.com/x"}, {"url": "http:///nohost"}, {"url": "http://a b"},
    {"secret": "short"}, {"secret": 123}, {"events": ["approved"]}, {"events": []},
    {"timeout": 0}, {"max_queue": 0}, {"max_attempts": True}, {"console_url": "javascript:x"},
    {"headers": {"X-A": "b\r\nEvil: 1"}},
])
def test_bad_webhook_settings_are_a_config_error(options: dict[str, Any]) -> None:
    args = {"url": "https://hooks.example.com/x", "secret": SECRET, **options}
    url, secret = args.pop("url"), args.pop("secret")
    with pytest.raises(eg.ConfigError):
        Webhooks(url, secret, **args)


def test_webhooks_on_a_gate_must_be_webhooks(store_url: str, namespace: str) -> None:
    with pytest.raises(eg.ConfigError):
        eg.Gate(store_url, namespace=namespace, webhooks="https://hooks.example.com/x")  # type: ignore[arg-type]


def test_the_environment_configures_one_shared_queue(monkeypatch: pytest.MonkeyPatch,
                                                     store_url: str, namespace: str) -> None:
    monkeypatch.setenv("EFFECTGATE_WEBHOOK_URL", "https://hooks.example.com/env")
    monkeypatch.setenv("EFFECTGATE_CONSOLE_URL", "https://console.example.com")
    monkeypatch.setenv("EFFECTGATE_WEBHOOK_EVENTS", "ambiguous")
    with pytest.raises(eg.ConfigError, match="SECRET"):
        eg.Gate(store_url, namespace=namespace)
    monkeypatch.setenv("EFFECTGATE_WEBHOOK_SECRET", SECRET)
    first, second = (eg.Gate(store_url, namespace=namespace) for _ in range(2))
    off = eg.Gate(store_url, namespace=namespace, webhooks=False)
    try:
        assert first._webhooks is not None and first._webhooks is second._webhooks
        assert first._webhooks.events == {"ambiguous"}
        assert first._webhooks.console_url == "https://console.example.com"
        assert off._webhooks is None
    finally:
        for gate in (first, second, off):
            gate.close()


def test_repr_hides_the_url_path_and_the_secret() -> None:
    wh = Webhooks("https://hooks.slack.com/services/T1/B2/sekrit", SECRET)
    assert "sekrit" not in repr(wh) and SECRET not in repr(wh)
    assert "hooks.slack.com" in repr(wh)


def test_a_notice_is_filled_with_its_own_attempts_run_and_agent_or_none(
        make_gate: Any) -> None:
    """Run and agent are read when the notice is delivered, maybe much later: only while the
    row is still at the notice's attempt, never attempt 2's for attempt 1's notice."""
    from effectgate.notices import AMBIGUOUS, Notice
    from effectgate.webhooks import _filled

    gate = make_gate(webhooks=False)
    d = gate.begin(effect_type="t", key="k", payload={}, run_id="run-A", agent_id="agent-A")
    gate.report(d, "ambiguous", error="lost")
    lapse = Notice(AMBIGUOUS, gate.namespace, "k", "t", d.effect_id, 1, "ambiguous",
                   store=gate.store)
    filled = _filled(lapse)
    assert (filled.run_id, filled.agent_id) == ("run-A", "agent-A")
    gate.resolve("k", "failed", by="op")
    again = gate.begin(effect_type="t", key="k", payload={}, run_id="run-B", agent_id="agent-B")
    assert again.attempt == 2
    late = _filled(lapse)
    assert (late.run_id, late.agent_id) == (None, None)


def test_a_bare_lease_notice_read_late_names_no_later_attempt(make_gate: Any) -> None:
    """A report made with a bare lease (the MCP form) tells only the key: what is read at
    delivery is read only while the effect is still at that lease's token."""
    from effectgate.notices import reported
    from effectgate.webhooks import _filled

    gate = make_gate(webhooks=False)
    d = gate.begin(effect_type="t", key="k", payload={}, run_id="run-A", agent_id="agent-A")
    assert d.lease is not None
    gate.report(d.lease, "ambiguous", error="reply lost")
    notice = reported(d.lease, "k", gate.namespace, gate.store, "reply lost")
    assert (_filled(notice).agent_id, _filled(notice).attempt) == ("agent-A", 1)
    gate.resolve("k", "failed", by="op")
    gate.begin(effect_type="t", key="k", payload={}, run_id="run-B", agent_id="agent-B")
    late = _filled(notice)
    assert (late.effect_id, late.attempt, late.run_id, late.agent_id) == (
        d.effect_id, None, None, None)
