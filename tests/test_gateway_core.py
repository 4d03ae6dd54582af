"""The gateway's pure parts: routing, outlier detection, health thresholds, balancing,
header rules, the last-good cache and the dashboard's arithmetic. Time is a FakeClock."""

from __future__ import annotations

import collections
import random
from types import SimpleNamespace
from typing import Any

import pytest
from multidict import CIMultiDict

from floodwall import FakeClock, Retry, RetryBudget, deadline
from floodwall._core.window import latency_bin
from floodwall.backoff import Fixed
from floodwall.gateway._headers import (
    client_address,
    connection_tokens,
    forwarded_element,
    forwarding_headers,
    new_request_id,
    trust_check,
    valid_request_id,
)
from floodwall.gateway.admin import admin_token
from floodwall.gateway.config import (
    CacheFallbackConfig,
    HealthCheckConfig,
    MatchConfig,
    OutlierConfig,
    UpstreamConfig,
)
from floodwall.gateway.dashboard import frame, histogram_percentile, merge_status
from floodwall.gateway.fallbacks import (
    Answer,
    LastGood,
    cacheable_request,
    cacheable_response,
    degraded_value,
)
from floodwall.gateway.proxy import _try_elsewhere
from floodwall.gateway.routing import Matcher, Router, normalise_host, unsafe_path
from floodwall.gateway.upstream import HealthTracker, OutlierDetector, UpstreamPool

# -- routing ----------------------------------------------------------------------------------


def _router(*matches: dict[str, object]) -> Router[int]:
    return Router([(Matcher.compile(MatchConfig(**m)), i) for i, m in enumerate(matches)])


def test_first_matching_route_wins() -> None:
    router = _router(
        {"host": "*.example.com", "path_prefix": "/api"},
        {"path_regex": r"/users/(?P<user>\d+)/orders"},
        {"path": "/exact", "methods": "get"},
        {"path_prefix": "/h", "headers": {"x-canary": "*"}},
        {"path_prefix": "/api", "prefix_boundary": True},
    )
    empty: dict[str, str] = {}
    assert router.match("GET", "eu.example.com", "/api/x", empty) == (0, {})
    assert router.match("GET", "example.com", "/api/x", empty) == (4, {})
    assert router.match("GET", "a", "/apis", empty) is None  # segment boundary
    assert router.match("GET", "a", "/users/7/orders", empty) == (1, {"user": "7"})
    assert router.match("POST", "a", "/exact", empty) is None
    assert router.match("GET", "a", "/exact", empty) == (2, {})
    assert router.match("GET", "a", "/h", CIMultiDict({"X-Canary": "yes"})) == (3, {})
    assert router.match("GET", "a", "/h", empty) is None


def test_a_first_route_asking_only_a_prefix_matches_as_the_loop_would() -> None:
    empty: dict[str, str] = {}
    catch_all = _router({"path_prefix": "/"}, {"path_prefix": "/x"})
    assert catch_all.match("GET", "a", "/x/y", empty) == (0, {})
    assert catch_all.match("OPTIONS", "a", "*", empty) is None  # not under "/"
    bounded = _router({"path_prefix": "/api", "prefix_boundary": True}, {"path_prefix": "/"})
    assert bounded.match("GET", "a", "/api/x", empty) == (0, {})
    assert bounded.match("GET", "a", "/apis", empty) == (1, {})
    loose = _router({"path_prefix": "/api", "prefix_boundary": False}, {"path_prefix": "/"})
    assert loose.match("GET", "a", "/apis", empty) == (0, {})
    posts = _router({"path_prefix": "/", "methods": "post"}, {"path_prefix": "/"})
    assert posts.match("GET", "a", "/x", empty) == (1, {})
    assert posts.match("POST", "a", "/x", empty) == (0, {})
    assert _router().match("GET", "a", "/", empty) is None


@pytest.mark.parametrize(
    ("host", "normal"),
    [
        ("API.Example.com:8080", "api.example.com"),
        ("[::1]:80", "::1"),
        ("x.com.", "x.com"),
        ("x.com:", "x.com"),  # an empty port is the default one (RFC 3986 §3.2.3)
        ("", ""),
    ],
)
def test_hosts_are_normalised(host: str, normal: str) -> None:
    assert normalise_host(host) == normal


