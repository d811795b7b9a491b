"""Signed webhooks: tell people when something waits for them.

``Gate(..., webhooks=Webhooks(url, secret, console_url="https://ops.example.com/effectgate"))``
POSTs a JSON body on three events (:data:`EVENTS`):

* ``approval_required`` — a new approval request (once per request, not per retry);
* ``ambiguous`` — an effect became AMBIGUOUS: a lapsed lease observed, or a holder reported
  ``ambiguous`` (a body error whose outcome is unknown). Once per move into AMBIGUOUS, in
  whichever process made it: a lapse is announced by the one writer that marked it (a
  ``begin`` or a sweeper), and the lapsed holder's own late ``ambiguous`` report is announced
  only when nobody had marked the lapse before it;
* ``budget_warning`` — a spend ceiling applies but the call declared no cost, so it cannot fire
  (once per effect type and namespace per ``budget_warning_every`` seconds).

The body is a Slack incoming-webhook message (``text`` and ``blocks``: point ``url`` at a Slack
incoming webhook and it posts as is) plus machine fields: ``event``, ``namespace``, ``key``,
``effect_type``, ``effect_id``, ``attempt``, ``state``, ``approval_id``, ``reason`` (redacted,
bounded), ``run_id``, ``agent_id``, ``estimated_cost_micros``, ``url`` (the console's page:
``{console_url}/approvals/{approval_id}`` or ``{console_url}/effects/{effect_id}``),
``delivery_id`` and ``occurred_at``. Never a payload, a result, an error's full text or a
secret. In the text people read (``text``, ``blocks``) every invisible or bidirectional
character of a key, type, id or reason is shown as ``⟨U+202E⟩``
(:func:`effectgate.redact.visible`); the machine fields carry the values as stored.

Every request is signed like Stripe's and Slack's: ``Effectgate-Timestamp`` (Unix seconds) and
``Effectgate-Signature: v1=<hex>``, the HMAC-SHA256 of ``f"{timestamp}.{body}"`` with the shared
secret. A receiver checks it with :func:`verify_signature`, which also refuses a timestamp
outside its window (a replay). Only the timestamp and the body are signed: the
``Effectgate-Event`` and ``Effectgate-Delivery`` headers repeat the body's ``event`` and
``delivery_id`` for convenience, and whoever replays a request inside the window can change
them. After verifying, route on the body's ``event`` and de-duplicate on the body's
``delivery_id``, which stays the same across retries (keep each id until its retries and the
window are over: a replay older than that already fails the timestamp check).

Delivery never blocks or fails a ``begin``: :meth:`Webhooks.notify` appends to a bounded
in-memory queue (O(1), no I/O; when full the oldest waiting delivery is dropped, counted and
logged) and a daemon thread posts (stdlib ``urllib``, no redirects followed), retrying
connection errors, timeouts, 408, 429 and 5xx with exponential backoff and jitter. A forked
child starts its own thread on its first event; at exit the queue gets ``flush_on_exit``
seconds to drain. Deliveries are at least once while the process lives and best effort beyond
it: the store stays the source of truth (the console and ``effectgate ls`` show what waits).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import heapq
import hmac
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

from .errors import ConfigError
from .governance import dollars
from .notices import AMBIGUOUS, APPROVAL_REQUIRED, BUDGET_WARNING, EVENTS, Notice
from .redact import bound, redact_text, visible

__all__ = [
    "EVENTS", "SIGNATURE_HEADER", "TIMESTAMP_HEADER", "WebhookStats", "Webhooks", "from_env",
    "from_option", "sign", "verify_signature",
]

log = logging.getLogger("effectgate")
TIMESTAMP_HEADER = "Effectgate-Timestamp"
SIGNATURE_HEADER = "Effectgate-Signature"
EVENT_HEADER = "Effectgate-Event"
DELIVERY_HEADER = "Effectgate-Delivery"
_MIN_SECRET = 16
_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_TITLES = {
    APPROVAL_REQUIRED: "Approval needed",
    AMBIGUOUS: "An effect is AMBIGUOUS",
    BUDGET_WARNING: "A spend ceiling cannot fire",
}
_ASKS = {
    APPROVAL_REQUIRED: "Approve or deny it in the console or with `effectgate approve`.",
    AMBIGUOUS: "It may or may not have happened and is not retried until someone resolves it: "
               "check the vendor, then resolve it in the console or with `effectgate resolve`.",
    BUDGET_WARNING: "Declare a cost on this effect (estimated_cost_micros / cost_micros) so "
                    "the ceiling can refuse.",
}


def _secret_bytes(secret: str | bytes, what: str = "secret") -> bytes:
    if isinstance(secret, str):
        raw = secret.encode("utf-8")
    elif isinstance(secret, bytes):
        raw = secret
    else:
        raise ConfigError(f"the webhook {what} must be a str or bytes")
    return raw


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The signature headers for ``body``: ``Effectgate-Timestamp`` and
    ``Effectgate-Signature: v1=<hex HMAC-SHA256 of "{timestamp}.{body}">``."""
    if not isinstance(body, bytes):
        raise ConfigError("the body to sign must be bytes")
    ts = int(time.time()) if timestamp is None else int(timestamp)
    mac = hmac.new(_secret_bytes(secret), f"{ts}.".encode() + body, hashlib.sha256)
    return {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: f"v1={mac.hexdigest()}"}


