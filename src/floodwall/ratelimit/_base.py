"""What every rate limiter shares: rates, decisions, and the shells around a pure core.

**Rates** are given per second as numbers (``10``, ``0.5``) or as strings ``"COUNT/PERIOD"``:
``"10/s"``, ``"5/h"``, ``"1/30s"`` (one per 30 seconds), ``"100/10m"``, ``"5 per hour"``.
Units: ``ms``, ``s``, ``m``/``min``, ``h``, ``d`` (and their long names). A number becomes the
smallest whole count over a whole period (``0.5`` → ``1/2s``, ``2.5`` → ``5/2s``).

**Decisions** (:class:`Decision`) carry ``allowed``, ``remaining`` (cost-1 requests that would
still be admitted right now), ``reset_after`` (seconds until the limiter is back to its fresh
state for this key), ``retry_after`` (0 when allowed; else seconds until this request's cost
could be admitted if nothing else arrives, ``inf`` when it never can, i.e. the cost exceeds the
limit) and ``limit`` (the quota, for ``RateLimit-Limit``).

**The core** of each algorithm is a set of pure methods on a small per-key state object: they
take ``now`` (seconds on the limiter's clock) and a cost, never read the clock, never sleep,
never lock. The shells here read the clock *inside* the limiter's lock, so every decision of a
limiter happens at a distinct, non-decreasing time and the algorithms' promises hold under
threads exactly as they do on a :class:`~floodwall.FakeClock`:

* ``_new_state(now)``: the state of a key never seen (its *fresh* state);
* ``_check(st, now, cost)``: could ``cost`` be admitted now (may bring ``st`` forward to
  ``now``, never consumes);
* ``_commit(st, now, cost)``: consume ``cost`` (after a successful check);
* ``_decide(st, now, cost)``: both at once (the hot path);
* ``_reserve(st, now, cost, max_wait)``: admit now or book a future slot no more than
  ``max_wait`` seconds away; the delay to wait, or -1 (algorithms that cannot book ahead admit
  now or return -1, and :meth:`RateLimiter.wait` retries after ``retry_after``);
* ``_figures(st, now, cost, allowed)``: the :class:`Decision` for a decision just made;
* ``_idle_at(st)``: when ``st`` will equal a fresh state again (its TTL), so a keyed limiter can
  forget it without changing any later decision.

Thread-safe (one short lock per limiter, never held while a protected call runs or a waiter
sleeps) and asyncio-safe (deciding never awaits).
"""

from __future__ import annotations

import copy
import math
import re
import threading
from abc import abstractmethod
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, RateLimitedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all
from floodwall._core.pending import advance, settle, settle_async, start
from floodwall._core.steps import FlowSteps, Sleep, Step
from floodwall._core.tally import Tally
from floodwall._core.validate import PLAIN_INT
from floodwall._core.validate import count as _count_check
from floodwall._core.validate import number as _number_check
from floodwall._core.validate import seconds as _seconds_check
from floodwall.context import _DEADLINE

__all__ = ["Decision", "Rate", "RateLike", "RateLimiter", "WindowOptions", "parse_rate"]

S = TypeVar("S")

INF = math.inf
_MIN_SLEEP = 1e-6
"""Shortest retry sleep of :meth:`RateLimiter.wait`: a retry_after rounded to 0 must still let
time move, or a fake clock at a large reading (where ``now + 1e-12 == now``) would spin."""

