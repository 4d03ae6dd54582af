"""Bounded memory: ``memory://`` and the keyed limiter hold at most their bound, in O(1) per op.

Functional checks of the bounds and eviction rules; the latency and RSS figures at a million
keys come from ``python benchmarks/million_keys.py`` (not a timed assertion here).
"""

from __future__ import annotations

import gc
import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from conftest import ONCE, once
from floodwall.ratelimit import FixedWindow, Keyed, TokenBucket
from floodwall.stores import MemoryStore


class Counting(dict[str, Any]):
    """The store's table, counting the records taken out of it: those the sweeping hand drops
    or moves to the back (``pop``, then put back when live) and those evicted or dropped
    (``del``)."""

    touched = 0

    def pop(self, key: str, *default: Any) -> Any:
        self.touched += 1
        return super().pop(key, *default)

    def __delitem__(self, key: str) -> None:
        self.touched += 1
        super().__delitem__(key)


def test_the_store_never_holds_more_than_max_keys_and_evicts_the_oldest() -> None:
    clock = fw.FakeClock()
    store = MemoryStore(clock=clock, max_keys=100)
    for i in range(1000):
        assert store.apply(ONCE, f"k{i}", once(60_000))[0]
        assert len(store) <= 100
    assert len(store) == 100
    assert store.evicted == 900
    assert store.raw("floodwall:{k999}") is not None  # the newest stay
    assert store.raw("floodwall:{k0}") is None  # the oldest made room
    assert not store.apply(ONCE, "k999", once(60_000))[0]  # a kept record still decides
    assert store.describe() == {
        "url": "memory://",
        "records": 100,
        "max_keys": 100,
        "evicted": 900,
    }


def test_an_expired_record_makes_room_before_any_live_one() -> None:
    clock = fw.FakeClock()
    store = MemoryStore(clock=clock, max_keys=10)
    for i in range(5):
        store.apply(ONCE, f"short{i}", once(1_000))
    for i in range(5):
        store.apply(ONCE, f"long{i}", once(60_000))
    clock.advance(2.0)
    for i in range(5):
        store.apply(ONCE, f"new{i}", once(60_000))
    assert store.evicted == 0  # the expired records were replaced, no live one was lost
    assert all(store.raw(f"floodwall:{{long{i}}}") is not None for i in range(5))


def test_expired_records_go_without_being_touched_and_no_op_scans_the_table() -> None:
    clock = fw.FakeClock()
    store = MemoryStore(clock=clock, max_keys=MemoryStore.SHARD_KEYS)  # one shard, one hand
    for i in range(1000):
        store.apply(ONCE, f"k{i}", once(1_000))
    store._shards = [table := Counting(store._shards[0])]
    clock.advance(2.0)
    most = 0
    for _ in range(600):
        before = table.touched
        store.apply(ONCE, "busy", once(1))
        most = max(most, table.touched - before)
    assert len(store) == 1  # two steps of the hand per op swept the 1000 expired ones
    assert most <= MemoryStore.HAND_STEPS + 1  # its steps, plus the op's own write
    full = MemoryStore(clock=clock, max_keys=50)
    for i in range(50):
        full.apply(ONCE, f"live{i}", once(60_000))
    full._shards = [table := Counting(full._shards[0])]
    for i in range(200):
        before = table.touched
        full.apply(ONCE, f"more{i}", once(60_000))
        assert table.touched - before <= MemoryStore.HAND_STEPS + MemoryStore.ROOM_STEPS
    assert full.sweep() == 0
    clock.advance(61.0)
    assert full.sweep() == 50
    assert len(full) == 0


