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

# -- bulkheads and rate limits (isolation issue) ---------------------------------------------
