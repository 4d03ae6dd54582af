"""Waiting for a turn on a store's connections without waiting behind a stuck server.

A call that finds every connection busy waits for one to free up. Behind a busy but healthy
server that is load: calls keep succeeding, and a wait longer than the store's ``timeout`` is
no failure. Behind a frozen server it is the outage itself: nothing succeeds, and each wave of
waiters would hold its callers one more timeout. So a waiter gives up when no call on those
connections has *succeeded* for ``timeout`` since it began waiting (failures, such as the
timed-out calls of a frozen server, are no progress): at most ``timeout`` behind a stuck
server, as long as the load needs behind a busy one.

Before a first success the store is connecting, not stuck: a waiter waits for a free slot, or
at most ``cold`` seconds when its caller has a bound of its own then (PostgreSQL's whole call).
The call that got its turn ends by the same rule (:func:`deadline`): its wait counts in its
bound unless calls succeeded meanwhile, so the turn and the call together take at most
``timeout`` past the call's start or the server's last answer, never a wait plus a whole bound.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

__all__ = ["Progress", "deadline", "take_turn", "take_turn_async"]


class Progress:
    """When a call last succeeded on a set of connections (monotonic seconds)."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = -math.inf

    def succeeded(self) -> None:
        self.at = time.monotonic()

    def until(self, began: float, timeout: float) -> float:
        """When a waiter that began at ``began`` gives up, as things stand: never before a
        first success (the first connections are being made: slow, not stuck)."""
        if self.at == -math.inf:
            return math.inf
        return max(began, self.at) + timeout


def deadline(began: float, timeout: float, progress: Progress) -> float:
    """When a call that began at ``began`` and has just got its turn must be done: ``timeout``
    after it began, or after the last call that succeeded while it waited, whichever is later
    (the store answered meanwhile: the wait was load, not an outage). The same instant its wait
    would have given up at (:meth:`Progress.until`), so behind a frozen server a call ends at
    most ``timeout`` after it began or after the freeze, however long it queued for its turn."""
    return max(began, progress.at) + timeout


def take_turn(
    slots: threading.Semaphore, timeout: float, progress: Progress, cold: float = math.inf
) -> bool:
    """Take one of ``slots``; False when nothing succeeded for ``timeout`` meanwhile, or, before
    a first success, after ``cold`` seconds (default: as long as it takes)."""
    if slots.acquire(blocking=False):
        return True
    began = time.monotonic()
    while True:
        left = _until(progress, began, timeout, cold) - time.monotonic()
        if left <= 0:
            return False
        if slots.acquire(timeout=min(left, threading.TIMEOUT_MAX)):
            return True


async def take_turn_async(
    slots: asyncio.Semaphore, bound: float, progress: Progress, cold: float = math.inf
) -> bool:
    """:func:`take_turn` for an :class:`asyncio.Semaphore`, ``bound`` the store's timeout (a
    free slot costs no suspension)."""
    if not slots.locked():
        await slots.acquire()
        return True
    began = time.monotonic()
    while True:
        left = _until(progress, began, bound, cold) - time.monotonic()
        if left <= 0:
            return False
        try:
            async with asyncio.timeout(left):
                await slots.acquire()
        except TimeoutError:
            continue
        return True


def _until(progress: Progress, began: float, timeout: float, cold: float) -> float:
    until = progress.until(began, timeout)
    return began + cold if until == math.inf else until
