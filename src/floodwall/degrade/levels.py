"""Dependency levels: switch optional dependencies off under overload, level 3 first, then 2.

The seeds classify a service's dependencies by how much the service needs them: **level 1**
(its failure makes the service unusable), **level 2** (a few users notice), **level 3** (nobody
does). Under a flash sale the service sheds level 3, then level 2 if it keeps degrading, and
keeps only level 1, giving it every thread and CPU cycle left.

A *shed* level's calls do not reach their dependency: a configured resource answers from its
fallback or raises :class:`~floodwall.DegradedError` (``kind == "degraded"``), and so does a
:class:`LevelGate` in a code-built pipeline. Who switches:

* operators and config: :meth:`floodwall.config.Registry.shed` (with a TTL), or :class:`Levels`,
  the same switchboard without a configuration document;
* the overload signal: :class:`AutoShedder` reads a signal every ``interval`` seconds, feeds the
  pure :class:`ShedController`, and sheds or restores through the switchboard.

The controller (a state machine; numbers stable for metrics: ``NORMAL`` 0, ``SHED_3`` 1,
``SHED_2`` 2) moves one level per step. A signal is a number where 1.0 means "at capacity"
(utilisation, queueing time over its threshold, CPU over its threshold):

* ``signal >= shed_above`` for ``shed_after`` seconds (2 s) sheds the next level (3, then 2);
  the streak restarts, so level 2 needs another ``shed_after`` of overload;
* ``signal < restore_below`` for ``restore_after`` seconds (30 s) restores the most recently
  shed level (2, then 3); a signal between the two thresholds holds the state (hysteresis);
* flap damping: a level shed again less than ``restore_after`` after its restore doubles the
  restore delay (``restore_growth``), up to ``max_restore_after`` (300 s); a restore that holds
  for the whole delay brings it back to ``restore_after``.

``restore_below`` must leave room for the restored level's own cost: with level 2 costing 30 %
of a busy service's capacity, a restore below 0.7 lands under 1.0 and does not flap.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal, Protocol

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, DegradedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all
from floodwall._core.validate import PLAIN_INT
from floodwall._core.validate import seconds as _seconds

__all__ = [
    "SHED_ORDER",
    "AutoShedder",
    "LevelGate",
    "LevelOverride",
    "LevelSwitch",
    "Levels",
    "ShedController",
    "ShedOptions",
    "ShedState",
    "ShedStep",
]


SHED_ORDER = (3, 2)
"""Levels in the order they are shed (restored in reverse). Level 1 is never shed."""


class ShedState(enum.IntEnum):
    """How many levels are shed. Numbers are stable (metrics)."""

    NORMAL = 0
    SHED_3 = 1
    """Level 3 is shed."""
    SHED_2 = 2
    """Levels 3 and 2 are shed: only level-1 dependencies are called."""


@dataclass(frozen=True, slots=True)
class ShedOptions:
    """The controller's thresholds and delays (defaults: [Degradation][guide-degradation])."""

    shed_above: float = defaults.SHED_ABOVE
    restore_below: float = defaults.SHED_RESTORE_BELOW
    shed_after: float = defaults.SHED_AFTER
    restore_after: float = defaults.SHED_RESTORE_AFTER
    restore_growth: float = defaults.SHED_RESTORE_GROWTH
    max_restore_after: float = defaults.SHED_MAX_RESTORE_AFTER

    CHECKS: ClassVar[Checks] = {
        "shed_above": partial(validate.number, low=0.0),
        "restore_below": partial(validate.number, low=0.0),
        "shed_after": _seconds,
        "restore_after": _seconds,
        "restore_growth": partial(validate.number, low=1.0),
        "max_restore_after": _seconds,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if not self.restore_below < self.shed_above:
            raise ConfigError(
                f"restore_below must be < shed_above ({self.shed_above!r}), "
                f"got {self.restore_below!r}"
            )
        if self.max_restore_after < self.restore_after:
            raise ConfigError(
                f"max_restore_after must be >= restore_after ({self.restore_after!r}), "
                f"got {self.max_restore_after!r}"
            )


@dataclass(frozen=True, slots=True)
class ShedStep:
    """One move of the controller: ``action`` on ``level``, the ``state`` after it, the
    ``signal`` that caused it and why, in words."""

    action: Literal["shed", "restore"]
    level: int
    state: ShedState
    signal: float
    reason: str


class ShedController:
    """The pure core: ``observe(now, signal)`` → a :class:`ShedStep` or ``None``.

    No clock, no I/O, no lock (its shell serialises calls). A NaN signal (no reading) holds
    the state and interrupts both streaks.
    """

    __slots__ = ("_above_since", "_below_since", "_depth", "_restore_after", "_restored_at", "opt")

    def __init__(self, options: ShedOptions | None = None) -> None:
        if options is not None and not isinstance(options, ShedOptions):
            raise ConfigError(f"options must be a ShedOptions or None, got {options!r}")
        self.opt = options if options is not None else ShedOptions()
        self._depth = 0
        self._above_since: float | None = None
        self._below_since: float | None = None
        self._restored_at: float | None = None
        self._restore_after = self.opt.restore_after

    @property
    def state(self) -> ShedState:
        return ShedState(self._depth)

    @property
    def shed_levels(self) -> frozenset[int]:
        """The levels shed now."""
        return frozenset(SHED_ORDER[: self._depth])

    @property
    def restore_after(self) -> float:
        """The restore delay in force (grows while the controller flaps)."""
        return self._restore_after

    def observe(self, now: float, signal: float) -> ShedStep | None:
        """Feed one reading of the signal at ``now``; the step taken, if any."""
        opt = self.opt
        if self._restored_at is not None and now - self._restored_at >= self._restore_after:
            self._restored_at = None  # the last restore held: the controller is not flapping
            self._restore_after = opt.restore_after
        if math.isnan(signal) or opt.restore_below <= signal < opt.shed_above:
            self._above_since = self._below_since = None
            return None
        if signal >= opt.shed_above:
            self._below_since = None
            if self._above_since is None:
                self._above_since = now
            if self._depth < len(SHED_ORDER) and now - self._above_since >= opt.shed_after:
                return self._shed(now, signal)
            return None
        self._above_since = None
        if self._below_since is None:
            self._below_since = now
        if self._depth > 0 and now - self._below_since >= self._restore_after:
            return self._restore(now, signal)
        return None

    def _shed(self, now: float, signal: float) -> ShedStep:
        opt = self.opt
        if self._restored_at is not None and now - self._restored_at < self._restore_after:
            self._restore_after = min(
                opt.max_restore_after, self._restore_after * opt.restore_growth
            )
        self._restored_at = None  # the last restore did not hold
        level = SHED_ORDER[self._depth]
        self._depth += 1
        self._above_since = now  # the next level needs a fresh streak of overload
        reason = (
            f"signal {signal:.2f} >= {opt.shed_above:g} for {opt.shed_after:g}s: level {level} shed"
        )
        return ShedStep("shed", level, self.state, signal, reason)

    def _restore(self, now: float, signal: float) -> ShedStep:
        self._depth -= 1
        level = SHED_ORDER[self._depth]
        self._below_since = now
        self._restored_at = now
        reason = (
            f"signal {signal:.2f} < {self.opt.restore_below:g} for "
            f"{self._restore_after:g}s: level {level} restored"
        )
        return ShedStep("restore", level, self.state, signal, reason)

    def reset(self) -> None:
        """Back to ``NORMAL`` with no history (an operator's manual reset)."""
        self._depth = 0
        self._above_since = self._below_since = self._restored_at = None
        self._restore_after = self.opt.restore_after


# -- switchboards ---------------------------------------------------------------------------


class _OverrideLike(Protocol):
    @property
    def target(self) -> str: ...

    @property
    def action(self) -> str: ...

    @property
    def reason(self) -> str: ...


class LevelSwitch(Protocol):
    """What sheds levels: a :class:`floodwall.config.Registry` or a :class:`Levels`."""

    def shed(self, level: int, *, ttl: float | None = None, reason: str = "") -> None: ...

    def clear(self, target: str, action: str | None = None) -> None: ...

    def is_shed(self, level: int) -> bool: ...

    def overrides(self) -> Sequence[_OverrideLike]: ...


@dataclass(frozen=True, slots=True)
class LevelOverride:
    """A shed in force on a :class:`Levels`: ``target`` ``"level:N"``, ``action`` ``"shed"``,
    ``until`` (clock seconds, ``None``: until cleared) and ``reason``."""

    target: str
    action: str
    until: float | None
    reason: str


def _check_level(level: int) -> int:
    if isinstance(level, bool) or not isinstance(level, int) or level not in SHED_ORDER:
        raise ConfigError(f"level must be 2 or 3 (level 1 is never shed), got {level!r}")
    return level


def _any_level(level: object, *, error: type[Exception] = ConfigError) -> int:
    if isinstance(level, bool) or not isinstance(level, int) or level not in (1, 2, 3):
        raise error(f"level must be 1, 2 or 3, got {level!r}")
    return level


class Levels:
    """An in-process switchboard for dependency levels, for pipelines built in code.

    The same operations as :class:`floodwall.config.Registry` (``shed``/``clear``/``is_shed``/
    ``overrides``), so an :class:`AutoShedder` drives either. ``gate(level)`` gives the policy
    that refuses a shed level's calls. Thread-safe; ``is_shed`` is a set lookup plus one clock
    read while a TTL is pending.
    """

    def __init__(
        self, *, clock: Clock = SYSTEM_CLOCK, listeners: Iterable[EventListener] = ()
    ) -> None:
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._lock = threading.Lock()
        self._overrides: dict[int, LevelOverride] = {}
        self._shed: frozenset[int] = frozenset()
        self._next_expiry = math.inf

    def shed(self, level: int, *, ttl: float | None = None, reason: str = "") -> None:
        """Shed ``level`` (2 or 3) until :meth:`restore` or for ``ttl`` seconds."""
        _check_level(level)
        if ttl is not None:
            _seconds("ttl", ttl, positive=True)
        validate.text("reason", reason, empty=True)
        now = self.clock.monotonic()
        text = reason or f"level {level} shed by operator"
        override = LevelOverride(f"level:{level}", "shed", None if ttl is None else now + ttl, text)
        with self._lock:
            self._overrides[level] = override
            self._refresh()
        self._emit("override", f"level:{level}: shed ({text})", now)

    def restore(self, level: int) -> None:
        """Stop shedding ``level``."""
        self.clear(f"level:{_check_level(level)}")

    def clear(self, target: str, action: str | None = None) -> None:
        """End the shed on ``target`` (``"level:2"`` or ``"level:3"``)."""
        validate.text("target", target)
        if action is not None:
            validate.text("action", action)
        if action not in (None, "shed"):
            return
        with self._lock:
            ended = [lv for lv, o in self._overrides.items() if o.target == target]
            for level in ended:
                del self._overrides[level]
            self._refresh()
        for level in ended:
            self._emit("override_ended", f"level:{level}: shed", self.clock.monotonic())

    def _refresh(self) -> None:
        self._shed = frozenset(self._overrides)
        pending = [o.until for o in self._overrides.values() if o.until is not None]
        self._next_expiry = min(pending, default=math.inf)

    def _expire(self, now: float) -> None:
        with self._lock:
            due = [
                lv for lv, o in self._overrides.items() if o.until is not None and o.until <= now
            ]
            for level in due:
                del self._overrides[level]
            self._refresh()
        for level in due:
            self._emit("override_ended", f"level:{level}: shed (ttl)", now)

    def is_shed(self, level: int) -> bool:
        """Whether calls at ``level`` are shed now."""
        if level.__class__ is not PLAIN_INT:  # gates pass ints; any other query is checked
            _any_level(level, error=ValueError)
        if self._next_expiry != math.inf:
            now = self.clock.monotonic()
            if now >= self._next_expiry:
                self._expire(now)
        return level in self._shed

    @property
    def shed_levels(self) -> frozenset[int]:
        self.is_shed(0)
        return self._shed

    def overrides(self) -> list[LevelOverride]:
        """The sheds in force."""
        self.is_shed(0)
        with self._lock:
            return sorted(self._overrides.values(), key=lambda o: o.target)

    def gate(self, level: int, *, name: str | None = None) -> LevelGate:
        """A :class:`LevelGate` on this switchboard."""
        return LevelGate(self, level, name=name)

    def _emit(self, kind: str, reason: str, now: float) -> None:
        if self.listeners:
            self.listeners.emit(Event(kind, "levels", "levels", now, reason))


class LevelGate(Gate):
    """Refuse calls of a shed level with :class:`~floodwall.DegradedError` before they start.

    Put it inside whatever should answer instead (a :class:`~floodwall.Fallback`, a
    :class:`~floodwall.Cache` serving its last good value, a
    :class:`~floodwall.degrade.FallbackSource`): ``Pipeline(Fallback([]), LevelGate(levels, 3),
    Timeout(0.2))``. ``shed_calls`` counts the refusals. Level 1 is accepted and never shed.

    As a gate: ``admit`` asks the switch whether the level is shed and refuses if so; there is
    nothing to ``record``.
    """

    kind = "level_gate"

    def __init__(
        self,
        switch: LevelSwitch,
        level: int,
        *,
        name: str | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.level = _any_level(level)
        if not callable(getattr(switch, "is_shed", None)):
            raise ConfigError(f"switch must be a LevelSwitch (with is_shed), got {switch!r}")
        self.switch = switch
        self.name = f"level{level}" if name is None else validate.text("name", name)
        self.listeners = Listeners(listeners)
        self.shed_calls = 0
        """Calls refused because the level was shed."""
        clock: Clock = getattr(switch, "clock", SYSTEM_CLOCK)
        self._now = clock.monotonic

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Refuse with :class:`~floodwall.DegradedError` while the level is shed."""
        if self.level != 1 and self.switch.is_shed(self.level):
            self.shed_calls += 1
            raise DegradedError(self.name, f"dependency level {self.level} is shed", None)

    def describe(self) -> str:
        return f"LevelGate({self.name!r}, level={self.level})"


# -- the automatic controller ---------------------------------------------------------------


class AutoShedder:
    """Shed levels 3 then 2 from an overload ``signal``, through a :class:`LevelSwitch`.

    ``AutoShedder(registry, signal=floodwall.degrade.queueing_signal(dagor))``; call
    :meth:`tick` every ``interval`` seconds (or run :meth:`run_async` / :meth:`start_thread`).
    Each tick reads the signal once, feeds the :class:`ShedController`, and brings the switch
    in line with the controller's state.

    Sheds it makes carry a ``lease`` (30 s) as their TTL and are renewed every ``lease / 3``
    seconds, so a controller that dies cannot keep a level off for longer than the lease. It
    never touches a shed it did not make: a level an operator shed stays shed when the signal
    calms, and an operator's shed replacing one of its own becomes the operator's.

    A signal that raises counts in ``signal_errors`` and holds the state (the controller must
    not become the failure).
    """

    def __init__(
        self,
        switch: LevelSwitch,
        signal: Callable[[], float],
        *,
        shed_above: float = defaults.SHED_ABOVE,
        restore_below: float = defaults.SHED_RESTORE_BELOW,
        shed_after: float = defaults.SHED_AFTER,
        restore_after: float = defaults.SHED_RESTORE_AFTER,
        restore_growth: float = defaults.SHED_RESTORE_GROWTH,
        max_restore_after: float = defaults.SHED_MAX_RESTORE_AFTER,
        interval: float = defaults.SHED_INTERVAL,
        lease: float = defaults.SHED_LEASE,
        name: str = "auto_shedder",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = ShedOptions(
            shed_above, restore_below, shed_after, restore_after, restore_growth, max_restore_after
        )
        self.interval = _seconds("interval", interval, positive=True)
        self.lease = _seconds("lease", lease, positive=True)
        if self.lease <= self.interval:
            raise ConfigError(f"lease must be > interval ({interval!r}), got {lease!r}")
        if not all(callable(getattr(switch, m, None)) for m in ("shed", "clear", "is_shed")):
            raise ConfigError(
                f"switch must be a LevelSwitch (shed, clear, is_shed), got {switch!r}"
            )
        self.switch = switch
        self.signal = validate.function("signal", signal, what="a callable returning a float")
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self.core = ShedController(self.options)
        self._marker = f"[{name}] "
        self._owned: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.last_signal = math.nan
        self.sheds = 0
        self.restores = 0
        self.signal_errors = 0

    @property
    def state(self) -> ShedState:
        return self.core.state

    def tick(self) -> ShedStep | None:
        """Read the signal once, decide, and apply; the step taken, if any."""
        try:
            value = float(self.signal())
        except Exception as exc:  # noqa: BLE001 - a broken signal must not break the service
            self.signal_errors += 1
            self._emit("signal_error", f"{type(exc).__name__}: {exc}", {})
            value = math.nan
        with self._lock:
            now = self.clock.monotonic()
            self.last_signal = value
            step = self.core.observe(now, value)
            if step is not None:
                if step.action == "shed":
                    self.sheds += 1
                else:
                    self.restores += 1
            self._sync(now, step)
        if step is not None:
            kind = "level_shed" if step.action == "shed" else "level_restored"
            figures = {"level": step.level, "state": int(step.state), "signal": value}
            self._emit(kind, step.reason, figures)
        return step

    def _ours(self, level: int) -> bool:
        target = f"level:{level}"
        return any(
            o.target == target and o.action == "shed" and o.reason.startswith(self._marker)
            for o in self.switch.overrides()
        )

    def _sync(self, now: float, step: ShedStep | None) -> None:
        """Under the lock: make the switch match the controller (and renew leases)."""
        wanted = self.core.shed_levels
        for level in SHED_ORDER:
            if level in self._owned and not self._ours(level):
                del self._owned[level]  # our lease lapsed, or an operator took the level over
            if level in wanted:
                if level not in self._owned:
                    if self.switch.is_shed(level):
                        continue  # an operator's shed: theirs to end
                    self._shed(level, now, step)
                elif now - self._owned[level] >= self.lease / 3:
                    self._shed(level, now, step)
            elif level in self._owned:
                self.switch.clear(f"level:{level}", "shed")
                del self._owned[level]

    def _shed(self, level: int, now: float, step: ShedStep | None) -> None:
        why = step.reason if step is not None and step.level == level else "lease renewed"
        self.switch.shed(level, ttl=self.lease, reason=self._marker + why)
        self._owned[level] = now

    def release(self) -> None:
        """End every shed this controller made and reset it to ``NORMAL``."""
        with self._lock:
            for level in list(self._owned):
                if self._ours(level):
                    self.switch.clear(f"level:{level}", "shed")
            self._owned.clear()
            self.core.reset()

    async def run_async(self) -> None:
        """Tick every ``interval`` on the clock's async sleep, until cancelled or stopped."""
        while not self._stop.is_set():
            self.tick()
            await self.clock.async_sleep(self.interval)

    def start_thread(self) -> threading.Thread:
        """Tick in a daemon thread (for sync applications); stop with :meth:`stop`."""

        def loop() -> None:
            while not self._stop.is_set():
                self.tick()
                self._stop.wait(self.interval)

        thread = threading.Thread(target=loop, name=f"floodwall-{self.name}", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop the loop (the sheds made stay until their lease ends or :meth:`release`)."""
        self._stop.set()

    def snapshot(self) -> dict[str, Any]:
        """State and counters, for metrics and the admin API."""
        return {
            "state": self.core.state.name,
            "shed_levels": sorted(self.core.shed_levels),
            "signal": self.last_signal,
            "restore_after": self.core.restore_after,
            "sheds": self.sheds,
            "restores": self.restores,
            "signal_errors": self.signal_errors,
        }

    def _emit(self, kind: str, reason: str, figures: dict[str, Any]) -> None:
        if self.listeners:
            now = self.clock.monotonic()
            self.listeners.emit(
                Event(kind, "auto_shedder", self.name, now, reason, figures=figures)
            )

    def __repr__(self) -> str:
        return f"AutoShedder({self.name!r}, state={self.core.state.name})"
