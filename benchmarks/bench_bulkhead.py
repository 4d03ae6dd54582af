"""Bulkheads: floodwall beside a bare semaphore and hyx's bulkhead; the price of a thread pool.

The protected function is the cheapest possible (``return 1``), so the figures are what each
bulkhead adds to an uncontended call (a slot is free): admit, run, release. A bare
``asyncio.Semaphore`` is the floor an async bulkhead is measured against: it bounds concurrency
too, but only within one event loop, with no queue bound, no wait bound, no figures and (in
3.11) no strict FIFO; floodwall's bulkhead also takes a thread lock twice, because the same
bulkhead guards sync callers on other threads.

A peer that is not installed or fails to set up becomes a skipped row with the reason.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat

import floodwall
from _harness import Case, Target

ASYNC = "bulkhead, async, a slot free"
SYNC = "bulkhead, sync, a slot free"
FULL = "bulkhead refusal, all slots busy"
POOL = "thread-pool isolation, one sync call"

PLAIN_AWAIT = "plain await f()"
SEMAPHORE = "async with asyncio.Semaphore(10): await f()"
FW_CALL_ASYNC = "floodwall await bulkhead.call_async(f)"
FW_DECO_ASYNC = "floodwall @Bulkhead (async def)"
FW_WITH_ASYNC = "floodwall async with bulkhead: await f()"
PLAIN_CALL = "plain call f()"
THREAD_SEMAPHORE = "with threading.Semaphore(10): f()"
FW_CALL = "floodwall bulkhead.call(f)"
FW_DECO = "floodwall @Bulkhead"
BARE_RAISE = "bare raise-and-catch, one frame"
FW_FULL = "floodwall @Bulkhead, full"
EXECUTOR = "ThreadPoolExecutor.submit(f).result()"
FW_POOL = "floodwall ThreadPoolBulkhead.call(f)"


def f() -> int:
    return 1


async def af() -> int:
    return 1


def _peer(group: str, label: str, build: Callable[[str, str], Case]) -> Case:
    try:
        return build(group, label)
    except Exception as exc:
        return Case(group, label, skip=f"could not be set up: {type(exc).__name__}: {exc}")


# -- async -------------------------------------------------------------------------------------


def _hyx_with(group: str, label: str) -> Case:
    from hyx.bulkhead import bulkhead

    guard = bulkhead(max_concurrency=10, max_capacity=20)

    async def run(n: int) -> None:
        for _ in repeat(None, n):
            async with guard:
                await af()

    return Case(group, label, aloop=run, note="two asyncio.Semaphore (capacity, concurrency)")


def _hyx_decorator(group: str, label: str) -> Case:
    from hyx.bulkhead import bulkhead

    return Case(group, label, afn=bulkhead(max_concurrency=10, max_capacity=20)(af))


def _async_cases() -> list[Case]:
    semaphore = asyncio.Semaphore(10)
    explicit = floodwall.Bulkhead("bench-call", max_concurrent=10)
    block = floodwall.Bulkhead("bench-with", max_concurrent=10)

    async def bare(n: int) -> None:
        for _ in repeat(None, n):
            async with semaphore:
                await af()

    async def call(n: int) -> None:
        for _ in repeat(None, n):
            await explicit.call_async(af)

    async def within(n: int) -> None:
        for _ in repeat(None, n):
            async with block:
                await af()

    return [
        Case(ASYNC, PLAIN_AWAIT, afn=af, ref="plain"),
        Case(ASYNC, SEMAPHORE, aloop=bare, ref="semaphore"),
        Case(ASYNC, FW_CALL_ASYNC, aloop=call),
        Case(ASYNC, FW_DECO_ASYNC, afn=floodwall.Bulkhead("bench-deco", max_concurrent=10)(af)),
        Case(ASYNC, FW_WITH_ASYNC, aloop=within),
        _peer(ASYNC, "hyx async with bulkhead(10, 20)", _hyx_with),
        _peer(ASYNC, "hyx @bulkhead(10, 20)", _hyx_decorator),
    ]


# -- sync --------------------------------------------------------------------------------------


def _sync_cases() -> list[Case]:
    semaphore = threading.Semaphore(10)
    explicit = floodwall.Bulkhead("bench-sync-call", max_concurrent=10)
    block = floodwall.Bulkhead("bench-sync-with", max_concurrent=10)

    def bare(n: int) -> None:
        for _ in repeat(None, n):
            with semaphore:
                f()

    def call(n: int) -> None:
        for _ in repeat(None, n):
            explicit.call(f)

    def within(n: int) -> None:
        for _ in repeat(None, n):
            with block:
                f()

    return [
        Case(SYNC, PLAIN_CALL, fn=f, ref="plain"),
        Case(
            SYNC,
            THREAD_SEMAPHORE,
            loop=bare,
            ref="threading.Semaphore",
            note="a Python-level class around a Condition",
        ),
        Case(SYNC, FW_CALL, loop=call),
        Case(SYNC, FW_DECO, fn=floodwall.Bulkhead("bench-sync-deco", max_concurrent=10)(f)),
        Case(SYNC, "floodwall with bulkhead: f()", loop=within),
        Case(SYNC, "hyx", skip="hyx 0.0.2 has no sync bulkhead."),
    ]


# -- refusal -----------------------------------------------------------------------------------


def bare_raise(n: int) -> None:
    for _ in repeat(None, n):
        try:
            raise ValueError("x")
        except ValueError:
            pass


def _hyx_full(group: str, label: str) -> Case:
    from hyx.bulkhead import bulkhead
    from hyx.bulkhead.exceptions import BulkheadFull

    guard = bulkhead(max_concurrency=1, max_capacity=1)
    fn = guard(af)
    hold: asyncio.Event | None = None

    async def run(n: int) -> None:
        nonlocal hold
        hold = asyncio.Event()

        async def occupy() -> None:
            assert hold is not None
            async with guard:
                await hold.wait()

        holder = asyncio.create_task(occupy())
        await asyncio.sleep(0)
        try:
            for _ in repeat(None, n):
                try:  # noqa: SIM105 - contextlib.suppress would add its own cost to the figure
                    await fn()
                except BulkheadFull:
                    pass
        finally:
            hold.set()
            await holder

    return Case(group, label, aloop=run)


def _full_cases() -> list[Case]:
    full = floodwall.Bulkhead("bench-full", max_concurrent=1)
    full.acquire()  # held for the whole run
    return [
        Case(FULL, BARE_RAISE, loop=bare_raise, ref="bare raise"),
        Case(FULL, FW_FULL, fn=full(f), raises=floodwall.BulkheadFullError),
        _peer(FULL, "hyx @bulkhead(1, 1), full", _hyx_full),
    ]


# -- thread pools ------------------------------------------------------------------------------


def _pool_cases() -> list[Case]:
    executor = ThreadPoolExecutor(10)
    pool = floodwall.ThreadPoolBulkhead("bench-pool", max_workers=10)
    semaphore = floodwall.Bulkhead("bench-pool-semaphore", max_concurrent=10)

    def submit(n: int) -> None:
        for _ in repeat(None, n):
            executor.submit(f).result()

    def isolated(n: int) -> None:
        for _ in repeat(None, n):
            pool.call(f)

    def guarded(n: int) -> None:
        for _ in repeat(None, n):
            semaphore.call(f)

    return [
        Case(POOL, PLAIN_CALL, fn=f, ref="plain"),
        Case(POOL, "floodwall Bulkhead.call(f) (semaphore)", loop=guarded),
        Case(POOL, EXECUTOR, loop=submit, ref="executor"),
        Case(
            POOL,
            FW_POOL,
            loop=isolated,
            note="admission count, a context copy, the executor's hand-off to a worker thread "
            "and back",
        ),
    ]


def cases() -> list[Case]:
    return [*_async_cases(), *_sync_cases(), *_full_cases(), *_pool_cases()]


def targets() -> list[Target]:
    return [
        Target(
            ASYNC, FW_CALL_ASYNC, SEMAPHORE, 2.0, "bulkhead `call_async` ≤ 2 × asyncio.Semaphore"
        ),
        Target(
            ASYNC,
            FW_DECO_ASYNC,
            SEMAPHORE,
            2.0,
            "bulkhead `@Bulkhead` (async) ≤ 2 × asyncio.Semaphore",
        ),
        Target(
            ASYNC, FW_WITH_ASYNC, SEMAPHORE, 2.0, "bulkhead `async with` ≤ 2 × asyncio.Semaphore"
        ),
        Target(
            SYNC, FW_CALL, THREAD_SEMAPHORE, None, "sync bulkhead `call` vs threading.Semaphore"
        ),
        Target(FULL, FW_FULL, BARE_RAISE, None, "bulkhead refusal vs a bare raise-and-catch"),
        Target(POOL, FW_POOL, EXECUTOR, None, "thread-pool bulkhead vs a bare ThreadPoolExecutor"),
    ]
