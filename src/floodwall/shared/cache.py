"""Cache: read degradation in front of a call, or behind it as its fallback.

``Cache(ttl=60, stale_ttl=3600)`` is a policy (``call``/``call_async``/decorator, a step of a
:class:`~floodwall.Pipeline`) keyed by the call's arguments (``key=``, default: their JSON):

1. **fresh hit**: an entry younger than ``ttl`` answers without calling the dependency
   (``ttl=0``: never; the cache then only remembers, and answers when the call fails, which
   is the "cache as fallback" use);
2. otherwise the call runs and a success is stored (both levels);
3. **stale-while-error**: when the call fails (any ``Exception`` by default, or as chosen by
   ``on=`` / ``kinds=``, e.g. ``{"circuit_open", "timeout", "degraded"}``), the last good value
   is served if it is younger than ``stale_ttl``, with its **age**: :meth:`fetch` returns a
   :class:`Cached` (``value``, ``age`` in seconds, ``source``), a ``stale`` event carries the
   age, and the open :func:`floodwall.call_context` is marked degraded (by the cache's name,
   with the failure's kind). Past ``stale_ttl`` the failure propagates;
4. **read only from cache** (``read_only=True``, or a callable read on every call, such as
   ``lambda: registry.is_shed(3)``; :meth:`set_read_only` switches it live): the dependency is
   never called; an entry younger than ``stale_ttl`` answers (marked degraded when older than
   ``ttl``), and a miss raises :class:`~floodwall.DegradedError`.

Levels: an in-process **TTL + LRU** level (``max_entries``, least recently used evicted; O(1)
per operation) and, with ``store=``, a shared second level on any
:mod:`floodwall.stores` backend (Redis: ``lua/cache_get.lua``/``cache_set.lua``; ages from the
server's clock, so every process agrees on them). Values cross the store through ``codec``
(JSON by default). The second level sits behind a :class:`~floodwall.stores.StoreGuard`: when
it is down the cache works on its first level alone (``store_errors`` counts, the guard's
breaker stops the waiting) and never fails a call because of it.

Counters: ``hits`` (fresh, either level), ``l2_hits``, ``misses``, ``stale`` (stale values
served), ``read_only_misses``, ``evictions``. The decision flow is one generator shared by the
sync and async shells; only the store and the call differ between them.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Generic, Literal, ParamSpec, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Flow
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.drivers import drive_async, drive_sync
from floodwall._core.errors import ConfigError, DegradedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.outcome import Outcomes, _kinds
from floodwall._core.steps import CALL, Apply, FlowSteps, Step
from floodwall.breaker import CircuitBreaker
from floodwall.degrade._common import mark_degraded, reason_of
from floodwall.shared.idempotency import JSON_CODEC, Codec
from floodwall.stores import resolve
from floodwall.stores.base import KEEP, Op, Record, Store, Write
from floodwall.stores.guard import StoreGuard

__all__ = ["CACHE_DELETE", "CACHE_GET", "CACHE_SET", "Cache", "CacheOptions", "Cached", "LruTtl"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# -- the second level's ops -------------------------------------------------------------------


def _pack(stored_at: float, payload: bytes) -> bytes:
    return repr(float(stored_at)).encode() + b"\n" + payload


def _unpack(value: bytes) -> tuple[float, bytes]:
    head, _, payload = value.partition(b"\n")
    return float(head), payload


class CacheGetOp(Op[tuple[bytes, int] | None]):
    """Read an entry: → ``(payload, age_ms)`` or ``None``."""

    script = "cache_get"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], tuple[bytes, int] | None]:
        record = records[0]
        if record is None:
            return [KEEP], None
        stored_at, payload = _unpack(record.value)
        return [KEEP], (payload, max(0, round((now - stored_at) * 1000)))

    def parse(self, raw: Any) -> tuple[bytes, int] | None:
        if raw is None:
            return None
        return bytes(raw[0]), int(raw[1])


class CacheSetOp(Op[bool]):
    """Store an entry: args ``(payload, keep_ms)``; stamped with the store's time."""

    script = "cache_set"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], bool]:
        payload, keep_ms = bytes(args[0]), int(args[1])
        return [Record(_pack(now, payload), now + keep_ms / 1000)], True

    def parse(self, raw: Any) -> bool:
        return bool(raw)


