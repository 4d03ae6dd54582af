"""Reverse-proxy cases ported from nginx's and HAProxy's own test suites, run on raw sockets.

Each :class:`Case` says which peer test it follows (``nginx-tests`` ``*.t`` files, HAProxy's
``reg-tests/**/*.vtc``), what the client sends, what the upstream answers, and how to describe
what happened in one line: the answers the client got (status, body, whether the message was
complete) and what reached the upstream. The inputs follow the peers' tests; the code and the
descriptions are floodwall's own.

The same cases run against floodwall's gateway (``tests/integration/test_gateway_peer_cases.py``
asserts :attr:`Case.floodwall`, the description of the strictest of nginx and HAProxy or a
documented choice) and against nginx and HAProxy (``python benchmarks/edge_compare.py``
prints the three side by side). Nothing leaves 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

TIMEOUT = 5.0
"""Seconds a client exchange may take at most (the upstream timeout cases take about 2)."""
UPSTREAM_TIMEOUT = 2.0
"""The proxies' wait for an answer head (nginx ``proxy_read_timeout``, HAProxy ``timeout
server``, floodwall ``read_timeout``), set the same in each configuration."""
INTERIM_WAIT = 1.5
"""Seconds a client that sent ``Expect: 100-continue`` waits for the 100 before it sends the
body anyway (as curl does)."""

HOST = b"Host: api.example.com\r\n"


# -- the upstream ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """What the upstream does with a request: send ``data``, then ``after``: ``close`` the
    connection, ``keep`` it for the next request, or ``hang`` (hold it open, reading nothing,
    until the peer closes it); ``early``: send it as soon as the head arrived, body unread,
    then close lingering (the rest read away until the peer closes); ``drop``: close as soon
    as the head arrived, sending nothing, the body unread."""

    data: bytes
    after: str = "close"


@dataclass
class Received:
    """One request as the upstream read it: the connection it came on, its head's lines, its
    body (de-chunked) and trailer lines, and how it was framed."""

    connection: int
    head: list[bytes]
    body: bytes
    framing: str
    trailers: list[bytes] = field(default_factory=list)
    complete: bool = False
    """Whether the body arrived whole (set with :attr:`done`, when reading it ended)."""
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def line(self) -> bytes:
        return self.head[0]

    @property
    def target(self) -> bytes:
        return self.head[0].split(b" ")[1] if b" " in self.head[0] else b""

    def field(self, name: bytes) -> bytes | None:
        for line in self.head[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None

    def names(self) -> set[bytes]:
        return {line.partition(b":")[0].strip().lower() for line in self.head[1:]}


def _read_line(conn: socket.socket, buf: bytearray) -> bytes | None:
    while b"\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line.rstrip(b"\r")


def _read_exact(conn: socket.socket, buf: bytearray, size: int) -> bytes | None:
    while len(buf) < size:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    data = bytes(buf[:size])
    del buf[:size]
    return data


def read_request(
    conn: socket.socket, buf: bytearray, connection: int, log: Callable[[Received], bool]
) -> Received | None:
    """The next request on ``conn`` (``None`` at its end), handed to ``log`` once its head
    arrived (``log`` returns whether to leave its body unread). Lenient on purpose: it logs
    what a proxy sent, it does not judge it; a ``100-continue`` expectation is granted."""
    head: list[bytes] = []
    while True:
        line = _read_line(conn, buf)
        if line is None:
            return None
        if not line:
            if head:
                break
            continue
        head.append(line)
    request = Received(connection, head, b"", "none")
    if log(request):  # answered before its body is read
        request.framing = "unread"
        request.done.set()
        return request
    try:
        return _read_body(conn, buf, request)
    finally:
        request.done.set()


def _read_body(conn: socket.socket, buf: bytearray, request: Received) -> Received:
    if (request.field(b"expect") or b"").lower() == b"100-continue":
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    coding = (request.field(b"transfer-encoding") or b"").lower()
    length = request.field(b"content-length")
    if b"chunked" in coding:
        request.framing = "chunked"
        return _read_chunked(conn, buf, request)
    if length is not None:
        request.framing = "length"
        body = _read_exact(conn, buf, int(length.split(b",")[0]))
        request.body = body or bytes(buf)
        request.complete = body is not None
        return request
    request.complete = True
    return request


def _read_chunked(conn: socket.socket, buf: bytearray, request: Received) -> Received:
    body = b""
    while True:
        line = _read_line(conn, buf)
        if line is None:
            break
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (trailer := _read_line(conn, buf)) not in (None, b""):
                request.trailers.append(trailer or b"")
            request.complete = trailer is not None
            break
        data = _read_exact(conn, buf, size + 2)
        if data is None:
            break
        body += data[:size]
    request.body = body
    return request


class Upstream:
    """A loopback socket server that logs every request it reads (:attr:`received`) and
    answers by the target's path, from :attr:`replies` (``"/r"`` → :class:`Reply`), else
    :data:`OK`. Connections are numbered in the order they were accepted."""

    def __init__(self) -> None:
        self.replies: dict[bytes, Reply] = {}
        self.received: list[Received] = []
        self.connections = 0
        self._numbers = itertools.count(1)
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def reset(self, replies: dict[bytes, Reply]) -> None:
        with self._lock:
            self.replies = replies
            self.received = []

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            number = next(self._numbers)
            self.connections = number
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        buf = bytearray()
        with conn, contextlib.suppress(OSError, ValueError):
            conn.settimeout(TIMEOUT + 5)
            while not self._stop.is_set():
                request = read_request(conn, buf, number, self._log)
                if request is None or not (request.complete or request.framing == "unread"):
                    return
                with self._lock:
                    reply = self.replies.get(request.target.partition(b"?")[0], OK_KEEP)
                if reply.after == "drop":  # the body arriving: closed unanswered, unread
                    return
                if reply.data:
                    conn.sendall(reply.data)
                if reply.after == "early":  # a lingering close (nginx's): what was sent
                    conn.shutdown(socket.SHUT_WR)  # is not lost to a reset for unread bytes
                    while conn.recv(65536):
                        pass
                    return
                if reply.after == "hang":
                    while conn.recv(65536):
                        pass
                    return
                if reply.after != "keep":
                    return

    def _log(self, request: Received) -> bool:
        with self._lock:
            self.received.append(request)
            reply = self.replies.get(request.target.partition(b"?")[0], OK_KEEP)
        return reply.after in ("early", "drop")

    def settled(self, timeout: float = 2.0) -> list[Received]:
        """The requests received, once each has been read to its end (or ``timeout``)."""
        until = time.monotonic() + timeout
        with self._lock:
            received = list(self.received)
        for request in received:
            request.done.wait(max(0.0, until - time.monotonic()))
        return received

    def quiet(self, spell: float = 0.5, limit: float = 3.0) -> None:
        """Wait (at most ``limit`` seconds) until no request has arrived for ``spell``
        seconds: a case that leaves a request in flight must not hand it to the next case."""
        until = time.monotonic() + limit
        seen = len(self.received)
        calm = time.monotonic() + spell
        while time.monotonic() < min(calm, until):
            time.sleep(0.05)
            if len(self.received) != seen:
                seen = len(self.received)
                calm = time.monotonic() + spell

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        self._thread.join(5)


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
OK_KEEP = Reply(OK, "keep")


# -- the client ----------------------------------------------------------------------------------


@dataclass
class Answer:
    """One answer as the client read it: ``complete`` is whether its framing said it ended."""

    status: int
    head: list[bytes]
    body: bytes
    complete: bool

    def field(self, name: bytes) -> bytes | None:
        for line in self.head[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None


def parse_answers(data: bytes, methods: list[bytes]) -> list[Answer]:
    """The answers in ``data``, read as a client that sent ``methods`` in that order would
    (1xx are answers of their own; HEAD, 204 and 304 have no body)."""
    answers: list[Answer] = []
    queue = list(methods)
    while data:
        head_bytes, sep, rest = data.partition(b"\r\n\r\n")
        head = head_bytes.split(b"\r\n")
        if not sep or not head[0].startswith(b"HTTP/"):
            answers.append(Answer(0, head, data, False))
            break
        try:
            status = int(head[0].split(b" ")[1])
        except (IndexError, ValueError):
            answers.append(Answer(0, head, data, False))
            break
        answer = Answer(status, head, b"", True)
        answers.append(answer)
        if status < 200:
            data = rest
            continue
        method = queue.pop(0) if queue else b"GET"
        data = _body(answer, rest, method)
    return answers


def _body(answer: Answer, rest: bytes, method: bytes) -> bytes:
    """Fill ``answer``'s body from ``rest``; what follows it."""
    if method == b"HEAD" or answer.status in (204, 304):
        return rest
    coding = (answer.field(b"transfer-encoding") or b"").lower()
    length = answer.field(b"content-length")
    if b"chunked" in coding:
        return _chunked_body(answer, rest)
    if length is not None:
        size = int(length)
        answer.body = rest[:size]
        answer.complete = len(rest) >= size
        return rest[size:]
    answer.body = rest  # until the connection closed
    return b""


