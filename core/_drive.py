"""The two drivers of a flow (:mod:`effectgate.flow`): :func:`drive` performs its commands
against a sync :class:`~effectgate.store.Store`, :func:`adrive` against the store's async face
(reads on the loop or natively awaited, writes as the face makes them); both call reconcile
hooks (a sync hook, or an ``async def`` one run or awaited), log, and tell the observer. A
store's error is thrown into the flow at the command that met it.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, TypeVar

from ._commands import (
    CallHook,
    Command,
    Examine,
    Fetch,
    GetApproval,
    HookFailed,
    Lapse,
    Reserve,
    Resolve,
    Tell,
    Write,
)
from .errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from .notices import Observer
    from .store import Store
    from .store.async_pg import AsyncPostgres
    from .store.threaded import ThreadedStore

__all__ = ["HOOK_SECONDS", "adrive", "drive", "to_thread"]

log = logging.getLogger("effectgate")
T = TypeVar("T")

HOOK_SECONDS = 30.0
"""How long an async caller's begin waits for a reconcile hook: past it the hook's answer is
taken as unknown (the begin is answered BLOCKED, logged as a failed hook; the next begin
asks again). A sync hook runs on a small pool of its own (:data:`HOOK_THREADS`), so hooks
that hang never take the event loop's default executor from the store's calls."""

HOOK_THREADS = 4
"""The threads that run an async caller's sync reconcile hooks (per process)."""

_hook_pool: Any = None


async def to_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread``, asyncio imported by an async caller's first call rather than by
    ``import effectgate`` (a sync worker never needs it)."""
    import asyncio

    return await asyncio.to_thread(fn, *args, **kwargs)


def drive(flow: Generator[Command, Any, Any], store: Store, observe: Observer | None) -> Any:
    """Run ``flow`` to its end against ``store``; what it returns."""
    try:
        command = next(flow)
        while True:
            try:
                answer = perform(command, store, observe)
            except Exception as err:  # the flow decides what a failed call means
                command = flow.throw(err)
            else:
                command = flow.send(answer)
    except StopIteration as stop:
        return stop.value


async def adrive(flow: Generator[Command, Any, Any], store: Store,
                 astore: ThreadedStore | AsyncPostgres, observe: Observer | None) -> Any:
    """Run ``flow`` to its end against ``store``'s async face ``astore``; what it returns."""
    try:
        command = next(flow)
        while True:
            try:
                answer = await aperform(command, store, astore, observe)
            except Exception as err:
                command = flow.throw(err)
            else:
                command = flow.send(answer)
    except StopIteration as stop:
        return stop.value


def perform(command: Command, store: Store, observe: Observer | None) -> Any:
    """Perform one command against the sync store; its answer."""
    if isinstance(command, Reserve):
        return store.reserve(command.req, command.secret)
    if isinstance(command, Fetch):
        return store.fetch(command.namespace, command.key)
    if isinstance(command, Write):
        return store.move(command.row, command.move, command.req, command.secret,
                          command.approval)
    if isinstance(command, Lapse):
        return store.lapse(command.row)
    if isinstance(command, GetApproval):
        return store.approval(command.namespace, command.approval_id)
    if isinstance(command, Examine):
        return store.get(command.row.namespace, command.row.key)
    if isinstance(command, Resolve):
        return _resolve(store, command)
    if isinstance(command, CallHook):
        return _call_hook(command)
    assert isinstance(command, Tell)
    return tell(command, store, observe)


async def aperform(command: Command, store: Store, astore: ThreadedStore | AsyncPostgres,
                   observe: Observer | None) -> Any:
    """Perform one command against the async face (writes the face lacks on a thread)."""
    if isinstance(command, Reserve):
        return await astore.reserve(command.req, command.secret)
    if isinstance(command, Fetch):
        return await astore.fetch(command.namespace, command.key)
    if isinstance(command, Write):
        if command.row is None and command.approval is None:
            return await astore.move_new(command.move, command.req, command.secret)
        from .store.abandoned import abandonable  # asyncio with it: async callers only

        c = command
        return await abandonable(store, c.secret, lambda: store.move(c.row, c.move, c.req,
                                                                     c.secret, c.approval))
    if isinstance(command, Lapse):
        return await store.on_worker(store.lapse, command.row)
    if isinstance(command, GetApproval):
        return await astore.approval(command.namespace, command.approval_id)
    if isinstance(command, Examine):
        return await astore.get(command.row.namespace, command.row.key)
    if isinstance(command, Resolve):
        return await store.on_worker(_resolve, store, command)
    if isinstance(command, CallHook):
        return await _acall_hook(command)
    return tell(command, store, observe)


def tell(command: Tell, store: Any, observe: Observer | None) -> None:
    """Log a :class:`Tell` (level 0: not logged) and pass its notice to ``observe``."""
    if command.level:
        log.log(command.level, command.message, *command.args, extra=command.extra)
    if command.notice is not None and observe is not None:
        observe(command.notice._replace(store=store))


def _resolve(store: Store, c: Resolve) -> Any:
    return store.resolve(c.row, c.resolution, result=c.result, reason=c.reason,
                         actor=c.actor, note=c.note)


def _call_hook(c: CallHook) -> Any:
    """A sync caller's hook: an ``async def`` one is run to its end, unless a loop is
    running here (then :class:`ConfigError`: the caller should have used ``abegin``)."""
    try:
        answer: Any = c.fn(c.record)
    except Exception as err:
        return HookFailed(err)
    if not inspect.iscoroutine(answer):
        return answer
    import asyncio  # an async hook: asyncio is in use already

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            return asyncio.run(answer)
        except Exception as err:
            return HookFailed(err)
    answer.close()
    raise ConfigError(
        f"the reconcile hook for {c.record.effect_type} is async, and a sync begin was called "
        "inside a running event loop: use await gate.abegin(...) (or the async decorator) "
        "there", key=c.record.key)


async def _acall_hook(c: CallHook) -> Any:
    """An async caller's hook, given :data:`HOOK_SECONDS` to answer: an ``async def`` one on
    this loop, a sync one on the hooks' own threads (:func:`_hooks`)."""
    import asyncio
    import contextvars

    try:
        async with asyncio.timeout(HOOK_SECONDS):
            if inspect.iscoroutinefunction(c.fn):
                return await c.fn(c.record)
            run = contextvars.copy_context().run
            answer: Any = await asyncio.wrap_future(_hooks().submit(run, c.fn, c.record))
            if inspect.iscoroutine(answer):
                answer = await answer
            return answer
    except TimeoutError as err:
        late = TimeoutError(f"no answer within {HOOK_SECONDS:g}s (effectgate._drive."
                            "HOOK_SECONDS)")
        return HookFailed(late if err.args == () else err)
    except Exception as err:
        return HookFailed(err)


def _hooks() -> Any:
    """The pool of :data:`HOOK_THREADS` threads that runs sync reconcile hooks for async
    callers (made on first use; a forked child makes its own)."""
    global _hook_pool
    if _hook_pool is None:
        import os
        from concurrent.futures import ThreadPoolExecutor

        _hook_pool = ThreadPoolExecutor(HOOK_THREADS, thread_name_prefix="effectgate-hook")
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_forget_hooks)
    return _hook_pool


def _forget_hooks() -> None:
    global _hook_pool
    _hook_pool = None
