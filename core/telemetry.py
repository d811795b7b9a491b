"""OpenTelemetry, when the ``otel`` extra is installed: spans, counters and gauges.

* Spans ``effectgate.begin``, ``effectgate.body`` (the gated function, through the decorator
  and every adapter) and ``effectgate.report``, with the attributes ``effectgate.key``,
  ``effectgate.effect_type``, ``effectgate.namespace``, ``effectgate.decision``,
  ``effectgate.attempt`` (and ``effectgate.outcome`` on a report) — never a payload, a result,
  an error text or a lease secret. The body's span is current while the body runs, so the
  spans of an instrumented HTTP client nest under it.
* Counters ``effectgate.decisions`` (by ``decision`` and ``effect_type``) and
  ``effectgate.outcomes`` (by ``outcome``).
* Observable gauges, read from the store only when a metrics reader collects (one aggregate
  statement and one bounded read per watched gate, namespace as attribute):
  ``effectgate.ambiguous`` (AMBIGUOUS effects, a lapsed lease included),
  ``effectgate.ambiguous.oldest_age`` (seconds), ``effectgate.approvals.pending``,
  ``effectgate.spend`` (micro-units, attributes ``ceiling`` — the policy's pattern — and
  ``scope``: the largest counter of that ceiling touched in the last day) and
  ``effectgate.spend.limit``.

What it costs: without OpenTelemetry installed, nothing (the gate holds None). Installed but
not imported by the application, nothing is imported either (no provider can have been set):
the instruments are made once some code has imported OpenTelemetry, at the gate's next call
(from then on the gauges report). Imported but with no tracer provider configured, a
``begin`` costs one clock read (the global provider is looked up at most once a second,
until one is set). ``Gate(telemetry=eg.telemetry.Telemetry(
tracer_provider=..., meter_provider=...))`` uses providers of your own;
``Gate(telemetry=False)`` turns it all off.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .gatelike import GateLike
    from .records import BeginDecision
    from .request import Lease, Request

__all__ = ["SPANS", "Telemetry", "telemetry"]

log = logging.getLogger("effectgate")
T = TypeVar("T")
SPANS = ("effectgate.begin", "effectgate.body", "effectgate.report")
_LOOK_EVERY = 1.0  # seconds between looks for a global tracer provider, until one is set
_MODULES, _TRACE, _METRICS = sys.modules, "opentelemetry.trace", "opentelemetry.metrics"
_default: list[Telemetry] = []
_default_lock = threading.Lock()
_instances: weakref.WeakSet[Telemetry] = weakref.WeakSet()


class Telemetry:
    """Spans, counters and gauges on the given OpenTelemetry providers (default: the global
    ones, picked up once the application configures them). Requires ``opentelemetry-api``.

    One instance may serve many gates; each gate it watches (every gate made with it) adds
    its namespace to the gauges.
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self._tracer: Any = None
        self._next_look = 0.0
        self._counting = False
        self._gates: weakref.WeakSet[GateLike] = weakref.WeakSet()
        self._reading: dict[int, Any] = {}
        self._reading_at = 0.0
        self._lock = threading.Lock()
        self._set_up_lock = threading.Lock()
        _instances.add(self)
        self._metrics_state: Any = _NotImported(self)
        if tracer_provider is not None or meter_provider is not None or _imported():
            self._set_up(tracer_provider, meter_provider)
        elif not _installed():
            raise ImportError("effectgate's telemetry needs opentelemetry-api "
                              '(pip install ".[otel]" in the effectgate clone)')

    def _set_up(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        """Make the instruments (once OpenTelemetry is imported: providers given, or some
        code imported it, which any code setting a global provider has done)."""
        with self._set_up_lock:
            if not isinstance(self._metrics_state, _NotImported):
                return
            self._make_instruments(tracer_provider, meter_provider)

    def _make_instruments(self, tracer_provider: Any, meter_provider: Any) -> None:
        from opentelemetry import metrics, trace

        self._trace = trace
        if tracer_provider is not None:
            self._tracer = tracer_provider.get_tracer("effectgate")
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("effectgate")
        self._decisions = meter.create_counter(
            "effectgate.decisions", description="begin decisions, by decision and effect type")
        self._outcomes = meter.create_counter(
            "effectgate.outcomes", description="reported outcomes, by outcome")
        gauge = meter.create_observable_gauge
        gauge("effectgate.ambiguous", [self._ambiguous], unit="{effect}",
              description="AMBIGUOUS effects (a lapsed lease included), by namespace")
        gauge("effectgate.ambiguous.oldest_age", [self._oldest], unit="s",
              description="age of the oldest AMBIGUOUS effect, by namespace")
        gauge("effectgate.approvals.pending", [self._pending], unit="{approval}",
              description="approval requests waiting for a person, by namespace")
        gauge("effectgate.spend", [self._spend], unit="{micro-unit}",
              description="spend of the largest counter of each ceiling touched in the last day")
        gauge("effectgate.spend.limit", [self._limits], unit="{micro-unit}",
              description="each spend ceiling's limit")
        # Counting into the global provider's stand-in (before the application sets one)
        # records nothing: skip it until one is set (an exact check, no clock).
        state = _global_meter_state()
        self._counting = meter_provider is not None or state is None
        self._metrics_state = state

    # -- counters ------------------------------------------------------------------------------

    def decision(self, decision: str, effect_type: str) -> None:
        """Count one ``begin`` decision."""
        if self._counting or (_METRICS in _MODULES  # (else no provider: nothing to ask)
                              and self._metrics_state._METER_PROVIDER is not None):
            self._counting = True  # for good: a provider, once set, stays
            self._decisions.add(1, {"decision": decision, "effect_type": effect_type})

    def outcome(self, outcome: str) -> None:
        """Count one reported outcome."""
        if self._counting or (_METRICS in _MODULES
                              and self._metrics_state._METER_PROVIDER is not None):
            self._counting = True
            self._outcomes.add(1, {"outcome": outcome})

    # -- spans ---------------------------------------------------------------------------------

    def tracer(self) -> Any:
        """The tracer, or None while no tracer provider is configured (looked for at most once
        a second)."""
        found = self._tracer
        if found is not None:
            return found
        if _TRACE not in _MODULES and _METRICS not in _MODULES:  # (:func:`_imported`, inline)
            return None  # no provider can have been set: no clock to read
        now = time.monotonic()
        if now < self._next_look:
            return None
        self._next_look = now + _LOOK_EVERY
        if isinstance(self._metrics_state, _NotImported):
            if not _imported():
                return None
            self._set_up()
        provider = self._trace.get_tracer_provider()
        if isinstance(provider, (self._trace.ProxyTracerProvider,
                                 self._trace.NoOpTracerProvider)):
            return None
        self._tracer = provider.get_tracer("effectgate")
        return self._tracer

    def begin(self, tracer: Any, run: Callable[[Request], BeginDecision],
              req: Request) -> BeginDecision:
        """``run(req)`` inside an ``effectgate.begin`` span (a child of the caller's current
        span; not made current itself: it has no children, and that halves its cost)."""
        span = tracer.start_span("effectgate.begin", attributes=_of_request(req))
        try:
            d = run(req)
            span.set_attributes({"effectgate.decision": d.decision.value,
                                 "effectgate.attempt": d.attempt})
            return d
        except BaseException as exc:
            self._failed(span, exc)
            raise
        finally:
            span.end()

    async def abegin(self, tracer: Any, run: Callable[[Request], Awaitable[BeginDecision]],
                     req: Request) -> BeginDecision:
        """``await run(req)`` inside an ``effectgate.begin`` span."""
        span = tracer.start_span("effectgate.begin", attributes=_of_request(req))
        try:
            d = await run(req)
            span.set_attributes({"effectgate.decision": d.decision.value,
                                 "effectgate.attempt": d.attempt})
            return d
        except BaseException as exc:
            self._failed(span, exc)
            raise
        finally:
            span.end()

    def body(self, d: BeginDecision, body: Callable[[], T]) -> T:
        """Run the gated body, inside an ``effectgate.body`` span when tracing."""
        tracer = self.tracer()
        if tracer is None:
            return body()
        with self._span(tracer, "effectgate.body", _of_decision(d)):
            return body()

    async def abody(self, d: BeginDecision, body: Callable[[], Awaitable[T]]) -> T:
        """Await the gated body, inside an ``effectgate.body`` span when tracing."""
        tracer = self.tracer()
        if tracer is None:
            return await body()
        with self._span(tracer, "effectgate.body", _of_decision(d)):
            return await body()

    @contextmanager
    def report_span(self, tracer: Any, held: BeginDecision | Lease,
                    outcome: Any) -> Iterator[None]:
        """An ``effectgate.report`` span around a report of ``outcome`` (not made current)."""
        # bounded: a bare lease and the outcome come from the caller, unchecked as yet
        attributes: dict[str, Any] = {
            "effectgate.key": str(getattr(held, "key", ""))[:512],
            "effectgate.outcome": str(getattr(outcome, "value", outcome))[:32]}
        if hasattr(held, "effect_type"):
            attributes.update(_of_decision(held))  # type: ignore[arg-type]
        span = tracer.start_span("effectgate.report", attributes=attributes)
        try:
            yield
        except BaseException as exc:
            self._failed(span, exc)
            raise
        finally:
            span.end()

    @contextmanager
    def _span(self, tracer: Any, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
        """A current span (the body's: an instrumented client's spans nest under it)."""
        with tracer.start_as_current_span(name, attributes=attributes, record_exception=False,
                                          set_status_on_exception=False) as span:
            try:
                yield span
            except BaseException as exc:
                self._failed(span, exc)
                raise

    def _failed(self, span: Any, exc: BaseException) -> None:
        """Mark ``span`` failed by the exception's type only: an error's text may carry what a
        span must not (a URL's token, a card number)."""
        kind = type(exc).__qualname__
        span.set_attribute("error.type", kind)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, kind))

    # -- gauges --------------------------------------------------------------------------------

    def watch(self, gate: GateLike) -> None:
        """Add ``gate``'s namespace to the gauges (held weakly: a gate that is gone drops
        out)."""
        with self._lock:
            self._gates.add(gate)

    def forget(self, gate: GateLike) -> None:
        """Drop ``gate`` from the gauges (it was closed)."""
        with self._lock:
            self._gates.discard(gate)
            self._reading_at = 0.0

    def _read(self) -> dict[int, Any]:
        """Every watched gate's figures, read once per collection (the five gauge callbacks
        of one collection share them)."""
        now = time.monotonic()
        with self._lock:
            if now - self._reading_at < 0.5:
                return self._reading
            gates = list(self._gates)
        from .store.gauges import read_gauges, read_spend

        out: dict[int, Any] = {}
        seen: set[tuple[str, str]] = set()
        for gate in gates:
            where = (gate.url, gate.namespace)
            if where in seen:
                continue
            seen.add(where)
            try:
                out[id(gate)] = (gate, read_gauges(gate.store, gate.namespace),
                                 read_spend(gate.store, gate.namespace))
            except Exception as err:  # a store that is down reports nothing this time
                log.debug("telemetry: cannot read %s: %s", gate.namespace,
                          type(err).__name__)
        with self._lock:
            self._reading, self._reading_at = out, now
        return out

    def _observe(self, pick: Callable[[Any, Any], Any]) -> Iterator[Any]:
        from opentelemetry.metrics import Observation

        for gate, gauges, _ in self._read().values():
            yield Observation(pick(gauges, gate), {"namespace": gate.namespace})

    def _ambiguous(self, options: Any) -> Iterator[Any]:
        return self._observe(lambda g, _: g.ambiguous)

    def _oldest(self, options: Any) -> Iterator[Any]:
        return self._observe(lambda g, _: g.oldest_ambiguous_age)

    def _pending(self, options: Any) -> Iterator[Any]:
        return self._observe(lambda g, _: g.pending_approvals)

    def _spend(self, options: Any) -> Iterator[Any]:
        from opentelemetry.metrics import Observation

        for gate, _, counters in self._read().values():
            largest: dict[tuple[str, str], tuple[str, int]] = {}
            for scope_key, spent in counters:
                pattern, _, rest = scope_key.partition("|")
                scope, _, subject = rest.partition("|")
                held = largest.get((pattern, scope))
                # a day ceiling: today's counter (the latest date); others: the largest
                if held is None or (subject > held[0] if scope == "day" else spent > held[1]):
                    largest[(pattern, scope)] = (subject, spent)
            for (pattern, scope), (_, spent) in largest.items():
                yield Observation(spent, {"namespace": gate.namespace, "ceiling": pattern,
                                          "scope": scope})

    def _limits(self, options: Any) -> Iterator[Any]:
        from opentelemetry.metrics import Observation

        for gate, _, _ in self._read().values():
            for pattern, scope, limit in _ceilings(gate.policy):
                yield Observation(limit, {"namespace": gate.namespace, "ceiling": pattern,
                                          "scope": scope})


