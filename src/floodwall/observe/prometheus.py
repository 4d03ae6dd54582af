"""Prometheus metrics for a :class:`~floodwall.config.Registry`, read at scrape time.

Nothing is recorded per call on behalf of Prometheus: the collector reads the policies' own
counters and each resource's :class:`~floodwall.observe.Meter` when Prometheus scrapes, so the
request path pays nothing extra for it. Names follow the Prometheus naming practice (base
units, ``_total`` on counters, ``_ratio`` on a 0..1 share, an enum as one series per value);
labels are bounded (``resource``, ``outcome``, ``answer``, ``state``, ``decision``,
``level``). A call answered by a fallback counts under the dependency's outcome (``error``,
``circuit_open``, …) in ``floodwall_calls_total`` and as ``answer="fallback"`` in
``floodwall_answers_total``, so an outage hidden by fallbacks still shows as one::

    floodwall_calls_total{resource, outcome}            counter: what the dependency did
    floodwall_answers_total{resource, answer}           counter: what the caller got
    floodwall_call_duration_seconds{resource}           histogram
    floodwall_circuit_breaker_state{resource, state}    gauge: 1 for the breaker's state, 0 for
                                                        the others (one series per state)
    floodwall_circuit_breaker_transitions_total{resource, state}  counter (the state entered)
    floodwall_circuit_breaker_rejected_total{resource}  counter
    floodwall_circuit_breaker_failure_ratio{resource}   gauge 0..1 (rolling window)
    floodwall_retry_calls_total{resource}               counter
    floodwall_retries_total{resource}                   counter (attempts beyond the first)
    floodwall_retry_budget_exhausted_total{resource}    counter
    floodwall_timeouts_total{resource}                  counter
    floodwall_fallbacks_total{resource}                 counter
    floodwall_bulkhead_in_flight{resource}              gauge
    floodwall_bulkhead_queued{resource}                 gauge
    floodwall_bulkhead_rejected_total{resource}         counter
    floodwall_rate_limit_decisions_total{resource, decision}  counter (admitted, rejected,
                                                        store_unavailable)
    floodwall_adaptive_limit{resource}                  gauge
    floodwall_adaptive_inflight{resource}               gauge
    floodwall_level_shed{level}                         gauge 0/1
    floodwall_store_up{resource, policy}                gauge: 1 while the policy's store
                                                        answers, 0 while on_store_error does
    floodwall_store_degraded_total{resource, policy}    counter: calls on_store_error answered

and, for an inbound guard published with :func:`register_guard`::

    floodwall_inbound_decisions_total{guard, outcome, reason}  counter (outcome: admitted,
                                                        refused, app_rejected; reason: the kind)
    floodwall_inbound_shedder_limit{guard}              gauge: the shedder's concurrency limit
    floodwall_inbound_shedder_in_flight{guard}          gauge: requests holding a ticket

and, for a task guard (Celery, Dramatiq, arq) published with :func:`register_tasks`::

    floodwall_task_deliveries_total{guard, outcome}     counter (outcome: executions, replays,
                                                        deferred, retried, failed)

The histogram's buckets are the standard Prometheus latency buckets; the meter's finer bins are
folded into them, so a bucket boundary is exact to within one bin (±12 %).

Usage::

    from floodwall.observe.prometheus import register
    register(registry)                 # on prometheus_client's default registry
    prometheus_client.start_http_server(9100)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from floodwall._core import validate
from floodwall._core.extras import missing_extra
from floodwall._core.meter import LATENCY_BUCKETS
from floodwall.breaker import CircuitState
from floodwall.observe._read import (
    InboundGuard,
    TaskGuard,
    rate_limit_decisions,
    shedder_figures,
    store_figures,
    task_deliveries,
)

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.observe.prometheus", "prometheus") from _missing

if TYPE_CHECKING:  # only annotations name it: importing this module needs no pydantic
    from floodwall.config.registry import Registry

__all__ = [
    "BUCKETS",
    "STATES",
    "FloodwallCollector",
    "InboundCollector",
    "register",
    "register_guard",
]

BUCKETS = LATENCY_BUCKETS
"""Upper bounds of the published latency buckets, in seconds (plus +Inf)."""

STATES = tuple(CircuitState)
"""Every breaker state, each published as a ``state`` label value (its lower-case name) on
``floodwall_circuit_breaker_state``, so a panel or alert selects ``state="open"`` instead of
comparing numbers; every series exists from the first scrape, so none appears out of nowhere."""


class FloodwallCollector(Collector):
    """A ``prometheus_client`` collector over every resource of a registry."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def describe(self) -> list[Metric]:
        return []  # collected lazily; no fixed description needed

    def collect(self) -> Iterator[Metric]:
        resources = list(self.registry)
        yield from self._calls(resources)
        yield from self._breakers(resources)
        yield from self._retries(resources)
        yield from self._isolation(resources)
        yield from self._others(resources)
        yield from self._stores(resources)

    def _calls(self, resources: list[Any]) -> Iterator[Metric]:
        calls = CounterMetricFamily(
            "floodwall_calls",
            "Calls through a resource, by what the dependency did (outcome).",
            labels=["resource", "outcome"],
        )
        answers = CounterMetricFamily(
            "floodwall_answers",
            "Calls through a resource, by what the caller got: answer, fallback or error.",
            labels=["resource", "answer"],
        )
        latency = HistogramMetricFamily(
            "floodwall_call_duration_seconds",
            "Time from entering a resource's pipeline to its answer or error.",
            labels=["resource"],
        )
        for resource in resources:
            if resource.meter is None:
                continue
            counts, bins, total = resource.meter.read()
            for outcome, count in sorted(counts.items()):
                calls.add_metric([resource.name, outcome], count)
            for answer, count in resource.meter.answers().items():
                answers.add_metric([resource.name, answer], count)
            buckets, seen, index = [], 0, 0
            for bound in BUCKETS:
                while index < len(bins) and bins[index][0] <= bound * 1.0000001:
                    seen += bins[index][1]
                    index += 1
                buckets.append((_bound(bound), float(seen)))
            count = sum(c for _, c in bins)
            buckets.append(("+Inf", float(count)))
            latency.add_metric([resource.name], buckets, total)
        yield calls
        yield answers
        yield latency

    def _breakers(self, resources: list[Any]) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "floodwall_circuit_breaker_state",
            "Breaker state: 1 on the series of the current state, 0 on the others.",
            labels=["resource", "state"],
        )
        rejected = CounterMetricFamily(
            "floodwall_circuit_breaker_rejected", "Calls a breaker refused.", labels=["resource"]
        )
        ratio = GaugeMetricFamily(
            "floodwall_circuit_breaker_failure_ratio",
            "Share of failed calls (0 to 1) over the breaker's rolling window.",
            labels=["resource"],
        )
        transitions = CounterMetricFamily(
            "floodwall_circuit_breaker_transitions",
            "Breaker state changes, by the state entered.",
            labels=["resource", "state"],
        )
        for resource in resources:
            breaker = resource.breaker
            if breaker is None:
                continue
            current = breaker.state
            for each in STATES:
                state.add_metric([resource.name, each.name.lower()], float(each is current))
            rejected.add_metric([resource.name], breaker.rejected)
            ratio.add_metric([resource.name], breaker.metrics().failure_rate)
            for to_state, count in sorted(breaker.transitions.items()):
                transitions.add_metric([resource.name, to_state.lower()], count)
        yield from (state, rejected, ratio, transitions)

    def _retries(self, resources: list[Any]) -> Iterator[Metric]:
        calls = CounterMetricFamily(
            "floodwall_retry_calls", "Logical calls through a Retry policy.", labels=["resource"]
        )
        retries = CounterMetricFamily(
            "floodwall_retries",
            "Retries made: attempts beyond the first of each call.",
            labels=["resource"],
        )
        exhausted = CounterMetricFamily(
            "floodwall_retry_budget_exhausted",
            "Retries refused because the retry budget was spent.",
            labels=["resource"],
        )
        for resource in resources:
            retry = resource.retry
            if retry is None:
                continue
            calls.add_metric([resource.name], retry.calls)
            retries.add_metric([resource.name], retry.retries)
            exhausted.add_metric([resource.name], retry.budget_refusals)
        yield from (calls, retries, exhausted)

    def _isolation(self, resources: list[Any]) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "floodwall_bulkhead_in_flight", "Calls holding a bulkhead slot.", labels=["resource"]
        )
        queued = GaugeMetricFamily(
            "floodwall_bulkhead_queued", "Calls waiting for a bulkhead slot.", labels=["resource"]
        )
        full = CounterMetricFamily(
            "floodwall_bulkhead_rejected", "Calls a full bulkhead refused.", labels=["resource"]
        )
        decisions = CounterMetricFamily(
            "floodwall_rate_limit_decisions",
            "Rate-limit decisions on calls through a resource.",
            labels=["resource", "decision"],
        )
        for resource in resources:
            bulkhead = resource.bulkhead
            if bulkhead is not None:
                in_flight.add_metric([resource.name], bulkhead.in_flight)
                queued.add_metric([resource.name], bulkhead.queued)
                full.add_metric([resource.name], bulkhead.rejected)
            made = rate_limit_decisions(resource)
            if made is not None:
                for decision, count in made.items():
                    decisions.add_metric([resource.name, decision], count)
        limit = GaugeMetricFamily(
            "floodwall_adaptive_limit",
            "Current concurrency limit of a resource's adaptive limiter.",
            labels=["resource"],
        )
        inflight = GaugeMetricFamily(
            "floodwall_adaptive_inflight",
            "Calls holding a token of a resource's adaptive limiter.",
            labels=["resource"],
        )
        for resource in resources:
            if resource.adaptive is not None:
                limit.add_metric([resource.name], resource.adaptive.limit)
                inflight.add_metric([resource.name], resource.adaptive.inflight)
        yield from (in_flight, queued, full, decisions, limit, inflight)

    def _stores(self, resources: list[Any]) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "floodwall_store_up",
            "1 while the store a policy keeps its state in answers, 0 while on_store_error "
            "answers for it.",
            labels=["resource", "policy"],
        )
        degraded = CounterMetricFamily(
            "floodwall_store_degraded",
            "Calls on_store_error answered because the policy's store did not.",
            labels=["resource", "policy"],
        )
        for resource in resources:
            for policy, answers, count in store_figures(resource):
                up.add_metric([resource.name, policy], 1.0 if answers else 0.0)
                degraded.add_metric([resource.name, policy], count)
        yield up
        yield degraded

    def _others(self, resources: list[Any]) -> Iterator[Metric]:
        timeouts = CounterMetricFamily(
            "floodwall_timeouts", "Calls that ran out of time.", labels=["resource"]
        )
        fallbacks = CounterMetricFamily(
            "floodwall_fallbacks", "Answers given by a fallback.", labels=["resource"]
        )
        shed = GaugeMetricFamily(
            "floodwall_level_shed",
            "Whether a dependency level is shed (1) or not (0).",
            labels=["level"],
        )
        for resource in resources:
            if resource.timeout is not None:
                timeouts.add_metric([resource.name], resource.timeout.timeouts)
            if resource.fallback is not None:
                fallbacks.add_metric([resource.name], resource.fallback.degraded)
        for level in (2, 3):
            shed.add_metric([str(level)], float(self.registry.is_shed(level)))
        yield from (timeouts, fallbacks, shed)


