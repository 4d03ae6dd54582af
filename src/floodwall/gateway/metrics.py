"""``/metrics``: the gateway's figures and its resources', in the Prometheus text format.

Read at scrape time from the counters the proxy keeps anyway (nothing per request is added
for Prometheus). Besides the library's ``floodwall_*`` families for every resource (breaker
state, retries, bulkheads, …; see :mod:`floodwall.observe.prometheus`)::

    floodwall_gateway_requests_total{route, code}          counter (code: 1xx…5xx, aborted)
    floodwall_gateway_outcomes_total{route, outcome}       counter (rate_limited, overloaded,
                                                           circuit_open, timeout, fallback, …)
    floodwall_gateway_dependency_outcomes_total{route, outcome}  counter: what the upstream did
                                                           per request (success, error, timeout,
                                                           circuit_open, …)
    floodwall_gateway_answers_total{route, answer}         counter: what the client got (answer,
                                                           fallback, error)
    floodwall_gateway_request_duration_seconds{route}      histogram
    floodwall_gateway_in_flight{route}                     gauge
    floodwall_gateway_endpoint_requests_total{upstream, endpoint}  counter
    floodwall_gateway_endpoint_failures_total{upstream, endpoint}  counter (5xx, gateway errors)
    floodwall_gateway_endpoint_failure_reasons_total{upstream, endpoint, reason}  counter
                                                           (timeout, connect, reset, protocol, 5xx)
    floodwall_gateway_endpoint_consecutive_failures{upstream, endpoint}  gauge: the current run
    floodwall_gateway_endpoint_up{upstream, endpoint}      gauge: healthy and not ejected
    floodwall_gateway_endpoint_ejections_total{upstream}   counter
    floodwall_gateway_retries_elsewhere_total{upstream}    counter: tries sent to an untried
                                                           endpoint past the retry's time rule
    floodwall_gateway_config_reloads_total{result}         counter (applied, rejected)

With several worker processes the admin listener merges theirs, adding a ``worker`` label
(:func:`merge`): sum over it for the gateway's totals.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from floodwall._core.window import latency_bin_bounds
from floodwall.observe.prometheus import BUCKETS, FloodwallCollector

if TYPE_CHECKING:
    from floodwall.gateway.app import Gateway

__all__ = ["GatewayCollector", "merge", "render"]


def _bound(value: float) -> str:
    return repr(value) if value != int(value) else f"{value:.1f}"


def histogram_buckets(bins: dict[int, int]) -> tuple[list[tuple[str, float]], float]:
    """Fold log-linear bins into Prometheus buckets: ``(buckets, estimated sum)``."""
    ordered = sorted((latency_bin_bounds(i), n) for i, n in bins.items())
    out, seen, index, total = [], 0, 0, 0.0
    for (low, high), count in ordered:
        total += count * (low + high) / 2
    for bound in BUCKETS:
        while index < len(ordered) and ordered[index][0][1] <= bound * 1.0000001:
            seen += ordered[index][1]
            index += 1
        out.append((_bound(bound), float(seen)))
    out.append(("+Inf", float(sum(n for _, n in ordered))))
    return out, total


class GatewayCollector(Collector):
    """The gateway families above, read from one worker's live objects."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._routes()
        yield from self._endpoints()
        reloads = CounterMetricFamily(
            "floodwall_gateway_config_reloads", "Configuration reloads.", labels=["result"]
        )
        reloads.add_metric(["applied"], self.gateway.reloads_applied)
        reloads.add_metric(["rejected"], self.gateway.reloads_rejected)
        yield reloads

    def _routes(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "floodwall_gateway_requests", "Answers by status class.", labels=["route", "code"]
        )
        outcomes = CounterMetricFamily(
            "floodwall_gateway_outcomes",
            "Requests refused, degraded or failed, by why.",
            labels=["route", "outcome"],
        )
        dependency = CounterMetricFamily(
            "floodwall_gateway_dependency_outcomes",
            "Requests by what the upstream did (success, or why it did not answer).",
            labels=["route", "outcome"],
        )
        answers = CounterMetricFamily(
            "floodwall_gateway_answers",
            "Requests by what the client got: answer, fallback or error.",
            labels=["route", "answer"],
        )
        latency = HistogramMetricFamily(
            "floodwall_gateway_request_duration_seconds",
            "Time from the request head to the last byte of the answer.",
            labels=["route"],
        )
        in_flight = GaugeMetricFamily(
            "floodwall_gateway_in_flight", "Requests being served.", labels=["route"]
        )
        for route in self.gateway.routes():
            stats = route.stats
            for index, count in enumerate(stats.classes):
                requests.add_metric([route.name, f"{index}xx" if index else "aborted"], count)
            for outcome, count in stats.outcomes.items():
                outcomes.add_metric([route.name, outcome], count)
            for outcome, count in stats.dependency.items():
                dependency.add_metric([route.name, outcome], count)
            for answer, count in stats.answers.items():
                answers.add_metric([route.name, answer], count)
            bins = {i: n for i, n in enumerate(stats.bins) if n}
            buckets, total = histogram_buckets(bins)
            latency.add_metric([route.name], buckets, total)
            in_flight.add_metric([route.name], stats.in_flight)
        yield from (requests, outcomes, dependency, answers, latency, in_flight)

    def _endpoints(self) -> Iterator[Metric]:
        labels = ["upstream", "endpoint"]
        requests = CounterMetricFamily(
            "floodwall_gateway_endpoint_requests", "Requests sent to an endpoint.", labels=labels
        )
        failures = CounterMetricFamily(
            "floodwall_gateway_endpoint_failures",
            "5xx answers and gateway failures of an endpoint.",
            labels=labels,
        )
        reasons = CounterMetricFamily(
            "floodwall_gateway_endpoint_failure_reasons",
            "Failures of an endpoint by reason (timeout, connect, reset, protocol, 5xx).",
            labels=[*labels, "reason"],
        )
        streak = GaugeMetricFamily(
            "floodwall_gateway_endpoint_consecutive_failures",
            "Failures of an endpoint in a row since its last answer below 500.",
            labels=labels,
        )
        up = GaugeMetricFamily(
            "floodwall_gateway_endpoint_up",
            "1 when the endpoint is healthy and not ejected.",
            labels=labels,
        )
        ejections = CounterMetricFamily(
            "floodwall_gateway_endpoint_ejections",
            "Outlier ejections in an upstream.",
            labels=["upstream"],
        )
        elsewhere = CounterMetricFamily(
            "floodwall_gateway_retries_elsewhere",
            "Tries sent to an endpoint not tried yet after a gateway failure, with the time left.",
            labels=["upstream"],
        )
        for name, pool in self.gateway.pools().items():
            now = pool.clock.monotonic()
            available = set(pool.available(now))
            for endpoint in pool.endpoints:
                key = [name, endpoint.url]
                requests.add_metric(key, endpoint.requests)
                failures.add_metric(key, endpoint.failures)
                for reason, count in endpoint.reasons.items():
                    reasons.add_metric([*key, reason], count)
                streak.add_metric(key, endpoint.streak)
                up.add_metric(key, 1.0 if endpoint in available else 0.0)
            ejections.add_metric([name], pool.outliers.ejections if pool.outliers else 0)
            elsewhere.add_metric([name], pool.retries_elsewhere)
        yield from (requests, failures, reasons, streak, up, ejections, elsewhere)


def render(gateway: Gateway) -> str:
    """The worker's exposition: gateway families and the registry's resource families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(gateway))
    registry.register(FloodwallCollector(gateway.registry))
    return generate_latest(registry).decode()


def merge(texts: list[str], workers: list[int] | None = None) -> str:
    """Several workers' expositions as one, each sample labelled with its ``worker``
    (``workers[i]`` for ``texts[i]``; default: the position)."""
    if len(texts) == 1 and workers is None:
        return texts[0]
    families: dict[str, tuple[Any, list[str]]] = {}
    for worker, text in zip(workers or range(len(texts)), texts, strict=True):
        for family in text_string_to_metric_families(text):
            entry = families.setdefault(family.name, (family, []))
            for sample in family.samples:
                labels = {**sample.labels, "worker": str(worker)}
                body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                entry[1].append(f"{sample.name}{{{body}}} {_number(sample.value)}")
    lines: list[str] = []
    for name, (family, samples) in families.items():
        kind = family.type
        exposed = f"{name}_total" if kind == "counter" and not name.endswith("_total") else name
        lines.append(f"# HELP {exposed} {family.documentation}")
        lines.append(f"# TYPE {exposed} {kind}")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}.0"
    return repr(float(value))
