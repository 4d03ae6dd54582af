"""The simulated world: service-time distributions, a server with workers and a queue, a
dependency behind a timeout and a bulkhead, and guards that plug real floodwall policies in.

A :class:`Server` has ``concurrency`` workers (threads, connections) and a FIFO or LIFO queue.
A job arrives, passes its guard (or is rejected at once, like an HTTP 503), waits for a worker,
works for its service time (plus a :class:`Dependency` call if there is one) and answers. The
server does not know when a client gave up: unless ``skip_expired`` is set, it still does the
work of an abandoned request, which is how an unprotected service collapses once its queue
delay passes the client timeout.

Guards adapt real policies to the server's life cycle, all on the simulation's clock:
:class:`LimiterGuard` (an :class:`~floodwall.adaptive.AdaptiveLimiter` counting queued and
running jobs, as a gRPC interceptor would), :class:`BBRGuard` (CPU = the workers' utilisation,
smoothed as in production), :class:`DagorGuard` (queueing time measured at start) and
:class:`ShedderGuard` (a :class:`~floodwall.adaptive.LoadShedder`, at arrival or at start).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from floodwall._core import validate
from floodwall._core.errors import ConfigError, OverloadedError
from floodwall.adaptive import (
    AdaptiveLimiter,
    BBRLimiter,
    LoadShedder,
    QueueingTimeAdmission,
    UpstreamLevels,
)
from floodwall.sim.engine import Simulation
from floodwall.sim.metrics import Recorder

__all__ = [
    "BBRGuard",
    "Constant",
    "DagorGuard",
    "Dependency",
    "Distribution",
    "Exponential",
    "Guard",
    "Hang",
    "Job",
    "LimiterGuard",
    "LogNormal",
    "Server",
    "ShedderGuard",
    "SimCPU",
    "Uniform",
    "distribution",
]

# -- distributions ------------------------------------------------------------------------------


class Distribution(Protocol):
    """Something to draw durations (seconds) from."""

    def sample(self, rng: random.Random) -> float: ...

    @property
    def mean(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Constant:
    value: float

    def __post_init__(self) -> None:
        validate.seconds("value", self.value)

    def sample(self, rng: random.Random) -> float:
        return self.value

    @property
    def mean(self) -> float:
        return self.value


@dataclass(frozen=True, slots=True)
class Exponential:
    mean: float

    def __post_init__(self) -> None:
        validate.seconds("mean", self.mean, positive=True)

    def sample(self, rng: random.Random) -> float:
        return rng.expovariate(1.0 / self.mean)


@dataclass(frozen=True, slots=True)
class Uniform:
    low: float
    high: float

    def __post_init__(self) -> None:
        validate.seconds("low", self.low)
        validate.seconds("high", self.high)
        if self.high < self.low:
            raise ConfigError(f"high must be >= low ({self.low!r}), got {self.high!r}")

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Log-normal with the given ``mean`` and shape ``sigma`` (concurrency-limits' example
    server draws LogNormal(3, 1) rescaled to a 20 ms mean: ``LogNormal(0.020, 1.0)``)."""

    mean: float
    sigma: float = 1.0

    def __post_init__(self) -> None:
        validate.seconds("mean", self.mean, positive=True)
        validate.number("sigma", self.sigma, 0.0)

    def sample(self, rng: random.Random) -> float:
        mu = math.log(self.mean) - self.sigma**2 / 2
        return rng.lognormvariate(mu, self.sigma)


@dataclass(frozen=True, slots=True)
class Hang:
    """``base`` most of the time; with ``probability`` the call hangs for ``duration``."""

    base: Distribution
    probability: float
    duration: float

    def __post_init__(self) -> None:
        if not callable(getattr(self.base, "sample", None)):
            raise ConfigError(f"base must be a distribution (with sample()), got {self.base!r}")
        validate.share("probability", self.probability)
        validate.seconds("duration", self.duration)

    def sample(self, rng: random.Random) -> float:
        if rng.random() < self.probability:
            return self.duration
        return self.base.sample(rng)

    @property
    def mean(self) -> float:
        return (1 - self.probability) * self.base.mean + self.probability * self.duration


