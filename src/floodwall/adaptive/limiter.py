"""AdaptiveLimiter: hand out tokens up to an adaptive limit; callers say how each call went.

The limiter is the thin, thread-safe shell around a pure :class:`~floodwall.adaptive.Limit`
(concurrency-limits' ``SimpleLimiter`` + ``AbstractPartitionedLimiter`` + ``LifoBlockingLimiter``):

* :meth:`AdaptiveLimiter.acquire` returns a :class:`Token` while fewer than ``limit`` tokens are
  out, else ``None``. The caller closes the token exactly once: :meth:`Token.success` (the RTT
  becomes a sample), :meth:`Token.dropped` (a timeout or a downstream rejection: a drop sample)
  or :meth:`Token.ignore` (no sample: a business error says nothing about capacity). Closing
  twice is a no-op, so a token can never be released twice.
* ``partitions={"live": 0.8, "batch": 0.2}`` gives each request class a guaranteed share
  (``floor(limit × share)`` tokens). A class may borrow unused capacity beyond its share, but
  never a slot another class is entitled to and not using; the total never exceeds the limit.
  Requests naming no known partition share what nobody reserved.
* ``backlog_size > 0`` makes :meth:`acquire_blocking` and :meth:`acquire_async` wait for a token
  instead of failing, up to ``backlog_timeout`` seconds, in LIFO order by default: under overload
  the newest waiter (most likely still wanted by its client) is served first and the oldest
  time out (Netflix's ``LifoBlockingLimiter``: 100 waiters, 1 s).

Use it as a policy too: ``limiter.call(fn)`` / ``await limiter.call_async(fn)`` raise
:class:`~floodwall.OverloadedError` when no token is to be had; a return closes the token as a
success, a ``TimeoutError`` or floodwall rejection as dropped, any other exception as ignored.

Cost: one lock round trip and one clock read per acquire and per release, plus the algorithm's
``on_sample``; O(partitions) when partitioned.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, ParamSpec, TypeVar

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, OverloadedError, RejectedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.policy import Policy
from floodwall.adaptive._base import Limit

__all__ = ["AdaptiveLimiter", "PartitionStats", "Token"]

P = ParamSpec("P")
R = TypeVar("R")

_OPEN, _SUCCESS, _DROPPED, _IGNORED = 0, 1, 2, 3


class Token:
    """Permission to run one call; close it exactly once with success, dropped or ignore.

    Also a context manager: a clean exit is a success, ``TimeoutError`` or a floodwall rejection
    is dropped, any other exception is ignored.
    """

    __slots__ = ("_limiter", "_state", "inflight", "partition", "start")

    def __init__(
        self, limiter: AdaptiveLimiter, start: float, inflight: int, partition: _Partition | None
    ) -> None:
        self._limiter = limiter
        self._state = _OPEN
        self.start = start
        """Clock reading when the token was handed out."""
        self.inflight = inflight
        """Tokens out (this one included) when it was handed out."""
        self.partition = partition

    @property
    def closed(self) -> bool:
        return self._state != _OPEN

    def success(self) -> bool:
        """The call completed: its RTT becomes a sample. False if already closed."""
        return self._limiter._release(self, _SUCCESS)

    def dropped(self) -> bool:
        """The call timed out or was shed downstream: a drop sample. False if already closed."""
        return self._limiter._release(self, _DROPPED)

    def ignore(self) -> bool:
        """Release without a sample (the outcome says nothing about capacity)."""
        return self._limiter._release(self, _IGNORED)

    def __enter__(self) -> Token:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.success()
        elif isinstance(exc, self._limiter.drop_on):
            self.dropped()
        else:
            self.ignore()

    def __repr__(self) -> str:
        state = ("open", "success", "dropped", "ignored")[self._state]
        return f"<Token {state} start={self.start:.6f} inflight={self.inflight}>"


_new_token = object.__new__


class _Partition:
    __slots__ = ("busy", "name", "share", "weight")

    def __init__(self, name: str, weight: float) -> None:
        self.name = name
        self.weight = weight
        self.share = 0
        self.busy = 0


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """One partition's guaranteed share of the limit and its tokens out."""

    name: str
    weight: float
    share: int
    inflight: int