@pytest.mark.parametrize(
    ("path", "raw", "unsafe"),
    [
        ("/a/b", "/a/b?q=1", False),
        ("/a/../b", "/a/../b", True),
        ("/a/./b", "/a/./b", True),
        ("/a//b", "/a//b", True),
        ("/a/..", "/a/%2e%2e", True),
        ("/a/b", "/a%2Fb", True),
        ("/a\\b", "/a%5Cb", True),
        ("/a%", "/a%", True),  # (nginx-tests http_uri.t 'percent')
        ("/a%1", "/a%1", True),  # ('percent digit')
        ("/a%zz", "/a%zz", True),
        ("/a b", "/a%20b?q=%", False),  # (a '%' in the query is the upstream's business)
        ("/.well-known/x", "/.well-known/x", False),
    ],
)
def test_unsafe_paths(path: str, raw: str, unsafe: bool) -> None:
    assert (unsafe_path(path, raw) is not None) is unsafe


# -- outlier detection and health ---------------------------------------------------------------


def test_consecutive_failures_eject_for_a_growing_time() -> None:
    config = OutlierConfig(consecutive_5xx=3, consecutive_gateway_failures=2, base_ejection_time=10)
    detector = OutlierDetector(4, config)
    assert detector.max_ejected == 2
    assert detector.record(0, 0.0, 500) is None
    assert detector.record(0, 0.0, 200) is None  # a success resets the streak
    assert [detector.record(0, 1.0, 500) for _ in range(3)][-1] is not None
    assert detector.ejected(0, 5.0) and not detector.ejected(0, 11.1)
    assert detector.record(1, 2.0, None) is None
    why = detector.record(1, 2.0, 503)
    assert why is not None and "gateway failures" in why
    assert detector.record(2, 3.0, None) is None and detector.record(2, 3.0, None) is None  # cap
    assert not detector.ejected(2, 3.0)
    detector.record(0, 12.0, 200)  # back, and answered: off probation
    for _ in range(3):  # endpoint 0 again, right after its return: ejected for 2 × 10 s
        detector.record(0, 12.0, 500)
    assert detector.ejected(0, 31.0) and not detector.ejected(0, 32.1)


def test_ejection_count_decays_after_quiet_time() -> None:
    detector = OutlierDetector(2, OutlierConfig(consecutive_5xx=1, base_ejection_time=10))
    detector.record(0, 0.0, 500)  # 10 s
    detector.record(0, 10.0, 200)  # back, and answered (off probation)
    detector.record(0, 10.0, 500)  # 20 s
    assert detector.until(0) == 30.0
    detector.record(0, 100.0, 500)  # 70 s quiet: the count decays back to zero first
    assert detector.until(0) == 110.0


def test_an_endpoint_back_from_ejection_is_on_probation_until_it_answers() -> None:
    config = OutlierConfig(consecutive_gateway_failures=3, base_ejection_time=10)
    detector = OutlierDetector(2, config)
    assert [detector.record(0, 0.0, None) for _ in range(3)][-1] is not None
    assert detector.on_probation(0) and detector.probing == 1
    why = detector.record(0, 10.5, None)  # back, and its first failure ejects it again,
    assert why is not None and "again" in why  # for as long as the last time
    assert detector.ejected(0, 20.4) and not detector.ejected(0, 20.6)
    assert detector.record(0, 21.0, 200) is None  # an answer ends the probation
    assert not detector.on_probation(0) and detector.probing == 0
    outcomes = [detector.record(0, 22.0, None) is None for _ in range(3)]
    assert outcomes == [True, True, False]  # three in a row again, then 2 × 10 s out
    assert detector.ejected(0, 41.9) and not detector.ejected(0, 42.1)


def test_a_single_endpoint_is_never_ejected() -> None:
    detector = OutlierDetector(1, OutlierConfig(consecutive_5xx=1))
    assert detector.record(0, 0.0, 500) is None
    assert detector.max_ejected == 0


def test_health_thresholds() -> None:
    tracker = HealthTracker(1, HealthCheckConfig(healthy_threshold=2, unhealthy_threshold=3))
    assert [tracker.record(0, False) for _ in range(3)] == [None, None, False]
    assert tracker.record(0, True) is None
    assert tracker.record(0, False) is None  # the streak restarts
    assert [tracker.record(0, True) for _ in range(2)] == [None, True]
    assert tracker.probe_ok(204) and not tracker.probe_ok(503) and not tracker.probe_ok(None)


