"""The wire format, the outbound core and the inbound guard core: pure, no network, fake clock."""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import floodwall as fw
from floodwall.adaptive import AdaptiveLimiter, FixedLimit, LoadShedder, QueueingTimeAdmission
from floodwall.integrations import _wire as wire
from floodwall.integrations._inbound import (
    Admission,
    Captured,
    Inbound,
    InboundGuard,
    RateLimit,
    Refusal,
    by_header,
    client_ip,
    current_admission,
)
from floodwall.integrations._outbound import (
    AdmissionLevels,
    Outbound,
    _AttemptTimeoutError,
    _ConnectError,
    _StatusError,
    _UnretryableError,
)
from floodwall.ratelimit import GCRA

# -- the wire format ----------------------------------------------------------------------------


def test_deadline_is_whole_milliseconds_rounded_down() -> None:
    assert wire.format_deadline(1.9999) == "1999"
    assert wire.format_deadline(-0.5) == "0"
    assert wire.parse_deadline("1500") == 1.5
    assert wire.parse_deadline("12.5") == 0.0125
    for bad in (None, "", "soon", "-1", "nan", str(10**12)):
        assert wire.parse_deadline(bad) is None


@given(st.floats(min_value=0, max_value=86_000, allow_nan=False))
def test_deadline_round_trip_never_promises_more_time(seconds: float) -> None:
    parsed = wire.parse_deadline(wire.format_deadline(seconds))
    assert parsed is not None
    assert seconds - 0.001 <= parsed <= seconds


@given(st.floats(min_value=0, max_value=10**7, allow_nan=False))
def test_grpc_timeout_round_trip(seconds: float) -> None:
    text = wire.format_grpc_timeout(seconds)
    assert len(text) <= 9
    parsed = wire.parse_grpc_timeout(text)
    assert parsed is not None
    assert parsed <= seconds + 1e-9
    assert parsed >= seconds * (1 - 1e-5) - 1e-8  # 8 digits of the finest unit that fits


def test_grpc_timeout_parsing() -> None:
    assert wire.parse_grpc_timeout("250m") == 0.25
    assert wire.parse_grpc_timeout(b"2S") == 2.0
    assert wire.parse_grpc_timeout("1H") == 3600.0
    for bad in (None, "", "m", "123456789S", "1x", "-1S"):
        assert wire.parse_grpc_timeout(bad) is None


def test_attempt_pushback_and_levels() -> None:
    assert wire.parse_attempt("3") == 3
    assert [wire.parse_attempt(v) for v in (None, "1", "0", "x")] == [None] * 4
    assert wire.parse_pushback("-1") == -1.0
    assert wire.parse_pushback("garbage") == -1.0  # as gRPC reads it: do not retry
    assert wire.parse_pushback("1500") == 1.5
    assert wire.parse_pushback(None) is None
    assert wire.format_level((3, 17)) == "3:17"
    assert wire.parse_level("3:17") == (3, 17)
    assert [wire.parse_level(v) for v in (None, "3", "a:b", "-1:2")] == [None] * 4


def test_request_start_units_are_told_apart() -> None:
    now = 1_700_000_010.0
    assert wire.parse_request_start("t=1700000000", now) == pytest.approx(10.0)
    assert wire.parse_request_start("1700000000500", now) == pytest.approx(9.5)
    assert wire.parse_request_start("t=1700000009000000", now) == pytest.approx(1.0)
    assert wire.parse_request_start("t=1800000000", now) == 0.0  # from the future: 0
    assert wire.parse_request_start("abc", now) is None


def test_problem_body_is_rfc9457() -> None:
    body = json.loads(wire.problem(429, "rate_limited", "too many", retry_after=1.23456))
    assert body == {
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": "too many",
        "kind": "rate_limited",
        "retry_after": 1.235,
    }
    typed = json.loads(wire.problem(503, "circuit_open", "open", type_base="https://x/p/"))
    assert typed["type"] == "https://x/p/circuit-open"
    assert wire.rejection_status(fw.CircuitOpenError("b", fw.CircuitState.OPEN, 1.0)) == 503
    assert wire.rejection_status(fw.TimeoutExceeded("t", 1.0)) == 504
    assert wire.rejection_status(fw.DuplicateInFlightError("i", "busy", 1.0)) == 409


