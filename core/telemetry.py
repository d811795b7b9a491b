"""OpenTelemetry counters, when the ``otel`` extra is installed: one count per ``begin``
decision (``effectgate.decisions``, attributes ``decision`` and ``effect_type``) and per
reported outcome (``effectgate.outcomes``). Without the extra this module does nothing and
costs one attribute check per call. Spans are left to the caller's own instrumentation: a
span per gated call would cost more than the gate itself on the embedded store.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Telemetry", "telemetry"]


class Telemetry:
    """Counters on the global meter provider (a no-op until the application configures one)."""

    def __init__(self, metrics: Any) -> None:
        meter = metrics.get_meter("effectgate")
        self._decisions = meter.create_counter(
            "effectgate.decisions", description="begin decisions, by decision and effect type")
        self._outcomes = meter.create_counter(
            "effectgate.outcomes", description="reported outcomes, by outcome")

    def decision(self, decision: str, effect_type: str) -> None:
        """Count one ``begin`` decision."""
        self._decisions.add(1, {"decision": decision, "effect_type": effect_type})

    def outcome(self, outcome: str) -> None:
        """Count one reported outcome."""
        self._outcomes.add(1, {"outcome": outcome})


def telemetry() -> Telemetry | None:
    """The counters, or None when OpenTelemetry is not installed."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    return Telemetry(metrics)
