"""Global, leased and time-slice limiters on a FakeClock: shells, batching, leases, drop rates,
and what each does when its store is down.

The store here is a real :class:`Store` (a memory store underneath) that counts round trips and
whose backend can be switched off, raising :class:`StoreUnavailableError` from a real
``ConnectionRefusedError`` as the Redis and SQL stores do. Real servers are in
``tests/test_global_limit_contract.py`` and ``tests/integration/test_global_limit_*.py``.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest

import floodwall as fw
from conftest import Shell, SwitchableStore
from floodwall.ratelimit import StoreDownDecision
from floodwall.shared.global_limit import GlobalLimiter
from floodwall.shared.leasing import LeasedLimiter
from floodwall.shared.timeslice import TimeSliceLimiter
from floodwall.stores import MemoryStore, Store


@pytest.fixture
def store(clock: fw.FakeClock) -> SwitchableStore:
    return SwitchableStore(clock, "counting://test", "c:")


# -- GlobalLimiter: the policy shells ---------------------------------------------------------


def test_call_admits_then_raises_rate_limited_with_retry_after(
    clock: fw.FakeClock, store: SwitchableStore, shell: Shell
) -> None:
    limiter = GlobalLimiter("gcra", "2/s", burst=1, store=store, clock=clock)
    assert [shell.run(limiter, lambda: "ok") for _ in range(2)] == ["ok", "ok"]
    with pytest.raises(fw.RateLimitedError) as caught:
        shell.run(limiter, lambda: "no")
    assert caught.value.retry_after == pytest.approx(0.5)
    assert limiter.rejected == 1
    clock.advance(0.5)
    assert shell.run(limiter, lambda: "again") == "again"


async def test_decorators_and_keys(clock: fw.FakeClock, store: SwitchableStore) -> None:
    limiter = GlobalLimiter(
        "fixed", "1/m", store=store, clock=clock, key=lambda user, **_: f"user:{user}"
    )

    @limiter
    async def post(user: str) -> str:
        return user

    @limiter
    def get(user: str) -> str:
        return user

    assert await post("ann") == "ann"
    assert get("bob") == "bob", "keys are independent"
    with pytest.raises(fw.RateLimitedError):
        await post("ann")
    assert store.inner.raw("c:{rl:global:user:ann}") is not None


def test_wait_paces_on_the_limiters_clock(clock: fw.FakeClock, store: SwitchableStore) -> None:
    limiter = GlobalLimiter("gcra", "4/s", burst=0, store=store, clock=clock, max_wait=1.0)
    start = clock.monotonic()
    for _ in range(4):
        limiter.call(lambda: None)
    assert clock.monotonic() - start == pytest.approx(0.75, abs=1e-5)
    assert all(s == pytest.approx(0.25, abs=1e-5) for s in clock.sleeps)
    refused = limiter.wait(cost=5)
    assert not refused.allowed and refused.retry_after == math.inf
    with fw.deadline(0.1, clock=clock), pytest.raises(fw.RateLimitedError):
        limiter.call(lambda: None)  # the next slot is 0.25 s away, past the deadline


async def test_wait_async_paces_too(clock: fw.FakeClock, store: SwitchableStore) -> None:
    limiter = GlobalLimiter("token", "2/s", burst=0, store=store, clock=clock)
    assert (await limiter.wait_async(max_wait=1.0)).allowed
    waiter = asyncio.ensure_future(limiter.wait_async(max_wait=1.0))
    for _ in range(10):  # let the waiter be refused and park on the clock
        await asyncio.sleep(0)
    assert clock.pending_sleepers == 1
    clock.advance(0.5)
    assert (await waiter).allowed


def test_reset_snapshot_describe_and_rejected_events(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    events: list[fw.Event] = []
    limiter = GlobalLimiter(
        "sliding", "2/h", store=store, clock=clock, name="posts", listeners=[events.append]
    )
    assert limiter.try_acquire("k") and limiter.try_acquire("k")
    assert not limiter.try_acquire("k")
    assert [e.kind for e in events] == ["rejected"]
    assert events[0].figures["key"] == "k" and events[0].figures["remaining"] == 0
    limiter.reset("k")
    assert limiter.try_acquire("k")
    assert limiter.snapshot()["rejected"] == 1 and limiter.snapshot()["state"] == "up"
    assert limiter.describe() == (
        "GlobalLimiter('posts', sliding_window_counter, 2/h, store=counting://test, "
        "on_store_error=local)"
    )


# -- GlobalLimiter: batching ----------------------------------------------------------------


async def test_concurrent_async_decisions_share_round_trips(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = GlobalLimiter("gcra", "20/h", store=store, clock=clock)
    decisions = await asyncio.gather(*(limiter.acquire_async() for _ in range(32)))
    assert store.calls == 2, "the first goes alone, the 31 that queued meanwhile go together"
    assert limiter.batches == 2
    assert [d.allowed for d in decisions] == [True] * 20 + [False] * 12, "arrival order"
    assert [d.remaining for d in decisions[:20]] == list(range(19, -1, -1))


async def test_batches_are_bounded_and_keys_do_not_share_them(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = GlobalLimiter("fixed", "100/h", store=store, clock=clock, max_batch=8)
    await asyncio.gather(*(limiter.acquire_async() for _ in range(33)))
    assert store.calls == 1 + 4
    store.calls = 0
    await asyncio.gather(*(limiter.acquire_async(f"k{n % 3}") for n in range(24)))
    assert store.calls == 3 * 2, "per key: the first alone, then the 7 that queued behind it"


async def test_without_batching_every_request_is_its_own_round_trip(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = GlobalLimiter("gcra", "100/h", store=store, clock=clock, batch=False)
    await asyncio.gather(*(limiter.acquire_async() for _ in range(10)))
    assert store.calls == 10


async def test_a_cancelled_waiter_is_left_out_of_its_batch(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = GlobalLimiter("fixed", "3/h", store=store, clock=clock)
    first = asyncio.ensure_future(limiter.acquire_async())
    await asyncio.sleep(0)  # the first is in flight
    queued = [asyncio.ensure_future(limiter.acquire_async()) for _ in range(4)]
    await asyncio.sleep(0)
    queued[0].cancel()
    results = await asyncio.gather(first, *queued[1:])
    assert [d.allowed for d in results] == [True, True, True, False]


async def test_a_bug_in_the_op_reaches_every_waiter_of_the_batch(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = GlobalLimiter("gcra", "100/h", store=store, clock=clock)
    limiter._params = ["not-a-number", "1", "1"]
    results = await asyncio.gather(
        *(limiter.acquire_async() for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, ValueError) for r in results)
    assert limiter.guard.failures == 0, "a bug is not an outage"


# -- GlobalLimiter: when the store is down --------------------------------------------------


@pytest.mark.parametrize("mode", ["fail_open", "fail_closed", "local"])
async def test_the_store_down_never_raises_and_follows_the_mode(
    clock: fw.FakeClock, store: SwitchableStore, mode: Any
) -> None:
    events: list[fw.Event] = []
    limiter = GlobalLimiter(
        "gcra",
        "100/h",
        store=store,
        clock=clock,
        on_store_error=mode,
        expected_instances=10,
        listeners=[events.append],
    )
    assert limiter.acquire().allowed
    store.down = True
    sync = [limiter.acquire() for _ in range(15)]
    both = sync + list(await asyncio.gather(*(limiter.acquire_async() for _ in range(5))))
    admitted = sum(d.allowed for d in both)
    expected = {"fail_open": 20, "fail_closed": 0, "local": 10}[mode]
    assert admitted == expected, "local: this process's share, 100 ÷ 10"
    assert store.calls == 1 + 3, "three failures open the breaker; the rest never reach it"
    if mode == "fail_closed":
        assert both[-1].retry_after == pytest.approx(1.0), "until the breaker's probe"
        assert all(isinstance(d, StoreDownDecision) for d in both)  # not the limit's refusal
        with pytest.raises(fw.LimitStoreUnavailableError, match="fail_closed") as caught:
            limiter.call(lambda: None)
        assert caught.value.kind == "store_unavailable"
    store.down = False
    clock.advance(1.0)
    assert limiter.acquire().remaining == 98, "back on the store by itself"
    assert [e.kind for e in events if e.source == "store_guard"] == ["store_down", "store_up"]
    assert limiter.snapshot()["outages"] == 1 and limiter.snapshot()["recoveries"] == 1


def test_local_share_of_buckets_divides_rate_and_capacity() -> None:
    limiter = GlobalLimiter("token", "100/s", burst=39, expected_instances=4)
    assert limiter.local_plan.limit == 10 and limiter.local_plan.params[2] == b"25"
    assert GlobalLimiter("fixed", "3/s", expected_instances=4).local_plan.limit == 1


# -- LeasedLimiter ------------------------------------------------------------------------------


def test_leases_cut_round_trips_by_the_lease_size(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = LeasedLimiter("gcra", "100000/s", store=store, clock=clock, lease=20)
    for _ in range(1000):
        assert limiter.acquire().allowed
        clock.advance(0.0001)
    assert store.calls == 50 and limiter.leases == 50 and limiter.local_decisions == 950
    assert limiter.held() == 0


def test_a_leased_limit_whose_store_is_down_says_the_store_not_the_limit(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = LeasedLimiter(
        "gcra", "1/h", store=store, clock=clock, lease=1, on_store_error="fail_closed"
    )
    limiter.call(lambda: None)
    with pytest.raises(fw.RateLimitedError) as limited:
        limiter.call(lambda: None)
    assert limited.value.kind == "rate_limited"  # the store answered: the limit refused
    store.down = True
    clock.advance(7200)
    with pytest.raises(fw.LimitStoreUnavailableError, match="store is unavailable") as down:
        limiter.call(lambda: None)
    assert down.value.kind == "store_unavailable" and down.value.retry_after is not None


def test_the_default_lease_keeps_over_admission_within_ten_percent() -> None:
    assert LeasedLimiter("gcra", "500/s", expected_instances=4).lease == 12
    assert LeasedLimiter("gcra", "1000000/s").lease == 100
    assert LeasedLimiter("gcra", "5/s", expected_instances=4).lease == 1
    with pytest.raises(fw.ConfigError, match="lease must be"):
        LeasedLimiter("gcra", "5/s", lease=0)
    with pytest.raises(fw.ConfigError, match="lease_ttl must be"):
        LeasedLimiter("gcra", "5/s", lease_ttl=0)


@pytest.mark.parametrize("seed", range(6))
def test_leased_over_admission_stays_within_the_stated_bounds(
    clock: fw.FakeClock, seed: int
) -> None:
    """n processes with leases of L: any t seconds admit at most bound(t) + n × (L − 1), and
    at most bound(t + lease_ttl); GCRA's bound(t) = capacity + rate × t."""
    rng = random.Random(seed)
    shared = MemoryStore(clock=clock)
    n, lease, ttl, rate, capacity = 3, 8, 0.5, 50, 10
    fleet = [
        LeasedLimiter(
            "gcra", f"{rate}/s", burst=capacity - 1, store=shared, clock=clock,
            lease=lease, lease_ttl=ttl,
        )
        for _ in range(n)
    ]  # fmt: skip
    times: list[float] = []
    for _ in range(3000):  # ~200 requests/s offered for ~15 s, in bursts
        clock.advance(rng.choice([0.0, 0.0, 0.001, 0.005, 0.02]))
        if fleet[rng.randrange(n)].try_acquire():
            times.append(clock.monotonic())

    def bound(t: float) -> float:
        return capacity + rate * t

    for width in (0.05, 0.2, 1.0, 3.0):
        most = max(sum(1 for u in times if s <= u <= s + width) for s in times)
        assert most <= bound(width) + n * (lease - 1), (width, most)
        assert most <= bound(width + ttl), (width, most)
    span = times[-1] - times[0]
    assert len(times) >= 0.9 * rate * span, "leases do not starve the fleet either"


