"""Waiting for a turn on a store's connections: as long as calls succeed, never behind a stuck
server longer than the timeout.

The rule itself (:meth:`Progress.until`) is checked on plain numbers; the first-come,
first-served queue (:class:`Turns`) against a reference model, its arrivals, releases and
give-ups (including a give-up racing the hand-over of its slot) interleaved by hypothesis in one
thread. The waits run on a :class:`~floodwall.FakeClock`: the test sets the time and the
successes, and the clock decides when a waiter gives up, to the exact instant. Between two
re-checks of the rule a waiter is in a real timed wait (a lock's acquire, an event loop timer) as
long as the clock says it has left, so a test that needs a re-check at the time it set waits for
the waiter to read the clock again (:class:`ReadClock`), never for a duration; the fake bound is
small so each such re-check comes within 20 ms. Real time is left only to the hand-off between
threads (:func:`test_threads_get_their_turns_in_arrival_order`). Against real frozen servers:
``tests/integration/test_store_freeze.py``; against a saturated one:
``tests/integration/test_store_faults_postgres.py``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from floodwall import FakeClock
from floodwall.stores._turns import Progress, Turns, deadline, take_turn, take_turn_async

BOUND = 0.02
"""A store's timeout, in the fake clock's seconds; a waiter's real wait between two re-checks is
at most this long."""
SECONDS = 10.0
"""Real seconds a test waits for a thread or a re-check before calling it lost."""


class ReadClock(FakeClock):
    """A :class:`FakeClock` that counts its reads, so a test can wait for a waiter to re-check
    the rule at the time the test set."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self._read = threading.Condition()

    def monotonic(self) -> float:
        with self._read:
            self.reads += 1
            self._read.notify_all()
        return super().monotonic()

    def read_again(self, waiter: Waiter) -> None:
        """Block until ``waiter`` re-checks (someone else reads the clock) or has ended."""
        with self._read:
            seen = self.reads
            woke = self._read.wait_for(lambda: self.reads > seen or waiter.ended(), SECONDS)
        assert woke, "no re-check"


class Waiter:
    """A wait for a turn on a :class:`ReadClock`: what it returned, and when on the clock."""

    def __init__(self, clock: ReadClock) -> None:
        self.clock = clock
        self.outcome: list[tuple[bool, float]] = []
        self.thread: threading.Thread | None = None
        self.task: asyncio.Task[None] | None = None

    def ended(self) -> bool:
        return bool(self.outcome)

    def end(self, taken: bool) -> None:
        self.outcome.append((taken, self.clock.monotonic()))
        self.clock.monotonic()  # a read after the outcome: wakes read_again

    @classmethod
    def in_thread(
        cls, clock: ReadClock, turns: Turns, timeout: float, progress: Progress, **cold: float
    ) -> Waiter:
        """:func:`take_turn` in a thread of its own, once it has begun and queued."""
        waiter = cls(clock)
        waiter.thread = threading.Thread(
            target=lambda: waiter.end(take_turn(turns, timeout, progress, **cold)), daemon=True
        )
        waiter.thread.start()
        while turns.waiting < 1 and not waiter.ended():  # a hand-off, not a duration
            time.sleep(0.001)
        return waiter

    @classmethod
    async def in_task(cls, clock: ReadClock, wait: Awaitable[bool]) -> Waiter:
        """``wait`` in a task, once it has begun and queued (one loop turn: nothing else runs)."""
        waiter = cls(clock)

        async def run() -> None:
            waiter.end(await wait)

        waiter.task = asyncio.create_task(run())
        await asyncio.sleep(0)
        return waiter

    def still_waiting(self) -> None:
        """Re-checked at the clock's time and still waiting."""
        self.clock.read_again(self)
        assert not self.ended(), f"gave up at {self.outcome[0][1]:g} s on the clock"

    def answered(self, progress: Progress, times: int) -> None:
        """A call succeeds every half bound, ``times`` times; the waiter re-checks at each one
        and keeps waiting (load, not an outage)."""
        for _ in range(times):
            self.clock.advance(BOUND / 2)
            progress.succeeded()
            self.still_waiting()

    async def outcome_async(self) -> tuple[bool, float]:
        """:meth:`result` of a wait in a task, once it ended."""
        assert self.task is not None
        await asyncio.wait_for(self.task, SECONDS)
        return self.result()

    def result(self) -> tuple[bool, float]:
        if self.thread is not None:
            self.thread.join(SECONDS)
        assert self.outcome, "still waiting"
        return self.outcome[0]


