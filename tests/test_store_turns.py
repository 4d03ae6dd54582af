"""Waiting for a turn on a store's connections: as long as calls succeed, never behind a stuck
server longer than the timeout.

The rule itself (:meth:`Progress.until`) is checked on plain numbers; the two waits on real
semaphores with a bound of a few milliseconds (the semaphores' own timed waits are the system
under test). Against real frozen servers: ``tests/integration/test_store_freeze.py``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from floodwall.stores._turns import Progress, deadline, take_turn, take_turn_async

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
    slots = threading.BoundedSemaphore(1)
    progress = Progress()
    progress.succeeded()
    assert take_turn(slots, BOUND, progress)
    began = time.monotonic()
    assert not take_turn(slots, BOUND, progress), "nothing succeeds: give up after the bound"
    assert BOUND <= time.monotonic() - began < BOUND + 0.5


def test_a_busy_store_that_keeps_answering_is_waited_for() -> None:
    slots = threading.BoundedSemaphore(1)
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
    slots = threading.BoundedSemaphore(1)
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
