"""``host://`` and HostBulkhead in one process (and its children): real System V objects of
each test's own NAME, removed at its end (asserted through ``info``, what ``ipcs`` shows).

The store's op contract runs in tests/test_store_contract.py (kind ``host``); the workers of a
real gunicorn / uvicorn and the SIGKILL storms are in tests/integration/test_host_workers.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import floodwall as fw
from floodwall.config import Registry
from floodwall.shared._global_ops import FIXED
from floodwall.stores import StoreTimeoutError, StoreUnavailableError, connect
from floodwall.stores.host import HostStore, info, remove
from stalls import StoodStill

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="System V: Linux")


def _count(store: HostStore, key: str = "k") -> tuple[bool, int]:
    """Count one call of ``key`` in a fixed window of 5 per hour (Frequency's op):
    ``(allowed, calls counted in the window)``. An hour, so that no test outlives the window
    its first count opened: a child's start-up between two counts took over 1 s (the old
    window) under a CPU hog on both cores beside a second test process."""
    _, [(allowed, _, remaining, _, _)] = store.apply(FIXED, key, [5, 3_600_000_000, 1, 1])
    return allowed, 5 - remaining


def _name() -> str:
    return f"t{uuid.uuid4().hex[:16]}"


@pytest.fixture
def name() -> Iterator[str]:
    """A NAME of this test alone; asserts that nothing of it is left at the end."""
    value = _name()
    yield value
    left = info(value)
    remove(value, force=True)
    assert not (left.semaphores or left.shared_memory), "the test left System V objects"


def test_bad_urls_are_refused_at_construction() -> None:
    with pytest.raises(fw.ConfigError, match="letters, digits"):
        connect("host://has space")
    with pytest.raises(fw.ConfigError, match="unknown options"):
        connect("host://app?size=3")
    with pytest.raises(fw.ConfigError, match="record_bytes must be an integer >= 64, got 8"):
        connect("host://app?record_bytes=8")
    with pytest.raises(fw.ConfigError, match="host://NAME"):
        connect("host://app/path")
    with pytest.raises(fw.ConfigError, match="must be a host:// store"):
        fw.HostBulkhead("db", store="memory://", max_concurrent=2)
    with pytest.raises(fw.ConfigError, match="max_wait=1 needs max_queue >= 1"):
        fw.HostBulkhead("db", store="host://app", max_concurrent=2, max_wait=1)


def test_the_last_process_to_close_removes_both_objects(name: str) -> None:
    first, second = HostStore(f"host://{name}"), HostStore(f"host://{name}")
    assert not info(name).semaphores, "nothing is opened before the first operation"
    assert _count(first) == (True, 1)
    assert _count(second) == (True, 2), "one count for both"
    assert info(name).users == 2
    with pytest.raises(fw.ConfigError, match="in use by 2"):
        remove(name)
    first.close()
    assert info(name).users == 1 and info(name).shared_memory
    second.close()
    assert not info(name).semaphores and not info(name).shared_memory
    with pytest.raises(StoreUnavailableError):
        _count(second)


def test_another_layout_or_size_is_refused_with_both_values(name: str) -> None:
    with HostStore(f"host://{name}") as store:
        _count(store)
        other = HostStore(f"host://{name}?max_keys=64")
        with pytest.raises(StoreUnavailableError) as caught:
            _count(other)  # as any store that cannot serve: on_store_error decides
        assert isinstance(caught.value.__cause__, fw.ConfigError)
        assert "exists with max_keys=4096" in str(caught.value)
        assert "this store asks for max_keys=64" in str(caught.value)
        store.slots("db", 3)
        with pytest.raises(fw.ConfigError, match="max_concurrent=3 while processes use it"):
            store.slots("db", 4)
        other.close()


def test_a_torn_record_reads_as_absent(name: str) -> None:
    with HostStore(f"host://{name}") as store:
        assert _count(store)[1] == 1
        view = store._attach()
        slot, _, record = store._find(view, store.keys(FIXED, "k")[0].encode(), 0.0)
        assert record is not None
        offset = store.layout.records + slot * store.layout.record_bytes + 20
        view[offset] ^= 0xFF  # a write cut short by a kill: the CRC no longer matches
        assert _count(store)[1] == 1, "starts over, never garbage"


def test_an_oversized_record_is_a_store_error(name: str) -> None:
    with HostStore(f"host://{name}?record_bytes=64") as store:
        from floodwall.shared.idempotency import BEGIN

        with pytest.raises(StoreUnavailableError) as caught:
            store.apply(BEGIN, "i" * 60, ["owner", "fp", 5000])
        assert "at most 48 bytes" in str(caught.value.__cause__)


def _hold_lock(name: str, then: str) -> subprocess.Popen[str]:
    """A child that takes NAME's lock, says so, and then sleeps (to be killed or stopped)."""
    code = (
        "import sys, time\n"
        "from floodwall.stores.host import HostStore\n"
        f"s = HostStore('host://{name}')\n"
        "s._attach(); s._lock_blocking('test')\n"
        f"print({then!r}, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == then
    return child


def test_a_lock_holder_killed_with_sigkill_leaves_it_free(name: str) -> None:
    with HostStore(f"host://{name}", timeout=5.0) as store:
        _count(store)
        child = _hold_lock(name, "holding")
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert _count(store)[1] == 2, "SEM_UNDO gave the lock back"


def test_a_stopped_lock_holder_costs_at_most_the_timeout(name: str) -> None:
    with HostStore(f"host://{name}", timeout=0.2) as store:
        began = time.monotonic()
        _count(store)
        healthy = time.monotonic() - began
        child = _hold_lock(name, "holding")
        child.send_signal(signal.SIGSTOP)
        try:
            with StoodStill() as stood:
                began = time.monotonic()
                with pytest.raises(StoreTimeoutError):
                    _count(store)
                waited = time.monotonic() - began
            # the timeout and the healthy call's work, plus what this process stood still
            allowed = 1.2 * 0.2 + 2 * healthy + stood.seconds
            print(
                f"\nstopped holder: {waited:.3f}s (bound {allowed:.3f}s, "
                f"stood still {stood.seconds:.3f}s)"
            )
            assert 0.2 <= waited <= allowed, (waited, allowed)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(10)


def test_host_bulkhead_refuses_with_the_host_figures(name: str) -> None:
    events: list[fw.Event] = []
    with HostStore(f"host://{name}") as store:
        one = fw.HostBulkhead("db", store=store, max_concurrent=2, listeners=[events.append])
        two = fw.HostBulkhead("db", store=HostStore(f"host://{name}"), max_concurrent=2)
        held = [one.acquire(), two.acquire()]
        with pytest.raises(fw.BulkheadFullError) as caught:
            one.call(lambda: None)
        assert (caught.value.in_flight, caught.value.max_concurrent) == (2, 2)
        assert events[-1].figures["scope"] == "host"
        assert (one.in_flight, two.available) == (2, 0)
        one.release(held[0])
        assert one.call(lambda: 42) == 42 and one.in_flight == 1
        two.release(held[1])
        assert info(name).bulkheads == (("db", 2, 2),)
        two.store.close()


def test_a_waiting_thread_is_woken_by_a_release(name: str) -> None:
    with HostStore(f"host://{name}") as store:
        bulkhead = fw.HostBulkhead("db", store=store, max_concurrent=1, max_queue=2, max_wait=5)
        held = bulkhead.acquire()
        timer = threading.Timer(0.05, bulkhead.release, args=(held,))
        began = time.monotonic()
        timer.start()
        assert bulkhead.call(lambda: "served") == "served"
        assert time.monotonic() - began < 5, "woken by the release, not by the bound"
        timer.join()
        quick = fw.HostBulkhead("q", store=store, max_concurrent=1, max_queue=1, max_wait=0.05)
        held = quick.acquire()
        began = time.monotonic()
        with pytest.raises(fw.BulkheadFullError, match=r"no slot within 0\.050s"):
            quick.acquire()
        assert time.monotonic() - began >= 0.05
        quick.release(held)


async def test_a_waiting_task_polls_without_blocking_the_loop(name: str) -> None:
    with HostStore(f"host://{name}") as store:
        bulkhead = fw.HostBulkhead("db", store=store, max_concurrent=1, max_queue=2, max_wait=5)
        held = bulkhead.acquire()
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        ticker = asyncio.create_task(tick())
        asyncio.get_running_loop().call_later(0.05, bulkhead.release, held)

        async def served() -> str:
            return "served"

        assert await bulkhead.call_async(served) == "served"
        ticker.cancel()
        assert ticks >= 5, "the loop kept running while the task waited"
        assert bulkhead.in_flight == 0


def test_store_error_falls_back_to_the_local_share(name: str) -> None:
    events: list[fw.Event] = []
    store = HostStore(f"host://{name}")
    bulkhead = fw.HostBulkhead(
        "db", store=store, max_concurrent=4, expected_instances=2, listeners=[events.append]
    )
    assert bulkhead.call(lambda: 1) == 1
    remove(name, force=True)  # an operator removed it under the running process
    held = [bulkhead.acquire(), bulkhead.acquire()]  # the local share: 4 / 2
    with pytest.raises(fw.BulkheadFullError):
        bulkhead.acquire()
    assert [e.kind for e in events] == ["store_down", "rejected"]
    for permit in held:
        bulkhead.release(permit)
    store.close()
    remove(name, force=True)  # what the store made again while it tried


def test_config_scope_host_builds_one_bulkhead_for_the_host(name: str) -> None:
    document = {
        "stores": {"default": "memory://", "h": f"host://{name}"},
        "resources": {
            "db": {"bulkhead": {"max_concurrent": 2, "scope": "host", "store": "h"}},
            "api": {"rate_limit": {"rate": "2/h", "scope": "host", "store": "h"}},
        },
    }
    registry = Registry(document)
    db = registry.get("db")
    assert isinstance(db.bulkhead, fw.HostBulkhead)
    assert db.call(lambda: "ok") == "ok"
    api = registry.get("api")
    assert [api.call(lambda: 1), api.call(lambda: 1)] == [1, 1]
    with pytest.raises(fw.RateLimitedError):
        api.call(lambda: 1)
    assert registry.snapshot()["db"]["bulkhead"]["scope"] == "host"
    registry.close()
    wrong = {**document, "stores": {"default": "memory://", "h": "memory://"}}
    with pytest.raises(fw.ConfigError, match=r"resources.db.bulkhead: scope: host needs"):
        Registry(wrong)


class SlotsModel(RuleBasedStateMachine):
    """HostSlots against a counter: taking succeeds iff a slot is free; giving frees one."""

    def __init__(self) -> None:
        super().__init__()
        self.name = _name()
        self.store = HostStore(f"host://{self.name}")
        self.slots = self.store.slots("m", 3)
        self.held = 0

    @rule()
    def take(self) -> None:
        assert self.slots.take() is (self.held < 3)
        self.held = min(3, self.held + 1)

    @precondition(lambda self: self.held > 0)
    @rule(n=st.integers(1, 3))
    def give(self, n: int) -> None:
        for _ in range(min(n, self.held)):
            self.slots.give()
            self.held -= 1

    @invariant()
    def free_matches(self) -> None:
        assert self.slots.free == 3 - self.held

    def teardown(self) -> None:
        self.store.close()
        assert not info(self.name).semaphores


SlotsModel.TestCase.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)
test_slots_follow_the_model = SlotsModel.TestCase