def test_the_rule_on_numbers() -> None:
    progress = Progress(FakeClock(100.3))
    assert progress.until(100.0, 0.5) == math.inf, "before a first success: connecting, not stuck"
    progress.at = 99.0
    assert progress.until(100.0, 0.5) == 100.5, "a success before the wait began: its own bound"
    progress.succeeded()
    assert progress.at == 100.3, "a success is stamped by the progress's clock"
    assert progress.until(100.0, 0.5) == pytest.approx(100.8), "a success meanwhile: load"
    assert deadline(100.0, 0.5, progress) == pytest.approx(100.8), "answering: from its answer"
    progress.at = 99.0
    assert deadline(100.0, 0.5, progress) == 100.5, "turn freed by failures: from the call's start"
    progress.at = -math.inf
    assert deadline(100.0, 0.5, progress) == 100.5, "before a first success: the call's own bound"


def test_a_free_slot_is_taken_at_once_and_a_stuck_one_gives_up() -> None:
    clock = ReadClock()
    slots, progress = Turns(1), Progress(clock)
    progress.succeeded()
    assert take_turn(slots, BOUND, progress)
    waiter = Waiter.in_thread(clock, slots, BOUND, progress)
    clock.advance(BOUND / 2)
    waiter.still_waiting()  # half the bound without a success
    clock.advance(BOUND / 2)
    assert waiter.result() == (False, BOUND), "nothing succeeds: gives up at the bound"


def test_a_busy_store_that_keeps_answering_is_waited_for() -> None:
    clock = ReadClock()
    slots, progress = Turns(1), Progress(clock)
    progress.succeeded()
    assert take_turn(slots, BOUND, progress)
    waiter = Waiter.in_thread(clock, slots, BOUND, progress)
    waiter.answered(progress, 10)  # 5 bounds
    slots.release()
    taken, at = waiter.result()
    assert taken and at == pytest.approx(5 * BOUND)


def test_before_a_first_success_the_wait_is_bounded_by_cold_or_by_a_free_slot() -> None:
    clock = ReadClock()
    slots, progress = Turns(1), Progress(clock)  # nothing succeeded yet: no progress to wait by
    assert take_turn(slots, BOUND, progress)
    waiter = Waiter.in_thread(clock, slots, BOUND, progress, cold=BOUND)
    clock.advance(BOUND)
    assert waiter.result() == (False, BOUND), "cold: the caller's own bound"
    waiter = Waiter.in_thread(clock, slots, BOUND, progress)  # no cold bound: until a slot frees
    clock.advance(1000 * BOUND)
    slots.release()
    assert waiter.result() == (True, 1001 * BOUND), "waited for the slot (no infinite timeout)"


async def test_the_async_wait_follows_the_same_rule() -> None:
    clock = ReadClock()
    slots, progress = asyncio.Semaphore(1), Progress(clock)
    progress.succeeded()
    assert await take_turn_async(slots, BOUND, progress)
    stuck = await Waiter.in_task(clock, take_turn_async(slots, BOUND, progress))
    clock.advance(BOUND / 2)
    await asyncio.to_thread(stuck.still_waiting)  # half the bound without a success
    clock.advance(BOUND / 2)
    assert await stuck.outcome_async() == (False, BOUND), "nothing succeeds: gives up at the bound"

    busy = await Waiter.in_task(clock, take_turn_async(slots, BOUND, progress))
    await asyncio.to_thread(busy.answered, progress, 10)
    slots.release()
    taken, at = await busy.outcome_async()
    assert taken and at == pytest.approx(6 * BOUND)

    cold = await Waiter.in_task(clock, take_turn_async(slots, BOUND, Progress(clock), cold=BOUND))
    clock.advance(BOUND)
    taken, at = await cold.outcome_async()
    assert not taken and at == pytest.approx(7 * BOUND), "cold: the caller's own bound"


