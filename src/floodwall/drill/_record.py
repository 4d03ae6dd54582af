"""The raw event log as a run writes it: times in seconds since the run's origin.

One :class:`Recorder` per run, shared by the mock services, the edge, the load and the sampler
(all on one event loop, so appending needs no lock). Calls are recorded when they start and
completed when they end; a call still open when the run stops has no end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from floodwall._core.events import Event
from floodwall.drill.metrics import Action, Call, Request, Sample

__all__ = ["Recorder"]


@dataclass
class _OpenCall:
    service: str
    start: float
    request: int | None
    end: float | None = None
    status: int = 0


@dataclass
class Recorder:
    """Collects a run's events; ``origin`` is the ``time.monotonic()`` reading of t = 0."""

    origin: float = field(default_factory=time.monotonic)
    requests: list[Request] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    _calls: list[_OpenCall] = field(default_factory=list)
    _open: int = 0

    def now(self) -> float:
        """Seconds since the origin."""
        return time.monotonic() - self.origin

    def at(self, monotonic: float) -> float:
        """A ``time.monotonic()`` reading as seconds since the origin."""
        return monotonic - self.origin

    def call_started(self, service: str, request: int | None) -> int:
        self._calls.append(_OpenCall(service, self.now(), request))
        self._open += 1
        return len(self._calls) - 1

    def call_ended(self, index: int, status: int) -> None:
        call = self._calls[index]
        call.end = self.now()
        call.status = status
        self._open -= 1

    def imported(self, call: Call) -> None:
        """A finished call another process recorded (a running service's drill agent)."""
        self._calls.append(_OpenCall(call.service, call.start, call.request, call.end, call.status))

    def request(self, request: Request) -> None:
        self.requests.append(request)

    def on_event(self, event: Event) -> None:
        """A floodwall listener: the edge's policies report their actions here."""
        if event.kind == "attempt":
            return  # one per call through a Retry: the calls at the services say it better
        self.actions.append(
            Action(
                self.at(event.time),
                event.kind,
                event.source,
                event.name,
                event.to_state,
                event.reason,
            )
        )

    def action(self, action: Action) -> None:
        self.actions.append(action)

    def sample(self, sample: Sample) -> None:
        self.samples.append(sample)

    @property
    def in_flight_calls(self) -> int:
        """Calls that reached a service and have not ended."""
        return self._open

    def calls(self) -> list[Call]:
        return [Call(c.service, c.start, c.end, c.status, c.request) for c in self._calls]
