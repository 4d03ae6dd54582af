"""Cache: fresh hits, stale-while-error with the value's age, read-only switch, LRU + TTL, a
shared second level on the memory store. FakeClock throughout; real Redis in integration/."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall.shared import Cache, LruTtl
from floodwall.stores import MemoryStore


class Backend:
    """A dependency that answers ``value`` or raises ``error``; counts its calls."""

    def __init__(self, value: Any = "v1") -> None:
        self.value = value
        self.error: Exception | None = None
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.value


def test_fresh_hit_then_miss_after_ttl(clock: fw.FakeClock, shell: Any) -> None:
    cache = Cache(ttl=10, clock=clock)
    backend = Backend()
    assert shell.run(cache, backend) == "v1"
    backend.value = "v2"
    clock.advance(9)
    assert shell.run(cache, backend) == "v1" and backend.calls == 1
    clock.advance(2)
    assert shell.run(cache, backend) == "v2" and backend.calls == 2
    assert (cache.hits, cache.misses) == (1, 2)


def test_keys_come_from_the_arguments(clock: fw.FakeClock) -> None:
    cache = Cache(clock=clock)

    @cache
    def profile(user: int, *, full: bool = False) -> str:
        return f"profile {user} {full}"

    assert profile(1) == "profile 1 False"
    assert profile(2, full=True) == "profile 2 True"
    assert cache.lookup(cache.key(2, full=True)) is not None
    keyed = Cache(key=lambda user, **_: f"u{user}", clock=clock)
    keyed.call(lambda user: user * 2, 21)
    entry = keyed.lookup("u21")
    assert entry is not None and entry.value == 42


def test_stale_while_error_serves_the_last_good_value_with_its_age(
    clock: fw.FakeClock, shell: Any
) -> None:
    events: list[fw.Event] = []
    cache = Cache(ttl=5, stale_ttl=60, clock=clock, listeners=[events.append])
    backend = Backend(["rose", "rocket"])
    assert shell.run(cache, backend) == ["rose", "rocket"]
    clock.advance(42)
    backend.error = ConnectionError("gift service down")
    with fw.call_context() as ctx:
        assert shell.run(cache, backend) == ["rose", "rocket"]
    assert ctx.degraded_by == "cache" and ctx.degraded_reason == "ConnectionError"
    assert cache.stale == 1
    (event,) = events
    assert event.kind == "stale" and event.figures["age"] == pytest.approx(42)
    answer = cache.fetch(backend)
    assert (answer.source, answer.age, answer.reason) == ("stale", 42.0, "ConnectionError")
    assert answer.degraded
    clock.advance(19)  # 61 s old: past stale_ttl
    with pytest.raises(ConnectionError):
        shell.run(cache, backend)


async def test_fetch_async_reports_the_age(clock: fw.FakeClock) -> None:
    cache = Cache(ttl=1, clock=clock)

    async def fetch() -> str:
        return "fresh"

    first = await cache.fetch_async(fetch)
    await cache.invalidate_async(cache.key())
    assert cache.lookup(cache.key()) is None
    first = await cache.fetch_async(fetch)
    assert (first.value, first.source, first.age) == ("fresh", "dependency", 0.0)
    clock.advance(0.5)
    hit = await cache.fetch_async(fetch)
    assert (hit.source, hit.age) == ("cache", 0.5)

    async def broken() -> str:
        raise TimeoutError

    clock.advance(3)
    stale = await cache.fetch_async(broken)
    assert (stale.value, stale.source, stale.age) == ("fresh", "stale", 3.5)


def test_which_failures_are_served_stale(clock: fw.FakeClock) -> None:
    cache = Cache(ttl=0, kinds={"circuit_open", "timeout"}, clock=clock)
    assert cache.call(lambda: "good") == "good"
    assert cache.call(lambda: "newer") == "newer", "ttl=0: the dependency is always asked"

    def open_breaker() -> str:
        raise fw.CircuitOpenError("recs", fw.CircuitState.OPEN, 1.0)

    assert cache.call(open_breaker) == "newer"

    def bug() -> str:
        raise KeyError("a bug, not an outage")

    with pytest.raises(KeyError):
        cache.call(bug)


def test_cancellation_is_never_swallowed(clock: fw.FakeClock) -> None:
    cache = Cache(ttl=0, clock=clock)
    cache.call(lambda: "good")

    async def cancelled() -> str:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cache.call_async(cancelled))


def test_read_only_switch_never_calls_the_dependency(clock: fw.FakeClock, shell: Any) -> None:
    cache = Cache(ttl=10, stale_ttl=100, clock=clock)
    backend = Backend()
    shell.run(cache, backend)
    cache.set_read_only(True)
    clock.advance(5)
    assert cache.fetch(backend).source == "cache"
    clock.advance(50)
    with fw.call_context() as ctx:
        assert shell.run(cache, backend) == "v1"
    assert ctx.degraded_reason == "read_only"
    assert backend.calls == 1
    with pytest.raises(fw.DegradedError, match="read only from cache and no entry"):
        cache.call(backend, "another key")
    assert cache.read_only_misses == 1 and backend.calls == 1
    cache.set_read_only(False)
    assert shell.run(cache, backend) == "v1" and backend.calls == 2


def test_read_only_follows_a_level_switch(clock: fw.FakeClock) -> None:
    from floodwall.degrade import Levels

    levels = Levels(clock=clock)
    cache = Cache(ttl=0, read_only=lambda: levels.is_shed(3), clock=clock)
    backend = Backend()
    cache.call(backend)
    levels.shed(3)
    assert cache.call(backend) == "v1" and backend.calls == 1
    levels.restore(3)
    cache.call(backend)
    assert backend.calls == 2


def test_a_cache_outside_a_level_gate_serves_the_last_value_when_shed(clock: fw.FakeClock) -> None:
    from floodwall.degrade import Levels

    levels = Levels(clock=clock)
    pipeline = fw.Pipeline(Cache(ttl=0, clock=clock), levels.gate(3))
    assert pipeline.call(lambda: ["recommended"]) == ["recommended"]
    levels.shed(3)
    assert pipeline.call(lambda: ["never called"]) == ["recommended"]


def test_lru_evicts_the_least_recently_used(clock: fw.FakeClock) -> None:
    cache = Cache(max_entries=2, clock=clock)
    for key in ("a", "b"):
        cache.call(lambda k: k.upper(), key)
    cache.call(lambda k: k.upper(), "a")  # a is now the most recent
    cache.call(lambda k: k.upper(), "c")
    assert cache.lookup(cache.key("b")) is None
    assert cache.lookup(cache.key("a")) is not None
    assert cache.evictions == 1


def test_second_level_on_a_shared_store(clock: fw.FakeClock) -> None:
    store = MemoryStore(clock=clock)
    writer = Cache(ttl=10, stale_ttl=100, store=store, clock=clock, name="gifts")
    reader = Cache(ttl=10, stale_ttl=100, store=store, clock=clock, name="gifts")
    assert writer.call(lambda: {"gift": "rose"}) == {"gift": "rose"}
    clock.advance(4)
    answer = reader.fetch(Backend("never"))
    assert (answer.value, answer.source, answer.age) == ({"gift": "rose"}, "cache", 4.0)
    assert reader.l2_hits == 1
    clock.advance(30)
    other = Cache(ttl=10, stale_ttl=100, store=store, clock=clock, name="gifts")
    down = Backend()
    down.error = OSError("down")
    stale = other.fetch(down)
    assert (stale.source, stale.age) == ("stale", 34.0), "a new process serves the shared value"
    writer.invalidate(writer.key())
    with pytest.raises(OSError, match="down"):
        Cache(store=store, clock=clock, name="gifts").call(down)


def test_values_the_codec_cannot_encode_stay_in_the_first_level(clock: fw.FakeClock) -> None:
    cache = Cache(store=MemoryStore(clock=clock), clock=clock)
    value = {1, 2}  # not JSON
    assert cache.call(lambda: value) == value
    assert cache.encode_errors == 1
    assert cache.call(lambda: {3}) == value, "still a fresh hit from the first level"


def test_a_down_second_level_never_fails_a_call(clock: fw.FakeClock) -> None:
    cache = Cache(store="redis://127.0.0.1:1/0", clock=clock)  # nothing listens on port 1
    assert cache.call(lambda: "from the dependency") == "from the dependency"
    assert cache.call(lambda: "x") == "from the dependency"
    assert cache.store_errors >= 1
    assert cache.guard is not None and cache.guard.state == "down"


def test_validation() -> None:
    with pytest.raises(fw.ConfigError, match=r"stale_ttl must be >= ttl \(10\), got 5"):
        Cache(ttl=10, stale_ttl=5)
    with pytest.raises(fw.ConfigError, match="max_entries must be an integer >= 1"):
        Cache(max_entries=0)
    assert "Cache('cache', ttl=60s, stale_ttl=3600s)" in str(fw.Pipeline(Cache()))


# -- invariants against a reference model -----------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["call_ok", "call_fail", "advance"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(0, 30),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_cache_matches_a_reference_model(ops: list[tuple[str, str, int]]) -> None:
    """A dict of (value, stored_at) with LRU order and the two TTLs predicts every answer;
    the first level never holds more than max_entries; a served age never exceeds stale_ttl."""
    clock = fw.FakeClock(0.0)
    ttl, stale_ttl, size = 10.0, 40.0, 3
    cache = Cache(ttl=ttl, stale_ttl=stale_ttl, max_entries=size, key=str, clock=clock)
    model: OrderedDict[str, tuple[int, float]] = OrderedDict()
    counter = 0

    def lookup(key: str) -> tuple[int, float] | None:
        entry = model.get(key)
        if entry is None:
            return None
        if clock.monotonic() - entry[1] > stale_ttl:
            del model[key]
            return None
        model.move_to_end(key)
        return entry

    for op, key, amount in ops:
        if op == "advance":
            clock.advance(amount)
            continue
        counter += 1
        entry = lookup(key)
        now = clock.monotonic()
        if entry is not None and now - entry[1] <= ttl:
            expected: Any = entry[0]
        elif op == "call_ok":
            expected = counter
            model[key] = (counter, now)
            model.move_to_end(key)
            while len(model) > size:
                model.popitem(last=False)
        else:
            expected = entry[0] if entry is not None else ConnectionError

        def dependency(_: str, value: int = counter, ok: bool = op == "call_ok") -> int:
            if not ok:
                raise ConnectionError
            return value

        if expected is ConnectionError:
            with pytest.raises(ConnectionError):
                cache.fetch(dependency, key)
            continue
        answer = cache.fetch(dependency, key)
        assert answer.value == expected
        assert answer.age <= stale_ttl
        assert len(cache.local) <= size


@given(st.lists(st.tuples(st.text(max_size=3), st.integers(0, 5)), max_size=40))
def test_lru_ttl_never_exceeds_its_bound(items: list[tuple[str, int]]) -> None:
    lru: LruTtl[int] = LruTtl(4, 10.0)
    now = 0.0
    for key, step in items:
        now += step
        lru.put(key, step, now)
        assert len(lru) <= 4
        got = lru.get(key, now)
        assert got is not None and got[0] == step
