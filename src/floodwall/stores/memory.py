"""``memory://``: records in a dict of this process, the default store.

Ops run their Python :meth:`~floodwall.stores.Op.step` under one lock, with ``now`` from the
injected clock (monotonic seconds), so a :class:`~floodwall.FakeClock` drives every expiry in
tests. Nothing is shared with other processes: a limit kept here is per worker.

**Bounded, in O(1) per op.** At most ``max_keys`` records are held (default 100 000; a record
with a 40-character full key takes about 170 bytes, 16 MB at the default bound, measured with
tracemalloc; ``benchmarks/million_keys.py`` measures latency and RSS). Records sit in plain
dicts, in the order they were written (shards of at most :attr:`MemoryStore.SHARD_KEYS` records,
chosen by the key's hash, each holding at most its share of ``max_keys``), that a sweeping hand
walks two steps per op: an expired record it reaches is dropped, a live one is taken out and put
back at the end of the line (a CLOCK sweep), so no op ever scans a table. Expired records are
also dropped when touched. A pass of the hand over a whole shard learns the soonest expiry in
it, and every write lowers that bound: until then no record of the shard can have expired, so
the hand rests (no steps at all). A new key arriving at a full shard evicts the record at the
front of the line (roughly the shard's oldest) at once while the hand rests, else first gives
the hand up to :attr:`MemoryStore.ROOM_STEPS` more steps to find an expired record; an evicted
live record is counted in :attr:`MemoryStore.evicted`: a limit kept for that key starts over, so
size ``max_keys`` above the keys live at once (``evicted`` staying 0 says it is).

**No long rebuilds.** Python rebuilds a dict whose keys come and go after about as many new
keys as it holds, copying what it holds in one go, so a shard holds at most
:attr:`MemoryStore.SHARD_KEYS` (256) records and a rebuild copies at most that many (an
``OrderedDict`` of 440 records rebuilt in 15 µs here under load, one of 4 096 in 0.5 ms, one of
65 536 in 6.7 ms), whatever the bound and however many records are live; up to
:attr:`MemoryStore.MAX_SHARDS` shards (a bound past a million records makes them larger). A
shard is a plain dict, not an ``OrderedDict``: an ``OrderedDict``'s rebuild also walks its
linked list of records to index them again, one dependent memory read per record in a table
last touched a shard's worth of keys ago; at a million keys through the default bound that
took 42-65 µs (median), against 8-18 µs for a dict of as many records, and was two thirds of
the slowest 0.1 % of ``Frequency`` decisions. Its front record is the dict's first key (the
deleted slots before it are skipped in C, a few hundred at most).

**No work for the garbage collector.** A record is held as one ``bytes`` object (its expiry
packed in front of its value), which the collector never tracks, and full keys are built per
op rather than cached, so ops leave no tracked object behind: a million records trigger no
collections. Ops see :class:`Record` objects made for the keys they touch.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.validate import count
from floodwall.stores.base import KEEP, Arg, Op, R, Record, Store, Write

__all__ = ["MemoryStore"]

_EXPIRY = struct.Struct("d")
"""A held record: its expiry (``inf``: never) as 8 bytes, then its value."""
_expiry = _EXPIRY.unpack_from
_INF = math.inf
_new_record: Callable[[type[Record], tuple[bytes, float | None]], Record] = tuple.__new__
"""``_new_record(Record, (value, expires_at))``: the record an op reads, built in C."""


def _record(held: bytes) -> Record:
    expires_at = _expiry(held)[0]
    return Record(held[8:], None if expires_at == math.inf else expires_at)


def _live(held: bytes, now: float) -> Record | None:
    """The record held, or ``None`` once it has expired."""
    return None if _expiry(held)[0] <= now else _record(held)


class _Hand:
    """A shard's sweeping hand: no record of the shard expires before ``calm_until`` (until
    then the hand rests: there is nothing for it to drop); ``left`` records to visit in the
    current pass, the soonest expiry met in it so far (and written since it began)."""

    __slots__ = ("calm_until", "left", "soonest")

    def __init__(self, calm_until: float = math.inf) -> None:
        self.calm_until = calm_until
        self.left = 0
        self.soonest = math.inf

    def wrote(self, expires_at: float) -> None:
        self.soonest = min(self.soonest, expires_at)
        self.calm_until = min(self.calm_until, expires_at)


class MemoryStore(Store):
    """A thread-safe in-process store (``memory://``) of at most ``max_keys`` records."""

    HAND_STEPS = 2
    """Records the sweeping hand visits per op: more than one, so it outruns new keys."""
    ROOM_STEPS = 4
    """Extra steps a new key at a full table may take to find an expired record to replace."""
    SHARD_KEYS = 256
    """Records per shard at most (``ceil(max_keys / SHARD_KEYS)`` shards): Python rebuilds a
    table whose records are replaced after about as many new keys as it holds, copying what it
    holds; shards of 4 096 made that 0.2-1.6 ms in one decision, and shards holding a few
    hundred live records each rebuilt on the p99.9. A shard of 256 rebuilds in about a
    decision's time."""
    MAX_SHARDS = 4096
    """Shards at most (a bound past about a million records makes them larger than
    :attr:`SHARD_KEYS`): each empty shard and its hand cost about 200 bytes (tracemalloc)."""

    def __init__(
        self,
        url: str = "memory://",
        *,
        prefix: str = defaults.STORE_PREFIX,
        clock: Clock = SYSTEM_CLOCK,
        max_keys: int = defaults.STORE_MEMORY_MAX_KEYS,
    ) -> None:
        super().__init__(url, prefix=prefix)
        self.clock = clock
        self.max_keys = count("max_keys", max_keys)
        shards = min(self.MAX_SHARDS, -(-self.max_keys // self.SHARD_KEYS))
        self._shard_keys = self.max_keys // shards
        """Records one shard holds at most: shards x this <= ``max_keys``."""
        self._shards: list[dict[str, bytes]] = [{} for _ in range(shards)]
        self._hands = [_Hand() for _ in range(shards)]
        self._lock = threading.Lock()
        self.evicted = 0
        """Live records dropped to make room for a new key (0 when ``max_keys`` is enough)."""

    def _shard(self, full: str) -> dict[str, bytes]:
        shards = self._shards
        return shards[hash(full) % len(shards)]

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        suffixes = op.suffixes
        if len(suffixes) != 1:
            return self._apply_many(op, key, args)
        if key.__class__ is not str or not key:
            self._check_key(key)
        full = f"{self.prefix}{{{key}}}{suffixes[0]}"
        shards = self._shards
        i = hash(full) % len(shards)
        with self._lock:
            data = shards[i]
            now = self.clock.monotonic()
            held = data.get(full)
            record = None
            if held is not None:
                expires_at = _expiry(held)[0]
                if expires_at > now:
                    record = _new_record(
                        Record, (held[8:], None if expires_at == _INF else expires_at)
                    )
            write, result = op.step_one(record, now, args)
            hand = self._hands[i]
            if write.__class__ is Record:  # a new record: the usual write, inlined
                value, expires_at = write
                if expires_at is None:
                    expires_at = _INF
                if (  # _make_room, inlined: no frame for the usual eviction
                    held is None
                    and len(data) >= self._shard_keys
                    and (
                        now < hand.calm_until
                        or not self._sweep(data, hand, self.ROOM_STEPS, now, room=True)
                    )
                ):
                    del data[next(iter(data))]  # the front record
                    self.evicted += 1
                data[full] = _EXPIRY.pack(expires_at) + value
                if expires_at < hand.soonest:  # hand.wrote(): calm_until <= soonest, always
                    hand.soonest = expires_at
                    hand.calm_until = min(hand.calm_until, expires_at)
            else:
                self._put(data, hand, full, write, now)
            if now >= hand.calm_until:
                self._sweep(data, hand, self.HAND_STEPS, now)
        return result

    def _apply_many(self, op: Op[R], key: str, args: Sequence[Arg]) -> R:
        """:meth:`apply` for an op on several records (the hand steps in the first one's
        shard)."""
        keys = self.keys(op, key)
        count = len(self._shards)
        at = [hash(full) % count for full in keys]
        with self._lock:
            now = self.clock.monotonic()
            records: list[Record | None] = []
            for full, i in zip(keys, at, strict=True):
                held = self._shards[i].get(full)
                records.append(None if held is None else _live(held, now))
            writes, result = op.step(records, now, args)
            for full, i, write in zip(keys, at, writes, strict=True):
                self._put(self._shards[i], self._hands[i], full, write, now)
            data, hand = self._shards[at[0]], self._hands[at[0]]
            if now >= hand.calm_until:
                self._sweep(data, hand, self.HAND_STEPS, now)
        return result

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        return self.apply(op, key, args)

    @staticmethod
    def _check_key(key: object) -> None:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"key must be a non-empty string, got {key!r}")

    def keys(self, op: Op[Any], key: str) -> list[str]:
        """The full keys, built each time: the base class's cache of them would leave two
        tracked objects per new key for the garbage collector (see
        :mod:`floodwall.stores.memory`)."""
        self._check_key(key)
        base = f"{self.prefix}{{{key}}}"
        return [base + suffix for suffix in op.suffixes]

    def _put(
        self, data: dict[str, bytes], hand: _Hand, full: str, write: Write, now: float
    ) -> None:
        """Carry out one write of an op (lock held)."""
        if write is None:
            data.pop(full, None)
        elif isinstance(write, Record):
            if len(data) >= self._shard_keys and full not in data:
                self._make_room(data, hand, now)
            expires_at = math.inf if write.expires_at is None else write.expires_at
            data[full] = _EXPIRY.pack(expires_at) + write.value
            hand.wrote(expires_at)
        elif write is KEEP:
            held = data.get(full)
            if held is not None and _expiry(held)[0] <= now:
                del data[full]

    @staticmethod
    def _sweep(
        data: dict[str, bytes], hand: _Hand, steps: int, now: float, room: bool = False
    ) -> bool:
        """Move a shard's hand ``steps`` records on (lock held, shard not empty), dropping the
        expired ones; True when it dropped one. Each step drops the record at the front if
        expired, else sends it to the back of the line. A pass that has met every record learns
        the soonest expiry among them: the hand rests until then. ``room``: stop at the first
        record dropped (the steps are not capped by the records held).

        One loop over locals, the hand's fields read and written once: a call per step was
        a third of a ``Frequency.allow`` with expiring records (``benchmarks/million_keys.py``).
        """
        left, soonest, dropped = hand.left, hand.soonest, False
        for _ in range(steps if room else min(steps, len(data))):
            if left <= 0:  # a new pass over the records held now
                left, soonest = len(data), _INF
            left -= 1
            full = next(iter(data))
            held = data.pop(full)
            expires_at: float = _expiry(held)[0]
            if expires_at <= now:
                dropped = True
            else:
                data[full] = held  # live: back of the line
                soonest = min(soonest, expires_at)
            if left <= 0:
                hand.calm_until = soonest
            if dropped and room:
                break
        hand.left, hand.soonest = left, soonest
        return dropped

    def _make_room(self, data: dict[str, bytes], hand: _Hand, now: float) -> None:
        """Free one slot of a full shard: an expired record if the hand meets one within
        :attr:`ROOM_STEPS` (it does not look while no record can have expired), else the
        record at the front of the line."""
        if now >= hand.calm_until and self._sweep(data, hand, self.ROOM_STEPS, now, room=True):
            return
        del data[next(iter(data))]
        self.evicted += 1

    def sweep(self) -> int:
        """Drop every expired record now and give the table's spare memory back; how many went.

        O(records) under the lock: for housekeeping, never needed for the bound.
        """
        with self._lock:
            now = self.clock.monotonic()
            gone = 0
            for i, data in enumerate(self._shards):
                live = {k: h for k, h in data.items() if _expiry(h)[0] > now}
                gone += len(data) - len(live)
                self._shards[i] = live
                soonest = min((_expiry(h)[0] for h in live.values()), default=math.inf)
                self._hands[i] = _Hand(soonest)
            return gone

    def __len__(self) -> int:
        """Records held now: the live ones and expired ones the hand has not reached yet."""
        return sum(len(data) for data in self._shards)

    def raw(self, full_key: str) -> Record | None:
        """The live record under a full key, for inspection and tests."""
        with self._lock:
            held = self._shard(full_key).get(full_key)
            if held is None or _expiry(held)[0] <= self.clock.monotonic():
                return None
            return _record(held)

    def clear(self) -> None:
        """Drop every record."""
        with self._lock:
            self._shards = [{} for _ in self._shards]
            self._hands = [_Hand() for _ in self._shards]

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "records": len(self),
            "max_keys": self.max_keys,
            "evicted": self.evicted,
        }
