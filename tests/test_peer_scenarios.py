"""Scenarios ported from the peers' own test suites, run against floodwall on a fake clock.

Each test names the peer file and test it follows (resilience4j's circuit breaker, bulkhead,
rate limiter, retry and interval-function tests; Polly v8's Core tests; Sentinel's degrade and
flow-control tests; pybreaker's ``tests/pybreaker_test.py``; tenacity's ``tests/test_tenacity.py``;
concurrency-limits' limiter tests are in ``test_adaptive_peers.py``) and either agrees with the
peer or says in its docstring why floodwall differs, a difference also tabled on the topic's
docs page. The inputs are the peers'; the code and the assertions are floodwall's own.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import sys
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall import (
    Bulkhead,
    CircuitBreaker,
    CircuitOpenError,
    CircuitState,
    ConfigError,
    FakeClock,
    Hedge,
    Retry,
    RetryBudget,
)
from floodwall._core.outcome import Kind
from floodwall.backoff import Exponential, Fixed, FullJitter, Linear, NoBackoff, Randomized
from floodwall.classify import DEFAULT_CLASSIFIER, ErrorClass
from floodwall.ratelimit import (
    FixedWindow,
    Keyed,
    LeakyBucket,
    SlidingWindowCounter,
    TokenBucket,
    WarmUp,
)
from floodwall.ratelimit.hot import HotKeys

R4J = "resilience4j-circuitbreaker/src/test/java/io/github/resilience4j/circuitbreaker/internal/"
R4J_SM = R4J + "CircuitBreakerStateMachineTest.java"
PYB = "pybreaker tests/pybreaker_test.py"
S = CircuitState


class Boom(Exception):
    """A recorded failure (resilience4j's RuntimeException)."""


# -- drivers: the pure core, time moved by hand --------------------------------------------


def r4j(clock: FakeClock, **overrides: Any) -> CircuitBreaker:
    """The breaker of resilience4j's CircuitBreakerStateMachineTest setUp: failure rate 50 %,
    4 half-open calls, slow above 4 s at 50 %, a 5 s time window needing 5 calls, 5 s open,
    NumberFormatException ignored (ValueError here)."""
    options: dict[str, Any] = {
        "failure_rate": 0.5,
        "half_open_calls": 4,
        "slow_call_duration": 4.0,
        "slow_call_rate": 0.5,
        "window": 5.0,
        "buckets": 5,
        "minimum_calls": 5,
        "open_duration": 5.0,
        "ignore": ValueError,
    }
    options.update(overrides)
    return CircuitBreaker("testName", clock=clock, **options)


def end(b: CircuitBreaker, clock: FakeClock, kind: Kind, duration: float = 0.0) -> None:
    """One admitted call ending as ``kind`` after ``duration`` seconds."""
    permit = b.acquire(clock.monotonic())
    assert permit >= 0, "the call was refused"
    clock.advance(duration)
    b.on_outcome(permit, clock.monotonic(), kind, duration)


def fail(b: CircuitBreaker, clock: FakeClock, duration: float = 0.0) -> None:
    end(b, clock, Kind.FAILURE, duration)


def ok(b: CircuitBreaker, clock: FakeClock, duration: float = 0.0) -> None:
    end(b, clock, Kind.SUCCESS, duration)


def half_open(b: CircuitBreaker, clock: FakeClock) -> None:
    """resilience4j's transitionToOpenState then transitionToHalfOpenState."""
    b.trip("test: open")
    clock.advance(b.options.open_duration)
    assert state(b) is S.HALF_OPEN


def state(b: CircuitBreaker) -> CircuitState:
    """Read the state through a call, so that mypy does not narrow it between reads."""
    return b.state


def permits(b: CircuitBreaker, clock: FakeClock, n: int) -> list[bool]:
    return [b.acquire(clock.monotonic()) >= 0 for _ in range(n)]


# == the scenarios (items 1-4, 6-10, 13) ===========================================


def test_count_window_smaller_than_minimum_calls_clamps(clock: FakeClock) -> None:
    """Item 1. resilience4j ``CircuitBreakerConfig.Builder#build`` sets
    ``minimumNumberOfCalls = min(minimumNumberOfCalls, slidingWindowSize)`` for COUNT_BASED
    windows (exercised by ``CircuitBreakerConfigTest``): floodwall clamps the same way, so
    ``window_calls=10`` with the default ``minimum_calls=20`` opens at 10 failures."""
    b = CircuitBreaker("x", window_calls=10, clock=clock)
    assert b.options.minimum_calls == 10
    for _ in range(9):
        fail(b, clock)
    assert state(b) is S.CLOSED
    fail(b, clock)
    assert state(b) is S.OPEN


def test_failure_rate_exactly_at_threshold_trips(clock: FakeClock) -> None:
    """Item 2. resilience4j ``CircuitBreakerMetrics#checkIfThresholdsExceeded`` trips at
    ``failureRate >= threshold`` and Polly's ``AdvancedCircuitBehavior`` at
    ``failureRate >= FailureRatio``: 7 of 25 at 0.28 trips (0.28 × 25 is 7.000000000000001 as a
    float; floodwall compares 7 × 25 >= 7 × 25 in integers)."""
    b = CircuitBreaker("x", failure_rate=0.28, minimum_calls=25, window_calls=25, clock=clock)
    for _ in range(18):
        ok(b, clock)
    for _ in range(6):
        fail(b, clock)
    assert state(b) is S.CLOSED
    fail(b, clock)
    assert state(b) is S.OPEN


@pytest.mark.parametrize(
    ("rate", "calls", "errors"), [(0.1, 10, 1), (0.3, 10, 3), (0.7, 10, 7), (0.29, 100, 29)]
)
def test_exact_thresholds_over_float_traps(
    clock: FakeClock, rate: float, calls: int, errors: int
) -> None:
    """Item 2 (more of Polly's break-decision table): rates whose float product with the call
    count overshoots the integer still trip at exactly that many errors."""
    b = CircuitBreaker("x", failure_rate=rate, minimum_calls=calls, window_calls=calls, clock=clock)
    for _ in range(calls - errors):
        ok(b, clock)
    for _ in range(errors - 1):
        fail(b, clock)
    assert state(b) is S.CLOSED
    fail(b, clock)
    assert state(b) is S.OPEN


def test_call_exactly_at_slow_call_duration_is_not_slow(clock: FakeClock) -> None:
    """Item 3. resilience4j ``CircuitBreakerStateMachine`` counts a call slow when
    ``duration > slowCallDurationThreshold`` (and Sentinel's ``ResponseTimeCircuitBreaker`` when
    ``rt > maxAllowedRt``): a call of exactly 4 s is not slow, one of 4.5 s is."""
    b = r4j(clock, failure_rate=None)
    for _ in range(5):
        ok(b, clock, 4.0)
    assert state(b) is S.CLOSED
    assert b.metrics().slow_calls == 0
    ok(b, clock, 4.5)
    assert b.metrics().slow_calls == 1


POLLY_CB = "Polly src/Polly.Core/CircuitBreaker/Controller/CircuitStateController.cs"
POLLY_CB_TESTS = (
    "Polly test/Polly.Core.Tests/CircuitBreaker/Controller/CircuitStateControllerTests.cs"
)


def _reopened_at(reopen: float, open_duration: float) -> tuple[CircuitBreaker, FakeClock]:
    """A breaker tripped ``open_duration`` + 1 s before ``reopen`` whose half-open probe fails
    at ``reopen`` (to the float the clock lands on: read ``clock.monotonic()``)."""
    clock = FakeClock(reopen - open_duration - 1.0)
    b = CircuitBreaker(
        "x", open_duration=open_duration, max_open_duration=open_duration, clock=clock
    )
    b.trip("test")
    clock.advance(open_duration + 1.0)
    with pytest.raises(Boom):
        b.call(_raise_boom)  # the probe fails: OPEN again from now
    assert state(b) is S.OPEN
    return b, clock


def _raise_boom() -> None:
    raise Boom


def test_flow_closed_half_open_open_half_open_reopen_at_10_01() -> None:
    """Item 4, the issue's case. Polly ``Flow_Closed_HalfOpen_Open_HalfOpen_Closed``
    (``POLLY_CB_TESTS``) with the end of the open period as ``PermitHalfOpenCircuitTest_NeedsLock``
    defines it (``now >= _blockedUntil``, ``POLLY_CB``): reopened by a failed probe at t = 10.01,
    a call at exactly +10 s (the clock moved by 10.0: 20.009999999999998 in floats) is the
    half-open probe, through ``call()`` and through ``acquire()`` alike; one float step earlier
    both refuse. resilience4j's ``OpenState.tryAcquirePermission`` uses ``isAfter`` (strictly
    later, on a millisecond clock) and would still refuse at the boundary: floodwall follows
    Polly (docs/circuit-breaker.md says so)."""
    through_call, call_clock = _reopened_at(10.01, 10.0)
    through_acquire, acquire_clock = _reopened_at(10.01, 10.0)
    for twin in (call_clock, acquire_clock):
        assert twin.monotonic() == 10.01
        twin.advance(10.0)
        assert twin.monotonic() == 10.01 + 10.0
    assert through_call.retry_after(call_clock.monotonic()) == 0.0
    assert through_call.call(lambda: "probe") == "probe"  # admitted half-open, then closed
    assert state(through_call) is S.CLOSED
    permit = through_acquire.acquire(acquire_clock.monotonic())
    assert permit >= 0
    assert state(through_acquire) is S.HALF_OPEN
    through_acquire.on_outcome(permit, acquire_clock.monotonic(), Kind.SUCCESS, 0.0)
    assert state(through_acquire) is S.CLOSED


@settings(max_examples=200, deadline=None)
@given(
    reopen=st.floats(min_value=0.001, max_value=1e7, allow_nan=False),
    open_duration=st.floats(min_value=0.001, max_value=3600.0, allow_nan=False),
)
def test_open_period_end_is_one_definition(reopen: float, open_duration: float) -> None:
    """Item 4 for any reopen time and open duration: at ``reopen + open_duration`` (the clock
    advanced once by the open duration) ``call()`` and ``acquire()`` both admit the probe, and
    at the float just before it both refuse: the open period's end is one stored value that
    every path compares with (Polly's ``_blockedUntil``)."""
    for how in ("call", "acquire"):
        early, early_clock = _reopened_at(reopen, open_duration)
        before = math.nextafter(early_clock.monotonic() + open_duration, -math.inf)
        early_clock.advance(before - early_clock.monotonic())
        if early_clock.monotonic() == before:  # the advance itself can round: only exact
            assert not _admitted(early, how)
        b, clock = _reopened_at(reopen, open_duration)
        end_at = clock.monotonic() + open_duration
        clock.advance(open_duration)
        assert clock.monotonic() == end_at
        assert _admitted(b, how)


def _admitted(b: CircuitBreaker, how: str) -> bool:
    """Whether a call now is let through, asked through ``call()`` or ``acquire()``."""
    if how == "acquire":
        return b.acquire(b.clock.monotonic()) >= 0
    try:
        b.call(lambda: None)
    except CircuitOpenError:
        return False
    return True


def test_success_completing_minimum_calls_opens(clock: FakeClock) -> None:
    """Item 6. resilience4j ``shouldOpenAfterFailureRateThresholdExceeded`` (``R4J_SM``): F F F S
    S with a minimum of 5 calls opens on the fifth call, a success, at 60 % failures."""
    b = r4j(clock)
    fail(b, clock)
    fail(b, clock)
    fail(b, clock)
    ok(b, clock)
    assert state(b) is S.CLOSED
    ok(b, clock)
    assert state(b) is S.OPEN
    assert b.acquire(clock.monotonic()) < 0


def test_bulkhead_max_wait_without_a_queue_is_refused() -> None:
    """Item 7. resilience4j ``SemaphoreBulkhead`` lets every caller wait ``maxWaitDuration``;
    floodwall bounds its waiters with ``max_queue``, so ``max_wait=2`` with no queue is a
    contradiction it refuses at construction instead of refusing every wait silently."""
    with pytest.raises(ConfigError, match=r"max_wait=2 needs max_queue >= 1"):
        Bulkhead(max_wait=2)
    assert Bulkhead(max_wait=2, max_queue=5).options.max_wait == 2.0
    assert Bulkhead(max_wait=0).options.max_queue == 0


def test_consecutive_failures_is_pybreakers_fail_max(clock: FakeClock) -> None:
    """Item 8. pybreaker ``test_several_failed_calls_setting_absent`` (``PYB``): with
    ``fail_max=3`` three failures in a row open the circuit, whatever the call rate."""
    b = CircuitBreaker("x", failure_rate=None, consecutive_failures=3, clock=clock)
    fail(b, clock)
    clock.advance(4.0)
    fail(b, clock)
    clock.advance(4.0)
    assert state(b) is S.CLOSED
    fail(b, clock)
    assert state(b) is S.OPEN


def test_consecutive_failures_ignore_scattered_errors(clock: FakeClock) -> None:
    """Item 8. pybreaker ``test_one_successful_call_after_failed_call`` (``PYB``): a success
    resets the failure counter, so 1 % scattered errors at 200 calls/s never open the breaker
    (the old ``error_count=5`` mapping refused most of such traffic)."""
    b = CircuitBreaker("x", failure_rate=None, consecutive_failures=5, clock=clock)
    for i in range(2000):
        if i % 100 == 0:
            fail(b, clock, 0.005)
        else:
            ok(b, clock, 0.005)
    assert state(b) is S.CLOSED
    assert b.rejected == 0


def test_consecutive_failures_in_config() -> None:
    """Item 8: the config schema takes the rule too."""
    from floodwall.config.schema import CircuitBreakerConfig

    config = CircuitBreakerConfig(failure_rate=None, consecutive_failures=5)
    assert config.consecutive_failures == 5
    with pytest.raises(ValueError, match="consecutive_failures"):
        CircuitBreakerConfig(consecutive_failures=0)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("httpx", "ConnectError"),
        ("httpx", "ReadTimeout"),
        ("httpx", "RemoteProtocolError"),
        ("requests", "ConnectionError"),
        ("requests", "Timeout"),
        ("aiohttp", "ServerDisconnectedError"),
    ],
)
def test_http_clients_transient_errors_are_transient(module: str, name: str) -> None:
    """Item 9. tenacity's users wrap ``httpx.get`` in ``retry_if_exception_type(httpx.
    TransportError)``; floodwall classifies the clients' own transient errors TRANSIENT once
    the client is imported (and never imports it itself)."""
    library = pytest.importorskip(module)
    kind = getattr(library, name)
    exc = kind("x") if module != "aiohttp" else kind()
    assert DEFAULT_CLASSIFIER.classify(exc) is ErrorClass.TRANSIENT


