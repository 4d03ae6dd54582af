"""One endpoint of two fails in real ways: floodwall's gateway beside nginx and HAProxy.

    python benchmarks/endpoint_faults.py [--balance least|round-robin] [--only KIND ...]
        [--proxies NAME ...] [--seconds 10]

For each fault kind and each proxy: two endpoint *processes* (:data:`ENDPOINT`,
``fault_endpoint.py``, started with ``subprocess``, so ``SIGSTOP`` and ``SIGKILL`` are real),
the proxy in front of them on loopback, then 100 GET requests/s open-loop for 10 s (the drill's
load generator: each request sent at its time whatever the answers do), the fault on the second
endpoint from second 2 to 7:

* ``frozen``: ``SIGSTOP`` (the kernel still accepts connections into the backlog), ``SIGCONT``;
* ``killed``: ``SIGKILL``, then a new process on the same port;
* ``stall-big`` / ``stall-small``: the answer's head at once, 16 KiB of a 256 KiB body (or
  100 bytes of 1 KiB), then nothing;
* ``slow``: every answer 300 ms late (within every timeout: slow, not dead);
* ``reset``: the connection reset (``SO_LINGER`` 0) once a request was read.

The endpoint switches ``slow``, ``stall-*`` and ``reset`` on at ``SIGUSR1`` and off at
``SIGUSR2``. Printed, as one Markdown table (a row per kind and proxy): requests answered 200
with their whole body, p99 (from each request's scheduled time), the time the faulty endpoint
took to stop affecting requests (the last request slower than :data:`AFFECTED` or failed,
before a second without one), the time after the heal until it answered a request again (from
its own log of the requests it answered, each carrying the load's ``X-Drill-Request``), and
tracebacks in the gateway's standard error. Each proxy is configured alike (see
:func:`command`); ``--balance`` picks least-request (the default, as ``examples/gateway.yaml``)
or round-robin balancing for all three. ``ENDPOINT_FAULTS_DEBUG=1`` prints the times of the
affected requests on standard error. Nothing leaves 127.0.0.1; every process is stopped at the
end, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edge_compare import floodwall_command, free_port, haproxy, nginx, running
from floodwall.drill._record import Recorder
from floodwall.drill.load import Arrival, LoadGenerator
from floodwall.drill.scenario import RouteSpec

ENDPOINT = Path(__file__).with_name("fault_endpoint.py")
"""The endpoint process's script."""

RATE = 100
"""Requests per second, sent on a schedule."""
FAULT_AT, HEAL_AT = 2.0, 7.0
AFFECTED = 0.1
"""Seconds past which a request counts as affected by the fault (loopback answers take about
a millisecond; the fault's timeouts and the slow endpoint's delay are 300 ms and more)."""
QUIET = 1.0
"""Seconds without an affected request that say the proxy stopped sending to the endpoint."""
TRY_TIMEOUT, ROUTE_TIMEOUT, CONNECT_TIMEOUT = 0.5, 1.0, 0.5
"""Seconds: each try's wait for the answer's head and then between two body bytes; the
whole request, all tries; a connection."""
EJECTION = 2.0
"""Seconds an endpoint is out after 5 failures in a row (floodwall's ``base_ejection_time``,
nginx's ``fail_timeout``; HAProxy: two good health checks 1 s apart)."""
CONNECTIONS = 1024
"""nginx's ``worker_connections`` and HAProxy's ``maxconn``: never the limit here (floodwall's
pool allows 1 000 connections)."""
KINDS = ("frozen", "killed", "stall-big", "stall-small", "slow", "reset")
SIGNALLED = {"slow", "stall-big", "stall-small", "reset"}


BALANCE = {
    "least": ("least_request", "least_conn;", "leastconn"),
    "round-robin": ("round_robin", "", "roundrobin"),
}
"""floodwall's, nginx's and HAProxy's balancing, by ``--balance``."""


