"""The gateway's edge rules as pure functions: Host syntax, answer-head syntax, the request-head
check and the parser refusals' statuses, each against a small reference model or the RFC's
own examples. The same rules on the wire: tests/integration/test_gateway_edge.py."""

from __future__ import annotations

import ipaddress
from typing import Any

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodwall.gateway._edge import EdgeRules, upgrade_refusal
from floodwall.gateway._headers import answer_head_error, host_error
from floodwall.gateway._server import Request, parse_head, parser_refusal
from floodwall.gateway.config import EdgeConfig

TCHAR = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
REG_NAME = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;="


# -- Host ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["example.com", "EXAMPLE.com:8080", "192.0.2.1", "192.0.2.1:0", "[::1]", "[2001:db8::7]:443",
     "[::ffff:192.0.2.1]", "a%41b", "x_y.example", "example.com:", "sub-delims!$&'()*+,;="],
)  # fmt: skip
def test_valid_hosts(host: str) -> None:
    assert host_error(host) is None


@pytest.mark.parametrize(
    "host",
    ["", "a b", "a b@c/../", "user@example.com", "example.com/x", "example.com?x", "exa#mple",
     "example.com:80:80", "example.com:99999", "example.com:123456", "example.com:http", "[::1",
     "::1", "[::1]x", "[not:ipv6]", "[v1.fe]", "[fe80::1%25eth0]", "a%4", "a%zz", "café.example",
     "a\tb", "a\x00b", "exa\\mple"],
)  # fmt: skip
def test_invalid_hosts(host: str) -> None:
    assert host_error(host) is not None


def _reference_host(value: str) -> bool:
    """RFC 9110 §7.2 read literally: reg-name / IPv4 / [IPv6], then ``:`` and up to 5 digits
    that are a port number."""
    if value.startswith("["):
        literal, close, rest = value[1:].partition("]")
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            return False
        if not close or "%" in literal:
            return False
    else:
        name, _, rest = value.partition(":")
        rest = value[len(name) :]
        if not name or not _reg_name(name) or ".." in name:  # (an empty label: as nginx)
            return False
    if not rest:
        return True
    digits = rest[1:]
    return rest[0] == ":" and digits.isascii() and (digits == "" or _port(digits))


def _reg_name(name: str) -> bool:
    i = 0
    while i < len(name):
        if name[i] == "%":
            pair = name[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in "0123456789abcdefABCDEF" for c in pair):
                return False
            i += 3
        elif name[i] in REG_NAME:
            i += 1
        else:
            return False
    return True


def _port(digits: str) -> bool:
    return digits.isdigit() and len(digits) <= 5 and int(digits) <= 65535


@given(st.text(alphabet=REG_NAME + "%:[]/@ 0123456789abcdef", max_size=24))
def test_host_error_agrees_with_the_reference(value: str) -> None:
    assert (host_error(value) is None) == _reference_host(value)


# -- answer heads -------------------------------------------------------------------------------

_FIELD_BYTES = st.binary(max_size=12)


def _reference_answer(reason: str, raw: list[tuple[bytes, bytes]]) -> bool:
    controls = {*range(0x09), *range(0x0A, 0x20), 0x7F}
    names_ok = all(all(b in TCHAR for b in name) for name, _ in raw)
    values_ok = all(all(b not in controls for b in value) for _, value in raw)
    reason_ok = all(ord(c) not in controls for c in reason)
    return names_ok and values_ok and reason_ok


@given(
    st.text(max_size=8),
    st.lists(st.tuples(st.binary(min_size=1, max_size=10), _FIELD_BYTES), max_size=6),
)
def test_answer_head_error_agrees_with_the_reference(
    reason: str, raw: list[tuple[bytes, bytes]]
) -> None:
    assert (answer_head_error(reason, raw) is None) == _reference_answer(reason, raw)


def test_answer_head_error_names_the_field() -> None:
    raw = [(b"Content-Type", b"text/plain"), (b"Content-Length ", b"8")]
    assert answer_head_error("OK", raw) == "the field name b'Content-Length ' is not a token"
    raw = [(b"X-A", b"fine\tand \xc3\xa9 obs-text"), (b"X-B", b"a\x01b")]
    assert answer_head_error("OK", raw) == "a control character in the value of X-B"
    assert answer_head_error("O\x1bK", []) == "a control character in the reason phrase"
    assert answer_head_error("Not Found", [(b"X", b"")]) is None