def test_http_client_error_of_a_decorated_call_is_retried(clock: FakeClock) -> None:
    """Item 9: ``@fw.Retry`` over an httpx call to a closed port retries the ConnectError."""
    httpx = pytest.importorskip("httpx")
    calls = itertools.count(1)

    @Retry("get", attempts=3, backoff=NoBackoff(), budget=None, clock=clock)
    def get() -> str:
        if next(calls) < 3:
            raise httpx.ConnectError("connection refused")
        return "ok"

    assert get() == "ok"


def test_grpc_status_codes_are_classified() -> None:
    """Item 9: a ``grpc.RpcError`` is classified by its code (UNAVAILABLE is transient,
    RESOURCE_EXHAUSTED an overload signal, NOT_FOUND no opinion), read by duck typing."""
    grpc: Any = pytest.importorskip("grpc")
    rpc_error: type[Exception] = grpc.RpcError

    class Failed(rpc_error):  # type: ignore[misc,valid-type]
        def __init__(self, code: Any) -> None:
            self._code = code

        def code(self) -> Any:
            return self._code

    assert DEFAULT_CLASSIFIER.classify(Failed(grpc.StatusCode.UNAVAILABLE)) is ErrorClass.TRANSIENT
    assert (
        DEFAULT_CLASSIFIER.classify(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED))
        is ErrorClass.OVERLOAD
    )
    assert DEFAULT_CLASSIFIER.classify(Failed(grpc.StatusCode.NOT_FOUND)) is ErrorClass.UNKNOWN


def test_classifier_never_imports_a_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 9: with no client in ``sys.modules`` classifying imports none; a stand-in module
    registered under a client's name is picked up by name."""
    monkeypatch.delitem(sys.modules, "requests", raising=False)
    DEFAULT_CLASSIFIER.classify(OSError("x"))
    assert "requests" not in sys.modules
    fake = types.ModuleType("requests")

    class Timeout(OSError):
        pass

    fake.Timeout = Timeout  # type: ignore[attr-defined]
    fake.ConnectionError = Timeout  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "requests", fake)
    monkeypatch.setattr("floodwall.classify._resolved", {})
    assert DEFAULT_CLASSIFIER.classify(Timeout()) is ErrorClass.TRANSIENT


def test_budget_refusal_says_so(clock: FakeClock) -> None:
    """Item 10. tenacity ``test_stop_after_attempt`` (``tests/test_tenacity.py``) retries every
    item; floodwall's budget may refuse, and when it does the error carries a note and an event
    says ``budget_exhausted`` (``budget=None`` restores tenacity's behaviour)."""
    events: list[fw.Event] = []
    budget = RetryBudget(0.0, min_per_second=0.0, clock=clock)
    policy = Retry(
        "items",
        attempts=3,
        backoff=NoBackoff(),
        budget=budget,
        clock=clock,
        listeners=[events.append],
    )

    def flaky() -> None:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError) as info:
        policy.call(flaky)
    assert any("RetryBudgetExhausted" in note for note in info.value.__notes__)
    assert [e.kind for e in events if e.kind == "budget_exhausted"] == ["budget_exhausted"]
    assert policy.budget_refusals == 1


def test_no_budget_retries_every_item(clock: FakeClock) -> None:
    """Item 10: the tenacity guide's first translation with ``budget=None``: 20 of 20 items that
    each fail twice succeed (with the default private budget some would be refused)."""
    policy = Retry("items", attempts=3, backoff=NoBackoff(), budget=None, clock=clock)
    done = 0
    for _ in range(20):
        left = iter([ConnectionError("1"), ConnectionError("2"), None])

        def item(left: Any = left) -> str:
            error = next(left)
            if error is not None:
                raise error
            return "ok"

        done += policy.call(item) == "ok"
    assert done == 20


def test_randomized_backoff_is_resilience4j_exponential_random() -> None:
    """Item 13. resilience4j ``IntervalFunctionTest#shouldPassPositiveRandomizationFactor``-style
    check of ``ofExponentialRandomBackoff(100 ms, 2, 0.5)``: each delay lies within ± 50 % of
    100, 200, 400 ms, and both halves of each range are reached."""
    strategy = Randomized(0.1, 2.0, 0.5, cap=10.0, rng=random.Random(7))
    samples = [list(itertools.islice(strategy.delays(), 3)) for _ in range(400)]
    for n, centre in enumerate((0.1, 0.2, 0.4)):
        values = [s[n] for s in samples]
        assert all(centre * 0.5 <= v <= centre * 1.5 for v in values)
        assert min(values) < centre * 0.6 and max(values) > centre * 1.4
    with pytest.raises(ConfigError, match="randomization_factor"):
        Randomized(0.1, randomization_factor=1.0)


def test_randomized_backoff_never_exceeds_cap() -> None:
    """Item 13, a documented difference: resilience4j randomizes after capping (up to
    ``max × (1 + f)``); floodwall's ``cap`` is a hard bound on every delay."""
    strategy = Randomized(1.0, 2.0, 0.5, cap=3.0, rng=random.Random(1))
    delays = list(itertools.islice(strategy.delays(), 50))
    assert max(delays) <= 3.0