_UNITS: dict[str, float] = {
    "ms": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_RATE = re.compile(
    r"^\s*(\d+(?:\.\d*)?)\s*(?:/|per\b)\s*(\d+(?:\.\d*)?)?\s*([a-z]+)\s*$", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` permits per ``period`` seconds (``Rate(10, 1.0)`` is ``"10/s"``): a whole
    count >= 1 over a finite period > 0."""

    count: int
    period: float

    def __post_init__(self) -> None:
        _count_check("count", self.count)
        object.__setattr__(self, "period", _seconds_check("period", self.period, positive=True))

    @property
    def per_second(self) -> float:
        """Permits per second."""
        return self.count / self.period

    @property
    def interval(self) -> float:
        """Seconds per permit at the steady rate (GCRA's emission interval)."""
        return self.period / self.count

    def __str__(self) -> str:
        for unit, seconds in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            if self.period >= seconds and self.period % seconds == 0:
                n = self.period / seconds
                return f"{self.count}/{unit}" if n == 1 else f"{self.count}/{n:g}{unit}"
        return f"{self.count}/{self.period * 1000:g}ms"


RateLike = Rate | str | float | int
"""What a limiter's ``rate`` accepts: a :class:`Rate`, a string (``"10/s"``) or permits/s."""


def parse_rate(value: RateLike, name: str = "rate") -> Rate:
    """Read ``value`` as a :class:`Rate` (see [Rate limiting][guide-rate-limiting]);
    ``ConfigError`` if bad, naming it ``name``."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name must be a non-empty string, got {name!r}")
    if isinstance(value, Rate):
        return value  # checked when it was made
    if isinstance(value, str):
        match = _RATE.match(value)
        unit = _UNITS.get(match.group(3).lower()) if match else None
        if match is None or unit is None:
            raise ConfigError(
                f"{name} must look like '10/s', '5/h' or '1/30s' "
                f"(units ms, s, m, h, d), got {value!r}"
            )
        count = Fraction(match.group(1))
        period = Fraction(match.group(2) or 1) * Fraction(unit)
        if count <= 0 or period <= 0:
            raise ConfigError(
                f"{name} must be a positive count over a positive period, got {value!r}"
            )
        # Keep the stated period ("5/h" is 5 per hour, not 1 per 12 minutes: windows differ);
        # a fractional count scales both ("0.5/s" is 1 per 2 s).
        scale = count.denominator
        return Rate(int(count * scale), float(period * scale))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a Rate, a string like '10/s' or a number, got {value!r}")
    if not 0 < value < INF:
        raise ConfigError(
            f"{name} must be a finite number of permits per second > 0, got {value!r}"
        )
    per_second = Fraction(value).limit_denominator(1_000_000)
    if per_second <= 0:
        raise ConfigError(f"{name} is too small to represent, got {value!r}")
    return Rate(per_second.numerator, float(per_second.denominator))


class Decision(NamedTuple):
    """The answer to one ``acquire``: truthy when ``allowed``.

    A tuple (built by C code, read by C code: cheap on the hot path); ``retry_after`` is 0 when
    allowed and ``inf`` when the cost can never be admitted (it exceeds the limit).
    """

    allowed: bool
    remaining: int
    reset_after: float
    retry_after: float
    limit: int

    def __bool__(self) -> bool:
        return self[0]


class StoreDownDecision(Decision):
    """A refusal that is not the limit's: a shared limiter's store did not answer and its
    ``on_store_error`` is ``"fail_closed"``, so nothing was checked. ``retry_after`` is the
    time until the store is probed again. Integrations answer it as floodwall's outage (HTTP
    503, :class:`~floodwall.LimitStoreUnavailableError`), never as the caller's rate (429)."""

    __slots__ = ()


_new: Callable[[type[Decision], tuple[bool, int, float, float, int]], Decision]  # or a subclass
_new = tuple.__new__
"""``_new(Decision, (allowed, remaining, reset_after, retry_after, limit))``: builds a decision
in C, skipping the Python-level ``NamedTuple.__new__``. Kept because it is measured: it saves
about a fifth of the ``floodwall acquire() → Decision`` row of ``benchmarks/bench_ratelimit.py``
(fixed window, interleaved A/B against ``Decision(...)``: median ratio 1.23)."""


def check_cost(cost: object) -> float:
    """A call's ``cost``: a finite number of permits >= 0 (an int passes on the fast path)."""
    return _number_check("cost", cost, 0.0, error=ValueError)


def _seconds(name: str, value: float, *, allow_inf: bool = True) -> float:
    return _seconds_check(name, value, infinite=allow_inf)


def rate_field(name: str, value: object) -> Rate:
    """An options object's ``rate``: anything :func:`parse_rate` reads, kept as a
    :class:`Rate` (``"5/h"`` keeps its one-hour window)."""
    return parse_rate(value, name)  # type: ignore[arg-type]  # parse_rate refuses other types


max_wait_field = partial(_seconds_check, infinite=True)
"""An options object's ``max_wait``: seconds >= 0, ``inf`` for a wait without a bound."""


@dataclass(frozen=True, slots=True)
class WindowOptions:
    """The options of a window limiter (:class:`~floodwall.ratelimit.FixedWindow`,
    :class:`~floodwall.ratelimit.SlidingLog`,
    :class:`~floodwall.ratelimit.SlidingWindowCounter`), validated once: ``rate`` (kept as a
    :class:`Rate`: ``count`` per window of ``period`` seconds) and ``max_wait`` (seconds a call
    may wait for its turn as a policy; 0 refuses at once)."""

    rate: RateLike
    max_wait: float = defaults.RATE_LIMIT_MAX_WAIT

    CHECKS: ClassVar[Checks] = {"rate": rate_field, "max_wait": max_wait_field}

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


class RateLimiter(Gate, Generic[S]):
    """Base of every limiter: the shells (``acquire``, ``try_acquire``, ``wait``…) around the
    pure core each algorithm implements (see [Rate limiting][guide-rate-limiting]).

    As a gate: ``admit`` decides under the limiter's lock (a refusal raises
    :class:`~floodwall.RateLimitedError`); with ``max_wait`` it raises ``Wait`` for the
    ``Sleep`` steps of :meth:`wait` and ``resume`` carries them on. ``record`` learns nothing:
    a permit once taken is spent, whatever the call's outcome.

    A plain limiter has one state and takes ``key=None`` only; wrap it in
    :class:`~floodwall.ratelimit.Keyed` for one state per key. As a policy, ``call`` admits the
    call or raises :class:`~floodwall.RateLimitedError` with ``retry_after``; with ``max_wait``
    > 0 it paces instead, waiting up to ``max_wait`` seconds (and never past the ambient
    :func:`floodwall.deadline`) for its turn.
    """

    kind = "rate_limiter"
    algorithm: ClassVar[str] = "rate_limiter"
    """Stable short name of the algorithm (``"token_bucket"``, ``"gcra"``, …)."""
    limit: int
    """The quota reported as ``RateLimit-Limit``."""
    window: float | None = None
    """Seconds the quota refers to (``RateLimit-Policy: limit;w=window``), when there is one."""
    books_ahead: ClassVar[bool] = False
    """Whether ``_reserve`` books future slots (then a refused reservation is final for
    ``wait``: it already looked as far ahead as the wait may go)."""

    def __init__(
        self,
        *,
        name: str,
        clock: Clock = SYSTEM_CLOCK,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = validate.text("name", name)
        self.clock = clock
        self.max_wait = _seconds("max_wait", max_wait)
        self.listeners = Listeners(listeners)
        lock = threading.Lock()
        self._lock = lock
        # bound once rather than `with self._lock`: 16-25 % of the `floodwall try_acquire()`
        # row of benchmarks/bench_ratelimit.py (interleaved A/B, fixed window)
        self._lock_acquire = lock.acquire
        self._lock_release = lock.release
        self._now = clock.monotonic
        self._rejections = Tally()
        self._reason = f"{self.describe()} exceeded"
        self._state: S = self._new_state(clock.monotonic())

    # -- the pure core (per algorithm) ------------------------------------------------------

    @abstractmethod
    def _new_state(self, now: float) -> S:
        """The state of a key never seen."""

    @abstractmethod
    def _check(self, st: S, now: float, cost: float) -> bool:
        """Whether ``cost`` could be admitted at ``now``; may bring ``st`` forward, not consume."""

    @abstractmethod
    def _commit(self, st: S, now: float, cost: float) -> None:
        """Consume ``cost`` at ``now`` (``_check`` just said yes)."""

    def _decide(self, st: S, now: float, cost: float) -> bool:
        """Admit ``cost`` at ``now`` if possible (check and commit in one)."""
        if self._check(st, now, cost):
            self._commit(st, now, cost)
            return True
        return False

    def _reserve(self, st: S, now: float, cost: float, max_wait: float) -> float:
        """Admit now (0.0) or book a slot at most ``max_wait`` away (the delay); -1.0 if not."""
        return 0.0 if self._decide(st, now, cost) else -1.0

    @abstractmethod
    def _figures(self, st: S, now: float, cost: float, allowed: bool) -> Decision:
        """The decision just made, with its figures (``st`` is already at ``now``)."""

    @abstractmethod
    def _idle_at(self, st: S) -> float:
        """When ``st`` will be equivalent to a fresh state (``-inf`` if it already is)."""

    def _pack(self, st: S) -> Any:
        """``st`` as what :class:`~floodwall.ratelimit.Keyed` keeps per key: a number, or its
        numbers packed in ``bytes``, where the algorithm's state allows (the garbage collector
        tracks neither, so a million keys cost its collections nothing; a
        :class:`~floodwall.ratelimit.Multi` packs a tuple of its members' values); default:
        ``st`` itself."""
        return st

    def _unpack(self, packed: Any) -> S:
        """The state :meth:`_pack` packed (a new object, or ``packed`` itself by default)."""
        return packed  # type: ignore[no-any-return]

    _decide_packed: Callable[[Any, float, float], tuple[Any, Decision]] | None = None
    """``_unpack``, ``_decide``, ``_figures`` and ``_pack`` at once on a packed state, where
    the algorithm has it (the packed state to keep and the decision): what a
    :class:`~floodwall.ratelimit.Keyed` calls for a tracked key."""

    # -- keys -------------------------------------------------------------------------------

    def _state_for(self, key: Hashable, now: float) -> S | None:
        """The state ``key`` decides on (lock held); ``None`` when there is no room for it."""
        if key is not None:
            raise TypeError(
                f"{type(self).__name__} {self.name!r} has one state and takes key=None only, "
                f"got key={key!r}; wrap it in floodwall.ratelimit.Keyed(...) for per-key limits"
            )
        return self._state

    def _keep(self, key: Hashable, st: S) -> None:
        """Store ``st``, taken by :meth:`_state_for` and changed since (lock held): a plain
        limiter changed its one state in place; a keyed one packs it back into its table."""

    def _no_room(self, now: float) -> Decision:  # pragma: no cover - plain limiters have room
        """The decision for a key that cannot be tracked (only keyed limiters have none)."""
        raise AssertionError("unreachable: a plain limiter always has its state")

    # -- the shells -------------------------------------------------------------------------

    def try_acquire(self, key: Hashable = None, cost: float = 1) -> bool:
        """Take ``cost`` permits now if possible: True if admitted. The cheapest question."""
        # its own path, not acquire(...).allowed: the `floodwall try_acquire()` row of
        # benchmarks/bench_ratelimit.py is 1.85x as fast for it (no figures, no Decision)
        if key is not None or cost.__class__ is not PLAIN_INT or cost < 0:
            return self.acquire(key, cost).allowed  # checks the cost (bool, float, NaN, …)
        self._lock_acquire()
        try:
            allowed = self._decide(self._state, self._now(), cost)
        finally:
            self._lock_release()
        if allowed:
            return True
        self._rejected(key, cost, None)
        return False

    def acquire(self, key: Hashable = None, cost: float = 1) -> Decision:
        """Take ``cost`` permits now if possible; the :class:`Decision` with its figures."""
        if cost.__class__ is not PLAIN_INT or cost < 0:
            cost = check_cost(cost)
        self._lock_acquire()
        try:
            now = self._now()
            st = self._state if key is None else self._state_for(key, now)
            if st is None:
                result = self._no_room(now)
            else:
                result = self._figures(st, now, cost, self._decide(st, now, cost))
        finally:
            self._lock_release()
        if not result[0]:
            self._rejected(key, cost, result)
        return result

    def peek(self, key: Hashable = None, cost: float = 1) -> Decision:
        """Whether ``acquire(key, cost)`` would admit now, with the figures as they stand
        (``remaining`` before anything is taken); consumes and changes nothing."""
        if cost.__class__ is not PLAIN_INT or cost < 0:
            cost = check_cost(cost)
        self._lock_acquire()
        try:
            now = self._now()
            st = self._peek_state(key, now)
            if st is None:
                return self._no_room(now)
            return self._figures(st, now, cost, self._check(st, now, cost))
        finally:
            self._lock_release()

    def _peek_state(self, key: Hashable, now: float) -> S | None:
        """A copy of ``key``'s state to evaluate without changing anything."""
        st = self._state_for(key, now)
        return None if st is None else copy.deepcopy(st)

    def reset(self, key: Hashable = None) -> None:
        """Forget what ``key`` consumed (operator action): back to a fresh state."""
        self._lock_acquire()
        try:
            self._forget(key, self._now())
        finally:
            self._lock_release()

    def _forget(self, key: Hashable, now: float) -> None:
        self._state_for(key, now)
        self._state = self._new_state(now)

    def wait(
        self, key: Hashable = None, cost: float = 1, *, max_wait: float | None = None
    ) -> Decision:
        """Take ``cost`` permits, sleeping (on the limiter's clock) until they are granted.

        Waits at most ``max_wait`` seconds (default: the limiter's ``max_wait``) and never past
        the ambient deadline; when the permits cannot be had within that bound it returns the
        refusal at once, without sleeping in vain. Algorithms that book ahead (token bucket,
        GCRA, leaky bucket, warm-up) reserve the slot before sleeping, so waiters are served
        in arrival order; the windows retry after ``retry_after``.
        """
        return settle(self._wait_steps(key, cost, max_wait))  # type: ignore[no-any-return]

    async def wait_async(
        self, key: Hashable = None, cost: float = 1, *, max_wait: float | None = None
    ) -> Decision:
        """:meth:`wait` for coroutines: suspends on ``clock.async_sleep`` instead of blocking."""
        return await settle_async(self._wait_steps(key, cost, max_wait))  # type: ignore[no-any-return]

    def _wait_steps(self, key: Hashable, cost: float, max_wait: float | None) -> FlowSteps:
        """The steps of :meth:`wait`: decide, sleep the delay (or until a retry), repeat."""
        until = self._wait_until(max_wait, cost)
        while True:
            result, sleep = self._wait_step(key, cost, until)
            if sleep > 0:
                yield Sleep(self.clock, sleep)
            if result[0] or sleep < 0:
                return result

    def _wait_until(self, max_wait: float | None, cost: float) -> float:
        check_cost(cost)
        bound = (
            self.max_wait
            if max_wait is None
            else _seconds_check("max_wait", max_wait, infinite=True, error=ValueError)
        )
        outer = _DEADLINE.get()
        if outer is not None:
            bound = min(bound, outer.remaining())
        return self._now() + bound

    def _wait_step(self, key: Hashable, cost: float, until: float) -> tuple[Decision, float]:
        """One round of ``wait``: ``(decision, sleep)``.

        Allowed: sleep ``sleep`` seconds (a reservation's delay, maybe 0), then go. Refused with
        ``sleep > 0``: sleep, then ask again. Refused with ``sleep < 0``: give up.
        """
        self._lock_acquire()
        try:
            now = self._now()
            st = self._state_for(key, now)
            if st is None:
                result = self._no_room(now)
            else:
                delay = self._reserve(st, now, cost, max(0.0, until - now))
                self._keep(key, st)
                if delay >= 0:
                    return self._figures(st, now, cost, True), delay
                result = self._figures(st, now, cost, False)
        finally:
            self._lock_release()
        retry = result[3]
        if not self.books_ahead and retry < INF and now + retry <= until:
            return result, max(retry, _MIN_SLEEP)
        self._rejected(key, cost, result)
        return result, -1.0

    def _rejected(self, key: Hashable, cost: float, result: Decision | None) -> None:
        self._rejections.add()
        if self.listeners:
            if result is None:
                result = self.peek(key, cost)
            self.listeners.emit(
                Event(
                    kind="rejected",
                    source=self.kind,
                    name=self.name,
                    time=self._now(),
                    reason=self._reason,
                    figures={
                        "key": key,
                        "cost": cost,
                        "limit": result[4],
                        "remaining": result[1],
                        "retry_after": result[3],
                    },
                )
            )

    def _error(self, result: Decision) -> RateLimitedError:
        retry = result[3]
        return RateLimitedError(self.name, self._reason, None if retry == INF else retry)

    def _admit(self, key: Hashable, cost: float = 1) -> Decision | None:
        """Immediate admission without figures (the policy's and the inbound guard's hot path):
        ``None`` if admitted, else the refusal, its figures taken under the same lock as the
        decision. ``cost`` must be >= 0 (callers check it once, at construction)."""
        self._lock_acquire()
        try:
            now = self._now()
            st = self._state if key is None else self._state_for(key, now)
            if st is None:
                result = self._no_room(now)
            elif self._decide(st, now, cost):
                return None
            else:
                result = self._figures(st, now, cost, False)
        finally:
            self._lock_release()
        self._rejected(key, cost, result)
        return result

    def _call_key(self, args: tuple[object, ...], kwargs: dict[str, object]) -> Hashable:
        """The key a protected call is limited under (``None``: the limiter's one state)."""
        return None

    # -- the gate ---------------------------------------------------------------------------

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Admit the call (its key from :meth:`_call_key`, cost 1) or raise
        :class:`~floodwall.RateLimitedError`; with ``max_wait`` or an ambient deadline, wait
        for the turn through the steps of :meth:`wait`.

        ``now`` is not used: the limiter reads its clock inside its lock (see
        :mod:`floodwall.ratelimit._base`), so its decisions happen at non-decreasing times
        under threads.
        """
        key = self._call_key(args, kwargs)
        if self.max_wait == 0 and _DEADLINE.get() is None:
            refused = self._admit(key)
            if refused is not None:
                raise self._error(refused)
            return None
        return start(self._paced(key))  # type: ignore[no-any-return]

    def _paced(self, key: Hashable) -> FlowSteps:
        result = yield from self._wait_steps(key, 1, None)
        if not result[0]:
            raise self._error(result)

    def resume(self, step: Step, value: Any, now: float) -> None:
        return advance(step, value)  # type: ignore[no-any-return]

    # -- observers --------------------------------------------------------------------------

    @property
    def rejected(self) -> int:
        """Requests refused since the limiter was built."""
        return self._rejections.value

    def describe(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
