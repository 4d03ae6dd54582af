"""Gradient2: compare the current RTT with a long exponential average of it.

concurrency-limits' current ``Gradient2Limit`` (``concurrency-limits-core/.../limit/
Gradient2Limit.java``, with ``rttTolerance``), the library's recommended default. The short RTT
is the sample itself; the long RTT is an exponential average over ``long_window`` samples (after
a 10-sample plain-average warm-up), decayed by 5 % per sample whenever it is more than twice the
short RTT, so the limit recovers quickly after a long overload:

    inflight < limit / 2  → unchanged ("app-limited": nothing learned about capacity)
    gradient = clamp(rtt_tolerance × long_rtt / short_rtt, 0.5, 1.0)
    new = limit × gradient + queue_size
    s = smoothing if new >= limit else decrease_smoothing
    new = limit × (1 − s) + new × s
    limit = clamp(new, min_limit, max_concurrency)

``rtt_tolerance`` (1.5) is how much slower than its long average a sample may be before it counts
as queueing: a steady 30 % rise in latency is not overload. Drops are ignored: the RTT already
carries the signal. Java's builder defaults (``initial_limit=20``, ``max_concurrency=200``,
``long_window=600``) except four, for small services (issue 18), and one rule:

* ``min_limit=1`` (Java: 20, a 40 ms queue on a one-core service at 2 ms a request);
* ``queue_size=square_root`` (Java: 4): under overload the limit tends to ``2 × queue_size``
  (the gradient's 0.5 floor), 8 in flight with 4, 4 with the square root;
* ``decrease_smoothing=0.5`` (Java smooths both ways by ``smoothing``, 0.2): behind a 1 s
  window, 0.2 needs ten seconds to walk down a limit the latency already shows is too high,
  0.5 four; growth keeps Java's 0.2, the way TCP grows a window carefully and backs off at
  once (growing as fast as it shrinks, a limit whose baseline was learned under load outruns
  the client's deadline sooner: see [Overload protection][guide-overload]);
* when no ``initial_limit`` is given, ``cold_limit=100`` in flight before the first sample (Java
  refuses a burst past 20 at start-up);
* the samples of the cold allowance (more in flight than the algorithm's own limit) do not
  teach the long RTT's warm-up: they measured the crowd, not the service.

``Gradient2Limit(initial_limit=20, min_limit=20, queue_size=4, decrease_smoothing=0.2)`` is
Java's algorithm exactly (the golden traces in the tests pass these).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall._core.options import Checks, check_all, optional
from floodwall.adaptive._base import ExpAvgMeasurement, Limit, count_or_function, square_root

__all__ = ["Gradient2Limit", "Gradient2Options"]


@dataclass(frozen=True, slots=True)
class Gradient2Options:
    """A :class:`Gradient2Limit`'s options, validated once (defaults: see the module doc).

    ``initial_limit=None`` starts at 20 with the ``cold_limit`` allowance (100 unless given);
    ``queue_size`` is a count (>= 0) or a function of the limit; ``max_concurrency`` must be
    at least ``min_limit``.
    """

    initial_limit: int | None = None
    min_limit: int = defaults.GRADIENT2_MIN_LIMIT
    max_concurrency: int = defaults.GRADIENT2_MAX_CONCURRENCY
    smoothing: float = defaults.GRADIENT2_SMOOTHING
    decrease_smoothing: float = defaults.GRADIENT2_DECREASE_SMOOTHING
    queue_size: int | Callable[[int], int] = square_root
    long_window: int = defaults.GRADIENT2_LONG_WINDOW
    rtt_tolerance: float = defaults.GRADIENT2_RTT_TOLERANCE
    cold_limit: int | None = None

    CHECKS: ClassVar[Checks] = {
        "initial_limit": optional(validate.count),
        "min_limit": validate.count,
        "max_concurrency": validate.count,
        "smoothing": partial(validate.number, low=0.0, high=1.0),
        "decrease_smoothing": partial(validate.number, low=0.0, high=1.0),
        "queue_size": partial(count_or_function, minimum=0),
        "long_window": validate.count,
        "rtt_tolerance": partial(validate.number, low=1.0),
        "cold_limit": optional(validate.count),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.max_concurrency < self.min_limit:
            raise ConfigError(
                f"max_concurrency must be >= min_limit ({self.min_limit}), "
                f"got {self.max_concurrency!r}"
            )


class Gradient2Limit(Limit):
    """Gradient of a long-term average RTT over the current RTT (see
    [Overload protection][guide-overload]).

    ``options`` holds the validated :class:`Gradient2Options`, copied once, at construction,
    into the fields :meth:`on_sample` reads."""

    __slots__ = (
        "_cold",
        "_fixed_queue",
        "_long_rtt",
        "_max",
        "_min",
        "_queue_at",
        "_queue_size",
        "decrease_smoothing",
        "estimated_limit",
        "last_rtt",
        "max_concurrency",
        "min_limit",
        "options",
        "rtt_tolerance",
        "smoothing",
    )

    def __init__(
        self,
        *,
        initial_limit: int | None = None,
        min_limit: int = defaults.GRADIENT2_MIN_LIMIT,
        max_concurrency: int = defaults.GRADIENT2_MAX_CONCURRENCY,
        smoothing: float = defaults.GRADIENT2_SMOOTHING,
        decrease_smoothing: float = defaults.GRADIENT2_DECREASE_SMOOTHING,
        queue_size: int | Callable[[int], int] = square_root,
        long_window: int = defaults.GRADIENT2_LONG_WINDOW,
        rtt_tolerance: float = defaults.GRADIENT2_RTT_TOLERANCE,
        cold_limit: int | None = None,
    ) -> None:
        self.options = o = Gradient2Options(
            initial_limit,
            min_limit,
            max_concurrency,
            smoothing,
            decrease_smoothing,
            queue_size,
            long_window,
            rtt_tolerance,
            cold_limit,
        )
        cold = o.cold_limit
        if cold is None and o.initial_limit is None:
            cold = defaults.GRADIENT2_COLD_LIMIT
        initial = defaults.GRADIENT2_INITIAL_LIMIT if o.initial_limit is None else o.initial_limit
        super().__init__(initial)
        self.min_limit = o.min_limit
        self.max_concurrency = o.max_concurrency
        self.smoothing = o.smoothing
        self.decrease_smoothing = o.decrease_smoothing
        self.rtt_tolerance = o.rtt_tolerance
        # The queue size in use is ``_fixed_queue``: the constant, or the function's value for
        # the whole estimated limit ``_queue_at``, recomputed only when that changes (calling
        # the function every sample cost 70 % more per on_sample; the limit moves rarely).
        self._queue_size: Callable[[int], int] | None = None
        self._queue_at = initial
        if callable(o.queue_size):
            self._queue_size = o.queue_size
            self._fixed_queue = o.queue_size(self._queue_at)
        else:
            self._fixed_queue = o.queue_size
        self._min = float(self.min_limit)
        self._max = float(self.max_concurrency)
        self._long_rtt = ExpAvgMeasurement(o.long_window, defaults.GRADIENT2_WARMUP)
        self.estimated_limit = float(initial)
        self.last_rtt = 0.0
        self._cold = cold is not None
        """Whether the cold allowance was granted (its samples must not define the baseline)."""
        if cold is not None:
            # Before the first sample nothing is known about capacity: a freshly started
            # service admits up to cold_limit (within [initial_limit, max_concurrency]) instead
            # of refusing a burst of healthy requests; the first sample starts Java's trace
            # from initial_limit. An explicit initial_limit alone is honoured from the start.
            self._limit = max(self._limit, min(cold, self.max_concurrency))

    @property
    def long_rtt(self) -> float:
        """The long-term average RTT, seconds."""
        return self._long_rtt.value

    def on_sample(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        # Limit.on_sample, _update, ExpAvgMeasurement.add and the clamps in one frame: this
        # runs once per request behind a LoadShedder, and calls cost more than the arithmetic
        # (same arithmetic in the same order: same results).
        estimated = self.estimated_limit
        queue = self._fixed_queue
        self.last_rtt = short = rtt
        avg = self._long_rtt
        learnt = True
        if avg._count < avg.warmup:  # the first ten samples only
            learnt = self._warm_up(rtt, inflight, estimated)
            long = avg.value
        else:
            factor = avg._factor
            avg.value = long = avg.value * (1 - factor) + rtt * factor
        if short > 0 and long / short > 2:
            avg.value *= defaults.GRADIENT2_LONG_RTT_DECAY  # a stale long RTT decays (5 %)
        if inflight < estimated / 2 or not learnt:
            limit = int(estimated)  # app-limited (or no baseline yet): nothing learned
        else:
            gradient = self.rtt_tolerance * long / short if short > 0 else 1.0
            if gradient > 1.0:
                gradient = 1.0
            elif gradient < 0.5:
                gradient = 0.5
            target = estimated * gradient + queue
            smoothing = self.smoothing if target >= estimated else self.decrease_smoothing
            new = estimated * (1 - smoothing) + target * smoothing
            if new < self._min:
                new = self._min
            elif new > self._max:
                new = self._max
            self.estimated_limit = new
            whole = int(new)
            limit = max(1, whole)
            if self._queue_size is not None and whole != self._queue_at:
                self._queue_at = whole
                self._fixed_queue = self._queue_size(whole)
        if limit != self._limit:  # Limit.on_sample's own ending
            self._limit = limit
            for listener in self._listeners:
                listener(limit)
        return limit

    def _warm_up(self, rtt: float, inflight: int, estimated: float) -> bool:
        """One sample of the long RTT's plain-average warm-up; False while there is no
        baseline at all."""
        avg = self._long_rtt
        if self._cold and inflight > estimated:
            # measured with the cold allowance's crowd in flight, not within a limit of the
            # algorithm's: it would teach the baseline a queue as normal (a service started at
            # 3x learnt 75 ms for a 2 ms service, and grew into its clients' timeouts)
            return avg._count > 0
        avg.add(rtt)
        return True

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        # Limit's contract, kept for callers of Limit.on_sample: this on_sample stores and
        # publishes the limit itself, so the base class then sees no change.
        return self.on_sample(start, rtt, inflight, dropped)
