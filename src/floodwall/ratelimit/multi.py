"""Several rates at once on one key: ``Multi(TokenBucket("10/s"), SlidingLog("1000/h"))``.

A request is admitted only when *every* limiter admits it, and then it is counted by every
limiter; a request refused by one is counted by none (all are checked before any is charged,
under one lock). The decision's figures are the tightest: ``remaining`` is the smallest,
``retry_after`` and ``reset_after`` the longest, ``limit`` that of the limiter with the least
remaining.

**Promise**: each member's own promise holds for the admitted traffic (the admitted requests are
a subset of what each member alone would admit, and each member is charged exactly for them).

The members supply their algorithms only: their own clocks, locks and states are not used (the
``Multi`` has its own), so build them just for it. ``wait`` retries after the combined
``retry_after`` (members' reservations are not used, as booking one member ahead while another
refuses would charge it for nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from floodwall._core import defaults
from floodwall._core.clock import Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import EventListener
from floodwall.ratelimit._base import Decision, RateLike, RateLimiter, _new

__all__ = ["Multi"]

_States = tuple[Any, ...]


class Multi(RateLimiter[_States]):
    """All of ``limiters`` at once, on one key (see [Rate limiting][guide-rate-limiting]).

    As a gate (:class:`~floodwall.ratelimit.RateLimiter`): ``admit`` charges every member or
    none and raises the tightest rejection; ``max_wait`` retries after its ``retry_after``.
    """

    algorithm = "multi"

    def __init__(
        self,
        *limiters: RateLimiter[Any],
        name: str = "multi",
        clock: Clock | None = None,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        if not limiters:
            raise ConfigError("Multi needs at least one limiter, got none")
        for index, limiter in enumerate(limiters):
            if not isinstance(limiter, RateLimiter):
                raise ConfigError(f"limiters[{index}] must be a RateLimiter, got {limiter!r}")
        self.limiters: tuple[RateLimiter[Any], ...] = limiters
        self.limit = min(limiter.limit for limiter in limiters)
        windows = [limiter.window for limiter in limiters if limiter.window is not None]
        self.window = max(windows) if windows else None
        super().__init__(
            name=name,
            clock=limiters[0].clock if clock is None else clock,
            max_wait=max_wait,
            listeners=listeners,
        )

    @classmethod
    def of(
        cls,
        *rates: RateLike,
        algorithm: type[RateLimiter[Any]] | None = None,
        name: str = "multi",
        clock: Clock | None = None,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
    ) -> Multi:
        """``Multi.of("10/s", "1000/h")``: one limiter per rate, of class ``algorithm``
        (default :class:`~floodwall.ratelimit.SlidingWindowCounter`), on ``clock``."""
        from floodwall._core.clock import SYSTEM_CLOCK
        from floodwall.ratelimit.sliding import SlidingWindowCounter  # a cycle at import time

        kind: Any = SlidingWindowCounter if algorithm is None else algorithm
        tick = SYSTEM_CLOCK if clock is None else clock
        members = [kind(rate, name=f"{name}[{rate}]", clock=tick) for rate in rates]
        return cls(*members, name=name, clock=tick, max_wait=max_wait)

    # -- the pure core ----------------------------------------------------------------------

    def _new_state(self, now: float) -> _States:
        return tuple(limiter._new_state(now) for limiter in self.limiters)

    def _check(self, st: _States, now: float, cost: float) -> bool:
        ok = True
        for limiter, sub in zip(self.limiters, st, strict=True):
            ok = limiter._check(sub, now, cost) and ok  # bring every member to ``now``
        return ok

    def _commit(self, st: _States, now: float, cost: float) -> None:
        for limiter, sub in zip(self.limiters, st, strict=True):
            limiter._commit(sub, now, cost)

    def _figures(self, st: _States, now: float, cost: float, allowed: bool) -> Decision:
        parts = [
            limiter._figures(sub, now, cost, allowed or limiter._check(sub, now, cost))
            for limiter, sub in zip(self.limiters, st, strict=True)
        ]
        tightest = min(parts, key=lambda part: part[1])
        return _new(
            Decision,
            (
                allowed,
                tightest[1],
                max(part[2] for part in parts),
                0.0 if allowed else max(part[3] for part in parts),
                tightest[4],
            ),
        )

    def _idle_at(self, st: _States) -> float:
        return max(limiter._idle_at(sub) for limiter, sub in zip(self.limiters, st, strict=True))

    def _pack(self, st: _States) -> tuple[Any, ...]:
        # each member's packed state is one value (bytes or a number): the tuple of them is
        # untracked by the first collection that meets it
        return tuple([limiter._pack(sub) for limiter, sub in zip(self.limiters, st, strict=True)])

    def _unpack(self, packed: tuple[Any, ...]) -> _States:
        pairs = zip(self.limiters, packed, strict=True)
        return tuple([limiter._unpack(sub) for limiter, sub in pairs])

    def describe(self) -> str:
        inner = ", ".join(limiter.describe() for limiter in self.limiters)
        return f"Multi({self.name!r}: {inner})"
