"""Leaky bucket as a pacing queue: a steady output rate behind a bounded queue.

Requests pour in at any rate and leave one at a time, ``interval = period / count`` seconds
apart (``cost × interval`` for a request of cost ``cost``), in arrival order. A request that
finds ``queue`` requests already waiting is turned away: the queue is full. The state is one
number per key, the time the queue is next free to let a request out.

* :meth:`~floodwall.ratelimit.RateLimiter.wait` / ``wait_async`` (and, as a policy, ``call`` /
  ``call_async``: a leaky bucket paces by default, ``max_wait=inf``) join the queue and sleep
  until their departure slot; they are refused at once when the queue is full or the slot is
  further away than ``max_wait`` or the ambient deadline.
* ``acquire`` / ``try_acquire`` never queue: they admit a request only if it can leave now.

**Promise**: departures of requests ``i`` before ``j`` are at least ``cost_i × interval`` apart,
so the output never exceeds the rate (over any ``t`` seconds: at most ``1 + t / interval``);
at most ``queue`` requests wait at any time, none longer than ``queue × interval`` (plus its own
slot's share of a multi-cost request ahead of it). The price of the smooth output is latency:
bursts that the service could absorb wait in the queue anyway (use a token bucket to let them
through).

A waiter cancelled while it sleeps keeps its slot (the output rate stays exact; the slot goes
unused).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from floodwall._core import validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.events import EventListener
from floodwall._core.options import Checks, check_all, optional
from floodwall.ratelimit._base import (
    INF,
    Decision,
    RateLike,
    RateLimiter,
    _new,
    max_wait_field,
    parse_rate,
    rate_field,
)

__all__ = ["LeakyBucket", "LeakyBucketOptions"]

_SLACK = 1e-9
"""Relative slack on the queue bound and on ``max_wait``, so float sums of intervals do not
refuse the last slot."""


@dataclass(frozen=True, slots=True)
class LeakyBucketOptions:
    """A :class:`LeakyBucket`'s options, validated once: ``rate`` (kept as a
    :class:`~floodwall.ratelimit.Rate`), ``queue`` (requests waiting at most, >= 0; ``None``:
    ``rate.count``) and ``max_wait`` (seconds a call may wait; default ``inf``: it paces)."""

    rate: RateLike
    queue: int | None = None
    max_wait: float = INF

    CHECKS: ClassVar[Checks] = {
        "rate": rate_field,
        "queue": optional(partial(validate.count, minimum=0)),
        "max_wait": max_wait_field,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


class _Queue:
    """Per-key state: when the next request may leave."""

    __slots__ = ("free",)

    def __init__(self, free: float) -> None:
        self.free = free


class LeakyBucket(RateLimiter[_Queue]):
    """Pacing queue: one request per ``interval``, at most ``queue`` waiting (see
    [Rate limiting][guide-rate-limiting]).

    ``queue`` defaults to ``rate.count`` (one period's worth of waiting at most).

    As a gate (:class:`~floodwall.ratelimit.RateLimiter`): ``admit`` books a place in the queue
    and raises ``Wait`` for the ``Sleep`` to its slot (it paces by default), or raises the
    rejection when the queue is full or the slot is beyond ``max_wait``.
    """

    algorithm = "leaky_bucket"
    books_ahead = True

    def __init__(
        self,
        rate: RateLike,
        *,
        queue: int | None = None,
        name: str = "leaky_bucket",
        clock: Clock = SYSTEM_CLOCK,
        max_wait: float = INF,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = LeakyBucketOptions(rate, queue, max_wait)
        """The validated :class:`LeakyBucketOptions`, read once, here."""
        self.rate = parse_rate(o.rate)
        self.queue = self.rate.count if o.queue is None else o.queue
        self.interval = self.rate.interval
        self.limit = self.queue + 1
        self.window = self.rate.period
        self._max_delay = self.queue * self.interval * (1 + _SLACK)
        super().__init__(name=name, clock=clock, max_wait=o.max_wait, listeners=listeners)

    # -- the pure core ----------------------------------------------------------------------

    def _new_state(self, now: float) -> _Queue:
        return _Queue(-INF)

    def _check(self, st: _Queue, now: float, cost: float) -> bool:
        return st.free <= now

    def _commit(self, st: _Queue, now: float, cost: float) -> None:
        st.free = max(st.free, now) + cost * self.interval

    def _decide(self, st: _Queue, now: float, cost: float) -> bool:
        if st.free <= now:
            st.free = now + cost * self.interval
            return True
        return False

    def _reserve(self, st: _Queue, now: float, cost: float, max_wait: float) -> float:
        start = max(now, st.free)
        delay = start - now
        # the same slack as the queue bound: five 0.1 s intervals add up to 0.5000000000000001,
        # and the slot exactly max_wait away must not be refused for it
        if delay > self._max_delay or delay > max_wait * (1 + _SLACK):
            return -1.0
        st.free = start + cost * self.interval
        return delay

    def _figures(self, st: _Queue, now: float, cost: float, allowed: bool) -> Decision:
        backlog = st.free - now if st.free > now else 0.0
        free_slots = (
            int((self._max_delay - backlog) / self.interval) + 1
            if backlog <= self._max_delay
            else 0
        )
        return _new(
            Decision,
            (allowed, free_slots, backlog, 0.0 if allowed else backlog, self.limit),
        )

    def _idle_at(self, st: _Queue) -> float:
        return st.free

    def _pack(self, st: _Queue) -> float:
        return st.free

    def _unpack(self, packed: float) -> _Queue:
        return _Queue(packed)

    def describe(self) -> str:
        return f"LeakyBucket({self.name!r}, {self.rate}, queue={self.queue})"
