"""The configuration document: one schema for every policy, in YAML or TOML, with human units.

Shape (keys may be added; these keep their names)::

    defaults:            # inherited by every resource, key by key
      timeout: 2s
      retry: {attempts: 3, backoff: {kind: exponential, base: 100ms, cap: 2s, jitter: full}}
      circuit_breaker: {failure_rate: 0.5, minimum_calls: 20, window: 10s, open_duration: 5s}
    resources:           # one per dependency or endpoint
      payments:
        level: 1         # 1 critical, 2 degradable, 3 optional
        timeout: 5s
        bulkhead: {max_concurrent: 10, max_queue: 20}
        retry: {attempts: 1}
      reviews:
        level: 3
        fallback: {value: []}
    stores:
      default: memory://

A policy section set to ``false`` (or ``null``) switches that policy off for the resource even
when ``defaults`` has it. Every model forbids unknown keys, so a typo is an error, not a silently
ignored setting.

A section with a policy's options object (``circuit_breaker``, ``bulkhead``, ``timeout``, the
options of ``retry``, ``budget``) checks each field with that object's own checks and builds the
object itself (:meth:`CircuitBreakerConfig.options`, …): a bad value gets the same message from a
file as from code, under the path of the field.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from types import NoneType
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall._core.options import Checks, check_field, optional
from floodwall.adaptive import (
    AdaptiveLimiterOptions,
    AIMDOptions,
    Gradient2Options,
    GradientOptions,
    VegasOptions,
)
from floodwall.backoff import (
    Backoff,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    Fixed,
    FullJitter,
    Linear,
    NoBackoff,
    Uniform,
)
from floodwall.breaker import BreakerOptions
from floodwall.budget import CHECKS as BUDGET_CHECKS
from floodwall.bulkhead import BulkheadOptions
from floodwall.config.units import Duration
from floodwall.degrade import SampledDropOptions
from floodwall.fallback import FallbackOptions
from floodwall.ratelimit import (
    GCRAOptions,
    LeakyBucketOptions,
    TokenBucketOptions,
    WindowOptions,
    parse_rate,
)
from floodwall.retry import RetryOptions
from floodwall.shared import CacheOptions, GlobalLimitOptions, IdempotencyOptions
from floodwall.timeout import TimeoutOptions

__all__ = [
    "AdaptiveConfig",
    "BackoffConfig",
    "BudgetConfig",
    "BulkheadConfig",
    "CacheConfig",
    "CircuitBreakerConfig",
    "Document",
    "FallbackConfig",
    "IdempotencyConfig",
    "RateLimitConfig",
    "ResourceConfig",
    "RetryConfig",
    "SampledDropConfig",
    "TimeoutConfig",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_scalars(cls, value: Any, info: ValidationInfo) -> Any:
        """A number is a number and a flag is true or false: pydantic's lax mode would read
        ``true`` as 1, ``b"1"`` as 1 and ``"yes"`` as true. (A duration has its own parser:
        ``"5s"``.)"""
        name = info.field_name
        assert name is not None
        kind = _scalar_kind(cls.model_fields[name])
        if kind == "number" and isinstance(value, bool | str | bytes | bytearray):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if kind == "flag" and not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value


def _scalar_kind(field: FieldInfo) -> str | None:
    """``"number"`` for an int/float field, ``"flag"`` for a bool one (``None`` allowed in
    both when optional), else ``None`` (anything with a parser of its own: durations, rates)."""
    if any(type(m).__module__.startswith("pydantic.functional") for m in field.metadata):
        return None  # a parser of its own (a duration, a rate)
    members = {a for a in get_args(field.annotation) or (field.annotation,) if a is not NoneType}
    if any(get_origin(a) is Annotated for a in members):
        return None
    if members and members <= {int, float}:
        return "number"
    return "flag" if members == {bool} else None


def _checked_by(checks: Checks, *, skip: tuple[str, ...] = ()) -> Any:
    """A validator running an options object's own check on every field it has one for
    (except ``skip``: a section of its own in the file, such as ``retry.backoff``)."""

    def check(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
        name = info.field_name
        assert name is not None
        return value if name in skip else check_field(checks, name, value)

    return field_validator("*")(check)


class CircuitBreakerConfig(_Model):
    """Options of :class:`floodwall.CircuitBreaker` (see docs/circuit-breaker.md); builds a
    :class:`~floodwall.breaker.BreakerOptions` (``record``/``ignore``/``failure_result`` are
    code-only: exception types and predicates have no file form)."""

    failure_rate: float | None = defaults.BREAKER_FAILURE_RATE
    minimum_calls: int = defaults.BREAKER_MINIMUM_CALLS
    slow_call_rate: float | None = None
    slow_call_duration: Duration | None = None
    error_count: int | None = None
    consecutive_failures: int | None = None
    window: Duration = defaults.BREAKER_WINDOW
    buckets: int = defaults.BREAKER_BUCKETS
    window_calls: int | None = None
    open_duration: Duration = defaults.BREAKER_OPEN_DURATION
    open_duration_growth: float = defaults.BREAKER_OPEN_DURATION_GROWTH
    max_open_duration: Duration = defaults.BREAKER_MAX_OPEN_DURATION
    half_open_calls: int = defaults.BREAKER_HALF_OPEN_CALLS
    probe_timeout: Duration = defaults.BREAKER_PROBE_TIMEOUT

    _fields = _checked_by(BreakerOptions.CHECKS)

    @model_validator(mode="after")
    def _whole(self) -> CircuitBreakerConfig:
        self.options()  # the checks between fields (slow_call_rate needs slow_call_duration, …)
        return self

    def options(self) -> BreakerOptions:
        """The breaker's options this section describes."""
        return BreakerOptions(**self.model_dump())


