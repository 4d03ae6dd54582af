"""Exactness under concurrency: 4 processes × 32 async tasks hammer one global limit of 500 per
second for 5 s on a real Redis, for each of the four algorithms at once (four limits, four keys,
128 tasks per process).

Every op reply carries the server's time (µs), recorded by a delegating store in each process,
so the bounds are checked on the clock that decided: GCRA and token bucket admit at most
``capacity + 500 × span`` between their first and last admission (``span`` in server seconds),
the fixed window at most 500 per window, the sliding window counter at most 500 per grid window;
and at least 95 % of that.

For the windowed two, "at least 95 %" is judged only where the callers asked for more than the
limit: each worker records every verdict (admitted or refused) with the server's time, so each
window's demand is known. On a machine whose cores are taken by other work the four workers can
stall for part of a window and ask for less than 500 in it; under-admitting is then no fault of
the limiter. A fixed window is judged when more than 500 were asked in it (it admits the first
500 asked, whenever they come, so it must then admit exactly 500). A sliding window counter
spreads a window's permits over it (a fraction f into a window after a full one it has room for
f x 500), so demand that only came early in the window is rightly refused: a grid window is
judged when more than 500 were asked in it and one of them was refused in its final twentieth
(then it had admitted at least 500 - 500 / 20 = 95 %). Never over the limit is checked over
every window. Run with ``-s`` for the figures, which include how many windows were judged.
This module is also the worker: ``python <this file> URL …``.
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
from dataclasses import dataclass
from typing import Any

import pytest

from floodwall.ratelimit import StoreDownDecision
from floodwall.shared.global_limit import GlobalLimiter
from floodwall.stores import Arg, Op, R, Store, connect

pytestmark = pytest.mark.integration

KINDS = ("gcra", "token_bucket", "fixed_window", "sliding_window_counter")
PROCESSES = 4
TASKS = 32
SECONDS = 5.0
RATE = 500
PERIOD_US = 1_000_000
"""The limit's period (a second) in the server's microseconds."""
TAIL_US = PERIOD_US // 20
"""A window's final twentieth: a sliding counter refusing then had admitted >= 95 % of RATE."""


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
    # fail_closed: a decision the store did not make is a StoreDownDecision refusal, counted
    # apart, so every admission the callers got is one the store's replies show (with the
    # default "local", an overloaded machine's timed-out batches were admitted locally: 857 of
    # 3 979 admissions in one CI run, which the store rightly never counted)
    limiters = {
        kind: GlobalLimiter(kind, f"{RATE}/s", store=store, name=kind, on_store_error="fail_closed")
        for kind in KINDS
    }
    await store.ping_async()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # "go"
    loop = asyncio.get_running_loop()
    until = loop.time() + SECONDS
    allowed: Counter[str] = Counter()
    decided: Counter[str] = Counter()
    down: Counter[str] = Counter()
    errors: list[str] = []

    async def task(kind: str, limiter: GlobalLimiter) -> None:
        while loop.time() < until:
            try:
                decision = await limiter.acquire_async()
            except Exception as exc:
                errors.append(repr(exc))
                return
            if isinstance(decision, StoreDownDecision):
                down[kind] += 1
                continue
            decided[kind] += 1
            allowed[kind] += decision.allowed

    await asyncio.gather(*(task(kind, lim) for kind, lim in limiters.items() for _ in range(TASKS)))
    await store.aclose()
    replies: dict[str, list[Any]] = defaultdict(list)
    for key, (now, verdicts) in store.replies:
        # every verdict, refused ones too: (allowed, granted, reset_us)
        replies[key.removeprefix("rl:")].append([now, [[v[0], v[1], v[3]] for v in verdicts]])
    return {
        "allowed": allowed,
        "decided": decided,
        "down": down,
        "errors": errors,
        "batches": {kind: lim.batches for kind, lim in limiters.items()},
        "store": {  # calls the store failed, decisions given without it (on_store_error)
            kind: {k: lim.snapshot()[k] for k in ("failures", "degraded")}
            for kind, lim in limiters.items()
        },
        "replies": replies,
    }


