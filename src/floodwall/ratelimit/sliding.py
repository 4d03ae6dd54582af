"""Sliding windows: the exact log and the weighted two-window counter.

:class:`SlidingLog` remembers when each of the last ``count`` permits was granted and admits a
request when granting it keeps every window of ``period`` seconds at or under ``count``.
**Promise** (exact): in every half-open interval ``[t, t + period)`` the admitted cost is at most
``count``, whatever the traffic; no boundary burst. Cost: O(``count``) memory per key (one
8-byte timestamp per permit, kept in a ring), O(cost) per decision.

:class:`SlidingWindowCounter` keeps two counts per key, for the current and the previous window
of a grid of ``period``-second windows (aligned to multiples of ``period`` on the clock), and
estimates the sliding count by assuming the previous window's requests were spread evenly
(Cloudflare's rate limiter)::

    estimate = previous × (period - elapsed) / period + current      elapsed = now - window start

and admits a request of cost ``c`` when ``estimate + c <= count`` (evaluated as
``previous × (end - now) + (current + c) × period <= count × period``, free of division). The
decision is :class:`~floodwall.ratelimit._steps.SlidingCounterStep`, the arithmetic the store op
behind ``GlobalLimiter("sliding_window_counter")`` runs (``lua/ratelimit_sliding.lua`` mirrors
it), in whole-µs ticks: ``reset_after`` and ``retry_after`` are rounded up to the microsecond.
**Promise**: at most ``count`` per grid window (the estimate is at least ``current``), and
exactly the estimate above; over an arbitrary ``period``-long interval it is an approximation,
exact for evenly spread traffic and at worst admitting just under ``2 × count`` (the previous
window's permits all bunched at its end). O(1) memory and time per key.

Sources: the seeds' sliding-window section; Cloudflare, "How we built rate limiting capable of
scaling to millions of domains" (2017).
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.events import EventListener
from floodwall.ratelimit._base import (
    INF,
    Decision,
    RateLike,
    RateLimiter,
    WindowOptions,
    _new,
    parse_rate,
)
from floodwall.ratelimit._steps import US, Counts, SlidingCounterStep, period_ticks

__all__ = ["SlidingLog", "SlidingWindowCounter"]


# -- the exact log ----------------------------------------------------------------------------


class _Log:
    """Per-key state: grant times of the last permits, oldest at ``head`` (a ring once full)."""

    __slots__ = ("head", "times")

    def __init__(self) -> None:
        self.times = array("d")
        self.head = 0


class SlidingLog(RateLimiter[_Log]):
    """Exact sliding window: never more than ``count`` in any ``period`` (see
    [Rate limiting][guide-rate-limiting]).

    As a gate (:class:`~floodwall.ratelimit.RateLimiter`): ``admit`` logs the call or raises
    the rejection; ``max_wait`` sleeps ``retry_after`` and asks again.
    """

    algorithm = "sliding_log"

    def __init__(
        self,
        rate: RateLike,
        *,
        name: str = "sliding_log",
        clock: Clock = SYSTEM_CLOCK,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = WindowOptions(rate, max_wait)
        """The validated :class:`~floodwall.ratelimit.WindowOptions`, read once, here."""
        self.rate = parse_rate(self.options.rate)
        self.limit = self.rate.count
        self.period = self.rate.period
        self.window = self.period
        super().__init__(
            name=name, clock=clock, max_wait=self.options.max_wait, listeners=listeners
        )

    def _oldest(self, st: _Log, index: int) -> float:
        """The ``index``-th oldest remembered grant (0 = oldest)."""
        times = st.times
        return times[(st.head + index) % len(times)]

    # -- the pure core ----------------------------------------------------------------------

    def _new_state(self, now: float) -> _Log:
        return _Log()

    def _check(self, st: _Log, now: float, cost: float) -> bool:
        # Granting ``cost`` more needs the ``must_leave`` oldest grants out of the window.
        must_leave = len(st.times) + int(cost) - self.limit
        if must_leave <= 0:
            return True
        if cost > self.limit:
            return False
        return self._oldest(st, must_leave - 1) + self.period <= now

    def _commit(self, st: _Log, now: float, cost: float) -> None:
        times = st.times
        for _ in range(int(cost)):
            if len(times) < self.limit:
                times.append(now)
            else:
                times[st.head] = now
                st.head = (st.head + 1) % self.limit

    def _decide(self, st: _Log, now: float, cost: float) -> bool:
        times = st.times
        if len(times) == self.limit and cost == 1:
            head = st.head
            if times[head] + self.period > now:
                return False
            times[head] = now
            st.head = head + 1 if head + 1 < self.limit else 0
            return True
        if self._check(st, now, cost):
            self._commit(st, now, cost)
            return True
        return False

    def _in_window(self, st: _Log, now: float) -> int:
        """How many remembered grants are still inside the window at ``now``."""
        times, head, cut = st.times, st.head, now - self.period
        n = len(times)
        gone = bisect.bisect_right(times, cut, head, n) - head
        if gone == n - head:
            gone += bisect.bisect_right(times, cut, 0, head)
        return n - gone

    def _figures(self, st: _Log, now: float, cost: float, allowed: bool) -> Decision:
        held = self._in_window(st, now)
        n = len(st.times)
        reset = self._oldest(st, n - 1) + self.period - now if held else 0.0
        if allowed:
            retry = 0.0
        elif cost > self.limit:
            retry = INF
        else:
            # the same grant _check looked at must leave the window first
            retry = self._oldest(st, n + int(cost) - self.limit - 1) + self.period - now
        return _new(
            Decision, (allowed, self.limit - held, max(reset, 0.0), max(retry, 0.0), self.limit)
        )

    def _idle_at(self, st: _Log) -> float:
        if not st.times:
            return -INF
        return self._oldest(st, len(st.times) - 1) + self.period

    def describe(self) -> str:
        return f"SlidingLog({self.name!r}, {self.rate})"


# -- the weighted counter ---------------------------------------------------------------------


class SlidingWindowCounter(RateLimiter[Counts], SlidingCounterStep):
    """The weighted two-window estimate of a sliding window (see
    [Rate limiting][guide-rate-limiting]).

    As a gate (:class:`~floodwall.ratelimit.RateLimiter`): ``admit`` counts the call in the
    current window or raises the rejection; ``max_wait`` sleeps ``retry_after``, asks again.
    """

    algorithm = "sliding_window_counter"

    def __init__(
        self,
        rate: RateLike,
        *,
        name: str = "sliding_window_counter",
        clock: Clock = SYSTEM_CLOCK,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = WindowOptions(rate, max_wait)
        """The validated :class:`~floodwall.ratelimit.WindowOptions`, read once, here."""
        self.rate = parse_rate(self.options.rate)
        self.period = self.rate.period
        self.window = self.period
        SlidingCounterStep.__init__(self, self.rate.count, float(period_ticks(self.rate)), US)
        super().__init__(
            name=name, clock=clock, max_wait=self.options.max_wait, listeners=listeners
        )

    def estimate(self, st: Counts, now: float) -> float:
        """The weighted sliding count of ``st`` at ``now`` (``st`` already at ``now``)."""
        return st.prev * (st.end - now * self.us_per_now) / self.period_us + st.cur

    # -- the pure core: the step's --------------------------------------------------------

    _new_state = SlidingCounterStep.fresh
    _check = SlidingCounterStep.check
    _commit = SlidingCounterStep.commit
    _decide = SlidingCounterStep.decide
    _figures = SlidingCounterStep.figures
    _idle_at = SlidingCounterStep.idle_at
    _pack = SlidingCounterStep.pack
    _unpack = SlidingCounterStep.unpack

    def describe(self) -> str:
        return f"SlidingWindowCounter({self.name!r}, {self.rate})"
