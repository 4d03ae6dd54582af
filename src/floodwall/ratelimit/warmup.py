"""Warm-up: a cold limiter starts at ``rate / cold_factor`` and ramps up to ``rate``.

A service that has been idle (cold caches, connection pools, JIT) cannot take its full rate at
once. Sentinel's warm-up flow control (``WarmUpController``, cold factor 3) and Guava's
``SmoothWarmingUp`` solve it the same way; this is Guava's exact-time form. Requests are paced
(no bursts): the spacing between permits depends on how *cold* the limiter is, measured by
``stored`` permits that accumulate while it is idle::

    stable   = period / count                    seconds per permit at full rate
    cold     = stable × cold_factor              seconds per permit when fully cold
    threshold = 0.5 × warmup / stable            stored permits below which it is warm
    maximum  = threshold + 2 × warmup / (stable + cold)
    spacing(stored) = stable                                     if stored <= threshold
                    = stable + (stored - threshold) × (cold - stable) / (maximum - threshold)

Taking permits removes them from ``stored``; the time a request costs is the integral of
``spacing`` over the permits it takes (the area under the ramp), and pushes back the moment the
*next* request may go (a request is admitted when that moment has come: its own cost is paid
by its successor, Guava's pre-payment). Idle time refills ``stored`` at ``maximum / warmup``
permits per second: a limiter left alone for ``warmup`` seconds is fully cold again. Under
saturation from fully cold, the spacing shrinks linearly from ``cold`` to ``stable`` over
``warmup`` seconds: the rate ramps from ``rate / cold_factor`` to ``rate``.

**Promise**: consecutive admissions ``i``, ``i + 1`` are at least ``cost_i × stable`` apart
(so over any ``t`` seconds at most ``1 + rate × t`` cost-1 requests, never a burst), and at
least ``cost_i × spacing(stored)`` apart while cold. A new key starts fully cold.

Sources: Guava ``SmoothRateLimiter.SmoothWarmingUp`` (Apache 2.0; the ramp and its constants);
Alibaba Sentinel ``WarmUpController`` (cold factor 3); the seeds' rate-limiting chapter.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.events import EventListener
from floodwall._core.options import Checks, check_all
from floodwall.ratelimit._base import (
    INF,
    Decision,
    RateLike,
    RateLimiter,
    _new,
    max_wait_field,
    parse_rate,
    rate_field,
)

__all__ = ["WarmUp", "WarmUpOptions"]


_MAX_COLD_FACTOR = 1e6
"""A cold start a million times slower than the rate is no warm-up any more (and a larger factor
makes the ramp's slope underflow to zero)."""


@dataclass(frozen=True, slots=True)
class WarmUpOptions:
    """A :class:`WarmUp`'s options, validated once: ``rate`` (kept as a
    :class:`~floodwall.ratelimit.Rate`), ``warmup`` (seconds of the ramp, > 0), ``cold_factor``
    (the cold rate is ``rate / cold_factor``, in ``(1, 1e6]``; Sentinel's 3) and ``max_wait``."""

    rate: RateLike
    warmup: float
    cold_factor: float = defaults.WARMUP_COLD_FACTOR
    max_wait: float = defaults.RATE_LIMIT_MAX_WAIT

    CHECKS: ClassVar[Checks] = {
        "rate": rate_field,
        "warmup": partial(validate.seconds, positive=True),
        "cold_factor": partial(validate.number, low=1.0, high=_MAX_COLD_FACTOR, low_open=True),
        "max_wait": max_wait_field,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


_PAIR = struct.Struct("dd")
"""A packed :class:`_Warm`: ``stored`` and ``free`` as doubles (``bytes``: never tracked by the
garbage collector)."""


class _Warm:
    """Per-key state: ``stored`` permits (coldness) and when the next request may go."""

    __slots__ = ("free", "stored")

    def __init__(self, stored: float, free: float) -> None:
        self.stored = stored
        self.free = free


class WarmUp(RateLimiter[_Warm]):
    """Ramp from ``rate / cold_factor`` to ``rate`` over ``warmup`` seconds (see
    [Rate limiting][guide-rate-limiting]).

    As a gate (:class:`~floodwall.ratelimit.RateLimiter`): ``admit`` takes the next slot at the
    current (warming) rate or raises; ``max_wait`` books the slot, then sleeps to it.
    """

    algorithm = "warm_up"
    books_ahead = True
    limit = 1

    def __init__(
        self,
        rate: RateLike,
        *,
        warmup: float,
        cold_factor: float = defaults.WARMUP_COLD_FACTOR,
        name: str = "warm_up",
        clock: Clock = SYSTEM_CLOCK,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = WarmUpOptions(rate, warmup, cold_factor, max_wait)
        """The validated :class:`WarmUpOptions`, read once, here."""
        self.rate = parse_rate(o.rate)
        self.warmup = o.warmup
        self.cold_factor = o.cold_factor
        self.stable = self.rate.interval
        self.cold = self.stable * self.cold_factor
        self.threshold = 0.5 * self.warmup / self.stable
        self.maximum = self.threshold + 2.0 * self.warmup / (self.stable + self.cold)
        self.slope = (self.cold - self.stable) / (self.maximum - self.threshold)
        self.cool_down = self.warmup / self.maximum
        """Seconds of idleness that store one permit."""
        self.window = self.stable
        super().__init__(name=name, clock=clock, max_wait=o.max_wait, listeners=listeners)

    def spacing(self, stored: float) -> float:
        """Seconds per permit when ``stored`` permits are stored (the ramp)."""
        return self.stable + max(0.0, stored - self.threshold) * self.slope

    def _cost(self, stored: float, permits: float) -> float:
        """Seconds that taking ``permits`` costs, ``stored`` permits being stored."""
        take = min(permits, stored)
        above = stored - self.threshold
        seconds = 0.0
        if above > 0:
            steep = min(above, take)
            # trapezoid under the ramp from ``above`` down to ``above - steep``
            seconds = steep * (2 * self.stable + (2 * above - steep) * self.slope) / 2
            take -= steep
        return seconds + self.stable * take + self.stable * (permits - min(permits, stored))

    def _resync(self, st: _Warm, now: float) -> None:
        if now > st.free:
            stored = st.stored + (now - st.free) / self.cool_down
            st.stored = min(self.maximum, stored)
            st.free = now

    # -- the pure core ----------------------------------------------------------------------

    def _new_state(self, now: float) -> _Warm:
        return _Warm(self.maximum, -INF)

    def _check(self, st: _Warm, now: float, cost: float) -> bool:
        self._resync(st, now)
        return st.free <= now

    def _commit(self, st: _Warm, now: float, cost: float) -> None:
        st.free += self._cost(st.stored, cost)
        st.stored -= min(cost, st.stored)

    def _decide(self, st: _Warm, now: float, cost: float) -> bool:
        self._resync(st, now)
        if st.free > now:
            return False
        self._commit(st, now, cost)
        return True

    def _reserve(self, st: _Warm, now: float, cost: float, max_wait: float) -> float:
        self._resync(st, now)
        delay = st.free - now if st.free > now else 0.0
        if delay > max_wait:
            return -1.0
        self._commit(st, now, cost)
        return delay

    def _figures(self, st: _Warm, now: float, cost: float, allowed: bool) -> Decision:
        wait = st.free - now if st.free > now else 0.0
        return _new(Decision, (allowed, 0 if wait else 1, wait, 0.0 if allowed else wait, 1))

    def _idle_at(self, st: _Warm) -> float:
        if st.free == -INF:
            return -INF
        return st.free + (self.maximum - st.stored) * self.cool_down

    def _pack(self, st: _Warm) -> bytes:
        return _PAIR.pack(st.stored, st.free)

    def _unpack(self, packed: bytes) -> _Warm:
        return _Warm(*_PAIR.unpack(packed))

    def describe(self) -> str:
        return (
            f"WarmUp({self.name!r}, {self.rate}, warmup={self.warmup:g}s, "
            f"cold_factor={self.cold_factor:g})"
        )
