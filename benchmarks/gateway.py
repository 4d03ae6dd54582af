"""The floodwall gateway beside its old revision, nginx, HAProxy, a bare aiohttp proxy and no proxy.

Standalone: ``python benchmarks/gateway.py [--seconds 5] [--rounds 5] [--old DIR]
[--workers] [--write docs/gateway.md]``. Starts, on loopback free ports, a fast upstream, the
gateway with a typical policy set (route timeout, breaker, retry with budget, per-try timeout,
bulkhead, per-client rate limit, outlier detection), the same gateway from an older checkout
(``--old DIR``: a checkout's root, run with ``PYTHONPATH=DIR/src``; make one with
``git worktree add /tmp/gw-old f9b4933``), a bare 30-line aiohttp pass-through proxy, nginx
and HAProxy (Debian's packages, when installed; each with its own configuration in a
temporary directory, never the system service: one worker, keep-alive to the upstream, no
logs), then:

1. **saturation**: closed-loop load with ``wrk`` (or a Python generator without it); requests/s,
   and the CPU each proxy process spent per request (``/proc``: user + system time, the figure
   that survives a noisy shared machine);
2. **latency at a fixed rate**: half of the bare proxy's saturation rate, open-loop (requests
   are sent on a schedule, latency counted from the scheduled time: no coordinated omission),
   after a warm-up at the same rate; p50/p99, and the latency each proxy adds over calling the
   upstream directly *in the same round*.

Both run in ``--rounds`` rounds, the targets interleaved (the order rotates each round), so a
burst of outside load hits one round of every target rather than all of one target; the table
gives the median over rounds, and each measurement first waits (a while) for the rest of the
machine to be quiet. The load generator runs with its garbage collector off: it is the
instrument, its pauses are not the proxy's. ``--pin`` puts the proxies on one CPU and the
upstream and load generator on another. ``--workers`` adds floodwall with ``workers: 2``
(CPU summed over its processes); on a machine with fewer than 4 CPUs the load generator and
the upstream cannot be kept off the workers' CPUs, which the report says.

``--instructions`` instead counts the user-space instructions per request of this gateway (and
of ``--old``) under ``valgrind --tool=callgrind``: sequential keep-alive requests, counted
between ``callgrind_control -i on`` and ``off``, so the figure does not move with the
machine's load.

Targets (issue 20): CPU per request <= 0.5 x the old revision's and <= 3.5 x nginx's; added
p99 <= 2 ms at half the bare proxy's saturation rate. Every process is stopped at the end,
whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

UPSTREAM = r"""
import asyncio, sys
BODY = b'{"ok":true,"item":"' + b"x" * 200 + b'"}'
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(BODY))
class Upstream(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""
    def data_received(self, data):
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            _, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            self.transport.write(HEAD + BODY)
async def main():
    server = await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""

BARE_PROXY = r"""
import sys, aiohttp
from aiohttp import web
UPSTREAM = sys.argv[2]
HOP = {"host", "connection", "keep-alive", "transfer-encoding", "content-length"}
async def proxy(request):
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    data = request.content if request.body_exists else None
    async with request.app["session"].request(
        request.method, UPSTREAM + request.path_qs, headers=headers, data=data
    ) as upstream:
        response = web.StreamResponse(status=upstream.status, headers={
            k: v for k, v in upstream.headers.items() if k.lower() not in HOP})
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response
async def session(app):
    app["session"] = aiohttp.ClientSession(auto_decompress=False)
    yield
    await app["session"].close()
app = web.Application()
app.cleanup_ctx.append(session)
app.router.add_route("*", "/{path:.*}", proxy)
try:
    import uvloop
    loop = uvloop.new_event_loop()
except ImportError:
    loop = None
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None, loop=loop)
"""

NGINX = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream app {{ server 127.0.0.1:{upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""

HAPROXY = """
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    http-reuse always
frontend edge
    bind 127.0.0.1:{port}
    default_backend app
backend app
    server one 127.0.0.1:{upstream}
"""

MAX_CONNECTIONS = 128
"""Connections the latency generator opens at most (wrk2 keeps a fixed set too); past it a
request waits for one, the wait counted in its latency."""
MARK_START = "<!-- bench:gateway:start -->"
MARK_END = "<!-- bench:gateway:end -->"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s")


def gateway_config(port: int, upstream: int) -> dict[str, object]:
    """The "typical policy set" the targets are about."""
    return {
        "listen": f"127.0.0.1:{port}",
        "admin": None,
        "upstreams": {
            "app": {"endpoints": [f"http://127.0.0.1:{upstream}"], "balance": "least_request"}
        },
        "resources": {
            "app": {
                "timeout": "2s",
                "retry": {"attempts": 2},
                "circuit_breaker": {"minimum_calls": 20, "failure_rate": 0.5},
                "bulkhead": {"max_concurrent": 1000},
            }
        },
        "routes": [
            {
                "name": "app",
                "match": {"path_prefix": "/"},
                "upstream": "app",
                "resource": "app",
                "timeout": "5s",
                "rate_limit": {"rate": "1000000/s", "key": "client_ip"},
            }
        ],
    }


@dataclass
class Target:
    name: str
    port: int
    pid: int | None  # the proxy process whose CPU we count (None: the upstream itself)
    family: bool = False  # count its children's CPU too (a supervisor and its workers)


def cpu_sets(pin: bool) -> tuple[set[int], set[int]] | None:
    """``(load CPUs, proxy CPUs)`` when pinning: the first CPU we may use for the upstream and
    the load generators, the next for the proxies; ``None`` to let the kernel place them."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None
    return {cpus[0]}, {cpus[1]}


@dataclass
class Options:
    with_nginx: bool = True
    with_haproxy: bool = True
    old: Path | None = None
    workers: bool = False


@contextlib.contextmanager
def processes(
    workdir: Path, options: Options, cpus: tuple[set[int], set[int]] | None = None
) -> Iterator[list[Target]]:
    started: list[subprocess.Popen[bytes]] = []
    log = (workdir / "processes.log").open("wb")
    if cpus is not None:
        os.sched_setaffinity(0, cpus[0])  # this process, the upstream and wrk: the load CPU

    def spawn(*command: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        started.append(proc)
        return proc

    def proxy(pid: int) -> int:
        if cpus is not None:
            os.sched_setaffinity(pid, cpus[1])
        return pid

    def floodwall(name: str, upstream: int, src: Path | None, workers: int = 1) -> Target:
        port = free_port()
        config = workdir / f"gateway-{port}.json"
        config.write_text(json.dumps({**gateway_config(port, upstream), "workers": workers}))
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = str(src)
        proc = spawn(sys.executable, "-m", "floodwall.gateway", "-c", str(config), env=env)
        wait_port(port)
        return Target(name, port, proxy(proc.pid), family=workers > 1)

    try:
        upstream = free_port()
        spawn(sys.executable, "-c", UPSTREAM, str(upstream))
        wait_port(upstream)
        targets = [Target("direct (no proxy)", upstream, None)]
        bare = free_port()
        proc = spawn(sys.executable, "-c", BARE_PROXY, str(bare), f"http://127.0.0.1:{upstream}")
        wait_port(bare)
        targets.append(Target("bare aiohttp proxy", bare, proxy(proc.pid)))
        targets.append(floodwall("floodwall gateway", upstream, None))
        if options.old is not None:
            targets.append(floodwall(OLD, upstream, options.old / "src"))
        if options.workers:
            targets.append(floodwall("floodwall, 2 workers", upstream, None, workers=2))
        targets.extend(
            Target(peer.name, peer.port, proxy(peer.pid or 0))
            for peer in _peers(workdir, options, upstream, spawn)
        )
        yield targets
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.close()


OLD = "floodwall, old revision"


def _binary(name: str) -> str | None:
    return shutil.which(name) or (
        f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None
    )


def _peers(
    workdir: Path,
    options: Options,
    upstream: int,
    spawn: Callable[..., subprocess.Popen[bytes]],
) -> list[Target]:
    """nginx and HAProxy in front of ``upstream``, each on its own configuration (the process
    whose CPU counts: nginx's one worker, HAProxy's one process)."""
    peers = []
    nginx = _binary("nginx")
    if options.with_nginx and nginx:
        port = free_port()
        conf = workdir / "nginx.conf"
        conf.write_text(NGINX.format(dir=workdir, upstream=upstream, port=port))
        proc = spawn(nginx, "-c", str(conf), "-p", str(workdir))
        wait_port(port)
        peers.append(Target("nginx", port, _nginx_worker(proc.pid)))
    haproxy = _binary("haproxy")
    if options.with_haproxy and haproxy:
        port = free_port()
        conf = workdir / "haproxy.cfg"
        conf.write_text(HAPROXY.format(upstream=upstream, port=port))
        proc = spawn(haproxy, "-db", "-f", str(conf))
        wait_port(port)
        peers.append(Target("HAProxy", port, proc.pid))
    return peers


def _nginx_worker(master: int) -> int:
    time.sleep(0.2)
    children = Path(f"/proc/{master}/task/{master}/children")
    with contextlib.suppress(OSError, ValueError):
        return int(children.read_text().split()[0])
    return master


def cpu_ticks(pid: int | None, family: bool = False) -> int:
    """User + system CPU ticks of ``pid`` (and of its descendants with ``family``)."""
    return sum(user_system_ticks(pid, family))


def user_system_ticks(pid: int | None, family: bool = False) -> tuple[int, int]:
    """User and system CPU ticks of ``pid`` (and of its descendants with ``family``), apart:
    on loopback a write also pays for waking its reader, so the two tell different stories."""
    if pid is None:
        return 0, 0
    user = system = 0
    for each in _family(pid) if family else [pid]:
        with contextlib.suppress(OSError, ValueError):
            fields = Path(f"/proc/{each}/stat").read_text().rpartition(")")[2].split()
            user += int(fields[11])
            system += int(fields[12])
    return user, system


def target_ticks(target: Target) -> tuple[int, int]:
    return user_system_ticks(target.pid, target.family)


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (the benchmark's own processes)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        with contextlib.suppress(OSError, ValueError):
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
            queue.extend(int(c) for c in children)
    return found


def _busy_ticks() -> int:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return user + nice + system + irq + softirq + steal


def outside_load(interval: float = 0.5) -> float:
    """CPUs kept busy by processes other than the benchmark's over ``interval`` seconds."""
    ours = _family(os.getpid())
    busy, mine = _busy_ticks(), sum(_ticks(p) for p in ours)
    time.sleep(interval)
    busy, mine = _busy_ticks() - busy, sum(_ticks(p) for p in ours) - mine
    return max(0.0, (busy - mine) / os.sysconf("SC_CLK_TCK") / interval)


def _ticks(pid: int) -> int:
    with contextlib.suppress(OSError):
        return cpu_ticks(pid)
    return 0


QUIET_LOAD = 0.25
"""Outside load (CPUs) under which a round may start."""
QUIET_PATIENCE = 20.0
"""Seconds a round waits for the machine to be quiet before it runs anyway."""


def wait_quiet() -> float:
    """Wait (at most ``QUIET_PATIENCE``) until other work on the machine keeps less than
    ``QUIET_LOAD`` CPUs busy; the outside load when the round starts."""
    deadline = time.monotonic() + QUIET_PATIENCE
    load = outside_load()
    while load > QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(1.0)
        load = outside_load()
    return load


def saturate(port: int, seconds: float) -> tuple[float, int]:
    """Closed-loop load: ``(requests/s, requests)``."""
    if shutil.which("wrk"):
        out = subprocess.run(
            ["wrk", "-t1", "-c32", f"-d{seconds:g}s", f"http://127.0.0.1:{port}/item"],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 30,
        ).stdout
        rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
        count = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
        return rate, count
    return _run(_closed_loop(port, seconds))


async def _closed_loop(port: int, seconds: float) -> tuple[float, int]:
    import aiohttp

    done = 0
    stop = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.monotonic() < stop:
            async with session.get(f"http://127.0.0.1:{port}/item") as answer:
                await answer.read()
            done += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as session:
        await asyncio.gather(*(worker(session) for _ in range(32)))
    return done / seconds, done


class _Client(asyncio.Protocol):
    """One keep-alive connection of the load generator: a raw HTTP/1.1 client that knows just
    enough (Content-Length or chunked answers) and costs a fraction of a full client, so the
    generator is not what limits the measured latency."""

    request = b"GET /item HTTP/1.1\r\nHost: bench\r\n\r\n"

    def __init__(self, idle: asyncio.Queue[_Client], latencies: list[float]) -> None:
        self.idle = idle
        self.latencies = latencies
        self.buffer = b""
        self.scheduled = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def send(self, scheduled: float) -> None:
        assert self.transport is not None
        self.scheduled = scheduled
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, body = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        match = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
        if match is not None:
            if len(body) < int(match.group(1)):
                return
        elif not body.endswith(b"0\r\n\r\n"):
            return
        self.buffer = b""
        self.latencies.append(time.perf_counter() - self.scheduled)
        self.idle.put_nowait(self)


async def fixed_rate(port: int, rate: float, seconds: float, warmup: float = 1.0) -> list[float]:
    """Open-loop load at ``rate`` requests/s for ``warmup + seconds``; the latencies of the last
    ``seconds``, each from its request's scheduled time (a request waiting for a free connection
    waits on the clock too: no coordinated omission)."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    idle: asyncio.Queue[_Client] = asyncio.Queue()
    opened: list[_Client] = []

    async def connection() -> _Client:
        _, client = await loop.create_connection(
            lambda: _Client(idle, latencies), "127.0.0.1", port
        )
        opened.append(client)
        return client

    for _ in range(32):
        idle.put_nowait(await connection())
    clock = time.perf_counter  # (uvloop's loop.time() ticks in whole milliseconds)
    start = clock() + 0.05
    total = int(rate * (warmup + seconds))
    for index in range(total):
        scheduled = start + index / rate
        delay = scheduled - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if not idle.empty() or len(opened) >= MAX_CONNECTIONS:
            try:  # at the cap a request waits, and its wait counts
                client = await asyncio.wait_for(idle.get(), 5.0)
            except TimeoutError:
                client = await connection()
        else:
            client = await connection()
        if client.transport is None or client.transport.is_closing():
            client = await connection()
        client.send(scheduled)
    deadline = clock() + 30
    while len(latencies) < total and clock() < deadline:  # noqa: ASYNC110 - a bounded drain
        await asyncio.sleep(0.01)
    for client in opened:
        if client.transport is not None:
            client.transport.close()
    return latencies[int(rate * warmup) :]


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on uvloop when installed (the generator must cost as little as it can)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def rotated(items: Sequence[T], by: int) -> list[T]:
    """``items`` starting at ``by`` (mod its length): each round its own order."""
    by %= len(items)
    return [*items[by:], *items[:by]]


def latency_round(port: int, rate: float, seconds: float) -> tuple[float, float]:
    """``(p50, p99)`` in ms of one open-loop measurement, the generator's collector off."""
    gc.disable()
    try:
        latencies = _run(fixed_rate(port, rate, seconds))
    finally:
        gc.enable()
    return pct(latencies, 0.5), pct(latencies, 0.99)


Rounds = dict[str, dict[str, list[float]]]
"""target → figure → one value per round."""


def run(seconds: float, rounds: int, options: Options, pin: bool) -> str:
    cpus = cpu_sets(pin)
    loads = [os.getloadavg()[0]]
    with (
        tempfile.TemporaryDirectory(prefix="floodwall-bench-") as tmp,
        processes(Path(tmp), options, cpus) as targets,
    ):
        data: Rounds = {t.name: {} for t in targets}
        for target in targets:
            saturate(target.port, 1.0)  # warm-up
        outside: list[float] = []
        for index in range(rounds):
            for target in rotated(targets, index):
                outside.append(wait_quiet())
                user, system = target_ticks(target)
                rate, count = saturate(target.port, seconds)
                after = target_ticks(target)
                tick_us = 1e6 / os.sysconf("SC_CLK_TCK") / count if target.pid else math.nan
                row = data[target.name]
                row.setdefault("rps", []).append(rate)
                row.setdefault("user_us", []).append((after[0] - user) * tick_us)
                row.setdefault("sys_us", []).append((after[1] - system) * tick_us)
                row.setdefault("cpu_us", []).append(row["user_us"][-1] + row["sys_us"][-1])
        half = statistics.median(data["bare aiohttp proxy"]["rps"]) / 2
        for index in range(rounds):
            for target in rotated(targets, index):
                outside.append(wait_quiet())
                user, system = target_ticks(target)
                p50, p99 = latency_round(target.port, half, seconds)
                after = target_ticks(target)
                sent = half * (seconds + 1.0)  # with the warm-up
                tick_us = 1e6 / os.sysconf("SC_CLK_TCK") / sent if target.pid else math.nan
                row = data[target.name]
                row.setdefault("user_fixed", []).append((after[0] - user) * tick_us)
                row.setdefault("sys_fixed", []).append((after[1] - system) * tick_us)
                row.setdefault("cpu_fixed", []).append(row["user_fixed"][-1] + row["sys_fixed"][-1])
                data[target.name].setdefault("p50", []).append(p50)
                data[target.name].setdefault("p99", []).append(p99)
            loads.append(os.getloadavg()[0])
    return report(data, half, seconds, rounds, cpus, outside, loads)


def report(  # noqa: PLR0917 - one figure per argument, from run() only
    data: Rounds,
    half: float,
    seconds: float,
    rounds: int,
    cpus: tuple[set[int], set[int]] | None,
    outside: list[float],
    loads: list[float],
) -> str:
    direct = data["direct (no proxy)"]
    for row in data.values():  # added latency: against the direct figure of the same round
        row["added50"] = [a - b for a, b in zip(row["p50"], direct["p50"], strict=True)]
        row["added99"] = [a - b for a, b in zip(row["p99"], direct["p99"], strict=True)]
    med = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in data.items()}
    placement = (
        f"proxies pinned to CPU {min(cpus[1])}, upstream and load generator to CPU {min(cpus[0])}"
        if cpus is not None
        else "load generator, upstream and proxies sharing every CPU"
    )
    tool = "wrk -t1 -c32" if shutil.which("wrk") else "a Python closed loop (32)"
    lines = [
        f"Loopback, one run of {rounds} interleaved round(s), {os.cpu_count()} CPU(s) "
        f"({placement}); per round: saturation with {tool} for {seconds:g} s, then latency "
        f"open-loop at {half:.0f} req/s (half the bare proxy's median saturation) for "
        f"{seconds:g} s after a 1 s warm-up. Medians over the rounds; CPU is user + system "
        f"time of the proxy's process(es) per request. Each measurement waits (up to "
        f"{QUIET_PATIENCE:g} s) for other work on the machine to fall under {QUIET_LOAD:g} "
        f"CPU; outside load at the starts: median {statistics.median(outside):.2f}, max "
        f"{max(outside):.2f} CPU; load average (1 min) from {min(loads):.1f} to "
        f"{max(loads):.1f}.",
        "",
        "| target | req/s (saturation) | CPU µs/req | user + system µs | CPU µs/req at the fixed "
        "rate | user + system µs | p50 ms | p99 ms | added p50 ms | added p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, fig in med.items():
        cpu = "–" if math.isnan(fig["cpu_us"]) else f"{fig['cpu_us']:.0f}"
        split = "–" if math.isnan(fig["cpu_us"]) else f"{fig['user_us']:.0f} + {fig['sys_us']:.0f}"
        fixed = "–" if math.isnan(fig["cpu_fixed"]) else f"{fig['cpu_fixed']:.0f}"
        fixed_split = (
            "–"
            if math.isnan(fig["cpu_fixed"])
            else f"{fig['user_fixed']:.0f} + {fig['sys_fixed']:.0f}"
        )
        first = name == "direct (no proxy)"
        added50 = "–" if first else f"{fig['added50']:+.2f}"
        added99 = "–" if first else f"{fig['added99']:+.2f}"
        lines.append(
            f"| {name} | {fig['rps']:.0f} | {cpu} | {split} | {fixed} | {fixed_split} "
            f"| {fig['p50']:.2f} "
            f"| {fig['p99']:.2f} | {added50} | {added99} |"
        )
    lines += ["", *_verdicts(data, med, half)]
    return "\n".join(lines)


def _ratio_line(label: str, mine: list[float], theirs: list[float], target: float) -> str:
    """Median of ``mine`` over median of ``theirs`` against ``target``, with the rounds."""
    ratio = statistics.median(mine) / statistics.median(theirs)
    rounds = ", ".join(f"{a / b:.2f}" for a, b in zip(mine, theirs, strict=True))
    verdict = "PASS" if ratio <= target else "FAIL"
    return (
        f"* CPU per request, {label}: **{ratio:.2f} x** (target <= {target:g}: **{verdict}**); "
        f"per round: {rounds}"
    )


def _verdicts(data: Rounds, med: dict[str, dict[str, float]], half: float) -> list[str]:
    gateway = data["floodwall gateway"]
    out = []
    if OLD in data:
        out.append(
            _ratio_line("floodwall / its old revision", gateway["cpu_us"], data[OLD]["cpu_us"], 0.5)
        )
    if "nginx" in data:
        out.append(
            _ratio_line("floodwall / nginx", gateway["cpu_us"], data["nginx"]["cpu_us"], 3.5)
        )
    if "HAProxy" in data:
        ratio = med["floodwall gateway"]["cpu_us"] / med["HAProxy"]["cpu_us"]
        out.append(f"* CPU per request, floodwall / HAProxy: {ratio:.2f} x")
    fixed = [  # every target at one request rate: a slower proxy's peers wait idle more often
        f"{other} {med['floodwall gateway']['cpu_fixed'] / med[name]['cpu_fixed']:.2f} x"
        for name, other in ((OLD, "its old revision"), ("nginx", "nginx"), ("HAProxy", "HAProxy"))
        if name in med
    ]
    if fixed:
        out.append(
            f"* CPU per request at the fixed rate ({half:.0f} req/s for every target), "
            f"floodwall / {', / '.join(fixed)}"
        )
    added = med["floodwall gateway"]["added99"]
    rounds_added = ", ".join(f"{a:+.2f}" for a in gateway["added99"])
    out.append(
        f"* added p99 at {half:.0f} req/s: **{added:.2f} ms** (target <= 2 ms: "
        f"**{'PASS' if added <= 2.0 else 'FAIL'}**); per round: {rounds_added}"
    )
    two = "floodwall, 2 workers"
    if two in data:
        gain = med[two]["rps"] / med["floodwall gateway"]["rps"]
        cores = len(os.sched_getaffinity(0))
        where = (
            "the load generator and the upstream share the workers' CPUs"
            if cores < 4
            else "every process may use every CPU"
        )
        out.append(
            f"* 2 workers / 1 worker, requests/s: {gain:.2f} x on {cores} CPU(s) ({where}; "
            f"pinning them apart takes at least 4 CPUs), CPU per request "
            f"{med[two]['cpu_us']:.0f} µs against {med['floodwall gateway']['cpu_us']:.0f}"
        )
    return out


INSTRUCTION_WARMUP = 500
INSTRUCTION_REQUESTS = 2000


def sequential(port: int, count: int) -> None:
    """``count`` GETs one after the other on one keep-alive connection."""
    request = b"GET /item HTTP/1.1\r\nHost: bench\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for _ in range(count):
            sock.sendall(request)
            data = b""
            while True:
                data += sock.recv(65536)
                head, sep, body = data.partition(b"\r\n\r\n")
                found = re.search(rb"(?i)content-length:\s*(\d+)", head) if sep else None
                if found is not None and len(body) >= int(found.group(1)):
                    break


def instructions(src: Path | None, workdir: Path) -> float:
    """User-space instructions per request of the gateway of ``src`` (``None``: this one) under
    callgrind: :data:`INSTRUCTION_REQUESTS` sequential keep-alive requests after
    :data:`INSTRUCTION_WARMUP` of warm-up, counted from the first to the last of them
    (``callgrind_control -i on/off``): no other load enters the count."""
    upstream, port = free_port(), free_port()
    config = workdir / f"callgrind-{port}.json"
    config.write_text(json.dumps(gateway_config(port, upstream)))
    out = workdir / f"callgrind-{port}.out"
    env = dict(os.environ, PYTHONHASHSEED="0")
    if src is not None:
        env["PYTHONPATH"] = str(src)
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    command += [sys.executable, "-m", "floodwall.gateway", "-c", str(config)]
    with contextlib.ExitStack() as stack:
        up = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(upstream)])
        stack.callback(_end, up)
        wait_port(upstream)
        gateway = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        stack.callback(_end, gateway)
        wait_port(port, timeout=300)
        sequential(port, INSTRUCTION_WARMUP)
        control = ["callgrind_control"]
        subprocess.run([*control, "-i", "on", str(gateway.pid)], check=True, capture_output=True)
        sequential(port, INSTRUCTION_REQUESTS)
        subprocess.run([*control, "-i", "off", str(gateway.pid)], check=True, capture_output=True)
        subprocess.run([*control, "-d", str(gateway.pid)], check=True, capture_output=True)
    total = 0
    for dump in workdir.glob(f"callgrind-{port}.out*"):
        for line in dump.read_text().splitlines():
            if line.startswith("totals:"):
                total = max(total, int(line.split()[1]))
    return total / INSTRUCTION_REQUESTS


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def instruction_report(old: Path | None) -> str:
    with tempfile.TemporaryDirectory(prefix="floodwall-callgrind-") as tmp:
        new = instructions(None, Path(tmp))
        before = instructions(old / "src", Path(tmp)) if old is not None else None
    line = f"* user-space instructions per request (callgrind): this revision {new / 1000:.0f} k"
    if before is not None:
        line += f", the old revision {before / 1000:.0f} k ({new / before:.2f} x)"
    return line


def write(path: Path, table: str) -> None:
    text = path.read_text(encoding="utf-8")
    block = f"{MARK_START}\n{table}\n{MARK_END}"
    if MARK_START in text and MARK_END in text:
        head, _, rest = text.partition(MARK_START)
        _, _, tail = rest.partition(MARK_END)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement (default 5)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--no-nginx", action="store_true", help="leave nginx out")
    parser.add_argument("--no-haproxy", action="store_true", help="leave HAProxy out")
    parser.add_argument("--old", type=Path, help="also run the gateway of this checkout")
    parser.add_argument("--workers", action="store_true", help="also run it with 2 workers")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="only count instructions per request under callgrind (this and --old)",
    )
    parser.add_argument("--pin", action="store_true", help="proxies on one CPU, load on another")
    parser.add_argument("--write", type=Path, help="put the table into this Markdown file")
    args = parser.parse_args()
    if args.instructions:
        print(instruction_report(args.old))
        return
    options = Options(
        with_nginx=not args.no_nginx,
        with_haproxy=not args.no_haproxy,
        old=args.old,
        workers=args.workers,
    )
    table = run(args.seconds, args.rounds, options, args.pin)
    print(table)
    if args.write is not None:
        write(args.write, table)
        print(f"\nwritten to {args.write}")


if __name__ == "__main__":
    main()