def test_randomized_backoff_factor_zero_is_exponential() -> None:
    """Item 13: a factor of 0 gives resilience4j's plain ``ofExponentialBackoff``."""
    plain = list(itertools.islice(Exponential(0.1, 2.0, cap=10).delays(), 5))
    spread = list(itertools.islice(Randomized(0.1, 2.0, 0.0, cap=10).delays(), 5))
    assert spread == plain


def test_hot_key_gets_its_own_threshold(clock: FakeClock) -> None:
    """Item 13. Sentinel ``ParamFlowRule`` with ``paramFlowItemList`` (ParamFlowCheckerTest's
    hot-item case): one value has its own count, every other value the rule's."""
    limiter = HotKeys(
        Keyed(FixedWindow("2/s", clock=clock)),
        {"vip": FixedWindow("5/s", clock=clock)},
    )
    assert [limiter.try_acquire("alice") for _ in range(3)] == [True, True, False]
    assert [limiter.try_acquire("vip") for _ in range(6)] == [True] * 5 + [False]
    assert "vip" not in limiter.default  # never tracked, never evicted
    assert limiter.rejected == 2
    clock.advance(1.0)
    assert limiter.try_acquire("vip") and limiter.try_acquire("alice")


def test_hot_keys_as_a_policy(clock: FakeClock) -> None:
    """Item 13: as a decorator the key comes from the call's arguments."""
    limiter = HotKeys(
        Keyed(TokenBucket("1/s", clock=clock)),
        {"bot": TokenBucket("1/m", clock=clock), "vip": TokenBucket("3/s", clock=clock)},
        key=lambda user: user,
    )

    @limiter
    def serve(user: str) -> str:
        return user

    assert [serve("vip") for _ in range(3)] == ["vip"] * 3
    with pytest.raises(fw.RateLimitedError):
        serve("vip")
    assert serve("bob") == "bob"
    with pytest.raises(ConfigError, match=r"hot\['x'\]"):
        HotKeys(Keyed(TokenBucket("1/s")), {"x": Keyed(TokenBucket("1/s"))})


async def test_hedge_starts_on_a_failed_first_attempt(clock: FakeClock) -> None:
    """Item 13. Polly v8 ``HedgingResilienceStrategyTests`` (a handled failure of the primary
    starts the next hedged attempt at once): with ``on_failure=True`` a transient failure starts
    attempt 2 without waiting for the delay."""
    started: list[int] = []

    async def call() -> str:
        marker = fw.current_retry()
        attempt = 1 if marker is None else marker.attempt
        started.append(attempt)
        if attempt == 1:
            raise ConnectionError("reset")
        return "second"

    policy = Hedge(10.0, on_failure=True, budget=None, clock=clock)
    assert await policy.call_async(call) == "second"
    assert started == [1, 2]


async def test_hedge_without_on_failure_answers_slowness_only(clock: FakeClock) -> None:
    """Item 13, floodwall's default kept: without ``on_failure`` a failed only attempt is the
    answer (Polly's default ``ShouldHandle`` would hedge it)."""

    async def call() -> str:
        raise ConnectionError("reset")

    policy = Hedge(10.0, budget=None, clock=clock)
    with pytest.raises(ConnectionError):
        await policy.call_async(call)
    assert policy.hedges == 0


async def test_hedge_on_failure_respects_max_hedges(clock: FakeClock) -> None:
    """Item 13: Polly's ``MaxHedgedAttempts``: every attempt failing ends after 1 + max_hedges."""
    started: list[int] = []

    async def call() -> str:
        started.append(len(started) + 1)
        await asyncio.sleep(0)
        raise ConnectionError("reset")

    policy = Hedge(10.0, max_hedges=2, on_failure=True, budget=None, clock=clock)
    with pytest.raises(ConnectionError):
        await policy.call_async(call)
    assert started == [1, 2, 3]


# == resilience4j CircuitBreakerStateMachineTest ==========================================


def test_should_return_the_correct_name(clock: FakeClock) -> None:
    """``R4J_SM`` shouldReturnTheCorrectName."""
    assert r4j(clock).name == "testName"


def test_should_throw_call_not_permitted_when_state_is_open(clock: FakeClock) -> None:
    """``R4J_SM`` shouldThrowCallNotPermittedExceptionWhenStateIsOpen."""
    b = r4j(clock)
    b.trip("test")
    with pytest.raises(CircuitOpenError):
        b.admit(clock.monotonic(), (), {})
    assert b.rejected == 1


def test_should_throw_call_not_permitted_when_state_is_forced_open(clock: FakeClock) -> None:
    """``R4J_SM`` shouldThrowCallNotPermittedExceptionWhenStateIsForcedOpen."""
    b = r4j(clock)
    b.force_open()
    with pytest.raises(CircuitOpenError) as info:
        b.admit(clock.monotonic(), (), {})
    assert info.value.state is S.FORCED_OPEN and b.rejected == 1


def test_should_increase_counter_on_release_permission(clock: FakeClock) -> None:
    """``R4J_SM`` shouldIncreaseCounterOnReleasePermission: an ignored outcome gives the
    half-open permit back (floodwall has no releasePermission; an ignored call is its way)."""
    b = r4j(clock)
    half_open(b, clock)
    held = [b.acquire(clock.monotonic()) for _ in range(4)]
    assert all(p >= 0 for p in held)
    assert permits(b, clock, 2) == [False, False]
    b.on_outcome(held[0], clock.monotonic(), Kind.IGNORED, 0.0)
    assert permits(b, clock, 1) == [True]


def test_should_throw_when_no_further_test_calls_are_permitted(clock: FakeClock) -> None:
    """``R4J_SM`` shouldThrowCallNotPermittedExceptionWhenNotFurtherTestCallsArePermitted."""
    b = r4j(clock)
    half_open(b, clock)
    assert permits(b, clock, 4) == [True] * 4
    with pytest.raises(CircuitOpenError):
        b.admit(clock.monotonic(), (), {})
    assert b.rejected == 1


def test_should_only_permit_four_calls_in_half_open_state(clock: FakeClock) -> None:
    """``R4J_SM`` shouldOnlyPermitFourCallsInHalfOpenState, twice over a reopen."""
    b = r4j(clock, probe_timeout=60.0)
    half_open(b, clock)
    held = [b.acquire(clock.monotonic()) for _ in range(4)]
    assert permits(b, clock, 2) == [False, False]
    b.on_outcome(held[0], clock.monotonic(), Kind.FAILURE, 0.0)  # reopen
    clock.advance(b.retry_after(clock.monotonic()) or 0.0)
    assert permits(b, clock, 6) == [True] * 4 + [False, False]


def test_should_open_after_slow_call_rate_threshold_exceeded(clock: FakeClock) -> None:
    """``R4J_SM`` shouldOpenAfterSlowCallRateThresholdExceeded: slow F, slow S, fast F, fast S,
    slow S: the fifth call (a success) opens at 60 % slow. The window is sized so the 5 s
    calls stay in it."""
    b = r4j(clock, failure_rate=None, window=60.0, buckets=60)
    fail(b, clock, 5.0)
    ok(b, clock, 5.0)
    fail(b, clock, 0.1)
    ok(b, clock, 0.1)
    assert state(b) is S.CLOSED
    ok(b, clock, 5.0)
    assert state(b) is S.OPEN


def test_should_transition_to_half_open_after_wait_duration(clock: FakeClock) -> None:
    """``R4J_SM`` shouldTransitionToHalfOpenAfterWaitDuration: refused at +0 s and +3 s, a
    probe at +6 s, with a fresh window."""
    b = r4j(clock)
    b.trip("test")
    assert permits(b, clock, 1) == [False]
    clock.advance(3)
    assert state(b) is S.OPEN and permits(b, clock, 1) == [False]
    assert b.rejected == 2
    clock.advance(3)
    assert permits(b, clock, 1) == [True]
    assert state(b) is S.HALF_OPEN and b.metrics().calls == 0


def test_should_transition_to_half_open_after_wait_interval(clock: FakeClock) -> None:
    """``R4J_SM`` shouldTransitionToHalfOpenAfterWaitInterval: an exponential open interval (5 s,
    then 7.5 s) maps to ``open_duration_growth=1.5``."""
    b = r4j(clock, open_duration_growth=1.5, half_open_calls=1)
    b.trip("test")
    clock.advance(6)
    permit = b.acquire(clock.monotonic())
    b.on_outcome(permit, clock.monotonic(), Kind.FAILURE, 0.0)
    clock.advance(6)
    assert state(b) is S.OPEN  # 7.5 s not over
    clock.advance(5)
    assert permits(b, clock, 1) == [True]


def test_should_transition_back_to_open_when_failure_rate_is_above_threshold(
    clock: FakeClock,
) -> None:
    """``R4J_SM`` shouldTransitionBackToOpenStateWhenFailureRateIsAboveThreshold (F F S F →
    OPEN). Agrees on the outcome; floodwall reopens already at the first failed probe (a
    documented difference: a probe proves the dependency down, there is no half-open rate)."""
    b = r4j(clock)
    half_open(b, clock)
    fail(b, clock)
    assert state(b) is S.OPEN


def test_should_transition_back_to_open_when_slow_call_rate_is_above_threshold(
    clock: FakeClock,
) -> None:
    """``R4J_SM`` shouldTransitionBackToOpenStateWhenSlowCallRateIsAboveThreshold: slow probes
    reopen (floodwall at the first slow probe, as above)."""
    b = r4j(clock)
    half_open(b, clock)
    ok(b, clock, 5.0)
    assert state(b) is S.OPEN


def test_should_transition_back_to_closed_when_failure_is_below_threshold(
    clock: FakeClock,
) -> None:
    """``R4J_SM`` shouldTransitionBackToClosedStateWhenFailureIsBelowThreshold: F S S S closes in
    resilience4j (25 % < 50 %). Documented difference: floodwall reopens on the failed probe;
    four good probes close it."""
    b = r4j(clock)
    half_open(b, clock)
    fail(b, clock)
    assert state(b) is S.OPEN
    clock.advance(b.retry_after(clock.monotonic()) or 0.0)
    for _ in range(4):
        ok(b, clock)
    assert state(b) is S.CLOSED and b.metrics().calls == 0


