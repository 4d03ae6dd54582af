"""Deadlines that shrink along a call chain, and the per-call context."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

import floodwall as fw
from floodwall import FakeClock


def test_no_deadline_outside() -> None:
    assert fw.remaining() is None
    assert fw.current_deadline() is None


def test_nested_deadlines_only_shrink(clock: FakeClock) -> None:
    with fw.deadline(5.0, clock=clock) as outer:
        assert fw.remaining() == 5.0
        clock.advance(1.0)
        with fw.deadline(10.0, clock=clock):
            assert fw.remaining() == 4.0  # the outer one ends sooner and wins
        with fw.deadline(1.0, clock=clock):
            assert fw.remaining() == 1.0
        assert fw.current_deadline() is outer
        clock.advance(5.0)
        assert fw.remaining() == -1.0
    assert fw.remaining() is None


async def test_deadline_follows_tasks(clock: FakeClock) -> None:
    async with fw.deadline(3.0, clock=clock):
        child = asyncio.create_task(asyncio.sleep(0, result=fw.remaining()))
        assert await child == 3.0
    other = asyncio.create_task(asyncio.sleep(0, result=fw.remaining()))
    assert await other is None


def test_deadline_is_per_context(clock: FakeClock) -> None:
    with fw.deadline(1.0, clock=clock):
        assert contextvars.Context().run(fw.remaining) is None


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_bad_deadline(bad: float) -> None:
    with pytest.raises(ValueError, match="seconds must be a finite number of seconds >= 0"):
        fw.deadline(bad)


async def test_call_context_is_fresh_and_nested() -> None:
    async with fw.call_context() as outer:
        with fw.call_context() as inner:
            assert fw.current_call() is inner
        assert fw.current_call() is outer
    assert not outer.degraded
