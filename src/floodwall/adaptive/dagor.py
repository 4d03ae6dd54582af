"""DAGOR: detect overload by queueing time, shed by a compound priority that all hops share.

WeChat's overload control (Zhou et al., "Overload Control for Scaling WeChat Microservices",
SoCC 2018; the seeds' 3.5.2):

* **Detection.** A server is overloaded when the average *queueing time* of its requests (start
  of processing minus arrival) exceeds ``threshold`` (20 ms) over a window that closes every
  ``window`` seconds (1 s) or every ``window_requests`` requests (2 000), whichever comes first.
  Queueing time, unlike CPU or response time, is neither high on a busy-but-coping server nor
  inflated by slow downstreams.
* **Admission.** Every request carries a business priority ``B`` (0 = most important, set by the
  entry service) and a user priority ``U`` = a hash of the user id that rotates every hour over
  128 levels (:func:`user_priority`), so one user's sub-requests on every hop get the same
  verdict and no user is shed for long. The server admits a request when its compound level
  ``(B, U)`` is at or below the admission level (lexicographic order).
* **Adjustment.** The server keeps a histogram of arrivals per compound level. After an
  overloaded window it lowers the level until the admitted share falls by ``alpha`` (5 %);
  after a calm one it raises it until the share grows by ``beta`` (1 %).
* **Surges** (floodwall's addition: at 5 % a second the paper needs ~20 s to meet a sudden 3×
  step, and the backlog times everybody out meanwhile). A window whose queueing time passes
  ``surge`` × threshold (5×, 100 ms) with at least ``early_requests`` (50) starts measures the
  service rate (starts per second) and cuts once to that rate less ``alpha`` less the backlog
  (Little's law), then takes the paper's steps (repeated deep cuts would halve fan-out
  requests); until a calm window, windows close after ``early_window`` (0.1 s) once they have
  50 arrivals; the first calm window goes straight back to the measured rate less ``alpha``.
  Around the threshold (no surge) the paper's 1 s windows and 5 % / 1 % steps are unchanged.
* **The wait rule** (floodwall's addition, issue 18: a level admits a *share* of a Poisson
  stream, itself a Poisson stream, and a one-worker service fed 90 % of its capacity that way
  has a p99 near 10× its unloaded latency whatever the level does). When the server reports
  starts and ends (:meth:`~QueueingTimeAdmission.on_start`,
  :meth:`~QueueingTimeAdmission.on_finish`), an arrival is also refused when the requests
  admitted ahead of it and not yet started would take longer than ``max_wait_ratio`` (4) mean
  service times to start (``pending × interval between starts``): no admitted request waits much
  longer than four of its own service times, and the queue refills at once from the excess, so
  the worker never idles. A window in which this rule refused more than ``overflow_share`` (20 %)
  of the arrivals counts as overloaded, and as a surge: the level, which sheds whole users, takes
  the sustained excess, and the rule only the Poisson bursts. Without reported starts and ends
  the rule stays off; ``max_wait_ratio=None`` turns it off (the paper's DAGOR).
* **Collaboration.** The level rides back to callers (:attr:`QueueingTimeAdmission.level`);
  a caller holding :class:`UpstreamLevels` sheds below-level sub-requests before sending them.

Because all sub-requests of a request share ``(B, U)``, a request with fan-out *k* is admitted
or shed whole: the success rate stays near the optimum ``min(1, 1/feed)`` for every *k*, where
random shedding gives ``(1/feed)^k``.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, NamedTuple

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.validate import PLAIN_INT
from floodwall.adaptive._base import check_int, check_positive

__all__ = [
    "AdmissionLevel",
    "DagorOptions",
    "DagorPermit",
    "QueueingTimeAdmission",
    "UpstreamLevels",
    "UserPriority",
    "user_priority",
]


_LEVELS = 1 << 16
"""Priority levels a DAGOR histogram holds at most per axis (the paper uses 128 and 64)."""


_seconds = partial(validate.seconds, positive=True)
_open_share = partial(validate.number, low=0.0, high=1.0, low_open=True, high_open=True)


@dataclass(frozen=True, slots=True)
class DagorOptions:
    """A :class:`QueueingTimeAdmission`'s options (the paper's figures and floodwall's wait
    rule, :mod:`floodwall._core.defaults`), validated once.

    Times are seconds; ``early_window`` must be at most ``window``; ``alpha`` and ``beta`` are
    shares in ``(0, 1)``; ``max_wait_ratio=None`` switches the wait rule off.
    """

    threshold: float = defaults.DAGOR_QUEUE_THRESHOLD
    window: float = defaults.DAGOR_WINDOW
    window_requests: int = defaults.DAGOR_WINDOW_REQUESTS
    early_window: float = defaults.DAGOR_EARLY_WINDOW
    early_requests: int = defaults.DAGOR_EARLY_REQUESTS
    surge: float = defaults.DAGOR_SURGE
    business_levels: int = defaults.DAGOR_BUSINESS_LEVELS
    user_levels: int = defaults.DAGOR_USER_LEVELS
    alpha: float = defaults.DAGOR_ALPHA
    beta: float = defaults.DAGOR_BETA
    max_wait_ratio: float | None = defaults.DAGOR_MAX_WAIT_RATIO
    overflow_share: float = defaults.DAGOR_OVERFLOW_SHARE

    CHECKS: ClassVar[Checks] = {
        "threshold": _seconds,
        "window": _seconds,
        "window_requests": validate.count,
        "early_window": _seconds,
        "early_requests": validate.count,
        "surge": partial(validate.number, low=1.0),
        "business_levels": partial(validate.count, maximum=_LEVELS),
        "user_levels": partial(validate.count, maximum=_LEVELS),
        "alpha": _open_share,
        "beta": _open_share,
        "max_wait_ratio": optional(partial(validate.number, low=0.0, low_open=True)),
        "overflow_share": partial(validate.number, low=0.0, high=1.0, high_open=True),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.early_window > self.window:
            raise ConfigError(
                f"early_window must be <= window ({self.window!r} s), got {self.early_window!r}"
            )


class AdmissionLevel(NamedTuple):
    """A compound priority level; requests at or below it (lexicographically) are admitted."""

    business: int
    user: int


def user_priority(
    user: str | bytes | int, epoch: int, levels: int = defaults.DAGOR_USER_LEVELS
) -> int:
    """The user priority of ``user`` during rotation period ``epoch``: a stable hash (BLAKE2b,
    not Python's salted ``hash``) of both, modulo ``levels``. Every service computes the same."""
    data = user if isinstance(user, bytes) else str(user).encode()
    digest = hashlib.blake2b(b"%d:" % epoch + data, digest_size=8).digest()
    return int.from_bytes(digest, "big") % levels


class UserPriority:
    """``priority(user)`` with the period taken from wall-clock time, rotating every
    ``rotation`` seconds (1 h), so that all services agree within the hour."""

    def __init__(
        self,
        *,
        levels: int = defaults.DAGOR_USER_LEVELS,
        rotation: float = defaults.DAGOR_ROTATION,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.levels = check_int("levels", levels)
        self.rotation = check_positive("rotation", rotation)
        self.wall = wall

    def __call__(self, user: str | bytes | int) -> int:
        return user_priority(user, int(self.wall() // self.rotation), self.levels)


class DagorPermit:
    """An admitted request. DAGOR learns from queueing time only, so closing it is free."""

    __slots__ = ()

    def success(self) -> bool:
        return True

    def dropped(self) -> bool:
        return True

    def ignore(self) -> bool:
        return True


_PERMIT = DagorPermit()


class QueueingTimeAdmission:
    """DAGOR's overload detection and priority admission for one server (see the module doc).

    The pure core is :meth:`admit` (at arrival, counts the request and decides),
    :meth:`on_start` (when processing starts, with the queueing time), and, for the wait rule,
    :meth:`on_finish` (when it ends, with the service time) and :meth:`on_abandon` (an admitted
    request that will never start); all take ``now``. :meth:`acquire` combines the first two on
    ``clock`` for the load-shedding guard. Thread-safe.
    """

    kind = "dagor"

    def __init__(
        self,
        *,
        name: str = "dagor",
        threshold: float = defaults.DAGOR_QUEUE_THRESHOLD,
        window: float = defaults.DAGOR_WINDOW,
        window_requests: int = defaults.DAGOR_WINDOW_REQUESTS,
        early_window: float = defaults.DAGOR_EARLY_WINDOW,
        early_requests: int = defaults.DAGOR_EARLY_REQUESTS,
        surge: float = defaults.DAGOR_SURGE,
        business_levels: int = defaults.DAGOR_BUSINESS_LEVELS,
        user_levels: int = defaults.DAGOR_USER_LEVELS,
        alpha: float = defaults.DAGOR_ALPHA,
        beta: float = defaults.DAGOR_BETA,
        max_wait_ratio: float | None = defaults.DAGOR_MAX_WAIT_RATIO,
        overflow_share: float = defaults.DAGOR_OVERFLOW_SHARE,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = validate.text("name", name)
        self.options = o = DagorOptions(
            threshold,
            window,
            window_requests,
            early_window,
            early_requests,
            surge,
            business_levels,
            user_levels,
            alpha,
            beta,
            max_wait_ratio,
            overflow_share,
        )
        """The validated :class:`DagorOptions`, copied once into the fields below."""
        self.threshold = o.threshold
        self.window = o.window
        self.window_requests = o.window_requests
        self.early_window = o.early_window
        self.early_requests = o.early_requests
        self.business_levels = o.business_levels
        self.user_levels = o.user_levels
        self.alpha = o.alpha
        self.beta = o.beta
        self._init_wait_rule(o.max_wait_ratio, o.overflow_share)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._lock = threading.Lock()
        self._top = self.business_levels * self.user_levels - 1
        self._level = self._top
        self._histogram = [0] * (self._top + 1)
        self._window_start: float | None = None
        self._queued_total = 0.0
        self._queued_count = 0
        self._arrivals = 0
        """Arrivals in this window, admitted or not (the histogram's sum)."""
        self.overloaded = False
        """Whether the last closed window was overloaded."""
        self.last_queueing_time = 0.0
        """Average queueing time of the last closed window, seconds."""
        self.admitted = 0
        self.rejected = 0
        self.capacity = 0.0
        """Requests started per second in the last surge window (0 before any)."""
        self.surge = o.surge
        self._surge_above = self.surge * self.threshold
        self._surge = False
        """In a surge (a window's queueing past ``surge`` x threshold) and not yet calm again."""

    def _init_wait_rule(self, max_wait_ratio: float | None, overflow_share: float) -> None:
        self.max_wait_ratio = max_wait_ratio
        self.overflow_share = overflow_share
        self._pending = 0
        """Admitted at arrival and not yet started (nor abandoned)."""
        self._admitted_before = 0
        """Admitted in the previous window (``_pending`` never exceeds two windows' worth)."""
        self._window_admitted = 0
        self._interval = 0.0
        """Average seconds between starts while requests wait (1 / service rate); 0 unknown."""
        self._service = 0.0
        """Average service time (start to end), seconds; 0 unknown."""
        self._last_start = -math.inf
        self._overflowed = 0
        """Arrivals this window refused by the wait rule."""
        self.wait_refused = 0
        """Arrivals refused by the wait rule since construction (also counted in ``rejected``)."""

    # -- levels -----------------------------------------------------------------------------

    def compound(self, business: int, user: int) -> int:
        """The index of ``(business, user)`` in admission order (clamped into range)."""
        b = min(max(business, 0), self.business_levels - 1)
        u = min(max(user, 0), self.user_levels - 1)
        return b * self.user_levels + u

    @property
    def level(self) -> AdmissionLevel:
        """The current admission level, to report back to callers."""
        business, user = divmod(self._level, self.user_levels)
        return AdmissionLevel(business, user)

    @property
    def admitted_share(self) -> float:
        """Fraction of the compound levels currently admitted (a rough gauge)."""
        return (self._level + 1) / (self._top + 1)

    # -- the pure core ----------------------------------------------------------------------

    def admit(self, now: float, business: int = 0, user: int = 0) -> bool:
        """Count a request arriving at ``now`` with priority ``(business, user)``; admit it?"""
        index = self.compound(business, user)
        with self._lock:
            self._roll(now)
            self._histogram[index] += 1
            self._arrivals += 1
            if index <= self._level:
                if self._would_wait_too_long():
                    self._overflowed += 1
                    self.wait_refused += 1
                    self.rejected += 1
                    return False
                self._pending += 1
                self._window_admitted += 1
                self.admitted += 1
                return True
            self.rejected += 1
            return False

    def _would_wait_too_long(self) -> bool:
        """Under the lock: the wait rule (off until starts and ends have been measured)."""
        ratio = self.max_wait_ratio
        if ratio is None or self._interval <= 0.0 or self._service <= 0.0:
            return False
        return self._pending * self._interval > ratio * self._service

    def on_start(self, now: float, queueing_time: float) -> None:
        """An admitted request started processing at ``now`` after waiting ``queueing_time``."""
        with self._lock:
            self._roll(now)
            if self._pending:
                self._pending -= 1
            last = self._last_start
            if last < now and now - queueing_time <= last:
                # it was waiting when the previous one started: the gap is one service interval
                gap = now - last
                self._interval = gap if self._interval <= 0 else _smooth(self._interval, gap)
            self._last_start = now
            self._queued_total += max(0.0, queueing_time)
            self._queued_count += 1
            if self._queued_count >= self.window_requests:
                self._close(now)

    def on_finish(self, now: float, service_time: float) -> None:
        """A started request ended at ``now`` after ``service_time`` seconds of service."""
        if service_time > 0:
            with self._lock:
                old = self._service
                self._service = service_time if old <= 0 else _smooth(old, service_time)

    def on_abandon(self, now: float) -> None:
        """An admitted request will never start (it was dropped, or its client left, while it
        waited): it no longer counts as waiting."""
        with self._lock:
            if self._pending:
                self._pending -= 1

    def _roll(self, now: float) -> None:
        start = self._window_start
        if start is None:
            self._window_start = now
            return
        elapsed = now - start
        if elapsed >= self.window or (
            elapsed >= self.early_window
            and self._arrivals >= self.early_requests
            and (
                self._surge
                or self._queued_total > self._surge_above * self._queued_count
                or self._overflowed > self.overflow_share * self._arrivals
            )
        ):
            # early only in a surge (this window's average already past surge x threshold, or
            # a surge not yet recovered from): a steady level keeps the paper's 1 s windows and
            # its 5 % / 1 % moves, so requests with fan-out are not cut half-way needlessly
            self._close(now)

    def _close(self, now: float) -> None:
        """Under the lock: end the window, judge it, move the level."""
        count = self._queued_count
        average = self._queued_total / count if count else 0.0
        elapsed = now - self._window_start if self._window_start is not None else 0.0
        self.last_queueing_time = average
        overflowed = self._overflowed > self.overflow_share * self._arrivals
        self.overloaded = average > self.threshold or overflowed
        old = self._level
        if self.overloaded:
            entering = False
            surging = average > self._surge_above or overflowed
            if surging and count >= self.early_requests and not self._surge:
                # A surge: requests started per second while saturated are the service rate,
                # which the admitted load must fall below for the queue to drain (a window of
                # a few stragglers says nothing about the rate, so it needs early_requests).
                self._surge = entering = True
                self.capacity = count / elapsed if elapsed > 0 else self.capacity
            self._level = self._lowered(count, average, elapsed, fast=entering)
        elif self._arrivals:
            self._level = self._raised(elapsed)
            self._surge = False
        self._histogram = [0] * (self._top + 1)
        self._queued_total = 0.0
        self._queued_count = 0
        self._arrivals = 0
        # a request admitted and never reported (started nor abandoned) is forgotten when the
        # window after the next one closes: a queue holding more than two windows' arrivals
        # would have shown in the average long before
        self._pending = min(self._pending, self._window_admitted + self._admitted_before)
        self._admitted_before = self._window_admitted
        self._window_admitted = 0
        self._overflowed = 0
        self._window_start = now
        if old != self._level and self.listeners:
            self.listeners.emit(
                Event(
                    "level_changed",
                    self.kind,
                    self.name,
                    now,
                    f"average queueing time {average * 1000:.1f} ms",
                    figures={"from": old, "to": self._level, "queueing_time": average},
                )
            )

    def _level_for(self, target: float) -> int:
        """The highest level whose arrivals this window, summed from level 0, stay <= target."""
        cumulative = 0
        for index, arrivals in enumerate(self._histogram):
            cumulative += arrivals
            if cumulative > target:
                return max(0, index - 1)
        return self._top

    def _lowered(self, started: int, average: float, elapsed: float, *, fast: bool) -> int:
        histogram, level = self._histogram, self._level
        admitted = sum(histogram[: level + 1])
        if admitted == 0:
            return max(0, level - 1)
        target = admitted * (1 - self.alpha)  # the paper's step
        if fast and elapsed > 0:
            # Once per surge, far faster than the paper's 5 % per window, so that a sudden 3x
            # step is met within a second: admit what the service starts, less alpha, less the
            # backlog (Little's law: the requests queued beyond the threshold). Later windows
            # of the surge take the paper's steps again: requests with fan-out would be cut
            # half-way by repeated deep cuts.
            backlog = max(0.0, average - self.threshold) * started / elapsed
            target = min(target, started * (1 - self.alpha) - backlog)
        return min(level - 1, self._level_for(target)) if level > 0 else 0

    def _raised(self, elapsed: float) -> int:
        histogram, level = self._histogram, self._level
        if level >= self._top:
            return level
        admitted = sum(histogram[: level + 1])
        target = max(admitted * (1 + self.beta), admitted + 1)
        if self._surge and elapsed > 0:
            # Calm after a surge's cut: back to the measured service rate less alpha at once,
            # not by 1 % a window (a drained queue would otherwise leave capacity idle).
            target = max(target, self.capacity * elapsed * (1 - self.alpha))
        cumulative = admitted
        seen_above = False
        for index in range(level + 1, self._top + 1):
            if histogram[index]:
                seen_above = True
                cumulative += histogram[index]
                if cumulative >= target:
                    return index
        if not seen_above:
            return level + 1  # callers shed above our level: grow one user level at a time
        return self._top

    # -- the shell ----------------------------------------------------------------------------

    def acquire(
        self, queueing_time: float | None = None, business: int = 0, user: int = 0
    ) -> DagorPermit | None:
        """Admit a request now, recording its ``queueing_time`` when known; ``None`` = shed."""
        if business.__class__ is not PLAIN_INT or user.__class__ is not PLAIN_INT:
            validate.integer("business", business, error=ValueError)
            validate.integer("user", user, error=ValueError)
        if queueing_time is not None:
            validate.seconds("queueing_time", queueing_time, error=ValueError)
        now = self.clock.monotonic()
        if not self.admit(now, business, user):
            return None
        if queueing_time is not None:
            self.on_start(now, queueing_time)
        return _PERMIT

    def __repr__(self) -> str:
        return f"QueueingTimeAdmission(level={tuple(self.level)}, overloaded={self.overloaded})"


def _smooth(average: float, sample: float) -> float:
    """An exponential average moved a tenth of the way to ``sample``."""
    return average * 0.9 + sample * 0.1


class UpstreamLevels:
    """A caller's memory of each downstream's reported admission level, for early shedding.

    ``update(service, level)`` when a response carries a level; ``admits(service, b, u)`` before
    sending a sub-request. Unknown services admit everything.
    """

    def __init__(self, user_levels: int = defaults.DAGOR_USER_LEVELS) -> None:
        self.user_levels = validate.count("user_levels", user_levels, 1, _LEVELS)
        self._levels: dict[str, AdmissionLevel] = {}

    def update(self, service: str, level: AdmissionLevel | tuple[int, int]) -> None:
        validate.text("service", service, error=ValueError)
        business, user = level
        self._levels[service] = AdmissionLevel(
            validate.integer("level[0]", business, error=ValueError),
            validate.integer("level[1]", user, error=ValueError),
        )

    def get(self, service: str) -> AdmissionLevel | None:
        validate.text("service", service, error=ValueError)
        return self._levels.get(service)

    def admits(self, service: str, business: int, user: int) -> bool:
        level = self._levels.get(service)
        return level is None or (business, user) <= tuple(level)