def distribution(spec: Any, path: str = "distribution") -> Distribution:
    """Build a distribution from a scenario value: a number (constant seconds) or a one-key
    mapping ``{constant|exponential|uniform|lognormal|hang: {...}}``."""
    validate.text("path", path)
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return Constant(float(spec))
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ConfigError(f"{path}: expected seconds or a one-key mapping, got {spec!r}")
    ((kind, args),) = spec.items()
    args = args if isinstance(args, dict) else {"value" if kind == "constant" else "mean": args}
    try:
        if kind == "constant":
            return Constant(float(args["value"]))
        if kind == "exponential":
            return Exponential(float(args["mean"]))
        if kind == "uniform":
            return Uniform(float(args["low"]), float(args["high"]))
        if kind == "lognormal":
            return LogNormal(float(args["mean"]), float(args.get("sigma", 1.0)))
        if kind == "hang":
            base = distribution(args["base"], f"{path}.hang.base")
            return Hang(base, float(args["probability"]), float(args["duration"]))
    except KeyError as missing:
        raise ConfigError(f"{path}.{kind}: missing {missing}") from None
    raise ConfigError(f"{path}: unknown distribution {kind!r}")


# -- jobs, dependency ---------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Job:
    """One attempt sent to a server. ``respond(job, outcome)`` tells the client."""

    arrival: float
    deadline: float
    work: float
    respond: Callable[[Job, str], None]
    business: int = 0
    user: int = 0
    partition: str | None = None
    start: float = math.nan
    permit: Any = None
    answered: bool = False
    tag: Any = None
    """The client's own state for this attempt."""


@dataclass
class Dependency:
    """A downstream call made while the worker is held by a ``share`` of the jobs: ``latency``
    per call, cut at ``timeout`` (an error answer), refused at once when ``bulkhead`` has no
    token (an error answer, i.e. the fallback path: no worker held)."""

    latency: Distribution
    timeout: float | None = None
    bulkhead: AdaptiveLimiter | None = None
    share: float = 1.0
    """Fraction of jobs that make the call (the others only do their own work)."""
    calls: int = 0
    timeouts: int = 0
    refused: int = 0
    inflight: int = 0
    max_inflight: int = 0


# -- guards -------------------------------------------------------------------------------------


class Guard:
    """The server asks its guard at arrival and at start, and tells it when a job ends."""

    def on_arrival(self, job: Job, now: float) -> bool:
        return True

    def on_start(self, job: Job, now: float) -> bool:
        return True

    def on_finish(self, job: Job, now: float, delivered: bool) -> None:
        return None

    def limit(self) -> float | None:
        """A number worth plotting (the limit, the admitted share), or ``None``."""
        return None


class LimiterGuard(Guard):
    """An :class:`AdaptiveLimiter` around queue + work; a late answer is a drop sample."""

    def __init__(self, limiter: AdaptiveLimiter) -> None:
        self.limiter = limiter

    def on_arrival(self, job: Job, now: float) -> bool:
        job.permit = self.limiter.acquire(job.partition)
        return job.permit is not None

    def on_finish(self, job: Job, now: float, delivered: bool) -> None:
        if job.permit is not None:
            if delivered:
                job.permit.success()
            else:
                job.permit.dropped()

    def limit(self) -> float | None:
        return float(self.limiter.limit)


class BBRGuard(Guard):
    """A :class:`BBRLimiter` around queue + work (its CPU source should be a :class:`SimCPU`)."""

    def __init__(self, limiter: BBRLimiter) -> None:
        self.limiter = limiter

    def on_arrival(self, job: Job, now: float) -> bool:
        job.permit = self.limiter.acquire()
        return job.permit is not None

    def on_finish(self, job: Job, now: float, delivered: bool) -> None:
        if job.permit is not None:
            if delivered:
                job.permit.success()
            else:
                job.permit.dropped()

    def limit(self) -> float | None:
        return float(self.limiter.core.max_inflight(self.limiter.clock.monotonic()))


class DagorGuard(Guard):
    """DAGOR: admit by priority at arrival, learn the queueing time at start."""

    def __init__(self, admission: QueueingTimeAdmission) -> None:
        self.admission = admission

    def on_arrival(self, job: Job, now: float) -> bool:
        return self.admission.admit(now, job.business, job.user)

    def on_start(self, job: Job, now: float) -> bool:
        self.admission.on_start(now, now - job.arrival)
        return True

    def on_finish(self, job: Job, now: float, delivered: bool) -> None:
        if math.isnan(job.start):
            self.admission.on_abandon(now)  # dropped unworked (its deadline passed)
        else:
            self.admission.on_finish(now, now - job.start)

    def limit(self) -> float | None:
        return self.admission.admitted_share


class ShedderGuard(Guard):
    """A :class:`LoadShedder` deciding at arrival or (with queueing time) at start."""

    def __init__(self, shedder: LoadShedder, at: Literal["arrival", "start"] = "arrival") -> None:
        self.shedder = shedder
        self.at = at

    def _admit(self, job: Job) -> bool:
        try:
            job.permit = self.shedder.admit(
                arrived_at=job.arrival,
                partition=job.partition,
                business=job.business,
                user=job.user,
            )
        except OverloadedError:
            return False
        return True

    def on_arrival(self, job: Job, now: float) -> bool:
        return self._admit(job) if self.at == "arrival" else True

    def on_start(self, job: Job, now: float) -> bool:
        return self._admit(job) if self.at == "start" else True

    def on_finish(self, job: Job, now: float, delivered: bool) -> None:
        if job.permit is not None:
            if delivered:
                job.permit.success()
            else:
                job.permit.dropped()

    def limit(self) -> float | None:
        limiter = self.shedder.limiter
        if isinstance(limiter, AdaptiveLimiter):
            return float(limiter.limit)
        return None