def test_should_reset_metrics(clock: FakeClock) -> None:
    """``R4J_SM`` shouldResetMetrics."""
    b = r4j(clock)
    ok(b, clock)
    fail(b, clock)
    assert (b.metrics().calls, b.metrics().errors) == (2, 1)
    b.reset()
    assert (b.metrics().calls, b.metrics().errors) == (0, 0)


def test_should_record_metrics_in_metrics_only_state(clock: FakeClock) -> None:
    """``R4J_SM`` shouldRecordMetricsInMetricsOnlyState: every call passes and is counted, and
    the state never changes. Documented difference (docs/circuit-breaker.md), in names only:
    resilience4j's METRICS_ONLY is floodwall's DISABLED (shadow mode, with ``would_trip``
    events)."""
    b = r4j(clock)
    b.disable()
    for _ in range(5):
        fail(b, clock)
    assert state(b) is S.DISABLED and b.rejected == 0
    assert b.metrics().errors == 5


def test_should_force_open_circuit_breaker(clock: FakeClock) -> None:
    """``R4J_SM`` shouldForceOpenCircuitBreaker: no half-open after the wait duration."""
    b = r4j(clock)
    b.force_open()
    assert permits(b, clock, 1) == [False]
    clock.advance(6)
    assert permits(b, clock, 1) == [False]
    assert state(b) is S.FORCED_OPEN and b.rejected == 2


def test_should_disable_circuit_breaker(clock: FakeClock) -> None:
    """``R4J_SM`` shouldDisableCircuitBreaker: every call passes, nothing is counted, the state
    stays. Documented difference (docs/circuit-breaker.md), in names only: resilience4j's
    DISABLED is floodwall's FORCED_CLOSED (floodwall's DISABLED counts: the test above)."""
    b = r4j(clock)
    b.force_closed()
    ok(b, clock, 1.0)
    fail(b, clock, 1.0)
    assert state(b) is S.FORCED_CLOSED and b.metrics().calls == 0


def test_should_release_permission_when_exception_ignored(clock: FakeClock) -> None:
    """``R4J_SM`` shouldReleasePermissionWhenExceptionIgnored: three good probes, an ignored
    one (its permit released, still HALF_OPEN), then a recorded failure. resilience4j closes
    (1 of 4 failed); floodwall reopens on it (documented difference, see above)."""
    b = r4j(clock)
    half_open(b, clock)
    for _ in range(3):
        ok(b, clock)
        assert state(b) is S.HALF_OPEN
    end(b, clock, Kind.IGNORED)
    assert state(b) is S.HALF_OPEN
    fail(b, clock)
    assert state(b) is S.OPEN


def test_should_ignore_exceptions_and_then_transition_to_closed(clock: FakeClock) -> None:
    """``R4J_SM`` shouldIgnoreExceptionsAndThenTransitionToClosed: four ignored probes change
    nothing; four successes close."""
    b = r4j(clock)
    half_open(b, clock)
    for _ in range(4):
        end(b, clock, Kind.IGNORED)
        assert state(b) is S.HALF_OPEN
    for _ in range(3):
        ok(b, clock)
        assert state(b) is S.HALF_OPEN
    ok(b, clock)
    assert state(b) is S.CLOSED


def test_ignored_exception_type_is_classified_ignored(clock: FakeClock) -> None:
    """``R4J_SM`` setUp ``ignoreExceptions(NumberFormatException.class)``."""
    b = r4j(clock)
    assert b.classify(ValueError()) is Kind.IGNORED
    assert b.classify(Boom()) is Kind.FAILURE
    assert b.classify(TimeoutError()) is Kind.TIMEOUT


def test_should_reset_to_closed_state(clock: FakeClock) -> None:
    """``R4J_SM`` shouldResetToClosedState."""
    b = r4j(clock)
    b.trip("test")
    b.reset()
    assert state(b) is S.CLOSED


def test_should_reset_closed_state(clock: FakeClock) -> None:
    """``R4J_SM`` shouldResetClosedState: two successes counted, then gone."""
    b = r4j(clock)
    ok(b, clock)
    ok(b, clock)
    assert b.metrics().successes == 2
    b.reset()
    assert state(b) is S.CLOSED and b.metrics().calls == 0


def test_should_not_open_below_minimum_number_of_calls(clock: FakeClock) -> None:
    """``R4J_SM`` shouldOpenAfterFailureRateThresholdExceeded, first part: four failures stay
    CLOSED below the minimum of five calls."""
    b = r4j(clock)
    for _ in range(4):
        fail(b, clock)
    assert state(b) is S.CLOSED


def test_time_window_forgets_old_failures(clock: FakeClock) -> None:
    """resilience4j ``SlidingTimeWindowMetricsTest`` (``resilience4j-circuitbreaker/src/test/
    java/io/github/resilience4j/circuitbreaker/internal/``): calls older than the window no
    longer count."""
    b = r4j(clock)
    for _ in range(4):
        fail(b, clock)
    clock.advance(6)
    ok(b, clock)
    assert b.metrics().calls == 1 and state(b) is S.CLOSED


def test_count_window_slides(clock: FakeClock) -> None:
    """resilience4j ``FixedSizeSlidingWindowMetricsTest``: the window holds the last N calls."""
    b = CircuitBreaker("x", window_calls=5, minimum_calls=5, failure_rate=0.5, clock=clock)
    for _ in range(2):
        fail(b, clock)
    for _ in range(5):
        ok(b, clock)
    snap = b.metrics()
    assert (snap.calls, snap.errors) == (5, 0)


# == pybreaker tests/pybreaker_test.py =====================================================


def pybreaker_like(clock: FakeClock, fail_max: int = 5, reset_timeout: float = 60.0) -> Any:
    """pybreaker's ``CircuitBreaker(fail_max, reset_timeout)`` mapped per the migration guide."""
    return CircuitBreaker(
        "pyb",
        failure_rate=None,
        consecutive_failures=fail_max,
        open_duration=reset_timeout,
        max_open_duration=max(reset_timeout, 1.0),
        clock=clock,
    )


def call(b: CircuitBreaker, fn: Any) -> Any:
    return b.call(fn)


def boom() -> None:
    raise NotImplementedError


def missing() -> None:
    raise KeyError("x")


def test_successful_call(clock: FakeClock) -> None:
    """``PYB`` test_successful_call."""
    b = pybreaker_like(clock)
    assert call(b, lambda: True) is True
    assert state(b) is S.CLOSED


def test_one_failed_call(clock: FakeClock) -> None:
    """``PYB`` test_one_failed_call."""
    b = pybreaker_like(clock)
    with pytest.raises(NotImplementedError):
        call(b, boom)
    assert state(b) is S.CLOSED and b.metrics().errors == 1


def test_one_successful_call_after_failed_call(clock: FakeClock) -> None:
    """``PYB`` test_one_successful_call_after_failed_call: the streak is reset (pybreaker's
    fail_counter back to 0), so four more failures do not open a fail_max=5 breaker."""
    b = pybreaker_like(clock)
    with pytest.raises(NotImplementedError):
        call(b, boom)
    assert call(b, lambda: True)
    for _ in range(4):
        with pytest.raises(NotImplementedError):
            call(b, boom)
    assert state(b) is S.CLOSED


def test_several_failed_calls(clock: FakeClock) -> None:
    """``PYB`` test_several_failed_calls_setting_absent. Documented difference: pybreaker's
    third failing call raises CircuitBreakerError in place of the error; floodwall raises the
    call's own error and refuses from the next call on (pybreaker's
    ``throw_new_error_on_trip=False``, its test_throw_new_error_on_trip_false)."""
    b = pybreaker_like(clock, fail_max=3)
    for _ in range(3):
        with pytest.raises(NotImplementedError):
            call(b, boom)
    assert state(b) is S.OPEN
    with pytest.raises(CircuitOpenError):
        call(b, boom)


def test_failed_call_after_timeout(clock: FakeClock) -> None:
    """``PYB`` test_failed_call_after_timeout: after reset_timeout the trial call fails and
    the circuit opens again."""
    b = pybreaker_like(clock, fail_max=3, reset_timeout=0.5)
    for _ in range(3):
        with pytest.raises(NotImplementedError):
            call(b, boom)
    clock.advance(0.6)
    with pytest.raises(NotImplementedError):
        call(b, boom)
    assert state(b) is S.OPEN


def test_successful_after_timeout(clock: FakeClock) -> None:
    """``PYB`` test_successful_after_timeout: refused while open, then one trial success closes
    the circuit and runs the function once."""
    b = pybreaker_like(clock, fail_max=3, reset_timeout=1)
    runs = itertools.count()
    for _ in range(3):
        with pytest.raises(NotImplementedError):
            call(b, boom)
    with pytest.raises(CircuitOpenError):
        call(b, lambda: next(runs))
    clock.advance(2)
    call(b, lambda: next(runs))
    assert state(b) is S.CLOSED and next(runs) == 1


def test_failed_call_when_halfopen(clock: FakeClock) -> None:
    """``PYB`` test_failed_call_when_halfopen."""
    b = pybreaker_like(clock, reset_timeout=1)
    half_open(b, clock)
    with pytest.raises(NotImplementedError):
        call(b, boom)
    assert state(b) is S.OPEN


def test_successful_call_when_halfopen(clock: FakeClock) -> None:
    """``PYB`` test_successful_call_when_halfopen."""
    b = pybreaker_like(clock, reset_timeout=1)
    half_open(b, clock)
    assert call(b, lambda: True)
    assert state(b) is S.CLOSED


def test_close(clock: FakeClock) -> None:
    """``PYB`` test_close: an operator closes an open circuit (floodwall's ``reset``)."""
    b = pybreaker_like(clock, fail_max=3)
    for _ in range(3):
        with pytest.raises(NotImplementedError):
            call(b, boom)
    b.reset()
    assert state(b) is S.CLOSED and b.metrics().calls == 0