def floodwall_document(port: int, endpoints: list[int], balance: str) -> dict[str, object]:
    """``examples/gateway.yaml``'s product route, its times scaled to a 10 s run: per-try
    timeout, route timeout, retry with backoff (budget ratio 0.5, as the docs advise for one
    endpoint of two), breaker, least-request balancing, health checks, outlier detection."""
    return {
        "listen": f"127.0.0.1:{port}",
        "admin": None,
        "defaults": {
            "timeout": TRY_TIMEOUT,
            "retry": {
                "attempts": 3,
                "backoff": {"kind": "exponential", "base": "50ms", "cap": "1s"},
                "budget": {"ratio": 0.5},
            },
            "circuit_breaker": {
                "failure_rate": 0.5,
                "minimum_calls": 20,
                "window": "10s",
                "open_duration": "5s",
            },
        },
        "resources": {"product": {"level": 1}},
        "upstreams": {
            "product": {
                "endpoints": [f"http://127.0.0.1:{endpoint}" for endpoint in endpoints],
                "balance": BALANCE[balance][0],
                "connect_timeout": CONNECT_TIMEOUT,
                "read_timeout": TRY_TIMEOUT,
                "health_check": {"path": "/health", "interval": "1s", "timeout": TRY_TIMEOUT},
                "outlier_detection": {
                    "consecutive_5xx": 5,
                    "consecutive_gateway_failures": 5,
                    "base_ejection_time": EJECTION,
                },
            }
        },
        "routes": [
            {
                "match": {"path_prefix": "/"},
                "upstream": "product",
                "resource": "product",
                "timeout": ROUTE_TIMEOUT,
            }
        ],
    }


def ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def command(
    directory: Path, proxy: str, port: int, endpoints: list[int], balance: str
) -> list[str] | None:
    """Each proxy's command line with the same times: a try waits ``TRY_TIMEOUT`` for the head
    and between two body bytes, ``CONNECT_TIMEOUT`` for a connection, ``ROUTE_TIMEOUT`` in all
    (nginx's ``proxy_next_upstream_timeout``); 3 tries at most, each failed one on the other
    endpoint (nginx ``proxy_next_upstream error timeout``, HAProxy ``retries 2`` + ``option
    redispatch`` + ``retry-on``); 5 failures in a row take an endpoint out (nginx ``max_fails``,
    HAProxy ``observe layer7`` + ``on-error mark-down``); the same balancing. Its
    configuration is written in ``directory``; ``None`` when it is not installed."""
    if proxy == "floodwall":
        return floodwall_command(directory, floodwall_document(port, endpoints, balance))
    location = (
        'proxy_http_version 1.1; proxy_set_header Connection ""; '
        f"proxy_connect_timeout {ms(CONNECT_TIMEOUT)}; proxy_send_timeout {ms(TRY_TIMEOUT)}; "
        "proxy_next_upstream error timeout; proxy_next_upstream_tries 3; "
        f"proxy_next_upstream_timeout {ms(ROUTE_TIMEOUT)};"
    )
    backend = (
        f"  balance {BALANCE[balance][2]}\n  retries 2\n"
        "  retry-on conn-failure empty-response response-timeout\n"
        "  option httpchk GET /health\n  http-reuse safe\n"
    )
    check = "check inter 1s fall 3 rise 2 observe layer7 error-limit 5 on-error mark-down"
    if proxy == "nginx":
        return nginx(
            directory,
            port,
            endpoints,
            TRY_TIMEOUT,
            server=f"max_fails=5 fail_timeout={EJECTION:g}s",
            upstream=f"{BALANCE[balance][1]} keepalive 32;",
            location=location,
            connections=CONNECTIONS,
        )
    return haproxy(
        directory,
        port,
        endpoints,
        TRY_TIMEOUT,
        retry=True,
        connect=CONNECT_TIMEOUT,
        server=check,
        backend=backend,
        connections=CONNECTIONS,
    )


class Endpoints:
    """The two endpoint processes (the second one faulty), their logs in ``directory``."""

    def __init__(self, directory: Path, kind: str) -> None:
        self.directory = directory
        self.kind = kind
        self.ports = [free_port(), free_port()]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.faulty = self._start(1)
        self.procs.insert(0, self._start(0))

    def log(self, index: int) -> Path:
        return self.directory / f"endpoint{index}.log"

    def _start(self, index: int) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            str(ENDPOINT),
            str(self.ports[index]),
            self.kind,
            str(self.log(index)),
        ]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def fault(self) -> None:
        if self.kind == "frozen":
            self.faulty.send_signal(signal.SIGSTOP)
        elif self.kind == "killed":
            self.faulty.send_signal(signal.SIGKILL)
            self.faulty.wait(5)
        else:
            self.faulty.send_signal(signal.SIGUSR1)

    def heal(self) -> None:
        if self.kind == "frozen":
            self.faulty.send_signal(signal.SIGCONT)
        elif self.kind == "killed":
            self.faulty = self._start(1)
        else:
            self.faulty.send_signal(signal.SIGUSR2)

    def answered(self, index: int) -> list[int]:
        """The load's request ids the endpoint answered (all its processes)."""
        text = self.log(index).read_text(encoding="utf-8") if self.log(index).exists() else ""
        return [int(line) for line in text.split() if line.isdigit()]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def endpoints(directory: Path, kind: str) -> Iterator[Endpoints]:
    pair = Endpoints(directory, kind)
    try:
        yield pair
    finally:
        pair.stop()


