"""A store's life under load: closed while callers use it, and threads that come and go.

* Closing a store while 8 threads and 64 async tasks call it: every call ends in its result or
  in a :class:`StoreUnavailableError` (the calls cut off by the close, and every later one, a
  :class:`StoreClosedError`), never in a client library's exception; a guarded policy on the
  same store answers every caller with its ``on_store_error`` mode.
* 6 000 short-lived threads, each making one op on an SQLite store: the process's open
  descriptors stay bounded by the store's pool.
* A Redis without persistence under an idempotency store: a warning and a ``store_volatile``
  event, unless the store was built with ``check_persistence=False``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from conftest import ONCE, once
from floodwall import Event
from floodwall.shared.global_limit import GlobalLimiter
from floodwall.shared.idempotency import Idempotency
from floodwall.stores import Store, StoreClosedError, StoreUnavailableError, connect
from floodwall.stores.redis import RedisStore
from floodwall.stores.sqlite import SqliteStore
from servers import RedisServer

pytestmark = pytest.mark.integration

THREADS = 8
TASKS = 64
RUN_BEFORE_CLOSE = 0.4
RUN_AFTER_CLOSE = 0.3


def _url(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/lifecycle.db"
    fixture = {"redis": "redis_url", "cluster": "redis_cluster_url", "postgres": "postgres_dsn"}
    return str(request.getfixturevalue(fixture[kind]))


class Outcomes:
    """How every call ended, by kind: ``ok``, a store error's class name, or ``raw:<type>``."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.raw: list[BaseException] = []
        self.after_close: Counter[str] = Counter()
        self.closed_at: float | None = None
        self._lock = threading.Lock()

    def record(self, started: float, exc: BaseException | None) -> None:
        if exc is None:
            what = "ok"
        elif isinstance(exc, StoreUnavailableError):
            what = type(exc).__name__
        else:
            what = f"raw:{type(exc).__name__}"
        with self._lock:
            self.seen[what] += 1
            if exc is not None and what.startswith("raw:"):
                self.raw.append(exc)
            if self.closed_at is not None and started > self.closed_at:
                self.after_close[what] += 1


def _sync_caller(store: Store, n: int, outcomes: Outcomes, stop: threading.Event) -> None:
    count = 0
    while not stop.is_set():
        count += 1
        started = time.monotonic()
        try:
            store.apply(ONCE, f"t{n}-{count}", once(60_000))
        except BaseException as exc:
            outcomes.record(started, exc)
        else:
            outcomes.record(started, None)


def _async_callers(store: Store, outcomes: Outcomes, stop: threading.Event) -> None:
    async def task(n: int) -> None:
        count = 0
        while not stop.is_set():
            count += 1
            started = time.monotonic()
            try:
                await store.apply_async(ONCE, f"a{n}-{count}", once(60_000))
            except BaseException as exc:
                outcomes.record(started, exc)
            else:
                outcomes.record(started, None)
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(task(n) for n in range(TASKS)))
        await store.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["redis", "cluster", "postgres", "sqlite"])
