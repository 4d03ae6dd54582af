"""chunked: a failing chunk is isolated; the rest of the batch goes through."""

from __future__ import annotations

import asyncio

import pytest

import floodwall as fw
from floodwall.degrade import chunked


def push(rows: tuple[int, ...]) -> int:
    if 13 in rows:
        raise ValueError("row 13 is malformed")
    return sum(rows)


def test_a_failing_chunk_is_isolated() -> None:
    result = chunked(range(100), 10).run(push)
    assert not result.ok
    assert [c.index for c in result.failed] == [1]
    assert result.failed_items == list(range(10, 20))
    assert len(result.succeeded) == 9
    assert sum(result.values) == sum(range(100)) - sum(range(10, 20))
    assert str(result) == "10 chunks: 9 ok, 1 failed, 0 skipped"
    with pytest.raises(ExceptionGroup) as group:
        result.raise_for_failures()
    assert isinstance(group.value.exceptions[0], ValueError)


def test_each_chunk_runs_through_the_policy(clock: fw.FakeClock) -> None:
    attempts = {"n": 0}

    def flaky(rows: tuple[int, ...]) -> int:
        attempts["n"] += 1
        if attempts["n"] % 2:  # every chunk fails once, then succeeds on the retry
            raise ConnectionError
        return len(rows)

    retry = fw.Retry("push", attempts=2, backoff=fw.backoff.NoBackoff(), budget=None, clock=clock)
    result = chunked(range(25), 10, retry).run(flaky)
    assert result.ok and result.values == [10, 10, 5]
    assert attempts["n"] == 6


def test_max_failures_skips_the_rest_and_pause_spaces_chunks(clock: fw.FakeClock) -> None:
    events: list[fw.Event] = []

    def down(rows: tuple[int, ...]) -> None:
        raise ConnectionError("downstream is down")

    batch = chunked(
        iter(range(50)), 10, max_failures=2, pause=0.5, clock=clock, listeners=[events.append]
    )
    result = batch.run(down)
    assert [len(result.failed), len(result.skipped)] == [2, 3]
    assert result.failed_items == list(range(50)), "failed and skipped items, to resubmit"
    assert clock.sleeps == [0.5], "a pause between the two chunks that ran"
    assert [e.kind for e in events] == ["chunk_failed", "chunk_failed", "batch_done"]


async def test_async_chunks_run_concurrently_in_order() -> None:
    running = 0
    peak = 0

    async def push_async(rows: tuple[int, ...]) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1
        return push(rows)

    result = await chunked(range(100), 10).run_async(push_async, concurrency=3)
    assert peak == 3
    assert [c.index for c in result.chunks] == list(range(10))
    assert [c.index for c in result.failed] == [1]


def test_validation() -> None:
    with pytest.raises(fw.ConfigError, match="size must be an integer >= 1"):
        chunked([1], 0)
    with pytest.raises(fw.ConfigError, match="policy must be a floodwall Policy"):
        chunked([1], 1, "retry")  # type: ignore[arg-type]
    assert chunked([], 3).run(push).chunks == ()
