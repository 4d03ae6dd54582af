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
window has closed (its TTL is the window's end).
"""

from __future__ import annotations

from collections.abc import Iterable

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.events import EventListener
from floodwall.ratelimit._base import INF, Decision, RateLike, RateLimiter, _new, parse_rate

__all__ = ["FixedWindow"]


class _Window:
    """Per-key state: the total cost admitted in the window that closes at ``end``."""

    __slots__ = ("count", "end")

    def __init__(self, count: float, end: float) -> None:
        self.count = count
        self.end = end


class FixedWindow(RateLimiter[_Window]):
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
        self.rate = parse_rate(rate)
        self.limit = self.rate.count
        self.period = self.rate.period
        self.window = self.period
        super().__init__(name=name, clock=clock, max_wait=max_wait, listeners=listeners)

    # -- the pure core ----------------------------------------------------------------------

    def _new_state(self, now: float) -> _Window:
        return _Window(0, -INF)

    def _check(self, st: _Window, now: float, cost: float) -> bool:
        if now >= st.end:
            st.end = now + self.period
            st.count = 0
        return st.count + cost <= self.limit

    def _commit(self, st: _Window, now: float, cost: float) -> None:
        st.count += cost

    def _decide(self, st: _Window, now: float, cost: float) -> bool:
        # check and commit in one: about a fifth of the `floodwall try_acquire()` row of
        # benchmarks/bench_ratelimit.py (fixed window; A/B against the base _decide)
        if now >= st.end:
            st.end = now + self.period
            st.count = 0
        count = st.count + cost
        if count <= self.limit:
            st.count = count
            return True
        return False

    def _figures(self, st: _Window, now: float, cost: float, allowed: bool) -> Decision:
        left = st.end - now
        if allowed:
            retry = 0.0
        elif cost > self.limit:
            retry = INF
        else:
            retry = left
        return _new(Decision, (allowed, int(self.limit - st.count), left, retry, self.limit))

    def _idle_at(self, st: _Window) -> float:
        return st.end

    def describe(self) -> str:
        return f"FixedWindow({self.name!r}, {self.rate})"