def test_priority_scope_nests_and_validates() -> None:
    assert wire.current_priority() is None
    with wire.priority(2, 7) as level:
        assert level == (2, 7) == wire.current_priority()
        with wire.priority(0):
            assert wire.current_priority() == (0, 0)
        assert wire.current_priority() == (2, 7)
    assert wire.current_priority() is None
    with pytest.raises(ValueError, match="business must be an integer >= 0"):
        wire.priority(-1)


# -- the outbound core ------------------------------------------------------------------------


def _headers(**values: str) -> Any:
    lower = {k.replace("_", "-").lower(): v for k, v in values.items()}
    return lower.get


def test_routes_most_specific_first() -> None:
    a, b, c, d = (fw.Retry(n, budget=None) for n in "abcd")
    core = Outbound(
        d, routes={"api.example": a, "api.example/v2/": b, "api.example:8443": c, "*": d}
    )
    assert core.resolve("api.example", None, "/v1/x") is a
    assert core.resolve("API.example", None, "/v2/x") is b
    assert core.resolve("api.example", 8443, "/v2/x") is c
    assert core.resolve("other", None, "/") is d


def test_routes_naming_resources_need_a_registry() -> None:
    with pytest.raises(fw.ConfigError, match="no registry"):
        Outbound(routes={"x": "payments"})


def test_a_get_failure_is_retryable_a_post_failure_is_not() -> None:
    core = Outbound()
    get = core.begin("GET", "svc", 80, "/")
    post = core.begin("POST", "svc", 80, "/")
    keyed = core.begin("POST", "svc", 80, "/", key="k")
    assert get.retryable and not post.retryable and keyed.retryable
    failure = get.check(503, _headers(retry_after="2"), "answer")
    assert isinstance(failure, _StatusError)
    assert failure.status_code == 503 and failure.retry_after == 2.0
    assert isinstance(post.check(503, _headers(), "answer"), _UnretryableError)
    assert get.check(404, _headers(), "answer") is None  # a business answer passes through
    assert isinstance(post.connect_error(OSError()), _ConnectError)  # nothing was sent
    assert isinstance(post.timeout_error(OSError()), _UnretryableError)
    assert isinstance(get.timeout_error(OSError()), _AttemptTimeoutError)


def test_negative_pushback_is_final_and_positive_pushback_waits() -> None:
    call = Outbound().begin("GET", "svc", None, "/")
    final = call.check(502, _headers(x_retry_pushback_ms="-1"), "answer")
    assert isinstance(final, _UnretryableError) and final.final
    wait = call.check(503, _headers(x_retry_pushback_ms="2500", retry_after="1"), "answer")
    assert isinstance(wait, _StatusError) and wait.retry_after == 2.5


def test_wire_headers_carry_deadline_marker_priority_and_key(clock: fw.FakeClock) -> None:
    call = Outbound(margin=0.05).begin("POST", "svc", None, "/")
    assert call.headers() == []
    with (
        fw.deadline(1.0, clock=clock),
        fw.retry_marker(2, "me"),
        wire.priority(1, 3),
        fw.idempotency_key("k"),
    ):
        keyed = Outbound(margin=0.05).begin("POST", "svc", None, "/")
        clock.advance(0.25)
        assert dict(keyed.headers()) == {
            "X-Request-Deadline": "700",
            "X-Retry-Attempt": "2",
            "X-Request-Priority": "1:3",
            "Idempotency-Key": "k",
        }
        assert keyed.attempt_timeout() == pytest.approx(0.75)
        assert keyed.retryable


def test_the_policy_sees_failures_and_the_caller_gets_the_answer() -> None:
    retry = fw.Retry("svc", attempts=3, backoff=fw.backoff.NoBackoff(), budget=None)
    call = Outbound(retry).begin("GET", "svc", None, "/")
    answers = iter([500, 502, 500])

    def attempt() -> str:
        status = next(answers)
        failure = call.check(status, _headers(), f"answer {status}")
        if failure is not None:
            raise failure
        return "ok"

    hop = wire.Hop()
    token = wire._HOP.set(hop)
    try:
        assert call.run(attempt) == "answer 500"
    finally:
        wire._HOP.reset(token)
    assert retry.retries == 2
    assert hop.final  # retried below: a failure answer upstream will say so


