"""Cumulative per-resource outcome counts and a latency histogram, lock-free on success.

Prometheus counters must only grow, so the rolling windows of the policies cannot serve them.
A :class:`Meter` keeps what they need: calls by outcome since start, and durations in the same
log-linear bins as the windows (4 per power of two, ±12 %), each bin an ``itertools.count`` so
a success is two atomic C increments and no lock. Adapters read it at scrape time and fold the
bins into whatever buckets they publish.

Every call is counted twice, because an outage answered by fallbacks must not read as health:
its *outcome* is what the dependency did (``success``, ``error`` or the rejection kind that kept
it from being called: ``circuit_open``, ``timeout``, ``rate_limited``, ``store_unavailable``
(a shared limit's store down, ``fail_closed``), ``bulkhead_full``,
``overloaded``, ``degraded``, …), its *answer* what the caller got (``answer`` from the
dependency, ``fallback`` from a fallback, cache or backup source, or ``error``). Both sets are
small and fixed, so labels stay bounded.

A fallback answer reaches the meter as a success; the policy that answered says so with
:func:`note_degraded`, which sets a context variable to a fresh marker. The meter gate reads
that variable when it admits a call and again when it records it: a different marker means
this call was degraded (two context reads on the success path, no lock).
"""

from __future__ import annotations

import contextvars
import threading
from bisect import bisect_right
from collections.abc import Callable
from typing import Protocol

from floodwall._core.errors import RejectedError
from floodwall._core.tally import Tally, values
from floodwall._core.window import _EDGES, HISTOGRAM_BINS, latency_bin_bounds

__all__ = [
    "ANSWERS",
    "EDGES",
    "LATENCY_BUCKETS",
    "OUTCOMES",
    "CallObserver",
    "Degradation",
    "Meter",
    "Metering",
    "note_degraded",
]

EDGES = _EDGES
"""Upper edges of the latency bins (seconds); a duration's bin is ``bisect_right(EDGES, d)``."""

OUTCOMES = (
    "success",
    "error",
    "circuit_open",
    "timeout",
    "rate_limited",
    "store_unavailable",
    "bulkhead_full",
    "overloaded",
    "degraded",
    "backlog_full",
    "duplicate_in_flight",
    "rejected",
)
"""Every outcome label a meter can report (bounded on purpose)."""

