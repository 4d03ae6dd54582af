"""OpenTelemetry: the Prometheus families as instruments, a span per protected call.

``instrument(registry, meter)`` publishes every family :mod:`floodwall.observe.prometheus`
publishes, one instrument each (:data:`PROMETHEUS_TWINS` names the pairs), with the same
attributes as Prometheus' labels and a UCUM unit (``{call}``, ``{transition}``, ``1`` for
ratios and 0/1 gauges, ``s``). Counters and gauges are observable: their callbacks read the
counters the policies and each resource's meter keep anyway, so nothing is recorded per call
for them. The duration histogram, ``floodwall.call.duration`` (seconds, by ``resource``, and
``error.type``, the semantic conventions' attribute, on calls whose dependency did not succeed),
needs every duration: OpenTelemetry has no observable histogram, so ``instrument`` installs a
:class:`CallTracer` on the registry (``Registry.add_observer``), which records each call's
duration from then on and, when spans are on, wraps the call in a span.

Spans (``spans=None``: on when a tracer provider is given or one is set globally): one span
``floodwall <resource>`` per call through a resource, current while the call runs (so the HTTP
client's span nests under it), with ``floodwall.resource``, ``floodwall.outcome`` (what the
dependency did), ``floodwall.answer`` (what the caller got) and ``error.type`` as attributes,
status ``ERROR`` when the caller got an error, and every policy decision taken during the call
(a breaker's rejection or state change, a retry, a timeout, a fallback answering) as a span
event by :class:`SpanEventListener`.

``instrument_guard(guard, meter)`` publishes an inbound guard's decisions and its shedder's
figures; ``instrument_tasks(guard, meter)`` a task guard's deliveries. Needs
``opentelemetry-api`` (the ``otel`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from floodwall._core.extras import missing_extra

try:
    from opentelemetry import context, trace
    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation
    from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.observe.otel", "otel") from _missing

from floodwall._core.events import Event
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

if TYPE_CHECKING:  # only annotations name it: importing this module needs no pydantic
    from floodwall.config.registry import Registry

__all__ = [
    "PROMETHEUS_TWINS",
    "CallTracer",
    "SpanEventListener",
    "instrument",
    "instrument_guard",
    "instrument_tasks",
]

PROMETHEUS_TWINS = {
    "floodwall_calls_total": "floodwall.calls",
    "floodwall_answers_total": "floodwall.answers",
    "floodwall_call_duration_seconds": "floodwall.call.duration",
    "floodwall_circuit_breaker_state": "floodwall.circuit_breaker.state",
    "floodwall_circuit_breaker_transitions_total": "floodwall.circuit_breaker.transitions",
    "floodwall_circuit_breaker_rejected_total": "floodwall.circuit_breaker.rejected",
    "floodwall_circuit_breaker_failure_ratio": "floodwall.circuit_breaker.failure_ratio",
    "floodwall_retry_calls_total": "floodwall.retry.calls",
    "floodwall_retries_total": "floodwall.retries",
    "floodwall_retry_budget_exhausted_total": "floodwall.retry.budget_exhausted",
    "floodwall_timeouts_total": "floodwall.timeouts",
    "floodwall_fallbacks_total": "floodwall.fallbacks",
    "floodwall_bulkhead_in_flight": "floodwall.bulkhead.in_flight",
    "floodwall_bulkhead_queued": "floodwall.bulkhead.queued",
    "floodwall_bulkhead_rejected_total": "floodwall.bulkhead.rejected",
    "floodwall_rate_limit_decisions_total": "floodwall.rate_limit.decisions",
    "floodwall_adaptive_limit": "floodwall.adaptive.limit",
    "floodwall_adaptive_inflight": "floodwall.adaptive.inflight",
    "floodwall_level_shed": "floodwall.level.shed",
    "floodwall_store_up": "floodwall.store.up",
    "floodwall_store_degraded_total": "floodwall.store.degraded",
    "floodwall_inbound_decisions_total": "floodwall.inbound.decisions",
    "floodwall_inbound_shedder_limit": "floodwall.inbound.shedder.limit",
    "floodwall_inbound_shedder_in_flight": "floodwall.inbound.shedder.in_flight",
    "floodwall_task_deliveries_total": "floodwall.task.deliveries",
}
"""Each Prometheus family (its sample name) and the OpenTelemetry instrument that carries the
same figures under the same label names."""

Callback = Callable[[CallbackOptions], Iterable[Observation]]


def instrument(
    registry: Registry,
    meter: Meter,
    *,
    tracer_provider: TracerProvider | None = None,
    spans: bool | None = None,
) -> CallTracer:
    """Publish ``registry``'s figures through ``meter`` (see the module); record each call's
    duration and, when ``spans`` (default: a tracer provider is given or set globally), a span
    per call. Returns the installed :class:`CallTracer`."""
    if spans is None:
        spans = tracer_provider is not None or _global_tracer_provider()
    tracer = None
    if spans:
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        tracer = provider.get_tracer("floodwall")
        registry.add_listener(SpanEventListener())
    _calls(registry, meter)
    _policies(registry, meter)
    histogram = meter.create_histogram(
        "floodwall.call.duration",
        unit="s",
        description="Time from entering a resource's pipeline to its answer or error",
        explicit_bucket_boundaries_advisory=list(LATENCY_BUCKETS),
    )
    observer = CallTracer(histogram, tracer)
    registry.add_observer(observer)
    return observer


def _global_tracer_provider() -> bool:
    """Whether the application set a tracer provider (the API's default is a proxy)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _calls(registry: Registry, meter: Meter) -> None:
    def calls(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.meter is not None:
                counts, _, _ = resource.meter.read()
                for outcome, count in counts.items():
                    yield Observation(count, {"resource": resource.name, "outcome": outcome})

    def answers(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.meter is not None:
                for answer, count in resource.meter.answers().items():
                    yield Observation(count, {"resource": resource.name, "answer": answer})

    def decisions(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            made = rate_limit_decisions(resource)
            for decision, count in (made or {}).items():
                yield Observation(count, {"resource": resource.name, "decision": decision})

    counter = meter.create_observable_counter
    counter("floodwall.calls", [calls], "{call}", "Calls by what the dependency did (outcome)")
    counter(
        "floodwall.answers",
        [answers],
        "{call}",
        "Calls by what the caller got: answer, fallback or error",
    )
    counter(
        "floodwall.rate_limit.decisions",
        [decisions],
        "{call}",
        "Rate-limit decisions on calls through a resource",
    )


def _policies(registry: Registry, meter: Meter) -> None:
    def states(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.breaker is not None:
                current = resource.breaker.state
                for state in CircuitState:
                    labels = {"resource": resource.name, "state": state.name.lower()}
                    yield Observation(int(state is current), labels)

    def transitions(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.breaker is not None:
                for to_state, count in resource.breaker.transitions.items():
                    labels = {"resource": resource.name, "state": to_state.lower()}
                    yield Observation(count, labels)

    def shed(options: CallbackOptions) -> Iterable[Observation]:
        for level in (2, 3):
            yield Observation(int(registry.is_shed(level)), {"level": str(level)})

    counter, gauge = meter.create_observable_counter, meter.create_observable_gauge
    gauge(
        "floodwall.circuit_breaker.state",
        [states],
        "1",
        "1 on the breaker's current state, 0 on the others",
    )
    counter(
        "floodwall.circuit_breaker.transitions",
        [transitions],
        "{transition}",
        "Breaker state changes, by the state entered",
    )
    for name, part, read, unit, description in _COUNTED:
        counter(name, [_per_resource(registry, part, read)], unit, description)
    for name, part, read, unit, description in _GAUGES:
        gauge(name, [_per_resource(registry, part, read)], unit, description)
    gauge("floodwall.level.shed", [shed], "1", "1 while a dependency level is shed")
    _stores(registry, meter)


def _stores(registry: Registry, meter: Meter) -> None:
    def up(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            for policy, answers, _ in store_figures(resource):
                yield Observation(int(answers), {"resource": resource.name, "policy": policy})

    def degraded(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            for policy, _, count in store_figures(resource):
                yield Observation(count, {"resource": resource.name, "policy": policy})

    meter.create_observable_gauge(
        "floodwall.store.up", [up], "1", "1 while a policy's store answers, 0 while it does not"
    )
    meter.create_observable_counter(
        "floodwall.store.degraded",
        [degraded],
        "{call}",
        "Calls on_store_error answered because the policy's store did not",
    )


def _per_resource(registry: Registry, part: str, read: Callable[[Any], float]) -> Callback:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            policy = getattr(resource, part)
            if policy is not None:
                yield Observation(read(policy), {"resource": resource.name})

    return observe


def _attr(name: str) -> Callable[[Any], float]:
    return lambda policy: float(getattr(policy, name))


_COUNTED: list[tuple[str, str, Callable[[Any], float], str, str]] = [
    ("floodwall.circuit_breaker.rejected", "breaker", _attr("rejected"), "{call}", "Refused"),
    ("floodwall.retry.calls", "retry", _attr("calls"), "{call}", "Logical calls through a Retry"),
    ("floodwall.retries", "retry", _attr("retries"), "{call}", "Attempts beyond the first"),
    (
        "floodwall.retry.budget_exhausted",
        "retry",
        _attr("budget_refusals"),
        "{call}",
        "Retries refused: the retry budget was spent",
    ),
    ("floodwall.timeouts", "timeout", _attr("timeouts"), "{call}", "Calls that ran out of time"),
    ("floodwall.fallbacks", "fallback", _attr("degraded"), "{call}", "Answers by a fallback"),
    ("floodwall.bulkhead.rejected", "bulkhead", _attr("rejected"), "{call}", "Full: refused"),
]
_GAUGES: list[tuple[str, str, Callable[[Any], float], str, str]] = [
    (
        "floodwall.circuit_breaker.failure_ratio",
        "breaker",
        lambda breaker: breaker.metrics().failure_rate,
        "1",
        "Failed share over the breaker's rolling window",
    ),
    ("floodwall.bulkhead.in_flight", "bulkhead", _attr("in_flight"), "{call}", "Slots held"),
    ("floodwall.bulkhead.queued", "bulkhead", _attr("queued"), "{call}", "Calls waiting"),
    ("floodwall.adaptive.limit", "adaptive", _attr("limit"), "{call}", "Concurrency limit"),
    ("floodwall.adaptive.inflight", "adaptive", _attr("inflight"), "{call}", "Tokens held"),
]


def instrument_guard(guard: InboundGuard, meter: Meter, name: str = "http") -> None:
    """Publish an inbound guard's decisions (by ``outcome`` and ``reason``) and its shedder's
    limit and in-flight count through ``meter``; ``name`` is the ``guard`` attribute."""

    def decisions(options: CallbackOptions) -> Iterable[Observation]:
        for (outcome, reason), count in guard.decisions().items():
            yield Observation(count, {"guard": name, "outcome": outcome, "reason": reason})

    def limit(options: CallbackOptions) -> Iterable[Observation]:
        figures = shedder_figures(guard)
        if figures is not None:
            yield Observation(figures[0], {"guard": name})

    def in_flight(options: CallbackOptions) -> Iterable[Observation]:
        figures = shedder_figures(guard)
        if figures is not None:
            yield Observation(figures[1], {"guard": name})

    meter.create_observable_counter(
        "floodwall.inbound.decisions",
        [decisions],
        "{request}",
        "Inbound requests by the guard's decision (outcome) and its reason",
    )
    meter.create_observable_gauge(
        "floodwall.inbound.shedder.limit",
        [limit],
        "{request}",
        "Concurrency the inbound load shedder allows now",
    )
    meter.create_observable_gauge(
        "floodwall.inbound.shedder.in_flight",
        [in_flight],
        "{request}",
        "Inbound requests holding a shedding ticket",
    )


def instrument_tasks(guard: TaskGuard, meter: Meter, name: str | None = None) -> None:
    """Publish a task guard's deliveries (by ``outcome``) through ``meter``; ``name`` is the
    ``guard`` attribute (default: the guard's own ``name``)."""
    label = guard.name if name is None else name

    def deliveries(options: CallbackOptions) -> Iterable[Observation]:
        for outcome, count in task_deliveries(guard).items():
            yield Observation(count, {"guard": label, "outcome": outcome})

    meter.create_observable_counter(
        "floodwall.task.deliveries",
        [deliveries],
        "{delivery}",
        "Task deliveries by what became of them (executions, replays, deferred, retried, failed)",
    )


class CallTracer:
    """The per-call observer :func:`instrument` installs: each call's duration into the
    histogram, and with a ``tracer`` a span around the call (see the module)."""

    def __init__(self, histogram: Histogram, tracer: Tracer | None) -> None:
        self.histogram = histogram
        self.tracer = tracer

    def begin(self, resource: str) -> tuple[Span, object] | None:
        if self.tracer is None:
            return None
        span = self.tracer.start_span(
            f"floodwall {resource}", attributes={"floodwall.resource": resource}
        )
        return span, context.attach(trace.set_span_in_context(span))

    def end(
        self,
        resource: str,
        begun: object,
        *,
        duration: float,
        outcome: str,
        answer: str,
        error: BaseException | None,
    ) -> None:
        failed = outcome != "success"
        labels = {"resource": resource, "error.type": outcome} if failed else {"resource": resource}
        self.histogram.record(duration, labels)
        if not isinstance(begun, tuple):
            return
        span, token = begun
        context.detach(token)
        span.set_attribute("floodwall.outcome", outcome)
        span.set_attribute("floodwall.answer", answer)
        if failed:
            span.set_attribute("error.type", outcome)
        if answer == "error":
            if error is not None:
                span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{outcome}: {error!r}"))
        span.end()


class SpanEventListener:
    """Adds each event to the current span as a span event with its reason and figures."""

    def __call__(self, event: Event) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        attributes: dict[str, Any] = {
            "floodwall.source": event.source,
            "floodwall.name": event.name,
            "floodwall.reason": event.reason,
        }
        if event.to_state is not None:
            attributes["floodwall.from"] = event.from_state or ""
            attributes["floodwall.to"] = event.to_state
        for key, value in event.figures.items():
            if isinstance(value, bool | int | float | str):
                attributes[f"floodwall.{key}"] = value
        span.add_event(f"floodwall.{event.kind}", attributes)