def test_transition_events(clock: FakeClock) -> None:
    """``PYB`` test_transition_events: closed->open, open->half-open, half-open->closed."""
    seen: list[str] = []
    b = CircuitBreaker(
        "pyb",
        failure_rate=None,
        consecutive_failures=1,
        open_duration=1.0,
        clock=clock,
        listeners=[lambda e: seen.append(f"{e.from_state}->{e.to_state}")],
    )
    b.trip("open")
    clock.advance(1.0)
    assert state(b) is S.HALF_OPEN
    ok(b, clock)
    assert seen == ["CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"]


def test_excluded_exceptions_do_not_count(clock: FakeClock) -> None:
    """``PYB`` test_new_with_custom_excluded_exceptions (``exclude=[...]``) is ``ignore=``."""
    b = CircuitBreaker(
        "pyb", failure_rate=None, consecutive_failures=2, ignore=LookupError, clock=clock
    )
    for _ in range(5):
        with pytest.raises(KeyError):
            call(b, missing)
    assert state(b) is S.CLOSED and b.metrics().calls == 0


def test_excluded_exception_does_not_break_the_streak(clock: FakeClock) -> None:
    """pybreaker's excluded errors are treated as successes (they reset ``fail_counter``);
    floodwall ignores them outright, so F, excluded, F opens at fail_max=2. A documented
    difference: an ignored error says nothing about the dependency's health."""
    b = CircuitBreaker(
        "pyb", failure_rate=None, consecutive_failures=2, ignore=LookupError, clock=clock
    )
    with pytest.raises(NotImplementedError):
        call(b, boom)
    with pytest.raises(KeyError):
        call(b, missing)
    with pytest.raises(NotImplementedError):
        call(b, boom)
    assert state(b) is S.OPEN


def test_call_with_args_and_kwargs(clock: FakeClock) -> None:
    """``PYB`` test_call_with_args, test_call_with_kwargs."""
    b = pybreaker_like(clock)
    assert b.call(lambda a, b: [a, b], 42, "abc") == [42, "abc"]
    assert b.call(lambda **kw: kw, a=1, b=2) == {"a": 1, "b": 2}


async def test_call_async(clock: FakeClock) -> None:
    """``PYB`` test_call_async_with_no_args."""
    b = pybreaker_like(clock)

    async def fn() -> bool:
        return True

    assert await b.call_async(fn) is True


def test_fail_max_reconfigured_live(clock: FakeClock) -> None:
    """``PYB`` test_fail_max_setter: the threshold changes on a live breaker."""
    b = pybreaker_like(clock, fail_max=5)
    b.reconfigure(consecutive_failures=10)
    assert b.options.consecutive_failures == 10
    for _ in range(9):
        with pytest.raises(NotImplementedError):
            call(b, boom)
    assert state(b) is S.CLOSED


def test_reset_timeout_reconfigured_live(clock: FakeClock) -> None:
    """``PYB`` test_reset_timeout_setter."""
    b = pybreaker_like(clock, reset_timeout=60)
    b.reconfigure(open_duration=30.0)
    assert b.options.open_duration == 30.0


# == tenacity tests/test_tenacity.py: stop and wait =========================================


def first(strategy: Any, n: int) -> list[float]:
    return list(itertools.islice(strategy.delays(), n))


def test_stop_after_attempt(clock: FakeClock) -> None:
    """tenacity ``TestStopConditions.test_stop_after_attempt``: three attempts, then stop."""
    runs = itertools.count(1)

    def always() -> None:
        next(runs)
        raise ConnectionError

    with pytest.raises(ConnectionError):
        Retry("x", attempts=3, backoff=NoBackoff(), budget=None, clock=clock).call(always)
    assert next(runs) == 4


def test_fixed_sleep() -> None:
    """tenacity ``TestWaitConditions.test_fixed_sleep``: ``wait_fixed(1)``."""
    assert first(Fixed(1.0), 3) == [1.0, 1.0, 1.0]


def test_incrementing_sleep() -> None:
    """tenacity ``TestWaitConditions.test_incrementing_sleep``: ``wait_incrementing(start=0.5,
    increment=1)``."""
    assert first(Linear(0.5, 1.0), 3) == [0.5, 1.5, 2.5]


def test_exponential() -> None:
    """tenacity ``TestWaitConditions.test_exponential``: ``wait_exponential()`` waits 1, 2, 4, 8.
    floodwall counts from ``base`` (here 1)."""
    assert first(Exponential(1.0, 2.0, cap=1000), 4) == [1.0, 2.0, 4.0, 8.0]


def test_exponential_with_max_wait() -> None:
    """tenacity ``TestWaitConditions.test_exponential_with_max_wait``: ``max=40`` caps."""
    assert first(Exponential(1.0, 2.0, cap=40), 8)[-3:] == [32.0, 40.0, 40.0]


def test_random_sleep() -> None:
    """tenacity ``TestWaitConditions.test_random_sleep``: full jitter draws in [0, ceiling)."""
    delays = first(FullJitter(1.0, 2.0, cap=1.0, rng=random.Random(3)), 100)
    assert all(0.0 <= d < 1.0 for d in delays) and len(set(delays)) > 90


def test_no_sleep() -> None:
    """tenacity ``TestWaitConditions.test_no_sleep``."""
    assert first(NoBackoff(), 3) == [0.0, 0.0, 0.0]


def test_retry_if_exception_of_type(clock: FakeClock) -> None:
    """tenacity ``test_retry_if_exception_of_type``: a ValueError is not retried by default
    (floodwall classifies it UNKNOWN); listing it in ``retry_on`` retries it."""
    runs = itertools.count(1)

    def bad() -> None:
        next(runs)
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        Retry("x", attempts=3, backoff=NoBackoff(), budget=None, clock=clock).call(bad)
    assert next(runs) == 2
    with pytest.raises(ValueError, match="bad input"):
        Retry(
            "x", attempts=3, backoff=NoBackoff(), budget=None, retry_on=ValueError, clock=clock
        ).call(bad)
    assert next(runs) == 6


# == resilience4j SemaphoreBulkheadTest and concurrency-limits ==============================

R4J_BH = "resilience4j-bulkhead/src/test/java/io/github/resilience4j/bulkhead/internal/"


def test_bulkhead_should_return_the_correct_name() -> None:
    """``R4J_BH`` SemaphoreBulkheadTest.shouldReturnTheCorrectName."""
    assert Bulkhead("test", max_concurrent=2).name == "test"


def test_bulkhead_permits_and_completions() -> None:
    """``R4J_BH`` SemaphoreBulkheadTest.testBulkhead: two permits, a third refused, each
    completion gives one back."""
    bulkhead = Bulkhead("test", max_concurrent=2)
    bulkhead.acquire()
    bulkhead.acquire()
    assert bulkhead.available == 0
    with pytest.raises(fw.BulkheadFullError):
        bulkhead.acquire()
    bulkhead.release()
    assert bulkhead.available == 1
    bulkhead.release()
    assert bulkhead.available == 2
    bulkhead.acquire()
    assert bulkhead.rejected == 1


def test_bulkhead_zero_max_concurrent_calls_is_refused() -> None:
    """``R4J_BH`` SemaphoreBulkheadTest.testZeroMaxConcurrentCalls: resilience4j builds a
    bulkhead that refuses everything; floodwall refuses the configuration (a bulkhead that
    admits nothing is an outage of its own making: use ``force_open`` on a breaker for that)."""
    with pytest.raises(ConfigError, match="max_concurrent"):
        Bulkhead("test", max_concurrent=0)


def test_bulkhead_create_with_defaults() -> None:
    """``R4J_BH`` SemaphoreBulkheadTest.testCreateWithDefaults. Documented difference:
    resilience4j's default is 25 concurrent calls, floodwall's 10 (Hystrix's semaphore
    default); neither waits by default."""
    bulkhead = Bulkhead("test")
    o = bulkhead.options
    assert (o.max_concurrent, o.max_queue, o.max_wait) == (10, 0, 0.0)


async def test_bulkhead_entry_timeout(clock: FakeClock) -> None:
    """``R4J_BH`` SemaphoreBulkheadTest.testEntryTimeout / testTryEnterWithTimeout: with the one
    permit taken, a caller waiting 10 ms is refused once the wait is over (fake clock)."""
    bulkhead = Bulkhead("test", max_concurrent=1, max_queue=1, max_wait=0.01, clock=clock)
    bulkhead.acquire()
    waiter = asyncio.ensure_future(bulkhead.acquire_async())
    for _ in range(5):
        await asyncio.sleep(0)
    assert bulkhead.queued == 1
    clock.advance(0.01)
    with pytest.raises(fw.BulkheadFullError):
        await waiter
    assert bulkhead.queued == 0 and bulkhead.in_flight == 1


def test_bulkhead_bypass_does_not_count() -> None:
    """concurrency-limits ``AbstractPartitionedLimiterTest``'s bypass cases (``bypassResolver``):
    a call the predicate matches runs even when every slot is busy and takes no slot."""
    bulkhead = Bulkhead("test", max_concurrent=1, bypass=lambda path: path == "/health")
    bulkhead.acquire()  # the only slot is busy
    assert bulkhead.call(lambda path: path, "/health") == "/health"
    assert bulkhead.in_flight == 1
    with pytest.raises(fw.BulkheadFullError):
        bulkhead.call(lambda path: path, "/orders")
    bulkhead.release()
    assert bulkhead.call(lambda path: path, "/orders") == "/orders"
    assert bulkhead.in_flight == 0
    with pytest.raises(ConfigError, match="bypass"):
        Bulkhead("test", bypass=True)  # type: ignore[arg-type]


def test_bulkhead_bypass_is_not_asked_on_direct_acquire() -> None:
    """concurrency-limits asks its bypass resolver about a request's context; floodwall's
    direct ``acquire()`` has no call to ask about, so it always takes a slot."""
    bulkhead = Bulkhead("test", max_concurrent=1, bypass=lambda *a, **k: True)
    bulkhead.acquire()
    assert bulkhead.in_flight == 1


# == Sentinel degrade rules (ExceptionCircuitBreakerTest, ResponseTimeCircuitBreakerTest) ====

