"""What every limit algorithm shares: the :class:`Limit` contract, change listeners, helpers.

A limit algorithm is a pure function of its samples, as in Netflix's concurrency-limits
(``com.netflix.concurrency.limits.Limit``): ``on_sample(start, rtt, inflight, dropped)`` feeds one
observation and returns the new limit. It reads no clock and sleeps never; the limiter that owns
it serialises calls (algorithms hold no lock of their own).

Times are seconds (floats) where the Java library uses nanoseconds, so published traces carry over
by dividing by 1e9.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

from floodwall._core import validate
from floodwall._core.errors import ConfigError

__all__ = [
    "ExpAvgMeasurement",
    "FixedLimit",
    "Limit",
    "MinimumMeasurement",
    "log10_root",
    "square_root",
]

LimitListener = Callable[[int], None]


def log10_root(value: int) -> int:
    """``max(1, int(log10(value)))``: concurrency-limits' ``Log10RootFunction`` (1 for 0)."""
    return max(1, int(math.log10(value))) if value > 0 else 1


def square_root(value: int) -> int:
    """``max(1, int(sqrt(value)))``: concurrency-limits' ``SquareRootFunction``."""
    return max(1, math.isqrt(value)) if value > 0 else 1


def check_int(name: str, value: int, low: int = 1) -> int:
    """Validate an integer option (``>= low``), naming the option in the error."""
    return validate.count(name, value, low)


def check_float(name: str, value: float, low: float, high: float, *, open_high: bool) -> float:
    """Validate a float option in ``[low, high]`` (or ``[low, high)``)."""
    return validate.number(name, value, low, high, high_open=open_high)


def check_positive(name: str, value: float) -> float:
    return validate.seconds(name, value, positive=True)


def count_or_function(name: str, value: object, minimum: int = 1) -> int | Callable[[int], int]:
    """An option that is a fixed count (``>= minimum``) or a function of the limit
    (``queue_size``, Vegas's ``alpha``/``beta``): the function kept as given, the count checked."""
    if callable(value):
        return value
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(
            f"{name} must be an integer >= {minimum} or a function of the limit, got {value!r}"
        )
    return value


def as_function(value: int | Callable[[int], int]) -> Callable[[int], int]:
    """A :func:`count_or_function` option as a function of the limit."""
    if callable(value):
        return value
    return lambda _limit: value


class Limit(ABC):
    """A concurrency limit that adapts to samples.

    Subclasses implement :meth:`_update`, returning the new limit as an ``int``; :meth:`on_sample`
    stores it and tells subscribers when it changed. ``limit`` is always >= 1.
    """

    __slots__ = ("_limit", "_listeners")

    def __init__(self, initial_limit: int) -> None:
        self._limit = check_int("initial_limit", initial_limit)
        self._listeners: tuple[LimitListener, ...] = ()

    @property
    def limit(self) -> int:
        """The current concurrency limit."""
        return self._limit

    def on_sample(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        """Feed one request that started at ``start``, took ``rtt`` seconds, saw ``inflight``
        requests in flight when it started and was ``dropped`` (timed out, shed downstream);
        return the new limit."""
        new = self._update(start, rtt, inflight, dropped)
        if new != self._limit:
            self._limit = new
            for listener in self._listeners:
                listener(new)
        return new

    @abstractmethod
    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        """Return the new limit for one sample (never below 1)."""

    def subscribe(self, listener: LimitListener) -> None:
        """Call ``listener(new_limit)`` after every change (``Limit.notifyOnChange``)."""
        self._listeners = (*self._listeners, listener)

    def unsubscribe(self, listener: LimitListener) -> None:
        self._listeners = tuple(item for item in self._listeners if item != listener)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limit={self._limit})"


class FixedLimit(Limit):
    """A limit that never moves: a plain bulkhead expressed as a :class:`Limit`."""

    __slots__ = ()

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        return self._limit


class ExpAvgMeasurement:
    """Exponential moving average over ``window`` samples after a plain-average warm-up.

    The first ``warmup`` samples are averaged arithmetically; after that each sample moves the
    value by ``2 / (window + 1)`` (concurrency-limits' ``ExpAvgMeasurement``). With
    ``window=100, warmup=10`` the samples 10, 11, …, 19 give 10.0, 10.5, …, 14.5 and a following
    100 gives ≈ 16.2 (``ExpAvgMeasurementTest.testWarmup``).
    """

    __slots__ = ("_count", "_factor", "_sum", "value", "warmup", "window")

    def __init__(self, window: int, warmup: int) -> None:
        self.window = check_int("window", window)
        self.warmup = check_int("warmup", warmup, 0)
        self._factor = 2.0 / (window + 1)
        self.value = 0.0
        self._sum = 0.0
        self._count = 0

    def add(self, sample: float) -> float:
        if self._count < self.warmup:
            self._count += 1
            self._sum += sample
            self.value = self._sum / self._count
        else:
            self.value = self.value * (1 - self._factor) + sample * self._factor
        return self.value

    def update(self, operation: Callable[[float], float]) -> None:
        """Replace the value by ``operation(value)`` (Gradient2 decays a stale long RTT)."""
        self.value = operation(self.value)

    def reset(self) -> None:
        self.value = 0.0
        self._sum = 0.0
        self._count = 0


class MinimumMeasurement:
    """The smallest sample since the last reset (0.0 when empty)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def add(self, sample: float) -> float:
        if self.value == 0.0 or sample < self.value:
            self.value = sample
        return self.value

    def reset(self) -> None:
        self.value = 0.0
