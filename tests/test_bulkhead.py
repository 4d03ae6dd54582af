"""Bulkheads: bounded concurrency, FIFO waits, thread pools, and the seeds' isolation example."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import statistics
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, assert_type

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall import Bulkhead, BulkheadFullError, ThreadPoolBulkhead, pool_size
from floodwall._core.outcome import Kind


async def settle(rounds: int = 8) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


# -- basics ------------------------------------------------------------------------------------


def test_admits_up_to_max_concurrent_then_refuses_with_the_figures() -> None:
    bulkhead = Bulkhead("reviews", max_concurrent=2)
    bulkhead.acquire()
    bulkhead.acquire()
    with pytest.raises(BulkheadFullError) as caught:
        bulkhead.call(lambda: None)
    error = caught.value
    assert error.kind == "bulkhead_full"
    assert (error.name, error.reason, error.retry_after) == ("reviews", "full", None)
    assert (error.max_concurrent, error.max_queue, error.in_flight, error.queued) == (2, 0, 2, 0)
    assert str(error) == "'reviews' rejected the call: full (2/2 in flight, 0/0 queued)"
    assert bulkhead.rejected == 1
    bulkhead.release()
    assert bulkhead.call(lambda: "ok") == "ok"
    assert (bulkhead.in_flight, bulkhead.available) == (1, 1)


def test_the_error_stays_cheap_and_compatible() -> None:
    plain = BulkheadFullError("bh", "20 in flight")
    assert plain.max_concurrent is None
    assert str(plain) == "'bh' rejected the call: 20 in flight"
    assert isinstance(plain, fw.RejectedError)


def test_options_are_validated_loudly() -> None:
    with pytest.raises(fw.ConfigError, match="max_concurrent must be an integer >= 1, got 0"):
        Bulkhead(max_concurrent=0)
    with pytest.raises(fw.ConfigError, match="max_queue"):
        Bulkhead(max_queue=-1)
    with pytest.raises(fw.ConfigError, match="max_wait"):
        Bulkhead(max_wait=-1)
    with pytest.raises(fw.ConfigError, match="max_workers"):
        ThreadPoolBulkhead(max_workers=0)


def test_slots_are_released_on_errors_and_work_as_context_managers() -> None:
    bulkhead = Bulkhead(max_concurrent=1)
    with pytest.raises(ZeroDivisionError):
        bulkhead.call(lambda: 1 / 0)
    with bulkhead:
        assert bulkhead.in_flight == 1
    assert bulkhead.in_flight == 0


def test_a_subclass_release_is_called_when_a_call_ends() -> None:
    """A subclass's own ``release`` runs when a call ends (``record`` gives the slot back)."""
    released: list[int] = []

    class Counted(Bulkhead):
        def release(self) -> None:
            released.append(self.in_flight)
            super().release()

    bulkhead = Counted(max_concurrent=1)
    assert bulkhead.call(lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        bulkhead.call(lambda: 1 / 0)
    assert released == [1, 1]
    assert bulkhead.in_flight == 0
    assert Counted.untimed


async def test_async_context_manager_and_decorator() -> None:
    bulkhead = Bulkhead(max_concurrent=1)

    @bulkhead
    async def work() -> int:
        return bulkhead.in_flight

    assert await work() == 1
    async with bulkhead:
        with pytest.raises(BulkheadFullError):
            await work()
    assert bulkhead.in_flight == 0


def test_refusals_are_events_and_the_breaker_counts_them_as_rejections() -> None:
    events: list[fw.Event] = []
    bulkhead = Bulkhead("db", max_concurrent=1, listeners=[events.append])
    breaker = fw.CircuitBreaker("db")
    bulkhead.acquire()
    with pytest.raises(BulkheadFullError) as caught:
        fw.Pipeline(breaker, bulkhead).call(lambda: None)
    assert breaker.classify(caught.value) is Kind.REJECTED
    assert events[0].kind == "rejected"
    assert events[0].figures == {"max_concurrent": 1, "max_queue": 0, "in_flight": 1, "queued": 0}
    assert bulkhead.describe() == "Bulkhead('db', max_concurrent=1, max_queue=0, max_wait=0s)"


# -- waiting (async, on a fake clock) ----------------------------------------------------------


async def test_async_waiters_are_served_first_come_first_served() -> None:
    clock = fw.FakeClock()
    bulkhead = Bulkhead(max_concurrent=1, max_queue=5, max_wait=10, clock=clock)
    order: list[int] = []
    gates = [asyncio.Event() for _ in range(4)]

    async def user(i: int) -> None:
        async def work() -> None:
            order.append(i)
            await gates[i].wait()

        await bulkhead.call_async(work)

    tasks = []
    for i in range(4):
        tasks.append(asyncio.create_task(user(i)))
        await settle()
    assert (bulkhead.in_flight, bulkhead.queued) == (1, 3)
    for i in range(4):
        gates[i].set()
        await settle()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3]
    assert (bulkhead.in_flight, bulkhead.queued) == (0, 0)


