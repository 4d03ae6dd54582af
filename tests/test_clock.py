"""The injected clock: the system clock, and the fake one every unit test drives."""

from __future__ import annotations

import asyncio
import time

import pytest

from floodwall import SYSTEM_CLOCK, Clock, FakeClock, SystemClock


def test_system_clock_is_monotonic_time() -> None:
    assert isinstance(SYSTEM_CLOCK, Clock)
    assert isinstance(SYSTEM_CLOCK, SystemClock)
    before = time.monotonic()
    assert before <= SYSTEM_CLOCK.monotonic() <= time.monotonic()


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(5.0)
    assert isinstance(clock, Clock)
    assert clock.monotonic() == 5.0
    clock.advance(1.5)
    assert clock.monotonic() == 6.5
    with pytest.raises(ValueError, match="got -1"):
        clock.advance(-1)


def test_fake_sync_sleep_advances_and_records() -> None:
    clock = FakeClock()
    clock.sleep(0.25)
    clock.sleep(1.0)
    assert clock.monotonic() == 1.25
    assert clock.sleeps == [0.25, 1.0]


async def test_fake_async_sleep_waits_for_advance() -> None:
    clock = FakeClock()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.async_sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper("a", 2.0)), asyncio.create_task(sleeper("b", 1.0))]
    await asyncio.sleep(0)
    assert clock.pending_sleepers == 2
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert woke == []
    clock.advance(0.5)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert woke == ["b"]
    clock.advance(5)
    await asyncio.gather(*tasks)
    assert woke == ["b", "a"]
    assert clock.sleeps == [2.0, 1.0]


async def test_fake_async_sleep_of_zero_yields_once() -> None:
    clock = FakeClock()
    await clock.async_sleep(0)
    assert clock.pending_sleepers == 0
