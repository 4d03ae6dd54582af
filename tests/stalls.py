"""How long this test process itself stood still: the stalls a heartbeat in another process
cannot see (a garbage collection, the interpreter lock among busy threads, a core taken by
other work). Timing bounds that must not blame a store for the process's own pauses read them.
"""

from __future__ import annotations

import gc
import threading
import time


class HeldOff:
    """A thread of this process that sleeps 1 ms at a time while in use and notes how late it
    woke up (``(monotonic time, seconds late)``, late by more than 5 ms): how long a thread of the
    callers' own process, its timed wait over, waits to run again, for the interpreter lock
    among the busy caller threads and the event loop, for a garbage collection, or for a core
    under a CPU hog. A store call whose read has timed out waits as long before it can return;
    the :class:`Heartbeat` process beside this one cannot see it."""

    def __init__(self) -> None:
        self.lags: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            time.sleep(0.001)
            lag = time.monotonic() - now - 0.001
            if lag > 0.005:
                self.lags.append((now, lag))

    def __enter__(self) -> HeldOff:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class CollectorPauses:
    """The garbage collector's pauses in this process while in use (``gc.callbacks``): the
    process's own stalls, which a heartbeat beside it cannot see."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.monotonic()
        else:
            self.pauses.append((self._start, time.monotonic() - self._start))

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)
