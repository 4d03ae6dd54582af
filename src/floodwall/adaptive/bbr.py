"""BBR: shed when the CPU is hot and more is in flight than the service has shown it can pass.

Kratos' BBR limiter (``go-kratos/kratos pkg/ratelimit/bbr``, now ``go-kratos/aegis
ratelimit/bbr``), after TCP BBR and Alibaba Sentinel's system rule. Over a rolling window of
``window`` seconds in ``buckets`` buckets (10 s × 100 by default) it tracks, per bucket, the
requests that completed (*passes*) and their average RT. From the *completed* buckets (the one
being filled is left out, as in aegis) it estimates what the service sustains:

    max_pass   = the most passes in one bucket (at least 1)
    min_rt     = the lowest bucket-average RT, rounded up to ``rt_resolution`` (1 ms)
    max_inflight = round(max_pass × min_rt × buckets_per_second)

and a request is dropped when ``inflight > 1`` and ``inflight > max_inflight`` while

* the CPU usage is at or above ``cpu_threshold`` (80 %), or
* the CPU has cooled down but the last drop was at most ``cooldown`` (1 s) ago, so the limiter
  does not flap on and off with every CPU reading.

Golden traces (``bbr_test.go``): a 1 s window of 10 buckets with passes 100·(i+2) and RTs
``10i+1 … 10i+10`` ms gives ``max_inflight`` 60; with passes 100·(i+1) it gives 54, drops at 80
in flight but not at 50 when the CPU is 80 %, keeps dropping at 70 % within the cool-down and
stops once it is over.

:class:`BBR` is the pure core (``now``, in-flight and CPU passed in); :class:`BBRLimiter` is the
thread-safe shell with a clock and a CPU source (see :mod:`floodwall.adaptive.cpu`).
Per-request cost is O(1): the bucket scan runs once per bucket duration and is cached.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, ClassVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import OverloadedError, RejectedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall.adaptive.cpu import CPUSource, SmoothedCPU, default_cpu_source

__all__ = ["BBR", "BBRLimiter", "BBROptions", "BBRStats", "BBRToken"]


_floor = math.floor


@dataclass(frozen=True, slots=True)
class BBRStats:
    """A snapshot of the figures behind BBR's decision (``BBR.Stat()`` in Kratos)."""

    cpu: float
    inflight: int
    max_inflight: int
    min_rt: float
    max_pass: int


