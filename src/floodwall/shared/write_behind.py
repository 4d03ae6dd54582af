"""WriteBehind: a synchronous write becomes a bounded, queued, asynchronous one.

When the database behind a write is slow or down, the caller should not wait for it (or fail
with it) if the write can land a little later: a view counter, an audit record, a "seen"
marker, a recommendation signal. ``WriteBehind(write)`` takes the write off the request path:

* ``submit(payload)`` puts the write in a **bounded queue** and returns a :class:`Deferred`
  receipt at once. A full queue refuses with :class:`~floodwall.degrade.BacklogFullError`
  (``on_full="reject"``, the default: backpressure instead of unbounded memory), or performs
  the write synchronously instead (``on_full="write_through"``);
* a worker (:meth:`deliver` / :meth:`deliver_async` for one round, :meth:`start_thread` or
  :meth:`run_async` in the background) takes writes oldest first and runs ``write(payload)``,
  through ``policy`` when given (a timeout, a breaker, an
  :class:`~floodwall.Idempotency`…), inside :func:`floodwall.idempotency_key` (the write's
  key: ``key=``, else the ambient key at submit time, else a fresh random one);
* a write is **acknowledged only after it succeeded**. A failed one stays at the head of the
  queue, and the worker waits before trying it again: a full-jitter exponential backoff
  (``backoff``, 0.1 s doubling to 10 s; at least the failure's ``retry_after``), reset by the
  next success. Writes keep their order: nothing behind a failing write overtakes it. With
  ``max_attempts`` a write failing that often is handed to ``dead_letter(message, exc)`` and
  removed; by default writes are retried until they succeed (a downstream outage delays them,
  it does not lose them).

**Delivery is at least once**, not exactly once: a crash between a successful write and its
acknowledgement delivers that write again. Every delivery carries the write's idempotency key,
so the sink can tell: make the write idempotent on that key (an ``INSERT … ON CONFLICT (key)
DO NOTHING`` in the same transaction as the effect is the robust way; an
:class:`~floodwall.Idempotency` policy in ``policy`` deduplicates every redelivery except one
whose crash fell between the effect and the idempotency record).

Queues (:class:`WriteQueue`): :class:`MemoryQueue` (this process; lost with it) or
:class:`StreamQueue` (Redis Streams through :class:`floodwall.stores.streams.RedisStream`: the
backlog survives a process restart, and a restarted worker with the same ``consumer`` name
first resumes the writes it had taken). Counters: ``deferred``, ``delivered``, ``failures``
(failed attempts), ``dead_lettered``, ``rejected``, ``written_through``, ``queue_errors``;
events of the same names (``deferred``, ``delivered``, ``write_failed``, ``dead_lettered``,
``rejected``).

**Closing** (:meth:`WriteBehind.close`) stops the background loop and drains what is queued
within ``timeout`` seconds, like ``Coalesce.stop()``; whatever is left is reported by count in
a ``closed`` event, a log line and the return value (on a memory queue those writes are lost; a
stream queue keeps them for the next worker). A process that exits with writes still in a
memory queue logs how many it dropped, so a lost backlog is never silent.
"""

from __future__ import annotations

import atexit
import inspect
import itertools
import logging
import math
import random
import sys
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, RejectedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.pending import settle, settle_async
from floodwall._core.policy import Policy
from floodwall._core.steps import Either, Step
from floodwall.backoff import Backoff, FullJitter, Rng
from floodwall.context import current_idempotency_key, idempotency_key
from floodwall.degrade._common import BacklogFullError
from floodwall.shared.idempotency import JSON_CODEC, Codec
from floodwall.stores.base import StoreUnavailableError

__all__ = [
    "Deferred",
    "MemoryQueue",
    "Message",
    "StreamQueue",
    "WriteBehind",
    "WriteQueue",
]


log = logging.getLogger("floodwall.degrade")

_OPEN: weakref.WeakSet[WriteBehind] = weakref.WeakSet()
"""Write-behinds with a memory queue not closed yet: checked at interpreter exit."""

CLOSE_TIMEOUT = 5.0
"""Seconds :meth:`WriteBehind.close` drains for by default."""