def test_a_forked_child_counts_as_a_user(name: str) -> None:
    store = HostStore(f"host://{name}")
    slots = store.slots("db", 2)
    pid = os.fork()
    if pid == 0:  # the child: take and give a slot, report the users it saw, leave
        code = 0
        try:
            took = slots.take()
            users = info(name).users
            slots.give()
            code = 0 if took and users == 2 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert info(name).users == 1 and slots.free == 2
    store.close()


# -- first-law review (issue 21): what a user could make the host store fail with --------------


def test_a_host_bulkhead_without_a_time_bound_waits_for_the_release(name: str) -> None:
    """``max_wait=inf`` (no bound but the ambient deadline, as for ``Bulkhead``) waited in the
    kernel with an infinite ``timespec``: the waiting caller got a raw ``OverflowError``."""
    with HostStore(f"host://{name}") as store:
        bulkhead = fw.HostBulkhead(
            "db", store=store, max_concurrent=1, max_queue=1, max_wait=float("inf")
        )
        held = bulkhead.acquire()
        got: list[object] = []

        def wait_for_a_slot() -> None:
            try:
                got.append(bulkhead.call(lambda: "served"))
            except BaseException as exc:
                got.append(exc)

        waiter = threading.Thread(target=wait_for_a_slot)
        waiter.start()
        deadline = time.monotonic() + 10
        while bulkhead.queued == 0 and waiter.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        bulkhead.release(held)
        waiter.join(10)
        assert not waiter.is_alive()
        assert got == ["served"]
        assert bulkhead.in_flight == 0


