"""The four rate-limit algorithms as store ops: one step each, run on a key's record.

Each op decides a **batch** of requests on one key in one atomic step (one round trip on every
store): ``args`` are the algorithm's parameters followed by one ``(cost_min, cost_max)`` pair per
request, in arrival order. A request is admitted when at least ``cost_min`` permits are available,
and then takes ``min(cost_max, available)``: ``cost_min == cost_max`` is a plain decision,
``cost_min < cost_max`` a token lease. Every request of a batch is decided at the same instant.

The arithmetic is not here: it is the algorithm's step in :mod:`floodwall.ratelimit._steps`,
the same code the in-memory limiters of :mod:`floodwall.ratelimit` run, given the store's clock
rounded to **whole microseconds** (Redis ``TIME``) as an integer, so every number stays an
integer (below 2^53, which :func:`plan` checks, so Lua holds them exactly). An op only reads the
key's record into the step's state, runs the requests through the step and writes the state
back with an expiry; ``lua/ratelimit_*.lua`` mirror the steps and these records:

* **fixed window** (:class:`~floodwall.ratelimit._steps.FixedWindowStep`): ``"<count> <end_us>"``;
* **sliding window counter** (:class:`~floodwall.ratelimit._steps.SlidingCounterStep`):
  ``"<previous> <current> <end_us>"``;
* **token bucket** (:class:`~floodwall.ratelimit._steps.TokenBucketStep`):
  ``"<tokens> <stamp_us>"``, tokens in units of ``1 / period_us`` token;
* **GCRA** (:class:`~floodwall.ratelimit._steps.GcraStep`): ``"<tat_us> <frac>"``, the
  theoretical arrival time ``tat_us + frac / scale`` µs.

A reply is ``(now_us, verdicts)``; a :data:`Verdict` is ``(allowed, granted, remaining,
reset_us, retry_us)`` with ``retry_us = -1`` for "never" (the cost exceeds the limit); a
refusal with ``granted =`` :data:`STORE_DOWN` was given because the store did not answer
(``on_store_error="fail_closed"``), and reads as a :class:`~floodwall.ratelimit.StoreDownDecision`.
``tests/integration/test_rate_steps.py`` feeds one trace to a local limiter, to these ops and to
the Lua scripts and finds the same verdicts. Records expire (Redis ``PX``) one millisecond after
the state they hold is back to fresh, so idle keys vanish; decisions never depend on the expiry,
only on the stored times (except a token bucket's ``initial`` below capacity: an expired key
starts again at ``initial``, not full).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from floodwall._core import validate
from floodwall._core.errors import ConfigError
from floodwall.ratelimit._base import INF, Decision, Rate, StoreDownDecision, _new
from floodwall.ratelimit._steps import (
    Bucket,
    Counts,
    FixedWindowStep,
    GcraStep,
    SlidingCounterStep,
    Tat,
    TokenBucketStep,
    Window,
)
from floodwall.stores.base import DELETE, KEEP, Op, Record, Write

__all__ = [
    "ALGORITHMS",
    "FIXED",
    "GCRA_OP",
    "RESET",
    "SLIDING",
    "STORE_DOWN",
    "TOKEN",
    "Batch",
    "Plan",
    "Verdict",
    "decision",
    "encode",
    "plan",
]

Verdict = tuple[bool, int, int, int, int]
STORE_DOWN: Final = -1
"""``granted`` of a refusal the store did not give (it was down, ``fail_closed``)."""
"""``(allowed, granted, remaining, reset_us, retry_us)``; ``retry_us = -1``: never."""
Batch = tuple[int, list[Verdict]]
"""What a rate-limit op returns: the store's ``now`` in µs and one verdict per request."""

S = TypeVar("S")
S_contra = TypeVar("S_contra", contravariant=True)


class _Step(Protocol[S_contra]):
    """What an op needs of a step of :mod:`floodwall.ratelimit._steps`."""

    def decide(self, st: S_contra, now: float, cost: float) -> bool: ...
    def take(self, st: S_contra, now: float, least: int, most: int) -> int: ...
    def figures(self, st: S_contra, now: float, cost: float, allowed: bool) -> Decision: ...
    def idle_at(self, st: S_contra) -> float: ...


P = TypeVar("P", bound=_Step[Any])

_RULES: Final = 256
"""Steps an op keeps built (one per distinct limit in the process, usually a handful)."""

EXACT: Final = 1 << 52
"""Every integer an op handles stays below this (Lua numbers are doubles)."""


_ONE = frozenset({b"1", "1"})
_SMALL = tuple(str(n).encode() for n in range(1024))


