"""The proxy's security rules, tried with raw sockets against a real gateway and upstream."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from conftest import GatewayThread, Upstream, raw_http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def setup(
    upstreams: Callable[..., list[Upstream]], gateways: Callable[[dict[str, Any]], GatewayThread]
) -> tuple[GatewayThread, Upstream]:
    (svc,) = upstreams("svc")
    gw = gateways(
        {
            "upstreams": {"svc": {"endpoints": [svc.url]}},
            "routes": [
                {"match": {"host": "api.example.com", "path_prefix": "/"}, "upstream": "svc"}
            ],
            "limits": {
                "max_line": 1024,
                "max_headers": 20,
                "max_body": 1000,
                "header_timeout": "500ms",
                "body_timeout": "500ms",
            },
            "proxy": {"trusted_proxies": ["10.0.0.0/8"]},
        }
    )
    return gw, svc


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


HEAD = b"Host: api.example.com\r\n"

SMUGGLING = [
    b"POST / HTTP/1.1\r\n" + HEAD + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\nGET /admin HTTP/1.1\r\n" + HEAD + b"\r\n",
    b"POST / HTTP/1.1\r\n" + HEAD + b"Content-Length: 3\r\nContent-Length: 40\r\n\r\nabc",
    b"POST / HTTP/1.1\r\n" + HEAD + b"Transfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\n" + HEAD + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\n" + HEAD + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\n" + HEAD + b" Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\n" + HEAD + b"Content-Length: +3\r\n\r\nabc",
    b"POST / HTTP/1.1\r\nHost: api.example.com\nContent-Length: 3\r\n\r\nabc",
    b"POST / HTTP/1.0\r\n" + HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + HEAD + b"Host: other.example.com\r\n\r\n",
]


@pytest.mark.parametrize("attempt", SMUGGLING, ids=range(len(SMUGGLING)))
def test_ambiguous_framing_is_refused(
    setup: tuple[GatewayThread, Upstream], attempt: bytes
) -> None:
    gw, svc = setup
    answer = raw_http(gw.port, attempt)
    assert _status(answer) == 400, answer[:200]
    assert svc.state.count == 0  # nothing reached the upstream, smuggled or not


def test_oversized_heads_are_refused(setup: tuple[GatewayThread, Upstream]) -> None:
    gw, svc = setup
    long_line = b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\n" + HEAD + b"\r\n"
    long_field = b"GET / HTTP/1.1\r\n" + HEAD + b"X-Big: " + b"b" * 2000 + b"\r\n\r\n"
    many = b"GET / HTTP/1.1\r\n" + HEAD + b"".join(b"X-%d: v\r\n" % i for i in range(40)) + b"\r\n"
    for attempt, status in ((long_line, 414), (long_field, 431), (many, 431)):
        assert _status(raw_http(gw.port, attempt)) == status
    big_body = b"POST / HTTP/1.1\r\n" + HEAD + b"Content-Length: 5000\r\n\r\n" + b"x" * 5000
    assert _status(raw_http(gw.port, big_body)) == 413
    chunked = b"POST / HTTP/1.1\r\n" + HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    chunked += b"".join(b"200\r\n" + b"y" * 512 + b"\r\n" for _ in range(4)) + b"0\r\n\r\n"
    assert _status(raw_http(gw.port, chunked)) == 413  # counted while it streams
    assert svc.state.count == 0


def test_slowloris_heads_and_bodies_are_cut_off(setup: tuple[GatewayThread, Upstream]) -> None:
    gw, svc = setup
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"GET / HTTP/1.1\r\n")
        closed = False
        for _ in range(40):  # a header line every 100 ms: never finishing the head
            try:
                sock.sendall(b"X-Drip: 1\r\n")
                time.sleep(0.1)
            except OSError:
                closed = True
                break
        if not closed:
            sock.settimeout(2)
            closed = sock.recv(100) == b""
        assert closed
        assert time.monotonic() - started < 2.5  # header_timeout is 500 ms
    slow_body = raw_http(
        gw.port, b"POST / HTTP/1.1\r\n" + HEAD + b"Content-Length: 10\r\n\r\nab", timeout=5
    )
    assert _status(slow_body) == 408
    assert svc.state.count <= 1


def test_hop_by_hop_headers_are_dropped_both_ways(setup: tuple[GatewayThread, Upstream]) -> None:
    gw, svc = setup
    request = (
        b"GET /stream HTTP/1.1\r\n" + HEAD + b"Connection: keep-alive, X-Secret\r\n"
        b"X-Secret: s3cret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: websocket\r\n"
        b"Proxy-Authorization: Basic Zm9vOmJhcg==\r\nProxy-Connection: keep-alive\r\n"
        b"X-Keep: yes\r\n\r\n"
    )
    answer = raw_http(
        gw.port, request + b"GET /x HTTP/1.1\r\n" + HEAD + b"Connection: close\r\n\r\n"
    )
    sent = {k.lower() for k in svc.state.requests[0]["headers"]}
    for name in (
        "x-secret",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
    ):
        assert name not in sent
    assert "x-keep" in sent
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert b"x-upstream-secret" not in head  # named in the upstream's Connection
    assert b"chunk4;" in answer  # the streamed body arrived whole
    assert b"keep-alive: timeout" not in answer.lower()  # the upstream's Keep-Alive


def test_only_configured_hosts_are_reachable(setup: tuple[GatewayThread, Upstream]) -> None:
    gw, svc = setup
    for attempt in (
        b"GET / HTTP/1.1\r\nHost: evil.example.com\r\nConnection: close\r\n\r\n",
        b"GET http://169.254.169.254/latest/meta-data HTTP/1.1\r\n"
        + HEAD
        + b"Connection: close\r\n\r\n",
        b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n",
        b"TRACE / HTTP/1.1\r\n" + HEAD + b"Connection: close\r\n\r\n",
        b"GET /a/../../admin HTTP/1.1\r\n" + HEAD + b"Connection: close\r\n\r\n",
        b"GET /a/%2e%2e/admin HTTP/1.1\r\n" + HEAD + b"Connection: close\r\n\r\n",
        b"GET /a%2Fb HTTP/1.1\r\n" + HEAD + b"Connection: close\r\n\r\n",
    ):
        assert _status(raw_http(gw.port, attempt)) in (400, 404, 405), attempt
    assert svc.state.count == 0


def test_forwarding_headers_and_request_ids(setup: tuple[GatewayThread, Upstream]) -> None:
    gw, svc = setup
    spoofed = {
        "Host": "api.example.com",
        "X-Forwarded-For": "1.2.3.4",
        "Forwarded": "for=1.2.3.4",
        "X-Real-IP": "1.2.3.4",
        "X-Request-Id": "client-chosen",
        "X-Request-Priority": "0:0",
    }
    answer = httpx.get(gw.url + "/who", headers=spoofed, timeout=5)
    seen = httpx.Headers(svc.state.requests[-1]["headers"])
    assert seen["X-Forwarded-For"] == "127.0.0.1"  # the untrusted client's claims are gone
    assert seen["X-Real-IP"] == "127.0.0.1"
    assert seen["Forwarded"] == 'for=127.0.0.1;proto=http;host="api.example.com"'
    assert "X-Request-Priority" not in seen
    rid = answer.headers["X-Request-Id"]
    assert rid != "client-chosen" and seen["X-Request-Id"] == rid
    assert seen["Host"] == svc.url.removeprefix("http://")  # the upstream's own name
    assert json.loads(answer.text)["upstream"] == "svc"


SMUGGLED_ANSWERS = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nsmuggle",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 9\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nsmuggle\r\n0\r\n\r\n",
]


@pytest.mark.parametrize("reply", SMUGGLED_ANSWERS, ids=range(len(SMUGGLED_ANSWERS)))
def test_an_upstream_answer_with_ambiguous_framing_never_reaches_the_client(
    gateways: Callable[[dict[str, Any]], GatewayThread], reply: bytes
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        port = server.getsockname()[1]
        stop = threading.Event()

        def answer_every_connection() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(2)
                    with contextlib.suppress(OSError):
                        conn.recv(65536)
                        conn.sendall(reply)
                        time.sleep(0.05)

        thread = threading.Thread(target=answer_every_connection, daemon=True)
        thread.start()
        try:
            gw = gateways(
                {
                    "upstreams": {"raw": {"endpoints": [f"http://127.0.0.1:{port}"]}},
                    "routes": [{"match": {"path_prefix": "/"}, "upstream": "raw"}],
                }
            )
            answer = raw_http(gw.port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        finally:
            stop.set()
            thread.join(5)
    assert _status(answer) == 502, answer[:300]
    assert b"smuggle" not in answer


def test_a_field_the_proxy_reads_is_seen_when_it_comes_alone(
    upstreams: Callable[..., list[Upstream]], gateways: Callable[[dict[str, Any]], GatewayThread]
) -> None:
    """A request whose only field the proxy reads after routing is its request id (by its
    configured name), ``Connection`` or ``Expect`` is not taken for one with none of them (one
    test tells the usual request: ``Route.reads``)."""
    (svc,) = upstreams("svc")
    gw = gateways(
        {
            "upstreams": {"svc": {"endpoints": [svc.url]}},
            "routes": [{"match": {"path_prefix": "/"}, "upstream": "svc"}],
            "proxy": {"trusted_proxies": ["127.0.0.1/32"], "request_id_header": "X-Trace-Id"},
        }
    )
    head = b"GET /a HTTP/1.1\r\nHost: api.example.com\r\n"
    answer = raw_http(gw.port, head + b"X-Trace-Id: chosen-1\r\nConnection: close\r\n\r\n")
    assert _status(answer) == 200 and b"\r\nX-Trace-Id: chosen-1\r\n" in answer
    assert httpx.Headers(svc.state.requests[-1]["headers"])["X-Trace-Id"] == "chosen-1"
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(head + b"X-Trace-Id: chosen-2\r\n\r\n")  # the id alone (kept alive)
        answer = sock.recv(65536)
    assert _status(answer) == 200 and b"\r\nX-Trace-Id: chosen-2\r\n" in answer
    answer = raw_http(gw.port, head + b"Connection: x-secret, close\r\nX-Secret: 1\r\n\r\n")
    assert _status(answer) == 200
    assert "X-Secret" not in httpx.Headers(svc.state.requests[-1]["headers"])
    answer = raw_http(gw.port, head + b"Expect: 200-ok\r\nConnection: close\r\n\r\n")
    assert _status(answer) == 417
    answer = raw_http(gw.port, head + b"Expect: 200-ok\r\n\r\n", read_all=False)
    assert _status(answer) == 417
