"""Coalesce: writes to one key within a window become one downstream call.

A like counter updated a thousand times a second does not need a thousand ``UPDATE`` s: adding
the increments up for 100 ms and writing the sum once costs the database ten writes a second,
whatever the traffic. ``Coalesce(flush, window=0.1, merge=operator.add)``:

* ``submit(key, value)`` returns at once. The first write to a key opens its **window**
  (``window`` seconds); later writes to that key merge into the pending value,
  ``merge(pending, value)`` (default: the last write wins);
* when the window closes, ``flush(key, merged)`` runs **once** for all of them (through
  ``policy`` when given, e.g. a retry and a timeout);
* **order per key is kept**: values merge in submission order, a key's next batch is never
  flushed while its previous one is still running, and a batch that fails is put back *in
  front of* what arrived meanwhile (``merge(failed, newer)``), to be tried again one window
  later (``on_error="requeue"``, the default; ``"drop"`` gives it up and counts it).
  ``merge`` must therefore be associative, as sums, concatenations, set unions, max and
  "last wins" are;
* bounded: at most ``max_keys`` keys with pending writes; a write for a new key beyond that
  raises :class:`~floodwall.degrade.BacklogFullError` (``kind="backlog_full"``).

Who flushes: :meth:`flush` (sync) / :meth:`flush_async` run what is due now, so a test or a
scheduler can drive it on a :class:`~floodwall.FakeClock`; :meth:`start_thread` or
:meth:`run_async` do it in the background; :meth:`flush_all` / :meth:`flush_all_async` push
everything out at shutdown. Counters: ``submitted``, ``flushes`` (downstream calls), ``merged``
(writes that needed no call of their own), ``failed``, ``requeued``, ``dropped``, ``rejected``;
a ``flushed`` event per call carries the number of writes it merged.

:class:`CoalesceCore` is the decision logic, pure (every method takes ``now``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Literal, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.pending import settle, settle_async
from floodwall._core.policy import Policy
from floodwall._core.steps import Either, Step
from floodwall.degrade._common import BacklogFullError

__all__ = ["Batch", "Coalesce", "CoalesceCore", "last_wins"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def last_wins(pending: Any, value: Any) -> Any:
    """The default merge: the newer value replaces the pending one."""
    return value


@dataclass(slots=True)
class Batch(Generic[K, V]):
    """The merged writes of one key: ``value``, ``count`` writes, due at ``due``."""

    key: K
    value: V
    count: int
    due: float
    seq: int


class CoalesceCore(Generic[K, V]):
    """Pending batches per key and which are due (pure; the shell locks and keeps time)."""

    def __init__(self, window: float, merge: Callable[[V, V], V], max_keys: int) -> None:
        self.window = validate.seconds("window", window)
        self.merge = validate.function("merge", merge, what="a callable (pending, value)")
        self.max_keys = validate.count("max_keys", max_keys)
        self._pending: dict[K, Batch[K, V]] = {}
        self._busy: set[K] = set()
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, key: K, value: V, now: float) -> bool:
        """Merge ``value`` into ``key``'s batch; True when it opened a new window. Raises
        ``OverflowError`` for a new key beyond ``max_keys``."""
        batch = self._pending.get(key)
        if batch is not None:
            batch.value = self.merge(batch.value, value)
            batch.count += 1
            return False
        if len(self._pending) >= self.max_keys:
            raise OverflowError(key)
        self._pending[key] = Batch(key, value, 1, now + self.window, next(self._seq))
        return True

    def take_due(self, now: float, *, everything: bool = False) -> list[Batch[K, V]]:
        """The batches due at ``now`` (all, with ``everything``) whose key has no flush
        running, oldest window first; they are marked as running."""
        due = [
            b
            for key, b in self._pending.items()
            if key not in self._busy and (everything or b.due <= now)
        ]
        due.sort(key=lambda b: (b.due, b.seq))
        for batch in due:
            del self._pending[batch.key]
            self._busy.add(batch.key)
        return due

    def done(self, batch: Batch[K, V], ok: bool, now: float, *, requeue: bool = True) -> None:
        """A flush ended. A failed batch goes back in front of what arrived since."""
        self._busy.discard(batch.key)
        if ok or not requeue:
            return
        newer = self._pending.get(batch.key)
        if newer is None:
            self._pending[batch.key] = Batch(
                batch.key, batch.value, batch.count, now + self.window, batch.seq
            )
        else:
            newer.value = self.merge(batch.value, newer.value)
            newer.count += batch.count
            newer.due = min(newer.due, now + self.window)

    def next_due(self) -> float | None:
        """When the earliest batch whose key is idle is due (``None``: nothing pending)."""
        dues = [b.due for key, b in self._pending.items() if key not in self._busy]
        return min(dues, default=None)


@dataclass(frozen=True, slots=True)
class Flushed(Generic[K, V]):
    """One downstream call: the batch, and the exception if it failed."""

    batch: Batch[K, V]
    exception: Exception | None = None


class Coalesce(Generic[K, V]):
    """Aggregate writes per key within a window (see [Degradation][guide-degradation])."""

    kind = "coalesce"

    def __init__(
        self,
        flush: Callable[[K, V], Any],
        *,
        window: float = defaults.COALESCE_WINDOW,
        merge: Callable[[V, V], V] = last_wins,
        max_keys: int = defaults.COALESCE_MAX_KEYS,
        policy: Policy | None = None,
        on_error: Literal["requeue", "drop"] = "requeue",
        name: str = "coalesce",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        if not callable(flush):
            raise ConfigError(f"flush must be callable, got {flush!r}")
        validate.seconds("window", window)
        validate.count("max_keys", max_keys)
        if on_error not in ("requeue", "drop"):
            raise ConfigError(f"on_error must be 'requeue' or 'drop', got {on_error!r}")
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a floodwall Policy or None, got {policy!r}")
        self.flush_fn = flush
        self.window = float(window)
        self.policy = policy
        self.on_error = on_error
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self.core: CoalesceCore[K, V] = CoalesceCore(self.window, merge, max_keys)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.submitted = 0
        self.flushes = 0
        self.merged = 0
        self.failed = 0
        self.requeued = 0
        self.dropped = 0
        self.rejected = 0

    @property
    def pending(self) -> int:
        """Keys with writes waiting."""
        return len(self.core)

    def submit(self, key: K, value: V) -> None:
        """Queue a write; returns at once (raises ``BacklogFullError`` when full)."""
        with self._lock:
            try:
                opened = self.core.add(key, value, self.clock.monotonic())
            except OverflowError:
                self.rejected += 1
                raise BacklogFullError(
                    self.name, f"{self.core.max_keys} keys already have pending writes", None
                ) from None
            self.submitted += 1
        if opened:
            self._wake.set()

    # -- the decision around one flush (shared by both shells) --------------------------------

    def _take(self, everything: bool) -> list[Batch[K, V]]:
        with self._lock:
            return self.core.take_due(self.clock.monotonic(), everything=everything)

    def _finish(self, batch: Batch[K, V], exc: Exception | None) -> Flushed[K, V]:
        requeue = self.on_error == "requeue"
        with self._lock:
            self.core.done(batch, exc is None, self.clock.monotonic(), requeue=requeue)
            if exc is None:
                self.flushes += 1
                self.merged += batch.count - 1
            else:
                self.failed += 1
                if requeue:
                    self.requeued += batch.count
                else:
                    self.dropped += batch.count
        if exc is None:
            self._emit("flushed", f"{batch.count} write(s) in one call", batch, {})
        else:
            action = "requeued" if self.on_error == "requeue" else "dropped"
            self._emit("flush_failed", f"{exc!r}: {action}", batch, {"action": action})
        return Flushed(batch, exc)

    def _emit(self, kind: str, reason: str, batch: Batch[K, V], extra: dict[str, Any]) -> None:
        if self.listeners:
            figures = {"key": batch.key, "writes": batch.count, **extra}
            now = self.clock.monotonic()
            self.listeners.emit(Event(kind, self.kind, self.name, now, reason, figures=figures))

    # -- the shells: one flush generator, each batch's call an Either step -----------------------

    def _flush(self, everything: bool) -> Generator[Step, Any, list[Flushed[K, V]]]:
        """Both shells' flush: each batch's call is a step, made in either world."""
        results = []
        for batch in self._take(everything):
            error: Exception | None = None
            try:
                yield Either(partial(self._call, batch), partial(self._call_async, batch))
            except Exception as exc:  # noqa: BLE001 - requeued or dropped, counted
                error = exc
            results.append(self._finish(batch, error))
        return results

    def _call(self, batch: Batch[K, V]) -> None:
        if self.policy is None:
            self.flush_fn(batch.key, batch.value)
        else:
            self.policy.call(self.flush_fn, batch.key, batch.value)

    def flush(self, *, everything: bool = False) -> list[Flushed[K, V]]:
        """Flush every batch due now (every pending batch, with ``everything``)."""
        return settle(self._flush(validate.flag("everything", everything, error=ValueError)))  # type: ignore[no-any-return]

    def flush_all(self) -> list[Flushed[K, V]]:
        """Flush every pending batch now (shutdown); failures are requeued or dropped as
        configured, not retried here."""
        return self.flush(everything=True)

    def _delay(self) -> float:
        with self._lock:
            due = self.core.next_due()
        if due is None:
            return self.window or 0.05
        return max(0.0, due - self.clock.monotonic())

    def start_thread(self) -> threading.Thread:
        """Flush in a daemon thread as windows close; stop with :meth:`stop`."""

        def loop() -> None:
            while not self._stop.is_set():
                self.flush()
                self._wake.clear()
                self._wake.wait(self._delay())
            self.flush_all()

        thread = threading.Thread(target=loop, name=f"floodwall-{self.name}", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop the background loop (it flushes what is pending on its way out)."""
        self._stop.set()
        self._wake.set()

    async def flush_async(self, *, everything: bool = False) -> list[Flushed[K, V]]:
        """:meth:`flush` for async flush functions (a sync one is called directly)."""
        flag = validate.flag("everything", everything, error=ValueError)
        return await settle_async(self._flush(flag))  # type: ignore[no-any-return]

    async def flush_all_async(self) -> list[Flushed[K, V]]:
        return await self.flush_async(everything=True)

    async def _call_async(self, batch: Batch[K, V]) -> None:
        flush: Callable[..., Awaitable[Any]] | Callable[..., Any] = self.flush_fn

        async def run(key: K, value: V) -> Any:
            result = flush(key, value)
            if isinstance(result, Awaitable):
                return await result
            return result

        if self.policy is None:
            await run(batch.key, batch.value)
        else:
            await self.policy.call_async(run, batch.key, batch.value)

    async def run_async(self) -> None:
        """Flush as windows close, until cancelled or :meth:`stop` (then flush what is left)."""
        try:
            while not self._stop.is_set():
                await self.flush_async()
                await self.clock.async_sleep(max(self._delay(), 0.001))
        finally:
            if self._stop.is_set():
                await self.flush_all_async()

    def snapshot(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "submitted": self.submitted,
            "flushes": self.flushes,
            "merged": self.merged,
            "failed": self.failed,
            "requeued": self.requeued,
            "dropped": self.dropped,
            "rejected": self.rejected,
        }

    def __repr__(self) -> str:
        return f"Coalesce({self.name!r}, window={self.window:g}s, pending={self.pending})"
