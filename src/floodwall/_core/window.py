"""Rolling windows: the one component every breaker, limiter and metric counts with.

Two shapes share one interface: :class:`TimeWindow` (``buckets`` × ``bucket_seconds``, default
10 × 1 s, the Hystrix/resilience4j design) and :class:`CountWindow` (the last ``size`` calls).
Both keep a running total that is updated on record and on eviction (subtract the bucket that
falls out), so reading the figures is O(1) and memory is fixed at construction.

A bounded latency summary rides along: a log-linear histogram with 4 bins per power of two over
1 µs … ~2000 s (124 bins, ±12 % relative error per bin, linear interpolation within a bin), enough
for p50/p99 without keeping samples.

Windows are not locked: the owning policy serialises ``record`` (the breaker does so under its
own short lock, never while the protected call runs).
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass, field
from typing import Protocol

from floodwall._core import defaults, validate
from floodwall._core.outcome import Kind
from floodwall._core.tally import Tally

__all__ = [
    "CountWindow",
    "TimeWindow",
    "Window",
    "WindowSnapshot",
    "latency_bin",
    "latency_bin_bounds",
]

# Slots of the per-bucket counters. Kind.FAILURE/TIMEOUT/REJECTED index themselves.
_CALLS = 0
_SLOW = 4
_FIELDS = 5

_SUB = 4  # bins per power of two
_MIN_EXP = -19  # frexp exponent of ~1 µs
_MAX_EXP = 11  # frexp exponent of ~2048 s
HISTOGRAM_BINS = (_MAX_EXP - _MIN_EXP + 1) * _SUB
"""Number of latency bins in every window's summary."""

_bisect = bisect.bisect_right

_floor = math.floor


def latency_bin_bounds(index: int) -> tuple[float, float]:
    """The ``[low, high)`` durations, in seconds, of bin ``index`` (the first and last bins
    also take everything below and above them)."""
    exp, sub = divmod(index, _SUB)
    scale = 2.0 ** (exp + _MIN_EXP)
    return (0.5 + sub / (2 * _SUB)) * scale, (0.5 + (sub + 1) / (2 * _SUB)) * scale


_EDGES = [latency_bin_bounds(index)[1] for index in range(HISTOGRAM_BINS - 1)]
"""Upper edges of every bin but the last: a bisection finds a duration's bin in one C call."""


