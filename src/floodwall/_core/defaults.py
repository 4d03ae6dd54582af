"""Every default in one place, with where it comes from.

The circuit breaker's figures are Hystrix's (and the seeds'): a 10 s window in 1 s buckets,
20 calls before the rate means anything, 50 % errors to trip, 5 s open, one half-open probe.
"""

from __future__ import annotations

BREAKER_FAILURE_RATE = 0.5
BREAKER_MINIMUM_CALLS = 20
BREAKER_WINDOW = 10.0
BREAKER_BUCKETS = 10
BREAKER_OPEN_DURATION = 5.0
BREAKER_HALF_OPEN_CALLS = 1
BREAKER_OPEN_DURATION_GROWTH = 1.0
"""Multiplier applied to the open duration each time a half-open probe fails (1 = no growth)."""
BREAKER_MAX_OPEN_DURATION = 60.0
BREAKER_PROBE_TIMEOUT = 10.0
"""A half-open probe not back after this many seconds counts as failed, so it cannot wedge."""

TIMEOUT_THREAD_LIMIT = 8
"""Sync ``Timeout(mode="thread")``: abandoned, still-running worker threads allowed at once."""

# -- retries, budgets, hedging (retry issue) -------------------------------------------------

RETRY_ATTEMPTS = 3
"""Total attempts (the first call plus two retries): the seeds' "at most 3 times"."""
RETRY_BACKOFF_BASE = 0.1
"""Seconds: the first retry of the default exponential full-jitter backoff waits up to this."""
RETRY_BACKOFF_CAP = 10.0
"""Seconds: no backoff delay is ever longer."""
RETRY_MAX_RETRY_AFTER = 30.0
"""Seconds: a server's ``Retry-After`` is honoured up to this much waiting, then capped."""
RETRY_MAX_LEVEL = 2
"""Dependency levels above this never retry (level 3, "nice to have", fails fast)."""
RETRY_BUDGET_RATIO = 0.1
"""Retries per request over the budget's window: the seeds' 10 % (amplification about 1.1)."""
RETRY_BUDGET_MIN_PER_SECOND = 1.0
"""Retries per second always allowed, so a quiet caller can still retry a blip."""
RETRY_BUDGET_WINDOW = 10.0
RETRY_BUDGET_BUCKETS = 10
HEDGE_MAX_HEDGES = 1
"""Extra attempts a :class:`~floodwall.Hedge` may start beside the first."""
HEDGE_MIN_SAMPLES = 20
"""Latency samples a percentile hedge delay needs before it replaces the fixed delay."""

# -- bulkheads and rate limits (isolation issue) ---------------------------------------------
