"""One configuration for every policy: schema, loading, the live registry, reload sources."""

from floodwall.config.loader import LEVEL_RULES, load, loads, parse, resolve
from floodwall.config.registry import Override, Registry, Resource, build, build_backoff
from floodwall.config.schema import (
    BackoffConfig,
    BudgetConfig,
    BulkheadConfig,
    CircuitBreakerConfig,
    Document,
    FallbackConfig,
    RateLimitConfig,
    ResourceConfig,
    RetryConfig,
    TimeoutConfig,
)
from floodwall.config.units import Duration, Rate, format_duration, parse_duration, parse_rate

__all__ = [
    "LEVEL_RULES",
    "BackoffConfig",
    "BudgetConfig",
    "BulkheadConfig",
    "CircuitBreakerConfig",
    "Document",
    "Duration",
    "FallbackConfig",
    "Override",
    "Rate",
    "RateLimitConfig",
    "Registry",
    "Resource",
    "ResourceConfig",
    "RetryConfig",
    "TimeoutConfig",
    "build",
    "build_backoff",
    "format_duration",
    "load",
    "loads",
    "parse",
    "parse_duration",
    "parse_rate",
    "resolve",
]
