"""A store connection's turn, taken and given back with a slot free: the cost every sync call on
the PostgreSQL store pays before its query, side by side with the semaphores it could use.

``take_turn`` over :class:`floodwall.stores._turns.Turns` (first come, first served) is what the
store does since the FIFO queue; over ``threading.BoundedSemaphore`` it is what it did before
(the semaphore's non-blocking acquire, then release). A bare ``threading.Semaphore`` acquire and
release is the floor the brief measures against. Only the uncontended path is timed here: with
every slot busy the caller waits for a query, milliseconds, and the queue's cost is noise
beside it (how long callers wait is measured in
``tests/integration/test_store_faults_postgres.py``, the saturation test).
"""

from __future__ import annotations

import threading
from itertools import repeat

from _harness import Case, Target
from floodwall.stores._turns import Progress, Turns, take_turn

GROUP = "store turn, sync, a slot free"
SEMAPHORE = "threading.Semaphore(2): acquire(); release()"
BOUNDED_TURN = "take_turn over threading.BoundedSemaphore(2), release (before)"
FIFO_TURN = "take_turn over Turns(2), release (first come, first served)"
FIFO_BARE = "Turns(2): take(); release()"
TIMEOUT = 1.0


def _semaphore() -> Case:
    slots = threading.Semaphore(2)

    def run(n: int) -> None:
        for _ in repeat(None, n):
            slots.acquire()
            slots.release()

    return Case(GROUP, SEMAPHORE, loop=run, ref="threading.Semaphore")


def _bounded_turn() -> Case:
    """The store's turn before: ``take_turn``'s free-slot path was a non-blocking acquire."""
    slots = threading.BoundedSemaphore(2)

    def run(n: int) -> None:
        for _ in repeat(None, n):
            if slots.acquire(blocking=False):
                slots.release()

    return Case(GROUP, BOUNDED_TURN, loop=run, ref="before")


def _fifo_turn() -> Case:
    turns, progress = Turns(2), Progress()
    progress.succeeded()

    def run(n: int) -> None:
        for _ in repeat(None, n):
            take_turn(turns, TIMEOUT, progress)
            turns.release()

    return Case(GROUP, FIFO_TURN, loop=run)


def _fifo_bare() -> Case:
    turns = Turns(2)

    def run(n: int) -> None:
        for _ in repeat(None, n):
            turns.take()
            turns.release()

    return Case(GROUP, FIFO_BARE, loop=run)


def cases() -> list[Case]:
    return [_semaphore(), _bounded_turn(), _fifo_turn(), _fifo_bare()]


def targets() -> list[Target]:
    return [
        Target(
            GROUP,
            FIFO_TURN,
            BOUNDED_TURN,
            1.0,
            "store turn, first come first served ≤ 1 × the semaphore turn before",
        ),
        Target(GROUP, FIFO_TURN, SEMAPHORE, None, "store turn vs threading.Semaphore"),
    ]