class CacheDeleteOp(Op[bool]):
    """Drop an entry: → whether it existed."""

    script = "cache_delete"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], bool]:
        return [None], records[0] is not None

    def parse(self, raw: Any) -> bool:
        return bool(raw)


CACHE_GET = CacheGetOp()
CACHE_SET = CacheSetOp()
CACHE_DELETE = CacheDeleteOp()


# -- the first level --------------------------------------------------------------------------


class LruTtl(Generic[T]):
    """An in-process map bounded by ``max_entries`` (least recently used evicted) whose entries
    are dropped ``keep`` seconds after they were stored. Pure: every method takes ``now``.
    Thread-safe (one short lock); every operation O(1) amortised."""

    def __init__(self, max_entries: int, keep: float) -> None:
        self.max_entries = validate.count("max_entries", max_entries)
        self.keep = validate.seconds("keep", keep, infinite=True)
        self._data: OrderedDict[str, tuple[T, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, key: str, now: float) -> tuple[T, float] | None:
        """``(value, stored_at)`` of a live entry (and mark it recently used), else ``None``."""
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            if now - entry[1] > self.keep:
                del self._data[key]
                return None
            self._data.move_to_end(key)
            return entry

    def put(self, key: str, value: T, stored_at: float) -> None:
        with self._lock:
            current = self._data.get(key)
            if current is not None and current[1] > stored_at:
                return  # a newer value is already here
            self._data[key] = (value, stored_at)
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)
                self.evictions += 1

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._data.pop(key, None) is not None

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def _read_only(
    name: str, value: object, *, error: type[Exception] = ConfigError
) -> bool | Callable[[], bool]:
    """A read-only switch: ``True``/``False``, or a callable consulted on each read."""
    if not (isinstance(value, bool) or callable(value)):
        raise error(f"{name} must be true, false or a callable returning one, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """A :class:`Cache`'s options, validated once: ``ttl`` (seconds an entry is fresh, 60),
    ``stale_ttl`` (seconds it is kept to answer stale when the call fails, >= ``ttl``; 1 h),
    ``max_entries`` (the in-process level's bound, 10 000), ``key`` (a callable of the call's
    arguments; ``None``: a digest of them), ``on``/``kinds`` (which failures are answered stale;
    neither: any ``Exception``), ``read_only`` (the switch, or a callable consulted on each
    read) and ``codec`` (the second level's encoding). ``handled`` is derived: ``on`` and
    ``kinds`` as one :class:`~floodwall.Outcomes`. The store and its breaker are what the cache
    is wired to, not options."""

    ttl: float = defaults.CACHE_TTL
    stale_ttl: float = defaults.CACHE_STALE_TTL
    max_entries: int = defaults.CACHE_MAX_ENTRIES
    key: Callable[..., str] | None = None
    on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes | None = None
    kinds: Collection[str] | None = None
    read_only: bool | Callable[[], bool] = False
    codec: Codec = JSON_CODEC
    handled: Outcomes = field(init=False, repr=False)

    CHECKS: ClassVar[Checks] = {
        "ttl": validate.seconds,
        "stale_ttl": validate.seconds,
        "max_entries": validate.count,
        "key": optional(partial(validate.function, what="a callable of the call's arguments")),
        "on": optional(Outcomes.of),
        "kinds": optional(_kinds),
        "read_only": _read_only,
        "codec": validate.codec,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.stale_ttl < self.ttl:
            raise ConfigError(f"stale_ttl must be >= ttl ({self.ttl:g}), got {self.stale_ttl:g}")
        object.__setattr__(self, "handled", Outcomes.handled(self.on, self.kinds))


# -- the policy -------------------------------------------------------------------------------

Source = Literal["dependency", "cache", "stale"]


@dataclass(frozen=True, slots=True)
class Cached(Generic[T]):
    """An answer and where it came from: ``"dependency"`` (the call ran; ``age`` 0),
    ``"cache"`` (a fresh entry) or ``"stale"`` (the last good value, served because the call
    failed or reads come only from the cache). ``age``: seconds since it was stored;
    ``reason``: why a stale value was served (the failure's kind, or ``"read_only"``)."""

    value: T
    age: float
    source: Source
    reason: str | None = None

    @property
    def degraded(self) -> bool:
        return self.source == "stale"


def default_key(*args: Any, **kwargs: Any) -> str:
    """The call's arguments as canonical JSON (``repr`` for what JSON cannot express)."""
    return json.dumps([args, kwargs], sort_keys=True, default=repr, separators=(",", ":"))


class Cache(Flow):
    """A read cache with stale-while-error and a read-only switch (see
    [Degradation][guide-degradation])."""

    kind = "cache"

    def __init__(
        self,
        *,
        ttl: float = defaults.CACHE_TTL,
        stale_ttl: float = defaults.CACHE_STALE_TTL,
        max_entries: int = defaults.CACHE_MAX_ENTRIES,
        key: Callable[..., str] | None = None,
        on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes | None = None,
        kinds: Collection[str] | None = None,
        read_only: bool | Callable[[], bool] = False,
        store: Store | str | None = None,
        codec: Codec = JSON_CODEC,
        breaker: CircuitBreaker | None = None,
        name: str = "cache",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = CacheOptions(
            ttl, stale_ttl, max_entries, key, on, kinds, read_only, codec
        )
        """The validated :class:`CacheOptions` (``set_read_only`` replaces it whole)."""
        self.ttl = o.ttl
        self.stale_ttl = o.stale_ttl
        self.key = o.key or default_key
        self.handled = o.handled
        """The errors answered from the cache (``on=`` and ``kinds=``)."""
        self.codec = o.codec
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._read_only = o.read_only
        if breaker is not None:
            validate.instance("breaker", breaker, CircuitBreaker, "a CircuitBreaker or None")
        self.local: LruTtl[Any] = LruTtl(o.max_entries, self.stale_ttl)
        self.store = None if store is None else resolve(store)
        self.guard = (
            None
            if self.store is None
            else StoreGuard(
                self.store, name=name, breaker=breaker, clock=clock, listeners=self.listeners
            )
        )
        self._keep_ms = max(1, round(self.stale_ttl * 1000))
        self.hits = 0
        self.l2_hits = 0
        self.misses = 0
        self.stale = 0
        self.read_only_misses = 0
        self.store_errors = 0
        self.encode_errors = 0

    # -- switches ------------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        """Whether reads come only from the cache now."""
        switch = self._read_only
        return switch() if callable(switch) else switch

    def set_read_only(self, on: bool | Callable[[], bool]) -> None:
        """Switch reading only from the cache on or off (or hand it a callable to consult)."""
        switch = _read_only("on", on, error=ValueError)
        self.options = dataclasses.replace(self.options, read_only=switch)
        self._read_only = switch  # the one field the read path consults
        self._emit("read_only", f"read only from cache: {on}", {})

    @property
    def evictions(self) -> int:
        return self.local.evictions

    # -- the decision flow (shared by both shells) ---------------------------------------------

    def flow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlowSteps:
        """The answer for the call's key: :meth:`fetch`'s steps, without the age."""
        cached = yield from self._fetch(self.key(*args, **kwargs))
        return cached.value

    def _fetch(self, key: str) -> Generator[Step, Any, Cached[Any]]:
        """First level, second level, the dependency, then stale-while-error: one flow."""
        now = self.clock.monotonic()
        best: tuple[Any, float] | None = None  # (value, age) of the newest entry found
        entry = self.local.get(key, now)
        if entry is not None:
            best = (entry[0], now - entry[1])
            if best[1] <= self.ttl and self.ttl > 0:
                self.hits += 1
                return Cached(best[0], best[1], "cache")
        if self.guard is not None:
            got = yield Apply(self.guard, CACHE_GET, self._remote_key(key), [])
            remote = None if got.down is not None else self._decoded(got.value)
            if got.down is not None:
                self.store_errors += 1
            if remote is not None and (best is None or remote[1] < best[1]):
                best = remote
                self.local.put(key, remote[0], now - remote[1])
                if remote[1] <= self.ttl and self.ttl > 0:
                    self.hits += 1
                    self.l2_hits += 1
                    return Cached(remote[0], remote[1], "cache")
        if self.read_only:
            return self._stale(key, best, "read_only", None)
        self.misses += 1
        try:
            value = yield CALL
        except BaseException as exc:
            if not self.handled.error(exc):
                raise
            return self._stale(key, best, reason_of(exc), exc)
        self.local.put(key, value, self.clock.monotonic())
        if self.guard is not None:
            payload = self._encoded(key, value)
            if payload is not None:
                put = yield Apply(self.guard, CACHE_SET, self._remote_key(key), payload)
                if put.down is not None:
                    self.store_errors += 1
        return Cached(value, 0.0, "dependency")

    def _stale(
        self, key: str, best: tuple[Any, float] | None, reason: str, exc: BaseException | None
    ) -> Cached[Any]:
        if best is None or best[1] > self.stale_ttl:
            if exc is not None:
                raise exc
            self.read_only_misses += 1
            raise DegradedError(self.name, f"read only from cache and no entry for {key!r}", None)
        value, age = best
        if reason == "read_only" and age <= self.ttl:
            self.hits += 1
            return Cached(value, age, "cache")
        self.stale += 1
        mark_degraded(self.name, reason)
        self._emit("stale", f"served a value {age:.3f}s old ({reason})", {"age": age, "key": key})
        return Cached(value, age, "stale", reason)

    # -- the second level ------------------------------------------------------------------------

    def _remote_key(self, key: str) -> str:
        return f"cache:{self.name}:{key}"

    def _decoded(self, raw: tuple[bytes, int] | None) -> tuple[Any, float] | None:
        if raw is None:
            return None
        return self.codec.loads(raw[0]), raw[1] / 1000

    def _encoded(self, key: str, value: Any) -> list[Any] | None:
        """The second level's arguments for ``value``; ``None`` when it cannot be encoded (it
        then stays in the first level only: the call succeeded, and the cache must not fail
        it)."""
        try:
            payload = self.codec.dumps(value)
        except (TypeError, ValueError) as exc:
            self.encode_errors += 1
            self._emit("encode_error", f"{type(exc).__name__}: {exc}", {"key": key})
            return None
        return [payload, self._keep_ms]

    # -- the shells ------------------------------------------------------------------------------

    def fetch(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Cached[R]:
        """Like :meth:`call`, with the answer's age and source."""
        steps = self._fetch(self.key(*args, **kwargs))
        return drive_sync(steps, partial(fn, *args, **kwargs))  # type: ignore[no-any-return]

    async def fetch_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Cached[R]:
        """:meth:`fetch` for coroutine functions."""
        steps = self._fetch(self.key(*args, **kwargs))
        return await drive_async(steps, partial(fn, *args, **kwargs))  # type: ignore[no-any-return]

    # -- direct access ---------------------------------------------------------------------------

    def lookup(self, key: str) -> Cached[Any] | None:
        """The first level's entry for ``key`` (fresh or stale), without calling anything;
        for a :class:`~floodwall.Fallback` factory: ``cache.lookup("gifts")``."""
        validate.text("key", key, error=ValueError)
        now = self.clock.monotonic()
        entry = self.local.get(key, now)
        if entry is None:
            return None
        age = now - entry[1]
        return Cached(entry[0], age, "cache" if age <= self.ttl else "stale")

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` in the first level (a warm-up, a pushed update)."""
        validate.text("key", key, error=ValueError)
        self.local.put(key, value, self.clock.monotonic())

    def invalidate(self, key: str) -> None:
        """Drop ``key`` from both levels (the second level only while its store answers)."""
        validate.text("key", key, error=ValueError)
        self.local.delete(key)
        if self.guard is not None:
            self.guard.apply(CACHE_DELETE, self._remote_key(key))

    async def invalidate_async(self, key: str) -> None:
        """:meth:`invalidate` for async callers."""
        validate.text("key", key, error=ValueError)
        self.local.delete(key)
        if self.guard is not None:
            await self.guard.apply_async(CACHE_DELETE, self._remote_key(key))

    def snapshot(self) -> dict[str, Any]:
        """Counters and size, for metrics."""
        return {
            "entries": len(self.local),
            "hits": self.hits,
            "l2_hits": self.l2_hits,
            "misses": self.misses,
            "stale": self.stale,
            "read_only": self.read_only,
            "read_only_misses": self.read_only_misses,
            "evictions": self.evictions,
            "store_errors": self.store_errors,
            "encode_errors": self.encode_errors,
        }

    def _emit(self, kind: str, reason: str, figures: dict[str, Any]) -> None:
        if self.listeners:
            now = self.clock.monotonic()
            self.listeners.emit(Event(kind, self.kind, self.name, now, reason, figures=figures))

    def describe(self) -> str:
        level2 = f", store={self.store.url}" if self.store is not None else ""
        return f"Cache({self.name!r}, ttl={self.ttl:g}s, stale_ttl={self.stale_ttl:g}s{level2})"
