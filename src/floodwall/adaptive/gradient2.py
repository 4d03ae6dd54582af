"""Gradient2: compare the current RTT with a long exponential average of it.

concurrency-limits' ``Gradient2Limit``, the library's recommended default. The short RTT is the
sample itself; the long RTT is an exponential average over ``long_window`` samples (after a
10-sample plain-average warm-up), decayed by 10 % whenever it is more than twice the short RTT so
the limit recovers quickly after a long overload:

    inflight < limit / 2  → unchanged ("app-limited": nothing learned about capacity)
    gradient = clamp(long_rtt / short_rtt, 0.5, 1.0)
    new = limit × gradient + queue_size
    new = limit × (1 − smoothing) + new × smoothing
    limit = clamp(new, min_limit, max_concurrency)

Drops are ignored: the RTT already carries the signal. Defaults: ``initial_limit=20``,
``min_limit=20``, ``max_concurrency=200``, ``smoothing=0.2``, ``queue_size=4`` (a constant, or a
function of the limit), ``long_window=600``.
"""

from __future__ import annotations

from collections.abc import Callable

from floodwall._core import defaults
from floodwall._core.errors import ConfigError
from floodwall.adaptive._base import ExpAvgMeasurement, Limit, check_float, check_int

__all__ = ["Gradient2Limit"]


class Gradient2Limit(Limit):
    """Gradient of a long-term average RTT over the current RTT (see
    [Overload protection][guide-overload])."""

    __slots__ = (
        "_fixed_queue",
        "_long_rtt",
        "_max",
        "_min",
        "_queue_size",
        "estimated_limit",
        "last_rtt",
        "max_concurrency",
        "min_limit",
        "smoothing",
    )

    def __init__(
        self,
        *,
        initial_limit: int = defaults.GRADIENT2_INITIAL_LIMIT,
        min_limit: int = defaults.GRADIENT2_MIN_LIMIT,
        max_concurrency: int = defaults.GRADIENT2_MAX_CONCURRENCY,
        smoothing: float = defaults.GRADIENT2_SMOOTHING,
        queue_size: int | Callable[[int], int] = defaults.GRADIENT2_QUEUE_SIZE,
        long_window: int = defaults.GRADIENT2_LONG_WINDOW,
    ) -> None:
        super().__init__(initial_limit)
        self.min_limit = check_int("min_limit", min_limit)
        self.max_concurrency = check_int("max_concurrency", max_concurrency)
        if self.max_concurrency < self.min_limit:
            raise ConfigError(
                f"max_concurrency must be >= min_limit ({min_limit}), got {max_concurrency!r}"
            )
        self.smoothing = check_float("smoothing", smoothing, 0.0, 1.0, open_high=False)
        self._queue_size: Callable[[int], int] | None = None
        self._fixed_queue = -1
        """``queue_size`` when it is a constant, else -1 (then ``_queue_size`` is called)."""
        if isinstance(queue_size, int):
            self._fixed_queue = check_int("queue_size", queue_size, 0)
        else:
            self._queue_size = queue_size
        self._min = float(self.min_limit)
        self._max = float(self.max_concurrency)
        self._long_rtt = ExpAvgMeasurement(
            check_int("long_window", long_window), defaults.GRADIENT2_WARMUP
        )
        self.estimated_limit = float(initial_limit)
        self.last_rtt = 0.0

    @property
    def long_rtt(self) -> float:
        """The long-term average RTT, seconds."""
        return self._long_rtt.value

    def on_sample(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        # Limit.on_sample, _update, ExpAvgMeasurement.add and the clamps in one frame: this
        # runs once per request behind a LoadShedder, and calls cost more than the arithmetic
        # (same arithmetic in the same order: same results).
        estimated = self.estimated_limit
        fixed = self._fixed_queue
        queue = fixed if fixed >= 0 else self._queue_size(int(estimated))  # type: ignore[misc]
        self.last_rtt = short = rtt
        avg = self._long_rtt
        if avg._count < avg.warmup:
            avg._count += 1
            avg._sum += rtt
            avg.value = long = avg._sum / avg._count
        else:
            factor = avg._factor
            avg.value = long = avg.value * (1 - factor) + rtt * factor
        if short > 0 and long / short > 2:
            avg.value *= 0.9  # a stale long RTT decays by 10 % (Gradient2Limit.java)
        if inflight < estimated / 2:
            limit = int(estimated)  # app-limited: nothing learned about capacity
        else:
            gradient = long / short if short > 0 else 1.0
            if gradient > 1.0:
                gradient = 1.0
            elif gradient < 0.5:
                gradient = 0.5
            smoothing = self.smoothing
            new = estimated * (1 - smoothing) + (estimated * gradient + queue) * smoothing
            if new < self._min:
                new = self._min
            elif new > self._max:
                new = self._max
            self.estimated_limit = new
            limit = max(1, int(new))
        if limit != self._limit:  # Limit.on_sample's own ending
            self._limit = limit
            for listener in self._listeners:
                listener(limit)
        return limit

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        # Limit's contract, kept for callers of Limit.on_sample: this on_sample stores and
        # publishes the limit itself, so the base class then sees no change.
        return self.on_sample(start, rtt, inflight, dropped)