def _header(headers: Any, name: str) -> str | None:
    """A header's value from any mapping or list of pairs, by case-insensitive name."""
    getter = getattr(headers, "get", None)
    if callable(getter):
        for candidate in (name, name.lower()):
            value = getter(candidate)
            if isinstance(value, (str, bytes)):
                return value.decode("latin-1") if isinstance(value, bytes) else value
    items = headers.items() if isinstance(headers, Mapping) else headers
    try:
        for key, value in items:
            key_text = key.decode("latin-1") if isinstance(key, bytes) else str(key)
            if key_text.lower() == name.lower():
                return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    except (TypeError, ValueError):
        return None
    return None


def verify_signature(secret: str | bytes | Iterable[str | bytes], headers: Any,
                     body: bytes | str, tolerance: float = 300, *,
                     now: float | None = None) -> bool:
    """True when ``body`` was signed with ``secret`` (or one of several, while rotating) less
    than ``tolerance`` seconds ago (either way: a clock a little ahead is tolerated alike).

    ``headers``: the request's headers (any mapping, or a list of pairs; names in any case).
    ``body``: the raw bytes received — verify before parsing. A missing, malformed, stale or
    future timestamp, or no matching ``v1=`` signature, is False; nothing raises on hostile
    input (a wrong ``secret`` type, or a ``tolerance`` or ``now`` that is not a finite
    non-negative number, is a :class:`ConfigError`: that is the receiver's bug)."""
    secrets = [secret] if isinstance(secret, (str, bytes)) else list(secret)
    keys = [_secret_bytes(s) for s in secrets]
    if not keys or any(not k for k in keys):
        raise ConfigError("verify_signature needs a non-empty secret")
    window = _positive(tolerance, "tolerance", zero=True)  # NaN or inf would accept any age
    clock = time.time() if now is None else _positive(now, "now")
    try:
        raw = body.encode("utf-8") if isinstance(body, str) else body
    except UnicodeEncodeError:  # a lone surrogate: no sender's bytes decode to it
        return False
    if not isinstance(raw, bytes):
        return False
    stamp = _header(headers, TIMESTAMP_HEADER)
    offered = _header(headers, SIGNATURE_HEADER)
    if stamp is None or offered is None or len(stamp) > 20 or len(offered) > 4096:
        return False
    stamp = stamp.strip()
    if not stamp.isascii() or not stamp.isdigit():
        return False
    ts = int(stamp)
    if abs(clock - ts) > window:
        return False
    signed = f"{ts}.".encode() + raw
    candidates = [part.strip()[3:].lower().encode("ascii") for part in offered.split(",")
                  if part.strip().startswith("v1=") and part.isascii()]  # hex is ASCII
    for key in keys:
        expected = hmac.new(key, signed, hashlib.sha256).hexdigest().encode("ascii")
        for candidate in candidates:
            if hmac.compare_digest(expected, candidate):
                return True
    return False