class TimeoutConfig(_Model):
    """Options of :class:`floodwall.Timeout`; a bare duration (``timeout: 2s``) also works."""

    seconds: Duration
    mode: Literal["auto", "signal", "thread", "cooperative"] = "auto"
    thread_limit: int = defaults.TIMEOUT_THREAD_LIMIT

    _fields = _checked_by(TimeoutOptions.CHECKS)

    def options(self) -> TimeoutOptions:
        """The timeout's options this section describes."""
        return TimeoutOptions(**self.model_dump())


class FallbackConfig(_Model):
    """A static fallback answer, chosen by rejection kind (default: any failure); builds a
    :class:`~floodwall.fallback.FallbackOptions` (a factory, ``on`` types and
    ``failure_result`` are code-only)."""

    value: Any = None
    kinds: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _whole(self) -> FallbackConfig:
        self.options()  # the kinds are error kinds, …
        return self

    def options(self) -> FallbackOptions:
        """The fallback's options this section describes."""
        return FallbackOptions(self.value, kinds=self.kinds)


class BackoffConfig(_Model):
    """Backoff between retries (``floodwall.backoff``)."""

    kind: Literal["none", "fixed", "linear", "random", "exponential", "decorrelated"] = (
        "exponential"
    )
    base: Duration = defaults.RETRY_BACKOFF_BASE
    cap: Duration = defaults.RETRY_BACKOFF_CAP
    multiplier: float = 2.0
    jitter: Literal["none", "full", "equal"] = "full"
    low: Duration | None = None
    high: Duration | None = None

    @model_validator(mode="after")
    def _whole(self) -> BackoffConfig:
        self.backoff()  # the strategy's own checks (a zero base, an infinite multiplier, …)
        return self

    def backoff(self) -> Backoff:
        """The backoff strategy this section describes (its own frozen, validated options)."""
        kind, base, cap, mult = self.kind, self.base, self.cap, self.multiplier
        if kind == "none":
            return NoBackoff()
        if kind == "fixed":
            return Fixed(base, cap=cap)
        if kind == "linear":
            return Linear(base, cap=cap)
        if kind == "random":
            low = self.low if self.low is not None else 0.0
            high = self.high if self.high is not None else base
            return Uniform(low, high, cap=cap)
        if kind == "decorrelated":
            return DecorrelatedJitter(base, cap=cap)
        if self.jitter == "full":
            return FullJitter(base, multiplier=mult, cap=cap)
        if self.jitter == "equal":
            return EqualJitter(base, multiplier=mult, cap=cap)
        return Exponential(base, multiplier=mult, cap=cap)


class BudgetConfig(_Model):
    """A retry budget: retries / requests over the window stay under ``ratio``."""

    ratio: float = defaults.RETRY_BUDGET_RATIO
    min_per_second: float = defaults.RETRY_BUDGET_MIN_PER_SECOND
    window: Duration = defaults.RETRY_BUDGET_WINDOW
    shared: str | None = None
    """Name of a budget shared by every resource that gives the same name."""

    _fields = _checked_by(BUDGET_CHECKS)


