"""floodwall: keep partial failures partial.

Circuit breakers, timeouts and deadlines, fallbacks and pipelines for ``def`` and ``async def``
alike; pure decision cores fed by an injectable clock, thin sync and async shells.
"""

from floodwall._core.clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock
from floodwall._core.errors import (
    BulkheadFullError,
    CircuitOpenError,
    ConfigError,
    DegradedError,
    FailedResult,
    FloodwallError,
    OverloadedError,
    RateLimitedError,
    RejectedError,
    TimeoutExceeded,
)
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.outcome import Kind, Outcome
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
    Cache,
    Coalesce,
    FallbackSource,
    LevelGate,
    Levels,
    PriorityGate,
    SampledDrop,
    WriteBehind,
    chunked,
)
from floodwall.fallback import Fallback
from floodwall.frequency import Frequency, FrequencyDecision
from floodwall.hedge import Hedge
from floodwall.idempotency import (
    DuplicateInFlightError,
    Idempotency,
    IdempotencyKeyMissingError,
    IdempotencyKeyReusedError,
    IdempotencyTokenError,
    IdempotencyUnavailableError,
    OneTimeTokens,
)
from floodwall.pipeline import Pipeline
from floodwall.retry import GaveUp, Retry, gave_up
from floodwall.stores.base import StoreUnavailableError
from floodwall.timeout import Timeout

__version__ = "0.1.0"

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
    "Idempotency",
    "IdempotencyKeyMissingError",
    "IdempotencyKeyReusedError",
    "IdempotencyTokenError",
    "IdempotencyUnavailableError",
    "Kind",
    "LevelGate",
    "Levels",
    "Listeners",
    "LoadShedder",
    "OneTimeTokens",
    "Outcome",
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
