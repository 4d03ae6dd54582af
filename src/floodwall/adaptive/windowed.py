"""Windowed: feed a limit one aggregate per sampling window instead of every request.

concurrency-limits' ``WindowedLimit``. Samples faster than ``min_rtt_threshold`` (100 µs) are
discarded; the rest collect in a window that closes when a request *ends* after the window's
deadline. The next deadline is ``end + clamp(2 × min_rtt, min_window_time, max_window_time)``
(1 s each by default). A closed window with at least ``window_size`` (10) samples is passed on
as one sample: its average RTT (or the ``percentile`` RTT), its largest in-flight count and
whether any request dropped.

This is what makes delay-based limits usable on noisy services: Gradient2 then sees one
smoothed RTT per second, and its long window of 600 samples spans ten minutes.
"""

from __future__ import annotations

import math

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall.adaptive._base import Limit, check_int, check_positive

__all__ = ["WindowedLimit"]


class _SampleWindow:
    """The samples of one window: count, RTT sum, min RTT, max in-flight, any drop."""

    __slots__ = ("count", "dropped", "max_inflight", "min_rtt", "rtts", "total")

    def __init__(self, keep: bool) -> None:
        self.count = 0
        self.total = 0.0
        self.min_rtt = math.inf
        self.max_inflight = 0
        self.dropped = False
        self.rtts: list[float] | None = [] if keep else None

    def add(self, rtt: float, inflight: int, dropped: bool) -> None:
        self.count += 1
        self.total += rtt
        self.min_rtt = min(self.min_rtt, rtt)
        self.max_inflight = max(self.max_inflight, inflight)
        if dropped:
            self.dropped = True
        if self.rtts is not None:
            self.rtts.append(rtt)

    def tracked_rtt(self, percentile: float | None) -> float:
        if percentile is None or self.rtts is None:
            return self.total / self.count
        ordered = sorted(self.rtts)
        # ImmutablePercentileSampleWindow: the round(n × p)-th smallest (1-based).
        index = max(1, round(len(ordered) * percentile)) - 1
        return ordered[index]


class WindowedLimit(Limit):
    """Aggregate samples per window before they reach ``delegate`` (see
    [Overload protection][guide-overload]).

    ``percentile=None`` feeds the window's average RTT (the default); a value in (0, 1] feeds
    that percentile instead.
    """

    __slots__ = (
        "_next_update",
        "_window",
        "delegate",
        "max_window_time",
        "min_rtt_threshold",
        "min_window_time",
        "percentile",
        "window_size",
    )

    def __init__(
        self,
        delegate: Limit,
        *,
        min_window_time: float = defaults.WINDOW_MIN_TIME,
        max_window_time: float = defaults.WINDOW_MAX_TIME,
        window_size: int = defaults.WINDOW_SIZE,
        min_rtt_threshold: float = defaults.WINDOW_MIN_RTT_THRESHOLD,
        percentile: float | None = None,
    ) -> None:
        if not isinstance(delegate, Limit):
            raise ConfigError(f"delegate must be a floodwall Limit, got {delegate!r}")
        super().__init__(delegate.limit)
        self.delegate = delegate
        self.min_window_time = check_positive("min_window_time", min_window_time)
        self.max_window_time = check_positive("max_window_time", max_window_time)
        if self.max_window_time < self.min_window_time:
            raise ConfigError(
                f"max_window_time must be >= min_window_time ({min_window_time}), "
                f"got {max_window_time!r}"
            )
        self.window_size = check_int("window_size", window_size)
        self.min_rtt_threshold = validate.seconds("min_rtt_threshold", min_rtt_threshold)
        if percentile is not None:
            validate.number("percentile", percentile, 0.0, 1.0, low_open=True)
        self.percentile = percentile
        self._window = _SampleWindow(percentile is not None)
        self._next_update = -math.inf

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        if rtt < self.min_rtt_threshold:
            return self._limit
        window = self._window
        window.add(rtt, inflight, dropped)
        end = start + rtt
        if end <= self._next_update:
            return self._limit
        self._window = _SampleWindow(self.percentile is not None)
        span = min(max(window.min_rtt * 2, self.min_window_time), self.max_window_time)
        self._next_update = end + span
        if window.count < self.window_size:
            return self._limit
        return self.delegate.on_sample(
            start, window.tracked_rtt(self.percentile), window.max_inflight, window.dropped
        )

    def __repr__(self) -> str:
        return f"WindowedLimit({self.delegate!r})"
