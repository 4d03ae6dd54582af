"""A global rate limit whose store is down, ``on_store_error: fail_closed``: floodwall's outage,
answered 503 with ``Retry-After``, never 429 (issue 19: HTTP answers tell the truth).

The store is a real Redis of the test's own: first up (the limit refuses for real: 429), then
stopped (the limit cannot be checked: 503, ``kind="store_unavailable"``). Checked through the
ASGI and WSGI middleware, the gateway's route limit and the metrics (Django's middleware:
``tests/test_django.py``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import floodwall as fw
from conftest import GatewayThread
from floodwall.asgi import FloodwallMiddleware as AsgiMiddleware
from floodwall.config import Registry
from floodwall.observe.prometheus import register, register_guard
from floodwall.ratelimit import StoreDownDecision
from floodwall.shared import GlobalLimiter
from floodwall.wsgi import FloodwallMiddleware as WsgiMiddleware
from servers import RestartableRedis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _document(url: str, name: str) -> dict[str, Any]:
    limit = {"rate": "1/min", "algorithm": "fixed", "scope": "global", "store": "shared"}
    return {
        "stores": {"shared": url},
        "resources": {name: {"rate_limit": {**limit, "on_store_error": "fail_closed"}}},
    }


@pytest.fixture
def quota(restartable_redis: RestartableRedis) -> Iterator[tuple[Registry, str]]:
    name = f"quota-{uuid.uuid4().hex[:8]}"
    registry = Registry(_document(restartable_redis.url, name))
    try:
        yield registry, name
    finally:
        registry.close()


def _asgi_get(middleware: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "path": "/q",
        "headers": [],
        "client": None,
    }
    asyncio.run(middleware(scope, receive, send))
    start, body = sent[0], sent[-1]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(body["body"] or b"{}")


def _wsgi_get(middleware: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started.append((status, headers))
        return lambda data: None

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/q", "wsgi.input": None}
    body = b"".join(middleware(environ, start_response))
    ((status, headers),) = started
    return int(status[:3]), {k.lower(): v for k, v in headers}, json.loads(body or b"{}")


def _asgi_app(registry: Registry, name: str) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await registry.get(name).call_async(asyncio.sleep, 0)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def _wsgi_app(registry: Registry, name: str) -> Callable[..., Iterable[bytes]]:
    def app(environ: Any, start_response: Any) -> Iterable[bytes]:
        registry.get(name).call(lambda: None)
        start_response("200 OK", [])
        return [b"{}"]

    return app


def _check_outage(status: int, headers: dict[str, str], problem: dict[str, Any]) -> None:
    assert status == 503
    assert headers["content-type"] == "application/problem+json"
    assert 1 <= int(headers["retry-after"]) <= 10  # until the store is probed again
    assert problem["kind"] == "store_unavailable"
    assert "store is unavailable" in problem["detail"]


@pytest.mark.parametrize("shell", ["asgi", "wsgi"])
def test_a_store_outage_is_503_not_429_through_the_middleware(
    quota: tuple[Registry, str], restartable_redis: RestartableRedis, shell: str
) -> None:
    registry, name = quota
    if shell == "asgi":
        middleware: Any = AsgiMiddleware(_asgi_app(registry, name))
        get = _asgi_get
    else:
        middleware = WsgiMiddleware(_wsgi_app(registry, name))
        get = _wsgi_get
    assert get(middleware)[0] == 200
    status, _, problem = get(middleware)  # the store answers: the limit refuses
    assert (status, problem["kind"]) == (429, "rate_limited")
    restartable_redis.stop()
    for _ in range(3):  # the failing calls, then the store breaker's short circuits
        _check_outage(*get(middleware))
    decisions = middleware.guard.decisions()
    assert decisions["app_rejected", "store_unavailable"] == 3
    assert decisions["app_rejected", "rate_limited"] == 1


def test_the_limiter_says_the_store_in_its_decision_error_and_metrics(
    quota: tuple[Registry, str], restartable_redis: RestartableRedis
) -> None:
    registry, name = quota
    resource = registry.get(name)
    limiter = resource.limiter
    assert isinstance(limiter, GlobalLimiter)
    resource.call(lambda: None)
    with pytest.raises(fw.RateLimitedError) as limited:
        resource.call(lambda: None)
    assert type(limited.value) is fw.RateLimitedError
    restartable_redis.stop()
    decision = limiter.acquire()
    assert isinstance(decision, StoreDownDecision) and not decision.allowed
    with pytest.raises(fw.LimitStoreUnavailableError) as down:
        resource.call(lambda: None)
    assert isinstance(down.value, fw.RateLimitedError)  # still caught as the limiter's refusal
    assert down.value.kind == "store_unavailable"
    assert down.value.retry_after is not None and 0 < down.value.retry_after <= 10
    into = CollectorRegistry()
    register(registry, into=into)
    scrape = generate_latest(into).decode()
    label = f'resource="{name}"'
    assert f'floodwall_calls_total{{outcome="store_unavailable",{label}}} 1.0' in scrape
    assert f'floodwall_calls_total{{outcome="rate_limited",{label}}} 1.0' in scrape
    decisions = "floodwall_rate_limit_decisions_total"
    assert f'{decisions}{{decision="store_unavailable",{label}}} 1.0' in scrape
    assert f'{decisions}{{decision="rejected",{label}}} 1.0' in scrape


def test_the_guard_metric_names_the_store(
    quota: tuple[Registry, str], restartable_redis: RestartableRedis
) -> None:
    registry, name = quota
    middleware = WsgiMiddleware(_wsgi_app(registry, name))
    restartable_redis.stop()
    _check_outage(*_wsgi_get(middleware))
    into = CollectorRegistry()
    register_guard(middleware.guard, into=into, name="http")
    scrape = generate_latest(into).decode()
    assert 'outcome="app_rejected",reason="store_unavailable"} 1.0' in scrape
    assert 'reason="rate_limited"' not in scrape


def test_a_gateway_route_limit_on_a_down_store_is_503(
    upstreams: Callable[..., list[Any]],
    gateways: Callable[[dict[str, Any]], GatewayThread],
    restartable_redis: RestartableRedis,
) -> None:
    (svc,) = upstreams("svc")
    limit = {"rate": "1/min", "algorithm": "fixed", "scope": "global", "store": "shared"}
    route = {
        "name": "quota",
        "match": {"path_prefix": "/"},
        "upstream": "svc",
        "rate_limit": {**limit, "on_store_error": "fail_closed"},
    }
    gw = gateways(
        {
            "stores": {"default": "memory://", "shared": restartable_redis.url},
            "upstreams": {"svc": {"endpoints": [svc.url]}},
            "routes": [route],
        }
    )
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        assert client.get(f"/{uuid.uuid4().hex}").status_code == 200
        limited = client.get("/again")
        assert (limited.status_code, limited.json()["kind"]) == (429, "rate_limited")
        restartable_redis.stop()
        answers = [client.get("/down") for _ in range(3)]
    for answer in answers:
        headers = {k.lower(): v for k, v in answer.headers.items()}
        _check_outage(answer.status_code, headers, answer.json())
        assert "ratelimit-remaining" not in headers  # no figures: nothing was counted
    routes = gw.admin("GET", "/status").json()["routes"]["quota"]
    assert "store_unavailable" in json.dumps(routes)
