"""One contract for every store: memory, Redis, Redis Cluster, PostgreSQL, SQLite.

Each test runs once per backend (the ``store_case`` fixture in conftest.py), against real
servers the harness starts. The ops are the ones policies use (the fixed window behind frequency
control and global limits, idempotency, one-time tokens), so the Lua scripts and the Python steps
are held to the same behaviour.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from redis.crc import key_slot

from conftest import ONCE, StoreCase, once
from floodwall.shared._global_ops import FIXED, Batch
from floodwall.shared.idempotency import (
    BEGIN,
    COMPLETE,
    GET,
    RELEASE,
    TOKEN_CONSUME,
    TOKEN_ISSUE,
)
from floodwall.stores import KEEP, Arg, Op, Record, Store, StoreUnavailableError, Write, connect
from floodwall.stores.redis import RedisStore, load_script

TTL = 0.3
"""Seconds: short, because the servers' clocks are real."""
TTL_MS = round(TTL * 1000)
PAST = TTL + 0.1


def test_once_takes_the_slot_then_refuses_until_it_expires(store_case: StoreCase) -> None:
    store = store_case.store
    assert store.apply(ONCE, "k", once(TTL_MS)) == (True, TTL_MS)
    took, left = store.apply(ONCE, "k", once(TTL_MS))
    assert not took and 0 < left <= TTL_MS
    assert store.apply(ONCE, "other", once(TTL_MS))[0], "keys are independent"
    store_case.wait(PAST)
    assert store.apply(ONCE, "k", once(TTL_MS))[0]


def _count(limit: int, cost: int = 1) -> list[Arg]:
    """The fixed-window op's args (Frequency's): ``limit`` per ``TTL``, one request of ``cost``."""
    return [limit, TTL_MS * 1000, cost, cost]


def _counted(reply: Batch, limit: int) -> tuple[bool, int, int]:
    """``(allowed, count in the window, µs until it ends)`` of a one-request reply."""
    _, [(allowed, _, remaining, reset_us, _)] = reply
    return allowed, limit - remaining, reset_us


def test_count_allows_the_limit_then_refuses_until_the_window_ends(store_case: StoreCase) -> None:
    store = store_case.store
    results = [_counted(store.apply(FIXED, "c", _count(3)), 3) for _ in range(5)]
    assert [r[0] for r in results] == [True, True, True, False, False]
    assert [r[1] for r in results] == [1, 2, 3, 3, 3], "refused calls do not count"
    assert all(0 < r[2] <= TTL_MS * 1000 for r in results)
    store_case.wait(PAST)
    assert _counted(store.apply(FIXED, "c", _count(3)), 3)[:2] == (True, 1)


def test_count_with_cost(store_case: StoreCase) -> None:
    store = store_case.store
    assert _counted(store.apply(FIXED, "c", _count(5, 3)), 5)[:2] == (True, 3)
    assert _counted(store.apply(FIXED, "c", _count(5, 3)), 5)[:2] == (False, 3)
    assert _counted(store.apply(FIXED, "c", _count(5, 2)), 5)[:2] == (True, 5)


def test_idempotency_record_lifecycle(store_case: StoreCase) -> None:
    store = store_case.store
    assert store.apply(GET, "i") is None
    assert store.apply(BEGIN, "i", ["owner-a", "fp", 5000]) == ("started", 5000, None)
    status, left, result = store.apply(BEGIN, "i", ["owner-b", "fp", 5000])
    assert (status, result) == ("in_flight", None) and 0 < left <= 5000
    assert store.apply(BEGIN, "i", ["owner-b", "other-fp", 5000])[0] == "mismatch"
    record = store.apply(GET, "i")
    assert record is not None and record[:2] == ("p", "fp")
    assert store.apply(RELEASE, "i", ["owner-b"]) is False, "only the owner releases"
    assert store.apply(BEGIN, "i", ["owner-a", "fp", 5000])[0] == "started", "a retried claim"
    assert store.apply(COMPLETE, "i", ["owner-b", "fp", b"x", 60_000]) == "conflict"
    assert store.apply(COMPLETE, "i", ["owner-a", "fp", b'{"id": 7}', 60_000]) == "stored"
    assert store.apply(COMPLETE, "i", ["owner-a", "fp", b"retried", 60_000]) == "stored"
    status, left, result = store.apply(BEGIN, "i", ["owner-c", "fp", 5000])
    assert (status, result) == ("done", b'{"id": 7}') and 59_000 < left <= 60_000
    assert store.apply(BEGIN, "i", ["owner-c", "x", 5000])[0] == "mismatch"
    assert store.apply(RELEASE, "i", ["owner-a"]) is False, "a done record is not released"
    record = store.apply(GET, "i")
    assert record is not None and record[:3] == ("d", "fp", b'{"id": 7}')
    assert 59_000 < record[3] <= 60_000


