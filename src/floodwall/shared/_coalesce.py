"""Coalescing: concurrent async requests for one key share one store round trip.

A *lane* per key: the first request finds the lane free and sends itself at once (a lone caller
pays no extra latency, no task, no hop through the event loop); requests arriving while a send is
in flight queue up, and when it returns they go together, in arrival order, as the next batch: one
op, one round trip (``EVALSHA`` with the whole batch on Redis, one transaction on SQL). The next
batch is formed one event-loop turn after the previous one returns, so the callers it just woke
have queued their next requests by then: N tasks deciding in a loop settle into batches of N.

Batches per key are sequential (a key's lane has one send in flight); different keys' lanes run
concurrently. A batch holds at most ``max_batch`` requests; the rest wait for the next one.

A waiter that is cancelled before its batch is sent is left out of it; after, its answer (and any
permit it took) is dropped. If a send raises, every request of the batch gets the exception.
One :class:`Coalescer` serves one event loop.

Bounded waits: with a ``timeout`` (the store's), a queued request waits at most that long from
its arrival, whatever the batch in flight does (a frozen server); then it leaves the queue (or
drops its answer, as a cancelled waiter does) and gets ``stuck(key, [request])`` instead, the
answer for a store that did not answer in time. A lone request is bounded by the send itself.
Until a first send has come back, queued requests wait for it unbounded here: that send is
setting the store's client up (a cluster client learns the topology, a few hundred ms on a busy
machine), which has bounds of its own and is no stuck batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

Q = TypeVar("Q")
A = TypeVar("A")


class _Lane(Generic[Q, A]):
    """A key with a send in flight, and the requests waiting for the next one."""

    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: list[tuple[Q, asyncio.Future[A]]] = []


class Coalescer(Generic[Q, A]):
    """Sends ``send(key, requests) -> answers`` (one answer per request, in order) per lane."""

    def __init__(
        self,
        send: Callable[[str, list[Q]], Awaitable[list[A]]],
        max_batch: int,
        timeout: float | None = None,
        stuck: Callable[[str, list[Q]], Awaitable[list[A]]] | None = None,
    ) -> None:
        if (timeout is None) != (stuck is None):
            raise ValueError("timeout and stuck go together: both or neither")
        self._send = send
        self.max_batch = max_batch
        self.timeout = timeout
        self._stuck = stuck
        self._lanes: dict[str, _Lane[Q, A]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Sends made (a lone request counts as a batch of one)."""
        self.gave_up = 0
        """Queued requests answered by ``stuck`` after waiting ``timeout``."""
        self._warm = False
        """Whether a send has come back (the store's client is set up)."""

    async def submit(self, key: str, request: Q) -> A:
        """The answer to ``request``, sent alone or with the requests that queue meanwhile."""
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
            self.batches += 1
            try:
                return (await self._send(key, [request]))[0]
            finally:
                self._warm = True
                self._next(key, lane)
        future: asyncio.Future[A] = asyncio.get_running_loop().create_future()
        lane.queue.append((request, future))
        if self._stuck is None or not self._warm:
            return await future
        scope = asyncio.timeout(self.timeout)
        try:
            async with scope:
                return await future  # on expiry the future is cancelled: no batch takes it
        except TimeoutError:
            if not scope.expired():
                raise  # the batch's own error
            self.gave_up += 1
        return (await self._stuck(key, [request]))[0]

    def _next(self, key: str, lane: _Lane[Q, A]) -> None:
        """Send the lane's queue as the next batch, or free the lane when nobody waits."""
        queue = lane.queue
        if queue:
            queue = [item for item in queue if not item[1].done()]
        if not queue:
            del self._lanes[key]
            return
        batch, lane.queue = queue[: self.max_batch], queue[self.max_batch :]
        self.batches += 1
        task = asyncio.get_running_loop().create_task(self._run(key, lane, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self, key: str, lane: _Lane[Q, A], batch: list[tuple[Q, asyncio.Future[A]]]
    ) -> None:
        try:
            answers = await self._send(key, [request for request, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        future.cancel()
                    else:
                        future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), answer in zip(batch, answers, strict=True):
                if not future.done():
                    future.set_result(answer)
        finally:
            self._warm = True
            # one loop turn later: the callers just woken queue their next requests first
            asyncio.get_running_loop().call_soon(self._next, key, lane)

    @property
    def pending(self) -> int:
        """Requests queued behind a send in flight (not those that gave up or were cancelled)."""
        return sum(not future.done() for lane in self._lanes.values() for _, future in lane.queue)