async def test_a_full_queue_refuses_and_a_waiter_gives_up_after_max_wait() -> None:
    clock = fw.FakeClock()
    bulkhead = Bulkhead(max_concurrent=1, max_queue=1, max_wait=2.0, clock=clock)
    await bulkhead.acquire_async()
    waiter = asyncio.create_task(bulkhead.acquire_async())
    await settle()
    with pytest.raises(BulkheadFullError, match="queue full") as caught:
        await bulkhead.acquire_async()
    assert (caught.value.in_flight, caught.value.queued) == (1, 1)
    clock.advance(1.999)
    await settle()
    assert not waiter.done()
    clock.advance(0.001)
    with pytest.raises(BulkheadFullError, match=r"no slot within 2\.000s"):
        await waiter
    assert bulkhead.queued == 0
    bulkhead.release()
    assert bulkhead.in_flight == 0


async def test_the_ambient_deadline_cuts_the_wait() -> None:
    clock = fw.FakeClock()
    bulkhead = Bulkhead(max_concurrent=1, max_queue=1, max_wait=60, clock=clock)
    await bulkhead.acquire_async()

    async def bounded() -> None:
        with fw.deadline(0.5, clock=clock):
            await bulkhead.acquire_async()

    waiter = asyncio.create_task(bounded())
    await settle()
    clock.advance(0.5)
    with pytest.raises(BulkheadFullError, match=r"within 0\.500s"):
        await waiter


async def test_a_cancelled_waiter_leaves_and_a_granted_one_passes_its_slot_on() -> None:
    clock = fw.FakeClock()
    bulkhead = Bulkhead(max_concurrent=1, max_queue=3, max_wait=None, clock=clock)
    await bulkhead.acquire_async()
    first = asyncio.create_task(bulkhead.acquire_async())
    second = asyncio.create_task(bulkhead.acquire_async())
    third = asyncio.create_task(bulkhead.acquire_async())
    await settle()
    first.cancel()  # cancelled while waiting: leaves the queue
    await settle()
    assert bulkhead.queued == 2
    bulkhead.release()  # granted to ``second``...
    second.cancel()  # ...which is cancelled before it resumes: the slot goes to ``third``
    await settle()
    assert first.cancelled()
    assert second.cancelled()
    assert third.done()
    assert not third.cancelled()
    assert (bulkhead.in_flight, bulkhead.queued) == (1, 0)
    bulkhead.release()
    assert bulkhead.in_flight == 0