# -- the request-head check ---------------------------------------------------------------------


def _kind(head: bytes, **config: Any) -> str | None:
    refused = EdgeRules(EdgeConfig(**config)).check(parse_head(head))
    return None if refused is None else f"{refused.status} {refused.kind}"


def test_versions() -> None:
    assert _kind(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n") is None
    assert _kind(b"GET /x HTTP/1.0\r\n\r\n") is None
    assert _kind(b"GET /x\r\nHost: a\r\n\r\n") == "400 no_http_version"
    assert _kind(b"GET /x HTTP/2.0\r\nHost: a\r\n\r\n") == "505 http_version_not_supported"


def test_head_size_counts_the_line_and_every_field() -> None:
    line = b"GET /x HTTP/1.1\r\n"  # 17 bytes; each field is name, ': ', value, CRLF
    fields = b"Host: a\r\n" + b"X: " + b"v" * 1000 + b"\r\n"  # 9 + 1005
    size = len(line) + len(fields) + 2
    assert size == 1033
    assert _kind(line + fields + b"\r\n", max_head=1033) is None
    assert _kind(line + fields + b"\r\n", max_head=1032) == "431 request_head_too_large"


def test_host_and_absolute_targets() -> None:
    assert _kind(b"GET /x HTTP/1.1\r\nHost: a b@c/../\r\n\r\n") == "400 bad_host"
    assert _kind(b"GET http://a/x HTTP/1.1\r\nHost: A:80\r\n\r\n") is None
    assert _kind(b"GET http://a/x HTTP/1.1\r\nHost: b\r\n\r\n") == "400 bad_host"
    assert _kind(b"GET http://u@a/x HTTP/1.1\r\nHost: a\r\n\r\n") == "400 bad_target"
    assert _kind(b"GET ftp://a/x HTTP/1.1\r\nHost: a\r\n\r\n") == "400 bad_target"


@pytest.mark.parametrize(
    ("target", "host", "same"),
    [  # HAProxy reg-tests/http-messaging/h1_host_normalization.vtc, by client
        (b"http://a:80/", b"a", True),  # c20
        (b"http://a/", b"a:80", True),  # c22
        (b"https://a:443/", b"a", True),  # c21
        (b"https://a:80/", b"a:80", True),  # c4
        (b"http://a:/", b"a:80", True),  # c29
        (b"http://a:80/", b"a:", True),  # c28
        (b"http://[::1]:80/", b"[::1]", True),
        (b"http://a:80/", b"a:81", False),  # c9
        (b"http://a:8080/", b"a", False),  # c10
        (b"http://a/", b"a:81", False),  # c11
        (b"https://a/", b"a:80", False),
        (b"http://[::1]:8080/", b"[::1]:80", False),
    ],
)
def test_an_absolute_target_and_host_name_the_same_port(
    target: bytes, host: bytes, same: bool
) -> None:
    """An absent or empty port is the scheme's default (RFC 3986 §6.2.3); any other
    difference between the target's port and ``Host``'s is a 400, as HAProxy answers."""
    head = b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"
    assert _kind(head) == (None if same else "400 bad_host")


@pytest.mark.parametrize(
    ("fields", "refused"),
    [  # HAProxy reg-tests/http-messaging/websocket.vtc c1, c2_1, c2_2
        ({"upgrade": "websocket", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ=="}, False),
        ({"upgrade": "websocket"}, True),
        ({"upgrade": "proto1, WebSocket , proto2, proto3"}, True),
        ({"upgrade": "custom_protocol"}, False),
        ({"upgrade": "websocket/13"}, False),
    ],
)
def test_a_websocket_upgrade_needs_its_key(fields: dict[str, str], refused: bool) -> None:
    """Applied to heads llhttp reports as upgrades (``Connection: upgrade`` and ``Upgrade``)."""
    headers = {"host": "a", "connection": "upgrade", **fields}
    request = Request("GET", "/", "1.1", list(headers.items()), headers)
    said = upgrade_refusal(request)
    assert (None if said is None else f"{said.status} {said.kind}") == (
        "400 bad_upgrade" if refused else None
    )


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        (b"/api/..;/admin", True),
        (b"/api/.;/admin", True),
        (b"/api/..;a=b;c/admin", True),
        (b"/api/%2E%2E;/admin", True),
        (b"/api/..%3B/admin", True),
        (b"/api/a;v=1/b", False),
        (b"/api/x.;/b", False),
        (b"/api/...;/b", False),
        (b"/api/;jsessionid=1", False),
        (b"/api/x?next=/..;/admin", False),
    ],
)
def test_dot_segments_with_parameters(path: bytes, refused: bool) -> None:
    head = b"GET " + path + b" HTTP/1.1\r\nHost: a\r\n\r\n"
    assert (_kind(head) == "400 bad_path") is refused
    assert _kind(head, path_parameters="forward") is None


# -- the parser's refusals ----------------------------------------------------------------------


def _refusal(head: bytes) -> tuple[int, str]:
    with pytest.raises(httptools.HttpParserError) as refused:
        parse_head(head)
    said = parser_refusal(refused.value)
    return said.status, said.detail


def test_parser_refusals_map_to_statuses() -> None:
    assert _refusal(b"GET / HTTP/9.9\r\n\r\n")[0] == 505
    assert _refusal(b"GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n") == (400, "Invalid header value char")
    assert _refusal(b"GET / HTTP/1.1\r\nX : a\r\n\r\n") == (400, "Invalid header token")
    assert parser_refusal(ValueError("")).detail == "malformed request"


def test_edge_options_are_validated() -> None:
    from floodwall._core.errors import ConfigError
    from floodwall.gateway.config import parse_gateway

    with pytest.raises(ConfigError, match=r"edge\.max_head: .*greater than or equal to 1024"):
        parse_gateway({"edge": {"max_head": 512}}, "gw.yaml")
    with pytest.raises(ConfigError, match=r"edge\.path_parameters"):
        parse_gateway({"edge": {"path_parameters": "strip"}}, "gw.yaml")
    with pytest.raises(ConfigError, match=r"edge\.server_header: must be printable ASCII"):
        parse_gateway({"edge": {"server_header": "a\x7fb"}}, "gw.yaml")
    defaults = parse_gateway({}, "gw.yaml").edge
    assert (defaults.max_head, defaults.path_parameters, defaults.server_header) == (
        32768,
        "refuse_dot_segments",
        None,
    )


def test_field_names_are_kept_decoded_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A field name (a request's or an answer's) is decoded and lower-cased once, in any case;
    a name longer than ``SHORT_NAME``, or past ``FIELD_NAMES`` names, is still decoded and
    lower-cased, only not kept."""
    from floodwall.gateway import _headers

    names: dict[bytes, tuple[str, str]] = {}
    monkeypatch.setattr(_headers, "NAMES", names)
    assert _headers.decode_name(b"CONTENT-length") == ("CONTENT-length", "content-length")
    assert _headers.decode_name(b"X-Trace-Id") == ("X-Trace-Id", "x-trace-id")
    assert list(names) == [b"CONTENT-length", b"X-Trace-Id"]
    long_name = b"X-" + b"a" * _headers.SHORT_NAME
    assert _headers.decode_name(long_name) == (long_name.decode(), long_name.decode().lower())
    assert long_name not in names
    names.update((b"x-%d" % i, ("", "")) for i in range(_headers.FIELD_NAMES - len(names)))
    assert _headers.decode_name(b"Connection") == ("Connection", "connection")
    assert b"Connection" not in names
    assert len(names) == _headers.FIELD_NAMES


def test_the_servers_kept_lines_read_as_formatted_ones() -> None:
    """The ``Content-Length`` lines and status lines the server keeps per distinct value say
    what formatting them each time would."""
    from floodwall.gateway import _server

    assert _server._length_line(214) == "Content-Length: 214\r\n"
    assert _server._LENGTHS[214] == "Content-Length: 214\r\n"
    assert _server._status_line("1.1", 200, None) == "HTTP/1.1 200 OK\r\n"
    assert _server._status_line("1.0", 599, None) == "HTTP/1.0 599 Unknown\r\n"
    assert _server._status_line("1.1", 200, "Fine") == "HTTP/1.1 200 Fine\r\n"
    assert _server._STATUS_LINES["1.1", 200, "Fine"] == "HTTP/1.1 200 Fine\r\n"
