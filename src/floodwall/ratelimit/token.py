"""Token bucket: a steady rate with room for bursts.

A bucket holds up to ``capacity = 1 + burst`` tokens and refills continuously at ``rate`` tokens
per second; a request of cost ``c`` is admitted when the bucket holds at least ``c`` tokens, and
takes them. ``burst`` is the permits allowed beyond the steady flow of one at a time: by default
``rate.count - 1``, so ``TokenBucket("10/s")`` admits 10 at once, then 10 per second.
``initial`` tokens (default: a full bucket) is where a new key starts.

**Promise** (exact, float arithmetic aside): over any interval of ``t`` seconds the admitted cost
is at most ``capacity + rate × t`` (``initial + rate × t`` from a fresh start); in the long run
the admitted rate is at most ``rate``. Nothing is admitted that the bucket could not pay for at
the moment of the decision: refills are applied, and capped, at every decision (a bucket that
refills only when it runs dry, as some limiters do, admits ``2 × capacity`` after an idle spell).

Per key: two numbers (tokens, time of the last refill); O(1) per decision. The decision is
:class:`~floodwall.ratelimit._steps.TokenBucketStep` (tokens counted in units of ``1 / period``
µs of a token, time in whole-µs ticks), the arithmetic the store op behind
``GlobalLimiter("token_bucket")`` runs and ``lua/ratelimit_token.lua`` mirrors; ``reset_after``
and ``retry_after`` are rounded up to the microsecond. ``wait`` books ahead:
a waiter takes its tokens at once, letting the bucket go negative, and sleeps until they are
paid for, so waiters are served in arrival order (Go's ``rate.Limiter.Reserve``).

Sources: Turner (1986), "New directions in communications"; the seeds' token-bucket section.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import EventListener
from floodwall._core.options import Checks, check_all, optional
from floodwall.ratelimit._base import (
    Rate,
    RateLike,
    RateLimiter,
    max_wait_field,
    parse_rate,
    rate_field,
)
from floodwall.ratelimit._steps import US, Bucket, TokenBucketStep, period_ticks

__all__ = ["TokenBucket", "TokenBucketOptions"]


@dataclass(frozen=True, slots=True)
class TokenBucketOptions:
    """A :class:`TokenBucket`'s options, validated once: ``rate`` (kept as a
    :class:`~floodwall.ratelimit.Rate`), ``burst`` (permits beyond the steady flow, >= 0;
    ``None``: ``rate.count - 1``), ``initial`` (tokens a new key starts with, in ``[0, 1 +
    burst]``; ``None``: a full bucket) and ``max_wait`` (seconds a call may wait as a policy)."""

    rate: RateLike
    burst: int | None = None
    initial: float | None = None
    max_wait: float = defaults.RATE_LIMIT_MAX_WAIT

    CHECKS: ClassVar[Checks] = {
        "rate": rate_field,
        "burst": optional(partial(validate.count, minimum=0)),
        "initial": optional(partial(validate.number, low=0.0)),
        "max_wait": max_wait_field,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        capacity = 1 + self.resolved_burst
        if self.initial is not None and self.initial > capacity:
            raise ConfigError(
                f"initial must be a number in [0, {capacity:g}] (the capacity, 1 + burst), "
                f"got {self.initial!r}"
            )

    @property
    def resolved_burst(self) -> int:
        """``burst``, or its default ``rate.count - 1``."""
        rate = self.rate
        assert isinstance(rate, Rate)  # normalised by its check
        return rate.count - 1 if self.burst is None else self.burst


class TokenBucket(RateLimiter[Bucket], TokenBucketStep):
    """Token bucket of ``capacity = 1 + burst`` tokens refilled at ``rate`` (see
    [Rate limiting][guide-rate-limiting]).

    As a gate (:class:`~floodwall.ratelimit.RateLimiter`): ``admit`` takes a token or raises the
    rejection; ``max_wait`` reserves the token, then sleeps until it has refilled.
    """

    algorithm = "token_bucket"
    books_ahead = True

    def __init__(
        self,
        rate: RateLike,
        *,
        burst: int | None = None,
        initial: float | None = None,
        name: str = "token_bucket",
        clock: Clock = SYSTEM_CLOCK,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = TokenBucketOptions(rate, burst, initial, max_wait)
        """The validated :class:`TokenBucketOptions`, read once, here."""
        self.rate = parse_rate(o.rate)
        self.burst = o.resolved_burst
        self.capacity = float(1 + self.burst)
        self.limit = 1 + self.burst
        self.window = self.capacity / self.rate.per_second
        self.initial = self.capacity if o.initial is None else o.initial
        # floats: the clock's ticks are floats, and a float meets a large int the slow way
        unit = float(period_ticks(self.rate))  # units per token: one per tick of the period
        TokenBucketStep.__init__(
            self, self.limit * unit, unit, float(self.rate.count), self.initial * unit, US
        )
        super().__init__(name=name, clock=clock, max_wait=o.max_wait, listeners=listeners)

    # -- the pure core: the step's --------------------------------------------------------

    _new_state = TokenBucketStep.fresh
    _check = TokenBucketStep.check
    _commit = TokenBucketStep.commit
    _decide = TokenBucketStep.decide
    _reserve = TokenBucketStep.reserve
    _figures = TokenBucketStep.figures
    _idle_at = TokenBucketStep.idle_at
    _pack = TokenBucketStep.pack
    _unpack = TokenBucketStep.unpack

    def describe(self) -> str:
        return f"TokenBucket({self.name!r}, {self.rate}, burst={self.burst})"
