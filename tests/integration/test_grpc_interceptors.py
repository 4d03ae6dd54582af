"""gRPC interceptors against a real ``grpc.aio`` server on loopback (no protobuf: bytes in and
out through generic handlers), with ``grpc.aio`` and sync clients."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

import floodwall as fw
from floodwall.asgi import RateLimit
from floodwall.backoff import NoBackoff
from floodwall.grpc import AsyncGuardInterceptor, AsyncResilientInterceptor, ResilientInterceptor
from floodwall.testing import BackoffWaits
from webservers import GrpcAio

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SAY = "/test.Echo/Say"
WRITE = "/test.Echo/Write"
LIMITED = "/test.Limited/Call"


@dataclass
class State:
    codes: list[grpc.StatusCode] = field(default_factory=list)
    calls: int = 0
    seen: list[dict[str, Any]] = field(default_factory=list)


def _build(state: State) -> Any:
    async def handle(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        state.calls += 1
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        state.seen.append({"metadata": metadata, "remaining": fw.remaining()})
        if state.codes:
            await context.abort(state.codes.pop(0), "scripted failure")
        return b"hi " + request

    def build(server: Any) -> None:
        handler: Any = grpc.unary_unary_rpc_method_handler(handle)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "test.Echo", {"Say": handler, "Write": handler}
                ),
                grpc.method_handlers_generic_handler("test.Limited", {"Call": handler}),
            )
        )

    return build


@pytest.fixture(scope="module")
def _server() -> Iterator[tuple[str, State]]:
    state = State()
    guard = AsyncGuardInterceptor(limits=[RateLimit("2/m", route=LIMITED)])
    with GrpcAio(_build(state), interceptors=(guard,)) as server:
        yield server.target, state


@pytest.fixture
def server(_server: tuple[str, State]) -> tuple[str, State]:
    target, state = _server
    state.codes.clear()
    state.calls = 0
    state.seen.clear()
    return target, state


def _retry(**options: Any) -> fw.Retry:
    options.setdefault("attempts", 3)
    return fw.Retry("grpc", backoff=NoBackoff(), budget=None, **options)


def _stub(channel: Any, method: str) -> Any:
    """The callable for ``method`` (bytes in, bytes out: no serializers)."""
    return channel.unary_unary(method)


def _aio(target: str, policy: fw.Policy | None) -> grpc.aio.Channel:
    interceptor = AsyncResilientInterceptor(policy, target=target, idempotent=[SAY])
    return grpc.aio.insecure_channel(target, interceptors=[interceptor])


def _sync(target: str, policy: fw.Policy | None) -> grpc.Channel:
    interceptor = ResilientInterceptor(policy, target=target, idempotent=[SAY])
    return grpc.intercept_channel(grpc.insecure_channel(target), interceptor)


async def test_aio_retries_unavailable_with_markers_under_the_native_deadline(
    server: tuple[str, State],
) -> None:
    target, state = server
    state.codes = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE]
    async with _aio(target, _retry()) as channel:
        with fw.deadline(2.0):
            assert await _stub(channel, SAY)(b"x") == b"hi x"
    assert [s["metadata"].get("x-retry-attempt") for s in state.seen] == [None, "2", "3"]
    assert all(1.5 < s["remaining"] < 2.0 for s in state.seen)


async def test_aio_does_not_retry_a_non_idempotent_method_without_a_key(
    server: tuple[str, State],
) -> None:
    target, state = server
    state.codes = [grpc.StatusCode.UNAVAILABLE]
    async with _aio(target, _retry()) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await _stub(channel, WRITE)(b"x")
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert state.calls == 1


async def test_aio_retries_a_write_carrying_an_idempotency_key(
    server: tuple[str, State],
) -> None:
    target, state = server
    state.codes = [grpc.StatusCode.UNAVAILABLE]
    async with _aio(target, _retry()) as channel:
        answer = await _stub(channel, WRITE)(b"x", metadata=(("idempotency-key", "w1"),))
    assert answer == b"hi x"
    assert state.calls == 2


async def test_business_errors_pass_through_uncounted(server: tuple[str, State]) -> None:
    target, state = server
    breaker = fw.CircuitBreaker("grpc", minimum_calls=2, failure_rate=0.5)
    state.codes = [grpc.StatusCode.NOT_FOUND] * 3
    async with _aio(target, breaker) as channel:
        for _ in range(3):
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await _stub(channel, SAY)(b"x")
            assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    assert breaker.state is fw.CircuitState.CLOSED
    assert breaker.metrics().calls == 3  # counted as successes: the service answered


def test_sync_breaker_opens_on_unavailable_and_recovers(
    server: tuple[str, State], fake_clock: fw.FakeClock
) -> None:
    target, state = server
    breaker = fw.CircuitBreaker("grpc", minimum_calls=3, open_duration=2.0, clock=fake_clock)
    state.codes = [grpc.StatusCode.UNAVAILABLE] * 3
    with _sync(target, breaker) as channel:
        say = _stub(channel, SAY)
        for _ in range(3):
            with pytest.raises(grpc.RpcError):
                say(b"x")
        with pytest.raises(fw.CircuitOpenError):
            say(b"x")
        fake_clock.advance(2.0)
        assert say(b"y") == b"hi y"
    assert state.calls == 4
    assert breaker.state is fw.CircuitState.CLOSED


def test_sync_client_retries_and_sends_the_deadline(server: tuple[str, State]) -> None:
    target, state = server
    state.codes = [grpc.StatusCode.ABORTED]
    with _sync(target, _retry()) as channel, fw.deadline(1.0):
        assert _stub(channel, SAY)(b"z") == b"hi z"
    assert state.calls == 2
    assert 0.8 < state.seen[-1]["remaining"] < 1.0


async def test_guard_refuses_with_resource_exhausted_and_pushback(
    server: tuple[str, State], no_backoff: BackoffWaits
) -> None:
    target, state = server
    async with grpc.aio.insecure_channel(target) as channel:
        call = _stub(channel, LIMITED)
        assert await call(b"1") == b"hi 1"
        assert await call(b"2") == b"hi 2"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(b"3")
    error = refused.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailing = dict(error.trailing_metadata() or ())
    assert int(trailing["grpc-retry-pushback-ms"]) >= 1000
    assert trailing["ratelimit-remaining"] == "0"
    assert state.calls == 2
    # A floodwall client told to retry overload waits the pushback (skipped here) and retries.
    async with _aio(target, _retry(retry_overload=True, attempts=2)) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await _stub(channel, LIMITED)(b"4", metadata=(("idempotency-key", "k4"),))
    assert len(no_backoff.delays) == 1 and no_backoff.delays[0] >= 1.0


def test_sync_server_guard_sets_the_deadline_and_refuses_over_the_limit() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from floodwall.grpc import GuardInterceptor

    seen: list[float | None] = []

    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append(fw.remaining())
        return request

    handler: Any = grpc.unary_unary_rpc_method_handler(handle)
    server = grpc.server(
        ThreadPoolExecutor(4),
        interceptors=[GuardInterceptor(limits=[RateLimit("1/m")])],
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Sync", {"Echo": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = _stub(channel, "/test.Sync/Echo")
            assert echo(b"a", timeout=1.0) == b"a"
            with pytest.raises(grpc.RpcError) as refused:
                echo(b"b", timeout=1.0)
    finally:
        server.stop(grace=None).wait(5)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert seen[0] is not None
    assert 0.8 < seen[0] <= 1.05  # grpc-timeout is rounded on the way
