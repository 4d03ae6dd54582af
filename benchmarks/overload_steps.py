"""A real aiohttp service stepped through 0.5×, 1×, 2× and 3× its capacity, per guard.

    .venv/bin/python benchmarks/overload_steps.py [--rounds 3] [--cost 0.002] [--step 8]
        [--pin] [--json out.json]

One aiohttp server on 127.0.0.1 whose handler burns ``cost`` of CPU (2 ms) in one worker
process. The server's own queue is explicit (a FIFO that a thread of the server feeds to the
worker the moment it is free), so the server knows when each request starts and ends, as a real
server's pending queue does. For each guard, in an order
rotated every round so that no guard always runs on the busiest minute of a shared machine:

1. a fresh unguarded server: a closed loop of 8 connections for 3 s measures the capacity
   (answers per second), then 4 s of Poisson load at 0.25× of it the unloaded p99;
2. a fresh server with the guard takes open-loop Poisson load at 0.5×, 1×, 2× and 3× of that
   capacity, ``step`` seconds each (8 s), from a cold guard, nothing skipped.

A client gives up after 100 ms, so goodput = answers within 100 ms per second; p99 is over the
admitted answers (200s within 100 ms). The load runs in a process of its own. Guards:

* ``none``: no guard;
* ``static``: a hand-tuned fixed limit (``AdaptiveLimiter(FixedLimit(4))``: one request in the
  worker and three waiting, found by trying 2, 4, 8 and 16);
* ``gradient2``: the documented default, ``AdaptiveLimiter(WindowedLimit(Gradient2Limit()))``;
* ``dagor``: ``QueueingTimeAdmission()`` on defaults, told each request's start (with its wait
  for the worker) and end, and a random user priority per request.

Every guard is a :class:`~floodwall.adaptive.LoadShedder` asked at the handler's entry; a refusal
is a 503. ``--pin`` runs the server and its worker on CPU 0 and the load on CPU 1 (``taskset``);
``OVERLOAD_STEPS_TRACE=1`` makes each server print its guard's state every second on stderr.
The targets of issue 18 at 3×: Gradient2 and DAGOR on defaults each ≥ 90 % of capacity with
admitted p99 ≤ 3 × the unloaded p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overload_http  # the sibling benchmark: load generator and process control

GUARDS = ("none", "static", "gradient2", "dagor")
STEPS = (0.5, 1.0, 2.0, 3.0)
DEADLINE = 0.1
"""Seconds a client waits for an answer: goodput counts answers within 100 ms."""
STATIC_LIMIT = 4
CALIBRATE = 3.0
"""Seconds of the closed loop that measures the capacity."""
CONNECTIONS = 8
"""Connections of that closed loop: enough to keep the worker busy, few enough that their queue
(8 × 2 ms) stays far inside the 100 ms a client waits..."""
CALIBRATE_DEADLINE = 1.0
"""...and its clients wait up to 1 s: a scheduling stall of the shared machine must not turn
into abandoned work that the next requests queue behind (every answer counts)."""
UNLOADED = 4.0
"""Seconds of 0.25× load that measure the unloaded p99."""


class Worker:
    """One worker process behind the server's own FIFO queue, fed by a thread of the server.

    The thread takes the next waiting request the moment the worker is free (no event-loop turn
    in between, so the worker never idles while requests wait), stamps its start and end and
    tells ``on_start``/``on_finish`` (DAGOR's hooks, when given), then wakes the handler.
    """

    def __init__(
        self,
        cost: float,
        on_start: Callable[[float, float], None] | None = None,
        on_finish: Callable[[float, float], None] | None = None,
    ) -> None:
        self.cost = cost
        self.on_start = on_start
        self.on_finish = on_finish
        self._conn, child = multiprocessing.Pipe()
        self._process = multiprocessing.Process(target=_burner, args=(child,), daemon=True)
        self._process.start()
        self._queue: queue.SimpleQueue[tuple[float, asyncio.Future[None]]] = queue.SimpleQueue()
        self._conn.send(cost)  # start-up is not queueing: one burn before the first request
        self._conn.recv()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            arrived, done = self._queue.get()
            began = time.monotonic()
            if self.on_start is not None:
                self.on_start(began, began - arrived)
            self._conn.send(self.cost)
            self._conn.recv()
            ended = time.monotonic()
            if self.on_finish is not None:
                self.on_finish(ended, ended - began)
            done.get_loop().call_soon_threadsafe(_settle, done)

    async def run(self, arrived: float) -> None:
        """Queue one request that arrived at ``arrived`` and wait until the worker served it."""
        done = asyncio.get_running_loop().create_future()
        self._queue.put((arrived, done))
        await done


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _burner(conn: Any) -> None:
    """The worker process: burn the CPU asked for, answer, forever."""
    while True:
        overload_http.burn(conn.recv())
        conn.send(None)


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

    dagor = QueueingTimeAdmission() if guard == "dagor" else None
    shedder: LoadShedder | None = None
    if guard == "static":
        shedder = LoadShedder(AdaptiveLimiter(FixedLimit(STATIC_LIMIT)))
    elif guard == "gradient2":
        shedder = LoadShedder(AdaptiveLimiter(WindowedLimit(Gradient2Limit())))
    elif dagor is not None:
        shedder = LoadShedder(dagor)
    rng = random.Random(port)

    async def main() -> None:
        hooks = () if dagor is None else (dagor.on_start, dagor.on_finish)
        worker = Worker(cost, *hooks)

        async def handle(request: web.Request) -> web.Response:
            arrived = time.monotonic()
            if shedder is None:
                await worker.run(arrived)
                return web.Response(text="ok")
            try:
                ticket = shedder.admit(user=rng.randrange(128))
            except OverloadedError as refused:
                headers = {"Retry-After": f"{refused.retry_after:g}"}
                return web.Response(status=503, headers=headers)
            with ticket:
                await worker.run(arrived)
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        print("READY", flush=True)
        if os.environ.get("OVERLOAD_STEPS_TRACE"):  # the guard's state each second, on stderr
            asyncio.get_running_loop().create_task(_trace(shedder, dagor))
        await asyncio.sleep(lifetime)
        await runner.cleanup()

    asyncio.run(main())


async def _trace(shedder: Any, dagor: Any) -> None:
    start = time.monotonic()
    while True:
        await asyncio.sleep(1.0)
        state = f"t={time.monotonic() - start:5.1f}"
        if shedder is not None:
            stats = shedder.stats()
            state += f" admitted={stats.admitted} shed={stats.shed} inflight={stats.inflight}"
            limiter = shedder.limiter
            algorithm = getattr(getattr(limiter, "algorithm", None), "delegate", None)
            if algorithm is not None:
                state += (
                    f" limit={limiter.limit} long={algorithm.long_rtt * 1000:.1f}ms"
                    f" last={algorithm.last_rtt * 1000:.1f}ms"
                )
        if dagor is not None:
            state += (
                f" level={tuple(dagor.level)} queueing={dagor.last_queueing_time * 1000:.1f}ms"
                f" wait_refused={dagor.wait_refused}"
            )
        print(state, file=sys.stderr, flush=True)


def _pinned(command: list[str], cpu: int | None) -> list[str]:
    return command if cpu is None else ["taskset", "-c", str(cpu), *command]


def _start(cost: float, guard: str, lifetime: float, cpu: int | None) -> tuple[Any, str]:
    port = overload_http._free_port()
    command = [
        sys.executable, __file__, "--serve", str(port), "--cost", str(cost),
        "--guard", guard, "--lifetime", str(lifetime),
    ]  # fmt: skip
    server = subprocess.Popen(
        _pinned(command, cpu), stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert server.stdout is not None
    if server.stdout.readline().strip() != "READY":
        overload_http._stop(server)
        raise RuntimeError("the benchmark server did not start")
    return server, f"http://127.0.0.1:{port}/"


def _drive(
    url: str,
    rate: float,
    duration: float,
    cpu: int | None,
    *,
    concurrency: int = 0,
    deadline: float = DEADLINE,
) -> dict[str, Any]:
    command = [
        sys.executable, __file__, "--drive", url, "--rate", str(rate),
        "--duration", str(duration), "--concurrency", str(concurrency),
        "--deadline", str(deadline),
    ]  # fmt: skip
    done = subprocess.run(
        _pinned(command, cpu), capture_output=True, text=True, check=True, timeout=duration + 30
    )
    return dict(json.loads(done.stdout))


def one_guard(guard: str, cost: float, step: float, pin: bool) -> dict[str, Any]:
    """Capacity and unloaded p99 on a fresh unguarded server, then ``guard`` through the steps."""
    server_cpu, load_cpu = (0, 1) if pin else (None, None)
    result: dict[str, Any] = {"loadavg": os.getloadavg()[0]}
    server, url = _start(cost, "none", CALIBRATE + UNLOADED + 30, server_cpu)
    try:
        calibration = _drive(
            url, 0, CALIBRATE, load_cpu, concurrency=CONNECTIONS, deadline=CALIBRATE_DEADLINE
        )
        result["capacity"] = capacity = calibration["ok"] / CALIBRATE
        result["unloaded"] = _drive(url, 0.25 * capacity, UNLOADED, load_cpu)
    finally:
        overload_http._stop(server)
    server, url = _start(cost, guard, len(STEPS) * step + 60, server_cpu)
    try:
        result["steps"] = {
            f"{multiple:g}x": _drive(url, multiple * capacity, step, load_cpu) for multiple in STEPS
        }
    finally:
        overload_http._stop(server)
    return result


def orchestrate(
    cost: float, step: float, guards: tuple[str, ...], rounds: int, pin: bool
) -> dict[str, Any]:
    results: dict[str, Any] = {"cost": cost, "step": step, "pin": pin, "rounds": []}
    for index in range(rounds):
        shift = index % len(guards)
        order = guards[shift:] + guards[:shift]
        started = os.getloadavg()[0]
        runs = {guard: one_guard(guard, cost, step, pin) for guard in order}
        results["rounds"].append(
            {"order": order, "loadavg": [started, os.getloadavg()[0]], "guards": runs}
        )
    return results


def _cell(run: dict[str, Any], capacity: float, unloaded: float) -> str:
    if not run["ok"]:
        return f"{run['goodput'] / capacity:.0%} / –"
    share, p99 = run["goodput"] / capacity, run["p99"]
    return f"{share:.0%} / {p99 * 1000:.0f} ({p99 / unloaded:.1f}×)"


def report(results: dict[str, Any]) -> str:
    lines = []
    for number, round_ in enumerate(results["rounds"], 1):
        low, high = round_["loadavg"]
        lines += [
            f"round {number} (order {', '.join(round_['order'])}; load average {low:.1f} → "
            f"{high:.1f}); cells: goodput / capacity, admitted p99 ms (÷ unloaded p99)",
            "",
            "| guard | capacity rps | unloaded p99 ms | load | 0.5× | 1× | 2× | **3×** |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for guard in GUARDS:
            run = round_["guards"].get(guard)
            if run is None:
                continue
            capacity, unloaded = run["capacity"], run["unloaded"]["p99"]
            cells = [_cell(step, capacity, unloaded) for step in run["steps"].values()]
            cells[-1] = f"**{cells[-1]}**"
            lines.append(
                f"| {guard} | {capacity:.0f} | {unloaded * 1000:.1f} | {run['loadavg']:.1f} | "
                + " | ".join(cells)
                + " |"
            )
        lines.append("")
    lines.append(_summary(results))
    return "\n".join(lines)


def _summary(results: dict[str, Any]) -> str:
    """Per guard, the median over rounds of goodput / capacity and p99 / unloaded at 3×."""
    rows = ["medians at 3× over the rounds: goodput / capacity, p99 / unloaded p99"]
    for guard in GUARDS:
        runs = [r["guards"][guard] for r in results["rounds"] if guard in r["guards"]]
        if not runs:
            continue
        share = [run["steps"]["3x"]["goodput"] / run["capacity"] for run in runs]
        ratio = [
            run["steps"]["3x"]["p99"] / run["unloaded"]["p99"]
            for run in runs
            if run["steps"]["3x"]["ok"]
        ]
        p99 = f"{statistics.median(ratio):.2f}" if ratio else "–"
        rows.append(f"  {guard}: {statistics.median(share):.0%}, {p99}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="aiohttp stepped to 3x capacity, per guard")
    parser.add_argument("--cost", type=float, default=0.002, help="CPU seconds per request")
    parser.add_argument("--step", type=float, default=8.0, help="seconds per load step")
    parser.add_argument("--rounds", type=int, default=1, help="repeat, rotating the guards")
    parser.add_argument("--guards", default=",".join(GUARDS), help="comma-separated")
    parser.add_argument("--pin", action="store_true", help="server on CPU 0, load on CPU 1")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--guard", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--lifetime", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.add_argument("--drive", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=DEADLINE, help=argparse.SUPPRESS)
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
                deadline=args.deadline,
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
    if args.pin and (shutil.which("taskset") is None or (os.cpu_count() or 1) < 2):
        parser.error("--pin needs taskset and two CPUs")
    results = orchestrate(args.cost, step, guards, max(1, args.rounds), args.pin)
    print(report(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
