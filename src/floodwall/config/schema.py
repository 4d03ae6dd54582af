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
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from floodwall._core import defaults
from floodwall.config.units import Duration

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


class CircuitBreakerConfig(_Model):
    """Options of :class:`floodwall.CircuitBreaker` (see docs/circuit-breaker.md)."""

    failure_rate: float | None = Field(defaults.BREAKER_FAILURE_RATE, gt=0, le=1)
    minimum_calls: int = Field(defaults.BREAKER_MINIMUM_CALLS, ge=1)
    slow_call_rate: float | None = Field(None, gt=0, le=1)
    slow_call_duration: Duration | None = None
    error_count: int | None = Field(None, ge=1)
    consecutive_failures: int | None = Field(None, ge=1)
    window: Duration = defaults.BREAKER_WINDOW
    buckets: int = Field(defaults.BREAKER_BUCKETS, ge=1)
    window_calls: int | None = Field(None, ge=1)
    open_duration: Duration = defaults.BREAKER_OPEN_DURATION
    open_duration_growth: float = Field(defaults.BREAKER_OPEN_DURATION_GROWTH, ge=1)
    max_open_duration: Duration = defaults.BREAKER_MAX_OPEN_DURATION
    half_open_calls: int = Field(defaults.BREAKER_HALF_OPEN_CALLS, ge=1)
    probe_timeout: Duration = defaults.BREAKER_PROBE_TIMEOUT


class TimeoutConfig(_Model):
    """Options of :class:`floodwall.Timeout`; a bare duration (``timeout: 2s``) also works."""

    seconds: Duration = Field(gt=0)
    mode: Literal["auto", "signal", "thread", "cooperative"] = "auto"
    thread_limit: int = Field(defaults.TIMEOUT_THREAD_LIMIT, ge=1)


class FallbackConfig(_Model):
    """A static fallback answer, chosen by rejection kind (default: any failure)."""

    value: Any = None
    kinds: tuple[str, ...] | None = None


class BackoffConfig(_Model):
    """Backoff between retries (``floodwall.backoff``)."""

    kind: Literal["none", "fixed", "linear", "random", "exponential", "decorrelated"] = (
        "exponential"
    )
    base: Duration = defaults.RETRY_BACKOFF_BASE
    cap: Duration = defaults.RETRY_BACKOFF_CAP
    multiplier: float = Field(2.0, ge=1)
    jitter: Literal["none", "full", "equal"] = "full"
    low: Duration | None = None
    high: Duration | None = None


class BudgetConfig(_Model):
    """A retry budget: retries / requests over the window stay under ``ratio``."""

    ratio: float = Field(defaults.RETRY_BUDGET_RATIO, ge=0, le=1)
    min_per_second: float = Field(defaults.RETRY_BUDGET_MIN_PER_SECOND, ge=0)
    window: Duration = defaults.RETRY_BUDGET_WINDOW
    shared: str | None = None
    """Name of a budget shared by every resource that gives the same name."""


class RetryConfig(_Model):
    """Options of :class:`floodwall.Retry`."""

    attempts: int = Field(defaults.RETRY_ATTEMPTS, ge=1)
    backoff: BackoffConfig = BackoffConfig()
    budget: BudgetConfig | None = BudgetConfig()
    deadline: Duration | None = None
    idempotent: bool = True
    retry_overload: bool = False
    max_retry_after: Duration = defaults.RETRY_MAX_RETRY_AFTER


class BulkheadConfig(_Model):
    """Options of :class:`floodwall.Bulkhead` (``scope: local``, per process) or of
    :class:`floodwall.HostBulkhead` (``scope: host``: one count for every process of the host,
    kept in the ``host://`` store named by ``store``)."""

    max_concurrent: int = Field(ge=1)
    max_queue: int = Field(0, ge=0)
    max_wait: Duration = 0.0
    scope: Literal["local", "host"] = "local"
    store: str = "default"
    """``scope: host``: the ``stores`` entry (a ``host://NAME`` URL) holding the slots."""
    expected_instances: int = Field(1, ge=1)
    """``scope: host``: processes sharing the slots; each keeps ``max_concurrent ÷
    expected_instances`` while the store is unavailable (``on_store_error: local``)."""
    on_store_error: Literal["local", "fail_open", "fail_closed"] = "local"


