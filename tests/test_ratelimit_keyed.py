"""Keyed limiters: per-key state, bounded memory, idle eviction, no reset of active keys."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall.ratelimit import (
    GCRA,
    FixedWindow,
    Keyed,
    LeakyBucket,
    Multi,
    RateLimiter,
    SlidingLog,
    SlidingWindowCounter,
    TokenBucket,
    WarmUp,
)


def test_keys_are_independent() -> None:
    clock = fw.FakeClock()
    posts = Keyed(FixedWindow("5/h", clock=clock))
    assert [posts.try_acquire("alice") for _ in range(6)] == [True] * 5 + [False]
    assert posts.try_acquire("bob")
    assert posts.acquire("alice").retry_after == 3600.0
    assert posts.acquire("bob").remaining == 3
    assert len(posts) == 2
    assert "alice" in posts
    assert posts.try_acquire(None)  # None is a key like any other


def test_idle_keys_are_evicted_and_nothing_changes_for_them() -> None:
    clock = fw.FakeClock()
    downloads = Keyed(FixedWindow("1/30s", clock=clock), max_keys=3)
    for user in ("a", "b", "c"):
        assert downloads.try_acquire(user)
    clock.advance(30.0)  # every window has closed: all three keys are idle
    assert downloads.try_acquire("d")  # room made by evicting an idle key ("a")
    assert downloads.try_acquire("e")  # and another ("b")
    assert len(downloads) == 3
    assert "a" not in downloads
    # evicted or not, an idle key decides exactly as before: one download, then no
    assert downloads.try_acquire("c")
    assert not downloads.try_acquire("c")
    assert not downloads.try_acquire("a")  # no room: d, e and c are active


def test_a_full_table_of_active_keys_refuses_new_keys_and_keeps_the_active() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(TokenBucket("1/10s", clock=clock), max_keys=2)
    assert limiter.try_acquire("a")
    clock.advance(1.0)
    assert limiter.try_acquire("b")
    refused = limiter.acquire("c")
    assert not refused
    assert refused.retry_after == pytest.approx(9.0)  # "a" refills at 10 s
    # the active keys were not reset to make room
    assert not limiter.try_acquire("a")
    assert not limiter.try_acquire("b")
    with pytest.raises(fw.RateLimitedError, match="exceeded"):
        limiter.call(lambda: None)
    clock.advance(9.0)  # "a" is idle now
    assert limiter.try_acquire("c")
    assert "a" not in limiter
    assert not limiter.try_acquire("b")  # still active, still counted


def test_overflow_shared_limits_untracked_keys_collectively() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(FixedWindow("2/m", clock=clock), max_keys=1, overflow="shared")
    assert limiter.try_acquire("tracked")
    assert limiter.try_acquire("x")  # shares one state with every untracked key
    assert limiter.try_acquire("y")
    assert not limiter.try_acquire("z")
    assert len(limiter) == 1


def test_the_full_table_scan_runs_once_until_a_key_can_be_idle() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(FixedWindow("1/h", clock=clock), max_keys=100)
    for i in range(100):
        assert limiter.try_acquire(i)
    looked_at: list[object] = []
    idle_at = limiter._idle

    def counting(st: Any) -> float:
        looked_at.append(st)
        return idle_at(st)

    limiter._idle = counting
    for i in range(100, 200):
        assert not limiter.try_acquire(i)
    assert len(looked_at) == 100  # one full scan; the 99 refusals after it cost O(1)
    assert limiter.acquire("late").retry_after == 3600.0  # when the first key goes idle
    clock.advance(3600.0)
    assert limiter.try_acquire("new")
    assert len(looked_at) == 101  # the oldest key was idle: evicted at the first look


def test_sweep_forgets_idle_keys_and_keeps_active_ones() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(GCRA("1/s", burst=0, clock=clock))
    for i in range(10):
        limiter.try_acquire(i)
    clock.advance(0.5)
    assert limiter.sweep() == 0
    clock.advance(0.5)
    limiter.try_acquire(3)
    assert limiter.sweep() == 9
    assert len(limiter) == 1 and 3 in limiter
    assert limiter.evicted == 9


def test_peek_and_reset_per_key() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(FixedWindow("1/m", clock=clock))
    assert limiter.peek("new").allowed
    assert "new" not in limiter  # peeking tracks nothing
    assert limiter.try_acquire("k")
    assert not limiter.peek("k").allowed
    limiter.reset("k")
    assert limiter.try_acquire("k")


def test_keyed_as_a_policy_takes_its_key_from_the_arguments() -> None:
    clock = fw.FakeClock()
    per_user = Keyed(FixedWindow("1/m", clock=clock), key=lambda user, *_: user)

    @per_user
    def download(user: str, item: str) -> str:
        return f"{user}:{item}"

    assert download("ann", "a") == "ann:a"
    assert download("bob", "a") == "bob:a"
    with pytest.raises(fw.RateLimitedError) as caught:
        download("ann", "b")
    assert caught.value.retry_after == 60.0


async def test_keyed_async_and_wait() -> None:
    clock = fw.FakeClock()
    per_user = Keyed(TokenBucket("1/s", burst=0, clock=clock), max_wait=5.0, key=str)

    async def work(user: str) -> str:
        return user

    assert await per_user.call_async(work, "a") == "a"
    assert await per_user.wait_async("b")
    pending = asyncio.create_task(per_user.call_async(work, "a"))
    await asyncio.sleep(0)
    assert not pending.done()  # paced: waits for its token
    clock.advance(1.0)
    assert await pending == "a"
    assert clock.sleeps == [1.0]


def test_multi_can_be_keyed() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(Multi.of("2/s", "3/m", algorithm=FixedWindow, clock=clock))
    assert [limiter.try_acquire("u") for _ in range(3)] == [True, True, False]
    clock.advance(1.0)
    assert [limiter.try_acquire("u") for _ in range(2)] == [True, False]
    assert limiter.try_acquire("v")


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 7), st.sampled_from([0, 0, 0, 1, 30, 200])), max_size=120
    ),
    max_keys=st.integers(1, 5),
)
def test_keyed_decides_like_unbounded_per_key_limiters(
    ops: list[tuple[int, int]], max_keys: int
) -> None:
    """Eviction is invisible: every admitted or refused decision of a tracked key is what an
    unbounded dict of limiters would decide; untracked keys are only ever refused."""
    clock = fw.FakeClock()
    keyed = Keyed(TokenBucket("1/s", burst=1, clock=clock), max_keys=max_keys)
    reference: dict[int, TokenBucket] = {}
    for key, dt in ops:
        clock.advance(dt / 16)
        model = reference.setdefault(key, TokenBucket("1/s", burst=1, clock=clock))
        decision = keyed.acquire(key)
        if key in keyed:
            assert decision.allowed == model.try_acquire()
        else:
            assert not decision.allowed  # refused for room: like the model, nothing charged
        assert len(keyed) <= max_keys


def test_keyed_is_thread_safe() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(FixedWindow("100/h", clock=clock), max_keys=1000)
    counts = [0] * 8

    def worker(index: int) -> None:
        for i in range(2000):
            if limiter.try_acquire(i % 16):
                counts[index] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts) == 16 * 100  # exactly the limit per key, never more


MakeLimiter = Callable[[fw.FakeClock], RateLimiter[Any]]
KEYS = 100_000


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda c: TokenBucket("5/h", clock=c), id="token_bucket"),
        pytest.param(lambda c: GCRA("5/h", clock=c), id="gcra"),
        pytest.param(lambda c: FixedWindow("5/h", clock=c), id="fixed_window"),
        pytest.param(lambda c: SlidingWindowCounter("5/h", clock=c), id="sliding_counter"),
    ],
)
def test_memory_per_key_with_tracemalloc(make: MakeLimiter) -> None:
    """100 000 active keys cost at most 256 bytes each (key strings aside); once idle and
    swept they cost nothing but the empty tables (under a byte per key of the bound)."""
    clock = fw.FakeClock(1000.0)
    limiter = Keyed(make(clock), max_keys=KEYS)
    keys = [f"user-{i}" for i in range(KEYS)]  # the key strings are the caller's
    acquire = limiter.try_acquire
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for key in keys:
            acquire(key)
        active = tracemalloc.get_traced_memory()[0] - base
        clock.advance(7200.0)
        assert limiter.sweep() == KEYS
        gc.collect()
        idle = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    name = limiter.limiter.algorithm
    print(f"{name}: {active / KEYS:.1f} B per active key, {idle / KEYS:.3f} B per idle key")
    assert active / KEYS <= 256
    # what stays is the empty tables themselves: one per Keyed.SHARD_KEYS keys of the bound
    assert idle <= 256 * len(limiter._tables)
    assert idle / KEYS < 1


def test_memory_of_the_exact_log_grows_with_its_limit() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(SlidingLog("5/h", clock=clock), max_keys=1000)
    keys = [f"k{i}" for i in range(1000)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for key in keys:
            limiter.try_acquire(key, cost=5)
        per_key = (tracemalloc.get_traced_memory()[0] - base) / 1000
    finally:
        tracemalloc.stop()
    assert per_key <= 256 + 5 * 16  # 8 bytes per remembered grant, the array over-allocates


def test_warm_up_keys_start_cold_and_idle_keys_are_cold_again() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(WarmUp("10/s", warmup=1.0, clock=clock))
    assert limiter.try_acquire("a")
    clock.advance(0.05)
    assert not limiter.try_acquire("a")  # cold: 0.3 s between requests
    clock.advance(5.0)
    assert limiter.sweep() == 1


PACKED: list[Any] = [
    pytest.param(lambda c: TokenBucket("3/s", burst=1, clock=c), id="token_bucket"),
    pytest.param(lambda c: GCRA("3/s", clock=c), id="gcra"),
    pytest.param(lambda c: FixedWindow("3/s", clock=c), id="fixed_window"),
    pytest.param(lambda c: SlidingWindowCounter("3/s", clock=c), id="sliding_counter"),
    pytest.param(lambda c: LeakyBucket("3/s", queue=2, clock=c), id="leaky_bucket"),
    pytest.param(lambda c: WarmUp("3/s", warmup=2.0, clock=c), id="warm_up"),
    pytest.param(
        lambda c: Multi(TokenBucket("3/s", clock=c), FixedWindow("5/2s", clock=c)), id="multi"
    ),
]


@pytest.mark.parametrize("make", PACKED)
def test_keyed_states_are_numbers_the_collector_does_not_track(make: MakeLimiter) -> None:
    clock = fw.FakeClock(1000.0)
    limiter = Keyed(make(clock), max_keys=5000)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(5000):
        limiter.try_acquire(f"user-{i}")
    gc.collect()
    assert len(gc.get_objects()) - before < 500  # 5 000 keys, no tracked object each
    packed = [value for table in limiter._tables for value in table.values()]
    assert len(packed) == 5000 and not any(gc.is_tracked(value) for value in packed)


@pytest.mark.parametrize("make", PACKED)
@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.integers(0, 5),
            st.sampled_from([0, 0, 1, 5, 40]),
            st.sampled_from(["acquire", "try_acquire", "peek", "wait", "reset"]),
        ),
        max_size=80,
    )
)
def test_packed_keyed_states_decide_like_one_limiter_per_key(
    make: MakeLimiter, ops: list[tuple[int, int, str]]
) -> None:
    """Every shell on a keyed limiter (packing each state back after it) decides as one plain
    limiter per key does, the figures included."""
    clock = fw.FakeClock(1000.0)
    keyed = Keyed(make(clock), max_keys=10)
    models: dict[int, RateLimiter[Any]] = {}
    for key, dt, shell in ops:
        clock.advance(dt / 16)
        model = models.setdefault(key, make(clock))
        if shell == "try_acquire":
            assert keyed.try_acquire(key) == model.try_acquire()
        elif shell == "wait":
            assert keyed.wait(key, max_wait=0) == model.wait(max_wait=0)
        elif shell == "reset":
            keyed.reset(key)
            model.reset()
        else:
            assert getattr(keyed, shell)(key) == getattr(model, shell)()


@pytest.fixture
def small_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables of 4 keys, so a bound of a few dozen keys spans several of them."""
    monkeypatch.setattr(Keyed, "SHARD_KEYS", 4)


