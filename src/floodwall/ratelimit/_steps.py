"""One pure step per stored rate algorithm: the arithmetic every copy of it runs.

The fixed window, the sliding window counter, the token bucket and GCRA each exist once, here,
as a small class of pure methods over a per-key state object (no clock, no lock, no I/O). Time
is counted in **ticks of one microsecond**, the resolution of a Redis server's ``TIME``; every
step is given ``now`` in some unit and the number of ticks per unit, ``us_per_now``:

* a **local limiter** (:class:`~floodwall.ratelimit.FixedWindow`,
  :class:`~floodwall.ratelimit.SlidingWindowCounter`, :class:`~floodwall.ratelimit.TokenBucket`,
  :class:`~floodwall.ratelimit.GCRA`) *is* its step (a base class whose methods are the
  limiter's core): it passes its clock's seconds with ``us_per_now = 1e6``, so the ticks are
  floats (GCRA rounds them to whole µs: its state must stay an exact integer);
* a **store op** (``floodwall/shared/_global_ops.py``, run by the memory, PostgreSQL and SQLite
  stores, and behind :class:`~floodwall.shared.GlobalLimiter`, :class:`~floodwall.Frequency` and
  the leased limiter) passes the store's time as whole µs with ``us_per_now = 1``: integer
  arithmetic, exact;
* the **Lua scripts** ``floodwall/stores/lua/ratelimit_<fixed|sliding|token|gcra>.lua`` mirror
  these classes, formula for formula (their ``fdiv`` is Python's ``//``).

Only ``+``, ``-``, ``*``, ``//`` and comparisons touch times and counts (a last ``/`` turns a
duration into the unit of ``now``), so on integer-valued numbers below 2^53 a float computes
what an integer does, bit for bit: a local limiter and a store decide identically at whole-µs
times, with the same figures (``reset_after`` and ``retry_after`` round *up* to whole µs).
``tests/integration/test_rate_steps.py`` feeds one trace to the local limiter, the op on a
memory store and the script on a real Redis, and compares.

Each step has the same methods: ``fresh(now)`` (a key never seen), ``check`` (could ``cost``
be admitted now; brings the state forward, consumes nothing), ``commit``, ``decide`` (both at
once: the hot path), ``take(st, now, least, most)`` (a lease: admit at least ``least``, at most
``most`` permits; the number granted or -1; ``take(c, c)`` is ``decide(c)``), ``figures`` (the
:class:`~floodwall.ratelimit.Decision`, durations in the unit of ``now``), ``idle_at`` (when
the state equals a fresh one again, in the unit of ``now``) and ``pack`` / ``unpack`` (the
state as a number or its numbers packed in ``bytes``, which the garbage collector never tracks:
how
:class:`~floodwall.ratelimit.Keyed` holds a million of them without collector pauses). The
booking algorithms add ``reserve`` for a local ``wait`` (the store does not book ahead).
"""

from __future__ import annotations

import math
import struct
from typing import Final

from floodwall._core.errors import ConfigError
from floodwall.ratelimit._base import INF, Decision, Rate, _new

__all__ = [
    "US",
    "Bucket",
    "Counts",
    "FixedWindowStep",
    "GcraStep",
    "SlidingCounterStep",
    "Tat",
    "TokenBucketStep",
    "Window",
    "period_ticks",
]

US: Final = 1_000_000.0
"""Ticks (µs) per second: the ``us_per_now`` of a local limiter, whose ``now`` is seconds."""

_floor = math.floor

_PAIR: Final = struct.Struct("dd")
_TRIPLE: Final = struct.Struct("ddd")
"""A packed state: its numbers as doubles in one ``bytes``, an object the garbage collector
never tracks (a tuple is tracked until a collection meets it, and counts toward the next one)."""


def period_ticks(rate: Rate) -> int:
    """``rate.period`` in whole µs (``ConfigError`` below one µs)."""
    period = round(rate.period * 1_000_000)
    if period < 1:
        raise ConfigError(f"rate period must be at least 1 µs, got {rate}")
    return period


