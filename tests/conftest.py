"""Shared pytest fixtures. Add new fixtures in their own clearly headed section."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from floodwall import FakeClock, Policy
from floodwall.shared._global_ops import FIXED, Batch
from floodwall.stores import (
    Arg,
    MemoryStore,
    Op,
    R,
    Record,
    Store,
    StoreUnavailableError,
    Write,
    connect,
)
from servers import (
    PostgresServer,
    RedisCluster,
    RedisServer,
    RestartablePostgres,
    RestartableRedis,
)

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


@pytest.fixture
def restartable_redis() -> Iterator[RestartableRedis]:
    """A redis-server of this test's own, to stop and start again (fault tests)."""
    server = RestartableRedis()
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def restartable_postgres() -> Iterator[RestartablePostgres]:
    """A PostgreSQL of this test's own, to stop and start again with its records (fault tests)."""
    server = RestartablePostgres()
    server.start()
    try:
        yield server
    finally:
        server.remove()


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


class SwitchableStore(Store):
    """An in-memory store whose "server" can be taken down (``down = True``) and brought back:
    ops then fail as a refused connection does. ``calls`` counts round trips; an async op
    suspends its caller once, as a real round trip would, letting others queue."""

    def __init__(self, clock: FakeClock, url: str = "switch://test", prefix: str = "s:") -> None:
        super().__init__(url, prefix=prefix)
        self.inner = MemoryStore(prefix=prefix, clock=clock)
        self.down = False
        self.calls = 0

    def _check(self, op: Op[Any]) -> None:
        self.calls += 1
        if self.down:
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except ConnectionRefusedError as exc:
                raise StoreUnavailableError(self.url, op.script) from exc

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        self._check(op)
        return self.inner.apply(op, key, args)

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        self._check(op)
        await asyncio.sleep(0)
        return self.inner.apply(op, key, args)


class OnceOp(Op[tuple[bool, int]]):
    """The store tests' simplest op, "once per ``ttl_ms``" (the seeds' ``SET NX PX``): the
    fixed-window op that :class:`~floodwall.Frequency` runs (``ratelimit_fixed.lua`` on Redis,
    its Python step elsewhere) with a limit of one, replying ``(took, ms_until_free)``. Args
    from :func:`once`."""

    script = FIXED.script

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], tuple[bool, int]]:
        writes, batch = FIXED.step(records, now, args)
        return writes, self._took(batch)

    def parse(self, raw: Any) -> tuple[bool, int]:
        return self._took(FIXED.parse(raw))

    @staticmethod
    def _took(batch: Batch) -> tuple[bool, int]:
        _, [(allowed, _, _, reset_us, _)] = batch
        return allowed, round(reset_us / 1000)


ONCE = OnceOp()


def once(ttl_ms: int) -> list[Arg]:
    """:data:`ONCE`'s args: a limit of one per window of ``ttl_ms``, one request."""
    return [1, ttl_ms * 1000, 1, 1]


