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

Per key: two floats (tokens, time of the last refill); O(1) per decision. ``wait`` books ahead:
a waiter takes its tokens at once, letting the bucket go negative, and sleeps until they are
paid for, so waiters are served in arrival order (Go's ``rate.Limiter.Reserve``).

Sources: Turner (1986), "New directions in communications"; the seeds' token-bucket section.
"""

from __future__ import annotations

from collections.abc import Iterable

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.events import EventListener
from floodwall._core.validate import count as _count
from floodwall.ratelimit._base import (
    INF,
    Decision,
    RateLike,
    RateLimiter,
    _new,
    parse_rate,
)

__all__ = ["TokenBucket"]


class _Bucket:
    """Per-key state: ``tokens`` as of ``stamp`` (may be negative while waiters are booked)."""

    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class TokenBucket(RateLimiter[_Bucket]):
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
        self.rate = parse_rate(rate)
        self.burst = self.rate.count - 1 if burst is None else _count("burst", burst, 0)
        self.capacity = float(1 + self.burst)
        self.limit = 1 + self.burst
        self.window = self.capacity / self.rate.per_second
        if initial is None:
            initial = self.capacity
        self.initial = validate.number("initial", initial, 0.0, self.capacity)
        self._per_second = self.rate.per_second
        super().__init__(name=name, clock=clock, max_wait=max_wait, listeners=listeners)

    # -- the pure core ----------------------------------------------------------------------

    def _new_state(self, now: float) -> _Bucket:
        return _Bucket(self.initial, now)

    def _check(self, st: _Bucket, now: float, cost: float) -> bool:
        tokens = min(st.tokens + (now - st.stamp) * self._per_second, self.capacity)
        st.tokens = tokens
        st.stamp = now
        return tokens >= cost

    def _commit(self, st: _Bucket, now: float, cost: float) -> None:
        st.tokens -= cost

    def _decide(self, st: _Bucket, now: float, cost: float) -> bool:
        tokens = st.tokens + (now - st.stamp) * self._per_second
        if tokens > self.capacity:  # noqa: PLR1730 - cheaper than calling min() (hot path)
            tokens = self.capacity
        st.stamp = now
        if tokens >= cost:
            st.tokens = tokens - cost
            return True
        st.tokens = tokens
        return False

    def _reserve(self, st: _Bucket, now: float, cost: float, max_wait: float) -> float:
        if self._check(st, now, cost):
            st.tokens -= cost
            return 0.0
        if cost > self.capacity:
            return -1.0
        delay = (cost - st.tokens) / self._per_second
        if delay > max_wait:
            return -1.0
        st.tokens -= cost
        return delay

    def _figures(self, st: _Bucket, now: float, cost: float, allowed: bool) -> Decision:
        tokens = st.tokens
        if allowed:
            retry = 0.0
        elif cost > self.capacity:
            retry = INF
        else:
            retry = (cost - tokens) / self._per_second
        return _new(
            Decision,
            (
                allowed,
                int(tokens) if tokens > 0 else 0,
                (self.capacity - tokens) / self._per_second,
                retry,
                self.limit,
            ),
        )

    def _idle_at(self, st: _Bucket) -> float:
        return st.stamp + (self.capacity - st.tokens) / self._per_second

    def describe(self) -> str:
        return f"TokenBucket({self.name!r}, {self.rate}, burst={self.burst})"