def encode(n: int) -> bytes:
    """``n`` as an op argument (bytes pass through the stores and redis-py untouched)."""
    return _SMALL[n] if 0 <= n < 1024 else str(n).encode()


def _us(now: float) -> int:
    return round(now * 1_000_000)


def _ttl(now: float, ttl_us: float) -> float:
    """Expiry of a record whose state is fresh again in ``ttl_us``: 1 ms later, as in Lua."""
    return now + (int(ttl_us) // 1000 + 1) / 1000


def _ints(record: Record | None) -> list[int] | None:
    return None if record is None else list(map(int, record.value.split()))


_new_record: Callable[[type[Record], tuple[bytes, float]], Record] = tuple.__new__
"""``_new_record(Record, (value, expires_at))``: the write of every decision, built in C."""


class _RateOp(Op[Batch], Generic[P, S]):
    """What the four ops share: run the batch through the step, and the reply format.

    Subclasses say how the leading ``params`` arguments build the step, how a record becomes
    the step's state (``load``) and when and how the state is written back (``save``, told
    what ``mark`` said of the state before the batch).
    """

    params: int
    """How many leading arguments are the algorithm's parameters."""

    def __init__(self) -> None:
        self._rules: dict[tuple[Any, ...], P] = {}
        self._plans: dict[tuple[Any, ...], tuple[P, tuple[tuple[int, int]]]] = {}

    @abstractmethod
    def build(self, params: list[int]) -> P:
        """The algorithm's step, in whole µs (``us_per_now = 1``)."""

    @abstractmethod
    def load(self, step: P, record: Record | None, t: int) -> S:
        """The state a record holds (a fresh one when there is none)."""

    def mark(self, st: S, record: Record | None) -> object:
        """What ``save`` needs to know of the state as loaded (default: whether it is new)."""
        return record is None

    @abstractmethod
    def save(self, step: P, st: S, t: int, mark: object, granted: int) -> bytes | None:
        """The record to write after a batch that granted ``granted`` (``None``: keep what is
        stored; ``b""``: delete it); ``mark``: what :meth:`mark` said before the batch."""

    def _rule(self, params: Sequence[Any]) -> P:
        """The step for these parameters, built once (a limiter sends the same ones every time;
        the table is bounded)."""
        key = tuple(params)
        rule = self._rules.get(key)
        if rule is None:
            if len(self._rules) >= _RULES:
                self._rules.clear()
            rule = self._rules[key] = self.build([int(a) for a in params])
        return rule

    def _one(self, args: Sequence[Any]) -> tuple[P, tuple[tuple[int, int]]]:
        """The step and the request of a one-request ``args`` (what a limiter sends every
        time), parsed once: a tenth of :meth:`step` (3.02 -> 2.70 µs per fixed-window step,
        best of 5 x 100 000 in thread CPU time)."""
        key = args if args.__class__ is tuple else tuple(args)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _RULES:
                self._plans.clear()
            plan = (self._rule(args[: self.params]), ((int(args[-2]), int(args[-1])),))
            self._plans[key] = plan
        return plan

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], Batch]:
        if len(args) == self.params + 2:  # one request: what a limiter sends every time
            write, batch = self.step_one(records[0], now, args)
            return [write], batch
        t = round(now * 1_000_000)  # _us(now)
        record = records[0]
        rule = self._rule(args[: self.params])
        st = self.load(rule, record, t)
        before = self.mark(st, record)
        out = []
        granted = 0
        for i in range(self.params, len(args), 2):
            verdict = self._request(rule, st, t, int(args[i]), int(args[i + 1]))
            out.append(verdict)
            granted += verdict[1]
        write = self._write(rule, st, t, before=before, granted=granted, record=record, now=now)
        return [write], (t, out)

    def step_one(
        self, record: Record | None, now: float, args: Sequence[Any]
    ) -> tuple[Write, Batch]:
        """One record, and one request in the usual case: no lists but the reply's (the path
        of every decision on ``memory://``)."""
        if len(args) != self.params + 2:
            writes, batch = self.step([record], now, args)
            return writes[0], batch
        t = round(now * 1_000_000)  # _us(now)
        plan = self._plans.get(args if args.__class__ is tuple else tuple(args))
        rule, ((least, most),) = self._one(args) if plan is None else plan
        st = self.load(rule, record, t)
        before = self.mark(st, record)
        if least == most:  # _request, inlined: the decision of every limiter
            take = least if rule.decide(st, t, least) else -1
        else:
            take = rule.take(st, t, least, most)
        allowed = take >= 0
        _, remaining, reset, retry, _ = rule.figures(st, t, least, allowed)
        granted = take if allowed else 0
        verdict = (allowed, granted, remaining, int(reset), -1 if retry == INF else int(retry))
        write = self._write(rule, st, t, before=before, granted=granted, record=record, now=now)
        return write, (t, [verdict])

    def _write(
        self,
        rule: P,
        st: S,
        t: int,
        *,
        before: object,
        granted: int,
        record: Record | None,
        now: float,
    ) -> Write:
        """The record's write after a batch: the saved state, with its expiry."""
        value = self.save(rule, st, t, before, granted)
        if value is None:
            return KEEP
        if value == b"":
            return DELETE if record is not None else KEEP
        ttl_us = int(rule.idle_at(st) - t)  # _ttl, inlined
        return _new_record(Record, (value, now + (ttl_us // 1000 + 1) / 1000))

    @staticmethod
    def _request(rule: P, st: S, t: int, least: int, most: int) -> Verdict:
        """One request of a batch, decided on ``st`` at ``t``."""
        if least == most:  # a plain request: the step's decision, as a local limiter's
            take = least if rule.decide(st, t, least) else -1
        else:
            take = rule.take(st, t, least, most)
        allowed = take >= 0
        _, remaining, reset, retry, _ = rule.figures(st, t, least, allowed)
        retry_us = -1 if retry == INF else int(retry)
        return (allowed, take if allowed else 0, remaining, int(reset), retry_us)

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


class FixedWindowOp(_RateOp[FixedWindowStep, Window]):
    """``lua/ratelimit_fixed.lua``: args ``(limit, period_us, pairs…)``; written when a window
    opened or a permit was granted."""

    script = "ratelimit_fixed"
    params = 2

    def build(self, params: list[int]) -> FixedWindowStep:
        return FixedWindowStep(*params)

    def load(self, step: FixedWindowStep, record: Record | None, t: int) -> Window:
        state = _ints(record)
        return Window(0, -INF) if state is None else Window(*state)

    def mark(self, st: Window, record: Record | None) -> object:
        return st.end

    def step_one(
        self, record: Record | None, now: float, args: Sequence[Any]
    ) -> tuple[Write, Batch]:
        """:meth:`_RateOp.step_one` with :class:`FixedWindowStep`'s ``decide``, ``figures``
        and ``save`` inlined for one plain request already parsed (what ``Frequency`` sends on
        every call): no state object, no decision tuple (``Frequency.allow`` on ``memory://``,
        ``benchmarks/bench_ratelimit.py``); ``tests/test_global_limit_model.py`` holds it to
        the generic path."""
        plan = self._plans.get(args) if args.__class__ is tuple else None
        if plan is None or plan[1][0][0] != plan[1][0][1]:  # not parsed yet, or a lease
            return super().step_one(record, now, args)
        rule, ((cost, _),) = plan
        t = round(now * 1_000_000)
        if record is not None:
            c, e = record.value.split()
            count, end = int(c), int(e)
        if record is None or t >= end:  # a window opens
            count, end, opened = 0, t + int(rule.period_us), True
        else:
            opened = False
        limit = rule.limit
        allowed = count + cost <= limit
        if allowed:
            count += cost
        left = end - t
        granted = cost if allowed else 0
        retry = 0 if allowed else -1 if cost > limit else left
        verdict = (allowed, granted, limit - count, left, retry)
        if not (granted or opened):  # save(): nothing new to keep
            return KEEP, (t, [verdict])
        write = _new_record(Record, (f"{count} {end}".encode(), now + (left // 1000 + 1) / 1000))
        return write, (t, [verdict])

    def save(
        self, step: FixedWindowStep, st: Window, t: int, mark: object, granted: int
    ) -> bytes | None:
        if granted or st.end != mark:  # a window opened (a new key opens one)
            return f"{st.count} {st.end}".encode()
        return None


class SlidingWindowOp(_RateOp[SlidingCounterStep, Counts]):
    """``lua/ratelimit_sliding.lua``: args ``(limit, period_us, pairs…)``; written when the
    grid window rolled or a permit was granted, deleted when both windows are empty."""

    script = "ratelimit_sliding"
    params = 2

    def build(self, params: list[int]) -> SlidingCounterStep:
        return SlidingCounterStep(*params)

    def load(self, step: SlidingCounterStep, record: Record | None, t: int) -> Counts:
        state = _ints(record)
        return Counts(0, 0, -INF) if state is None else Counts(*state)

    def mark(self, st: Counts, record: Record | None) -> object:
        return st.end

    def save(
        self, step: SlidingCounterStep, st: Counts, t: int, mark: object, granted: int
    ) -> bytes | None:
        if not (granted or st.end != mark):  # the grid window rolled (a new key rolls)
            return None
        return f"{st.prev} {st.cur} {st.end}".encode() if st.cur or st.prev else b""


class TokenBucketOp(_RateOp[TokenBucketStep, Bucket]):
    """``lua/ratelimit_token.lua``: args ``(capacity, unit, refill, initial, pairs…)`` in units
    of ``1 / unit`` token (``unit = period_us``, ``refill = count`` units per µs); written when
    a new key or a grant leaves the bucket short of full."""

    script = "ratelimit_token"
    params = 4

    def build(self, params: list[int]) -> TokenBucketStep:
        return TokenBucketStep(*params)

    def load(self, step: TokenBucketStep, record: Record | None, t: int) -> Bucket:
        state = _ints(record)
        return step.fresh(t) if state is None else Bucket(*state)

    def save(
        self, step: TokenBucketStep, st: Bucket, t: int, mark: object, granted: int
    ) -> bytes | None:
        if (granted or mark) and st.tokens < step.full:  # mark: a new key
            return f"{st.tokens} {t}".encode()
        return None


class GcraOp(_RateOp[GcraStep, Tat]):
    """``lua/ratelimit_gcra.lua``: args ``(scale, T, tau, pairs…)`` in units of 1/scale µs;
    written when a permit was granted."""

    script = "ratelimit_gcra"
    params = 3

    def build(self, params: list[int]) -> GcraStep:
        return GcraStep(*params)

    def load(self, step: GcraStep, record: Record | None, t: int) -> Tat:
        state = _ints(record)
        return step.fresh(t) if state is None else Tat(state[0] * step.scale + state[1])

    def save(self, step: GcraStep, st: Tat, t: int, mark: object, granted: int) -> bytes | None:
        if not granted:
            return None
        whole, frac = divmod(st.tat, step.scale)
        return f"{whole} {frac}".encode()


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
    op: _RateOp[Any, Any]
    params: tuple[bytes, ...]
    limit: int
    window: float


def _args(*values: int) -> tuple[bytes, ...]:
    return tuple(encode(v) for v in values)


def _period_us(rate: Rate) -> int:
    """The period in whole µs, which a store's integer arithmetic needs (``ConfigError`` if it
    is not one)."""
    exact = rate.period * 1_000_000
    period = round(exact)
    if period < 1 or abs(period - exact) > 1e-6 * max(1.0, exact):
        raise ConfigError(
            f"rate period must be a whole number of microseconds for a global limit, got {rate}"
        )
    return period


def _exact(rate: Rate, *values: int, burst: int | None = None) -> None:
    if max(values) >= EXACT:
        with_burst = "" if burst is None else f" with burst {burst}"
        raise ConfigError(
            f"rate {rate}{with_burst} is too large for a global limit's exact integer "
            f"arithmetic (count × period in µs, and the burst's tolerance, must stay below 2^52)"
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
    _exact(rate, count * period)  # the documented bound, the same for every algorithm
    if burst is not None:
        validate.count("burst", burst, 0)
    if name in {"fixed_window", "sliding_window_counter"}:
        _exact(rate, count * period * 2)
        op: _RateOp[Any, Any] = FIXED if name == "fixed_window" else SLIDING
        return Plan(name, op, _args(count, period), count, window)
    capacity = 1 + (count - 1 if burst is None else burst)
    if name == "token_bucket":
        full = capacity * period
        start = full if initial is None else round(initial * period)
        if isinstance(initial, bool) or not 0 <= start <= full:
            raise ConfigError(
                f"initial must be a number of tokens in [0, capacity={capacity}], got {initial!r}"
            )
        _exact(rate, full * 2, burst=burst)
        return Plan(
            name,
            TOKEN,
            _args(full, period, count, start),
            capacity,
            capacity * period / count / 1_000_000,
        )
    scale, emission, tolerance = GcraStep.units_of(rate, capacity)
    _exact(rate, tolerance * 2, scale * period, burst=burst)
    return Plan(
        name,
        GCRA_OP,
        _args(scale, emission, tolerance),
        capacity,
        tolerance / scale / 1_000_000,
    )


def decision(verdict: Verdict, limit: int) -> Decision:
    """The :class:`Decision` a verdict stands for (seconds, ``inf`` for "never"); a
    :class:`~floodwall.ratelimit.StoreDownDecision` for a :data:`STORE_DOWN` refusal."""
    allowed, granted, remaining, reset_us, retry_us = verdict
    if allowed:
        retry = 0.0
    elif retry_us < 0:
        retry = INF
    else:
        retry = retry_us / 1_000_000
        if granted == STORE_DOWN:
            return _new(StoreDownDecision, (False, remaining, reset_us / 1_000_000, retry, limit))
    return _new(Decision, (allowed, remaining, reset_us / 1_000_000, retry, limit))