def _bound(value: float) -> str:
    return repr(value) if value != int(value) else f"{value:.1f}"


def register(registry: Registry, into: CollectorRegistry = REGISTRY) -> FloodwallCollector:
    """Publish ``registry``'s metrics on a ``prometheus_client`` registry."""
    collector = FloodwallCollector(registry)
    into.register(collector)
    return collector


class InboundCollector(Collector):
    """A ``prometheus_client`` collector over an inbound guard (ASGI, WSGI or gRPC): its
    decisions by outcome and reason, and its shedder's limit and in-flight count."""

    def __init__(self, guard: InboundGuard, name: str) -> None:
        self.guard = guard
        self.name = validate.text("name", name)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily(
            "floodwall_inbound_decisions",
            "Inbound requests by the guard's decision (outcome) and its reason.",
            labels=["guard", "outcome", "reason"],
        )
        for (outcome, reason), count in sorted(self.guard.decisions().items()):
            decisions.add_metric([self.name, outcome, reason], count)
        yield decisions
        figures = shedder_figures(self.guard)
        if figures is not None:
            limit, inflight = figures
            gauge = GaugeMetricFamily(
                "floodwall_inbound_shedder_limit",
                "Concurrency the inbound load shedder allows now.",
                labels=["guard"],
            )
            gauge.add_metric([self.name], limit)
            held = GaugeMetricFamily(
                "floodwall_inbound_shedder_in_flight",
                "Inbound requests holding a shedding ticket.",
                labels=["guard"],
            )
            held.add_metric([self.name], inflight)
            yield gauge
            yield held


