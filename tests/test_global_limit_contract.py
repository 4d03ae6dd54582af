"""One contract for every global limiter on every store: memory, Redis, Redis Cluster,
PostgreSQL, SQLite (the ``store_case`` fixtures start real servers), sync and async.

* the in-memory limiters' contract on quotas that real time cannot disturb (``5/h``): quota,
  figures, costs, keys, policy errors, concurrency from threads and tasks;
* **Lua ≡ step**: random batches and leases on a short rate, with real pauses; every reply
  carries the store's time in µs, and replaying the same requests at those times through the
  ops' Python steps (on a fake clock) must give identical replies, so the Lua scripts, the SQL
  stores and the memory store implement one algorithm, bit for bit;
* idle keys vanish (Redis TTLs, SQL expiry) and come back fresh;
* leased and time-slice limiters on each store.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest

import floodwall as fw
from conftest import StoreCase
from floodwall.ratelimit import Rate, StoreDownDecision
from floodwall.shared._global_ops import Batch, plan
from floodwall.shared.global_limit import GlobalLimiter
from floodwall.shared.leasing import LeasedLimiter
from floodwall.shared.timeslice import SLICE_SYNC
from floodwall.stores import Arg, MemoryStore, Store
from floodwall.stores.redis import RedisStore

KINDS = ["fixed_window", "sliding_window_counter", "token_bucket", "gcra"]


def _limiter(case: StoreCase, kind: str, rate: str, **options: Any) -> GlobalLimiter:
    clock = case.clock if case.clock is not None else fw.SYSTEM_CLOCK
    return GlobalLimiter(kind, rate, store=case.store, clock=clock, **options)


@pytest.mark.parametrize("kind", KINDS)
def test_the_quota_and_its_figures(store_case: StoreCase, kind: str) -> None:
    limiter = _limiter(store_case, kind, "5/h")
    decisions = [limiter.acquire() for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0, 0]
    assert all(d.limit == 5 for d in decisions)
    refused = decisions[-1]
    # The weighted estimate keeps the previous window's count for a while: the sliding counter
    # can take up to a period plus the share one permit has of it (here 3600 + 3600/5 s),
    # depending on where in the clock's hour the test runs.
    longest = 3600 * (1 + 1 / 5) if kind == "sliding_window_counter" else 3600
    assert 0 < refused.retry_after <= longest
    assert refused.reset_after <= 7200
    assert limiter.acquire("other").allowed, "keys are independent"
    assert not limiter.acquire("other", cost=5).allowed
    assert limiter.acquire("other", cost=4).allowed, "a cost counts as that many permits"
    assert limiter.acquire("third", cost=6).retry_after == float("inf")
    with pytest.raises(fw.RateLimitedError) as caught:
        limiter.call(lambda: None)
    assert caught.value.retry_after == pytest.approx(limiter.acquire().retry_after, abs=1.0)


@pytest.mark.parametrize("kind", KINDS)
def test_threads_never_get_more_than_the_quota(store_case: StoreCase, kind: str) -> None:
    limiter = _limiter(store_case, kind, "10/h")
    allowed: list[bool] = []
    barrier = threading.Barrier(4)

    def racer() -> None:
        barrier.wait()
        allowed.extend(limiter.try_acquire() for _ in range(8))

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(allowed) == 32 and allowed.count(True) == 10


async def _forty_at_once(case: StoreCase, kind: str) -> tuple[GlobalLimiter, list[fw.Decision]]:
    """40 concurrent acquisitions of a ``10/h`` quota, all answered by the store.

    The limiter fails closed so that an answer the store did not give shows: a request queued
    behind a batch for longer than the store's timeout takes the ``on_store_error`` answer, and
    the default (``"local"``) admits it in process up to the whole quota, beside what the store
    admitted. In CI under a CPU hog on both cores PostgreSQL admitted 11: the first request's
    batch answered by the store and, by all signs, the 39 queued behind it admitted in process
    (1 + 10; with a 3 ms store timeout, every answer local, the count is 10). Such a run tests
    the outage path, not the quota: it is redone on a new key (at most five times), after one
    call that opens the store's connection outside the measured batch."""
    for attempt in range(5):
        limiter = _limiter(
            case, kind, "10/h", name=f"{kind}-{attempt}", on_store_error="fail_closed"
        )
        await limiter.try_acquire_async("warm-up")
        decisions = await asyncio.gather(*(limiter.acquire_async() for _ in range(40)))
        if not any(isinstance(d, StoreDownDecision) for d in decisions):
            return limiter, decisions
    pytest.fail(f"five batches of {kind} in a row outlived the store's timeout")


@pytest.mark.parametrize("kind", KINDS)
async def test_concurrent_tasks_are_batched_and_get_exactly_the_quota(
    async_store_case: StoreCase, kind: str
) -> None:
    limiter, decisions = await _forty_at_once(async_store_case, kind)
    assert [d.allowed for d in decisions].count(True) == 10
    if async_store_case.kind not in ("memory", "host"):  # no server: answers without suspending
        assert limiter.batches < 40 / 4, "coalesced into a few round trips"
    assert await limiter.try_acquire_async("other")
    with pytest.raises(fw.RateLimitedError):
        await limiter.call_async(asyncio.sleep, 0)
    await limiter.reset_async()
    assert await limiter.try_acquire_async()