# -- balancing ----------------------------------------------------------------------------------


def _pool(balance: str, n: int, clock: FakeClock, **extra: object) -> UpstreamPool:
    config = UpstreamConfig(
        endpoints=tuple(f"http://10.0.0.{i}:80" for i in range(1, n + 1)),
        balance=balance,
        **extra,
    )
    return UpstreamPool("svc", config, clock=clock, rng=random.Random(7))


def test_round_robin_and_retry_avoidance(clock: FakeClock) -> None:
    pool = _pool("round_robin", 3, clock)
    picks = [pool.pick() for _ in range(6)]
    assert [p.index for p in picks if p] == [0, 1, 2, 0, 1, 2]
    first = pool.endpoints[0]
    assert all(pool.pick(avoid=first) is not first for _ in range(10))


def test_power_of_two_choices_prefers_idle_endpoints(clock: FakeClock) -> None:
    pool = _pool("least_request", 4, clock)
    pool.endpoints[0].in_flight = 50
    counts = collections.Counter(p.index for p in (pool.pick() for _ in range(3000)) if p)
    # The busy endpoint wins only when drawn twice (never: draws are distinct).
    assert counts[0] == 0 and min(counts[i] for i in (1, 2, 3)) > 800


def test_ejected_endpoints_leave_and_return(clock: FakeClock) -> None:
    pool = _pool(
        "round_robin", 2, clock, outlier_detection={"consecutive_5xx": 2, "base_ejection_time": 5}
    )
    bad = pool.endpoints[1]
    pool.report(bad, 500)
    pool.report(bad, 500)
    assert {pool.pick() for _ in range(4)} == {pool.endpoints[0]}
    clock.advance(5.01)
    assert {pool.pick() for _ in range(4)} == set(pool.endpoints)
    snapshot = pool.snapshot()
    assert snapshot["ejections"] == 1 and snapshot["available"] == 2


def test_an_endpoint_on_probation_takes_one_request_at_a_time(clock: FakeClock) -> None:
    outliers = {"consecutive_gateway_failures": 2, "base_ejection_time": 5}
    pool = _pool("round_robin", 2, clock, outlier_detection=outliers)
    good, bad = pool.endpoints
    pool.report(bad, None, "timeout")
    pool.report(bad, None, "timeout")
    clock.advance(5.01)
    assert {pool.pick() for _ in range(4)} == {good, bad}  # back, nothing in flight on it
    bad.in_flight = 1  # its probe is out: the others wait for its answer
    assert {pool.pick() for _ in range(4)} == {good}
    pool.report(bad, 200)  # it answered: off probation, its share again
    assert {pool.pick() for _ in range(4)} == {good, bad}


def test_sole_is_the_pick_of_a_pool_of_one_and_none_otherwise(clock: FakeClock) -> None:
    one = _pool("least_request", 1, clock)
    assert one.sole is one.endpoints[0] is one.pick(one.endpoints)
    pool = _pool(
        "round_robin", 2, clock, outlier_detection={"consecutive_5xx": 2, "base_ejection_time": 5}
    )
    assert pool.sole is None
    bad = pool.endpoints[1]
    pool.report(bad, 500)
    pool.report(bad, 500)
    assert pool.sole is None  # one left, but due back: pick reads the clock
    assert pool.pick() is pool.endpoints[0]
    clock.advance(5.01)
    pool.pick()
    assert pool.sole is None
    for endpoint in pool.endpoints[1:]:
        endpoint.healthy = False
    pool._refresh(clock.monotonic())
    assert pool.sole is pool.endpoints[0] is pool.pick(pool.endpoints)


def test_a_retry_avoids_every_endpoint_it_tried(clock: FakeClock) -> None:
    pool = _pool("least_request", 3, clock)
    first, second, third = pool.endpoints
    assert all(pool.pick([first, second]) is third for _ in range(20))
    assert pool.untried([first, second]) and not pool.untried(pool.endpoints)
    # All tried: any available endpoint again rather than none.
    assert pool.pick(pool.endpoints) in pool.endpoints


