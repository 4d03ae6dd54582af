"""Rate limiting in one process: the algorithm family behind one interface, keyed or not.

Every limiter answers ``acquire(key=None, cost=1)`` with a :class:`Decision` (``allowed``,
``remaining``, ``reset_after``, ``retry_after``, ``limit``), ``try_acquire`` with a bool,
``wait``/``await wait_async`` by pacing instead of refusing, and is a
:class:`~floodwall.Policy` (``call``, ``call_async``, decorator) that raises
:class:`~floodwall.RateLimitedError`. Rates are ``"10/s"``, ``"5/h"``, ``"1/30s"`` or permits
per second; ``burst`` is permits beyond the steady one-at-a-time flow; all time comes from the
``clock=`` given.

========================  ===================================================================
:class:`FixedWindow`      ``count`` per window opened by the first request (2× at a boundary)
:class:`SlidingLog`       exact: never more than ``count`` in any ``period``; O(count) per key
:class:`SlidingWindowCounter` the weighted two-window estimate; O(1) per key
:class:`LeakyBucket`      pacing queue: steady output, bounded queue, refuses when full
:class:`TokenBucket`      rate + burst (+ initial tokens)
:class:`GCRA`             the token bucket as one integer timestamp, exact integer time
:class:`WarmUp`           ramps from ``rate / 3`` to ``rate`` over a warm-up period
:class:`Multi`            several limiters on one key (``10/s`` and ``1000/h``)
:class:`Keyed`            one state per key, bounded memory, idle keys evicted
:class:`HotKeys`          listed hot key values on limits of their own beside a ``Keyed`` default
========================  ===================================================================

Each limiter's options are a frozen, validated object in its ``options`` attribute
(:class:`WindowOptions` for the three windows, :class:`TokenBucketOptions`, :class:`GCRAOptions`,
:class:`LeakyBucketOptions`, :class:`WarmUpOptions`: what a ``rate_limit:`` section builds;
:class:`KeyedOptions` for a keyed one).
See ``docs/rate-limiting.md`` (local) and ``docs/distributed.md`` (global) for each
algorithm's promise, defaults and measured cost.
"""

from floodwall.ratelimit._base import (
    Decision,
    Rate,
    RateLike,
    RateLimiter,
    StoreDownDecision,
    WindowOptions,
    parse_rate,
)
from floodwall.ratelimit.fixed import FixedWindow
from floodwall.ratelimit.gcra import GCRA, GCRAOptions
from floodwall.ratelimit.headers import rate_limit_headers
from floodwall.ratelimit.hot import HotKeys
from floodwall.ratelimit.keyed import Keyed, KeyedOptions
from floodwall.ratelimit.leaky import LeakyBucket, LeakyBucketOptions
from floodwall.ratelimit.multi import Multi
from floodwall.ratelimit.sliding import SlidingLog, SlidingWindowCounter
from floodwall.ratelimit.token import TokenBucket, TokenBucketOptions
from floodwall.ratelimit.warmup import WarmUp, WarmUpOptions

__all__ = [
    "GCRA",
    "Decision",
    "FixedWindow",
    "GCRAOptions",
    "HotKeys",
    "Keyed",
    "KeyedOptions",
    "LeakyBucket",
    "LeakyBucketOptions",
    "Multi",
    "Rate",
    "RateLike",
    "RateLimiter",
    "SlidingLog",
    "SlidingWindowCounter",
    "StoreDownDecision",
    "TokenBucket",
    "TokenBucketOptions",
    "WarmUp",
    "WarmUpOptions",
    "WindowOptions",
    "parse_rate",
    "rate_limit_headers",
]