def test_a_store_closed_under_load_raises_only_store_errors(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    store = connect(_url(request, kind, tmp_path), prefix=f"close-{uuid.uuid4().hex[:8]}:")
    store.apply(ONCE, "warm", once(60_000))
    outcomes = Outcomes()
    stop = threading.Event()
    workers = [
        threading.Thread(target=_sync_caller, args=(store, n, outcomes, stop), daemon=True)
        for n in range(THREADS)
    ]
    workers.append(
        threading.Thread(target=_async_callers, args=(store, outcomes, stop), daemon=True)
    )
    for worker in workers:
        worker.start()
    try:
        time.sleep(RUN_BEFORE_CLOSE)
        outcomes.closed_at = time.monotonic()
        store.close()
        time.sleep(RUN_AFTER_CLOSE)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=10)
    print(f"\n{kind}: {dict(outcomes.seen)}; started after close: {dict(outcomes.after_close)}")
    assert not any(worker.is_alive() for worker in workers)
    assert outcomes.raw == [], outcomes.raw[:5]
    assert outcomes.seen["ok"] > 0
    assert set(outcomes.after_close) == {"StoreClosedError"}, outcomes.after_close
    with pytest.raises(StoreClosedError):
        store.apply(ONCE, "later", once(60_000))


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_guarded_policy_answers_every_caller_when_its_store_is_closed(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    store = connect(_url(request, kind, tmp_path), prefix=f"closeg-{uuid.uuid4().hex[:8]}:")
    limiter = GlobalLimiter(
        "fixed_window", "100000000/s", store=store, name="closed", on_store_error="fail_closed"
    )
    answers: Counter[bool] = Counter()
    escaped: list[BaseException] = []
    stop = threading.Event()

    def caller(n: int) -> None:
        while not stop.is_set():
            try:
                answers[limiter.try_acquire(f"k{n}")] += 1
            except BaseException as exc:
                escaped.append(exc)

    threads = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(RUN_BEFORE_CLOSE)
        store.close()
        time.sleep(RUN_AFTER_CLOSE)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert escaped == []
    assert answers[True] > 0 and answers[False] > 0, answers
    assert limiter.try_acquire("after") is False  # fail_closed, from the guard
    assert limiter.guard.state == "down"


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_short_lived_threads_leave_no_sqlite_descriptors_behind(tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/threads.db", prefix="threads:")
    errors: list[BaseException] = []

    def one(n: int) -> None:
        try:
            store.apply(ONCE, f"k{n}", once(60_000))
        except BaseException as exc:
            errors.append(exc)

    try:
        store.apply(ONCE, "warm", once(60_000))
        before = _open_descriptors()
        peak = before
        for wave in range(60):  # 6 000 threads, 100 alive at a time
            batch = [threading.Thread(target=one, args=(wave * 100 + n,)) for n in range(100)]
            for thread in batch:
                thread.start()
            for thread in batch:
                thread.join(timeout=30)
            peak = max(peak, _open_descriptors())
        after = _open_descriptors()
    finally:
        store.close()
    pool = store.pool_size
    print(f"\nsqlite: 6000 threads; descriptors before {before}, peak {peak}, after {after}")
    assert errors == []
    # each pooled connection holds the database and its WAL file open
    assert after - before <= 2 * pool
    assert peak - before <= 2 * pool
    assert _open_descriptors() <= before


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_an_idempotency_store_on_a_redis_without_persistence_warns(
    caplog: pytest.LogCaptureFixture, shell: str
) -> None:
    events: list[Event] = []
    with RedisServer() as server:  # started with neither AOF nor RDB
        store = connect(server.url, prefix="volatile:")
        quiet = connect(server.url, prefix="volatile:", check_persistence=False)
        idem = Idempotency(store, name="payments", listeners=[events.append])
        silent = Idempotency(quiet, name="quiet", listeners=[events.append])

        async def lookups() -> None:
            try:
                assert await idem.lookup_async("k") is None
                assert await silent.lookup_async("k") is None
            finally:
                await store.aclose()
                await quiet.aclose()

        with caplog.at_level(logging.WARNING, logger="floodwall.stores"):
            if shell == "async":
                asyncio.run(lookups())
            else:
                try:
                    assert idem.lookup("k") is None
                    assert silent.lookup("k") is None
                finally:
                    store.close()
                    quiet.close()
    assert [(e.kind, e.name) for e in events] == [("store_volatile", "payments")]
    assert "neither AOF nor RDB" in events[0].reason
    assert [r.name for r in caplog.records if "payments" in r.getMessage()] == ["floodwall.stores"]
    assert not any("quiet" in r.getMessage() for r in caplog.records)


def test_a_cluster_without_persistence_is_reported_per_primary(redis_cluster_url: str) -> None:
    events: list[Event] = []
    store = connect(redis_cluster_url, prefix=f"volatile-{uuid.uuid4().hex[:8]}:")
    try:
        idem = Idempotency(store, name="orders", listeners=[events.append])
        assert idem.lookup("k") is None
    finally:
        store.close()
    assert [(e.kind, e.name, e.figures["volatile_nodes"]) for e in events] == [
        ("store_volatile", "orders", 3)
    ]
    assert "3 of 3 primaries" in events[0].reason


def test_a_redis_with_an_append_only_file_raises_no_warning() -> None:
    events: list[Event] = []
    with RedisServer(extra_args=["--appendonly", "yes"]) as server:
        store = RedisStore(server.url, prefix="durable:")
        try:
            idem = Idempotency(store, name="durable", listeners=[events.append])
            assert idem.lookup("k") is None
            assert store.client().config_get("appendonly") == {"appendonly": "yes"}
        finally:
            store.close()
    assert events == []