class RetryConfig(_Model):
    """Options of :class:`floodwall.Retry` (checked as :class:`~floodwall.retry.RetryOptions`
    checks them; the resource's ``level`` is the retry's)."""

    attempts: int = defaults.RETRY_ATTEMPTS
    backoff: BackoffConfig = BackoffConfig()
    budget: BudgetConfig | None = BudgetConfig()
    deadline: Duration | None = None
    idempotent: bool = True
    retry_overload: bool = False
    max_retry_after: Duration = defaults.RETRY_MAX_RETRY_AFTER

    _fields = _checked_by(RetryOptions.CHECKS, skip=("backoff",))


class BulkheadConfig(_Model):
    """Options of :class:`floodwall.Bulkhead` (``scope: local``, per process) or of
    :class:`floodwall.HostBulkhead` (``scope: host``: one count for every process of the host,
    kept in the ``host://`` store named by ``store``); the first three build a
    :class:`~floodwall.bulkhead.BulkheadOptions` (``bypass`` is code-only)."""

    max_concurrent: int
    max_queue: int = defaults.BULKHEAD_MAX_QUEUE
    max_wait: Duration = defaults.BULKHEAD_MAX_WAIT
    scope: Literal["local", "host"] = "local"
    store: str = "default"
    """``scope: host``: the ``stores`` entry (a ``host://NAME`` URL) holding the slots."""
    expected_instances: int = 1
    """``scope: host``: processes sharing the slots; each keeps ``max_concurrent ÷
    expected_instances`` while the store is unavailable (``on_store_error: local``)."""
    on_store_error: Literal["local", "fail_open", "fail_closed"] = "local"

    _fields = _checked_by({**BulkheadOptions.CHECKS, "expected_instances": validate.count})

    @model_validator(mode="after")
    def _whole(self) -> BulkheadConfig:
        self.options()  # max_wait > 0 needs max_queue >= 1
        return self

    def options(self) -> BulkheadOptions:
        """The bulkhead's options this section describes."""
        return BulkheadOptions(self.max_concurrent, self.max_queue, self.max_wait)


def _rate_spec(value: object) -> str | float:
    """Keep the rate as written (``"5/h"`` keeps its one-hour window), checked by the limiters'
    own parser so the error says the same thing everywhere."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a rate such as '100/s' or '5/h', got {value!r}")
    parse_rate(value)
    return value if isinstance(value, str) else float(value)


RateSpec = Annotated[str | float, BeforeValidator(_rate_spec)]


RateLimitOptions = (
    WindowOptions | TokenBucketOptions | GCRAOptions | LeakyBucketOptions | GlobalLimitOptions
)
"""One of the limiters' options objects (:meth:`RateLimitConfig.options`)."""

GLOBAL_ALGORITHMS = ("gcra", "token_bucket", "fixed", "sliding")
"""The ``rate_limit.algorithm`` values a store can run (``sliding`` is the window counter)."""


class RateLimitConfig(_Model):
    """A local or global rate limit."""

    rate: RateSpec
    burst: int | None = None
    """Permits beyond the steady rate (default: one period's worth, ``count - 1``)."""
    algorithm: Literal["fixed", "sliding_log", "sliding", "token_bucket", "gcra", "leaky"] = "gcra"
    key: str | None = None
    scope: Literal["local", "host", "global"] = "local"
    store: str = "default"
    """``scope: global`` or ``host``: the ``stores`` entry holding the shared counts (``host``
    requires a ``host://NAME`` store: the processes of one host, no server)."""
    expected_instances: int = 1
    """``scope: global``: processes sharing the limit; each keeps ``rate ÷ expected_instances``
    while the store is down (``on_store_error: local``)."""
    on_store_error: Literal["local", "fail_open", "fail_closed"] = "local"

    _fields = _checked_by(
        {
            "burst": optional(partial(validate.count, minimum=0)),
            "expected_instances": validate.count,
        }
    )

    @model_validator(mode="after")
    def _global_form(self) -> RateLimitConfig:
        if self.scope != "local" and self.algorithm not in GLOBAL_ALGORITHMS:
            raise ValueError(
                f"algorithm {self.algorithm!r} has no shared form "
                f"(scope: {self.scope} takes {', '.join(GLOBAL_ALGORITHMS)})"
            )
        self.options()  # the limiter's own checks (an exact bound for a shared rate, …)
        return self

    def options(self) -> RateLimitOptions:
        """The limiter's options this section describes: a
        :class:`~floodwall.shared.GlobalLimitOptions` for a shared scope, else the in-process
        algorithm's object (``burst`` applies to ``token_bucket`` and ``gcra``)."""
        if self.scope != "local":
            return GlobalLimitOptions(
                self.algorithm,
                self.rate,
                burst=self.burst,
                on_store_error=self.on_store_error,
                expected_instances=self.expected_instances,
            )
        if self.algorithm == "token_bucket":
            return TokenBucketOptions(self.rate, burst=self.burst)
        if self.algorithm == "gcra":
            return GCRAOptions(self.rate, burst=self.burst)
        if self.algorithm == "leaky":
            return LeakyBucketOptions(self.rate)
        return WindowOptions(self.rate)