SENTINEL_DEGRADE = "sentinel-core/src/test/java/com/alibaba/csp/sentinel/slots/block/degrade/"


def test_sentinel_exception_count_rule(clock: FakeClock) -> None:
    """``SENTINEL_DEGRADE`` circuitbreaker/ExceptionCircuitBreakerTest
    (DEGRADE_GRADE_EXCEPTION_COUNT), given the minimum request amount; floodwall's
    ``error_count``. Documented difference: Sentinel opens when the count is exceeded
    (``curCount > threshold``), floodwall when it is reached (``>=``, as resilience4j and Polly
    compare): Sentinel's ``count=3`` is ``error_count=4``."""
    b = CircuitBreaker(
        "s", failure_rate=None, error_count=3, minimum_calls=5, window=1.0, buckets=1, clock=clock
    )
    ok(b, clock)
    ok(b, clock)
    fail(b, clock)
    fail(b, clock)
    assert state(b) is S.CLOSED
    fail(b, clock)
    assert state(b) is S.OPEN


def test_sentinel_exception_ratio_rule(clock: FakeClock) -> None:
    """``SENTINEL_DEGRADE`` circuitbreaker/ExceptionCircuitBreakerTest
    (DEGRADE_GRADE_EXCEPTION_RATIO).
    Documented difference: a ratio exactly at the threshold opens floodwall (``>=``, with
    resilience4j and Polly) where Sentinel needs it exceeded."""
    b = CircuitBreaker("s", failure_rate=0.5, minimum_calls=4, window_calls=4, clock=clock)
    ok(b, clock)
    ok(b, clock)
    fail(b, clock)
    fail(b, clock)
    assert state(b) is S.OPEN


def test_sentinel_slow_ratio_is_strict(clock: FakeClock) -> None:
    """``SENTINEL_DEGRADE`` circuitbreaker/ResponseTimeCircuitBreakerTest: a request is slow
    when its RT is greater than ``count`` (max allowed RT); exactly at it is not."""
    b = CircuitBreaker(
        "s",
        failure_rate=None,
        slow_call_rate=0.5,
        slow_call_duration=0.05,
        minimum_calls=2,
        window_calls=2,
        clock=clock,
    )
    ok(b, clock, 0.05)
    ok(b, clock, 0.05)
    assert state(b) is S.CLOSED
    ok(b, clock, 0.0625)
    assert state(b) is S.OPEN


def test_sentinel_half_open_probe_recovers(clock: FakeClock) -> None:
    """``SENTINEL_DEGRADE`` CircuitBreakingIntegrationTest (recovery after the time window):
    after ``timeWindow`` one probe passes; its success closes the breaker."""
    b = CircuitBreaker("s", minimum_calls=1, open_duration=10.0, clock=clock)
    fail(b, clock)
    assert state(b) is S.OPEN
    clock.advance(10.0)
    ok(b, clock)
    assert state(b) is S.CLOSED


# == tenacity: more stop/wait/retry cases ==================================================


def test_stop_after_delay(clock: FakeClock) -> None:
    """tenacity ``TestStopConditions.test_stop_after_delay``: floodwall's ``deadline=`` stops
    before an attempt that could not finish in time (the attempts take 0.4 s each here)."""
    runs = itertools.count(1)

    def slow() -> None:
        next(runs)
        clock.advance(0.4)
        raise ConnectionError

    policy = Retry("x", attempts=10, backoff=Fixed(0.1), deadline=1.0, budget=None, clock=clock)
    with pytest.raises(ConnectionError):
        policy.call(slow)
    assert next(runs) - 1 == 2  # a third 0.4 s attempt after 0.1 s would end past 1 s


def test_wait_chain_is_linear_then_capped() -> None:
    """tenacity ``TestWaitConditions.test_incrementing_sleep`` with ``max``: a cap bounds it."""
    assert first(Linear(1.0, 1.0, cap=2.5), 4) == [1.0, 2.0, 2.5, 2.5]


def test_retry_on_result(clock: FakeClock) -> None:
    """tenacity ``test_retry_if_result``: a result the predicate flags is retried."""
    answers = iter([None, None, 3])
    policy = Retry(
        "x",
        attempts=3,
        backoff=NoBackoff(),
        budget=None,
        retry_on_result=lambda value: value is None,
        clock=clock,
    )
    assert policy.call(lambda: next(answers)) == 3


# == resilience4j RetryImpl: SupplierRetryTest and IntervalFunctionTest =====================

R4J_RETRY = (
    "resilience4j-retry/src/test/java/io/github/resilience4j/retry/internal/SupplierRetryTest.java"
)
R4J_INTERVAL = (
    "resilience4j-core/src/test/java/io/github/resilience4j/core/IntervalFunctionTest.java"
)


def r4j_retry(clock: FakeClock, **overrides: Any) -> Retry:
    """``Retry.ofDefaults``: 3 attempts, a fixed 500 ms wait, no budget (resilience4j has none)."""
    options: dict[str, Any] = {"attempts": 3, "backoff": Fixed(0.5), "budget": None}
    options.update(overrides)
    return Retry("id", clock=clock, **options)


class Service:
    """resilience4j's mocked HelloWorldService: answers from a script, counts its calls."""

    def __init__(self, *script: object) -> None:
        self.script = list(script)
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        step = self.script[min(self.calls, len(self.script)) - 1]
        if isinstance(step, BaseException):
            raise step
        return step


def test_retry_should_not_retry(clock: FakeClock) -> None:
    """``R4J_RETRY`` shouldNotRetry: a success is called once and never sleeps."""
    service = Service("Hello world")
    assert r4j_retry(clock).call(service) == "Hello world"
    assert (service.calls, clock.sleeps) == (1, [])


def test_retry_should_return_successfully_after_second_attempt(clock: FakeClock) -> None:
    """``R4J_RETRY`` shouldReturnSuccessfullyAfterSecondAttempt: one failure, one 500 ms wait
    (``RetryConfig.DEFAULT_WAIT_DURATION``), then the answer."""
    service = Service(ConnectionError("hello"), "Hello world")
    assert r4j_retry(clock).call(service) == "Hello world"
    assert (service.calls, clock.sleeps) == (2, [0.5])


def test_retry_should_return_after_three_attempts(clock: FakeClock) -> None:
    """``R4J_RETRY`` shouldReturnAfterThreeAttempts: three failures, the last error raised,
    two waits of 500 ms."""
    service = Service(ConnectionError("hello"))
    with pytest.raises(ConnectionError):
        r4j_retry(clock).call(service)
    assert (service.calls, clock.sleeps) == (3, [0.5, 0.5])


def test_retry_should_return_after_one_attempt(clock: FakeClock) -> None:
    """``R4J_RETRY`` shouldReturnAfterOneAttempt: ``maxAttempts(1)`` never retries."""
    service = Service(ConnectionError("hello"))
    with pytest.raises(ConnectionError):
        r4j_retry(clock, attempts=1).call(service)
    assert (service.calls, clock.sleeps) == (1, [])


def test_retry_should_return_after_one_attempt_and_ignore_exception(clock: FakeClock) -> None:
    """``R4J_RETRY`` shouldReturnAfterOneAttemptAndIgnoreException: an error the predicate
    excludes is raised at once (floodwall: ``business=`` errors are never retried)."""

    class HelloWorldError(Exception):
        pass

    service = Service(HelloWorldError())
    with pytest.raises(HelloWorldError):
        r4j_retry(clock, business=HelloWorldError).call(service)
    assert (service.calls, clock.sleeps) == (1, [])


def test_retry_should_retry_with_result(clock: FakeClock) -> None:
    """``R4J_RETRY`` shouldRetryWithResult: ``retryOnResult`` matching every answer with
    ``maxAttempts(2)`` calls twice and returns the last answer (not an error)."""
    service = Service("Hello world")
    policy = r4j_retry(clock, attempts=2, retry_on_result=lambda s: "Hello world" in s)
    assert policy.call(service) == "Hello world"
    assert service.calls == 2


def test_retry_should_return_after_three_attempts_and_recover_with_result(
    clock: FakeClock,
) -> None:
    """``R4J_RETRY`` shouldReturnAfterThreeAttemptsAndRecoverWithResult: error, flagged
    result, error: three calls and two 500 ms waits, then the last error (which the test's
    ``recover`` turns into a value; floodwall's is a ``Fallback`` outside the retry)."""
    service = Service(ConnectionError(), "Hello world", ConnectionError())
    policy = fw.Pipeline(
        fw.Fallback(value="Hello world from recovery function"),
        r4j_retry(clock, retry_on_result=lambda s: "Hello world" in s),
    )
    assert policy.call(service) == "Hello world from recovery function"
    assert (service.calls, clock.sleeps) == (3, [0.5, 0.5])


def test_retry_should_take_into_account_backoff_function(clock: FakeClock) -> None:
    """``R4J_RETRY`` shouldTakeIntoAccountBackoffFunction: ``ofExponentialBackoff(500, 2.0)``
    waits 500 ms, then 1 000 ms."""
    service = Service(ConnectionError())
    with pytest.raises(ConnectionError):
        r4j_retry(clock, backoff=Exponential(0.5, 2.0)).call(service)
    assert clock.sleeps == [0.5, 1.0]


def test_retry_interval_generates_exponential_intervals() -> None:
    """``R4J_INTERVAL`` generatesExponentialIntervals: ``ofExponentialBackoff(100, 1.5)`` gives
    100, 150, 225 ms."""
    assert first(Exponential(0.1, 1.5), 3) == pytest.approx([0.1, 0.15, 0.225])


def test_retry_interval_generates_capped_exponential_intervals() -> None:
    """``R4J_INTERVAL`` generatesCappedExponentialIntervals: ``ofExponentialBackoff(100, 1.5,
    200)`` gives 100, 150, 200 ms."""
    assert first(Exponential(0.1, 1.5, cap=0.2), 3) == pytest.approx([0.1, 0.15, 0.2])


