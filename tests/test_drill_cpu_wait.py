"""The run-queue wait a drill samples (``/proc/<pid>/task/<tid>/schedstat``, Linux)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from floodwall.drill._cpu_wait import CpuWait

SCHEDSTAT = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists()


def test_no_proc_says_none() -> None:
    """A process the system does not describe (or no /proc at all): no figure, not zero."""
    assert CpuWait(pid=2**22 + 1).read() is None  # above Linux's pid_max


def test_the_total_only_grows_while_threads_come_and_go() -> None:
    """Summed over the threads, kept for those that exited: the total never goes back."""
    waits = CpuWait()
    first = waits.read()
    if not SCHEDSTAT:  # not Linux, or a kernel without scheduler statistics
        assert first is None
        return
    assert first is not None and first >= 0.0
    readings: list[float | None] = []
    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            os.sched_yield()

    threads = [threading.Thread(target=spin) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(50):
        readings.append(waits.read())
        os.sched_yield()
    done.set()
    for thread in threads:
        thread.join()
    readings.append(waits.read())
    values = [r for r in readings if r is not None]
    assert len(values) == len(readings)
    assert values == sorted(values) and values[0] >= first  # the spinners' exit took nothing