def test_every_outcome_counts_against_the_endpoint_by_reason(clock: FakeClock) -> None:
    pool = _pool(
        "round_robin",
        2,
        clock,
        outlier_detection={"consecutive_gateway_failures": 3, "base_ejection_time": 5},
    )
    bad = pool.endpoints[1]
    pool.report(bad, None, "timeout")
    pool.report(bad, 503)
    assert pool.snapshot()["endpoints"][1]["state"] == "failing"
    pool.report(bad, None, "reset")  # third gateway failure in a row: ejected
    shown = pool.snapshot()["endpoints"][1]
    assert shown["state"] == "ejected" and shown["ejected_for"] == 5.0
    assert shown["failures_by_reason"] == {
        "timeout": 1,
        "connect": 0,
        "reset": 1,
        "protocol": 0,
        "5xx": 1,
    }
    assert shown["failures"] == 3 and shown["consecutive_failures"] == 3
    assert shown["last_failure"] == "reset"
    clock.advance(5.01)
    pool.report(bad, 200)  # back, and answering: its run of failures ends
    shown = pool.snapshot()["endpoints"][1]
    assert shown["state"] == "up" and shown["consecutive_failures"] == 0
    assert shown["failures"] == 3 and shown["requests"] == 4


def _refused_for_time(retry: Retry, clock: FakeClock) -> BaseException:
    """The error of a try that hung 0.6 s, which ``retry`` refused to repeat within 1 s."""

    def hangs() -> None:
        clock.advance(0.6)
        raise TimeoutError("no answer")

    with pytest.raises(TimeoutError) as caught:
        retry.call(hangs)
    return caught.value


def test_a_try_elsewhere_needs_the_deadline_to_be_the_retrys_only_objection(
    clock: FakeClock,
) -> None:
    pool = _pool("round_robin", 3, clock)
    budget = RetryBudget(ratio=0.0, min_per_second=0.2, window=10, clock=clock)  # 2 retries
    retry = Retry(attempts=3, backoff=Fixed(0.05), budget=budget, clock=clock)
    policy = SimpleNamespace(retry=retry)
    attempt: Any = SimpleNamespace(failed=True, pool=pool, tried=[pool.endpoints[0]])
    with deadline(1.0, clock=clock):
        error = _refused_for_time(retry, clock)  # 0.4 s left: less than another 0.6 s try
        now = clock.monotonic()
        attempt.failed = False  # a POST that timed out: never sent again
        assert _try_elsewhere(error, attempt, policy, 0, now) == 0
        attempt.failed = True
        assert _try_elsewhere(error, attempt, None, 0, now) == 0  # no retry: no retries
        assert _try_elsewhere(error, attempt, policy, 0, now) == 1  # one try made so far
        attempt.tried = list(pool.endpoints[:2])
        assert _try_elsewhere(error, attempt, policy, 1, now) == 2
        attempt.tried = list(pool.endpoints)
        assert _try_elsewhere(error, attempt, policy, 1, now) == 0  # no endpoint left untried
        attempt.tried = [pool.endpoints[0]]
        assert _try_elsewhere(error, attempt, policy, 2, now) == 0  # attempts=3 all made
        assert _try_elsewhere(error, attempt, policy, 1, now) == 0  # the budget's 2 are spent
        clock.advance(0.395)
        fresh = Retry(attempts=3, backoff=Fixed(0.05), clock=clock)
        assert _try_elsewhere(error, attempt, SimpleNamespace(retry=fresh), 1, now) == 0  # < 10 ms
    other = TimeoutError("no record: the retry never objected to the time")
    assert _try_elsewhere(other, attempt, SimpleNamespace(retry=fresh), 0, now) == 0


def test_no_available_endpoint_is_none(clock: FakeClock) -> None:
    pool = _pool("round_robin", 2, clock, health_check={"path": "/h"})
    for endpoint in pool.endpoints:
        endpoint.healthy = False
    pool._refresh(clock.monotonic())
    assert pool.pick() is None


# -- headers --------------------------------------------------------------------------------------


def test_connection_tokens_and_trust() -> None:
    assert connection_tokens({"connection": "keep-alive, X-Secret"}) == {"keep-alive", "x-secret"}
    trusted = trust_check(["10.0.0.0/8", "192.0.2.1"])
    assert trusted("10.1.2.3") and trusted("192.0.2.1")
    assert not trusted("192.0.2.2") and not trusted(None) and not trusted("nonsense")