CLOSE_POLL = 0.01
"""Seconds :meth:`WriteBehind.close` waits for a delivery running in another thread."""


@dataclass(frozen=True, slots=True)
class Message:
    """A queued write: the queue's ``id``, its idempotency ``key`` and the ``payload``."""

    id: str
    key: str
    payload: Any


@dataclass(frozen=True, slots=True)
class Deferred:
    """The receipt of a submitted write: its queue ``id`` and idempotency ``key``
    (``id`` is empty for a write performed synchronously because the queue was full)."""

    id: str
    key: str


class WriteQueue(Protocol):
    """Where deferred writes wait; sync and async forms of each operation."""

    durable: bool
    """Whether queued writes survive the process."""

    def put(self, key: str, payload: Any) -> str | None:
        """Queue a write; its id, or ``None`` when the queue is full."""
        ...

    def take(self, count: int) -> list[Message]:
        """Up to ``count`` unacknowledged writes, oldest first (they stay until acked)."""
        ...

    def ack(self, ids: Sequence[str]) -> None: ...

    def depth(self) -> int:
        """Writes waiting (taken or not), not yet acknowledged."""
        ...

    async def put_async(self, key: str, payload: Any) -> str | None: ...

    async def take_async(self, count: int) -> list[Message]: ...

    async def ack_async(self, ids: Sequence[str]) -> None: ...

    async def depth_async(self) -> int: ...


def _ids(ids: object) -> None:
    """Message ids to acknowledge: a sequence of strings (one bare string is refused)."""
    if isinstance(ids, str) or not isinstance(ids, Sequence):
        raise TypeError(f"ids must be a sequence of message ids, got {ids!r}")
    for item in ids:
        validate.text("ids items", item, error=ValueError)


class MemoryQueue:
    """A bounded in-process queue (``max_pending`` writes); lost when the process ends."""

    durable = False

    def __init__(self, max_pending: int = defaults.WRITE_BEHIND_MAX_PENDING) -> None:
        validate.count("max_pending", max_pending)
        self.max_pending = max_pending
        self._items: deque[Message] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def put(self, key: str, payload: Any) -> str | None:
        validate.text("key", key, error=ValueError)
        with self._lock:
            if len(self._items) >= self.max_pending:
                return None
            message = Message(str(next(self._ids)), key, payload)
            self._items.append(message)
            return message.id

    def take(self, count: int) -> list[Message]:
        validate.count("count", count, 1, sys.maxsize, error=ValueError)
        with self._lock:
            return list(itertools.islice(self._items, count))

    def ack(self, ids: Sequence[str]) -> None:
        _ids(ids)
        done = set(ids)
        with self._lock:
            while self._items and self._items[0].id in done:
                done.discard(self._items.popleft().id)
            if done:  # acknowledged out of order: rare, O(n)
                self._items = deque(m for m in self._items if m.id not in done)

    def depth(self) -> int:
        return len(self._items)

    async def put_async(self, key: str, payload: Any) -> str | None:
        return self.put(key, payload)

    async def take_async(self, count: int) -> list[Message]:
        return self.take(count)

    async def ack_async(self, ids: Sequence[str]) -> None:
        self.ack(ids)

    async def depth_async(self) -> int:
        return self.depth()


