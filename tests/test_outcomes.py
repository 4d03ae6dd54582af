"""Issue 19, item 1: outcomes that tell what happened.

Every call is counted by what the dependency did (``floodwall_calls_total{outcome}``) and by
what the caller got (``floodwall_answers_total{answer}``), so an outage answered by fallbacks
reads as an outage: 100 % dependency errors and 100 % degraded answers, not 100 % success.
"""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

import floodwall as fw
from conftest import GatewayThread
from floodwall.config import Registry
from floodwall.observe import Meter
from floodwall.observe.otel import instrument
from floodwall.observe.prometheus import register
from servers import HOST, free_port, log_tail, terminate, wait_until
from test_observe import PrometheusServer, dashboard_queries

OUTAGE_SECONDS = 5.0
CALL_INTERVAL = 0.01
"""Seconds between calls to each downstream during the outage test (bounded traffic)."""


def fail() -> None:
    raise ConnectionError("down")


def test_item1_a_fallback_answer_counts_the_dependency_error(clock: fw.FakeClock) -> None:
    registry = Registry({"resources": {"reviews": {"fallback": {"value": []}}}}, clock=clock)
    reviews = registry.get("reviews")
    assert reviews.call(fail) == []
    assert reviews.call(lambda: [1]) == [1]
    meter = reviews.meter
    assert meter is not None
    counts, _, _ = meter.read()
    assert counts == {"error": 1, "success": 1}
    assert meter.answers() == {"answer": 1, "fallback": 1, "error": 0}
    assert meter.read_both() == {("error", "fallback"): 1, ("success", "answer"): 1}


def test_item1_rejection_answered_by_fallback_counts_the_rejection_kind(
    clock: fw.FakeClock,
) -> None:
    doc = {
        "resources": {
            "pay": {
                "circuit_breaker": {"minimum_calls": 2, "failure_rate": 0.5},
                "fallback": {"value": "later"},
            }
        }
    }
    registry = Registry(doc, clock=clock)
    pay = registry.get("pay")
    for _ in range(5):
        assert pay.call(fail) == "later"
    meter = pay.meter
    assert meter is not None
    both = meter.read_both()
    assert both[("error", "fallback")] == 2
    assert both[("circuit_open", "fallback")] == 3
    assert meter.answers() == {"answer": 0, "fallback": 5, "error": 0}


def test_item1_error_without_fallback_is_an_error_answer(clock: fw.FakeClock) -> None:
    registry = Registry({"resources": {"plain": {}}}, clock=clock)
    plain = registry.get("plain")
    with pytest.raises(ConnectionError):
        plain.call(fail)
    assert plain.meter is not None
    assert plain.meter.answers() == {"answer": 0, "fallback": 0, "error": 1}


def test_item1_async_fallback_is_counted_as_degraded(clock: fw.FakeClock) -> None:
    registry = Registry({"resources": {"reviews": {"fallback": {"value": []}}}}, clock=clock)
    reviews = registry.get("reviews")

    async def down() -> None:
        raise ConnectionError("down")

    assert asyncio.run(reviews.call_async(down)) == []
    assert reviews.meter is not None
    assert reviews.meter.read_both() == {("error", "fallback"): 1, ("success", "answer"): 0}


def test_item1_a_nested_resource_degradation_is_counted_once(clock: fw.FakeClock) -> None:
    """The inner resource's fallback answered; the outer resource's dependency (the code that
    called the inner one) answered normally."""
    doc = {"resources": {"outer": {}, "inner": {"fallback": {"value": 0}}}}
    registry = Registry(doc, clock=clock)
    outer, inner = registry.get("outer"), registry.get("inner")

    def count() -> int:
        raise ConnectionError("down")

    def through_inner() -> int:
        return inner.call(count) + 1

    assert outer.call(through_inner) == 1
    assert inner.meter is not None and outer.meter is not None
    assert inner.meter.answers()["fallback"] == 1
    assert outer.meter.answers() == {"answer": 1, "fallback": 0, "error": 0}


