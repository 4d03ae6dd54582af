"""Store round trips as steps: through a store guard, mapped to an answer, batched in tasks.

Store-backed policies (global limiters, frequency control, time slices) write each decision
once, as a generator that yields one of these steps and turns the reply into its answer; the
drivers run the step in a thread (the store's sync adapter) or in a task (its async adapter).

* :class:`GuardedApply`: ``guard.apply(op, key, args, local_args)``, the op through a
  :class:`~floodwall.stores.StoreGuard`, which degrades instead of raising when the store is
  down (``local_args`` are the op's arguments for the in-process fallback).
* :class:`Then`: another step's value passed through a pure function (a reply into answers).
* :class:`Batched`: one request of a round trip that concurrent tasks share: in a thread it goes
  alone; in a task it joins the requests for its key on its event loop's coalescer
  (:class:`Lanes`), so N concurrent callers cost about one round trip per N decisions.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

from floodwall._core.drivers import _no_call_async
from floodwall._core.steps import Step

__all__ = ["Batched", "GuardedApply", "Lanes", "Then"]

Q = TypeVar("Q")
A = TypeVar("A")
Q_contra = TypeVar("Q_contra", contravariant=True)
A_co = TypeVar("A_co", covariant=True)


class _Guards(Protocol):
    """A :class:`~floodwall.stores.StoreGuard`: ``apply(op, key, args, local_args, callers)``
    in a thread, ``apply_async`` (the same arguments) in a task."""

    @property
    def apply(self) -> Callable[..., Any]: ...

    @property
    def apply_async(self) -> Callable[..., Awaitable[Any]]: ...


class GuardedApply(Step):
    """``guard.apply(op, key, args, local_args)``; its value is the guard's ``Guarded``.
    ``callers``: how many callers the op answers (a batch), for the guard's failure counts."""

    __slots__ = ("args", "callers", "guard", "key", "local_args", "op")

    def __init__(
        self,
        guard: _Guards,
        op: Any,
        key: str,
        args: Sequence[Any],
        local_args: Sequence[Any] | None = None,
        *,
        callers: int = 1,
    ) -> None:
        self.guard = guard
        self.op = op
        self.key = key
        self.args = args
        self.local_args = local_args
        self.callers = callers

    def run(self, call: Callable[[], Any]) -> Any:
        return self.guard.apply(self.op, self.key, self.args, self.local_args, self.callers)

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        return await self.guard.apply_async(
            self.op, self.key, self.args, self.local_args, self.callers
        )

    def __repr__(self) -> str:
        return f"GuardedApply({type(self.op).__name__}, {self.key!r})"


class Then(Step):
    """``step``'s value passed through ``fn`` (pure: the same in both worlds)."""

    __slots__ = ("fn", "step")

    def __init__(self, step: Step, fn: Callable[[Any], Any]) -> None:
        self.step = step
        self.fn = fn

    def run(self, call: Callable[[], Any]) -> Any:
        return self.fn(self.step.run(call))

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        return self.fn(await self.step.arun(call))

    def __repr__(self) -> str:
        return f"Then({self.step!r})"


Batch = Callable[[str, list[Q]], Step]
"""``batch(key, requests)``: the step of one round trip for ``requests``, whose value is the
list of their answers, in order."""


class _Submits(Protocol[Q_contra, A_co]):
    @property
    def batches(self) -> int: ...

    async def submit(self, key: str, request: Q_contra) -> A_co: ...


class Lanes(Generic[Q, A]):
    """The coalescers of one batched round trip, one per event loop, built on first use there.

    ``coalescer(send)`` builds one (``send(key, requests)`` awaits the round trip of a batch);
    loops that are gone take their coalescer with them.
    """

    def __init__(
        self,
        batch: Batch[Q],
        coalescer: Callable[[Callable[[str, list[Q]], Awaitable[list[A]]]], _Submits[Q, A]],
    ) -> None:
        self.batch = batch
        self._make = coalescer
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Submits[Q, A]]
        self._by_loop = weakref.WeakKeyDictionary()

    async def _send(self, key: str, requests: list[Q]) -> list[A]:
        return await self.batch(key, requests).arun(_no_call_async)  # type: ignore[no-any-return]

    async def submit(self, key: str, request: Q) -> A:
        """``request``'s answer, from a round trip shared with the requests queued meanwhile."""
        loop = asyncio.get_running_loop()
        coalescer = self._by_loop.get(loop)
        if coalescer is None:
            coalescer = self._by_loop[loop] = self._make(self._send)
        return await coalescer.submit(key, request)

    def __iter__(self) -> Iterator[_Submits[Q, A]]:
        """The coalescers of the live event loops."""
        return iter(list(self._by_loop.values()))


class Batched(Step, Generic[Q, A]):
    """One request of a round trip: alone in a thread, coalesced by ``lanes`` in a task
    (alone there too when ``lanes`` is ``None``). Its value is the request's answer."""

    __slots__ = ("batch", "key", "lanes", "request")

    def __init__(self, batch: Batch[Q], lanes: Lanes[Q, A] | None, key: str, request: Q) -> None:
        self.batch = batch
        self.lanes = lanes
        self.key = key
        self.request = request

    def run(self, call: Callable[[], Any]) -> A:
        return self.batch(self.key, [self.request]).run(call)[0]  # type: ignore[no-any-return]

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> A:
        if self.lanes is None:
            return (await self.batch(self.key, [self.request]).arun(call))[0]  # type: ignore[no-any-return]
        return await self.lanes.submit(self.key, self.request)

    def __repr__(self) -> str:
        return f"Batched({self.key!r}, {self.request!r})"
