"""FallbackSource: a backup data source behind its own pipeline (the seeds' recommendation
feed falling back to the nightly list of popular items)."""

from __future__ import annotations

from typing import Any

import pytest

import floodwall as fw
from floodwall.degrade import FallbackSource


def nightly_popular() -> list[str]:
    return [f"popular-{i}" for i in range(3)]


def test_the_backup_answers_when_the_ranking_service_fails(shell: Any) -> None:
    events: list[fw.Event] = []
    source = FallbackSource(nightly_popular, listeners=[events.append], name="popular")

    def ranking() -> list[str]:
        raise TimeoutError("ranking too slow")

    with fw.call_context() as ctx:
        assert shell.run(source, ranking) == nightly_popular()
    assert ctx.degraded_by == "popular" and ctx.degraded_reason == "TimeoutError"
    assert source.degraded == 1 and events[0].kind == "fallback_source"
    assert shell.run(source, lambda: ["for-you"]) == ["for-you"]


def test_the_backup_gets_the_same_arguments() -> None:
    seen: list[Any] = []

    def backup(user: int, *, limit: int) -> list[int]:
        seen.append((user, limit))
        return [user] * limit

    @FallbackSource(backup)
    def ranked(user: int, *, limit: int) -> list[int]:
        raise ConnectionError

    assert ranked(7, limit=2) == [7, 7]
    assert seen == [(7, 2)]


def test_the_backup_runs_under_its_own_pipeline(clock: fw.FakeClock) -> None:
    breaker = fw.CircuitBreaker(
        "backup", failure_rate=None, error_count=2, minimum_calls=2, clock=clock
    )
    backup_calls = 0

    def flaky_backup() -> str:
        nonlocal backup_calls
        backup_calls += 1
        raise OSError("backup down too")

    source = FallbackSource(flaky_backup, pipeline=fw.Pipeline(breaker))

    def primary() -> str:
        raise ConnectionError("primary down")

    for _ in range(5):
        with pytest.raises(ConnectionError) as caught:
            source.call(primary)
    assert backup_calls == 2, "the backup's own breaker opened after two failures"
    notes = caught.value.__notes__
    assert "fallback source 'fallback_source' failed too: CircuitOpenError" in notes[0]
    assert source.backup_failures == 5
    assert "pipeline=Pipeline" in source.describe()


def test_only_chosen_failures_use_the_backup() -> None:
    source = FallbackSource(lambda: "backup", kinds={"circuit_open"})

    def bug() -> str:
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        source.call(bug)

    def rejected() -> str:
        raise fw.CircuitOpenError("ranking", fw.CircuitState.OPEN, None)

    assert source.call(rejected) == "backup"


async def test_async_backup() -> None:
    async def backup() -> str:
        return "from backup"

    async def primary() -> str:
        raise ConnectionError

    source = FallbackSource(backup, pipeline=fw.Pipeline(fw.Timeout(1.0)))
    assert await source.call_async(primary) == "from backup"

    def sync_primary() -> str:
        raise ConnectionError

    with pytest.raises(fw.ConfigError, match="async backup; use call_async"):
        source.call(sync_primary)
    with pytest.raises(fw.ConfigError, match="backup must be callable"):
        FallbackSource("not callable")  # type: ignore[arg-type]
