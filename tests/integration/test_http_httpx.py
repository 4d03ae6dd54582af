"""httpx transports (sync and async) against a real FastAPI upstream under uvicorn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response

import floodwall as fw
from floodwall.backoff import NoBackoff
from floodwall.config import Registry
from floodwall.httpx import AsyncResilientTransport, ResilientTransport
from floodwall.integrations import priority
from floodwall.testing import BackoffWaits, Fault, FaultTransport
from stalls import StoodStill
from webservers import Uvicorn, bound_socket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@dataclass
class Upstream:
    """What the upstream answers next, and what it saw."""

    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    delay: float = 0.0
    calls: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    def reset(self) -> None:
        self.script.clear()
        self.delay = 0.0
        self.calls = 0
        self.headers.clear()


def _app(state: Upstream) -> FastAPI:
    app = FastAPI()

    @app.api_route("/thing", methods=["GET", "POST", "PUT"])
    async def thing(request: Request) -> Response:
        state.calls += 1
        calls = state.calls
        state.headers.append(dict(request.headers))
        status, headers = state.script.pop(0) if state.script else (200, {})
        if state.delay:  # after taking its answer: a late handler must not take the next test's
            await asyncio.sleep(state.delay)
        return Response(f"answer {calls}", status, headers)

    return app


@pytest.fixture(scope="module")
def _server() -> Iterator[Upstream]:
    state = Upstream()
    with Uvicorn(_app(state)) as server:
        state.url = server.url
        yield state


@pytest.fixture
def upstream(_server: Upstream) -> Upstream:
    _server.reset()
    return _server


Send = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def client(request: pytest.FixtureRequest) -> Callable[..., httpx.Response]:
    """``client(policy, method, url, **options) -> response`` through the sync or the async
    transport (a fresh client each call; the policy keeps the state)."""

    def sync(policy: fw.Policy | None, method: str, url: str, **kw: Any) -> httpx.Response:
        options = kw.pop("options", {})
        with httpx.Client(transport=ResilientTransport(policy=policy, **options)) as c:
            return c.request(method, url, **kw)

    def async_(policy: fw.Policy | None, method: str, url: str, **kw: Any) -> httpx.Response:
        options = kw.pop("options", {})

        async def go() -> httpx.Response:
            transport = AsyncResilientTransport(policy=policy, **options)
            async with httpx.AsyncClient(transport=transport) as c:
                return await c.request(method, url, **kw)

        return asyncio.run(go())

    return sync if request.param == "sync" else async_


def _retry(clock: fw.Clock = fw.SYSTEM_CLOCK, **options: Any) -> fw.Retry:
    options.setdefault("backoff", NoBackoff())
    return fw.Retry("upstream", attempts=3, budget=None, clock=clock, **options)


def test_breaker_opens_on_a_failing_upstream_and_recovers(
    upstream: Upstream, client: Send, fake_clock: fw.FakeClock
) -> None:
    breaker = fw.CircuitBreaker(
        "upstream", minimum_calls=4, failure_rate=0.5, open_duration=5.0, clock=fake_clock
    )
    upstream.script = [(500, {})] * 4
    for _ in range(4):
        assert client(breaker, "GET", upstream.url + "/thing").status_code == 500
    assert breaker.state is fw.CircuitState.OPEN
    with pytest.raises(fw.CircuitOpenError) as refused:
        client(breaker, "GET", upstream.url + "/thing")
    assert refused.value.retry_after == pytest.approx(5.0)
    assert upstream.calls == 4  # the open breaker did not call
    fake_clock.advance(5.0)
    assert client(breaker, "GET", upstream.url + "/thing").status_code == 200
    assert breaker.state.name == "CLOSED"


def test_retries_transient_answers_and_marks_each_retry(upstream: Upstream, client: Send) -> None:
    upstream.script = [(502, {}), (504, {})]
    answer = client(_retry(), "GET", upstream.url + "/thing")
    assert answer.status_code == 200
    assert answer.text == "answer 3"
    assert [h.get("x-retry-attempt") for h in upstream.headers] == [None, "2", "3"]


def test_retries_honour_retry_after(
    upstream: Upstream, client: Send, no_backoff: BackoffWaits
) -> None:
    retry = _retry(retry_overload=True)
    upstream.script = [(503, {"Retry-After": "2"}), (429, {"Retry-After": "1"})]
    answer = client(retry, "GET", upstream.url + "/thing")
    assert answer.status_code == 200
    assert no_backoff.delays == [2.0, 1.0]  # the waits the server asked for (skipped in tests)


def test_retry_after_is_waited_for_real_on_the_policy_clock(
    upstream: Upstream, fake_clock: fw.FakeClock
) -> None:
    retry = _retry(fake_clock, retry_overload=True)
    upstream.script = [(503, {"Retry-After": "2"})]
    with httpx.Client(transport=ResilientTransport(policy=retry)) as c:
        assert c.get(upstream.url + "/thing").status_code == 200
    assert fake_clock.sleeps == [2.0]


def test_overload_answers_are_not_retried_by_default(upstream: Upstream, client: Send) -> None:
    upstream.script = [(503, {"Retry-After": "1"})]
    answer = client(_retry(), "GET", upstream.url + "/thing")
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    assert upstream.calls == 1


def test_post_without_an_idempotency_key_is_not_retried(upstream: Upstream, client: Send) -> None:
    upstream.script = [(502, {})]
    answer = client(_retry(), "POST", upstream.url + "/thing", content=b"x")
    assert answer.status_code == 502
    assert answer.text == "answer 1"  # the failed answer comes back, body intact
    assert upstream.calls == 1


def test_post_with_an_idempotency_key_is_retried_with_the_same_key(
    upstream: Upstream, client: Send
) -> None:
    upstream.script = [(502, {})]
    answer = client(
        _retry(), "POST", upstream.url + "/thing", content=b"x", headers={"Idempotency-Key": "k1"}
    )
    assert answer.status_code == 200
    assert [h["idempotency-key"] for h in upstream.headers] == ["k1", "k1"]


def test_an_ambient_idempotency_key_is_sent_and_allows_retries(
    upstream: Upstream, client: Send
) -> None:
    upstream.script = [(500, {})]
    with fw.idempotency_key("order-7"):
        answer = client(_retry(idempotent=False), "POST", upstream.url + "/thing")
    assert answer.status_code == 200
    assert [h.get("idempotency-key") for h in upstream.headers] == ["order-7", "order-7"]


def test_connect_errors_are_retried_even_for_post(client: Send) -> None:
    sock = bound_socket()  # bound, never listening: connection refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/thing"
    retry = _retry()
    try:
        with pytest.raises(httpx.ConnectError) as failed:
            client(retry, "POST", url)
    finally:
        sock.close()
    assert retry.retries == 2
    assert fw.gave_up(failed.value) is not None
    assert any("gave up after 3 attempt(s)" in note for note in failed.value.__notes__)


def test_each_attempt_waits_no_longer_than_the_deadline(upstream: Upstream, client: Send) -> None:
    started = time.monotonic()
    assert client(_retry(), "GET", upstream.url + "/thing").status_code == 200
    answered = time.monotonic() - started  # the same call, answered at once: the baseline
    upstream.reset()
    upstream.delay = 1.0
    with StoodStill() as stood:
        started = time.monotonic()
        with fw.deadline(0.3), pytest.raises(httpx.ReadTimeout):
            client(_retry(), "GET", upstream.url + "/thing")
        took = time.monotonic() - started
    # the deadline and a round trip, plus what this process (client and upstream threads)
    # stood still meanwhile; an attempt that waited for the upstream's 1 s is far past it
    bound = 1.2 * 0.3 + answered + stood.seconds
    print(f"\ndeadline 0.3 s: {took:.3f}s (bound {bound:.3f}s, stood still {stood.seconds:.3f}s)")
    assert took < bound, (took, bound)
    assert int(upstream.headers[0]["x-request-deadline"]) <= 290  # 300 ms minus the margin


def test_a_passed_deadline_sends_nothing(upstream: Upstream, client: Send) -> None:
    with fw.deadline(0.0), pytest.raises(fw.TimeoutExceeded):
        client(None, "GET", upstream.url + "/thing")
    assert upstream.calls == 0


def test_item4_a_passed_deadline_still_answers_from_the_resources_fallback(
    upstream: Upstream, client: Send
) -> None:
    """Issue 19, item 4: a request whose deadline passed before it was sent is answered by its
    resource's fallback (nothing is sent, the breaker and the retry never see it, the meter
    counts a timeout answered by the fallback); without a fallback it still raises."""
    registry = Registry(
        {
            "resources": {
                "things": {
                    "circuit_breaker": {"minimum_calls": 1, "failure_rate": 0.5},
                    "retry": {"attempts": 3, "backoff": {"kind": "none"}},
                    "fallback": {"value": {"items": []}},
                },
                "bare": {"retry": {"attempts": 3, "backoff": {"kind": "none"}}},
            }
        }
    )
    things = registry.get("things")
    with fw.deadline(0.0):
        answer = client(None, "GET", upstream.url + "/thing", options={"routes": {"*": things}})
    assert upstream.calls == 0
    assert answer.status_code == 200
    assert answer.json() == {"items": []}
    assert answer.headers["x-degraded"] == "things.fallback; reason=timeout"
    assert things.meter is not None and things.breaker is not None and things.retry is not None
    assert things.meter.read_both()[("timeout", "fallback")] == 1
    assert things.breaker.metrics().calls == 0  # the dependency did nothing: nothing to count
    assert things.retry.calls == 0
    bare = registry.get("bare")
    with fw.deadline(0.0), pytest.raises(fw.TimeoutExceeded, match="before the request was sent"):
        client(None, "GET", upstream.url + "/thing", options={"routes": {"*": bare}})
    assert upstream.calls == 0
    assert bare.meter is not None
    assert bare.meter.read_both()[("timeout", "error")] == 1


def test_early_shedding_by_the_reported_admission_level(upstream: Upstream, client: Send) -> None:
    upstream.script = [(200, {"X-Admission-Level": "2:10"})] * 3

    async def both() -> tuple[httpx.Response, BaseException | None]:
        transport = AsyncResilientTransport()
        async with httpx.AsyncClient(transport=transport) as c:
            with priority(2, 5):
                first = await c.get(upstream.url + "/thing")
                admitted = await c.get(upstream.url + "/thing")
            try:
                with priority(3, 0):
                    await c.get(upstream.url + "/thing")
            except fw.OverloadedError as exc:
                return admitted, exc
            return first, None

    admitted, refused = asyncio.run(both())
    assert admitted.status_code == 200
    assert isinstance(refused, fw.OverloadedError)
    assert upstream.calls == 2  # the low-priority request never left the client
    assert upstream.headers[0]["x-request-priority"] == "2:5"


def test_routes_pick_registry_resources(upstream: Upstream) -> None:
    registry = Registry(
        {
            "resources": {
                "things": {"retry": {"attempts": 2, "backoff": {"kind": "none"}}},
                "other": {"retry": {"attempts": 1}},
            }
        }
    )
    upstream.script = [(500, {})]
    transport = ResilientTransport(registry=registry, routes={"/thing": "things", "*": "other"})
    with httpx.Client(transport=transport) as c:
        assert c.get(upstream.url + "/thing").status_code == 200
    retry = registry.get("things").retry
    assert retry is not None
    assert retry.retries == 1


def test_a_fallback_value_comes_back_as_a_degraded_response(upstream: Upstream) -> None:
    policy = fw.Pipeline(fw.Fallback(value={"items": []}, name="things.fallback"), _retry())
    upstream.script = [(500, {})] * 3
    with httpx.Client(transport=ResilientTransport(policy=policy)) as c:
        answer = c.get(upstream.url + "/thing")
    assert answer.status_code == 200
    assert answer.json() == {"items": []}
    assert answer.headers["x-degraded"] == "things.fallback; reason=upstream_5xx"


def test_fault_transport_injects_before_a_real_upstream(upstream: Upstream) -> None:
    faults = FaultTransport([Fault.connect(), Fault.answer(503, retry_after=0), None])
    retry = _retry(retry_overload=True)
    with httpx.Client(transport=ResilientTransport(faults, policy=retry)) as c:
        assert c.get(upstream.url + "/thing").status_code == 200
    assert faults.faults.injected == 2
    assert upstream.calls == 1