@settings(max_examples=60, deadline=None)
@given(
    users=st.lists(
        st.tuples(st.integers(0, 6), st.integers(1, 8), st.sampled_from([None, 0.0, 2.0, 5.0])),
        min_size=1,
        max_size=30,
    ),
    max_concurrent=st.integers(1, 3),
    max_queue=st.integers(0, 4),
)
def test_bulkhead_invariants_over_random_schedules(
    users: list[tuple[int, int, float | None]], max_concurrent: int, max_queue: int
) -> None:
    """Never more than max_concurrent; FIFO among waiters; no idle slot while someone waits;
    nobody waits past max_wait; the queue never exceeds max_queue."""

    async def main() -> None:
        clock = fw.FakeClock()
        running = 0
        most = 0
        granted: list[int] = []
        enqueued: list[int] = []
        outcomes: dict[int, str] = {}
        # one bulkhead; each user's patience is its ambient deadline
        shared = Bulkhead(
            max_concurrent=max_concurrent, max_queue=max_queue, max_wait=None, clock=clock
        )

        async def user(i: int, hold: int, patience: float | None) -> None:
            nonlocal running, most
            start = clock.monotonic()
            waiting = shared.in_flight >= max_concurrent
            if waiting and shared.queued < max_queue and patience != 0.0:
                enqueued.append(i)
            try:
                if patience is None:
                    await shared.acquire_async()
                else:
                    with fw.deadline(patience, clock=clock):
                        await shared.acquire_async()
            except BulkheadFullError:
                outcomes[i] = "refused"
                assert clock.monotonic() - start <= (patience or 0.0)
                return
            granted.append(i)
            running += 1
            most = max(most, running)
            await clock.async_sleep(hold)
            running -= 1
            shared.release()
            outcomes[i] = "done"

        tasks = []
        for i, (gap, hold, patience) in enumerate(users):
            for _ in range(gap):
                clock.advance(0.5)
                await settle()
                # work conservation: a free slot never coexists with a waiter
                assert shared.queued == 0 or shared.in_flight == max_concurrent
            tasks.append(asyncio.create_task(user(i, hold, patience)))
            await settle()
            assert shared.queued <= max_queue
        while not all(task.done() for task in tasks):
            clock.advance(0.5)
            await settle()
            assert shared.queued == 0 or shared.in_flight == max_concurrent
        assert most <= max_concurrent
        served_waiters = [i for i in granted if i in enqueued]
        assert served_waiters == sorted(served_waiters)  # FIFO among those who waited
        assert (shared.in_flight, shared.queued) == (0, 0)
        assert len(outcomes) == len(users)

    asyncio.run(main())


# -- waiting (threads) -------------------------------------------------------------------------


def test_sync_waiters_are_handed_slots_in_order() -> None:
    bulkhead = Bulkhead(max_concurrent=1, max_queue=4, max_wait=None)
    bulkhead.acquire()
    order: list[int] = []
    threads = []
    for i in range(4):
        thread = threading.Thread(target=lambda i=i: bulkhead.call(order.append, i))
        thread.start()
        threads.append(thread)
        while bulkhead.queued < i + 1:
            time.sleep(0.001)
    bulkhead.release()
    for thread in threads:
        thread.join(5)
    assert order == [0, 1, 2, 3]
    assert bulkhead.in_flight == 0


def test_a_sync_waiter_times_out_on_the_bulkheads_clock() -> None:
    clock = fw.FakeClock()
    bulkhead = Bulkhead(max_concurrent=1, max_queue=1, max_wait=3.0, clock=clock)
    bulkhead.acquire()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            bulkhead.acquire()
        except BulkheadFullError as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    while bulkhead.queued < 1:
        time.sleep(0.001)
    clock.advance(3.0)
    thread.join(5)
    assert len(errors) == 1
    assert "no slot within 3.000s" in str(errors[0])
    assert bulkhead.queued == 0


