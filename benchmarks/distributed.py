"""Global rate limits on one Redis: floodwall against raw redis-py and the peer libraries.

``python benchmarks/distributed.py [--rounds N] [--sample-ms MS] [--write PATH]``

Starts its own throwaway ``redis-server`` on a free loopback port (``tests/servers.py``), then
measures **decisions per second** of every case against that one server, in one run:

* raw redis-py: ``INCR``, and ``EVALSHA`` of floodwall's own GCRA script (the round-trip floor
  every Redis limiter pays), sync and async;
* floodwall: :class:`GlobalLimiter` sync, async sequential, async with 32 concurrent tasks
  (coalesced into shared round trips), and :class:`LeasedLimiter` (100 permits per lease);
* limits (fixed window, sliding window counter; async through redis-py), pyrate-limiter
  (``RedisBucket``'s sorted-set log, and its GCRA ``StateBucket``), throttled-py (GCRA, fixed
  window).

Every limit is far above the offered rate, so every decision is an admission (the path every
request takes). Method, as ``benchmarks/run.py``: each case's batch size is calibrated so one
sample lasts about ``--sample-ms``; then in each of ``--rounds`` rounds every case takes one sample,
in a fresh random order, so the machine's drift hits all cases of a round alike; a figure is the
median over rounds, a ratio the median of the per-round ratios; the garbage collector is off
during samples. ``--write`` writes the Markdown report (default ``docs/benchmarks-distributed.md``).

``--scripts`` measures only whether the Redis store's own ``EVALSHA`` path (one command written
straight on a pooled connection, ``EVAL`` on ``NOSCRIPT``) earns its keep against redis-py's
``register_script`` (which does the same retry through ``execute_command``): the same op, keys,
arguments and parsing on the same server, by paired interleaved bursts, sync and async, and for
async also inside the same store (only the way the script is sent differs); with ``--write`` it
replaces the report's "Script path" section.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import importlib.metadata
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
import redis.asyncio  # noqa: E402

from floodwall.shared.global_limit import GlobalLimiter  # noqa: E402
from floodwall.shared.leasing import LeasedLimiter  # noqa: E402
from floodwall.stores import connect  # noqa: E402
from floodwall.stores.redis import _retried_async, load_script  # noqa: E402
from servers import RedisServer  # noqa: E402

HUGE = 1_000_000_000
"""Permits per second of every limit: nothing is ever refused."""
CONCURRENCY = 32
LEASE = 100


@dataclass
class Case:
    """One measured variant: ``run(n)`` (sync) or ``arun(n)`` (async) makes ``n`` decisions."""

    label: str
    group: str
    run: Callable[[int], object] | None = None
    arun: Callable[[int], Awaitable[object]] | None = None
    note: str = ""
    n: int = 0
    samples: list[float] = field(default_factory=list)
    """ns per decision, one per round."""

    async def time(self, n: int) -> float:
        gc.disable()
        try:
            start = time.perf_counter_ns()
            if self.run is not None:
                self.run(n)
            else:
                assert self.arun is not None
                await self.arun(n)
            return (time.perf_counter_ns() - start) / n
        finally:
            gc.enable()

    @property
    def ns(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Half the interquartile range, relative to the median."""
        q = statistics.quantiles(self.samples, n=4)
        return (q[2] - q[0]) / 2 / self.ns


def _sync(fn: Callable[[], object]) -> Callable[[int], object]:
    def run(n: int) -> None:
        for _ in repeat(None, n):
            fn()

    return run


def _async(fn: Callable[[], Awaitable[object]]) -> Callable[[int], Awaitable[object]]:
    async def run(n: int) -> None:
        for _ in repeat(None, n):
            await fn()

    return run


