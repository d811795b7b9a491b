"""Identical calls in one turn: a twin waits for the call it repeats and gets its answer.

A model that sends the same tool call twice in one turn (parallel tool calls) would otherwise
have the second told "NOT DONE YET … call again" by the store, while the first is still running
in this very process. Here the second waits for the first (at most the effect's lease) and
returns the same answer, as though it had run.

Two calls are twins when they propose the same effect — same store, namespace, effect type and
key — with the same payload hash. A call that differs in payload is not a twin: it goes to the
store, which refuses it (``PayloadMismatch``); the leader's payload hash is pinned as its body
begins, so a body that changes its arguments in place makes no later call its twin. A denial
is not handed on (it may be the leader's own: its run's or agent's ceiling): a twin then asks
the store. A call made *inside* the call it repeats (a body
that calls its own tool again) is not a twin either: waiting would deadlock, so it goes to the
store too (``in_flight``).

The registry is in-process, thread-safe and asyncio-safe: a leader running on any thread or event
loop wakes waiters on any other. The payload hash is computed only when a second call meets a
first one with the same key, so the common path (no twin) costs a render and a dict lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from effectgate import payload_hash

__all__ = ["Answer", "Slot", "TwinRegistry", "registry"]

_held: contextvars.ContextVar[frozenset[Hashable]] = contextvars.ContextVar(
    "effectgate_twin_slots", default=frozenset())


class Answer:
    """What the leader ended with: a value, or an exception to raise again."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error

    def give(self) -> Any:
        """Return the value, or raise the leader's exception."""
        if self.error is not None:
            raise self.error
        return self.value


class Slot:
    """One call in progress: its arguments, and whoever waits for its answer."""

    __slots__ = ("_digest", "_done", "_event", "_lock", "_loops", "answer", "arguments", "key")

    def __init__(self, key: Hashable, arguments: Mapping[str, Any]) -> None:
        self.key = key
        self.arguments = arguments
        self.answer: Answer | None = None
        self._digest: str | None = None
        self._lock = threading.Lock()
        self._event: threading.Event | None = None  # made when a thread first waits
        self._loops: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._done = False

    def digest(self) -> str:
        """The leader's payload hash (computed on first need, or pinned as its body began)."""
        if self._digest is None:
            self._digest = payload_hash(self.arguments)
        return self._digest

    def pin(self, digest: str) -> None:
        """The payload hash the store recorded for the leader, as its body begins: a body that
        changes its argument objects in place must not make a later call look like a twin."""
        if self._digest is None:
            self._digest = digest

    def finish(self, answer: Answer | None) -> None:
        """Record the answer and wake every waiter."""
        with self._lock:
            self.answer = answer
            self._done = True
            loops, self._loops = self._loops, []
            event = self._event
        if event is not None:
            event.set()
        for loop, future in loops:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there now
                loop.call_soon_threadsafe(_resolve, future)

    def wait(self, timeout: float) -> Answer | None:
        """Block until the answer (None after ``timeout`` seconds)."""
        with self._lock:
            if self._done:
                return self.answer
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        event.wait(timeout)
        return self.answer

    async def await_answer(self, timeout: float) -> Answer | None:
        """Wait without blocking the event loop (None after ``timeout`` seconds)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._done:
                return self.answer
            self._loops.append((loop, future))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(future, timeout)
        return self.answer


def _ended(exc: BaseException) -> Answer | None:
    """A leader's exception as its twins' answer; None (ask the store) when the leader was
    cancelled or interrupted rather than answered."""
    return Answer(error=exc) if isinstance(exc, Exception) else None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class TwinRegistry:
    """The calls in progress in this process, by effect identity."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[Hashable, Slot] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def claim(self, key: Hashable, arguments: Mapping[str, Any]) -> tuple[Slot | None, bool]:
        """``(slot, leading)``: lead a new slot, or the slot of the call this one repeats.

        ``(None, False)``: neither (another call holds the key with a different payload, or this
        call runs inside the one it repeats) — go to the store.
        """
        held = _held.get()
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = Slot(key, arguments)
                return slot, True
        if key in held:
            return None, False
        if slot.digest() != payload_hash(arguments):
            return None, False
        return slot, False

    def release(self, slot: Slot, answer: Answer | None) -> None:
        """The leader is done: forget the slot and wake its twins."""
        with self._lock:
            if self._slots.get(slot.key) is slot:
                del self._slots[slot.key]
        slot.finish(answer)

    def lead(self, slot: Slot, call: Callable[[], Any],
             shared: Callable[[Any], bool] | None = None) -> Any:
        """Run ``call`` as the slot's leader; its answer (value or exception) goes to twins,
        unless ``shared(answer)`` says it is the leader's own (then they ask the store)."""
        token = _held.set(_held.get() | {slot.key})
        try:
            out = call()
        except BaseException as exc:
            self.release(slot, _ended(exc) if shared is None or shared(exc) else None)
            raise
        finally:
            _held.reset(token)
        self.release(slot, Answer(out) if shared is None or shared(out) else None)
        return out

    async def alead(self, slot: Slot, call: Callable[[], Any],
                    shared: Callable[[Any], bool] | None = None) -> Any:
        """:meth:`lead` for a coroutine function."""
        token = _held.set(_held.get() | {slot.key})
        try:
            out = await call()
        except BaseException as exc:
            self.release(slot, _ended(exc) if shared is None or shared(exc) else None)
            raise
        finally:
            _held.reset(token)
        self.release(slot, Answer(out) if shared is None or shared(out) else None)
        return out


registry = TwinRegistry()
"""The process-wide registry every adapter uses."""