class WebhookStats(NamedTuple):
    """Deliveries so far: posted (a 2xx), retried (attempts that will be tried again),
    failed (given up: attempts exhausted or refused with a 4xx), dropped (the queue was
    full), and waiting (queued or due for a retry)."""

    delivered: int
    retried: int
    failed: int
    dropped: int
    waiting: int


class _Delivery:
    __slots__ = ("attempt", "body", "due", "event", "id", "notice", "occurred")

    def __init__(self, notice: Notice) -> None:
        self.notice = notice
        self.event = notice.event
        self.id = ""  # given on the delivery thread, kept across retries
        self.occurred = time.time()
        self.attempt = 0
        self.due = 0.0
        self.body: bytes | None = None

    def __lt__(self, other: _Delivery) -> bool:
        return self.due < other.due


_live: weakref.WeakSet[Webhooks] = weakref.WeakSet()


class Webhooks:
    """Signed POSTs to ``url`` on approval requests, AMBIGUOUS effects and budget warnings.

    ``secret``: the shared signing secret (at least 16 characters; e.g.
    ``secrets.token_urlsafe(32)``). ``console_url``: the web console's base URL, for links to
    ``/approvals/{approval_id}`` and ``/effects/{effect_id}``. ``events``: which of
    :data:`EVENTS` to send. ``timeout``: seconds per attempt, the whole answer included (an
    endpoint that trickles its answer is cut off then and retried). ``max_queue``: deliveries
    held in memory at most (the oldest is dropped beyond it). ``max_attempts``, ``backoff_seconds``,
    ``max_backoff_seconds``: retries (exponential, with jitter). ``budget_warning_every``:
    seconds between two budget warnings of one effect type. ``flush_on_exit``: seconds the
    queue gets to drain when the interpreter exits (0: none). ``headers``: extra request
    headers (an ``Authorization`` for a gateway in front of the receiver: ``url`` may carry
    no ``user:password@``).

    One instance may serve several gates; give each process its own only if you want separate
    queues.
    """

    def __init__(self, url: str, secret: str | bytes, *, console_url: str | None = None,
                 events: Iterable[str] = EVENTS, timeout: float = 5.0, max_queue: int = 1000,
                 max_attempts: int = 6, backoff_seconds: float = 1.0,
                 max_backoff_seconds: float = 60.0, budget_warning_every: float = 3600.0,
                 flush_on_exit: float = 2.0, headers: Mapping[str, str] | None = None) -> None:
        self._url = _http_url(url, "url")
        self._where = _origin(self._url)
        self._secret = _secret_bytes(secret)
        if len(self._secret) < _MIN_SECRET:
            raise ConfigError(f"the webhook secret must be at least {_MIN_SECRET} characters "
                              "(e.g. secrets.token_urlsafe(32))")
        self.console_url = None if console_url is None else _http_url(
            console_url, "console_url").rstrip("/")
        if isinstance(events, str):
            events = (events,)
        chosen = tuple(dict.fromkeys(events))
        unknown = [e for e in chosen if e not in EVENTS]
        if unknown or not chosen:
            raise ConfigError(f"webhook events must be some of {', '.join(EVENTS)}, not "
                              f"{unknown or 'none'}")
        self.events = frozenset(chosen)
        self.timeout = _positive(timeout, "timeout")
        self.max_queue = _whole(max_queue, "max_queue")
        self.max_attempts = _whole(max_attempts, "max_attempts")
        self.backoff_seconds = _positive(backoff_seconds, "backoff_seconds")
        self.max_backoff_seconds = _positive(max_backoff_seconds, "max_backoff_seconds")
        self.budget_warning_every = _positive(budget_warning_every, "budget_warning_every",
                                              zero=True)
        self.flush_on_exit = _positive(flush_on_exit, "flush_on_exit", zero=True)
        extra = dict(headers or {})
        for name, value in extra.items():
            if not (isinstance(name, str) and isinstance(value, str)) or any(
                    c in name + value for c in "\r\n\x00"):
                raise ConfigError("webhook headers must be str names and values on one line")
        self._headers = extra
        self._counts = {"delivered": 0, "retried": 0, "failed": 0, "dropped": 0}
        self._warned: dict[tuple[str, str | None], float] = {}
        self._next_drop_log = 0.0
        self._ambiguous: OrderedDict[tuple[str, str, int], None] = OrderedDict()
        self._reset()
        _live.add(self)

    def _reset(self) -> None:
        """Fresh queue, lock and (not yet started) thread: at construction, and in a forked
        child (the parent's thread does not exist there; its queue is the parent's to send)."""
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Delivery] = deque()
        self._retry: list[_Delivery] = []
        self._busy = 0
        self._thread: threading.Thread | None = None
        self._stopping = False

    def __repr__(self) -> str:  # the URL's path may itself be a secret (Slack's are)
        return f"Webhooks({self._where}, events={sorted(self.events)})"

    # -- the caller's side: O(1), no I/O, never raises ----------------------------------------

    def notify(self, notice: Notice) -> None:
        """Queue ``notice`` for delivery and return at once."""
        try:
            if notice.event not in self.events:
                return
            item = _Delivery(notice)
            with self._cond:
                if notice.event == BUDGET_WARNING and not self._first_warning(notice):
                    return
                if notice.event == AMBIGUOUS and not self._first_ambiguous(notice):
                    return
                if len(self._queue) + len(self._retry) >= self.max_queue:
                    self._drop_oldest()
                self._queue.append(item)
                if self._thread is None:
                    self._start()
                self._cond.notify()
        except Exception as err:  # a notification must never fail the caller's begin
            log.warning("webhook: could not queue %s: %s", getattr(notice, "event", "?"),
                        type(err).__name__)

    def _first_warning(self, notice: Notice) -> bool:
        where = (notice.namespace, notice.effect_type)
        now = time.monotonic()
        last = self._warned.get(where)
        if last is not None and now - last < self.budget_warning_every:
            return False
        if len(self._warned) > 10_000:
            self._warned.clear()
        self._warned[where] = now
        return True

    def _first_ambiguous(self, notice: Notice) -> bool:
        """One message per attempt that became AMBIGUOUS, within this process: a second
        guard only (the gate already notifies a report's AMBIGUOUS only when that report moved
        the effect there, so a lapse and the late holder's report are one event across
        processes too)."""
        if notice.attempt is None:
            return True
        where = (notice.namespace, notice.key, notice.attempt)
        if where in self._ambiguous:
            return False
        if len(self._ambiguous) >= 10_000:
            self._ambiguous.popitem(last=False)
        self._ambiguous[where] = None
        return True

    def _drop_oldest(self) -> None:
        victim = self._queue.popleft() if self._queue else heapq.heappop(self._retry)
        self._counts["dropped"] += 1
        now = time.monotonic()
        if now >= self._next_drop_log:  # logged at most every 10 s: a flood must stay O(1)
            self._next_drop_log = now + 10.0
            log.warning("webhook: queue full (%d); dropped the oldest delivery (%s %s); %d "
                        "dropped so far", self.max_queue, victim.event, victim.notice.key,
                        self._counts["dropped"])

    def _start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="effectgate-webhooks",
                                        daemon=True)
        self._thread.start()

    def stats(self) -> WebhookStats:
        """How many deliveries were posted, retried, given up, dropped, and are waiting."""
        with self._cond:
            c = self._counts
            waiting = len(self._queue) + len(self._retry) + self._busy
            return WebhookStats(c["delivered"], c["retried"], c["failed"], c["dropped"],
                                waiting)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait up to ``timeout`` seconds for every queued delivery (retries included) to be
        posted or given up; True when none is left."""
        end = time.monotonic() + max(0.0, float(timeout))
        with self._cond:
            while self._queue or self._retry or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Give the queue ``timeout`` seconds to drain, then stop the thread (a later event
        starts it again)."""
        self.flush(timeout)
        with self._cond:
            self._stopping = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(0.1, timeout))

    # -- the delivery thread ----------------------------------------------------------------

    def _next(self) -> _Delivery | None:
        with self._cond:
            while True:
                if self._stopping or self._thread is not threading.current_thread():
                    return None  # closed, or replaced by a newer thread
                now = time.monotonic()
                if self._retry and self._retry[0].due <= now:
                    item = heapq.heappop(self._retry)
                elif self._queue:
                    item = self._queue.popleft()
                else:
                    wait = self._retry[0].due - now if self._retry else None
                    self._cond.wait(wait)
                    continue
                self._busy += 1
                return item

    def _run(self) -> None:
        me = threading.current_thread()
        while self._thread is me:
            item = self._next()
            if item is None:
                return
            again: float | None = None
            try:
                again = self._attempt(item)
            except Exception as err:  # never let the thread die
                log.warning("webhook: delivery %s failed: %s", item.id, type(err).__name__)
            with self._cond:
                self._busy -= 1
                if again is not None:
                    item.due = time.monotonic() + again
                    heapq.heappush(self._retry, item)
                self._cond.notify_all()

    def _attempt(self, item: _Delivery) -> float | None:
        """Post once; the delay before the next attempt, or None when done."""
        if item.body is None:
            item.id = uuid.uuid4().hex
            item.body = json.dumps(self.message(_filled(item.notice), item.id, item.occurred),
                                   separators=(",", ":")).encode()
        item.attempt += 1
        status, retry_after, problem = self._post(item)
        if status is not None and 200 <= status < 300:
            with self._cond:
                self._counts["delivered"] += 1
            return None
        retryable = status is None or status in _RETRY_STATUS
        if not retryable or item.attempt >= self.max_attempts:
            with self._cond:
                self._counts["failed"] += 1
            log.warning("webhook: gave up on %s %s to %s after %d attempt(s): %s", item.event,
                        item.id, self._where, item.attempt, problem)
            return None
        with self._cond:
            self._counts["retried"] += 1
        delay: float = min(self.max_backoff_seconds,
                           self.backoff_seconds * 2.0 ** (item.attempt - 1))
        delay *= random.uniform(0.5, 1.0)  # jitter: receivers coming back are not stampeded
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_backoff_seconds))
        log.info("webhook: %s %s to %s failed (%s); retry %d in %.1fs", item.event, item.id,
                 self._where, problem, item.attempt, delay)
        return delay

    def _post(self, item: _Delivery) -> tuple[int | None, float | None, str]:
        """(HTTP status or None, Retry-After seconds, what went wrong) for one attempt."""
        import urllib.error
        import urllib.request

        assert item.body is not None
        headers = {"Content-Type": "application/json", "User-Agent": "effectgate-webhooks",
                   EVENT_HEADER: item.event, DELIVERY_HEADER: item.id, **self._headers}
        headers.update(sign(self._secret, item.body))
        request = urllib.request.Request(self._url, data=item.body, headers=headers,
                                         method="POST")
        # Whether the deadline had passed when the headers were in: ``passed`` is set before
        # any socket is cut, so headers cut short (they end at EOF) always show it; once they
        # came whole, the status stands, however slowly the body follows (it is cut).
        with _Deadline(self.timeout) as deadline:
            try:
                with _opener(deadline).open(request, timeout=self.timeout) as response:
                    cut = deadline.passed
                    answer: tuple[int | None, float | None, str] = (
                        int(response.status), None, f"HTTP {response.status}")
                    with contextlib.suppress(Exception):  # only the status matters
                        response.read(65536)
            except urllib.error.HTTPError as err:
                cut = deadline.passed
                after = err.headers.get("Retry-After") if err.headers else None
                err.close()
                wait = _retry_after(after)
                answer = int(err.code), wait, f"HTTP {err.code}"
            except Exception as err:  # refused, reset, timed out, DNS: all worth a retry
                cut = deadline.passed
                reason = getattr(err, "reason", None)
                answer = None, None, type(reason if isinstance(reason, BaseException) else err
                                          ).__name__
        if cut:
            return None, None, f"no answer within {self.timeout:g}s"
        return answer

    # -- the body --------------------------------------------------------------------------

    def link(self, notice: Notice) -> str | None:
        """The console's page for ``notice`` (None without ``console_url``)."""
        if self.console_url is None:
            return None
        if notice.event == APPROVAL_REQUIRED and notice.approval_id:
            return f"{self.console_url}/approvals/{quote(notice.approval_id, safe='')}"
        if notice.effect_id is not None:
            return f"{self.console_url}/effects/{int(notice.effect_id)}"
        return None

    def message(self, notice: Notice, delivery_id: str = "", occurred: float | None = None,
                ) -> dict[str, Any]:
        """The JSON body for ``notice``: a Slack message (``text``, ``blocks``) and the
        machine fields."""
        link = self.link(notice)
        reason = None if notice.reason is None else bound(redact_text(notice.reason), 300)
        title = _TITLES.get(notice.event, notice.event)
        what = f"`{_code(notice.effect_type or '?')}` `{_code(notice.key)}`"
        lines = [f"*{title}*: {what}"]
        if notice.estimated_cost_micros is not None:
            lines.append(f"Estimated cost: {dollars(notice.estimated_cost_micros)}")
        if notice.agent_id or notice.run_id:
            lines.append("Asked by: " + " · ".join(
                f"{label} `{_code(value)}`" for label, value in
                (("agent", notice.agent_id), ("run", notice.run_id)) if value))
        if reason:
            lines.append(f"Reason: {_mrkdwn(visible(reason))}")
        lines.append(_ASKS.get(notice.event, ""))
        if link:
            lines.append(f"<{_mrkdwn(link)}|Open in the effectgate console>")
        context = [f"namespace `{_code(notice.namespace)}`"]
        if notice.effect_id is not None:
            context.append(f"effect {int(notice.effect_id)}")
        if notice.attempt is not None:
            context.append(f"attempt {int(notice.attempt)}")
        if notice.approval_id:
            context.append(f"approval `{_code(notice.approval_id)}`")
        fallback = f"{title}: {_plain(notice.effect_type or '?')} {_plain(notice.key)}"
        stamp = time.time() if occurred is None else occurred
        return {
            "text": _mrkdwn(fallback + (f" {link}" if link else "")),
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}},
                {"type": "context", "elements": [
                    {"type": "mrkdwn", "text": " · ".join(context)}]},
            ],
            "unfurl_links": False,  # Slack: do not fetch the console's page for a preview
            "unfurl_media": False,
            "event": notice.event,
            "namespace": notice.namespace,
            "key": notice.key,
            "effect_type": notice.effect_type,
            "effect_id": notice.effect_id,
            "attempt": notice.attempt,
            "state": notice.state,
            "approval_id": notice.approval_id,
            "reason": reason,
            "run_id": notice.run_id,
            "agent_id": notice.agent_id,
            "estimated_cost_micros": notice.estimated_cost_micros,
            "url": link,
            "delivery_id": delivery_id,
            "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp)),
        }


