"""The step that runs a blocking call on a thread pool and waits for its answer, bounded.

A :class:`~floodwall.ThreadPoolBulkhead` isolates sync clients that can hang: the call runs on
one of the pool's threads and the caller waits at most a budget for it. ``run`` waits in the
calling thread, ``arun`` in a task (the blocking function still runs on the pool); past the
budget the caller gets the pool's timeout error and the work, if still queued, is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

from floodwall._core.steps import Step

__all__ = ["Offload", "Pool"]


class Pool(Protocol):
    """What :class:`Offload` asks of the pool it runs on."""

    def submit(self, fn: Callable[[], Any], /) -> Future[Any]:
        """Start ``fn`` on a worker thread (or raise the pool's refusal)."""

    def expired(self, budget: float, future: Future[Any]) -> BaseException:
        """The error for a caller that stopped waiting after ``budget`` seconds."""


class Offload(Step):
    """Run ``job`` (a sync callable) on ``pool``; wait for it at most ``budget`` seconds
    (``None``: without a bound).

    A flow that offloads the protected call passes ``job=None``: ``run`` then offloads the
    ``call`` the driver hands over, and ``arun`` refuses (a coroutine function needs no thread:
    ``refusal`` says what to use instead).
    """

    __slots__ = ("budget", "job", "pool", "refusal")

    def __init__(
        self,
        pool: Pool,
        budget: float | None,
        job: Callable[[], Any] | None = None,
        refusal: str = "a coroutine function cannot be offloaded to a thread pool",
    ) -> None:
        self.pool = pool
        self.budget = budget
        self.job = job
        self.refusal = refusal

    def run(self, call: Callable[[], Any]) -> Any:
        future = self.pool.submit(self.job or call)
        try:
            return future.result(timeout=self.budget)
        except FutureTimeout:
            assert self.budget is not None
            raise self.pool.expired(self.budget, future) from None

    async def arun(self, call: Callable[[], Awaitable[Any]] | None = None) -> Any:
        if self.job is None:
            raise TypeError(self.refusal)
        future = self.pool.submit(self.job)
        waiting = asyncio.wrap_future(future)
        waiting.add_done_callback(_retrieve)  # a result nobody awaits any more is not an error
        if self.budget is None:
            return await waiting
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), self.budget)
        except TimeoutError:
            raise self.pool.expired(self.budget, future) from None

    def __repr__(self) -> str:
        return f"Offload({self.budget}s)"


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
