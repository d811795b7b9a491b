"""``@gate.effect``: one line around a function, sync or async.

:class:`EffectSpec` is the gated call written once: arguments in, key and payload hash out,
``begin``, the body, ``report``. The decorator and every framework adapter drive it; only how
the body and the store are awaited differs between :meth:`EffectSpec.run` and
:meth:`EffectSpec.arun`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import types
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from ._payload_steps import apayload_hash, is_small
from .classify import Classifier, checked_classifiers
from .context import _current, current_effect, current_effect_scope
from .errors import (
    ApprovalRequired,
    BudgetWarning,
    ConfigError,
    EffectAmbiguous,
    EffectDenied,
    EffectGateError,
    EffectInFlight,
    EffectRefused,
    OverspendWarning,
    PayloadError,
    ResultNotStoredWarning,
)
from .keys import KeyTemplate, effect_key_template
from .records import BeginDecision
from .redact import describe, redact_fields
from .reporting import failure_outcome
from .states import Decision, Outcome

if TYPE_CHECKING:
    import asyncio

    from .gatelike import GateLike
    from .request import Request

__all__ = [
    "BudgetWarning",
    "EffectSpec", "OverspendWarning", "ResultNotStoredWarning", "current_effect",
    "current_effect_scope", "gate_function", "refusal",
]

log = logging.getLogger("effectgate")
T = TypeVar("T")
_UNFINISHED = (types.CoroutineType, types.GeneratorType, types.AsyncGeneratorType)
# Results that are finished work by their type alone (no __await__, not a generator), asked
# first: hasattr's miss on a type raises and swallows an AttributeError (~0.5 µs a call).
_FINISHED = frozenset((dict, list, tuple, str, int, float, bool, bytes, type(None)))
_STORAGE = frozenset(("redact", "redact_result", "store_result"))
_NOT_STARTED = "cancelled before the body started"
_WARNED = "a warning raised as an error before the body started"
_COMMITTED = Outcome.COMMITTED


def refusal(d: BeginDecision) -> EffectRefused:
    """The exception that stands for a refusing decision (anything but execute/duplicate)."""
    fields: dict[str, Any] = {
        "key": d.key, "state": d.state.value, "decision": d.decision.value,
        "reason": d.reason, "effect_id": d.effect_id,
    }
    if d.decision is Decision.IN_FLIGHT:
        return EffectInFlight(
            f"{d.key!r} is being executed by another holder; ask again in "
            f"{d.retry_after_seconds}s", retry_after_seconds=d.retry_after_seconds, **fields,
        )
    if d.decision is Decision.BLOCKED:
        return EffectAmbiguous(
            f"{d.key!r} may or may not have happened ({d.reason}); it is not retried until an "
            "operator or a reconcile hook resolves it", **fields,
        )
    if d.decision is Decision.APPROVAL_REQUIRED:
        return ApprovalRequired(
            f"{d.key!r} needs a human's approval (approval id {d.approval_id})",
            approval_id=d.approval_id, **fields,
        )
    if d.decision is Decision.DENIED:
        return EffectDenied(f"{d.key!r} was denied: {d.reason}", **fields)
    raise ValueError(f"{d.decision.value!r} is not a refusal")


def _accepted(fn: Callable[..., Any]) -> tuple[frozenset[str] | None, bool]:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None, True
    return frozenset(p.name for p in params), False


class EffectSpec:
    """A declared effect: key template, effect type and options, bound to a gate.

    ``run(arguments, body)`` gates one call whose arguments (by name) are ``arguments``;
    ``arun`` is its async twin. Adapters build ``arguments`` from a tool call.
    """

    def __init__(
        self,
        gate: GateLike,
        key: str,
        *,
        effect_type: str,
        vendor: str | None = None,
        cost_micros: int | Callable[..., int] | None = None,
        lease_seconds: float | None = None,
        max_attempts: int | None = None,
        group_key: str | None = None,
        compensation: Any = None,
        redact: Callable[[Any], Any] | None = None,
        store_result: bool = True,
        classifiers: tuple[Classifier, ...] = (),
        result_type: Any = None,
    ) -> None:
        self.gate = gate
        self.template = effect_key_template(key)
        self.group_template = KeyTemplate(group_key) if group_key else None
        self.effect_type = effect_type
        self.vendor = vendor
        self.cost_micros = cost_micros
        self._cost_params = _accepted(cost_micros) if callable(cost_micros) else None
        self.compensation = compensation
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        if redact is not None and not callable(redact):
            raise ConfigError("redact must be a function of the result")
        if not isinstance(store_result, bool):
            raise ConfigError("store_result must be a bool")
        self.redact = redact
        self.classifiers = checked_classifiers(classifiers) + tuple(gate.classifiers)
        self.result_type = result_type
        # Whether a duplicate's stored JSON is handed back as it is (decided once, not on
        # every duplicate).
        self._as_stored = result_type in (None, inspect.Signature.empty, Any)
        self._adapter: Any = None
        # A call with no cost, group or compensation to work out: its request is its key and
        # payload (the common tool).
        self._plain = cost_micros is None and group_key is None and compensation is None
        # Validate the options now, not at the first refund.
        self.kind = gate.kind(effect_type, vendor=vendor, lease_seconds=lease_seconds,
                              max_attempts=max_attempts)
        # The policy can only keep more out of the store, never put more in.
        self.store_result = store_result and self.kind.store_result
        self.redact_result = self.kind.redact_result
        # Whether :meth:`stored_form` is the result itself (decided once, not per commit;
        # again when one of what decides it is set: :meth:`__setattr__`).
        self._stores_as_is = self.store_result and redact is None and not self.redact_result

    def __setattr__(self, name: str, value: Any) -> None:
        # An adapter's copy may set ``redact``, ``redact_result`` or ``store_result`` after
        # the spec is made (the MCP gateway's does): what is stored follows them.
        object.__setattr__(self, name, value)
        if name in _STORAGE and "_stores_as_is" in self.__dict__:
            object.__setattr__(self, "_stores_as_is", self.store_result and (
                self.redact is None) and not self.redact_result)

    def check_names(self, names: Any, where: str) -> None:
        """Raise :class:`EffectKeyError` if a template names an argument ``where`` lacks."""
        self.template.check_names(names, where)
        if self.group_template is not None:
            self.group_template.check_names(names, where)

    def request(self, arguments: Mapping[str, Any]) -> Request:
        """Key, payload hash and options for one call; every error before anything runs."""
        template = self.template
        key = template.render(arguments)
        if self._plain:
            return self.gate._checked_request(self.kind, key, template.normalise(arguments)
                                              if template.normalises else arguments)
        cost, compensation = self._cost_and_compensation(key, arguments)
        return self.gate._checked_request(
            self.kind, key, self.template.normalise(arguments),
            group_key=self.group_template.render(arguments) if self.group_template else None,
            compensation=compensation, estimated_cost_micros=cost,
        )

    async def arequest(self, arguments: Mapping[str, Any]) -> Request:
        """:meth:`request` for an async caller: the same request, or the same error. Large
        arguments are hashed by steps the event loop runs other tasks between
        (:func:`~effectgate._payload_steps.apayload_hash`); the request is then built around an
        empty stand-in and given the arguments and their hash."""
        if is_small(arguments):
            return self.request(arguments)
        key = self.template.render(arguments)
        cost, compensation = (None, None) if self._plain else self._cost_and_compensation(
            key, arguments)
        payload = self.template.normalise(arguments)
        group = self.group_template.render(arguments) if self.group_template else None
        digest = await apayload_hash(payload)
        req = self.gate._checked_request(self.kind, key, {}, group_key=group,
                                         compensation=compensation,
                                         estimated_cost_micros=cost)
        return req._replace(payload_hash=digest, payload=payload)

    def _cost_and_compensation(self, key: str, arguments: Mapping[str, Any]) -> tuple[Any, Any]:
        """The call's estimated cost and its undo's description, each worked out from the
        arguments when it is a function (:class:`ConfigError` when that raises)."""
        cost = self.cost_micros
        if callable(cost):
            names, everything = self._cost_params or (None, True)
            args = arguments if everything or names is None else {
                k: v for k, v in arguments.items() if k in names
            }
            try:
                cost = cost(**args)
            except Exception as err:
                raise ConfigError(f"cost_micros for {key!r} raised {err!r}", key=key) from err
        compensation = self.compensation
        if callable(compensation):
            try:
                compensation = compensation(**arguments)
            except Exception as err:
                raise ConfigError(f"compensation for {key!r} raised {type(err).__name__}",
                                  key=key) from err
        return cost, compensation

    def answer(self, d: BeginDecision) -> Any:
        """The value a non-executing decision stands for: a duplicate's stored result (rebuilt
        as ``result_type`` where one is known), or the refusal raised."""
        if d.decision is Decision.DUPLICATE:
            return self._rebuild(d.result)
        raise refusal(d)

    def _rebuild(self, stored: Any) -> Any:
        if self._as_stored or stored is None:
            return stored
        kind = self.result_type
        if isinstance(kind, type) and type(stored) is kind:
            return stored
        try:
            if self._adapter is None:
                from pydantic import TypeAdapter

                self._adapter = TypeAdapter(self.result_type)
            return self._adapter.validate_python(stored)
        except Exception:  # the stored JSON is still the truth; hand it back as is
            return stored

    def stored_form(self, result: Any) -> Any:
        """What is stored of ``result``: None unless ``store_result`` (and the policy's
        ``store_result``) allow it, else ``redact(result)`` with the policy's
        ``redact_result`` fields replaced. :class:`PayloadError` when that has no JSON form
        or ``redact`` raised."""
        if not self.store_result:
            return None
        value = result
        if self.redact is not None:
            try:
                value = self.redact(result)
            except Exception as err:
                raise PayloadError(f"redact raised {type(err).__name__}") from None
        if self.redact_result:
            value = redact_fields(value, self.redact_result)
        return value

    def _not_stored(self, d: BeginDecision, err: PayloadError) -> None:
        warnings.warn(
            f"{d.key!r} committed, but its result is not stored ({err.message}); a "
            "duplicate will return None. Pass redact= to store a JSON form.",
            ResultNotStoredWarning, stacklevel=5,
        )

    def _commit(self, d: BeginDecision, result: Any) -> None:
        """Report COMMITTED with the result as stored JSON (or none, then a warning, when it
        has no JSON form: the effect did happen). Recorded first, warned after: a warning
        raised as an error (``-W error``) must not lose the record."""
        try:
            self.gate.report(d, _COMMITTED, result=result if self._stores_as_is else (
                self.stored_form(result)))
        except PayloadError as err:  # raised before anything was written
            self.gate.report(d, Outcome.COMMITTED, result=None)
            self._not_stored(d, err)

    async def _acommit(self, d: BeginDecision, result: Any) -> None:
        """:meth:`_commit` for async bodies (natively async on Postgres)."""
        try:
            await self.gate.areport(d, Outcome.COMMITTED, result=self.stored_form(result))
        except PayloadError as err:  # raised before anything was written
            await self.gate.areport(d, Outcome.COMMITTED, result=None)
            self._not_stored(d, err)

    def _failure(self, exc: BaseException, d: BeginDecision) -> tuple[Outcome | str, str]:
        """The outcome to report for a body that raised ``exc`` (a FAILED a classifier
        inferred as :data:`~effectgate.reporting.INFERRED_FAILED`: it keeps the vendor key),
        and the error."""
        return failure_outcome(exc, self.classifiers, d.vendor_key is not None), describe(exc)

    @staticmethod
    def _unfinished(d: BeginDecision, value: Any) -> tuple[str, ConfigError]:
        """A body that handed back a coroutine, generator, async generator or other awaitable
        has not finished its work: the rest would run later, outside the gate. What it did
        before returning did happen, so it is recorded AMBIGUOUS, never FAILED (a retry must
        not do it again), and refused as a programming error. The error recorded and the
        one to raise."""
        close = getattr(value, "close", None)
        if callable(close) and not hasattr(value, "cancel"):  # a task may be running already
            with contextlib.suppress(Exception):
                close()
        error = (f"the body returned {type(value).__name__!r}, an unfinished piece of work: "
                 "what it does next would run outside the gate")
        return error, ConfigError(
            f"{d.key!r}: {error}; decorate the function that does all the work (an async def "
            "is gated as one) instead", key=d.key)

    def run(self, arguments: Mapping[str, Any], body: Callable[[], T]) -> T:
        """Gate one synchronous call."""
        gate = self.gate
        d = gate.begin(self.request(arguments))
        if d.decision is not Decision.EXECUTE:
            return self.answer(d)  # type: ignore[no-any-return]
        if d.budget_warning:
            try:
                warnings.warn(d.budget_warning, BudgetWarning, stacklevel=3)
            except BaseException:  # a warning raised as an error: the body never starts
                gate.report(d, Outcome.FAILED, error=_WARNED)
                raise
        token = _current.set(d)
        try:
            result = body() if gate._telemetry is None else gate._telemetry.body(d, body)
        except BaseException as exc:
            outcome, error = self._failure(exc, d)
            try:
                gate.report(d, outcome, error=error)
            except EffectGateError as report_err:
                exc.add_note(f"effectgate could not record {outcome}: {report_err}")
            raise
        finally:
            _current.reset(token)
        if type(result) not in _FINISHED and (
                isinstance(result, _UNFINISHED) or hasattr(type(result), "__await__")):
            error, refused = self._unfinished(d, result)
            gate.report(d, Outcome.AMBIGUOUS, error=error)
            raise refused
        self._commit(d, result)
        return result

    async def arun(self, arguments: Mapping[str, Any], body: Callable[[], Awaitable[T]]) -> T:
        """Gate one asynchronous call; the store is reached off the event loop. A call
        cancelled before its body started is recorded FAILED: it provably never ran."""
        import asyncio  # here: a program with no async tool never pays for importing it

        gate = self.gate
        req = await self.arequest(arguments)
        begun = asyncio.ensure_future(gate.abegin(req))
        try:
            d = await asyncio.shield(begun)
        except asyncio.CancelledError:
            await _settle_unstarted(gate, begun)
            raise
        if d.decision is not Decision.EXECUTE:
            return self.answer(d)  # type: ignore[no-any-return]
        if d.budget_warning:
            try:
                warnings.warn(d.budget_warning, BudgetWarning, stacklevel=3)
            except BaseException:
                await _surely(gate, gate.areport(d, Outcome.FAILED, error=_WARNED),
                              lambda: gate.report(d, Outcome.FAILED, error=_WARNED))
                raise
        token = _current.set(d)
        try:
            result = await (body() if gate._telemetry is None
                            else gate._telemetry.abody(d, body))
        except BaseException as exc:
            outcome, error = self._failure(exc, d)
            try:
                # A second cancellation (or the loop closing) must not lose the record.
                await _surely(gate, gate.areport(d, outcome, error=error),
                              lambda: gate.report(d, outcome, error=error))
            except EffectGateError as report_err:
                exc.add_note(f"effectgate could not record {outcome}: {report_err}")
            except asyncio.CancelledError:
                pass
            raise
        finally:
            _current.reset(token)
        if type(result) not in _FINISHED and (
                isinstance(result, _UNFINISHED) or hasattr(type(result), "__await__")):
            error, refused = self._unfinished(d, result)
            await _surely(gate, gate.areport(d, Outcome.AMBIGUOUS, error=error),
                          lambda: gate.report(d, Outcome.AMBIGUOUS, error=error))
            raise refused
        await _surely(gate, self._acommit(d, result), lambda: self._commit(d, result))
        return result


async def _settle_unstarted(gate: GateLike, begun: asyncio.Future[BeginDecision]) -> None:
    """The caller was cancelled while its ``begin`` was in flight. The begin cannot be taken
    back once sent: let it finish, and if it reserved the effect, record FAILED — the body
    never started. Cancelled again while waiting, it finishes in the background."""
    import asyncio

    try:
        d = await asyncio.shield(begun)
    except asyncio.CancelledError:
        begun.add_done_callback(functools.partial(_report_unstarted_later, gate))
        return
    except Exception:
        return
    if d.decision is Decision.EXECUTE:
        with contextlib.suppress(EffectGateError, asyncio.CancelledError):
            await _surely(gate, gate.store.on_worker(_give_back, gate, d),
                          lambda: _give_back(gate, d))


async def _surely(gate: GateLike, report: Awaitable[None], fallback: Callable[[], None],
                  ) -> None:
    """Await ``report`` (an outcome's write) in a task of its own: a cancelled caller leaves
    it to finish. If that task is cancelled itself (the loop closing, a handler cancelling
    every task) before the write is known to be done, ``fallback`` writes it the sync way on
    a thread of its own (a write that landed after all is then found done: a holder's report
    of what it already reported is answered quietly)."""
    import asyncio

    task = asyncio.ensure_future(report)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        fall_back = functools.partial(_fall_back_if_cancelled, gate, fallback)
        if task.done():
            fall_back(task)
        else:
            task.add_done_callback(fall_back)
        raise


def _fall_back_if_cancelled(gate: GateLike, fallback: Callable[[], None],
                            task: asyncio.Future[Any]) -> None:
    if task.cancelled():
        gate.store.in_background("effectgate-report", functools.partial(_quietly, fallback))


def _quietly(fallback: Callable[[], None]) -> None:
    try:
        fallback()
    except Exception as err:  # the lease lapses to AMBIGUOUS instead: safe, only slower
        log.warning("effectgate could not record an outcome after its loop closed: %s", err)


_background: set[asyncio.Future[Any]] = set()


def _report_unstarted_later(gate: GateLike, begun: asyncio.Future[BeginDecision]) -> None:
    if begun.cancelled() or begun.exception() is not None:
        return
    d = begun.result()
    if d.decision is Decision.EXECUTE:
        import asyncio

        task = asyncio.ensure_future(_report_quietly(gate, d))
        _background.add(task)
        task.add_done_callback(_background.discard)


async def _report_quietly(gate: GateLike, d: BeginDecision) -> None:
    with contextlib.suppress(EffectGateError):
        await _surely(gate, gate.store.on_worker(_give_back, gate, d),
                      lambda: _give_back(gate, d))


def _give_back(gate: GateLike, d: BeginDecision) -> None:
    """Settle the reservation ``d`` of a call whose body never started (its caller was
    cancelled first), as the store settles one whose caller was gone before the answer came
    (:func:`~effectgate.store.abandoned.release`): an approval it consumed is given back, the
    effect waiting on it again (a person is not asked twice for a yes nothing used); else it
    is recorded FAILED. Sync: run on a worker, or on a thread of its own."""
    from .request import LeaseSecret
    from .store.abandoned import release

    row = gate.store.fetch(gate.namespace, d.key)
    if row is None or not release(gate.store, LeaseSecret(d.lease_secret), row, _NOT_STARTED):
        gate.report(d, Outcome.FAILED, error=_NOT_STARTED)  # (found done if that landed)


def gate_function(gate: GateLike, fn: Callable[..., T], key: str, *,
                  effect_type: str | None = None, **options: Any) -> Callable[..., T]:
    """Wrap ``fn`` so each call passes through ``gate`` under the key template ``key``."""
    if not callable(fn):
        raise ConfigError(f"@gate.effect decorates a function, not {type(fn).__name__}")
    name = _name_of(fn)
    call = None if inspect.isfunction(fn) else getattr(type(fn), "__call__", None)  # noqa: B004
    if any(inspect.isgeneratorfunction(f) or inspect.isasyncgenfunction(f) for f in (fn, call)):
        raise ConfigError(
            f"{name}() is a generator: its work runs as it is iterated, after the call "
            "returns, outside the gate; decorate the function that does the work")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{name}: cannot read its signature ({err})") from None
    names = list(signature.parameters)
    skip = 1 if names and names[0] in ("self", "cls") and _in_class_body(fn) else 0
    result_type = options.pop("result_type", _return_type(fn, signature))
    spec = EffectSpec(gate, key, effect_type=effect_type or name.rsplit(".", 1)[-1],
                      result_type=result_type, **options)
    spec.check_names(names[skip:], f"{name}()")
    arguments = _binder(fn, signature, skip)

    if _is_async(fn):

        @functools.wraps(fn)
        async def gated_async(*args: Any, **kwargs: Any) -> Any:
            return await spec.arun(arguments(args, kwargs), lambda: fn(*args, **kwargs))

        gated_async.effect_spec = spec  # type: ignore[attr-defined]
        return gated_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def gated(*args: Any, **kwargs: Any) -> Any:
        return spec.run(arguments(args, kwargs), lambda: fn(*args, **kwargs))

    gated.effect_spec = spec  # type: ignore[attr-defined]
    return gated


def _name_of(fn: Any) -> str:
    """A callable's name for messages and default effect types (a callable object, a
    ``functools.partial``: its class's name)."""
    for candidate in (fn, getattr(fn, "func", None), type(fn)):
        name = getattr(candidate, "__qualname__", None)
        if isinstance(name, str) and name:
            return name
    return type(fn).__name__


def _in_class_body(fn: Any) -> bool:
    """Whether ``fn`` is a function defined in a class body (a method, before it is bound):
    its first parameter is then the instance or the class, not one of the call's arguments.
    A plain function whose first parameter happens to be called ``self`` or ``cls``, or a
    method already bound, is not."""
    if not inspect.isfunction(fn):
        return False
    owner, _, _ = fn.__qualname__.rpartition(".")
    return bool(owner) and not owner.endswith("<locals>")


def _is_async(fn: Any) -> TypeGuard[Callable[..., Awaitable[Any]]]:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own method
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


def _binder(fn: Callable[..., Any], signature: inspect.Signature,
            skip: int) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """A function from (args, kwargs) to the call's arguments by name, defaults applied.

    Plain signatures take a fast path; anything unusual (``*args``, positional-only, a wrong
    call) goes through ``inspect.Signature.bind`` for its exact semantics and messages."""
    params = list(signature.parameters.values())
    names = [p.name for p in params]
    simple = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    known = frozenset(names)
    first = names[0] if skip else None

    def slow(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise ConfigError(f"{_name_of(fn)}(): {err}") from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        if first is not None:
            del values[first]
        return values

    if not simple:
        return slow

    most, every = len(positional), len(names)
    # By how many arguments came positionally: the names they took (a keyword naming one of
    # them again is a wrong call, for the slow path's message).
    taken = [frozenset(positional[:count]) for count in range(most + 1)]

    def fast(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        count = len(args)
        if count > most:
            return slow(args, kwargs)
        values = defaults.copy()  # then what the call gave, over them
        for at, value in enumerate(args):  # (zip's strict= and dict.update cost more)
            values[positional[at]] = value
        if kwargs:
            if not known.issuperset(kwargs) or not taken[count].isdisjoint(kwargs):
                return slow(args, kwargs)
            values.update(kwargs)
        if len(values) < every:  # a required argument is missing
            return slow(args, kwargs)
        if first is not None:
            del values[first]
        return values

    return fast


def _return_type(fn: Callable[..., Any], signature: inspect.Signature) -> Any:
    """The return annotation, resolved when it is a string (``from __future__ import
    annotations``); None when it cannot be resolved (the stored JSON is returned as is)."""
    annotation = signature.return_annotation
    if not isinstance(annotation, str):
        return annotation
    try:
        import typing

        return typing.get_type_hints(fn).get("return")
    except Exception:
        return None