@dataclass(frozen=True, slots=True)
class BBROptions:
    """BBR's options (Kratos' defaults: 10 s in 100 buckets, 80 % CPU, 1 s cool-down, RT in
    whole milliseconds), validated once; ``retry_after`` (seconds, ``None``: none) is what
    :class:`BBRLimiter` suggests to a shed caller (the pure :class:`BBR` ignores it)."""

    window: float = defaults.BBR_WINDOW
    buckets: int = defaults.BBR_BUCKETS
    cpu_threshold: float = defaults.BBR_CPU_THRESHOLD
    cooldown: float = defaults.BBR_COOLDOWN
    rt_resolution: float = defaults.BBR_RT_RESOLUTION
    retry_after: float | None = defaults.SHED_RETRY_AFTER

    CHECKS: ClassVar[Checks] = {
        "window": partial(validate.seconds, positive=True),
        "buckets": partial(validate.count, minimum=2, maximum=defaults.MAX_SLOTS),
        "cpu_threshold": partial(validate.number, low=0.0, high=1.0, low_open=True),
        "cooldown": validate.seconds,
        "rt_resolution": validate.seconds,
        "retry_after": optional(validate.seconds),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


class BBR:
    """The pure BBR decision (see [Overload protection][guide-overload]). Not thread-safe: shells
    lock."""

    __slots__ = (
        "_cache_epoch",
        "_cached",
        "_counts",
        "_epochs",
        "_passes",
        "_per_second",
        "_sums",
        "bucket_seconds",
        "buckets",
        "cooldown",
        "cpu_threshold",
        "last_drop",
        "options",
        "rt_resolution",
    )

    def __init__(
        self,
        *,
        window: float = defaults.BBR_WINDOW,
        buckets: int = defaults.BBR_BUCKETS,
        cpu_threshold: float = defaults.BBR_CPU_THRESHOLD,
        cooldown: float = defaults.BBR_COOLDOWN,
        rt_resolution: float = defaults.BBR_RT_RESOLUTION,
        options: BBROptions | None = None,
    ) -> None:
        if options is None:
            o = BBROptions(window, buckets, cpu_threshold, cooldown, rt_resolution)
        else:
            o = validate.instance("options", options, BBROptions, "a BBROptions")
        self.options = o
        """The validated :class:`BBROptions` (``options`` given: the keywords are unused)."""
        self.buckets = o.buckets
        self.cpu_threshold = o.cpu_threshold
        self.cooldown = o.cooldown
        self.rt_resolution = o.rt_resolution
        self.bucket_seconds = o.window / self.buckets
        self._per_second = 1.0 / self.bucket_seconds
        n = self.buckets
        self._epochs = [-1] * n
        self._passes = [0] * n
        self._sums = [0.0] * n
        self._counts = [0] * n
        self._cache_epoch = -1
        self._cached = (1, 0.0, 0)
        self.last_drop: float | None = None
        """Clock reading of the last drop while hot (``None``: not dropping)."""

    def _bucket(self, now: float) -> int:
        epoch = math.floor(now * self._per_second)
        slot = epoch % self.buckets
        if self._epochs[slot] != epoch:
            self._epochs[slot] = epoch
            self._passes[slot] = 0
            self._sums[slot] = 0.0
            self._counts[slot] = 0
        return slot

    def add_pass(self, now: float, count: int = 1) -> None:
        """Count ``count`` requests that completed at ``now``."""
        self._passes[self._bucket(now)] += count

    def add_rt(self, now: float, rt: float) -> None:
        """Count one response time (seconds) measured at ``now``."""
        slot = self._bucket(now)
        self._sums[slot] += rt
        self._counts[slot] += 1

    def record(self, now: float, rt: float, passed: bool = True) -> None:
        """One request ended at ``now`` after ``rt`` seconds; ``passed`` counts it as a pass."""
        epoch = _floor(now * self._per_second)
        slot = epoch % self.buckets
        if self._epochs[slot] != epoch:
            self._bucket(now)
        if passed:
            self._passes[slot] += 1
        self._sums[slot] += rt
        self._counts[slot] += 1

    def _estimate(self, now: float) -> tuple[int, float, int]:
        """``(max_pass, min_rt, max_inflight)`` over the completed buckets, cached per bucket."""
        epoch = _floor(now * self._per_second)
        if epoch == self._cache_epoch:
            return self._cached
        oldest = epoch - self.buckets + 1
        max_pass, min_avg = 1, math.inf
        for slot, bucket_epoch in enumerate(self._epochs):
            if oldest <= bucket_epoch < epoch:
                max_pass = max(max_pass, self._passes[slot])
                if self._counts[slot]:
                    min_avg = min(min_avg, self._sums[slot] / self._counts[slot])
        resolution = self.rt_resolution
        if math.isinf(min_avg):
            min_rt = resolution or 0.0
        elif resolution:
            min_rt = max(1, math.ceil(min_avg / resolution - 1e-9)) * resolution
        else:
            min_rt = min_avg
        max_inflight = math.floor(max_pass * min_rt * self._per_second + 0.5)
        self._cache_epoch = epoch
        self._cached = (max_pass, min_rt, max_inflight)
        return self._cached

    def max_pass(self, now: float) -> int:
        return self._estimate(now)[0]

    def min_rt(self, now: float) -> float:
        return self._estimate(now)[1]

    def max_inflight(self, now: float) -> int:
        return self._estimate(now)[2]

    def should_drop(self, now: float, inflight: int, cpu: float) -> bool:
        """Decide for a request arriving at ``now`` with ``inflight`` already running."""
        if cpu < self.cpu_threshold:
            last = self.last_drop
            if last is None:
                return False
            if now - last <= self.cooldown:
                return inflight > 1 and inflight > self._estimate(now)[2]
            self.last_drop = None
            return False
        if inflight <= 1:
            return False
        cached = (
            self._cached
            if _floor(now * self._per_second) == self._cache_epoch
            else self._estimate(now)
        )
        if inflight > cached[2]:
            self.last_drop = now
            return True
        return False


class BBRToken:
    """One admitted request; close it once with success, dropped or ignore (or use ``with``)."""

    __slots__ = ("_limiter", "_open", "start")

    def __init__(self, limiter: BBRLimiter, start: float) -> None:
        self._limiter = limiter
        self.start = start
        self._open = True

    def success(self) -> bool:
        """Completed: a pass and an RT sample."""
        return self._limiter._release(self, True)

    def ignore(self) -> bool:
        """Completed with an error that says nothing about capacity: counted like a success."""
        return self._limiter._release(self, True)

    def dropped(self) -> bool:
        """Timed out or shed downstream: an RT sample, no pass."""
        return self._limiter._release(self, False)

    def __enter__(self) -> BBRToken:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(exc)

    def close(self, error: BaseException | None) -> bool:
        """Close after a call that raised ``error`` (``None``: it returned): dropped for a
        timeout or a rejection downstream, else a pass."""
        return self._limiter._release(self, not isinstance(error, TimeoutError | RejectedError))


class BBRLimiter(Gate):
    """Thread-safe BBR shell: a clock, a CPU reading, the in-flight count and tokens.

    ``cpu`` is a callable returning the (already smoothed) CPU usage in [0, 1]; by default the
    :func:`~floodwall.adaptive.cpu.default_cpu_source` smoothed by
    :class:`~floodwall.adaptive.cpu.SmoothedCPU` (0.95 every 500 ms). Tests inject a lambda.

    As a gate: ``admit`` hands out a :class:`BBRToken` (:meth:`acquire`) or raises
    :class:`~floodwall.OverloadedError`; ``record`` closes the token from the outcome
    (:meth:`BBRToken.close`).
    """

    kind = "bbr"

    def __init__(
        self,
        *,
        name: str = "bbr",
        window: float = defaults.BBR_WINDOW,
        buckets: int = defaults.BBR_BUCKETS,
        cpu_threshold: float = defaults.BBR_CPU_THRESHOLD,
        cooldown: float = defaults.BBR_COOLDOWN,
        rt_resolution: float = defaults.BBR_RT_RESOLUTION,
        cpu: CPUSource | None = None,
        retry_after: float | None = defaults.SHED_RETRY_AFTER,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = validate.text("name", name)
        self.options = BBROptions(
            window, buckets, cpu_threshold, cooldown, rt_resolution, retry_after
        )
        """The validated :class:`BBROptions`, shared with the core."""
        self.core = BBR(options=self.options)
        if cpu is not None:
            validate.function("cpu", cpu, what="a callable returning the CPU usage in [0, 1]")
        self.cpu: Callable[[], float] = cpu or SmoothedCPU(default_cpu_source(clock), clock=clock)
        self.retry_after = self.options.retry_after
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._should_drop = self.core.should_drop
        self._record = self.core.record
        self._lock = threading.Lock()
        self._inflight = 0
        self._dropped = 0

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def dropped(self) -> int:
        """Requests refused since the limiter was built."""
        return self._dropped

    def acquire(self) -> BBRToken | None:
        """A token for one request, or ``None`` when BBR sheds it."""
        now = self._now()
        cpu = self.cpu()
        with self._lock:
            inflight = self._inflight
            if not self._should_drop(now, inflight, cpu):
                self._inflight = inflight + 1
                return BBRToken(self, now)
            self._dropped += 1
        if self.listeners:
            self.listeners.emit(
                Event(
                    "rejected",
                    self.kind,
                    self.name,
                    now,
                    f"cpu {cpu:.0%} and {inflight} in flight > "
                    f"{self.core.max_inflight(now)} sustainable",
                    figures={"cpu": cpu, "inflight": inflight},
                )
            )
        return None

    def _release(self, token: BBRToken, passed: bool) -> bool:
        now = self._now()
        with self._lock:
            if not token._open:
                return False
            token._open = False
            self._inflight -= 1
            self._record(now, now - token.start, passed)
        return True

    def stats(self) -> BBRStats:
        now = self._now()
        cpu = self.cpu()
        with self._lock:
            max_pass, min_rt, max_inflight = self.core._estimate(now)
            return BBRStats(cpu, self._inflight, max_inflight, min_rt, max_pass)

    def _rejection(self) -> OverloadedError:
        return OverloadedError(self.name, "BBR: CPU overloaded", self.retry_after)

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BBRToken:
        """A token for the call, or raise :class:`~floodwall.OverloadedError`."""
        token = self.acquire()
        if token is None:
            raise self._rejection()
        return token

    def record(
        self,
        permit: BBRToken,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        """Close the token from the outcome (see :meth:`BBRToken.close`)."""
        permit.close(error)

    def describe(self) -> str:
        return f"BBRLimiter(cpu_threshold={self.core.cpu_threshold:.0%})"
