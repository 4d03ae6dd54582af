"""The four rate-limit algorithms as store ops: ``lua/ratelimit_*.lua`` and their Python twins.

Each op decides a **batch** of requests on one key in one atomic step (one round trip on every
store): ``args`` are the algorithm's parameters followed by one ``(cost_min, cost_max)`` pair per
request, in arrival order. A request is admitted when at least ``cost_min`` permits are available,
and then takes ``min(cost_max, available)``: ``cost_min == cost_max`` is a plain decision,
``cost_min < cost_max`` a token lease. Every request of a batch is decided at the same instant.

Time is the store's clock rounded to **whole microseconds** (Redis ``TIME``), and all arithmetic
is on integers (Lua holds them exactly below 2^53, which :func:`plan` checks), so the Lua scripts
and the :meth:`~floodwall.stores.Op.step` methods below compute the same answers bit for bit, and
the same answers as the in-memory limiters of :mod:`floodwall.ratelimit` at whole-microsecond
times (``tests/test_global_limit_model.py`` holds all three to it):

* **fixed window** (:class:`~floodwall.ratelimit.FixedWindow`): ``"<count> <end_us>"``; a window
  opens at the first request after the last one closed;
* **sliding window counter** (:class:`~floodwall.ratelimit.SlidingWindowCounter`):
  ``"<previous> <current> <end_us>"`` on a grid aligned to multiples of the period;
* **token bucket** (:class:`~floodwall.ratelimit.TokenBucket`): ``"<tokens> <stamp_us>"`` with
  tokens counted in units of ``1 / period_us`` token, so refilling ``count`` tokens per period
  adds exactly ``count`` units per microsecond;
* **GCRA** (:class:`~floodwall.ratelimit.GCRA`): ``"<tat_us> <frac>"``, the theoretical arrival
  time in units of ``1 / scale`` µs with ``scale`` chosen so that the emission interval is whole.

A reply is ``(now_us, verdicts)``; a :data:`Verdict` is ``(allowed, granted, remaining,
reset_us, retry_us)`` with ``retry_us = -1`` for "never" (the cost exceeds the limit). Records
expire (Redis ``PX``) one millisecond after the state they hold is back to fresh, so idle keys
vanish; decisions never depend on the expiry, only on the stored times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from floodwall._core.errors import ConfigError
from floodwall.ratelimit._base import INF, Decision, Rate, _new
from floodwall.stores.base import DELETE, KEEP, Op, Record, Write

__all__ = [
    "ALGORITHMS",
    "FIXED",
    "GCRA_OP",
    "RESET",
    "SLIDING",
    "TOKEN",
    "Batch",
    "Plan",
    "Verdict",
    "decision",
    "encode",
    "plan",
]

Verdict = tuple[bool, int, int, int, int]
"""``(allowed, granted, remaining, reset_us, retry_us)``; ``retry_us = -1``: never."""
Batch = tuple[int, list[Verdict]]
"""What a rate-limit op returns: the store's ``now`` in µs and one verdict per request."""

EXACT: Final = 1 << 52
"""Every integer an op handles stays below this (Lua numbers are doubles)."""


_ONE = frozenset({b"1", "1"})
_SMALL = tuple(str(n).encode() for n in range(1024))


def encode(n: int) -> bytes:
    """``n`` as an op argument (bytes pass through the stores and redis-py untouched)."""
    return _SMALL[n] if 0 <= n < 1024 else str(n).encode()


def _us(now: float) -> int:
    return round(now * 1_000_000)


def _ttl(now: float, ttl_us: int) -> float:
    """Expiry of a record whose state is fresh again in ``ttl_us``: 1 ms later, as in Lua."""
    return now + (ttl_us // 1000 + 1) / 1000


def _pairs(args: Sequence[Any], first: int) -> list[tuple[int, int]]:
    return [(int(args[i]), int(args[i + 1])) for i in range(first, len(args), 2)]


def _two(record: Record | None) -> tuple[int, int] | None:
    if record is None:
        return None
    a, b = record.value.split()
    return int(a), int(b)


class _RateOp(Op[Batch]):
    """What the four ops share: the reply format."""

    params: int
    """How many leading arguments are the algorithm's parameters."""

    def parse(self, raw: Any) -> Batch:
        words = raw.split()
        if len(words) == 6:  # one request: the hot path
            _, a, g, rem, reset, retry = words
            one = (a in _ONE, int(g), int(rem), int(reset), int(retry))
            return int(words[0]), [one]
        nums = [int(x) for x in words]
        return nums[0], [
            (nums[i] == 1, nums[i + 1], nums[i + 2], nums[i + 3], nums[i + 4])
            for i in range(1, len(nums), 5)
        ]


class FixedWindowOp(_RateOp):
    """``lua/ratelimit_fixed.lua``: args ``(limit, period_us, pairs…)``."""

    script = "ratelimit_fixed"
    params = 2

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], Batch]:
        t = _us(now)
        limit, period = int(args[0]), int(args[1])
        state = _two(records[0])
        opened = state is None or t >= state[1]
        count, end = (0, t + period) if opened or state is None else state
        left = end - t
        out: list[Verdict] = []
        granted = 0
        for cmin, cmax in _pairs(args, 2):
            take = min(cmax, limit - count)
            if take >= cmin:
                count += take
                granted += take
                out.append((True, take, limit - count, left, 0))
            else:
                out.append((False, 0, limit - count, left, -1 if cmin > limit else left))
        write: Write = KEEP
        if opened or granted:
            write = Record(f"{count} {end}".encode(), _ttl(now, left))
        return [write], (t, out)