def _concurrent(fn: Callable[[], Awaitable[object]]) -> Callable[[int], Awaitable[object]]:
    async def task(n: int) -> None:
        for _ in repeat(None, n):
            await fn()

    async def run(n: int) -> None:
        share = max(1, n // CONCURRENCY)
        await asyncio.gather(*(task(share) for _ in range(CONCURRENCY)))

    return run


def _admit(result: object) -> None:
    if not result:
        raise AssertionError(f"a benchmark decision was refused: {result!r}")


async def build(url: str) -> tuple[list[Case], Callable[[], Awaitable[None]]]:
    """Every case, on the server at ``url``; and how to close their clients."""
    client: Any = redis.Redis.from_url(url)
    aclient: Any = redis.asyncio.Redis.from_url(url)
    script = load_script("ratelimit_gcra")
    client.script_load(script.source)
    store = connect(url, prefix="bench:")
    rate = f"{HUGE}/s"
    gcra = GlobalLimiter("gcra", rate, store=store, name="gcra", on_store_error="fail_open")
    fixed = GlobalLimiter("fixed", rate, store=store, name="fixed", on_store_error="fail_open")
    leased = LeasedLimiter("gcra", rate, store=store, name="leased", lease=LEASE)
    argv = [*gcra.plan.params, 1, 1]

    def raw_evalsha() -> object:
        return client.execute_command("EVALSHA", script.sha, 1, "raw:{gcra}", *argv)

    async def raw_evalsha_async() -> object:
        return await aclient.execute_command("EVALSHA", script.sha, 1, "raw:{agcra}", *argv)

    def check(fn: Callable[[], Any]) -> Callable[[], None]:
        _admit(fn())
        return fn

    cases = [
        Case("raw INCR (redis-py)", "sync", _sync(lambda: client.incr("raw:incr"))),
        Case("raw EVALSHA, floodwall's GCRA script (redis-py)", "sync", _sync(raw_evalsha)),
        Case("floodwall GlobalLimiter gcra", "sync", _sync(check(gcra.try_acquire))),
        Case("floodwall GlobalLimiter fixed_window", "sync", _sync(check(fixed.try_acquire))),
        Case(
            f"floodwall LeasedLimiter gcra, lease={LEASE}",
            "sync",
            _sync(check(leased.try_acquire)),
            note="one round trip per 100 decisions",
        ),
    ]
    cases += peers_sync(url, check)
    cases += [
        Case("raw EVALSHA (redis.asyncio), sequential", "async", arun=_async(raw_evalsha_async)),
        Case(
            f"raw EVALSHA (redis.asyncio), {CONCURRENCY} concurrent",
            "async",
            arun=_concurrent(raw_evalsha_async),
            note="one pooled connection per task",
        ),
        Case(
            "floodwall GlobalLimiter gcra, sequential", "async", arun=_async(gcra.try_acquire_async)
        ),
        Case(
            f"floodwall GlobalLimiter gcra, {CONCURRENCY} concurrent",
            "async",
            arun=_concurrent(gcra.try_acquire_async),
            note="coalesced: one EVALSHA per batch",
        ),
        Case(
            f"floodwall LeasedLimiter gcra, lease={LEASE}, {CONCURRENCY} concurrent",
            "async",
            arun=_concurrent(leased.try_acquire_async),
        ),
    ]
    cases += await peers_async(url)
    for case in cases:
        if case.run is None and case.arun is None:
            continue
        if case.run is not None:
            case.run(1)
        elif case.arun is not None:
            await case.arun(CONCURRENCY)

    async def close() -> None:
        client.close()
        await aclient.aclose()
        await store.aclose()

    return cases, close


def peers_sync(url: str, check: Callable[[Callable[[], Any]], Callable[[], Any]]) -> list[Case]:
    from limits import parse, storage, strategies
    from pyrate_limiter import (
        GCRA,
        Duration,
        Limiter,
        Rate,
        RedisBucket,
        RedisStateStore,
        StateBucket,
    )
    from throttled import RedisStore, Throttled, rate_limiter

    item = parse(f"{HUGE}/second")
    limits_store = storage.RedisStorage(url)
    fixed = strategies.FixedWindowRateLimiter(limits_store)
    sliding = strategies.SlidingWindowCounterRateLimiter(limits_store)
    client = redis.Redis.from_url(url)
    rates = [Rate(HUGE, Duration.SECOND)]
    pyrate_log = Limiter(RedisBucket.init(rates, client, "pyrate:log"))
    pyrate_gcra = Limiter(
        StateBucket(rates, algorithm=GCRA(), store=RedisStateStore(client, "pyrate:gcra"))
    )
    quota = rate_limiter.per_sec(HUGE)
    throttled_store = RedisStore(server=url)
    t_gcra = Throttled(key="t:gcra", using="gcra", quota=quota, store=throttled_store)
    t_fixed = Throttled(key="t:fixed", using="fixed_window", quota=quota, store=throttled_store)
    return [
        Case("limits FixedWindowRateLimiter", "sync", _sync(check(lambda: fixed.hit(item, "b")))),
        Case(
            "limits SlidingWindowCounterRateLimiter",
            "sync",
            _sync(check(lambda: sliding.hit(item, "b"))),
        ),
        Case(
            "pyrate-limiter RedisBucket (log)",
            "sync",
            _sync(check(lambda: pyrate_log.try_acquire("b", blocking=False))),
        ),
        Case(
            "pyrate-limiter StateBucket GCRA",
            "sync",
            _sync(check(lambda: pyrate_gcra.try_acquire("b", blocking=False))),
        ),
        Case(
            "throttled-py gcra",
            "sync",
            _sync(check(lambda: not t_gcra.limit().limited)),
        ),
        Case(
            "throttled-py fixed_window",
            "sync",
            _sync(check(lambda: not t_fixed.limit().limited)),
        ),
    ]


async def peers_async(url: str) -> list[Case]:
    from limits import parse
    from limits.aio import storage, strategies

    item = parse(f"{HUGE}/second")
    store = storage.RedisStorage("async+" + url, implementation="redispy")
    fixed = strategies.FixedWindowRateLimiter(store)

    async def hit() -> bool:
        return await fixed.hit(item, "ab")

    _admit(await hit())
    return [
        Case("limits FixedWindowRateLimiter (aio), sequential", "async", arun=_async(hit)),
        Case(
            f"limits FixedWindowRateLimiter (aio), {CONCURRENCY} concurrent",
            "async",
            arun=_concurrent(hit),
        ),
    ]


async def calibrate(case: Case, sample_ms: float) -> None:
    n = CONCURRENCY
    while True:
        ns = await case.time(n)
        if ns * n >= sample_ms * 1e6 / 4 or n >= 10_000_000:
            break
        n *= 4
    case.n = max(CONCURRENCY, int(sample_ms * 1e6 / ns))


async def measure(cases: list[Case], rounds: int, sample_ms: float) -> None:
    for case in cases:
        await calibrate(case, sample_ms)
    rng = random.Random(0)
    for _ in range(rounds):
        order = cases[:]
        rng.shuffle(order)
        for case in order:
            case.samples.append(await case.time(case.n))
            await asyncio.sleep(0)
        gc.collect()


def ratio(a: Case, b: Case) -> tuple[float, float, float]:
    """Median and quartiles of ``a``'s time over ``b``'s, per round."""
    per = sorted(x / y for x, y in zip(a.samples, b.samples, strict=True))
    q = statistics.quantiles(per, n=4)
    return statistics.median(per), q[0], q[2]


async def paired(a: Case, b: Case, pairs: int, burst: int) -> tuple[float, float, float]:
    """``a``'s time per decision over ``b``'s, from ``pairs`` back-to-back bursts of ``burst``
    decisions each (a then b, b then a, alternately): median and quartiles of the ratios.

    Finer than rounds of long samples: the two bursts of a pair are milliseconds apart, so the
    machine's drift cancels out of each ratio.
    """
    per = []
    for n in range(pairs):
        first, second = (a, b) if n % 2 else (b, a)
        times = {id(first): await first.time(burst), id(second): await second.time(burst)}
        per.append(times[id(a)] / times[id(b)])
    q = statistics.quantiles(per, n=4)
    return statistics.median(per), q[0], q[2]


@dataclass
class Target:
    text: str
    value: float
    low: float
    high: float
    limit: float
    at_least: bool

    @property
    def ok(self) -> bool:
        return self.value >= self.limit if self.at_least else self.value <= self.limit


async def targets(cases: list[Case], pairs: int) -> list[Target]:
    """The issue's three targets (and one more figure), each from :func:`paired` bursts."""
    by = {c.label: c for c in cases}
    raw = by["raw EVALSHA, floodwall's GCRA script (redis-py)"]
    sync = by["floodwall GlobalLimiter gcra"]
    seq = by["floodwall GlobalLimiter gcra, sequential"]
    conc = by[f"floodwall GlobalLimiter gcra, {CONCURRENCY} concurrent"]
    leased = by[f"floodwall LeasedLimiter gcra, lease={LEASE}"]
    limits_fixed = by["limits FixedWindowRateLimiter"]
    raw_async = by["raw EVALSHA (redis.asyncio), sequential"]
    goals = [
        ("sequential decision (sync) ≤ 1.1 × a raw EVALSHA round trip", sync, raw, 100, 1.1),
        (
            f"{CONCURRENCY} concurrent async decisions ≥ 5 × the sequential async rate",
            seq, conc, 320, 5.0,
        ),
        ("leased (sync) ≥ 20 × limits' Redis fixed window", limits_fixed, leased, 100, 20.0),
        ("(not a target) sequential async ≤ 1.1 × raw async EVALSHA", seq, raw_async, 100, 1.1),
    ]  # fmt: skip
    out = []
    for text, a, b, burst, limit in goals:
        value, low, high = await paired(a, b, pairs, burst)
        out.append(Target(text, value, low, high, limit, at_least=limit > 2))
    return out


async def script_path(url: str, pairs: int, burst: int) -> list[tuple[str, Target]]:
    """The store's op path over redis-py's ``register_script`` of the same Lua script: alone
    (sync, async), and for async inside the same store (the store's turn-taking, deadline and
    parsing around both, so only the way the script is sent differs)."""
    store: Any = connect(url, prefix="bench:")
    other: Any = connect(url, prefix="bench:")  # the same store, sending by register_script
    gcra = GlobalLimiter("gcra", f"{HUGE}/s", store=store, name="gcra")
    op, argv = gcra.plan.op, [*gcra.plan.params, 1, 1]
    source = load_script(op.script).source
    keys, akeys = store.keys(op, "script"), store.keys(op, "ascript")
    client = store.client()
    aclient = await store.async_client()
    registered, aregistered = client.register_script(source), aclient.register_script(source)
    oclient = await other.async_client()
    other._arunners[asyncio.get_running_loop()] = {
        op.script: partial(_retried_async, oclient.register_script(source))
    }

    def ours() -> object:
        return store.apply(op, "script", argv)

    def theirs() -> object:
        return op.parse(registered(keys, argv))

    async def aours() -> object:
        return await store.apply_async(op, "ascript", argv)

    async def atheirs() -> object:
        return op.parse(await aregistered(akeys, argv))

    async def astore_theirs() -> object:
        return await other.apply_async(op, "ascript", argv)

    for fn in (ours, theirs):
        _admit(fn())
    for afn in (aours, atheirs, astore_theirs):
        _admit(await afn())
    sides = [
        ("sync", Case("store", "sync", _sync(ours)), Case("script", "sync", _sync(theirs))),
        (
            "async",
            Case("store", "async", arun=_async(aours)),
            Case("script", "async", arun=_async(atheirs)),
        ),
        (
            "async, inside the store",
            Case("store", "async", arun=_async(aours)),
            Case("store by register_script", "async", arun=_async(astore_theirs)),
        ),
    ]
    out = []
    try:
        for group, a, b in sides:
            value, low, high = await paired(a, b, pairs, burst)
            text = f"{group}: the store's time per op over register_script's"
            out.append((group, Target(text, value, low, high, 1.0, at_least=False)))
    finally:
        for each in (store, other):
            await each.aclose()
            each.close()
    return out


def script_report(found: list[tuple[str, Target]], args: argparse.Namespace) -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "## Script path: the store's EVALSHA against redis-py's register_script",
        "",
        f"- Command: `.venv/bin/python benchmarks/distributed.py --scripts --pairs {args.pairs} "
        f"--write {args.write or 'docs/benchmarks-distributed.md'}`",
        f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; load average "
        f"(1, 5, 15 min) at the end: {load} on {os.cpu_count()} CPUs; Redis {args.redis_version}, "
        f"redis-py {redis.__version__}",
        f"- Method: {args.pairs} pairs of back-to-back bursts of {SCRIPT_BURST} decisions "
        "(alternating which goes first) of `GlobalLimiter`'s GCRA op through the store and "
        "through `register_script` of the same script (same keys, arguments, parsing); "
        "*inside the store*: the same store op both ways, its script sent by the store's own "
        "path or by `register_script` (what choosing one of them changes); the figure is the "
        "median of the pairs' time ratios, below 1 when the store's own path is faster.",
        "",
        "| path | store ÷ register_script | pairs' range (p25–p75) |",
        "| --- | ---: | ---: |",
    ]
    for group, goal in found:
        lines.append(f"| {group} | {goal.value:.3f} × | {goal.low:.3f}–{goal.high:.3f} |")
    return "\n".join(lines) + "\n"


