"""Each algorithm against its promise and a tiny exact reference model, on a FakeClock.

Traces are requests ``(dt, cost)`` with ``dt`` in 64ths of a second, so every clock reading is a
dyadic rational that floats hold exactly: the limiters' float arithmetic then has no rounding to
hide behind, and the reference models (exact ``Fraction`` arithmetic) must agree decision for
decision.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import defaultdict
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall.ratelimit import (
    GCRA,
    FixedWindow,
    LeakyBucket,
    Multi,
    Rate,
    SlidingLog,
    SlidingWindowCounter,
    TokenBucket,
    WarmUp,
)

Trace = list[tuple[int, int]]

traces = st.lists(st.tuples(st.integers(0, 96), st.integers(1, 3)), min_size=1, max_size=80)
"""``(dt in 1/64 s, cost)`` pairs."""
bursty = st.lists(
    st.tuples(st.sampled_from([0, 0, 0, 1, 8, 32, 64, 200]), st.integers(1, 2)),
    min_size=1,
    max_size=80,
)
"""Mostly simultaneous requests with occasional gaps: the traffic that finds the edges."""
requests = st.one_of(traces, bursty)
rates = st.builds(Rate, st.integers(1, 6), st.sampled_from([0.5, 1.0, 2.0, 4.0]))
EXAMPLES = settings(max_examples=150, deadline=None)


def run(limiter: fw.Policy, clock: fw.FakeClock, trace: Trace) -> list[tuple[Fraction, int, bool]]:
    """Feed ``trace`` to ``limiter.acquire``; ``(time, cost, allowed)`` per request."""
    assert isinstance(limiter, fw.ratelimit.RateLimiter)
    out = []
    t = Fraction(0)
    for dt, cost in trace:
        clock.advance(dt / 64)
        t += Fraction(dt, 64)
        assert Fraction(clock.monotonic()) == t
        out.append((t, cost, limiter.acquire(cost=cost).allowed))
    return out


def admitted(results: list[tuple[Fraction, int, bool]]) -> list[tuple[Fraction, int]]:
    return [(t, c) for t, c, ok in results if ok]


def most_in_any_window(grants: list[tuple[Fraction, int]], width: Fraction) -> int:
    """The largest admitted cost in any half-open interval ``[t, t + width)``."""
    return max((sum(c for s, c in grants if a <= s < a + width) for a, _ in grants), default=0)


# -- fixed window ------------------------------------------------------------------------------


@EXAMPLES
@given(rate=rates, trace=requests)
def test_fixed_window_matches_its_model_and_promise(rate: Rate, trace: Trace) -> None:
    clock = fw.FakeClock()
    results = run(FixedWindow(rate, clock=clock), clock, trace)
    width, limit = Fraction(rate.period), rate.count
    end, count = Fraction(-1), 0
    windows: defaultdict[Fraction, int] = defaultdict(int)
    for t, cost, ok in results:
        if t >= end or end < 0:
            end, count = t + width, 0
        expected = count + cost <= limit
        assert ok == expected
        if ok:
            count += cost
            windows[end] += cost
    # the promise: at most ``count`` per window; at most 2x in any sliding interval
    assert all(total <= limit for total in windows.values())
    assert most_in_any_window(admitted(results), width) <= 2 * limit


def test_fixed_window_admits_twice_the_limit_across_a_boundary() -> None:
    clock = fw.FakeClock()
    limiter = FixedWindow("4/s", clock=clock)
    assert limiter.try_acquire()  # opens the window [0, 1)
    clock.advance(0.75)
    assert [limiter.try_acquire() for _ in range(4)] == [True, True, True, False]
    clock.advance(0.25)  # a new window [1, 2)
    assert [limiter.try_acquire() for _ in range(5)] == [True] * 4 + [False]
    # 3 + 4 = 7 admitted within 0.25 s: the documented boundary burst (up to 2 × 4)


def test_fixed_window_is_the_seeds_frequency_control() -> None:
    clock = fw.FakeClock()
    downloads = FixedWindow("1/30s", clock=clock)
    posts = FixedWindow("5/h", clock=clock)
    assert downloads.try_acquire()
    clock.advance(29.9)
    refused = downloads.acquire()
    assert not refused
    assert refused.retry_after == pytest.approx(0.1)
    clock.advance(0.1)
    assert downloads.try_acquire()
    assert [posts.try_acquire() for _ in range(6)] == [True] * 5 + [False]


# -- sliding log -------------------------------------------------------------------------------


@EXAMPLES
@given(rate=rates, trace=requests)
def test_sliding_log_is_exact(rate: Rate, trace: Trace) -> None:
    clock = fw.FakeClock()
    results = run(SlidingLog(rate, clock=clock), clock, trace)
    width, limit = Fraction(rate.period), rate.count
    grants: list[tuple[Fraction, int]] = []
    for t, cost, ok in results:
        held = sum(c for s, c in grants if s + width > t)
        assert ok == (held + cost <= limit)
        if ok:
            grants.append((t, cost))
    # the promise: never more than ``count`` in ANY window of ``period`` seconds
    assert most_in_any_window(grants, width) <= limit


def test_sliding_log_refuses_the_boundary_burst() -> None:
    clock = fw.FakeClock()
    limiter = SlidingLog("4/s", clock=clock)
    assert limiter.try_acquire()
    clock.advance(0.75)
    assert [limiter.try_acquire() for _ in range(4)] == [True, True, True, False]
    clock.advance(0.25)  # only the first grant (at 0) has left the window
    assert [limiter.try_acquire() for _ in range(2)] == [True, False]
    decision = limiter.acquire()
    assert decision.retry_after == pytest.approx(0.75)  # when the three at 0.75 leave
    assert decision.remaining == 0


# -- sliding window counter --------------------------------------------------------------------


@EXAMPLES
@given(rate=rates, trace=requests)
def test_sliding_counter_matches_the_weighted_formula(rate: Rate, trace: Trace) -> None:
    clock = fw.FakeClock()
    results = run(SlidingWindowCounter(rate, clock=clock), clock, trace)
    width, limit = Fraction(rate.period), rate.count
    counts: defaultdict[int, int] = defaultdict(int)
    for t, cost, ok in results:
        k = math.floor(t / width)
        elapsed = t - k * width
        estimate = counts[k - 1] * (width - elapsed) / width + counts[k]
        assert ok == (estimate + cost <= limit), (t, estimate, cost)
        if ok:
            counts[k] += cost
    assert all(total <= limit for total in counts.values())  # per grid window
    assert most_in_any_window(admitted(results), width) < 2 * limit


def test_sliding_counter_figures() -> None:
    clock = fw.FakeClock()
    limiter = SlidingWindowCounter("10/s", clock=clock)
    for _ in range(10):
        assert limiter.try_acquire()
    clock.advance(1.25)  # previous window: 10, a quarter of the way into the current one
    decision = limiter.acquire()
    # estimate before: 10 × 0.75 = 7.5; after: 8.5 → 1 left
    assert decision.allowed
    assert decision.remaining == 1
    assert not limiter.acquire(cost=2)
    # 2 more fit once 10 × (2 - t) + 1 + 2 ≤ 10, i.e. t ≥ 1.3: 0.05 s from 1.25
    assert limiter.acquire(cost=2).retry_after == pytest.approx(0.05)


# -- token bucket and GCRA ---------------------------------------------------------------------


def bucket_model(
    trace: list[tuple[Fraction, int]], rate: Fraction, capacity: int, initial: Fraction
) -> list[bool]:
    tokens, last, out = initial, Fraction(0), []
    for t, cost in trace:
        tokens = min(Fraction(capacity), tokens + (t - last) * rate)
        last = t
        ok = tokens >= cost
        if ok:
            tokens -= cost
        out.append(ok)
    return out


def check_bucket_promise(
    grants: list[tuple[Fraction, int]], rate: Fraction, capacity: int, initial: Fraction
) -> None:
    for i, (a, _) in enumerate(grants):
        for j in range(i, len(grants)):
            b = grants[j][0]
            total = sum(c for _, c in grants[i : j + 1])
            assert total <= capacity + rate * (b - a)
    if grants:
        assert sum(c for _, c in grants) <= initial + rate * grants[-1][0]


@EXAMPLES
@given(
    rate=st.sampled_from(["1/s", "2/s", "4/s", "1/2s", "3/4s"]),
    burst=st.integers(0, 4),
    initial=st.integers(0, 5),
    trace=requests,
)
def test_token_bucket_matches_its_model_and_promise(
    rate: str, burst: int, initial: int, trace: Trace
) -> None:
    clock = fw.FakeClock()
    start = min(initial, 1 + burst)
    limiter = TokenBucket(rate, burst=burst, initial=start, clock=clock)
    results = run(limiter, clock, trace)
    per_second = Fraction(limiter.rate.count) / Fraction(limiter.rate.period)
    expected = bucket_model([(t, c) for t, c, _ in results], per_second, 1 + burst, Fraction(start))
    assert [ok for _, _, ok in results] == expected
    check_bucket_promise(admitted(results), per_second, 1 + burst, Fraction(start))


@EXAMPLES
@given(
    rate=st.sampled_from(["1/s", "3/s", "5/2s", "7/h", "1000/s"]),
    burst=st.integers(0, 4),
    trace=requests,
)
def test_gcra_is_the_token_bucket_in_exact_integers(rate: str, burst: int, trace: Trace) -> None:
    clock = fw.FakeClock()
    limiter = GCRA(rate, burst=burst, clock=clock)
    results = run(limiter, clock, trace)
    per_second = Fraction(limiter.rate.count) / Fraction(limiter.rate.period)
    full = Fraction(1 + burst)
    expected = bucket_model([(t, c) for t, c, _ in results], per_second, 1 + burst, full)
    assert [ok for _, _, ok in results] == expected
    check_bucket_promise(admitted(results), per_second, 1 + burst, full)


def test_gcra_keeps_exact_time_for_rates_floats_cannot_hold() -> None:
    """T = 1/3 s is no float; in units of 1/3 µs it is the integer 10⁶, and stays exact."""
    clock = fw.FakeClock()
    limiter = GCRA("3/s", burst=1, clock=clock)
    assert (limiter.scale, limiter.emission_interval) == (3, 1_000_000)
    polls = [(1, 1)] * (64 * 600)  # ten minutes of polling every 1/64 s
    results = run(limiter, clock, polls)
    expected = bucket_model([(t, c) for t, c, _ in results], Fraction(3), 2, Fraction(2))
    assert [ok for _, _, ok in results] == expected
    assert sum(expected) == 2 + 3 * 600 - 1  # capacity + rate × time, to the last grant


# redis-cell's own fake-clock trace: ``it_rate_limits`` in redis-cell-impl/src/lib.rs
# (github.com/brandur/redis-cell): max_burst 4 (limit 5), 1 per second. Columns: ms after start,
# quantity, limited, remaining, reset_after (ms), retry_after (ms; -1 = none).
REDIS_CELL_TRACE = [
    (0, 6, True, 5, 0, -1),  # you can never make a request larger than the maximum
    (0, 1, False, 4, 1000, -1),
    (0, 1, False, 3, 2000, -1),
    (0, 1, False, 2, 3000, -1),
    (0, 1, False, 1, 4000, -1),
    (0, 1, False, 0, 5000, -1),
    (0, 1, True, 0, 5000, 1000),
    (3000, 1, False, 2, 3000, -1),
    (3100, 1, False, 1, 3900, -1),
    (4000, 1, False, 1, 4000, -1),
    (8000, 1, False, 4, 1000, -1),
    (9500, 1, False, 4, 1000, -1),
    (9500, 0, False, 4, 1000, -1),  # zero quantity peeks
    (9500, 2, False, 2, 3000, -1),  # high volume uses up more of the limit
    (9500, 5, True, 2, 3000, 3000),  # large requests cannot exceed limits
]


@pytest.mark.parametrize("start", [0.0, 1_700_000_000.0, 12345.678])
def test_gcra_reproduces_the_redis_cell_trace(start: float) -> None:
    clock = fw.FakeClock(start)
    limiter = GCRA("1/s", burst=4, clock=clock)
    for ms, quantity, limited, remaining, reset_ms, retry_ms in REDIS_CELL_TRACE:
        clock.advance(start + ms / 1000 - clock.monotonic())
        decision = limiter.acquire(cost=quantity)
        assert decision.allowed is not limited
        assert decision.limit == 5
        assert decision.remaining == remaining
        assert decision.reset_after == pytest.approx(reset_ms / 1000, abs=1e-6)
        expected_retry = 0.0 if not limited else (math.inf if retry_ms < 0 else retry_ms / 1000)
        assert decision.retry_after == pytest.approx(expected_retry, abs=1e-6)


def test_token_bucket_burst_initial_and_figures() -> None:
    clock = fw.FakeClock()
    bucket = TokenBucket("10/s", burst=4, initial=2, clock=clock)
    assert bucket.capacity == 5
    assert [bucket.try_acquire() for _ in range(3)] == [True, True, False]
    refused = bucket.acquire()
    assert refused.retry_after == pytest.approx(0.1)
    clock.advance(1.0)
    first = bucket.acquire()
    assert first.remaining == 4  # capped at capacity 5, one taken
    assert first.reset_after == pytest.approx(0.1)
    assert bucket.acquire(cost=6).retry_after == math.inf


def test_a_bucket_that_refills_only_when_dry_admits_double_we_do_not() -> None:
    """Refills are capped at every decision, not when the bucket runs dry."""
    clock = fw.FakeClock()
    bucket = TokenBucket("10/s", clock=clock)  # capacity 10
    clock.advance(100.0)  # long idle: the bucket is full, not "owed" 1000 tokens
    admitted_now = sum(bucket.try_acquire() for _ in range(25))
    assert admitted_now == 10


# -- leaky bucket ------------------------------------------------------------------------------


async def _settle() -> None:
    for _ in range(6):
        await asyncio.sleep(0)


def _leaky_run(queue: int, trace: Trace) -> list[tuple[Fraction, int, Fraction | None]]:
    """Arrivals join ``wait_async``; ``(arrival, cost, departure or None)`` each."""

    async def main() -> list[tuple[Fraction, int, Fraction | None]]:
        clock = fw.FakeClock()
        limiter = LeakyBucket("4/s", queue=queue, clock=clock)
        out: list[tuple[Fraction, int, Fraction | None]] = []

        async def one(arrival: Fraction, cost: int, slot: int) -> None:
            decision = await limiter.wait_async(cost=cost)
            out[slot] = (arrival, cost, Fraction(clock.monotonic()) if decision else None)

        tasks = []
        for dt, cost in trace:
            for _ in range(dt):
                clock.advance(1 / 64)
                await _settle()
            arrival = Fraction(clock.monotonic())
            out.append((arrival, cost, None))
            tasks.append(asyncio.create_task(one(arrival, cost, len(out) - 1)))
            await _settle()
        while not all(task.done() for task in tasks):
            clock.advance(1 / 64)
            await _settle()
        return out

    return asyncio.run(main())


@settings(max_examples=60, deadline=None)
@given(
    queue=st.integers(0, 4),
    trace=st.lists(
        st.tuples(st.sampled_from([0, 0, 4, 16, 40]), st.integers(1, 2)), min_size=1, max_size=25
    ),
)
def test_leaky_bucket_paces_in_order_within_its_queue(queue: int, trace: Trace) -> None:
    interval = Fraction(1, 4)
    results = _leaky_run(queue, trace)
    free = Fraction(-1)
    for arrival, cost, departure in results:
        start = max(free, arrival)
        fits = start - arrival <= queue * interval
        assert (departure is not None) == fits, (arrival, cost, departure, free)
        if departure is not None:
            assert departure == start  # FIFO, exactly on its slot
            free = start + cost * interval
    departures = [(d, c) for _, c, d in results if d is not None]
    for (d1, c1), (d2, _) in itertools.pairwise(departures):
        assert d2 - d1 >= c1 * interval  # the steady output rate


def test_leaky_bucket_acquire_never_queues() -> None:
    clock = fw.FakeClock()
    limiter = LeakyBucket("2/s", queue=5, clock=clock)
    assert limiter.try_acquire()
    refused = limiter.acquire()
    assert not refused
    assert refused.retry_after == 0.5
    assert refused.remaining == 5  # the queue has 5 free places for pacing callers
    clock.advance(0.5)
    assert limiter.try_acquire()


def test_leaky_bucket_as_a_policy_paces_and_refuses_when_full() -> None:
    clock = fw.FakeClock()
    limiter = LeakyBucket("2/s", queue=1, clock=clock)
    assert limiter.max_wait == math.inf
    assert limiter.call(clock.monotonic) == 0.0
    assert limiter.call(clock.monotonic) == 0.5  # waited in the queue
    assert limiter.call(clock.monotonic) == 1.0


# -- warm-up -----------------------------------------------------------------------------------


def test_warm_up_ramps_from_a_third_of_the_rate_to_the_rate() -> None:
    clock = fw.FakeClock()
    limiter = WarmUp("10/s", warmup=10.0, clock=clock, max_wait=math.inf)
    departures = []
    for _ in range(200):  # a saturating client: asks again the moment it may
        assert limiter.wait()
        departures.append(clock.monotonic())
    gaps = [b - a for a, b in itertools.pairwise(departures)]
    assert gaps[0] == pytest.approx(0.3, rel=0.02)  # cold: rate / 3
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(gaps))  # only speeds up
    assert gaps[-1] == pytest.approx(0.1)  # warm: the rate
    warm_at = departures[next(i for i, gap in enumerate(gaps) if gap <= 0.1 + 1e-9)]
    assert warm_at == pytest.approx(10.0, abs=0.35)  # after the warm-up period


def test_warm_up_cools_down_when_idle() -> None:
    clock = fw.FakeClock()
    limiter = WarmUp("10/s", warmup=10.0, clock=clock, max_wait=math.inf)
    for _ in range(150):
        limiter.wait()
    clock.advance(20.0)  # idle longer than the warm-up period: fully cold again
    first = clock.monotonic()
    limiter.wait()
    limiter.wait()
    assert clock.monotonic() - first == pytest.approx(0.3, rel=0.02)


@EXAMPLES
@given(trace=requests, cold_factor=st.sampled_from([2.0, 3.0, 5.0]))
def test_warm_up_never_spaces_requests_closer_than_the_rate(
    trace: Trace, cold_factor: float
) -> None:
    clock = fw.FakeClock()
    limiter = WarmUp("4/s", warmup=2.0, cold_factor=cold_factor, clock=clock)
    grants = admitted(run(limiter, clock, trace))
    for (a, cost), (b, _) in itertools.pairwise(grants):
        assert b - a >= cost * Fraction(1, 4) - Fraction(1, 10**9)


# -- several rates on one key ------------------------------------------------------------------


@EXAMPLES
@given(trace=requests)
def test_multi_admits_only_what_all_admit_and_charges_all_or_none(trace: Trace) -> None:
    clock = fw.FakeClock()
    multi = Multi(
        TokenBucket("4/s", burst=1, clock=clock), SlidingLog("6/2s", clock=clock), clock=clock
    )
    reference_clock = fw.FakeClock()
    fast = TokenBucket("4/s", burst=1, clock=reference_clock)
    slow = SlidingLog("6/2s", clock=reference_clock)
    for dt, cost in trace:
        clock.advance(dt / 64)
        reference_clock.advance(dt / 64)
        expected = fast.peek(cost=cost).allowed and slow.peek(cost=cost).allowed
        if expected:
            assert fast.try_acquire(cost=cost)
            assert slow.try_acquire(cost=cost)
        decision = multi.acquire(cost=cost)
        assert decision.allowed == expected
        if not expected:
            assert decision.retry_after == max(
                fast.peek(cost=cost).retry_after, slow.peek(cost=cost).retry_after
            )


def test_multi_of_ten_per_second_and_a_thousand_per_hour() -> None:
    clock = fw.FakeClock()
    limiter = Multi.of("10/s", "25/h", algorithm=FixedWindow, clock=clock)
    granted = 0
    for _ in range(10):
        granted += sum(limiter.try_acquire() for _ in range(20))
        clock.advance(1.0)
    assert granted == 25  # 10 + 10 + 5: the hourly limit bites in the third second
    decision = limiter.acquire()
    assert not decision.allowed
    assert decision.limit == 25
    assert decision.retry_after == pytest.approx(3600 - 10)