AlgorithmOptions = AIMDOptions | VegasOptions | GradientOptions | Gradient2Options

ADAPTIVE_OPTIONS: dict[str, type[AlgorithmOptions]] = {
    "aimd": AIMDOptions,
    "vegas": VegasOptions,
    "gradient": GradientOptions,
    "gradient2": Gradient2Options,
}
"""The options object each ``adaptive.algorithm`` builds from ``adaptive.options``."""


class AdaptiveConfig(_Model):
    """An adaptive concurrency limit (``floodwall.adaptive``): no hand-set threshold.

    ``options`` are the algorithm's keywords, named like the Java builders of Netflix's
    concurrency-limits in snake_case (``initial_limit``, ``min_limit``, ``max_limit``,
    ``backoff_ratio``, ``smoothing``, ``long_window``, …), times in seconds; they build the
    algorithm's options object (:meth:`algorithm_options`: :class:`~floodwall.adaptive.AIMDOptions`,
    …), so they are checked as in code. ``windowed`` aggregates samples first (min 1 s, >= 10
    samples).
    """

    algorithm: Literal["aimd", "vegas", "gradient", "gradient2"] = "gradient2"
    options: dict[str, float | int] = Field(default_factory=dict)
    windowed: bool = False
    partitions: dict[str, float] | None = None
    backlog_size: int = 0
    backlog_timeout: Duration = defaults.LIFO_BACKLOG_TIMEOUT

    _fields = _checked_by({"backlog_size": partial(validate.count, minimum=0)})

    @model_validator(mode="after")
    def _whole(self) -> AdaptiveConfig:
        self.algorithm_options()  # the algorithm's own checks, under this section's path
        self.limiter_options()  # the partitions' shares add up to at most 1
        return self

    def limiter_options(self) -> AdaptiveLimiterOptions:
        """The limiter's options (partitions and backlog) this section describes."""
        return AdaptiveLimiterOptions(self.partitions, self.backlog_size, self.backlog_timeout)

    def algorithm_options(self) -> AlgorithmOptions:
        """The algorithm's options object ``options`` describes (a key the algorithm does not
        take is refused, naming it and the keys there are)."""
        kind = ADAPTIVE_OPTIONS[self.algorithm]
        known = [f.name for f in dataclasses.fields(kind)]
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            raise ConfigError(
                f"options for {self.algorithm} must be among {', '.join(known)}, got {unknown}"
            )
        given: dict[str, Any] = dict(self.options)
        return kind(**given)


class IdempotencyConfig(_Model):
    """Idempotency records for writes (``floodwall.Idempotency``) on a named store; the other
    keys build a :class:`~floodwall.shared.IdempotencyOptions`."""

    store: str = "default"
    ttl: Duration = defaults.IDEMPOTENCY_TTL
    lock_ttl: Duration = defaults.IDEMPOTENCY_LOCK_TTL
    required: bool = False
    on_store_error: Literal["fail_open", "fail_closed", "local"] = "fail_closed"

    _fields = _checked_by(IdempotencyOptions.CHECKS)

    @model_validator(mode="after")
    def _whole(self) -> IdempotencyConfig:
        self.options()  # lock_ttl <= ttl
        return self

    def options(self) -> IdempotencyOptions:
        """The idempotency options this section describes."""
        return IdempotencyOptions(
            self.ttl, self.lock_ttl, required=self.required, on_store_error=self.on_store_error
        )


