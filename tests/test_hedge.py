"""Hedging on a fake clock: a second attempt after ``delay``, first success wins, losers cancelled.

The fake clock's async sleepers park until the test moves time, so each test decides exactly
when the hedge timer fires; ``settle()`` lets the event loop run what is ready.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import floodwall as fw
from floodwall import ConfigError, FakeClock, Hedge, RetryBudget, RetryMarker


async def settle(turns: int = 10) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


class Attempts:
    """An async dependency: attempt ``k`` (by its retry marker) follows ``plan[k]``:
    ``"hang"`` waits until cancelled, an exception is raised, anything else is returned."""

    def __init__(self, *plan: object) -> None:
        self.plan = plan
        self.started: list[int] = []
        self.cancelled: list[int] = []
        self.gates: dict[int, asyncio.Event] = {}

    async def __call__(self) -> object:
        marker = fw.current_retry()
        attempt = 1 if marker is None else marker.attempt
        self.started.append(attempt)
        step = self.plan[attempt - 1]
        if step == "hang" or isinstance(step, tuple):
            gate = self.gates.setdefault(attempt, asyncio.Event())
            try:
                await gate.wait()
            except asyncio.CancelledError:
                self.cancelled.append(attempt)
                raise
            step = step[1] if isinstance(step, tuple) else "released"
        if isinstance(step, BaseException):
            raise step
        return step


def hedge(clock: FakeClock, **kwargs: Any) -> Hedge:
    kwargs.setdefault("budget", None)
    return Hedge(0.1, clock=clock, **kwargs)


async def test_fast_first_attempt_starts_no_hedge(clock: FakeClock) -> None:
    policy = hedge(clock)
    attempts = Attempts("first")
    assert await policy.call_async(attempts) == "first"
    await settle()
    assert attempts.started == [1]
    assert policy.hedges == 0
    assert clock.pending_sleepers == 0  # the timer was cancelled


async def test_slow_first_attempt_is_hedged_and_cancelled(clock: FakeClock) -> None:
    events: list[fw.Event] = []
    budget = RetryBudget(clock=clock)
    policy = hedge(clock, budget=budget, listeners=[events.append])
    attempts = Attempts("hang", "hedged")
    call = asyncio.create_task(policy.call_async(attempts))
    await settle()
    assert attempts.started == [1]
    clock.advance(0.09)
    await settle()
    assert attempts.started == [1]  # not yet
    clock.advance(0.01)
    assert await call == "hedged"
    await settle()
    assert attempts.started == [1, 2]
    assert attempts.cancelled == [1]  # the loser was cancelled
    assert (policy.hedges, policy.hedge_wins) == (1, 1)
    assert budget.snapshot().retries == 1  # a hedge counts against the budget
    assert [e.kind for e in events] == ["hedge_started", "hedge_answered"]


async def test_first_success_wins_even_from_the_first_attempt(clock: FakeClock) -> None:
    policy = hedge(clock)
    attempts = Attempts(("hang", "primary"), "hang")
    call = asyncio.create_task(policy.call_async(attempts))
    await settle()
    clock.advance(0.1)
    await settle()
    assert attempts.started == [1, 2]
    attempts.gates[1].set()
    assert await call == "primary"
    await settle()
    assert attempts.cancelled == [2]
    assert policy.hedge_wins == 0


async def test_up_to_max_hedges_one_per_delay(clock: FakeClock) -> None:
    policy = hedge(clock, max_hedges=2)
    attempts = Attempts("hang", "hang", "hang")
    call = asyncio.create_task(policy.call_async(attempts))
    for _ in range(4):
        await settle()
        clock.advance(0.1)
    await settle()
    assert attempts.started == [1, 2, 3]  # never a fourth
    attempts.gates[3].set()
    assert await call == "released"
    await settle()
    assert sorted(attempts.cancelled) == [1, 2]


async def test_hedges_carry_a_retry_marker(clock: FakeClock) -> None:
    seen: list[RetryMarker | None] = []

    async def work() -> str:
        seen.append(fw.current_retry())
        if len(seen) == 1:
            await asyncio.Event().wait()
        return "ok"

    call = asyncio.create_task(hedge(clock, name="reads").call_async(work))
    await settle()
    clock.advance(0.1)
    assert await call == "ok"
    assert seen == [None, RetryMarker(2, "reads")]


@pytest.mark.parametrize("respect_marker", [True, False])
async def test_no_hedge_under_an_upstream_retry(clock: FakeClock, respect_marker: bool) -> None:
    policy = hedge(clock, respect_marker=respect_marker)
    gate = asyncio.Event()
    seen: list[RetryMarker | None] = []

    async def work() -> str:
        seen.append(fw.current_retry())
        if len(seen) == 1:
            await gate.wait()
            return "first"
        return "hedged"

    with fw.retry_marker(2, "upstream"):
        call = asyncio.create_task(policy.call_async(work))
    await settle()
    clock.advance(0.1)
    await settle()
    if respect_marker:
        assert policy.hedges == 0
        gate.set()
        assert await call == "first"
    else:
        assert await call == "hedged"
        assert seen == [RetryMarker(2, "upstream"), RetryMarker(2, "hedge")]


async def test_budget_refusal_means_no_hedge(clock: FakeClock) -> None:
    events: list[fw.Event] = []
    budget = RetryBudget(0.0, min_per_second=0.0, clock=clock)
    policy = hedge(clock, budget=budget, listeners=[events.append])
    attempts = Attempts(("hang", "slow but fine"), "never")
    call = asyncio.create_task(policy.call_async(attempts))
    await settle()
    clock.advance(1.0)
    await settle()
    assert attempts.started == [1]
    assert policy.budget_refusals == 1
    assert events[0].kind == "budget_exhausted"
    attempts.gates[1].set()
    assert await call == "slow but fine"


async def test_a_failure_does_not_start_a_hedge(clock: FakeClock) -> None:
    policy = hedge(clock)
    with pytest.raises(ConnectionError):
        await policy.call_async(Attempts(ConnectionError("fast failure")))
    assert policy.hedges == 0


async def test_transient_failure_waits_for_the_others(clock: FakeClock) -> None:
    policy = hedge(clock)
    attempts = Attempts(("hang", "primary"), ConnectionError("hedge failed"))
    call = asyncio.create_task(policy.call_async(attempts))
    await settle()
    clock.advance(0.1)
    await settle()
    assert not call.done()  # the hedge failed, the first attempt still runs
    attempts.gates[1].set()
    assert await call == "primary"


async def test_every_attempt_failing_raises_the_last_error(clock: FakeClock) -> None:
    policy = hedge(clock)
    last = ConnectionError("second")
    attempts = Attempts(("hang", ConnectionError("first")), last)
    call = asyncio.create_task(policy.call_async(attempts))
    await settle()
    clock.advance(0.1)
    await settle()
    attempts.gates[1].set()
    with pytest.raises(ConnectionError) as caught:
        await call
    assert caught.value.args == ("first",)  # the last one to fail
    assert "all 2 attempts failed" in caught.value.__notes__[0]


async def test_a_business_error_ends_the_call_at_once(clock: FakeClock) -> None:
    class NotFound(Exception):
        status_code = 404

    policy = hedge(clock)
    attempts = Attempts("hang", NotFound())
    call = asyncio.create_task(policy.call_async(attempts))
    await settle()
    clock.advance(0.1)
    with pytest.raises(NotFound):
        await call
    await settle()
    assert attempts.cancelled == [1]


async def test_cancelling_the_caller_cancels_every_attempt(clock: FakeClock) -> None:
    policy = hedge(clock)
    attempts = Attempts("hang", "hang")
    call = asyncio.create_task(policy.call_async(attempts))
    await settle()
    clock.advance(0.1)
    await settle()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await settle()
    assert sorted(attempts.cancelled) == [1, 2]
    assert clock.pending_sleepers == 0


async def test_percentile_delay_replaces_the_fixed_one(clock: FakeClock) -> None:
    policy = hedge(clock, percentile=0.95, min_samples=20)
    now = clock.monotonic()
    assert policy.current_delay(now) == 0.1  # no samples yet: the fixed delay
    for _ in range(19):
        policy.record(now, 0.3)
    assert policy.current_delay(now + 1.0) == 0.1  # 19 < min_samples
    policy.record(now + 1.0, 0.3)
    assert policy.current_delay(now + 1.0) == 0.1  # cached for the rest of the bucket
    assert policy.current_delay(now + 2.0) == pytest.approx(0.3, rel=0.13)  # ±12 % bins


async def test_percentile_from_answered_calls(clock: FakeClock) -> None:
    policy = hedge(clock, percentile=0.5, min_samples=3)

    async def takes_half_a_second() -> str:
        await clock.async_sleep(0.5)
        return "ok"

    for _ in range(3):
        call = asyncio.create_task(policy.call_async(takes_half_a_second))
        await settle()
        clock.advance(0.5)  # the attempt ends; the 0.1 s hedge timer fired first
        await call
    clock.advance(1.0)
    assert policy.current_delay(clock.monotonic()) == pytest.approx(0.5, rel=0.13)


def test_sync_calls_are_refused(clock: FakeClock) -> None:
    with pytest.raises(ConfigError, match="hedges async calls only"):
        hedge(clock).call(lambda: 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delay": 0}, "delay must be a finite number of seconds > 0, got 0"),
        ({"delay": 0.1, "max_hedges": 0}, "max_hedges must be an integer >= 1, got 0"),
        ({"delay": 0.1, "percentile": 1.0}, r"percentile must be a number in \(0, 1\), got 1.0"),
        ({"delay": 0.1, "min_samples": 0}, "min_samples must be an integer >= 1, got 0"),
        ({"delay": 0.1, "budget": 3}, "budget must be a RetryBudget or None, got 3"),
    ],
)
def test_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Hedge(**kwargs)


def test_describe() -> None:
    assert Hedge(0.05).describe() == "Hedge('hedge', delay=0.05s, max_hedges=1)"
    assert Hedge(0.05, percentile=0.95, name="r").describe() == (
        "Hedge('r', delay=p95 (else 0.05s), max_hedges=1)"
    )