@dataclass(frozen=True)
class Row:
    proxy: str
    ok: float
    p99: float
    ejected: str
    back: str
    affected: int
    tracebacks: str


async def load(port: int, pair: Endpoints, path: str, seconds: float) -> Recorder:
    """The open-loop load, the fault switched on at :data:`FAULT_AT` and off at
    :data:`HEAL_AT` (from the load's origin)."""
    route = RouteSpec(path=path, calls=("endpoint",))
    schedule = [Arrival(n + 1, n / RATE, route) for n in range(int(RATE * seconds))]
    recorder = Recorder()
    generator = LoadGenerator(
        schedule, f"http://127.0.0.1:{port}", timeout=5.0, max_in_flight=500, recorder=recorder
    )

    async def faults() -> None:
        await asyncio.sleep(max(0.0, recorder.origin + FAULT_AT - time.monotonic()))
        pair.fault()
        await asyncio.sleep(max(0.0, recorder.origin + HEAL_AT - time.monotonic()))
        pair.heal()

    await asyncio.gather(generator.run(), faults())
    return recorder


def figures(
    proxy: str, recorder: Recorder, pair: Endpoints, seconds: float, log: Path | None
) -> Row:
    requests = sorted(recorder.requests, key=lambda r: r.id)
    took = sorted(r.end - (r.id - 1) / RATE for r in requests)
    p99 = took[min(len(took) - 1, int(0.99 * len(took)))] if took else float("nan")
    ok = sum(1 for r in requests if r.ok) / max(1, int(RATE * seconds))
    hit = [
        (r.id - 1) / RATE
        for r in requests
        if FAULT_AT <= (r.id - 1) / RATE < HEAL_AT
        and (not r.ok or r.end - (r.id - 1) / RATE > AFFECTED)
    ]
    if os.environ.get("ENDPOINT_FAULTS_DEBUG"):
        print(proxy, [f"{t:.2f}" for t in hit], file=sys.stderr)
    ejected = "no request affected"
    if hit:
        ejected = f"never (in {HEAL_AT - FAULT_AT:g} s)"
        for before, after in zip(hit, [*hit[1:], HEAL_AT], strict=True):
            if after - before >= QUIET:
                ejected = f"{before - FAULT_AT:.2f} s"
                break
    later = [(n - 1) / RATE - HEAL_AT for n in pair.answered(1) if (n - 1) / RATE >= HEAL_AT]
    back = f"{min(later):.2f} s" if later else f"> {seconds - HEAL_AT:g} s"
    tracebacks = "-"
    if log is not None and log.exists():
        tracebacks = str(log.read_text(encoding="utf-8", errors="replace").count("Traceback"))
    return Row(proxy, ok, p99, ejected, back, len(hit), tracebacks)


PROXIES = ("floodwall", "nginx", "HAProxy")


def run_kind(
    kind: str, directory: Path, seconds: float, proxies: list[str], balance: str
) -> list[Row]:
    path = {"stall-big": "/big", "stall-small": "/small"}.get(kind, "/item")
    rows = []
    for proxy in proxies:
        where = directory / kind / proxy
        where.mkdir(parents=True)
        with endpoints(where, kind) as pair:
            ports = {proxy: free_port()}
            argv = command(where, proxy, ports[proxy], pair.ports, balance)
            if argv is None:
                continue
            with running({proxy: argv}, ports, logs=where):
                time.sleep(1.5)  # the first health checks
                recorder = asyncio.run(load(ports[proxy], pair, path, seconds))
            log = where / "floodwall.log" if proxy == "floodwall" else None
            rows.append(figures(proxy, recorder, pair, seconds, log))
    return rows


HEADER = (
    "| fault | proxy | answered 200 | p99 | fault stops affecting requests after "
    "| back after the heal | requests affected | tracebacks |"
)


def table(kind: str, rows: list[Row]) -> list[str]:
    return [
        f"| {kind} | {row.proxy} | {row.ok:.1%} | {row.p99 * 1000:.0f} ms | {row.ejected} "
        f"| {row.back} | {row.affected} | {row.tracebacks} |"
        for row in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", nargs="*", choices=KINDS, default=list(KINDS))
    parser.add_argument("--proxies", nargs="*", choices=PROXIES, default=list(PROXIES))
    parser.add_argument("--balance", choices=list(BALANCE), default="least")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(HEADER, "| --- | --- |" + " ---: |" * 6, sep="\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="endpoint-faults-") as where:
        for kind in args.only:
            rows = run_kind(kind, Path(where), args.seconds, args.proxies, args.balance)
            print("\n".join(table(kind, rows)), flush=True)


if __name__ == "__main__":
    main()
