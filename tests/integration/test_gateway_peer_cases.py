"""Issue 20's cases ported from nginx's and HAProxy's own test suites, against the gateway.

The cases live in ``benchmarks/proxy_cases.py`` (each names the ``nginx-tests`` file or the
HAProxy ``reg-tests`` file and client it follows), so that ``python benchmarks/edge_compare.py``
runs the very same bytes against nginx and HAProxy and prints the three side by side
(docs/gateway.md, "Cases from the peers' test suites"). Each case here asserts one line that
describes both ends: the answers the client read (status, body, whether complete) and what
reached the upstream, a raw socket server that logs every request it reads. The expected line
is the strictest of nginx's and HAProxy's, or a stricter choice the docs table explains.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from conftest import GatewayThread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "proxy_cases.py"
    spec = importlib.util.spec_from_file_location("floodwall_bench_proxy_cases", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up while it executes)
    spec.loader.exec_module(module)
    return module


cases = _load()


def _gateway(endpoints: list[int], **extra: Any) -> GatewayThread:
    config: dict[str, Any] = {
        "admin": None,
        "upstreams": {
            "svc": {
                "endpoints": [f"http://127.0.0.1:{port}" for port in endpoints],
                "read_timeout": cases.UPSTREAM_TIMEOUT,
            }
        },
        "routes": [{"match": {"path_prefix": "/"}, "upstream": "svc", **extra}],
    }
    if "resource" in extra:
        config["resources"] = {extra["resource"]: {"retry": {"attempts": 2}}}
    return GatewayThread(config).start()


@pytest.fixture(scope="module")
def proxied() -> Iterator[tuple[GatewayThread, Any]]:
    upstream = cases.Upstream()
    gateway = _gateway([upstream.port])
    try:
        yield gateway, upstream
    finally:
        gateway.stop()
        upstream.close()


@pytest.mark.parametrize("case", cases.CASES, ids=[c.name for c in cases.CASES])
def test_peer_case(proxied: tuple[GatewayThread, Any], case: Any) -> None:
    gateway, upstream = proxied
    said, _ = cases.run(gateway.port, upstream, case)
    assert said == case.floodwall, f"{case.peer}: {case.label}"


@pytest.mark.parametrize("name", ["answer_timeout", "answer_length_stalls"])
def test_an_upstream_that_never_answers_is_a_504_after_the_read_timeout(
    proxied: tuple[GatewayThread, Any], name: str
) -> None:
    """nginx-tests proxy_next_upstream.t 'timeout', HAProxy's ``timeout server``, and HAProxy's
    http_wait_for_body.vtc (a small answer's body that stalls one byte short, read whole
    before any of it is sent): the answer comes once the wait ran out, not before, and the
    client's exchange never reaches its own cap (:data:`TIMEOUT`)."""
    gateway, upstream = proxied
    (case,) = [c for c in cases.CASES if c.name == name]
    said, took = cases.run(gateway.port, upstream, case)
    assert said == "504"
    assert cases.UPSTREAM_TIMEOUT <= took < cases.TIMEOUT


def test_bytes_after_a_pooled_answer_close_that_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """nginx-tests proxy_extra_data.t, the stray bytes coming after the answer was handed on
    (the case table covers them in the same read): the idle connection is closed at once and
    the next request goes on a fresh one, never reading them as its answer."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(cases.TIMEOUT)
    gateway = _gateway([listener.getsockname()[1]])
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=cases.TIMEOUT) as c:
            c.sendall(cases.get(b"/r", close=False))
            first, _ = listener.accept()
            with first:
                first.settimeout(cases.TIMEOUT)
                assert first.recv(65536).startswith(b"GET /r ")
                first.sendall(cases.OK)
                assert _read_answer(c).endswith(b"\r\n\r\nok")
                first.sendall(b"-BUT-NOT-THIS")
                assert first.recv(65536) == b""  # the gateway closed it
            c.sendall(cases.get(b"/next"))
            second, _ = listener.accept()
            with second:
                second.settimeout(cases.TIMEOUT)
                assert second.recv(65536).startswith(b"GET /next ")
                second.sendall(cases.LAST)
                assert _read_answer(c).endswith(b"\r\n\r\nlast response")
    finally:
        gateway.stop()
        listener.close()
    assert "sent bytes after a complete answer" in caplog.text


def _read_answer(sock: socket.socket) -> bytes:
    """One answer with a ``Content-Length`` from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return data[: len(head) + 4] + body


def test_bytes_after_a_closing_request_do_not_cut_its_answer_off() -> None:
    """nginx-tests http_keepalive.t, the bytes after a ``Connection: close`` request arriving
    while it is served (the case table sends them in the same write): the request is answered
    whole and the bytes are never read as a request."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(cases.TIMEOUT)
    gateway = _gateway([listener.getsockname()[1]])
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=cases.TIMEOUT) as c:
            c.sendall(cases.get(b"/a"))
            served, _ = listener.accept()
            with served:
                served.settimeout(cases.TIMEOUT)
                assert served.recv(65536).startswith(b"GET /a ")
                c.sendall(cases.get(b"/b"))  # while /a waits for its answer
                served.sendall(cases.OK)
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert answer.endswith(b"\r\n\r\nok")
        listener.settimeout(0.5)
        with pytest.raises(TimeoutError):
            listener.accept()  # /b never went anywhere
    finally:
        gateway.stop()
        listener.close()


@pytest.mark.parametrize("retry", [False, True], ids=["default", "retry"])
def test_a_refused_connection_goes_on_to_the_next_endpoint_with_a_retry(retry: bool) -> None:
    """nginx-tests proxy_next_upstream.t: the first of two endpoints refuses connections. With
    a resource whose retry allows a second attempt, every request is answered by the other
    endpoint (nginx's default ``proxy_next_upstream error``, HAProxy's ``option redispatch``);
    without one, a request sent to the refusing endpoint is a 502 (``connect``), one try only,
    as HAProxy's default (which answers none of them) and Envoy's: docs/gateway.md says so."""
    upstream = cases.Upstream()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
    extra = {"resource": "svc"} if retry else {}
    gateway = _gateway([dead.getsockname()[1], upstream.port], **extra)
    try:
        upstream.reset({})
        answers = [cases.exchange(gateway.port, [cases.get(b"/r")])[0] for _ in range(4)]
    finally:
        gateway.stop()
        dead.close()
        upstream.close()
    statuses = sorted(int(a.split(b" ")[1]) for a in answers)
    if retry:
        assert statuses == [200, 200, 200, 200]
        assert len(upstream.received) == 4  # each request once
    else:
        assert statuses == [200, 200, 502, 502]  # round robin: every other one refused
        assert len(upstream.received) == 2


@pytest.mark.parametrize(
    "case", cases.TWO_ENDPOINT_CASES, ids=[c.name for c in cases.TWO_ENDPOINT_CASES]
)
def test_only_a_request_that_may_be_repeated_goes_to_a_second_endpoint(case: Any) -> None:
    """nginx-tests proxy_non_idempotent.t: both endpoints close without answering. With a
    retry of 2 attempts, a ``GET`` is sent to each (then a 502), a ``POST`` to one only:
    it may have had its effect already (nginx's default, without ``non_idempotent``)."""
    upstreams = [cases.Upstream(), cases.Upstream()]
    gateway = _gateway([u.port for u in upstreams], resource="svc")
    try:
        said = cases.run_two(gateway.port, upstreams, case)
    finally:
        gateway.stop()
        for upstream in upstreams:
            upstream.close()
    assert said == case.floodwall, f"{case.peer}: {case.label}"
