"""What a simulation measures: per-second counters, gauges and the latencies of good answers.

Outcomes are binned by the time the client learned them (``bin`` seconds, default 1 s). A
*good* answer is a success delivered before the client's deadline; **goodput** is good answers
per second. Latencies are kept for good answers only ("p99 of admitted requests").
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from floodwall.drill.metrics import percentile

__all__ = ["OUTCOMES", "Recorder", "Summary"]

OUTCOMES = ("ok", "rejected", "error", "timeout")
"""How a client sees one attempt end: a good answer, a rejection (shed: HTTP 503), an error
answer (a failed dependency), or no answer before its deadline."""


def _quantile(values: list[float], q: float) -> float:
    """:func:`~floodwall.drill.metrics.percentile`, NaN (as the simulator's other absent
    figures) when there are no values."""
    value = percentile(values, q)
    return math.nan if value is None else value


@dataclass(frozen=True, slots=True)
class Summary:
    """Figures over one time range ``[start, end)`` of a run."""

    start: float
    end: float
    offered: int
    ok: int
    rejected: int
    error: int
    timeout: int
    p50: float
    p99: float
    goodput: float
    """Good answers per second."""
    max_busy: int
    max_queue: int
    mean_limit: float

    @property
    def answered(self) -> int:
        return self.ok + self.rejected + self.error + self.timeout

    @property
    def success_rate(self) -> float:
        """Good answers per attempt that ended in the range."""
        return self.ok / self.answered if self.answered else math.nan


@dataclass
class Recorder:
    """Counters per bin; gauges sampled by the server; good latencies with their end time."""

    bin: float = 1.0
    counts: dict[str, defaultdict[int, int]] = field(
        default_factory=lambda: {name: defaultdict(int) for name in ("offered", *OUTCOMES)}
    )
    busy: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    queue: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    limits: dict[int, float] = field(default_factory=dict)
    good: list[tuple[float, float]] = field(default_factory=list)
    """``(end_time, latency)`` of every good answer."""

    def offered(self, now: float) -> None:
        self.counts["offered"][int(now / self.bin)] += 1

    def outcome(self, now: float, outcome: str, latency: float) -> None:
        self.counts[outcome][int(now / self.bin)] += 1
        if outcome == "ok":
            self.good.append((now, latency))

    def gauge(self, now: float, busy: int, queue: int, limit: float | None) -> None:
        index = int(now / self.bin)
        self.busy[index] = max(self.busy[index], busy)
        self.queue[index] = max(self.queue[index], queue)
        if limit is not None:
            self.limits[index] = limit

    def series(self, name: str, end: float) -> list[float]:
        """Per-bin values of a counter (per second), ``busy``, ``queue`` or ``limit``."""
        bins = range(int(end / self.bin))
        if name == "busy":
            return [float(self.busy.get(i, 0)) for i in bins]
        if name == "queue":
            return [float(self.queue.get(i, 0)) for i in bins]
        if name == "limit":
            return [self.limits.get(i, math.nan) for i in bins]
        counter = self.counts[name]
        return [counter.get(i, 0) / self.bin for i in bins]

    def summary(self, start: float, end: float) -> Summary:
        """Figures over ``[start, end)`` (whole bins)."""
        first, last = int(start / self.bin), int(end / self.bin)
        bins = range(first, last)

        def total(name: str) -> int:
            counter = self.counts[name]
            return sum(counter.get(i, 0) for i in bins)

        latencies = [lat for at, lat in self.good if start <= at < end]
        limits = [self.limits[i] for i in bins if i in self.limits]
        span = max(end - start, 1e-9)
        return Summary(
            start=start,
            end=end,
            offered=total("offered"),
            ok=total("ok"),
            rejected=total("rejected"),
            error=total("error"),
            timeout=total("timeout"),
            p50=_quantile(latencies, 0.5),
            p99=_quantile(latencies, 0.99),
            goodput=total("ok") / span,
            max_busy=max((self.busy.get(i, 0) for i in bins), default=0),
            max_queue=max((self.queue.get(i, 0) for i in bins), default=0),
            mean_limit=sum(limits) / len(limits) if limits else math.nan,
        )