def test_a_host_bulkhead_refuses_a_max_wait_that_is_not_a_number_of_seconds() -> None:
    with pytest.raises(fw.ConfigError, match=r"max_wait must be a number of seconds >= 0.*got nan"):
        fw.HostBulkhead("db", store="host://app", max_concurrent=2, max_wait=float("nan"))


def test_a_long_key_is_counted_like_any_other_and_never_takes_the_store_down(name: str) -> None:
    """A key longer than a record (a client's header, a URL: a caller's input) was a store
    error: three of them opened the guard's breaker, every key of the limiter fell back to the
    local share, and ``store_down`` said the host store was down while it answered."""
    from floodwall.shared import GlobalLimiter

    events: list[fw.Event] = []
    with HostStore(f"host://{name}") as store, HostStore(f"host://{name}") as second:
        limiter = GlobalLimiter("fixed", "3/h", store=store, name="api", listeners=[events.append])
        other = GlobalLimiter("fixed", "3/h", store=second, name="api")
        long_key = "k" * 5000
        assert [limiter.try_acquire(long_key) for _ in range(4)] == [True, True, True, False]
        assert not other.try_acquire(long_key), "one count for the host, whatever the length"
        assert other.try_acquire("k" * 4999), "a key of its own"
        assert [limiter.try_acquire("short") for _ in range(4)] == [True, True, True, False]
        assert limiter.guard.snapshot()["failures"] == 0
        assert [e.kind for e in events if e.source == "store_guard"] == []


