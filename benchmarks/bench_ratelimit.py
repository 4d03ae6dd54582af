"""Rate limiters: floodwall beside limits, pyrate-limiter, throttled-py, aiolimiter and hyx.

One group per algorithm; every row is one admission decision on an in-memory limiter whose
quota (10⁹ per second) is never reached during the run, so the figures are the cost of the
common case, an admitted request. Peers are grouped by the algorithm they implement (their own
name for it, plus aiolimiter, whose "leaky bucket" is the meter form: a level draining at the
rate, admitting while ``level + amount <= max_rate``, i.e. a token bucket).

floodwall rows: ``try_acquire()`` (bool, like ``limits.hit``), ``acquire()`` (a full
``Decision`` with remaining / reset / retry figures, like throttled-py's ``RateLimitResult``),
and a ``Keyed`` limiter deciding for key ``"k"`` (peers all keep per-key state in a store:
that row does the same work). A last group times refusals (the limit exhausted).

A peer that is not installed or fails to set up becomes a skipped row with the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from itertools import repeat
from typing import Any

from _harness import Case, Target
from floodwall import FakeClock
from floodwall.ratelimit import (
    GCRA,
    FixedWindow,
    Keyed,
    RateLimiter,
    SlidingLog,
    SlidingWindowCounter,
    TokenBucket,
)

HUGE = 10**9
"""Permits per second: never reached, every decision is an admission."""

FIXED = "fixed window, admitted"
SLIDING = "sliding window counter, admitted"
BUCKET = "token bucket, admitted"
GCRA_GROUP = "GCRA, admitted"
LOG = "sliding log (exact), admitted"
REFUSED = "refusal, limit exhausted"

FW_TRY = "floodwall try_acquire()"
FW_DECISION = "floodwall acquire() → Decision"
FW_KEYED = "floodwall Keyed(…).try_acquire('k')"
LIMITS_FIXED = "limits FixedWindowRateLimiter.hit"
LIMITS_SLIDING = "limits SlidingWindowCounterRateLimiter.hit"
LIMITS_MOVING = "limits MovingWindowRateLimiter.hit"
THROTTLED = "throttled-py Throttled.limit('k')"
PYRATE_BUCKET = "pyrate-limiter TokenBucket try_acquire"
PYRATE_GCRA = "pyrate-limiter GCRA try_acquire"
PYRATE_LOG = "pyrate-limiter InMemoryBucket try_acquire"
HYX = "hyx TokenBucketLimiter await acquire()"
AIOLIMITER = "aiolimiter await acquire()"


def _peer(group: str, label: str, build: Callable[[str, str], Case]) -> Case:
    """``build(group, label)``, or a skipped row saying why it could not be set up."""
    try:
        return build(group, label)
    except Exception as exc:
        return Case(group, label, skip=f"could not be set up: {type(exc).__name__}: {exc}")


def _floodwall(group: str, make: Callable[[], RateLimiter[Any]]) -> list[Case]:
    plain, decided, keyed = make(), make(), Keyed(make())
    try_acquire, acquire, keyed_try = plain.try_acquire, decided.acquire, keyed.try_acquire

    def per_key(n: int) -> None:
        for _ in repeat(None, n):
            keyed_try("k")

    return [
        Case(group, FW_TRY, fn=try_acquire),
        Case(group, FW_DECISION, fn=acquire),
        Case(group, FW_KEYED, loop=per_key),
    ]


# -- peers -------------------------------------------------------------------------------------


def _limits(strategy: str) -> Callable[[str, str], Case]:
    def build(group: str, label: str) -> Case:
        import limits
        import limits.strategies
        from limits.storage import MemoryStorage

        item = limits.parse(f"{HUGE}/second")
        hit = getattr(limits.strategies, strategy)(MemoryStorage()).hit

        def run(n: int) -> None:
            for _ in repeat(None, n):
                hit(item, "k")

        return Case(group, label, loop=run, ref="limits")

    return build


def _throttled(using: str) -> Callable[[str, str], Case]:
    def build(group: str, label: str) -> Case:
        from throttled import MemoryStore, Throttled, per_sec

        limit = Throttled(using=using, quota=per_sec(HUGE), store=MemoryStore()).limit

        def run(n: int) -> None:
            for _ in repeat(None, n):
                limit("k")

        return Case(group, label, loop=run, ref="throttled-py")

    return build


def _pyrate(algorithm: str) -> Callable[[str, str], Case]:
    def build(group: str, label: str) -> Case:
        from pyrate_limiter import Duration, InMemoryBucket, Limiter, Rate, StateBucket
        from pyrate_limiter import abstracts as pyrate_algorithms

        rates = [Rate(HUGE, Duration.SECOND)]
        if algorithm == "log":
            bucket: Any = InMemoryBucket([Rate(10**6, Duration.SECOND * 1000)])
            note = "a sliding log of every admission (pyrate-limiter's default bucket)"
        else:
            bucket = StateBucket(rates, algorithm=getattr(pyrate_algorithms, algorithm)())
            note = f"`StateBucket(algorithm={algorithm}())`"
        acquire = Limiter(bucket).try_acquire

        def run(n: int) -> None:
            for _ in repeat(None, n):
                acquire("k", blocking=False)

        return Case(group, label, loop=run, ref="pyrate-limiter", note=note)

    return build


def _hyx(group: str, label: str) -> Case:
    from hyx.ratelimit import TokenBucketLimiter

    # Building hyx's limiter captures the running event loop: build it once per loop, inside.
    built: dict[asyncio.AbstractEventLoop, Callable[[], Awaitable[None]]] = {}

    async def run(n: int) -> None:
        loop = asyncio.get_running_loop()
        acquire = built.get(loop) or built.setdefault(
            loop, TokenBucketLimiter(HUGE, 1.0, HUGE).acquire
        )
        for _ in repeat(None, n):
            await acquire()

    return Case(
        group,
        label,
        aloop=run,
        ref="hyx",
        note="asyncio only, no lock, and it reads no clock while tokens remain: it refills "
        "only when the bucket runs dry, capped at one bucketful, so after an idle spell it "
        "admits two bucketfuls at once (see `docs/rate-limiting.md`).",
    )


def _aiolimiter(group: str, label: str) -> Case:
    from aiolimiter import AsyncLimiter

    acquire = AsyncLimiter(HUGE, 1.0).acquire

    async def run(n: int) -> None:
        for _ in repeat(None, n):
            await acquire()

    return Case(
        group,
        label,
        aloop=run,
        ref="aiolimiter",
        note="a leaky bucket as a meter (level drains at the rate): the token bucket's rule; "
        "asyncio only, one event loop, no lock.",
    )


# -- groups ------------------------------------------------------------------------------------


def _fixed() -> list[Case]:
    return [
        *_floodwall(FIXED, lambda: FixedWindow(HUGE)),
        _peer(FIXED, LIMITS_FIXED, _limits("FixedWindowRateLimiter")),
        _peer(FIXED, THROTTLED, _throttled("fixed_window")),
        Case(FIXED, "pyrate-limiter", skip="pyrate-limiter 4 has no fixed window."),
    ]


def _sliding() -> list[Case]:
    return [
        *_floodwall(SLIDING, lambda: SlidingWindowCounter(HUGE)),
        _peer(SLIDING, LIMITS_SLIDING, _limits("SlidingWindowCounterRateLimiter")),
        _peer(SLIDING, THROTTLED, _throttled("sliding_window")),
    ]


def _token() -> list[Case]:
    return [
        *_floodwall(BUCKET, lambda: TokenBucket(HUGE)),
        _peer(BUCKET, THROTTLED, _throttled("token_bucket")),
        _peer(BUCKET, PYRATE_BUCKET, _pyrate("TokenBucket")),
        _peer(BUCKET, HYX, _hyx),
        _peer(BUCKET, AIOLIMITER, _aiolimiter),
    ]


def _gcra() -> list[Case]:
    return [
        *_floodwall(GCRA_GROUP, lambda: GCRA(HUGE)),
        _peer(GCRA_GROUP, THROTTLED, _throttled("gcra")),
        _peer(GCRA_GROUP, PYRATE_GCRA, _pyrate("GCRA")),
    ]


def _log() -> list[Case]:
    # 10⁶ per 0.1 s: never reached, and the ring of grant times stays at most 10⁶ long
    return [
        *_floodwall(LOG, lambda: SlidingLog("1000000/100ms")),
        _peer(LOG, LIMITS_MOVING, _limits("MovingWindowRateLimiter")),
        _peer(LOG, PYRATE_LOG, _pyrate("log")),
    ]


def _refused() -> list[Case]:
    clock = FakeClock()
    limiters: dict[str, RateLimiter[Any]] = {
        "fixed window": FixedWindow("1/h", clock=clock),
        "sliding counter": SlidingWindowCounter("1/h", clock=clock),
        "token bucket": TokenBucket("1/h", clock=clock),
        "GCRA": GCRA("1/h", clock=clock),
    }
    cases = []
    for name, limiter in limiters.items():
        limiter.try_acquire()
        cases.append(
            Case(REFUSED, f"floodwall {name} try_acquire() → False", fn=limiter.try_acquire)
        )
    cases.append(_peer(REFUSED, "limits fixed window hit → False", _refused_limits))
    cases.append(_peer(REFUSED, "throttled-py token bucket limit → limited", _refused_throttled))
    return cases


def _refused_limits(group: str, label: str) -> Case:
    import limits
    from limits.storage import MemoryStorage
    from limits.strategies import FixedWindowRateLimiter

    item = limits.parse("1/hour")
    hit = FixedWindowRateLimiter(MemoryStorage()).hit
    hit(item, "k")
    return Case(group, label, fn=lambda: hit(item, "k"), ref="limits")


def _refused_throttled(group: str, label: str) -> Case:
    from throttled import MemoryStore, Throttled, per_hour

    limit = Throttled(using="token_bucket", quota=per_hour(1), store=MemoryStore()).limit
    limit("k")
    return Case(group, label, fn=lambda: limit("k"))


def cases() -> list[Case]:
    return [*_fixed(), *_sliding(), *_token(), *_gcra(), *_log(), *_refused()]


_PEERS = {
    FIXED: [(LIMITS_FIXED, "limits"), (THROTTLED, "throttled-py")],
    SLIDING: [(LIMITS_SLIDING, "limits"), (THROTTLED, "throttled-py")],
    BUCKET: [
        (THROTTLED, "throttled-py"),
        (PYRATE_BUCKET, "pyrate-limiter"),
        (HYX, "hyx"),
        (AIOLIMITER, "aiolimiter"),
    ],
    GCRA_GROUP: [(THROTTLED, "throttled-py"), (PYRATE_GCRA, "pyrate-limiter")],
}


def targets() -> list[Target]:
    found = []
    for group, peers in _PEERS.items():
        algorithm = group.split(",")[0]
        for case, (what) in ((FW_TRY, "try_acquire"), (FW_KEYED, "keyed")):
            for peer, name in peers:
                text = f"{algorithm}: floodwall {what} ≤ 0.2 × {name}"
                found.append(Target(group, case, peer, 0.2, text))
    return found
