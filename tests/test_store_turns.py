"""Waiting for a turn on a store's connections: as long as calls succeed, never behind a stuck
server longer than the timeout.

The rule itself (:meth:`Progress.until`) is checked on plain numbers; the first-come,
first-served queue (:class:`Turns`) against a reference model, its arrivals, releases and
give-ups (including a give-up racing the hand-over of its slot) interleaved by hypothesis in one
thread; the two waits on real locks with a bound of a few milliseconds (the locks' own timed
waits are the system under test). Against real frozen servers:
``tests/integration/test_store_freeze.py``; against a saturated one:
``tests/integration/test_store_faults_postgres.py``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from floodwall.stores._turns import Progress, Turns, deadline, take_turn, take_turn_async

BOUND = 0.02
BUSY_BOUND = 0.2
"""The bound while other calls keep succeeding every ``BUSY_BOUND / 10``: a tenth of the bound
between successes leaves room for a scheduler that is late by up to nine tenths of it (seen:
10 ms sleeps late past a 20 ms bound at load 15)."""


def test_the_rule_on_numbers() -> None:
    progress = Progress()
    assert progress.until(100.0, 0.5) == math.inf, "before a first success: connecting, not stuck"
    progress.at = 99.0
    assert progress.until(100.0, 0.5) == 100.5, "a success before the wait began: its own bound"
    progress.at = 100.3
    assert progress.until(100.0, 0.5) == pytest.approx(100.8), "a success meanwhile: load"
    assert deadline(100.0, 0.5, progress) == pytest.approx(100.8), "answering: from its answer"
    progress.at = 99.0
    assert deadline(100.0, 0.5, progress) == 100.5, "turn freed by failures: from the call's start"
    progress.at = -math.inf
    assert deadline(100.0, 0.5, progress) == 100.5, "before a first success: the call's own bound"


def test_a_free_slot_is_taken_at_once_and_a_stuck_one_gives_up() -> None:
    slots = Turns(1)
    progress = Progress()
    progress.succeeded()
    assert take_turn(slots, BOUND, progress)
    began = time.monotonic()
    assert not take_turn(slots, BOUND, progress), "nothing succeeds: give up after the bound"
    assert BOUND <= time.monotonic() - began < BOUND + 0.5


def test_a_busy_store_that_keeps_answering_is_waited_for() -> None:
    slots = Turns(1)
    progress = Progress()
    progress.succeeded()
    assert take_turn(slots, BUSY_BOUND, progress)
    done = threading.Event()

    def busy() -> None:  # other calls keep succeeding for 5 bounds, then the slot frees
        for _ in range(50):
            time.sleep(BUSY_BOUND / 10)
            progress.succeeded()
        slots.release()
        done.set()

    threading.Thread(target=busy, daemon=True).start()
    began = time.monotonic()
    assert take_turn(slots, BUSY_BOUND, progress)
    assert time.monotonic() - began >= 2 * BUSY_BOUND and done.is_set()


def test_before_a_first_success_the_wait_is_bounded_by_cold_or_by_a_free_slot() -> None:
    slots = Turns(1)
    progress = Progress()  # nothing succeeded yet: no progress to wait by
    assert take_turn(slots, BOUND, progress)
    began = time.monotonic()
    assert not take_turn(slots, BOUND, progress, cold=BOUND), "cold: the caller's own bound"
    assert BOUND <= time.monotonic() - began < BOUND + 0.5
    releaser = threading.Timer(BOUND, slots.release)  # no cold bound: until a slot frees
    releaser.start()
    assert take_turn(slots, BOUND, progress), "waited for the slot (no infinite timeout)"
    releaser.join()


async def test_the_async_wait_follows_the_same_rule() -> None:
    slots = asyncio.Semaphore(1)
    progress = Progress()
    progress.succeeded()
    assert await take_turn_async(slots, BOUND, progress)
    assert not await take_turn_async(slots, BOUND, progress)

    async def busy() -> None:
        for _ in range(50):
            await asyncio.sleep(BUSY_BOUND / 10)
            progress.succeeded()
        slots.release()

    task = asyncio.create_task(busy())
    assert await take_turn_async(slots, BUSY_BOUND, progress)
    await task
    assert not await take_turn_async(slots, BOUND, Progress(), cold=BOUND), "cold: own bound"


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
    turns = Turns(1)
    progress = Progress()
    progress.succeeded()
    assert take_turn(turns, BUSY_BOUND, progress)
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
        thread.join(timeout=10)
    assert order == list(range(8))


async def test_an_async_waiter_keeps_its_place_while_the_store_answers() -> None:
    """Each re-check of the progress rule used to cancel the wait and queue again, behind
    every newcomer."""
    slots = asyncio.Semaphore(1)
    progress = Progress()
    progress.succeeded()
    assert await take_turn_async(slots, BUSY_BOUND, progress)
    order: list[str] = []

    async def caller(name: str) -> None:
        assert await take_turn_async(slots, BUSY_BOUND, progress)
        order.append(name)
        slots.release()

    async def busy() -> None:  # calls keep succeeding: waiting is load, not an outage
        while True:
            await asyncio.sleep(BUSY_BOUND / 10)
            progress.succeeded()

    load = asyncio.create_task(busy())
    first = asyncio.create_task(caller("first"))
    await asyncio.sleep(BUSY_BOUND / 2)
    newcomer = asyncio.create_task(caller("newcomer"))
    await asyncio.sleep(3 * BUSY_BOUND / 4)  # the first waiter re-checked the rule meanwhile
    slots.release()
    await asyncio.gather(first, newcomer)
    load.cancel()
    assert order == ["first", "newcomer"]
