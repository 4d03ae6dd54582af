"""A drill through the real gateway (``python -m floodwall.gateway``): the load goes through the
gateway to mock services on fixed ports; one fault slows a mock service down, another is a
configuration reload through the admin API (and is undone); breaker states come from
``GET /status``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import GATEWAY_TOKEN, GatewayProcess
from floodwall.drill import Job, load_scenario, run_jobs
from floodwall.drill.metrics import EventLog
from servers import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.xdist_group("drill"),  # real servers and real time: one drill at a time
]


def gateway_config(product: int, reviews: int) -> dict[str, Any]:
    return {
        "upstreams": {
            "product": {"endpoints": [f"http://127.0.0.1:{product}"]},
            "reviews": {"endpoints": [f"http://127.0.0.1:{reviews}"]},
        },
        "resources": {
            "product": {"level": 1, "timeout": "1s"},
            "reviews": {
                "level": 3,
                "timeout": "300ms",
                "circuit_breaker": {
                    "minimum_calls": 5,
                    "failure_rate": 0.5,
                    "window": "5s",
                    "open_duration": "1s",
                },
            },
        },
        "routes": [
            {
                "match": {"path_prefix": "/api/product"},
                "upstream": "product",
                "resource": "product",
            },
            {
                "match": {"path_prefix": "/api/reviews"},
                "upstream": "reviews",
                "resource": "reviews",
                "fallback": {"status": 200, "json": {"reviews": []}},
            },
        ],
    }


BREAKER = gateway_config(0, 0)["resources"]["reviews"]["circuit_breaker"]
POLL = 0.25
"""Seconds between the drill's polls of ``GET /status`` (the scenario's ``interval``)."""
POLL_TIMEOUT = 1.0
"""Seconds the drill waits for one poll: ``max(interval, 1 s)``."""


def _tripped(log: EventLog, route: str) -> float | None:
    """When the answers of ``route`` its caller saw first met the reviews breaker's rule (at least
    ``minimum_calls`` in its window, a share ``failure_rate`` of them failed: a fallback's
    answer is a failed call): seconds since the run started. The caller sees an answer after
    the gateway recorded it, so the breaker tripped no later than this."""
    window = float(BREAKER["window"].removesuffix("s"))
    ends = sorted((r.end, r.degraded or not r.ok) for r in log.requests if r.route == route)
    for i, (t, failed) in enumerate(ends):
        inside = [f for end, f in ends[: i + 1] if end > t - window]
        enough = len(inside) >= BREAKER["minimum_calls"]
        if failed and enough and sum(inside) >= BREAKER["failure_rate"] * len(inside):
            return t
    return None


def _status_round_trip(url: str) -> float:
    """The slowest of five ``GET /status`` round trips, in seconds: what a poll costs now."""
    slowest = 0.0
    with httpx.Client(headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"}, timeout=5) as client:
        for _ in range(5):
            began = time.monotonic()
            client.get(url).raise_for_status()
            slowest = max(slowest, time.monotonic() - began)
    return slowest


def test_a_drill_through_the_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOODWALL_ADMIN_TOKEN", GATEWAY_TOKEN)
    product, reviews = free_port(), free_port()
    gateway = GatewayProcess(gateway_config(product, reviews), tmp_path / "gateway.json")
    gateway.start()
    try:
        original = gateway.path.read_text()
        scenario, modes = load_scenario(
            {
                "name": "through-the-gateway",
                "warmup": 0.5,
                "drain": 2,
                "services": {
                    "product": {"latency": "20ms", "port": product},
                    "reviews": {"latency": "20ms", "port": reviews},
                },
                "edge": {
                    "kind": "external",
                    "url": gateway.url,
                    "status": {"url": gateway.admin_url + "/status", "interval": f"{POLL}s"},
                    "routes": [
                        {"path": "/api/product/1", "calls": ["product"]},
                        {"path": "/api/reviews/1", "calls": ["reviews"]},
                    ],
                },
                # as long as the assertions need (it was 9 s, the reload at 5 to 7 s): the slow
                # fault and its detection, the reload and its undo, half a second after
                "load": {"duration": 6, "rate": 40, "timeout": "2s"},
                "faults": [
                    {"at": 1.5, "until": 4, "service": "reviews", "latency": "3s"},
                    {
                        "at": 4.5,
                        "until": 5.5,
                        "reload": {
                            "file": str(gateway.path),
                            "admin": gateway.admin_url,
                            "merge": {
                                "upstreams": {"reviews": {"endpoints": ["http://127.0.0.1:9"]}}
                            },
                        },
                    },
                ],
            }
        )
        assert [m.name for m in modes] == ["external"]
        (result,) = run_jobs([Job(scenario, modes[0], tmp_path / "run")], parallel=False)
        assert gateway.path.read_text() == original  # the reload fault was undone
        round_trip = _status_round_trip(gateway.admin_url + "/status")
    finally:
        gateway.stop()
    log = gateway.log.read_text()
    assert "version 2" in log and "version 3" in log  # applied, then restored

    figures = result.figures
    # every poll of /status answered (a busy machine may add a note on event-loop lag, and keep
    # a poll past its 1 s timeout: 1 of 29 seen under a CPU hog on both cores); any other
    # failed poll is a defect, and the detection figure below needs the polls' states
    busy = ("event loop fell", "(last: TimeoutError)")
    assert [n for n in result.notes if not any(b in n for b in busy)] == []
    assert figures.healthy_routes == ("/api/product/1",)
    # A void run (the machine, not the system, set the pace: arrivals sent late, the loop
    # lagging, the run queue full) has no verdict on rates, as in the other drill tests; seen
    # in CI with arrivals 1.1 s late at p99 and 94 % healthy success.
    if figures.void:
        print(f"void on this machine, healthy success not judged: {figures.void}")
    else:
        assert figures.healthy_success_rate is not None and figures.healthy_success_rate >= 0.99
    # Detection: the breaker needs as many failures as its 5 s window holds successes from
    # before the fault (1.5 s of them: 1.80 s after the fault starts, 1.86 to 2.10 s seen
    # with the polls under a CPU hog, past the fixed 2.0 s this used to be). So the bound is
    # when the run's own answers met the breaker's rule, plus what it takes a poll to see it:
    # a poll in flight, the pause, the event loop's worst lag in this run, the next poll, and
    # the whole timeout of any poll the busy machine kept past it (counted in the note).
    tripped = _tripped(result.log, "/api/reviews/1")
    assert tripped is not None and figures.fault_start is not None
    met = tripped - figures.fault_start
    lag = max((s.loop_lag for s in result.log.samples), default=0.0)
    missed = sum(int(n.split(" of ")[0]) for n in result.notes if busy[1] in n)
    bound = met + POLL + lag + 2 * round_trip + missed * POLL_TIMEOUT
    detected = figures.detection_time_s
    print(f"detection {detected} s; rule met {met:.3f} s, lag {lag:.3f} s, poll {round_trip:.3f} s")
    assert detected is not None and detected <= bound, (detected, met, lag, round_trip)
    opened = [a for a in result.log.actions if a.kind == "state_change" and a.name == "reviews"]
    assert "OPEN" in [a.to_state for a in opened]  # polled from GET /status
    assert any(r.degraded for r in result.log.requests)  # X-Degraded
    # calls reaching the mock reviews carry the load's request ids through the gateway
    assert figures.amplification_by_dependency["product"] == pytest.approx(1.0, abs=0.02)
    assert figures.amplification is not None and figures.amplification < 1.0
