"""A real aiohttp service stepped through 0.5×, 1×, 2× and 3× its capacity, per guard.

    .venv/bin/python benchmarks/overload_steps.py [--cost 0.002] [--step 8] [--json out.json]

One aiohttp server on 127.0.0.1 whose handler burns ``cost`` of CPU (2 ms) in one worker
process, so its capacity is ≈ 1 / cost. A closed loop of 32 connections against the unguarded
server measures the capacity, 4 s at 0.25× measure its unloaded p99; then, for each guard, a
fresh server takes open-loop Poisson load at 0.5×, 1×, 2× and 3× of that capacity, ``step``
seconds each (8 s, from a cold guard, no warm-up skipped). A client gives up after 100 ms, so
goodput = answers within 100 ms per second; p99 is over those admitted answers. Guards:

* ``none``: no guard;
* ``static``: a hand-tuned fixed limit (``AdaptiveLimiter(FixedLimit(4))``: one worker busy
  and three waiting, found by trying 2, 4, 8 and 16);
* ``gradient2``: the documented default, ``AdaptiveLimiter(WindowedLimit(Gradient2Limit()))``;
* ``dagor``: ``QueueingTimeAdmission()`` on defaults, told each request's queueing time (its
  wait for the worker) and a random user priority per request.

Every guard is a :class:`~floodwall.adaptive.LoadShedder`; a refusal is a 503. Load runs in a
process of its own (shared loopback only). The targets of issue 18 at 3×: Gradient2 and DAGOR
on defaults each ≥ 90 % of capacity with admitted p99 ≤ 3 × the unloaded p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overload_http  # the sibling benchmark: load generator and process control

GUARDS = ("none", "static", "gradient2", "dagor")
STEPS = (0.5, 1.0, 2.0, 3.0)
DEADLINE = 0.1
"""Seconds a client waits for an answer: goodput counts answers within 100 ms."""
STATIC_LIMIT = 4


def started_burn(cost: float) -> float:
    """Burn ``cost`` seconds of CPU in the worker; return when it started (system monotonic)."""
    began = time.monotonic()
    overload_http.burn(cost)
    return began


def serve(port: int, *, cost: float, guard: str, lifetime: float) -> None:
    """Run the service with ``guard`` on 127.0.0.1:``port`` for ``lifetime`` seconds."""
    from aiohttp import web

    from floodwall import OverloadedError
    from floodwall.adaptive import (
        AdaptiveLimiter,
        FixedLimit,
        Gradient2Limit,
        LoadShedder,
        QueueingTimeAdmission,
        WindowedLimit,
    )

    pool = ProcessPoolExecutor(1)
    dagor = QueueingTimeAdmission() if guard == "dagor" else None
    shedder: LoadShedder | None = None
    if guard == "static":
        shedder = LoadShedder(AdaptiveLimiter(FixedLimit(STATIC_LIMIT)))
    elif guard == "gradient2":
        shedder = LoadShedder(AdaptiveLimiter(WindowedLimit(Gradient2Limit())))
    elif dagor is not None:
        shedder = LoadShedder(dagor)
    rng = random.Random(port)

    async def handle(request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        arrived = time.monotonic()
        if shedder is None:
            await loop.run_in_executor(pool, started_burn, cost)
            return web.Response(text="ok")
        try:
            ticket = shedder.admit(user=rng.randrange(128))
        except OverloadedError as refused:
            return web.Response(status=503, headers={"Retry-After": f"{refused.retry_after:g}"})
        with ticket:
            began = await loop.run_in_executor(pool, started_burn, cost)
        if dagor is not None:
            dagor.on_start(began, began - arrived)  # its wait for the worker
        return web.Response(text="ok")

    async def main() -> None:
        await loop_warm(pool, cost)
        app = web.Application()
        app.router.add_get("/", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        print("READY", flush=True)
        await asyncio.sleep(lifetime)
        await runner.cleanup()

    asyncio.run(main())


async def loop_warm(pool: ProcessPoolExecutor, cost: float) -> None:
    """Start the worker process before the first request (its start-up is not queueing)."""
    await asyncio.get_running_loop().run_in_executor(pool, started_burn, cost)


def _start(cost: float, guard: str, lifetime: float) -> tuple[Any, str]:
    port = overload_http._free_port()
    command = [
        sys.executable, __file__, "--serve", str(port), "--cost", str(cost),
        "--guard", guard, "--lifetime", str(lifetime),
    ]  # fmt: skip
    import subprocess

    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert server.stdout is not None
    if server.stdout.readline().strip() != "READY":
        overload_http._stop(server)
        raise RuntimeError("the benchmark server did not start")
    return server, f"http://127.0.0.1:{port}/"


def _drive(url: str, rate: float, duration: float, concurrency: int = 0) -> dict[str, Any]:
    import subprocess

    command = [
        sys.executable, __file__, "--drive", url, "--rate", str(rate),
        "--duration", str(duration), "--concurrency", str(concurrency),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=duration + 30
    )
    return dict(json.loads(done.stdout))


def orchestrate(cost: float, step: float, guards: tuple[str, ...]) -> dict[str, Any]:
    results: dict[str, Any] = {"cost": cost, "step": step, "loadavg": os.getloadavg()}
    server, url = _start(cost, "none", 60.0)
    try:
        calibration = overload_http._run_client(url, 0, 3.0, concurrency=32)
        capacity = calibration["ok"] / 3.0
        unloaded = _drive(url, 0.25 * capacity, 4.0)
    finally:
        overload_http._stop(server)
    results["capacity"] = capacity
    results["unloaded"] = unloaded
    for guard in guards:
        server, url = _start(cost, guard, len(STEPS) * step + 60)
        try:
            results[guard] = {
                f"{multiple:g}x": _drive(url, multiple * capacity, step) for multiple in STEPS
            }
        finally:
            overload_http._stop(server)
    results["loadavg_after"] = os.getloadavg()
    return results


def report(results: dict[str, Any]) -> str:
    capacity = results["capacity"]
    unloaded = results["unloaded"]["p99"]
    lines = [
        f"capacity (closed loop, 32 connections): {capacity:.0f} rps; unloaded p99 (0.25x): "
        f"{unloaded * 1000:.1f} ms; CPU {results['cost'] * 1000:.0f} ms/request; load average "
        f"before {results['loadavg'][0]:.1f}, after {results['loadavg_after'][0]:.1f}",
        "",
        "| guard | step | offered rps | goodput rps | goodput / capacity | admitted p99 ms "
        "| p99 / unloaded | shed 503 | timeouts |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for guard in GUARDS:
        if guard not in results:
            continue
        for name, run in results[guard].items():
            ratio = run["p99"] / unloaded if run["ok"] else math.nan
            lines.append(
                f"| {guard} | {name} | {run['sent'] / run['seconds']:.0f} | {run['goodput']:.0f} "
                f"| {run['goodput'] / capacity:.0%} | {run['p99'] * 1000:.1f} | {ratio:.2f} "
                f"| {run['shed']} | {run['timeout']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="aiohttp stepped to 3x capacity, per guard")
    parser.add_argument("--cost", type=float, default=0.002, help="CPU seconds per request")
    parser.add_argument("--step", type=float, default=8.0, help="seconds per load step")
    parser.add_argument("--guards", default=",".join(GUARDS), help="comma-separated")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--guard", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--lifetime", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.add_argument("--drive", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, cost=args.cost, guard=args.guard, lifetime=args.lifetime)
        return 0
    if args.drive:
        figures = asyncio.run(
            overload_http._drive(
                args.drive,
                rate=args.rate,
                duration=args.duration,
                deadline=DEADLINE,
                concurrency=args.concurrency,
                seed=os.getpid(),
            )
        )
        print(json.dumps(figures))
        return 0
    step = min(args.step, overload_http.MAX_DRIVE_SECONDS)
    guards = tuple(name for name in args.guards.split(",") if name)
    unknown = set(guards) - set(GUARDS)
    if unknown:
        parser.error(f"unknown guards {sorted(unknown)}; choose from {', '.join(GUARDS)}")
    results = orchestrate(args.cost, step, guards)
    print(report(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
