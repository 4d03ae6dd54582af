"""The load-shedding guard in front of a real aiohttp server on 127.0.0.1.

Behaviour only: what is refused, with which status and header, and that refused work never
starts. Timing figures (goodput and p99 at 3× capacity, the collapse without the guard) are
measured by ``benchmarks/overload_http.py`` and reported in docs/overload.md, not asserted here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from floodwall import OverloadedError
from floodwall.adaptive import AdaptiveLimiter, FixedLimit, LoadShedder

pytestmark = pytest.mark.integration


def _app(shedder: LoadShedder, gate: asyncio.Event, started: asyncio.Queue[int]) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        try:
            ticket = shedder.admit(queue_time=float(request.headers.get("X-Queue-Time", "0")))
        except OverloadedError as refused:
            return web.Response(
                status=503,
                text=refused.reason,
                headers={"Retry-After": f"{refused.retry_after:g}"},
            )
        with ticket:
            started.put_nowait(1)
            await gate.wait()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", handle)
    return app


Served = tuple[str, asyncio.Event, "asyncio.Queue[int]"]
"""The server's URL, the gate that lets admitted handlers finish, and one item per started
handler."""
Start = Callable[[LoadShedder], Awaitable[Served]]


@pytest.fixture
async def served() -> AsyncIterator[Start]:
    """Start an app guarded by a given shedder on 127.0.0.1 (any free port); cleaned up after."""
    runners: list[web.AppRunner] = []

    async def start(shedder: LoadShedder) -> Served:
        gate, started = asyncio.Event(), asyncio.Queue[int]()
        runner = web.AppRunner(_app(shedder, gate, started), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/", gate, started

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_guard_answers_503_with_retry_after_when_the_limit_is_reached(
    served: Start,
) -> None:
    shedder = LoadShedder(AdaptiveLimiter(FixedLimit(2)), name="api", retry_after=2.0)
    url, gate, started = await served(shedder)
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(session.get(url))
        second = asyncio.create_task(session.get(url))
        await started.get()  # both handlers are inside, holding the two tokens
        await started.get()
        async with session.get(url) as refused:
            assert refused.status == 503
            assert refused.headers["Retry-After"] == "2"
            assert "concurrency limit 2 reached" in await refused.text()
        gate.set()
        for task in (first, second):
            response = await task
            assert response.status == 200
            response.release()
    assert started.empty()  # the refused request never started its work
    stats = shedder.stats()
    assert (stats.admitted, stats.shed, stats.inflight) == (2, 1, 0)


async def test_guard_sheds_requests_that_queued_too_long(
    served: Start,
) -> None:
    shedder = LoadShedder(max_queue_time=0.05)
    url, gate, started = await served(shedder)
    gate.set()
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers={"X-Queue-Time": "0.2"}) as stale:
            assert stale.status == 503
            assert "queued 200 ms > 50 ms" in await stale.text()
        async with session.get(url, headers={"X-Queue-Time": "0.01"}) as fresh:
            assert fresh.status == 200
    assert started.qsize() == 1
