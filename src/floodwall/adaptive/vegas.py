"""Vegas: estimate the queue from the no-load RTT and keep it between alpha and beta.

TCP Vegas applied to concurrency (concurrency-limits' ``VegasLimit``). With ``rtt_noload`` the
smallest RTT seen (re-probed every ``probe_multiplier × limit`` samples, jittered by [0.5, 1)):

    queue = ceil(limit × (1 − rtt_noload / rtt))
    drop                        → limit = decrease(limit)
    inflight × 2 < limit        → unchanged (the app is not using the limit)
    queue <= threshold(limit)   → limit + beta(limit)     (no queueing: grow fast)
    queue <  alpha(limit)       → increase(limit)
    queue >  beta(limit)        → decrease(limit)
    otherwise                   → unchanged
    limit = clamp(1, max_concurrency); limit = (1 − smoothing) × old + smoothing × new

Defaults: ``alpha = 3·log10(limit)``, ``beta = 6·log10(limit)``, ``threshold = log10(limit)``,
``increase = limit + log10(limit)``, ``decrease = limit − log10(limit)`` (log10 taken as
``max(1, int(log10))``), ``initial_limit=20``, ``max_concurrency=1000``, ``smoothing=1.0``,
``probe_multiplier=30``. Golden traces (``VegasLimitTest``): with alpha 3, beta 6, limit 10, a
10 ms sample sets the no-load RTT, a second 10 ms sample gives 16, a 50 ms one gives 9; from
10000 with the defaults a queue-free sample gives 10024.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall.adaptive._base import Limit, check_float, check_int, log10_root

__all__ = ["VegasLimit"]

IntFn = Callable[[int], int]
FloatFn = Callable[[float], float]


def _as_fn(name: str, value: int | IntFn | None, default: IntFn) -> IntFn:
    if value is None:
        return default
    if callable(value):
        return value
    fixed = check_int(name, value, 0)
    return lambda _limit: fixed


def _fn(name: str, value: Callable[..., Any] | None, default: Callable[..., Any]) -> Any:
    if value is None:
        return default
    return validate.function(name, value, what="a function of the limit")


class VegasLimit(Limit):
    """Delay-based limit after TCP Vegas (the rule: [Overload protection][guide-overload])."""

    __slots__ = (
        "_alpha",
        "_beta",
        "_decrease",
        "_increase",
        "_probe_count",
        "_probe_jitter",
        "_rng",
        "_threshold",
        "estimated_limit",
        "max_concurrency",
        "probe_multiplier",
        "rtt_noload",
        "smoothing",
    )

    def __init__(
        self,
        *,
        initial_limit: int = defaults.VEGAS_INITIAL_LIMIT,
        max_concurrency: int = defaults.VEGAS_MAX_CONCURRENCY,
        smoothing: float = defaults.VEGAS_SMOOTHING,
        alpha: int | IntFn | None = None,
        beta: int | IntFn | None = None,
        threshold: IntFn | None = None,
        increase: FloatFn | None = None,
        decrease: FloatFn | None = None,
        probe_multiplier: int = defaults.VEGAS_PROBE_MULTIPLIER,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(initial_limit)
        self.max_concurrency = check_int("max_concurrency", max_concurrency)
        if initial_limit > max_concurrency:
            raise ConfigError(
                f"initial_limit must be <= max_concurrency ({max_concurrency}), "
                f"got {initial_limit!r}"
            )
        self.smoothing = check_float("smoothing", smoothing, 0.0, 1.0, open_high=False)
        self._alpha = _as_fn("alpha", alpha, lambda limit: 3 * log10_root(limit))
        self._beta = _as_fn("beta", beta, lambda limit: 6 * log10_root(limit))
        self._threshold = _fn("threshold", threshold, log10_root)
        self._increase: FloatFn = _fn(
            "increase", increase, lambda limit: limit + log10_root(int(limit))
        )
        self._decrease: FloatFn = _fn(
            "decrease", decrease, lambda limit: limit - log10_root(int(limit))
        )
        self.probe_multiplier = check_int("probe_multiplier", probe_multiplier)
        self._rng = rng or random.Random()
        self.estimated_limit = float(initial_limit)
        self.rtt_noload = 0.0
        self._probe_count = 0
        self._probe_jitter = self._rng.uniform(0.5, 1.0)

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        if not rtt > 0:
            raise ValueError(f"rtt must be > 0, got {rtt!r}")
        self._probe_count += 1
        if self._probe_jitter * self.probe_multiplier * self.estimated_limit <= self._probe_count:
            self._probe_jitter = self._rng.uniform(0.5, 1.0)
            self._probe_count = 0
            self.rtt_noload = rtt
            return int(self.estimated_limit)
        if self.rtt_noload == 0.0 or rtt < self.rtt_noload:
            self.rtt_noload = rtt
            return int(self.estimated_limit)
        return self._estimate(rtt, inflight, dropped)

    def _estimate(self, rtt: float, inflight: int, dropped: bool) -> int:
        estimated = self.estimated_limit
        current = int(estimated)
        queue = math.ceil(estimated * (1 - self.rtt_noload / rtt))
        if dropped:
            new = self._decrease(estimated)
        elif inflight * 2 < estimated:
            return current
        elif queue <= self._threshold(current):
            new = estimated + self._beta(current)
        elif queue < self._alpha(current):
            new = self._increase(estimated)
        elif queue > self._beta(current):
            new = self._decrease(estimated)
        else:
            return current
        new = max(1.0, min(float(self.max_concurrency), new))
        self.estimated_limit = (1 - self.smoothing) * estimated + self.smoothing * new
        return max(1, int(self.estimated_limit))