def latency_bin(seconds: float) -> int:
    """The histogram bin of a duration (clamped to the first and last bin)."""
    return _bisect(_EDGES, seconds)


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    """The figures of a window at one moment.

    ``failures``, ``timeouts`` and ``rejections`` are the three error kinds; ``errors`` is their
    sum and ``failure_rate`` is ``errors / calls``. ``slow_calls`` counts calls (of any kind)
    strictly slower than the window's slow-call threshold (resilience4j's and Sentinel's rule).
    ``span`` is the seconds the window covers (time windows) or its size in calls (count
    windows).
    """

    calls: int
    failures: int
    timeouts: int
    rejections: int
    slow_calls: int
    span: float
    histogram: tuple[int, ...] = field(repr=False)

    @property
    def errors(self) -> int:
        return self.failures + self.timeouts + self.rejections

    @property
    def successes(self) -> int:
        return self.calls - self.errors

    @property
    def failure_rate(self) -> float:
        """Errors per call in ``[0, 1]``; 0.0 when there were no calls."""
        return self.errors / self.calls if self.calls else 0.0

    @property
    def slow_call_rate(self) -> float:
        """Slow calls per call in ``[0, 1]``; 0.0 when there were no calls."""
        return self.slow_calls / self.calls if self.calls else 0.0

    def percentile(self, q: float) -> float | None:
        """Estimated latency at quantile ``q`` in ``[0, 1]``, in seconds; ``None`` if empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        total = sum(self.histogram)
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for index, count in enumerate(self.histogram):
            if count and seen + count >= rank:
                low, high = latency_bin_bounds(index)
                return low + (high - low) * max(0.0, rank - seen) / count
            seen += count
        return latency_bin_bounds(HISTOGRAM_BINS - 1)[1]  # pragma: no cover - rank <= total

    @property
    def p50(self) -> float | None:
        return self.percentile(0.5)

    @property
    def p99(self) -> float | None:
        return self.percentile(0.99)


class Window(Protocol):
    """What a policy needs from a window (the owner serialises everything but
    :meth:`add_success` with its own lock)."""

    slow_call_duration: float

    def add_success(self, now: float, duration: float) -> bool: ...

    def add_success_in(self, now: float, duration: float, index: int) -> bool: ...

    def record(self, now: float, kind: Kind, duration: float) -> None: ...

    def totals(self) -> tuple[int, int, int, int, int]: ...

    def refresh(self, now: float) -> None: ...

    def snapshot(self, now: float) -> WindowSnapshot: ...

    def reset(self) -> None: ...


def _check_slow(slow_call_duration: float) -> float:
    return validate.seconds(
        "slow_call_duration", slow_call_duration, positive=True, infinite=True, error=ValueError
    )


class _Bucket:
    """One time slice. ``calls`` and the latency bins are :class:`~floodwall._core.tally.Tally`
    objects, bumped by a single atomic C call, so successes are counted without a lock; the
    rarer error and slow-call counters are plain ints changed under the owner's lock."""

    __slots__ = ("bins", "calls", "epoch", "failures", "rejections", "slow", "timeouts")

    def __init__(self, epoch: int, latency: bool) -> None:
        self.epoch = epoch
        self.calls = Tally()
        self.bins = [Tally() for _ in range(HISTOGRAM_BINS)] if latency else None
        self.failures = 0
        self.timeouts = 0
        self.rejections = 0
        self.slow = 0


def _value(counter: Tally) -> int:
    """The next value an ``itertools.count`` would return, i.e. how often it was advanced."""
    return int(repr(counter)[6:-1])


