"""One configuration for every policy: schema, loading, the live registry, reload sources.

The schema is validated by pydantic and files may be YAML, so this package needs the ``config``
extra (``pip install 'floodwall[config]'``, also pulled by ``gateway``, ``cli``, ``prometheus``
and ``otel``); without it, importing it says so instead of failing on a bare module name.
"""

from floodwall._core.extras import missing_extra

try:
    import pydantic
    import yaml
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.config", "config") from _missing

from floodwall.config.loader import LEVEL_RULES, inherit, load, loads, parse
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

del pydantic, yaml  # imported above only to name the missing extra

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
    "inherit",
    "load",
    "loads",
    "parse",
    "parse_duration",
    "parse_rate",
]