class CacheConfig(_Model):
    """A read cache in front of the call, serving the last good value when it fails."""

    ttl: Duration = defaults.CACHE_TTL
    stale_ttl: Duration = defaults.CACHE_STALE_TTL
    max_entries: int = defaults.CACHE_MAX_ENTRIES
    kinds: tuple[str, ...] | None = None
    read_only: bool = False
    store: str | None = None
    """Name of a ``stores`` entry for a shared level (``None``: in-process only)."""

    _fields = _checked_by(CacheOptions.CHECKS, skip=("kinds",))

    @model_validator(mode="after")
    def _whole(self) -> CacheConfig:
        self.options()  # stale_ttl >= ttl, the kinds are error kinds
        return self

    def options(self) -> CacheOptions:
        """The cache's options this section describes (a ``key`` function, ``on`` types and a
        codec are code-only)."""
        return CacheOptions(
            self.ttl,
            self.stale_ttl,
            self.max_entries,
            kinds=self.kinds,
            read_only=self.read_only,
        )


class SampledDropConfig(_Model):
    """Drop this share of the calls (low-priority writes); tunable live by reloading."""

    ratio: float

    _fields = _checked_by({"ratio": validate.share})

    def options(self) -> SampledDropOptions:
        """The sampled drop's options this section describes."""
        return SampledDropOptions(self.ratio)


class ChaosConfig(_Model):
    """A fault injected into the resource's calls (``floodwall.chaos``), innermost in its
    pipeline: exactly one of ``latency``, ``exception``, ``result``, ``hang``. Inert unless the
    document says ``allow_chaos: true`` or the process has ``FLOODWALL_CHAOS=1``."""

    latency: Duration | None = None
    exception: Literal[True] | None = None
    result: Any = None
    hang: Duration | None = None
    rate: float = 1.0
    enabled: bool = True

    _fields = _checked_by({"rate": validate.share})
    schedule: tuple[tuple[Duration, Duration | None], ...] | None = None
    period: Duration | None = None

    @model_validator(mode="after")
    def _one_fault(self) -> ChaosConfig:
        kinds = ("latency", "exception", "result", "hang")
        given = [k for k in kinds if k in self.model_fields_set]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of latency, exception, result, hang, got {given or 'none'}"
            )
        return self

    def spec(self) -> dict[str, Any]:
        """The plain data ``floodwall.chaos.chaos_from_spec`` takes."""
        return self.model_dump(mode="python", exclude_unset=True)


class ResourceConfig(_Model):
    """One dependency or endpoint: its level and its pipeline's policies."""

    level: Literal[1, 2, 3] = 2
    sampled_drop: SampledDropConfig | None = None
    cache: CacheConfig | None = None
    timeout: TimeoutConfig | None = None
    retry: RetryConfig | None = None
    circuit_breaker: CircuitBreakerConfig | None = None
    bulkhead: BulkheadConfig | None = None
    rate_limit: RateLimitConfig | None = None
    adaptive: AdaptiveConfig | None = None
    idempotency: IdempotencyConfig | None = None
    fallback: FallbackConfig | None = None
    chaos: ChaosConfig | None = None

    @field_validator("timeout", mode="before")
    @classmethod
    def _bare_timeout(cls, value: object) -> object:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return {"seconds": value}
        return value

    @model_validator(mode="before")
    @classmethod
    def _false_is_off(cls, data: object) -> object:
        if isinstance(data, dict):
            return {k: (None if v is False else v) for k, v in data.items()}
        return data


class Document(_Model):
    """The whole configuration file."""

    version: Literal[1] = 1
    defaults: ResourceConfig = ResourceConfig()
    resources: dict[str, ResourceConfig] = Field(default_factory=dict)
    stores: dict[str, str] = Field(default_factory=lambda: {"default": "memory://"})
    allow_chaos: bool = False
    """Let ``chaos`` sections inject (else only ``FLOODWALL_CHAOS=1`` in the environment does)."""

    @model_validator(mode="after")
    def _host_scopes(self) -> Document:
        """``scope: host`` names a ``host://`` store (checked here: the path says where)."""
        sections = {
            "defaults": self.defaults,
            **{f"resources.{k}": v for k, v in self.resources.items()},
        }
        for path, resource in sections.items():
            for field in ("bulkhead", "rate_limit"):
                section = getattr(resource, field)
                if section is None or section.scope != "host":
                    continue
                url = self.stores.get(section.store)
                if url is not None and not url.lower().startswith("host://"):
                    raise ValueError(
                        f"{path}.{field}: scope: host needs a host:// store, but stores."
                        f"{section.store} is {url!r}"
                    )
        return self