def test_sixteen_threads_and_a_thousand_tasks_never_exceed_max_concurrent() -> None:
    bulkhead = Bulkhead(max_concurrent=8, max_queue=2000, max_wait=None)
    lock = threading.Lock()
    state = {"now": 0, "most": 0, "calls": 0}

    def enter() -> None:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            state["calls"] += 1

    def leave() -> None:
        with lock:
            state["now"] -= 1

    def sync_work() -> None:
        enter()
        time.sleep(0)
        leave()

    async def async_work() -> None:
        enter()
        await asyncio.sleep(0)
        leave()

    def thread_main() -> None:
        for _ in range(100):
            bulkhead.call(sync_work)

    async def tasks_main() -> None:
        await asyncio.gather(*(bulkhead.call_async(async_work) for _ in range(1000)))

    threads = [threading.Thread(target=thread_main) for _ in range(16)]
    for thread in threads:
        thread.start()
    asyncio.run(tasks_main())
    for thread in threads:
        thread.join(30)
    assert state["calls"] == 16 * 100 + 1000
    assert 1 <= state["most"] <= 8
    assert (bulkhead.in_flight, bulkhead.queued, state["now"]) == (0, 0, 0)


async def test_a_thread_release_wakes_an_async_waiter() -> None:
    bulkhead = Bulkhead(max_concurrent=1, max_queue=1, max_wait=None)
    bulkhead.acquire()
    waiter = asyncio.create_task(bulkhead.acquire_async())
    await settle()
    thread = threading.Thread(target=bulkhead.release)
    thread.start()
    thread.join()
    await asyncio.wait_for(waiter, 5)
    assert bulkhead.in_flight == 1


# -- the seeds' isolation example --------------------------------------------------------------


def _dependency() -> int:
    return sum(range(200))  # pure Python work, a few µs


@contextlib.contextmanager
def _released(gate: threading.Event) -> Iterator[None]:
    """Open ``gate`` on the way out, also on failure (hung threads must end)."""
    try:
        yield
    finally:
        gate.set()


def _paired_medians(
    call: Callable[[], object], twin: Callable[[], object], n: int = 300
) -> tuple[float, float]:
    """Median latencies of `call` and of its `twin`, sampled in turn so that both see the same
    host load: the twin (the same calls through fresh bulkheads) is the measured baseline."""
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(n):
        for side, fn in zip(samples, (call, twin), strict=True):
            t0 = time.perf_counter()
            fn()
            side.append(time.perf_counter() - t0)
    return statistics.median(samples[0]), statistics.median(samples[1])


def test_seeds_isolation_example_semaphore_bulkheads_20_30_20() -> None:
    """100 worker threads, three dependencies behind bulkheads of 20 / 30 / 20; the review
    service hangs. Product and price calls keep succeeding with unchanged latency; reviews are
    refused at once instead of eating threads; only 20 workers are stuck."""
    product = Bulkhead("product", max_concurrent=20)
    price = Bulkhead("price", max_concurrent=30)
    review = Bulkhead("review", max_concurrent=20)
    hang = threading.Event()

    def review_service() -> int:
        hang.wait(10)
        return 0

    def page() -> tuple[int, int, int | None]:
        try:
            reviews: int | None = review.call(review_service)
        except BulkheadFullError:
            reviews = None  # degrade: the page without reviews
        return product.call(_dependency), price.call(_dependency), reviews

    def direct() -> tuple[int, int]:
        return product.call(_dependency), price.call(_dependency)

    twins = Bulkhead("product-twin", max_concurrent=20), Bulkhead("price-twin", max_concurrent=30)

    def twin() -> tuple[int, int]:
        return twins[0].call(_dependency), twins[1].call(_dependency)

    workers = concurrent.futures.ThreadPoolExecutor(100)
    try:
        pages = [workers.submit(page) for _ in range(100)]
        deadline = time.monotonic() + 5
        while review.in_flight < 20 and time.monotonic() < deadline:
            time.sleep(0.001)
        while sum(f.done() for f in pages) < 80 and time.monotonic() < deadline:
            time.sleep(0.001)
        done = [f for f in pages if f.done()]
        stuck = [f for f in pages if not f.done()]
        assert review.in_flight == 20
        assert len(stuck) == 20  # exactly the review bulkhead's share of the threads
        assert all(f.result() == (19900, 19900, None) for f in done)
        during, baseline = _paired_medians(direct, twin)
        more = [workers.submit(page) for _ in range(50)]  # the page keeps serving
        assert all(f.result(timeout=2) == (19900, 19900, None) for f in more)
        assert review.rejected >= 130
        assert during <= baseline * 2, (baseline, during)
    finally:
        hang.set()
        workers.shutdown(wait=True)
    assert (product.in_flight, price.in_flight, review.in_flight) == (0, 0, 0)


