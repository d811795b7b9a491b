"""OpenTelemetry (the ``otel`` extra), read back with the SDK's in-memory exporters: spans
begin / body / report with key, type, decision and attempt (never payload or result), counters
per decision and outcome, and the gauges an operator alerts on, on both backends."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

import effectgate as eg

sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics", reason="needs opentelemetry-sdk")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="needs opentelemetry-sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from effectgate.telemetry import SPANS, Telemetry, telemetry  # noqa: E402

CARD = "4242424242424242"
SECRET_RESULT = "re_SECRET_RESULT_77"


class Otel:
    """A tracer and a meter provider of the test's own, read in memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = sdk_trace.TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = sdk_metrics.MeterProvider(metric_readers=[self.reader])
        self.telemetry = Telemetry(tracer_provider=self.tracer_provider,
                                   meter_provider=self.meter_provider)

    def finished(self) -> list[Any]:
        return list(self.spans.get_finished_spans())

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).extend(
                        (dict(p.attributes), p.value) for p in metric.data.data_points)
        return out


@pytest.fixture
def otel() -> Otel:
    return Otel()


def _attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def _no_payload_or_result(spans: list[Any]) -> None:
    for span in spans:
        text = json.dumps({k: str(v) for k, v in _attrs(span).items()})
        text += json.dumps([str(dict(e.attributes or {})) for e in span.events])
        assert CARD not in text and SECRET_RESULT not in text, (span.name, text)
        assert "payload" not in text and "result" not in text


def test_decorated_call_makes_begin_body_and_report_spans(make_gate: Any, otel: Otel) -> None:
    gate = make_gate(telemetry=otel.telemetry)
    inside: list[str] = []

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str, card: str) -> dict[str, Any]:
        inside.append(trace.get_current_span().name)  # type: ignore[attr-defined]
        return {"refund_id": SECRET_RESULT}

    assert refund("t1", CARD) == {"refund_id": SECRET_RESULT}
    assert refund("t1", CARD) == {"refund_id": SECRET_RESULT}  # a duplicate
    spans = otel.finished()
    assert [s.name for s in spans] == ["effectgate.begin", "effectgate.body",
                                       "effectgate.report", "effectgate.begin"]
    assert inside == ["effectgate.body"]  # the body's span is current while it runs
    begin, body, report, duplicate = (_attrs(s) for s in spans)
    assert begin["effectgate.key"] == "refund:t1"
    assert begin["effectgate.effect_type"] == "payment.refund"
    assert (begin["effectgate.decision"], begin["effectgate.attempt"]) == ("execute", 1)
    assert body["effectgate.decision"] == "execute" and body["effectgate.key"] == "refund:t1"
    assert report["effectgate.outcome"] == "committed"
    assert duplicate["effectgate.decision"] == "duplicate"
    assert set(SPANS) == {s.name for s in spans}
    _no_payload_or_result(spans)


async def test_async_paths_make_the_same_spans(make_gate: Any, otel: Otel) -> None:
    gate = make_gate(telemetry=otel.telemetry)

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    async def refund(txn_id: str, card: str) -> dict[str, Any]:
        return {"refund_id": SECRET_RESULT}

    await refund("a1", CARD)
    d = await gate.abegin(effect_type="payment.refund", key="refund:a2", payload={"card": CARD})
    await gate.areport(d, "failed", error=f"declined {CARD}")
    names = [s.name for s in otel.finished()]
    assert names == ["effectgate.begin", "effectgate.body", "effectgate.report",
                     "effectgate.begin", "effectgate.report"]
    assert _attrs(otel.finished()[-1])["effectgate.outcome"] == "failed"
    _no_payload_or_result(otel.finished())


def test_a_failing_body_marks_its_span_by_the_error_type_only(make_gate: Any,
                                                              otel: Otel) -> None:
    gate = make_gate(telemetry=otel.telemetry)

    @gate.effect("refund:{txn_id}", effect_type="payment.refund")
    def refund(txn_id: str) -> None:
        raise TimeoutError(f"https://api.example.com/?card={CARD}")

    with pytest.raises(TimeoutError):
        refund("t2")
    body = next(s for s in otel.finished() if s.name == "effectgate.body")
    assert body.status.status_code is trace.StatusCode.ERROR
    assert _attrs(body)["error.type"] == "TimeoutError"
    report = otel.finished()[-1]
    assert _attrs(report)["effectgate.outcome"] == "ambiguous"
    _no_payload_or_result(otel.finished())


def test_decisions_and_outcomes_are_counted(make_gate: Any, otel: Otel) -> None:
    gate = make_gate(telemetry=otel.telemetry)
    d = gate.begin(effect_type="payment.refund", key="refund:1", payload={})
    gate.report(d, "committed")
    gate.begin(effect_type="payment.refund", key="refund:1", payload={})
    metrics = otel.metrics()
    decisions = {a["decision"]: v for a, v in metrics["effectgate.decisions"]}
    outcomes = {a["outcome"]: v for a, v in metrics["effectgate.outcomes"]}
    assert decisions == {"execute": 1, "duplicate": 1} and outcomes == {"committed": 1}


