"""GCRA, the generic cell rate algorithm: a token bucket kept as one timestamp, in integers.

Requests are spaced by the *emission interval* ``T = period / count``; the *delay variation
tolerance* ``τ = T × capacity`` (``capacity = 1 + burst``) is how far ahead of that schedule a
client may run. The state is the *theoretical arrival time* (TAT) of the next request. At
``now``, a request of cost ``c`` is admitted when::

    new_tat = max(tat, now) + T × c
    new_tat - now <= τ            (then tat = new_tat)

This is redis-cell's ``CL.THROTTLE`` (Brandur Leach): ``burst`` is its ``max_burst``, the
reported ``limit`` is ``capacity = 1 + burst``, ``remaining = floor((τ - ttl) / T)`` and
``reset_after = ttl`` where ``ttl = new_tat - now`` (admitted) or ``tat - now`` (refused),
``retry_after = new_tat - τ - now`` (refused; ``inf`` when ``T × c > τ``). ``burst`` defaults
to ``rate.count - 1``, so ``GCRA("10/s")`` admits 10 at once, like ``TokenBucket("10/s")``.

**Exact integer time.** Times are integers in units of ``1/scale`` ns, ``scale`` chosen so that
``T`` is a whole number of units (``scale = count / gcd(period_ns, count)``): ``GCRA("3/s")``
has ``T = 10⁹`` units of ⅓ ns, so three requests a second are spaced exactly, with no rounding
drift however long it runs. The clock's float seconds are rounded to the nearest nanosecond once
per decision (``floor(x + 0.5)``). Costs must be integers for the arithmetic to stay exact.

**Promise** (exact): over any interval of ``t`` seconds, the admitted cost is at most
``capacity + t / T`` (the token bucket's bound), and a key's state is one integer (its TAT),
which is back to fresh once ``tat <= now``.

Sources: ATM Forum Traffic Management Specification 4.0 (1996), §4.4.2 (virtual scheduling);
redis-cell, ``redis-cell-impl/src/lib.rs`` (github.com/brandur/redis-cell).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.events import EventListener
from floodwall._core.validate import count as _count
from floodwall.ratelimit._base import (
    INF,
    Decision,
    RateLike,
    RateLimiter,
    _new,
    parse_rate,
)

__all__ = ["GCRA"]

_floor = math.floor

_NEVER = -(1 << 62)
"""A TAT that any clock reading is past: the state of a key never seen."""


class _Tat:
    """Per-key state: the theoretical arrival time, in the limiter's integer units."""

    __slots__ = ("tat",)

    def __init__(self, tat: int) -> None:
        self.tat = tat


class GCRA(RateLimiter[_Tat]):
    """GCRA with ``capacity = 1 + burst`` (see [Rate limiting][guide-rate-limiting]).

    As a gate (:class:`~floodwall.ratelimit.RateLimiter`): ``admit`` moves the theoretical
    arrival time or raises the rejection; ``max_wait`` books the slot, then sleeps to it.
    """

    algorithm = "gcra"
    books_ahead = True

    def __init__(
        self,
        rate: RateLike,
        *,
        burst: int | None = None,
        name: str = "gcra",
        clock: Clock = SYSTEM_CLOCK,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.rate = parse_rate(rate)
        self.burst = self.rate.count - 1 if burst is None else _count("burst", burst, 0)
        self.limit = 1 + self.burst
        period_ns = round(self.rate.period * 1_000_000_000)
        common = math.gcd(period_ns, self.rate.count)
        self.scale = self.rate.count // common
        """Time units per nanosecond."""
        self.emission_interval = period_ns // common
        """``T`` in units (``1/scale`` ns)."""
        self.tolerance = self.emission_interval * self.limit
        """``τ = T × capacity`` in units."""
        self.units_per_second = 1_000_000_000 * self.scale
        self._per_unit = 1.0 / self.units_per_second
        self.window = self.tolerance * self._per_unit
        super().__init__(name=name, clock=clock, max_wait=max_wait, listeners=listeners)

    def units(self, now: float) -> int:
        """``now`` (seconds) in this limiter's integer time units."""
        return _floor(now * 1_000_000_000 + 0.5) * self.scale

    # -- the pure core ----------------------------------------------------------------------

    def _new_state(self, now: float) -> _Tat:
        return _Tat(_NEVER)

    def _check(self, st: _Tat, now: float, cost: float) -> bool:
        t = _floor(now * 1_000_000_000 + 0.5) * self.scale
        return max(st.tat, t) + self.emission_interval * cost - t <= self.tolerance

    def _commit(self, st: _Tat, now: float, cost: float) -> None:
        t = _floor(now * 1_000_000_000 + 0.5) * self.scale
        st.tat = max(st.tat, t) + self.emission_interval * cost  # type: ignore[assignment]

    def _decide(self, st: _Tat, now: float, cost: float) -> bool:
        t = _floor(now * 1_000_000_000 + 0.5) * self.scale
        tat = st.tat
        if tat < t:  # noqa: PLR1730 - a comparison costs less than calling max() (hot path)
            tat = t
        new = tat + self.emission_interval * cost
        if new - t <= self.tolerance:
            st.tat = new  # type: ignore[assignment]
            return True
        return False

    def _reserve(self, st: _Tat, now: float, cost: float, max_wait: float) -> float:
        t = _floor(now * 1_000_000_000 + 0.5) * self.scale
        increment = self.emission_interval * cost
        if increment > self.tolerance:
            return -1.0
        new = max(st.tat, t) + increment
        wait = new - self.tolerance - t
        if wait > 0 and wait * self._per_unit > max_wait:
            return -1.0
        st.tat = new  # type: ignore[assignment]
        return wait * self._per_unit if wait > 0 else 0.0

    def _figures(self, st: _Tat, now: float, cost: float, allowed: bool) -> Decision:
        t = _floor(now * 1_000_000_000 + 0.5) * self.scale
        tat = max(st.tat, t)
        ttl = tat - t  # after an admission st.tat is the new TAT
        if allowed:
            retry = 0.0
        else:
            increment = self.emission_interval * cost
            late = tat + increment - self.tolerance - t
            retry = INF if increment > self.tolerance else late * self._per_unit
        spare = self.tolerance - ttl
        return _new(
            Decision,
            (
                allowed,
                int(spare // self.emission_interval) if spare > 0 else 0,
                ttl * self._per_unit,
                retry,
                self.limit,
            ),
        )

    def _idle_at(self, st: _Tat) -> float:
        return -INF if st.tat == _NEVER else st.tat * self._per_unit

    def describe(self) -> str:
        return f"GCRA({self.name!r}, {self.rate}, burst={self.burst})"