def test_seeds_isolation_example_thread_pools_20_30_20() -> None:
    """The same page with thread-pool isolation: callers wait for reviews at most 50 ms, so
    not even the 20 worker threads are lost; the hung calls hold the review pool's threads."""
    hang = threading.Event()

    def review_service() -> int:
        hang.wait(10)
        return 0

    with (
        ThreadPoolBulkhead("product", max_workers=20, max_queue=100) as product,
        ThreadPoolBulkhead("price", max_workers=30, max_queue=100) as price,
        ThreadPoolBulkhead("review", max_workers=20, max_queue=0, timeout=0.05) as review,
        ThreadPoolBulkhead("product-twin", max_workers=20, max_queue=100) as product_twin,
        ThreadPoolBulkhead("price-twin", max_workers=30, max_queue=100) as price_twin,
        _released(hang),
    ):

        def page() -> tuple[int, int, int | None]:
            try:
                reviews: int | None = review.call(review_service)
            except (BulkheadFullError, fw.TimeoutExceeded):
                reviews = None
            return product.call(_dependency), price.call(_dependency), reviews

        def direct() -> tuple[int, int]:
            return product.call(_dependency), price.call(_dependency)

        def twin() -> tuple[int, int]:
            return product_twin.call(_dependency), price_twin.call(_dependency)

        with concurrent.futures.ThreadPoolExecutor(100) as workers:
            results = list(workers.map(lambda _: page(), range(100)))
        assert all(r == (19900, 19900, None) for r in results)
        assert review.in_flight == 20  # the review pool is full of hung calls...
        assert review.rejected >= 80  # ...and refuses the rest at once
        assert review.timeouts == 20
        during, baseline = _paired_medians(direct, twin, 200)
        assert during <= baseline * 2, (baseline, during)


# -- thread pools ------------------------------------------------------------------------------


def test_thread_pool_runs_on_its_own_threads_and_copies_the_context() -> None:
    with ThreadPoolBulkhead("db", max_workers=2) as pool:
        with fw.deadline(30):
            name, left = pool.call(lambda: (threading.current_thread().name, fw.remaining()))
        assert name.startswith("floodwall-db")
        assert left is not None
        assert 0 < left <= 30
        assert pool.call(divmod, 7, 2) == (3, 1)
        with pytest.raises(ZeroDivisionError):
            pool.call(lambda: 1 / 0)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.call(lambda: None)


def test_thread_pools_share_no_threads() -> None:
    barrier = threading.Barrier(4)

    def meet() -> int:
        barrier.wait(5)  # both threads of both pools run at once
        return threading.get_ident()

    with ThreadPoolBulkhead("a", max_workers=2) as a, ThreadPoolBulkhead("b", max_workers=2) as b:
        calls = [a.submit(meet), a.submit(meet), b.submit(meet), b.submit(meet)]
        idents = [call.result(5) for call in calls]
    assert len(set(idents[:2])) == 2
    assert len(set(idents[2:])) == 2
    assert not set(idents[:2]) & set(idents[2:])