# -- the server ---------------------------------------------------------------------------------


@dataclass
class Server:
    """``concurrency`` workers over a FIFO/LIFO queue (see [Overload protection][guide-overload]).

    ``queue_limit`` bounds the queue (``None``: unbounded); ``skip_expired`` drops, unworked,
    a job whose client deadline passed while it queued (deadline propagation, as gRPC does).
    """

    sim: Simulation
    concurrency: int
    recorder: Recorder
    guard: Guard = field(default_factory=Guard)
    queue_limit: int | None = None
    discipline: Literal["fifo", "lifo"] = "fifo"
    skip_expired: bool = False
    dependency: Dependency | None = None
    upstream: UpstreamLevels | None = None
    name: str = "server"
    busy: int = 0
    busy_time: float = 0.0
    _queue: deque[Job] = field(default_factory=deque)
    _since: float = 0.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency!r}")

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _account(self, now: float) -> None:
        self.busy_time += self.busy * (now - self._since)
        self._since = now

    def _answer(self, job: Job, outcome: str) -> None:
        if not job.answered:
            job.answered = True
            job.respond(job, outcome)

    def submit(self, job: Job) -> None:
        """A job arrives now."""
        now = self.sim.clock.now
        if not self.guard.on_arrival(job, now):
            self._answer(job, "rejected")
            return
        if self.queue_limit is not None and len(self._queue) >= self.queue_limit:
            self.guard.on_finish(job, now, False)
            self._answer(job, "rejected")
            return
        self._queue.append(job)
        self._dispatch()

    def _dispatch(self) -> None:
        queue, sim = self._queue, self.sim
        while queue and self.busy < self.concurrency:
            job = queue.popleft() if self.discipline == "fifo" else queue.pop()
            now = sim.clock.now
            if self.skip_expired and now >= job.deadline:
                self.guard.on_finish(job, now, False)
                continue  # the client is gone: nobody to answer
            if not self.guard.on_start(job, now):
                self._answer(job, "rejected")
                continue
            self._account(now)
            self.busy += 1
            job.start = now
            dep = self.dependency
            if dep is None or (dep.share < 1.0 and sim.rng.random() >= dep.share):
                sim.after(job.work, self._finish_ok, job)
            else:
                sim.after(job.work, self._call_dependency, job)
        self.recorder.gauge(sim.clock.now, self.busy, len(queue), self.guard.limit())

    def _call_dependency(self, job: Job) -> None:
        dep, sim = self.dependency, self.sim
        assert dep is not None
        dep.calls += 1
        token = None
        if dep.bulkhead is not None:
            token = dep.bulkhead.acquire()
            if token is None:
                dep.refused += 1
                self._finish(job, "error")
                return
        latency = dep.latency.sample(sim.rng)
        dep.inflight += 1
        dep.max_inflight = max(dep.max_inflight, dep.inflight)
        if dep.timeout is not None and latency > dep.timeout:
            dep.timeouts += 1
            sim.after(dep.timeout, self._dependency_done, (job, token, "error"))
        else:
            sim.after(latency, self._dependency_done, (job, token, "ok"))

    def _dependency_done(self, event: tuple[Job, Any, str]) -> None:
        job, token, outcome = event
        assert self.dependency is not None
        self.dependency.inflight -= 1
        if token is not None:
            if outcome == "ok":
                token.success()
            else:
                token.dropped()
        self._finish(job, outcome)

    def _finish_ok(self, job: Job) -> None:
        self._finish(job, "ok")

    def _finish(self, job: Job, outcome: str) -> None:
        now = self.sim.clock.now
        self._account(now)
        self.busy -= 1
        self.guard.on_finish(job, now, outcome == "ok" and now <= job.deadline)
        self._answer(job, outcome)
        self._dispatch()


class SimCPU:
    """A CPU source for BBR: the server's worker utilisation since the previous call."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._last = (0.0, 0.0)

    def __call__(self) -> float:
        server = self.server
        now = server.sim.clock.now
        server._account(now)
        busy_time, then = self._last
        self._last = (server.busy_time, now)
        if now <= then:
            return 0.0
        return min(1.0, (server.busy_time - busy_time) / ((now - then) * server.concurrency))
