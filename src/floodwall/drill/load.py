"""Open-loop load: arrivals on a schedule that does not wait for answers.

A closed loop (N clients, each waiting for its answer) slows down with the system under test
and hides an outage; real users keep arriving. :func:`arrivals` computes the whole schedule up
front from the scenario's profile and seed (``constant``, ``ramp`` or ``spike``; Poisson or even
gaps), bounded by the load's ``duration`` and ``max_requests``. :class:`LoadGenerator` sends each
arrival at its time, never more than ``max_in_flight`` at once (an arrival beyond that is
recorded as failed with status ``-2``, not queued), and records every answer as a
:class:`~floodwall.drill.metrics.Request`: status, latency, ``X-Degraded``, for writes the
order id it carried, and how late it left (a generator that falls behind its schedule voids the
run's comparison: :func:`~floodwall.drill.metrics.void_reason`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from floodwall.drill._record import Recorder
from floodwall.drill.metrics import Action, Request
from floodwall.drill.scenario import LoadSpec, RouteSpec
from floodwall.drill.services import REQUEST_HEADER
from floodwall.integrations._wire import DEGRADED

__all__ = ["Arrival", "LoadGenerator", "arrivals"]

NOT_SENT = -2
"""Status of an arrival the generator could not send (``max_in_flight`` reached)."""
NO_ANSWER = 0
"""Status of a request without an answer before the caller's timeout."""
CONNECTION_FAILED = -1
"""Status of a request whose connection failed."""
DEGRADED_HEADERS = (DEGRADED,)
"""A fallback answered (the one header of the integrations and the gateway)."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """Request ``id`` on ``route`` is sent ``t`` seconds after the load starts."""

    id: int
    t: float
    route: RouteSpec


def arrivals(load: LoadSpec, routes: Sequence[RouteSpec], seed: int) -> list[Arrival]:
    """The whole arrival schedule (sorted by time, ids from 1).

    Poisson arrivals of a varying rate are drawn by thinning (Lewis and Shedler, 1979): candidate
    gaps at the peak rate, each kept with probability ``rate(t) / peak``. Even arrivals step by
    ``1 / rate(t)``. Routes are drawn by ``mix`` weight (default: equal).
    """
    rng = random.Random(f"{seed}:arrivals")
    weights = [(load.mix or {}).get(r.path, 0.0 if load.mix else 1.0) for r in routes]
    peak = load.peak_rate
    out: list[Arrival] = []
    t = 0.0
    while len(out) < load.max_requests:
        if load.arrivals == "poisson":
            t += rng.expovariate(peak)
            if t >= load.duration:
                break
            if rng.random() * peak > load.rate_at(t):
                continue
        else:
            if out:
                t += 1.0 / max(load.rate_at(t), 1e-9)
            if t >= load.duration - 1e-9:  # sums of gaps drift below the exact end
                break
        route = rng.choices(routes, weights)[0]
        out.append(Arrival(len(out) + 1, t, route))
    return out


class LoadGenerator:
    """Sends ``schedule`` to ``base_url`` from ``origin`` (a ``time.monotonic()`` reading)."""

    def __init__(
        self,
        schedule: Sequence[Arrival],
        base_url: str,
        *,
        timeout: float,
        max_in_flight: int,
        recorder: Recorder,
        on_request: Callable[[Request], None] | None = None,
        observe_degraded: bool = False,
    ) -> None:
        self.schedule = schedule
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self.recorder = recorder
        self.on_request = on_request
        self.observe_degraded = observe_degraded
        """Record a degraded answer as a ``fallback`` action (an external edge reports none)."""
        self.in_flight = 0
        self.sent = 0

    async def run(self) -> None:
        """Send every arrival on time, then wait for the last answers (at most the timeout)."""
        connector = aiohttp.TCPConnector(limit=self.max_in_flight)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        tasks: set[asyncio.Task[None]] = set()
        origin = self.recorder.origin
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            for arrival in self.schedule:
                delay = origin + arrival.t - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self.in_flight >= self.max_in_flight:
                    now = self.recorder.now()
                    late = max(0.0, now - arrival.t)
                    path = arrival.route.path
                    self._record(Request(arrival.id, path, now, now, NOT_SENT, late=late))
                    continue
                task = asyncio.create_task(self._one(session, arrival))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)

    async def _one(self, session: aiohttp.ClientSession, arrival: Arrival) -> None:
        route = arrival.route
        order = f"order-{arrival.id}" if route.write else None
        body = {"order": order, "amount": 100} if order else None
        headers = {REQUEST_HEADER: str(arrival.id)}
        self.in_flight += 1
        self.sent += 1
        start = self.recorder.now()
        status, degraded = NO_ANSWER, False
        try:
            async with session.request(
                route.method, self.base_url + route.path, json=body, headers=headers
            ) as response:
                await response.read()
                status = response.status
                degraded = any(response.headers.get(h) for h in DEGRADED_HEADERS)
        except TimeoutError:
            status = NO_ANSWER
        except aiohttp.ClientError:
            status = CONNECTION_FAILED
        finally:
            self.in_flight -= 1
        end = self.recorder.now()
        if degraded and self.observe_degraded:
            for dependency in route.calls:
                self.recorder.action(Action(end, "fallback", "edge", dependency))
        late = max(0.0, start - arrival.t)
        self._record(Request(arrival.id, route.path, start, end, status, degraded, order, late))

    def _record(self, request: Request) -> None:
        self.recorder.request(request)
        if self.on_request is not None:
            self.on_request(request)
