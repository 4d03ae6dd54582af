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
    woke up (``(monotonic time, seconds late)``, late by more than ``threshold``, 5 ms unless
    told): how long a thread of the callers' own process, its timed wait over, waits to run
    again, for the interpreter lock among the busy caller threads and the event loop, for a
    garbage collection, or for a core under a CPU hog. A store call whose read has timed out
    waits as long before it can return; the :class:`Heartbeat` process beside this one cannot
    see it."""

    def __init__(self, threshold: float = 0.005) -> None:
        self.lags: list[tuple[float, float]] = []
        self._threshold = threshold
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            time.sleep(0.001)
            lag = time.monotonic() - now - 0.001
            if lag > self._threshold:
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


class StoodStill:
    """How long this process stood still while in use, in seconds (:attr:`seconds`): the
    lateness :class:`HeldOff` saw, summed, or the collector's pauses, summed, whichever is more
    (a collection makes the thread late too, so the two are not added). A wall-clock bound on
    work this process's own threads do (a client, a gateway and its upstreams in loop threads)
    adds it: none of that work goes on while the process stands still, whatever the code does.

    It suits bounds whose failure is a wait (a timer, a socket, a kernel lock): a wait leaves
    the interpreter free and makes no thread late, so it is never excused. Work that holds the
    interpreter would make the thread late by as much, so a bound on it cannot use this.
    Wake-ups late by more than 1 ms count (a sum over a short span needs the small ones too);
    a bound keeps a slack of its own for the rest."""

    def __init__(self) -> None:
        self._held_off = HeldOff(threshold=0.001)
        self._collector = CollectorPauses()

    @property
    def seconds(self) -> float:
        held = sum(lag for _, lag in self._held_off.lags)
        return max(held, sum(took for _, took in self._collector.pauses))

    def __enter__(self) -> StoodStill:
        self._collector.__enter__()
        self._held_off.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._held_off.__exit__()
        self._collector.__exit__()
