"""OpenTelemetry: metrics as observable instruments, events as span events.

``instrument(registry, meter)`` registers asynchronous (observable) instruments whose callbacks
read the same counters the Prometheus collector reads, so nothing is recorded per call:
``floodwall.calls`` (by ``resource``, ``outcome``), ``floodwall.circuit_breaker.state`` (1 on the
current ``state``, 0 on the others, as in Prometheus) and ``floodwall.retries``.
``SpanEventListener`` adds every floodwall event to the current span, so a trace shows why a
call was rejected or degraded. Needs ``opentelemetry-api`` (the ``otel`` extra).
"""

from __future__ import annotations

from collections.abc import Iterable
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
    """Publish ``registry``'s calls, breaker states and retries through ``meter``."""

    def calls(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.meter is None:
                continue
            counts, _, _ = resource.meter.read()
            for outcome, count in counts.items():
                yield Observation(count, {"resource": resource.name, "outcome": outcome})

    def states(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.breaker is not None:
                current = resource.breaker.state
                for state in CircuitState:
                    labels = {"resource": resource.name, "state": state.name.lower()}
                    yield Observation(int(state is current), labels)

    def retries(options: CallbackOptions) -> Iterable[Observation]:
        for resource in registry:
            if resource.retry is not None:
                yield Observation(resource.retry.retries, {"resource": resource.name})

    meter.create_observable_counter("floodwall.calls", [calls], description="Calls by outcome")
    meter.create_observable_gauge(
        "floodwall.circuit_breaker.state",
        [states],
        description="1 on the breaker's current state, 0 on the others",
    )
    meter.create_observable_counter(
        "floodwall.retries", [retries], description="Retries: attempts beyond the first"
    )


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