def test_binary_results_round_trip(store_case: StoreCase) -> None:
    store = store_case.store
    blob = bytes(range(256)) + b"\n\x00end"
    store.apply(BEGIN, "b", ["o", "", 5000])
    assert store.apply(COMPLETE, "b", ["o", "", blob, 60_000]) == "stored"
    assert store.apply(BEGIN, "b", ["p", "", 5000])[2] == blob


def test_release_frees_the_key_for_a_retry(store_case: StoreCase) -> None:
    store = store_case.store
    store.apply(BEGIN, "r", ["a", "", 5000])
    assert store.apply(RELEASE, "r", ["a"]) is True
    assert store.apply(GET, "r") is None
    assert store.apply(BEGIN, "r", ["b", "", 5000])[0] == "started"


def test_a_lapsed_claim_can_be_taken_and_then_wins(store_case: StoreCase) -> None:
    store = store_case.store
    assert store.apply(BEGIN, "l", ["a", "", TTL_MS])[0] == "started"
    store_case.wait(PAST)
    assert store.apply(GET, "l") is None, "the crashed owner's claim lapsed"
    assert store.apply(BEGIN, "l", ["b", "", 5000])[0] == "started"
    assert store.apply(COMPLETE, "l", ["a", "", b"late", 60_000]) == "conflict"
    assert store.apply(COMPLETE, "l", ["b", "", b"ok", 60_000]) == "stored"
    assert store.apply(BEGIN, "l", ["c", "", 5000])[2] == b"ok"


def test_a_late_result_is_stored_when_nobody_took_the_key(store_case: StoreCase) -> None:
    store = store_case.store
    store.apply(BEGIN, "s", ["a", "fp", TTL_MS])
    store_case.wait(PAST)
    assert store.apply(COMPLETE, "s", ["a", "fp", b"r", 60_000]) == "stored_late"
    status, left, result = store.apply(BEGIN, "s", ["b", "fp", 5000])
    assert (status, result) == ("done", b"r") and 59_000 < left <= 60_000


def test_done_records_expire_after_their_ttl(store_case: StoreCase) -> None:
    store = store_case.store
    store.apply(BEGIN, "e", ["a", "", 5000])
    store.apply(COMPLETE, "e", ["a", "", b"r", TTL_MS])
    store_case.wait(PAST)
    assert store.apply(GET, "e") is None
    assert store.apply(BEGIN, "e", ["b", "", 5000])[0] == "started"


def test_one_time_tokens(store_case: StoreCase) -> None:
    store = store_case.store
    assert store.apply(TOKEN_CONSUME, "never-issued", ["a"]) is False
    store.apply(TOKEN_ISSUE, "t1", [60_000])
    store.apply(TOKEN_ISSUE, "t2", [TTL_MS])
    assert store.apply(TOKEN_CONSUME, "t1", ["a"]) is True
    assert store.apply(TOKEN_CONSUME, "t1", ["b"]) is False
    assert store.apply(TOKEN_CONSUME, "t1", ["a"]) is True, "a retry by the winner still wins"
    store_case.wait(PAST)
    assert store.apply(TOKEN_CONSUME, "t2", ["a"]) is False, "expired"