@pytest.mark.usefixtures("small_tables")
def test_the_bound_is_kept_across_tables_and_any_table_makes_room() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(FixedWindow("1/h", clock=clock), max_keys=40)
    assert len(limiter._tables) == 10
    for i in range(40):  # the whole bound is usable, however the keys fall into tables
        assert limiter.try_acquire(i)
    assert len(limiter) == 40
    for i in range(40, 60):
        assert not limiter.try_acquire(i)  # every tracked key is active
    assert len(limiter) == 40 and limiter.evicted == 0
    clock.advance(3601.0)  # all idle now: new keys take their places, in any table
    crowded = [1000 + 10 * i for i in range(40)]  # all in one table: hash(n) == n for ints
    assert {hash(key) % 10 for key in crowded} == {0}
    for key in crowded:  # its own table has room for 4: the others give theirs in turn
        assert limiter.try_acquire(key)
        assert len(limiter) == 40
    assert len(limiter._tables[0]) == 40 and limiter.evicted == 40
    assert not limiter.try_acquire(2000)  # and now every tracked key is active again
    assert limiter.sweep() == 0 and len(limiter) == 40


@pytest.mark.usefixtures("small_tables")
@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 30), st.sampled_from([0, 0, 0, 1, 30, 200])), max_size=200
    ),
    max_keys=st.integers(8, 24),
)
def test_keyed_over_several_tables_decides_like_unbounded_per_key_limiters(
    ops: list[tuple[int, int]], max_keys: int
) -> None:
    clock = fw.FakeClock()
    keyed = Keyed(TokenBucket("1/s", burst=1, clock=clock), max_keys=max_keys)
    assert len(keyed._tables) > 1
    reference: dict[int, TokenBucket] = {}
    for key, dt in ops:
        clock.advance(dt / 16)
        model = reference.setdefault(key, TokenBucket("1/s", burst=1, clock=clock))
        decision = keyed.acquire(key)
        if key in keyed:
            assert decision.allowed == model.try_acquire()
        else:
            assert not decision.allowed
        assert len(keyed) == sum(len(table) for table in keyed._tables) <= max_keys


