"""floodwall: keep partial failures partial.

Circuit breakers, timeouts and deadlines, fallbacks and pipelines for ``def`` and ``async def``
alike; pure decision cores fed by an injectable clock, thin sync and async shells.
"""

from floodwall._core.clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock
from floodwall._core.errors import (
    BulkheadFullError,
    CircuitOpenError,
    ConfigError,
    FailedResult,
    FloodwallError,
    RateLimitedError,
    RejectedError,
    TimeoutExceeded,
)
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.outcome import Kind, Outcome
from floodwall._core.policy import Policy
from floodwall._core.window import CountWindow, TimeWindow, WindowSnapshot
from floodwall.breaker import CircuitBreaker, CircuitState
from floodwall.context import (
    CallContext,
    Deadline,
    call_context,
    current_call,
    current_deadline,
    deadline,
    remaining,
)
from floodwall.fallback import Fallback
from floodwall.pipeline import Pipeline
from floodwall.timeout import Timeout

__version__ = "0.1.0"

__all__ = [
    "SYSTEM_CLOCK",
    "BulkheadFullError",
    "CallContext",
    "CircuitBreaker",
    "CircuitOpenError",
    "CircuitState",
    "Clock",
    "ConfigError",
    "CountWindow",
    "Deadline",
    "Event",
    "EventListener",
    "FailedResult",
    "FakeClock",
    "Fallback",
    "FloodwallError",
    "Kind",
    "Listeners",
    "Outcome",
    "Pipeline",
    "Policy",
    "RateLimitedError",
    "RejectedError",
    "SystemClock",
    "TimeWindow",
    "Timeout",
    "TimeoutExceeded",
    "WindowSnapshot",
    "__version__",
    "call_context",
    "current_call",
    "current_deadline",
    "deadline",
    "remaining",
]