def _ceil_div(a: float, b: float) -> float:
    """``ceil(a / b)`` for ``b > 0``, exact on integers (and integer-valued floats)."""
    return -(-a // b)


# -- fixed window -----------------------------------------------------------------------------


class Window:
    """A fixed window's state: the cost admitted in the window that closes at ``end`` (ticks)."""

    __slots__ = ("count", "end")

    def __init__(self, count: float, end: float) -> None:
        self.count = count
        self.end = end


class FixedWindowStep:
    """``limit`` permits per window of ``period_us`` ticks; a window opens at the first request
    after the previous one closed. Record ``"<count> <end_us>"``."""

    limit: int
    period_us: float
    us_per_now: float

    def __init__(self, limit: int, period_us: float, us_per_now: float = 1) -> None:
        self.limit = limit
        self.period_us = period_us
        self.us_per_now = us_per_now

    def fresh(self, now: float) -> Window:
        return Window(0, -INF)

    def pack(self, st: Window) -> bytes:
        return _PAIR.pack(st.count, st.end)

    def unpack(self, packed: bytes) -> Window:
        return Window(*_PAIR.unpack(packed))

    def check(self, st: Window, now: float, cost: float) -> bool:
        t = now * self.us_per_now
        if t >= st.end:
            st.end = t + self.period_us
            st.count = 0
        return st.count + cost <= self.limit

    def commit(self, st: Window, now: float, cost: float) -> None:
        st.count += cost

    def decide(self, st: Window, now: float, cost: float) -> bool:
        t = now * self.us_per_now
        if t >= st.end:
            st.end = t + self.period_us
            st.count = 0
        count = st.count + cost
        if count <= self.limit:
            st.count = count
            return True
        return False

    def take(self, st: Window, now: float, least: int, most: int) -> int:
        if least == most:
            return least if self.decide(st, now, least) else -1
        self.check(st, now, 0)
        grant = min(most, self.limit - st.count)
        if grant < least:
            return -1
        st.count += grant
        return int(grant)

    def figures(self, st: Window, now: float, cost: float, allowed: bool) -> Decision:
        per = self.us_per_now
        left = (st.end - now * per) / per
        if allowed:
            retry = 0.0
        elif cost > self.limit:
            retry = INF
        else:
            retry = left
        return _new(Decision, (allowed, int(self.limit - st.count), left, retry, self.limit))

    def idle_at(self, st: Window) -> float:
        return st.end / self.us_per_now


# -- sliding window counter -------------------------------------------------------------------


class Counts:
    """A sliding counter's state: the previous and current grid windows' totals; the current
    window ends at ``end`` (ticks)."""

    __slots__ = ("cur", "end", "prev")

    def __init__(self, prev: float, cur: float, end: float) -> None:
        self.prev = prev
        self.cur = cur
        self.end = end


class SlidingCounterStep:
    """Cloudflare's weighted two-window estimate on a grid of ``period_us``-tick windows aligned
    to multiples of the period: a cost ``c`` is admitted when
    ``previous × (end - now) + (current + c) × period <= limit × period`` (free of division).
    Record ``"<previous> <current> <end_us>"``."""

    limit: int
    period_us: float
    us_per_now: float
    budget: float
    """``limit × period``: the right side of the admission test."""

    def __init__(self, limit: int, period_us: float, us_per_now: float = 1) -> None:
        self.limit = limit
        self.period_us = period_us
        self.us_per_now = us_per_now
        self.budget = limit * period_us

    def fresh(self, now: float) -> Counts:
        return Counts(0, 0, -INF)

    def pack(self, st: Counts) -> bytes:
        return _TRIPLE.pack(st.prev, st.cur, st.end)

    def unpack(self, packed: bytes) -> Counts:
        return Counts(*_TRIPLE.unpack(packed))

    def _roll(self, st: Counts, t: float) -> None:
        """Move ``st`` to the grid window holding ``t`` (``t >= st.end``)."""
        period = self.period_us
        st.prev = st.cur if t < st.end + period else 0
        st.cur = 0
        st.end = (t // period + 1) * period

    def check(self, st: Counts, now: float, cost: float) -> bool:
        t = now * self.us_per_now
        if t >= st.end:
            self._roll(st, t)
        return st.prev * (st.end - t) + (st.cur + cost) * self.period_us <= self.budget

    def commit(self, st: Counts, now: float, cost: float) -> None:
        st.cur += cost

    def decide(self, st: Counts, now: float, cost: float) -> bool:
        t = now * self.us_per_now
        if t >= st.end:
            self._roll(st, t)
        cur = st.cur + cost
        if st.prev * (st.end - t) + cur * self.period_us <= self.budget:
            st.cur = cur
            return True
        return False

    def _room(self, st: Counts, t: float) -> float:
        """The largest ``current`` the estimate allows now (whole permits)."""
        return (self.budget - st.prev * (st.end - t)) // self.period_us

    def take(self, st: Counts, now: float, least: int, most: int) -> int:
        if least == most:
            return least if self.decide(st, now, least) else -1
        self.check(st, now, 0)
        grant = min(most, self._room(st, now * self.us_per_now) - st.cur)
        if grant < least:
            return -1
        st.cur += grant
        return int(grant)

    def figures(self, st: Counts, now: float, cost: float, allowed: bool) -> Decision:
        per = self.us_per_now
        t = now * per
        prev, cur, period = st.prev, st.cur, self.period_us
        w = st.end - t
        if allowed:
            retry = 0.0
        elif cost > self.limit:
            retry = INF
        else:
            spare = self.limit - cost
            if cur <= spare:  # the previous window's weight decays within this window
                wait = w - (period * (spare - cur)) // prev
            else:  # the current window must become the previous one and decay
                wait = w + period - (period * spare) // cur
            retry = max(0, wait) / per
        idle = w + period if cur else (w if prev else 0)
        left = (self.budget - prev * w) // period - cur  # whole permits the estimate allows
        return _new(
            Decision, (allowed, int(left) if left > 0 else 0, idle / per, retry, self.limit)
        )

    def idle_at(self, st: Counts) -> float:
        if st.cur:
            return (st.end + self.period_us) / self.us_per_now
        if st.prev:
            return st.end / self.us_per_now
        return -INF


# -- token bucket -----------------------------------------------------------------------------


class Bucket:
    """A token bucket's state: ``tokens`` (in units of ``1 / unit`` token; negative while
    waiters are booked) as of ``stamp`` (ticks)."""

    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class TokenBucketStep:
    """``capacity`` tokens refilled at ``count`` per period, counted in units of ``1 /
    period_us`` token so that the refill is exactly ``count`` units per tick: ``full`` (the
    capacity in units), ``unit`` (units per token: the period in ticks), ``refill`` (units per
    tick: the count), ``start`` (a new key's units). Refills are applied, and capped, at every
    decision. Record ``"<tokens> <stamp_us>"``."""

    full: float
    unit: float
    refill: float
    start: float
    limit: int
    us_per_now: float

    def __init__(
        self, full: float, unit: float, refill: float, start: float, us_per_now: float = 1
    ) -> None:
        self.full = full
        self.unit = unit
        self.refill = refill
        self.start = start
        self.limit = int(full // unit)
        self.us_per_now = us_per_now

    def fresh(self, now: float) -> Bucket:
        return Bucket(self.start, now * self.us_per_now)

    def pack(self, st: Bucket) -> bytes:
        return _PAIR.pack(st.tokens, st.stamp)

    def unpack(self, packed: bytes) -> Bucket:
        return Bucket(*_PAIR.unpack(packed))

    def check(self, st: Bucket, now: float, cost: float) -> bool:
        t = now * self.us_per_now
        if t > st.stamp:
            tokens = st.tokens + (t - st.stamp) * self.refill
            st.tokens = min(self.full, tokens)
        st.stamp = t
        return st.tokens >= cost * self.unit

    def commit(self, st: Bucket, now: float, cost: float) -> None:
        st.tokens -= cost * self.unit

    def decide(self, st: Bucket, now: float, cost: float) -> bool:
        t = now * self.us_per_now
        tokens = st.tokens
        if t > st.stamp:  # a clock that steps back refills nothing (and takes nothing)
            tokens += (t - st.stamp) * self.refill
            if tokens > self.full:  # noqa: PLR1730 - cheaper than calling min() (hot path)
                tokens = self.full
        st.stamp = t
        need = cost * self.unit
        if tokens >= need:
            st.tokens = tokens - need
            return True
        st.tokens = tokens
        return False

    def take(self, st: Bucket, now: float, least: int, most: int) -> int:
        if least == most:
            return least if self.decide(st, now, least) else -1
        self.check(st, now, 0)
        grant = min(most, st.tokens // self.unit)
        if grant < least:
            return -1
        st.tokens -= grant * self.unit
        return int(grant)

    def reserve(self, st: Bucket, now: float, cost: float, max_wait: float) -> float:
        """Take ``cost`` now (0.0) or book it, letting the bucket go negative, if it is paid
        for within ``max_wait``: the delay; -1.0 when it cannot be."""
        if self.check(st, now, cost):
            st.tokens -= cost * self.unit
            return 0.0
        need = cost * self.unit
        if need > self.full:
            return -1.0
        per = self.us_per_now
        delay = _ceil_div(need - st.tokens, self.refill)
        if delay > max_wait * per:
            return -1.0
        st.tokens -= need
        return delay / per

    def figures(self, st: Bucket, now: float, cost: float, allowed: bool) -> Decision:
        per, refill, tokens = self.us_per_now, self.refill, st.tokens
        if allowed:
            retry = 0.0
        elif cost * self.unit > self.full:
            retry = INF
        else:
            retry = -((tokens - cost * self.unit) // refill) / per  # ceil, in whole ticks
        whole = tokens // self.unit
        reset = -((tokens - self.full) // refill) / per
        return _new(Decision, (allowed, int(whole) if whole > 0 else 0, reset, retry, self.limit))

    def idle_at(self, st: Bucket) -> float:
        return (st.stamp + _ceil_div(self.full - st.tokens, self.refill)) / self.us_per_now


# -- GCRA -------------------------------------------------------------------------------------


class Tat:
    """A GCRA state: the theoretical arrival time, in units of ``1 / scale`` tick (an integer)."""

    __slots__ = ("tat",)

    def __init__(self, tat: int) -> None:
        self.tat = tat


_new_state = object.__new__
"""A state made without a class call (a class call with a Python ``__init__`` re-enters the
interpreter from C on CPython 3.11: about 0.6 k instructions more)."""

_NEVER: Final = -(1 << 62)
"""A TAT that every clock reading is past: the state of a key never seen."""


class GcraStep:
    """The generic cell rate algorithm in integer units of ``1 / scale`` tick, ``scale`` chosen
    so the emission interval ``T`` is whole: with ``d = max(tat - now, 0)``, a cost ``c`` is
    admitted when ``d + T × c <= tau`` (then ``tat = now + d + T × c``), ``tau = T ×
    capacity``. ``now`` is rounded to a whole tick once per decision, so the state stays an
    exact integer however long it runs. Record ``"<tat_us> <frac>"``: ``divmod(tat, scale)``,
    small enough for Lua's 53-bit integers."""

    scale: int
    emission_interval: int
    tolerance: int
    limit: int
    us_per_now: float

    def __init__(
        self, scale: int, emission_interval: int, tolerance: int, us_per_now: float = 1
    ) -> None:
        self.scale = scale
        self.emission_interval = emission_interval
        self.tolerance = tolerance
        self.limit = tolerance // emission_interval
        self.us_per_now = us_per_now
        reset = -(-emission_interval // scale) / us_per_now
        self._drained = _new(Decision, (True, max(0, self.limit - 1), reset, 0.0, self.limit))
        """What :meth:`figures` gives for one permit admitted when the TAT was not ahead of
        now (a key not busy: the usual case), the same every time: :meth:`decide_packed`
        hands it out."""
        self._drained_cost = 1 if emission_interval <= tolerance else None
        """The cost :attr:`_drained` is for: 1, or ``None`` (no shortcut) when one permit is
        more than the tolerance (never admitted)."""

    @staticmethod
    def units_of(rate: Rate, capacity: int) -> tuple[int, int, int]:
        """``(scale, T, tau)`` for ``rate`` and ``capacity``: ``scale = count / gcd(period_us,
        count)`` makes ``T = period_us × scale / count`` whole (``"3/s"``: scale 3, T = 10⁶)."""
        period = period_ticks(rate)
        common = math.gcd(period, rate.count)
        emission = period // common
        return rate.count // common, emission, emission * capacity

    def _ticks(self, now: float) -> int:
        return _floor(now * self.us_per_now + 0.5)

    def fresh(self, now: float) -> Tat:
        return Tat(_NEVER)

    def pack(self, st: Tat) -> int:
        return st.tat

    def unpack(self, packed: int) -> Tat:
        st = _new_state(Tat)  # (Tat(packed) without a class call: once per decision)
        st.tat = packed
        return st

    def _delay(self, st: Tat, t: int) -> int:
        """``d``: how far the TAT runs ahead of ``t`` (units), 0 when it is past."""
        d = st.tat - t * self.scale
        return max(0, d)

    def check(self, st: Tat, now: float, cost: float) -> bool:
        return self._delay(st, self._ticks(now)) + self.emission_interval * cost <= self.tolerance

    def commit(self, st: Tat, now: float, cost: float) -> None:
        ts = self._ticks(now) * self.scale
        st.tat = max(st.tat, ts) + self.emission_interval * cost  # type: ignore[assignment]

    def decide(self, st: Tat, now: float, cost: float) -> bool:
        ts = _floor(now * self.us_per_now + 0.5) * self.scale
        tat = st.tat
        if tat < ts:  # noqa: PLR1730 - a comparison costs less than calling max() (hot path)
            tat = ts
        new = tat + self.emission_interval * cost
        if new - ts <= self.tolerance:
            st.tat = new  # type: ignore[assignment]
            return True
        return False

    def take(self, st: Tat, now: float, least: int, most: int) -> int:
        if least == most:
            return least if self.decide(st, now, least) else -1
        ts = self._ticks(now) * self.scale
        d = st.tat - ts if st.tat > ts else 0
        grant = min(most, (self.tolerance - d) // self.emission_interval)
        if grant < least:
            return -1
        st.tat = ts + d + self.emission_interval * grant
        return grant

    def reserve(self, st: Tat, now: float, cost: float, max_wait: float) -> float:
        """Admit now (0.0) or book the slot ``cost`` gets if it is within ``max_wait``: the
        delay; -1.0 when it is not."""
        increment = self.emission_interval * cost
        if increment > self.tolerance:
            return -1.0
        per = self.us_per_now
        t = self._ticks(now)
        ts = t * self.scale
        new = max(st.tat, ts) + increment
        late = _ceil_div(new - self.tolerance - ts, self.scale)
        if late > 0 and late > max_wait * per:
            return -1.0
        st.tat = new  # type: ignore[assignment]
        return late / per if late > 0 else 0.0

    def figures(self, st: Tat, now: float, cost: float, allowed: bool) -> Decision:
        per, scale, tolerance = self.us_per_now, self.scale, self.tolerance
        d = st.tat - _floor(now * per + 0.5) * scale
        if d < 0:  # noqa: PLR1730 - a comparison costs less than calling max()
            d = 0
        if allowed:
            retry = 0.0
        else:
            increment = self.emission_interval * cost
            late = -((tolerance - d - increment) // scale)  # ceil, in whole ticks
            retry = INF if increment > tolerance else late / per
        spare = (tolerance - d) // self.emission_interval
        reset = -(-d // scale) / per
        return _new(Decision, (allowed, int(spare) if spare > 0 else 0, reset, retry, self.limit))

    def decide_packed(self, tat: int, now: float, cost: float) -> tuple[int, Decision]:
        """:meth:`unpack`, :meth:`decide`, :meth:`figures` and :meth:`pack` in one call, on the
        packed state: the state to keep and the decision (a keyed limiter's hot path: three
        calls and a state object fewer per decision, measured by ``benchmarks/bench_ratelimit.py``'s
        keyed GCRA row). It repeats :meth:`decide` and :meth:`figures` for that;
        ``tests/test_ratelimit_keyed.py`` holds the two to the same states and decisions."""
        per, scale = self.us_per_now, self.scale
        ts = _floor(now * per + 0.5) * scale
        if tat <= ts and cost == self._drained_cost:  # one permit, the key not busy: the
            return ts + self.emission_interval, self._drained  # usual case (7.1 k -> 2.2 k)
        tolerance = self.tolerance
        start = tat
        if start < ts:  # noqa: PLR1730 - a comparison costs less than calling max()
            start = ts
        increment = self.emission_interval * cost
        new = start + increment
        allowed = new - ts <= tolerance
        if allowed:  # the TAT moves on; refused, the state stays as it was
            tat = new  # type: ignore[assignment]
            d = new - ts
            retry = 0.0
        else:
            d = start - ts
            late = -((tolerance - d - increment) // scale)  # ceil, in whole ticks
            retry = INF if increment > tolerance else late / per
        spare = (tolerance - d) // self.emission_interval
        figures = (allowed, int(spare) if spare > 0 else 0, -(-d // scale) / per, retry, self.limit)
        return tat, _new(Decision, figures)

    def idle_at(self, st: Tat) -> float:
        if st.tat == _NEVER:
            return -INF
        return _ceil_div(st.tat, self.scale) / self.us_per_now