@dataclass
class Window:
    """What was asked and admitted in one window (server µs)."""

    admitted: int = 0
    asked: int = 0
    last_refused: int = -1
    """When the last refusal in the window was given (µs; -1: none)."""


def _window_end(kind: str, now: int, reset: int) -> int:
    """The end (µs) of the window a verdict given at ``now`` fell in: the fixed window's as the
    server reported it (a window opens at the first request after the last one closed, and
    ``reset`` is the time left in it, admitted or refused); the sliding window counter's grid
    window (aligned to multiples of the period on the server's clock)."""
    if kind == "fixed_window":
        return now + reset
    return (now // PERIOD_US + 1) * PERIOD_US


def _windows(kind: str, verdicts: list[tuple[int, int, int, int]]) -> dict[int, Window]:
    """Every window's demand and admissions, keyed by its end, from ``(now, allowed, granted,
    reset)`` verdicts."""
    windows: defaultdict[int, Window] = defaultdict(Window)
    for now, allowed, granted, reset in verdicts:
        window = windows[_window_end(kind, now, reset)]
        window.asked += 1  # every request asks for one permit
        window.admitted += granted
        if not allowed:
            window.last_refused = max(window.last_refused, now)
    return dict(windows)


def _judged(kind: str, end: int, window: Window) -> bool:
    """Whether the window's demand was there to fill it (see the module's docstring)."""
    if window.asked <= RATE:
        return False
    return kind == "fixed_window" or window.last_refused >= end - TAIL_US


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
        verdicts = sorted(
            (now, allowed, granted, reset)
            for r in results
            for now, batch in r["replies"][kind]
            for allowed, granted, reset in batch
        )
        grants = [v for v in verdicts if v[1]]
        admitted = sum(v[2] for v in grants)
        allowed = sum(r["allowed"][kind] for r in results)
        store = [r["store"][kind] for r in results]
        assert admitted == allowed, ("decisions match the store", kind, admitted, allowed, store)
        decided = sum(r["decided"][kind] for r in results)
        assert len(verdicts) == decided, (
            "every verdict recorded",
            kind,
            len(verdicts),
            decided,
            store,
        )
        batches = sum(r["batches"][kind] for r in results)
        unanswered = sum(r["down"].get(kind, 0) for r in results)
        span = (grants[-1][0] - grants[0][0]) / 1_000_000
        if kind in {"gcra", "token_bucket"}:
            bound = RATE + RATE * span  # capacity (burst = 499) + rate × span
            assert admitted <= bound
            assert admitted >= 0.95 * bound, (kind, admitted, bound)
            detail = f"bound {bound:.0f} (500 + 500/s × {span:.3f} s): {admitted / bound:.1%}"
        else:
            windows = _windows(kind, verdicts)
            ends = sorted(windows)
            figures = {e: (w.admitted, w.asked) for e, w in windows.items()}
            assert all(w.admitted <= RATE for w in windows.values()), (kind, figures)
            judged = [e for e in ends if _judged(kind, e, windows[e])]
            assert judged, f"{kind}: no window with demand to judge: {figures}"
            short = {e: figures[e] for e in judged if windows[e].admitted < 0.95 * RATE}
            assert not short, f"{kind} under-admitted with demand there: {short}"
            assert admitted <= RATE * len(ends)
            detail = (
                f"admitted/asked per window {[figures[e] for e in ends]} (≤ 500 each; "
                f"{len(judged)} of {len(ends)} judged, with demand to fill them: all ≥ 95 %)"
            )
        lines.append(
            f"{kind}: admitted {admitted} of {decided} decisions in {batches} round trips "
            f"({decided / max(batches, 1):.1f} per round trip; {unanswered} refused unasked "
            f"while the store did not answer); {detail}"
        )
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    started = time.monotonic()
    outcome = asyncio.run(_hammer(sys.argv[1], sys.argv[2]))
    print(json.dumps(outcome))
