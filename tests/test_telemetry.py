"""OpenTelemetry counters per decision and outcome (the ``otel`` extra)."""

from __future__ import annotations

from typing import Any

import pytest

import effectgate as eg

sdk = pytest.importorskip("opentelemetry.sdk.metrics", reason="needs opentelemetry-sdk")


def test_decisions_and_outcomes_are_counted(make_gate: Any) -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from effectgate.telemetry import Telemetry

    reader = InMemoryMetricReader()
    provider = sdk.MeterProvider(metric_readers=[reader])

    class Metrics:
        @staticmethod
        def get_meter(name: str) -> Any:
            return provider.get_meter(name)

    gate = make_gate()
    gate._telemetry = Telemetry(Metrics)
    d = gate.begin(effect_type="payment.refund", key="refund:1", payload={})
    gate.report(d, "committed")
    gate.begin(effect_type="payment.refund", key="refund:1", payload={})
    counts: dict[tuple[str, str], int] = {}
    for metric in reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics:
        for point in metric.data.data_points:
            label = point.attributes.get("decision") or point.attributes.get("outcome")
            counts[(metric.name, str(label))] = point.value
    assert counts == {
        ("effectgate.decisions", "execute"): 1,
        ("effectgate.decisions", "duplicate"): 1,
        ("effectgate.outcomes", "committed"): 1,
    }
    assert isinstance(eg.Gate, type)
