"""The gateway's edge rules beside nginx and HAProxy: the same raw-socket cases against each.

    python benchmarks/edge_compare.py          # needs `nginx` and/or `haproxy` on the PATH

Starts one upstream (a socket server that answers a scripted reply and logs every request it
received), then floodwall's gateway, nginx and HAProxy in front of it on loopback ports (each
with its default settings and a minimal configuration in a temporary directory), sends every
case on a fresh connection, and prints a Markdown table: the status each answered and whether
the upstream received the request. A proxy that is not installed gets a column of "-".
Nothing leaves 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import proxy_cases

OK = b"HTTP/1.1 200 OK\r\nServer: upstream-secret/1.0\r\nContent-Length: 2\r\n\r\nok"
HOST = b"Host: api.example.com\r\n"
TIMEOUT = 3.0


class Upstream:
    """One request per connection: logged, answered with :attr:`reply`, closed."""

    def __init__(self) -> None:
        self.reply = OK
        self.received = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(TIMEOUT)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.received += 1
            conn.sendall(self.reply)

    def close(self) -> None:
        self._stop.set()
        self._server.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def exchange(port: int, data: bytes) -> bytes:
    """``data`` on a fresh connection; what came back until close or :data:`TIMEOUT`."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
        return answer


def nginx(
    directory: Path,
    port: int,
    upstreams: list[int],
    timeout: float = 60.0,
    *,
    server: str = "",
    upstream: str = "",
    location: str = "",
    connections: int = 64,
) -> list[str] | None:
    """nginx's command line, its configuration written in ``directory``; ``server`` is added to
    each ``server`` line of the upstream block, ``upstream`` to the block and ``location`` to
    the proxied location (directives, for a comparison that needs more than the defaults);
    ``connections``: its ``worker_connections`` (a proxied request takes two)."""
    if shutil.which("nginx") is None:
        return None
    conf = directory / "nginx.conf"
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    for kind in kinds:
        (directory / kind).mkdir(exist_ok=True)
    user = "user root;" if os.geteuid() == 0 else ""  # (its workers write the temp files)
    temp = " ".join(f"{kind}_temp_path {directory / kind};" for kind in kinds)
    servers = " ".join(f"server 127.0.0.1:{port_} {server};" for port_ in upstreams)
    conf.write_text(
        f"{user} worker_processes 1; daemon off; pid {directory / 'nginx.pid'};\n"
        f"error_log {directory / 'nginx.log'} info;\n"
        f"events {{ worker_connections {connections}; }}\n"
        f"http {{ access_log off; {temp}\n  upstream backend {{ {servers} {upstream} }}\n"
        f"  server {{ listen 127.0.0.1:{port};\n"
        f"    location / {{ proxy_pass http://backend; "
        f"proxy_read_timeout {round(timeout * 1000)}ms; {location} }} }} }}\n",
        encoding="utf-8",
    )
    return ["nginx", "-p", str(directory), "-e", str(directory / "nginx.log"), "-c", str(conf)]


def haproxy(
    directory: Path,
    port: int,
    upstreams: list[int],
    timeout: float = 5.0,
    retry: bool = False,
    *,
    connect: float = 2.0,
    server: str = "",
    backend: str = "",
    connections: int = 64,
) -> list[str] | None:
    """HAProxy's command line, its configuration written in ``directory``; ``server`` is added
    to each ``server`` line and ``backend`` (lines) to the backend; ``connections``: its
    ``maxconn``. Times are written in milliseconds."""
    if shutil.which("haproxy") is None:
        return None
    conf = directory / "haproxy.cfg"
    servers = "".join(
        f"  server s{number} 127.0.0.1:{upstream} {server}\n"
        for number, upstream in enumerate(upstreams)
    )
    redispatch = "  option redispatch 1\n" if retry else ""
    conf.write_text(
        f"global\n  maxconn {connections}\ndefaults\n  mode http\n"
        f"  timeout connect {round(connect * 1000)}ms\n  timeout client 5s\n"
        f"  timeout server {round(timeout * 1000)}ms\n{redispatch}"
        f"frontend edge\n  bind 127.0.0.1:{port}\n  default_backend upstream\n"
        f"backend upstream\n{backend}{servers}",
        encoding="utf-8",
    )
    return ["haproxy", "-db", "-f", str(conf)]


def floodwall(
    directory: Path, port: int, upstreams: list[int], timeout: float = 30.0, retry: bool = False
) -> list[str]:
    route: dict[str, object] = {"match": {"path_prefix": "/"}, "upstream": "svc"}
    resources = {}
    if retry:
        resources = {"svc": {"retry": {"attempts": 2}}}
        route["resource"] = "svc"
    endpoints = [f"http://127.0.0.1:{upstream}" for upstream in upstreams]
    document = {
        "listen": f"127.0.0.1:{port}",
        "admin": None,
        "upstreams": {"svc": {"endpoints": endpoints, "read_timeout": timeout}},
        "resources": resources,
        "routes": [route],
    }
    return floodwall_command(directory, document)


