"""The aiohttp client middleware against a real aiohttp server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import floodwall as fw
from floodwall.aiohttp import ResilientMiddleware
from floodwall.backoff import NoBackoff
from floodwall.testing import BackoffWaits, Fault, FaultMiddleware
from webservers import Aiohttp, bound_socket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@dataclass
class State:
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    calls: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)


def _app(state: State) -> web.Application:
    async def thing(request: web.Request) -> web.Response:
        state.calls += 1
        state.headers.append(dict(request.headers))
        status, headers = state.script.pop(0) if state.script else (200, {})
        return web.Response(text=f"answer {state.calls}", status=status, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/thing", thing)
    return app


@pytest.fixture(scope="module")
def _server() -> Iterator[tuple[str, State]]:
    state = State()
    with Aiohttp(_app(state)) as server:
        yield server.url, state


@pytest.fixture
def server(_server: tuple[str, State]) -> tuple[str, State]:
    url, state = _server
    state.script.clear()
    state.calls = 0
    state.headers.clear()
    return url, state


def _retry(**options: Any) -> fw.Retry:
    return fw.Retry("aio", attempts=3, backoff=NoBackoff(), budget=None, **options)


def _session(*middlewares: Any) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(middlewares=middlewares)


async def test_retries_a_get_with_markers_and_a_shrinking_deadline(
    server: tuple[str, State],
) -> None:
    url, state = server
    state.script = [(500, {}), (504, {})]
    async with _session(ResilientMiddleware(_retry())) as session:
        with fw.deadline(2.0):
            answer = await session.get(url + "/thing")
            assert answer.status == 200
            assert await answer.text() == "answer 3"
    assert [h.get("X-Retry-Attempt") for h in state.headers] == [None, "2", "3"]
    deadlines = [int(h["X-Request-Deadline"]) for h in state.headers]
    assert deadlines == sorted(deadlines, reverse=True)
    assert 1500 < deadlines[-1] < 2000


async def test_a_post_without_a_key_is_not_retried_and_the_body_survives(
    server: tuple[str, State],
) -> None:
    url, state = server
    state.script = [(502, {})]
    async with (
        _session(ResilientMiddleware(_retry())) as session,
        session.post(url + "/thing", data=b"x") as answer,
    ):
        assert answer.status == 502
        assert await answer.text() == "answer 1"
    assert state.calls == 1


async def test_retry_after_is_honoured(server: tuple[str, State], no_backoff: BackoffWaits) -> None:
    url, state = server
    state.script = [(429, {"Retry-After": "2"})]
    async with (
        _session(ResilientMiddleware(_retry(retry_overload=True))) as session,
        session.get(url + "/thing") as answer,
    ):
        assert answer.status == 200
    assert no_backoff.delays == [2.0]


async def test_breaker_opens_and_recovers(
    server: tuple[str, State], fake_clock: fw.FakeClock
) -> None:
    url, state = server
    breaker = fw.CircuitBreaker("aio", minimum_calls=3, open_duration=1.0, clock=fake_clock)
    state.script = [(503, {})] * 3
    async with _session(ResilientMiddleware(breaker)) as session:
        for _ in range(3):
            async with session.get(url + "/thing") as answer:
                assert answer.status == 503
        with pytest.raises(fw.CircuitOpenError):
            await session.get(url + "/thing")
        fake_clock.advance(1.0)
        async with session.get(url + "/thing") as answer:
            assert answer.status == 200
    assert state.calls == 4


async def test_connect_errors_are_retried_and_raised_as_aiohttp_errors() -> None:
    sock = bound_socket()
    retry = _retry()
    try:
        async with _session(ResilientMiddleware(retry)) as session:
            with pytest.raises(aiohttp.ClientConnectorError):
                await session.post(f"http://127.0.0.1:{sock.getsockname()[1]}/thing")
    finally:
        sock.close()
    assert retry.retries == 2


async def test_fault_middleware_injects_inside_the_resilient_one(
    server: tuple[str, State],
) -> None:
    url, state = server
    faults = FaultMiddleware([Fault.disconnect(), Fault.answer(500), None])
    async with (
        _session(ResilientMiddleware(_retry()), faults) as session,
        session.get(url + "/thing") as answer,
    ):
        assert answer.status == 200
    assert faults.faults.injected == 2
    assert state.calls == 2  # the status fault let the request through, then replaced it