def test_a_passed_deadline_refuses_before_sending(clock: fw.FakeClock) -> None:
    call = Outbound().begin("GET", "svc", None, "/")
    with fw.deadline(0.0, clock=clock), pytest.raises(fw.TimeoutExceeded):
        call.run(lambda: pytest.fail("sent"))


def test_admission_levels_expire(clock: fw.FakeClock) -> None:
    levels = AdmissionLevels(ttl=1.0, clock=clock)
    levels.update("svc", (1, 10))
    levels.check("svc", (1, 10))
    with pytest.raises(fw.OverloadedError, match="below the admission level 1:10"):
        levels.check("svc", (1, 11))
    clock.advance(1.0)
    levels.check("svc", (5, 0))  # forgotten: ask the server again


# -- the inbound guard core -------------------------------------------------------------------


def _request(
    method: str = "GET", path: str = "/", client: str = "10.0.0.1", **headers: str
) -> Inbound:
    lower = {k.replace("_", "-").lower(): v for k, v in headers.items()}
    return Inbound(method, path, lower, client)


def test_rate_limit_refusal_carries_headers_and_problem(clock: fw.FakeClock) -> None:
    guard = InboundGuard(
        limits=[RateLimit(GCRA("2/s", clock=clock), key="ip")], rate_limit_headers=True, clock=clock
    )
    first = guard.admit(_request())
    assert isinstance(first, Admission)
    assert dict(first.rate_headers)["RateLimit-Remaining"] == "1"
    assert isinstance(guard.admit(_request()), Admission)
    refused = guard.admit(_request())
    assert isinstance(refused, Refusal)
    headers = dict(refused.headers)
    assert refused.status == 429
    assert headers["Retry-After"] == "1"
    assert headers["RateLimit-Limit"] == "2" and headers["RateLimit-Remaining"] == "0"
    assert headers["Content-Type"] == "application/problem+json"
    problem = json.loads(refused.body)
    assert problem["kind"] == "rate_limited"
    assert problem["detail"].endswith("rate limit of 2 per 1s exceeded (retry after 0.500s)")
    assert isinstance(guard.admit(_request(client="10.0.0.2")), Admission)  # another key
    clock.advance(0.5)
    assert isinstance(guard.admit(_request()), Admission)


def test_rate_limits_match_routes_and_methods() -> None:
    limit = RateLimit("1/s", route="/api/*", methods=["post"])
    assert limit.matches("POST", "/api/orders")
    assert not limit.matches("GET", "/api/orders")
    assert not limit.matches("POST", "/health")
    exact = RateLimit("1/s", route="/login")
    assert exact.matches("GET", "/login") and not exact.matches("GET", "/login/x")
    with pytest.raises(fw.ConfigError, match="key must be"):
        RateLimit("1/s", key="cookie")


def test_client_ip_trusts_only_the_configured_proxies() -> None:
    key = client_ip(["10.0.0.0/8"])
    via_proxy = _request(client="10.1.1.1", x_forwarded_for="198.51.100.1, 10.2.2.2")
    assert key(via_proxy) == "198.51.100.1"
    direct = _request(client="192.0.2.9", x_forwarded_for="198.51.100.1")
    assert key(direct) == "192.0.2.9"
    assert client_ip()(via_proxy) == "10.1.1.1"
    assert by_header("X-Api-Key")(_request(x_api_key="abc")) == "abc"


def test_deadline_and_marker_are_set_for_the_handler(clock: fw.FakeClock) -> None:
    guard = InboundGuard(clock=clock, max_deadline=5.0)
    admitted = guard.admit(_request(x_request_deadline="9000", x_retry_attempt="2"))
    assert isinstance(admitted, Admission)
    with admitted:
        assert fw.remaining() == pytest.approx(5.0)  # capped at max_deadline
        marker = fw.current_retry()
        assert marker is not None and marker.attempt == 2
        assert current_admission() is admitted
    assert fw.remaining() is None and fw.current_retry() is None
    assert current_admission() is None
    expired = guard.admit(_request(x_request_deadline="0"))
    assert isinstance(expired, Refusal) and expired.status == 504


