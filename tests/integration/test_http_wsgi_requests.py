"""The WSGI middleware around a real Flask app (wsgiref server), driven through the requests
adapter: both ends of floodwall over one loopback connection."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
from flask import Flask, Response
from flask import request as flask_request

import floodwall as fw
from floodwall.backoff import NoBackoff
from floodwall.requests import ResilientAdapter
from floodwall.wsgi import FloodwallMiddleware, RateLimit
from webservers import WSGI

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@dataclass
class State:
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    calls: int = 0
    writes: int = 0
    seen: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _flask(state: State) -> Flask:
    app = Flask(__name__)

    @app.route("/thing", methods=["GET", "POST"])
    def thing() -> Response:
        with state.lock:
            state.calls += 1
            admission = flask_request.environ["floodwall"]
            state.seen.append(
                {
                    "attempt": admission.attempt,
                    "remaining": fw.remaining(),
                    "header": flask_request.headers.get("X-Retry-Attempt"),
                }
            )
            status, headers = state.script.pop(0) if state.script else (200, {})
        return Response(f"answer {state.calls}", status, headers)

    @app.post("/orders")
    def orders() -> Response:
        with state.lock:
            state.writes += 1
            return Response(f'{{"order": {state.writes}}}', 201, mimetype="application/json")

    app.wsgi_app = FloodwallMiddleware(  # type: ignore[method-assign]
        app.wsgi_app,
        limits=[RateLimit("2/m", route="/limited/*", key="ip")],
        idempotency=fw.Idempotency("memory://", fingerprint=str),
    )

    @app.get("/limited/a")
    def limited() -> str:
        return "ok"

    return app


@pytest.fixture(scope="module")
def _server() -> Iterator[tuple[str, State]]:
    state = State()
    with WSGI(_flask(state)) as server:
        yield server.url, state


@pytest.fixture
def server(_server: tuple[str, State]) -> tuple[str, State]:
    url, state = _server
    state.script.clear()
    state.calls = state.writes = 0
    state.seen.clear()
    return url, state


def _session(policy: fw.Policy | None) -> requests.Session:
    session = requests.Session()
    session.mount("http://", ResilientAdapter(policy))
    return session


def _retry(**options: Any) -> fw.Retry:
    return fw.Retry("flask", attempts=3, backoff=NoBackoff(), budget=None, **options)


def test_requests_retries_a_get_and_the_server_sees_the_marker(
    server: tuple[str, State],
) -> None:
    url, state = server
    state.script = [(500, {}), (502, {})]
    with _session(_retry()) as session, fw.deadline(2.0):
        answer = session.get(url + "/thing")
    assert answer.status_code == 200
    assert [s["attempt"] for s in state.seen] == [None, 2, 3]
    assert all(1.5 < s["remaining"] <= 2.0 for s in state.seen)


def test_requests_does_not_retry_a_post_without_a_key(server: tuple[str, State]) -> None:
    url, state = server
    state.script = [(500, {})]
    with _session(_retry()) as session:
        assert session.post(url + "/thing", data=b"x").status_code == 500
    assert state.calls == 1


def test_requests_honours_retry_after(server: tuple[str, State], no_backoff: Any) -> None:
    url, state = server
    state.script = [(503, {"Retry-After": "3"})]
    with _session(_retry(retry_overload=True)) as session:
        assert session.get(url + "/thing").status_code == 200
    assert no_backoff.delays == [3.0]


def test_requests_breaker_opens_and_recovers(
    server: tuple[str, State], fake_clock: fw.FakeClock
) -> None:
    url, state = server
    breaker = fw.CircuitBreaker("flask", minimum_calls=3, open_duration=2.0, clock=fake_clock)
    state.script = [(500, {})] * 3
    with _session(breaker) as session:
        for _ in range(3):
            assert session.get(url + "/thing").status_code == 500
        with pytest.raises(fw.CircuitOpenError):
            session.get(url + "/thing")
        fake_clock.advance(2.0)
        assert session.get(url + "/thing").status_code == 200
    assert breaker.state is fw.CircuitState.CLOSED
    assert state.calls == 4


def test_wsgi_429_carries_the_headers(server: tuple[str, State]) -> None:
    url, _ = server
    answers = [requests.get(url + "/limited/a", timeout=5) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    refused = answers[-1]
    assert refused.headers["RateLimit-Limit"] == "2"
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["Content-Type"] == "application/problem+json"
    assert refused.json()["status"] == 429


def test_wsgi_duplicate_posts_execute_once(server: tuple[str, State]) -> None:
    url, state = server
    with _session(None) as session:
        key = {"Idempotency-Key": "wsgi-order-1"}
        first = session.post(url + "/orders", data=b"{}", headers=key)
        again = session.post(url + "/orders", data=b"{}", headers=key)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"order": 1}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert state.writes == 1


def test_requests_connect_error_is_retried_and_raised_as_requests_error() -> None:
    from webservers import bound_socket

    sock = bound_socket()
    retry = _retry()
    try:
        with _session(retry) as session, pytest.raises(requests.ConnectionError):
            session.post(f"http://127.0.0.1:{sock.getsockname()[1]}/thing", timeout=2)
    finally:
        sock.close()
    assert retry.retries == 2
