"""Golden vectors from the original projects' own test suites, times converted to seconds.

Sources:
* Netflix/concurrency-limits, concurrency-limits-core/src/test/java/com/netflix/concurrency/
  limits/limit/AIMDLimitTest.java, VegasLimitTest.java, ExpAvgMeasurementTest.java.
* go-kratos/aegis ratelimit/bbr/bbr_test.go (TestBBRMaxQps, TestBBRShouldDrop), the successor of
  go-kratos/kratos pkg/ratelimit/bbr/bbr_test.go.
* Google SRE book, "Handling Overload", client-side throttling, equation 21-1; the self-
  protection cases of go-kratos/aegis circuitbreaker/sre/sre_test.go (TestSRESelfProtection).
"""

from __future__ import annotations

import pytest

from floodwall import FakeClock
from floodwall.adaptive import (
    BBR,
    AIMDLimit,
    BBRLimiter,
    ClientThrottle,
    ExpAvgMeasurement,
    Gradient2Limit,
    VegasLimit,
    reject_probability,
)

MS = 1e-3


# -- AIMDLimitTest ---------------------------------------------------------------------------


def test_aimd_default_limit() -> None:
    assert AIMDLimit(initial_limit=10, min_limit=1).limit == 10


def test_aimd_increase_on_success() -> None:
    # AIMDLimitTest.increaseOnSuccess: initialLimit(20), onSample(0, 1 ms, 10, false) -> 21
    limit = AIMDLimit(initial_limit=20)
    assert limit.on_sample(0, 1 * MS, 10, False) == 21


def test_aimd_decrease_on_drops() -> None:
    # AIMDLimitTest.decreaseOnDrops: initialLimit(30), onSample(0, 0, 0, true) -> 27
    limit = AIMDLimit(initial_limit=30)
    assert limit.on_sample(0, 0, 0, True) == 27


# -- VegasLimitTest --------------------------------------------------------------------------


def _vegas() -> VegasLimit:
    # VegasLimitTest.create(): alpha(3).beta(6).smoothing(1.0).initialLimit(10).maxConcurrency(20)
    return VegasLimit(alpha=3, beta=6, smoothing=1.0, initial_limit=10, max_concurrency=20)


def test_vegas_initial_limit() -> None:
    assert _vegas().limit == 10


def test_vegas_increase_limit() -> None:
    limit = _vegas()
    assert limit.on_sample(0, 10 * MS, 10, False) == 10
    assert limit.on_sample(0, 10 * MS, 11, False) == 16


def test_vegas_decrease_limit() -> None:
    limit = _vegas()
    assert limit.on_sample(0, 10 * MS, 10, False) == 10
    assert limit.on_sample(0, 50 * MS, 11, False) == 9


def test_vegas_no_change_if_within_thresholds() -> None:
    limit = _vegas()
    assert limit.on_sample(0, 10 * MS, 10, False) == 10
    assert limit.on_sample(0, 14 * MS, 14, False) == 10


def test_vegas_large_limit_increase() -> None:
    # VegasLimitTest.largeLimitIncrease: 10000 -> 10024 with the default log10 functions
    limit = VegasLimit(initial_limit=10000, max_concurrency=20000)
    assert limit.on_sample(0, 10.0, 5000, False) == 10000
    assert limit.on_sample(0, 10.0, 6000, False) == 10024
    # a drop subtracts log10(10024) = 4
    assert limit.on_sample(0, 20.0, 3000, True) == 10020


def test_vegas_decrease_smoothing() -> None:
    limit = VegasLimit(
        decrease=lambda current: current / 2, smoothing=0.5, initial_limit=100, max_concurrency=200
    )
    assert limit.on_sample(0, 10 * MS, 100, False) == 100
    assert limit.on_sample(0, 20 * MS, 100, False) == 75
    assert limit.on_sample(0, 20 * MS, 100, False) == 56


def test_vegas_decrease_without_smoothing() -> None:
    limit = VegasLimit(decrease=lambda current: current / 2, initial_limit=100, max_concurrency=200)
    assert limit.on_sample(0, 10 * MS, 100, False) == 100
    assert limit.on_sample(0, 20 * MS, 100, False) == 50
    assert limit.on_sample(0, 20 * MS, 100, False) == 25


# -- ExpAvgMeasurementTest (Gradient2's long RTT) --------------------------------------------


def test_exp_avg_measurement_warmup_trace() -> None:
    average = ExpAvgMeasurement(100, 10)
    expected = [10.0, 10.5, 11, 11.5, 12, 12.5, 13, 13.5, 14, 14.5]
    for index, value in enumerate(expected):
        assert average.add(index + 10) == pytest.approx(value, abs=0.01)
    assert average.add(100) == pytest.approx(16.2, abs=0.1)


