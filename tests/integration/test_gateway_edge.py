"""The edge rules (issue 20, items 4 and 5), with raw sockets on both sides of a real gateway.

The upstream here is a plain socket server that logs exactly the bytes it received and answers
what the test scripts, byte for byte, so each case asserts two things: the status the client
got, and what (if anything) reached the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conftest import GatewayThread, raw_http
from floodwall.gateway.app import Gateway, exposed_admin
from floodwall.gateway.config import parse_gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


class RawUpstream:
    """A loopback socket server: one request per connection, logged as the exact bytes that
    arrived (head and declared body); answered with :attr:`reply`, then closed."""

    def __init__(self, reply: bytes = OK) -> None:
        self.reply = reply
        self.received: list[bytes] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(3)
                data = self._read_request(conn)
                if data:
                    self.received.append(data)
                    conn.sendall(self.reply)

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body

    def heads(self) -> list[list[bytes]]:
        """Every request received, as its head's lines."""
        return [r.partition(b"\r\n\r\n")[0].split(b"\r\n") for r in self.received]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()


@pytest.fixture
def raw_upstream() -> Iterator[Callable[..., RawUpstream]]:
    started: list[RawUpstream] = []

    def start(reply: bytes = OK) -> RawUpstream:
        server = RawUpstream(reply)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.close()


def _config(upstream: RawUpstream, **extra: Any) -> dict[str, Any]:
    return {
        "upstreams": {"raw": {"endpoints": [upstream.url]}},
        "routes": [{"match": {"path_prefix": "/"}, "upstream": "raw"}],
        **extra,
    }