ANSWERS = ("answer", "fallback", "error")
"""What a caller can get: the dependency's answer, a degraded answer, or an error."""

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the latency buckets every adapter publishes (plus +Inf)."""

_NOT_CALLED = frozenset({"sampled", "read_only"})
"""Degradation reasons for which the dependency was deliberately not called."""


class Degradation:
    """One degraded answer: who gave it and what the dependency did (``outcome``)."""

    __slots__ = ("by", "claimed", "outcome", "reason")

    def __init__(self, by: str, reason: str) -> None:
        self.by = by
        self.reason = reason
        if reason in OUTCOMES:
            self.outcome = reason
        elif reason in _NOT_CALLED:
            self.outcome = "degraded"
        else:  # an exception type name, or a result that counts as a failure
            self.outcome = "error"
        self.claimed = False


DEGRADED: contextvars.ContextVar[Degradation | None] = contextvars.ContextVar(
    "floodwall_degraded", default=None
)
"""The latest degraded answer given in this context (compared by identity, never reset)."""


def note_degraded(by: str, reason: str) -> None:
    """Tell the enclosing meter that ``by`` answered instead of the dependency, because of
    ``reason`` (a rejection kind, an exception type name, ``sampled``, ``read_only``, …)."""
    DEGRADED.set(Degradation(by, reason))


class Meter:
    """Counts calls by outcome and their durations; read with :meth:`read`.

    A success is one lock-free bump of its latency bin and nothing else: every call lands in
    exactly one bin, and errors and degraded answers are counted (bin and outcome together)
    under the lock that readers hold, so the successes are the bins' total less those, exact
    and never decreasing (one counter bump fewer per success: benchmark group "meter folded
    into its runner").
    """

    __slots__ = ("_bins", "_degraded", "_errors", "_lock", "started")

    def __init__(self) -> None:
        self._bins = [Tally() for _ in range(HISTOGRAM_BINS)]
        self._errors: dict[str, int] = {}
        self._degraded: dict[str, int] = {}
        self._lock = threading.Lock()

    def success(self, duration: float) -> None:
        """A call answered after ``duration`` seconds (lock-free)."""
        self._bins[bisect_right(_EDGES, duration)].add()

    def latency_bins(self) -> list[Tally]:
        """The latency bins, for callers that inline :meth:`success` on their hot path (bump
        the bin ``bisect_right(EDGES, duration)``)."""
        return self._bins

    def degraded(self, degradation: Degradation, duration: float) -> str:
        """A call answered by a fallback after ``duration`` seconds; returns the dependency's
        outcome it was counted under."""
        degradation.claimed = True  # an enclosing meter sees its dependency answer
        outcome = degradation.outcome
        with self._lock:
            self._degraded[outcome] = self._degraded.get(outcome, 0) + 1
            self._bins[bisect_right(_EDGES, duration)].add()
        return outcome

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

    def _snapshot(self) -> tuple[dict[str, int], dict[str, int], list[int], int]:
        """``(errors, degraded, bins, successes)``, consistent with each other."""
        with self._lock:
            errors = dict(self._errors)
            degraded = dict(self._degraded)
            bins = values(self._bins)
        successes = sum(bins) - sum(errors.values()) - sum(degraded.values())
        return errors, degraded, bins, successes

    def read(self) -> tuple[dict[str, int], list[tuple[float, int]], float]:
        """``(calls by outcome, [(bin upper edge, count)], estimated sum of durations)``.

        The sum is estimated from the bins' midpoints (within the bins' ±12 %).
        """
        errors, degraded, counts_by_bin, successes = self._snapshot()
        counts = errors
        for outcome, count in degraded.items():
            counts[outcome] = counts.get(outcome, 0) + count
        counts["success"] = counts.get("success", 0) + successes
        bins: list[tuple[float, int]] = []
        total = 0.0
        for index, count in enumerate(counts_by_bin):
            if count:
                low, high = latency_bin_bounds(index)
                bins.append((high, count))
                total += count * (low + high) / 2
        return counts, bins, total

    def answers(self) -> dict[str, int]:
        """Calls by what the caller got: ``answer``, ``fallback`` and ``error``."""
        errors, degraded, _, successes = self._snapshot()
        return {
            "answer": successes,
            "fallback": sum(degraded.values()),
            "error": sum(errors.values()),
        }

    def read_both(self) -> dict[tuple[str, str], int]:
        """Calls by ``(outcome, answer)``: what the dependency did and what the caller got."""
        errors, degraded, _, successes = self._snapshot()
        both = {(outcome, "error"): count for outcome, count in errors.items()}
        both.update(((o, "fallback"), c) for o, c in degraded.items())
        both["success", "answer"] = successes
        return both


class Metering:
    """A meter as the drivers run it around a stage of a pipeline (a config resource's meter,
    outermost): :func:`~floodwall._core.drivers.metered_sync` reads :data:`DEGRADED` before and
    after the call and counts a success inline (``next()`` of one of ``bins``); the rarer
    outcomes go through :meth:`degraded` and :meth:`failed`.
    ``rejected(outcome, error)`` hears each call refused by a floodwall rejection."""

    __slots__ = ("bins", "meter", "rejected")

    def __init__(self, meter: Meter, rejected: Callable[[str, BaseException], None]) -> None:
        self.meter = meter
        self.rejected = rejected
        self.bins = [tally.counter for tally in meter.latency_bins()]

    def degraded(self, marker: Degradation, duration: float) -> None:
        """A fallback answered (``marker``) after ``duration`` seconds."""
        self.meter.degraded(marker, duration)

    def failed(self, error: BaseException, duration: float) -> None:
        """The call ended with ``error`` after ``duration`` seconds."""
        outcome = self.meter.failure(error, duration)
        if outcome not in ("error", "cancelled"):
            self.rejected(outcome, error)


class CallObserver(Protocol):
    """Watches every call through a resource, per call (a tracer, a latency histogram that
    needs each duration): installed with ``Registry.add_observer``. ``begin`` runs when the call
    enters the resource (outermost, beside the meter) and returns what ``end`` gets back;
    ``end`` learns what the dependency did (``outcome``) and what the caller got (``answer``).
    Neither may raise: an observer that fails is logged and skipped, never the call's failure."""

    def begin(self, resource: str) -> object: ...

    def end(
        self,
        resource: str,
        begun: object,
        *,
        duration: float,
        outcome: str,
        answer: str,
        error: BaseException | None,
    ) -> None: ...