def test_default_deadline_applies_without_a_header(clock: fw.FakeClock) -> None:
    admitted = InboundGuard(deadline=3.0, clock=clock).admit(_request())
    assert isinstance(admitted, Admission)
    assert admitted.remaining() == pytest.approx(3.0)


def test_shedding_refuses_and_tickets_close_by_status(clock: fw.FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(1), clock=clock)
    guard = InboundGuard(shedder=LoadShedder(limiter, clock=clock), clock=clock)
    first = guard.admit(_request())
    assert isinstance(first, Admission)
    refused = guard.admit(_request())
    assert isinstance(refused, Refusal)
    assert refused.status == 503 and dict(refused.headers)["Retry-After"] == "1"
    first.close(200)
    assert limiter.inflight == 0
    again = guard.admit(_request())
    assert isinstance(again, Admission)
    again.close(error=fw.TimeoutExceeded("x", 1.0))
    assert limiter.inflight == 0


def test_dagor_level_rides_on_answers_and_pushback_on_failures(clock: fw.FakeClock) -> None:
    guard = InboundGuard(shedder=LoadShedder(QueueingTimeAdmission(clock=clock), clock=clock))
    admitted = guard.admit(_request(x_request_priority="1:2"))
    assert isinstance(admitted, Admission)
    assert admitted.priority == (1, 2)
    with admitted:
        assert wire.current_priority() == (1, 2)
        hop = wire.current_hop()
        assert hop is not None
        hop.final = True
    assert dict(admitted.response_headers(200)) == {"X-Admission-Level": "63:127"}
    assert dict(admitted.response_headers(502))["X-Retry-Pushback-Ms"] == "-1"


def _idempotent(
    world: str, guard: InboundGuard, request: Inbound, body: bytes, produce: Callable[[], Captured]
) -> tuple[Captured, bool] | Refusal:
    """``guard.idempotent`` in a thread, or ``guard.idempotent_async`` in a task."""
    if world == "thread":
        return guard.idempotent(request, body, produce)

    async def produce_async() -> Captured:
        await asyncio.sleep(0)
        return produce()

    return asyncio.run(guard.idempotent_async(request, body, produce_async))


@pytest.mark.parametrize("world", ["thread", "task"])
def test_idempotent_answers_are_stored_replayed_and_refused(
    clock: fw.FakeClock, world: str
) -> None:
    guard = InboundGuard(
        idempotency=fw.Idempotency("memory://", fingerprint=str, clock=clock), clock=clock
    )
    request = _request("POST", "/orders", idempotency_key="k1")
    assert guard.idempotency_key(request) == "k1"
    assert guard.idempotency_key(_request("GET", idempotency_key="k1")) is None
    runs: list[int] = []

    def produce() -> Captured:
        runs.append(1)
        return Captured(201, [("Content-Length", "2"), ("X-Order", "7")], b"ok")

    first = _idempotent(world, guard, request, b"{}", produce)
    again = _idempotent(world, guard, request, b"{}", produce)
    assert not isinstance(first, Refusal) and not isinstance(again, Refusal)
    assert first[1] is False and again[1] is True
    assert again[0].body == b"ok" and again[0].headers == [("X-Order", "7")]
    other = _idempotent(world, guard, request, b"{other}", produce)
    assert isinstance(other, Refusal) and other.status == 422
    assert len(runs) == 1


@pytest.mark.parametrize("world", ["thread", "task"])
def test_idempotent_failures_are_not_stored(clock: fw.FakeClock, world: str) -> None:
    guard = InboundGuard(
        idempotency=fw.Idempotency("memory://", fingerprint=str, clock=clock), clock=clock
    )
    request = _request("POST", "/orders", idempotency_key="k2")
    statuses = iter([503, 200])

    def produce() -> Captured:
        return Captured(next(statuses), [], b"")

    first = _idempotent(world, guard, request, b"", produce)
    second = _idempotent(world, guard, request, b"", produce)
    assert not isinstance(first, Refusal) and first[0].status == 503
    assert not isinstance(second, Refusal) and second[0].status == 200 and not second[1]


