"""Exactness under concurrency: 4 processes × 32 async tasks hammer one global limit of 500 per
second for 5 s on a real Redis, for each of the four algorithms at once (four limits, four keys,
128 tasks per process).

Every op reply carries the server's time (µs), recorded by a delegating store in each process,
so the bounds are checked on the clock that decided: GCRA and token bucket admit at most
``capacity + 500 × span`` between their first and last admission (``span`` in server seconds),
the fixed window at most 500 per window, the sliding window counter at most 500 per grid window;
and at least 95 % of that (over the windows that ran from start to end, for the windowed two).
Run with ``-s`` for the figures. This module is also the worker: ``python <this file> URL …``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import pytest

from floodwall.shared.global_limit import GlobalLimiter
from floodwall.stores import Arg, Op, R, Store, connect

pytestmark = pytest.mark.integration

KINDS = ("gcra", "token_bucket", "fixed_window", "sliding_window_counter")
PROCESSES = 4
TASKS = 32
SECONDS = 5.0
RATE = 500


class RecordingStore(Store):
    """A store that keeps every rate-limit reply ``(now_us, verdicts)`` it passes on."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner.url, prefix=inner.prefix)
        self.inner = inner
        self.replies: list[tuple[str, Any]] = []

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        reply = self.inner.apply(op, key, args)
        self.replies.append((key, reply))
        return reply

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        reply = await self.inner.apply_async(op, key, args)
        self.replies.append((key, reply))
        return reply

    async def ping_async(self) -> None:
        await self.inner.ping_async()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _hammer(url: str, prefix: str) -> dict[str, Any]:
    store = RecordingStore(connect(url, prefix=prefix))
    limiters = {kind: GlobalLimiter(kind, f"{RATE}/s", store=store, name=kind) for kind in KINDS}
    await store.ping_async()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # "go"
    loop = asyncio.get_running_loop()
    until = loop.time() + SECONDS
    allowed: Counter[str] = Counter()
    decided: Counter[str] = Counter()
    errors: list[str] = []

    async def task(kind: str, limiter: GlobalLimiter) -> None:
        while loop.time() < until:
            try:
                decision = await limiter.acquire_async()
            except Exception as exc:
                errors.append(repr(exc))
                return
            decided[kind] += 1
            allowed[kind] += decision.allowed

    await asyncio.gather(*(task(kind, lim) for kind, lim in limiters.items() for _ in range(TASKS)))
    await store.aclose()
    replies: dict[str, list[Any]] = defaultdict(list)
    for key, (now, verdicts) in store.replies:
        replies[key.removeprefix("rl:")].append([now, [[v[1], v[3]] for v in verdicts if v[0]]])
    return {
        "allowed": allowed,
        "decided": decided,
        "errors": errors,
        "batches": {kind: lim.batches for kind, lim in limiters.items()},
        "replies": replies,
    }


def _windows(grants: list[tuple[int, int, int]]) -> dict[int, int]:
    """Admitted permits per window, keyed by the window's end (µs) as the server reported."""
    totals: Counter[int] = Counter()
    for now, granted, reset in grants:
        totals[now + reset] += granted
    return dict(totals)


def test_four_processes_hammering_one_global_limit(redis_url: str) -> None:
    prefix = f"exact-{uuid.uuid4().hex[:8]}:"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, redis_url, prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(proc.communicate(timeout=60)[0]) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert all(not r["errors"] for r in results), [r["errors"][:3] for r in results]
    lines = []
    for kind in KINDS:
        grants = sorted(
            (now, granted, reset)
            for r in results
            for now, admitted in r["replies"][kind]
            for granted, reset in admitted
        )
        admitted = sum(g for _, g, _ in grants)
        assert admitted == sum(r["allowed"][kind] for r in results), "decisions match the store"
        decided = sum(r["decided"][kind] for r in results)
        batches = sum(r["batches"][kind] for r in results)
        span = (grants[-1][0] - grants[0][0]) / 1_000_000
        if kind in {"gcra", "token_bucket"}:
            bound = RATE + RATE * span  # capacity (burst = 499) + rate × span
            assert admitted <= bound
            assert admitted >= 0.95 * bound, (kind, admitted, bound)
            detail = f"bound {bound:.0f} (500 + 500/s × {span:.3f} s): {admitted / bound:.1%}"
        else:
            windows = _windows(grants)
            ends = sorted(windows)
            assert all(total <= RATE for total in windows.values()), windows
            first, last = grants[0][0], grants[-1][0]
            full = [e for e in ends if e - 1_000_000 >= first and e <= last]
            assert full, windows
            assert all(windows[e] >= 0.95 * RATE for e in full), (kind, windows)
            bound = RATE * len(ends)
            assert admitted <= bound
            detail = (
                f"per window {[windows[e] for e in ends]} (≤ 500 each; the "
                f"{len(full)} complete ones ≥ 95 %)"
            )
        lines.append(
            f"{kind}: admitted {admitted} of {decided} decisions in {batches} round trips "
            f"({decided / max(batches, 1):.1f} per round trip); {detail}"
        )
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    started = time.monotonic()
    outcome = asyncio.run(_hammer(sys.argv[1], sys.argv[2]))
    print(json.dumps(outcome))
