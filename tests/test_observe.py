"""Observability: Prometheus exposition parsed back, JSON logs, OpenTelemetry adapters."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import floodwall as fw
from floodwall.config import Registry
from floodwall.observe import Meter
from floodwall.observe.logs import JsonLogListener
from floodwall.observe.otel import SpanEventListener, instrument
from floodwall.observe.prometheus import register

DOC = {
    "resources": {
        "payments": {
            "circuit_breaker": {"minimum_calls": 2, "failure_rate": 0.4},
            "retry": {"attempts": 1},
            "timeout": "1s",
        },
        "reviews": {"level": 3, "fallback": {"value": []}},
        "search": {"bulkhead": {"max_concurrent": 2}, "rate_limit": {"rate": "2/s", "burst": 0}},
    }
}


def fail() -> None:
    raise ConnectionError("down")


def exercise(registry: Registry, clock: fw.FakeClock) -> None:
    pay = registry.get("payments")
    for duration in (0.003, 0.02, 0.2):
        pay.call(clock.advance, duration)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            pay.call(fail)
    with pytest.raises(fw.CircuitOpenError):
        pay.call(int)
    registry.get("reviews").call(fail)
    search = registry.get("search")
    search.call(int)
    with pytest.raises(fw.RateLimitedError):
        search.call(int)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_prometheus_exposition_parses_back(clock: fw.FakeClock) -> None:
    registry = Registry(DOC, clock=clock)
    exercise(registry, clock)
    prom = CollectorRegistry()
    register(registry, prom)
    got = samples(generate_latest(prom).decode())
    pay = (("resource", "payments"),)
    assert got[("floodwall_calls_total", (("outcome", "success"), *pay))] == 3
    assert got[("floodwall_calls_total", (("outcome", "error"), *pay))] == 2
    assert got[("floodwall_calls_total", (("outcome", "circuit_open"), *pay))] == 1
    assert got[("floodwall_calls_total", (("outcome", "success"), ("resource", "reviews")))] == 1
    assert got[("floodwall_circuit_state", pay)] == 1.0
    assert got[("floodwall_circuit_rejected_total", pay)] == 1
    assert got[("floodwall_circuit_transitions_total", (*pay, ("state", "open")))] == 1
    assert got[("floodwall_fallbacks_total", (("resource", "reviews"),))] == 1
    assert got[("floodwall_retry_calls_total", pay)] == 5
    assert got[("floodwall_level_shed", (("level", "3"),))] == 0
    search = (("resource", "search"),)
    assert got[("floodwall_bulkhead_in_flight", search)] == 0
    assert got[("floodwall_bulkhead_rejected_total", search)] == 0
    assert got[("floodwall_rate_limit_decisions_total", (("decision", "admitted"), *search))] == 1
    assert got[("floodwall_rate_limit_decisions_total", (("decision", "rejected"), *search))] == 1
    histogram = "floodwall_call_duration_seconds"
    assert got[(f"{histogram}_bucket", (("le", "0.005"), *pay))] >= 1  # the 3 ms call
    assert got[(f"{histogram}_bucket", (("le", "0.025"), *pay))] >= 2
    assert got[(f"{histogram}_bucket", (("le", "+Inf"), *pay))] == 6
    assert got[(f"{histogram}_count", pay)] == 6
    assert got[(f"{histogram}_sum", pay)] == pytest.approx(0.223, rel=0.15)


def test_meter_counts_without_locks_on_success() -> None:
    meter = Meter()
    for _ in range(10):
        meter.success(0.01)
    assert meter.failure(fw.TimeoutExceeded("t", 1.0), 1.0) == "timeout"
    assert meter.failure(ValueError(), 0.5) == "error"
    assert meter.failure(KeyboardInterrupt(), 0.0) == "cancelled"
    counts, bins, total = meter.read()
    assert counts == {"success": 10, "timeout": 1, "error": 1}
    assert sum(c for _, c in bins) == 12
    assert total == pytest.approx(1.6, rel=0.15)


def test_json_logs_one_line_per_event(
    clock: fw.FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry(DOC, clock=clock, listeners=[JsonLogListener()])
    with caplog.at_level(logging.INFO, logger="floodwall"):
        exercise(registry, clock)
        for _ in range(5):  # a flood of rejections is sampled: one line per second
            with pytest.raises(fw.CircuitOpenError):
                registry.get("payments").call(int)
        clock.advance(1.0)
        with pytest.raises(fw.CircuitOpenError):
            registry.get("payments").call(int)
    lines = [json.loads(r.getMessage()) for r in caplog.records]
    change = next(line for line in lines if line["event"] == "state_change")
    assert (change["from"], change["to"]) == ("CLOSED", "OPEN")
    assert change["reason"] == "failure rate 0.40 >= 0.40 over 5 calls in 10s"
    rejected = [
        line
        for line in lines
        if line["event"] == "rejected" and line.get("figures", {}).get("outcome") == "circuit_open"
    ]
    assert len(rejected) == 2
    assert rejected[1]["figures"] == {"outcome": "circuit_open", "suppressed_since_last": 5}
    assert all(r.levelname == "WARNING" for r in caplog.records if "rejected" in r.getMessage())


def test_opentelemetry_metrics_and_span_events(clock: fw.FakeClock) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    registry = Registry(DOC, clock=clock)
    instrument(registry, provider.get_meter("floodwall-test"))
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry.add_listener(SpanEventListener())
    with tracer_provider.get_tracer("t").start_as_current_span("request"):
        exercise(registry, clock)
    data = reader.get_metrics_data()
    assert data is not None
    metrics = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    points = {
        tuple(sorted((p.attributes or {}).items())): p.value
        for p in metrics["floodwall.calls"].data.data_points
        if isinstance(p, NumberDataPoint)
    }
    assert points[(("outcome", "success"), ("resource", "payments"))] == 3
    (span,) = exporter.get_finished_spans()
    names = [e.name for e in span.events]
    assert "floodwall.state_change" in names
    assert "floodwall.rejected" in names


def test_grafana_dashboard_uses_only_published_metrics(clock: fw.FakeClock) -> None:
    """Every metric the example dashboard queries is one the collector publishes."""
    import re
    from pathlib import Path

    path = Path(__file__).parent.parent / "examples" / "grafana-dashboard.json"
    dashboard = json.loads(path.read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"floodwall_[a-z_]+", target["expr"])
    }
    registry = Registry(DOC, clock=clock)
    exercise(registry, clock)
    prom = CollectorRegistry()
    register(registry, prom)
    published = {name for name, _ in samples(generate_latest(prom).decode())}
    assert queried <= published, queried - published


def test_example_configuration_is_valid() -> None:
    from pathlib import Path

    from floodwall.config import load

    doc = load(Path(__file__).parent.parent / "examples" / "floodwall.yaml")
    assert doc.resources["ip-location"].level == 3
    assert Registry(doc).get("posts-write").retry is not None