_LOCAL_STORES = ("memory", "host")
"""Stores with no server: unit tests, on a fake clock (``host://`` reads it in one process)."""
STORE_KINDS = ("memory", "host", "redis", "redis_cluster", "postgres", "sqlite")
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
        pytest.param(kind, marks=() if kind in _LOCAL_STORES else pytest.mark.integration)
        for kind in STORE_KINDS
    ]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of each store kind in turn (servers started on first use)."""
    kind = str(request.param)
    if kind == "memory":
        return "memory://"
    if kind == "host":  # System V objects of this test alone, removed when it closes the store
        return f"host://t{uuid.uuid4().hex[:16]}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/floodwall.db"
    return str(request.getfixturevalue(_STORE_SERVER_FIXTURES[kind]))


def _store_case(request: pytest.FixtureRequest, url: str) -> StoreCase:
    """A fresh store on ``url``. The fixtures ping it once before the test: under a CPU hog on
    both cores a first call on a new PostgreSQL connection took 568 ms against the 0.5 s store
    timeout, which a test of quotas would see as an outage (an ``on_store_error`` answer)."""
    kind = str(request.node.callspec.params["store_url"])
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    clock = FakeClock(1000.0) if kind in _LOCAL_STORES else None
    options: dict[str, object] = {"prefix": prefix}
    if clock is not None:
        options["clock"] = clock
    return StoreCase(kind, url, connect(url, **options), clock)


@pytest.fixture
def store_case(request: pytest.FixtureRequest, store_url: str) -> Iterator[StoreCase]:
    case = _store_case(request, store_url)
    with contextlib.suppress(StoreUnavailableError):
        case.store.ping()  # a connection opened before the test: see _store_case
    try:
        yield case
    finally:
        case.store.close()


@pytest.fixture
async def async_store_case(
    request: pytest.FixtureRequest, store_url: str
) -> AsyncIterator[StoreCase]:
    case = _store_case(request, store_url)
    with contextlib.suppress(StoreUnavailableError):
        await case.store.ping_async()  # a connection opened before the test: see _store_case
    try:
        yield case
    finally:
        await case.store.aclose()
        if case.kind == "host":
            case.store.close()  # the test's System V objects go with it


# --------------------------------------------------------------------------------------------
# Integrations (httpx, aiohttp, requests, ASGI, WSGI, gRPC): floodwall's pytest plugin
#
# `fake_clock` and `no_backoff` come from floodwall.testing, which is registered through the
# `pytest11` entry point once the package metadata declares it; imported here so the suite has
# them either way (a conftest fixture simply shadows the plugin's). Servers: tests/webservers.py.
# --------------------------------------------------------------------------------------------

import floodwall.testing as _floodwall_testing  # noqa: E402

fake_clock = _floodwall_testing.fake_clock
no_backoff = _floodwall_testing.no_backoff


# --------------------------------------------------------------------------------------------
# Gateway (floodwall.gateway): scripted upstreams, gateways in a thread or a process, raw HTTP
#
# `upstreams(...)` starts aiohttp servers on loopback whose answers a test scripts (status,
# delay, health); `gateways(config)` runs a whole gateway (proxy + admin API) in a loop thread
# with a known admin token; `GatewayProcess` runs `python -m floodwall.gateway` for tests that
# need real processes. Everything binds 127.0.0.1 on kernel-picked ports and is stopped at the
# end of the test.
# --------------------------------------------------------------------------------------------

import json as _json  # noqa: E402
import signal as _signal  # noqa: E402
import socket as _socket  # noqa: E402
import subprocess as _subprocess  # noqa: E402
import sys as _sys  # noqa: E402
from dataclasses import dataclass as _dataclass  # noqa: E402
from dataclasses import field as _field  # noqa: E402
from typing import Any as _Any  # noqa: E402

GATEWAY_TOKEN = "test-admin-token-0123456789"  # noqa: S105 - a throwaway test token


@_dataclass
class UpstreamState:
    """What a scripted upstream answers: ``status`` (or the next of ``script``), after
    ``delay`` seconds; ``healthy`` drives ``/health``; every request is recorded."""

    name: str
    status: int = 200
    delay: float = 0.0
    healthy: bool = True
    script: list[int] = _field(default_factory=list)
    requests: list[dict[str, _Any]] = _field(default_factory=list)
    health_checks: int = 0

    @property
    def count(self) -> int:
        return len(self.requests)


class Upstream:
    """A scripted aiohttp upstream on loopback (see :class:`UpstreamState`)."""

    def __init__(self, name: str) -> None:
        from aiohttp import web

        from webservers import Aiohttp

        self.state = UpstreamState(name)
        state = self.state

        async def health(request: web.Request) -> web.Response:
            state.health_checks += 1
            return web.Response(status=200 if state.healthy else 503, text="health")

        async def answer(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            state.requests.append(
                {
                    "method": request.method,
                    "path": request.path_qs,
                    "headers": dict(request.headers),
                    "body": body.decode("latin-1"),
                }
            )
            if state.delay:
                await asyncio.sleep(state.delay)
            status = state.script.pop(0) if state.script else state.status
            if request.path.startswith("/stream"):
                response = web.StreamResponse(status=status)
                response.headers["Connection"] = "close, X-Upstream-Secret"
                response.headers["X-Upstream-Secret"] = "hop"
                await response.prepare(request)
                for i in range(5):
                    await response.write(f"chunk{i};".encode())
                await response.write_eof()
                return response
            payload = {"upstream": state.name, "path": request.path_qs, "status": status}
            response = web.json_response(payload, status=status)
            response.headers["Keep-Alive"] = "timeout=5"
            response.headers["X-Served-By"] = state.name
            return response

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_route("*", "/{tail:.*}", answer)
        # stopped after its test only: an answer still held by ``delay`` has no one to read it
        # (waiting for them took 2.3 to 5.2 s of teardown in tests with a hanging upstream);
        # aiohttp reads a timeout <= 0 as none at all, so the shortest positive one
        self.server = Aiohttp(app, shutdown_timeout=0.01)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> Upstream:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()


class GatewayThread:
    """A whole gateway (supervisor, one in-process worker, admin API) in a loop thread."""

    def __init__(self, config: dict[str, _Any]) -> None:
        from floodwall.gateway.config import parse_gateway
        from floodwall.gateway.supervisor import Supervisor
        from webservers import LoopThread

        config = {"listen": "127.0.0.1:0", **config}
        config.setdefault("admin", {"listen": "127.0.0.1:0", "dashboard_interval": 0.5})
        self.config = config
        self.text = _json.dumps(config)
        document = parse_gateway(config, "<test>.json")
        env = {**os.environ, "FLOODWALL_ADMIN_TOKEN": GATEWAY_TOKEN}
        self.supervisor = Supervisor(document, self.text, "<test>.json", environ=env)
        self.loop = LoopThread()

    def start(self) -> GatewayThread:
        self.loop.run(self.supervisor.start(), timeout=20)
        return self

    def stop(self) -> None:
        async def cancel_rest() -> None:
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            self.loop.run(self.supervisor.stop(), timeout=20)
            self.loop.run(cancel_rest(), timeout=5)
        finally:
            self.loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.supervisor.port}"

    @property
    def port(self) -> int:
        return self.supervisor.port

    @property
    def admin_url(self) -> str:
        assert self.supervisor.admin is not None
        return f"http://127.0.0.1:{self.supervisor.admin.port}"

    @property
    def gateway(self) -> _Any:
        return self.supervisor.gateway

    def admin(self, method: str, path: str, **kwargs: _Any) -> _Any:
        import httpx

        headers = {"Authorization": f"Bearer {GATEWAY_TOKEN}", **kwargs.pop("headers", {})}
        return httpx.request(method, self.admin_url + path, headers=headers, timeout=10, **kwargs)


class GatewayProcess:
    """``python -m floodwall.gateway -c FILE`` as a real process (stopped with SIGTERM)."""

    def __init__(self, config: dict[str, _Any], path: Path, *, workers: int | None = None) -> None:
        from servers import free_port

        self.port = free_port()
        self.admin_port = free_port()
        config = {
            **config,
            "listen": f"127.0.0.1:{self.port}",
            "admin": {"listen": f"127.0.0.1:{self.admin_port}", "dashboard_interval": 0.5},
        }
        path.write_text(_json.dumps(config), encoding="utf-8")
        self.path = path
        self.log = path.with_suffix(".log")
        self.workers = workers
        self.proc: _subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout: float = 30.0) -> GatewayProcess:
        import httpx

        command = [_sys.executable, "-m", "floodwall.gateway", "-c", str(self.path)]
        if self.workers:
            command += ["--workers", str(self.workers)]
        env = {**os.environ, "FLOODWALL_ADMIN_TOKEN": GATEWAY_TOKEN}
        with self.log.open("wb") as log:
            self.proc = _subprocess.Popen(command, stdout=log, stderr=_subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited at start:\n{self.log.read_text()}")
            try:
                if httpx.get(self.admin_url + "/healthz", timeout=1).status_code == 200:
                    httpx.get(self.url + "/", timeout=2)  # the proxy answers too
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gateway not up within {timeout}s:\n{self.log.read_text()}")

    def admin(self, method: str, path: str, **kwargs: _Any) -> _Any:
        import httpx

        headers = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
        return httpx.request(method, self.admin_url + path, headers=headers, timeout=10, **kwargs)

    def stop(self, timeout: float = 20.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(_signal.SIGTERM)
            try:
                proc.wait(timeout)
            except _subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return proc.returncode


def raw_http(port: int, data: bytes, *, timeout: float = 5.0, read_all: bool = True) -> bytes:
    """Send ``data`` on a fresh TCP connection to 127.0.0.1:``port``; what came back until the
    server closed the connection (or ``timeout``)."""
    with _socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks: list[bytes] = []
        sock.settimeout(timeout)
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if not read_all and b"\r\n\r\n" in b"".join(chunks):
                    break
        except TimeoutError:
            pass
        return b"".join(chunks)


@pytest.fixture
def upstreams() -> Iterator[Callable[..., list[Upstream]]]:
    """``upstreams("a", "b")``: started scripted upstreams, stopped after the test."""
    started: list[Upstream] = []

    def start(*names: str) -> list[Upstream]:
        servers = [Upstream(name).start() for name in names]
        started.extend(servers)
        return servers

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def gateways() -> Iterator[Callable[[dict[str, _Any]], GatewayThread]]:
    """``gateways(config)``: a started :class:`GatewayThread`, stopped after the test."""
    started: list[GatewayThread] = []

    def start(config: dict[str, _Any]) -> GatewayThread:
        gateway = GatewayThread(config).start()
        started.append(gateway)
        return gateway

    try:
        yield start
    finally:
        for gateway in started:
            gateway.stop()
