"""Fixed window: at most ``count`` permits per window of ``period`` seconds.

A key's window opens at its first request after the previous window closed and lasts
``period`` seconds; requests are admitted while the window's total cost stays within ``count``.
This is the seeds' Redis frequency control (``INCR key`` + ``EXPIRE key period`` on the first
count): "at most 5 posts per hour" is ``FixedWindow("5/h")``, "one download per 30 s" is
``FixedWindow("1/30s")``.

**Promise**: within each window ``[start, start + period)`` the admitted cost is at most
``count``. Windows are not sliding: across a window boundary up to ``2 × count`` can be admitted
within ``period`` seconds (``count`` at the end of one window, ``count`` at the start of the
next). Use :class:`~floodwall.ratelimit.SlidingLog` when that matters.

Per key: the window's end and its count; O(1) per decision. A key is fresh again when its
window has closed (its TTL is the window's end). The decision is
:class:`~floodwall.ratelimit._steps.FixedWindowStep`, the same arithmetic the store op behind
``GlobalLimiter("fixed_window")`` and :class:`~floodwall.Frequency` runs (and
``lua/ratelimit_fixed.lua`` mirrors), in whole-µs ticks: ``reset_after`` and ``retry_after``
are rounded up to the microsecond.
"""

from __future__ import annotations

from collections.abc import Iterable

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.events import EventListener
from floodwall.ratelimit._base import RateLike, RateLimiter, WindowOptions, parse_rate
from floodwall.ratelimit._steps import US, FixedWindowStep, Window, period_ticks

__all__ = ["FixedWindow"]


class FixedWindow(RateLimiter[Window], FixedWindowStep):
    """``count`` permits per window of ``period`` seconds, opened by a key's first request.

    As a gate (:class:`~floodwall.ratelimit.RateLimiter`): ``admit`` counts the call in the
    window or raises the rejection with ``retry_after`` = the window's end; ``max_wait``
    sleeps until then and asks again.
    """

    algorithm = "fixed_window"

    def __init__(
        self,
        rate: RateLike,
        *,
        name: str = "fixed_window",
        clock: Clock = SYSTEM_CLOCK,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = WindowOptions(rate, max_wait)
        """The validated :class:`~floodwall.ratelimit.WindowOptions`, read once, here."""
        self.rate = parse_rate(self.options.rate)
        self.period = self.rate.period
        self.window = self.period
        FixedWindowStep.__init__(self, self.rate.count, float(period_ticks(self.rate)), US)
        super().__init__(
            name=name, clock=clock, max_wait=self.options.max_wait, listeners=listeners
        )

    # -- the pure core: the step's --------------------------------------------------------

    _new_state = FixedWindowStep.fresh
    _check = FixedWindowStep.check
    _commit = FixedWindowStep.commit
    _decide = FixedWindowStep.decide
    _figures = FixedWindowStep.figures
    _idle_at = FixedWindowStep.idle_at
    _pack = FixedWindowStep.pack
    _unpack = FixedWindowStep.unpack

    def describe(self) -> str:
        return f"FixedWindow({self.name!r}, {self.rate})"
