"""Priority admission by dependency level: when capacity is short, level 1 gets it first.

The seeds: "strong dependencies first; weak dependencies are easier to limit". The rule is a
*reserve*: work of level *L* may only use a share of the capacity, so the rest is still free
when level-1 work arrives.

    level 1: 100 % of the capacity
    level 2: 1 − reserve₂  (90 % by default)
    level 3: 1 − reserve₃  (70 % by default)

While the capacity is far from used up every level is admitted alike; as it fills, level 3 is
refused first, then level 2, and the last ``reserve₂`` of it only ever goes to level 1.
:class:`LevelReserve` is that rule as a pure function, applied by:

* :class:`PriorityGate`: a concurrency gate (a bulkhead with levels); ``gate.for_level(3)`` is
  the policy for level-3 calls, refusing with :class:`~floodwall.BulkheadFullError`;
* :class:`LevelLimiter`: any :class:`~floodwall.ratelimit.RateLimiter`; a level-2/3 call is
  admitted only while the limiter's ``remaining`` stays above the reserve
  (:class:`~floodwall.RateLimitedError` otherwise). The check (``peek``) and the take
  (``acquire``) are two steps, so concurrent callers may dip into the reserve by at most one
  permit each;
* the load-shedding guard of :mod:`floodwall.adaptive`: :func:`admit_level` passes the level as
  the DAGOR business priority (level 1 = 0, the most important) or as an
  :class:`~floodwall.adaptive.AdaptiveLimiter` partition (:func:`level_partitions` builds the
  partitions: each level a guaranteed share, unused shares borrowable).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import BulkheadFullError, ConfigError, RateLimitedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all

__all__ = [
    "LevelLimiter",
    "LevelReserve",
    "PriorityGate",
    "PriorityGateOptions",
    "admit_level",
    "dagor_business",
    "level_partition",
    "level_partitions",
]

R = TypeVar("R")

_EPSILON = 1e-9


def _check_level(level: int) -> int:
    if isinstance(level, bool) or level not in (1, 2, 3):
        raise ConfigError(f"level must be 1, 2 or 3, got {level!r}")
    return level


@dataclass(frozen=True, slots=True)
class LevelReserve:
    """The share of a capacity each level must leave to more important ones (module doc)."""

    level2: float = defaults.PRIORITY_RESERVE_LEVEL2
    level3: float = defaults.PRIORITY_RESERVE_LEVEL3

    CHECKS: ClassVar[Checks] = {
        "level2": partial(validate.number, low=0.0, high=1.0, high_open=True),
        "level3": partial(validate.number, low=0.0, high=1.0, high_open=True),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if not self.level2 <= self.level3 < 1:
            raise ConfigError(
                f"level3 must be in [level2 ({self.level2!r}), 1), got {self.level3!r}"
            )

    def share(self, level: int) -> float:
        """The share of the capacity ``level`` may use (1.0 for level 1)."""
        _check_level(level)
        return 1.0 if level == 1 else 1.0 - (self.level2 if level == 2 else self.level3)

    def admits(self, level: int, in_use: float, capacity: float, cost: float = 1) -> bool:
        """Whether ``cost`` more units of ``level`` work fit, with ``in_use`` of ``capacity``
        taken. Pure; O(1)."""
        return in_use + cost <= capacity * self.share(level) + _EPSILON


def _reserve(name: str, value: object) -> LevelReserve:
    if not isinstance(value, LevelReserve):
        raise ConfigError(f"{name} must be a LevelReserve, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class PriorityGateOptions:
    """A :class:`PriorityGate`'s options, validated once: ``max_concurrent`` calls at once
    (>= 1), the ``reserve`` each level leaves to more important ones (a :class:`LevelReserve`:
    10 % for level 2, 30 % for level 3) and the ``level`` of ``gate.call`` (1)."""

    max_concurrent: int
    reserve: LevelReserve = LevelReserve()
    level: int = 1

    CHECKS: ClassVar[Checks] = {
        "max_concurrent": validate.count,
        "reserve": _reserve,
        "level": lambda name, value: _check_level(value),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


# -- a concurrency gate with levels ---------------------------------------------------------


class _Levelled:
    """What the level-aware admissions share: a policy per level, sharing the owner's capacity
    (:meth:`for_level`), and :meth:`run` / :meth:`run_async` through it."""

    _views: dict[int, _LevelView]

    def for_level(self, level: int) -> _LevelView:
        """The policy for ``level`` calls through this gate or limiter."""
        return self._views[_check_level(level)]

    def run(self, level: int, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)`` as ``level`` work."""
        return self.for_level(level).call(fn, *args, **kwargs)

    async def run_async(
        self, level: int, fn: Callable[..., Awaitable[R]], /, *args: Any, **kwargs: Any
    ) -> R:
        """Await ``fn(*args, **kwargs)`` as ``level`` work."""
        return await self.for_level(level).call_async(fn, *args, **kwargs)