def test_gauges_read_ambiguous_approvals_and_spend_from_the_store(make_gate: Any,
                                                                   otel: Otel) -> None:
    policy = {"effects": {
        "payment.*": {"budget": {"per_run_micros": 50_000_000}},
        "wire.*": {"approval": "always"},
    }}
    gate = make_gate(policy=policy, telemetry=otel.telemetry, lease_seconds=0.2)
    before = otel.metrics()
    assert [v for a, v in before["effectgate.ambiguous"]
            if a["namespace"] == gate.namespace] == [0]
    d = gate.begin(effect_type="payment.refund", key="refund:g1", payload={},
                   run_id="r1", estimated_cost_micros=7_000_000)
    gate.report(d, "ambiguous", error="lost reply")  # holds its spend
    gate.begin(effect_type="payment.refund", key="refund:g2", payload={}, run_id="r2",
               estimated_cost_micros=3_000_000)  # will lapse
    gate.begin(effect_type="wire.send", key="wire:g3", payload={})
    time.sleep(0.7)  # the lease lapses; and the gauges' per-collection cache expires
    mine = {name: [(a, v) for a, v in points if a.get("namespace") == gate.namespace]
            for name, points in otel.metrics().items()}
    assert [v for _, v in mine["effectgate.ambiguous"]] == [2]
    (age,) = [v for _, v in mine["effectgate.ambiguous.oldest_age"]]
    assert 0.3 < age < 60
    assert [v for _, v in mine["effectgate.approvals.pending"]] == [1]
    spend = {(a["ceiling"], a["scope"]): v for a, v in mine["effectgate.spend"]}
    assert spend == {("payment.*", "run"): 7_000_000}  # the largest run counter
    limits = {(a["ceiling"], a["scope"]): v for a, v in mine["effectgate.spend.limit"]}
    assert limits == {("payment.*", "run"): 50_000_000}
    gate.close()
    after = otel.metrics()
    assert not [a for a, _ in after.get("effectgate.ambiguous", [])
                if a["namespace"] == gate.namespace]  # a closed gate drops out


def test_telemetry_without_opentelemetry_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where OpenTelemetry's API cannot be imported, a Telemetry made by hand says so (as
    it did when it imported the API at once), and a gate's default is none."""
    import effectgate.telemetry as module

    monkeypatch.setattr(module, "_installed", lambda: False)
    monkeypatch.setattr(module, "_imported", lambda: False)
    monkeypatch.setattr(module, "_default", [])
    with pytest.raises(ImportError, match="opentelemetry-api"):
        Telemetry()
    assert telemetry() is None


def test_telemetry_false_and_no_provider_cost_nothing(make_gate: Any) -> None:
    assert make_gate(telemetry=False)._telemetry is None
    with pytest.raises(eg.ConfigError):
        make_gate(telemetry="yes")
    shared = telemetry()
    assert shared is not None and telemetry() is shared  # one per process, on the globals
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        assert Telemetry().tracer() is None  # no provider configured: no spans made


@pytest.mark.parametrize("imported", ["before the gate", "after its first begin"])
def test_the_global_providers_are_picked_up_once_configured(tmp_path: Any,
                                                            imported: str) -> None:
    """A gate made before the application configures OpenTelemetry makes no spans; once the
    global providers are set, its begins are traced, counted and its gauges read (a fresh
    process: the global providers can be set only once). A gate whose application has not
    imported OpenTelemetry yet imports none of it, and picks it up all the same."""
    import subprocess
    import sys
    import textwrap

    otel = textwrap.indent(textwrap.dedent("""
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    """), "        ")
    early = imported == "before the gate"
    code = textwrap.dedent(f"""
        import json, sys, time
        import effectgate as eg
        {otel.strip() if early else ""}
        gate = eg.Gate("sqlite:///{tmp_path / 'g.db'}", policy=False)
        gate.begin(effect_type="t", key="before", payload={{}})
        loaded = any(m.startswith("opentelemetry.") for m in sys.modules)
        {"" if early else otel.strip()}
        spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        time.sleep(1.1)  # the gate looks for a provider at most once a second
        d = gate.begin(effect_type="t", key="after", payload={{}})
        gate.report(d, "ambiguous")
        names = [s.name for s in spans.get_finished_spans()]
        points = {{m.name: [p.value for p in m.data.data_points]
                  for r in reader.get_metrics_data().resource_metrics
                  for s in r.scope_metrics for m in s.metrics}}
        print(json.dumps([names, points.get("effectgate.ambiguous"),
                          points.get("effectgate.decisions"), loaded]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    names, ambiguous, decisions, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded is early  # no OpenTelemetry imported by the gate itself
    assert names == ["effectgate.begin", "effectgate.report"]
    assert ambiguous == [1]
    assert decisions == [1]  # counted from the provider's setting on (the first went nowhere)
