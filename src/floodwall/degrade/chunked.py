"""Bulk work in chunks: one failure costs one chunk, not the batch.

A nightly job that pushes 200 000 rows in one call fails whole when one row is bad, one
request times out or the downstream sheds it, and then it retries whole, hammering the service
it just overloaded. ``chunked(items, size, policy)`` cuts the batch into chunks of ``size``
items and runs ``fn(chunk)`` once per chunk, each through ``policy`` (a
:class:`~floodwall.Pipeline` with a retry, a timeout, a rate limit…), and returns a
:class:`BatchResult`: the value or the exception of every chunk, in order, instead of
all-or-nothing::

    result = chunked(rows, 500, Pipeline(Retry("push"), Timeout(5))).run(push_rows)
    result.values            # what the successful chunks returned, in order
    result.failed_items      # the items of failed (and skipped) chunks, to resubmit later
    result.raise_for_failures()   # an ExceptionGroup of the chunks' errors, when you must

Options: ``max_failures`` stops starting new chunks after that many failed (the rest are
*skipped*: a downstream that is down does not need 400 more tries); ``pause`` seconds between
chunks on the injected clock (so a bulk job leaves room for live traffic); ``run_async(fn,
concurrency=n)`` runs up to ``n`` chunks at once, results still in chunk order.

Only ``Exception`` fails a chunk: ``KeyboardInterrupt`` and task cancellation stop the batch.
``items`` may be any iterable, a generator included (it is read one chunk at a time).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.policy import Policy

__all__ = ["BatchResult", "Chunk", "Chunked", "chunked"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Chunk(Generic[T, R]):
    """One chunk's fate: its ``index``, the offset ``start`` of its first item in the batch,
    its ``items``, and either ``value`` (success), ``exception`` (failure) or ``skipped``."""

    index: int
    start: int
    items: tuple[T, ...]
    value: R | None = None
    exception: Exception | None = None
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return self.exception is None and not self.skipped


@dataclass(frozen=True, slots=True)
class BatchResult(Generic[T, R]):
    """Every chunk of a batch, in order."""

    chunks: tuple[Chunk[T, R], ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """True when every chunk succeeded."""
        return all(chunk.ok for chunk in self.chunks)

    @property
    def succeeded(self) -> list[Chunk[T, R]]:
        return [chunk for chunk in self.chunks if chunk.ok]

    @property
    def failed(self) -> list[Chunk[T, R]]:
        return [chunk for chunk in self.chunks if chunk.exception is not None]

    @property
    def skipped(self) -> list[Chunk[T, R]]:
        return [chunk for chunk in self.chunks if chunk.skipped]

    @property
    def values(self) -> list[R]:
        """The successful chunks' return values, in chunk order."""
        return [chunk.value for chunk in self.chunks if chunk.ok]  # type: ignore[misc]

    @property
    def failed_items(self) -> list[T]:
        """The items of failed and skipped chunks, in order: what to resubmit."""
        return [item for chunk in self.chunks if not chunk.ok for item in chunk.items]

    def raise_for_failures(self) -> None:
        """Raise an :class:`ExceptionGroup` of the failed chunks' exceptions, if any."""
        errors = [chunk.exception for chunk in self.chunks if chunk.exception is not None]
        if errors:
            raise ExceptionGroup(f"{len(errors)} of {len(self.chunks)} chunks failed", errors)

    def __str__(self) -> str:
        return (
            f"{len(self.chunks)} chunks: {len(self.succeeded)} ok, {len(self.failed)} failed, "
            f"{len(self.skipped)} skipped"
        )