def _chunked_body(answer: Answer, rest: bytes) -> bytes:
    body = b""
    while True:
        line, sep, after = rest.partition(b"\r\n")
        if not sep:
            answer.complete = False
            break
        try:
            size = int(line.split(b";")[0].strip(), 16)
        except ValueError:
            answer.complete = False
            break
        if size == 0:
            trailers, sep, rest = after.partition(b"\r\n\r\n") if after[:2] != b"\r\n" else (
                b"", b"\r\n", after[2:])  # fmt: skip
            answer.complete = bool(sep)
            if trailers:
                answer.head += [b"(trailer) " + t for t in trailers.split(b"\r\n")]
            break
        if len(after) < size + 2:
            body += after[:size]
            answer.complete = False
            rest = b""
            break
        body += after[:size]
        rest = after[size + 2 :]
    answer.body = body
    return rest


def exchange(port: int, parts: list[bytes], *, interim: bool = False) -> tuple[bytes, float]:
    """Send ``parts`` on a fresh connection (waiting up to :data:`INTERIM_WAIT` for a ``100``
    after the first when ``interim``); what came back until close or :data:`TIMEOUT`, and the
    seconds that took."""
    start = time.monotonic()
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        with contextlib.suppress(OSError):
            for number, part in enumerate(parts):
                if number and interim:
                    sock.settimeout(INTERIM_WAIT)
                    with contextlib.suppress(TimeoutError):
                        while b"\r\n\r\n" not in answer:
                            chunk = sock.recv(65536)
                            if not chunk:
                                break
                            answer += chunk
                    sock.settimeout(TIMEOUT)
                sock.sendall(part)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer, time.monotonic() - start


# -- describing what happened -----------------------------------------------------------------


def _short(data: bytes, limit: int = 24) -> str:
    text = data[:limit].decode("latin-1").replace("\r", "\\r").replace("\n", "\\n")
    return f"`{text}{'…' if len(data) > limit else ''}`"


def answer_text(answer: Answer) -> str:
    if answer.status == 0:
        return f"not HTTP: {_short(answer.body)}" if answer.body else "closed, no answer"
    text = str(answer.status)
    if answer.body and answer.status < 400:  # (not the proxies' own error pages)
        text += f" {_short(answer.body)}"
    if not answer.complete:
        text += " cut short"
    return text


def client_text(answers: list[Answer]) -> str:
    if not answers:
        return "closed, no answer"
    return " then ".join(answer_text(a) for a in answers)


def request_text(request: Received) -> str:
    method = request.line.split(b" ")[0].decode("latin-1")
    text = f"{method} {request.target.decode('latin-1')}"
    if request.body:
        text += f" {_short(request.body)}"
    if not request.complete:
        text += " (body cut short)"
    return text


def upstream_text(received: list[Received]) -> str:
    if not received:
        return "nothing"
    return ", ".join(request_text(r) for r in received)


Describe = Callable[[list[Answer], list[Received]], str]


def default(answers: list[Answer], received: list[Received]) -> str:
    return f"{client_text(answers)}; upstream got {upstream_text(received)}"


def with_fields(*names: bytes) -> Describe:
    """The default description, then which of ``names`` reached the upstream."""

    def describe(answers: list[Answer], received: list[Received]) -> str:
        passed = sorted({n.decode() for r in received for n in names if n in r.names()})
        tail = f"; passed on: {', '.join(passed)}" if passed else "; none passed on"
        return default(answers, received) + tail

    return describe


def field_lines(name: bytes) -> Describe:
    """The default description, then every value of field ``name`` the upstream got, in
    order (a repeated field: whether it was kept, joined or replaced)."""

    def describe(answers: list[Answer], received: list[Received]) -> str:
        values = [
            f"`{line.partition(b':')[2].strip().decode('latin-1')}`"
            for request in received
            for line in request.head[1:]
            if line.partition(b":")[0].strip().lower() == name
        ]
        return f"{default(answers, received)}; {name.decode()}: {', '.join(values) or 'none'}"

    return describe


def answer_fields(*names: bytes) -> Describe:
    """The client's answers, then which of ``names`` the client got."""

    def describe(answers: list[Answer], received: list[Received]) -> str:
        got = sorted({n.decode() for a in answers for n in names if a.field(n) is not None})
        return f"{client_text(answers)}; passed on: {', '.join(got) if got else 'none'}"

    return describe


def framing(answers: list[Answer], received: list[Received]) -> str:
    """The default description, with how the upstream got each body framed."""
    frames = ", ".join(r.framing for r in received if r.body or r.framing != "none")
    return default(answers, received) + (f" ({frames})" if frames else "")


def _name_case(request: Received, lower: bytes) -> str:
    for line in request.head[1:]:
        name = line.partition(b":")[0]
        if name.lower() == lower:
            return f"`{name.decode('latin-1')}`"
    return "nothing"


def connections(answers: list[Answer], received: list[Received]) -> str:
    count = len({r.connection for r in received})
    return f"{client_text(answers)}; {len(received)} requests on {count} upstream connections"


def status_only(answers: list[Answer], received: list[Received]) -> str:
    """The client's answers without their bodies (a long body)."""
    texts = [str(a.status) + ("" if a.complete else " cut short") for a in answers]
    return " then ".join(texts) if texts else "closed, no answer"


def only_client(answers: list[Answer], received: list[Received]) -> str:
    return client_text(answers)


# -- the cases -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A client's bytes, the upstream's script, and what floodwall is expected to do."""

    name: str
    label: str
    peer: str
    parts: list[bytes]
    floodwall: str
    replies: dict[bytes, Reply] = field(default_factory=dict)
    describe: Describe = default
    interim: bool = False
    half_close: bool = False

    @property
    def methods(self) -> list[bytes]:
        data = b"".join(self.parts)
        return [line.split(b" ")[0] for line in _request_lines(data)]


def _request_lines(data: bytes) -> list[bytes]:
    """Each request line in ``data`` (a line that starts a request after a blank line)."""
    lines = []
    for block in data.split(b"\r\n\r\n"):
        first = block.split(b"\r\n")[0]
        if b" HTTP/1." in first and first.split(b" ")[0].isalpha():
            lines.append(first)
    return lines


def get(target: bytes, *fields: bytes, close: bool = True, method: bytes = b"GET") -> bytes:
    tail = b"Connection: close\r\n" if close else b""
    return method + b" " + target + b" HTTP/1.1\r\n" + HOST + b"".join(fields) + tail + b"\r\n"