class StreamQueue:
    """A durable queue on Redis Streams (:class:`floodwall.stores.streams.RedisStream`).

    ``StreamQueue("redis://…", "audit", consumer="worker-1")``: payloads cross as ``codec``
    (JSON by default). Give each worker process a stable ``consumer`` name so a restart resumes
    its own pending writes; writes left by a consumer that never comes back are claimed after
    ``claim_after`` seconds. An entry that cannot be decoded is acknowledged and counted in
    ``malformed`` (it can never be written).
    """

    durable = True

    def __init__(
        self,
        store: Any,
        name: str,
        *,
        consumer: str,
        group: str = "floodwall",
        max_pending: int = defaults.WRITE_BEHIND_MAX_PENDING,
        claim_after: float | None = defaults.WRITE_BEHIND_CLAIM_AFTER,
        codec: Codec = JSON_CODEC,
        **store_options: Any,
    ) -> None:
        from floodwall.stores.streams import RedisStream  # needs redis-py: import on use

        validate.count("max_pending", max_pending)
        validate.codec("codec", codec)
        self.stream = RedisStream(
            store,
            name,
            consumer=consumer,
            group=group,
            max_length=max_pending,
            claim_after=claim_after,
            **store_options,
        )
        self.codec = codec
        self.malformed = 0

    def _fields(self, key: str, payload: Any) -> dict[str, bytes | str]:
        return {"k": key, "p": self.codec.dumps(payload)}

    def _messages(self, entries: Iterable[Any]) -> tuple[list[Message], list[str]]:
        messages: list[Message] = []
        bad: list[str] = []
        for entry in entries:
            try:
                key = entry.fields[b"k"].decode()
                payload = self.codec.loads(entry.fields[b"p"])
            except (KeyError, ValueError, UnicodeDecodeError):
                bad.append(entry.id)
                continue
            messages.append(Message(entry.id, key, payload))
        self.malformed += len(bad)
        return messages, bad

    def put(self, key: str, payload: Any) -> str | None:
        return self.stream.add(self._fields(key, payload))

    def take(self, count: int) -> list[Message]:
        messages, bad = self._messages(self.stream.read(count))
        self.stream.ack(bad)
        return messages

    def ack(self, ids: Sequence[str]) -> None:
        self.stream.ack(ids)

    def depth(self) -> int:
        return self.stream.length()

    async def put_async(self, key: str, payload: Any) -> str | None:
        return await self.stream.add_async(self._fields(key, payload))

    async def take_async(self, count: int) -> list[Message]:
        messages, bad = self._messages(await self.stream.read_async(count))
        await self.stream.ack_async(bad)
        return messages

    async def ack_async(self, ids: Sequence[str]) -> None:
        await self.stream.ack_async(ids)

    async def depth_async(self) -> int:
        return await self.stream.length_async()


# -- the delivery decision ---------------------------------------------------------------------


class DeliveryCore:
    """When to try again, and when to give up (pure: every method takes ``now``).

    One failure streak at a time (the head of the queue): its delays come from ``backoff``,
    at least the failure's ``retry_after``; a success ends the streak.
    """

    def __init__(self, backoff: Backoff, rng: Rng, max_attempts: int | None) -> None:
        if not isinstance(backoff, Backoff):
            raise ConfigError(f"backoff must have a delays() method, got {backoff!r}")
        if not callable(getattr(rng, "random", None)):
            raise ConfigError(f"rng must have a random() method, got {rng!r}")
        self.backoff = backoff
        self.rng = rng
        self.max_attempts = (
            None if max_attempts is None else validate.count("max_attempts", max_attempts)
        )
        self.blocked_until = -math.inf
        self.attempts: dict[str, int] = {}
        self._delays: Iterator[float] | None = None

    def ready(self, now: float) -> bool:
        return now >= self.blocked_until

    def wait(self, now: float) -> float:
        """Seconds until the next attempt may run (0 when it may now)."""
        return max(0.0, self.blocked_until - now)

    def succeeded(self, message_id: str) -> None:
        self.attempts.pop(message_id, None)
        self._delays = None

    def failed(
        self, message_id: str, now: float, retry_after: float | None
    ) -> Literal["retry", "dead_letter"]:
        attempts = self.attempts.get(message_id, 0) + 1
        if self.max_attempts is not None and attempts >= self.max_attempts:
            self.attempts.pop(message_id, None)
            return "dead_letter"
        self.attempts[message_id] = attempts
        if self._delays is None:
            self._delays = self.backoff.delays(self.rng)
        self.blocked_until = now + max(next(self._delays), retry_after or 0.0)
        return "retry"

    def pause(self, now: float) -> None:
        """The queue itself failed: wait as after a failed write."""
        if self._delays is None:
            self._delays = self.backoff.delays(self.rng)
        self.blocked_until = now + next(self._delays)


# -- the writer ----------------------------------------------------------------------------------


