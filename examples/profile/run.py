"""The profile example in one command: Redis, three services, the gateway, a drill, and stop.

    .venv/bin/python examples/profile/run.py            # about 25 s
    .venv/bin/python examples/profile/run.py --quick    # about 24 s (what the tests run)

1. a throwaway ``redis-server`` on a free 127.0.0.1 port (never 6379), without persistence;
2. ``users`` and ``posts``, then ``profile`` (FastAPI under uvicorn, each on a free port, each
   with floodwall's inbound guard and a drill agent, ``FLOODWALL_CHAOS=1``);
3. the floodwall gateway (``python -m floodwall.gateway``) with ``gateway.yaml``'s routes and
   global rate limits, its addresses and store replaced by the ones started here;
4. a 2xx through every route (readiness), then bursts on every route until three in a row
   all succeed (warm connection pools at every hop), then ``drill.yaml`` through the gateway,
   run by ``floodwall drill``'s own code: its progress, the table of figures ``floodwall
   demo`` prints, the HTML report, the ``expect`` checks;
5. what the global limits did in Redis; then every process is stopped by its pid (also on
   Ctrl-C, SIGTERM or a failure), and the exit status is the drill's (130 when interrupted).

Logs of every process are in the work directory printed at the start (kept with ``--keep``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

from floodwall.config import parse_duration
from floodwall.drill.cli import drill

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"
START_TIMEOUT = 30.0
"""Seconds each process gets to answer (the first imports are slow on a busy machine)."""
STOP_TIMEOUT = 10.0
QUICK = {"warmup": "2s", "drain": "2s", "load": {"duration": "16s", "rate": 60}, "fault": (4, 8)}
"""``--quick``: shorter phases and less load, the same story (the load lasts 8 s past the
fault, for recovery to be seen holding; 2 s of it at the full rate before the *before* window,
as the long run's 1.5 s at 80 requests/s)."""
WARM_BURST = 10
"""Requests sent at once on each route by the warm-up: more than the load keeps in flight (60
to 80 requests/s answered in 10 to 150 ms), so every hop's pool holds the connections it needs."""
WARM_ROUNDS = 3
"""Bursts in a row that must all get a 2xx on every route before the drill starts."""


def free_port() -> int:
    """A free loopback port (bound and released: a process that loses the race is restarted
    on another by :meth:`Fleet.start_until_up`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class Process:
    """One child process with its log file; stopped by its pid, SIGTERM then SIGKILL."""

    def __init__(self, name: str, command: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(  # noqa: S603 - our own commands
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C reaches us; we stop the children in order
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> bool:
        return self.popen.poll() is not None

    def tail(self) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return text[-3000:]

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(STOP_TIMEOUT)


class Fleet:
    """Every process this run started, stopped in reverse order."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: list[Process] = []
        self.admin_url = ""
        """The gateway's admin API, once it runs."""
        self.env = dict(os.environ, FLOODWALL_CHAOS="1", PYTHONUNBUFFERED="1")

    def spawn(self, name: str, command: list[str], **env: str) -> Process:
        process = Process(name, command, self.workdir / f"{name}.log", {**self.env, **env})
        self.processes.append(process)
        return process

    def wait(self, process: Process, ready: Callable[[], bool]) -> bool:
        """Until ``ready()`` (True) or the process exits (False); raises after the timeout."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if process.exited():
                return False
            try:
                if ready():
                    return True
            except (OSError, httpx.HTTPError, redis.RedisError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{process.name} did not start in {START_TIMEOUT:g}s:\n{process.tail()}")

    def start_until_up(
        self, name: str, launch: Callable[[int], Process], ready: Callable[[int], bool]
    ) -> int:
        """Start on a free port; if the port was taken meanwhile, again on another (3 tries)."""
        for _ in range(3):
            port = free_port()
            process = launch(port)
            if self.wait(process, functools.partial(ready, port)):
                return port
        raise RuntimeError(f"{name} exited at start:\n{process.tail()}")

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


# -- the parts ---------------------------------------------------------------------------------


def start_redis(fleet: Fleet) -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")

    def launch(port: int) -> Process:
        command = [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly"]
        command += ["no", "--dir", str(fleet.workdir)]
        return fleet.spawn("redis", command)

    def ready(port: int) -> bool:
        return bool(redis.Redis(host=HOST, port=port, socket_timeout=1).ping())

    port = fleet.start_until_up("redis", launch, ready)
    return f"redis://{HOST}:{port}/0"


def start_service(fleet: Fleet, name: str, **env: str) -> str:
    """A service of this folder; it binds its own free port and writes it to a file."""
    port_file = fleet.workdir / f"{name}.port"
    command = [sys.executable, str(HERE / f"{name}.py"), "--port-file", str(port_file)]
    process = fleet.spawn(name, command, **env)
    url = ""

    def ready() -> bool:
        nonlocal url
        if not url and port_file.exists():
            url = f"http://{HOST}:{port_file.read_text(encoding='utf-8')}"
        return bool(url) and httpx.get(url + "/_drill/health", timeout=1).status_code == 200

    if not fleet.wait(process, ready):
        raise RuntimeError(f"{name} exited at start:\n{process.tail()}")
    return url


def gateway_config(urls: dict[str, str], redis_url: str, port: int, admin: int) -> dict[str, Any]:
    """``gateway.yaml`` with this run's addresses."""
    config: dict[str, Any] = yaml.safe_load((HERE / "gateway.yaml").read_text(encoding="utf-8"))
    config["listen"] = f"{HOST}:{port}"
    config["admin"]["listen"] = f"{HOST}:{admin}"
    config["stores"]["shared"] = redis_url
    for name, upstream in config["upstreams"].items():
        upstream["endpoints"] = [urls[name]]
    return config


def start_gateway(fleet: Fleet, urls: dict[str, str], redis_url: str, token: str) -> str:
    """The gateway; returns its URL (its admin is on ``fleet.admin_url``)."""
    path = fleet.workdir / "gateway.json"
    ports: dict[str, int] = {}

    def launch(port: int) -> Process:
        ports["proxy"], ports["admin"] = port, free_port()
        config = gateway_config(urls, redis_url, port, ports["admin"])
        path.write_text(json.dumps(config, indent=2), encoding="utf-8")
        command = [sys.executable, "-m", "floodwall.gateway", "-c", str(path)]
        return fleet.spawn("gateway", command, FLOODWALL_ADMIN_TOKEN=token)

    def ready(port: int) -> bool:
        admin = f"http://{HOST}:{ports['admin']}/healthz"
        return httpx.get(admin, timeout=1).status_code == 200

    port = fleet.start_until_up("gateway", launch, ready)
    fleet.admin_url = f"http://{HOST}:{ports['admin']}"
    return f"http://{HOST}:{port}"


def scenario(urls: dict[str, str], gateway: str, admin: str, quick: bool) -> dict[str, Any]:
    """``drill.yaml`` with this run's addresses (and ``--quick``'s shorter phases)."""
    raw: dict[str, Any] = yaml.safe_load((HERE / "drill.yaml").read_text(encoding="utf-8"))
    for name, spec in raw["services"].items():
        spec["url"] = urls[name]
    raw["edge"]["url"] = gateway
    raw["edge"]["status"]["url"] = admin + "/status"
    if quick:
        raw["warmup"], raw["drain"] = QUICK["warmup"], QUICK["drain"]
        raw["load"].update(QUICK["load"])
        raw["faults"][0]["at"], raw["faults"][0]["until"] = QUICK["fault"]
    return raw


async def _answered(client: httpx.AsyncClient, path: str) -> httpx.Response | str:
    try:
        return await client.get(path)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__} {exc}"