_from_env: dict[tuple[str, ...], Webhooks] = {}
_from_env_lock = threading.Lock()


def from_option(webhooks: object) -> Webhooks | None:
    """The webhooks a gate's ``webhooks=`` names: a :class:`Webhooks`, or None for those of
    :func:`from_env`; :class:`~effectgate.ConfigError` for anything else."""
    if webhooks is None:
        return from_env()
    if not isinstance(webhooks, Webhooks):
        raise ConfigError("webhooks must be an effectgate.webhooks.Webhooks, or False for none")
    return webhooks


def from_env() -> Webhooks | None:
    """The process's webhooks from the environment, or None when ``$EFFECTGATE_WEBHOOK_URL``
    is not set: ``$EFFECTGATE_WEBHOOK_SECRET`` (required with it), ``$EFFECTGATE_CONSOLE_URL``
    and ``$EFFECTGATE_WEBHOOK_EVENTS`` (comma-separated). Every gate made from the same
    settings shares one queue and one delivery thread. This is how a gate the CLI makes
    (``effectgate mcp serve``) sends webhooks."""
    url = os.environ.get("EFFECTGATE_WEBHOOK_URL")
    if not url:
        return None
    secret = os.environ.get("EFFECTGATE_WEBHOOK_SECRET")
    if not secret:
        raise ConfigError("$EFFECTGATE_WEBHOOK_URL is set but $EFFECTGATE_WEBHOOK_SECRET is not: "
                          "every webhook is signed")
    console = os.environ.get("EFFECTGATE_CONSOLE_URL") or None
    events = tuple(e.strip() for e in os.environ.get("EFFECTGATE_WEBHOOK_EVENTS", "").split(",")
                   if e.strip()) or EVENTS
    settings = (url, secret, console or "", *events)
    with _from_env_lock:
        found = _from_env.get(settings)
        if found is None:
            found = _from_env[settings] = Webhooks(url, secret, console_url=console,
                                                   events=events)
        return found


