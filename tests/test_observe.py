"""Observability: Prometheus exposition parsed back, JSON logs, OpenTelemetry adapters."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

import floodwall as fw
from floodwall.config import Registry
from floodwall.observe import Meter
from floodwall.observe.logs import JsonLogListener
from floodwall.observe.otel import SpanEventListener, instrument
from floodwall.observe.prometheus import register
from servers import (
    HOST,
    RestartableRedis,
    free_port,
    log_tail,
    require_binary,
    terminate,
    wait_until,
)

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "examples" / "grafana-dashboard.json"
STATE_NAMES = ("closed", "open", "half_open", "forced_open", "forced_closed", "disabled")
"""The ``state`` label values of the breaker state series, spelled out as dashboards use them."""
SCRAPE_INTERVAL_MS = 500
"""Milliseconds between the test Prometheus' scrapes (the dashboard's ``rate()`` needs two)."""

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
    # reviews' dependency failed and its fallback answered: the outcome says what the dependency
    # did, the answer what the caller got (issue 19: a fallback answer is not a success)
    rev = (("resource", "reviews"),)
    assert got[("floodwall_calls_total", (("outcome", "error"), *rev))] == 1
    assert got[("floodwall_calls_total", (("outcome", "success"), *rev))] == 0
    assert got[("floodwall_answers_total", (("answer", "fallback"), *rev))] == 1
    assert got[("floodwall_answers_total", (("answer", "answer"), *pay))] == 3
    assert got[("floodwall_answers_total", (("answer", "error"), *pay))] == 3
    states = {
        labels[1][1]: value
        for (name, labels), value in got.items()
        if name == "floodwall_circuit_breaker_state" and labels[0] == pay[0]
    }
    assert states == {state: float(state == "open") for state in STATE_NAMES}
    assert got[("floodwall_circuit_breaker_rejected_total", pay)] == 1
    assert got[("floodwall_circuit_breaker_transitions_total", (*pay, ("state", "open")))] == 1
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
    instrument(registry, provider.get_meter("floodwall-test"), spans=False)
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
    states = {
        (p.attributes or {})["state"]: p.value
        for p in metrics["floodwall.circuit_breaker.state"].data.data_points
        if isinstance(p, NumberDataPoint) and (p.attributes or {})["resource"] == "payments"
    }
    assert states == {state: int(state == "open") for state in STATE_NAMES}
    assert "floodwall.retries" in metrics
    (span,) = exporter.get_finished_spans()
    names = [e.name for e in span.events]
    assert "floodwall.state_change" in names
    assert "floodwall.rejected" in names


PARITY_DOC = {
    "resources": {
        **DOC["resources"],
        "ranking": {"adaptive": {"algorithm": "aimd", "options": {"initial_limit": 5}}},
        "quota": {"rate_limit": {"rate": "5/s", "scope": "global"}},
    }
}
"""Every policy a Prometheus family reads, so every family has series."""


def otel_points(reader: InMemoryMetricReader) -> dict[str, dict[tuple[tuple[str, str], ...], Any]]:
    """``{instrument: {sorted attributes: data point}}`` from an in-memory reader."""
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, dict[tuple[tuple[str, str], ...], Any]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = out.setdefault(metric.name, {})
                for point in metric.data.data_points:
                    labels = tuple(sorted((k, str(v)) for k, v in (point.attributes or {}).items()))
                    points[labels] = point
    return out


def test_item5_opentelemetry_publishes_every_prometheus_family_with_the_same_figures(
    clock: fw.FakeClock,
) -> None:
    """Issue 19, item 5: one OpenTelemetry instrument per Prometheus family (the library's
    and the inbound guard's), the same label names, the same values, a UCUM unit each, and a
    duration histogram counting the same calls."""
    from floodwall.adaptive import AdaptiveLimiter, FixedLimit, LoadShedder
    from floodwall.integrations._inbound import Inbound, InboundGuard
    from floodwall.integrations._tasks import Delivery, TaskGuard
    from floodwall.observe.otel import PROMETHEUS_TWINS, instrument_guard, instrument_tasks
    from floodwall.observe.prometheus import register_guard, register_tasks

    registry = Registry(PARITY_DOC, clock=clock)
    guard = InboundGuard(shedder=LoadShedder(AdaptiveLimiter(FixedLimit(1), clock=clock)))
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("parity")
    instrument(registry, meter, spans=False)
    instrument_guard(guard, meter, name="web")
    tasks = TaskGuard(fw.CircuitBreaker("jobs", clock=clock), name="jobs", clock=clock)
    instrument_tasks(tasks, meter)
    tasks.run(Delivery("t", "m1"), lambda: None)
    tasks.policy.force_open()  # type: ignore[union-attr]
    tasks.run(Delivery("t", "m2"), lambda: None)  # deferred
    exercise(registry, clock)
    registry.get("ranking").call(clock.advance, 0.004)
    held = guard.admit(Inbound("GET", "/", {}, "10.0.0.1"))
    guard.admit(Inbound("GET", "/", {}, "10.0.0.1"))  # shed: the limit is 1
    prom = CollectorRegistry()
    register(registry, prom)
    register_guard(guard, prom, name="web")
    register_tasks(tasks, prom)
    families = {
        family.name: family
        for family in text_string_to_metric_families(generate_latest(prom).decode())
    }
    points = otel_points(reader)
    data = reader.get_metrics_data()
    assert data is not None
    units = {
        m.name: m.unit
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    published = {
        sample.name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
        for family in families.values()
        for sample in family.samples
    }
    published = {name for name in published if not name.endswith("_created")}
    assert published == set(PROMETHEUS_TWINS), published ^ set(PROMETHEUS_TWINS)
    assert set(points) == set(PROMETHEUS_TWINS.values())
    assert all(units[name] for name in points), units
    assert units["floodwall.call.duration"] == "s"
    for family in families.values():
        for sample in family.samples:
            name = sample.name
            if name.endswith(("_bucket", "_sum", "_created")):
                continue
            if name == "floodwall_call_duration_seconds_count":
                twin = points["floodwall.call.duration"]
                count = sum(
                    p.count for k, p in twin.items() if ("resource", sample.labels["resource"]) in k
                )
                assert count == sample.value, (name, sample.labels)
                continue
            labels = tuple(sorted(sample.labels.items()))
            point = points[PROMETHEUS_TWINS[name]].get(labels)
            assert point is not None, (name, labels)
            assert point.value == pytest.approx(sample.value), (name, labels)
    assert held is not None


def test_item5_a_span_per_protected_call_with_the_policies_decisions(clock: fw.FakeClock) -> None:
    """Issue 19, item 5: with a tracer provider, each call through a resource is a span that
    says what the dependency did and what the caller got, with the decisions as events."""
    registry = Registry(DOC, clock=clock)
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("spans")
    instrument(registry, meter, tracer_provider=tracer_provider)
    tracer = tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("request") as outer:
        exercise(registry, clock)
        clock.advance(1.0)  # search's rate limit has a token again
        registry.get("search").call(lambda: tracer.start_span("inner").end())
    spans = exporter.get_finished_spans()
    ours = [span for span in spans if span.name.startswith("floodwall ")]
    assert [span.name for span in ours[:5]] == ["floodwall payments"] * 5
    attrs = [dict(span.attributes or {}) for span in ours]
    assert [(a["floodwall.outcome"], a["floodwall.answer"]) for a in attrs[:6]] == [
        ("success", "answer"),
        ("success", "answer"),
        ("success", "answer"),
        ("error", "error"),
        ("error", "error"),
        ("circuit_open", "error"),
    ]
    assert attrs[3]["error.type"] == "error"
    assert ours[3].status.status_code.name == "ERROR"
    assert "floodwall.state_change" in [e.name for e in ours[4].events]  # the breaker opened
    assert "floodwall.rejected" in [e.name for e in ours[5].events]
    reviews = next(span for span in ours if span.name == "floodwall reviews")
    assert dict(reviews.attributes or {})["floodwall.answer"] == "fallback"
    assert reviews.status.status_code.name == "UNSET"  # the caller got an answer
    assert "floodwall.fallback" in [e.name for e in reviews.events]
    context = outer.get_span_context()
    assert all(span.parent is not None and span.parent.span_id == context.span_id for span in ours)
    # the call's own spans nest under floodwall's span; the span-less path stays free
    inner = next(span for span in spans if span.name == "inner")
    assert inner.parent is not None and inner.parent.span_id == ours[-1].context.span_id
    histogram = otel_points(reader)["floodwall.call.duration"]
    failed = histogram[(("error.type", "error"), ("resource", "payments"))]
    assert failed.count == 2
    assert sum(p.count for p in histogram.values()) == len(ours)


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` of every query of the example Grafana dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_grafana_dashboard_uses_only_published_metrics(clock: fw.FakeClock) -> None:
    """Every metric the example dashboard queries is one the collector publishes."""
    queried = {
        name for _, expr in dashboard_queries() for name in re.findall(r"floodwall_[a-z_]+", expr)
    }
    _, text = exposition(clock)
    published = {name for name, _ in samples(text)}
    assert queried <= published, queried - published


def test_example_configuration_is_valid() -> None:
    from floodwall.config import load

    doc = load(Path(__file__).parent.parent / "examples" / "floodwall.yaml")
    assert doc.resources["ip-location"].level == 3
    assert Registry(doc).get("posts-write").retry is not None


def exposition(clock: fw.FakeClock) -> tuple[CollectorRegistry, str]:
    """A Prometheus registry over the exercised ``DOC`` registry, and its text exposition."""
    registry = Registry(DOC, clock=clock)
    exercise(registry, clock)
    prom = CollectorRegistry()
    register(registry, prom)
    return prom, generate_latest(prom).decode()


def test_metric_names_pass_promtool_without_warnings(clock: fw.FakeClock) -> None:
    """``promtool check metrics`` (Prometheus' own linter for names, units, suffixes and help)
    prints nothing for a scrape with every metric family present."""
    _, text = exposition(clock)
    result = subprocess.run(
        [require_binary("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_documented_alert_rules_pass_promtool(tmp_path: Path) -> None:
    """The operating guide's alert rules load in Prometheus (``promtool check rules``)."""
    page = (ROOT / "docs" / "operating.md").read_text(encoding="utf-8")
    (rules,) = re.findall(r"```yaml\n(groups:.*?)```", page, flags=re.DOTALL)
    assert "floodwall_circuit_breaker_state" in rules
    path = tmp_path / "rules.yml"
    path.write_text(rules)
    result = subprocess.run(
        [require_binary("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


class PrometheusServer:
    """A throwaway ``prometheus`` scraping one loopback target every ``SCRAPE_INTERVAL_MS``."""

    def __init__(self, target: str, workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / "prometheus.log"
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: {SCRAPE_INTERVAL_MS}ms, evaluation_interval: 1s}}\n"
            "scrape_configs:\n"
            f"  - {{job_name: floodwall, static_configs: [{{targets: ['{target}']}}]}}\n"
        )
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    require_binary("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address={HOST}:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str, **params: str) -> Any:
        """The ``data`` of a JSON API answer (an error status fails the test)."""
        url = f"http://{HOST}:{self.port}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", (path, params, answer)
        return answer["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now."""
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=promql)["result"]
        return result

    def settled(self) -> bool:
        """Exited, or scraped its target three times (enough for a ``rate()``)."""
        return self.proc.poll() is not None or self.scraped(3)

    def scraped(self, times: int) -> bool:
        try:
            counts = self.query("count_over_time(up[1m])")
        except OSError:
            return False
        return bool(counts) and float(counts[0]["value"][1]) >= times


@pytest.fixture
def prometheus(clock: fw.FakeClock, tmp_path: Path) -> Iterator[PrometheusServer]:
    """A real Prometheus that has scraped the exercised ``DOC`` registry at least three times."""
    prom, _ = exposition(clock)
    target_port = free_port()
    exporter, thread = start_http_server(target_port, addr=HOST, registry=prom)
    server = PrometheusServer(f"{HOST}:{target_port}", tmp_path)
    try:
        if not wait_until(server.settled, 30, interval=0.1) or server.proc.poll() is not None:
            log = log_tail(server.log)
            pytest.fail(f"prometheus exited or did not scrape 3 times in 30 s:\n{log}")
        yield server
    finally:
        terminate([server.proc])
        exporter.shutdown()
        exporter.server_close()
        thread.join(timeout=5)


@pytest.mark.integration
def test_grafana_dashboard_evaluates_against_a_real_scrape(prometheus: PrometheusServer) -> None:
    """Every query of the dashboard, as Grafana sends it with "All" resources selected, runs on
    a real Prometheus and returns series; the breaker panel folds the per-state series back
    into one row per resource that reads "open" (1) for the tripped breaker."""
    label = "/api/v1/label/resource/values"
    choices = prometheus.get(label, **{"match[]": "floodwall_calls_total"})
    assert set(choices) == {"payments", "reviews", "search"}  # the dashboard's $resource
    for title, expr in dashboard_queries():
        result = prometheus.query(expr.replace("$resource", ".*"))
        assert result, f"{title}: {expr} returned no series"
    (breaker,) = [expr for title, expr in dashboard_queries() if title == "Circuit breaker state"]
    states = {
        series["metric"]["resource"]: float(series["value"][1])
        for series in prometheus.query(breaker.replace("$resource", ".*"))
    }
    assert states == {"payments": 1.0}


@pytest.mark.integration
def test_a_store_outage_shows_on_the_scrape_and_in_opentelemetry(
    restartable_redis: RestartableRedis, clock: fw.FakeClock
) -> None:
    """A resource whose rate limit lives on Redis (killed here) and whose bulkhead lives on
    ``host://`` (its objects removed under it) kept answering from its local share, and
    neither Prometheus nor OpenTelemetry showed anything of it: the scrape (a Django
    ``/metrics`` view, a FastAPI app) read as if all was well. Now ``floodwall_store_up`` is 0
    and ``floodwall_store_degraded_total`` counts the calls on_store_error answered."""
    import uuid

    from floodwall.stores.host import remove

    host = f"obs-{uuid.uuid4().hex[:12]}"
    document = {
        "stores": {"default": "memory://", "shared": restartable_redis.url, "h": f"host://{host}"},
        "resources": {
            "partner": {"rate_limit": {"rate": "100/s", "scope": "global", "store": "shared"}},
            "db": {"bulkhead": {"max_concurrent": 4, "scope": "host", "store": "h"}},
        },
    }
    registry = Registry(document, clock=clock)
    reader = InMemoryMetricReader()
    instrument(registry, MeterProvider(metric_readers=[reader]).get_meter("t"), spans=False)
    prom = CollectorRegistry()
    register(registry, prom)

    def figures() -> dict[tuple[str, str, str], float]:
        scraped = samples(generate_latest(prom).decode())
        out: dict[tuple[str, str, str], float] = {}
        for (name, labels), value in scraped.items():
            if name in ("floodwall_store_up", "floodwall_store_degraded_total"):
                tags = dict(labels)
                out[(name, tags["resource"], tags["policy"])] = value
        points = otel_points(reader)
        for (name, resource, policy), value in out.items():
            twin = {"floodwall_store_up": "floodwall.store.up"}.get(
                name, "floodwall.store.degraded"
            )
            point = points[twin][(("policy", policy), ("resource", resource))]
            assert point.value == value, (name, resource, policy)
        return out

    def call_both(times: int) -> None:
        for _ in range(times):
            assert registry.get("partner").call(lambda: "ok") == "ok"
            assert registry.get("db").call(lambda: "ok") == "ok"

    try:
        call_both(1)
        assert figures() == {
            ("floodwall_store_up", "partner", "rate_limit"): 1.0,
            ("floodwall_store_up", "db", "bulkhead"): 1.0,
            ("floodwall_store_degraded_total", "partner", "rate_limit"): 0.0,
            ("floodwall_store_degraded_total", "db", "bulkhead"): 0.0,
        }
        restartable_redis.stop()
        remove(host, force=True)
        call_both(3)
        down = figures()
        assert down[("floodwall_store_up", "partner", "rate_limit")] == 0.0
        assert down[("floodwall_store_up", "db", "bulkhead")] == 0.0
        assert down[("floodwall_store_degraded_total", "partner", "rate_limit")] == 3.0
        assert down[("floodwall_store_degraded_total", "db", "bulkhead")] == 3.0
        restartable_redis.start()
        clock.advance(30.0)  # past every store breaker's open time
        call_both(1)
        up = figures()
        assert up[("floodwall_store_up", "partner", "rate_limit")] == 1.0
        assert up[("floodwall_store_up", "db", "bulkhead")] == 1.0
    finally:
        registry.close()
        remove(host, force=True)
