"""The discrete-event engine: a virtual clock and a heap of timed callbacks.

Everything in a simulation happens at a virtual time; nothing sleeps. :class:`SimClock`
implements the :class:`~floodwall.Clock` protocol, so real floodwall policies built with
``clock=sim.clock`` read the simulated time. Events at the same time run in the order they were
scheduled, and all randomness comes from one seeded :class:`random.Random`, so a run is
reproducible bit for bit.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

__all__ = ["SimClock", "Simulation"]


class SimClock:
    """The simulation's time. Policies may read it; nothing may wait on it."""

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        raise RuntimeError("simulated code cannot block: schedule an event instead")

    async def async_sleep(self, seconds: float) -> None:
        raise RuntimeError("simulated code cannot sleep: schedule an event instead")

    def __repr__(self) -> str:
        return f"SimClock(now={self.now!r})"


class Simulation:
    """A heap of ``(time, seq, callback, arg)`` events over a :class:`SimClock`.

    ``at(t, fn, arg)`` / ``after(dt, fn, arg)`` schedule ``fn(arg)``; :meth:`run` processes
    events in time order until ``until``. Scheduling is O(log n), dispatch O(log n).
    """

    def __init__(self, seed: int = 0) -> None:
        self.clock = SimClock()
        self.rng = random.Random(seed)
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = itertools.count()
        self.events = 0

    @property
    def now(self) -> float:
        return self.clock.now

    def at(self, time: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        heapq.heappush(self._heap, (max(time, self.clock.now), next(self._seq), fn, arg))

    def after(self, delay: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        heapq.heappush(self._heap, (self.clock.now + max(0.0, delay), next(self._seq), fn, arg))

    def run(self, until: float) -> None:
        """Process every event scheduled before ``until``; leave the clock at ``until``."""
        heap, clock, pop = self._heap, self.clock, heapq.heappop
        count = 0
        while heap and heap[0][0] < until:
            time, _, fn, arg = pop(heap)
            clock.now = time
            fn(arg)
            count += 1
        self.events += count
        clock.now = max(clock.now, until)