def _of_request(req: Request) -> dict[str, Any]:
    return {"effectgate.key": req.key, "effectgate.effect_type": req.effect_type,
            "effectgate.namespace": req.namespace}


def _of_decision(d: BeginDecision) -> dict[str, Any]:
    return {"effectgate.key": d.key, "effectgate.effect_type": d.effect_type,
            "effectgate.namespace": d.namespace, "effectgate.decision": d.decision.value,
            "effectgate.attempt": d.attempt}


def _installed() -> bool:
    """Whether OpenTelemetry's API can be imported (found, not imported: importing it waits
    for the application)."""
    from importlib.util import find_spec

    try:
        return find_spec("opentelemetry.trace") is not None and (
            find_spec("opentelemetry.metrics") is not None)
    except (ImportError, ValueError):
        return False


def _imported() -> bool:
    """Whether some code has imported OpenTelemetry's API (no provider is set before)."""
    return _TRACE in _MODULES or _METRICS in _MODULES


class _NotImported:
    """Stands in for OpenTelemetry's metrics state until OpenTelemetry is imported: its
    provider reads as none, and once OpenTelemetry is there, the instruments are made and
    the real state is asked (an exact check: no decision after a provider is set is
    missed)."""

    __slots__ = ("_telemetry",)

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry

    @property
    def _METER_PROVIDER(self) -> Any:  # the name OpenTelemetry's module uses
        if "opentelemetry.metrics" not in sys.modules:  # set_meter_provider lives there
            return None
        self._telemetry._set_up()
        state = self._telemetry._metrics_state
        return True if state is None else state._METER_PROVIDER