def test_a_reload_that_would_resize_a_host_bulkhead_is_refused_and_the_old_one_runs(
    name: str,
) -> None:
    """A reload changing ``max_concurrent`` of a ``scope: host`` bulkhead was applied, and then
    every call of the resource raised ``ConfigError`` (the slots keep their size while a
    process uses them): a hot reload turned the resource into an outage."""

    def document(size: int) -> dict[str, object]:
        bulkhead = {"max_concurrent": size, "scope": "host", "store": "h"}
        return {
            "stores": {"default": "memory://", "h": f"host://{name}"},
            "resources": {"db": {"bulkhead": bulkhead}},
        }

    registry = Registry(document(2))
    try:
        assert registry.get("db").call(lambda: "ok") == "ok"
        with pytest.raises(fw.ConfigError, match=r"max_concurrent=2 .*got max_concurrent=3"):
            registry.reload(document(3))
        assert registry.get("db").call(lambda: "ok") == "ok"
        assert registry.get("db").bulkhead.max_concurrent == 2  # type: ignore[union-attr]
    finally:
        registry.close()


def test_a_size_another_process_holds_degrades_as_a_store_outage_not_an_error(
    name: str,
) -> None:
    """A worker deployed with another ``max_concurrent`` than the running ones (a rolling
    deploy) got ``ConfigError`` from every call and from every read of its figures (a metrics
    scrape); now ``on_store_error`` answers and ``store_down`` names both sizes."""
    events: list[fw.Event] = []
    with HostStore(f"host://{name}") as running, HostStore(f"host://{name}") as deployed:
        fw.HostBulkhead("db", store=running, max_concurrent=2).call(lambda: None)
        bulkhead = fw.HostBulkhead(
            "db", store=deployed, max_concurrent=3, listeners=[events.append]
        )
        held = [bulkhead.acquire() for _ in range(3)]  # the local share: 3 / 1
        with pytest.raises(fw.BulkheadFullError):
            bulkhead.acquire()
        assert (bulkhead.in_flight, bulkhead.available, bulkhead.queued) == (3, 0, 0)
        for permit in held:
            bulkhead.release(permit)
        assert bulkhead.call(lambda: "ok") == "ok"
        down = [e for e in events if e.kind == "store_down"]
        assert len(down) == 1
        assert "max_concurrent=2" in down[0].reason and "max_concurrent=3" in down[0].reason


@pytest.mark.parametrize(
    ("asked", "layout"),
    [
        ("max_keys=8192", "max_keys=8192, record_bytes=1024, bulkheads=64"),
        ("bulkheads=128", "max_keys=4096, record_bytes=1024, bulkheads=128"),
        ("record_bytes=2048", "max_keys=4096, record_bytes=2048, bulkheads=64"),
    ],
)
def test_a_larger_layout_is_refused_naming_both_layouts_and_the_fix(
    name: str, asked: str, layout: str
) -> None:
    """QA: a store asking NAME for more keys or slots than its running segment got EINVAL from
    shmget/semget, reported as "unavailable during 'attach'" (a closed store) with nothing
    about the layout. Now it names NAME, both layouts and how to fix it."""
    events: list[fw.Event] = []
    from floodwall.shared import GlobalLimiter

    with HostStore(f"host://{name}") as running, HostStore(f"host://{name}?{asked}") as larger:
        _count(running)
        with pytest.raises(StoreUnavailableError) as caught:
            _count(larger)
        assert isinstance(caught.value.__cause__, fw.ConfigError)
        text = str(caught.value)
        assert f"host store {name!r} exists with max_keys=4096, record_bytes=1024, " in text
        assert f"bulkheads=64; this store asks for {layout}" in text
        assert f"run `floodwall host remove {name}` once no process uses it" in text
        assert f"or use a new name (host://{name}-2?...)" in text
        limiter = GlobalLimiter("fixed", "2/h", store=larger, name="api", listeners=[events.append])
        assert limiter.try_acquire()  # on_store_error="local": no exception, its share
        down = [e for e in events if e.kind == "store_down"]
        assert len(down) == 1 and f"asks for {layout}" in down[0].reason, down
        assert _count(running) == (True, 2), "the running segment is untouched"