def test_unused_leased_permits_lapse_and_refusals_are_cached(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = LeasedLimiter("gcra", "10/s", burst=9, store=store, clock=clock, lease=5)
    assert limiter.acquire().allowed and limiter.held() == 4
    clock.advance(1.0)
    assert limiter.held() == 0, "lease_ttl (1 s) passed: unused permits are dropped"
    for _ in range(10):
        limiter.acquire()
    calls = store.calls
    refused = limiter.acquire()
    assert not refused.allowed and refused.retry_after == pytest.approx(0.1)
    assert [limiter.acquire().allowed for _ in range(50)] == [False] * 50
    assert store.calls == calls + 1, "refused from the cache until retry_after"
    clock.advance(0.1)
    assert limiter.acquire().allowed and store.calls == calls + 2


async def test_concurrent_async_requests_wait_for_one_lease(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = LeasedLimiter("gcra", "1000/s", store=store, clock=clock, lease=100)
    decisions = await asyncio.gather(*(limiter.acquire_async() for _ in range(60)))
    assert all(d.allowed for d in decisions)
    assert store.calls == 1 and limiter.held() == 40


async def test_a_cost_above_the_pool_leases_the_difference(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    limiter = LeasedLimiter("fixed", "30/h", store=store, clock=clock, lease=10)
    assert limiter.acquire().allowed and limiter.held() == 9
    assert (await limiter.acquire_async(cost=12)).allowed
    assert limiter.held() == 0, "a cost of a lease or more leases what the pool lacks: 9 + 3"
    assert limiter.acquire(cost=2).allowed and limiter.held() == 8
    assert not limiter.acquire(cost=20).allowed


@pytest.mark.parametrize("mode", ["fail_open", "fail_closed", "local"])
def test_leases_follow_the_store_mode(
    clock: fw.FakeClock, store: SwitchableStore, mode: Any
) -> None:
    limiter = LeasedLimiter(
        "gcra", "100/h", store=store, clock=clock, on_store_error=mode,
        expected_instances=4, lease=10,
    )  # fmt: skip
    store.down = True
    admitted = sum(limiter.try_acquire() for _ in range(40))
    assert admitted == {"fail_open": 40, "fail_closed": 0, "local": 25}[mode]
    if mode == "fail_closed":
        with pytest.raises(fw.RateLimitedError, match="exceeded"):
            limiter.call(lambda: None)


# -- TimeSliceLimiter -------------------------------------------------------------------------


def _fleet(
    clock: fw.FakeClock, store: Store, n: int, rate: str = "100/s", **options: Any
) -> list[TimeSliceLimiter]:
    return [
        TimeSliceLimiter(
            rate, store=store, clock=clock, instance=f"i{k}", background=False,
            rng=random.Random(k), slice_length=10.0, **options,
        )
        for k in range(n)
    ]  # fmt: skip


def test_requests_never_touch_the_store(clock: fw.FakeClock, store: SwitchableStore) -> None:
    limiter = _fleet(clock, store, 1)[0]
    assert all(limiter.try_acquire() for _ in range(1000))
    assert store.calls == 0
    limiter.sync()
    assert store.calls == 1


def test_the_elected_instance_publishes_the_seeds_drop_rate(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    """Four instances at 30 QPS each against a limit of 100: dropRate = (120 − 100) / 120."""
    fleet = _fleet(clock, store, 4)
    for _ in range(2):
        for limiter in fleet:
            for _ in range(300):
                limiter.acquire()
        clock.advance(10.0)
        for limiter in fleet:
            limiter.sync()
    assert [lim.elected for lim in fleet] == [True, False, False, False]
    assert fleet[0].qps == pytest.approx(120.0) and fleet[0].instances == 4
    assert all(lim.drop_rate == pytest.approx(20 / 120, abs=1e-6) for lim in fleet)
    admitted = sum(lim.try_acquire() for lim in fleet for _ in range(3000))
    assert admitted / 12000 == pytest.approx(100 / 120, abs=0.02)


def test_the_lease_passes_on_when_the_elected_instance_goes_quiet(
    clock: fw.FakeClock, store: SwitchableStore
) -> None:
    a, b = _fleet(clock, store, 2)
    a.sync()
    b.sync()
    assert a.elected and not b.elected
    for _ in range(4):  # a stops reporting; its lease lasts 3 slices (and a millisecond)
        clock.advance(10.0)
        b.sync()
    assert (b.elected, b.instances) == (True, 1), "a's report went stale after 2 slices"


def test_under_the_limit_nothing_is_dropped(clock: fw.FakeClock, store: SwitchableStore) -> None:
    (limiter,) = _fleet(clock, store, 1)
    for _ in range(500):
        limiter.acquire()
    clock.advance(10.0)
    assert limiter.sync() == 0.0 and limiter.qps == pytest.approx(50.0)
    decision = limiter.acquire()
    assert decision.allowed and decision.remaining == 100 and decision.reset_after == 10.0


@pytest.mark.parametrize("mode", ["fail_open", "fail_closed", "local"])
def test_time_slices_follow_the_store_mode(
    clock: fw.FakeClock, store: SwitchableStore, mode: Any
) -> None:
    events: list[fw.Event] = []
    (limiter,) = _fleet(
        clock, store, 1, on_store_error=mode, expected_instances=4, listeners=[events.append]
    )
    store.down = True
    for _ in range(500):  # 50 QPS against this instance's share of 25
        limiter.acquire()
    clock.advance(10.0)
    drop = limiter.sync()
    assert drop == pytest.approx({"fail_open": 0.0, "fail_closed": 1.0, "local": 0.5}[mode])
    if mode == "fail_closed":
        with pytest.raises(fw.RateLimitedError) as caught:
            limiter.call(lambda: None)
        assert caught.value.retry_after == pytest.approx(10.0)
    assert [e.kind for e in events][:2] == ["store_down", "drop_rate"] or mode == "fail_open"


async def test_sync_async_and_keys(clock: fw.FakeClock, store: SwitchableStore) -> None:
    (limiter,) = _fleet(clock, store, 1)
    assert await limiter.sync_async() == 0.0 and limiter.syncs == 1
    assert (await limiter.acquire_async()).allowed
    with pytest.raises(TypeError, match="key=None only"):
        limiter.acquire("user")
    assert limiter.snapshot()["elected"] is True
    assert "slice=10s" in limiter.describe()
