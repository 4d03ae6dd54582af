"""Gradient: shrink the limit as the RTT grows past a tolerance of the no-load RTT.

concurrency-limits' ``GradientLimit``. With ``rtt_noload`` the minimum RTT since the last probe
and ``queue = queue_size(limit)`` (default ``max(4, sqrt(limit))``):

    gradient = clamp(rtt_tolerance × rtt_noload / rtt, 0.5, 1.0)
    drop                  → new = limit × backoff_ratio
    inflight < limit / 2  → unchanged (app-limited)
    otherwise             → new = limit × gradient + queue
    new < limit           → new = max(min_limit, (1 − smoothing) × limit + smoothing × new)
    limit = clamp(new, queue, max_concurrency)

Every ``probe_interval`` + U[0, probe_interval) samples the limit drops to
``max(min_limit, queue)`` and the no-load RTT is re-measured, so a stale minimum cannot pin it.
Defaults: ``initial_limit=50``, ``min_limit=1``, ``max_concurrency=1000``, ``smoothing=0.2``,
``rtt_tolerance=2.0``, ``probe_interval=1000`` (``None`` disables), ``backoff_ratio=0.9``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall._core.options import Checks, check_all, optional
from floodwall.adaptive._base import (
    Limit,
    MinimumMeasurement,
    as_function,
    count_or_function,
    square_root,
)

__all__ = ["GradientLimit", "GradientOptions"]


def _default_queue(limit: int) -> int:
    return max(4, square_root(limit))


@dataclass(frozen=True, slots=True)
class GradientOptions:
    """A :class:`GradientLimit`'s options, validated once.

    ``queue_size`` is a count (>= 1) or a function of the limit (``None``: ``max(4,
    sqrt(limit))``); ``probe_interval=None`` disables probing; ``max_concurrency`` must be at
    least ``min_limit``.
    """

    initial_limit: int = defaults.GRADIENT_INITIAL_LIMIT
    min_limit: int = defaults.GRADIENT_MIN_LIMIT
    max_concurrency: int = defaults.GRADIENT_MAX_CONCURRENCY
    smoothing: float = defaults.GRADIENT_SMOOTHING
    queue_size: int | Callable[[int], int] | None = None
    rtt_tolerance: float = defaults.GRADIENT_RTT_TOLERANCE
    probe_interval: int | None = defaults.GRADIENT_PROBE_INTERVAL
    backoff_ratio: float = defaults.GRADIENT_BACKOFF_RATIO

    CHECKS: ClassVar[Checks] = {
        "initial_limit": validate.count,
        "min_limit": validate.count,
        "max_concurrency": validate.count,
        "smoothing": partial(validate.number, low=0.0, high=1.0),
        "queue_size": optional(count_or_function),
        "rtt_tolerance": partial(validate.number, low=1.0),
        "probe_interval": optional(validate.count),
        "backoff_ratio": partial(validate.number, low=0.5, high=1.0),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.max_concurrency < self.min_limit:
            raise ConfigError(
                f"max_concurrency must be >= min_limit ({self.min_limit}), "
                f"got {self.max_concurrency!r}"
            )


class GradientLimit(Limit):
    """Gradient of the no-load RTT over the sampled RTT (see
    [Overload protection][guide-overload]).

    ``options`` holds the validated :class:`GradientOptions`, copied once, at construction,
    into the fields the update reads. ``rng`` draws the probe jitter."""

    __slots__ = (
        "_countdown",
        "_queue_size",
        "_rng",
        "_rtt_noload",
        "backoff_ratio",
        "estimated_limit",
        "max_concurrency",
        "min_limit",
        "options",
        "probe_interval",
        "rtt_tolerance",
        "smoothing",
    )

    def __init__(
        self,
        *,
        initial_limit: int = defaults.GRADIENT_INITIAL_LIMIT,
        min_limit: int = defaults.GRADIENT_MIN_LIMIT,
        max_concurrency: int = defaults.GRADIENT_MAX_CONCURRENCY,
        smoothing: float = defaults.GRADIENT_SMOOTHING,
        queue_size: int | Callable[[int], int] | None = None,
        rtt_tolerance: float = defaults.GRADIENT_RTT_TOLERANCE,
        probe_interval: int | None = defaults.GRADIENT_PROBE_INTERVAL,
        backoff_ratio: float = defaults.GRADIENT_BACKOFF_RATIO,
        rng: random.Random | None = None,
    ) -> None:
        self.options = o = GradientOptions(
            initial_limit,
            min_limit,
            max_concurrency,
            smoothing,
            queue_size,
            rtt_tolerance,
            probe_interval,
            backoff_ratio,
        )
        super().__init__(o.initial_limit)
        self.min_limit = o.min_limit
        self.max_concurrency = o.max_concurrency
        self.smoothing = o.smoothing
        self._queue_size = _default_queue if o.queue_size is None else as_function(o.queue_size)
        self.rtt_tolerance = o.rtt_tolerance
        self.probe_interval = o.probe_interval
        self.backoff_ratio = o.backoff_ratio
        self._rng = rng or random.Random()
        self._rtt_noload = MinimumMeasurement()
        self.estimated_limit = float(o.initial_limit)
        self._countdown = self._next_probe()

    @property
    def rtt_noload(self) -> float:
        """The minimum RTT since the last probe (seconds; 0.0 before any sample)."""
        return self._rtt_noload.value

    def _next_probe(self) -> int:
        if self.probe_interval is None:
            return -1
        return self.probe_interval + self._rng.randrange(self.probe_interval)

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        estimated = self.estimated_limit
        queue = float(self._queue_size(int(estimated)))
        if self.probe_interval is not None:
            self._countdown -= 1
            if self._countdown < 0:
                self._countdown = self._next_probe()
                self.estimated_limit = max(float(self.min_limit), queue)
                self._rtt_noload.reset()
                return int(self.estimated_limit)
        rtt_noload = self._rtt_noload.add(rtt)
        gradient = max(0.5, min(1.0, self.rtt_tolerance * rtt_noload / rtt))
        if dropped:
            new = estimated * self.backoff_ratio
        elif inflight < estimated / 2:
            return int(estimated)
        else:
            new = estimated * gradient + queue
        if new < estimated:
            new = max(self.min_limit, estimated * (1 - self.smoothing) + self.smoothing * new)
        self.estimated_limit = max(queue, min(float(self.max_concurrency), new))
        return max(1, int(self.estimated_limit))