class TimeWindow:
    """Counts over the last ``buckets × bucket_seconds`` seconds, ``buckets`` at a time.

    A bucket is dropped whole when time moves past it, so the window covers between
    ``(buckets - 1) × bucket_seconds`` and ``buckets × bucket_seconds`` of history. Records that
    arrive late (a thread that read the clock just before a rotation) land in their own bucket
    while it is still in the window.

    Two ways in: :meth:`add_success` is lock-free and O(1) (two atomic counter bumps) and
    handles the common case, a fast success inside the current bucket; everything else goes
    through :meth:`record`, which the owner calls under its lock. Reading the totals sums the
    live buckets: O(buckets), O(buckets × bins) with the latency histogram.
    """

    __slots__ = (
        "_buckets",
        "_cur",
        "_end",
        "_inv",
        "_latency",
        "_ring",
        "_start",
        "bucket_seconds",
        "slow_call_duration",
    )

    def __init__(
        self,
        buckets: int = 10,
        bucket_seconds: float = 1.0,
        *,
        slow_call_duration: float = math.inf,
        latency: bool = True,
    ) -> None:
        validate.count("buckets", buckets, 1, defaults.MAX_SLOTS, error=ValueError)
        validate.flag("latency", latency, error=ValueError)
        validate.seconds("bucket_seconds", bucket_seconds, positive=True, error=ValueError)
        self._buckets = buckets
        self.bucket_seconds = float(bucket_seconds)
        self._inv = 1.0 / self.bucket_seconds
        self.slow_call_duration = _check_slow(slow_call_duration)
        self._latency = latency
        self._ring: list[_Bucket | None] = [None] * buckets
        self._cur: _Bucket | None = None
        self._start = math.inf  # empty: no time falls in [inf, -inf)
        self._end = -math.inf

    def add_success(self, now: float, duration: float) -> bool:
        """Count a success without a lock if it is fast and falls in the current bucket.

        Returns False, having counted nothing, when the call was slow or time has moved to a
        new bucket: the caller then takes its lock and uses :meth:`record`.
        """
        return self.add_success_in(now, duration, _bisect(_EDGES, duration))

    def add_success_in(self, now: float, duration: float, index: int) -> bool:
        """:meth:`add_success` given the duration's bin (``latency_bin(duration)``), by a caller
        that found it for a histogram of its own: a resource's meter (one bisection per call)."""
        if duration > self.slow_call_duration or not self._start <= now < self._end:
            return False
        bucket = self._cur
        # next(counter) rather than add(): benchmark group "tally: one bump"
        next(bucket.calls.counter)  # type: ignore[union-attr] # _cur is set while _start <= _end
        bins = bucket.bins  # type: ignore[union-attr]
        if bins is not None:
            next(bins[index].counter)
        return True

    def record(self, now: float, kind: Kind, duration: float) -> None:
        """Count one call that ended at ``now`` as ``kind`` after ``duration`` seconds.

        Callers serialise this (and every read) with a lock. ``Kind.IGNORED`` is not counted.
        """
        if kind > 3:
            return
        bucket = self._locate(now)
        if bucket is None:
            return  # older than the window: it would be dropped already
        bucket.calls.add()
        if kind == 1:
            bucket.failures += 1
        elif kind == 2:
            bucket.timeouts += 1
        elif kind == 3:
            bucket.rejections += 1
        if duration > self.slow_call_duration:
            bucket.slow += 1
        if bucket.bins is not None:
            bucket.bins[_bisect(_EDGES, duration)].add()

    def _locate(self, now: float) -> _Bucket | None:
        if self._start <= now < self._end:
            return self._cur
        epoch = _floor(now * self._inv)
        cur = self._cur
        if cur is None or epoch > cur.epoch:
            return self._rotate(epoch)
        if epoch <= cur.epoch - self._buckets:
            return None
        slot = epoch % self._buckets
        bucket = self._ring[slot]
        if bucket is None or bucket.epoch != epoch:
            bucket = self._ring[slot] = _Bucket(epoch, self._latency)
        return bucket

    def _rotate(self, epoch: int) -> _Bucket:
        cur = self._cur
        n = self._buckets
        if cur is None or epoch - cur.epoch >= n:
            self._ring = [None] * n
        else:
            for stale in range(cur.epoch + 1, epoch):
                self._ring[stale % n] = None
        bucket = self._ring[epoch % n] = _Bucket(epoch, self._latency)
        self._cur = bucket
        self._start = epoch * self.bucket_seconds
        self._end = (epoch + 1) * self.bucket_seconds
        return bucket

    def refresh(self, now: float) -> None:
        """Drop what ``now`` has pushed out of the window (call before trusting totals)."""
        if now >= self._end and self._cur is not None:
            epoch = _floor(now * self._inv)
            if epoch > self._cur.epoch:
                n = self._buckets
                for stale in range(max(self._cur.epoch + 1, epoch - n + 1), epoch + 1):
                    self._ring[stale % n] = None
                for slot, bucket in enumerate(self._ring):
                    if bucket is not None and bucket.epoch <= epoch - n:
                        self._ring[slot] = None

    def _live(self) -> list[_Bucket]:
        return [bucket for bucket in self._ring if bucket is not None]

    def totals(self) -> tuple[int, int, int, int, int]:
        """``(calls, failures, timeouts, rejections, slow)`` over the live buckets."""
        calls = failures = timeouts = rejections = slow = 0
        for bucket in self._live():
            calls += bucket.calls.value
            failures += bucket.failures
            timeouts += bucket.timeouts
            rejections += bucket.rejections
            slow += bucket.slow
        return calls, failures, timeouts, rejections, slow

    @property
    def calls(self) -> int:
        return self.totals()[0]

    def reset(self) -> None:
        """Forget everything."""
        self._ring = [None] * self._buckets
        self._cur = None
        self._start = math.inf
        self._end = -math.inf

    def snapshot(self, now: float) -> WindowSnapshot:
        self.refresh(now)
        calls, failures, timeouts, rejections, slow = self.totals()
        return WindowSnapshot(
            calls=calls,
            failures=failures,
            timeouts=timeouts,
            rejections=rejections,
            slow_calls=slow,
            span=self._buckets * self.bucket_seconds,
            histogram=self._histogram(),
        )

    def _histogram(self) -> tuple[int, ...]:
        sums = [0] * HISTOGRAM_BINS
        for bucket in self._live():
            if bucket.bins is not None:
                for index, counter in enumerate(bucket.bins):
                    sums[index] += counter.value
        return tuple(sums)

    def __repr__(self) -> str:
        return f"TimeWindow(buckets={self._buckets}, bucket_seconds={self.bucket_seconds})"