def test_item1_a_degradation_before_the_call_is_not_this_calls(clock: fw.FakeClock) -> None:
    fallback = fw.Fallback(value=0)
    assert fallback.call(fail) == 0  # no meter around it: the marker stays in the context
    registry = Registry({"resources": {"next": {}}}, clock=clock)
    nxt = registry.get("next")
    assert nxt.call(int) == 0
    assert nxt.meter is not None
    assert nxt.meter.answers() == {"answer": 1, "fallback": 0, "error": 0}


def test_item1_meter_counts_stay_consistent() -> None:
    meter = Meter()
    meter.success(0.01)
    assert meter.failure(fw.TimeoutExceeded("t", 1.0), 1.0) == "timeout"
    counts, bins, _ = meter.read()
    assert counts == {"timeout": 1, "success": 1}
    assert sum(c for _, c in bins) == 2
    assert sum(meter.answers().values()) == sum(counts.values())


# -- the outage: two real downstream HTTP servers on loopback, both down for 5 s ----------------


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class Downstream:
    """A tiny HTTP server on a loopback port that can be stopped (connection refused) and
    started again on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server = http.server.ThreadingHTTPServer((HOST, self.port), _Ok)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=5)
            self._server = None

    def get(self) -> bytes:
        with urllib.request.urlopen(f"http://{HOST}:{self.port}/", timeout=0.5) as answer:
            body: bytes = answer.read()
            return body


@pytest.fixture
def downstreams() -> Iterator[tuple[Downstream, Downstream]]:
    pair = Downstream(), Downstream()
    for each in pair:
        each.start()
    try:
        yield pair
    finally:
        for each in pair:
            each.stop()


def prometheus_figures(prom: CollectorRegistry) -> dict[tuple[str, str, str], float]:
    """``(family sample, resource, outcome or answer) -> value`` from a real exposition."""
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(generate_latest(prom).decode()):
        for sample in family.samples:
            if sample.name in ("floodwall_calls_total", "floodwall_answers_total"):
                kind = sample.labels.get("outcome") or sample.labels["answer"]
                out[(sample.name, sample.labels["resource"], kind)] = sample.value
    return out


def otel_figures(reader: InMemoryMetricReader) -> dict[tuple[str, str, str], float]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[tuple[str, str, str], float] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name not in ("floodwall.calls", "floodwall.answers"):
                    continue
                for point in metric.data.data_points:
                    assert isinstance(point, NumberDataPoint)
                    attrs = dict(point.attributes or {})
                    kind = str(attrs.get("outcome") or attrs["answer"])
                    out[(metric.name, str(attrs["resource"]), kind)] = float(point.value)
    return out


def shares(
    before: dict[tuple[str, str, str], float],
    after: dict[tuple[str, str, str], float],
    calls: str,
    answers: str,
    resource: str,
) -> tuple[float, float, float]:
    """``(calls in the window, dependency error share, degraded answer share)``."""

    def delta(name: str, predicate: Any) -> float:
        return sum(
            value - before.get(key, 0.0)
            for key, value in after.items()
            if key[0] == name and key[1] == resource and predicate(key[2])
        )

    total = delta(calls, lambda _: True)
    errors = delta(calls, lambda outcome: outcome != "success")
    degraded = delta(answers, lambda answer: answer == "fallback")
    assert delta(answers, lambda _: True) == total  # both views count every call once
    return total, errors / total, degraded / total


PANEL_RANGE = "[3s]"
"""The dashboard's ``[1m]`` ranges shortened, so a rate taken at the outage's end covers only
samples scraped during the outage (the test cannot wait a minute)."""


def panel(title: str) -> str:
    (expr,) = [expr for each, expr in dashboard_queries() if each == title]
    return expr.replace("$resource", ".*").replace("[1m]", PANEL_RANGE)


RESOURCES = {
    name: {
        "circuit_breaker": {"minimum_calls": 5, "failure_rate": 0.5, "open_duration": "1s"},
        "timeout": "1s",
        "fallback": {"value": b"{}"},
    }
    for name in ("inventory", "analytics")
}


def gateway_config(resources: dict[str, Downstream]) -> dict[str, Any]:
    """A gateway in front of the downstreams: one route and one upstream per downstream, each
    protected by a resource like the library's (its fallback answers ``{}``)."""
    fallback = {name: {**config, "fallback": {"value": {}}} for name, config in RESOURCES.items()}
    return {
        "upstreams": {
            name: {"endpoints": [f"http://{HOST}:{downstream.port}"], "outlier_detection": False}
            for name, downstream in resources.items()
        },
        "resources": fallback,
        "routes": [
            {"name": name, "match": {"path_prefix": f"/{name}"}, "upstream": name, "resource": name}
            for name in resources
        ],
    }


