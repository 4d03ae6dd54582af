"""OpenTelemetry: metrics as observable instruments, events as span events.

``instrument(registry, meter)`` registers asynchronous (observable) instruments whose callbacks
read the same counters the Prometheus collector reads, so nothing is recorded per call: one
instrument per Prometheus family except the duration histogram (OpenTelemetry has no
observable histogram), each with its unit: ``floodwall.calls`` (by ``resource``, ``outcome``:
what the dependency did), ``floodwall.answers`` (by ``resource``, ``answer``: what the caller
got), ``floodwall.circuit_breaker.state`` (1 on the current ``state``, 0 on the others, as in
Prometheus), the breaker's rejections and failure ratio, retries, timeouts, fallbacks, the
bulkhead's and the adaptive limiter's figures and ``floodwall.level.shed``.
``SpanEventListener`` adds every floodwall event to the current span, so a trace shows why a
call was rejected or degraded. Needs ``opentelemetry-api`` (the ``otel`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from floodwall._core.extras import missing_extra

try:
    from opentelemetry import trace
    from opentelemetry.metrics import CallbackOptions, Meter, Observation
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.observe.otel", "otel") from _missing

from floodwall._core.events import Event
from floodwall.breaker import CircuitState

if TYPE_CHECKING:  # only annotations name it: importing this module needs no pydantic
    from floodwall.config.registry import Registry

__all__ = ["SpanEventListener", "instrument"]


def instrument(registry: Registry, meter: Meter) -> None:
    """Publish ``registry``'s calls, answers, breakers, retries, isolation and shed levels
    through ``meter``, with units (UCUM: ``{call}``, ``1`` for ratios)."""

    def calls(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.meter is None:
                continue
            counts, _, _ = resource.meter.read()
            for outcome, count in counts.items():
                yield Observation(count, {"resource": resource.name, "outcome": outcome})

    def answers(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.meter is None:
                continue
            for answer, count in resource.meter.answers().items():
                yield Observation(count, {"resource": resource.name, "answer": answer})

    def states(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.breaker is not None:
                current = resource.breaker.state
                for state in CircuitState:
                    labels = {"resource": resource.name, "state": state.name.lower()}
                    yield Observation(int(state is current), labels)

    def per_resource(
        part: str, read: Callable[[Any], float]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for resource in registry:
                policy = getattr(resource, part)
                if policy is not None:
                    yield Observation(read(policy), {"resource": resource.name})

        return observe

    def shed(options: CallbackOptions) -> Iterable[Observation]:
        for level in (2, 3):
            yield Observation(int(registry.is_shed(level)), {"level": str(level)})

    counter, gauge = meter.create_observable_counter, meter.create_observable_gauge
    counter(
        "floodwall.calls",
        [calls],
        unit="{call}",
        description="Calls by what the dependency did (outcome)",
    )
    counter(
        "floodwall.answers",
        [answers],
        unit="{call}",
        description="Calls by what the caller got: answer, fallback or error",
    )
    gauge(
        "floodwall.circuit_breaker.state",
        [states],
        unit="1",
        description="1 on the breaker's current state, 0 on the others",
    )
    counted: list[tuple[str, str, Callable[[Any], float], str]] = [
        ("floodwall.circuit_breaker.rejected", "breaker", _attr("rejected"), "Calls refused"),
        ("floodwall.retry.calls", "retry", _attr("calls"), "Logical calls through a Retry"),
        ("floodwall.retries", "retry", _attr("retries"), "Retries: attempts beyond the first"),
        (
            "floodwall.retry.budget_exhausted",
            "retry",
            _attr("budget_refusals"),
            "Retries refused: budget spent",
        ),
        ("floodwall.timeouts", "timeout", _attr("timeouts"), "Calls that ran out of time"),
        ("floodwall.fallbacks", "fallback", _attr("degraded"), "Answers given by a fallback"),
        (
            "floodwall.bulkhead.rejected",
            "bulkhead",
            _attr("rejected"),
            "Calls a full bulkhead refused",
        ),
    ]
    for name, part, read, description in counted:
        counter(name, [per_resource(part, read)], unit="{call}", description=description)
    gauges: list[tuple[str, str, Callable[[Any], float], str, str]] = [
        (
            "floodwall.circuit_breaker.failure_ratio",
            "breaker",
            lambda b: b.metrics().failure_rate,
            "1",
            "Failed share over the breaker's rolling window",
        ),
        ("floodwall.bulkhead.in_flight", "bulkhead", _attr("in_flight"), "{call}", "Slots held"),
        ("floodwall.bulkhead.queued", "bulkhead", _attr("queued"), "{call}", "Calls waiting"),
        ("floodwall.adaptive.limit", "adaptive", _attr("limit"), "{call}", "Concurrency limit"),
        ("floodwall.adaptive.inflight", "adaptive", _attr("inflight"), "{call}", "Tokens held"),
    ]
    for name, part, read, unit, description in gauges:
        gauge(name, [per_resource(part, read)], unit=unit, description=description)
    gauge("floodwall.level.shed", [shed], unit="1", description="1 while a level is shed")


def _attr(name: str) -> Callable[[Any], float]:
    return lambda policy: float(getattr(policy, name))


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
