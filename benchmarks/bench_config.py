"""Configuration and metrics: what a resource built from a document costs per call.

Targets from the config issue: a pipeline built from config costs the same per call as the same
pipeline built in code (ratio ≤ 1.05), and metrics collection (the per-resource meter the
Prometheus and OpenTelemetry adapters read) adds ≤ 20 % to the success path. The pipeline is a
circuit breaker and a retry around ``return 1``, in both cases the same options. The
OpenTelemetry rows price what ``floodwall.observe.otel.instrument`` adds per call (the duration
histogram's record, and a span per call); no target: they are paid only when instrumented.
"""

from __future__ import annotations

import floodwall
from _harness import Case, Target
from floodwall.backoff import FullJitter
from floodwall.config import Registry

GROUP = "config-built resource vs code-built pipeline, sync"
AGROUP = "config-built resource vs code-built pipeline, async"
CODE = "code: Pipeline(CircuitBreaker, Retry)"
CONFIG = "config: registry.get(name), metrics off"
METERED = "config: registry.get(name), metrics on"
OTEL = "config: metrics on, OpenTelemetry duration histogram"
TRACED = "config: metrics on, OpenTelemetry histogram and a span per call"

DOC = {
    "resources": {
        "dep": {
            "circuit_breaker": {"minimum_calls": 20},
            "retry": {"attempts": 3, "backoff": {"kind": "exponential", "jitter": "full"}},
        }
    }
}


def f() -> int:
    return 1


async def af() -> int:
    return 1


def _code() -> floodwall.Pipeline:
    return floodwall.Pipeline(
        floodwall.CircuitBreaker("dep", minimum_calls=20),
        floodwall.Retry("dep", attempts=3, backoff=FullJitter(0.1, cap=10.0)),
    )


def _instrumented(spans: bool) -> Registry:
    """A registry published through OpenTelemetry's SDK (an in-memory reader; spans go to a
    tracer provider with no exporter, so the figure is floodwall's and the SDK's, not I/O)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from floodwall.observe.otel import instrument

    registry = Registry(DOC)
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
    instrument(registry, meter, tracer_provider=TracerProvider() if spans else None, spans=spans)
    return registry


def cases() -> list[Case]:
    code = _code()(f)
    plain = Registry(DOC, metrics=False).get("dep")(f)
    metered = Registry(DOC).get("dep")(f)
    histogram = _instrumented(spans=False).get("dep")(f)
    traced = _instrumented(spans=True).get("dep")(f)
    acode = _code()(af)
    aplain = Registry(DOC, metrics=False).get("dep")(af)
    ametered = Registry(DOC).get("dep")(af)
    return [
        Case(GROUP, CODE, fn=code, ref="code"),
        Case(GROUP, CONFIG, fn=plain, ref="config, no metrics"),
        Case(GROUP, METERED, fn=metered),
        Case(GROUP, OTEL, fn=histogram),
        Case(GROUP, TRACED, fn=traced),
        Case(AGROUP, CODE, afn=acode, ref="code"),
        Case(AGROUP, CONFIG, afn=aplain, ref="config, no metrics"),
        Case(AGROUP, METERED, afn=ametered),
    ]


def targets() -> list[Target]:
    return [
        Target(GROUP, CONFIG, CODE, 1.05, "config-built ≤ 1.05 × code-built, sync"),
        Target(AGROUP, CONFIG, CODE, 1.05, "config-built ≤ 1.05 × code-built, async"),
        Target(GROUP, METERED, CONFIG, 1.20, "metrics add ≤ 20 % to the success path, sync"),
        Target(AGROUP, METERED, CONFIG, 1.20, "metrics add ≤ 20 % to the success path, async"),
    ]