Figures = dict[tuple[str, str, str], float]


def gateway_figures(status: dict[str, Any]) -> Figures:
    """``(where, name, kind) -> count`` from the gateway's ``/status``: each route's and each
    upstream's requests by what the upstream did and by what the client got."""
    out: Figures = {}
    for where, entries in (("route", status["routes"]), ("upstream", status["upstreams"])):
        for name, entry in entries.items():
            counts = entry["stats"] if where == "route" else entry
            for part in ("dependency", "answers"):
                for kind, count in counts[part].items():
                    out[(f"{where}.{part}", name, kind)] = float(count)
    return out


def gateway_scrape(text: str) -> Figures:
    out: Figures = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (
                "floodwall_gateway_dependency_outcomes_total",
                "floodwall_gateway_answers_total",
            ):
                kind = sample.labels.get("outcome") or sample.labels["answer"]
                out[(sample.name, sample.labels["route"], kind)] = sample.value
    return out


@pytest.mark.integration
def test_item1_outage_shows_dependency_errors_and_degraded_answers_everywhere(
    downstreams: tuple[Downstream, Downstream],
    tmp_path: Path,
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> None:
    """Issue 19, items 1 and 3: both downstreams down for ``OUTAGE_SECONDS``, every call and
    every gateway request answered by a fallback; the library's scrape, the OTel reader, the
    dashboard's panels on a real Prometheus, and the gateway's ``/status`` (each route and each
    upstream) and ``/metrics`` all show >= 99 % dependency errors and degraded answers."""
    inventory, analytics = downstreams
    registry = Registry({"resources": RESOURCES})
    prom = CollectorRegistry()
    register(registry, prom)
    reader = InMemoryMetricReader()
    instrument(registry, MeterProvider(metric_readers=[reader]).get_meter("outage"))
    resources = {"inventory": inventory, "analytics": analytics}
    gateway = gateways(gateway_config(resources))
    target = free_port()
    exporter, thread = start_http_server(target, addr=HOST, registry=prom)
    server = PrometheusServer(f"{HOST}:{target}", tmp_path)
    try:
        if not wait_until(server.settled, 30, interval=0.1) or server.proc.poll() is not None:
            pytest.fail(
                f"prometheus exited or did not scrape 3 times in 30 s:\n{log_tail(server.log)}"
            )
        outage(registry, prom, reader, resources=resources, server=server, gateway=gateway)
    finally:
        terminate([server.proc])
        exporter.shutdown()
        exporter.server_close()
        thread.join(timeout=5)


def outage(
    registry: Registry,
    prom: CollectorRegistry,
    reader: InMemoryMetricReader,
    *,
    resources: dict[str, Downstream],
    server: PrometheusServer,
    gateway: GatewayThread,
) -> None:
    """Both downstreams down for ``OUTAGE_SECONDS``, every call answered by its fallback: the
    scrape, the OTel reader, the dashboard's panels on a real Prometheus and the gateway's
    ``/status`` and ``/metrics`` all say so."""
    inventory, analytics = resources["inventory"], resources["analytics"]
    client = httpx.Client(base_url=gateway.url, timeout=5)

    for _ in range(20):  # healthy: every answer from the dependency
        for name, downstream in resources.items():
            assert registry.get(name).call(downstream.get) == b'{"ok": true}'
            answer = client.get(f"/{name}")
            assert (answer.status_code, answer.json()) == (200, {"ok": True})
    healthy = prometheus_figures(prom)
    assert healthy[("floodwall_calls_total", "inventory", "success")] == 20
    assert healthy[("floodwall_answers_total", "inventory", "answer")] == 20
    status = gateway_figures(gateway.admin("GET", "/status").json())
    assert status[("route.dependency", "inventory", "success")] == 20
    assert status[("upstream.answers", "analytics", "answer")] == 20

    inventory.stop()
    analytics.stop()
    prom_before, otel_before = prometheus_figures(prom), otel_figures(reader)
    gw_before = gateway_figures(gateway.admin("GET", "/status").json())
    scrape_before = gateway_scrape(gateway.admin("GET", "/metrics").text)
    end = time.monotonic() + OUTAGE_SECONDS
    while time.monotonic() < end:
        for name, downstream in resources.items():
            assert registry.get(name).call(downstream.get) == b"{}"
            answer = client.get(f"/{name}")
            assert (answer.status_code, answer.json()) == (200, {}), answer.text
            assert answer.headers["x-degraded"].startswith(f"{name}.fallback")
        time.sleep(CALL_INTERVAL)
    prom_after, otel_after = prometheus_figures(prom), otel_figures(reader)
    gw_after = gateway_figures(gateway.admin("GET", "/status").json())
    scrape_after = gateway_scrape(gateway.admin("GET", "/metrics").text)
    client.close()
    print(f"outage figures over {OUTAGE_SECONDS:g} s (calls, dependency error share, degraded):")

    for name in resources:
        views = {
            "prometheus": (
                prom_before,
                prom_after,
                "floodwall_calls_total",
                "floodwall_answers_total",
            ),
            "otel": (otel_before, otel_after, "floodwall.calls", "floodwall.answers"),
            "gateway /status route": (gw_before, gw_after, "route.dependency", "route.answers"),
            "gateway /status upstream": (
                gw_before,
                gw_after,
                "upstream.dependency",
                "upstream.answers",
            ),
            "gateway /metrics": (
                scrape_before,
                scrape_after,
                "floodwall_gateway_dependency_outcomes_total",
                "floodwall_gateway_answers_total",
            ),
        }
        for view, (before, after, calls_name, answers_name) in views.items():
            calls, error_share, degraded_share = shares(
                before, after, calls_name, answers_name, name
            )
            print(f"  {name:9} {view:25} {calls:5.0f}  {error_share:.4f}  {degraded_share:.4f}")
            assert calls >= 50, f"{name}, {view}: only {calls} calls in the outage"
            assert error_share >= 0.99, f"{name}, {view}: dependency error share {error_share}"
            assert degraded_share >= 0.99, f"{name}, {view}: degraded share {degraded_share}"
    for title in ("Dependency error and rejection share", "Degraded answer share"):
        figures = {
            series["metric"]["resource"]: float(series["value"][1])
            for series in server.query(panel(title))
        }
        print(f"  Grafana panel {title!r}: {figures}")
        assert set(figures) == set(resources), (title, figures)
        assert all(value >= 0.99 for value in figures.values()), (title, figures)


def test_item1_a_shed_resource_still_counts_its_calls() -> None:
    """An operator's shed is an outage the metrics must show: shed calls pass the meter too,
    refused (no fallback) or answered by the fallback."""
    clock = fw.FakeClock()
    document = {
        "resources": {
            "bare": {"level": 3},
            "covered": {"level": 3, "fallback": {"value": "cached"}},
        }
    }
    registry = Registry(document, clock=clock)
    registry.shed(3)
    bare, covered = registry.get("bare"), registry.get("covered")
    for _ in range(4):
        with pytest.raises(fw.DegradedError):
            bare.call(lambda: "live")
        assert covered.call(lambda: "live") == "cached"
    assert bare.meter is not None and covered.meter is not None
    bare_counts, _, _ = bare.meter.read()
    covered_counts, _, _ = covered.meter.read()
    assert sum(bare_counts.values()) == 4 and bare_counts.get("success", 0) == 0
    assert sum(covered_counts.values()) == 4 and covered_counts.get("success", 0) == 0
