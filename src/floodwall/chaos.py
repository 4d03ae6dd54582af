"""Fault injection: make a dependency slow, failing, wrong or silent, on purpose and on schedule.

Four policies with the shape of every floodwall policy (``call``, ``call_async``, decorator, a
step of a :class:`~floodwall.Pipeline`), for drills and tests (each class's docstring says how it
maps to the admission protocol):

* :class:`ChaosLatency`: wait ``delay`` seconds (fixed, or drawn from a :class:`Latency`
  distribution), then make the call;
* :class:`ChaosException`: raise instead of calling (default :class:`InjectedFault`, a
  :class:`ConnectionError`, so retries, breakers and fallbacks treat it as a network failure);
* :class:`ChaosResult`: answer ``value`` (or ``factory()``) instead of calling, e.g. an HTTP
  503 response;
* :class:`ChaosHang`: never answer (wait ``duration`` seconds, default an hour, then raise
  :class:`InjectedFault`); only a timeout or a cancellation gets the caller out, which is the
  point.

Each injects on a share ``rate`` of the calls (drawn from ``rng``, seedable), only while its
switch is on (``enabled``, :meth:`~ChaosPolicy.enable` / :meth:`~ChaosPolicy.disable`) and only
inside its :class:`Schedule` (windows of seconds counted from ``origin``). Options are a frozen,
validated :class:`ChaosOptions`; :meth:`~ChaosPolicy.reconfigure` swaps them atomically (what a
config reload or an admin API calls).

**Off unless the process allows it.** A chaos policy injects nothing, whatever its options say,
unless chaos is allowed: ``allow=True`` given when it is built (the config's ``allow_chaos:
true``, a drill), or the environment variable ``FLOODWALL_CHAOS=1`` (exactly ``1``) when
``allow`` is left at ``None``. A policy that is not allowed is inert (one attribute test per
call), says so in :meth:`~ChaosPolicy.describe`, and :meth:`~ChaosPolicy.enable` raises
:class:`~floodwall.ConfigError` naming the flag. So a fault copied into a production config does
nothing there unless someone also sets the flag.

The decision core is :meth:`ChaosPolicy.decide` (``now`` and a uniform draw in, yes/no out):
no I/O, no sleeping. Waiting goes through the injected ``clock`` (a
:class:`~floodwall.FakeClock` makes every fault instantaneous and exact in tests).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from floodwall._core import validate
from floodwall._core.admission import Flow, Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, FloodwallError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.policy import Policy
from floodwall._core.steps import CALL, FlowSteps, Sleep, Step, Wait
from floodwall._core.tally import Tally
from floodwall._core.validate import seconds as _seconds

__all__ = [
    "CHAOS_ENV",
    "CHAOS_HANG_DURATION",
    "CHAOS_RATE",
    "ChaosException",
    "ChaosHang",
    "ChaosLatency",
    "ChaosOptions",
    "ChaosPolicy",
    "ChaosResult",
    "InjectedFault",
    "Latency",
    "Schedule",
    "chaos_allowed",
    "chaos_from_spec",
]

CHAOS_ENV = "FLOODWALL_CHAOS"
"""Environment variable that allows chaos in a process when set to exactly ``1``."""
CHAOS_RATE = 1.0
"""Share of calls a fault hits by default: all of them. Chaos is already gated twice (the
process flag and the switch), and a drill's fault ("reviews is 5 s slow") means every call;
a partial fault states its rate."""
CHAOS_HANG_DURATION = 3600.0
"""Seconds a hang lasts before it gives up with :class:`InjectedFault` (bounded, so a forgotten
hang in a thread still ends)."""

_INF = math.inf


def chaos_allowed() -> bool:
    """Whether the environment allows chaos: ``FLOODWALL_CHAOS=1``, exactly."""
    return os.environ.get(CHAOS_ENV) == "1"


class InjectedFault(FloodwallError, ConnectionError):  # noqa: N818 - a fault, named as one
    """The failure a chaos policy injected: ``InjectedFault(name, reason)``.

    A :class:`ConnectionError` too, so every policy treats it as the network failure it stands
    for (retried as transient, counted by breakers, answered by fallbacks). Being an
    ``OSError``, its fields are kept as attributes.
    """

    def __init__(self, name: str, reason: str = "injected fault") -> None:
        super().__init__(name, reason)
        self._fields = (name, reason)

    @property
    def name(self) -> str:
        """The chaos policy that injected it."""
        return self._fields[0]

    @property
    def reason(self) -> str:
        return self._fields[1]

    def __str__(self) -> str:
        return f"{self._fields[0]!r} injected a fault: {self._fields[1]}"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), self._fields)


# -- distributions and schedules ---------------------------------------------------------------

LatencyKind = Literal["fixed", "uniform", "exponential", "lognormal"]


@dataclass(frozen=True, slots=True)
class Latency:
    """A distribution of delays in seconds, sampled with a caller's ``random.Random``.

    Build with :meth:`fixed`, :meth:`uniform` (``low``..``high``), :meth:`exponential` (``mean``)
    or :meth:`lognormal` (``median`` and ``sigma``: the median of the delays and the standard
    deviation of their logarithm, so ``p99 = median × e^(2.326 σ)``). ``cap`` bounds every draw.
    """

    kind: LatencyKind
    a: float
    b: float = 0.0
    cap: float = _INF

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "exponential", "lognormal"):
            raise ConfigError(
                f"kind must be fixed, uniform, exponential or lognormal, got {self.kind!r}"
            )
        _seconds("latency", self.a, positive=self.kind not in ("fixed", "uniform"))
        if self.kind == "uniform" and not self.a <= self.b < _INF:
            raise ConfigError(f"high must be >= low ({self.a!r}) and finite, got {self.b!r}")
        if self.kind == "lognormal" and not 0 <= self.b < _INF:
            raise ConfigError(f"sigma must be a finite number >= 0, got {self.b!r}")
        if not self.cap > 0:
            raise ConfigError(f"cap must be > 0 seconds, got {self.cap!r}")

    @classmethod
    def fixed(cls, seconds: float) -> Latency:
        return cls("fixed", seconds)

    @classmethod
    def uniform(cls, low: float, high: float) -> Latency:
        return cls("uniform", low, high)

    @classmethod
    def exponential(cls, mean: float, *, cap: float = _INF) -> Latency:
        return cls("exponential", mean, cap=cap)

    @classmethod
    def lognormal(cls, median: float, sigma: float, *, cap: float = _INF) -> Latency:
        return cls("lognormal", median, sigma, cap=cap)

    def sample(self, rng: random.Random) -> float:
        """One delay in seconds (never above ``cap``)."""
        kind = self.kind
        if kind == "fixed":
            value = self.a
        elif kind == "uniform":
            value = rng.uniform(self.a, self.b)
        elif kind == "exponential":
            value = rng.expovariate(1.0 / self.a)
        else:
            value = self.a * math.exp(rng.gauss(0.0, self.b))
        return min(value, self.cap)

    @property
    def mean(self) -> float:
        """The distribution's mean in seconds (ignoring ``cap``)."""
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "exponential":
            return self.a
        return self.a * math.exp(self.b * self.b / 2)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g}s"
        if self.kind == "uniform":
            return f"uniform({self.a:g}s..{self.b:g}s)"
        if self.kind == "exponential":
            return f"exponential(mean {self.a:g}s)"
        return f"lognormal(median {self.a:g}s, sigma {self.b:g})"


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a fault is active: half-open windows ``[start, end)`` of seconds after the policy's
    origin, optionally repeating every ``period`` seconds.

    ``Schedule.between(10, 40)``: from 10 s to 40 s. ``Schedule.after(20)``: from 20 s on.
    ``Schedule.periodic(every=60, for_=10)``: the first 10 s of every minute. Windows must be
    sorted and must not overlap; with a ``period`` they must fit inside it. Cost of
    :meth:`active`: O(number of windows).
    """

    windows: tuple[tuple[float, float], ...]
    period: float | None = None

    def __post_init__(self) -> None:
        previous_end = -_INF
        for index, window in enumerate(self.windows):
            if len(window) != 2:
                raise ConfigError(f"windows[{index}] must be (start, end), got {window!r}")
            start, end = window
            if not (0 <= start < end) or start >= _INF:
                raise ConfigError(
                    f"windows[{index}] must have 0 <= start < end seconds, got {window!r}"
                )
            if start < previous_end:
                raise ConfigError(
                    f"windows[{index}] starts before the previous window ends, got {window!r}"
                )
            previous_end = end
        if self.period is not None:
            if not 0 < self.period < _INF:
                raise ConfigError(f"period must be a finite number > 0, got {self.period!r}")
            if self.windows and previous_end > self.period:
                raise ConfigError(
                    f"windows must end within the period ({self.period:g}s), "
                    f"got one ending at {previous_end:g}s"
                )

    @classmethod
    def always(cls) -> Schedule:
        return cls(((0.0, _INF),))

    @classmethod
    def between(cls, start: float, end: float = _INF) -> Schedule:
        return cls(((float(start), float(end)),))

    @classmethod
    def after(cls, start: float) -> Schedule:
        return cls.between(start)

    @classmethod
    def periodic(cls, *, every: float, for_: float, offset: float = 0.0) -> Schedule:
        return cls(((float(offset), float(offset + for_)),), period=float(every))

    def active(self, elapsed: float) -> bool:
        """Whether the fault is on ``elapsed`` seconds after the origin."""
        if elapsed < 0:
            return False
        if self.period is not None:
            elapsed %= self.period
        return any(start <= elapsed < end for start, end in self.windows)

    def __str__(self) -> str:
        spans = ", ".join(
            f"{s:g}s..{'∞' if e == _INF else format(e, 'g') + 's'}" for s, e in self.windows
        )
        return f"[{spans}]" + (f" every {self.period:g}s" if self.period is not None else "")


# -- options ---------------------------------------------------------------------------------


def _schedule_field(name: str, value: object) -> Schedule:
    if not isinstance(value, Schedule):
        raise ConfigError(f"{name} must be a Schedule or None, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosOptions:
    """What every chaos policy shares: ``rate`` (share of calls hit, in [0, 1], default
    :data:`CHAOS_RATE`), ``enabled`` (the switch, default on) and ``schedule`` (``None``: always).
    Validated on construction; replaced whole by :meth:`ChaosPolicy.reconfigure`."""

    rate: float = CHAOS_RATE
    enabled: bool = True
    schedule: Schedule | None = None

    CHECKS: ClassVar[Checks] = {
        "rate": validate.share,
        "enabled": validate.flag,
        "schedule": optional(_schedule_field),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


# -- the policies ----------------------------------------------------------------------------


class ChaosPolicy(Policy):
    """Base of the chaos policies: the switch, the schedule and the decision core.

    Each fault maps to the protocol on its own: latency, exception and hang are gates whose
    ``admit`` decides (:meth:`_hit`) and then waits (``Wait(Sleep(...))``, then ``resume``) or
    raises; a result answers instead of the call, so it is a flow. Subclasses describe the
    fault (:meth:`_what`).
    """

    kind = "chaos"
    fault: ClassVar[str] = "fault"
    """The fault's stable short name (``latency``, ``exception``, ``result``, ``hang``)."""

    def __init__(
        self,
        name: str,
        *,
        rate: float = CHAOS_RATE,
        enabled: bool = True,
        schedule: Schedule | None = None,
        allow: bool | None = None,
        origin: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = validate.text("name", name)
        self.options = ChaosOptions(rate=rate, enabled=enabled, schedule=schedule)
        self.allowed = chaos_allowed() if allow is None else bool(allow)
        """Whether this process lets the policy inject (fixed when it is built)."""
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.listeners = Listeners(listeners)
        self.origin = clock.monotonic() if origin is None else float(origin)
        """The clock reading the schedule counts from (see :meth:`restart`)."""
        self._now = clock.monotonic
        self._calls = Tally()
        self._injected = Tally()

    # -- the decision core ------------------------------------------------------------------

    def decide(self, now: float, draw: float) -> bool:
        """Whether a call at ``now`` is hit, given a uniform ``draw`` in [0, 1).

        True only when chaos is allowed, the switch is on, ``now`` is inside the schedule and
        ``draw < rate``. Pure: reads the options once, no clock, no I/O.
        """
        options = self.options
        if not (self.allowed and options.enabled):
            return False
        schedule = options.schedule
        if schedule is not None and not schedule.active(now - self.origin):
            return False
        return draw < options.rate

    def _hit(self) -> bool:
        self._calls.add()
        if not (self.allowed and self.options.enabled):
            return False  # the free path: no clock reading, no draw
        if not self.decide(self.clock.monotonic(), self.rng.random()):
            return False
        self._injected.add()
        if self.listeners:
            self.listeners.emit(
                Event(
                    "injected",
                    self.kind,
                    self.name,
                    self.clock.monotonic(),
                    self._what(),
                    figures={"fault": self.fault},
                )
            )
        return True

    def _what(self) -> str:
        return self.fault

    # -- controls ---------------------------------------------------------------------------

    def enable(self) -> None:
        """Turn the switch on. Raises :class:`~floodwall.ConfigError` when the process does not
        allow chaos (an operator asking for a fault gets a loud answer, not silence)."""
        if not self.allowed:
            raise ConfigError(
                f"chaos policy {self.name!r} cannot be enabled: chaos is not allowed in this "
                f"process (set {CHAOS_ENV}=1, or build it with allow=True / allow_chaos: true)"
            )
        self._swap(dataclasses.replace(self.options, enabled=True), "chaos_enabled")

    def disable(self) -> None:
        """Turn the switch off (always allowed)."""
        self._swap(dataclasses.replace(self.options, enabled=False), "chaos_disabled")

    def reconfigure(self, options: ChaosOptions | None = None, /, **changes: Any) -> None:
        """Replace the options (``rate``, ``enabled``, ``schedule``) at once: ``options``
        whole, and/or keyword ``changes`` over them (or over the options in force). Validated
        first: an invalid change raises :class:`~floodwall.ConfigError` and changes nothing;
        then swapped in one assignment, so a call judges by the old options or the new ones."""
        base = self.options if options is None else options
        if not isinstance(base, ChaosOptions):
            raise ConfigError(f"options must be a ChaosOptions, got {base!r}")
        unknown = set(changes) - {f.name for f in dataclasses.fields(ChaosOptions)}
        if unknown:
            raise ConfigError(f"unknown chaos options {sorted(unknown)}")
        fresh = dataclasses.replace(base, **changes)
        if fresh.enabled and not self.options.enabled and not self.allowed:
            raise ConfigError(
                f"chaos policy {self.name!r} cannot be enabled: chaos is not allowed in this "
                f"process (set {CHAOS_ENV}=1, or allow_chaos: true)"
            )
        self._swap(fresh, "chaos_reconfigured")

    def restart(self, origin: float | None = None) -> None:
        """Count the schedule from ``origin`` (default: now)."""
        self.origin = (
            self.clock.monotonic()
            if origin is None
            else validate.number("origin", origin, error=ValueError)
        )

    def _swap(self, options: ChaosOptions, kind: str) -> None:
        self.options = options
        if self.listeners:
            self.listeners.emit(
                Event(kind, self.kind, self.name, self.clock.monotonic(), self.describe())
            )

    @property
    def active(self) -> bool:
        """Whether a call made now could be hit (allowed, switched on, inside the schedule)."""
        options = self.options
        if not (self.allowed and options.enabled):
            return False
        schedule = options.schedule
        return schedule is None or schedule.active(self.clock.monotonic() - self.origin)

    @property
    def calls(self) -> int:
        """Calls that went through the policy."""
        return self._calls.value

    @property
    def injected(self) -> int:
        """Calls the policy hit."""
        return self._injected.value

    def describe(self) -> str:
        options = self.options
        parts = [self._what(), f"rate={options.rate:g}"]
        if options.schedule is not None:
            parts.append(f"schedule={options.schedule}")
        if not options.enabled:
            parts.append("off")
        if not self.allowed:
            parts.append(f"inert: {CHAOS_ENV} not set")
        return f"{type(self).__name__}({self.name!r}: {', '.join(parts)})"


class ChaosLatency(ChaosPolicy, Gate):
    """Wait ``delay`` seconds (a number, or a :class:`Latency` distribution), then call.

    As a gate: ``admit`` raises ``Wait(Sleep(delay))`` on a hit; ``resume`` admits."""

    fault = "latency"

    def __init__(
        self, delay: float | Latency, *, name: str = "chaos.latency", **options: Any
    ) -> None:
        super().__init__(name, **options)
        self.delay = (
            delay if isinstance(delay, Latency) else Latency.fixed(_seconds("delay", delay))
        )

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._hit():
            raise Wait(Sleep(self.clock, self.delay.sample(self.rng)))

    def resume(self, step: Step, value: Any, now: float) -> None:
        """The delay is over: make the call."""

    def _what(self) -> str:
        return f"latency +{self.delay}"


class ChaosException(ChaosPolicy, Gate):
    """Raise ``exception()`` instead of calling: an exception class or a factory (default
    :class:`InjectedFault`). As a gate: ``admit`` raises it on a hit."""

    fault = "exception"

    def __init__(
        self,
        exception: Callable[[], BaseException] | None = None,
        *,
        name: str = "chaos.exception",
        **options: Any,
    ) -> None:
        super().__init__(name, **options)
        if exception is not None and not callable(exception):
            raise ConfigError(
                f"exception must be an exception class or a factory, got {exception!r}"
            )
        self.exception = exception

    def _error(self) -> BaseException:
        if self.exception is None:
            return InjectedFault(self.name)
        return self.exception()

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._hit():
            raise self._error()

    def _what(self) -> str:
        shown = "InjectedFault" if self.exception is None else _name_of(self.exception)
        return f"exception {shown}"


_UNSET: Any = object()


class ChaosResult(ChaosPolicy, Flow):
    """Answer ``value`` (or ``factory()``, e.g. a fresh HTTP 503 response) instead of calling.

    As a flow: on a hit the answer, without a step; otherwise one :data:`CALL`."""

    fault = "result"

    def __init__(
        self,
        value: Any = _UNSET,
        *,
        factory: Callable[[], Any] | None = None,
        name: str = "chaos.result",
        **options: Any,
    ) -> None:
        super().__init__(name, **options)
        if (value is _UNSET) == (factory is None):
            raise ConfigError(
                "give exactly one of value=... or factory=..., got "
                + ("both" if factory is not None else "neither")
            )
        self.value = value
        self.factory = factory

    def _answer(self) -> Any:
        return self.value if self.factory is None else self.factory()

    def flow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlowSteps:
        if self._hit():
            return self._answer()
        return (yield CALL)

    def _what(self) -> str:
        shown = _name_of(self.factory) + "()" if self.factory is not None else repr(self.value)
        return f"result {shown[:60]}"


class ChaosHang(ChaosPolicy, Gate):
    """Never answer: wait ``duration`` seconds (default :data:`CHAOS_HANG_DURATION`), then raise
    :class:`InjectedFault`. A :class:`~floodwall.Timeout` (or a cancellation) ends it sooner.

    As a gate: ``admit`` raises ``Wait(Sleep(duration))`` on a hit; ``resume`` raises."""

    fault = "hang"

    def __init__(
        self,
        duration: float = CHAOS_HANG_DURATION,
        *,
        name: str = "chaos.hang",
        **options: Any,
    ) -> None:
        super().__init__(name, **options)
        self.duration = _seconds("duration", duration, positive=True)

    def _hung(self) -> InjectedFault:
        return InjectedFault(self.name, f"hung for {self.duration:g}s without answering")

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._hit():
            raise Wait(Sleep(self.clock, self.duration))

    def resume(self, step: Step, value: Any, now: float) -> None:
        """The hang is over: fail as the silent dependency would."""
        raise self._hung()

    def _what(self) -> str:
        return f"hang {self.duration:g}s"


def _name_of(obj: object) -> str:
    return str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or obj)