def _replay(kind: str, rate: Rate, log: list[tuple[list[Arg], Batch]]) -> None:
    """Run the logged requests through the Python steps at the logged store times."""
    p = plan(kind, rate, None, None)
    clock = fw.FakeClock(log[0][1][0] / 1_000_000)
    store = MemoryStore(clock=clock)
    for args, reply in log:
        clock.advance(reply[0] / 1_000_000 - clock.monotonic())
        assert store.apply(p.op, "k", args) == reply, (args, reply)


@pytest.mark.parametrize("kind", KINDS)
def test_every_store_runs_the_same_algorithm_bit_for_bit(store_case: StoreCase, kind: str) -> None:
    rng = random.Random(kind)
    rate = Rate(5, 0.06)
    p = plan(kind, rate, None, None)
    log: list[tuple[list[Arg], Batch]] = []
    for _ in range(40):
        pairs: list[int] = []
        for _ in range(rng.choice([1, 1, 1, 3, 6])):
            cost = rng.randint(0, 3)
            pairs += [cost, cost + (rng.randint(1, 5) if rng.random() < 0.3 else 0)]
        args: list[Arg] = [*p.params, *pairs]
        log.append((args, store_case.store.apply(p.op, "k", args)))
        if rng.random() < 0.3:
            store_case.wait(rng.choice([0.002, 0.01, 0.03]))
    _replay(kind, rate, log)
    assert any(v[0] for _, (_, vs) in log for v in vs) and not all(
        v[0] for _, (_, vs) in log for v in vs
    )


IDLE_RATE = "3/0.5s"
REFILL = 0.5 / 3
"""Seconds for one permit of ``IDLE_RATE`` to come back (token bucket, GCRA): the shortest span
over which four decisions can see a permit return."""


def _filled(case: StoreCase, kind: str) -> tuple[GlobalLimiter, str]:
    """A limiter of ``kind`` whose key was just taken to its quota (3 allowed, the 4th refused)
    and its full key. On a real clock the four decisions and the TTL read must fit in one
    :data:`REFILL`, measured on this process's clock (which bounds the store's span): a fill the
    machine stretched past it (a 251 ms one in 600 under a CPU hog on both cores, where the
    median is 2 ms) lets a permit come back, so it proves nothing and is redone on a new key."""
    store = case.store
    for attempt in range(5):
        limiter = _limiter(case, kind, IDLE_RATE, name=f"{kind}-{attempt}")
        key = store.keys(limiter.plan.op, f"rl:{limiter.name}")[0]
        if case.clock is None and kind == "sliding_window_counter":
            time.sleep(0.5 - time.time() % 0.5 + 0.01)  # begin just after a grid window starts
        began = time.monotonic()
        verdicts = [limiter.try_acquire() for _ in range(4)]
        ttl = store.client().pttl(key) if isinstance(store, RedisStore) else None
        if case.clock is not None or time.monotonic() - began < REFILL:
            assert verdicts == [True, True, True, False], kind
            assert ttl is None or 0 < ttl <= 2 * 500 + 1, "PX set to the state's own lifetime"
            return limiter, key
    pytest.fail(f"five fills of {kind} in a row took longer than {REFILL:.3f} s")


def test_idle_keys_vanish_and_come_back_fresh(store_case: StoreCase) -> None:
    store = store_case.store
    filled = [_filled(store_case, kind) for kind in KINDS]
    store_case.wait(1.6)  # past every algorithm's idle time (at most two 0.5 s windows)
    for limiter, key in filled:
        if isinstance(store, RedisStore):
            assert store.client().exists(key) == 0
        elif isinstance(store, MemoryStore):
            assert store.raw(key) is None
        assert limiter.acquire().remaining == 2, f"{limiter.algorithm}: a fresh state"


def test_leases_share_one_quota(store_case: StoreCase) -> None:
    clock = store_case.clock if store_case.clock is not None else fw.SYSTEM_CLOCK
    a, b = (
        LeasedLimiter("gcra", "20/h", store=store_case.store, clock=clock, lease=5)
        for _ in range(2)
    )
    admitted = sum(a.try_acquire() + b.try_acquire() for _ in range(30))
    assert admitted + a.held() + b.held() == 20
    assert a.leases + b.leases <= 8


def _sync(store: Store, me: str, count: int) -> tuple[int, bool, int, int]:
    # 1 s slices, reports lasting 2 slices, a lease of 3: nothing goes stale during the test
    return store.apply(SLICE_SYNC, "ts:t", [me, count, 1_000_000, 100_000, 10_000_000, 2, 3])


def test_time_slice_reports_elect_one_and_publish_the_drop_rate(store_case: StoreCase) -> None:
    store = store_case.store
    assert _sync(store, "a", 60) == (0, True, 60_000, 1)
    assert _sync(store, "b", 60) == (0, False, -1, 0)
    assert _sync(store, "a", 60) == (166_667, True, 120_000, 2), "(120 − 100) / 120"
    assert _sync(store, "b", 40) == (166_667, False, -1, 0)
    assert _sync(store, "a", 50) == (0, True, 90_000, 2)


def test_a_time_slice_op_keeps_its_three_records_in_one_slot() -> None:
    from redis.crc import key_slot

    keys = MemoryStore().keys(SLICE_SYNC, "ts:t")
    assert len(keys) == 3 and len({key_slot(k.encode()) for k in keys}) == 1
