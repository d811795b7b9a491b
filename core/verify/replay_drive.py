"""How a replay runs its begins (:mod:`effectgate.verify.replay`): each one a :class:`Runner`
that stops at every store call until the schedule lets it go on, started by one of two
drivers — :class:`Threads` (the sync flow: :meth:`Gate.begin` on a kept thread) or
:class:`Loop` (the async flow: :meth:`Gate.abegin`, a task on one event loop) — and the
store's async face held call by call (:class:`HeldFace`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import queue
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..gate import Gate
    from ..request import Request

__all__ = ["FACE", "INSIDE", "RUNNER", "TIMEOUT", "HeldFace", "Killed", "Loop", "Runner",
           "Threads", "awaited"]

FACE = {"reserve": "reserve", "move_new": "move", "fetch": "fetch", "get": "get",
         "approval": "approval", "record_outcome": "record_outcome"}
"""The async face's operations the replay holds, and the store call each one is."""
TIMEOUT = 30.0
RUNNER: contextvars.ContextVar[Runner | None] = contextvars.ContextVar(
    "effectgate_replay_runner", default=None)
"""The begin whose store calls these are (a thread's or a task's, and the worker threads its
task hands calls to): None for the replaying thread's own calls."""
INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "effectgate_replay_inside", default=False)
"""True inside a held call of the async face: the sync store calls it makes are part of it."""


class Killed(BaseException):
    """Ends a begin whose worker died at this store call (the call is not made)."""


class Runner:
    """One begin, one store call at a time: at each call it says which (:attr:`events`) and
    waits for the schedule's go-ahead (:meth:`release`); how it is started is the driver's."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.verdict: str | None = None
        self.ended: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._lock = threading.Lock()
        self._waiting: concurrent.futures.Future[tuple[str, bool]] | None = None
        self._killed = False

    def ask(self, name: str) -> concurrent.futures.Future[tuple[str, bool]]:
        """The begin is at store call ``name``: the go-ahead to wait for (run or kill, and
        whether the reply is lost)."""
        go: concurrent.futures.Future[tuple[str, bool]] = concurrent.futures.Future()
        with self._lock:
            if self._killed:
                go.set_result(("kill", False))
                return go
            self._waiting = go
        self.events.put(("call", name))
        return go

    def release(self, command: str, lose: bool = False) -> None:
        """The schedule's go-ahead for the call the begin waits at (``kill``: at any call
        from now on)."""
        with self._lock:
            self._killed = self._killed or command == "kill"
            go, self._waiting = self._waiting, None
        if go is not None:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # it timed out
                go.set_result((command, lose))

    def next(self) -> tuple[str, Any]:
        return self.events.get(timeout=TIMEOUT)

    def join(self) -> None:
        concurrent.futures.wait([self.ended], timeout=TIMEOUT)

    def run(self, gate: Gate, request: Request) -> None:
        """The sync begin (on its own thread)."""
        RUNNER.set(self)
        try:
            self._end(gate.begin(request))
        except BaseException as err:  # the answer is compared with the model's
            self._end(err)

    async def arun(self, gate: Gate, request: Request) -> None:
        """The async begin (a task on the replay's loop)."""
        RUNNER.set(self)
        try:
            self._end(await gate.abegin(request))
        except BaseException as err:
            self._end(err)

    def _end(self, answer: Any) -> None:
        self.events.put(("killed", None) if isinstance(answer, Killed) else ("done", answer))
        if not self.ended.done():
            self.ended.set_result(None)


class Threads:
    """The sync flow: each begin in flight on a thread of its own, the gate's sync methods.
    The threads are kept for the next schedules' begins (as an application's thread pool
    keeps them), and with them each thread's store connection."""

    name = "sync"

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=16, thread_name_prefix="effectgate-replay-begin")

    def start(self, runner: Runner, gate: Gate, request: Request) -> None:
        # A fresh context each time: a kept thread holds nothing of the begin before.
        self._pool.submit(contextvars.Context().run, runner.run, gate, request)

    def call(self, gate: Gate, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(gate, method)(*args, **kwargs)

    def close(self, faces: Iterable[Any]) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Loop:
    """The async flow: each begin a task on one event loop (on its own thread), the gate's
    async methods (``abegin``, ``areport``, ...)."""

    name = "async"

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="effectgate-replay-loop")
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()

    def start(self, runner: Runner, gate: Gate, request: Request) -> None:
        asyncio.run_coroutine_threadsafe(runner.arun(gate, request), self.loop)

    def call(self, gate: Gate, method: str, *args: Any, **kwargs: Any) -> Any:
        made: Awaitable[Any] = getattr(gate, f"a{method}")(*args, **kwargs)
        return asyncio.run_coroutine_threadsafe(awaited(made), self.loop).result(TIMEOUT)

    def close(self, faces: Iterable[Any]) -> None:
        """Close the async faces' connections on this loop, then the loop."""
        for face in faces:
            closing = getattr(face, "close", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(closing(), self.loop).result(TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=TIMEOUT)


async def awaited(made: Awaitable[Any]) -> Any:
    return await made


class HeldFace:
    """A store's async face whose operations (:data:`FACE`) wait for the schedule; the rest
    is the face's own."""

    def __init__(self, face: Any, hold: Callable[[str, Any], Any]) -> None:
        self.real = face
        for attr, name in FACE.items():
            setattr(self, attr, hold(name, self._late(attr)))

    def _late(self, attr: str) -> Callable[..., Awaitable[Any]]:
        """The face's ``attr`` as it is when called (a test may patch the face's class)."""
        return lambda *args, **kwargs: getattr(self.real, attr)(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.real, attr)