class WriteBehind:
    """Deferred writes with at-least-once delivery (see [Degradation][guide-degradation])."""

    kind = "write_behind"

    def __init__(
        self,
        write: Callable[[Any], Any],
        *,
        queue: WriteQueue | None = None,
        max_pending: int = defaults.WRITE_BEHIND_MAX_PENDING,
        batch: int = defaults.WRITE_BEHIND_BATCH,
        policy: Policy | None = None,
        backoff: Backoff | None = None,
        max_attempts: int | None = None,
        dead_letter: Callable[[Message, Exception], None] | None = None,
        on_full: Literal["reject", "write_through"] = "reject",
        idle_wait: float = defaults.WRITE_BEHIND_IDLE_WAIT,
        name: str = "write_behind",
        clock: Clock = SYSTEM_CLOCK,
        rng: Rng | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        if not callable(write):
            raise ConfigError(f"write must be callable, got {write!r}")
        validate.count("batch", batch)
        if max_attempts is not None:
            validate.count("max_attempts", max_attempts)
        if on_full not in ("reject", "write_through"):
            raise ConfigError(f"on_full must be 'reject' or 'write_through', got {on_full!r}")
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a floodwall Policy or None, got {policy!r}")
        validate.seconds("idle_wait", idle_wait, positive=True)
        if queue is not None and not all(
            callable(getattr(queue, m, None)) for m in ("put", "take", "ack", "depth")
        ):
            raise ConfigError(f"queue must be a WriteQueue (put, take, ack, depth), got {queue!r}")
        if backoff is not None and not isinstance(backoff, Backoff):
            raise ConfigError(f"backoff must have a delays() method, got {backoff!r}")
        if dead_letter is not None:
            validate.function("dead_letter", dead_letter, what="a callable (message, error)")
        self.write = write
        self.queue: WriteQueue = queue if queue is not None else MemoryQueue(max_pending)
        self.batch = batch
        self.policy = policy
        self.dead_letter = dead_letter
        self.on_full = on_full
        self.idle_wait = float(idle_wait)
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        chosen = backoff or FullJitter(
            defaults.WRITE_BEHIND_RETRY_BASE, cap=defaults.WRITE_BEHIND_RETRY_CAP
        )
        self.core = DeliveryCore(chosen, rng or random.Random(), max_attempts)
        self._deliver_lock = threading.Lock()
        self._stop = threading.Event()
        self.deferred = 0
        self.delivered = 0
        self.failures = 0
        self.dead_lettered = 0
        self.rejected = 0
        self.written_through = 0
        self.queue_errors = 0
        self.closed = False
        if not self.queue.durable:
            _OPEN.add(self)

    # -- submitting ----------------------------------------------------------------------------

    @staticmethod
    def _key(key: str | None) -> str:
        if key is not None:
            if not isinstance(key, str) or not key:
                raise ConfigError(f"key must be a non-empty string, got {key!r}")
            return key
        return current_idempotency_key() or uuid.uuid4().hex

    def _queued(self, key: str, message_id: str | None) -> Deferred | None:
        if message_id is not None:
            self.deferred += 1
            self._emit("deferred", "write queued", {"key": key, "id": message_id})
            return Deferred(message_id, key)
        if self.on_full == "reject":
            self.rejected += 1
            self._emit("rejected", "write queue full", {"key": key})
            raise BacklogFullError(self.name, "the write-behind queue is full", None)
        self.written_through += 1
        return None

    def submit(self, payload: Any, *, key: str | None = None) -> Deferred:
        """Queue ``write(payload)``; returns at once (see [Degradation][guide-degradation] for a
        full queue). Raises :class:`~floodwall.stores.StoreUnavailableError` when a durable queue
        cannot take it (the caller knows the write was not accepted)."""
        chosen = self._key(key)
        receipt = self._queued(chosen, self.queue.put(chosen, payload))
        if receipt is not None:
            return receipt
        with idempotency_key(chosen):
            self._run(payload)
        return Deferred("", chosen)

    async def submit_async(self, payload: Any, *, key: str | None = None) -> Deferred:
        """:meth:`submit` for async callers."""
        chosen = self._key(key)
        receipt = self._queued(chosen, await self.queue.put_async(chosen, payload))
        if receipt is not None:
            return receipt
        with idempotency_key(chosen):
            await self._run_async(payload)
        return Deferred("", chosen)

    def pending(self) -> int:
        """Writes not yet acknowledged."""
        return self.queue.depth()

    # -- the decision around one write (shared by both shells) -----------------------------------

    def _succeeded(self, message: Message) -> None:
        self.core.succeeded(message.id)
        self.delivered += 1
        self._emit("delivered", "write applied", {"key": message.key, "id": message.id})

    def _failed(self, message: Message, exc: Exception) -> bool:
        """Count a failed write; True when it was dead-lettered (then acknowledge it and go
        on), False when it must be retried later (stop this round)."""
        self.failures += 1
        retry_after = exc.retry_after if isinstance(exc, RejectedError) else None
        verdict = self.core.failed(message.id, self.clock.monotonic(), retry_after)
        figures = {"key": message.key, "id": message.id, "error": repr(exc)}
        if verdict == "retry":
            wait = self.core.wait(self.clock.monotonic())
            self._emit("write_failed", f"{exc!r}: retry in {wait:.3f}s", figures)
            return False
        self.dead_lettered += 1
        self._emit("dead_lettered", f"{exc!r}: giving up", figures)
        if self.dead_letter is not None:
            self.dead_letter(message, exc)
        return True

    def _queue_failed(self, exc: StoreUnavailableError) -> None:
        self.queue_errors += 1
        self.core.pause(self.clock.monotonic())
        self._emit("queue_error", str(exc), {})

    # -- the shells: one delivery generator, each write and queue round trip an Either step ----

    def _run(self, payload: Any) -> None:
        if inspect.iscoroutinefunction(self.write):
            raise ConfigError(f"write-behind {self.name!r} has an async write; use the async API")
        if self.policy is None:
            self.write(payload)
        else:
            self.policy.call(self.write, payload)

    def deliver(self, limit: int | None = None) -> int:
        """One delivery round: write what is queued (at most ``limit``), oldest first, until
        the queue is empty or a write fails. Returns how many writes were applied. Does
        nothing while a retry is not due, or while another thread delivers."""
        if limit is not None:
            validate.count("limit", limit, error=ValueError)
        if inspect.iscoroutinefunction(self.write):
            raise ConfigError(f"write-behind {self.name!r} has an async write; use the async API")
        return settle(self._deliver(limit))  # type: ignore[no-any-return]

    def _deliver(self, limit: int | None) -> Generator[Step, Any, int]:
        """Both shells' delivery: the queue and the writes are steps, taken in either world."""
        if not self._deliver_lock.acquire(blocking=False):
            return 0
        try:
            done = 0
            queue = self.queue
            while limit is None or done < limit:
                if not self.core.ready(self.clock.monotonic()):
                    break
                count = self.batch if limit is None else min(self.batch, limit - done)
                try:
                    messages = yield Either(
                        partial(queue.take, count), partial(queue.take_async, count)
                    )
                except StoreUnavailableError as exc:
                    self._queue_failed(exc)
                    break
                applied, finished = yield from self._round(messages)
                done += applied
                if finished or not messages:
                    break
            return done
        finally:
            self._deliver_lock.release()

    def _round(self, messages: list[Message]) -> Generator[Step, Any, tuple[int, bool]]:
        """Write ``messages`` in order; ``(applied, stopped_early)``."""
        acks: list[str] = []
        applied = 0
        stopped = False
        for message in messages:
            payload = message.payload
            try:
                with idempotency_key(message.key):
                    yield Either(partial(self._run, payload), partial(self._run_async, payload))
            except Exception as exc:  # noqa: BLE001 - retried or dead-lettered, counted
                if not self._failed(message, exc):
                    stopped = True
                    break
                acks.append(message.id)
                continue
            self._succeeded(message)
            acks.append(message.id)
            applied += 1
        try:
            yield Either(partial(self.queue.ack, acks), partial(self.queue.ack_async, acks))
        except StoreUnavailableError as exc:  # redelivered later; the key deduplicates
            self._queue_failed(exc)
            stopped = True
        return applied, stopped

    def start_thread(self) -> threading.Thread:
        """Deliver in a daemon thread; stop with :meth:`stop`."""

        def loop() -> None:
            while not self._stop.is_set():
                if not self.deliver():
                    self._stop.wait(max(self.core.wait(self.clock.monotonic()), self.idle_wait))

        thread = threading.Thread(target=loop, name=f"floodwall-{self.name}", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop the background loop (queued writes stay queued; :meth:`close` drains them)."""
        self._stop.set()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> int:
        """Stop the background loop and deliver what is queued for at most ``timeout`` seconds
        (the write in progress when the time is up is not interrupted: bound it with a
        ``Timeout`` in ``policy``). Returns how many writes are left; a non-zero count is
        reported in a ``closed`` event and a warning, since on a memory queue they are lost."""
        validate.seconds("timeout", timeout)
        if inspect.iscoroutinefunction(self.write):
            raise ConfigError(
                f"write-behind {self.name!r} has an async write: drain it with deliver_async(), "
                "then close(0)"
            )
        self._stop.set()
        clock = self.clock
        deadline = clock.monotonic() + timeout
        while self._left() > 0 and clock.monotonic() < deadline:
            if not self.deliver():
                now = clock.monotonic()
                clock.sleep(min(max(self.core.wait(now), CLOSE_POLL), max(deadline - now, 0.0)))
        return self._closed(timeout)

    def _left(self) -> int:
        """Writes not applied, or -1 when unknown (a durable queue's store is down: they stay
        in it)."""
        try:
            return self.pending()
        except StoreUnavailableError:
            return -1

    def _closed(self, timeout: float) -> int:
        left = self._left()
        self.closed = True
        _OPEN.discard(self)
        if left:
            fate = "kept in the stream" if self.queue.durable else "dropped"
            what = "an unknown number of" if left < 0 else str(left)
            reason = f"closed after {timeout:.3f}s with {what} writes not applied ({fate})"
            self._emit("closed", reason, {"left": left, "durable": self.queue.durable})
            log.warning("write-behind %r %s", self.name, reason)
        return left

    async def _run_async(self, payload: Any) -> None:
        write = self.write

        async def run(value: Any) -> Any:
            result = write(value)
            if inspect.isawaitable(result):
                return await result
            return result

        if self.policy is None:
            await run(payload)
        else:
            await self.policy.call_async(run, payload)

    async def deliver_async(self, limit: int | None = None) -> int:
        """:meth:`deliver` for async writes and queues."""
        if limit is not None:
            validate.count("limit", limit, error=ValueError)
        return await settle_async(self._deliver(limit))  # type: ignore[no-any-return]

    async def run_async(self) -> None:
        """Deliver until cancelled or :meth:`stop`, sleeping on the clock when idle."""
        while not self._stop.is_set():
            if not await self.deliver_async():
                wait = max(self.core.wait(self.clock.monotonic()), self.idle_wait)
                await self.clock.async_sleep(wait)

    # -- reporting -------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "deferred": self.deferred,
            "delivered": self.delivered,
            "failures": self.failures,
            "dead_lettered": self.dead_lettered,
            "rejected": self.rejected,
            "written_through": self.written_through,
            "queue_errors": self.queue_errors,
            "retry_in": self.core.wait(self.clock.monotonic()),
        }

    def _emit(self, kind: str, reason: str, figures: dict[str, Any]) -> None:
        if self.listeners:
            now = self.clock.monotonic()
            self.listeners.emit(Event(kind, self.kind, self.name, now, reason, figures=figures))

    def __repr__(self) -> str:
        durable = "durable" if self.queue.durable else "memory"
        return f"WriteBehind({self.name!r}, {durable})"


@atexit.register
def _report_dropped_at_exit() -> None:
    """Log the writes still queued in memory when the process exits (they die with it)."""
    for each in list(_OPEN):
        left = each.pending()
        if left and not each.closed:
            log.warning(
                "write-behind %r: process exiting with %d writes in its memory queue, dropped "
                "(call close(timeout) before exit to drain them)",
                each.name,
                left,
            )