def test_retry_interval_generates_exponential_random_intervals() -> None:
    """``R4J_INTERVAL`` generatesExponentialRandomIntervals: ``ofExponentialRandomBackoff(100,
    1.5, 0.5)``: retry n lies in 100 x 1.5^(n-1) x [0.5, 1.5]."""
    rng = random.Random(7)
    for _ in range(50):
        delays = first(Randomized(0.1, 1.5, randomization_factor=0.5, cap=100, rng=rng), 3)
        for n, delay in enumerate(delays):
            middle = 0.1 * 1.5**n
            assert 0.5 * middle <= delay <= 1.5 * middle


def test_retry_interval_rejects_out_of_bounds_randomization_factor() -> None:
    """``R4J_INTERVAL`` shouldRejectOutOfBoundsRandomizationFactor: resilience4j accepts
    [0, 1]; floodwall [0, 1) (a factor of 1 could draw a zero delay: a retry storm)."""
    with pytest.raises(ConfigError, match=r"randomization_factor must be in \[0, 1\), got 1"):
        Randomized(0.1, randomization_factor=1)
    with pytest.raises(ConfigError, match="randomization_factor"):
        Randomized(0.1, randomization_factor=-0.1)


# == resilience4j AtomicRateLimiter: AtomicRateLimiterTest ===================================

R4J_RL = (
    "resilience4j-ratelimiter/src/test/java/io/github/resilience4j/ratelimiter/internal/"
    "AtomicRateLimiterTest.java"
)
CYCLE = 0.25
"""The test's ``CYCLE_IN_NANOS``: 250 ms, one permit per cycle."""


def test_rate_limiter_permissions_in_first_cycle(clock: FakeClock) -> None:
    """``R4J_RL`` permissionsInFirstCycle: a fresh limiter has its whole limit available."""
    limiter = TokenBucket(f"1/{CYCLE}s", clock=clock)
    assert limiter.peek().remaining == 1


def test_rate_limiter_acquire_and_refresh(clock: FakeClock) -> None:
    """``R4J_RL`` acquireAndRefreshWithEventPublishing: one permit, then a refusal that says
    to wait a whole cycle; a cycle later one more permit and the same refusal."""
    limiter = TokenBucket(f"1/{CYCLE}s", clock=clock)
    for _ in range(2):
        assert limiter.acquire()
        refused = limiter.acquire()
        assert not refused
        assert refused.retry_after == pytest.approx(CYCLE)
        clock.advance(CYCLE)


def test_rate_limiter_rejected_by_timeout_non_blocking(clock: FakeClock) -> None:
    """``R4J_RL`` rejectedByTimeoutNonBlocking: with no timeout the second call is refused at
    once; one time unit before the next cycle the wait left is that unit. resilience4j counts
    nanoseconds; floodwall's rate steps count whole microseconds and round a wait up to the
    next one (docs/rate-limiting.md), so the unit here is 1 µs."""
    limiter = TokenBucket(f"1/{CYCLE}s", clock=clock)
    assert limiter.acquire()
    assert not limiter.acquire()
    clock.advance(CYCLE - 1e-6)
    assert limiter.peek().retry_after == pytest.approx(1e-6, abs=1e-12)


async def _callers_at_once(limiter: Any, clock: FakeClock, n: int, until: float) -> list[bool]:
    """``n`` callers of ``limiter.call_async`` at the same instant, then the clock moves on to
    ``until`` in small steps: whether each was admitted (the waits are in ``clock.sleeps``)."""
    start = clock.monotonic()

    async def one() -> bool:
        try:
            await limiter.call_async(_nothing)
        except fw.RateLimitedError:
            return False
        return True

    tasks = [asyncio.ensure_future(one()) for _ in range(n)]
    await asyncio.sleep(0)
    while clock.monotonic() - start < until:
        clock.advance(0.0005)
        await asyncio.sleep(0)
    return list(await asyncio.gather(*tasks))


async def _nothing() -> None:
    return None


async def test_rate_limiter_reserve_few_then_skip_cycles(clock: FakeClock) -> None:
    """``R4J_RL`` reserveFewThenSkipCyclesBeforeRefresh: with a timeout of one cycle and the
    permit taken, a caller waits for the next cycle and the one after it (two cycles away) is
    refused at once; after six idle cycles the limiter holds its limit (one permit), not the
    permits of every cycle it skipped."""
    limiter = TokenBucket(f"1/{CYCLE}s", clock=clock, max_wait=CYCLE)
    assert limiter.acquire()
    assert await _callers_at_once(limiter, clock, 2, CYCLE + 0.01) == [True, False]
    assert clock.sleeps == [pytest.approx(CYCLE)]
    clock.advance(6 * CYCLE)
    assert limiter.peek().remaining == 1


async def test_rate_limiter_reserve_permissions_upfront(clock: FakeClock) -> None:
    """``R4J_RL`` reservePermissionsUpfront: 3 permits per 10 ms, a 12 ms timeout, nine
    callers at once: three go now, three wait, three are refused (their turn is past the
    timeout). Documented difference (docs/rate-limiting.md): resilience4j refreshes whole
    cycles, so its three waiters all wait for the next cycle (~10 ms); floodwall's token bucket
    refills smoothly, so they wait 3.3, 6.7 and 10 ms (each rounded up to the microsecond, the
    rate steps' unit)."""
    limiter = TokenBucket("3/10ms", clock=clock, max_wait=0.012)
    admitted = await _callers_at_once(limiter, clock, 9, 0.02)
    assert admitted == [True] * 6 + [False] * 3
    # the first three: no wait
    assert clock.sleeps == pytest.approx([0.003334, 0.006667, 0.01], abs=1e-9)


def test_rate_limiter_weight_greater_than_limit_per_period(clock: FakeClock) -> None:
    """``R4J_RL`` reserveManyCyclesIfWegithgreaterThenLimitPerPeriod: resilience4j books a
    3-permit request on a 1-per-cycle limiter several cycles ahead. Documented difference
    (docs/rate-limiting.md): a cost above the bucket's capacity can never be paid at once, and
    floodwall says so (``retry_after`` = inf) rather than book a debt of several cycles."""
    limiter = TokenBucket(f"1/{CYCLE}s", clock=clock, max_wait=5 * CYCLE)
    refused = limiter.acquire(cost=3)
    assert not refused
    assert refused.retry_after == math.inf


# == Polly v8 Core: retry, hedging, fallback, timeout, manual control =======================

POLLY = "Polly test/Polly.Core.Tests/"


class FixedDraw:
    """An rng whose every draw is ``value`` (Polly's tests replace its randomizer the same
    way)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_polly_constant_backoff() -> None:
    """``POLLY`` Retry/RetryHelperTests.cs Constant_Ok: a constant 1 s delay is 1 s every time."""
    assert first(Fixed(1.0), 3) == [1.0, 1.0, 1.0]


def test_polly_linear_backoff() -> None:
    """``POLLY`` Retry/RetryHelperTests.cs Linear_Ok: linear from 1 s waits 1, 2, 3 s."""
    assert first(Linear(1.0, 1.0), 3) == [1.0, 2.0, 3.0]


def test_polly_exponential_backoff() -> None:
    """``POLLY`` Retry/RetryHelperTests.cs Exponential_Ok: exponential from 1 s waits 1, 2, 4 s."""
    assert first(Exponential(1.0, 2.0), 3) == [1.0, 2.0, 4.0]


def test_polly_constant_jitter() -> None:
    """``POLLY`` Retry/RetryHelperTests.cs Constant_Jitter_Ok: Polly's jitter on a constant
    delay is +/- 25 % (``delay x (0.75 + r x 0.5)``): draws 0, 0.4 and 0.6 give 0.75, 0.95 and
    1.05 s. floodwall's ``Randomized`` with multiplier 1 and factor 0.25 is the same formula."""
    delays = [
        next(Randomized(1.0, multiplier=1.0, randomization_factor=0.25).delays(FixedDraw(r)))
        for r in (0.0, 0.4, 0.6)
    ]
    assert delays == pytest.approx([0.75, 0.95, 1.05])


def test_polly_overflow_with_max_delay_returns_max_delay() -> None:
    """``POLLY`` Retry/RetryHelperTests.cs GetRetryDelay_OverflowWithMaxDelay_ReturnsMaxDelay:
    the 1 001st exponential delay from one day, capped at two days, is two days (no overflow)."""
    day = 86400.0
    delays = Exponential(day, 2.0, cap=2 * day).delays()
    assert list(itertools.islice(delays, 1000, 1001)) == [2 * day]


def test_polly_max_delay_is_respected(clock: FakeClock) -> None:
    """``POLLY`` Retry/RetryResilienceStrategyTests.cs MaxDelay_EnsureRespected: linear from the
    default 2 s, capped at 123 ms: three retries wait 123 ms each."""
    service = Service(ConnectionError())
    policy = Retry("x", attempts=4, backoff=Linear(2.0, 2.0, cap=0.123), budget=None, clock=clock)
    with pytest.raises(ConnectionError):
        policy.call(service)
    assert clock.sleeps == [0.123, 0.123, 0.123]


def test_polly_retry_count_respected(clock: FakeClock) -> None:
    """``POLLY`` Retry/RetryResilienceStrategyTests.cs Retry_RetryCount_Respected: 12 retries of
    a flagged result. Documented difference (docs/retries.md): Polly's ``MaxRetryAttempts``
    counts retries, floodwall's ``attempts`` every call, so it is ``attempts=13``."""
    service = Service(0)
    policy = Retry(
        "x",
        attempts=13,
        backoff=NoBackoff(),
        budget=None,
        retry_on_result=lambda value: value == 0,
        clock=clock,
    )
    assert policy.call(service) == 0
    assert service.calls == 13
    assert policy.retries == 12


async def _run_on(clock: FakeClock, coro: Any, step: float = 0.01, limit: float = 60.0) -> Any:
    """Run ``coro`` while the fake clock moves on in ``step`` s increments (at most ``limit``)."""
    task = asyncio.ensure_future(coro)
    start = clock.monotonic()
    while not task.done() and clock.monotonic() - start < limit:
        for _ in range(10):  # let whatever the last step woke run before time moves again
            await asyncio.sleep(0)
        clock.advance(step)
    return await task


