"""A running service in a drill: the drill's side of a :class:`~floodwall.drill.agent.DrillAgent`.

:class:`RemoteService` stands where a :class:`~floodwall.drill.services.MockService` would: the
drill does not start it, it checks that its agent answers, hands it its faults when the run
starts (``POST /_drill/start``: the agent's t = 0), asks how many calls it has in flight while
draining, and at the end reads its log (``GET /_drill/log``) into the run's recorder.

**One time base.** The agent counts from the moment it took ``start``; the drill's origin is
set right after every agent answered. The agent's t = 0 is taken as the midpoint of the
``start`` round trip (on loopback: well under a millisecond off), and its times are shifted by
that midpoint's distance to the drill's origin.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from floodwall.drill._record import Recorder
from floodwall.drill.agent import PREFIX
from floodwall.drill.faults import fault_wire
from floodwall.drill.metrics import Action, Call
from floodwall.drill.scenario import FaultSpec, ServiceSpec

__all__ = ["AgentError", "RemoteService"]

TIMEOUT = 5.0
"""Seconds a control call to an agent may take."""


class AgentError(RuntimeError):
    """A running service's drill agent did not answer as expected."""


class RemoteService:
    """A running service reached through its drill agent (see [Chaos drills][guide-drills])."""

    def __init__(self, name: str, spec: ServiceSpec) -> None:
        if spec.url is None:
            raise ValueError(f"service {name!r} has no url: it is a mock service")
        self.name = name
        self.url = spec.url
        self.agent_origin = 0.0
        """The agent's t = 0 as a ``time.monotonic()`` reading of this process."""
        self._session: aiohttp.ClientSession | None = None

    async def _call(self, method: str, path: str, body: object = None) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        url = self.url + PREFIX + path
        try:
            async with self._session.request(method, url, json=body) as answer:
                text = await answer.text()
                if answer.status == 404:
                    raise AgentError(
                        f"{self.name}: no drill agent answers at {url}: wrap the app in a "
                        "DrillAgent and allow it (FLOODWALL_CHAOS=1 or allow=True)"
                    )
                if answer.status != 200:
                    raise AgentError(f"{self.name}: {url} answered {answer.status}: {text[:300]}")
                return await answer.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise AgentError(f"{self.name}: {method} {url} failed: {reason}") from exc

    async def start(self) -> str:
        """Check that the agent answers; returns the service's URL."""
        health = await self._call("GET", "/health")
        if health.get("service") != self.name:
            raise AgentError(
                f"{self.url} is the drill agent of {health.get('service')!r}, not {self.name!r}"
            )
        return self.url

    async def begin(self, faults: Sequence[tuple[int, FaultSpec]], seed: int) -> None:
        """Start the agent's log and schedule its faults (``(index, fault)`` pairs)."""
        body = {"seed": seed, "faults": [{"index": i, "spec": fault_wire(f)} for i, f in faults]}
        sent = time.monotonic()
        await self._call("POST", "/start", body)
        self.agent_origin = (sent + time.monotonic()) / 2

    async def in_flight(self) -> int:
        health = await self._call("GET", "/health")
        return int(health.get("in_flight", 0))

    async def collect(self, recorder: Recorder) -> None:
        """Read the agent's calls and actions into ``recorder``, on its time base."""
        log = await self._call("GET", "/log")
        shift = self.agent_origin - recorder.origin
        for start, end, status, request in log.get("calls", []):
            ended = None if end is None else end + shift
            recorder.imported(Call(self.name, start + shift, ended, int(status), request))
        for at, kind, source, name, to_state, reason in log.get("actions", []):
            action = Action(at + shift, kind, f"{self.name}/{source}", name, to_state, reason)
            recorder.action(action)

    async def stop(self) -> None:
        """Drop the agent's faults and log (the service keeps running: it is not ours)."""
        if self._session is None:
            return
        try:
            await self._call("POST", "/stop")
        except AgentError:
            pass  # the service went away first: nothing left to drop
        finally:
            await self._session.close()
            self._session = None