def test_client_address_behind_trusted_proxies() -> None:
    trusted = trust_check(["10.0.0.0/8"])
    chain = {"x-forwarded-for": "203.0.113.9, 198.51.100.7, 10.0.0.2"}
    assert client_address("10.0.0.1", chain, trusted) == "198.51.100.7"
    assert client_address("203.0.113.50", chain, trusted) == "203.0.113.50"  # not trusted


def test_forwarding_headers() -> None:
    assert forwarded_element("2001:db8::1", "https", 'a"b') == (
        'for="[2001:db8::1]";proto=https;host="a\\"b"'
    )
    untrusted = dict(
        forwarding_headers(
            {"x-forwarded-for": "1.1.1.1"},
            peer="198.51.100.7",
            client=None,
            trusted=False,
            proto="http",
            host="api",
        )
    )
    assert untrusted["X-Forwarded-For"] == "198.51.100.7"
    assert untrusted["X-Forwarded-Host"] == "api"
    trusted = dict(
        forwarding_headers(
            {"x-forwarded-for": "203.0.113.9", "x-forwarded-proto": "https"},
            peer="10.0.0.1",
            client="203.0.113.9",
            trusted=True,
            proto="http",
            host="api",
            forwarded_all="for=203.0.113.9",
        )
    )
    assert trusted["X-Forwarded-For"] == "203.0.113.9, 10.0.0.1"
    assert trusted["X-Forwarded-Proto"] == "https"
    assert trusted["Forwarded"] == 'for=203.0.113.9, for=10.0.0.1;proto=http;host="api"'
    assert trusted["X-Real-IP"] == "203.0.113.9"


def test_request_ids() -> None:
    first, second = new_request_id(), new_request_id()
    assert first != second and valid_request_id(first)
    assert not valid_request_id("bad id\n") and not valid_request_id("x" * 200)


# -- fallbacks ----------------------------------------------------------------------------------


def test_last_good_cache_is_bounded_and_expires() -> None:
    cache = LastGood(CacheFallbackConfig(ttl=10, max_entries=2, max_body=10, max_bytes=10_000))
    assert cache.put("a", Answer(200, [], b"1"), 0.0)
    assert not cache.put("big", Answer(200, [], b"x" * 11), 0.0)
    cache.put("b", Answer(200, [], b"2"), 1.0)
    cache.get("a", 2.0)  # a is now the most recently used
    cache.put("c", Answer(200, [], b"3"), 3.0)
    assert cache.get("b", 3.0) is None and cache.evictions == 1
    hit = cache.get("a", 9.0)
    assert hit is not None and hit[1] == 9.0
    assert cache.get("a", 10.5) is None  # past its ttl
    small = LastGood(CacheFallbackConfig(max_bytes=40))
    small.put("k1", Answer(200, [], b"x" * 20), 0.0)
    small.put("k2", Answer(200, [], b"y" * 20), 0.0)
    assert len(small) == 1 and small.bytes <= 40


def test_what_may_be_cached() -> None:
    config = CacheFallbackConfig()
    assert cacheable_request("GET", {})
    assert not cacheable_request("POST", {})
    assert not cacheable_request("GET", {"authorization": "Bearer x"})
    assert not cacheable_request("GET", {"cookie": "s=1"})
    assert cacheable_response(200, {"vary": "Accept-Encoding"}, config)
    assert not cacheable_response(200, {"vary": "Cookie"}, config)
    assert not cacheable_response(200, {"set-cookie": "s=1"}, config)
    assert not cacheable_response(200, {"cache-control": "private, max-age=5"}, config)
    assert not cacheable_response(500, {}, config)
    assert degraded_value("cache", "timeout", 12.7) == "cache; reason=timeout; age=12"


# -- dashboard ----------------------------------------------------------------------------------


def _route(
    requests: int, fivexx: int, bins: dict[str, int], state: str = "CLOSED"
) -> dict[str, object]:
    return {
        "upstream": "svc",
        "level": 2,
        "stats": {
            "requests": requests,
            "in_flight": 0,
            "classes": {"2xx": requests - fivexx, "5xx": fivexx},
            "outcomes": {"fallback": 0},
            "bins": bins,
        },
        "breaker": {"state": state, "failure_rate": 0.0},
    }


