"""``memory://``: records in a dict of this process, the default store.

Ops run their Python :meth:`~floodwall.stores.Op.step` under one lock, with ``now`` from the
injected clock (monotonic seconds), so a :class:`~floodwall.FakeClock` drives every expiry in
tests. Nothing is shared with other processes: a limit kept here is per worker.

**Bounded, in O(1) per op.** At most ``max_keys`` records are held (default 100 000; a record
with a 40-character full key takes about 220 bytes, 21 MB at the default bound, measured with
tracemalloc; ``benchmarks/million_keys.py`` measures latency and RSS). Records sit in ordered
tables (shards of about :attr:`MemoryStore.SHARD_KEYS` records, chosen by the key's hash, each
holding at most its share of ``max_keys``) that a sweeping hand walks two steps per op: an
expired record it reaches is dropped, a live one goes to the back of the line (a CLOCK sweep),
so no op ever scans a table. Expired records are also dropped when touched. A new key arriving
at a full shard first gives the hand up to :attr:`MemoryStore.ROOM_STEPS` more steps to find
an expired record; when every record it meets is live, the record at the front of the line
(roughly the shard's oldest) is evicted and counted in :attr:`MemoryStore.evicted`: a limit
kept for that key starts over, so size ``max_keys`` above the keys live at once (``evicted``
staying 0 says it is). Shards keep Python's occasional rebuild of a table whose records are
replaced (O(its records)) to a few thousand records.

**No work for the garbage collector.** A record is held as one ``bytes`` object (its expiry
packed in front of its value), which the collector never tracks, and full keys are built per
op rather than cached, so ops leave no tracked object behind: a million records trigger no
collections. Ops see :class:`Record` objects made for the keys they touch.
"""

from __future__ import annotations

import math
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.validate import count
from floodwall.stores.base import KEEP, Arg, Op, R, Record, Store

__all__ = ["MemoryStore"]

_EXPIRY = struct.Struct("d")
"""A held record: its expiry (``inf``: never) as 8 bytes, then its value."""
_expiry = _EXPIRY.unpack_from


def _hold(record: Record) -> bytes:
    expires_at = math.inf if record.expires_at is None else record.expires_at
    return _EXPIRY.pack(expires_at) + record.value


def _record(held: bytes) -> Record:
    expires_at = _expiry(held)[0]
    return Record(held[8:], None if expires_at == math.inf else expires_at)


class MemoryStore(Store):
    """A thread-safe in-process store (``memory://``) of at most ``max_keys`` records."""

    HAND_STEPS = 2
    """Records the sweeping hand visits per op: more than one, so it outruns new keys."""
    ROOM_STEPS = 4
    """Extra steps a new key at a full table may take to find an expired record to replace."""
    SHARD_KEYS = 4096
    """Records per shard (up to 256 shards): a table whose records are replaced is rebuilt by
    Python now and then (O(its records)), and a shard keeps that rebuild small."""

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
        shards = max(1, min(256, self.max_keys // self.SHARD_KEYS))
        self._shard_keys = self.max_keys // shards
        """Records one shard holds at most: shards x this <= ``max_keys``."""
        self._shards: list[OrderedDict[str, bytes]] = [OrderedDict() for _ in range(shards)]
        self._lock = threading.Lock()
        self.evicted = 0
        """Live records dropped to make room for a new key (0 when ``max_keys`` is enough)."""

    def _shard(self, full: str) -> OrderedDict[str, bytes]:
        shards = self._shards
        return shards[hash(full) % len(shards)]

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        keys = self.keys(op, key)
        with self._lock:
            now = self.clock.monotonic()
            tables = [self._shard(full) for full in keys]
            records: list[Record | None] = []
            for full, data in zip(keys, tables, strict=True):
                held = data.get(full)
                if held is None or _expiry(held)[0] <= now:
                    records.append(None)
                else:
                    records.append(_record(held))
            writes, result = op.step(records, now, args)
            for full, data, write in zip(keys, tables, writes, strict=True):
                if write is None:
                    data.pop(full, None)
                elif isinstance(write, Record):
                    if len(data) >= self._shard_keys and full not in data:
                        self._make_room(data, now)
                    data[full] = _hold(write)
                elif write is KEEP:
                    held = data.get(full)
                    if held is not None and _expiry(held)[0] <= now:
                        del data[full]
            self._sweep_steps(tables[0], self.HAND_STEPS, now)
        return result

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        return self.apply(op, key, args)

    def keys(self, op: Op[Any], key: str) -> list[str]:
        """The full keys, built each time: the base class's cache of them would leave two
        tracked objects per new key for the garbage collector (see
        :mod:`floodwall.stores.memory`)."""
        if not isinstance(key, str) or not key:
            raise ConfigError(f"key must be a non-empty string, got {key!r}")
        base = f"{self.prefix}{{{key}}}"
        return [base + suffix for suffix in op.suffixes]

    @staticmethod
    def _sweep_steps(data: OrderedDict[str, bytes], steps: int, now: float) -> None:
        """Move a shard's hand ``steps`` records on (lock held), dropping the expired ones."""
        for _ in range(min(steps, len(data))):
            full = next(iter(data))
            if _expiry(data[full])[0] <= now:
                del data[full]
            else:
                data.move_to_end(full)  # live: back of the line (no new dict entry, no resize)

    def _make_room(self, data: OrderedDict[str, bytes], now: float) -> None:
        """Free one slot of a full shard: an expired record if the hand meets one within
        :attr:`ROOM_STEPS`, else the record at the front of the line."""
        for _ in range(self.ROOM_STEPS):
            full = next(iter(data))
            if _expiry(data[full])[0] <= now:
                del data[full]
                return
            data.move_to_end(full)
        data.popitem(last=False)
        self.evicted += 1

    def sweep(self) -> int:
        """Drop every expired record now and give the table's spare memory back; how many went.

        O(records) under the lock: for housekeeping, never needed for the bound.
        """
        with self._lock:
            now = self.clock.monotonic()
            gone = 0
            for i, data in enumerate(self._shards):
                live = OrderedDict((k, h) for k, h in data.items() if _expiry(h)[0] > now)
                gone += len(data) - len(live)
                self._shards[i] = live
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
            self._shards = [OrderedDict() for _ in self._shards]

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "records": len(self),
            "max_keys": self.max_keys,
            "evicted": self.evicted,
        }