# -- the builder -----------------------------------------------------------------------------

_KINDS: dict[str, type[ChaosPolicy]] = {
    "latency": ChaosLatency,
    "exception": ChaosException,
    "result": ChaosResult,
    "hang": ChaosHang,
}


def chaos_from_spec(
    name: str,
    spec: Mapping[str, Any],
    *,
    allow: bool | None = None,
    origin: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
    rng: random.Random | None = None,
    listeners: Iterable[EventListener] = (),
) -> ChaosPolicy:
    """Build one chaos policy from plain data, in seconds (what config loaders hand over)::

        {"latency": 5.0}                                  # or {"latency": Latency.lognormal(...)}
        {"exception": True, "rate": 0.3}                  # InjectedFault on 30 % of calls
        {"result": {"status": 503}, "rate": 0.3}          # answer this value instead
        {"hang": 3600, "rate": 0.05, "schedule": [[20, 40]], "enabled": False}

    Exactly one of ``latency``, ``exception``, ``result``, ``hang``; plus ``rate``,
    ``enabled``, ``schedule`` (a :class:`Schedule` or a list of ``[start, end]`` pairs, ``end``
    may be ``None``) and ``period``. Errors name the key.
    """
    kinds = [k for k in _KINDS if k in spec]
    if len(kinds) != 1:
        raise ConfigError(
            f"give exactly one fault of {sorted(_KINDS)}, got {kinds or 'none'} in {dict(spec)!r}"
        )
    unknown = set(spec) - {*_KINDS, "rate", "enabled", "schedule", "period"}
    if unknown:
        raise ConfigError(f"unknown chaos keys {sorted(unknown)}")
    kind = kinds[0]
    what = spec[kind]
    options: dict[str, Any] = {
        "name": name,
        "rate": spec.get("rate", CHAOS_RATE),
        "enabled": spec.get("enabled", True),
        "schedule": _schedule(spec.get("schedule"), spec.get("period")),
        "allow": allow,
        "origin": origin,
        "clock": clock,
        "rng": rng,
        "listeners": listeners,
    }
    if kind == "latency":
        return ChaosLatency(what, **options)
    if kind == "exception":
        return ChaosException(None if what is True else what, **options)
    if kind == "result":
        return ChaosResult(what, **options)
    return ChaosHang(CHAOS_HANG_DURATION if what is True else what, **options)


def _schedule(windows: object, period: object) -> Schedule | None:
    if windows is None:
        if period is not None:
            raise ConfigError("period needs a schedule of windows to repeat")
        return None
    if isinstance(windows, Schedule):
        return windows
    if not isinstance(windows, list | tuple):
        raise ConfigError(f"schedule must be a list of [start, end] pairs, got {windows!r}")
    pairs: list[tuple[float, float]] = []
    for index, window in enumerate(windows):
        if not isinstance(window, list | tuple) or len(window) != 2:
            raise ConfigError(f"schedule[{index}] must be [start, end], got {window!r}")
        start, end = window
        pairs.append((_seconds(f"schedule[{index}] start", start), _end(index, end)))
    if period is not None and (isinstance(period, bool) or not isinstance(period, int | float)):
        raise ConfigError(f"period must be a number of seconds, got {period!r}")
    return Schedule(tuple(pairs), None if period is None else float(period))


def _end(index: int, end: object) -> float:
    if end is None:
        return _INF
    return _seconds(f"schedule[{index}] end", end)