def _filled(notice: Notice) -> Notice:
    """What a notice's maker did not know, read (on the delivery thread): a bare-lease
    report's effect id and type; an AMBIGUOUS notice's run and agent (a lapse is observed from
    the effect's head, a report from the holder's decision: neither carries them)."""
    bare = notice.effect_id is None
    if notice.store is None or not (bare or (
            notice.event == AMBIGUOUS and notice.run_id is None and notice.agent_id is None)):
        return notice
    try:
        row = notice.store.get(notice.namespace, notice.key)
    except Exception:
        return notice
    if row is None:
        return notice
    if not bare:  # the same attempt still, or its run and agent are no longer on the row
        same = row.id == notice.effect_id and row.attempt == notice.attempt
        return notice._replace(run_id=row.run_id, agent_id=row.agent_id) if same else notice
    if notice.token is not None and row.token != notice.token:  # moved on since the report
        return notice._replace(effect_id=row.id, effect_type=row.effect_type)
    return notice._replace(effect_id=row.id, effect_type=row.effect_type, attempt=row.attempt,
                           run_id=row.run_id, agent_id=row.agent_id)


def _plain(text: str) -> str:
    """Agent-supplied text for people: bounded, on one line, every invisible or bidi character
    shown as ``⟨U+XXXX⟩`` (:func:`effectgate.redact.visible`)."""
    return visible(bound(str(text), 200))