class _Waiter:
    __slots__ = ("event", "future", "loop", "partition", "token")

    def __init__(
        self,
        partition: _Partition | None,
        event: threading.Event | None = None,
        future: asyncio.Future[Token | None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.partition = partition
        self.event = event
        self.future = future
        self.loop = loop
        self.token: Token | None = None


class AdaptiveLimiter(Policy):
    """Concurrency limiter driven by an adaptive :class:`Limit` (see
    [Overload protection][guide-overload])."""

    kind = "adaptive_limiter"

    def __init__(
        self,
        algorithm: Limit,
        *,
        name: str = "adaptive_limiter",
        partitions: Mapping[str, float] | None = None,
        backlog_size: int = 0,
        backlog_timeout: float = defaults.LIFO_BACKLOG_TIMEOUT,
        backlog_order: Literal["lifo", "fifo"] = "lifo",
        drop_on: tuple[type[BaseException], ...] = (TimeoutError, RejectedError),
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        if not isinstance(algorithm, Limit):
            raise ConfigError(f"algorithm must be a floodwall adaptive Limit, got {algorithm!r}")
        if isinstance(backlog_size, bool) or not isinstance(backlog_size, int) or backlog_size < 0:
            raise ConfigError(f"backlog_size must be an integer >= 0, got {backlog_size!r}")
        if not 0 <= backlog_timeout < math.inf:
            raise ConfigError(f"backlog_timeout must be >= 0 seconds, got {backlog_timeout!r}")
        if backlog_order not in ("lifo", "fifo"):
            raise ConfigError(f"backlog_order must be 'lifo' or 'fifo', got {backlog_order!r}")
        self.algorithm = algorithm
        self.name = name
        self.backlog_size = backlog_size
        self.backlog_timeout = float(backlog_timeout)
        self.backlog_order = backlog_order
        self.drop_on = drop_on
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._lock = threading.Lock()
        # Bound once: the per-request paths call these in try/finally, which costs less than
        # `with self._lock` (no special-method lookup per use).
        self._lock_acquire = self._lock.acquire
        self._lock_release = self._lock.release
        self._limit = algorithm.limit
        self._inflight = 0
        self._backlog: deque[_Waiter] = deque()
        self._rejected = 0
        self._partitions = self._build_partitions(partitions)
        self._unknown = _Partition("unknown", 0.0) if self._partitions else None
        self._reshare()

    @staticmethod
    def _build_partitions(partitions: Mapping[str, float] | None) -> dict[str, _Partition]:
        if not partitions:
            return {}
        built: dict[str, _Partition] = {}
        for name, weight in partitions.items():
            if not 0.0 <= weight <= 1.0:
                raise ConfigError(f"partitions[{name!r}] must be in [0, 1], got {weight!r}")
            built[name] = _Partition(name, float(weight))
        total = sum(p.weight for p in built.values())
        if total > 1.0 + 1e-9:
            raise ConfigError(f"partition shares must add up to <= 1.0, got {total:g}")
        return built

    def _reshare(self) -> None:
        for partition in self._partitions.values():
            partition.share = math.floor(self._limit * partition.weight + 1e-9)

    # -- figures ----------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The current concurrency limit."""
        return self._limit

    @property
    def inflight(self) -> int:
        """Tokens handed out and not yet closed."""
        return self._inflight

    @property
    def backlog(self) -> int:
        """Callers waiting for a token."""
        return len(self._backlog)

    @property
    def rejected(self) -> int:
        """Acquisitions refused since the limiter was built."""
        return self._rejected

    def partition_stats(self) -> list[PartitionStats]:
        """Each partition's weight, guaranteed share and tokens out (``unknown`` last)."""
        with self._lock:
            parts = list(self._partitions.values())
            if self._unknown is not None:
                parts.append(self._unknown)
            return [PartitionStats(p.name, p.weight, p.share, p.busy) for p in parts]

    # -- the decision -----------------------------------------------------------------------

    def _resolve(self, partition: str | None) -> _Partition | None:
        if self._unknown is None:
            return None
        if partition is None:
            return self._unknown
        return self._partitions.get(partition, self._unknown)

    def _admissible(self, part: _Partition | None) -> bool:
        """Under the lock: may one more token go to ``part``?"""
        inflight = self._inflight
        if inflight >= self._limit:
            return False
        if part is None or part.busy < part.share:
            return True
        reserved = 0
        for other in self._partitions.values():
            if other.busy < other.share:
                reserved += other.share - other.busy
        return inflight + reserved < self._limit

    def _grant(self, part: _Partition | None) -> Token:
        """Under the lock: hand out a token."""
        self._inflight += 1
        if part is not None:
            part.busy += 1
        return Token(self, self._now(), self._inflight, part)

    def acquire(self, partition: str | None = None) -> Token | None:
        """A token, or ``None`` when the limit (or the partition's entitlement) is used up."""
        self._lock_acquire()
        try:
            if self._unknown is None:
                inflight = self._inflight
                if inflight < self._limit:
                    # Token.__init__ written out (the common, unpartitioned case): on CPython
                    # 3.11 a class call with a Python __init__ re-enters the interpreter from C.
                    self._inflight = inflight = inflight + 1
                    token = _new_token(Token)
                    token._limiter = self
                    token._state = _OPEN
                    token.start = self._now()
                    token.inflight = inflight
                    token.partition = None
                    return token
            else:
                part = self._resolve(partition)
                if self._admissible(part):
                    return self._grant(part)
            self._rejected += 1
        finally:
            self._lock_release()
        if self.listeners:
            self._emit_rejected(partition)
        return None

    def _release(self, token: Token, outcome: int) -> bool:
        self._lock_acquire()
        try:
            if token._state != _OPEN:
                return False
            token._state = outcome
            self._inflight -= 1
            if token.partition is not None:
                token.partition.busy -= 1
            old = new = self._limit
            if outcome != _IGNORED:
                new = self.algorithm.on_sample(
                    token.start, self._now() - token.start, token.inflight, outcome == _DROPPED
                )
                if new != old:
                    self._limit = new
                    self._reshare()
            if self._backlog:
                self._serve_backlog()
        finally:
            self._lock_release()
        if new != old and self.listeners:
            self._emit_limit(old, new)
        return True

    # -- waiting ----------------------------------------------------------------------------

    def _serve_backlog(self) -> None:
        """Under the lock: hand tokens to waiters, newest first (LIFO) or oldest first."""
        backlog = self._backlog
        lifo = self.backlog_order == "lifo"
        while backlog:
            waiter = backlog[-1] if lifo else backlog[0]
            if not self._admissible(waiter.partition):
                return
            if lifo:
                backlog.pop()
            else:
                backlog.popleft()
            token = self._grant(waiter.partition)
            waiter.token = token
            if waiter.event is not None:
                waiter.event.set()
            elif waiter.loop is not None and waiter.future is not None:
                waiter.loop.call_soon_threadsafe(_deliver, waiter.future, token)

    def _enqueue(self, waiter: _Waiter) -> bool:
        """Under the lock: park ``waiter`` unless the backlog is full."""
        if len(self._backlog) >= self.backlog_size:
            return False
        self._backlog.append(waiter)
        return True

    def _withdraw(self, waiter: _Waiter) -> Token | None:
        """Leave the backlog; return the token if one was granted in the meantime."""
        with self._lock:
            try:
                self._backlog.remove(waiter)
            except ValueError:
                return waiter.token
            return None

    def acquire_blocking(
        self, partition: str | None = None, max_wait: float | None = None
    ) -> Token | None:
        """Like :meth:`acquire`, but wait in the backlog (real time: threads cannot wait on a
        fake clock) for up to ``max_wait`` (default ``backlog_timeout``) seconds."""
        token = self.acquire(partition)
        if token is not None or self.backlog_size == 0:
            return token
        wait = self.backlog_timeout if max_wait is None else max_wait
        waiter = _Waiter(self._resolve(partition), event=threading.Event())
        with self._lock:
            if self._admissible(waiter.partition):
                return self._grant(waiter.partition)
            if wait <= 0 or not self._enqueue(waiter):
                return None
        assert waiter.event is not None
        if waiter.event.wait(wait):
            return waiter.token
        return self._withdraw(waiter)

    async def acquire_async(
        self, partition: str | None = None, max_wait: float | None = None
    ) -> Token | None:
        """Like :meth:`acquire_blocking` for asyncio tasks; the wait runs on ``clock``."""
        token = self.acquire(partition)
        if token is not None or self.backlog_size == 0:
            return token
        wait = self.backlog_timeout if max_wait is None else max_wait
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Token | None] = loop.create_future()
        waiter = _Waiter(self._resolve(partition), future=future, loop=loop)
        with self._lock:
            if self._admissible(waiter.partition):
                return self._grant(waiter.partition)
            if wait <= 0 or not self._enqueue(waiter):
                return None
        timer = loop.create_task(self._expire(waiter, wait))
        try:
            return await future
        except asyncio.CancelledError:
            granted = self._withdraw(waiter)
            if granted is not None:
                granted.ignore()
            raise
        finally:
            timer.cancel()

    async def _expire(self, waiter: _Waiter, wait: float) -> None:
        await self.clock.async_sleep(wait)
        with self._lock:
            try:
                self._backlog.remove(waiter)
            except ValueError:
                return  # granted meanwhile: _deliver hands the token over
        if waiter.future is not None and not waiter.future.done():
            waiter.future.set_result(None)

    # -- policy shells ----------------------------------------------------------------------

    def _rejection(self) -> OverloadedError:
        return OverloadedError(
            self.name, f"concurrency limit {self._limit} reached ({self._inflight} in flight)"
        )

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        token = self.acquire_blocking() if self.backlog_size else self.acquire()
        if token is None:
            raise self._rejection()
        with token:
            return fn(*args, **kwargs)

    async def call_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        token = await self.acquire_async() if self.backlog_size else self.acquire()
        if token is None:
            raise self._rejection()
        with token:
            return await fn(*args, **kwargs)

    def describe(self) -> str:
        return f"AdaptiveLimiter({self.algorithm!r}, inflight={self._inflight})"

    # -- events -----------------------------------------------------------------------------

    def _emit_rejected(self, partition: str | None) -> None:
        self.listeners.emit(
            Event(
                "rejected",
                self.kind,
                self.name,
                self._now(),
                f"limit {self._limit} reached",
                figures={"limit": self._limit, "inflight": self._inflight, "partition": partition},
            )
        )

    def _emit_limit(self, old: int, new: int) -> None:
        self.listeners.emit(
            Event(
                "limit_changed",
                self.kind,
                self.name,
                self._now(),
                f"limit {old} -> {new}",
                figures={"old": old, "new": new, "inflight": self._inflight},
            )
        )


def _deliver(future: asyncio.Future[Token | None], token: Token) -> None:
    if future.done():
        token.ignore()  # the waiter gave up as the token arrived: give it back
    else:
        future.set_result(token)
