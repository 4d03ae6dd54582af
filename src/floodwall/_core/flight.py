"""One flight at a time: concurrent callers that need the same slow refill share one.

A leasing limiter whose pool is empty fetches more permits from the store; if every caller that
found it empty fetched, a burst would cost one round trip per caller. A :class:`Flight` step
performs its inner step (the fetch, folded into the pool) only when no other flight of the same
:class:`Flights` is under way: in threads one at a time (a lock, held for the round trip, which
the store's timeout bounds); in tasks one per key and event loop. A caller that finds a flight
under way waits for it to land and gets :data:`LANDED` instead of a value: it then looks at the
refilled pool again, and flies itself only if the pool is still short.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final

from floodwall._core.steps import Step

__all__ = ["LANDED", "Flight", "Flights"]


class _Landed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "LANDED"


LANDED: Final = _Landed()
"""A :class:`Flight`'s value when another flight landed meanwhile: look again."""


class Flights:
    """The flights of one owner (a limiter): who is fetching now, in each world."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.landed = 0
        """Flights completed by threads (a :class:`Flight` built before one landed looks
        again rather than flying)."""
        self._events: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, asyncio.Event]
        ] = weakref.WeakKeyDictionary()

    def _in_flight(self) -> dict[str, asyncio.Event]:
        loop = asyncio.get_running_loop()
        events = self._events.get(loop)
        if events is None:
            events = self._events[loop] = {}
        return events


class Flight(Step):
    """Perform ``step`` for ``key`` unless another flight is under way; then :data:`LANDED`."""

    __slots__ = ("flights", "key", "seen", "step")

    def __init__(self, flights: Flights, key: str, step: Step) -> None:
        self.flights = flights
        self.key = key
        self.step = step
        self.seen = flights.landed

    def run(self, call: Callable[[], Any]) -> Any:
        flights = self.flights
        with flights._lock:
            if flights.landed != self.seen:
                return LANDED
            try:
                return self.step.run(call)
            finally:
                flights.landed += 1

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        events = self.flights._in_flight()
        event = events.get(self.key)
        if event is not None:
            await event.wait()
            return LANDED
        event = events[self.key] = asyncio.Event()
        try:
            return await self.step.arun(call)
        finally:
            del events[self.key]
            event.set()

    def __repr__(self) -> str:
        return f"Flight({self.key!r}, {self.step!r})"
