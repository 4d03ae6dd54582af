"""The drill agent in a running service, driven as an ASGI app (no server), and the wire form
of faults it takes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest

import floodwall as fw
from floodwall._core.events import Event
from floodwall.chaos import Latency
from floodwall.drill.agent import DrillAgent
from floodwall.drill.faults import fault_wire
from floodwall.drill.scenario import FaultSpec, parse_scenario

Message = MutableMapping[str, Any]


async def hello(scope: Message, receive: Any, send: Any) -> None:
    """The service's own app: 200 ``hello`` on every path."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


async def call(
    app: Any, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, content


def error_fault(status: int = 503) -> dict[str, Any]:
    spec = FaultSpec.model_validate({"at": 0, "service": "users", "error": status})
    return {"seed": 1, "faults": [{"index": 0, "spec": fault_wire(spec)}]}


async def test_an_agent_not_allowed_is_invisible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOODWALL_CHAOS", raising=False)
    agent = DrillAgent(hello, name="users")
    assert not agent.allowed
    assert await call(agent, "POST", "/_drill/start", error_fault()) == (200, b"hello")
    assert await call(agent, "GET", "/x") == (200, b"hello")
    assert agent.recorder is None


async def test_the_environment_allows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOODWALL_CHAOS", "1")
    assert DrillAgent(hello, name="users").allowed


async def test_nothing_is_recorded_before_a_drill_starts() -> None:
    agent = DrillAgent(hello, name="users", allow=True)
    assert await call(agent, "GET", "/x") == (200, b"hello")
    status, body = await call(agent, "GET", "/_drill/health")
    assert status == 200 and json.loads(body) == {"service": "users", "in_flight": 0}
    assert json.loads((await call(agent, "GET", "/_drill/log"))[1])["calls"] == []


async def test_calls_are_recorded_with_the_edge_request_they_serve() -> None:
    agent = DrillAgent(hello, name="users", allow=True)
    status, body = await call(agent, "POST", "/_drill/start", {"seed": 1, "faults": []})
    assert (status, json.loads(body)["faults"]) == (200, 0)
    await call(agent, "GET", "/a", headers={"X-Drill-Request": "7"})
    await call(agent, "GET", "/b")
    log = json.loads((await call(agent, "GET", "/_drill/log"))[1])
    assert [(c[2], c[3]) for c in log["calls"]] == [(200, 7), (200, None)]
    assert all(0 <= start <= end for start, end, *_ in log["calls"])


async def test_an_error_fault_answers_instead_of_the_app() -> None:
    agent = DrillAgent(hello, name="users", allow=True)
    assert (await call(agent, "POST", "/_drill/start", error_fault(502)))[0] == 200
    status, body = await call(agent, "GET", "/x", headers={"X-Drill-Request": "3"})
    assert status == 502 and json.loads(body) == {"error": "injected", "service": "users"}
    log = json.loads((await call(agent, "GET", "/_drill/log"))[1])
    assert [(c[2], c[3]) for c in log["calls"]] == [(502, 3)]
    # stop drops the faults and the log: the app answers again, unobserved
    assert (await call(agent, "POST", "/_drill/stop"))[0] == 200
    assert await call(agent, "GET", "/x") == (200, b"hello")
    assert agent.recorder is None


async def test_the_services_own_events_become_actions() -> None:
    agent = DrillAgent(hello, name="profile", allow=True)
    agent.on_event(Event("timeout", "timeout", "posts", 0.0))  # no drill yet: dropped
    await call(agent, "POST", "/_drill/start", {"seed": 1, "faults": []})
    timeout = fw.Timeout(0.001, name="posts", listeners=[agent.on_event])

    async def slow() -> None:
        await asyncio.Event().wait()  # hangs until the timeout cancels it

    with pytest.raises(TimeoutError):
        await timeout.call_async(slow)
    actions = json.loads((await call(agent, "GET", "/_drill/log"))[1])["actions"]
    assert [(a[1], a[3]) for a in actions] == [("timeout", "posts")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "Expecting value"),
        ([1, 2], "expected a JSON object"),
        ({"faults": [{"spec": {}}]}, "each fault must be {index, spec}"),
        ({"faults": [{"index": 0, "spec": {"at": 0}}]}, "fault 0:"),
    ],
)
async def test_a_malformed_start_is_refused(body: object, message: str) -> None:
    agent = DrillAgent(hello, name="users", allow=True)
    status, answer = await call(agent, "POST", "/_drill/start", body)
    assert status == 422 and message in json.loads(answer)["error"]
    assert agent.recorder is None


async def test_unknown_control_paths_are_404() -> None:
    agent = DrillAgent(hello, name="users", allow=True)
    assert (await call(agent, "DELETE", "/_drill/log"))[0] == 404


@pytest.mark.parametrize(
    "fault",
    [
        {"at": 1, "until": 3, "service": "s", "latency": "250ms"},
        {"at": 1, "service": "s", "latency": {"uniform": {"low": "1s", "high": "2s"}}},
        {"at": 1, "service": "s", "latency": {"exponential": {"mean": "1s", "cap": "5s"}}},
        {"at": 1, "service": "s", "rate": 0.5, "latency": {"lognormal": {"median": "1s"}}},
        {"at": 0, "until": 2, "service": "s", "error": 502, "rate": 0.25},
        {"at": 2, "service": "s", "hang": {"duration": "4s", "after_apply": 0.5}},
    ],
)
def test_a_fault_survives_the_wire(fault: dict[str, Any]) -> None:
    spec = FaultSpec.model_validate(fault)
    wire = json.loads(json.dumps(fault_wire(spec)))
    assert FaultSpec.model_validate(wire) == spec


def test_a_reload_fault_has_no_wire_form() -> None:
    spec = FaultSpec.model_validate({"at": 1, "reload": {"file": "g.yaml", "merge": {}}})
    with pytest.raises(ValueError, match="edge's config"):
        fault_wire(spec)


def _remote(**service: Any) -> dict[str, Any]:
    return {
        "services": {"users": {"url": "http://127.0.0.1:9"}, **service},
        "edge": {"routes": [{"path": "/u", "calls": ["users"]}]},
        "load": {"duration": 5, "rate": 10},
    }


def test_a_running_service_is_a_url() -> None:
    scenario, _ = parse_scenario(_remote())
    assert scenario.services["users"].remote
    assert scenario.services["users"].latency == Latency.fixed(0.01)  # unused default


def test_a_running_service_takes_no_mock_settings() -> None:
    raw = _remote()
    raw["services"]["users"]["latency"] = "1s"
    raw["services"]["users"]["port"] = 8000
    with pytest.raises(fw.ConfigError, match="takes no mock settings: drop latency, port"):
        parse_scenario(raw, "drill.yaml")


def test_a_running_service_needs_an_http_url() -> None:
    with pytest.raises(fw.ConfigError, match=r"services\.users\.url: must be an http"):
        parse_scenario(
            {**_remote(), "services": {"users": {"url": "redis://x"}}},
            "drill.yaml",
        )


def test_writes_go_to_mock_services_only() -> None:
    raw = _remote()
    raw["edge"]["routes"] = [{"path": "/u", "method": "POST", "calls": ["users"]}]
    with pytest.raises(fw.ConfigError, match="ledger audit counts writes on mock services"):
        parse_scenario(raw, "drill.yaml")