class SlidingWindowOp(_RateOp):
    """``lua/ratelimit_sliding.lua``: args ``(limit, period_us, pairs…)``."""

    script = "ratelimit_sliding"
    params = 2

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], Batch]:
        t = _us(now)
        limit, period = int(args[0]), int(args[1])
        prev = cur = 0
        end: int | None = None
        if records[0] is not None:
            prev, cur, end = (int(x) for x in records[0].value.split())
        rolled = end is None or t >= end
        if rolled:
            prev = cur if end is not None and t < end + period else 0
            cur, end = 0, (t // period + 1) * period
        assert end is not None
        w = end - t
        room = (limit * period - prev * w) // period
        out: list[Verdict] = []
        granted = 0
        for cmin, cmax in _pairs(args, 2):
            take = min(cmax, room - cur)
            allowed = take >= cmin
            if allowed:
                cur += take
                granted += take
                retry = 0
            else:
                take = 0
                retry = _sliding_retry(limit, period, (prev, cur, w), cmin)
            out.append((allowed, take, max(0, room - cur), _idle(prev, cur, w, period), retry))
        write: Write = KEEP
        if granted or rolled:
            if cur or prev:
                idle = _idle(prev, cur, w, period)
                write = Record(f"{prev} {cur} {end}".encode(), _ttl(now, idle))
            elif records[0] is not None:
                write = DELETE
        return [write], (t, out)


def _sliding_retry(limit: int, period: int, state: tuple[int, int, int], cost: int) -> int:
    """µs until ``cost`` fits if nothing else arrives (ceil), as ``SlidingWindowCounter``;
    ``state`` is ``(previous, current, µs left in the current window)``."""
    prev, cur, w = state
    if cost > limit:
        return -1
    spare = limit - cost
    if cur <= spare:  # the previous window's weight decays within this window
        retry = w - period * (spare - cur) // prev
    else:  # the current window must become the previous one and decay
        retry = w + period - period * spare // cur
    return max(retry, 0)


def _idle(prev: int, cur: int, w: int, period: int) -> int:
    """µs until a sliding counter's state is fresh again."""
    if cur:
        return w + period
    return w if prev else 0


class TokenBucketOp(_RateOp):
    """``lua/ratelimit_token.lua``: args ``(capacity, unit, refill, initial, pairs…)`` in units
    of ``1 / unit`` token (``unit = period_us``, ``refill = count`` units per µs)."""

    script = "ratelimit_token"
    params = 4

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], Batch]:
        t = _us(now)
        cap, unit, refill, tokens = (int(a) for a in args[:4])
        state = _two(records[0])
        fresh = state is None
        if state is not None:
            tokens = min(state[0] + max(0, t - state[1]) * refill, cap)
        out: list[Verdict] = []
        granted = 0
        for cmin, cmax in _pairs(args, 4):
            take = min(cmax, tokens // unit)
            allowed = take >= cmin
            if allowed:
                tokens -= take * unit
                granted += take
                retry = 0
            else:
                take = 0
                retry = -1 if cmin * unit > cap else -((tokens - cmin * unit) // refill)
            out.append((allowed, take, tokens // unit, -((tokens - cap) // refill), retry))
        write: Write = KEEP
        if (granted or fresh) and tokens < cap:
            write = Record(f"{tokens} {t}".encode(), _ttl(now, -((tokens - cap) // refill)))
        return [write], (t, out)


class GcraOp(_RateOp):
    """``lua/ratelimit_gcra.lua``: args ``(scale, T, tau, pairs…)`` in units of 1/scale µs."""

    script = "ratelimit_gcra"
    params = 3

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], Batch]:
        t = _us(now)
        scale, emission, tau = int(args[0]), int(args[1]), int(args[2])
        state = _two(records[0])
        d = 0 if state is None else max(0, (state[0] - t) * scale + state[1])
        out: list[Verdict] = []
        granted = 0
        for cmin, cmax in _pairs(args, 3):
            take = min(cmax, (tau - d) // emission)
            allowed = take >= cmin
            if allowed:
                d += emission * take
                granted += take
                retry = 0
            else:
                take = 0
                retry = -1 if emission * cmin > tau else -((tau - d - emission * cmin) // scale)
            out.append((allowed, take, (tau - d) // emission, -(-d // scale), retry))
        write: Write = KEEP
        if granted:
            whole = d // scale
            write = Record(f"{t + whole} {d - whole * scale}".encode(), _ttl(now, -(-d // scale)))
        return [write], (t, out)


class ResetOp(Op[None]):
    """``lua/ratelimit_reset.lua``: forget a key's state."""

    script = "ratelimit_reset"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], None]:
        return [DELETE], None

    def parse(self, raw: Any) -> None:
        return None


FIXED = FixedWindowOp()
SLIDING = SlidingWindowOp()
TOKEN = TokenBucketOp()
GCRA_OP = GcraOp()
RESET = ResetOp()

ALGORITHMS: dict[str, str] = {
    "fixed_window": "fixed_window",
    "fixed": "fixed_window",
    "sliding_window_counter": "sliding_window_counter",
    "sliding_window": "sliding_window_counter",
    "sliding": "sliding_window_counter",
    "token_bucket": "token_bucket",
    "token": "token_bucket",
    "gcra": "gcra",
}
"""Accepted names (and aliases) → the algorithm's stable name (as on the in-memory limiters)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """An algorithm with its parameters as op arguments: ``op``, ``params`` (encoded, ready for
    ``ARGV``), ``limit`` (the quota a :class:`Decision` reports) and ``window`` (seconds)."""

    algorithm: str
    op: _RateOp
    params: tuple[bytes, ...]
    limit: int
    window: float


def _args(*values: int) -> tuple[bytes, ...]:
    return tuple(encode(v) for v in values)


def _period_us(rate: Rate) -> int:
    exact = rate.period * 1_000_000
    period = round(exact)
    if period < 1 or abs(period - exact) > 1e-6 * max(1.0, exact):
        raise ConfigError(
            f"rate period must be a whole number of microseconds for a global limit, got {rate}"
        )
    return period


def _exact(rate: Rate, *values: int) -> None:
    if max(values) >= EXACT:
        raise ConfigError(
            f"rate {rate} is too large for a global limit's exact integer arithmetic "
            f"(count × period in µs must stay below 2^52)"
        )


def plan(algorithm: str, rate: Rate, burst: int | None, initial: float | None) -> Plan:
    """The op and arguments for ``algorithm`` at ``rate`` (see
    [Distributed state][guide-distributed]).

    ``burst`` (token bucket, GCRA) defaults to ``rate.count - 1`` as in memory; ``initial``
    (token bucket) to a full bucket.
    """
    name = ALGORITHMS.get(algorithm)
    if name is None:
        raise ConfigError(
            f"algorithm must be one of {', '.join(sorted(set(ALGORITHMS.values())))} "
            f"(or fixed, sliding, token), got {algorithm!r}"
        )
    if burst is not None and name in {"fixed_window", "sliding_window_counter"}:
        raise ConfigError(f"burst applies to token_bucket and gcra only, not {name}")
    if initial is not None and name != "token_bucket":
        raise ConfigError(f"initial applies to token_bucket only, not {name}")
    period = _period_us(rate)
    count = rate.count
    window = rate.period
    if name in {"fixed_window", "sliding_window_counter"}:
        _exact(rate, count * period * 2)
        op: _RateOp = FIXED if name == "fixed_window" else SLIDING
        return Plan(name, op, _args(count, period), count, window)
    capacity = 1 + (count - 1 if burst is None else burst)
    if name == "token_bucket":
        full = capacity * period
        start = full if initial is None else round(initial * period)
        if isinstance(initial, bool) or not 0 <= start <= full:
            raise ConfigError(
                f"initial must be a number of tokens in [0, capacity={capacity}], got {initial!r}"
            )
        _exact(rate, full * 2)
        return Plan(
            name,
            TOKEN,
            _args(full, period, count, start),
            capacity,
            capacity * period / count / 1_000_000,
        )
    common = math.gcd(period, count)
    scale = count // common
    emission = period // common
    tolerance = emission * capacity
    _exact(rate, tolerance * 2, scale * period)
    return Plan(
        name,
        GCRA_OP,
        _args(scale, emission, tolerance),
        capacity,
        tolerance / scale / 1_000_000,
    )


def decision(verdict: Verdict, limit: int) -> Decision:
    """The :class:`Decision` a verdict stands for (seconds, ``inf`` for "never")."""
    allowed, _, remaining, reset_us, retry_us = verdict
    if allowed:
        retry = 0.0
    elif retry_us < 0:
        retry = INF
    else:
        retry = retry_us / 1_000_000
    return _new(Decision, (allowed, remaining, reset_us / 1_000_000, retry, limit))
