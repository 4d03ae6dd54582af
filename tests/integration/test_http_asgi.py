"""The ASGI middleware in front of a real FastAPI app under uvicorn, driven by httpx."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response

import floodwall as fw
from floodwall.adaptive import LoadShedder, QueueingTimeAdmission
from floodwall.asgi import FloodwallMiddleware, RateLimit
from floodwall.config import Registry
from webservers import Uvicorn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _app(counts: dict[str, int], **options: Any) -> FastAPI:
    app = FastAPI()

    @app.get("/hello")
    async def hello(request: Request) -> dict[str, Any]:
        admission = request.state.floodwall
        return {
            "remaining": fw.remaining(),
            "attempt": admission.attempt,
            "retry": fw.current_retry() is not None,
            "reviews_degraded": admission.degraded("reviews") if "registry" in options else None,
        }

    @app.post("/orders")
    async def orders(request: Request) -> Response:
        body = await request.body()
        counts["orders"] = counts.get("orders", 0) + 1
        if body == b"slow":
            await asyncio.sleep(0.5)
        if body == b"fail-once" and counts["orders"] == 1:
            return Response("boom", 500)
        return Response(json.dumps({"order": counts["orders"]}), 201)

    @app.get("/degraded")
    async def degraded() -> str:
        fallback = fw.Fallback(value="cached", name="reviews.fallback")

        async def broken() -> str:
            raise ConnectionError("reviews down")

        return str(await fallback.call_async(broken))

    @app.post("/login")
    async def login() -> str:
        return "welcome"

    app.add_middleware(FloodwallMiddleware, **options)
    return app


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Uvicorn] = []

    def start(**options: Any) -> tuple[str, dict[str, int]]:
        counts: dict[str, int] = {}
        server = Uvicorn(_app(counts, **options)).start()
        servers.append(server)
        return server.url, counts

    yield start
    for server in servers:
        server.stop()


def test_a_429_carries_retry_after_ratelimit_headers_and_a_problem(serve: Any) -> None:
    url, _ = serve(limits=[RateLimit("3/10s", key="ip")], rate_limit_headers=True)
    answers = [httpx.get(url + "/hello") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    ok, refused = answers[0], answers[3]
    assert ok.headers["ratelimit-limit"] == "3"
    assert ok.headers["ratelimit-remaining"] == "2"
    assert ok.headers["ratelimit-policy"] == "3;w=10"
    assert refused.headers["ratelimit-remaining"] == "0"
    assert 1 <= int(refused.headers["retry-after"]) <= 4  # GCRA: one permit per 3.33 s
    assert int(refused.headers["ratelimit-reset"]) >= int(refused.headers["retry-after"])
    assert refused.headers["content-type"] == "application/problem+json"
    problem = refused.json()
    assert problem["status"] == 429
    assert problem["kind"] == "rate_limited"
    assert problem["title"] == "Too Many Requests"


def test_limits_are_per_route_and_per_key(serve: Any) -> None:
    url, _ = serve(
        limits=[RateLimit("1/m", route="/login", methods=["POST"], key="header:X-Api-Key")]
    )
    assert httpx.post(url + "/login", headers={"X-Api-Key": "a"}).status_code == 200
    assert httpx.post(url + "/login", headers={"X-Api-Key": "a"}).status_code == 429
    assert httpx.post(url + "/login", headers={"X-Api-Key": "b"}).status_code == 200
    assert httpx.get(url + "/hello").status_code == 200  # other routes are not limited


def test_client_ip_honours_trusted_proxies_only(serve: Any) -> None:
    url, _ = serve(limits=[RateLimit("1/m", key="ip", trusted_proxies=["127.0.0.0/8"])])
    forwarded = {"X-Forwarded-For": "203.0.113.7, 127.0.0.1"}
    assert httpx.get(url + "/hello", headers=forwarded).status_code == 200
    assert httpx.get(url + "/hello", headers=forwarded).status_code == 429
    other = {"X-Forwarded-For": "203.0.113.8"}
    assert httpx.get(url + "/hello", headers=other).status_code == 200


def test_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored(serve: Any) -> None:
    url, _ = serve(limits=[RateLimit("1/m", key="ip")])  # no trusted proxies
    assert httpx.get(url + "/hello", headers={"X-Forwarded-For": "1.1.1.1"}).status_code == 200
    assert httpx.get(url + "/hello", headers={"X-Forwarded-For": "2.2.2.2"}).status_code == 429


def test_shedding_answers_503_with_retry_after(serve: Any) -> None:
    url, _ = serve(shedder=LoadShedder(max_queue_time=0.5, retry_after=2.0))
    stale = {"X-Request-Start": f"t={time.time() - 2.0:.3f}"}
    refused = httpx.get(url + "/hello", headers=stale)
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "2"
    assert refused.json()["kind"] == "overloaded"
    fresh = {"X-Request-Start": f"t={time.time():.3f}"}
    assert httpx.get(url + "/hello", headers=fresh).status_code == 200


def test_a_dagor_server_reports_its_admission_level(serve: Any) -> None:
    url, _ = serve(shedder=LoadShedder(QueueingTimeAdmission()))
    answer = httpx.get(url + "/hello", headers={"X-Request-Priority": "3:9"})
    assert answer.status_code == 200
    assert answer.headers["x-admission-level"] == "63:127"


def test_handlers_see_the_deadline_and_the_retry_marker(serve: Any) -> None:
    url, _ = serve()
    seen = httpx.get(url + "/hello", headers={"X-Request-Deadline": "1500", "X-Retry-Attempt": "2"})
    body = seen.json()
    assert 1.3 < body["remaining"] <= 1.5
    assert body["attempt"] == 2
    assert body["retry"] is True
    plain = httpx.get(url + "/hello").json()
    assert plain["remaining"] is None and plain["retry"] is False


def test_grpc_timeout_header_also_sets_the_deadline(serve: Any) -> None:
    url, _ = serve()
    body = httpx.get(url + "/hello", headers={"grpc-timeout": "800m"}).json()
    assert 0.6 < body["remaining"] <= 0.8


def test_an_expired_deadline_is_answered_504_at_once(serve: Any) -> None:
    url, counts = serve()
    refused = httpx.post(url + "/orders", headers={"X-Request-Deadline": "0"})
    assert refused.status_code == 504
    assert refused.json()["kind"] == "timeout"
    assert counts == {}


def test_duplicate_posts_with_one_key_execute_once(serve: Any) -> None:
    url, counts = serve(idempotency=fw.Idempotency("memory://", fingerprint=str))
    key = {"Idempotency-Key": "order-1"}
    first = httpx.post(url + "/orders", content=b"one", headers=key)
    again = httpx.post(url + "/orders", content=b"one", headers=key)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"order": 1}
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    reused = httpx.post(url + "/orders", content=b"two", headers=key)
    assert reused.status_code == 422
    assert counts["orders"] == 1


def test_a_concurrent_duplicate_gets_409(serve: Any) -> None:
    url, counts = serve(idempotency=fw.Idempotency("memory://", fingerprint=str))

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=5) as client:
            key = {"Idempotency-Key": "slow-1"}
            first = asyncio.create_task(client.post(url + "/orders", content=b"slow", headers=key))
            await asyncio.sleep(0.15)
            second = await client.post(url + "/orders", content=b"slow", headers=key)
            return [await first, second]

    first, second = asyncio.run(both())
    assert first.status_code == 201
    assert second.status_code == 409
    assert second.json()["kind"] == "duplicate_in_flight"
    assert "retry-after" in second.headers
    assert counts["orders"] == 1


def test_a_failed_write_is_not_stored_and_runs_again(serve: Any) -> None:
    url, counts = serve(idempotency=fw.Idempotency("memory://", fingerprint=str))
    key = {"Idempotency-Key": "flaky-1"}
    assert httpx.post(url + "/orders", content=b"fail-once", headers=key).status_code == 500
    assert httpx.post(url + "/orders", content=b"fail-once", headers=key).status_code == 201
    assert counts["orders"] == 2


def test_handlers_see_dependency_degradation(serve: Any) -> None:
    registry = Registry({"resources": {"reviews": {"level": 3, "fallback": {"value": []}}}})
    url, _ = serve(registry=registry)
    assert httpx.get(url + "/hello").json()["reviews_degraded"] is False
    registry.shed(3, reason="incident")
    assert httpx.get(url + "/hello").json()["reviews_degraded"] is True


def test_a_fallback_answer_is_marked_degraded(serve: Any) -> None:
    url, _ = serve()
    answer = httpx.get(url + "/degraded")
    assert answer.json() == "cached"
    assert answer.headers["x-degraded"] == "reviews.fallback; reason=ConnectionError"


def test_admitted_answers_carry_no_ratelimit_headers_by_default(serve: Any) -> None:
    url, _ = serve(limits=[RateLimit("3/10s", key="ip")])
    assert "ratelimit-limit" not in httpx.get(url + "/hello").headers
