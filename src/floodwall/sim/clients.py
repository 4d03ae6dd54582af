"""Load: open-loop arrivals, closed-loop users, and fan-out callers.

* :class:`OpenLoop`: Poisson arrivals whose rate changes by :class:`Phase`; the rate does not
  care how the server is doing (the internet's traffic). Each request may be retried.
* :class:`ClosedLoop`: ``clients`` users who each send, wait for the outcome, think, and send
  again; with retries on failure they form the retry storms of the seeds.
* :class:`FanOut`: each request makes ``fanout`` sequential sub-calls to the same server and
  succeeds only if all do; user priorities come from :func:`~floodwall.adaptive.user_priority`
  (DAGOR's coherent admission) or at random per sub-call (the baseline).

Every client records one ``offered`` per attempt and one outcome per attempt (``ok``,
``rejected``, ``error`` or ``timeout``), except :class:`FanOut`, which records per request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from floodwall._core import validate
from floodwall.adaptive import AdmissionLevel, UpstreamLevels, user_priority
from floodwall.sim.engine import Simulation
from floodwall.sim.metrics import Recorder
from floodwall.sim.models import Distribution, Job, Server

__all__ = ["ClosedLoop", "FanOut", "OpenLoop", "Phase", "phase_bounds"]

USER_LEVELS = 128
"""Each request comes from a random user: a DAGOR user priority uniform over 128 levels."""


@dataclass(frozen=True, slots=True)
class Phase:
    """``duration`` seconds of arrivals at ``rate`` per second."""

    duration: float
    rate: float
    name: str = ""

    def __post_init__(self) -> None:
        validate.seconds("duration", self.duration)
        closed = isinstance(self.rate, float) and math.isnan(self.rate)
        if not closed:  # NaN: a closed loop's phase, with no arrival rate
            validate.number("rate", self.rate, 0.0)
        validate.text("name", self.name, empty=True)


def phase_bounds(phases: Sequence[Phase]) -> list[tuple[float, float, Phase]]:
    """``(start, end, phase)`` for consecutive phases starting at 0."""
    bounds, start = [], 0.0
    for phase in phases:
        bounds.append((start, start + phase.duration, phase))
        start += phase.duration
    return bounds


class _Attempts:
    """One logical request's attempts: timeout, retries, outcome."""

    __slots__ = ("attempt", "on_done", "user")

    def __init__(self, on_done: Callable[[str], None] | None, user: int) -> None:
        self.attempt = 0
        self.on_done = on_done
        self.user = user
        """DAGOR user priority (a random user's hash), the same for every retry."""


class _Sender:
    """Shared by open and closed loops: send an attempt, time it out, retry, record."""

    def __init__(
        self,
        sim: Simulation,
        server: Server,
        recorder: Recorder,
        service_time: Distribution,
        *,
        timeout: float | None,
        retries: int,
        backoff: Distribution | None,
        retry_on: tuple[str, ...],
        partitions: Sequence[tuple[str, float]] = (),
    ) -> None:
        self.sim = sim
        self.server = server
        self.recorder = recorder
        self.service_time = service_time
        self.timeout = math.inf if timeout is None else timeout
        self.retries = retries
        self.backoff = backoff
        self.retry_on = retry_on
        self.partitions = list(partitions)

    def _partition(self) -> str | None:
        if not self.partitions:
            return None
        draw = self.sim.rng.random()
        for name, weight in self.partitions:
            draw -= weight
            if draw < 0:
                return name
        return self.partitions[-1][0]

    def send(self, state: _Attempts) -> None:
        sim = self.sim
        now = sim.clock.now
        state.attempt += 1
        self.recorder.offered(now)
        job = Job(
            arrival=now,
            deadline=now + self.timeout,
            work=self.service_time.sample(sim.rng),
            respond=self._on_response,
            user=state.user,
            partition=self._partition(),
            tag=state,
        )
        if self.timeout < math.inf:
            sim.after(self.timeout, self._on_timeout, job)
        self.server.submit(job)

    def _on_response(self, job: Job, outcome: str) -> None:
        now = self.sim.clock.now
        if now > job.deadline:
            return  # the client stopped listening at its deadline
        job.deadline = -math.inf  # answered: the pending timeout event is void
        self._settle(job, outcome, now)

    def _on_timeout(self, job: Job) -> None:
        if job.deadline == -math.inf:
            return
        job.deadline = -math.inf
        self._settle(job, "timeout", self.sim.clock.now)

    def _settle(self, job: Job, outcome: str, now: float) -> None:
        self.recorder.outcome(now, outcome, now - job.arrival)
        state: _Attempts = job.tag
        if outcome != "ok" and outcome in self.retry_on and state.attempt <= self.retries:
            delay = self.backoff.sample(self.sim.rng) if self.backoff else 0.0
            self.sim.after(delay, self.send, state)
        elif state.on_done is not None:
            state.on_done(outcome)