def test_percentiles_from_bins() -> None:
    fast, slow = latency_bin(0.001), latency_bin(0.1)
    assert histogram_percentile({}, 0.5) is None
    p50 = histogram_percentile({fast: 98, slow: 2}, 0.5)
    p99 = histogram_percentile({fast: 98, slow: 2}, 0.99)
    assert p50 is not None and 0.0009 < p50 < 0.0012
    assert p99 is not None and 0.09 < p99 < 0.12


def test_frames_are_rates_over_the_interval() -> None:
    fast = str(latency_bin(0.002))
    before = {"routes": {"r": _route(100, 0, {fast: 100})}, "upstreams": {}}
    now = {"routes": {"r": _route(300, 50, {fast: 300}, "OPEN")}, "upstreams": {}}
    route = frame(now, before, 2.0, 0.0)["routes"][0]
    assert route["rps"] == 100.0
    assert route["error_rate"] == 0.25
    assert route["breaker"] == "OPEN"
    assert 1.7 < route["p50_ms"] < 2.3
    first = frame(now, None, 1.0, 0.0)["routes"][0]
    assert first["rps"] == 0.0 and first["p50_ms"] is None


def test_merging_workers() -> None:
    one = {"routes": {"r": _route(10, 1, {"5": 10})}, "upstreams": {}, "requests": 10}
    two = {"routes": {"r": _route(5, 0, {"5": 5}, "OPEN")}, "upstreams": {}, "requests": 5}
    merged = merge_status([one, two])
    stats = merged["routes"]["r"]["stats"]
    assert stats["requests"] == 15 and stats["bins"] == {"5": 15}
    assert merged["routes"]["r"]["breaker"]["state"] == "OPEN"
    assert merged["routes"]["r"]["level"] == 2


def _upstream(failures: int, state: str, timeouts: int) -> dict[str, object]:
    endpoint = {
        "url": "http://10.0.0.2:80",
        "state": state,
        "healthy": True,
        "ejected": state == "ejected",
        "in_flight": 1,
        "requests": failures + 10,
        "failures": failures,
        "failures_by_reason": {"timeout": timeouts, "5xx": failures - timeouts},
        "consecutive_failures": 2 if state != "up" else 0,
        "last_failure": "timeout" if timeouts else None,
    }
    return {"balance": "round_robin", "endpoints": [endpoint], "retries_elsewhere": failures}


def test_frames_show_failing_and_ejected_endpoints() -> None:
    before = {"routes": {}, "upstreams": {"u": _upstream(0, "up", 0)}}
    now = {"routes": {}, "upstreams": {"u": _upstream(6, "failing", 4)}}
    (upstream,) = frame(now, before, 2.0, 0.0)["upstreams"]
    (endpoint,) = upstream["endpoints"]
    assert endpoint["state"] == "failing" and endpoint["up"]
    assert endpoint["failures_per_s"] == 3.0
    assert endpoint["failures_by_reason"] == {"timeout": 4, "5xx": 2}
    assert upstream["retries_elsewhere"] == 6
    ejected = {"routes": {}, "upstreams": {"u": _upstream(6, "ejected", 4)}}
    (endpoint,) = frame(ejected, now, 1.0, 0.0)["upstreams"][0]["endpoints"]
    assert endpoint["state"] == "ejected" and not endpoint["up"]
    assert endpoint["failures_per_s"] == 0.0


def test_merging_workers_keeps_the_worst_endpoint_state() -> None:
    one = {"routes": {}, "upstreams": {"u": _upstream(1, "up", 0)}}
    two = {"routes": {}, "upstreams": {"u": _upstream(5, "ejected", 3)}}
    (endpoint,) = merge_status([one, two])["upstreams"]["u"]["endpoints"]
    assert endpoint["state"] == "ejected" and endpoint["ejected"]
    assert endpoint["failures"] == 6
    assert endpoint["failures_by_reason"] == {"timeout": 3, "5xx": 3}
    assert endpoint["consecutive_failures"] == 2 and endpoint["last_failure"] == "timeout"


def test_admin_token_must_be_set_and_long() -> None:
    assert admin_token("T", {"T": "x" * 16}) == "x" * 16
    with pytest.raises(ValueError, match="T is not set"):
        admin_token("T", {})
    with pytest.raises(ValueError, match="shorter than 16"):
        admin_token("T", {"T": "short"})