def _mrkdwn(text: str) -> str:
    """Text Slack shows as written: its three control characters escaped (so a hostile key
    cannot make a link or a mention)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    """Text inside a Slack code span: one line, no backtick to break out of it, escaped."""
    return _mrkdwn(_plain(text).replace("`", "ˋ"))


def _http_url(url: object, what: str) -> str:
    if not isinstance(url, str):
        raise ConfigError(f"webhook {what} must be a str")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(f"webhook {what} is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(
            c <= " " or c == "\x7f" for c in url):  # urlsplit drops a tab; http.client not
        raise ConfigError(f"webhook {what} must be an http(s) URL with a host (and no space "
                          "or control character)")
    if what == "url" and not (parts.path + parts.query).isascii():  # http.client sends ASCII
        raise ConfigError(f"webhook {what} must have an ASCII path and query (percent-encode "
                          "the rest): every delivery would fail")
    if not parts.hostname.isascii():  # http.client sends it IDNA-encoded
        _idna_host(parts.hostname, what)
    if "@" in parts.netloc:  # urllib would look the password up in DNS as part of the host
        raise ConfigError(f"webhook {what} must not carry credentials (user:password@): pass "
                          "them as headers={'Authorization': ...}")
    try:
        parts.port  # noqa: B018 - raises on a port that is not 0-65535
    except ValueError:
        raise ConfigError(f"webhook {what} has an invalid port") from None
    return url


def _idna_host(host: str, what: str) -> None:
    """A non-ASCII host is sent IDNA-encoded: one the codec refuses would fail every delivery,
    and one IDNA maps to another host than the one shown is refused: it drops an invisible
    character (a zero-width space, a soft hyphen) and maps others (``ß`` to ``ss``, full-width
    letters and the ideographic full stop to ASCII), so deliveries went elsewhere. ``host`` is
    as :func:`~urllib.parse.urlsplit` gives it (lower case)."""
    if not host.isprintable():
        raise ConfigError(f"webhook {what} has an invisible or control character in its host "
                          "(IDNA would drop it and send to another host)")
    try:
        sent = host.encode("idna")
        named = sent.decode("idna")
    except UnicodeError:
        raise ConfigError(f"webhook {what} has a host that IDNA cannot encode (a label empty "
                          "or over 63 characters, or a character IDNA refuses): every "
                          "delivery would fail") from None
    if named != host:
        raise ConfigError(f"webhook {what} has a host that IDNA sends as {sent.decode()!r}, "
                          "another host than the one configured: configure the host meant (its "
                          "xn-- form where IDNA 2008 spells it otherwise)")


def _retry_after(value: object) -> float | None:
    """A ``Retry-After`` of delay-seconds (ASCII digits only: ``str.isdigit`` also says yes to
    ``²``, which ``float`` refuses, and the exception lost the delivery); None otherwise."""
    text = value.strip() if isinstance(value, str) else ""
    return float(text[:12]) if text.isascii() and text.isdigit() else None


def _origin(url: str) -> str:
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"


def _positive(value: object, what: str, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            value > 0 or (zero and value == 0)) or value != value or value == float("inf"):
        raise ConfigError(f"{what} must be a {'non-negative' if zero else 'positive'} number "
                          "of seconds")
    return float(value)


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a whole number of at least 1")
    return value


class _Deadline:
    """One attempt's time limit: once it passes, the attempt's connections are shut down
    (again every 50 ms until the attempt returns: a socket still connecting, or in its TLS
    handshake, at that moment is cut too). A socket timeout bounds each read, not the whole
    answer: an endpoint that sends a byte every few seconds would otherwise hold the delivery
    thread (and every later webhook) for ever.

    Each socket is watched through a duplicate of its descriptor that only this deadline
    closes, after its timer thread has stopped: shutting a duplicate cuts the connection
    wherever urllib keeps it (the response's file once the headers are read, a TLS socket
    after the handshake), and can never reach a descriptor number the attempt's own close
    released and another socket reused."""

    __slots__ = ("_lock", "_over", "_socks", "_timer", "passed")

    def __init__(self, seconds: float) -> None:
        self.passed = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._over = threading.Event()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._over.set()
        self._timer.cancel()
        self._timer.join()
        for sock in self._socks:
            sock.close()

    def watch(self, sock: socket.socket) -> socket.socket:
        """``sock``, now cut with the others when the deadline passes."""
        copy = sock.dup()
        with self._lock:
            self._socks.append(copy)
        return sock

    def _cut(self) -> None:
        self.passed = True
        while True:
            with self._lock:
                watched = list(self._socks)
            for sock in watched:
                with contextlib.suppress(OSError):  # not connected (yet, or any more)
                    sock.shutdown(socket.SHUT_RDWR)
            if self._over.wait(0.05):
                return


_handlers: list[tuple[Any, Any, Any]] = []


def _opener(deadline: _Deadline) -> Any:
    """A urllib opener that follows no redirect (a redirected POST would lose its body, and
    the signature is for the configured URL only) and hands each socket it connects to
    ``deadline``."""
    import urllib.request

    if not _handlers:
        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        class Timed(urllib.request.AbstractHTTPHandler):
            def __init__(self, deadline: _Deadline) -> None:
                super().__init__()
                self.deadline = deadline

            def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
                def connection(*args: Any, **kw: Any) -> Any:
                    made = http_class(*args, **kw)
                    connect = made._create_connection
                    made._create_connection = lambda *a, **k: self.deadline.watch(
                        connect(*a, **k))
                    return made

                return super().do_open(connection, req, **kwargs)

        class TimedHTTP(Timed, urllib.request.HTTPHandler):
            pass

        class TimedHTTPS(Timed, urllib.request.HTTPSHandler):
            pass

        _handlers.append((NoRedirect, TimedHTTP, TimedHTTPS))  # two threads: either is fine
    no_redirect, plain, tls = _handlers[0]
    return urllib.request.build_opener(no_redirect, plain(deadline), tls(deadline))


def _after_fork_in_child() -> None:
    for hooks in list(_live):
        hooks._reset()


def _at_exit() -> None:
    for hooks in list(_live):
        if hooks.flush_on_exit and hooks._thread is not None:
            hooks.flush(hooks.flush_on_exit)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