async def test_polly_all_attempts_fail_and_the_original_is_the_slowest(clock: FakeClock) -> None:
    """``POLLY`` Hedging/HedgingResilienceStrategyTests.cs
    ExecuteAsync_AllAttemptsFailAndTheOriginalCallIsTheSlowest_EnsureOriginalCallsResultReturned
    in (nearly) parallel mode, two hedges: the hedges fail at once, the original fails last
    after 200 ms, and its failure is the answer. Documented differences (docs/retries.md):
    floodwall answers with the last failure, Polly with the original call's in every mode (in
    latency mode, the original failing before the delay, they differ); and a hedge delay must
    be > 0 (Polly's 0, "parallel mode", is 10 ms here)."""
    calls = itertools.count(1)

    async def execute() -> str:
        number = next(calls)
        if number == 1:
            await clock.async_sleep(0.2)
            raise ConnectionError("1st")
        raise ConnectionError(str(number))

    policy = Hedge(0.01, max_hedges=2, on_failure=True, budget=None, clock=clock)
    with pytest.raises(ConnectionError, match="1st"):
        await _run_on(clock, policy.call_async(execute))
    assert next(calls) == 4


async def test_polly_hedge_answers_with_the_first_success(clock: FakeClock) -> None:
    """``POLLY`` Hedging/HedgingResilienceStrategyTests.cs
    ExecuteAsync_EnsurePrimaryTaskCancelled_Ok: the primary hangs, the hedge started after the
    delay answers, and the primary is cancelled."""
    cancelled: list[int] = []
    started: list[float] = []
    calls = itertools.count(1)

    async def execute() -> str:
        number = next(calls)
        started.append(clock.monotonic())
        try:
            await clock.async_sleep(10.0 if number == 1 else 0.05)
        except asyncio.CancelledError:
            cancelled.append(number)
            raise
        return f"attempt {number}"

    policy = Hedge(1.0, budget=None, clock=clock)
    assert await _run_on(clock, policy.call_async(execute)) == "attempt 2"
    await asyncio.sleep(0)
    assert cancelled == [1]
    assert started[1] - started[0] == pytest.approx(1.0, abs=0.0101)  # the delay, one step


def test_polly_fallback_handles_exception() -> None:
    """``POLLY`` Fallback/FallbackResilienceStrategyTests.cs Handle_Exception_Ok: a handled
    error answers with the fallback."""
    policy = fw.Fallback(value="secondary", on=InvalidOperationError)
    assert policy.call(_raise_invalid_operation) == "secondary"


def test_polly_fallback_unhandled_exception_passes_through() -> None:
    """``POLLY`` Fallback/FallbackResilienceStrategyTests.cs Handle_UnhandledException_Ok: an
    error the fallback does not handle reaches the caller unchanged."""
    policy = fw.Fallback(value="secondary", on=InvalidOperationError)
    with pytest.raises(KeyError):
        policy.call(_raise_key_error)


def test_polly_fallback_handles_result() -> None:
    """``POLLY`` Fallback/FallbackResilienceStrategyTests.cs Handle_Result_Ok: a result the
    predicate flags answers with the fallback; others pass through."""
    policy = fw.Fallback(value="secondary", failure_result=lambda value: value == "error")
    assert policy.call(lambda: "error") == "secondary"
    assert policy.call(lambda: "fine") == "fine"


class InvalidOperationError(Exception):
    """.NET's InvalidOperationException."""


def _raise_invalid_operation() -> str:
    raise InvalidOperationError


def _raise_key_error() -> str:
    raise KeyError("missing")


async def test_polly_timeout(clock: FakeClock) -> None:
    """``POLLY`` Timeout/TimeoutResilienceStrategyTests.cs Execute_Timeout: a call slower than
    the timeout is abandoned with a timeout error (floodwall's ``TimeoutExceeded``, also a
    ``TimeoutError``), after the timeout and not after the call."""

    abandoned: list[float] = []

    async def slow() -> str:
        try:
            await clock.async_sleep(10.0)
        except asyncio.CancelledError:
            abandoned.append(clock.monotonic())
            raise
        return "late"

    policy = fw.Timeout(2.0, clock=clock)
    with pytest.raises(fw.TimeoutExceeded):
        await _run_on(clock, policy.call_async(slow))
    assert abandoned[0] - 1000.0 == pytest.approx(2.0, abs=0.0101)  # the timeout, one step


def test_polly_timeout_infinite_is_no_timeout() -> None:
    """``POLLY`` Timeout/TimeoutResilienceStrategyTests.cs Execute_NoTimeout: Polly treats an
    infinite timeout as none. Documented difference (docs/timeouts.md): floodwall refuses it at
    construction; a call without a time box simply has no ``Timeout`` in its pipeline."""
    with pytest.raises(
        ConfigError, match="seconds must be a finite number of seconds > 0, got inf"
    ):
        fw.Timeout(math.inf)


def test_polly_manual_control_isolate_then_close(clock: FakeClock) -> None:
    """``POLLY`` CircuitBreaker/Controller/CircuitStateControllerTests.cs IsolateAsync_Ok: an
    isolated circuit refuses every call whatever its health, with no retry-after, and closing
    it lets calls through (floodwall: ``force_open`` and ``reset``)."""
    b = CircuitBreaker("x", clock=clock)
    b.force_open()
    with pytest.raises(CircuitOpenError) as refused:
        b.call(lambda: None)
    assert refused.value.retry_after is None
    assert state(b) is S.FORCED_OPEN
    clock.advance(3600.0)
    assert state(b) is S.FORCED_OPEN  # never times out into half-open
    b.reset()
    assert b.call(lambda: "ok") == "ok"
    assert state(b) is S.CLOSED


# == Sentinel flow control: DefaultControllerTest, ThrottlingControllerTest, WarmUpControllerTest

SENTINEL_FLOW = "sentinel-core/src/test/java/com/alibaba/csp/sentinel/slots/block/flow/controller/"


def test_sentinel_default_controller_qps(clock: FakeClock) -> None:
    """``SENTINEL_FLOW`` DefaultControllerTest.testCanPassForQps: a QPS threshold of 10 lets the
    request that makes 10 pass and refuses the next one in the same second (floodwall's
    sliding-window counter, Sentinel's statistic being a sliding window too)."""
    limiter = SlidingWindowCounter("10/s", clock=clock)
    for _ in range(9):
        assert limiter.acquire()
        clock.advance(0.01)
    assert limiter.acquire()  # passQps 9: passes
    assert not limiter.acquire()  # passQps 10: refused


def test_sentinel_default_controller_thread_count() -> None:
    """``SENTINEL_FLOW`` DefaultControllerTest.testCanPassForThreadCount: a thread threshold of 8
    admits with 7 in flight and refuses with 8 (floodwall's ``Bulkhead``)."""
    bulkhead = Bulkhead("s", max_concurrent=8)
    for _ in range(7):
        bulkhead.acquire()
    bulkhead.acquire()  # the eighth: 7 were in flight
    with pytest.raises(fw.BulkheadFullError):
        bulkhead.acquire()
    assert bulkhead.in_flight == 8


async def test_sentinel_throttling_controller_normal(clock: FakeClock) -> None:
    """``SENTINEL_FLOW`` ThrottlingControllerTest.testThrottlingControllerNormal: 10 QPS paced,
    500 ms of queueing allowed: six requests at once all pass, the last after 500 ms
    (floodwall's ``LeakyBucket``: Sentinel's throttling controller is a leaky bucket). The
    sixth slot is five 0.1 s intervals away, 0.5000000000000001 s in floats: it was refused
    until the wait bound got the queue bound's slack (Sentinel counts whole milliseconds)."""
    limiter = LeakyBucket("10/s", clock=clock, max_wait=0.5)
    admitted = await _callers_at_once(limiter, clock, 6, 0.6)
    assert admitted == [True] * 6
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])


async def test_sentinel_throttling_controller_queue_timeout(clock: FakeClock) -> None:
    """``SENTINEL_FLOW`` ThrottlingControllerTest.testThrottlingControllerQueueTimeout: ten
    requests at once against 10 QPS with 500 ms of queueing: those whose turn is later than
    500 ms are blocked (here exactly four: turns at 0.6-0.9 s)."""
    limiter = LeakyBucket("10/s", clock=clock, max_wait=0.5)
    admitted = await _callers_at_once(limiter, clock, 10, 0.6)
    assert admitted == [True] * 6 + [False] * 4


def test_sentinel_throttling_controller_zero_threshold() -> None:
    """``SENTINEL_FLOW`` ThrottlingControllerTest.testThrottlingControllerZeroThreshold:
    Sentinel builds a controller of 0 QPS that refuses every request. Documented difference
    (docs/rate-limiting.md): floodwall refuses a zero rate at construction (a limiter that can
    never admit is an outage of its own making; switch the call off with a degradation level
    instead)."""
    with pytest.raises(ConfigError, match="rate"):
        LeakyBucket("0/s")


def test_sentinel_warm_up_controller(clock: FakeClock) -> None:
    """``SENTINEL_FLOW`` WarmUpControllerTest.testWarmUp (count 10, warm-up 10 s, cold factor
    3): cold, the limiter admits about count / 3 per second, so two requests 0.1 s apart are
    too fast; after 10 s of steady load at 10/s it admits 10/s, and no faster."""
    limiter = WarmUp("10/s", warmup=10.0, clock=clock)
    assert limiter.acquire()
    clock.advance(0.1)
    assert not limiter.acquire()  # cold: about 0.3 s between requests
    clock.advance(0.2)
    assert limiter.acquire()
    for _ in range(200):  # 20 s of load, one request every 0.1 s when admitted
        clock.advance(0.1)
        limiter.acquire()
    clock.advance(0.1)
    assert limiter.acquire()  # warm: 10/s
    clock.advance(0.05)
    assert not limiter.acquire()  # 20/s is still too fast
