"""``memory://``: records in a dict of this process, the default store.

Ops run their Python :meth:`~floodwall.stores.Op.step` under one lock, with ``now`` from the
injected clock (monotonic seconds), so a :class:`~floodwall.FakeClock` drives every expiry in
tests. Nothing is shared with other processes: a limit kept here is per worker.

Expired records are dropped when touched, and swept in full every ``sweep_every`` ops
(O(records) then, amortised O(1) per op), so idle keys do not pile up.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall.stores.base import KEEP, Arg, Op, R, Record, Store

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    """A thread-safe in-process store (``memory://``)."""

    def __init__(
        self,
        url: str = "memory://",
        *,
        prefix: str = defaults.STORE_PREFIX,
        clock: Clock = SYSTEM_CLOCK,
        sweep_every: int = defaults.STORE_MEMORY_SWEEP_EVERY,
    ) -> None:
        super().__init__(url, prefix=prefix)
        if not isinstance(sweep_every, int) or sweep_every < 1:
            raise ConfigError(f"sweep_every must be an integer >= 1, got {sweep_every!r}")
        self.clock = clock
        self.sweep_every = sweep_every
        self._data: dict[str, Record] = {}
        self._lock = threading.Lock()
        self._ops = 0

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        keys = self.keys(op, key)
        with self._lock:
            now = self.clock.monotonic()
            data = self._data
            records: list[Record | None] = []
            for full in keys:
                record = data.get(full)
                records.append(record if record is not None and record.alive(now) else None)
            writes, result = op.step(records, now, args)
            for full, write in zip(keys, writes, strict=True):
                if write is None:
                    data.pop(full, None)
                elif isinstance(write, Record):
                    data[full] = write
                elif write is KEEP and full in data and not data[full].alive(now):
                    del data[full]
            self._ops += 1
            if self._ops % self.sweep_every == 0:
                self._sweep(now)
        return result

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        return self.apply(op, key, args)

    def _sweep(self, now: float) -> None:
        dead = [key for key, record in self._data.items() if not record.alive(now)]
        for key in dead:
            del self._data[key]

    def __len__(self) -> int:
        """Live records (expired ones are swept first)."""
        with self._lock:
            self._sweep(self.clock.monotonic())
            return len(self._data)

    def raw(self, full_key: str) -> Record | None:
        """The live record under a full key, for inspection and tests."""
        with self._lock:
            record = self._data.get(full_key)
            now = self.clock.monotonic()
            return record if record is not None and record.alive(now) else None

    def clear(self) -> None:
        """Drop every record."""
        with self._lock:
            self._data.clear()

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "records": len(self)}
