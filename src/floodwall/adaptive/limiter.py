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
  time out (Netflix's ``LifoBlockingLimiter``: 100 waiters, 1 s). Both wait on the limiter's
  clock, in one backlog shared by threads and tasks.

Use it as a policy too: ``limiter.call(fn)`` / ``await limiter.call_async(fn)`` raise
:class:`~floodwall.OverloadedError` when no token is to be had; a return closes the token as a
success, a ``TimeoutError`` or floodwall rejection as dropped, any other exception as ignored.

Cost: one lock round trip and one clock read per acquire and per release, plus the algorithm's
``on_sample``; O(partitions) when partitioned.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType, TracebackType
from typing import Any, ClassVar, Literal

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, OverloadedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.outcome import Outcomes
from floodwall._core.parking import TIMED_OUT, Lot, Park, Waiter
from floodwall._core.steps import Step, Wait
from floodwall.adaptive._base import Limit

__all__ = ["AdaptiveLimiter", "AdaptiveLimiterOptions", "PartitionStats", "Token"]

_OPEN, _SUCCESS, _DROPPED, _IGNORED = 0, 1, 2, 3
_DROPS = Outcomes(kinds=frozenset({"timeout", "rejected"}))
"""The default ``drop_on``: timeouts and rejections say the dependency is at capacity."""


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
        self.close(exc)

    def close(self, error: BaseException | None) -> bool:
        """Close after a call that raised ``error`` (``None``: it returned): a success, dropped
        for the limiter's ``drop_on`` errors (timeouts, rejections), else ignored."""
        if error is None:
            outcome = _SUCCESS
        elif self._limiter.drop_on.error(error):
            outcome = _DROPPED
        else:
            outcome = _IGNORED
        return self._limiter._release(self, outcome)

    def __repr__(self) -> str:
        state = ("open", "success", "dropped", "ignored")[self._state]
        return f"<Token {state} start={self.start:.6f} inflight={self.inflight}>"


class _Partition:
    __slots__ = ("busy", "name", "share", "weight")

    def __init__(self, name: str, weight: float) -> None:
        self.name = validate.text("name", name)
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


def _partitions(name: str, value: object) -> Mapping[str, float]:
    """Partition shares: a mapping of non-empty names to shares in ``[0, 1]`` adding up to at
    most 1, kept read-only."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a mapping of name to share, got {value!r}")
    shares = {
        validate.text("partition names", key): validate.share(f"{name}[{key!r}]", weight)
        for key, weight in value.items()
    }
    total = sum(shares.values())
    if total > 1.0 + 1e-9:
        raise ConfigError(f"partition shares must add up to <= 1.0, got {total:g}")
    return MappingProxyType(shares)


@dataclass(frozen=True, slots=True)
class AdaptiveLimiterOptions:
    """An :class:`AdaptiveLimiter`'s options, validated once (the algorithm is what it is
    wired to): ``partitions`` (guaranteed shares of the limit by request class, ``None``:
    none), the backlog (``backlog_size`` callers waiting at most, 0: refuse at once, for
    ``backlog_timeout`` seconds, served ``"lifo"`` or ``"fifo"``) and ``drop_on`` (the errors
    that are drop samples; default the kinds ``timeout`` and ``rejected``)."""

    partitions: Mapping[str, float] | None = None
    backlog_size: int = 0
    backlog_timeout: float = defaults.LIFO_BACKLOG_TIMEOUT
    backlog_order: Literal["lifo", "fifo"] = "lifo"
    drop_on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes = _DROPS

    CHECKS: ClassVar[Checks] = {
        "partitions": optional(_partitions),
        "backlog_size": partial(validate.count, minimum=0),
        "backlog_timeout": validate.seconds,
        "backlog_order": partial(validate.choice, options=("lifo", "fifo")),
        "drop_on": Outcomes.of,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


class AdaptiveLimiter(Gate):
    """Concurrency limiter driven by an adaptive :class:`Limit` (see
    [Overload protection][guide-overload]).

    As a gate: ``admit`` hands out a token (the permit), refuses with
    :class:`~floodwall.OverloadedError`, or, with a backlog, raises ``Wait(Park(...))`` to queue
    the caller in the limiter's :class:`~floodwall._core.parking.Lot`; ``resume`` turns a wait
    that timed out into the refusal; ``record`` closes the token from the outcome
    (:meth:`Token.close`).

    ``drop_on`` (exception types or an :class:`~floodwall.Outcomes`; default: the kinds
    ``timeout`` and ``rejected``) selects the errors that are drop samples; other errors release
    the token without a sample.
    """

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
        drop_on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes = _DROPS,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        if not isinstance(algorithm, Limit):
            raise ConfigError(f"algorithm must be a floodwall adaptive Limit, got {algorithm!r}")
        self.options = o = AdaptiveLimiterOptions(
            partitions, backlog_size, backlog_timeout, backlog_order, drop_on
        )
        """The validated :class:`AdaptiveLimiterOptions`, read once, here."""
        self.algorithm = algorithm
        self.name = validate.text("name", name)
        self.backlog_size = o.backlog_size
        self.backlog_timeout = o.backlog_timeout
        self.backlog_order = o.backlog_order
        self.drop_on: Outcomes = o.drop_on  # type: ignore[assignment]  # normalised by its check
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._lock = threading.Lock()
        self._lot = Lot(self._lock, o.backlog_size, o.backlog_order)
        self._limit = algorithm.limit
        self._inflight = 0
        self._rejected = 0
        self._partitions = {
            name: _Partition(name, share) for name, share in (o.partitions or {}).items()
        }
        self._unknown = _Partition("unknown", 0.0) if self._partitions else None
        self._reshare()

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
        return len(self._lot)

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
            given: object = partition  # a caller's argument: any object may arrive
            if given is not None and not isinstance(given, str):
                validate.text("partition", given, error=ValueError)
            return None
        if partition is None:
            return self._unknown
        found = self._partitions.get(partition)
        if found is None:
            validate.text("partition", partition, error=ValueError)
            return self._unknown
        return found

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
        with self._lock:
            part = self._resolve(partition)
            if self._admissible(part):
                return self._grant(part)
            self._rejected += 1
        if self.listeners:
            self._emit_rejected(partition)
        return None

    def _release(self, token: Token, outcome: int) -> bool:
        with self._lock:
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
            if self._lot.waiters:
                self._serve_backlog()
        if new != old and self.listeners:
            self._emit_limit(old, new)
        return True

    # -- waiting ----------------------------------------------------------------------------

    def _serve_backlog(self) -> None:
        """Under the lock: hand tokens to waiters, newest first (LIFO) or oldest first."""
        lot = self._lot
        while (waiter := lot.next()) is not None and self._admissible(waiter.tag):
            token = self._grant(waiter.tag)
            if not lot.hand(waiter, token):  # nobody left to take it: undo the grant
                token._state = _IGNORED
                self._inflight -= 1
                if token.partition is not None:
                    token.partition.busy -= 1

    def join(self, waiter: Waiter, budget: float) -> bool:
        """The wait step's entry: a token freed meanwhile, or ``None`` when no wait is allowed
        or the backlog is full (True), or parked (False)."""
        with self._lock:
            if self._admissible(waiter.tag):
                waiter.value = self._grant(waiter.tag)
            elif budget <= 0 or not self._lot.park(waiter):
                waiter.value = None
            else:
                return False
        return True

    def pass_on(self, value: Any) -> None:
        """A waiter cancelled as its token came: give the token back (no sample)."""
        value.ignore()

    def _first_try(self, partition: str | None, max_wait: float | None) -> Token | Park | None:
        """A token, ``None`` (refused, no backlog), or the step that waits in the backlog."""
        token = self.acquire(partition)
        if token is not None or self.backlog_size == 0:
            return token
        wait = self.backlog_timeout if max_wait is None else max_wait
        return Park(self, self._lot, self.clock, wait, self._resolve(partition))

    def acquire_blocking(
        self, partition: str | None = None, max_wait: float | None = None
    ) -> Token | None:
        """Like :meth:`acquire`, but wait in the backlog for up to ``max_wait`` (default
        ``backlog_timeout``) seconds on the limiter's clock."""
        if max_wait is not None:
            validate.seconds("max_wait", max_wait, infinite=True, error=ValueError)
        first = self._first_try(partition, max_wait)
        return _token(first.run()) if isinstance(first, Park) else first

    async def acquire_async(
        self, partition: str | None = None, max_wait: float | None = None
    ) -> Token | None:
        """Like :meth:`acquire_blocking` for asyncio tasks."""
        if max_wait is not None:
            validate.seconds("max_wait", max_wait, infinite=True, error=ValueError)
        first = self._first_try(partition, max_wait)
        return _token(await first.arun()) if isinstance(first, Park) else first

    # -- the admission hooks ----------------------------------------------------------------

    def _rejection(self) -> OverloadedError:
        return OverloadedError(
            self.name, f"concurrency limit {self._limit} reached ({self._inflight} in flight)"
        )

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Token:
        """A token, the refusal, or (with a backlog) ``Wait`` for one."""
        first = self._first_try(None, None)
        if first is None:
            raise self._rejection()
        if isinstance(first, Park):
            raise Wait(first)
        return first

    def resume(self, step: Step, value: Any, now: float) -> Token:
        """After the wait: the token handed over, or the refusal."""
        if value is None or value is TIMED_OUT:
            raise self._rejection()
        return value  # type: ignore[no-any-return]

    def record(
        self,
        permit: Token,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        """Close the token from the outcome (see :meth:`Token.close`)."""
        permit.close(error)

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


def _token(value: Any) -> Token | None:
    return None if value is TIMED_OUT else value