def floodwall_command(directory: Path, document: Mapping[str, object]) -> list[str]:
    """The gateway's command line, ``document`` written as its configuration in ``directory``."""
    conf = directory / "gateway.json"
    conf.write_text(json.dumps(document), encoding="utf-8")
    return [sys.executable, "-m", "floodwall.gateway", "-c", str(conf)]


def get(target: bytes = b"/x", fields: bytes = b"", version: bytes = b" HTTP/1.1") -> bytes:
    return b"GET " + target + version + b"\r\n" + HOST + fields + b"Connection: close\r\n\r\n"


def pad(count: int) -> bytes:
    return b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 4096) for i in range(count))


REQUESTS: list[tuple[str, bytes]] = [
    ("`Host: a b@c/../`", b"GET /x HTTP/1.1\r\nHost: a b@c/../\r\nConnection: close\r\n\r\n"),
    ("`Host: user@api.example.com`", get().replace(HOST, b"Host: user@api.example.com\r\n")),
    ("`GET /x` (no version)", b"GET /x\r\nHost: a\r\n\r\n"),
    ("`GET /x HTTP/2.0`", get(version=b" HTTP/2.0")),
    ("`GET /x HTTP/1.2`", get(version=b" HTTP/1.2")),
    ("8 fields of 4 KiB (a 32.1 KiB head)", get(fields=pad(8))),
    ("30 fields of 4 KiB (a 120 KiB head)", get(fields=pad(30))),
    ("`GET /api/..;/admin`", get(b"/api/..;/admin")),
    ("`GET http://169.254.169.254/latest` with `Host: api.example.com`", get(b"http://169.254.169.254/latest")),
]  # fmt: skip
ANSWERS: list[tuple[str, bytes]] = [
    ("an upstream answer with `Content-Length : 8` beside `Transfer-Encoding: chunked`",
     b"HTTP/1.1 200 OK\r\nContent-Length : 8\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\nsmuggled"),
    ("an upstream answer with `Content-Length : 2`",
     b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\nConnection: close\r\n\r\nok"),
    ("an upstream field value `a\\x01b`",
     b"HTTP/1.1 200 OK\r\nX-Data: a\x01b\r\nContent-Length: 2\r\n\r\nok"),
    ("an upstream reason phrase `O\\x01K`", b"HTTP/1.1 200 O\x01K\r\nContent-Length: 2\r\n\r\nok"),
]  # fmt: skip


def status(answer: bytes) -> str:
    if not answer:
        return "closed, no answer"
    if not answer.startswith(b"HTTP/"):
        return "answered as HTTP/0.9"
    return answer.split(b" ", 2)[1].decode("ascii", "replace")


def server_field(answer: bytes) -> str:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"server":
            return f"`{value.strip().decode('latin-1')}`"
    return "none"


@contextlib.contextmanager
def running(
    commands: dict[str, list[str] | None], ports: dict[str, int], logs: Path | None = None
) -> Iterator[None]:
    """The ``commands`` started, each ready once its port in ``ports`` takes a connection (at
    most 20 s in all), and stopped at the end whatever happens; ``logs``: a directory for each
    one's standard error (``NAME.log``), else it is dropped."""
    procs = []
    with contextlib.ExitStack() as files:
        for name, command in commands.items():
            if command is None:
                continue
            err = (
                files.enter_context((logs / f"{name}.log").open("wb"))
                if logs is not None
                else subprocess.DEVNULL
            )
            procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err))
        try:
            deadline = time.monotonic() + 20
            for name, port in ports.items():
                while commands.get(name) is not None and time.monotonic() < deadline:
                    with contextlib.suppress(OSError):
                        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                        break
                    time.sleep(0.1)
            yield
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


def table(upstream: Upstream, ports: dict[str, int], live: set[str]) -> list[str]:
    def each(case: Callable[[int], str]) -> str:
        return " | ".join(case(ports[name]) if name in live else "-" for name in ports)

    def request(data: bytes) -> Callable[[int], str]:
        def run(port: int) -> str:
            before = upstream.received
            said = status(exchange(port, data))
            return f"{said}, forwarded" if upstream.received > before else said

        return run

    rows = [f"| what arrives | {' | '.join(ports)} |", "| --- |" + " --- |" * len(ports)]
    rows += [f"| {label} | {each(request(data))} |" for label, data in REQUESTS]
    for label, reply in ANSWERS:
        upstream.reply = reply
        rows.append(f"| {label} | {each(lambda port: status(exchange(port, get())))} |")
    upstream.reply = OK
    proxied = each(lambda port: server_field(exchange(port, get())))
    rows.append(f"| `Server` on a proxied answer (the upstream sent one) | {proxied} |")
    own = each(lambda port: server_field(exchange(port, get(fields=pad(30)))))
    rows.append(f"| `Server` on the proxy's own refusal | {own} |")
    return rows


