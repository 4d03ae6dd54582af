"""Issue 19, item 2: the inbound guard's decisions by outcome and reason, and its shedder's
limit and in-flight count, on a real Prometheus exposition.

A burst that got 429s and 503s used to leave no trace in ``/metrics``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import floodwall as fw
from floodwall.adaptive import AdaptiveLimiter, FixedLimit, LoadShedder
from floodwall.asgi import FloodwallMiddleware
from floodwall.breaker import CircuitState
from floodwall.integrations._inbound import Admission, Inbound, InboundGuard, RateLimit, Refusal
from floodwall.observe.prometheus import register_guard


def request(path: str = "/", client: str = "10.0.0.1") -> Inbound:
    return Inbound("GET", path, {}, client)


def scrape(prom: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(prom).decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def decision(outcome: str, reason: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = (("guard", "web"), ("outcome", outcome), ("reason", reason))
    return ("floodwall_inbound_decisions_total", labels)


def test_item2_inbound_metrics_count_refusals_by_reason_and_the_shedder(
    clock: fw.FakeClock,
) -> None:
    limiter = AdaptiveLimiter(FixedLimit(2), clock=clock)
    guard = InboundGuard(
        limits=[RateLimit("3/10s", route="/login", key="ip")],
        shedder=LoadShedder(limiter, clock=clock),
        clock=clock,
    )
    prom = CollectorRegistry()
    register_guard(guard, prom, name="web")
    answers = [guard.admit(request("/login")) for _ in range(5)]
    refused = [a for a in answers if isinstance(a, Refusal)]
    # the limit lets 3 through, the shedder holds 2 of them, the third is shed; then 2 x 429
    assert [r.status for r in refused] == [503, 429, 429]
    held = [a for a in answers if isinstance(a, Admission)]
    got = scrape(prom)
    assert got[decision("admitted", "admitted")] == 2
    assert got[decision("refused", "rate_limited")] == 2
    assert got[decision("refused", "overloaded")] == 1
    assert got[("floodwall_inbound_shedder_limit", (("guard", "web"),))] == 2
    assert got[("floodwall_inbound_shedder_in_flight", (("guard", "web"),))] == 2
    for each in held:
        each.close(200)
    assert scrape(prom)[("floodwall_inbound_shedder_in_flight", (("guard", "web"),))] == 0


def test_item2_inbound_metrics_count_rejections_the_app_raised(clock: fw.FakeClock) -> None:
    guard = InboundGuard(clock=clock)
    prom = CollectorRegistry()
    register_guard(guard, prom, name="web")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise fw.CircuitOpenError("payments", CircuitState.OPEN, 3.0)

    middleware = FloodwallMiddleware(app, guard=guard)
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/", "headers": []}
    for _ in range(3):
        asyncio.run(middleware(scope, receive, send))
    got = scrape(prom)
    assert got[decision("admitted", "admitted")] == 3
    assert got[decision("app_rejected", "circuit_open")] == 3
    assert ("floodwall_inbound_shedder_limit", (("guard", "web"),)) not in got  # no shedder
