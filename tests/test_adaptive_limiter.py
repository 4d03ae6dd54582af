"""AdaptiveLimiter: tokens, partitions, the LIFO backlog, the policy shells, and a model check.

Behaviour after concurrency-limits' SimpleLimiterTest, AbstractPartitionedLimiterTest and
LifoBlockingLimiterTest (Netflix/concurrency-limits, concurrency-limits-core/src/test/...).
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from floodwall import ConfigError, Event, FakeClock, OverloadedError, Pipeline, TimeoutExceeded
from floodwall.adaptive import AdaptiveLimiter, AIMDLimit, FixedLimit, Limit, Token


async def _parked(clock: FakeClock) -> None:
    """Let the event loop run until some task sleeps on ``clock``."""
    for _ in range(100):
        if clock.pending_sleepers:
            return
        await asyncio.sleep(0)
    pytest.fail("nothing parked on the fake clock")


class Settable(Limit):
    """A limit the test moves by hand (concurrency-limits' SettableLimit)."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.next = value
        self.samples: list[tuple[float, bool]] = []

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        self.samples.append((rtt, dropped))
        return self.next


def test_tokens_up_to_the_limit_then_rejection(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(10), clock=clock)
    tokens = [limiter.acquire() for _ in range(10)]
    assert all(isinstance(t, Token) for t in tokens)
    assert limiter.acquire() is None
    assert limiter.rejected == 1
    assert tokens[0] is not None and tokens[0].success()
    assert limiter.acquire() is not None
    assert limiter.inflight == 10


def test_token_is_released_exactly_once(clock: FakeClock) -> None:
    algorithm = Settable(2)
    limiter = AdaptiveLimiter(algorithm, clock=clock)
    token = limiter.acquire()
    assert token is not None
    clock.advance(0.25)
    assert token.success() is True
    assert token.success() is False
    assert token.dropped() is False
    assert token.ignore() is False
    assert limiter.inflight == 0
    assert algorithm.samples == [(0.25, False)]
    assert token.closed


def test_outcomes_feed_the_algorithm(clock: FakeClock) -> None:
    algorithm = Settable(5)
    limiter = AdaptiveLimiter(algorithm, clock=clock)
    first, second, third = (limiter.acquire() for _ in range(3))
    assert first and second and third
    assert first.inflight == 1 and third.inflight == 3
    clock.advance(0.1)
    first.dropped()
    second.ignore()  # no sample
    third.success()
    assert [dropped for _, dropped in algorithm.samples] == [True, False]
    assert [rtt for rtt, _ in algorithm.samples] == pytest.approx([0.1, 0.1])


def test_limit_changes_take_effect_and_are_reported(clock: FakeClock) -> None:
    events: list[Event] = []
    algorithm = Settable(1)
    limiter = AdaptiveLimiter(algorithm, clock=clock, listeners=[events.append])
    token = limiter.acquire()
    assert token is not None and limiter.acquire() is None
    algorithm.next = 3
    token.success()
    assert limiter.limit == 3
    assert [limiter.acquire() is not None for _ in range(4)] == [True, True, True, False]
    kinds = [event.kind for event in events]
    assert kinds == ["rejected", "limit_changed", "rejected"]
    assert events[1].figures["new"] == 3


def test_aimd_drives_the_limit(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(AIMDLimit(initial_limit=20), clock=clock)
    tokens = [limiter.acquire() for _ in range(20)]
    for token in tokens:
        assert token is not None
        token.success()
    assert limiter.limit > 20
    for _ in range(5):
        token = limiter.acquire()
        assert token is not None
        token.dropped()
    assert limiter.limit == 20  # min_limit


def test_token_context_manager_classifies_exceptions(clock: FakeClock) -> None:
    algorithm = Settable(5)
    limiter = AdaptiveLimiter(algorithm, clock=clock)
    with limiter.acquire() or pytest.fail("no token"):
        pass
    with pytest.raises(TimeoutError), limiter.acquire() or pytest.fail("no token"):
        raise TimeoutError
    with pytest.raises(KeyError), limiter.acquire() or pytest.fail("no token"):
        raise KeyError("business error")
    assert [dropped for _, dropped in algorithm.samples] == [False, True]
    assert limiter.inflight == 0


# -- partitions --------------------------------------------------------------------------------


def test_partitions_guarantee_shares_and_lend_spare_capacity(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(10), partitions={"live": 0.7, "batch": 0.3}, clock=clock)
    # batch may borrow what nobody reserved, but never the 7 slots live is entitled to
    batch = [limiter.acquire("batch") for _ in range(5)]
    assert [t is not None for t in batch] == [True, True, True, False, False]
    live = [limiter.acquire("live") for _ in range(8)]
    assert [t is not None for t in live] == [True] * 7 + [False]
    stats = {s.name: s for s in limiter.partition_stats()}
    assert (stats["live"].share, stats["live"].inflight) == (7, 7)
    assert (stats["batch"].share, stats["batch"].inflight) == (3, 3)
    assert stats["unknown"].inflight == 0


def test_a_partition_borrows_when_others_idle_but_never_over_the_limit(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(10), partitions={"live": 0.5, "batch": 0.5}, clock=clock)
    live = [limiter.acquire("live") for _ in range(10)]
    assert sum(t is not None for t in live) == 5  # batch's 5 stay reserved while unused
    unknown = limiter.acquire("nobody")
    assert unknown is None  # nothing unreserved is left
    for token in live:
        if token is not None:
            token.success()
    roomy = AdaptiveLimiter(FixedLimit(10), partitions={"live": 0.6}, clock=clock)
    got = [roomy.acquire("other") for _ in range(6)]
    assert sum(t is not None for t in got) == 4  # 10 - 6 reserved for live


def test_partition_shares_follow_the_limit(clock: FakeClock) -> None:
    algorithm = Settable(10)
    limiter = AdaptiveLimiter(algorithm, partitions={"a": 0.5, "b": 0.5}, clock=clock)
    token = limiter.acquire("a")
    assert token is not None
    algorithm.next = 20
    token.success()
    assert {s.name: s.share for s in limiter.partition_stats()} == {"a": 10, "b": 10, "unknown": 0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"partitions": {"a": 0.7, "b": 0.5}}, "partition shares must add up to <= 1.0"),
        ({"partitions": {"a": 1.5}}, r"partitions\['a'\] must be a number in \[0, 1\]"),
        ({"backlog_size": -1}, "backlog_size must be an integer >= 0"),
        ({"backlog_order": "random"}, "backlog_order must be"),
        ({"backlog_timeout": -1}, "backlog_timeout must be"),
    ],
)
def test_limiter_options_are_validated(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AdaptiveLimiter(FixedLimit(1), **kwargs)  # type: ignore[arg-type]


def test_algorithm_must_be_a_limit() -> None:
    with pytest.raises(ConfigError, match="algorithm must be"):
        AdaptiveLimiter(10)  # type: ignore[arg-type]


# -- backlog (LIFO blocking) -------------------------------------------------------------------


async def test_async_backlog_serves_newest_first_and_times_out(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(1), backlog_size=2, backlog_timeout=1.0, clock=clock)
    holder = limiter.acquire()
    assert holder is not None
    old = asyncio.create_task(limiter.acquire_async())
    await asyncio.sleep(0)
    new = asyncio.create_task(limiter.acquire_async())
    await asyncio.sleep(0)
    full = await limiter.acquire_async()
    assert full is None  # backlog of 2 is full: refused at once
    assert limiter.backlog == 2
    holder.success()
    granted = await new  # LIFO: the newest waiter gets the freed token
    assert granted is not None
    await _parked(clock)
    clock.advance(1.0)
    assert await old is None  # the oldest timed out on the fake clock
    assert limiter.backlog == 0
    granted.success()
    assert limiter.inflight == 0


async def test_async_backlog_fifo_and_cancellation(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(
        FixedLimit(1), backlog_size=5, backlog_order="fifo", backlog_timeout=10, clock=clock
    )
    holder = limiter.acquire()
    assert holder is not None
    first = asyncio.create_task(limiter.acquire_async())
    second = asyncio.create_task(limiter.acquire_async())
    cancelled = asyncio.create_task(limiter.acquire_async())
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    holder.success()
    token = await first  # FIFO: the oldest first
    assert token is not None
    token.success()
    token2 = await second
    assert token2 is not None
    token2.success()
    assert limiter.inflight == 0 and limiter.backlog == 0


async def test_async_waiter_cancelled_as_the_token_arrives_gives_it_back(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(1), backlog_size=1, clock=clock)
    holder = limiter.acquire()
    assert holder is not None
    waiter = asyncio.create_task(limiter.acquire_async())
    await asyncio.sleep(0)
    holder.success()  # grants the token and schedules its delivery
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.sleep(0)
    assert limiter.inflight == 0


def test_blocking_backlog_with_threads(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(1), backlog_size=1, backlog_timeout=30, clock=clock)
    holder = limiter.acquire()
    assert holder is not None
    got: list[Token | None] = []
    waiter = threading.Thread(target=lambda: got.append(limiter.acquire_blocking()))
    waiter.start()
    while limiter.backlog == 0:  # spin (no sleep) until the thread has parked itself
        os.sched_yield()
    assert limiter.acquire_blocking(max_wait=0) is None  # no waiting allowed
    holder.success()
    waiter.join(5)
    assert got and got[0] is not None
    got[0].success()
    assert limiter.inflight == 0


def test_blocking_without_backlog_is_plain_acquire(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(1), clock=clock)
    assert limiter.acquire_blocking() is not None
    assert limiter.acquire_blocking() is None


# -- policy shells -----------------------------------------------------------------------------


def test_call_raises_overloaded_and_closes_tokens(clock: FakeClock) -> None:
    algorithm = Settable(1)
    limiter = AdaptiveLimiter(algorithm, name="api", clock=clock)
    assert limiter.call(lambda: 42) == 42
    holder = limiter.acquire()
    with pytest.raises(OverloadedError) as info:
        limiter.call(lambda: 1)
    assert info.value.kind == "overloaded"
    assert info.value.name == "api"
    assert "concurrency limit 1 reached" in str(info.value)
    assert holder is not None
    holder.success()

    def slow() -> None:
        raise TimeoutExceeded("t", 1.0)

    with pytest.raises(TimeoutExceeded):
        limiter.call(slow)
    assert [dropped for _, dropped in algorithm.samples] == [False, False, True]
    assert "AdaptiveLimiter(" in str(Pipeline(limiter))


async def test_call_async_and_decorator(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(1), backlog_size=1, clock=clock)

    @limiter
    async def work(x: int) -> int:
        return x * 2

    assert await work(21) == 42
    holder = limiter.acquire()
    assert holder is not None
    pending = asyncio.create_task(work(1))
    await _parked(clock)  # the backlog timer waits on the fake clock
    clock.advance(1.0)
    with pytest.raises(OverloadedError):
        await pending
    holder.success()


# -- the model: never more tokens out than the limit; each released once ------------------------


class LimiterModel(RuleBasedStateMachine):
    """Random acquires, releases, double releases and limit moves against a tiny model."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.algorithm = Settable(3)
        self.limiter = AdaptiveLimiter(
            self.algorithm, partitions={"a": 0.5, "b": 0.25}, clock=self.clock
        )
        self.open: list[Token] = []
        self.closed: list[Token] = []

    @rule(partition=st.sampled_from(["a", "b", None, "zzz"]))
    def acquire(self, partition: str | None) -> None:
        before = self.limiter.inflight
        token = self.limiter.acquire(partition)
        if token is None:
            return
        assert before < self.limiter.limit  # admitted only below the limit
        self.open.append(token)

    @precondition(lambda self: bool(self.open))
    @rule(
        index=st.integers(min_value=0),
        how=st.sampled_from(["success", "dropped", "ignore"]),
        new_limit=st.integers(1, 8),
    )
    def release(self, index: int, how: str, new_limit: int) -> None:
        token = self.open.pop(index % len(self.open))
        self.algorithm.next = new_limit
        self.clock.advance(0.01)
        assert getattr(token, how)() is True
        self.closed.append(token)

    @precondition(lambda self: bool(self.closed))
    @rule(index=st.integers(min_value=0), how=st.sampled_from(["success", "dropped", "ignore"]))
    def release_again(self, index: int, how: str) -> None:
        token = self.closed[index % len(self.closed)]
        assert getattr(token, how)() is False

    @invariant()
    def counts_match(self) -> None:
        assert self.limiter.inflight == len(self.open)
        stats = self.limiter.partition_stats()
        assert sum(s.inflight for s in stats) == len(self.open)
        assert sum(s.share for s in stats) <= self.limiter.limit


TestLimiterModel = LimiterModel.TestCase
TestLimiterModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_threads_never_exceed_the_limit() -> None:
    limiter = AdaptiveLimiter(FixedLimit(4))
    peak = [0]
    lock = threading.Lock()
    out = [0]

    def worker() -> None:
        for _ in range(2000):
            token = limiter.acquire()
            if token is None:
                continue
            with lock:
                out[0] += 1
                peak[0] = max(peak[0], out[0])
            with lock:
                out[0] -= 1
            token.success()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] <= 4
    assert limiter.inflight == 0
