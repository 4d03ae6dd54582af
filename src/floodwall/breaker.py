"""Circuit breaker: stop calling a dependency that is failing, probe it, resume when it heals.

States and their stable metric numbers: CLOSED 0, OPEN 1, HALF_OPEN 2; operator states
FORCED_OPEN 3, FORCED_CLOSED 4, DISABLED 5.

* CLOSED: every call runs and is counted in a rolling window. The breaker trips to OPEN when
  the window holds at least ``minimum_calls`` calls AND one of: the error rate is at least
  ``failure_rate``; the share of calls strictly slower than ``slow_call_duration`` is at least
  ``slow_call_rate``; the error count is at least ``error_count``. Below ``minimum_calls``
  nothing trips, even at 100 % failures (a handful of calls proves nothing). Rates are compared
  exactly (as fractions: 7 errors of 25 calls is a rate of 0.28, not 0.2799…), and the rule is
  evaluated on the call that completes ``minimum_calls`` even when that call succeeded (F F F S S
  at ``minimum_calls=5``, ``failure_rate=0.5`` opens, as resilience4j does). A count window
  smaller than ``minimum_calls`` clamps ``minimum_calls`` to its size (resilience4j's rule:
  otherwise the breaker could never open). ``consecutive_failures=N`` opens after N errors in a
  row regardless of ``minimum_calls`` (pybreaker's ``fail_max``, gobreaker's
  ``ConsecutiveFailures``); any counted success resets the streak.
* OPEN: calls are rejected with :class:`CircuitOpenError` (``retry_after`` = time left) for
  ``open_duration`` seconds; then the next call moves the breaker to HALF_OPEN.
* HALF_OPEN: ``half_open_calls`` probes run; when all succeed the breaker closes with a fresh
  window, the first failure (or slow probe, when the slow-call rule is on) reopens it, for an
  open duration multiplied by ``open_duration_growth`` (capped at ``max_open_duration``). A probe
  that has not come back after ``probe_timeout`` seconds counts as failed, so a hung probe cannot
  wedge the breaker.
* FORCED_OPEN rejects everything; FORCED_CLOSED lets everything through and counts nothing;
  DISABLED lets everything through but keeps counting and emits ``"would_trip"`` events, for
  rolling out thresholds in shadow mode. ``reset()`` returns to CLOSED.

What counts (in the one outcome vocabulary, :class:`~floodwall.Outcomes`): an error selected
by ``ignore`` is not counted; otherwise a timeout (any ``TimeoutError``, ``TimeoutExceeded``
included) counts as a timeout and another floodwall rejection (a full bulkhead) as a rejection;
any other error selected by ``record`` (default: any ``Exception``) is a failure, and the rest
are ignored. ``record`` and ``ignore`` take exception types or an ``Outcomes`` (which also
selects by kind: ``ignore=Outcomes(kinds={"rate_limited"})``). A result for which
``failure_result(result)`` is true (an HTTP 503 response) is a failure. Ignored exceptions
(business errors, cancellation) are not counted and release a half-open probe slot.

Thread safety: the breaker's lock is held only to count and decide, never while the protected
call runs (pybreaker holds it across the call, serialising every caller).
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any, ClassVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import CircuitOpenError, ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, kwargs, optional
from floodwall._core.outcome import ANY_ERROR, NOTHING, Kind, Outcomes, kind_of
from floodwall._core.tally import Tally
from floodwall._core.window import CountWindow, TimeWindow, Window, WindowSnapshot

__all__ = ["BreakerOptions", "CircuitBreaker", "CircuitState"]


class CircuitState(enum.IntEnum):
    """A breaker's state; the numbers are stable for metrics."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2
    FORCED_OPEN = 3
    FORCED_CLOSED = 4
    DISABLED = 5


