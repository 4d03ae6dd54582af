"""Cumulative per-resource outcome counts and a latency histogram, lock-free on success.

Prometheus counters must only grow, so the rolling windows of the policies cannot serve them.
A :class:`Meter` keeps what they need: calls by outcome since start, and durations in the same
log-linear bins as the windows (4 per power of two, ±12 %), each bin an ``itertools.count`` so
a success is two atomic C increments and no lock. Adapters read it at scrape time and fold the
bins into whatever buckets they publish.

Outcomes are a small fixed set, so labels stay bounded: ``success``, ``error`` and one per
rejection kind (``circuit_open``, ``timeout``, ``rate_limited``, ``bulkhead_full``,
``overloaded``, ``degraded``, …).
"""

from __future__ import annotations

import threading
from bisect import bisect_right

from floodwall._core.errors import RejectedError
from floodwall._core.tally import Tally, values
from floodwall._core.window import _EDGES, HISTOGRAM_BINS, latency_bin_bounds

__all__ = ["EDGES", "OUTCOMES", "Meter"]

EDGES = _EDGES
"""Upper edges of the latency bins (seconds); a duration's bin is ``bisect_right(EDGES, d)``."""

OUTCOMES = (
    "success",
    "error",
    "circuit_open",
    "timeout",
    "rate_limited",
    "bulkhead_full",
    "overloaded",
    "degraded",
    "backlog_full",
    "duplicate_in_flight",
    "rejected",
)
"""Every outcome label a meter can report (bounded on purpose)."""


class Meter:
    """Counts calls by outcome and their durations; read with :meth:`read`."""

    __slots__ = ("_bins", "_errors", "_lock", "_successes", "started")

    def __init__(self) -> None:
        self._successes = Tally()
        self._bins = [Tally() for _ in range(HISTOGRAM_BINS)]
        self._errors: dict[str, int] = {}
        self._lock = threading.Lock()

    def success(self, duration: float) -> None:
        """A call answered after ``duration`` seconds (lock-free)."""
        self._successes.add()
        self._bins[bisect_right(_EDGES, duration)].add()

    def success_counters(self) -> tuple[Tally, list[Tally]]:
        """The success counter and the latency bins, for callers that inline :meth:`success`
        on their hot path (bump the first, and the bin ``bisect_right(EDGES, duration)``)."""
        return self._successes, self._bins

    def failure(self, exc: BaseException, duration: float) -> str:
        """A call ended with ``exc``; returns the outcome label it was counted under."""
        if isinstance(exc, RejectedError):
            outcome = exc.kind if exc.kind in OUTCOMES else "rejected"
        elif isinstance(exc, Exception):
            outcome = "error"
        else:
            return "cancelled"  # cancellation and interpreter exits are not outcomes
        with self._lock:
            self._errors[outcome] = self._errors.get(outcome, 0) + 1
        self._bins[bisect_right(_EDGES, duration)].add()
        return outcome

    def read(self) -> tuple[dict[str, int], list[tuple[float, int]], float]:
        """``(calls by outcome, [(bin upper edge, count)], estimated sum of durations)``.

        The sum is estimated from the bins' midpoints (within the bins' ±12 %).
        """
        with self._lock:
            counts = dict(self._errors)
        counts["success"] = self._successes.value
        bins: list[tuple[float, int]] = []
        total = 0.0
        for index, count in enumerate(values(self._bins)):
            if count:
                low, high = latency_bin_bounds(index)
                bins.append((high, count))
                total += count * (low + high) / 2
        return counts, bins, total
