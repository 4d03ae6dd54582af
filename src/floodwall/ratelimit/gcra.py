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

**Exact integer time.** Times are integers in units of ``1/scale`` µs, ``scale`` chosen so that
``T`` is a whole number of units (``scale = count / gcd(period_us, count)``): ``GCRA("3/s")``
has ``T = 10⁶`` units of ⅓ µs, so three requests a second are spaced exactly, with no rounding
drift however long it runs. The clock's float seconds are rounded to the nearest microsecond
once per decision (``floor(x + 0.5)``). Costs must be integers for the arithmetic to stay exact.
The decision is :class:`~floodwall.ratelimit._steps.GcraStep`, the arithmetic the store op
behind ``GlobalLimiter("gcra")`` runs and ``lua/ratelimit_gcra.lua`` mirrors; ``reset_after``
and ``retry_after`` are rounded up to the microsecond.

**Promise** (exact): over any interval of ``t`` seconds, the admitted cost is at most
``capacity + t / T`` (the token bucket's bound), and a key's state is one integer (its TAT),
which is back to fresh once ``tat <= now``.

Sources: ATM Forum Traffic Management Specification 4.0 (1996), §4.4.2 (virtual scheduling);
redis-cell, ``redis-cell-impl/src/lib.rs`` (github.com/brandur/redis-cell).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.events import EventListener
from floodwall._core.options import Checks, check_all, optional
from floodwall.ratelimit._base import RateLike, RateLimiter, max_wait_field, parse_rate, rate_field
from floodwall.ratelimit._steps import US, GcraStep, Tat

__all__ = ["GCRA", "GCRAOptions"]


@dataclass(frozen=True, slots=True)
class GCRAOptions:
    """A :class:`GCRA`'s options, validated once: ``rate`` (kept as a
    :class:`~floodwall.ratelimit.Rate`), ``burst`` (permits beyond the steady flow, >= 0;
    ``None``: ``rate.count - 1``) and ``max_wait`` (seconds a call may wait as a policy)."""

    rate: RateLike
    burst: int | None = None
    max_wait: float = defaults.RATE_LIMIT_MAX_WAIT

    CHECKS: ClassVar[Checks] = {
        "rate": rate_field,
        "burst": optional(partial(validate.count, minimum=0)),
        "max_wait": max_wait_field,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


class GCRA(RateLimiter[Tat], GcraStep):
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
        self.options = o = GCRAOptions(rate, burst, max_wait)
        """The validated :class:`GCRAOptions`, read once, here."""
        self.rate = parse_rate(o.rate)
        self.burst = self.rate.count - 1 if o.burst is None else o.burst
        self.limit = 1 + self.burst
        GcraStep.__init__(self, *GcraStep.units_of(self.rate, self.limit), US)
        self.units_per_second = 1_000_000 * self.scale
        self.window = self.tolerance / self.units_per_second
        super().__init__(name=name, clock=clock, max_wait=o.max_wait, listeners=listeners)

    def units(self, now: float) -> int:
        """``now`` (seconds) in this limiter's integer time units."""
        return self._ticks(now) * self.scale

    # -- the pure core: the step's --------------------------------------------------------

    _new_state = GcraStep.fresh
    _check = GcraStep.check
    _commit = GcraStep.commit
    _decide = GcraStep.decide
    _reserve = GcraStep.reserve
    _figures = GcraStep.figures
    _idle_at = GcraStep.idle_at
    _pack = GcraStep.pack
    _unpack = GcraStep.unpack
    _decide_packed = GcraStep.decide_packed

    def describe(self) -> str:
        return f"GCRA({self.name!r}, {self.rate}, burst={self.burst})"