class OpenLoop(_Sender):
    """Poisson arrivals at each phase's rate (see [Overload protection][guide-overload])."""

    def __init__(
        self,
        sim: Simulation,
        server: Server,
        recorder: Recorder,
        phases: Sequence[Phase],
        service_time: Distribution,
        *,
        timeout: float | None = None,
        retries: int = 0,
        backoff: Distribution | None = None,
        retry_on: tuple[str, ...] = ("error", "timeout"),
        partitions: Sequence[tuple[str, float]] = (),
    ) -> None:
        super().__init__(
            sim,
            server,
            recorder,
            service_time,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            retry_on=retry_on,
            partitions=partitions,
        )
        self.bounds = phase_bounds(phases)
        self.end = self.bounds[-1][1] if self.bounds else 0.0

    def start(self) -> None:
        self.sim.at(0.0, self._arrive, None)

    def _rate(self, now: float) -> tuple[float, float]:
        for start, end, phase in self.bounds:
            if start <= now < end:
                return phase.rate, end
        return 0.0, math.inf

    def _arrive(self, _: None) -> None:
        sim = self.sim
        now = sim.clock.now
        if now >= self.end:
            return
        rate, phase_end = self._rate(now)
        if rate > 0:
            self.send(_Attempts(None, sim.rng.randrange(USER_LEVELS)))
            sim.after(sim.rng.expovariate(rate), self._arrive, None)
        else:
            sim.at(phase_end, self._arrive, None)


class ClosedLoop(_Sender):
    """``clients`` users: send, wait for the outcome (with retries), think, repeat."""

    def __init__(
        self,
        sim: Simulation,
        server: Server,
        recorder: Recorder,
        clients: int,
        *,
        service_time: Distribution,
        think_time: Distribution,
        until: float,
        timeout: float | None = None,
        retries: int = 0,
        backoff: Distribution | None = None,
        retry_on: tuple[str, ...] = ("error", "timeout"),
    ) -> None:
        super().__init__(
            sim,
            server,
            recorder,
            service_time,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            retry_on=retry_on,
        )
        self.clients = clients
        self.think_time = think_time
        self.until = until

    def start(self) -> None:
        for _ in range(self.clients):
            self.sim.after(self.think_time.sample(self.sim.rng), self._begin, None)

    def _begin(self, _: None) -> None:
        if self.sim.clock.now < self.until:
            self.send(_Attempts(self._done, self.sim.rng.randrange(USER_LEVELS)))

    def _done(self, outcome: str) -> None:
        self.sim.after(self.think_time.sample(self.sim.rng), self._begin, None)


class _Request:
    __slots__ = ("calls", "sent", "user")

    def __init__(self, sent: float, user: int) -> None:
        self.sent = sent
        self.user = user
        self.calls = 0


class FanOut:
    """Requests of ``fanout`` sequential sub-calls to one server (see
    [Overload protection][guide-overload]).

    ``coherent=True`` gives every sub-call of a request the same DAGOR priority (the user's
    hashed priority); ``False`` draws a fresh one per sub-call. With ``levels`` (a callable
    returning the server's admission level), the caller sheds below-level sub-calls itself.
    """

    def __init__(
        self,
        sim: Simulation,
        server: Server,
        recorder: Recorder,
        phases: Sequence[Phase],
        service_time: Distribution,
        *,
        fanout: int,
        timeout: float | None = None,
        users: int = 100_000,
        coherent: bool = True,
        levels: Callable[[], AdmissionLevel] | None = None,
    ) -> None:
        self.sim = sim
        self.server = server
        self.recorder = recorder
        self.bounds = phase_bounds(phases)
        self.end = self.bounds[-1][1] if self.bounds else 0.0
        self.service_time = service_time
        self.fanout = fanout
        self.timeout = math.inf if timeout is None else timeout
        self.users = users
        self.coherent = coherent
        self.levels = levels
        self.upstream = UpstreamLevels() if levels is not None else None
        self.calls = 0

    def start(self) -> None:
        self.sim.at(0.0, self._arrive, None)

    def _arrive(self, _: None) -> None:
        sim = self.sim
        now = sim.clock.now
        if now >= self.end:
            return
        rate = next((p.rate for s, e, p in self.bounds if s <= now < e), 0.0)
        if rate > 0:
            self.recorder.offered(now)
            user = user_priority(sim.rng.randrange(self.users), 0)
            self._call(_Request(now, user))
            sim.after(sim.rng.expovariate(rate), self._arrive, None)

    def _call(self, request: _Request) -> None:
        sim = self.sim
        now = sim.clock.now
        user = request.user if self.coherent else sim.rng.randrange(USER_LEVELS)
        if self.upstream is not None and not self.upstream.admits(self.server.name, 0, user):
            self._end(request, "rejected")
            return
        request.calls += 1
        self.calls += 1
        job = Job(
            arrival=now,
            deadline=request.sent + self.timeout,
            work=self.service_time.sample(sim.rng),
            respond=self._on_response,
            user=user,
            tag=request,
        )
        self.server.submit(job)

    def _on_response(self, job: Job, outcome: str) -> None:
        request: _Request = job.tag
        if self.upstream is not None and self.levels is not None:
            self.upstream.update(self.server.name, self.levels())
        if self.sim.clock.now > job.deadline:
            self._end(request, "timeout")
        elif outcome != "ok":
            self._end(request, outcome)
        elif request.calls < self.fanout:
            self._call(request)
        else:
            self._end(request, "ok")

    def _end(self, request: _Request, outcome: str) -> None:
        now = self.sim.clock.now
        self.recorder.outcome(now, outcome, now - request.sent)