def _global_meter_state() -> Any:
    """OpenTelemetry's module that holds the global meter provider once one is set (None when
    this version keeps it elsewhere: then every decision is counted)."""
    try:
        from opentelemetry.metrics import _internal
    except ImportError:  # pragma: no cover - another layout: count always
        return None
    return _internal if hasattr(_internal, "_METER_PROVIDER") else None


def _ceilings(policy: Any) -> list[tuple[str, str, int]]:
    """(pattern, scope, limit) of every ceiling a policy sets."""
    if policy is None:
        return []
    out: list[tuple[str, str, int]] = []
    for rule in policy.effects.values():
        if rule.budget is not None:
            out += [(rule.effect_type, s, limit) for s, limit in rule.budget.ceilings()]
    if policy.budget is not None:
        out += [("*", s, limit) for s, limit in policy.budget.ceilings()]
    return out


def telemetry(option: Telemetry | bool | None = None) -> Telemetry | None:
    """What a gate uses for ``telemetry=option``: the one given, None for ``False`` or when
    OpenTelemetry is not installed, else one process-wide instance on the global providers."""
    if isinstance(option, Telemetry):
        return option
    if option is False:
        return None
    if option is not None and option is not True:
        from .errors import ConfigError

        raise ConfigError("telemetry must be an effectgate.telemetry.Telemetry, True, False or "
                          "None")
    if _default:
        return _default[0]
    if not _imported() and not _installed():
        return None
    with _default_lock:
        if not _default:
            _default.append(Telemetry())
    return _default[0]


def _after_fork_in_child() -> None:
    """A lock the parent's metrics thread held at the fork would never be released here."""
    global _default_lock
    _default_lock = threading.Lock()
    for instance in list(_instances):
        instance._lock = threading.Lock()
        instance._set_up_lock = threading.Lock()
        instance._reading_at = 0.0


os.register_at_fork(after_in_child=_after_fork_in_child)
