"""A drill against a running service: a FastAPI app under uvicorn with a drill agent, next to a
mock service, behind the drill's own edge. The agent takes its fault on the run's schedule and
its calls and actions land in the run's log on the run's clock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from floodwall.drill import Job, load_scenario, run_jobs
from floodwall.drill.agent import DrillAgent
from floodwall.drill.remote import AgentError, RemoteService
from floodwall.drill.scenario import ServiceSpec
from webservers import Uvicorn

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.xdist_group("drill"),  # real servers and real time: one drill at a time
]

FAULT = (1.5, 3.5)


def app() -> FastAPI:
    api = FastAPI()

    @api.get("/real")
    async def real() -> dict[str, str]:
        return {"service": "real"}

    return api


def scenario(url: str) -> dict[str, Any]:
    return {
        "name": "remote",
        "warmup": 0.5,
        "drain": 2,
        "services": {"mock": {"latency": "10ms"}, "real": {"url": url}},
        "edge": {
            "routes": [
                {"path": "/mock", "calls": ["mock"]},
                {"path": "/real", "calls": ["real"]},
            ]
        },
        "load": {"duration": 5.5, "rate": 30, "timeout": "2s"},
        "faults": [{"at": FAULT[0], "until": FAULT[1], "service": "real", "latency": "1s"}],
        "config": {"resources": {"real": {"timeout": "200ms", "fallback": {"value": None}}}},
    }


def test_a_running_service_takes_its_fault_and_reports_its_calls(tmp_path: Path) -> None:
    agent = DrillAgent(app(), name="real", allow=True)
    with Uvicorn(agent) as server:
        scenario_, modes = load_scenario(scenario(server.url))
        (result,) = run_jobs([Job(scenario_, modes[0], tmp_path)], parallel=False)
        assert agent.recorder is None  # the drill dropped its faults and its log

    figures = result.figures
    assert figures.amplification_by_dependency["real"] == pytest.approx(1.0, abs=0.02)
    assert figures.healthy_routes == ("/mock",)
    assert figures.healthy_success_rate is not None and figures.healthy_success_rate >= 0.99
    # a timeout and a fallback, no breaker: the fault is acted on, never cut out of the path
    assert figures.first_action_s is not None and figures.first_action_s <= 0.5
    assert figures.first_action_by is not None and "timeout" in figures.first_action_by
    assert figures.detection_time_s is None
    # the agent's clock lines up with the run's: calls are slow inside the fault window only
    calls = [
        (c.start, c.end - c.start)
        for c in result.log.calls
        if c.service == "real" and c.end is not None
    ]
    inside = [took for start, took in calls if FAULT[0] + 0.05 <= start < FAULT[1] - 0.05]
    outside = [took for start, took in calls if not FAULT[0] - 0.05 <= start < FAULT[1] + 0.05]
    assert inside and outside
    assert min(inside) >= 0.95
    assert max(outside) < 0.5
    assert result.ledgers == [str(tmp_path / "mock.ledger.jsonl")]


def test_a_service_without_an_allowed_agent_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOODWALL_CHAOS", raising=False)
    with Uvicorn(DrillAgent(app(), name="real")) as server:
        remote = RemoteService("real", ServiceSpec(url=server.url))

        async def start() -> None:
            try:
                await remote.start()
            finally:
                await remote.stop()

        with pytest.raises(AgentError, match="FLOODWALL_CHAOS=1"):
            asyncio.run(start())


def test_the_agent_of_another_service_is_refused() -> None:
    with Uvicorn(DrillAgent(app(), name="users", allow=True)) as server:
        remote = RemoteService("posts", ServiceSpec(url=server.url))

        async def start() -> None:
            try:
                await remote.start()
            finally:
                await remote.stop()

        with pytest.raises(AgentError, match="drill agent of 'users', not 'posts'"):
            asyncio.run(start())