SCRIPT_BURST = 50
SCRIPT_HEADING = "## Script path:"


def replace_section(text: str, section: str) -> str:
    """``text`` with its "Script path" section (up to the next ``## ``) replaced by ``section``,
    or ``section`` appended."""
    start = text.find(SCRIPT_HEADING)
    if start < 0:
        return text.rstrip("\n") + "\n\n" + section
    end = text.find("\n## ", start + 1)
    rest = "" if end < 0 else text[end + 1 :]
    return text[:start] + section + ("\n" + rest if rest else "")


def report(cases: list[Case], goals: list[Target], args: argparse.Namespace, took: float) -> str:
    ref = next(c for c in cases if c.label.startswith("raw EVALSHA, floodwall"))
    versions = ", ".join(
        f"{p} {importlib.metadata.version(p)}"
        for p in ("floodwall", "redis", "limits", "pyrate-limiter", "throttled-py")
    )
    server = redis.__version__
    lines = [
        "# Benchmarks: global rate limits on Redis",
        "",
        "Decisions per second against one local Redis, every decision an admission. Written",
        "by `benchmarks/distributed.py` (it starts its own `redis-server`); **only ratios",
        "within one run mean anything**: these small shared machines drift by tens of percent.",
        "",
        "## This run",
        "",
        f"- Command: `.venv/bin/python benchmarks/distributed.py --write {args.write}`",
        f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"the run took {took:.0f} s",
        f"- Python {platform.python_version()} on {platform.platform()}; "
        f"{os.cpu_count()} CPUs (Redis and the client share them)",
        f"- Redis: {args.redis_version}, loopback TCP; redis-py {server}, no hiredis",
        f"- Packages: {versions}",
        f"- Method: {args.rounds} rounds of one ~{args.sample_ms:g} ms sample per case, cases in "
        "random order each round, garbage collector off during samples; figures are medians "
        "over rounds, `±` half the interquartile range; `× raw EVALSHA` is the median per-round "
        "ratio of this case's time per decision to a raw sync `EVALSHA` of the same script.",
        f"- Targets: measured apart from the tables, by {args.pairs} pairs of back-to-back bursts "
        "(100 decisions; 320 for the concurrent case) of the two cases compared, in alternating "
        "order; the figure is the median of the pairs' ratios of decision rates (of times, for "
        "the ≤ targets), with its interquartile range.",
        "",
        "## Targets",
        "",
        "| target | measured | pairs' range (p25–p75) | limit | result |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for goal in goals:
        sign = "≥" if goal.at_least else "≤"
        lines.append(
            f"| {goal.text} | {goal.value:.2f} × | {goal.low:.2f}–{goal.high:.2f} | "
            f"{sign} {goal.limit:g} | **{'PASS' if goal.ok else 'FAIL'}** |"
        )
    for group in ("sync", "async"):
        lines += [
            "",
            f"## {group}",
            "",
            "| case | decisions/s | µs/decision | ± | × raw EVALSHA | note |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for case in (c for c in cases if c.group == group):
            lines.append(
                f"| {case.label} | {1e9 / case.ns:,.0f} | {case.ns / 1000:.1f} | "
                f"{100 * case.spread:.0f} % | {ratio(case, ref)[0]:.2f} | {case.note} |"
            )
    return "\n".join(lines) + "\n"


async def main(args: argparse.Namespace) -> str:
    started = time.monotonic()
    with RedisServer() as server:
        info = redis.Redis.from_url(server.url).info("server")
        args.redis_version = info["redis_version"]
        if args.scripts:
            return script_report(await script_path(server.url, args.pairs, SCRIPT_BURST), args)
        cases, close = await build(server.url)
        try:
            await measure(cases, args.rounds, args.sample_ms)
            goals = await targets(cases, args.pairs)
        finally:
            await close()
    return report(cases, goals, args, time.monotonic() - started)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--sample-ms", type=float, default=150.0)
    parser.add_argument("--pairs", type=int, default=120, help="burst pairs per target")
    parser.add_argument("--write", default="", help="write the Markdown report here")
    parser.add_argument(
        "--scripts", action="store_true", help="only the store's EVALSHA vs register_script"
    )
    options = parser.parse_args()
    text = asyncio.run(main(options))
    print(text)
    if options.write:
        path = Path(options.write)
        old = path.read_text() if path.exists() else ""
        if options.scripts:
            text = replace_section(old, text)
        elif SCRIPT_HEADING in old:  # a full run keeps the last script-path figures
            text = replace_section(text, old[old.find(SCRIPT_HEADING) :])
        path.write_text(text)
