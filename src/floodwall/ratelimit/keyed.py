"""Keyed limiters: one state per key (per user, per IP, per API token) in bounded memory.

``Keyed(FixedWindow("5/h"), max_keys=100_000)`` is "at most 5 posts per hour, per user":
``acquire(key=user_id)``. Any limiter can be keyed, including a :class:`~floodwall.ratelimit.Multi`.

**Memory is bounded** by ``max_keys`` states, and shrinks back as keys go quiet. Each key's
state carries its own TTL: the moment it will be indistinguishable from a fresh state (for
``"1/30s"``, 30 s after the last download; for a token bucket, when it has refilled). Past it
the key is *idle*, and forgetting it changes no later decision, so idle keys are evicted:

* continuously: every new key moves a sweeping hand one step over the oldest entry, evicting it
  if idle, else sending it to the back of the line (a CLOCK sweep: O(1) per new key);
* on demand: :meth:`Keyed.sweep` evicts every idle key and gives the table's memory back.

**Tables of a few hundred keys.** Keys live in ``ceil(max_keys / Keyed.SHARD_KEYS)`` tables
(256 keys each on average, at most ``Keyed.MAX_TABLES``, 4 096), picked by the key's hash.
Python rebuilds a dict whose keys come and go after about as many new keys as it holds, copying
what it holds in one decision: one table of 100 000 active keys took 8–11 ms for it, and tables
of 65 536 keys that held a few hundred live ones each rebuilt every thousandth decision or so,
on the p99.9 (``keyed-1m`` in ``benchmarks/million_keys.py``). A table of a few hundred keys
rebuilds in about a decision's time, however many keys are live. ``max_keys`` bounds the keys
of all tables together.

**An active key is never reset to make room.** When a new key arrives and ``max_keys`` keys are
tracked, the hand looks for an idle key to evict, at most ``Keyed.ROOM_STEPS`` (16) entries in
all: half of them in the key's own table, the rest in the next table in turn (so every table
gives its idle keys as new keys arrive), so one pass over a full table is spread over its keys /
8 new keys and no decision costs O(keys). A pass that meets only active keys learns the earliest
moment any of them goes idle, and no pass of that table starts again before it, so tables full
of active keys refuse new keys in O(1). While a pass is under way a new key may be refused
although a key further along (or in a table not searched yet) is idle: stricter for that moment,
never looser. Without room, ``overflow`` decides:

* ``"reject"`` (default): the new key is refused (``retry_after`` = when the earliest key the
  search met goes idle); tracked keys are unaffected;
* ``"shared"``: the new key falls back to one shared state of the same limiter, which all
  untracked keys share until room frees up: they are still limited, collectively.

A token bucket whose ``initial`` is below its capacity is idle once full: a key evicted then
and seen again starts from ``initial`` tokens, stricter than the bucket it replaces, never
looser.

**No tracked objects per key.** The table holds each state packed (``limiter._pack``: a number
or its numbers in ``bytes``, which the garbage collector never tracks); a decision unpacks the
key's state, decides and packs it back. New keys trigger no collections, and a million keys
add nothing to the collector's work but the entries a full collection walks in any large
dict.

Cost: one lock per keyed limiter, one dict lookup per decision; a tracked key costs its packed
state (a few numbers) plus about 90 bytes of table (measured in
``tests/test_ratelimit_keyed.py``).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Generic, Literal, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall._core.events import EventListener
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.validate import PLAIN_INT
from floodwall.ratelimit._base import INF, Decision, RateLimiter, _new, check_cost, max_wait_field

__all__ = ["Keyed", "KeyedOptions"]

S = TypeVar("S")

Overflow = Literal["reject", "shared"]


@dataclass(frozen=True, slots=True)
class KeyedOptions:
    """A :class:`Keyed` limiter's options, validated once: ``max_keys`` (states tracked at most,
    100 000), ``overflow`` (a new key when the table is full of busy keys: ``"reject"`` it, or
    decide it on one ``"shared"`` state), ``key`` (a callable of a protected call's arguments
    giving its key) and ``max_wait`` (``None``: the wrapped limiter's)."""

    max_keys: int = defaults.RATE_LIMIT_MAX_KEYS
    overflow: Overflow = "reject"
    key: Callable[..., Hashable] | None = None
    max_wait: float | None = None

    CHECKS: ClassVar[Checks] = {
        "max_keys": validate.count,
        "overflow": partial(validate.choice, options=("reject", "shared")),
        "key": optional(partial(validate.function, what="a callable of the call's arguments")),
        "max_wait": optional(max_wait_field),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


class _Scan:
    """One table's search for room: no pass starts before ``full_until`` (a pass met only
    active keys); ``left`` entries to look at in the pass under way, the soonest moment one
    met goes idle; ``peak``: the most keys the table held since the last sweep."""

    __slots__ = ("full_until", "left", "peak", "soonest")

    def __init__(self) -> None:
        self.full_until = -INF
        self.left = 0
        self.soonest = INF
        self.peak = 0

    def room_at(self) -> float:
        """When this table could have an idle key, as far as its search knows."""
        return self.full_until if self.left <= 0 else self.soonest


class Keyed(RateLimiter[S], Generic[S]):
    """``limiter``'s algorithm with one state per key, at most ``max_keys`` of them.

    ``key`` (a function of the protected call's arguments) picks the key when the limiter is
    used as a policy or decorator; without it every call uses key ``None``. As a gate
    (:class:`~floodwall.ratelimit.RateLimiter`): ``admit`` decides on that key's state (a new
    key needs room in the table, else ``overflow`` decides) or raises the rejection.
    """

    algorithm = "keyed"

    def __init__(
        self,
        limiter: RateLimiter[S],
        *,
        max_keys: int = defaults.RATE_LIMIT_MAX_KEYS,
        overflow: Overflow = "reject",
        key: Callable[..., Hashable] | None = None,
        name: str | None = None,
        max_wait: float | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        if not isinstance(limiter, RateLimiter) or isinstance(limiter, Keyed):
            raise ConfigError(f"limiter must be a RateLimiter that is not Keyed, got {limiter!r}")
        self.options = o = KeyedOptions(max_keys, overflow, key, max_wait)
        """The validated :class:`KeyedOptions`, read once, here."""
        self.limiter = limiter
        self.max_keys = o.max_keys
        self.overflow: Overflow = o.overflow
        self.key = o.key
        self.limit = limiter.limit
        self.window = limiter.window
        self.books_ahead = limiter.books_ahead  # type: ignore[misc]
        tables = min(self.MAX_TABLES, -(-self.max_keys // self.SHARD_KEYS))
        self._tables: list[OrderedDict[Hashable, Any]] = [OrderedDict() for _ in range(tables)]
        """Each key's state, packed (``limiter._pack``: numbers the collector never tracks),
        in the table the key's hash picks."""
        self._scans = [_Scan() for _ in range(tables)]
        self._held = 0
        """Keys tracked, in every table: at most ``max_keys``."""
        self._turn = 0
        """The table a new key at the bound searches after its own (each in turn)."""
        self._room_at = -INF
        """When the tables the last search for room met could have an idle key."""
        self._inner_decide = limiter._decide
        self._inner_figures = limiter._figures
        self._idle = limiter._idle_at
        self._fresh = limiter._new_state
        self._packs = limiter._pack
        self._unpacks = limiter._unpack
        self._decides_packed = limiter._decide_packed
        self.evicted = 0
        """Idle keys forgotten since the limiter was built."""
        super().__init__(
            name=f"{limiter.name}[key]" if name is None else name,
            clock=limiter.clock,
            max_wait=limiter.max_wait if o.max_wait is None else o.max_wait,
            listeners=listeners,
        )

    # -- the core: the wrapped limiter's ------------------------------------------------------

    def _new_state(self, now: float) -> S:
        return self.limiter._new_state(now)

    def _check(self, st: S, now: float, cost: float) -> bool:
        return self.limiter._check(st, now, cost)

    def _commit(self, st: S, now: float, cost: float) -> None:
        self.limiter._commit(st, now, cost)

    def _decide(self, st: S, now: float, cost: float) -> bool:
        return self._inner_decide(st, now, cost)

    def _reserve(self, st: S, now: float, cost: float, max_wait: float) -> float:
        return self.limiter._reserve(st, now, cost, max_wait)

    def _figures(self, st: S, now: float, cost: float, allowed: bool) -> Decision:
        return self._inner_figures(st, now, cost, allowed)

    def _idle_at(self, st: S) -> float:
        return self._idle(st)

    # -- the table (lock held) --------------------------------------------------------------

    def _table_of(self, key: Hashable) -> OrderedDict[Hashable, Any]:
        tables = self._tables
        return tables[hash(key) % len(tables)]

    def _state_for(self, key: Hashable, now: float) -> S | None:
        tables = self._tables
        i = hash(key) % len(tables)
        packed = tables[i].get(key)
        return self._admit_key(key, now, i) if packed is None else self._unpacks(packed)

    def _keep(self, key: Hashable, st: S) -> None:
        if st is not self._state:  # not the shared state of untracked keys
            self._table_of(key)[key] = self._packs(st)

    def _admit_key(self, key: Hashable, now: float, i: int) -> S | None:
        """Track ``key`` (a miss) in table ``i``: make room if needed, or fall back per
        ``overflow``."""
        table = self._tables[i]
        if self._held >= self.max_keys:
            if not self._make_room(i, now):
                return self._state if self.overflow == "shared" else None
        elif table:
            self._tidy(table, now)
        st = self._fresh(now)
        table[key] = self._packs(st)
        self._held += 1
        scan = self._scans[i]
        scan.peak = max(scan.peak, len(table))
        return st

    def _tidy(self, table: OrderedDict[Hashable, Any], now: float) -> None:
        """Two steps of the sweeping hand: evict the oldest entry if idle, else rotate it."""
        for _ in range(2):
            key = next(iter(table))
            if self._idle(self._unpacks(table[key])) > now:
                table.move_to_end(key)  # active: back of the line, state untouched
                return
            del table[key]
            self._held -= 1
            self.evicted += 1
            if not table:
                return

    ROOM_STEPS = 16
    """Entries one new key at a full table may look at, in all (half in its own table when
    there are several, the rest and what those did not take in the next one in turn): the
    scan for an idle key is spread over new keys, so no decision pays for the whole table
    (32 entries per decision, 16 in each table, set the p99.9 with every key active: calm
    82-86 µs against 51-53 µs at 16 in all, ``benchmarks/million_keys.py``, load 3-6)."""
    SHARD_KEYS = 256
    """Keys per table, about (``ceil(max_keys / SHARD_KEYS)`` tables, picked by the key's
    hash): Python rebuilds a table whose keys come and go after about as many new keys as it
    holds, in time proportional to what it holds. One table of 100 000 active keys took
    8-11 ms for it in one decision, tables of 65 536 keys holding a few hundred each rebuilt
    on the p99.9; tables of a few hundred keys rebuild in about a decision's time."""
    MAX_TABLES = 4096
    """Tables at most (a bound past about a million keys makes them larger than
    :attr:`SHARD_KEYS`): each empty table and its scan cost about 240 bytes (tracemalloc)."""

    def _make_room(self, i: int, now: float) -> bool:
        """Evict one idle key from table ``i`` (else from the next table in turn, so every
        table is searched as new keys arrive); False when none was found (yet)."""
        self._room_at = -INF  # as long as room is found: nothing to wait for
        tables = len(self._tables)
        own = self.ROOM_STEPS if tables == 1 else self.ROOM_STEPS // 2
        left = self._room_in(i, now, own)
        if left < 0:
            return True
        turn = self._turn if self._turn != i else (i + 1) % tables
        self._turn = (turn + 1) % tables
        if turn != i and self._room_in(turn, now, self.ROOM_STEPS - own + left) < 0:
            return True
        self._room_at = min(self._scans[i].room_at(), self._scans[turn].room_at())
        return False

    def _room_in(self, i: int, now: float, steps: int) -> int:
        """Look at up to ``steps`` entries of table ``i`` for an idle key to evict: -1 when
        one was, else the steps not taken."""
        scan, table = self._scans[i], self._tables[i]
        if now < scan.full_until or not table:
            return steps
        if scan.left <= 0:  # a new pass over the whole table
            scan.left = len(table)
            scan.soonest = INF
        idle, unpack = self._idle, self._unpacks
        taken = min(steps, scan.left)
        for _ in range(taken):
            scan.left -= 1
            key = next(iter(table))
            idle_at = idle(unpack(table[key]))
            if idle_at <= now:
                del table[key]
                self._held -= 1
                self.evicted += 1
                scan.left = 0
                return -1
            table.move_to_end(key)  # active: back of the line, state untouched
            scan.soonest = min(scan.soonest, idle_at)
        if scan.left <= 0:  # a whole pass found every key active
            scan.full_until = scan.soonest
        return steps - taken

    def _no_room(self, now: float) -> Decision:
        wait = max(0.0, self._room_at - now)
        return _new(Decision, (False, 0, wait, wait, self.limit))

    def _peek_state(self, key: Hashable, now: float) -> S | None:
        packed = self._table_of(key).get(key)
        if packed is None:
            return self._fresh(now) if self._held < self.max_keys else None
        return copy.deepcopy(self._unpacks(packed))  # a copy: an unpacked state may be shared

    def _forget(self, key: Hashable, now: float) -> None:
        if self._table_of(key).pop(key, None) is not None:
            self._held -= 1
        for scan in self._scans:
            scan.full_until = -INF
            scan.left = 0
        self._room_at = -INF

    # -- the shells: every key goes through the table ---------------------------------------

    def try_acquire(self, key: Hashable = None, cost: float = 1) -> bool:
        if cost.__class__ is not PLAIN_INT or cost < 0:
            cost = check_cost(cost)
        self._lock_acquire()
        try:
            now = self._now()
            tables = self._tables
            i = hash(key) % len(tables)
            table = tables[i]
            packed = table.get(key)
            st = self._admit_key(key, now, i) if packed is None else self._unpacks(packed)
            if st is None:
                allowed = False
            else:
                allowed = self._inner_decide(st, now, cost)
                if st is not self._state:  # not the shared state of untracked keys
                    table[key] = self._packs(st)
        finally:
            self._lock_release()
        if allowed:
            return True
        self._rejected(key, cost, None)
        return False

    def acquire(self, key: Hashable = None, cost: float = 1) -> Decision:
        if cost.__class__ is not PLAIN_INT or cost < 0:
            cost = check_cost(cost)
        # (callables held by the instance read as names: `self._now()` is a method load the
        # interpreter cannot specialise, about 0.2 k more per call)
        lock_acquire, lock_release, clock = self._lock_acquire, self._lock_release, self._now
        lock_acquire()
        try:
            now = clock()
            tables = self._tables
            i = hash(key) % len(tables)
            table = tables[i]
            packed = table.get(key)
            fused = self._decides_packed
            if packed is not None and fused is not None:  # (a tracked key: one call)
                table[key], result = fused(packed, now, cost)
            else:
                st = self._admit_key(key, now, i) if packed is None else self._unpacks(packed)
                if st is None:
                    result = self._no_room(now)
                else:
                    result = self._inner_figures(st, now, cost, self._inner_decide(st, now, cost))
                    if st is not self._state:
                        table[key] = self._packs(st)
        finally:
            lock_release()
        if not result[0]:
            self._rejected(key, cost, result)
        return result

    def _admit(self, key: Hashable, cost: float = 1) -> Decision | None:
        self._lock_acquire()  # not `with self._lock`: bound once, cheaper per call
        try:
            now = self._now()
            tables = self._tables
            i = hash(key) % len(tables)
            table = tables[i]
            packed = table.get(key)
            st = self._admit_key(key, now, i) if packed is None else self._unpacks(packed)
            if st is None:
                result = self._no_room(now)
            else:
                allowed = self._inner_decide(st, now, cost)
                if st is not self._state:
                    table[key] = self._packs(st)
                if allowed:
                    return None
                result = self._inner_figures(st, now, cost, False)
        finally:
            self._lock_release()
        self._rejected(key, cost, result)
        return result

    def _call_key(self, args: tuple[object, ...], kwargs: dict[str, object]) -> Hashable:
        return None if self.key is None else self.key(*args, **kwargs)

    # -- operators and observers ------------------------------------------------------------

    def sweep(self) -> int:
        """Evict every idle key now and give the table's spare memory back; how many went.

        O(tracked keys). Eviction also happens on its own (see
        [Rate limiting][guide-rate-limiting]); call this to shrink the table at once, e.g. from a
        periodic housekeeping task.
        """
        self._lock_acquire()
        try:
            now = self._now()
            idle, unpack = self._idle, self._unpacks
            gone = 0
            for i, table in enumerate(self._tables):
                idle_keys = [key for key, packed in table.items() if idle(unpack(packed)) <= now]
                for key in idle_keys:
                    del table[key]
                gone += len(idle_keys)
                if len(table) <= self._scans[i].peak // 4:
                    # dicts never shrink on deletion: rebuild at the current size
                    self._tables[i] = OrderedDict(table)
                scan = self._scans[i] = _Scan()  # a new pass may find room again
                scan.peak = len(table)
            self._held -= gone
            self.evicted += gone
            self._room_at = -INF
            return gone
        finally:
            self._lock_release()

    def __len__(self) -> int:
        """Keys tracked now (active ones and idle ones not yet evicted)."""
        return self._held

    def __contains__(self, key: object) -> bool:
        return key in self._table_of(key)

    def describe(self) -> str:
        inner = self.limiter.describe()
        return f"Keyed({inner}, max_keys={self.max_keys}, overflow={self.overflow!r})"