async def _ready(client: httpx.AsyncClient, paths: list[str]) -> None:
    """Until each route answered a 2xx once (every hop behind it is up); raises after
    :data:`START_TIMEOUT` with what the last try got."""
    deadline = time.monotonic() + START_TIMEOUT
    for path in paths:
        while not isinstance(answer := await _answered(client, path), httpx.Response) or (
            not answer.is_success
        ):
            if time.monotonic() > deadline:
                got = answer if isinstance(answer, str) else f"HTTP {answer.status_code}"
                raise RuntimeError(f"{path} not ready in {START_TIMEOUT:g}s: {got}")
            await asyncio.sleep(0.1)


async def _steady(client: httpx.AsyncClient, paths: list[str]) -> tuple[int, bool]:
    """Bursts of :data:`WARM_BURST` requests at once on every route until :data:`WARM_ROUNDS`
    bursts in a row got a 2xx each (at most :data:`START_TIMEOUT`): (bursts sent, steady)."""
    deadline = time.monotonic() + START_TIMEOUT
    bursts = in_a_row = 0
    while in_a_row < WARM_ROUNDS and time.monotonic() < deadline:
        answers = await asyncio.gather(*(_answered(client, p) for p in paths * WARM_BURST))
        bursts += 1
        good = all(isinstance(a, httpx.Response) and a.is_success for a in answers)
        in_a_row = in_a_row + 1 if good else 0
    return bursts, in_a_row >= WARM_ROUNDS


