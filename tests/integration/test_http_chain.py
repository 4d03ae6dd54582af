"""Three services over HTTP (edge → mid → leaf), floodwall on both sides of every hop.

Real uvicorn servers on loopback, real httpx clients. The leaf fails; naively (3 attempts per
tier) every edge request would cost 3 × 3 × 3 = 27 leaf calls. With floodwall the mid retries
within its budget, says so on its failure answers (``X-Retry-Pushback-Ms: -1``), and the edge
does not retry again: about 1.1 leaf calls per edge request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from fastapi import FastAPI, Request, Response

import floodwall as fw
from floodwall.asgi import FloodwallMiddleware
from floodwall.backoff import NoBackoff
from floodwall.httpx import AsyncResilientTransport
from webservers import Uvicorn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

EDGE_REQUESTS = 200


@dataclass
class Leaf:
    failing: bool = True
    calls: int = 0
    deadlines: list[str | None] = field(default_factory=list)
    attempts: list[str | None] = field(default_factory=list)


def _leaf_app(leaf: Leaf) -> FastAPI:
    app = FastAPI()

    @app.get("/work")
    async def work(request: Request) -> Response:
        leaf.calls += 1
        leaf.deadlines.append(request.headers.get("x-request-deadline"))
        leaf.attempts.append(request.headers.get("x-retry-attempt"))
        return Response("leaf down" if leaf.failing else "ok", 500 if leaf.failing else 200)

    app.add_middleware(FloodwallMiddleware)
    return app


def _relay_app(downstream: str, name: str, seen: list[str | None]) -> FastAPI:
    """A service whose one handler calls ``downstream`` through floodwall and relays."""
    retry = fw.Retry(
        name,
        attempts=3,
        backoff=NoBackoff(),
        budget=fw.RetryBudget(0.1, min_per_second=1.0),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        transport = AsyncResilientTransport(policy=retry)
        async with httpx.AsyncClient(transport=transport) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/work")
    async def work(request: Request) -> Response:
        seen.append(request.headers.get("x-request-deadline"))
        answer = await request.app.state.client.get(downstream + "/work")
        status = 200 if answer.status_code == 200 else 502
        return Response(answer.content, status)

    app.add_middleware(FloodwallMiddleware)
    app.state.retry = retry
    return app


@dataclass
class Chain:
    edge: str
    mid: str
    leaf: Leaf
    mid_seen: list[str | None]
    edge_retry: fw.Retry
    mid_retry: fw.Retry


@pytest.fixture
def chain() -> Iterator[Chain]:
    leaf = Leaf()
    mid_seen: list[str | None] = []
    edge_seen: list[str | None] = []
    with Uvicorn(_leaf_app(leaf)) as leaf_server:
        mid_app = _relay_app(leaf_server.url, "mid->leaf", mid_seen)
        with Uvicorn(mid_app, lifespan="on") as mid_server:
            edge_app = _relay_app(mid_server.url, "edge->mid", edge_seen)
            with Uvicorn(edge_app, lifespan="on") as edge_server:
                yield Chain(
                    edge_server.url,
                    mid_server.url,
                    leaf,
                    mid_seen,
                    edge_app.state.retry,
                    mid_app.state.retry,
                )


async def _drive(url: str, count: int, concurrency: int = 8) -> list[int]:
    statuses: list[int] = []
    numbers = iter(range(count))
    async with httpx.AsyncClient(timeout=10.0) as client:

        async def worker() -> None:
            for _ in numbers:
                answer = await client.get(url + "/work")
                statuses.append(answer.status_code)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses


def test_leaf_calls_per_edge_request_stay_near_one(chain: Chain) -> None:
    statuses = asyncio.run(_drive(chain.edge, EDGE_REQUESTS))
    assert statuses == [502] * EDGE_REQUESTS
    per_request = chain.leaf.calls / EDGE_REQUESTS
    print(f"\nleaf calls per edge request: {per_request:.3f} (naive: 27)")
    assert per_request <= 1.4
    # The edge never retried: every failure it got said "retried below".
    assert chain.edge_retry.retries == 0
    assert chain.mid_retry.retries == chain.leaf.calls - EDGE_REQUESTS


def test_a_retried_request_is_not_retried_again_downstream(chain: Chain) -> None:
    # An upstream's retry (attempt 2) reaches mid: mid's own call to the leaf must not retry,
    # and the marker travels on to the leaf.
    answer = httpx.get(chain.mid + "/work", headers={"X-Retry-Attempt": "2"})
    assert answer.status_code == 502
    assert chain.leaf.calls == 1
    assert chain.leaf.attempts == ["2"]


def test_the_deadline_set_at_the_edge_shrinks_at_every_hop(chain: Chain) -> None:
    chain.leaf.failing = False
    answer = httpx.get(chain.edge + "/work", headers={"X-Request-Deadline": "2000"})
    assert answer.status_code == 200
    mid = int(chain.mid_seen[-1] or 0)
    leaf = int(chain.leaf.deadlines[-1] or 0)
    print(f"\ndeadline: edge 2000 ms -> mid {mid} ms -> leaf {leaf} ms")
    assert 1500 < leaf < mid < 2000


def test_calls_without_a_deadline_send_none(chain: Chain) -> None:
    chain.leaf.failing = False
    assert httpx.get(chain.edge + "/work").status_code == 200
    assert chain.leaf.deadlines == [None]