class CountWindow:
    """Counts over the last ``size`` calls (resilience4j's COUNT_BASED window)."""

    __slots__ = (
        "_filled",
        "_hist_total",
        "_latency",
        "_next",
        "_size",
        "_slot_bin",
        "_slot_code",
        "_total",
        "slow_call_duration",
    )

    def __init__(
        self, size: int = 100, *, slow_call_duration: float = math.inf, latency: bool = True
    ) -> None:
        validate.count("size", size, 1, defaults.MAX_SLOTS, error=ValueError)
        validate.flag("latency", latency, error=ValueError)
        self._size = size
        self.slow_call_duration = _check_slow(slow_call_duration)
        self._latency = latency
        self._next = 0
        self._filled = 0
        self.reset()

    def add_success(self, now: float, duration: float) -> bool:
        """A ring has no lock-free path: always False, so the owner uses :meth:`record`."""
        return False

    def add_success_in(self, now: float, duration: float, index: int) -> bool:
        """No lock-free path either (see :meth:`add_success`)."""
        return False

    def totals(self) -> tuple[int, int, int, int, int]:
        """``(calls, failures, timeouts, rejections, slow)`` over the last ``size`` calls."""
        t = self._total
        return t[0], t[1], t[2], t[3], t[4]

    @property
    def calls(self) -> int:
        return self._total[_CALLS]

    def record(self, now: float, kind: Kind, duration: float) -> None:
        """Count one call; the oldest call falls out once ``size`` are held."""
        del now  # a count window does not age
        if kind > 3:
            return
        slot = self._next
        total = self._total
        if self._filled == self._size:
            old = self._slot_code[slot]
            total[0] -= 1
            if old & 3:
                total[old & 3] -= 1
            if old & 4:
                total[_SLOW] -= 1
            if self._latency:
                self._hist_total[self._slot_bin[slot]] -= 1
        else:
            self._filled += 1
        code = int(kind) & 3
        total[0] += 1
        if code:
            total[code] += 1
        if duration > self.slow_call_duration:
            code |= 4
            total[_SLOW] += 1
        self._slot_code[slot] = code
        if self._latency:
            index = _bisect(_EDGES, duration)
            self._slot_bin[slot] = index
            self._hist_total[index] += 1
        self._next = slot + 1 if slot + 1 < self._size else 0

    def refresh(self, now: float) -> None:
        """Nothing ages out of a count window."""

    def reset(self) -> None:
        """Forget everything."""
        self._slot_code = bytearray(self._size)
        self._slot_bin = array("H", bytes(2 * self._size)) if self._latency else array("H")
        self._hist_total = array("q", bytes(8 * HISTOGRAM_BINS))
        self._total = [0] * _FIELDS
        self._next = 0
        self._filled = 0

    def snapshot(self, now: float) -> WindowSnapshot:
        t = self._total
        return WindowSnapshot(
            calls=t[0],
            failures=t[1],
            timeouts=t[2],
            rejections=t[3],
            slow_calls=t[_SLOW],
            span=float(self._size),
            histogram=tuple(self._hist_total),
        )

    def __repr__(self) -> str:
        return f"CountWindow(size={self._size})"
