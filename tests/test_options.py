"""Issue 16: options as frozen, validated objects shared by code and configuration, swapped whole.

A policy's options object holds the documented defaults, refuses a bad value naming it, cannot
be changed in place, is what the configuration builds, and is replaced in one assignment: a
reader in another thread never sees half of a reconfiguration.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import floodwall as fw
from floodwall import adaptive, degrade, ratelimit, shared
from floodwall._core import defaults
from floodwall._core.options import kwargs
from floodwall.breaker import BreakerOptions
from floodwall.bulkhead import BulkheadOptions
from floodwall.chaos import ChaosOptions, ChaosResult
from floodwall.config import parse
from floodwall.fallback import FallbackOptions
from floodwall.hedge import HedgeOptions
from floodwall.retry import RetryOptions
from floodwall.timeout import TimeoutOptions

A = BreakerOptions(failure_rate=0.5, minimum_calls=10, open_duration=5.0, window=10.0)
B = BreakerOptions(failure_rate=0.25, minimum_calls=40, open_duration=30.0, window=20.0)


def fingerprint(options: BreakerOptions) -> tuple[Any, ...]:
    """Fields that differ between A and B, and a derived one that must follow its source."""
    return (
        options.failure_rate,
        options.minimum_calls,
        options.open_duration,
        options.window,
        options.failure_ratio,
    )


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Let threads interleave every microsecond, so a torn read has every chance to show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("fast_switching")
def test_reconfigure_is_seen_whole_by_concurrent_readers(clock: fw.FakeClock) -> None:
    """One thread flips the options between A and B 10 000 times while two others read them and
    run calls through the breaker: every read is A or B entirely (never A's rate with B's
    minimum), the derived exact ratio always belongs to the rate beside it, and no call fails.
    (Written field by field on one object instead, the same run shows thousands of mixed reads.)
    """
    breaker = fw.CircuitBreaker("flip", clock=clock, **kwargs(A))
    allowed = {fingerprint(A), fingerprint(B)}
    stop = threading.Event()
    torn: list[tuple[Any, ...]] = []
    reads = [0, 0]
    errors: list[BaseException] = []

    def reader(index: int) -> None:
        try:
            while not stop.is_set():
                seen = fingerprint(breaker.options)
                if seen not in allowed:
                    torn.append(seen)
                breaker.call(lambda: None)
                reads[index] += 1
        except BaseException as exc:  # a failure here must fail the test, not vanish
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        started = threading.Event()
        while min(reads) == 0 and not errors:  # both readers are reading before the flips
            started.wait(0.001)
        for i in range(10_000):
            breaker.reconfigure(B if i % 2 == 0 else A)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not errors
    assert not torn
    assert min(reads) > 1  # both readers kept reading while the options changed
    assert breaker.options == A  # the last one applied
    assert breaker.state is fw.CircuitState.CLOSED


def test_reconfigure_takes_changes_or_a_whole_object(clock: fw.FakeClock) -> None:
    breaker = fw.CircuitBreaker(clock=clock, minimum_calls=5)
    before = breaker.options
    breaker.reconfigure(failure_rate=0.25)
    assert breaker.options == dataclasses.replace(before, failure_rate=0.25)
    breaker.reconfigure(B)
    assert breaker.options is B
    with pytest.raises(fw.ConfigError, match="minimum_calls must be an integer >= 1, got 0"):
        breaker.reconfigure(minimum_calls=0)
    with pytest.raises(fw.ConfigError, match="options must be a BreakerOptions, got 3"):
        breaker.reconfigure(3)  # type: ignore[arg-type]
    assert breaker.options is B  # a refused change leaves the options in force


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            BreakerOptions(),
            {
                "failure_rate": defaults.BREAKER_FAILURE_RATE,
                "minimum_calls": defaults.BREAKER_MINIMUM_CALLS,
                "window": defaults.BREAKER_WINDOW,
                "buckets": defaults.BREAKER_BUCKETS,
                "open_duration": defaults.BREAKER_OPEN_DURATION,
                "open_duration_growth": defaults.BREAKER_OPEN_DURATION_GROWTH,
                "max_open_duration": defaults.BREAKER_MAX_OPEN_DURATION,
                "half_open_calls": defaults.BREAKER_HALF_OPEN_CALLS,
                "probe_timeout": defaults.BREAKER_PROBE_TIMEOUT,
            },
        ),
        (
            BulkheadOptions(),
            {
                "max_concurrent": defaults.BULKHEAD_MAX_CONCURRENT,
                "max_queue": defaults.BULKHEAD_MAX_QUEUE,
                "max_wait": defaults.BULKHEAD_MAX_WAIT,
            },
        ),
        (TimeoutOptions(1.0), {"thread_limit": defaults.TIMEOUT_THREAD_LIMIT}),
        (
            RetryOptions(),
            {
                "attempts": defaults.RETRY_ATTEMPTS,
                "max_retry_after": defaults.RETRY_MAX_RETRY_AFTER,
                "max_level": defaults.RETRY_MAX_LEVEL,
            },
        ),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, dict) else "",
)
def test_defaults_come_from_the_one_defaults_module(options: Any, expected: dict[str, Any]) -> None:
    assert {name: getattr(options, name) for name in expected} == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.__setattr__(next(iter(expected)), 1)


def test_policies_hold_the_options_they_were_built_with(clock: fw.FakeClock) -> None:
    assert fw.CircuitBreaker(clock=clock, **kwargs(B)).options == B
    bulkhead = BulkheadOptions(max_concurrent=3, max_queue=2, max_wait=0.5)
    assert fw.Bulkhead(clock=clock, **kwargs(bulkhead)).options == bulkhead
    assert fw.Timeout(2.5, mode="thread", clock=clock).options == TimeoutOptions(2.5, "thread")
    retry = fw.Retry(attempts=5, retry_on=KeyError, clock=clock, budget=None).options
    assert retry == RetryOptions(
        attempts=5, retry_on=fw.Outcomes((KeyError,)), backoff=retry.backoff
    )


def test_the_configuration_builds_the_same_objects(clock: fw.FakeClock) -> None:
    document = parse(
        {
            "resources": {
                "pay": {
                    "circuit_breaker": {"minimum_calls": 40, "window": "20s", "window_calls": 30},
                    "bulkhead": {"max_concurrent": 3, "max_queue": 2, "max_wait": "500ms"},
                    "timeout": "2500ms",
                }
            }
        }
    )
    config = document.resources["pay"]
    assert config.circuit_breaker is not None
    assert config.bulkhead is not None
    assert config.timeout is not None
    # the count window clamps minimum_calls in the one options object, from a file as in code
    assert config.circuit_breaker.options() == BreakerOptions(
        minimum_calls=40, window=20.0, window_calls=30
    )
    assert config.circuit_breaker.options().minimum_calls == 30
    assert config.bulkhead.options() == BulkheadOptions(3, 2, 0.5)
    assert config.timeout.options() == TimeoutOptions(2.5)
    registry = fw.config.Registry(document, clock=clock)
    resource = registry.get("pay")
    assert resource.breaker is not None and resource.breaker.options == BreakerOptions(
        minimum_calls=40, window=20.0, window_calls=30
    )
    assert resource.bulkhead is not None and resource.bulkhead.options == BulkheadOptions(3, 2, 0.5)
    assert resource.timeout is not None and resource.timeout.options == TimeoutOptions(2.5)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("circuit_breaker", "failure_rate", 1.5),
        ("circuit_breaker", "open_duration_growth", 0.5),
        ("bulkhead", "max_concurrent", 0),
        ("timeout", "thread_limit", 0),
        ("retry", "attempts", 0),
        ("retry", "max_retry_after", "-1s"),
    ],
)
def test_a_file_and_code_get_the_same_words(section: str, key: str, value: Any) -> None:
    """The message under the field's path is the options object's own, minus the name."""
    base: dict[str, Any] = {"bulkhead": {"max_concurrent": 1}, "timeout": {"seconds": 1}}
    body = {**base.get(section, {}), key: value}
    with pytest.raises(fw.ConfigError) as from_file:
        parse({"resources": {"r": {section: body}}}, "x.yaml")
    options = {
        "circuit_breaker": BreakerOptions,
        "bulkhead": BulkheadOptions,
        "timeout": TimeoutOptions,
        "retry": RetryOptions,
    }[section]
    code_value = -1.0 if value == "-1s" else value
    code_body = {**base.get(section, {}), key: code_value}
    with pytest.raises(fw.ConfigError) as from_code:
        options(**code_body)
    said = str(from_code.value).removeprefix(f"{key} ")
    if value == "-1s":  # a negative duration is refused by the unit parser, before the option
        assert f"x.yaml: resources.r.{section}.{key}: " in str(from_file.value)
    else:
        assert f"x.yaml: resources.r.{section}.{key}: {said}" in str(from_file.value)


# -- small leftovers: a clock and a store refusing what they cannot mean ----------------------


def test_a_fake_sleep_of_negative_seconds_is_refused(clock: fw.FakeClock) -> None:
    with pytest.raises(ValueError, match="seconds must be a finite number of seconds >= 0, got -1"):
        clock.sleep(-1)
    assert clock.sleeps == []
    assert clock.monotonic() == 1000.0


@pytest.mark.parametrize(
    "url",
    [
        "memory://",
        "sqlite:///unused.db",
        "host://unused",
        "redis://127.0.0.1:1",
        "redis+cluster://127.0.0.1:1",
        "postgresql://user@127.0.0.1:1/db",
    ],
)
def test_connect_refuses_an_unknown_option_naming_it(url: str) -> None:
    """Before any connection: a misspelt option must not wait for the first call (or, passed
    through to a client library, never be noticed)."""
    from floodwall.stores import connect

    with pytest.raises(fw.ConfigError, match="bogus"):
        connect(url, bogus=1)


# -- issue 16, step 1: adaptive limits and shedders ------------------------------------------

ADAPTIVE_DEFAULTS: list[tuple[type[Any], dict[str, Any]]] = [
    (
        adaptive.AIMDOptions,
        {
            "initial_limit": defaults.AIMD_INITIAL_LIMIT,
            "min_limit": defaults.AIMD_MIN_LIMIT,
            "max_limit": defaults.AIMD_MAX_LIMIT,
            "backoff_ratio": defaults.AIMD_BACKOFF_RATIO,
            "timeout": defaults.AIMD_TIMEOUT,
        },
    ),
    (
        adaptive.VegasOptions,
        {
            "initial_limit": defaults.VEGAS_INITIAL_LIMIT,
            "max_concurrency": defaults.VEGAS_MAX_CONCURRENCY,
            "smoothing": defaults.VEGAS_SMOOTHING,
            "alpha": None,
            "beta": None,
            "probe_multiplier": defaults.VEGAS_PROBE_MULTIPLIER,
        },
    ),
    (
        adaptive.GradientOptions,
        {
            "initial_limit": defaults.GRADIENT_INITIAL_LIMIT,
            "min_limit": defaults.GRADIENT_MIN_LIMIT,
            "max_concurrency": defaults.GRADIENT_MAX_CONCURRENCY,
            "smoothing": defaults.GRADIENT_SMOOTHING,
            "queue_size": None,
            "rtt_tolerance": defaults.GRADIENT_RTT_TOLERANCE,
            "probe_interval": defaults.GRADIENT_PROBE_INTERVAL,
            "backoff_ratio": defaults.GRADIENT_BACKOFF_RATIO,
        },
    ),
    (
        adaptive.Gradient2Options,
        {
            "initial_limit": None,  # 20, with the cold allowance of 100 (see Gradient2Limit)
            "min_limit": defaults.GRADIENT2_MIN_LIMIT,
            "max_concurrency": defaults.GRADIENT2_MAX_CONCURRENCY,
            "smoothing": defaults.GRADIENT2_SMOOTHING,
            "decrease_smoothing": defaults.GRADIENT2_DECREASE_SMOOTHING,
            "queue_size": adaptive.square_root,
            "long_window": defaults.GRADIENT2_LONG_WINDOW,
            "rtt_tolerance": defaults.GRADIENT2_RTT_TOLERANCE,
            "cold_limit": None,
        },
    ),
    (
        adaptive.BBROptions,
        {
            "window": defaults.BBR_WINDOW,
            "buckets": defaults.BBR_BUCKETS,
            "cpu_threshold": defaults.BBR_CPU_THRESHOLD,
            "cooldown": defaults.BBR_COOLDOWN,
            "rt_resolution": defaults.BBR_RT_RESOLUTION,
            "retry_after": defaults.SHED_RETRY_AFTER,
        },
    ),
    (
        adaptive.DagorOptions,
        {
            "threshold": defaults.DAGOR_QUEUE_THRESHOLD,
            "window": defaults.DAGOR_WINDOW,
            "window_requests": defaults.DAGOR_WINDOW_REQUESTS,
            "early_window": defaults.DAGOR_EARLY_WINDOW,
            "early_requests": defaults.DAGOR_EARLY_REQUESTS,
            "surge": defaults.DAGOR_SURGE,
            "business_levels": defaults.DAGOR_BUSINESS_LEVELS,
            "user_levels": defaults.DAGOR_USER_LEVELS,
            "alpha": defaults.DAGOR_ALPHA,
            "beta": defaults.DAGOR_BETA,
            "max_wait_ratio": defaults.DAGOR_MAX_WAIT_RATIO,
            "overflow_share": defaults.DAGOR_OVERFLOW_SHARE,
        },
    ),
    (
        adaptive.ThrottleOptions,
        {
            "k": defaults.THROTTLE_K,
            "window": defaults.THROTTLE_WINDOW,
            "buckets": defaults.THROTTLE_BUCKETS,
            "min_requests": 0,
            "max_reject": 1.0,
            "backend_rejections": fw.Outcomes(kinds=frozenset({"rejected", "timeout"})),
            "rejected_result": None,
        },
    ),
    (
        adaptive.AdaptiveLimiterOptions,
        {
            "partitions": None,
            "backlog_size": 0,
            "backlog_timeout": defaults.LIFO_BACKLOG_TIMEOUT,
            "backlog_order": "lifo",
            "drop_on": fw.Outcomes(kinds=frozenset({"timeout", "rejected"})),
        },
    ),
]


def check_options_object(
    options_type: type[Any],
    expected: dict[str, Any],
    required: dict[str, Any] | None = None,
    unchecked: frozenset[str] = frozenset(),
) -> None:
    """The defaults are the documented ones, every field is there, the object is frozen, and
    every checked field refuses a bad value with a message that starts with its name
    (``required``: valid values for the fields without a default; ``unchecked``: fields that
    take any value, such as a fallback's answer)."""
    given = required or {}
    fields = {f.name for f in dataclasses.fields(options_type) if f.init}
    assert set(expected) <= fields
    assert set(options_type.CHECKS) == fields - unchecked  # every other field has its check
    made = options_type(**given)
    assert {name: getattr(made, name) for name in expected} == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.__setattr__(next(iter(expected)), 1)
    for name in sorted(fields - unchecked):
        with pytest.raises(fw.ConfigError, match=f"^{name} must .*, got 'bogus'"):
            options_type(**{**given, name: "bogus"})


@pytest.mark.parametrize(
    ("options_type", "expected"), ADAPTIVE_DEFAULTS, ids=lambda v: getattr(v, "__name__", "")
)
def test_adaptive_options_are_documented_frozen_and_checked(
    options_type: type[Any], expected: dict[str, Any]
) -> None:
    check_options_object(options_type, expected)


def test_adaptive_options_check_the_rules_between_fields() -> None:
    with pytest.raises(fw.ConfigError, match=r"max_limit must be >= min_limit \(30\), got 10"):
        adaptive.AIMDOptions(min_limit=30, max_limit=10)
    with pytest.raises(fw.ConfigError, match="initial_limit must be <= max_concurrency"):
        adaptive.VegasOptions(initial_limit=50, max_concurrency=10)
    for gradient in (adaptive.GradientOptions, adaptive.Gradient2Options):
        with pytest.raises(fw.ConfigError, match="max_concurrency must be >= min_limit"):
            gradient(min_limit=30, max_concurrency=10)
    with pytest.raises(fw.ConfigError, match="early_window must be <= window"):
        adaptive.DagorOptions(window=0.5, early_window=1.0)
    with pytest.raises(fw.ConfigError, match=r"partition shares must add up to <= 1.0, got 1.2"):
        adaptive.AdaptiveLimiterOptions(partitions={"live": 0.7, "batch": 0.5})
    with pytest.raises(fw.ConfigError, match="queue_size must be an integer >= 1 or a function"):
        adaptive.GradientOptions(queue_size=0)
    assert adaptive.Gradient2Options(queue_size=0).queue_size == 0  # Gradient2 takes no queue


def test_adaptive_policies_hold_the_options_they_were_built_with(clock: fw.FakeClock) -> None:
    aimd = adaptive.AIMDOptions(initial_limit=30, min_limit=5, max_limit=90, timeout=2.0)
    assert adaptive.AIMDLimit(**kwargs(aimd)).options == aimd
    vegas = adaptive.VegasOptions(initial_limit=10, alpha=3, beta=6, smoothing=0.5)
    assert adaptive.VegasLimit(**kwargs(vegas)).options == vegas
    gradient = adaptive.GradientOptions(queue_size=4, probe_interval=None)
    assert adaptive.GradientLimit(**kwargs(gradient)).options == gradient
    gradient2 = adaptive.Gradient2Options(initial_limit=20, min_limit=20, queue_size=4)
    assert adaptive.Gradient2Limit(**kwargs(gradient2)).options == gradient2
    bbr = adaptive.BBROptions(window=1.0, buckets=10, retry_after=None)
    limiter = adaptive.BBRLimiter(cpu=lambda: 0.0, clock=clock, **kwargs(bbr))
    assert limiter.options == bbr
    assert limiter.core.options is limiter.options  # one object for the shell and its core
    assert limiter.retry_after is None and limiter.core.bucket_seconds == 0.1
    dagor = adaptive.DagorOptions(threshold=0.05, max_wait_ratio=None)
    assert adaptive.QueueingTimeAdmission(clock=clock, **kwargs(dagor)).options == dagor
    shares = {"live": 0.7, "batch": 0.2}
    limiter_options = adaptive.AdaptiveLimiterOptions(shares, backlog_size=5, backlog_order="fifo")
    shaped = adaptive.AdaptiveLimiter(
        adaptive.FixedLimit(10), clock=clock, **kwargs(limiter_options)
    )
    assert shaped.options == limiter_options and shaped.options.partitions == shares
    assert shaped.backlog_size == 5
    assert {p.name for p in shaped.partition_stats()} >= {"live", "batch"}
    throttle = adaptive.ThrottleOptions(k=1.5, backend_rejections=fw.Outcomes((KeyError,)))
    built = adaptive.ClientThrottle(clock=clock, **kwargs(throttle))
    assert built.options == throttle
    assert built.k == 1.5 and built.backend_rejections == fw.Outcomes((KeyError,))


@pytest.mark.parametrize(
    ("algorithm", "options"),
    [
        ("aimd", adaptive.AIMDOptions(initial_limit=30, backoff_ratio=0.8)),
        ("vegas", adaptive.VegasOptions(initial_limit=10, alpha=2, beta=4)),
        ("gradient", adaptive.GradientOptions(min_limit=2, probe_interval=500)),
        ("gradient2", adaptive.Gradient2Options(initial_limit=10, long_window=100)),
    ],
)
def test_the_configuration_builds_the_same_adaptive_options(
    clock: fw.FakeClock, algorithm: str, options: Any
) -> None:
    given = {k: v for k, v in kwargs(options).items() if v != getattr(type(options)(), k)}
    document = parse({"resources": {"r": {"adaptive": {"algorithm": algorithm, "options": given}}}})
    section = document.resources["r"].adaptive
    assert section is not None
    assert section.algorithm_options() == options
    assert section.limiter_options() == adaptive.AdaptiveLimiterOptions()
    resource = fw.config.Registry(document, clock=clock).get("r")
    assert resource.adaptive is not None
    assert resource.adaptive.algorithm.options == options  # type: ignore[attr-defined]
    assert resource.adaptive.options == adaptive.AdaptiveLimiterOptions()


def test_a_file_gets_the_adaptive_options_words() -> None:
    with pytest.raises(fw.ConfigError) as from_code:
        adaptive.AIMDOptions(backoff_ratio=1.5)
    with pytest.raises(fw.ConfigError) as from_file:
        parse(
            {
                "resources": {
                    "r": {"adaptive": {"algorithm": "aimd", "options": {"backoff_ratio": 1.5}}}
                }
            },
            "x.yaml",
        )
    assert f"x.yaml: resources.r.adaptive: {from_code.value}" in str(from_file.value)


# -- issue 16, step 2: rate limiters, in process and shared -----------------------------------

TEN = ratelimit.Rate(10, 1.0)
RATE_DEFAULTS: list[tuple[type[Any], dict[str, Any], dict[str, Any]]] = [
    (ratelimit.WindowOptions, {"rate": "10/s"}, {"rate": TEN, "max_wait": 0.0}),
    (
        ratelimit.TokenBucketOptions,
        {"rate": "10/s"},
        {"rate": TEN, "burst": None, "initial": None, "max_wait": defaults.RATE_LIMIT_MAX_WAIT},
    ),
    (ratelimit.GCRAOptions, {"rate": 10}, {"rate": TEN, "burst": None, "max_wait": 0.0}),
    (
        ratelimit.LeakyBucketOptions,
        {"rate": "10/s"},
        {"rate": TEN, "queue": None, "max_wait": float("inf")},
    ),
    (
        ratelimit.WarmUpOptions,
        {"rate": "10/s", "warmup": 5.0},
        {"cold_factor": defaults.WARMUP_COLD_FACTOR, "max_wait": 0.0},
    ),
    (
        ratelimit.KeyedOptions,
        {},
        {
            "max_keys": defaults.RATE_LIMIT_MAX_KEYS,
            "overflow": "reject",
            "key": None,
            "max_wait": None,
        },
    ),
    (
        shared.GlobalLimitOptions,
        {"algorithm": "gcra", "rate": "10/s"},
        {
            "burst": None,
            "initial": None,
            "on_store_error": "local",
            "expected_instances": 1,
            "max_wait": defaults.RATE_LIMIT_MAX_WAIT,
            "batch": True,
            "max_batch": defaults.GLOBAL_MAX_BATCH,
        },
    ),
    (
        shared.LeaseOptions,
        {"algorithm": "gcra", "rate": "10/s"},
        {"lease": None, "lease_ttl": defaults.LEASE_TTL, "on_store_error": "local"},
    ),
    (
        shared.TimeSliceOptions,
        {"rate": "10/s"},
        {
            "slice_length": defaults.TIMESLICE_LENGTH,
            "on_store_error": "local",
            "expected_instances": 1,
            "background": True,
        },
    ),
    (
        shared.FrequencyOptions,
        {"limit": 5, "per": 3600.0},
        {"on_store_error": "fail_open", "expected_instances": 1},
    ),
]


@pytest.mark.parametrize(
    ("options_type", "required", "expected"),
    RATE_DEFAULTS,
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_rate_limit_options_are_documented_frozen_and_checked(
    options_type: type[Any], required: dict[str, Any], expected: dict[str, Any]
) -> None:
    check_options_object(options_type, expected, required)


def test_rate_limit_options_check_the_rules_between_fields() -> None:
    assert ratelimit.TokenBucketOptions("5/h").rate == ratelimit.Rate(5, 3600.0)  # kept as said
    with pytest.raises(fw.ConfigError, match=r"initial must be a number in \[0, 10\]"):
        ratelimit.TokenBucketOptions("10/s", initial=11)
    assert ratelimit.TokenBucketOptions("10/s", burst=20, initial=21).initial == 21
    with pytest.raises(fw.ConfigError, match="burst applies to token_bucket and gcra only"):
        shared.GlobalLimitOptions("fixed", "10/s", burst=5)
    with pytest.raises(fw.ConfigError, match="initial applies to token_bucket only"):
        shared.GlobalLimitOptions("gcra", "10/s", initial=5)
    with pytest.raises(fw.ConfigError, match="burst applies to token_bucket and gcra only"):
        shared.LeaseOptions("sliding", "10/s", burst=5)


def test_rate_limiters_hold_the_options_they_were_built_with(clock: fw.FakeClock) -> None:
    built: list[tuple[Any, Any]] = [
        (ratelimit.FixedWindow, ratelimit.WindowOptions("5/h", max_wait=1.0)),
        (ratelimit.SlidingLog, ratelimit.WindowOptions("10/s")),
        (ratelimit.SlidingWindowCounter, ratelimit.WindowOptions("1/30s")),
        (ratelimit.TokenBucket, ratelimit.TokenBucketOptions("10/s", burst=3, initial=2.0)),
        (ratelimit.GCRA, ratelimit.GCRAOptions("10/s", burst=0)),
        (ratelimit.LeakyBucket, ratelimit.LeakyBucketOptions("10/s", queue=3)),
        (ratelimit.WarmUp, ratelimit.WarmUpOptions("10/s", warmup=5.0, cold_factor=2.0)),
    ]
    for cls, options in built:
        limiter = cls(clock=clock, **kwargs(options))
        assert limiter.options == options, cls
        assert limiter.rate == options.rate and limiter.max_wait == options.max_wait, cls
    keyed = ratelimit.KeyedOptions(max_keys=10, overflow="shared", key=str, max_wait=0.5)
    table = ratelimit.Keyed(ratelimit.GCRA("10/s", clock=clock), **kwargs(keyed))
    assert table.options == keyed and (table.max_keys, table.max_wait) == (10, 0.5)
    with pytest.raises(fw.ConfigError, match="key must be a callable of the call's arguments"):
        ratelimit.Keyed(ratelimit.GCRA("10/s", clock=clock), key=5)  # type: ignore[arg-type]
    bucket = ratelimit.TokenBucket("10/s", burst=3, initial=2.0, clock=clock)
    assert (bucket.burst, bucket.initial, bucket.limit) == (3, 2.0, 4)
    store = fw.stores.MemoryStore(clock=clock)
    global_options = shared.GlobalLimitOptions("token_bucket", "10/s", burst=4, initial=2.0)
    global_limit = shared.GlobalLimiter(store=store, clock=clock, **kwargs(global_options))
    assert global_limit.options == global_options and global_limit.limit == 5
    lease = shared.LeaseOptions("gcra", "100/s", lease=5, lease_ttl=0.5)
    leased = shared.LeasedLimiter(store=store, clock=clock, **kwargs(lease))
    assert leased.options == lease and (leased.lease, leased.lease_ttl) == (5, 0.5)
    timeslice = shared.TimeSliceOptions("10/s", slice_length=2.0, background=False)
    sliced = shared.TimeSliceLimiter(store=store, clock=clock, **kwargs(timeslice))
    assert sliced.options == timeslice and sliced.slice_length == 2.0
    frequency = shared.FrequencyOptions(2, 60.0, expected_instances=2)
    limited = fw.Frequency(store=store, clock=clock, **kwargs(frequency))
    assert limited.options == frequency and limited.local_limit == 1


@pytest.mark.parametrize(
    ("section", "expected", "kind"),
    [
        ({"rate": "5/h"}, ratelimit.GCRAOptions("5/h"), ratelimit.GCRA),
        (
            {"rate": "10/s", "algorithm": "token_bucket", "burst": 3},
            ratelimit.TokenBucketOptions("10/s", burst=3),
            ratelimit.TokenBucket,
        ),
        ({"rate": 2, "algorithm": "leaky"}, ratelimit.LeakyBucketOptions(2), ratelimit.LeakyBucket),
        ({"rate": "1/30s", "algorithm": "fixed"}, ratelimit.WindowOptions("1/30s"), None),
        ({"rate": "10/s", "algorithm": "sliding_log"}, ratelimit.WindowOptions("10/s"), None),
        (
            {"rate": "10/s", "algorithm": "sliding", "scope": "global", "expected_instances": 2},
            shared.GlobalLimitOptions("sliding", "10/s", expected_instances=2),
            shared.GlobalLimiter,
        ),
    ],
)
def test_the_configuration_builds_the_same_rate_limit_options(
    clock: fw.FakeClock, section: dict[str, Any], expected: Any, kind: Any
) -> None:
    document = parse({"resources": {"r": {"rate_limit": section}}})
    config = document.resources["r"].rate_limit
    assert config is not None
    assert config.options() == expected
    limiter = fw.config.Registry(document, clock=clock).get("r").limiter
    assert limiter is not None
    assert limiter.options == expected  # type: ignore[union-attr]  # the algorithms have one
    if kind is not None:
        assert type(limiter) is kind


def test_a_file_gets_the_rate_limit_options_words() -> None:
    with pytest.raises(fw.ConfigError) as from_code:
        shared.GlobalLimitOptions("fixed", "10/s", burst=5)
    with pytest.raises(fw.ConfigError) as from_file:
        parse(
            {
                "resources": {
                    "r": {
                        "rate_limit": {
                            "rate": "10/s",
                            "algorithm": "fixed",
                            "scope": "global",
                            "burst": 5,
                        }
                    }
                }
            },
            "x.yaml",
        )
    assert f"x.yaml: resources.r.rate_limit: {from_code.value}" in str(from_file.value)


# -- issue 16, step 3: fallback, cache, idempotency, hedge, sampled drop, levels, chaos --------

OTHER_DEFAULTS: list[tuple[type[Any], dict[str, Any], dict[str, Any], frozenset[str]]] = [
    (
        degrade.SampledDropOptions,
        {},
        {"ratio": 0.0, "on_drop": None, "drop_factory": None, "key": None, "when": None},
        frozenset({"on_drop"}),
    ),
    (
        FallbackOptions,
        {"value": []},
        {"on": None, "kinds": None, "failure_result": None, "factory": None},
        frozenset({"value"}),
    ),
    (
        shared.CacheOptions,
        {},
        {
            "ttl": defaults.CACHE_TTL,
            "stale_ttl": defaults.CACHE_STALE_TTL,
            "max_entries": defaults.CACHE_MAX_ENTRIES,
            "read_only": False,
        },
        frozenset(),
    ),
    (
        shared.IdempotencyOptions,
        {},
        {
            "ttl": defaults.IDEMPOTENCY_TTL,
            "lock_ttl": defaults.IDEMPOTENCY_LOCK_TTL,
            "required": False,
            "on_store_error": "fail_closed",
        },
        frozenset(),
    ),
    (
        HedgeOptions,
        {"delay": 0.05},
        {
            "max_hedges": defaults.HEDGE_MAX_HEDGES,
            "percentile": None,
            "min_samples": defaults.HEDGE_MIN_SAMPLES,
            "respect_marker": True,
            "on_failure": False,
            "window": defaults.RETRY_BUDGET_WINDOW,
            "buckets": defaults.RETRY_BUDGET_BUCKETS,
        },
        frozenset(),
    ),
    (
        degrade.PriorityGateOptions,
        {"max_concurrent": 10},
        {"reserve": degrade.LevelReserve(), "level": 1},
        frozenset(),
    ),
    (
        degrade.LevelReserve,
        {},
        {
            "level2": defaults.PRIORITY_RESERVE_LEVEL2,
            "level3": defaults.PRIORITY_RESERVE_LEVEL3,
        },
        frozenset(),
    ),
    (
        degrade.ShedOptions,
        {},
        {
            "shed_above": defaults.SHED_ABOVE,
            "restore_below": defaults.SHED_RESTORE_BELOW,
            "shed_after": defaults.SHED_AFTER,
            "restore_after": defaults.SHED_RESTORE_AFTER,
            "restore_growth": defaults.SHED_RESTORE_GROWTH,
            "max_restore_after": defaults.SHED_MAX_RESTORE_AFTER,
        },
        frozenset(),
    ),
    (ChaosOptions, {}, {"rate": 1.0, "enabled": True, "schedule": None}, frozenset()),
]


@pytest.mark.parametrize(
    ("options_type", "required", "expected", "unchecked"),
    OTHER_DEFAULTS,
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_other_options_are_documented_frozen_and_checked(
    options_type: type[Any],
    required: dict[str, Any],
    expected: dict[str, Any],
    unchecked: frozenset[str],
) -> None:
    check_options_object(options_type, expected, required, unchecked)


def test_other_options_check_the_rules_between_fields() -> None:
    with pytest.raises(fw.ConfigError, match=r"give exactly one of value=\.\.\. or factory=\.\.\."):
        FallbackOptions()
    with pytest.raises(fw.ConfigError, match=r"give exactly one of value=\.\.\. or factory=\.\.\."):
        FallbackOptions(1, factory=lambda exc: 2)
    assert shared.CacheOptions().handled == fw.Outcomes((Exception,))  # any Exception
    timeouts = FallbackOptions(None, on=KeyError, kinds=("timeout",))
    assert timeouts.handled == fw.Outcomes((KeyError,), frozenset({"timeout"}))
    with pytest.raises(fw.ConfigError, match=r"stale_ttl must be >= ttl \(10\), got 5"):
        shared.CacheOptions(ttl=10, stale_ttl=5)
    with pytest.raises(fw.ConfigError, match=r"lock_ttl must be <= ttl \(10\), got 60"):
        shared.IdempotencyOptions(ttl=10)
    with pytest.raises(fw.ConfigError, match=r"level3 must be in \[level2"):
        degrade.LevelReserve(level2=0.5, level3=0.2)


def test_other_policies_hold_the_options_they_were_built_with(clock: fw.FakeClock) -> None:
    dropped = degrade.SampledDropOptions(0.5, on_drop="later", key=str)
    assert fw.SampledDrop(clock=clock, **kwargs(dropped)).options == dropped
    fallback = FallbackOptions("cached", kinds=frozenset({"circuit_open"}))
    built = fw.Fallback(clock=clock, **kwargs(fallback))
    assert built.options == fallback and built.handled == fallback.handled
    cache = shared.CacheOptions(ttl=5.0, stale_ttl=50.0, max_entries=10, read_only=True)
    assert fw.Cache(clock=clock, **kwargs(cache)).options == cache
    store = fw.stores.MemoryStore(clock=clock)
    idempotency = shared.IdempotencyOptions(ttl=100.0, lock_ttl=10.0, required=True)
    assert fw.Idempotency(store, clock=clock, **kwargs(idempotency)).options == idempotency
    hedge = HedgeOptions(0.05, max_hedges=2, percentile=0.9, on_failure=True)
    hedged = fw.Hedge(clock=clock, budget=None, **kwargs(hedge))
    assert hedged.options == hedge and (hedged.max_hedges, hedged.percentile) == (2, 0.9)
    gate = degrade.PriorityGateOptions(4, degrade.LevelReserve(0.2, 0.5), level=2)
    held = fw.PriorityGate(clock=clock, **kwargs(gate))
    assert held.options == gate and held.reserve == gate.reserve
    chaos = ChaosResult("boom", rate=0.25, allow=True, clock=clock)
    assert chaos.options == ChaosOptions(rate=0.25)


def test_the_configuration_builds_the_same_other_options(clock: fw.FakeClock) -> None:
    document = parse(
        {
            "allow_chaos": True,
            "resources": {
                "r": {
                    "sampled_drop": {"ratio": 0.25},
                    "fallback": {"value": [], "kinds": ["circuit_open", "timeout"]},
                    "cache": {"ttl": "5s", "stale_ttl": "1m", "max_entries": 50},
                    "idempotency": {"ttl": "1h", "lock_ttl": "30s", "required": True},
                    "chaos": {"result": "boom", "rate": 0.5},
                }
            },
        }
    )
    config = document.resources["r"]
    assert config.sampled_drop is not None and config.fallback is not None
    assert config.cache is not None and config.idempotency is not None
    sampled = degrade.SampledDropOptions(0.25)
    fallback = FallbackOptions([], kinds=("circuit_open", "timeout"))
    cache = shared.CacheOptions(5.0, 60.0, 50)
    idempotency = shared.IdempotencyOptions(3600.0, 30.0, required=True)
    assert config.sampled_drop.options() == sampled
    assert config.fallback.options() == fallback
    assert config.cache.options() == cache
    assert config.idempotency.options() == idempotency
    resource = fw.config.Registry(document, clock=clock).get("r")
    assert resource.sampled is not None and resource.sampled.options == sampled
    assert resource.fallback is not None and resource.fallback.options == fallback
    assert resource.cache is not None and resource.cache.options == cache
    built = [p for p in resource.pipeline.policies if isinstance(p, fw.Idempotency)]
    assert [p.options for p in built] == [idempotency]
    assert resource.chaos is not None and resource.chaos.options == ChaosOptions(rate=0.5)


@pytest.mark.parametrize(
    ("section", "key", "value", "options"),
    [
        ("sampled_drop", "ratio", 1.5, degrade.SampledDropOptions),
        ("cache", "max_entries", 0, shared.CacheOptions),
        ("idempotency", "required", "yes", shared.IdempotencyOptions),
    ],
)
def test_a_file_gets_the_other_options_words(
    section: str, key: str, value: Any, options: type[Any]
) -> None:
    with pytest.raises(fw.ConfigError) as from_code:
        options(**{key: value})
    with pytest.raises(fw.ConfigError) as from_file:
        parse({"resources": {"r": {section: {key: value}}}}, "x.yaml")
    said = str(from_code.value).removeprefix(f"{key} ")
    assert f"x.yaml: resources.r.{section}.{key}: " in str(from_file.value)
    if section != "idempotency":  # a flag is refused by the schema's own scalar rule first
        assert said in str(from_file.value)


@pytest.mark.usefixtures("fast_switching")
def test_sampled_drop_reconfigure_is_seen_whole_by_concurrent_calls() -> None:
    """One thread flips a sampled drop between "pass everything" and "drop everything,
    answering 'b'" (whole options, and set_ratio between a number and a live callable) while
    two others call through it: every call passes or answers 'b' (never the old answer with
    the new ratio), and the last ratio set stands (a reading under the old live callable
    never overwrites it)."""

    def pause() -> bool:  # lets the flipping thread run between deciding and answering
        time.sleep(0)
        return True

    a = degrade.SampledDropOptions(0.0, on_drop="a", when=pause)
    b = degrade.SampledDropOptions(1.0, on_drop="b", when=pause)
    drop = fw.SampledDrop(**kwargs(a))
    stop = threading.Event()
    mixed: list[Any] = []
    calls = [0, 0]
    errors: list[BaseException] = []

    def caller(index: int) -> None:
        try:
            while not stop.is_set():
                answer = drop.call(lambda: "ran")
                if answer not in ("ran", "b"):
                    mixed.append(answer)
                calls[index] += 1
        except BaseException as exc:  # a failure here must fail the test, not vanish
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        while min(calls) == 0 and not errors:
            stop.wait(0.001)
        for i in range(5_000):
            drop.reconfigure(b if i % 2 == 0 else a)
        drop.reconfigure(b)
        for i in range(5_000):
            drop.set_ratio((lambda: 1.0) if i % 2 == 0 else 1.0, announce=False)
        drop.set_ratio(0.0, announce=False)
        settled = calls[:]
        while min(c - s for c, s in zip(calls, settled, strict=True)) < 50 and not errors:
            stop.wait(0.001)  # the callers keep reading after the last change
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not errors
    assert not mixed
    assert min(calls) > 1
    assert drop.ratio == 0.0 and drop.options.on_drop == "b"


@pytest.mark.usefixtures("fast_switching")
def test_chaos_reconfigure_is_seen_whole_by_concurrent_readers(clock: fw.FakeClock) -> None:
    a = ChaosOptions(rate=0.0, enabled=True)
    b = ChaosOptions(rate=1.0, enabled=False)
    chaos = ChaosResult("boom", allow=True, clock=clock, rate=a.rate, enabled=a.enabled)
    allowed = {(a.rate, a.enabled), (b.rate, b.enabled)}
    stop = threading.Event()
    torn: list[Any] = []
    reads = [0, 0]
    errors: list[BaseException] = []

    def reader(index: int) -> None:
        try:
            while not stop.is_set():
                seen = chaos.options
                if (seen.rate, seen.enabled) not in allowed:
                    torn.append(seen)
                if chaos.call(lambda: "ran") != "ran":  # rate 1 only ever comes switched off
                    torn.append("injected")
                reads[index] += 1
        except BaseException as exc:  # a failure here must fail the test, not vanish
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        while min(reads) == 0 and not errors:
            stop.wait(0.001)
        for i in range(10_000):
            chaos.reconfigure(b if i % 2 == 0 else a)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not errors
    assert not torn
    assert min(reads) > 1
    assert chaos.options == a
