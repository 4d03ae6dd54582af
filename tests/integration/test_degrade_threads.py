"""The background-thread shells of the degradation tools, on real time (the unit tests drive the
same cores on a FakeClock; these check that the threads run them and stop)."""

from __future__ import annotations

import operator
from collections.abc import Callable

import pytest

import floodwall as fw
from floodwall.degrade import AutoShedder, Coalesce, Levels
from floodwall.shared import WriteBehind

pytestmark = pytest.mark.integration


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = fw.SYSTEM_CLOCK.monotonic() + timeout
    while not condition():
        if fw.SYSTEM_CLOCK.monotonic() > deadline:
            return False
        fw.SYSTEM_CLOCK.sleep(0.005)
    return True


def test_write_behind_thread_delivers() -> None:
    applied: list[str | None] = []
    writer = WriteBehind(lambda payload: applied.append(fw.current_idempotency_key()))
    thread = writer.start_thread()
    for n in range(20):
        writer.submit(n, key=f"w{n}")
    assert wait_until(lambda: writer.pending() == 0)
    writer.stop()
    thread.join(2)
    assert not thread.is_alive()
    assert applied == [f"w{n}" for n in range(20)]


def test_coalesce_thread_flushes_as_windows_close_and_on_stop() -> None:
    calls: list[tuple[str, int]] = []
    counter: Coalesce[str, int] = Coalesce(
        lambda key, n: calls.append((key, n)), window=0.01, merge=operator.add
    )
    thread = counter.start_thread()
    for _ in range(10):
        counter.submit("k", 1)
    assert wait_until(lambda: counter.pending == 0)
    counter.submit("late", 1)
    counter.stop()
    thread.join(2)
    assert not thread.is_alive()
    assert sum(n for key, n in calls if key == "k") == 10 and ("late", 1) in calls


def test_auto_shedder_thread() -> None:
    levels = Levels()
    shedder = AutoShedder(levels, lambda: 5.0, shed_after=0, interval=0.01, lease=1)
    thread = shedder.start_thread()
    assert wait_until(lambda: levels.shed_levels == {2, 3})
    shedder.stop()
    thread.join(2)
    assert not thread.is_alive()
    shedder.release()
    assert levels.shed_levels == frozenset()
