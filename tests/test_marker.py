"""Retry markers and idempotency keys: context that stops retries from multiplying.

Ends with the storm test from the issue: three nested tiers, each ``Retry(attempts=3)``, over a
database that always fails. Naively that is 3 × 3 × 3 = 27 database calls per request; with
markers and a shared budget it must stay at or below 1.2.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import floodwall as fw
from floodwall import FakeClock, Retry, RetryBudget, RetryMarker
from floodwall.backoff import FullJitter, NoBackoff


class AutoClock(FakeClock):
    """A fake clock whose async sleepers move time themselves, like its sync ones."""

    async def async_sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


def retry(name: str, clock: FakeClock, **kwargs: Any) -> Retry:
    kwargs.setdefault("backoff", NoBackoff())
    kwargs.setdefault("budget", None)
    return Retry(name, clock=clock, **kwargs)


# -- the marker -----------------------------------------------------------------------------


def test_marker_is_set_only_while_an_attempt_is_a_retry() -> None:
    clock = FakeClock()
    seen: list[RetryMarker | None] = []

    def failing() -> None:
        seen.append(fw.current_retry())
        raise ConnectionError

    with pytest.raises(ConnectionError):
        retry("outer", clock).call(failing)
    assert seen == [None, RetryMarker(2, "outer"), RetryMarker(3, "outer")]
    assert fw.current_retry() is None


def test_inner_retries_the_first_attempt_and_outer_leaves_it_alone() -> None:
    clock = FakeClock()
    inner = retry("inner", clock, attempts=3)
    outer = retry("outer", clock, attempts=3)
    calls: list[RetryMarker | None] = []

    def dependency() -> None:
        calls.append(fw.current_retry())
        raise ConnectionError

    # outer's first attempt is no retry, so inner (closest to the failure) retries; its
    # exhausted failure is final, so outer does not multiply it
    with pytest.raises(ConnectionError):
        outer.call(inner.call, dependency)
    assert calls == [None, RetryMarker(2, "inner"), RetryMarker(3, "inner")]


def test_inner_makes_one_attempt_per_outer_retry() -> None:
    clock = FakeClock()
    inner = retry("inner", clock, attempts=3)
    outer = retry("outer", clock, attempts=3)
    calls: list[RetryMarker | None] = []

    def dependency() -> None:
        calls.append(fw.current_retry())
        raise ConnectionError

    with fw.retry_marker(2, "upstream-service"), pytest.raises(ConnectionError):
        outer.call(inner.call, dependency)
    assert calls == [RetryMarker(2, "upstream-service")]  # an upstream retries: nobody here

    calls.clear()
    single_inner = retry("inner1", clock, attempts=1)  # gives up without a "final" record
    with pytest.raises(ConnectionError):
        outer.call(single_inner.call, dependency)
    # outer retries; under its marker the inner policy would not retry anyway
    assert calls == [None, RetryMarker(2, "outer"), RetryMarker(3, "outer")]


async def test_nested_retry_does_not_retry_under_a_retry_async() -> None:
    clock = AutoClock()
    inner = retry("inner", clock, attempts=3)
    outer = retry("outer", clock, attempts=3, respect_marker=False)
    calls: list[RetryMarker | None] = []

    async def dependency() -> None:
        calls.append(fw.current_retry())
        raise ConnectionError

    async def in_a_child_task() -> None:
        # the marker follows the context into tasks started inside the attempt
        await asyncio.create_task(inner.call_async(dependency))

    with pytest.raises(ConnectionError):
        await outer.call_async(in_a_child_task)
    # outer ignores inner's "already retried"; under outer's marker inner tries once
    assert calls == [
        None,
        RetryMarker(2, "inner"),
        RetryMarker(3, "inner"),
        RetryMarker(2, "outer"),
        RetryMarker(3, "outer"),
    ]


def test_respect_marker_false_retries_anyway() -> None:
    clock = FakeClock()
    inner = retry("inner", clock, attempts=2, respect_marker=False)
    calls = 0

    def dependency() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError

    with fw.retry_marker(3, "edge"), pytest.raises(ConnectionError):
        inner.call(dependency)
    assert calls == 2


def test_a_failure_retried_below_is_not_retried_above() -> None:
    clock = FakeClock()
    events: list[fw.Event] = []
    inner = retry("inner", clock, attempts=2)
    outer = retry("outer", clock, attempts=3, listeners=[events.append])
    calls = 0

    def dependency() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError

    with pytest.raises(ConnectionError) as caught:
        outer.call(inner.call, dependency)
    assert calls == 2
    record = fw.gave_up(caught.value)
    assert record is not None
    assert record.policy == "inner"  # the layer that retried keeps the record
    assert len(caught.value.__notes__) == 1
    assert events[-1].figures["cause"] == "retried_below"


def test_marker_context_manager() -> None:
    with pytest.raises(ValueError, match=r"attempt must be an integer >= 2 \(a retry\), got 1"):
        fw.retry_marker(1, "x")
    with fw.retry_marker(2, "a") as outer:
        assert fw.current_retry() is outer
        with fw.retry_marker(3, "b"):
            assert fw.current_retry() == RetryMarker(3, "b")
        assert fw.current_retry() is outer
        assert contextvars.Context().run(fw.current_retry) is None
    assert fw.current_retry() is None


async def test_marker_context_manager_async() -> None:
    async with fw.retry_marker(2, "a"):
        child = asyncio.create_task(asyncio.sleep(0, result=fw.current_retry()))
        assert await child == RetryMarker(2, "a")


# -- the idempotency key --------------------------------------------------------------------


def test_idempotency_key_context() -> None:
    assert fw.current_idempotency_key() is None
    with fw.idempotency_key("a") as key:
        assert key == "a"
        with fw.idempotency_key("b"):
            assert fw.current_idempotency_key() == "b"
        assert fw.current_idempotency_key() == "a"
    assert fw.current_idempotency_key() is None
    with pytest.raises(ValueError, match="key must be a non-empty string, got ''"):
        fw.idempotency_key("")


async def test_idempotency_key_follows_tasks() -> None:
    async with fw.idempotency_key("order-7"):
        child = asyncio.create_task(asyncio.sleep(0, result=fw.current_idempotency_key()))
        assert await child == "order-7"


# -- the storm ------------------------------------------------------------------------------

REQUESTS = 2000
RATE = 100.0
"""Top-level requests per second of simulated time."""


def build_tiers(
    clock: FakeClock, *, budget: str, markers: bool
) -> tuple[list[Retry], RetryBudget | None]:
    shared = RetryBudget(clock=clock) if budget == "shared" else None
    tiers = []
    for name in ("server-1", "server-2", "server-3"):
        per_tier: RetryBudget | None = shared
        if budget == "per-tier":
            per_tier = RetryBudget(clock=clock)
        tiers.append(
            Retry(
                name,
                attempts=3,
                budget=per_tier,
                respect_marker=markers,
                backoff=FullJitter(0.005, cap=0.5),
                clock=clock,
            )
        )
    return tiers, shared


def storm_sync(*, budget: str, markers: bool) -> float:
    clock = FakeClock()
    (t1, t2, t3), _ = build_tiers(clock, budget=budget, markers=markers)
    database_calls = 0

    def database() -> None:
        nonlocal database_calls
        database_calls += 1
        raise ConnectionError("database overloaded")

    def server_3() -> None:
        t3.call(database)

    def server_2() -> None:
        t2.call(server_3)

    for _ in range(REQUESTS):
        with pytest.raises(ConnectionError):
            t1.call(server_2)
        clock.advance(1 / RATE)
    return database_calls / REQUESTS


async def storm_async(*, budget: str, markers: bool) -> float:
    clock = AutoClock()
    (t1, t2, t3), _ = build_tiers(clock, budget=budget, markers=markers)
    database_calls = 0

    async def database() -> None:
        nonlocal database_calls
        database_calls += 1
        raise ConnectionError("database overloaded")

    def tier(policy: Retry, below: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def serve() -> None:
            await policy.call_async(below)

        return serve

    top = tier(t1, tier(t2, tier(t3, database)))
    for _ in range(REQUESTS):
        with pytest.raises(ConnectionError):
            await top()
        clock.advance(1 / RATE)
    return database_calls / REQUESTS


def test_storm_naive_is_27() -> None:
    assert storm_sync(budget="none", markers=False) == 27.0


def test_storm_markers_alone_keep_one_retrying_layer() -> None:
    assert storm_sync(budget="none", markers=True) == 3.0


def test_storm_with_markers_and_a_shared_budget_stays_near_one() -> None:
    amplification = storm_sync(budget="shared", markers=True)
    assert amplification <= 1.2
    assert amplification > 1.0  # the budget does allow some retries


def test_storm_with_markers_and_per_tier_budgets_stays_near_one() -> None:
    assert storm_sync(budget="per-tier", markers=True) <= 1.2


async def test_storm_async_with_markers_and_a_shared_budget() -> None:
    assert await storm_async(budget="none", markers=False) == 27.0
    assert await storm_async(budget="shared", markers=True) <= 1.2