def test_a_store_of_another_layout_degrades_its_limiter_instead_of_raising(name: str) -> None:
    """A process whose ``host://`` URL asks another layout than the running ones got
    ``ConfigError`` from every call through a limiter on it, past ``on_store_error``."""
    from floodwall.shared import GlobalLimiter

    events: list[fw.Event] = []
    with HostStore(f"host://{name}") as running, HostStore(f"host://{name}?max_keys=64") as other:
        _count(running)
        limiter = GlobalLimiter("fixed", "2/h", store=other, name="api", listeners=[events.append])
        assert [limiter.try_acquire() for _ in range(3)] == [True, True, False]
        down = [e for e in events if e.kind == "store_down"]
        assert len(down) == 1 and "max_keys=4096" in down[0].reason, down


def test_a_value_too_large_for_a_record_fails_that_op_only_not_the_store(name: str) -> None:
    """An idempotent call whose result did not fit a record (an HTTP answer, a cached page)
    was a store outage: three of them opened the guard's breaker, and every other key's call
    was refused with ``IdempotencyUnavailableError`` (503) while the store answered."""
    events: list[fw.Event] = []
    with HostStore(f"host://{name}?record_bytes=256") as store:
        idempotency = fw.Idempotency(store, key=lambda key, size: key, listeners=[events.append])

        @idempotency
        def write(key: str, size: int) -> str:
            return "x" * size

        for i in range(4):
            assert len(write(f"big-{i}", 1000)) == 1000, "the caller still gets its answer"
        assert write("small", 10) == "x" * 10
        assert write("small", 10) == "x" * 10
        assert idempotency.replays == 1, "the other keys are deduplicated as before"
        assert idempotency.lock_lost == 4
        assert [e.kind for e in events].count("lock_lost") == 4
        assert idempotency.guard.state == "up"
        assert "store_down" not in [e.kind for e in events]


@pytest.mark.parametrize("user", ["rate limit", "host bulkhead"])
async def test_a_first_async_op_waits_for_a_stopped_lock_holder_without_blocking_the_loop(
    name: str, user: str
) -> None:
    """A process's first op (a rate limit's step, a host bulkhead's first slot) attaches
    NAME, which takes the lock: from a task it waited for a stopped holder in the kernel, on
    the event loop's thread, freezing every task of the process for the store's ``timeout``
    (the bulkhead again at every retry, each second)."""
    from floodwall.shared import GlobalLimiter

    timeout = 1.0
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.002)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        await asyncio.sleep(0.3)  # the loop's own hiccups on this machine, now
        healthy = max(gaps)
        with HostStore(f"host://{name}", timeout=timeout) as store:
            child = _hold_lock(name, "holding")
            child.send_signal(signal.SIGSTOP)
            try:
                limiter = GlobalLimiter("fixed", "5/s", store=store, name="api")
                bulkhead = fw.HostBulkhead("db", store=store, max_concurrent=2)

                async def served() -> str:
                    return "served"

                await asyncio.sleep(0.02)  # the ticker notes the gap starting the child left
                gaps.clear()
                with StoodStill() as stood:
                    began = time.monotonic()
                    if user == "rate limit":
                        assert await limiter.try_acquire_async(), "the local share answers"
                    else:
                        assert await bulkhead.call_async(served) == "served", "the local share"
                    waited = time.monotonic() - began
                    await asyncio.sleep(0.05)  # the ticker notes the gap the call left
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait(10)
    finally:
        ticker.cancel()
    remove(name)  # the killed holder made NAME; nothing else uses it now
    # what this process stood still meanwhile is added: a kernel wait on the loop's thread
    # (what the test is about) leaves the interpreter free, so it makes no thread late
    late = stood.seconds
    assert waited <= 1.2 * timeout + 3 * healthy + late, (waited, healthy, late)
    assert max(gaps) < timeout / 2 + 3 * healthy + late, (max(gaps), healthy, late)