class TurnsModel(RuleBasedStateMachine):
    """:class:`Turns` against a list and a counter: waiters served in arrival order, every
    slot held by exactly one caller or free, whatever the give-ups."""

    def __init__(self) -> None:
        super().__init__()
        self.turns = Turns(1)
        self.size = self.free = 1
        self.queue: list[int] = []  # the model: ids in arrival order
        self.holders: set[int] = set()
        self.tickets: dict[int, threading.Lock] = {}
        self.next_id = 0

    @initialize(size=st.integers(1, 3))
    def sized(self, size: int) -> None:
        self.turns = Turns(size)
        self.size = self.free = size

    def _arrive(self) -> tuple[int, bool]:
        caller, self.next_id = self.next_id, self.next_id + 1
        served = self.free > 0 and not self.queue
        if served:
            self.free -= 1
            self.holders.add(caller)
        return caller, served

    def _hand_on(self) -> None:
        if self.queue:
            self.holders.add(self.queue.pop(0))
        else:
            self.free += 1

    @rule()
    def take_without_waiting(self) -> None:
        _, served = self._arrive()
        assert self.turns.take() is served, "a free slot, and only when nobody waits"

    @rule()
    def join(self) -> None:
        caller, served = self._arrive()
        self.tickets[caller] = self.turns.join()
        if not served:
            self.queue.append(caller)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.holders.remove(data.draw(st.sampled_from(sorted(self.holders))))
        self.turns.release()
        self._hand_on()

    @precondition(lambda self: self.queue)
    @rule(data=st.data())
    def give_up(self, data: st.DataObject) -> None:
        caller = data.draw(st.sampled_from(self.queue))
        self.turns.leave(self.tickets.pop(caller))
        self.queue.remove(caller)

    @precondition(lambda self: self.holders & self.tickets.keys())
    @rule(data=st.data())
    def give_up_as_its_slot_is_handed_over(self, data: st.DataObject) -> None:
        """The waiter's wait ran out at the instant its slot was handed to it: the slot goes
        on to the next waiter, or back."""
        caller = data.draw(st.sampled_from(sorted(self.holders & self.tickets.keys())))
        self.turns.leave(self.tickets.pop(caller))
        self.holders.remove(caller)
        self._hand_on()

    @precondition(lambda self: not self.holders)
    @rule()
    def release_unheld(self) -> None:
        with pytest.raises(ValueError, match="released more often than taken"):
            self.turns.release()

    @invariant()
    def no_slot_lost_or_duplicated(self) -> None:
        assert len(self.holders) + self.free == self.size
        assert self.turns.waiting == len(self.queue)
        for caller, ticket in self.tickets.items():
            assert ticket.locked() is (caller in self.queue), f"caller {caller}: FIFO broken"


TurnsModel.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestTurnsModel = TurnsModel.TestCase


def test_threads_get_their_turns_in_arrival_order() -> None:
    """Real threads: the hand-off between them is what is tested (no bound is involved)."""
    turns = Turns(1)
    progress = Progress(FakeClock())
    progress.succeeded()
    assert take_turn(turns, BOUND, progress)
    order: list[int] = []

    def caller(n: int) -> None:
        if take_turn(turns, math.inf, progress):
            order.append(n)
            turns.release()

    threads = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(8)]
    for n, thread in enumerate(threads):
        thread.start()
        while turns.waiting <= n:  # queued before the next one starts: a known arrival order
            time.sleep(0.001)
    turns.release()
    for thread in threads:
        thread.join(timeout=SECONDS)
    assert order == list(range(8))


async def test_an_async_waiter_keeps_its_place_while_the_store_answers() -> None:
    """Each re-check of the progress rule used to cancel the wait and queue again, behind
    every newcomer. The store answers every half bound; the first waiter re-checks the rule at
    each answer, past its own bound before the newcomer comes and after. The newcomer waits
    without a bound (nothing succeeded on its clock, no ``cold``), so it never re-checks: every
    re-check is the first waiter's, and only the first could lose its place."""
    clock = ReadClock()
    slots, progress = asyncio.Semaphore(1), Progress(clock)
    progress.succeeded()
    assert await take_turn_async(slots, BOUND, progress)
    order: list[str] = []

    async def caller(name: str, progress: Progress) -> bool:
        taken = await take_turn_async(slots, BOUND, progress)
        order.append(name)
        slots.release()
        return taken

    first = await Waiter.in_task(clock, caller("first", progress))
    await asyncio.to_thread(first.answered, progress, 3)
    newcomer = await Waiter.in_task(ReadClock(), caller("newcomer", Progress(FakeClock())))
    await asyncio.to_thread(first.answered, progress, 3)
    slots.release()
    assert (await first.outcome_async())[0] and (await newcomer.outcome_async())[0]
    assert order == ["first", "newcomer"]