class PriorityGate(_Levelled, Gate):
    """At most ``max_concurrent`` calls at once, level 1 first (see
    [Degradation][guide-degradation]).

    ``gate.call`` runs at ``level`` (default 1); ``gate.for_level(n)`` is a policy for level-n
    calls sharing the same slots. Refusals raise :class:`~floodwall.BulkheadFullError` at once.
    ``admitted`` and ``rejected`` count per level.

    As a gate: ``admit`` takes a slot if the level's share of them allows, else refuses;
    ``record`` gives the slot back. Each ``for_level`` view is a gate with the same hooks.
    """

    kind = "priority_gate"

    def __init__(
        self,
        max_concurrent: int,
        *,
        reserve: LevelReserve | None = None,
        level: int = 1,
        name: str = "priority_gate",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = PriorityGateOptions(
            max_concurrent, LevelReserve() if reserve is None else reserve, level
        )
        """The validated :class:`PriorityGateOptions`, read once, here."""
        self.clock = clock
        self.max_concurrent = o.max_concurrent
        self.reserve = o.reserve
        self.level = o.level
        self.name = validate.text("name", name)
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._lock = threading.Lock()
        self._in_flight = 0
        self.admitted = {1: 0, 2: 0, 3: 0}
        self.rejected = {1: 0, 2: 0, 3: 0}
        self._views = {n: _LevelView(self, n) for n in (1, 2, 3)}

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def try_enter(self, level: int) -> bool:
        """Take a slot for ``level`` work if the reserve allows; pair with :meth:`release`."""
        with self._lock:
            if self.reserve.admits(level, self._in_flight, self.max_concurrent):
                self._in_flight += 1
                self.admitted[level] += 1
                return True
            self.rejected[level] += 1
        return False

    def release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _enter(self, level: int) -> None:
        if self.try_enter(level):
            return
        in_flight, limit = self._in_flight, self.max_concurrent
        reason = (
            f"level {level} may use {self.reserve.share(level):.0%} of {limit} slots "
            f"and {in_flight} are taken"
        )
        if self.listeners:
            now = self.clock.monotonic()
            self.listeners.emit(Event("rejected", self.kind, self.name, now, reason))
        raise BulkheadFullError(self.name, reason, None, limit, 0, in_flight, 0)

    def _leave(self) -> None:
        self.release()

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A slot for a call at the gate's ``level``, or raise the refusal."""
        self._enter(self.level)

    def record(
        self,
        permit: None,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        """Give the slot back."""
        self.release()

    def describe(self) -> str:
        return f"PriorityGate({self.name!r}, max_concurrent={self.max_concurrent})"


class _LevelView(Gate):
    """One level's door into a shared :class:`PriorityGate` or :class:`LevelLimiter`: admits
    through the owner's ``_enter(level)``, records through its ``_leave()``."""

    def __init__(self, owner: PriorityGate | LevelLimiter, level: int) -> None:
        self.owner = owner
        self.level = level
        self.name = f"{owner.name}[level {level}]"
        self.kind = owner.kind
        self.listeners = owner.listeners
        self._now = owner._now

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.owner._enter(self.level)

    def record(
        self,
        permit: None,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        self.owner._leave()

    def describe(self) -> str:
        return f"{self.owner.describe()}.for_level({self.level})"


# -- rate limiters --------------------------------------------------------------------------


class LevelLimiter(_Levelled):
    """A :class:`~floodwall.ratelimit.RateLimiter` that keeps a reserve for level 1.

    ``acquire(level, key, cost)`` returns the limiter's
    :class:`~floodwall.ratelimit.Decision` (``allowed`` False when the reserve refused);
    ``for_level(level)`` is the policy, raising :class:`~floodwall.RateLimitedError`: a gate
    whose ``admit`` takes a permit for its level and whose ``record`` has nothing to give back.
    """

    kind = "level_limiter"

    def __init__(self, limiter: Any, *, reserve: LevelReserve | None = None) -> None:
        for method in ("peek", "acquire"):
            if not callable(getattr(limiter, method, None)):
                raise ConfigError(f"limiter must be a floodwall RateLimiter, got {limiter!r}")
        self.limiter = limiter
        if reserve is not None and not isinstance(reserve, LevelReserve):
            raise ConfigError(f"reserve must be a LevelReserve or None, got {reserve!r}")
        self.reserve = reserve if reserve is not None else LevelReserve()
        self.name: str = getattr(limiter, "name", "rate_limiter")
        self.listeners: Listeners = getattr(limiter, "listeners", Listeners())
        self.reserve_refusals = 0
        """Calls refused by the reserve while the limiter itself still had room."""
        clock: Clock = getattr(limiter, "clock", SYSTEM_CLOCK)
        self._now = clock.monotonic
        self._views = {n: _LevelView(self, n) for n in (1, 2, 3)}

    def acquire(self, level: int, key: Hashable = None, cost: float = 1) -> Any:
        """Take ``cost`` permits for ``level`` work if the limiter and the reserve allow."""
        if _check_level(level) == 1:
            return self.limiter.acquire(key, cost)
        peek = self.limiter.peek(key, cost)
        used = peek.limit - peek.remaining
        if peek.allowed and not self.reserve.admits(level, used, peek.limit, cost):
            self.reserve_refusals += 1
            return peek._replace(allowed=False, retry_after=peek.reset_after)
        if not peek.allowed:
            return peek
        return self.limiter.acquire(key, cost)

    def _enter(self, level: int) -> None:
        decision = self.acquire(level)
        if not decision.allowed:
            retry = decision.retry_after
            reason = (
                f"level {level} may use {self.reserve.share(level):.0%} of {decision.limit} "
                f"and {decision.limit - decision.remaining} are taken"
            )
            raise RateLimitedError(self.name, reason, None if retry == float("inf") else retry)

    def _leave(self) -> None:
        """Nothing to give back: rate permits are spent."""

    def describe(self) -> str:
        return f"LevelLimiter({self.name!r})"


# -- the load-shedding guard ----------------------------------------------------------------


def level_partition(level: int) -> str:
    """The :class:`~floodwall.adaptive.AdaptiveLimiter` partition name of ``level``."""
    return f"level{_check_level(level)}"


def level_partitions(shares: Mapping[int, float] | None = None) -> dict[str, float]:
    """Partitions for an :class:`~floodwall.adaptive.AdaptiveLimiter`, one per level, each
    guaranteed ``floor(limit × share)`` tokens (default 70 / 20 / 10 %)."""
    chosen = shares if shares is not None else {1: 0.7, 2: 0.2, 3: 0.1}
    if not isinstance(chosen, Mapping):
        raise ConfigError(f"shares must be a mapping of level to share, got {shares!r}")
    return {
        level_partition(level): validate.share(f"shares[{level!r}]", share)
        for level, share in chosen.items()
    }


def dagor_business(level: int) -> int:
    """The DAGOR business priority of ``level`` (0, the most important, for level 1)."""
    return _check_level(level) - 1


def admit_level(shedder: Any, level: int, **options: Any) -> Any:
    """``shedder.admit(...)`` for ``level`` work: its level as the DAGOR business priority and
    as the limiter partition (see :func:`level_partitions`). Raises
    :class:`~floodwall.OverloadedError` when refused; returns the ticket."""
    options.setdefault("business", dagor_business(level))
    options.setdefault("partition", level_partition(level))
    return shedder.admit(**options)
