"""The rate limiters' shared surface: rates, decisions, shells, policies, headers."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Coroutine
from typing import Any, assert_type

import pytest

import floodwall as fw
from floodwall.ratelimit import (
    GCRA,
    Decision,
    FixedWindow,
    Keyed,
    LeakyBucket,
    Multi,
    Rate,
    RateLimiter,
    SlidingLog,
    SlidingWindowCounter,
    TokenBucket,
    WarmUp,
    parse_rate,
    rate_limit_headers,
)

# -- rates -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [
        ("10/s", 10, 1.0),
        ("5/h", 5, 3600.0),
        ("1/30s", 1, 30.0),
        ("100/10m", 100, 600.0),
        ("5 per hour", 5, 3600.0),
        ("1000/H", 1000, 3600.0),
        ("3/d", 3, 86400.0),
        ("250/ms", 250, 0.001),
        ("0.5/s", 1, 2.0),
        ("2.5/min", 5, 120.0),
    ],
)
def test_rate_strings(text: str, count: int, period: float) -> None:
    rate = parse_rate(text)
    assert rate.count == count
    assert rate.period == pytest.approx(period)


@pytest.mark.parametrize(
    ("value", "count", "period"),
    [(10, 10, 1.0), (10.0, 10, 1.0), (0.5, 1, 2.0), (2.5, 5, 2.0), (1e9, 10**9, 1.0)],
)
def test_rates_per_second(value: float, count: int, period: float) -> None:
    rate = parse_rate(value)
    assert (rate.count, rate.period) == (count, period)
    assert rate.per_second == pytest.approx(value)


def test_rate_round_trips_through_str() -> None:
    for text in ("10/s", "5/h", "1/30s", "100/10m", "7/d"):
        assert str(parse_rate(text)) == text
    assert parse_rate(Rate(3, 2.0)) == Rate(3, 2.0)


@pytest.mark.parametrize(
    "bad", ["", "10", "10/fortnight", "-1/s", "0/s", "x/s", 0, -1.0, math.inf, True, None, "1/0s"]
)
def test_bad_rates_are_refused_loudly(bad: Any) -> None:
    with pytest.raises(fw.ConfigError, match="rate"):
        parse_rate(bad)


def test_bad_options_name_the_parameter() -> None:
    with pytest.raises(fw.ConfigError, match="burst must be an integer >= 0, got -1"):
        TokenBucket("10/s", burst=-1)
    with pytest.raises(fw.ConfigError, match="initial"):
        TokenBucket("10/s", initial=11)
    with pytest.raises(fw.ConfigError, match="max_wait"):
        FixedWindow("10/s", max_wait=-1)
    with pytest.raises(fw.ConfigError, match="warmup"):
        WarmUp("10/s", warmup=0)
    with pytest.raises(fw.ConfigError, match="cold_factor"):
        WarmUp("10/s", warmup=1, cold_factor=1)
    with pytest.raises(fw.ConfigError, match="queue"):
        LeakyBucket("10/s", queue=-1)
    with pytest.raises(fw.ConfigError, match="max_keys"):
        Keyed(FixedWindow("1/s"), max_keys=0)
    with pytest.raises(fw.ConfigError, match="overflow"):
        Keyed(FixedWindow("1/s"), overflow="drop")  # type: ignore[arg-type]
    with pytest.raises(fw.ConfigError, match="Multi needs"):
        Multi()


# -- decisions ---------------------------------------------------------------------------------


def test_decision_is_a_truthy_tuple_with_names() -> None:
    clock = fw.FakeClock()
    limiter = FixedWindow("2/s", clock=clock)
    first = limiter.acquire()
    assert first
    assert first == Decision(True, 1, 1.0, 0.0, 2)
    assert (first.allowed, first.remaining, first.reset_after, first.retry_after, first.limit) == (
        True,
        1,
        1.0,
        0.0,
        2,
    )
    limiter.acquire()
    refused = limiter.acquire()
    assert not refused
    assert refused.retry_after == 1.0
    assert limiter.acquire(cost=3).retry_after == math.inf  # never: more than the limit


def test_peek_consumes_nothing_and_changes_nothing() -> None:
    clock = fw.FakeClock()
    limiter = FixedWindow("2/s", clock=clock)
    clock.advance(0.5)
    assert limiter.peek() == Decision(True, 2, 1.0, 0.0, 2)
    clock.advance(0.25)
    # the peek did not open the window: the first real request does, at 0.75
    assert limiter.acquire() == Decision(True, 1, 1.0, 0.0, 2)


def test_cost_zero_peeks_and_negative_cost_is_refused() -> None:
    limiter = TokenBucket("1/s", clock=fw.FakeClock())
    assert limiter.acquire(cost=0)
    assert limiter.try_acquire()
    with pytest.raises(ValueError, match="cost must be a finite number >= 0"):
        limiter.acquire(cost=-1)
    with pytest.raises(ValueError, match="cost must be a finite number >= 0"):
        limiter.try_acquire(cost=-1)


def test_a_plain_limiter_refuses_keys_and_points_to_keyed() -> None:
    limiter = FixedWindow("1/s")
    with pytest.raises(TypeError, match=r"Keyed\(\.\.\.\)"):
        limiter.acquire("alice")
    with pytest.raises(TypeError, match="key=None only"):
        limiter.try_acquire("alice")


def test_reset_forgets_consumption() -> None:
    limiter = FixedWindow("1/h", clock=fw.FakeClock())
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    limiter.reset()
    assert limiter.try_acquire()


def test_rejections_are_counted_and_emitted() -> None:
    events: list[fw.Event] = []
    limiter = FixedWindow("1/s", clock=fw.FakeClock(), name="api", listeners=[events.append])
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    assert not limiter.acquire(cost=1)
    assert limiter.rejected == 2
    assert [e.kind for e in events] == ["rejected", "rejected"]
    assert events[0].source == "rate_limiter"
    assert events[0].name == "api"
    assert events[0].figures["retry_after"] == 1.0
    assert "FixedWindow('api', 1/s) exceeded" in events[0].reason


def test_every_limiter_describes_itself() -> None:
    clock = fw.FakeClock()
    limiters: list[RateLimiter[Any]] = [
        FixedWindow("5/h", clock=clock),
        SlidingLog("5/h", clock=clock),
        SlidingWindowCounter("5/h", clock=clock),
        TokenBucket("10/s", burst=4, clock=clock),
        GCRA("10/s", burst=4, clock=clock),
        LeakyBucket("10/s", queue=3, clock=clock),
        WarmUp("10/s", warmup=5, clock=clock),
        Multi.of("10/s", "1000/h", clock=clock),
        Keyed(TokenBucket("1/s", clock=clock)),
    ]
    texts = [limiter.describe() for limiter in limiters]
    assert texts[0] == "FixedWindow('fixed_window', 5/h)"
    assert texts[3] == "TokenBucket('token_bucket', 10/s, burst=4)"
    assert texts[5] == "LeakyBucket('leaky_bucket', 10/s, queue=3)"
    assert texts[7].startswith("Multi('multi': SlidingWindowCounter(")
    assert texts[8].startswith("Keyed(TokenBucket(")
    for limiter in limiters:
        assert limiter.try_acquire() in (True, False)


# -- policies ----------------------------------------------------------------------------------


def test_call_admits_or_raises_rate_limited_with_retry_after() -> None:
    clock = fw.FakeClock()
    limiter = TokenBucket("2/s", clock=clock, name="api")
    assert limiter.call(lambda x: x * 2, 21) == 42
    assert limiter.call(lambda: "ok") == "ok"
    with pytest.raises(fw.RateLimitedError) as caught:
        limiter.call(lambda: "no")
    error = caught.value
    assert error.kind == "rate_limited"
    assert error.name == "api"
    assert error.retry_after == pytest.approx(0.5)
    assert "TokenBucket('api', 2/s, burst=1) exceeded" in str(error)


async def test_call_async_and_decorators() -> None:
    clock = fw.FakeClock()
    limiter = FixedWindow("1/s", clock=clock)

    @limiter
    async def fetch(x: int) -> int:
        return x + 1

    assert await fetch(1) == 2
    with pytest.raises(fw.RateLimitedError):
        await fetch(1)
    clock.advance(1.0)
    assert await fetch(2) == 3


def test_a_limiter_composes_in_a_pipeline_under_a_fallback() -> None:
    clock = fw.FakeClock()
    limiter = FixedWindow("1/s", clock=clock)
    pipeline = fw.Pipeline(fw.Fallback(value="busy", kinds={"rate_limited"}), limiter)
    assert pipeline.call(lambda: "ok") == "ok"
    assert pipeline.call(lambda: "ok") == "busy"


def test_max_wait_paces_instead_of_refusing() -> None:
    clock = fw.FakeClock()
    limiter = TokenBucket("2/s", burst=0, clock=clock, max_wait=1.0)
    results = [limiter.call(clock.monotonic) for _ in range(3)]
    assert results == [0.0, 0.5, 1.0]
    assert clock.sleeps == [0.5, 0.5]


def test_wait_gives_up_at_once_when_the_bound_is_too_short() -> None:
    clock = fw.FakeClock()
    limiter = FixedWindow("1/10s", clock=clock)
    assert limiter.wait()
    refused = limiter.wait(max_wait=5)
    assert not refused
    assert refused.retry_after == 10.0
    assert clock.sleeps == []  # no sleeping in vain
    granted = limiter.wait(max_wait=10)
    assert granted
    assert clock.monotonic() == 10.0


def test_wait_is_bounded_by_the_ambient_deadline() -> None:
    clock = fw.FakeClock()
    limiter = GCRA("1/s", burst=0, clock=clock, max_wait=60)
    assert limiter.wait()
    with fw.deadline(0.5, clock=clock):
        assert not limiter.wait()
        with pytest.raises(fw.RateLimitedError):
            limiter.call(lambda: None)
    with fw.deadline(1.0, clock=clock):
        assert limiter.wait()
    assert clock.monotonic() == 1.0


async def test_wait_async_serves_waiters_in_arrival_order() -> None:
    clock = fw.FakeClock()
    limiter = TokenBucket("8/s", burst=0, clock=clock, max_wait=10)
    order: list[tuple[int, float]] = []

    async def one(i: int) -> None:
        assert await limiter.wait_async()
        order.append((i, clock.monotonic()))

    tasks = [asyncio.create_task(one(i)) for i in range(5)]
    await asyncio.sleep(0)
    for _ in range(10):
        clock.advance(1 / 16)
        for _ in range(5):
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == [(0, 0.0), (1, 0.125), (2, 0.25), (3, 0.375), (4, 0.5)]


async def test_window_waiters_retry_after_retry_after() -> None:
    clock = fw.FakeClock()
    limiter = SlidingLog("2/s", clock=clock, max_wait=5)
    assert limiter.try_acquire()
    assert limiter.try_acquire()
    waiting = asyncio.create_task(limiter.wait_async())
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.advance(0.999)
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.advance(0.001)
    assert await waiting


# -- headers -----------------------------------------------------------------------------------


def test_headers_follow_the_ietf_draft_and_round_up() -> None:
    clock = fw.FakeClock()
    limiter = FixedWindow("10/m", clock=clock)
    clock.advance(0.3)
    decision = limiter.acquire()
    assert rate_limit_headers(decision, limiter=limiter) == {
        "RateLimit-Limit": "10",
        "RateLimit-Remaining": "9",
        "RateLimit-Reset": "60",
        "RateLimit-Policy": "10;w=60",
    }
    refused = Decision(False, 0, 2.25, 0.25, 10)
    assert rate_limit_headers(refused) == {
        "RateLimit-Limit": "10",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "3",
        "Retry-After": "1",
    }
    never = Decision(False, 0, 0.0, math.inf, 10)
    assert "Retry-After" not in rate_limit_headers(never)


def test_the_public_names() -> None:
    import floodwall.ratelimit as rl

    for name in rl.__all__:
        assert hasattr(rl, name), name
    assert {"Bulkhead", "ThreadPoolBulkhead", "pool_size"} <= set(fw.__all__)


def test_decorators_keep_signatures_for_type_checkers() -> None:
    limiter = TokenBucket("10/s", clock=fw.FakeClock())

    @limiter
    def get(path: str, retries: int = 0) -> bytes:
        return path.encode()

    @Keyed(FixedWindow("1/s"), key=lambda path: path)
    async def aget(path: str) -> int:
        return len(path)

    assert_type(get("/x"), bytes)
    assert_type(limiter.call(get, "/y", retries=1), bytes)
    assert_type(limiter.acquire(), Decision)
    pending: Coroutine[Any, Any, int] = aget("/x")  # a decorated coroutine function stays one
    assert get("/x") == b"/x"
    assert asyncio.run(pending) == 2


@pytest.mark.parametrize(
    "make",
    [
        lambda c: FixedWindow("100/h", clock=c),
        lambda c: SlidingLog("100/h", clock=c),
        lambda c: SlidingWindowCounter("100/h", clock=c),
        lambda c: TokenBucket("100/h", clock=c),
        lambda c: GCRA("100/h", clock=c),
    ],
    ids=["fixed", "log", "counter", "token", "gcra"],
)
def test_limiters_are_thread_safe(make: Any) -> None:
    """Eight threads race for a frozen clock's quota: exactly the quota is admitted."""
    limiter: RateLimiter[Any] = make(fw.FakeClock())
    admitted = [0] * 8

    def worker(index: int) -> None:
        for _ in range(500):
            if limiter.try_acquire():
                admitted[index] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 100
