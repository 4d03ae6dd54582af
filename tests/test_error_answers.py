"""Issue 19, item 4: HTTP answers for floodwall's own errors.

A :class:`~floodwall.RejectedError` an app raises (an open breaker, a full bulkhead, a rate
limit, a timeout deep in a handler) is answered by the ASGI and WSGI middleware the way the
guard answers its own refusals, problem+json with 503 + ``Retry-After`` / 429 / 504, not as a
bare 500. Other errors and answers already started are left alone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

import pytest

import floodwall as fw
from floodwall.adaptive import AdaptiveLimiter, AIMDLimit, LoadShedder
from floodwall.asgi import FloodwallMiddleware as AsgiMiddleware
from floodwall.breaker import CircuitState
from floodwall.wsgi import FloodwallMiddleware as WsgiMiddleware

RAISED: list[tuple[BaseException, int, str | None]] = [
    (fw.CircuitOpenError("payments", CircuitState.OPEN, 7.2), 503, "8"),
    (fw.BulkheadFullError("pool", "no free slot", 1.0), 503, "1"),
    (fw.RateLimitedError("api", "2/s", 0.4), 429, "1"),
    (fw.TimeoutExceeded("payments", 1.0), 504, None),
]
"""An error the app raises, the status it must be answered with, its ``Retry-After``."""


def asgi_call(app: Any, **options: Any) -> tuple[int, dict[str, str], bytes]:
    middleware = AsgiMiddleware(app, **options)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "path": "/pay",
        "headers": [],
        "client": None,
    }
    asyncio.run(middleware(scope, receive, send))
    start, body = sent
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, body["body"]


def raising_asgi(error: BaseException) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise error

    return app


@pytest.mark.parametrize(("error", "status", "retry_after"), RAISED)
def test_item4_error_answers_asgi_turns_a_rejection_into_problem_json(
    error: BaseException, status: int, retry_after: str | None
) -> None:
    got, headers, body = asgi_call(raising_asgi(error))
    assert got == status
    assert headers["content-type"] == "application/problem+json"
    assert headers.get("retry-after") == retry_after
    problem = json.loads(body)
    assert (problem["status"], problem["kind"]) == (status, getattr(error, "kind", None))


def test_item4_error_answers_asgi_reraises_other_errors_and_can_be_turned_off() -> None:
    with pytest.raises(ValueError, match="bug"):
        asgi_call(raising_asgi(ValueError("bug")))
    with pytest.raises(fw.CircuitOpenError):
        asgi_call(raising_asgi(RAISED[0][0]), answer_rejections=False)


def test_item4_error_answers_asgi_leaves_an_answer_already_started() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise fw.RateLimitedError("api", "2/s", 0.4)

    with pytest.raises(fw.RateLimitedError):
        asgi_call(app)


def wsgi_call(app: Any, **options: Any) -> tuple[int, dict[str, str], bytes]:
    middleware = WsgiMiddleware(app, **options)
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started.append((status, headers))
        return lambda data: None

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/pay", "wsgi.input": None}
    body = b"".join(middleware(environ, start_response))
    ((status, headers),) = started
    return int(status[:3]), {k.lower(): v for k, v in headers}, body


def raising_wsgi(error: BaseException) -> Callable[..., Iterable[bytes]]:
    def app(environ: Any, start_response: Any) -> Iterable[bytes]:
        raise error

    return app


@pytest.mark.parametrize(("error", "status", "retry_after"), RAISED)
def test_item4_error_answers_wsgi_turns_a_rejection_into_problem_json(
    error: BaseException, status: int, retry_after: str | None
) -> None:
    got, headers, body = wsgi_call(raising_wsgi(error))
    assert got == status
    assert headers["content-type"] == "application/problem+json"
    assert headers.get("retry-after") == retry_after
    assert json.loads(body)["status"] == status


def test_item4_error_answers_wsgi_reraises_other_errors_and_can_be_turned_off() -> None:
    with pytest.raises(ValueError, match="bug"):
        wsgi_call(raising_wsgi(ValueError("bug")))
    with pytest.raises(fw.TimeoutExceeded):
        wsgi_call(raising_wsgi(RAISED[3][0]), answer_rejections=False)


def test_item4_error_answers_end_the_shedding_ticket_as_dropped(clock: fw.FakeClock) -> None:
    """A 503 the middleware answered for the app is a drop for the shedder, as its own are."""
    limiter = AdaptiveLimiter(AIMDLimit(initial_limit=10, min_limit=1), clock=clock)
    shedder = LoadShedder(limiter, clock=clock)
    for _ in range(3):
        status, _, _ = asgi_call(raising_asgi(RAISED[0][0]), shedder=shedder)
        assert status == 503
    assert limiter.inflight == 0
    assert limiter.limit < 10  # each answered rejection was a drop sample


def test_item4_flask_answers_a_rejection_through_the_guard(clock: fw.FakeClock) -> None:
    """Flask answers a handler's exception itself (a 500 page) before any WSGI middleware sees
    it; ``register_error_handler`` gives it the guard's 503 problem+json, counted as the
    middleware's own, and the shedding ticket ends as a drop."""
    from flask import Flask
    from werkzeug.test import Client

    from floodwall.integrations._inbound import InboundGuard

    def flask_app() -> Flask:
        app = Flask(__name__)

        @app.get("/pay")
        def pay() -> str:
            raise RAISED[0][0]

        return app

    limiter = AdaptiveLimiter(AIMDLimit(initial_limit=10, min_limit=1), clock=clock)
    guard = InboundGuard(shedder=LoadShedder(limiter, clock=clock), clock=clock)
    bare = Client(WsgiMiddleware(flask_app().wsgi_app, guard=guard)).get("/pay")
    assert bare.status_code == 500  # what Flask does on its own
    bare.close()  # as a server does: the middleware's ticket ends when the body is closed
    app = flask_app()
    app.wsgi_app = middleware = WsgiMiddleware(app.wsgi_app, guard=guard)  # type: ignore[method-assign]
    middleware.register_error_handler(app)
    answer = Client(app).get("/pay")
    assert answer.status_code == 503
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert answer.headers["Retry-After"] == "8"
    assert json.loads(answer.get_data())["status"] == 503
    answer.close()
    assert guard.decisions()[("app_rejected", "circuit_open")] == 1
    assert limiter.inflight == 0 and limiter.limit < 10  # the tickets ended, as drops


def test_item4_fastapi_rejections_reach_the_middleware() -> None:
    """FastAPI (Starlette) re-raises what no exception handler takes, through the middleware
    ``add_middleware`` installed: no helper is needed there."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/pay")
    async def pay() -> str:
        raise RAISED[2][0]

    app.add_middleware(AsgiMiddleware)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/pay",
        "raw_path": b"/pay",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
    }
    asyncio.run(app(scope, receive, send))
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert start["status"] == 429
    assert headers["content-type"] == "application/problem+json"
    assert json.loads(body)["status"] == 429