def test_concurrent_claims_have_exactly_one_winner(store_case: StoreCase) -> None:
    store = store_case.store
    keys = [f"race-{i}" for i in range(25)]
    outcomes: list[tuple[str, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def racer(me: int) -> None:
        barrier.wait()
        for key in keys:
            status = store.apply(BEGIN, key, [f"owner-{me}", "", 5000])[0]
            with lock:
                outcomes.append((key, status))

    threads = [threading.Thread(target=racer, args=(me,)) for me in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    started = Counter(key for key, status in outcomes if status == "started")
    assert len(outcomes) == 4 * len(keys)
    assert started == dict.fromkeys(keys, 1)


def test_concurrent_counters_never_exceed_the_limit(store_case: StoreCase) -> None:
    store = store_case.store
    allowed: list[bool] = []
    barrier = threading.Barrier(4)

    def racer() -> None:
        barrier.wait()
        allowed.extend(store.apply(FIXED, "hot", [10, 60_000_000, 1, 1])[1][0][0] for _ in range(8))

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert allowed.count(True) == 10 and len(allowed) == 32


# -- async: the same ops, the same answers ----------------------------------------------------


async def test_async_ops_match_the_sync_contract(async_store_case: StoreCase) -> None:
    store = async_store_case.store
    assert await store.apply_async(ONCE, "k", once(TTL_MS)) == (True, TTL_MS)
    assert not (await store.apply_async(ONCE, "k", once(TTL_MS)))[0]
    counts = [_counted(await store.apply_async(FIXED, "c", _count(2)), 2)[:2] for _ in range(3)]
    assert counts == [(True, 1), (True, 2), (False, 2)]
    assert await store.apply_async(BEGIN, "i", ["a", "fp", 5000]) == ("started", 5000, None)
    assert (await store.apply_async(BEGIN, "i", ["b", "fp", 5000]))[0] == "in_flight"
    assert await store.apply_async(COMPLETE, "i", ["a", "fp", b"1", 60_000]) == "stored"
    assert (await store.apply_async(BEGIN, "i", ["b", "fp", 5000]))[2] == b"1"
    await async_store_case.wait_async(PAST)
    assert (await store.apply_async(ONCE, "k", once(TTL_MS)))[0]


async def test_async_concurrent_claims_have_exactly_one_winner(
    async_store_case: StoreCase,
) -> None:
    store = async_store_case.store
    keys = [f"race-{i}" for i in range(40)]
    results = await asyncio.gather(
        *(store.apply_async(BEGIN, key, [f"o{n}", "", 5000]) for key in keys for n in range(3))
    )
    started = [r[0] for r in results].count("started")
    assert started == len(keys)


# -- keys, scripts, errors, schema -------------------------------------------------------------


class _TwoRecords(Op[None]):
    script = "none"
    suffixes = ("", ":prev", ":meta")

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], None]:
        return [KEEP, KEEP, KEEP], None

    def parse(self, raw: Any) -> None:
        return None


def test_keys_share_one_hash_tag() -> None:
    store = connect("memory://", prefix="app:")
    keys = store.keys(_TwoRecords(), "user:42")
    assert keys == ["app:{user:42}", "app:{user:42}:prev", "app:{user:42}:meta"]
    slots = {key_slot(key.encode()) for key in keys}
    assert len(slots) == 1
    weird = store.keys(_TwoRecords(), "a}b{c")
    assert len({key_slot(key.encode()) for key in weird}) == 1


@pytest.mark.integration
@pytest.mark.parametrize("shell", ["sync", "async"])
@pytest.mark.parametrize("fixture", ["redis_url", "redis_cluster_url"])
def test_scripts_are_reloaded_after_script_flush(
    request: pytest.FixtureRequest, fixture: str, shell: str
) -> None:
    """NOSCRIPT after SCRIPT FLUSH: the op still runs once (one EVAL on the key's node), and
    the script is cached again."""
    url = str(request.getfixturevalue(fixture))
    store = RedisStore(url, prefix=f"flush-{shell}:")
    ops = [("a", True), ("a", False), ("b", True)]  # the SCRIPT FLUSH comes after the first

    async def run_async() -> list[bool]:
        answers = []
        try:
            for n, (key, _) in enumerate(ops):
                if n == 1:
                    store.client().script_flush()  # on a cluster: every primary
                answers.append((await store.apply_async(ONCE, key, once(60_000)))[0])
            return answers
        finally:
            await store.aclose()

    try:
        if shell == "async":
            answers = asyncio.run(run_async())
        else:
            answers = []
            for n, (key, _) in enumerate(ops):
                if n == 1:
                    store.client().script_flush()
                answers.append(store.apply(ONCE, key, once(60_000))[0])
        assert answers == [expected for _, expected in ops]
        if not store.cluster:  # a cluster answers SCRIPT EXISTS for every primary at once
            assert store.client().script_exists(load_script(ONCE.script).sha) == [True]
    finally:
        store.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize(
    "template",
    [
        "redis://:s3cret@127.0.0.1:{port}/0",
        "redis+cluster://user:s3cret@127.0.0.1:{port}",
        "postgresql://floodwall:s3cret@127.0.0.1:{port}/x",
        "sqlite:////proc/floodwall-no-such-dir/x.db",
    ],
)
async def test_backend_errors_are_wrapped_once_with_the_cause(template: str) -> None:
    url = template.format(port=_closed_port())
    store = connect(url, timeout=0.2)
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            store.apply(ONCE, "k", once(1000))
        error = caught.value
        assert error.__cause__ is not None
        assert "s3cret" not in str(error) and "s3cret" not in error.url
        assert error.op in {"ratelimit_fixed", "connect", "migrate"}
        with pytest.raises(StoreUnavailableError):
            await store.apply_async(ONCE, "k", once(1000))
    finally:
        await store.aclose()


@pytest.mark.integration
def test_sql_migrations_are_recorded_and_idempotent(
    postgres_dsn: str, tmp_path: pytest.TempPathFactory
) -> None:
    from floodwall.stores import migrate

    sqlite_url = f"sqlite:///{tmp_path}/m.db"
    assert migrate(sqlite_url) == [1]
    assert migrate(sqlite_url) == []
    migrate(postgres_dsn)
    assert migrate(postgres_dsn) == []
    assert migrate("memory://") == []
    store = connect(sqlite_url, auto_migrate=False)
    try:
        assert store.apply(ONCE, "k", once(1000))[0]
    finally:
        store.close()


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_expired_rows_are_purged(
    request: pytest.FixtureRequest, kind: str, tmp_path: pytest.TempPathFactory
) -> None:
    import time

    url = (
        str(request.getfixturevalue("postgres_dsn"))
        if kind == "postgres"
        else f"sqlite:///{tmp_path}/p.db"
    )
    store: Any = connect(url, prefix=f"purge-{kind}:")
    try:
        for n in range(20):
            store.apply(ONCE, f"k{n}", once(50))
        store.apply(TOKEN_ISSUE, "t", [50])
        time.sleep(0.1)
        assert store.purge_expired() >= 21
        assert store.apply(ONCE, "k0", once(50))[0]
    finally:
        store.close()


def test_unknown_schemes_and_bad_options_are_config_errors() -> None:
    from floodwall import ConfigError

    with pytest.raises(ConfigError, match="scheme"):
        connect("mongodb://x")
    with pytest.raises(ConfigError, match="prefix"):
        connect("memory://", prefix="{x}")
    with pytest.raises(ConfigError, match="file"):
        connect("sqlite:///:memory:")
    with pytest.raises(ConfigError, match="key"):
        connect("memory://").apply(ONCE, "", once(1))


def test_store_repr_never_shows_a_password() -> None:
    store: Store = connect("redis://user:pw@127.0.0.1:1/0")
    assert "pw" not in repr(store) and "***" in store.url


@pytest.mark.integration
async def test_a_cluster_connection_closed_under_a_command_is_a_store_error(
    redis_cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's async cluster client can close a connection another command is writing on
    (re-initialising after a timeout); that command failed on the store: StoreUnavailableError."""
    store = RedisStore(redis_cluster_url, prefix=f"closed-{uuid.uuid4().hex[:8]}:")
    try:
        client = await store.async_client()

        async def closed_under_us(*args: object, **kwargs: object) -> object:
            raise AttributeError("'NoneType' object has no attribute 'writelines'")

        monkeypatch.setattr(client, "execute_command", closed_under_us)
        with pytest.raises(StoreUnavailableError) as caught:
            await store.apply_async(ONCE, "k", once(1000))
        assert isinstance(caught.value.__cause__, AttributeError)
    finally:
        await store.aclose()