def _rate_spec(value: object) -> str | float:
    """Keep the rate as written (``"5/h"`` keeps its one-hour window), checked by the limiters'
    own parser so the error says the same thing everywhere."""
    from floodwall.ratelimit import parse_rate

    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a rate such as '100/s' or '5/h', got {value!r}")
    parse_rate(value)
    return value if isinstance(value, str) else float(value)


RateSpec = Annotated[str | float, BeforeValidator(_rate_spec)]


GLOBAL_ALGORITHMS = ("gcra", "token_bucket", "fixed", "sliding")
"""The ``rate_limit.algorithm`` values a store can run (``sliding`` is the window counter)."""


class RateLimitConfig(_Model):
    """A local or global rate limit."""

    rate: RateSpec
    burst: int | None = Field(None, ge=0)
    """Permits beyond the steady rate (default: one period's worth, ``count - 1``)."""
    algorithm: Literal["fixed", "sliding_log", "sliding", "token_bucket", "gcra", "leaky"] = "gcra"
    key: str | None = None
    scope: Literal["local", "host", "global"] = "local"
    store: str = "default"
    """``scope: global`` or ``host``: the ``stores`` entry holding the shared counts (``host``
    requires a ``host://NAME`` store: the processes of one host, no server)."""
    expected_instances: int = Field(1, ge=1)
    """``scope: global``: processes sharing the limit; each keeps ``rate ÷ expected_instances``
    while the store is down (``on_store_error: local``)."""
    on_store_error: Literal["local", "fail_open", "fail_closed"] = "local"

    @model_validator(mode="after")
    def _global_form(self) -> RateLimitConfig:
        if self.scope != "local" and self.algorithm not in GLOBAL_ALGORITHMS:
            raise ValueError(
                f"algorithm {self.algorithm!r} has no shared form "
                f"(scope: {self.scope} takes {', '.join(GLOBAL_ALGORITHMS)})"
            )
        return self


class AdaptiveConfig(_Model):
    """An adaptive concurrency limit (``floodwall.adaptive``): no hand-set threshold.

    ``options`` are the algorithm's keywords, named like the Java builders of Netflix's
    concurrency-limits in snake_case (``initial_limit``, ``min_limit``, ``max_limit``,
    ``backoff_ratio``, ``smoothing``, ``long_window``, …), times in seconds; they are checked by
    the algorithm itself. ``windowed`` aggregates samples first (min 1 s, >= 10 samples).
    """

    algorithm: Literal["aimd", "vegas", "gradient", "gradient2"] = "gradient2"
    options: dict[str, float | int] = Field(default_factory=dict)
    windowed: bool = False
    partitions: dict[str, float] | None = None
    backlog_size: int = Field(0, ge=0)
    backlog_timeout: Duration = defaults.LIFO_BACKLOG_TIMEOUT


class IdempotencyConfig(_Model):
    """Idempotency records for writes (``floodwall.Idempotency``) on a named store."""

    store: str = "default"
    ttl: Duration = defaults.IDEMPOTENCY_TTL
    lock_ttl: Duration = defaults.IDEMPOTENCY_LOCK_TTL
    required: bool = False
    on_store_error: Literal["fail_open", "fail_closed", "local"] = "fail_closed"


class CacheConfig(_Model):
    """A read cache in front of the call, serving the last good value when it fails."""

    ttl: Duration = defaults.CACHE_TTL
    stale_ttl: Duration = defaults.CACHE_STALE_TTL
    max_entries: int = Field(defaults.CACHE_MAX_ENTRIES, ge=1)
    kinds: tuple[str, ...] | None = None
    read_only: bool = False
    store: str | None = None
    """Name of a ``stores`` entry for a shared level (``None``: in-process only)."""


class SampledDropConfig(_Model):
    """Drop this share of the calls (low-priority writes); tunable live by reloading."""

    ratio: float = Field(ge=0, le=1)


class ChaosConfig(_Model):
    """A fault injected into the resource's calls (``floodwall.chaos``), innermost in its
    pipeline: exactly one of ``latency``, ``exception``, ``result``, ``hang``. Inert unless the
    document says ``allow_chaos: true`` or the process has ``FLOODWALL_CHAOS=1``."""

    latency: Duration | None = None
    exception: Literal[True] | None = None
    result: Any = None
    hang: Duration | None = None
    rate: float = Field(1.0, ge=0, le=1)
    enabled: bool = True
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
