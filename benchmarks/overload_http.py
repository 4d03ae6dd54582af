"""A real aiohttp server at 3× its capacity, with and without the load-shedding guard.

    .venv/bin/python benchmarks/overload_http.py [--cost 0.010] [--overload 15] [--json out.json]

Three processes on 127.0.0.1 only: this orchestrator, the server (``--serve``) and a load
generator (``--drive``). The server burns a fixed ``cost`` of CPU per request in a pool of
``workers`` threads (one core's worth through the GIL), so its capacity is ≈ 1 / cost. Steps:

1. calibrate: a closed loop of 32 connections against the unguarded server for 3 s gives the
   capacity (requests/s);
2. for each server (unguarded, guarded): 4 s of Poisson load at 0.25× capacity gives the
   unloaded p99, then ``--overload`` seconds (≤ 20) at 3× capacity, client timeout 1 s.

Guarded = :class:`~floodwall.adaptive.LoadShedder` over an :class:`~floodwall.adaptive.
AdaptiveLimiter` with a windowed Gradient2 (0.2 s windows, ``min_limit=2``, ``queue_size=1``,
``initial_limit=4``) counting requests waiting for a worker and running; a refusal is an HTTP
503 with ``Retry-After``. Goodput = 200 answers within the timeout per second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

MAX_DRIVE_SECONDS = 20.0
"""No load phase runs longer than this (the issue's bound for the real-process test)."""
UNLOADED = 8.0
"""Seconds of 0.25× load that measure the unloaded p99."""


# -- server ---------------------------------------------------------------------------------------


def burn(cost: float) -> None:
    """Spend ``cost`` seconds of this thread's CPU time."""
    end = time.thread_time() + cost
    while time.thread_time() < end:
        pass


def serve(
    port: int, *, cost: float, workers: int, guarded: bool, lifetime: float, processes: bool
) -> None:
    """Run the benchmark server on 127.0.0.1:``port`` for ``lifetime`` seconds."""
    from aiohttp import web

    from floodwall import OverloadedError
    from floodwall.adaptive import AdaptiveLimiter, Gradient2Limit, LoadShedder, WindowedLimit

    pool: Executor = ProcessPoolExecutor(workers) if processes else ThreadPoolExecutor(workers)
    shedder = LoadShedder(
        AdaptiveLimiter(
            WindowedLimit(
                Gradient2Limit(initial_limit=4, min_limit=2, queue_size=1),
                min_window_time=0.2,
                max_window_time=0.2,
            )
        ),
        name="http",
    )

    async def handle(request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        if not guarded:
            await loop.run_in_executor(pool, burn, cost)
            return web.Response(text="ok")
        try:
            ticket = shedder.admit()
        except OverloadedError as refused:
            return web.Response(
                status=503, headers={"Retry-After": f"{refused.retry_after or 1:g}"}
            )
        with ticket:
            await loop.run_in_executor(pool, burn, cost)
        return web.Response(text="ok")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        print("READY", flush=True)
        await asyncio.sleep(lifetime)
        await runner.cleanup()

    asyncio.run(main())


# -- load generator -------------------------------------------------------------------------------


class _Tally:
    """What one load run saw: counts per outcome and the latencies of good answers."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.ok: list[float] = []
        self.counts = {"sent": 0, "ok": 0, "shed": 0, "timeout": 0, "error": 0}

    async def one(self, session: Any, url: str) -> None:
        import aiohttp

        self.counts["sent"] += 1
        start = time.perf_counter()
        try:
            async with session.get(url) as response:
                await response.read()
                status = response.status
        except TimeoutError:
            self.counts["timeout"] += 1
            return
        except aiohttp.ClientError:
            self.counts["error"] += 1
            return
        elapsed = time.perf_counter() - start
        if status == 200 and elapsed <= self.deadline:
            self.counts["ok"] += 1
            self.ok.append(elapsed)
        else:
            self.counts["shed" if status == 503 else "error"] += 1

    def figures(self, duration: float, elapsed: float) -> dict[str, Any]:
        ok = sorted(self.ok)
        return {
            **self.counts,
            "seconds": elapsed,
            "goodput": self.counts["ok"] / duration,
            "p50": ok[len(ok) // 2] if ok else math.nan,
            "p99": ok[max(0, math.ceil(0.99 * len(ok)) - 1)] if ok else math.nan,
        }


async def _drive(
    url: str, *, rate: float, duration: float, deadline: float, concurrency: int, seed: int
) -> dict[str, Any]:
    """Open-loop Poisson load at ``rate`` (or a closed loop of ``concurrency`` connections)."""
    import aiohttp

    duration = min(duration, MAX_DRIVE_SECONDS)
    rng = random.Random(seed)
    tally = _Tally(deadline)
    connector = aiohttp.TCPConnector(limit=0)
    client_timeout = aiohttp.ClientTimeout(total=deadline)
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:
        loop = asyncio.get_running_loop()
        began = loop.time()
        end = began + duration
        if concurrency:

            async def worker() -> None:
                while loop.time() < end:
                    await tally.one(session, url)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            tasks: set[asyncio.Task[None]] = set()
            next_send = began
            while next_send < end:
                delay = next_send - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(tally.one(session, url))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_send += rng.expovariate(rate)
            if tasks:
                await asyncio.wait(tasks, timeout=deadline + 1)
        elapsed = loop.time() - began
    return tally.figures(duration, elapsed)


# -- orchestration --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_server(
    cost: float, workers: int, guarded: bool, lifetime: float, pool: str
) -> tuple[Any, str]:
    port = _free_port()
    command = [
        sys.executable, __file__, "--serve", str(port), "--cost", str(cost),
        "--workers", str(workers), "--lifetime", str(lifetime), "--pool", pool,
    ]  # fmt: skip
    if guarded:
        command.append("--guarded")
    # A session of its own, so that stopping it also stops its worker processes.
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert server.stdout is not None
    if server.stdout.readline().strip() != "READY":
        _stop(server)
        raise RuntimeError("the benchmark server did not start")
    return server, f"http://127.0.0.1:{port}/"


def _stop(server: Any) -> None:
    """Kill the server and the worker processes it forked (its process group), then reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def _run_client(url: str, rate: float, duration: float, concurrency: int = 0) -> dict[str, Any]:
    command = [
        sys.executable, __file__, "--drive", url, "--rate", str(rate),
        "--duration", str(duration), "--concurrency", str(concurrency),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=duration + 30
    )
    return dict(json.loads(done.stdout))


def orchestrate(cost: float, workers: int, overload: float, pool: str) -> dict[str, Any]:
    lifetime = 3 + UNLOADED + overload + 30
    results: dict[str, Any] = {"cost": cost, "workers": workers, "pool": pool}
    server, url = _start_server(cost, workers, False, lifetime, pool)
    try:
        calibration = _run_client(url, 0, 3.0, concurrency=32)
    finally:
        _stop(server)
    capacity = calibration["ok"] / 3.0
    results["capacity"] = capacity
    for guarded in (False, True):
        server, url = _start_server(cost, workers, guarded, lifetime, pool)
        try:
            unloaded = _run_client(url, 0.25 * capacity, UNLOADED)
            loaded = _run_client(url, 3.0 * capacity, overload)
        finally:
            _stop(server)
        results["guarded" if guarded else "unguarded"] = {"unloaded": unloaded, "3x": loaded}
    return results


def report(results: dict[str, Any]) -> str:
    capacity = results["capacity"]
    lines = [
        f"capacity (closed loop, 32 connections): {capacity:.1f} rps "
        f"(CPU cost {results['cost'] * 1000:.0f} ms/request, {results['workers']} "
        f"{results['pool']} worker(s))",
        "",
        "| server | unloaded p99 ms | offered at 3× rps | goodput rps | goodput / capacity "
        "| p99 admitted ms | p99 / unloaded | shed 503 | timeouts |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("unguarded", "guarded"):
        run = results[name]
        unloaded, loaded = run["unloaded"], run["3x"]
        ratio = loaded["p99"] / unloaded["p99"] if loaded["ok"] else math.nan
        lines.append(
            f"| {name} | {unloaded['p99'] * 1000:.1f} | {loaded['sent'] / loaded['seconds']:.0f} "
            f"| {loaded['goodput']:.1f} | {loaded['goodput'] / capacity:.0%} "
            f"| {loaded['p99'] * 1000:.1f} | {ratio:.2f} | {loaded['shed']} | {loaded['timeout']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="aiohttp at 3x capacity, guard on/off")
    parser.add_argument("--cost", type=float, default=0.010, help="CPU seconds per request")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--pool",
        choices=["process", "thread"],
        default="process",
        help="burn the CPU in worker processes (default) or threads (GIL-bound)",
    )
    parser.add_argument("--overload", type=float, default=15.0, help="seconds at 3x (<= 20)")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--guarded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lifetime", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.add_argument("--drive", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(
            args.serve,
            cost=args.cost,
            workers=args.workers,
            guarded=args.guarded,
            lifetime=args.lifetime,
            processes=args.pool == "process",
        )
        return 0
    if args.drive:
        figures = asyncio.run(
            _drive(
                args.drive,
                rate=args.rate,
                duration=args.duration,
                deadline=1.0,
                concurrency=args.concurrency,
                seed=os.getpid(),
            )
        )
        print(json.dumps(figures))
        return 0
    overload = min(args.overload, MAX_DRIVE_SECONDS)
    results = orchestrate(args.cost, args.workers, overload, args.pool)
    print(report(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
