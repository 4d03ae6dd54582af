"""Shared pytest fixtures. Add new fixtures in their own clearly headed section."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from floodwall import FakeClock, Policy
from floodwall.stores import Store, connect
from servers import PostgresServer, RedisCluster, RedisServer

T = TypeVar("T")

# --------------------------------------------------------------------------------------------
# Real servers for integration tests (helpers in tests/servers.py)
#
# Session-scoped: one server of each kind per pytest process, started on first use. Under
# pytest-xdist every worker starts its own on its own free port, so workers never share state.
# Set REDIS_URL / REDIS_CLUSTER_URL / DATABASE_URL to use an existing server instead (it is then
# shared by all workers; `redis_client` FLUSHes its database).
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """``redis://127.0.0.1:PORT/0`` of a throwaway redis-server (or ``$REDIS_URL``)."""
    if url := os.environ.get("REDIS_URL"):
        yield url
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """``redis+cluster://127.0.0.1:PORT`` of a throwaway 3-master cluster (or env)."""
    if url := os.environ.get("REDIS_CLUSTER_URL"):
        yield url
        return
    with RedisCluster() as cluster:
        yield cluster.url


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """``postgresql://floodwall@127.0.0.1:PORT/floodwall_test`` (or ``$DATABASE_URL``)."""
    if dsn := os.environ.get("DATABASE_URL"):
        yield dsn
        return
    with PostgresServer() as server:
        yield server.dsn


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on ``redis_url`` whose database was just flushed; closed afterwards."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushdb()
        yield client
    finally:
        client.close()


# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Core fixtures: a fake clock, and the two execution shells every policy must honour alike
# --------------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    """A fresh :class:`floodwall.FakeClock` starting at t=1000 s (away from zero on purpose)."""
    return FakeClock(1000.0)


class Shell:
    """Runs ``policy`` around a plain function in the sync or the async shell.

    Contract tests take the ``shell`` fixture and run twice, once per shell, so the sync and
    async paths are held to the same behaviour.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def run(self, policy: Policy, fn: Callable[[], T]) -> T:
        if self.kind == "sync":
            return policy.call(fn)

        async def coroutine() -> T:
            return fn()

        return asyncio.run(policy.call_async(coroutine))

    def __repr__(self) -> str:
        return self.kind


@pytest.fixture(params=["sync", "async"])
def shell(request: pytest.FixtureRequest) -> Shell:
    return Shell(str(request.param))


# --------------------------------------------------------------------------------------------
# Stores (distributed-state issue): one contract suite over every backend
#
# `store_case` runs a test once per store: memory (driven by a FakeClock), a real Redis, a real
# 3-master Redis Cluster, a real PostgreSQL and an SQLite file. Each test gets a fresh key
# prefix, so tests never see each other's records on the shared servers. `case.wait(seconds)`
# moves time: the fake clock for memory, a real sleep for the servers (their clocks are real).
# Async tests use `async_store_case`, whose async clients are closed in the test's own loop.
# --------------------------------------------------------------------------------------------

STORE_KINDS = ("memory", "redis", "redis_cluster", "postgres", "sqlite")
_STORE_SERVER_FIXTURES = {
    "redis": "redis_url",
    "redis_cluster": "redis_cluster_url",
    "postgres": "postgres_dsn",
}


class StoreCase:
    """A store under test, with the way to let its time pass."""

    def __init__(self, kind: str, url: str, store: Store, clock: FakeClock | None) -> None:
        self.kind = kind
        self.url = url
        self.store = store
        self.clock = clock

    def wait(self, seconds: float) -> None:
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            time.sleep(seconds)

    async def wait_async(self, seconds: float) -> None:
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return self.kind


@pytest.fixture(
    params=[
        pytest.param(kind, marks=() if kind == "memory" else pytest.mark.integration)
        for kind in STORE_KINDS
    ]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of each store kind in turn (servers started on first use)."""
    kind = str(request.param)
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/floodwall.db"
    return str(request.getfixturevalue(_STORE_SERVER_FIXTURES[kind]))


def _store_case(request: pytest.FixtureRequest, url: str) -> StoreCase:
    kind = str(request.node.callspec.params["store_url"])
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    clock = FakeClock(1000.0) if kind == "memory" else None
    options: dict[str, object] = {"prefix": prefix}
    if clock is not None:
        options["clock"] = clock
    return StoreCase(kind, url, connect(url, **options), clock)


@pytest.fixture
def store_case(request: pytest.FixtureRequest, store_url: str) -> Iterator[StoreCase]:
    case = _store_case(request, store_url)
    try:
        yield case
    finally:
        case.store.close()


@pytest.fixture
async def async_store_case(
    request: pytest.FixtureRequest, store_url: str
) -> AsyncIterator[StoreCase]:
    case = _store_case(request, store_url)
    try:
        yield case
    finally:
        await case.store.aclose()