class Chunked(Generic[T]):
    """A batch cut into chunks, ready to run (see [Degradation][guide-degradation])."""

    def __init__(
        self,
        items: Iterable[T],
        size: int = defaults.CHUNK_SIZE,
        policy: Policy | None = None,
        *,
        max_failures: int | None = None,
        pause: float = 0.0,
        name: str = "chunked",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        validate.count("size", size)
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a floodwall Policy or None, got {policy!r}")
        if max_failures is not None and (
            isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 1
        ):
            raise ConfigError(f"max_failures must be an integer >= 1 or None, got {max_failures!r}")
        validate.seconds("pause", pause)
        self.items = items
        self.size = size
        self.policy = policy
        self.max_failures = max_failures
        self.pause = float(pause)
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._failures = 0

    def __iter__(self) -> Iterator[tuple[int, tuple[T, ...]]]:
        """``(start, items)`` of each chunk, reading ``items`` one chunk at a time."""
        source = iter(self.items)
        start = 0
        while chunk := tuple(itertools.islice(source, self.size)):
            yield start, chunk
            start += len(chunk)

    # -- the decision core (shared) ---------------------------------------------------------

    def _stopped(self) -> bool:
        return self.max_failures is not None and self._failures >= self.max_failures

    def _record(
        self, index: int, start: int, items: tuple[T, ...], value: Any, exc: Exception | None
    ) -> Chunk[T, Any]:
        if exc is None:
            return Chunk(index, start, items, value)
        self._failures += 1
        self._emit(
            "chunk_failed",
            f"chunk {index} (items {start}..{start + len(items) - 1}): {exc!r}",
            {"index": index, "start": start, "size": len(items)},
        )
        return Chunk(index, start, items, exception=exc)

    def _done(self, chunks: list[Chunk[T, Any]]) -> BatchResult[T, Any]:
        result = BatchResult(tuple(sorted(chunks, key=lambda c: c.index)))
        self._emit(
            "batch_done",
            str(result),
            {
                "chunks": len(result.chunks),
                "failed": len(result.failed),
                "skipped": len(result.skipped),
            },
        )
        return result

    # -- the shells -------------------------------------------------------------------------

    def run(self, fn: Callable[[tuple[T, ...]], R]) -> BatchResult[T, R]:
        """Run ``fn(chunk)`` for every chunk, one after the other."""
        self._failures = 0
        chunks: list[Chunk[T, Any]] = []
        for index, (start, items) in enumerate(self):
            if self._stopped():
                chunks.append(Chunk(index, start, items, skipped=True))
                continue
            if index and self.pause:
                self.clock.sleep(self.pause)
            value: Any = None
            error: Exception | None = None
            try:
                value = fn(items) if self.policy is None else self.policy.call(fn, items)
            except Exception as exc:  # noqa: BLE001 - a failed chunk is a result
                error = exc
            chunks.append(self._record(index, start, items, value, error))
        return self._done(chunks)

    async def run_async(
        self, fn: Callable[[tuple[T, ...]], Awaitable[R]], *, concurrency: int = 1
    ) -> BatchResult[T, R]:
        """Await ``fn(chunk)`` for every chunk, up to ``concurrency`` at once."""
        validate.count("concurrency", concurrency)
        self._failures = 0
        chunks: list[Chunk[T, Any]] = []
        slots = asyncio.Semaphore(concurrency)

        async def one(index: int, start: int, items: tuple[T, ...]) -> None:
            try:
                if self._stopped():
                    chunks.append(Chunk(index, start, items, skipped=True))
                    return
                if index and self.pause:
                    await self.clock.async_sleep(self.pause)
                value: Any = None
                error: Exception | None = None
                try:
                    if self.policy is None:
                        value = await fn(items)
                    else:
                        value = await self.policy.call_async(fn, items)
                except Exception as exc:  # noqa: BLE001 - a failed chunk is a result
                    error = exc
                chunks.append(self._record(index, start, items, value, error))
            finally:
                slots.release()

        async with asyncio.TaskGroup() as group:
            for index, (start, items) in enumerate(self):
                await slots.acquire()  # read the next chunk only when a slot is free
                group.create_task(one(index, start, items))
        return self._done(chunks)

    def _emit(self, kind: str, reason: str, figures: dict[str, Any]) -> None:
        if self.listeners:
            now = self.clock.monotonic()
            self.listeners.emit(Event(kind, "chunked", self.name, now, reason, figures=figures))


def chunked(
    items: Iterable[T],
    size: int = defaults.CHUNK_SIZE,
    policy: Policy | None = None,
    **options: Any,
) -> Chunked[T]:
    """``items`` in chunks of ``size``, each run through ``policy``: call ``.run(fn)`` or
    ``await .run_async(fn)`` for the :class:`BatchResult`. ``options``: ``max_failures``,
    ``pause``, ``name``, ``clock``, ``listeners`` (see :class:`Chunked`)."""
    return Chunked(items, size, policy, **options)
