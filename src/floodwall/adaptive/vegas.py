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
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall._core.options import Checks, check_all, optional
from floodwall.adaptive._base import Limit, as_function, count_or_function, log10_root

__all__ = ["VegasLimit", "VegasOptions"]

IntFn = Callable[[int], int]
FloatFn = Callable[[float], float]

_function_of_limit = partial(validate.function, what="a function of the limit")


@dataclass(frozen=True, slots=True)
class VegasOptions:
    """A :class:`VegasLimit`'s options, validated once.

    ``alpha`` and ``beta`` are a count (>= 0) or a function of the limit; ``threshold``,
    ``increase`` and ``decrease`` a function of it; ``None`` takes the log10 defaults of the
    module doc. ``initial_limit`` must be at most ``max_concurrency``.
    """

    initial_limit: int = defaults.VEGAS_INITIAL_LIMIT
    max_concurrency: int = defaults.VEGAS_MAX_CONCURRENCY
    smoothing: float = defaults.VEGAS_SMOOTHING
    alpha: int | IntFn | None = None
    beta: int | IntFn | None = None
    threshold: IntFn | None = None
    increase: FloatFn | None = None
    decrease: FloatFn | None = None
    probe_multiplier: int = defaults.VEGAS_PROBE_MULTIPLIER

    CHECKS: ClassVar[Checks] = {
        "initial_limit": validate.count,
        "max_concurrency": validate.count,
        "smoothing": partial(validate.number, low=0.0, high=1.0),
        "alpha": optional(partial(count_or_function, minimum=0)),
        "beta": optional(partial(count_or_function, minimum=0)),
        "threshold": optional(_function_of_limit),
        "increase": optional(_function_of_limit),
        "decrease": optional(_function_of_limit),
        "probe_multiplier": validate.count,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.initial_limit > self.max_concurrency:
            raise ConfigError(
                f"initial_limit must be <= max_concurrency ({self.max_concurrency}), "
                f"got {self.initial_limit!r}"
            )


def _or(value: Any, default: Callable[..., Any]) -> Any:
    return default if value is None else as_function(value)


class VegasLimit(Limit):
    """Delay-based limit after TCP Vegas (the rule: [Overload protection][guide-overload]).

    ``options`` holds the validated :class:`VegasOptions`; the functions and numbers the
    update reads are taken from it once, at construction. ``rng`` draws the probe jitter."""

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
        "options",
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
        self.options = o = VegasOptions(
            initial_limit,
            max_concurrency,
            smoothing,
            alpha,
            beta,
            threshold,
            increase,
            decrease,
            probe_multiplier,
        )
        super().__init__(o.initial_limit)
        self.max_concurrency = o.max_concurrency
        self.smoothing = o.smoothing
        self._alpha: IntFn = _or(o.alpha, lambda limit: 3 * log10_root(limit))
        self._beta: IntFn = _or(o.beta, lambda limit: 6 * log10_root(limit))
        self._threshold: IntFn = o.threshold or log10_root
        self._increase: FloatFn = o.increase or (lambda limit: limit + log10_root(int(limit)))
        self._decrease: FloatFn = o.decrease or (lambda limit: limit - log10_root(int(limit)))
        self.probe_multiplier = o.probe_multiplier
        self._rng = rng or random.Random()
        self.estimated_limit = float(o.initial_limit)
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
