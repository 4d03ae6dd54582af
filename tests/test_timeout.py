"""Timeouts: async cancellation on a fake clock, sync modes, deadlines that shrink."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

import floodwall as fw
from floodwall import Event, FakeClock, Timeout, TimeoutExceeded


async def spin(times: int = 5) -> None:
    """Let the loop run callbacks (wake-ups scheduled by FakeClock.advance)."""
    for _ in range(times):
        await asyncio.sleep(0)


# -- async ----------------------------------------------------------------------------------


async def test_async_timeout_cancels_the_work(clock: FakeClock) -> None:
    events: list[Event] = []
    timeout = Timeout(1.0, name="slow-dep", clock=clock, listeners=[events.append])
    cancelled = asyncio.Event()

    async def hang() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    task = asyncio.create_task(timeout.call_async(hang))
    await spin()
    clock.advance(0.5)
    await spin()
    assert not task.done()
    clock.advance(0.5)
    await spin()
    with pytest.raises(TimeoutExceeded) as info:
        await task
    assert isinstance(info.value, TimeoutError)
    assert cancelled.is_set()
    assert (info.value.name, info.value.timeout, info.value.kind) == ("slow-dep", 1.0, "timeout")
    assert "no answer within 1.000s" in str(info.value)
    assert timeout.timeouts == 1
    assert [e.kind for e in events] == ["timeout"]


async def test_fast_calls_return_and_leave_nothing_behind(clock: FakeClock) -> None:
    timeout = Timeout(1.0, clock=clock)

    async def quick(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    assert [await timeout.call_async(quick, i) for i in range(100)] == [i * 2 for i in range(100)]
    watch = timeout._watchdogs._watch
    assert len(watch.fifo) == 0
    clock.advance(1.0)
    await spin()
    assert watch.task is None  # the watchdog exits when nothing is left to watch


async def test_outside_cancellation_stays_a_cancellation(clock: FakeClock) -> None:
    timeout = Timeout(1.0, clock=clock)
    task = asyncio.create_task(timeout.call_async(asyncio.sleep, 3600))
    await spin()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert timeout.timeouts == 0


async def test_work_that_finishes_despite_the_cancel_keeps_its_answer(clock: FakeClock) -> None:
    timeout = Timeout(1.0, clock=clock)
    gate = asyncio.Event()

    async def stubborn() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await gate.wait()  # cleans up for a while, then answers anyway
        return "late but whole"

    task = asyncio.create_task(timeout.call_async(stubborn))
    await spin()
    clock.advance(1.0)
    await spin()
    gate.set()
    assert await task == "late but whole"
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0


async def test_many_concurrent_calls_expire_independently(clock: FakeClock) -> None:
    timeout = Timeout(1.0, clock=clock)

    async def takes(seconds: float) -> float:
        await clock.async_sleep(seconds)
        return seconds

    durations = [0.125 + 0.25 * (i % 8) for i in range(64)]  # 0.125 … 1.875 s, never 1.0
    tasks = [asyncio.create_task(timeout.call_async(takes, d)) for d in durations]
    await spin()
    for _ in range(8):
        clock.advance(0.25)
        await spin(10)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for duration, result in zip(durations, results, strict=True):
        if duration < 1.0:
            assert result == duration
        else:
            assert isinstance(result, TimeoutExceeded)


async def test_ambient_deadline_shortens_the_timeout(clock: FakeClock) -> None:
    timeout = Timeout(10.0, clock=clock)
    seen: list[float | None] = []

    async def work() -> None:
        seen.append(fw.remaining())
        await asyncio.Event().wait()

    async with fw.deadline(2.0, clock=clock):
        task = asyncio.create_task(timeout.call_async(work))
        await spin()
        clock.advance(2.0)
        await spin()
        with pytest.raises(TimeoutExceeded) as info:
            await task
    assert seen == [2.0]
    assert info.value.timeout == 2.0
    assert "ambient deadline" in info.value.reason


async def test_a_passed_deadline_fails_without_calling(clock: FakeClock) -> None:
    timeout = Timeout(1.0, clock=clock)
    called = []

    async def work() -> None:
        called.append(1)

    with fw.deadline(0.5, clock=clock):
        clock.advance(0.5)
        with pytest.raises(TimeoutExceeded, match="had already passed"):
            await timeout.call_async(work)
    assert called == []


async def test_decorated_coroutine_function(clock: FakeClock) -> None:
    @Timeout(1.0, clock=clock)
    async def fetch(x: int) -> int:
        return x + 1

    assert await fetch(1) == 2


async def test_async_timeout_on_the_real_clock() -> None:
    """One real-time check that the watchdog drives actual expiry (50 ms)."""
    with pytest.raises(TimeoutExceeded):
        await Timeout(0.05).call_async(asyncio.Event().wait)


# -- sync -----------------------------------------------------------------------------------


def test_cooperative_sync_timeout_discards_a_late_answer(clock: FakeClock) -> None:
    timeout = Timeout(1.0, clock=clock)  # a fake clock always means cooperative

    def slow() -> str:
        clock.advance(1.5)
        return "late"

    def quick() -> str:
        clock.advance(0.5)
        return "in time"

    with pytest.raises(TimeoutExceeded):
        timeout.call(slow)
    assert timeout.call(quick) == "in time"


def test_sync_timeout_installs_the_deadline(clock: FakeClock) -> None:
    timeout = Timeout(3.0, clock=clock)
    assert fw.remaining() is None
    assert timeout.call(fw.remaining) == 3.0
    with fw.deadline(1.0, clock=clock):
        assert timeout.call(fw.remaining) == 1.0


def test_signal_mode_interrupts_python_code() -> None:
    timeout = Timeout(0.05, mode="signal")
    started = time.monotonic()

    def busy() -> None:
        while time.monotonic() - started < 5:
            pass

    with pytest.raises(TimeoutExceeded):
        timeout.call(busy)
    assert time.monotonic() - started < 1.0


def test_signal_mode_interrupts_a_blocking_read() -> None:
    left, right = socket.socketpair()
    try:
        with pytest.raises(TimeoutExceeded):
            Timeout(0.05, mode="signal").call(left.recv, 1)
    finally:
        left.close()
        right.close()


def test_nested_signal_timeouts_restore_the_outer_timer() -> None:
    outer = Timeout(0.3, mode="signal", name="outer")
    inner = Timeout(0.05, mode="signal", name="inner")

    def body() -> None:
        with pytest.raises(TimeoutExceeded) as info:
            inner.call(time.sleep, 5)
        assert info.value.name == "inner"
        time.sleep(5)  # the outer timer must still fire

    with pytest.raises(TimeoutExceeded) as info:
        outer.call(body)
    assert info.value.name == "outer"


def test_signal_mode_refuses_other_threads() -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            Timeout(1.0, mode="signal").call(int)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert isinstance(errors[0], fw.ConfigError)
    assert "main thread" in str(errors[0])


def test_thread_mode_counts_abandoned_workers_and_bounds_them() -> None:
    events: list[Event] = []
    timeout = Timeout(0.05, mode="thread", thread_limit=1, listeners=[events.append])
    release = threading.Event()
    assert timeout.call(lambda: 7) == 7
    with pytest.raises(TimeoutExceeded):
        timeout.call(release.wait)
    assert timeout.abandoned == 1
    assert events[-2].kind == "thread_abandoned"
    with pytest.raises(TimeoutExceeded, match="still running"):
        timeout.call(lambda: 1)  # refused at once: no second leaked thread
    release.set()
    pause = threading.Event()
    for _ in range(500):
        if timeout.abandoned == 0:
            break
        pause.wait(0.01)
    assert timeout.abandoned == 0
    assert timeout.call(lambda: 8) == 8


def test_thread_mode_carries_context_and_errors() -> None:
    timeout = Timeout(1.0, mode="thread")
    assert 0 < (timeout.call(fw.remaining) or 0) <= 1.0
    table: dict[str, int] = {}
    with pytest.raises(KeyError):
        timeout.call(table.__getitem__, "missing")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seconds": 0}, "seconds must be a finite number of seconds > 0, got 0"),
        ({"seconds": float("inf")}, "got inf"),
        ({"seconds": 1, "mode": "kill"}, "mode must be one of"),
        ({"seconds": 1, "thread_limit": 0}, "thread_limit must be an integer >= 1, got 0"),
    ],
)
def test_bad_options(options: dict[str, object], message: str) -> None:
    with pytest.raises(fw.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Timeout(**options)  # type: ignore[arg-type]
