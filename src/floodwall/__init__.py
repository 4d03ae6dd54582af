"""floodwall: keep partial failures partial.

Circuit breakers, retries that never storm, bulkheads, rate limits, adaptive limits, timeouts
and deadlines, fallbacks, degradation and pipelines for ``def`` and ``async def`` alike; pure
decision cores fed by an injectable clock, run by one sync and one async driver.

The public names below are imported on first use (PEP 562), so ``import floodwall`` stays
cheap; type checkers see them through the ``TYPE_CHECKING`` imports.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING
from typing import Any as _Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from floodwall._core.clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock
    from floodwall._core.errors import (
        BulkheadFullError,
        CircuitOpenError,
        ConfigError,
        DegradedError,
        FailedResult,
        FloodwallError,
        LimitStoreUnavailableError,
        OverloadedError,
        RateLimitedError,
        RejectedError,
        TimeoutExceeded,
    )
    from floodwall._core.events import Event, EventListener, Listeners
    from floodwall._core.outcome import Kind, Outcomes
    from floodwall._core.policy import Policy
    from floodwall._core.window import CountWindow, TimeWindow, WindowSnapshot
    from floodwall.adaptive import (
        AdaptiveLimiter,
        BBRLimiter,
        ClientThrottle,
        LoadShedder,
        QueueingTimeAdmission,
    )
    from floodwall.breaker import CircuitBreaker, CircuitState
    from floodwall.budget import BudgetSnapshot, RetryBudget, RetryBudgetExhausted
    from floodwall.bulkhead import Bulkhead, ThreadPoolBulkhead, pool_size
    from floodwall.chaos import (
        ChaosException,
        ChaosHang,
        ChaosLatency,
        ChaosPolicy,
        ChaosResult,
        InjectedFault,
    )
    from floodwall.classify import Classifier, ErrorClass
    from floodwall.context import (
        CallContext,
        Deadline,
        RetryMarker,
        call_context,
        current_call,
        current_deadline,
        current_idempotency_key,
        current_retry,
        deadline,
        idempotency_key,
        remaining,
        retry_marker,
    )
    from floodwall.degrade import (
        AutoShedder,
        BacklogFullError,
        Coalesce,
        FallbackSource,
        LevelGate,
        Levels,
        PriorityGate,
        SampledDrop,
        chunked,
    )
    from floodwall.fallback import Fallback
    from floodwall.hedge import Hedge
    from floodwall.pipeline import Pipeline
    from floodwall.retry import GaveUp, Retry, gave_up
    from floodwall.shared import (
        Cache,
        DuplicateInFlightError,
        Frequency,
        FrequencyDecision,
        HostBulkhead,
        Idempotency,
        IdempotencyKeyMissingError,
        IdempotencyKeyReusedError,
        IdempotencyTokenError,
        IdempotencyUnavailableError,
        OneTimeTokens,
        WriteBehind,
    )
    from floodwall.stores.base import StoreUnavailableError
    from floodwall.timeout import Timeout

_EXPORTS: dict[str, str] = {
    "SYSTEM_CLOCK": "floodwall._core.clock",
    "AdaptiveLimiter": "floodwall.adaptive",
    "AutoShedder": "floodwall.degrade",
    "BBRLimiter": "floodwall.adaptive",
    "BacklogFullError": "floodwall.degrade",
    "BudgetSnapshot": "floodwall.budget",
    "Bulkhead": "floodwall.bulkhead",
    "BulkheadFullError": "floodwall._core.errors",
    "Cache": "floodwall.shared.cache",
    "CallContext": "floodwall.context",
    "ChaosException": "floodwall.chaos",
    "ChaosHang": "floodwall.chaos",
    "ChaosLatency": "floodwall.chaos",
    "ChaosPolicy": "floodwall.chaos",
    "ChaosResult": "floodwall.chaos",
    "CircuitBreaker": "floodwall.breaker",
    "CircuitOpenError": "floodwall._core.errors",
    "CircuitState": "floodwall.breaker",
    "Classifier": "floodwall.classify",
    "ClientThrottle": "floodwall.adaptive",
    "Clock": "floodwall._core.clock",
    "Coalesce": "floodwall.degrade",
    "ConfigError": "floodwall._core.errors",
    "CountWindow": "floodwall._core.window",
    "Deadline": "floodwall.context",
    "HostBulkhead": "floodwall.shared.host_bulkhead",
    "DegradedError": "floodwall._core.errors",
    "DuplicateInFlightError": "floodwall.shared.idempotency",
    "ErrorClass": "floodwall.classify",
    "Event": "floodwall._core.events",
    "EventListener": "floodwall._core.events",
    "FailedResult": "floodwall._core.errors",
    "FakeClock": "floodwall._core.clock",
    "Fallback": "floodwall.fallback",
    "FallbackSource": "floodwall.degrade",
    "FloodwallError": "floodwall._core.errors",
    "Frequency": "floodwall.shared.frequency",
    "FrequencyDecision": "floodwall.shared.frequency",
    "GaveUp": "floodwall.retry",
    "Hedge": "floodwall.hedge",
    "Idempotency": "floodwall.shared.idempotency",
    "IdempotencyKeyMissingError": "floodwall.shared.idempotency",
    "IdempotencyKeyReusedError": "floodwall.shared.idempotency",
    "IdempotencyTokenError": "floodwall.shared.idempotency",
    "IdempotencyUnavailableError": "floodwall.shared.idempotency",
    "InjectedFault": "floodwall.chaos",
    "Kind": "floodwall._core.outcome",
    "LevelGate": "floodwall.degrade",
    "Levels": "floodwall.degrade",
    "LimitStoreUnavailableError": "floodwall._core.errors",
    "Listeners": "floodwall._core.events",
    "LoadShedder": "floodwall.adaptive",
    "OneTimeTokens": "floodwall.shared.idempotency",
    "Outcomes": "floodwall._core.outcome",
    "OverloadedError": "floodwall._core.errors",
    "Pipeline": "floodwall.pipeline",
    "Policy": "floodwall._core.policy",
    "PriorityGate": "floodwall.degrade",
    "QueueingTimeAdmission": "floodwall.adaptive",
    "RateLimitedError": "floodwall._core.errors",
    "RejectedError": "floodwall._core.errors",
    "Retry": "floodwall.retry",
    "RetryBudget": "floodwall.budget",
    "RetryBudgetExhausted": "floodwall.budget",
    "RetryMarker": "floodwall.context",
    "SampledDrop": "floodwall.degrade",
    "StoreUnavailableError": "floodwall.stores.base",
    "SystemClock": "floodwall._core.clock",
    "ThreadPoolBulkhead": "floodwall.bulkhead",
    "TimeWindow": "floodwall._core.window",
    "Timeout": "floodwall.timeout",
    "TimeoutExceeded": "floodwall._core.errors",
    "WindowSnapshot": "floodwall._core.window",
    "WriteBehind": "floodwall.shared.write_behind",
    "call_context": "floodwall.context",
    "chunked": "floodwall.degrade",
    "current_call": "floodwall.context",
    "current_deadline": "floodwall.context",
    "current_idempotency_key": "floodwall.context",
    "current_retry": "floodwall.context",
    "deadline": "floodwall.context",
    "gave_up": "floodwall.retry",
    "idempotency_key": "floodwall.context",
    "pool_size": "floodwall.bulkhead",
    "remaining": "floodwall.context",
    "retry_marker": "floodwall.context",
}
"""Where each public name lives; a name is imported the first time it is asked for."""

__all__ = [
    "SYSTEM_CLOCK",
    "AdaptiveLimiter",
    "AutoShedder",
    "BBRLimiter",
    "BacklogFullError",
    "BudgetSnapshot",
    "Bulkhead",
    "BulkheadFullError",
    "Cache",
    "CallContext",
    "ChaosException",
    "ChaosHang",
    "ChaosLatency",
    "ChaosPolicy",
    "ChaosResult",
    "CircuitBreaker",
    "CircuitOpenError",
    "CircuitState",
    "Classifier",
    "ClientThrottle",
    "Clock",
    "Coalesce",
    "ConfigError",
    "CountWindow",
    "Deadline",
    "DegradedError",
    "DuplicateInFlightError",
    "ErrorClass",
    "Event",
    "EventListener",
    "FailedResult",
    "FakeClock",
    "Fallback",
    "FallbackSource",
    "FloodwallError",
    "Frequency",
    "FrequencyDecision",
    "GaveUp",
    "Hedge",
    "HostBulkhead",
    "Idempotency",
    "IdempotencyKeyMissingError",
    "IdempotencyKeyReusedError",
    "IdempotencyTokenError",
    "IdempotencyUnavailableError",
    "InjectedFault",
    "Kind",
    "LevelGate",
    "Levels",
    "LimitStoreUnavailableError",
    "Listeners",
    "LoadShedder",
    "OneTimeTokens",
    "Outcomes",
    "OverloadedError",
    "Pipeline",
    "Policy",
    "PriorityGate",
    "QueueingTimeAdmission",
    "RateLimitedError",
    "RejectedError",
    "Retry",
    "RetryBudget",
    "RetryBudgetExhausted",
    "RetryMarker",
    "SampledDrop",
    "StoreUnavailableError",
    "SystemClock",
    "ThreadPoolBulkhead",
    "TimeWindow",
    "Timeout",
    "TimeoutExceeded",
    "WindowSnapshot",
    "WriteBehind",
    "__version__",
    "call_context",
    "chunked",
    "current_call",
    "current_deadline",
    "current_idempotency_key",
    "current_retry",
    "deadline",
    "gave_up",
    "idempotency_key",
    "pool_size",
    "remaining",
    "retry_marker",
]


_SUBPACKAGES = frozenset(
    {
        "adaptive",
        "backoff",
        "config",
        "degrade",
        "drill",
        "gateway",
        "integrations",
        "observe",
        "ratelimit",
        "shared",
        "sim",
        "stores",
        "testing",
    }
)
"""Subpackages reachable as attributes (``floodwall.ratelimit``) without importing them first."""


def __getattr__(name: str) -> _Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name in _SUBPACKAGES:
            return _importlib.import_module(f"floodwall.{name}")
        raise AttributeError(f"module 'floodwall' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