@pytest.fixture
def edge(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> tuple[GatewayThread, RawUpstream]:
    upstream = raw_upstream()
    return gateways(_config(upstream)), upstream


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def _head(answer: bytes) -> list[bytes]:
    return answer.partition(b"\r\n\r\n")[0].split(b"\r\n")


def _field(answer: bytes, name: bytes) -> bytes | None:
    for line in _head(answer)[1:]:
        key, _, value = line.partition(b":")
        if key.lower() == name.lower():
            return value.strip()
    return None


def _kind(answer: bytes) -> str:
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert isinstance(body, dict)
    return str(body["kind"])


def _get(target: bytes, *fields: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    lines = [b"GET " + target + b" " + version, *fields, b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


# -- 5. the request side ------------------------------------------------------------------------

BAD_HOSTS = [
    b"a b@c/../",
    b"user@api.example.com",
    b"api.example.com/admin",
    b"api.example.com:80:80",
    b"api.example.com:99999",
    b"api.example.com:http",
    b"[::1",
    b"[not-ipv6]:80",
    b"",
]


@pytest.mark.parametrize("host", BAD_HOSTS, ids=range(len(BAD_HOSTS)))
def test_a_host_that_is_not_an_authority_is_refused_before_it_is_used(
    edge: tuple[GatewayThread, RawUpstream], host: bytes
) -> None:
    gw, upstream = edge
    answer = raw_http(gw.port, _get(b"/x", b"Host: " + host))
    assert _status(answer) == 400, answer[:300]
    assert _kind(answer) == "bad_host"
    assert upstream.received == []  # never routed, never copied into X-Forwarded-Host


GOOD_HOSTS = [b"api.example.com", b"API.example.com:8080", b"127.0.0.1:80", b"[::1]:8080", b"x_y"]


@pytest.mark.parametrize("host", GOOD_HOSTS, ids=range(len(GOOD_HOSTS)))
def test_a_valid_host_is_forwarded_as_sent(
    edge: tuple[GatewayThread, RawUpstream], host: bytes
) -> None:
    gw, upstream = edge
    answer = raw_http(gw.port, _get(b"/x", b"Host: " + host))
    assert _status(answer) == 200, answer[:300]
    (head,) = upstream.heads()
    assert head[0] == b"GET /x HTTP/1.1"
    assert b"X-Forwarded-Host: " + host in head
    assert b"Host: " + upstream.url.removeprefix("http://").encode() in head


def test_an_absolute_target_must_name_the_host_it_is_sent_with(
    edge: tuple[GatewayThread, RawUpstream],
) -> None:
    gw, upstream = edge
    steer = _get(b"http://169.254.169.254/latest", b"Host: api.example.com")
    answer = raw_http(gw.port, steer)
    assert (_status(answer), _kind(answer)) == (400, "bad_host")
    userinfo = raw_http(gw.port, _get(b"http://u@api.example.com/x", b"Host: api.example.com"))
    assert (_status(userinfo), _kind(userinfo)) == (400, "bad_target")
    assert upstream.received == []
    same = raw_http(gw.port, _get(b"http://api.example.com/x?q=1", b"Host: api.example.com"))
    assert _status(same) == 200, same[:300]
    (head,) = upstream.heads()
    assert head[0] == b"GET /x?q=1 HTTP/1.1"  # origin-form upstream
    assert b"X-Forwarded-Host: api.example.com" in head


def test_an_absolute_target_without_host_routes_on_its_authority(
    edge: tuple[GatewayThread, RawUpstream],
) -> None:
    gw, upstream = edge
    answer = raw_http(gw.port, _get(b"http://api.example.com/x", version=b"HTTP/1.0"))
    assert _status(answer) == 200, answer[:300]
    (head,) = upstream.heads()
    assert head[0] == b"GET /x HTTP/1.1"
    assert b"X-Forwarded-Host: api.example.com" in head


def test_a_request_line_without_a_version_is_a_400_in_http_1_1(
    edge: tuple[GatewayThread, RawUpstream],
) -> None:
    gw, upstream = edge
    for attempt in (b"GET /x\r\nHost: a\r\n\r\n", b"GET /x\r\n\r\n"):
        answer = raw_http(gw.port, attempt)
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
        assert _kind(answer) == "no_http_version"
    assert upstream.received == []


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/1.2", b"HTTP/3.0", b"HTTP/9.9"])
def test_versions_other_than_1_0_and_1_1_are_a_505(
    edge: tuple[GatewayThread, RawUpstream], version: bytes
) -> None:
    gw, upstream = edge
    answer = raw_http(gw.port, _get(b"/x", b"Host: a", version=version))
    assert answer.startswith(b"HTTP/1.1 505 "), answer[:300]  # never echoed as HTTP/2.0
    assert _kind(answer) == "http_version_not_supported"
    assert upstream.received == []


def test_http_1_0_is_still_served(edge: tuple[GatewayThread, RawUpstream]) -> None:
    gw, upstream = edge
    answer = raw_http(gw.port, b"GET /x HTTP/1.0\r\nHost: a\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 200 "), answer[:300]
    assert upstream.heads()[0][0] == b"GET /x HTTP/1.1"


def _fields(count: int, size: int) -> list[bytes]:
    return [b"X-Pad-%d: %s" % (i, b"p" * size) for i in range(count)]


def test_the_whole_head_is_capped_at_32_kib_by_default(
    edge: tuple[GatewayThread, RawUpstream],
) -> None:
    gw, upstream = edge
    big = raw_http(gw.port, _get(b"/x", b"Host: a", *_fields(30, 4096)))  # 120 KiB of fields
    assert (_status(big), _kind(big)) == (431, "request_head_too_large")
    just_over = raw_http(gw.port, _get(b"/x", b"Host: a", *_fields(8, 4096)))  # 32.1 KiB
    assert _status(just_over) == 431
    assert upstream.received == []
    under = raw_http(gw.port, _get(b"/x", b"Host: a", *_fields(7, 4096)))  # 28 KiB
    assert _status(under) == 200, under[:300]
    (head,) = upstream.heads()
    assert sum(line.startswith(b"X-Pad-") for line in head) == 7


def test_bytes_sent_after_a_refused_head_do_not_reset_its_answer(
    edge: tuple[GatewayThread, RawUpstream],
) -> None:
    """A client still sending when its head is refused (431) gets the answer whole, then the
    end of the connection: the gateway half-closes after the answer and reads away what comes
    (a socket closed with unread bytes is reset, and the reset may reach the client before it
    read the answer: CI once saw ``ConnectionResetError`` instead of the 431 under a CPU hog)."""
    gw, upstream = edge
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(_get(b"/x", b"Host: a", *_fields(9, 4096)))  # past the 32 KiB cap
        assert sock.recv(1, socket.MSG_PEEK)  # the answer is here, unread
        sock.sendall(b"X-Late: " + b"a" * 65536 + b"\r\n")  # arrives after the answer
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert (_status(answer), _kind(answer)) == (431, "request_head_too_large")
    assert upstream.received == []


def test_a_body_still_arriving_does_not_reset_the_413_that_refused_it(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> None:
    """A declared body over ``limits.max_body`` is answered 413 before a byte of it is read,
    and the connection closed: the client, still sending its body, gets the answer whole, then
    the end of the connection (the gateway half-closes and reads the rest away, as it does
    after a refused head), never a reset in its place."""
    upstream = raw_upstream()
    gw = gateways(_config(upstream, limits={"max_body": 1024}))
    head = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(head)
        assert sock.recv(1, socket.MSG_PEEK)  # the answer is here, unread
        sock.sendall(b"b" * 262144)  # the body goes on after the answer
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert (_status(answer), _kind(answer)) == (413, "body_too_large")
    assert _field(answer, b"Connection") == b"close"
    assert upstream.received == []


def test_a_head_still_arriving_is_cut_off_at_the_cap(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> None:
    upstream = raw_upstream()
    gw = gateways(_config(upstream, edge={"max_head": 4096}))
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n")
        answer = b""
        with contextlib.suppress(OSError):
            for line in _fields(20, 500):  # never finished: no blank line
                sock.sendall(line + b"\r\n")
                sock.settimeout(0.05)
                with contextlib.suppress(TimeoutError):
                    answer += sock.recv(65536)
                if answer:
                    break
            sock.settimeout(2)
            while chunk := sock.recv(65536):
                answer += chunk
    assert (_status(answer), _kind(answer)) == (431, "request_head_too_large"), answer[:300]
    assert upstream.received == []
    configured = raw_http(gw.port, _get(b"/x", b"Host: a", *_fields(5, 1000)))  # in one piece
    assert _status(configured) == 431
    assert upstream.received == []


def test_the_parsers_own_refusals_name_their_status(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = raw_upstream()
    gw = gateways(_config(upstream, limits={"max_line": 1024, "max_headers": 20}))
    many = [b"X-%d: v" % i for i in range(30)]
    cases = [
        (_get(b"/" + b"a" * 2000, b"Host: a"), 414, "request_line_too_long"),
        (_get(b"/x", b"Host: a", b"X-Big: " + b"b" * 2000), 431, "request_field_too_large"),
        (_get(b"/x", b"Host: a", *many), 431, "request_field_too_large"),
        (b"GET /x HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n", 400, "bad_request"),
    ]
    with caplog.at_level(logging.DEBUG, logger="floodwall.gateway"):
        for attempt, status, kind in cases:
            answer = raw_http(gw.port, attempt)
            assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:300]
            assert _kind(answer) == kind
            assert b"\\x01" not in answer and b"aaaa" not in answer  # the request is not quoted
    assert upstream.received == []
    assert not [r for r in caplog.records if r.exc_info], "refusals are logged without traceback"


DOT_PARAMETERS = [b"/api/..;/admin", b"/api/.;x=1/admin", b"/api/%2e%2e;/admin", b"/a/..;v/..;/"]


@pytest.mark.parametrize("path", DOT_PARAMETERS, ids=range(len(DOT_PARAMETERS)))
def test_dot_segments_with_path_parameters_are_refused(
    edge: tuple[GatewayThread, RawUpstream], path: bytes
) -> None:
    gw, upstream = edge
    answer = raw_http(gw.port, _get(path, b"Host: a"))
    assert (_status(answer), _kind(answer)) == (400, "bad_path"), answer[:300]
    assert upstream.received == []


def test_other_path_parameters_are_forwarded_exactly(
    edge: tuple[GatewayThread, RawUpstream],
) -> None:
    gw, upstream = edge
    answer = raw_http(gw.port, _get(b"/api/items;v=2/x;jsessionid=A1?q=..;", b"Host: a"))
    assert _status(answer) == 200, answer[:300]
    assert upstream.heads()[0][0] == b"GET /api/items;v=2/x;jsessionid=A1?q=..; HTTP/1.1"


def test_path_parameters_forward_sends_dot_parameters_as_they_came(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> None:
    upstream = raw_upstream()
    gw = gateways(_config(upstream, edge={"path_parameters": "forward"}))
    answer = raw_http(gw.port, _get(b"/api/..;/admin", b"Host: a"))
    assert _status(answer) == 200, answer[:300]
    assert upstream.heads()[0][0] == b"GET /api/..;/admin HTTP/1.1"


# -- the Server field ---------------------------------------------------------------------------

SERVER_REPLY = b"HTTP/1.1 200 OK\r\nServer: upstream-secret/1.0\r\nContent-Length: 2\r\n\r\nok"


def _answers(gw: GatewayThread) -> dict[str, bytes]:
    """One answer of each source: proxied, the proxy's own refusal, the parser's, the edge
    rules', and the protocol's raw 431."""
    return {
        "proxied": raw_http(gw.port, _get(b"/x", b"Host: a")),
        "proxy": raw_http(gw.port, _get(b"/a/../b", b"Host: a")),
        "parser": raw_http(gw.port, b"GET /x HTTP/1.1\r\nX: \x01\r\n\r\n"),
        "edge": raw_http(gw.port, _get(b"/x", b"Host: a b")),
        "head_cap": raw_http(gw.port, b"GET /x HTTP/1.1\r\n" + b"X: y\r\n" * 12000),
    }


def test_no_server_field_on_any_answer_by_default(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> None:
    upstream = raw_upstream(SERVER_REPLY)
    gw = gateways(_config(upstream))
    answers = _answers(gw)
    assert [_status(a) for a in answers.values()] == [200, 400, 400, 400, 431]
    for source, answer in answers.items():
        assert _field(answer, b"Server") is None, (source, answer[:300])
        assert b"aiohttp" not in answer and b"Python/" not in answer, source


def test_no_server_field_on_the_admin_listener_either(
    edge: tuple[GatewayThread, RawUpstream],
) -> None:
    gw, _ = edge
    admin = gw.supervisor.admin
    assert admin is not None
    for path, status in ((b"/healthz", 200), (b"/status", 401), (b"/nowhere", 401)):
        answer = raw_http(admin.port, _get(path, b"Host: a"))
        assert _status(answer) == status, answer[:300]
        assert _field(answer, b"Server") is None, answer[:300]


def test_a_configured_server_field_is_on_every_answer(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> None:
    upstream = raw_upstream(SERVER_REPLY)
    gw = gateways(_config(upstream, edge={"server_header": "edge"}))
    for source, answer in _answers(gw).items():
        assert _field(answer, b"Server") == b"edge", (source, answer[:300])


def test_server_header_must_be_a_clean_field_value() -> None:
    from floodwall._core.errors import ConfigError

    for bad in ("a\r\nX-Injected: 1", "caf\u00e9", " padded"):
        with pytest.raises(ConfigError, match=r"edge\.server_header"):
            parse_gateway({"edge": {"server_header": bad}}, "gw.yaml")


# -- the admin listener -------------------------------------------------------------------------


def test_a_non_loopback_admin_listener_is_warned_about_at_start(
    raw_upstream: Callable[..., RawUpstream], caplog: pytest.LogCaptureFixture
) -> None:
    upstream = raw_upstream()
    exposed = parse_gateway(
        {**_config(upstream), "listen": "127.0.0.1:0", "admin": {"listen": "0.0.0.0:9901"}}
    )
    warning = exposed_admin(exposed)
    assert warning is not None and "every interface" in warning
    for listen in ("127.0.0.1:9901", "[::1]:9901", "localhost:9901"):
        assert exposed_admin(parse_gateway({"admin": {"listen": listen}})) is None
    assert exposed_admin(parse_gateway({"admin": None})) is None
    host = exposed_admin(parse_gateway({"admin": {"listen": "192.0.2.7:9901"}}))
    assert host is not None and "192.0.2.7" in host

    async def start_and_stop() -> None:
        gateway = Gateway(exposed, log_events=False)  # the proxy only: admin is not bound
        await gateway.start()
        await gateway.stop(0)

    with caplog.at_level(logging.WARNING, logger="floodwall.gateway"):
        asyncio.run(start_and_stop())
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [warning]


# -- 4. the response side -----------------------------------------------------------------------

BAD_ANSWERS = {
    "space_before_colon_beside_chunked": b"HTTP/1.1 200 OK\r\nContent-Length : 8\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nsmuggled",
    "space_before_colon": b"HTTP/1.1 200 OK\r\nContent-Length : 8\r\n\r\nsmuggled",
    "name_not_a_token": b"HTTP/1.1 200 OK\r\nX{y}: 1\r\nContent-Length: 2\r\n\r\nok",
    "control_in_value": b"HTTP/1.1 200 OK\r\nX-Data: a\x01b\r\nContent-Length: 2\r\n\r\nok",
    "delete_in_value": b"HTTP/1.1 200 OK\r\nX-Data: a\x7fb\r\nContent-Length: 2\r\n\r\nok",
    "escape_in_value": b"HTTP/1.1 200 OK\r\nX-Data: \x1b[31m\r\nContent-Length: 2\r\n\r\nok",
    "control_in_reason": b"HTTP/1.1 200 O\x01K\r\nContent-Length: 2\r\n\r\nok",
    # RFC 9112 §5.2: a proxy either replaces obs-fold with spaces or answers 502; llhttp's
    # strict mode refuses it, so the gateway takes the second choice.
    "obs_fold": b"HTTP/1.1 200 OK\r\nX-Data: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
}


def test_a_small_answer_whose_body_ends_short_is_a_502(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> None:
    """A small answer is read whole before its head goes out: an upstream that closes before
    the declared length gets the client a 502, never the cut body under a 200."""
    upstream = raw_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    gw = gateways(_config(upstream))
    answer = raw_http(gw.port, _get(b"/x", b"Host: api.example.com"))
    assert _status(answer) == 502, answer[:300]
    assert _kind(answer) == "upstream_unavailable"
    assert b"abc" not in answer


@pytest.mark.parametrize("reply", list(BAD_ANSWERS.values()), ids=list(BAD_ANSWERS))
def test_an_answer_head_the_parser_let_through_is_a_502_with_a_logged_reason(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
    caplog: pytest.LogCaptureFixture,
    reply: bytes,
) -> None:
    upstream = raw_upstream(reply)
    gw = gateways(_config(upstream))
    with caplog.at_level(logging.DEBUG):
        answer = raw_http(gw.port, _get(b"/x", b"Host: api.example.com"))
    assert _status(answer) == 502, answer[:300]  # an answer, never a zero-byte close
    assert _kind(answer) == "upstream_unavailable"
    assert b"smuggled" not in answer and b"X-Data" not in answer and b"X{y}" not in answer
    (head,) = upstream.heads()  # the upstream got the request once, as the gateway wrote it
    assert head[0] == b"GET /x HTTP/1.1"
    assert b"X-Forwarded-Host: api.example.com" in head
    said = f"127.0.0.1:{upstream.port} sent an invalid answer"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(said in message for message in warnings), warnings
    assert not [r for r in caplog.records if r.exc_info], "no traceback is logged"


GOOD_ANSWERS = {
    "tab_in_value": (b"X-Data: a\tb", b"X-Data: a\tb"),
    "obs_text_in_value": (b"X-Data: caf\xc3\xa9", b"X-Data: caf\xc3\xa9"),
}


@pytest.mark.parametrize("case", list(GOOD_ANSWERS.values()), ids=list(GOOD_ANSWERS))
def test_valid_answer_fields_still_pass(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
    case: tuple[bytes, bytes],
) -> None:
    sent, seen = case
    upstream = raw_upstream(b"HTTP/1.1 200 OK\r\n" + sent + b"\r\nContent-Length: 2\r\n\r\nok")
    gw = gateways(_config(upstream))
    answer = raw_http(gw.port, _get(b"/x", b"Host: a"))
    assert _status(answer) == 200, answer[:300]
    assert seen in _head(answer)
    assert answer.endswith(b"\r\n\r\nok")


def test_a_body_left_unread_is_not_counted_as_a_head(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> None:
    upstream = raw_upstream()
    config = _config(upstream, edge={"max_head": 4096})
    config["routes"] = [{"match": {"path_prefix": "/api"}, "upstream": "raw"}]
    gw = gateways(config)
    body = b"b" * 50_000  # answered 404 before it is read: aiohttp reads it away afterwards
    post = b"POST /elsewhere HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(post)
        answer = sock.recv(65536)
        for start in range(0, len(body), 4096):
            sock.sendall(body[start : start + 4096])
        sock.sendall(_get(b"/api/x", b"Host: a"))
        sock.settimeout(3)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]
    assert statuses == [404, 200], answer[:600]  # one answer each: no 431 for the body
    assert [head[0] for head in upstream.heads()] == [b"GET /api/x HTTP/1.1"]


def test_a_reload_changes_the_edge_rules_for_the_next_head(
    raw_upstream: Callable[..., RawUpstream],
    gateways: Callable[[dict[str, Any]], GatewayThread],
) -> None:
    upstream = raw_upstream(SERVER_REPLY)
    config = _config(upstream)
    gw = gateways(config)
    keep = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(keep)
        before = sock.recv(65536)
        stricter = {**config, "edge": {"server_header": "edge-2", "max_head": 2048}}
        applied = gw.admin("POST", "/reload?source=edge.json", content=json.dumps(stricter))
        assert applied.status_code == 200, applied.text
        sock.sendall(keep)  # the same connection: its next head meets the new rules
        after = sock.recv(65536)
    assert (_status(before), _field(before, b"Server")) == (200, None)
    assert (_status(after), _field(after, b"Server")) == (200, b"edge-2")
    big = raw_http(gw.port, _get(b"/x", b"Host: a", *_fields(3, 1000)))
    assert (_status(big), _kind(big), _field(big, b"Server")) == (
        431,
        "request_head_too_large",
        b"edge-2",
    )
