"""The degradation tools on real servers: the cache's second-level ops on every store, a cache
shared through Redis (ages from the server's clock), and the Redis Streams adapter."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import floodwall as fw
from conftest import StoreCase
from floodwall.shared import Cache
from floodwall.shared.cache import CACHE_DELETE, CACHE_GET, CACHE_SET
from floodwall.stores import StoreUnavailableError
from floodwall.stores.redis import RedisStore
from floodwall.stores.streams import RedisStream

pytestmark = pytest.mark.integration

WAIT = 0.25


def test_cache_ops_contract(store_case: StoreCase) -> None:
    """The Lua scripts and the Python steps agree on every backend."""
    store = store_case.store
    assert store.apply(CACHE_GET, "c") is None
    assert store.apply(CACHE_SET, "c", [b'{"gift": "rose"}', 60_000]) is True
    payload, age = store.apply(CACHE_GET, "c") or (b"", -1)
    assert payload == b'{"gift": "rose"}' and 0 <= age < 200
    store_case.wait(WAIT)
    _, age = store.apply(CACHE_GET, "c") or (b"", -1)
    assert WAIT * 1000 - 5 <= age < WAIT * 1000 + 500, "the age grows on the store's clock"
    store.apply(CACHE_SET, "c", [b"newer", 60_000])
    payload, age = store.apply(CACHE_GET, "c") or (b"", -1)
    assert payload == b"newer" and age < 200, "a new value restarts the age"
    assert store.apply(CACHE_DELETE, "c") is True
    assert store.apply(CACHE_DELETE, "c") is False
    assert store.apply(CACHE_GET, "c") is None


def test_cache_entries_expire_after_their_keep_time(store_case: StoreCase) -> None:
    store = store_case.store
    store.apply(CACHE_SET, "e", [b"x", 200])
    store_case.wait(0.35)
    assert store.apply(CACHE_GET, "e") is None


async def test_cache_ops_async(async_store_case: StoreCase) -> None:
    store = async_store_case.store
    binary = bytes(range(256))
    await store.apply_async(CACHE_SET, "a", [binary, 60_000])
    got = await store.apply_async(CACHE_GET, "a")
    assert got is not None and got[0] == binary


def test_two_processes_share_a_cache_through_redis(redis_url: str) -> None:
    """A value one instance fetched is served stale by another while the dependency is down,
    with its age measured on the Redis server's clock."""
    store = RedisStore(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    try:
        first = Cache(ttl=0.1, stale_ttl=60, store=store, name="recs")
        second = Cache(ttl=0.1, stale_ttl=60, store=store, name="recs")
        assert first.call(lambda: ["a", "b"]) == ["a", "b"]
        fw.SYSTEM_CLOCK.sleep(WAIT)

        def down() -> list[str]:
            raise ConnectionError("recommendation service down")

        answer = second.fetch(down)
        assert answer.value == ["a", "b"] and answer.source == "stale"
        assert WAIT - 0.01 <= answer.age < WAIT + 0.5
        assert second.l2_hits == 0 and second.stale == 1
    finally:
        store.close()


# -- the Redis Streams adapter -------------------------------------------------------------------


@pytest.fixture(params=["redis", "redis_cluster"])
def stream_url(request: pytest.FixtureRequest) -> str:
    fixture = "redis_url" if request.param == "redis" else "redis_cluster_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def stream(stream_url: str) -> Iterator[RedisStream]:
    store = RedisStore(stream_url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    made = RedisStream(store, "audit", consumer="c1", max_length=5, claim_after=0.2)
    try:
        yield made
    finally:
        made.delete()
        store.close()


def test_stream_delivers_pending_first_and_acks_delete(stream: RedisStream) -> None:
    ids = [stream.add({"k": f"w{n}", "p": str(n)}) for n in range(5)]
    assert all(ids)
    assert stream.add({"k": "w5", "p": "5"}) is None, "bounded: the sixth is refused"
    first = stream.read(2)
    assert [e.fields[b"k"] for e in first] == [b"w0", b"w1"]
    again = stream.read(10)
    assert [e.id for e in again] == [e.id for e in first], "pending entries come back first"
    assert stream.ack([first[0].id]) == 1
    assert stream.length() == 4, "acknowledged entries are deleted"
    rest = stream.read(10)
    assert [e.fields[b"k"] for e in rest] == [b"w1"]
    stream.ack([rest[0].id])
    rest = stream.read(10)
    assert [e.fields[b"k"] for e in rest] == [b"w2", b"w3", b"w4"]
    assert stream.add({"k": "w5", "p": "5"}) is not None, "room again"


def test_a_restarted_consumer_resumes_and_a_dead_ones_entries_are_claimed(
    stream: RedisStream,
) -> None:
    for n in range(3):
        stream.add({"k": f"w{n}", "p": str(n)})
    taken = stream.read(2)  # c1 takes two, then dies
    restarted = RedisStream(stream.store, "audit", consumer="c1", claim_after=None)
    assert [e.id for e in restarted.read(5)] == [e.id for e in taken]
    other = RedisStream(stream.store, "audit", consumer="c2", claim_after=0.2)
    (fresh,) = other.read(5)
    assert fresh.fields[b"k"] == b"w2", "too soon to claim c1's"
    other.ack([fresh.id])
    fw.SYSTEM_CLOCK.sleep(0.3)
    claimed = other.read(5)
    assert [e.id for e in claimed] == [e.id for e in taken]


async def test_stream_async(stream: RedisStream) -> None:
    try:
        assert await stream.add_async({"k": "a", "p": "1"})
        entries = await stream.read_async(5)
        assert [e.fields[b"k"] for e in entries] == [b"a"]
        assert await stream.length_async() == 1
        assert await stream.ack_async([entries[0].id]) == 1
        assert await stream.length_async() == 0
    finally:
        await stream.store.aclose()


def test_stream_errors_are_store_errors() -> None:
    down = RedisStream("redis://127.0.0.1:1/0", "x", consumer="c", timeout=0.2)
    with pytest.raises(StoreUnavailableError, match="stream_add") as caught:
        down.add({"k": "v"})
    assert caught.value.__cause__ is not None
    with pytest.raises(StoreUnavailableError, match="stream_read"):
        down.read(1)
