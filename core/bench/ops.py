"""Operators' plumbing: a ``begin`` on a gate with webhooks and OpenTelemetry on (a real SDK
tracer provider with a batching span processor, and a meter provider) beside a plain ``begin``
on the same store, in the same run. No webhook event fires on an executed effect, so this is
the cost a gate pays on every call for having them configured: the observer checks, the
spans, the counters."""

from __future__ import annotations

import socket
import time
from typing import Any

from ..gate import Gate
from .baseline import KeySource
from .measure import Ratio, Report, interleave
from .stores import Scratch

__all__ = ["TARGET", "bench_ops"]

TARGET = 1.1  # issue 13: a begin with webhooks and telemetry <= 1.1x one without


def _telemetry(report: Report) -> tuple[Any, Any]:
    """(Telemetry on SDK providers, a function that shuts them down), or (None, None)."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
    except ImportError:
        report.notes.append("ops: opentelemetry-sdk is not installed; telemetry not measured")
        return None, None
    from ..telemetry import Telemetry

    class Discard(SpanExporter):
        def export(self, spans: Any) -> Any:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Discard()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider), shutdown


def _dead_url() -> str:
    """A local port nobody listens on (nothing is posted in this measure anyway)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"


def _runner(gate: Gate, keys: KeySource, *, report: bool) -> Any:
    def run(count: int) -> float:
        batch = keys.take(count)
        start = time.perf_counter()
        for key in batch:
            d = gate.begin(effect_type="bench.effect", key=key, payload={"amount_cents": 500})
            if report:
                gate.report(d, "committed", result={"ok": True})
        return time.perf_counter() - start

    return run


def bench_ops(s: Scratch, report: Report, *, n: int, chunks: int) -> None:
    """Add the webhooks+telemetry-vs-plain ``begin`` ratios for the backend ``s``."""
    from ..webhooks import Webhooks

    telemetry, shutdown = _telemetry(report)
    if telemetry is None:
        return
    hooks = Webhooks(_dead_url(), "bench-secret-" + "x" * 16, flush_on_exit=0)
    url = s.url("ops")
    plain = Gate(url, namespace=s.namespace("ops-plain"), policy=False, telemetry=False)
    watched = Gate(url, namespace=s.namespace("ops-on"), policy=False, webhooks=hooks,
                   telemetry=telemetry)
    try:
        for with_report, title in ((False, "begin, webhooks + telemetry"),
                                   (True, "begin+report, webhooks + telemetry")):
            keys = KeySource("ops:")
            times = interleave({
                "plain": _runner(plain, keys, report=with_report),
                "on": _runner(watched, keys, report=with_report),
            }, total=n, chunks=chunks)
            report.ratios.append(Ratio(
                "ops", s.backend, title, times["on"], times["plain"],
                "plain begin+report" if with_report else "plain begin",
                None if with_report else TARGET, times.spread("on", "plain")))
    finally:
        plain.close()
        watched.close()
        hooks.close(0.1)
        shutdown()