def test_shells_decode_only_the_headers_the_guard_reads() -> None:
    listed = InboundGuard(limits=[RateLimit("1/s", key="header:X-Api-Key")])
    assert listed.wanted_headers is not None
    assert {"x-api-key", "x-request-deadline"} <= listed.wanted_headers
    trusted = InboundGuard(limits=[RateLimit("1/s", key="ip", trusted_proxies=["10.0.0.0/8"])])
    assert trusted.wanted_headers is not None
    assert "x-forwarded-for" in trusted.wanted_headers
    unknown = InboundGuard(limits=[RateLimit("1/s", key=lambda request: request.path)])
    assert unknown.wanted_headers is None


def test_a_priority_function_may_list_the_headers_it_reads() -> None:
    def tier(request: Inbound) -> tuple[int, int] | None:
        return (0, 1) if request.headers.get("x-tier") == "gold" else None

    assert InboundGuard(priority=tier).wanted_headers is None  # unlisted: every header
    tier.headers = ("x-tier",)  # type: ignore[attr-defined]
    listed = InboundGuard(priority=tier)
    assert listed.wanted_headers is not None
    assert {"x-tier", "x-request-deadline"} <= listed.wanted_headers
    admitted = listed.admit(Inbound("GET", "/", {"x-tier": "gold"}))
    assert not isinstance(admitted, Refusal) and admitted.priority == (0, 1)


def test_guard_options_are_validated() -> None:
    with pytest.raises(fw.ConfigError, match="deadline must be"):
        InboundGuard(deadline=math.inf)
    with pytest.raises(fw.ConfigError, match="limits must be RateLimit"):
        InboundGuard(limits=["10/s"])  # type: ignore[list-item]


# -- the pytest plugin ------------------------------------------------------------------------


def test_no_backoff_skips_waits_but_keeps_decisions(no_backoff: Any) -> None:
    retry = fw.Retry("r", attempts=3, budget=None, backoff=fw.backoff.Fixed(5.0))
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "ok"

    assert retry.call(flaky) == "ok"
    assert no_backoff.delays == [5.0, 5.0]