def proxies(
    directory: Path, upstreams: list[int], timeout: float, retry: bool = False
) -> dict[str, list[str] | None]:
    """Each proxy's command line, its configuration written under ``directory`` (one
    subdirectory each), in front of ``upstreams``; ``retry``: floodwall with a resource whose
    retry makes 2 attempts, HAProxy with ``option redispatch`` (nginx's default already tries
    the next endpoint on an error)."""
    where = {name: directory / name for name in ("floodwall", "nginx", "HAProxy")}
    for path in where.values():
        path.mkdir(parents=True, exist_ok=True)
    return {
        "floodwall": floodwall(where["floodwall"], PORTS["floodwall"], upstreams, timeout, retry),
        "nginx": nginx(where["nginx"], PORTS["nginx"], upstreams, timeout),
        "HAProxy": haproxy(where["HAProxy"], PORTS["HAProxy"], upstreams, timeout, retry),
    }


PORTS: dict[str, int] = {}


def next_upstream_row(ports: dict[str, int], live: set[str], directory: Path, retry: bool) -> str:
    """nginx-tests proxy_next_upstream.t: the first endpoint refuses connections; four
    requests on fresh connections, each answered by the second one or not."""
    upstream = proxy_cases.Upstream()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
    where = directory / ("next-retry" if retry else "next")
    commands = proxies(where, [dead.getsockname()[1], upstream.port], 2.0, retry)
    try:
        with running(commands, ports):
            said = []
            for name, port in ports.items():
                if name not in live:
                    said.append("-")
                    continue
                statuses = [status(exchange(port, get())) for _ in range(4)]
                said.append(", ".join(statuses))
    finally:
        dead.close()
        upstream.close()
    label = "the first of two endpoints refuses connections: four requests"
    if retry:
        label += " (floodwall `retry: {attempts: 2}`, HAProxy `option redispatch`)"
    return f"| {label} | nginx-tests proxy_next_upstream.t | {' | '.join(said)} |"


def two_endpoint_rows(ports: dict[str, int], live: set[str], directory: Path) -> list[str]:
    """nginx-tests proxy_non_idempotent.t and proxy_next_upstream.t: two endpoints that answer
    alike; which requests a proxy sends to the second, with its defaults and with a retry.
    Each case runs on proxies started for it: a failure one case provoked (nginx's
    ``max_fails=1`` marks an endpoint down for 10 s) must not decide the next case."""
    rows = []
    for retry in (False, True):
        for number, case in enumerate(proxy_cases.TWO_ENDPOINT_CASES):
            upstreams = [proxy_cases.Upstream(), proxy_cases.Upstream()]
            where = directory / f"two-{'retry-' if retry else ''}{number}"
            commands = proxies(where, [u.port for u in upstreams], 2.0, retry)
            try:
                with running(commands, ports):
                    said = [
                        proxy_cases.run_two(port, upstreams, case) if name in live else "-"
                        for name, port in ports.items()
                    ]
            finally:
                for upstream in upstreams:
                    upstream.close()
            label = case.label + (" (with a retry, as above)" if retry else "")
            rows.append(f"| {label} | {case.peer} | {' | '.join(said)} |")
    return rows


def main() -> None:
    upstream = Upstream()
    PORTS.update({name: free_port() for name in ("floodwall", "nginx", "HAProxy")})
    ports = dict(PORTS)
    with tempfile.TemporaryDirectory(prefix="edge-compare-") as where:
        directory = Path(where)
        commands = proxies(directory / "edge", [upstream.port], 5.0)
        live = {name for name, command in commands.items() if command is not None}
        try:
            with running(commands, ports):
                print("\n".join(table(upstream, ports, live)))
        finally:
            upstream.close()
        if "--edge-only" in sys.argv:
            return
        print()
        peers = proxy_cases.Upstream()
        commands = proxies(directory / "cases", [peers.port], proxy_cases.UPSTREAM_TIMEOUT)
        try:
            with running(commands, ports):
                rows = peer_table(peers, ports, live)
        finally:
            peers.close()
        rows.append(next_upstream_row(ports, live, directory, retry=False))
        rows.append(next_upstream_row(ports, live, directory, retry=True))
        rows += two_endpoint_rows(ports, live, directory)
        print("\n".join(rows))


def peer_table(upstream: proxy_cases.Upstream, ports: dict[str, int], live: set[str]) -> list[str]:
    """Issue 20's cases ported from nginx's and HAProxy's tests (``proxy_cases.py``)."""
    rows = [
        f"| case | peer source | {' | '.join(ports)} |",
        "| --- | --- |" + " --- |" * len(ports),
    ]
    for case in proxy_cases.CASES:
        said = [
            proxy_cases.run(ports[name], upstream, case)[0] if name in live else "-"
            for name in ports
        ]
        rows.append(f"| {case.label} | {case.peer} | {' | '.join(said)} |")
    return rows


if __name__ == "__main__":
    main()