def test_the_hand_rests_while_no_record_can_have_expired() -> None:
    clock = fw.FakeClock()
    store = MemoryStore(clock=clock, max_keys=50)
    for i in range(50):
        store.apply(ONCE, f"live{i}", once(60_000))
        clock.advance(0.01)
    store._shards = [table := Counting(store._shards[0])]
    for i in range(100):  # a full shard of live records: each new key evicts the front one
        before = table.touched
        store.apply(ONCE, f"more{i}", once(60_000))
        assert table.touched == before + 1  # the front record only: no step of the hand
    assert store.evicted == 100
    assert store.raw("floodwall:{more99}") is not None
    assert store.raw("floodwall:{live49}") is None  # the oldest went first
    store.apply(ONCE, "short", once(1_000))  # one record that expires soon wakes the hand
    assert store.evicted == 101  # "more50" made room for it
    clock.advance(1.5)
    for i in range(51, 100):
        store.apply(ONCE, f"more{i}", once(60_000))  # kept records: no room needed
    assert len(store) == 49  # the hand met the expired one and dropped it, untouched
    assert store.evicted == 101


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.sampled_from([5, 50, 500, 5_000]), st.integers(0, 800)),
        max_size=250,
    )
)
def test_the_hand_never_rests_past_an_expiry(ops: list[tuple[int, int, int]]) -> None:
    """Against a reference model: decisions as an unbounded table's while nothing is evicted,
    the bound held, and every shard's resting time at or before its soonest expiry."""
    clock = fw.FakeClock()
    store = MemoryStore(clock=clock, max_keys=24)
    model: dict[str, int] = {}  # key -> end of its window in µs (the op's clock), no bound
    for key, ttl_ms, wait_ms in ops:
        name = f"k{key}"
        now_us = round(clock.monotonic() * 1_000_000)
        free = model.get(name, -1) <= now_us
        took, _ = store.apply(ONCE, name, once(ttl_ms))
        if store.evicted == 0:
            assert took == free
        if took:
            model[name] = now_us + ttl_ms * 1000
        assert len(store) <= 24
        for data, hand in zip(store._shards, store._hands, strict=True):
            expiries = [struct.unpack_from("d", held)[0] for held in data.values()]
            assert hand.calm_until <= min(expiries, default=math.inf)
        clock.advance(wait_ms / 1000)


def test_records_are_not_tracked_by_the_garbage_collector() -> None:
    store = MemoryStore(clock=fw.FakeClock())
    gc.collect()
    before = len(gc.get_objects())
    for i in range(20_000):
        store.apply(ONCE, f"k{i}", once(60_000))
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert grown < 100  # 20 000 records, and no tracked object left behind by any op
    assert not any(gc.is_tracked(held) for held in list(store._shards[0].values())[:100])


def test_a_large_bound_is_kept_shard_by_shard() -> None:
    clock = fw.FakeClock()
    store = MemoryStore(clock=clock, max_keys=3 * MemoryStore.SHARD_KEYS + 7)
    assert len(store._shards) == 4  # no shard holds more than SHARD_KEYS records
    for i in range(30_000):
        store.apply(ONCE, f"k{i}", once(60_000))
        assert len(store) <= store.max_keys
    assert all(len(shard) == store.max_keys // 4 for shard in store._shards)
    assert store.max_keys // 4 <= MemoryStore.SHARD_KEYS
    assert store.evicted == 30_000 - len(store)
    assert store.raw("floodwall:{k29999}") is not None


def test_frequency_on_memory_keeps_its_store_bounded() -> None:
    clock = fw.FakeClock()
    store = MemoryStore(clock=clock, max_keys=1000)
    once = fw.Frequency.once(60, store=store, clock=clock)
    for i in range(20_000):
        assert once.allow(f"user-{i}").allowed
    assert len(store) == 1000
    assert store.evicted == 19_000
    assert not once.allow("user-19999").allowed  # the recent keys are still limited


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_max_keys_is_checked(bad: object) -> None:
    with pytest.raises(fw.ConfigError, match=f"max_keys must be an integer >= 1, got {bad!r}"):
        MemoryStore(max_keys=bad)  # type: ignore[arg-type]


def test_the_keyed_limiter_spreads_its_search_for_room_over_new_keys() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(FixedWindow("1/h", clock=clock), max_keys=1000)
    for i in range(1000):
        assert limiter.try_acquire(i)
    looked: list[int] = [0]
    idle_at = limiter._idle

    def counting(st: Any) -> float:
        looked[0] += 1
        return idle_at(st)

    limiter._idle = counting
    most = 0
    for i in range(1000, 1200):
        before = looked[0]
        assert not limiter.try_acquire(i)  # every tracked key is active
        most = max(most, looked[0] - before)
    assert len(limiter._tables) == 4
    assert most <= Keyed.ROOM_STEPS  # half in the key's own table, the rest in one other
    assert looked[0] == 1000  # one pass over each table, spread over its keys / 16 new keys
    assert len(limiter) == 1000


def test_the_keyed_limiter_stays_at_its_bound_through_many_distinct_keys() -> None:
    clock = fw.FakeClock()
    limiter = Keyed(TokenBucket("10/s", clock=clock), max_keys=500)
    for i in range(50_000):
        assert limiter.try_acquire(f"user-{i}")
        assert len(limiter) <= 500
        clock.advance(0.001)  # a key is idle 0.1 s after its one call
    assert limiter.evicted >= 50_000 - 500