def test_gradient2_defaults_grow_by_the_smoothed_queue() -> None:
    # Gradient2Limit.java with the builder defaults (initial 20, queue 4, smoothing 0.2; two of
    # them are not floodwall's defaults, so they are passed):
    # 20 * 0.8 + (20 + 4) * 0.2 = 20.8 -> 20, then 20.8 * 0.8 + 24.8 * 0.2 = 21.6 -> 21.
    limit = Gradient2Limit(
        initial_limit=20, max_concurrency=200, min_limit=20, queue_size=4, decrease_smoothing=0.2
    )
    assert limit.on_sample(0, 10.0, 5000, False) == 20
    assert limit.on_sample(0, 10.0, 6000, False) == 21


# -- bbr_test.go ------------------------------------------------------------------------------


def _bbr_with_history(pass_base: int) -> BBR:
    """10 buckets of 100 ms: passes (i + pass_base) * 100, RTs 10i+1 .. 10i+10 ms."""
    bbr = BBR(window=1.0, buckets=10)
    for i in range(10):
        now = i * 0.1 + 0.05
        bbr.add_pass(now, (i + pass_base) * 100)
        for rt in range(i * 10 + 1, i * 10 + 11):
            bbr.add_rt(now, rt * MS)
    return bbr


def test_bbr_max_inflight_60() -> None:
    # TestBBRMaxQps: the current bucket is left out: max pass 1000, min RT ceil(5.5) = 6 ms
    bbr = _bbr_with_history(2)
    now = 0.95
    assert bbr.max_pass(now) == 1000
    assert bbr.min_rt(now) == pytest.approx(6 * MS)
    assert bbr.max_inflight(now) == 60


def test_bbr_should_drop_and_cool_down() -> None:
    # TestBBRShouldDrop: max pass 900, min RT 6 ms -> max in-flight 54
    bbr = _bbr_with_history(1)
    now = 0.95
    assert bbr.max_inflight(now) == 54
    assert bbr.should_drop(now, 50, cpu=0.8) is False  # hot, under the estimate
    assert bbr.should_drop(now, 80, cpu=0.8) is True  # hot, over it
    assert bbr.should_drop(now, 80, cpu=0.7) is True  # cooled, but within 1 s of the drop
    assert bbr.should_drop(now + 2.0, 80, cpu=0.7) is False  # cool-down over


def test_bbr_limiter_golden_through_the_shell() -> None:
    clock = FakeClock(0.0)
    cpu = [0.8]
    limiter = BBRLimiter(window=1.0, buckets=10, cpu=lambda: cpu[0], clock=clock)
    core = limiter.core
    for i in range(10):
        clock.advance(0.1 if i else 0.05)
        core.add_pass(clock.monotonic(), (i + 1) * 100)
        for rt in range(i * 10 + 1, i * 10 + 11):
            core.add_rt(clock.monotonic(), rt * MS)
    assert limiter.stats().max_inflight == 54
    tokens = [limiter.acquire() for _ in range(55)]
    assert all(token is not None for token in tokens)  # in flight 0..54: all admitted
    assert limiter.acquire() is None  # 55 in flight > 54 at 80 % CPU
    cpu[0] = 0.7
    assert limiter.acquire() is None  # cool-down: still shedding
    clock.advance(1.01)
    assert limiter.acquire() is not None


# -- SRE book, eq. 21-1 -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requests", "accepts", "expected"),
    [
        (0, 0, 0.0),  # no history
        (100, 100, 0.0),  # everything accepted
        (100, 50, 0.0),  # exactly K = 2 times the accepts
        (100, 0, 100 / 101),  # nothing accepted: reject almost all
        (300, 100, 100 / 301),
        (1000, 250, 500 / 1001),
    ],
)
def test_sre_formula_vectors(requests: int, accepts: int, expected: float) -> None:
    assert reject_probability(requests, accepts, 2.0) == pytest.approx(expected)


def test_sre_self_protection_cases() -> None:
    # aegis TestSRESelfProtection: below 100 requests nothing is throttled; with more accepts
    # than half the requests nothing is throttled either.
    clock = FakeClock(0.0)
    throttle = ClientThrottle(min_requests=100, clock=clock)
    for _ in range(99):
        assert throttle.attempt(clock.monotonic(), 0.0)  # failures: no accepts at all
    assert throttle.probability() == 0.0
    fresh = ClientThrottle(clock=clock)
    for _ in range(1000):
        fresh.attempt(clock.monotonic(), 0.999)
        fresh.accept()
    assert fresh.probability() == 0.0
