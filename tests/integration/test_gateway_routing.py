"""The gateway against real upstreams on loopback: routing, balancing, outlier ejection."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from conftest import GatewayThread, Upstream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Start = Callable[[dict[str, Any]], GatewayThread]


def test_routes_by_host_prefix_regex_method_and_header(
    upstreams: Callable[..., list[Upstream]], gateways: Start
) -> None:
    a, b, c, d = upstreams("a", "b", "c", "d")
    gw = gateways(
        {
            "upstreams": {u.state.name: {"endpoints": [u.url]} for u in (a, b, c, d)},
            "routes": [
                {"match": {"host": "api.example.com", "path_prefix": "/"}, "upstream": "a"},
                {"match": {"path_regex": r"/users/(?P<user>\d+)"}, "upstream": "b"},
                {"match": {"path_prefix": "/x", "methods": ["POST"]}, "upstream": "c"},
                {"match": {"path_prefix": "/x", "headers": {"X-Canary": "1"}}, "upstream": "d"},
                {"match": {"path_prefix": "/x"}, "upstream": "c", "name": "x-default"},
            ],
        }
    )
    with httpx.Client(base_url=gw.url, timeout=5) as client:
        assert (
            client.get("/anything", headers={"Host": "API.example.com:8080"}).json()["upstream"]
            == "a"
        )
        assert client.get("/users/42").json()["upstream"] == "b"
        assert client.get("/users/abc").status_code == 404  # the regex is a full match
        assert client.post("/x/1").json()["upstream"] == "c"
        assert client.get("/x/1", headers={"X-Canary": "1"}).json()["upstream"] == "d"
        assert client.get("/x/1").json()["upstream"] == "c"
        missing = client.get("/nowhere")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/problem+json"


def test_round_robin_spreads_evenly(
    upstreams: Callable[..., list[Upstream]], gateways: Start
) -> None:
    servers = upstreams("e1", "e2", "e3")
    gw = gateways(
        {
            "upstreams": {"pool": {"endpoints": [s.url for s in servers]}},
            "routes": [{"match": {"path_prefix": "/"}, "upstream": "pool"}],
        }
    )
    with httpx.Client(base_url=gw.url, timeout=5) as client:
        seen = collections.Counter(client.get("/").json()["upstream"] for _ in range(30))
    assert seen == {"e1": 10, "e2": 10, "e3": 10}


def test_least_request_avoids_the_slow_endpoint(
    upstreams: Callable[..., list[Upstream]], gateways: Start
) -> None:
    fast, slow = upstreams("fast", "slow")
    slow.state.delay = 0.3
    gw = gateways(
        {
            "upstreams": {"pool": {"endpoints": [fast.url, slow.url], "balance": "least_request"}},
            "routes": [{"match": {"path_prefix": "/"}, "upstream": "pool"}],
        }
    )
    results: list[str] = []

    def worker() -> None:
        with httpx.Client(base_url=gw.url, timeout=5) as client:
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                results.append(client.get("/").json()["upstream"])

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seen = collections.Counter(results)
    # The slow endpoint holds its requests longer, so power-of-two choices sends it far fewer.
    assert seen["fast"] > 5 * seen["slow"], seen


def test_outlier_is_ejected_then_returns(
    upstreams: Callable[..., list[Upstream]], gateways: Start
) -> None:
    good, bad = upstreams("good", "bad")
    bad.state.status = 500
    gw = gateways(
        {
            "upstreams": {
                "pool": {
                    "endpoints": [good.url, bad.url],
                    "outlier_detection": {
                        "consecutive_5xx": 3,
                        "base_ejection_time": "1s",
                        "max_ejection_share": 0.5,
                    },
                }
            },
            "routes": [{"match": {"path_prefix": "/"}, "upstream": "pool"}],
        }
    )
    with httpx.Client(base_url=gw.url, timeout=5) as client:
        for _ in range(6):  # round robin: 3 go to `bad`, the third ejects it
            client.get("/")
        assert bad.state.count == 3
        statuses = [client.get("/").status_code for _ in range(10)]
        assert statuses == [200] * 10
        assert bad.state.count == 3  # ejected: nothing more reached it
        endpoints = gw.admin("GET", "/status").json()["upstreams"]["pool"]["endpoints"]
        assert [e["ejected"] for e in endpoints] == [False, True]
        bad.state.status = 200
        time.sleep(1.3)  # the ejection (1 s, the first) ends
        for _ in range(10):
            assert client.get("/").status_code == 200
        assert bad.state.count > 3  # back in the pool
        endpoints = gw.admin("GET", "/status").json()["upstreams"]["pool"]["endpoints"]
        assert [e["ejected"] for e in endpoints] == [False, False]


def test_active_health_checks_take_an_endpoint_out_and_back(
    upstreams: Callable[..., list[Upstream]], gateways: Start
) -> None:
    one, two = upstreams("one", "two")
    gw = gateways(
        {
            "upstreams": {
                "pool": {
                    "endpoints": [one.url, two.url],
                    "health_check": {
                        "path": "/health",
                        "interval": "100ms",
                        "healthy_threshold": 1,
                        "unhealthy_threshold": 2,
                    },
                }
            },
            "routes": [{"match": {"path_prefix": "/"}, "upstream": "pool"}],
        }
    )
    two.state.healthy = False
    time.sleep(0.6)
    with httpx.Client(base_url=gw.url, timeout=5) as client:
        assert {client.get("/").json()["upstream"] for _ in range(8)} == {"one"}
        two.state.healthy = True
        time.sleep(0.5)
        assert {client.get("/").json()["upstream"] for _ in range(8)} == {"one", "two"}


def test_bodies_stream_both_ways(upstreams: Callable[..., list[Upstream]], gateways: Start) -> None:
    (svc,) = upstreams("svc")
    gw = gateways(
        {
            "upstreams": {"svc": {"endpoints": [svc.url]}},
            "routes": [
                {"match": {"path_prefix": "/"}, "upstream": "svc", "retry_body_limit": 1024}
            ],
        }
    )
    big = bytes(range(256)) * 800  # 200 KiB: streamed, not buffered

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 10_000):
            yield big[i : i + 10_000]

    with httpx.Client(base_url=gw.url, timeout=10) as client:
        assert client.post("/upload", content=big).status_code == 200
        assert svc.state.requests[-1]["body"] == big.decode("latin-1")
        assert client.post("/chunked", content=chunks()).status_code == 200  # no length
        assert svc.state.requests[-1]["body"] == big.decode("latin-1")
        streamed = client.get("/stream/x")
        assert streamed.text == "chunk0;chunk1;chunk2;chunk3;chunk4;"
