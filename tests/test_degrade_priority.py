"""Priority admission by level: when capacity is short, level 1 gets it first."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import floodwall as fw
from floodwall.adaptive import AdaptiveLimiter, FixedLimit, LoadShedder, QueueingTimeAdmission
from floodwall.degrade import (
    LevelLimiter,
    LevelReserve,
    PriorityGate,
    admit_level,
    dagor_business,
    level_partitions,
)
from floodwall.ratelimit import TokenBucket


def test_reserve_shares() -> None:
    reserve = LevelReserve()
    assert [reserve.share(level) for level in (1, 2, 3)] == [1.0, 0.9, 0.7]
    assert reserve.admits(3, 6, 10) and not reserve.admits(3, 7, 10)
    assert reserve.admits(2, 8, 10) and not reserve.admits(2, 9, 10)
    assert reserve.admits(1, 9, 10) and not reserve.admits(1, 10, 10)
    with pytest.raises(fw.ConfigError, match="level3 must be in"):
        LevelReserve(level2=0.5, level3=0.2)
    with pytest.raises(fw.ConfigError, match="level must be 1, 2 or 3"):
        reserve.share(4)


@given(
    st.integers(0, 3),
    st.integers(0, 200),
    st.integers(1, 200),
)
def test_a_lower_level_is_never_admitted_where_a_higher_one_is_not(
    level_offset: int, in_use: int, capacity: int
) -> None:
    reserve = LevelReserve()
    admitted = [reserve.admits(level, in_use, capacity) for level in (1, 2, 3)]
    assert admitted == sorted(admitted, reverse=True), admitted
    if in_use + 1 <= capacity * 0.7:
        assert all(admitted), "with room to spare every level is admitted"


def test_priority_gate_keeps_the_last_slots_for_level_1(shell: Any) -> None:
    gate = PriorityGate(10)
    level3, level2, level1 = gate.for_level(3), gate.for_level(2), gate.for_level(1)
    held = [gate.try_enter(3) for _ in range(7)]
    assert all(held)
    with pytest.raises(fw.BulkheadFullError, match="level 3 may use 70% of 10 slots"):
        shell.run(level3, lambda: "nope")
    assert shell.run(level2, lambda: "reviews") == "reviews"
    gate.try_enter(2)
    gate.try_enter(2)
    with pytest.raises(fw.BulkheadFullError):
        shell.run(level2, lambda: "nope")
    assert shell.run(level1, lambda: "paid") == "paid"
    assert shell.run(gate, lambda: "level 1 by default") == "level 1 by default"
    assert gate.in_flight == 9
    assert gate.rejected == {1: 0, 2: 1, 3: 1}
    for _ in range(9):
        gate.release()
    assert "PriorityGate" in str(fw.Pipeline(level3))


def test_level_limiter_reserves_tokens_for_level_1(clock: fw.FakeClock, shell: Any) -> None:
    bucket = TokenBucket(10, burst=9, clock=clock)  # 10 tokens, refilled 10/s
    limiter = LevelLimiter(bucket)
    grants = [limiter.acquire(3).allowed for _ in range(10)]
    assert grants.count(True) == 7, "level 3 stops at 70 % of the bucket"
    assert limiter.reserve_refusals == 3
    assert limiter.acquire(2).allowed and limiter.acquire(2).allowed
    assert not limiter.acquire(2).allowed
    with pytest.raises(fw.RateLimitedError, match="level 2 may use 90%"):
        shell.run(limiter.for_level(2), lambda: "x")
    assert shell.run(limiter.for_level(1), lambda: "paid") == "paid"
    assert not limiter.acquire(1).allowed, "the bucket itself is empty now"


def test_admit_level_uses_dagor_priorities() -> None:
    clock = fw.FakeClock()
    dagor = QueueingTimeAdmission(clock=clock, window=1.0)
    shedder = LoadShedder(dagor, clock=clock)
    assert [dagor_business(level) for level in (1, 2, 3)] == [0, 1, 2]
    # overload the server: DAGOR lowers its admission level until level 3 is refused
    for _ in range(30):
        for _ in range(50):
            for level in (1, 2, 3):
                with contextlib.suppress(fw.OverloadedError):
                    admit_level(shedder, level, queue_time=0.1).success()
        clock.advance(1.0)
    admitted = dict.fromkeys((1, 2, 3), 0)
    for level in (1, 2, 3):
        try:
            admit_level(shedder, level, queue_time=0.1).success()
            admitted[level] += 1
        except fw.OverloadedError:
            pass
    assert admitted == {1: 1, 2: 0, 3: 0}


def test_admit_level_uses_limiter_partitions() -> None:
    clock = fw.FakeClock()
    limiter = AdaptiveLimiter(FixedLimit(10), partitions=level_partitions(), clock=clock)
    shedder = LoadShedder(limiter, clock=clock)
    tickets = []
    refused = 0
    for _ in range(20):
        try:
            tickets.append(admit_level(shedder, 3))
        except fw.OverloadedError:
            refused += 1
    assert len(tickets) == 1 and refused == 19, "level 3 gets its share only: 1 of 10"
    tickets += [admit_level(shedder, 1) for _ in range(7)]
    for ticket in tickets:
        ticket.success()