def test_sweep_gives_back_the_memory_of_tables_left_mostly_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Keyed, "SHARD_KEYS", 5000)  # four tables of 20 000 keys
    clock = fw.FakeClock()
    limiter = Keyed(FixedWindow("1/s", clock=clock), max_keys=20_000)
    assert len(limiter._tables) == 4
    for i in range(19_000):
        limiter.try_acquire(i)
    clock.advance(0.9)
    for i in range(19_000, 20_000):
        limiter.try_acquire(i)
    full = sum(sys.getsizeof(table) for table in limiter._tables)
    clock.advance(0.15)  # the first windows have ended, the last 1 000 have not
    assert limiter.sweep() == 19_000 and len(limiter) == 1000
    kept = sum(sys.getsizeof(table) for table in limiter._tables)
    assert kept < full / 8  # every table rebuilt at its size: dicts never shrink on their own
    assert all(limiter.peek(i).remaining == 0 for i in range(19_000, 20_000))


@settings(max_examples=80, deadline=None)
@given(
    rate=st.sampled_from(["3/s", "10/s", "7/2s", "1000000/s"]),
    burst=st.integers(0, 4),
    steps=st.lists(
        st.tuples(st.integers(0, 3_000_000), st.sampled_from([0, 1, 1, 1.0, 2, 5, 40])), max_size=40
    ),
)
def test_gcra_decides_on_a_packed_state_as_its_four_steps_do(
    rate: str, burst: int, steps: list[tuple[int, float]]
) -> None:
    """``_decide_packed`` (what a keyed GCRA calls for a tracked key) keeps the state and
    gives the decision that unpacking, deciding, the figures and packing give."""
    limiter = GCRA(rate, burst=burst, clock=fw.FakeClock())
    now = 1000.0
    fused = stepwise = limiter._pack(limiter._new_state(now))
    for dt_us, cost in steps:
        now += dt_us / 1_000_000
        fused, decision = limiter._decide_packed(fused, now, cost)
        state = limiter._unpack(stepwise)
        expected = limiter._figures(state, now, cost, limiter._decide(state, now, cost))
        stepwise = limiter._pack(state)
        assert (fused, decision) == (stepwise, expected)
        assert type(decision) is type(expected)
