"""Coalescing in front of a store that stops answering: queued requests wait at most the timeout.

The send here is stuck on an :class:`asyncio.Event` until the test releases it, as a batch on a
frozen server is. The bound is the event loop's own timer (``asyncio.timeout``), so the one test
that shows it firing lets 20 ms of the loop's time pass; the others need none. The same path
against real frozen servers is in ``tests/integration/test_store_freeze.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from floodwall.shared._coalesce import Coalescer
from stalls import StoodStill

BOUND = 0.02
"""Seconds a queued request may wait (the store timeout, shrunk)."""


class StuckSend:
    """``send(key, requests)``: answers ``request * 10`` once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.batches: list[list[int]] = []

    async def send(self, key: str, requests: list[int]) -> list[int]:
        self.batches.append(requests)
        await asyncio.sleep(0)  # a round trip suspends its caller, letting others queue
        await self.release.wait()
        return [request * 10 for request in requests]


async def stuck(key: str, requests: list[int]) -> list[int]:
    return [-request for request in requests]


async def _warm(coalescer: Coalescer[int, int], send: StuckSend) -> None:
    """One send come back: the store's client is set up."""
    send.release.set()
    assert await coalescer.submit("warm", 0) == 0
    send.release.clear()
    send.batches.clear()


async def test_a_queued_request_gets_the_stuck_answer_after_the_timeout() -> None:
    send = StuckSend()
    coalescer = Coalescer(send.send, max_batch=8, timeout=BOUND, stuck=stuck)
    await _warm(coalescer, send)
    loop = asyncio.get_running_loop()
    first = asyncio.create_task(coalescer.submit("k", 1))
    await asyncio.sleep(0)  # the lone request is in flight, stuck
    with StoodStill() as stood:
        began = loop.time()
        queued = await asyncio.gather(*(coalescer.submit("k", n) for n in (2, 3, 4)))
        waited = loop.time() - began
    assert queued == [-2, -3, -4], "the on-error answer, not a wait for the stuck batch"
    # each queued request's own bound, at once (one after another would be 3 x BOUND), plus
    # what this process stood still meanwhile (a collection alone took 600 ms once in CI)
    assert BOUND <= waited < 2 * BOUND + stood.seconds, (waited, stood.seconds)
    assert coalescer.gave_up == 3 and coalescer.pending == 0
    send.release.set()
    assert await first == 10, "the lone request is bounded by its own send"
    await asyncio.sleep(0)
    assert send.batches == [[1]], "requests that gave up are never sent afterwards"


async def test_requests_queued_behind_the_first_send_wait_for_it() -> None:
    """The first send sets the store's client up: no stuck batch yet, nobody gives up."""
    send = StuckSend()
    coalescer = Coalescer(send.send, max_batch=8, timeout=0.0, stuck=stuck)  # 0: fires at once
    first = asyncio.create_task(coalescer.submit("k", 1))
    await asyncio.sleep(0)
    queued = asyncio.gather(*(coalescer.submit("k", n) for n in (2, 3)))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not queued.done() and coalescer.gave_up == 0 and coalescer.pending == 2
    send.release.set()
    assert await first == 10 and await queued == [20, 30]


async def test_requests_answered_in_time_never_see_the_stuck_answer() -> None:
    send = StuckSend()
    send.release.set()
    coalescer = Coalescer(send.send, max_batch=8, timeout=BOUND, stuck=stuck)
    answers = await asyncio.gather(*(coalescer.submit("k", n) for n in range(1, 6)))
    assert answers == [10, 20, 30, 40, 50] and coalescer.gave_up == 0
    assert send.batches == [[1], [2, 3, 4, 5]]


async def test_a_batch_error_reaches_its_callers_as_it_is() -> None:
    async def failing(key: str, requests: list[int]) -> list[int]:
        await asyncio.sleep(0)
        raise TimeoutError("the send's own error, not the wait's")

    coalescer = Coalescer(failing, max_batch=8, timeout=BOUND * 50, stuck=stuck)
    results = await asyncio.gather(
        *(coalescer.submit("k", n) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, TimeoutError) for r in results)
    assert coalescer.gave_up == 0


def test_timeout_and_stuck_go_together() -> None:
    async def send(key: str, requests: list[int]) -> list[int]:
        return requests

    with pytest.raises(ValueError, match="both or neither"):
        Coalescer(send, max_batch=8, timeout=BOUND)
    with pytest.raises(ValueError, match="both or neither"):
        Coalescer(send, max_batch=8, stuck=stuck)