def register_guard(
    guard: InboundGuard, into: CollectorRegistry = REGISTRY, name: str = "http"
) -> InboundCollector:
    """Publish an inbound guard's decisions (and its shedder's figures) on a registry; ``name``
    is the ``guard`` label (one per guard: ``http``, ``grpc``, …)."""
    collector = InboundCollector(guard, name)
    into.register(collector)
    return collector


class TaskCollector(Collector):
    """A ``prometheus_client`` collector over a task guard (Celery, Dramatiq, arq): its
    deliveries by what became of them."""

    def __init__(self, guard: TaskGuard, name: str) -> None:
        self.guard = guard
        self.name = validate.text("name", name)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        deliveries = CounterMetricFamily(
            "floodwall_task_deliveries",
            "Task deliveries by what became of them (executions, replays, deferred, retried, "
            "failed).",
            labels=["guard", "outcome"],
        )
        for outcome, count in sorted(task_deliveries(self.guard).items()):
            deliveries.add_metric([self.name, outcome], count)
        yield deliveries


def register_tasks(
    guard: TaskGuard, into: CollectorRegistry = REGISTRY, name: str | None = None
) -> TaskCollector:
    """Publish a task guard's deliveries on a registry; ``name`` is the ``guard`` label
    (default: the guard's own ``name``)."""
    collector = TaskCollector(guard, guard.name if name is None else name)
    into.register(collector)
    return collector