def warm_up(gateway: str, raw: dict[str, Any]) -> str:
    """Readiness, then warm-up, before the drill's load starts: a 2xx through every route (the
    gateway and every service behind it answered), then bursts on every route until the whole
    path carries them (connection pools at every hop opened, the Lua scripts loaded in Redis,
    first-call paths taken; a service still starting on a busy machine fails its burst, as
    the healthy routes failed 15 % of the drill's first seconds on a busy CI machine). Returns
    a line saying what it took."""
    paths = [route["path"] for route in raw["edge"]["routes"]]
    timeout = parse_duration(raw["load"]["timeout"])
    limits = httpx.Limits(max_connections=len(paths) * WARM_BURST)

    async def both() -> str:
        begun = time.monotonic()
        async with httpx.AsyncClient(base_url=gateway, timeout=timeout, limits=limits) as client:
            await _ready(client, paths)
            bursts, steady = await _steady(client, paths)
        took = f"{bursts} bursts of {WARM_BURST} per route in {time.monotonic() - begun:.1f} s"
        return f"warm: {took}" if steady else f"not steady ({took}): the drill's void check judges"

    return asyncio.run(both())


def global_limits(redis_url: str) -> dict[str, Any]:
    """What the global rate limits did in Redis: scripts run (one per batch of decisions)."""
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    stats = client.info("commandstats")
    calls = {
        name.removeprefix("cmdstat_"): int(entry["calls"])
        for name, entry in stats.items()
        if name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_script|load", "cmdstat_fcall")
    }
    client.close()
    return {"redis": redis_url, "script_calls": calls}


def run(args: argparse.Namespace, fleet: Fleet) -> int:
    token = secrets.token_urlsafe(24)
    os.environ["FLOODWALL_ADMIN_TOKEN"] = token  # the drill polls the admin /status with it
    redis_url = start_redis(fleet)
    print(f"redis      {redis_url}", flush=True)
    urls = {name: start_service(fleet, name) for name in ("users", "posts")}
    urls["profile"] = start_service(
        fleet, "profile", USERS_URL=urls["users"], POSTS_URL=urls["posts"], REDIS_URL=redis_url
    )
    for name, url in urls.items():
        print(f"{name:<10} {url}", flush=True)
    gateway = start_gateway(fleet, urls, redis_url, token)
    print(f"gateway    {gateway}   admin {fleet.admin_url} (dashboard: /dashboard)", flush=True)
    raw = scenario(urls, gateway, fleet.admin_url, args.quick)
    print(warm_up(gateway, raw), flush=True)
    path = fleet.workdir / "drill.json"
    path.write_text(json.dumps(raw), "utf-8")
    status = 0
    try:
        drill(str(path), args.json, args.html)
    except SystemExit as exc:  # an `expect` check missed: report it, stop everything
        status = exc.code if isinstance(exc.code, int) else 1
    limits = global_limits(redis_url)
    print(f"global rate limits in Redis: {limits['script_calls']} script calls", flush=True)
    if args.json is not None:  # the drill's figures, and what Redis did for the limits
        figures = json.loads(Path(args.json).read_text(encoding="utf-8"))
        figures["global_limits"] = limits
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return status


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM unwinds as Ctrl-C does (the event loop lets only KeyboardInterrupt and
    SystemExit through, and SystemExit is the drill's verdict), through the ``finally`` that
    stops every child."""
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases (about 24 s in all)")
    parser.add_argument("--json", help="write every figure here as JSON")
    parser.add_argument("--html", help="write the HTML report here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-profile-"))
    print(f"work directory {workdir}", flush=True)
    fleet = Fleet(workdir)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(args, fleet)
    except KeyboardInterrupt:
        print("interrupted: stopping every process", flush=True)
        return 130
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut this short
            signal.signal(signum, signal.SIG_IGN)
        fleet.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
