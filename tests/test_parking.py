"""The core parking lot: one queue for threads and tasks, bounded waits, no slot lost on give-up."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Literal

import pytest

import floodwall as fw
from floodwall._core.parking import TIMED_OUT, Lot, Park, TaskWaiter, ThreadWaiter, Waiter
from floodwall.adaptive import AdaptiveLimiter, FixedLimit


async def _until(ready: Callable[[], bool], *, seconds: float = 5.0) -> None:
    """Let the loop (and other threads) run until ``ready()``, at most ``seconds``."""
    for _ in range(int(seconds / 0.001)):
        if ready():
            return
        await asyncio.sleep(0.001)
    pytest.fail("the waiters never parked")


class Owner:
    """A one-slot owner: grants when free, parks otherwise, counts what is passed on."""

    def __init__(self, size: int = 4, order: Literal["fifo", "lifo"] = "fifo") -> None:
        self.lock = threading.Lock()
        self.lot = Lot(self.lock, size, order)
        self.free = 0
        self.passed: list[object] = []

    def join(self, waiter: Waiter, budget: float) -> bool:
        with self.lock:
            if self.free:
                self.free -= 1
                waiter.value = "now"
                return True
            if budget <= 0 or not self.lot.park(waiter):
                waiter.value = "refused"
                return True
            return False

    def pass_on(self, value: object) -> None:
        self.passed.append(value)

    def grant(self, value: object) -> bool:
        with self.lock:
            waiter = self.lot.next()
            return waiter is not None and self.lot.hand(waiter, value)


def test_the_lot_serves_oldest_or_newest_first_and_is_bounded() -> None:
    orders: list[tuple[Literal["fifo", "lifo"], list[str]]] = [
        ("fifo", ["a", "b"]),
        ("lifo", ["b", "a"]),
    ]
    for order, expected in orders:
        owner = Owner(size=2, order=order)
        first, second, third = ThreadWaiter("a"), ThreadWaiter("b"), ThreadWaiter("c")
        with owner.lock:
            assert owner.lot.park(first) and owner.lot.park(second)
            assert not owner.lot.park(third)  # full: the owner refuses beyond ``size``
            served = []
            while (waiter := owner.lot.next()) is not None:
                assert owner.lot.hand(waiter, waiter.tag)
                served.append(waiter.value)
        assert served == expected
        assert len(owner.lot) == 0


def test_a_granted_waiter_that_gives_up_keeps_its_grant_and_a_pending_one_leaves() -> None:
    owner = Owner()
    granted, pending = ThreadWaiter(), ThreadWaiter()
    with owner.lock:
        owner.lot.park(granted)
        owner.lot.park(pending)
    assert owner.grant("slot")
    assert owner.lot.leave(granted) == (True, "slot")
    assert owner.lot.leave(pending) == (False, None)
    assert len(owner.lot) == 0  # a waiter that gave up leaves the queue at once


def test_a_waiter_on_a_closed_loop_is_skipped() -> None:
    owner = Owner()
    loop = asyncio.new_event_loop()
    gone = TaskWaiter(loop)
    loop.close()
    thread = ThreadWaiter()
    with owner.lock:
        owner.lot.park(gone)
        owner.lot.park(thread)
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.extend([owner.grant(1), owner.grant(2)]))
    worker.start()  # another thread than the loop's: waking goes through the (closed) loop
    worker.join(5)
    assert results == [False, True]
    assert thread.lock.acquire(blocking=False)
    assert thread.value == 2


def test_a_thread_waits_on_the_owners_clock_and_times_out() -> None:
    clock = fw.FakeClock()
    owner = Owner()
    step = Park(owner, owner.lot, clock, 2.0)
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(step.run()))
    worker.start()
    while not len(owner.lot):
        os.sched_yield()
    clock.advance(2.0)
    worker.join(5)
    assert results == [TIMED_OUT]
    assert len(owner.lot) == 0


def test_a_thread_is_woken_with_its_grant() -> None:
    owner = Owner()
    step = Park(owner, owner.lot, fw.SYSTEM_CLOCK, 30.0)
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(step.run()))
    worker.start()
    while not len(owner.lot):
        os.sched_yield()
    assert owner.grant("token")
    worker.join(5)
    assert results == ["token"]


async def test_a_task_times_out_on_the_clock_or_is_granted() -> None:
    clock = fw.FakeClock()
    owner = Owner()
    late = asyncio.create_task(Park(owner, owner.lot, clock, 1.0).arun())
    served = asyncio.create_task(Park(owner, owner.lot, clock, 10.0).arun())
    await _until(lambda: clock.pending_sleepers == 2)
    clock.advance(1.0)
    assert await late is TIMED_OUT
    assert owner.grant("slot")
    assert await served == "slot"
    assert len(owner.lot) == 0


async def test_a_task_cancelled_after_its_grant_passes_it_on() -> None:
    owner = Owner()
    task = asyncio.create_task(Park(owner, owner.lot, fw.SYSTEM_CLOCK, 30.0).arun())
    await asyncio.sleep(0)
    assert owner.grant("slot")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert owner.passed == ["slot"]


async def test_no_wait_allowed_or_a_free_slot_settle_at_once() -> None:
    owner = Owner()
    assert Park(owner, owner.lot, fw.SYSTEM_CLOCK, 0.0).run() == "refused"
    assert await Park(owner, owner.lot, fw.SYSTEM_CLOCK, 0.0).arun() == "refused"
    owner.free = 2
    assert Park(owner, owner.lot, fw.SYSTEM_CLOCK, 1.0).run() == "now"
    assert await Park(owner, owner.lot, fw.SYSTEM_CLOCK, 1.0).arun() == "now"


async def test_threads_and_tasks_share_one_queue_in_arrival_order() -> None:
    bulkhead = fw.Bulkhead(max_concurrent=1, max_queue=2, max_wait=30)
    bulkhead.acquire()
    order: list[str] = []
    thread = threading.Thread(target=lambda: bulkhead.call(order.append, "thread"))
    thread.start()
    await _until(lambda: bulkhead.queued == 1)

    async def append() -> None:
        order.append("task")

    task = asyncio.create_task(bulkhead.call_async(append))
    await _until(lambda: bulkhead.queued == 2)
    bulkhead.release()  # to the thread (it came first), which passes it to the task
    await asyncio.wait_for(task, 5)
    thread.join(5)
    assert order == ["thread", "task"]
    assert (bulkhead.in_flight, bulkhead.queued) == (0, 0)


def test_an_adaptive_limiters_thread_waits_on_its_clock() -> None:
    clock = fw.FakeClock()
    limiter = AdaptiveLimiter(FixedLimit(1), backlog_size=1, backlog_timeout=5, clock=clock)
    holder = limiter.acquire()
    assert holder is not None
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(limiter.acquire_blocking()))
    worker.start()
    while limiter.backlog == 0:
        os.sched_yield()
    clock.advance(5)
    worker.join(5)
    assert results == [None]
    assert limiter.backlog == 0
    holder.success()
    assert limiter.inflight == 0