_CLOSED = CircuitState.CLOSED
_OPEN = CircuitState.OPEN
_HALF_OPEN = CircuitState.HALF_OPEN
_FORCED_OPEN = CircuitState.FORCED_OPEN
_FORCED_CLOSED = CircuitState.FORCED_CLOSED
_DISABLED = CircuitState.DISABLED
_SUCCESS = Kind.SUCCESS
_FAILURE = Kind.FAILURE
_INF = float("inf")
_REJECTED = -1
"""``acquire`` result meaning "refused"; permits are generation numbers >= 0."""


def _ratio(rate: float | None) -> tuple[int, int]:
    """``rate`` as an exact ``(numerator, denominator)``: the decimal the user wrote, so that
    ``errors * den >= num * calls`` is integer arithmetic (0.28 is 7/25, not 0.28000000000000003).
    ``None`` gives a ratio no count reaches."""
    if rate is None:
        return 1, 0
    exact = Fraction(repr(rate))
    return exact.numerator, exact.denominator


def _rate(name: str, value: object) -> float:
    return validate.number(name, value, 0.0, 1.0, low_open=True)


@dataclass(frozen=True, slots=True)
class BreakerOptions:
    """A circuit breaker's options, validated once and replaced whole (never field by field).

    Defaults (Hystrix's, :mod:`floodwall._core.defaults`) and meanings: see
    :class:`CircuitBreaker`. ``record`` and ``ignore`` take exception types or an
    :class:`~floodwall.Outcomes` and are kept as ``Outcomes``. A count window smaller than
    ``minimum_calls`` clamps it (resilience4j's rule: otherwise the breaker could never open).
    ``failure_ratio`` and ``slow_ratio`` are derived: the rates as exact fractions.
    """

    failure_rate: float | None = defaults.BREAKER_FAILURE_RATE
    minimum_calls: int = defaults.BREAKER_MINIMUM_CALLS
    slow_call_rate: float | None = None
    slow_call_duration: float | None = None
    error_count: int | None = None
    consecutive_failures: int | None = None
    window: float = defaults.BREAKER_WINDOW
    buckets: int = defaults.BREAKER_BUCKETS
    window_calls: int | None = None
    open_duration: float = defaults.BREAKER_OPEN_DURATION
    open_duration_growth: float = defaults.BREAKER_OPEN_DURATION_GROWTH
    max_open_duration: float = defaults.BREAKER_MAX_OPEN_DURATION
    half_open_calls: int = defaults.BREAKER_HALF_OPEN_CALLS
    probe_timeout: float = defaults.BREAKER_PROBE_TIMEOUT
    record: Outcomes = ANY_ERROR
    ignore: Outcomes = NOTHING
    failure_result: Callable[[Any], bool] | None = None
    failure_ratio: tuple[int, int] = field(init=False, repr=False, compare=False)
    slow_ratio: tuple[int, int] = field(init=False, repr=False, compare=False)

    CHECKS: ClassVar[Checks] = {
        "failure_rate": optional(_rate),
        "minimum_calls": validate.count,
        "slow_call_rate": optional(_rate),
        "slow_call_duration": optional(partial(validate.seconds, positive=True)),
        "error_count": optional(validate.count),
        "consecutive_failures": optional(validate.count),
        "window": partial(validate.seconds, positive=True),
        "buckets": partial(validate.count, maximum=defaults.MAX_SLOTS),
        "window_calls": optional(partial(validate.count, maximum=defaults.MAX_SLOTS)),
        "open_duration": partial(validate.seconds, positive=True),
        "open_duration_growth": partial(validate.number, low=1.0),
        "max_open_duration": partial(validate.seconds, positive=True),
        "half_open_calls": validate.count,
        "probe_timeout": partial(validate.seconds, positive=True),
        "record": Outcomes.of,
        "ignore": Outcomes.of,
        "failure_result": optional(partial(validate.function, what="a predicate on the result")),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.slow_call_rate is not None and self.slow_call_duration is None:
            raise ConfigError(
                f"slow_call_rate={self.slow_call_rate!r} needs slow_call_duration (seconds), "
                "got None"
            )
        if (
            self.failure_rate is None
            and self.slow_call_rate is None
            and self.error_count is None
            and self.consecutive_failures is None
        ):
            raise ConfigError(
                "at least one of failure_rate, slow_call_rate, error_count, consecutive_failures"
                " must be set, got none"
            )
        if self.max_open_duration < self.open_duration:
            raise ConfigError(
                f"max_open_duration must be >= open_duration ({self.open_duration!r}), "
                f"got {self.max_open_duration!r}"
            )
        if self.window_calls is not None and self.minimum_calls > self.window_calls:
            object.__setattr__(self, "minimum_calls", self.window_calls)
        object.__setattr__(self, "failure_ratio", _ratio(self.failure_rate))
        object.__setattr__(self, "slow_ratio", _ratio(self.slow_call_rate))

    def window_shape(self) -> tuple[float, int, int | None, float]:
        """What the rolling window is built from (a change means a new, empty window)."""
        slow = self.slow_call_duration if self.slow_call_duration is not None else _INF
        return self.window, self.buckets, self.window_calls, slow

    def new_window(self) -> Window:
        """An empty rolling window of this shape."""
        window, buckets, calls, slow = self.window_shape()
        if calls is not None:
            return CountWindow(calls, slow_call_duration=slow)
        return TimeWindow(buckets, window / buckets, slow_call_duration=slow)


def _span(options: BreakerOptions) -> str:
    if options.window_calls is not None:
        return f"the last {options.window_calls} calls"
    return f"{options.window:g}s"


class CircuitBreaker(Gate):
    """A circuit breaker over a rolling window ([Circuit breaker][guide-circuit-breaker]).

    Defaults (Hystrix's): ``window=10`` s in ``buckets=10``, ``minimum_calls=20``,
    ``failure_rate=0.5``, ``open_duration=5`` s, ``half_open_calls=1``. Pass ``window_calls=N``
    for a count-based window of the last N calls instead.

    Use it as a decorator (``@breaker``), with ``breaker.call(fn, ...)`` or
    ``await breaker.call_async(fn, ...)``, or inside a :class:`~floodwall.Pipeline`. The pure
    core is :meth:`acquire` / :meth:`on_outcome`, fed by the caller's clock readings.
    """

    kind = "circuit_breaker"

    def __init__(
        self,
        name: str = "circuit_breaker",
        *,
        failure_rate: float | None = defaults.BREAKER_FAILURE_RATE,
        minimum_calls: int = defaults.BREAKER_MINIMUM_CALLS,
        slow_call_rate: float | None = None,
        slow_call_duration: float | None = None,
        error_count: int | None = None,
        consecutive_failures: int | None = None,
        window: float = defaults.BREAKER_WINDOW,
        buckets: int = defaults.BREAKER_BUCKETS,
        window_calls: int | None = None,
        open_duration: float = defaults.BREAKER_OPEN_DURATION,
        open_duration_growth: float = defaults.BREAKER_OPEN_DURATION_GROWTH,
        max_open_duration: float = defaults.BREAKER_MAX_OPEN_DURATION,
        half_open_calls: int = defaults.BREAKER_HALF_OPEN_CALLS,
        probe_timeout: float = defaults.BREAKER_PROBE_TIMEOUT,
        record: type[BaseException] | tuple[type[BaseException], ...] | Outcomes = Exception,
        ignore: type[BaseException] | tuple[type[BaseException], ...] | Outcomes = (),
        failure_result: Callable[[Any], bool] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = validate.text("name", name)
        self.options = BreakerOptions(
            failure_rate=failure_rate,
            minimum_calls=minimum_calls,
            slow_call_rate=slow_call_rate,
            slow_call_duration=slow_call_duration,
            error_count=error_count,
            consecutive_failures=consecutive_failures,
            window=window,
            buckets=buckets,
            window_calls=window_calls,
            open_duration=open_duration,
            open_duration_growth=open_duration_growth,
            max_open_duration=max_open_duration,
            half_open_calls=half_open_calls,
            probe_timeout=probe_timeout,
            record=record,  # type: ignore[arg-type]  # normalised to Outcomes by its check
            ignore=ignore,  # type: ignore[arg-type]
            failure_result=failure_result,
        )
        """The options in force; :meth:`reconfigure` replaces the whole object at once."""
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._failure_result = self.options.failure_result  # the success path's one read
        self._window: Window = self.options.new_window()
        self._window_shape = self.options.window_shape()
        self._streak = 0  # errors in a row while CLOSED/DISABLED (``consecutive_failures``)
        # armed: a success must be counted under the lock, as it may complete minimum_calls
        # after errors or end an error streak; while armed, the lane is closed
        self._armed = False
        self._lock = threading.Lock()
        self._now = clock.monotonic
        self._state = _CLOSED
        self._gen = 0
        self._changed_at = clock.monotonic()
        self._open_for = self.options.open_duration
        self._open_until = _INF
        self._probes = 0
        self._probe_successes = 0
        self._rejections = Tally()
        self.transitions: dict[str, int] = {}
        """State changes since the breaker was built, by the state entered (for metrics)."""
        self._would_trip = False
        self._set_lane()

    # -- the pure core ----------------------------------------------------------------------

    def acquire(self, now: float) -> int:
        """Ask to run one call at ``now``; return a permit (>= 0) or -1 when refused.

        The permit is handed back to :meth:`on_outcome`. OPEN turns into HALF_OPEN here once
        the open duration has passed.
        """
        state = self._state
        if state is _CLOSED or state is _DISABLED or state is _FORCED_CLOSED:
            return self._gen
        events: list[Event] = []
        with self._lock:
            permit = self._acquire_locked(now, events)
        if events:
            self._emit(events)
        return permit

    def _acquire_locked(self, now: float, events: list[Event]) -> int:
        state = self._state
        if state is _OPEN:
            if now < self._open_until:
                self._rejections.add()
                return _REJECTED
            self._transition(_HALF_OPEN, now, f"open for {self._open_for:g}s", events)
            state = _HALF_OPEN
        if state is _HALF_OPEN:
            options = self.options
            if self._probes < options.half_open_calls:
                self._probes += 1
                return self._gen
            if now - self._changed_at >= options.probe_timeout:
                self._reopen(now, f"probe not back within {options.probe_timeout:g}s", events)
            self._rejections.add()
            return _REJECTED
        if state is _FORCED_OPEN:
            self._rejections.add()
            return _REJECTED
        return self._gen

    def on_outcome(self, permit: int, now: float, kind: Kind, duration: float) -> None:
        """Record how the call holding ``permit`` ended: ``kind`` at ``now`` after ``duration``.

        Thresholds are judged on every call counted under the lock; the lock-free path takes
        only fast successes that cannot cross one (it is off while a success could complete
        ``minimum_calls`` after errors, or end an error streak). Outcomes of calls admitted
        before the last state change are dropped: they describe the dependency as it was, not
        as the current state is testing it.
        """
        lane = self.lane
        if kind == 0 and lane is not None and permit == lane[0] and lane[1](now, duration):
            return  # the hot path: a fast success, counted lock-free
        events: list[Event] = []
        with self._lock:
            if permit != self._gen:
                return
            state = self._state
            if state is _HALF_OPEN:
                self._on_probe(now, kind, duration, events)
            elif state is _CLOSED or state is _DISABLED:
                self._count_closed(now, kind, duration, events)
        if events:
            self._emit(events)

    def _count_closed(self, now: float, kind: Kind, duration: float, events: list[Event]) -> None:
        """Count a CLOSED (or DISABLED) outcome and apply the trip rules (lock held)."""
        if kind > 3:
            return  # ignored: neither counted nor ending a streak
        self._window.record(now, kind, duration)
        if self._would_trip and self._state is _DISABLED:
            return
        reason = None
        if kind:
            self._streak += 1
            limit = self.options.consecutive_failures
            if limit is not None and self._streak >= limit:
                reason = f"{self._streak} consecutive errors >= {limit}"
        else:
            self._streak = 0
        if reason is None:
            # every locked count is judged: the lock-free path only takes fast successes in the
            # current bucket while unarmed, and those cannot cross a threshold
            reason = self._trip_reason(self._window.totals(), self.options)
        if reason is not None:
            self._on_threshold(now, reason, events)
        elif self._state is _CLOSED or self._state is _DISABLED:
            self._arm(self._streak > 0 or self._short_of_minimum())

    def _short_of_minimum(self) -> bool:
        """Errors in a window still short of ``minimum_calls``: a success may complete it."""
        calls, failures, timeouts, rejections, slow = self._window.totals()
        minimum = self.options.minimum_calls
        return calls < minimum and (failures + timeouts + rejections + slow) > 0

    def _arm(self, armed: bool) -> None:
        """Route successes through the lock (armed) or the lock-free path (lock held)."""
        if armed != self._armed:
            self._armed = armed
            self._set_lane()

    def _set_lane(self) -> None:
        """Open the lane (:attr:`~floodwall._core.admission.Gate.lane`) while CLOSED, unarmed and
        without ``failure_result``: ``(generation, the window's lock-free success count)``;
        close it otherwise (lock held, or the breaker not yet shared)."""
        if self._state is _CLOSED and not self._armed and self._failure_result is None:
            window = self._window
            self.lane = (self._gen, window.add_success, window.add_success_in)
        else:
            self.lane = None

    def _on_probe(self, now: float, kind: Kind, duration: float, events: list[Event]) -> None:
        options = self.options
        threshold = options.slow_call_duration
        slow = threshold is not None and duration > threshold
        if kind is Kind.IGNORED:
            self._probes -= 1
        elif kind or (slow and options.slow_call_rate is not None):
            what = "slow" if not kind else kind.name.lower()
            self._reopen(now, f"half-open probe ended {what} after {duration:.3f}s", events)
        else:
            self._probe_successes += 1
            if self._probe_successes >= options.half_open_calls:
                self._open_for = options.open_duration
                self._transition(
                    _CLOSED, now, f"{self._probe_successes} half-open probe(s) succeeded", events
                )

    @staticmethod
    def _trip_reason(totals: tuple[int, int, int, int, int], o: BreakerOptions) -> str | None:
        """Why the figures trip the breaker under options ``o``, or None (lock held)."""
        calls, failures, timeouts, rejections, slow = totals
        if calls < o.minimum_calls:
            return None
        errors = failures + timeouts + rejections
        num, den = o.failure_ratio
        if errors * den >= num * calls:
            return (
                f"failure rate {errors / calls:.2f} >= {o.failure_rate:.2f} over {calls} calls"
                f" in {_span(o)}"
            )
        num, den = o.slow_ratio
        if slow * den >= num * calls:
            return (
                f"slow-call rate {slow / calls:.2f} >= {o.slow_call_rate:.2f} "
                f"(calls > {o.slow_call_duration:g}s) over {calls} calls in {_span(o)}"
            )
        if o.error_count is not None and errors >= o.error_count:
            return f"error count {errors} >= {o.error_count} over {calls} calls in {_span(o)}"
        return None

    def _on_threshold(self, now: float, reason: str, events: list[Event]) -> None:
        if self._state is _CLOSED:
            self._open_for = self.options.open_duration
            self._transition(_OPEN, now, reason, events)
        elif self._state is _DISABLED and not self._would_trip:
            self._would_trip = True
            events.append(self._event("would_trip", now, reason))

    def _reopen(self, now: float, reason: str, events: list[Event]) -> None:
        options = self.options
        grown = self._open_for * options.open_duration_growth
        self._open_for = min(grown, options.max_open_duration)
        self._transition(_OPEN, now, f"{reason}; open for {self._open_for:g}s", events)

    def _transition(
        self, to: CircuitState, now: float, reason: str, events: list[Event] | None
    ) -> None:
        """Change state (lock held): new generation, fresh probe and window bookkeeping."""
        before = self._state
        figures = self._figures(now)
        self.lane = None  # closed while the state changes; _set_lane below reopens it
        self._state = to
        self._gen += 1
        self._changed_at = now
        self._open_until = now + self._open_for if to is _OPEN else _INF
        self._probes = 0
        self._probe_successes = 0
        self._would_trip = False
        self._streak = 0
        self._armed = False
        self._set_lane()
        if to is _CLOSED or to is _DISABLED or to is _HALF_OPEN:
            self._window.reset()
        self.transitions[to.name] = self.transitions.get(to.name, 0) + 1
        if events is not None and self.listeners:
            events.append(
                Event(
                    kind="state_change",
                    source=self.kind,
                    name=self.name,
                    time=now,
                    reason=reason,
                    from_state=before.name,
                    to_state=to.name,
                    figures=figures,
                )
            )

    def _figures(self, now: float) -> dict[str, Any]:
        snap = self._window.snapshot(now)
        return {
            "calls": snap.calls,
            "errors": snap.errors,
            "failure_rate": snap.failure_rate,
            "slow_calls": snap.slow_calls,
            "slow_call_rate": snap.slow_call_rate,
            "open_duration": self._open_for,
        }

    def _event(self, kind: str, now: float, reason: str) -> Event:
        return Event(kind=kind, source=self.kind, name=self.name, time=now, reason=reason)

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            self.listeners.emit(event)

    def classify(self, exc: BaseException) -> Kind:
        """How an exception counts: ignored, timeout, rejection or failure."""
        options = self.options
        if options.ignore.error(exc):
            return Kind.IGNORED
        kind = kind_of(exc)
        if kind is not _FAILURE or options.record.error(exc):
            return kind
        return Kind.IGNORED

    def retry_after(self, now: float) -> float | None:
        """Seconds until an OPEN breaker lets a probe through; ``None`` when unknown."""
        if self._state is _OPEN:
            return max(0.0, self._open_until - now)
        return None

    def rejection(self, now: float) -> CircuitOpenError:
        """The error for a call refused at ``now``."""
        state = self._state
        retry_after = self._open_until - now if state is _OPEN else None
        return CircuitOpenError(self.name, state, retry_after)

    # -- the admission hooks (the drivers run them around each call) -------------------------

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """A permit (the generation) for a call at ``now``, or raise :class:`CircuitOpenError`.

        CLOSED admits without the lock, and so does OPEN's refusal: rejecting is the hot path
        of an outage. Every other state goes through :meth:`acquire`.
        """
        state = self._state
        if state is _CLOSED:
            return self._gen
        if state is _OPEN and now < (until := self._open_until) < _INF:
            # read once: a concurrent move to HALF_OPEN sets it to inf (then acquire decides)
            self._rejections.add()
            raise CircuitOpenError(self.name, state, until - now)
        if state is _FORCED_OPEN:
            self._rejections.add()
            raise CircuitOpenError(self.name, state, None)
        permit = self.acquire(now)
        if permit < 0:
            raise self.rejection(now)
        return permit

    def record(
        self,
        permit: int,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        """Count how the call ended; a fast success while CLOSED is two lock-free bumps."""
        if error is not None:
            self.on_outcome(permit, now, self.classify(error), duration)
        elif self._failure_result is not None and self._failure_result(result):
            self.on_outcome(permit, now, _FAILURE, duration)
        else:
            self.on_outcome(permit, now, _SUCCESS, duration)

    # -- operators and observers ------------------------------------------------------------

    @property
    def state(self) -> CircuitState:
        """The current state; an OPEN breaker whose open time is over reads as HALF_OPEN."""
        if self._state is _OPEN and self._now() >= self._open_until:
            events: list[Event] = []
            with self._lock:
                now = self._now()
                if self._state is _OPEN and now >= self._open_until:
                    self._transition(_HALF_OPEN, now, f"open for {self._open_for:g}s", events)
            self._emit(events)
        return self._state

    def metrics(self) -> WindowSnapshot:
        """The rolling window's figures now (calls, error and slow-call rates, p50/p99)."""
        with self._lock:
            return self._window.snapshot(self._now())

    @property
    def rejected(self) -> int:
        """Calls refused since the breaker was built."""
        return self._rejections.value

    def force_open(self, reason: str = "forced open by operator") -> None:
        """Reject every call until :meth:`reset` or another manual state."""
        self._manual(_FORCED_OPEN, reason)

    def trip(self, reason: str) -> None:
        """Open now as the thresholds would (CLOSED only; DISABLED says ``would_trip``): for a
        caller that knows one failure proves the dependency down, a store call that timed out."""
        validate.text("reason", reason, error=ValueError)
        events: list[Event] = []
        with self._lock:
            self._on_threshold(self._now(), reason, events)
        self._emit(events)

    def force_closed(self, reason: str = "forced closed by operator") -> None:
        """Let every call through, counting nothing, until :meth:`reset`."""
        self._manual(_FORCED_CLOSED, reason)

    def disable(self, reason: str = "disabled by operator") -> None:
        """Let every call through but keep counting (shadow mode: ``would_trip`` events)."""
        self._manual(_DISABLED, reason)

    def reset(self, reason: str = "reset by operator") -> None:
        """Back to CLOSED with an empty window and the base open duration."""
        self._open_for = self.options.open_duration
        self._manual(_CLOSED, reason)

    def _manual(self, to: CircuitState, reason: str) -> None:
        validate.text("reason", reason, error=ValueError)
        events: list[Event] = []
        with self._lock:
            self._transition(to, self._now(), reason, events)
        self._emit(events)

    def reconfigure(self, options: BreakerOptions | None = None, /, **changes: Any) -> None:
        """Change options live (a config reload), keeping the state and the counts.

        ``options`` replaces the options whole; keyword ``changes`` apply over ``options`` (or
        over the options in force). The new options are validated first; on a bad value nothing
        changes and :class:`ConfigError` says why. They are swapped in with one assignment
        under the lock, so a reader in another thread sees the old options or the new ones,
        never a mix, and every decision judges by one of them. The window keeps its counts
        unless its shape (``window``, ``buckets``, ``window_calls``, ``slow_call_duration``)
        changes, in which case it starts empty; the state, the open timer and half-open probes
        are kept either way.
        """
        base = self.options if options is None else options
        if not isinstance(base, BreakerOptions):
            raise ConfigError(f"options must be a BreakerOptions, got {base!r}")
        unknown = set(changes) - set(kwargs(base))
        if unknown:
            raise ConfigError(f"unknown circuit breaker option(s) {sorted(unknown)}")
        fresh = dataclasses.replace(base, **changes) if changes else base
        shape = fresh.window_shape()
        with self._lock:
            if shape != self._window_shape:
                self._window = fresh.new_window()
                self._window_shape = shape
                self._streak = 0
                self._armed = False
            self._failure_result = fresh.failure_result
            self.options = fresh
            self._set_lane()

    def describe(self) -> str:
        o = self.options
        rules = []
        if o.failure_rate is not None:
            rules.append(f"failure_rate={o.failure_rate:g}")
        if o.slow_call_rate is not None:
            rules.append(f"slow_call_rate={o.slow_call_rate:g}@{o.slow_call_duration:g}s")
        if o.error_count is not None:
            rules.append(f"error_count={o.error_count}")
        if o.consecutive_failures is not None:
            rules.append(f"consecutive_failures={o.consecutive_failures}")
        return (
            f"CircuitBreaker({self.name!r}, {', '.join(rules)}, minimum_calls={o.minimum_calls},"
            f" window={_span(o)}, open_duration={o.open_duration:g}s)"
        )