def test_plugin_registers_fixtures_and_the_command_line_switch(tmp_path: Path) -> None:
    test = tmp_path / "test_plugin_use.py"
    test.write_text(
        textwrap.dedent(
            """
            import floodwall as fw

            def test_fake_clock(fake_clock):
                assert isinstance(fake_clock, fw.FakeClock)
                assert fake_clock.monotonic() == 1000.0

            def test_switch():
                retry = fw.Retry("r", attempts=2, budget=None, backoff=fw.backoff.Fixed(60.0))
                calls = []
                def flaky():
                    calls.append(1)
                    if len(calls) == 1:
                        raise ConnectionError("down")
                    return "ok"
                assert retry.call(flaky) == "ok"  # would sleep 60 s without the switch
            """
        )
    )
    registered = any(
        ep.value.startswith("floodwall.testing")
        for ep in importlib.metadata.entry_points(group="pytest11")
    )
    plugin = [] if registered else ["-p", "floodwall.testing"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *plugin,
            "--floodwall-no-backoff",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "-c",
            "/dev/null",
            str(test),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_import_floodwall_and_the_guards_needs_no_framework() -> None:
    frameworks = ("httpx", "aiohttp", "requests", "grpc", "starlette", "fastapi", "flask")
    code = (
        "import sys, floodwall, floodwall.asgi, floodwall.wsgi, floodwall.integrations; "
        f"loaded = [m for m in {frameworks!r} if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "module",
    ["httpx", "aiohttp", "requests", "grpc", "asgi", "wsgi", "testing", "integrations"],
)
def test_public_modules_export_what_they_promise(module: str) -> None:
    loaded = importlib.import_module(f"floodwall.{module}")
    for name in loaded.__all__:
        assert getattr(loaded, name) is not None, name


def test_the_call_record_is_the_innermost_of_admissions_and_call_contexts() -> None:
    guard = InboundGuard()
    first, second = guard.admit(_request()), guard.admit(_request())
    assert isinstance(first, Admission)
    assert isinstance(second, Admission)
    assert fw.current_call() is None
    with fw.call_context() as outside:
        with first:
            assert fw.current_call() is first.call  # admitted inside: the request's record
            with fw.call_context() as inside:
                assert fw.current_call() is inside
                with second:
                    assert fw.current_call() is second.call
                assert fw.current_call() is inside
            assert fw.current_call() is first.call
            fw.Fallback(1, name="fb").call(_fail)
            assert first.call.degraded_by == "fb"
            assert first.response_headers(200) == [(wire.DEGRADED, "fb; reason=RuntimeError")]
        assert fw.current_call() is outside
        assert outside.degraded_by is None
    hop = wire.Hop()  # a bare Hop has no call record of its own
    token = wire._HOP.set(hop)
    try:
        with fw.call_context() as opened:
            assert fw.current_call() is opened
        assert fw.current_call() is None
    finally:
        wire._HOP.reset(token)


def _fail() -> int:
    raise RuntimeError("down")


def test_a_call_without_its_own_record_leaves_marks_to_the_request() -> None:
    """``Call.record = False`` (the gateway's, for a resource with nothing answering): no call
    record opened, so what the policy inside sees is the request's, in both worlds."""
    guard = InboundGuard()
    admitted = guard.admit(_request())
    assert isinstance(admitted, Admission)
    seen: list[object] = []

    def attempt() -> int:
        seen.append(fw.current_call())
        return 1

    async def attempt_async() -> int:
        return attempt()

    policy = fw.Pipeline(fw.Retry(attempts=1), name="recs")
    with admitted:
        own = Outbound(policy).begin("GET", "recs", None, "/")
        assert own.run(attempt) == 1
        quiet = Outbound(policy).begin("GET", "recs", None, "/")
        quiet.record = False
        assert quiet.run(attempt) == 1
        assert asyncio.run(_run_async(quiet, attempt_async)) == 1
        # a degradation noted inside (a sampled drop's, say) lands on the request's record
        marked = Outbound(fw.Fallback(2, name="fb")).begin("GET", "recs", None, "/")
        marked.record = False
        assert marked.run(_fail) == 2
    assert seen == [own, admitted.call, admitted.call]
    assert marked.degraded_by is None
    assert (admitted.call.degraded_by, admitted.call.degraded_reason) == ("fb", "RuntimeError")


async def _run_async(call: Any, attempt: Callable[[], Any]) -> Any:
    return await call.run_async(attempt)


def test_one_degraded_vocabulary_formats_and_parses_back() -> None:
    """Inbound middleware, outbound clients and the gateway write ``X-Degraded`` alike."""
    assert wire.DEGRADED == "X-Degraded"
    assert wire.format_degraded("reviews.fallback", "timeout") == "reviews.fallback; reason=timeout"
    assert (
        wire.format_degraded("cache", "circuit_open", 12.7) == "cache; reason=circuit_open; age=12"
    )
    assert wire.format_degraded("posts") == "posts"
    assert wire.parse_degraded(b"cache; reason=circuit_open; age=12, posts") == [
        ("cache", {"reason": "circuit_open", "age": "12"}),
        ("posts", {}),
    ]
    assert wire.parse_degraded(None) == wire.parse_degraded("") == []
    from floodwall.gateway.fallbacks import DEGRADED_HEADER, degraded_value

    assert DEGRADED_HEADER == wire.DEGRADED
    assert degraded_value("static", "upstream_5xx") == "static; reason=upstream_5xx"


def test_an_outbound_fallback_answer_names_the_fallback_and_why() -> None:
    """A client's fallback value is marked like a server's, and the request being served (the
    call around the outbound call) learns it was degraded too."""
    policy: fw.Fallback[list[str]] = fw.Fallback(value=[], name="recommendations.fallback")
    with fw.call_context() as served:
        call = Outbound(policy).begin("GET", "recs", None, "/top")
        assert call.run(_fail) == []
    assert call.degraded_value() == "recommendations.fallback; reason=RuntimeError"
    assert (served.degraded_by, served.degraded_reason) == (
        "recommendations.fallback",
        "RuntimeError",
    )
    plain = Outbound(fw.Pipeline(fw.Retry(attempts=1), name="recs")).begin("GET", "r", None, "/")
    assert plain.run(lambda: 1) == 1
    assert not plain.degraded and plain.degraded_by is None
    assert plain.degraded_value() == "recs"  # a policy's own value, not a Fallback's: its name
