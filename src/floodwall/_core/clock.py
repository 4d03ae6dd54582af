"""Time, injected.

Policies never read ``time`` or sleep on their own: they take a :class:`Clock`. Production code
uses :data:`SYSTEM_CLOCK`; tests drive a :class:`FakeClock` whose time moves only when told to,
so every time-dependent behaviour is tested exactly and without waiting.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from typing import Protocol, runtime_checkable

from floodwall._core import validate

__all__ = ["SYSTEM_CLOCK", "Clock", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Monotonic time in seconds and the two ways of waiting on it."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        ...

    async def async_sleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds``."""
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.sleep`, :func:`asyncio.sleep`."""

    __slots__ = ()

    # Bound as attributes so the hot path pays one C call, not a Python frame.
    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    async def async_sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK: Clock = SystemClock()
"""The process-wide default clock."""


class FakeClock:
    """A clock that moves only when :meth:`advance` is called.

    ``sleep()`` advances the clock by the requested amount (a sync sleeper owns its thread, so
    nothing else could move time for it). ``async_sleep()`` parks the task until some other code
    advances the clock past its wake-up time, which lets a test interleave many sleepers exactly.
    Thread-safe.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = validate.number("start", start, error=ValueError)
        self._lock = threading.Lock()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.sleeps: list[float] = []
        """Every duration passed to ``sleep`` or ``async_sleep``, in call order."""

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every async sleeper whose time has come."""
        validate.seconds("seconds", seconds, error=ValueError)
        with self._lock:
            self._now += seconds
            due: list[asyncio.Future[None]] = []
            while self._sleepers and self._sleepers[0][0] <= self._now:
                due.append(heapq.heappop(self._sleepers)[2])
        for fut in due:
            if not fut.done():
                fut.get_loop().call_soon_threadsafe(_wake, fut)

    def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` (>= 0, as :func:`time.sleep` requires: a negative sleep is a
        caller's bug, refused with a :class:`ValueError` naming ``seconds``)."""
        validate.seconds("seconds", seconds, error=ValueError)
        self.sleeps.append(seconds)
        self.advance(seconds)

    async def async_sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    @property
    def pending_sleepers(self) -> int:
        """How many async sleepers are waiting for time to move."""
        with self._lock:
            return sum(1 for _, _, f in self._sleepers if not f.done())

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now!r})"


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