def test_thread_pool_bounds_running_and_queued_calls() -> None:
    gate = threading.Event()
    pool = ThreadPoolBulkhead("slow", max_workers=2, max_queue=1)
    try:
        futures = [pool.submit(gate.wait, 5) for _ in range(3)]
        with pytest.raises(BulkheadFullError) as caught:
            pool.submit(gate.wait, 5)
        error = caught.value
        assert (error.max_concurrent, error.max_queue) == (2, 1)
        assert error.in_flight == 2
        assert error.queued == 1
        assert (pool.in_flight, pool.queued, pool.rejected) == (2, 1, 1)
        gate.set()
        assert [f.result(5) for f in futures] == [True, True, True]
    finally:
        pool.shutdown()
    assert pool.in_flight == 0


def test_a_caller_timeout_frees_the_caller_and_cancels_queued_work() -> None:
    gate = threading.Event()
    pool = ThreadPoolBulkhead("slow", max_workers=1, max_queue=1, timeout=0.02)
    ran: list[int] = []
    try:
        with pytest.raises(fw.TimeoutExceeded):
            pool.call(gate.wait, 5)  # runs, hangs: the caller leaves after 20 ms
        with pytest.raises(fw.TimeoutExceeded):
            pool.call(ran.append, 1)  # queued behind it: cancelled when its caller leaves
        gate.set()
    finally:
        pool.shutdown()
    assert ran == []
    assert pool.timeouts == 2


async def test_run_async_for_blocking_calls_and_call_async_points_elsewhere() -> None:
    with ThreadPoolBulkhead("blocking", max_workers=1) as pool:
        assert await pool.run_async(sum, [1, 2, 3]) == 6

        async def coroutine() -> int:
            return 1

        with pytest.raises(TypeError, match="Bulkhead for coroutines"):
            await pool.call_async(coroutine)
        gate = threading.Event()
        slow = ThreadPoolBulkhead("slow", max_workers=1, timeout=0.02)
        try:
            with pytest.raises(fw.TimeoutExceeded):
                await slow.run_async(gate.wait, 5)
        finally:
            gate.set()
            slow.shutdown()


# -- sizing ------------------------------------------------------------------------------------


def test_pool_size_from_the_seeds_rule() -> None:
    assert pool_size(peak_rps=30, p99_latency=0.2) == 8  # 6 + buffer 2
    assert pool_size(peak_rps=100, p99_latency=0.2, buffer=0) == 20
    assert pool_size(peak_rps=1, p99_latency=0.001) == 3
    with pytest.raises(fw.ConfigError, match="needs peak_rps and p99_latency"):
        pool_size(peak_rps=10)


def test_pool_size_from_a_windows_observed_figures() -> None:
    window = fw.TimeWindow(10, 1.0)
    for i in range(500):  # 50 rps over 10 s; 1 % of calls take 150 ms, the rest 20 ms
        window.record(i * 0.02, Kind.SUCCESS, 0.15 if i % 100 == 0 else 0.02)
    snapshot = window.snapshot(9.99)
    p99 = snapshot.percentile(0.99)
    assert p99 is not None
    rps = snapshot.calls / snapshot.span
    assert rps == 50
    assert pool_size(window=snapshot) == math.ceil(rps * p99) + 2
    assert pool_size(window=snapshot, peak_rps=200) == math.ceil(200 * p99) + 2
    with pytest.raises(fw.ConfigError, match="no latency samples"):
        pool_size(window=fw.TimeWindow(10, 1.0).snapshot(0.0))


def test_the_decorator_keeps_signatures_for_type_checkers() -> None:
    bulkhead = Bulkhead()

    @bulkhead
    def get(path: str) -> bytes:
        return path.encode()

    @bulkhead
    async def aget(path: str) -> int:
        return len(path)

    assert_type(get("/x"), bytes)
    pending: Coroutine[Any, Any, int] = aget("/x")  # a decorated coroutine function stays one
    assert_type(bulkhead.call(get, "/y"), bytes)
    assert get("/x") == b"/x"
    assert asyncio.run(pending) == 2
    assert_type(pool_size(peak_rps=1, p99_latency=1), int)
