"""How long a process was ready to run but waited for a core: the machine's share of a drill.

Linux keeps, per thread, the nanoseconds it spent runnable on a run queue without a core
(``/proc/<pid>/task/<tid>/schedstat``, second field). A drill whose process waited a large share
of its wall time there measured the machine: every request in flight was delayed by that wait,
whatever the protection did. The event loop's lag misses most of it: a loop starved in many
short waits still wakes almost on time from each 0.25 s sleep.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["CpuWait"]


class CpuWait:
    """Cumulative run-queue wait, in seconds, of every thread ``pid`` has had since the first
    :meth:`read` (``None`` where ``/proc`` does not say: not Linux, or no scheduler statistics).

    A thread's figure disappears when it exits, so each thread's last reading is kept (and put
    aside when a new thread reuses its id): the total never goes back, and loses at most what an
    exited thread waited since its last reading.
    """

    def __init__(self, pid: int | str = "self") -> None:
        self._tasks = f"/proc/{pid}/task"
        self._seen: dict[str, int] = {}
        self._gone = 0

    def read(self) -> float | None:
        """Seconds waited so far, summed over the threads; ``None`` without ``/proc``."""
        try:
            threads = os.listdir(self._tasks)
        except OSError:
            return None
        for tid in threads:
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"{self._tasks}/{tid}/schedstat", encoding="ascii") as stats:
                    waited = int(stats.read().split()[1])
                if waited < self._seen.get(tid, 0):
                    self._gone += self._seen[tid]
                self._seen[tid] = waited
        if not self._seen:
            return None
        return (self._gone + sum(self._seen.values())) / 1e9