def post(target: bytes, fields: bytes, body: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    return b"POST " + target + b" " + version + b"\r\n" + HOST + fields + b"\r\n" + body


def chunked_answer(*pieces: bytes, close: bool = True) -> bytes:
    tail = b"Connection: close\r\n" if close else b""
    return b"HTTP/1.1 200 OK\r\n" + tail + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(pieces)


NGX = "nginx-tests "
HAP = "HAProxy reg-tests/"
SMUGGLE = b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
CHUNKED = b"Transfer-Encoding: chunked\r\n"
CLOSE = b"Connection: close\r\n"
LAST = b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nlast response"

REQUEST_CASES: list[Case] = [
    Case("te_and_cl",
         "`Transfer-Encoding: chunked` beside `Content-Length`, a request after the last chunk",
         HAP + "http-messaging/http_transfer_encoding.vtc c1",
         [post(b"/r", CHUNKED + b"Content-Length: %d\r\n" % len(SMUGGLE), SMUGGLE)],
         "400; upstream got nothing"),
    Case("http10_te", "HTTP/1.0 `POST` with `Transfer-Encoding: chunked`",
         HAP + "http-messaging/http_transfer_encoding.vtc c2",
         [post(b"/r", CHUNKED, b"0\r\n\r\n", b"HTTP/1.0")],
         "400; upstream got nothing"),
    Case("te_chunked_chunked", "`Transfer-Encoding: chunked, chunked`",
         HAP + "http-messaging/http_transfer_encoding.vtc c6",
         [post(b"/r", b"Transfer-Encoding: chunked, chunked\r\n" + CLOSE, b"0\r\n\r\n")],
         "400; upstream got nothing"),
    Case("te_chunked_gzip", "`Transfer-Encoding: chunked, gzip`",
         HAP + "http-messaging/http_transfer_encoding.vtc c8",
         [post(b"/r", b"Transfer-Encoding: chunked, gzip\r\n" + CLOSE, b"0\r\n\r\n")],
         "400; upstream got nothing"),
    Case("te_gzip", "`Transfer-Encoding: gzip` (not chunked last)",
         HAP + "http-messaging/http_transfer_encoding.vtc c9",
         [post(b"/r", b"Transfer-Encoding: gzip\r\n" + CLOSE, b"")],
         "400; upstream got nothing"),
    Case("te_gzip_chunked", "`Transfer-Encoding: gzip, chunked`",
         HAP + "http-messaging/http_transfer_encoding.vtc c10",
         [post(b"/r", b"Transfer-Encoding: gzip, chunked\r\n" + CLOSE, b"0\r\n\r\n")],
         "501; upstream got nothing"),
    Case("cl_twice", "`Content-Length: 5` twice",
         NGX + "http_headers_multi.t 'duplicate Content-Length rejected'",
         [post(b"/r", b"Content-Length: 5\r\nContent-Length: 5\r\n" + CLOSE, b"hello")],
         "400; upstream got nothing"),
    Case("cl_signed", "`Content-Length: +5`", "RFC 9110 §8.6 (no peer test found)",
         [post(b"/r", b"Content-Length: +5\r\n" + CLOSE, b"hello")],
         "400; upstream got nothing"),
    Case("chunk_extension", "a chunked body with a chunk extension (`5;name=value`)",
         NGX + "body_chunked.t (chunked bodies; the extension: RFC 9112 §7.1.1)",
         [post(b"/r", CHUNKED + CLOSE, b"5;name=value\r\nhello\r\n0\r\n\r\n")],
         "200 `ok`; upstream got POST /r `hello` (chunked)", describe=framing),
    Case("chunk_trailer", "a chunked body with a trailer field",
         NGX + "body_chunked.t (chunked bodies; the trailer: RFC 9112 §7.1.2)",
         [post(b"/r", CHUNKED + CLOSE, b"5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n")],
         "200 `ok`; upstream got POST /r `hello` (chunked)", describe=framing),
    Case("chunk_runaway", "a chunk of size 4 carrying 8 bytes",
         NGX + "body_chunked.t 'runaway chunk'",
         [post(b"/r", CHUNKED + CLOSE, b"4\r\nSEE-THIS\r\n0\r\n\r\n")],
         "400; upstream got nothing"),
    Case("te_identity", "`Transfer-Encoding: identity`",
         NGX + "body_chunked.t 'transfer encoding identity' (RFC 9112 §6.1: 400)",
         [post(b"/r", b"Transfer-Encoding: identity\r\n" + CLOSE, b"")],
         "400; upstream got nothing"),
    Case("te_repeated", "`Transfer-Encoding: chunked` twice",
         NGX + "body_chunked.t 'transfer encoding repeat'",
         [post(b"/r", CHUNKED + CHUNKED + CLOSE, b"0\r\n\r\n")],
         "400; upstream got nothing"),
    Case("te_chunked_identity", "`Transfer-Encoding: chunked, identity`",
         NGX + "body_chunked.t 'transfer encoding list'",
         [post(b"/r", b"Transfer-Encoding: chunked, identity\r\n" + CLOSE, b"0\r\n\r\n")],
         "400; upstream got nothing"),
    Case("chunk_size_overflow", "a chunk size of 17 hex digits",
         "RFC 9112 §7.1 (no peer test found)",
         [post(b"/r", CHUNKED + CLOSE, b"10000000000000001\r\nhello\r\n0\r\n\r\n")],
         "400; upstream got nothing"),
    Case("chunk_bare_lf", "chunk lines ended by a bare LF",
         "RFC 9112 §7.1 (no peer test found)",
         [post(b"/r", CHUNKED + CLOSE, b"5\nhello\n0\n\n")],
         "400; upstream got nothing"),
    Case("body_short", "`Content-Length: 10`, 5 bytes sent, then the client half-closes",
         NGX + "proxy_request_buffering.t (client closes early)",
         [post(b"/r", b"Content-Length: 10\r\n" + CLOSE, b"hello")],
         "closed, no answer; upstream got nothing", describe=framing, half_close=True),
    Case("expect_continue", "`Expect: 100-continue` with a 5-byte body, the client waits",
         NGX + "http_expect_100_continue.t 'expect 100 continue'",
         [post(b"/r", b"Expect: 100-continue\r\nContent-Length: 5\r\n" + CLOSE, b""), b"hello"],
         "100 then 200 `ok`; upstream got POST /r `hello`", interim=True),
    Case("expect_continue_empty", "`Expect: 100-continue` with `Content-Length: 0`",
         NGX + "http_expect_100_continue.t 'expect 100 continue' (its exact request)",
         [post(b"/r", b"Expect: 100-continue\r\nContent-Length: 0\r\n" + CLOSE, b"")],
         "100 then 200 `ok`; upstream got POST /r"),
    Case("expect_continue_case", "`Expect: 100-Continue` (other case)",
         NGX + "http_expect_100_continue.t 'expect 100 continue case-insensitive'",
         [post(b"/r", b"Expect: 100-Continue\r\nContent-Length: 5\r\n" + CLOSE, b""), b"hello"],
         "100 then 200 `ok`; upstream got POST /r `hello`", interim=True),
    Case("expect_continue_10", "`Expect: 100-continue` in HTTP/1.0",
         NGX + "http_expect_100_continue.t 'no 100 continue via http 1.0'",
         [post(b"/r", b"Expect: 100-continue\r\nContent-Length: 5\r\n", b"", b"HTTP/1.0"),
          b"hello"],
         "200 `ok`; upstream got POST /r `hello`", interim=True),
    Case("expect_unknown", "`Expect: unknown`",
         NGX + "http_expect_100_continue.t 'unknown expectation' (a TODO there: 417)",
         [post(b"/r", b"Expect: unknown\r\nContent-Length: 0\r\n" + CLOSE, b"")],
         "417; upstream got nothing"),
    Case("hop_by_hop", "`Connection: X-Secret`, `Keep-Alive`, `Proxy-Connection`, `Upgrade`, `TE`",
         NGX + "proxy_connection_headers.t / "
         + HAP + "http-messaging/http_transfer_encoding.vtc c5",
         [get(b"/r", b"Connection: close, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 300\r\n"
              b"Proxy-Connection: keep-alive\r\nUpgrade: h2c\r\nTE: trailers\r\n", close=False)],
         "200 `ok`; upstream got GET /r; none passed on",
         describe=with_fields(b"x-secret", b"keep-alive", b"proxy-connection", b"upgrade", b"te")),
    Case("underscore_name", "a field name with an underscore (`X-My_Hdr: on`)",
         HAP + "http-rules/restrict_req_hdr_names.vtc s1 (default: preserve)",
         [get(b"/r", b"X-My_Hdr: on\r\n")],
         "200 `ok`; upstream got GET /r; passed on: x-my_hdr", describe=with_fields(b"x-my_hdr")),
    Case("absolute_form", "`GET http://api.example.com/abs?q=1` with the same `Host`",
         NGX + "http_absolute_redirect.t / " + HAP + "http-messaging/h1_host_normalization.vtc",
         [get(b"http://api.example.com/abs?q=1")],
         "200 `ok`; upstream got GET /abs?q=1"),
    Case("fragment", "`GET /r#frag` (a fragment in the target)",
         HAP + "http-messaging/h1_authority_fragment_char.vtc (`#` refused by default)",
         [get(b"/r#frag")], "400; upstream got nothing"),
    Case("absolute_default_port", "`GET http://api.example.com:80/r` with `Host: api.example.com`",
         HAP + "http-messaging/h1_host_normalization.vtc c22",
         [get(b"http://api.example.com:80/r")], "200 `ok`; upstream got GET /r"),
    Case("absolute_userinfo", "`GET http://user:pw@api.example.com/r`",
         HAP + "http-messaging/h1_host_normalization.vtc c1",
         [get(b"http://user:pw@api.example.com/r")], "400; upstream got nothing"),
    Case("host_empty_port", "`GET http://api.example.com/r` with `Host: api.example.com:`",
         HAP + "http-messaging/h1_host_normalization.vtc c26",
         [get(b"http://api.example.com/r").replace(HOST, b"Host: api.example.com:\r\n")],
         "200 `ok`; upstream got GET /r"),
    Case("asterisk_get", "`GET *`", HAP + "http-messaging/h1_request_target_validation.vtc c5",
         [get(b"*")], "400; upstream got nothing"),
    Case("asterisk_options", "`OPTIONS *`",
         HAP + "http-messaging/h1_request_target_validation.vtc c1",
         [get(b"*", method=b"OPTIONS")], "400; upstream got nothing"),
    Case("authority_get", "`GET api.example.com:80` (authority form, not CONNECT)",
         HAP + "http-messaging/h1_request_target_validation.vtc c12",
         [get(b"api.example.com:80")], "400; upstream got nothing"),
    Case("relative_target", "`GET admin/a/b` (no leading slash)",
         HAP + "http-messaging/h1_request_target_validation.vtc c14",
         [get(b"admin/a/b")], "400; upstream got nothing"),
    Case("connect", "`CONNECT api.example.com:443`",
         HAP + "http-messaging/h1_request_target_validation.vtc c6 / " + NGX + "http_method.t",
         [get(b"api.example.com:443", method=b"CONNECT")], "400; upstream got nothing"),
    Case("host_dotdot", "`Host: ..`", NGX + "http_host.t 'double dot'",
         [get(b"/r").replace(HOST, b"Host: ..\r\n")], "400; upstream got nothing"),
    Case("host_trailing_dot", "`Host: api.example.com.`", NGX + "http_host.t 'trailing dot'",
         [get(b"/r").replace(HOST, b"Host: api.example.com.\r\n")],
         "200 `ok`; upstream got GET /r"),
    Case("pipelined", "two `GET`s in one write",
         NGX + "http_keepalive.t / " + HAP + "http-messaging/http_bodyless_response.vtc",
         [get(b"/a", close=False) + get(b"/b")],
         "200 `ok` then 200 `ok`; upstream got GET /a, GET /b"),
    Case("keepalive_reuse", "three `GET`s on one client connection",
         NGX + "proxy_keepalive.t 'keepalive' (with `keepalive` set there)",
         [get(b"/a", close=False) + get(b"/b", close=False) + get(b"/c")],
         "200 `ok` then 200 `ok` then 200 `ok`; 3 requests on 1 upstream connections",
         describe=connections),
    Case("get_with_body", "`GET` with `Content-Length: 5` and a body",
         NGX + "proxy_pass_request.t / " + HAP + "http-messaging/h1_to_h1.vtc",
         [get(b"/r", b"Content-Length: 5\r\n") + b"hello"],
         "200 `ok`; upstream got GET /r `hello`"),
    Case("pipelined_post", "`POST` with a 5-byte body, then a `GET`, in one write",
         NGX + "http_keepalive.t / " + HAP + "http-messaging/h1_to_h1.vtc",
         [post(b"/a", b"Content-Length: 5\r\n", b"hello") + get(b"/b")],
         "200 `ok` then 200 `ok`; upstream got POST /a `hello`, GET /b"),
    Case("close_then_more", "`GET` with `Connection: close`, then another `GET` in the same write",
         NGX + "http_keepalive.t",
         [get(b"/a") + get(b"/b")], "200 `ok`; upstream got GET /a"),
    Case("close_second_of_three", "three `GET`s in one write, the second with `Connection: close`",
         NGX + "http_keepalive.t",
         [get(b"/a", close=False) + get(b"/b") + get(b"/c")],
         "200 `ok` then 200 `ok`; upstream got GET /a, GET /b"),
    Case("http10_keepalive", "two HTTP/1.0 `GET`s with `Connection: keep-alive`",
         NGX + "http_keepalive.t",
         [b"GET /a HTTP/1.0\r\n" + HOST + b"Connection: keep-alive\r\n\r\n"
          b"GET /b HTTP/1.0\r\n" + HOST + b"\r\n"],
         "200 `ok` then 200 `ok`; upstream got GET /a, GET /b"),
    Case("http10_no_host", "HTTP/1.0 `GET` without `Host`", NGX + "http_host.t 'no host'",
         [b"GET /r HTTP/1.0\r\n\r\n"], "200 `ok`; upstream got GET /r"),
    Case("http11_no_host", "HTTP/1.1 `GET` without `Host`",
         NGX + "http_host.t / " + HAP + "http-messaging/h1_host_normalization.vtc",
         [b"GET /r HTTP/1.1\r\nConnection: close\r\n\r\n"], "400; upstream got nothing"),
    Case("space_in_target", "`GET /a b HTTP/1.1` (a space in the target)",
         HAP + "http-messaging/h1_request_target_validation.vtc",
         [get(b"/a b")], "400; upstream got nothing"),
    Case("request_obs_fold", "a folded request field (obs-fold)", NGX + "http_header_buffers.t",
         [get(b"/r", b"X-A: 1\r\n  2\r\n")], "400; upstream got nothing"),
    Case("expect_too_large", "`Expect: 100-continue` with a 20 MiB `Content-Length`",
         NGX + "http_expect_100_continue.t / client_max_body_size",
         [post(b"/r", b"Expect: 100-continue\r\nContent-Length: 20971520\r\n" + CLOSE, b"")],
         "413; upstream got nothing"),
    Case("name_case", "a field name in mixed case (`X-CamelCase`)",
         HAP + "http-rules/h1or2_to_h1c.vtc (h1-case-adjust)",
         [get(b"/r", b"X-CamelCase: v\r\n")], "200 `ok`; upstream got GET /r as `X-CamelCase`",
         describe=lambda a, r: f"{client_text(a)}; upstream got "
         + ", ".join(request_text(x) + " as " + _name_case(x, b"x-camelcase") for x in r)),
    # -- HAProxy reg-tests, more cases
    Case("abs_host_mismatch", "`GET http://other.example.com/r` with `Host: api.example.com`",
         HAP + "http-messaging/h1_host_normalization.vtc c8",
         [get(b"http://other.example.com/r")], "400; upstream got nothing"),
    Case("abs_port_mismatch", "`GET http://api.example.com:80/r` with `Host: api.example.com:81`",
         HAP + "http-messaging/h1_host_normalization.vtc c9",
         [get(b"http://api.example.com:80/r").replace(HOST, b"Host: api.example.com:81\r\n")],
         "400; upstream got nothing"),
    Case("abs_port_not_in_host", "`GET http://api.example.com:8080/r` with `Host: api.example.com`",
         HAP + "http-messaging/h1_host_normalization.vtc c10",
         [get(b"http://api.example.com:8080/r")], "400; upstream got nothing"),
    Case("abs_port_only_in_host", "`GET http://api.example.com/r` with `Host: api.example.com:81`",
         HAP + "http-messaging/h1_host_normalization.vtc c11",
         [get(b"http://api.example.com/r").replace(HOST, b"Host: api.example.com:81\r\n")],
         "400; upstream got nothing"),
    Case("two_hosts", "two `Host` fields naming different hosts",
         HAP + "http-messaging/h1_host_normalization.vtc c12",
         [get(b"/r", b"Host: other.example.com\r\n")], "400; upstream got nothing"),
    Case("abs_https_default_port",
         "`GET https://api.example.com:443/r` with `Host: api.example.com:443`",
         HAP + "http-messaging/h1_host_normalization.vtc c3",
         [get(b"https://api.example.com:443/r").replace(HOST, b"Host: api.example.com:443\r\n")],
         "200 `ok`; upstream got GET /r"),
    Case("abs_query_no_path", "`GET http://api.example.com?a=b` (a query, no path)",
         HAP + "http-messaging/h1_host_normalization.vtc c44",
         [get(b"http://api.example.com?a=b")], "200 `ok`; upstream got GET /?a=b"),
    Case("abs_empty_host", "`GET http://:` with `Host: :80` (no host at all)",
         HAP + "http-messaging/h1_host_normalization.vtc c32",
         [get(b"http://:").replace(HOST, b"Host: :80\r\n")], "400; upstream got nothing"),
    Case("options_asterisk_path", "`OPTIONS */test`",
         HAP + "http-messaging/h1_request_target_validation.vtc c4",
         [get(b"*/test", method=b"OPTIONS")], "400; upstream got nothing"),
    Case("cl_trailing_comma", "`Content-Length: 0,` (a list ending empty)",
         HAP + "http-messaging/h1_to_h1.vtc c4h1",
         [get(b"/r", b"Content-Length: 0,\r\n")], "400; upstream got nothing"),
    Case("head_with_request_body", "`HEAD` with a 38-byte body, the answer has one too",
         HAP + "http-messaging/h1_to_h1.vtc c2h1",
         [get(b"/r", b"Content-Length: 38\r\n", method=b"HEAD")
          + b"this must be delivered, like it or not"],
         "200; upstream got HEAD /r `this must be delivered, …`"),
    Case("four_posts", "four `POST`s: no length, `Content-Length: 0`, a body, then one with "
         "`Connection: close` and stray bytes", HAP + "http-messaging/h1_to_h1.vtc c3h1",
         [b"POST /a HTTP/1.1\r\n" + HOST + b"\r\n" + post(b"/b", b"Content-Length: 0\r\n", b"")
          + post(b"/c", b"Content-Length: 12\r\n", b"this is sent")
          + post(b"/d", b"Content-Length: 0\r\n" + CLOSE, b"") + b"this is not sent\r\n\r\n"],
         "200 `ok` then 200 `ok` then 200 `ok` then 200 `ok`; "
         "upstream got POST /a, POST /b, POST /c `this is sent`, POST /d"),
    Case("te_chunked_gzip_chunked", "`Transfer-Encoding: chunked, gzip, chunked`",
         HAP + "http-messaging/http_transfer_encoding.vtc c7",
         [post(b"/r", b"Transfer-Encoding: chunked, gzip, chunked\r\n" + CLOSE, b"0\r\n\r\n")],
         "400; upstream got nothing"),
    Case("chunk_split", "a chunked body split inside a chunk, sent in two writes",
         HAP + "http-messaging/http_request_buffer.vtc c3",
         [post(b"/r", CHUNKED + CLOSE, b"1\r\n1\r\n1"), b"\r\n1\r\n0\r\n\r\n"],
         "200 `ok`; upstream got POST /r `11` (chunked)", describe=framing),
    Case("chunk_no_last_crlf", "a chunked body without its last CRLF, then the client half-closes",
         HAP + "http-messaging/http_request_buffer.vtc c4",
         [post(b"/r", CHUNKED + CLOSE, b"1\r\n1\r\n1\r\n1\r\n0\r\n")],
         "closed, no answer; upstream got POST /r `11` (body cut short) (chunked)",
         describe=framing, half_close=True),
    Case("upgrade_custom", "`Connection: upgrade`, `Upgrade: custom_protocol`; the upstream "
         "answers 101", HAP + "http-messaging/protocol_upgrade.vtc c4_h1",
         [get(b"/up", b"Connection: upgrade\r\nUpgrade: custom_protocol\r\n")],
         "502; upstream got GET /up; none passed on",
         {b"/up": Reply(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
                        b"Upgrade: custom_protocol\r\n\r\n")}, with_fields(b"upgrade")),
    Case("websocket_no_key",
         "`Connection: upgrade`, `Upgrade: websocket`, no `Sec-WebSocket-Key`",
         HAP + "http-messaging/websocket.vtc c2_1",
         [get(b"/r", b"Connection: upgrade\r\nUpgrade: websocket\r\n")],
         "400; upstream got nothing"),
    # -- nginx-tests, more cases
    Case("percent_alone", "`GET /foo/bar%` (a `%` without its two hex digits)",
         NGX + "http_uri.t 'percent'", [get(b"/foo/bar%")], "400; upstream got nothing"),
    Case("percent_one_digit", "`GET /foo/bar%1` (a `%` with one hex digit)",
         NGX + "http_uri.t 'percent digit'", [get(b"/foo/bar%1")], "400; upstream got nothing"),
    Case("dotdot_query", "`GET /foo/bar/..?args` (a dot-segment before the query)",
         NGX + "http_uri.t 'dot dot args'", [get(b"/foo/bar/..?args")],
         "400; upstream got nothing"),
    Case("slashes_dotdot", "`GET /foo//../bar` (an empty segment, then a dot-segment)",
         NGX + "merge_slashes.t 'merge slashes'", [get(b"/foo//../bar")],
         "400; upstream got nothing"),
    Case("target_control", "`GET /\\x02` (a control character in the target)",
         NGX + "http_uri.t 'control'", [get(b"/\x02")], "400; upstream got nothing"),
    Case("target_control_escaped", "`GET /%02` (a control character, percent-encoded)",
         NGX + "http_uri.t 'control escaped'", [get(b"/%02")], "200 `ok`; upstream got GET /%02"),
    Case("absolute_no_path", "`GET http://api.example.com?args` (absolute form, no path)",
         NGX + "http_uri.t 'absolute args'", [get(b"http://api.example.com?args")],
         "200 `ok`; upstream got GET /?args"),
    Case("trace", "`TRACE /r`", NGX + "http_method.t 'trace'",
         [get(b"/r", method=b"TRACE")], "405; upstream got nothing"),
    Case("connect_no_port", "`CONNECT api.example.com` (no port)",
         NGX + "http_method.t 'connect no port'", [get(b"api.example.com", method=b"CONNECT")],
         "400; upstream got nothing"),
    Case("host_twice", "`Host` twice (`foo`, `bar`)",
         NGX + "http_headers_multi.t 'duplicate host rejected'",
         [get(b"/r").replace(HOST, b"Host: foo\r\nHost: bar\r\n")], "400; upstream got nothing"),
    Case("xff_three", "`X-Forwarded-For` three times from a client no proxy trusts",
         NGX + "http_headers_multi.t 'multi $http_x_forwarded_for'",
         [get(b"/r", b"X-Forwarded-For: foo\r\nX-Forwarded-For: bar\r\nX-Forwarded-For: bazz\r\n")],
         "200 `ok`; upstream got GET /r; x-forwarded-for: `127.0.0.1`",
         describe=field_lines(b"x-forwarded-for")),
    Case("cookie_three", "`Cookie` three times",
         NGX + "http_headers_multi.t 'multi $http_cookie'",
         [get(b"/r", b"Cookie: foo=1\r\nCookie: bar=2\r\nCookie: bazz=3\r\n")],
         "200 `ok`; upstream got GET /r; cookie: `foo=1`, `bar=2`, `bazz=3`",
         describe=field_lines(b"cookie")),
    Case("chunked_pipelined", "two `GET`s with chunked bodies in one write",
         NGX + "proxy_request_buffering_chunked.t 'body pipelined'",
         [get(b"/a", CHUNKED, close=False) + b"a\r\n0123456789\r\n0\r\n\r\n"
          + get(b"/b", CHUNKED) + b"6\r\nfoobar\r\n0\r\n\r\n"],
         "200 `ok` then 200 `ok`; upstream got GET /a `0123456789`, GET /b `foobar`"),
    Case("method_unknown", "`FOO /r` (a method no RFC defines)", NGX + "http_method.t (any method)",
         [get(b"/r", method=b"FOO")], "400; upstream got nothing"),
    Case("query_percent", "`GET /r?q=%` (a `%` alone in the query)",
         NGX + "http_uri.t 'percent' (in the query, which nginx does not decode)",
         [get(b"/r?q=%")], "200 `ok`; upstream got GET /r?q=%"),
    Case("query_raw_byte", "`GET /r?q=\\xff` (a byte above 0x7F in the query)",
         NGX + "http_uri.t (raw bytes) / RFC 9112 §3.2", [get(b"/r?q=\xff")],
         "400; upstream got nothing"),
    Case("long_target", "a request target of 10 KiB",
         NGX + "http_header_buffers.t 'long request line' (past `large_client_header_buffers`)",
         [get(b"/" + b"a" * 10240)], "414; upstream got nothing"),
    Case("two_spaces", "`GET  /r HTTP/1.1` (two spaces before the target)",
         NGX + "http_uri.t 'space' (between the words) / RFC 9112 §3", [get(b" /r")],
         "200 `ok`; upstream got GET /r"),
    Case("leading_empty_line", "an empty line before the request line",
         NGX + "http_keepalive.t (CRLF between requests) / RFC 9112 §2.2",
         [b"\r\n" + get(b"/r")], "200 `ok`; upstream got GET /r"),
    Case("obs_text_value", "a field value with a byte above 0x7F (`X-Obs: caf\\xe9`)",
         NGX + "http_headers_multi.t ($http_* as sent) / RFC 9110 §5.5 (obs-text)",
         [get(b"/r", b"X-Obs: caf\xe9\r\n")], "200 `ok`; upstream got GET /r; x-obs: `caf\xe9`",
         describe=field_lines(b"x-obs")),
]  # fmt: skip

ANSWER_CASES: list[Case] = [
    Case("chunked", "a chunked answer", NGX + "proxy_chunked.t 'chunked'",
         [get(b"/r")], "200 `SEE-THIS`", {b"/r": Reply(chunked_answer(
             b"8\r\nSEE-THIS\r\n0\r\n\r\n"))}, only_client),
    Case("chunked_extension", "a chunked answer with a chunk extension",
         NGX + "proxy_chunked_extra.t", [get(b"/r")], "200 `SEE-THIS`",
         {b"/r": Reply(chunked_answer(b"8;ext=1\r\nSEE-THIS\r\n0\r\n\r\n"))}, only_client),
    Case("chunked_trailer", "a chunked answer with a trailer", NGX + "proxy_trailers.t",
         [get(b"/r")], "200 `SEE-THIS`",
         {b"/r": Reply(chunked_answer(b"8\r\nSEE-THIS\r\n0\r\nX-Trailer: t\r\n\r\n"))},
         only_client),
    Case("extra_data", "`Content-Length: 8` then 21 bytes, on a kept connection; a 2nd request",
         NGX + "proxy_extra_data.t 'response with extra data'",
         [get(b"/r", close=False) + get(b"/last")], "200 `SEE-THIS` then 200 `last response`",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSEE-THIS-BUT-NOT-THIS",
                       "keep"), b"/last": Reply(LAST, "keep")}, only_client),
    Case("zero_extra", "`Content-Length: 0` then bytes, on a kept connection; a 2nd request",
         NGX + "proxy_extra_data.t 'zero size'",
         [get(b"/r", close=False) + get(b"/last")], "200 then 200 `last response`",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nNOT-THIS", "keep"),
          b"/last": Reply(LAST, "keep")}, only_client),
    Case("short_length", "`Content-Length: 100`, 8 bytes, then the upstream closes",
         NGX + "proxy_extra_data.t 'too short response' / proxy_unfinished.t",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nSEE-THIS")}, only_client),
    Case("chunked_unfinished", "a chunked answer without its last chunk, then the upstream closes",
         NGX + "proxy_unfinished.t 'chunked no final chunk'",
         [get(b"/r")], "200 `SEE-THIS` cut short",
         {b"/r": Reply(chunked_answer(b"8\r\nSEE-THIS\r\n"))}, only_client),
    Case("big_unfinished", "`Content-Length` 1 MiB, 256 KiB sent, then the upstream closes",
         NGX + "proxy_unfinished.t 'big unfinished'",
         [get(b"/r")], "200 cut short",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n" + b"X" * 262144)},
         status_only),
    Case("head_with_body", "`HEAD` answered with a body, then a `GET` on the same connection",
         HAP + "http-messaging/http_bodyless_response.vtc c1 / "
         + NGX + "proxy_extra_data.t 'no data in HEAD'",
         [get(b"/r", close=False, method=b"HEAD") + get(b"/last")], "200 then 200 `last response`",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nskipped data", "keep"),
          b"/last": Reply(LAST, "keep")}, only_client),
    Case("no_content_with_body", "`204` with `Content-Length: 4` and a body, then a `GET`",
         HAP + "http-messaging/http_bodyless_response.vtc (for 204)",
         [get(b"/r", close=False) + get(b"/last")], "204 then 200 `last response`",
         {b"/r": Reply(b"HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\noops", "keep"),
          b"/last": Reply(LAST, "keep")}, only_client),
    Case("not_modified_with_body", "`304` with `Content-Length: 4` and a body, then a `GET`",
         HAP + "http-messaging/http_bodyless_response.vtc (for 304)",
         [get(b"/r", close=False) + get(b"/last")], "304 then 200 `last response`",
         {b"/r": Reply(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 4\r\n\r\noops", "keep"),
          b"/last": Reply(LAST, "keep")}, only_client),
    Case("answer_te_and_cl", "`Transfer-Encoding: chunked` beside `Content-Length: 30`",
         HAP + "http-messaging/http_transfer_encoding.vtc c4",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 Ok\r\nTransfer-Encoding: chunked\r\nContent-Length: 30"
                       b"\r\n\r\n0\r\n\r\nResponse splitting attach")}, only_client),
    Case("answer_http10_chunked", "an HTTP/1.0 answer with `Transfer-Encoding: chunked`",
         HAP + "http-messaging/http_transfer_encoding.vtc c3",
         [get(b"/r")], "200",
         {b"/r": Reply(b"HTTP/1.0 200 Ok\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")},
         only_client),
    Case("answer_te_chunked_chunked", "`Transfer-Encoding: chunked, chunked` in an answer",
         HAP + "http-messaging/http_transfer_encoding.vtc c11 (s2)",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"
                       b"0\r\n\r\n")}, only_client),
    Case("answer_te_gzip", "`Transfer-Encoding: gzip` in an answer (no chunked)",
         HAP + "http-messaging/http_transfer_encoding.vtc c11 (s2)",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 0"
                       b"\r\n\r\n")}, only_client),
    Case("answer_te_gzip_chunked", "`Transfer-Encoding: gzip, chunked` in an answer",
         HAP + "http-messaging/http_transfer_encoding.vtc c11 (s2)",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                       b"0\r\n\r\n")}, only_client),
    Case("answer_two_lengths", "two different `Content-Length`s in an answer",
         NGX + "proxy_duplicate_headers.t",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n"
                       b"okk")}, only_client),
    Case("answer_hop_by_hop", "an answer with `Connection: X-Secret`, `Keep-Alive`, `Upgrade`",
         NGX + "proxy_connection_headers.t 'upgrade in 200'",
         [get(b"/r")], "200 `ok`; passed on: none",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nX-Secret: 1\r\n"
                       b"Keep-Alive: timeout=5\r\nUpgrade: websocket\r\n"
                       b"Content-Length: 2\r\n\r\nok")},
         answer_fields(b"x-secret", b"keep-alive", b"upgrade")),
    Case("answer_interim", "`100 Continue` then `200` from the upstream, to a `GET`",
         "RFC 9110 §15.2 (no peer test found)",
         [get(b"/r")], "200 `ok`",
         {b"/r": Reply(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)}, only_client),
    Case("answer_early_hints", "`103 Early Hints` then `200`",
         NGX + "proxy_early_hints.t 'early hints off'",
         [get(b"/r")], "200 `ok`",
         {b"/r": Reply(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n" + OK)},
         only_client),
    Case("answer_only_hints", "`103 Early Hints`, then the upstream closes",
         NGX + "proxy_early_hints.t 'early hints only'",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n")},
         only_client),
    Case("answer_bad_status", "status `2000`", "RFC 9112 §4 (no peer test found)",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok")}, only_client),
    Case("answer_no_reason", "a status line without a reason phrase (`HTTP/1.1 200`)",
         "RFC 9112 §4 (no peer test found)", [get(b"/r")], "200 `ok`",
         {b"/r": Reply(b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok")}, only_client),
    Case("answer_big_head", "an answer field of 40 KiB",
         NGX + "proxy.t / proxy_buffer_size (`upstream sent too big header`)",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * 40960
                       + b"\r\nContent-Length: 2\r\n\r\nok")}, only_client),
    Case("answer_101", "`101 Switching Protocols` to a plain `GET`",
         NGX + "proxy_upgrade.t / " + HAP + "http-messaging/protocol_upgrade.vtc",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                       b"Connection: Upgrade\r\n\r\nraw bytes")}, only_client),
    Case("answer_close_then_more", "an answer with `Connection: close`, a 2nd request pipelined",
         NGX + "proxy_keepalive.t 'upstream close'",
         [get(b"/r", close=False) + get(b"/last")], "200 `ok` then 200 `last response`",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"),
          b"/last": Reply(LAST)}, only_client),
    Case("answer_until_close", "an answer without length or chunking, ended by the close",
         NGX + "proxy.t 'proxy request' (its upstream closes) / RFC 9112 §6.3",
         [get(b"/r")], "200 `until the close`",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\n\r\nuntil the close")}, only_client),
    Case("answer_early_413",
         "a 512 KiB `POST` body; the upstream answers 413 after the head, body unread",
         HAP + "http-messaging/http_abortonclose.vtc / " + NGX + "proxy_request_buffering.t",
         [post(b"/big", b"Content-Length: 524288\r\n" + CLOSE, b"x" * 524288)], "413",
         {b"/big": Reply(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n", "early")}, only_client),
    Case("upload_dropped", "a 512 KiB `POST` body; the upstream closes after the head, unanswered",
         NGX + "proxy_request_buffering.t / " + HAP + "http-messaging/http_abortonclose.vtc",
         [post(b"/big", b"Content-Length: 524288\r\n" + CLOSE, b"x" * 524288)], "502",
         {b"/big": Reply(b"", "drop")}, only_client),
    Case("answer_chunked_to_http10", "a chunked answer to an HTTP/1.0 client",
         NGX + "proxy_chunked.t 'chunked' (for an HTTP/1.0 client)",
         [b"GET /r HTTP/1.0\r\n" + HOST + b"\r\n"], "200 `SEE-THIS`",
         {b"/r": Reply(chunked_answer(b"8\r\nSEE-THIS\r\n0\r\n\r\n"))}, only_client),
    Case("answer_noclose", "an answer without length that never ends (the proxy waits 2 s)",
         NGX + "proxy_noclose.t 'bad backend - no content length'",
         [get(b"/r")], "200 `SEE-THIS` cut short",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\n\r\nSEE-THIS", "hang")}, only_client),
    Case("answer_length_noclose", "`Content-Length: 8`, then the upstream holds the connection",
         NGX + "proxy_noclose.t 'content-length actually used'",
         [get(b"/r")], "200 `SEE-THIS`",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSEE-THIS", "keep")},
         only_client),
    Case("answer_nothing", "the upstream closes without answering",
         NGX + "proxy_next_upstream.t (an `error`)", [get(b"/r")], "502",
         {b"/r": Reply(b"")}, only_client),
    Case("answer_half_head", "the upstream sends half a head and closes",
         NGX + "proxy_unfinished.t", [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-")}, only_client),
    Case("answer_timeout", "the upstream never answers (the proxy waits 2 s)",
         NGX + "proxy_next_upstream.t 'timeout' / " + HAP + "timeout server",
         [get(b"/r")], "504", {b"/r": Reply(b"", "hang")}, only_client),
    # -- HAProxy reg-tests, more cases
    Case("answer_te_chunked_gzip_chunked",
         "`Transfer-Encoding: chunked, gzip, chunked` in an answer",
         HAP + "http-messaging/http_transfer_encoding.vtc c11 (s2)",
         [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip, chunked\r\n\r\n"
                       b"0\r\n\r\n")}, only_client),
    Case("heads_with_bodies", "three `HEAD`s answered with bodies (12 bytes, 50 000 bytes, "
         "chunked 55 087 bytes), then a `GET`",
         HAP + "http-messaging/http_bodyless_response.vtc c1",
         [get(b"/h1", close=False, method=b"HEAD") + get(b"/h2", close=False, method=b"HEAD")
          + get(b"/h3", close=False, method=b"HEAD") + get(b"/last")],
         "200 then 200 then 200 then 200 `last response`",
         {b"/h1": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nskipped data", "keep"),
          b"/h2": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 50000\r\n\r\n" + b"x" * 50000,
                        "keep"),
          b"/h3": Reply(chunked_answer(*(b"%x\r\n%s\r\n" % (n, b"x" * n)
                                         for n in (15, 1024, 4048, 50000)), b"0\r\n\r\n",
                                       close=False), "keep"),
          b"/last": Reply(LAST, "keep")}, only_client),
    Case("answer_many_chunks", "a chunked answer of 20 chunks of 815 bytes, then the close",
         HAP + "http-messaging/truncated.vtc",
         [get(b"/r")], "200 16300 bytes",
         {b"/r": Reply(chunked_answer(*[b"32f\r\n" + b"y" * 815 + b"\r\n"] * 20, b"0\r\n\r\n"))},
         lambda a, r: " then ".join(f"{x.status} {len(x.body)} bytes"
                                    + ("" if x.complete else " cut short") for x in a)),
    Case("answer_length_stalls", "`Content-Length: 1001`, 1000 bytes, then the upstream holds "
         "the connection (the proxy waits 2 s)", HAP + "http-messaging/http_wait_for_body.vtc s2",
         [get(b"/r")], "504",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1001\r\n\r\n" + b"z" * 1000,
                       "hang")}, status_only),
    # -- nginx-tests, more cases
    Case("chunked_extra_data", "a chunked answer, then more chunks after its last chunk",
         NGX + "proxy_chunked_extra.t 'chunked with extra data'",
         [get(b"/r")], "200 `SEE-THIS`",
         {b"/r": Reply(chunked_answer(b"8\r\nSEE-THIS\r\n0\r\n\r\n3\r\nzzz\r\n0\r\n\r\n"))},
         only_client),
    Case("keepalive_head", "`HEAD` answered with `Content-Length: 26`, no body; a `GET` next",
         NGX + "proxy_keepalive.t 'buffered head 2'",
         [get(b"/r", close=False, method=b"HEAD") + get(b"/last")],
         "200 then 200 `last response`; 2 requests on 1 upstream connections",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 26\r\n\r\n", "keep"),
          b"/last": Reply(LAST, "keep")}, connections),
    Case("keepalive_304_length", "`304` with `Content-Length: 100`, no body; a `GET` next",
         NGX + "proxy_keepalive.t 'buffered 304 with length 2'",
         [get(b"/r", close=False) + get(b"/last")],
         "304 then 200 `last response`; 2 requests on 1 upstream connections",
         {b"/r": Reply(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\n", "keep"),
          b"/last": Reply(LAST, "keep")}, connections),
    Case("keepalive_304", "`304` without length; a `GET` next",
         NGX + "proxy_keepalive.t 'buffered 304 2'",
         [get(b"/r", close=False) + get(b"/last")],
         "304 then 200 `last response`; 2 requests on 1 upstream connections",
         {b"/r": Reply(b"HTTP/1.1 304 Not Modified\r\n\r\n", "keep"),
          b"/last": Reply(LAST, "keep")}, connections),
    Case("keepalive_last_chunk", "a chunked answer of its last chunk only; a `GET` next",
         NGX + "proxy_keepalive.t 'buffered 0 chunk 2'",
         [get(b"/r", close=False) + get(b"/last")],
         "200 then 200 `last response`; 2 requests on 1 upstream connections",
         {b"/r": Reply(chunked_answer(b"0\r\n\r\n", close=False), "keep"),
          b"/last": Reply(LAST, "keep")}, connections),
    Case("keepalive_upstream_closed",
         "an answer, then the upstream closes (no `Connection: close`); a `GET` next",
         NGX + "proxy_keepalive.t 'buffered closed 2' (here unannounced)",
         [get(b"/r", close=False) + get(b"/last")],
         "200 `ok` then 200 `last response`; 2 requests on 2 upstream connections",
         {b"/r": Reply(OK), b"/last": Reply(LAST, "keep")}, connections),
    Case("keepalive_many_chunks", "a chunked answer of 100 chunks of 10 bytes and one of 26;"
         " a `GET` next", NGX + "proxy_keepalive.t 'buffered complex chunked 2'",
         [get(b"/r", close=False) + get(b"/last")],
         "200 `012345678901234567890123…` then 200 `last response`;"
         " 2 requests on 1 upstream connections",
         {b"/r": Reply(chunked_answer(b"a\r\n0123456789\r\n" * 100,
                                      b"1a\r\nTEST-OK-IF-YOU-SEE-THIS001\r\n0\r\n\r\n",
                                      close=False), "keep"),
          b"/last": Reply(LAST, "keep")}, connections),
    Case("big_whole", "`Content-Length` 1 MiB, sent whole",
         NGX + "proxy_max_temp_file_size.t 'no temp file - body length'",
         [get(b"/r")], "200",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n" + b"X" * 1048576)},
         status_only),
    Case("answer_chunk_size_bad", "a chunked answer whose chunk size is not hex (`zz`)",
         NGX + "proxy_chunked.t (`upstream sent invalid chunked response`)",
         [get(b"/r")], "502",
         {b"/r": Reply(chunked_answer(b"zz\r\nSEE-THIS\r\n0\r\n\r\n"))}, only_client),
    Case("answer_chunk_size_huge", "a chunked answer whose chunk size has 17 hex digits",
         NGX + "proxy_chunked.t (`upstream sent invalid chunked response`)",
         [get(b"/r")], "502",
         {b"/r": Reply(chunked_answer(b"10000000000000008\r\nSEE-THIS\r\n0\r\n\r\n"))},
         only_client),
    Case("answer_length_invalid", "`Content-Length: foo` in an answer",
         NGX + "proxy_duplicate_headers.t 'invalid length'", [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: foo\r\n\r\n")},
         only_client),
    Case("answer_length_twice", "`Content-Length: 0` twice in an answer",
         NGX + "proxy_duplicate_headers.t 'duplicate length'", [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n"
                       b"Content-Length: 0\r\n\r\n")}, only_client),
    Case("answer_te_unknown", "`Transfer-Encoding: foo` in an answer",
         NGX + "proxy_duplicate_headers.t 'unknown transfer encoding'", [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: foo\r\n\r\n")},
         only_client),
    Case("answer_te_twice", "`Transfer-Encoding: chunked` twice (two fields) in an answer",
         NGX + "proxy_duplicate_headers.t 'duplicate transfer encoding'", [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")}, only_client),
    Case("answer_many_fields", "an answer with 150 fields",
         NGX + "proxy.t / proxy_buffer_size (`upstream sent too big header`)", [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-F%d: v\r\n" % i for i in range(150))
                       + b"Content-Length: 2\r\n\r\nok")}, only_client),
    Case("answer_obs_fold", "a folded answer field (obs-fold)",
         NGX + "proxy.t (`upstream sent invalid header`) / RFC 9112 §5.2", [get(b"/r")], "502",
         {b"/r": Reply(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n  2\r\nContent-Length: 2\r\n\r\nok")},
         only_client),
]  # fmt: skip

CASES: list[Case] = REQUEST_CASES + ANSWER_CASES


def run(port: int, upstream: Upstream, case: Case) -> tuple[str, float]:
    """``case`` against the proxy on ``port``: its description and the seconds it took."""
    upstream.reset(case.replies)
    if case.half_close:
        data, took = _half_close(port, case.parts[0])
        upstream.quiet()  # (a proxy that streams may forward the partial request late)
    else:
        data, took = exchange(port, case.parts, interim=case.interim)
    answers = parse_answers(data, case.methods)
    return case.describe(answers, upstream.settled()), took


def _half_close(port: int, data: bytes) -> tuple[bytes, float]:
    """Send ``data`` and shut the sending side: a body that will never be complete."""
    start = time.monotonic()
    answer = b""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock,
        contextlib.suppress(OSError),
    ):
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        while chunk := sock.recv(65536):
            answer += chunk
    return answer, time.monotonic() - start


# -- two endpoints -----------------------------------------------------------------------------

TWO_ENDPOINT_CASES: list[Case] = [
    Case("next_get", "both endpoints close without answering a `GET`",
         NGX + "proxy_non_idempotent.t 'get'", [get(b"/r")], "502; tried 2 endpoints",
         {b"/r": Reply(b"")}),
    Case("next_post", "both endpoints close without answering a `POST`",
         NGX + "proxy_non_idempotent.t 'post'",
         [post(b"/r", b"Content-Length: 5\r\n" + CLOSE, b"hello")], "502; tried 1 endpoint",
         {b"/r": Reply(b"")}),
    # -- nginx-tests, more cases
    Case("next_500", "both endpoints answer a `GET` with 500",
         NGX + "proxy_next_upstream.t 'request 500' (without `http_500`)", [get(b"/r")],
         "500; tried 2 endpoints",
         {b"/r": Reply(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")}),
    Case("next_timeout", "both endpoints never answer a `GET` (each try waits 2 s)",
         NGX + "proxy_next_upstream.t (`timeout`, in the default `error timeout`)", [get(b"/r")],
         "504; tried 2 endpoints", {b"/r": Reply(b"", "hang")}),
]  # fmt: skip
"""Run against a proxy with two endpoints that answer alike (:func:`run_two`); the expected
line is floodwall's with a retry of 2 attempts on the route's resource."""


def run_two(port: int, upstreams: list[Upstream], case: Case) -> str:
    """``case`` against a proxy in front of ``upstreams``: the client's answers and how many
    of the endpoints got the request."""
    for upstream in upstreams:
        upstream.reset(case.replies)
    data, _ = exchange(port, case.parts)
    answers = parse_answers(data, case.methods)
    tried = sum(1 for upstream in upstreams if upstream.settled())
    return f"{client_text(answers)}; tried {tried} endpoint{'s' if tried != 1 else ''}"
