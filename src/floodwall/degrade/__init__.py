"""Degradation: keep the core alive by giving up what is optional (see ``docs/degradation.md``).

* **Dependency levels and switches**: :class:`Levels` and :class:`LevelGate` (or a config
  :class:`~floodwall.config.Registry`'s ``shed``), switched automatically from an overload
  signal by :class:`AutoShedder` (level 3 first, then 2, restored with hysteresis; signals in
  :mod:`floodwall.degrade.signals`); priority admission that gives level 1 the capacity first:
  :class:`LevelReserve`, :class:`PriorityGate`, :class:`LevelLimiter`, :func:`admit_level`.
* **Read degradation**: :class:`FallbackSource` (a backup data source behind its own
  pipeline), and :class:`~floodwall.Cache` (TTL + LRU, optional shared second level,
  stale-while-error with the value's age, read only from cache), which lives in
  :mod:`floodwall.shared` with the other policies that can keep their state in a store.
* **Write degradation**: :class:`Coalesce` (one downstream call per key and window),
  :class:`SampledDrop` (drop a live-tunable share of low-priority writes), and
  :class:`~floodwall.WriteBehind` (bounded queued writes, memory or Redis Streams, at least
  once with idempotency keys; in :mod:`floodwall.shared`).
* **Bulk work**: :func:`chunked` (per-chunk results and failures, not all-or-nothing).
"""

from floodwall.degrade._common import BacklogFullError
from floodwall.degrade.chunked import BatchResult, Chunk, Chunked, chunked
from floodwall.degrade.coalesce import Batch, Coalesce, CoalesceCore, Flushed, last_wins
from floodwall.degrade.levels import (
    SHED_ORDER,
    AutoShedder,
    LevelGate,
    LevelOverride,
    Levels,
    LevelSwitch,
    ShedController,
    ShedOptions,
    ShedState,
    ShedStep,
)
from floodwall.degrade.priority import (
    LevelLimiter,
    LevelReserve,
    PriorityGate,
    PriorityGateOptions,
    admit_level,
    dagor_business,
    level_partition,
    level_partitions,
)
from floodwall.degrade.sampled import SampledDrop, SampledDropOptions, key_fraction
from floodwall.degrade.signals import (
    Signal,
    cpu_signal,
    limiter_signal,
    max_signal,
    queueing_signal,
    shed_rate_signal,
)
from floodwall.degrade.source import FallbackSource

__all__ = [
    "SHED_ORDER",
    "AutoShedder",
    "BacklogFullError",
    "Batch",
    "BatchResult",
    "Chunk",
    "Chunked",
    "Coalesce",
    "CoalesceCore",
    "FallbackSource",
    "Flushed",
    "LevelGate",
    "LevelLimiter",
    "LevelOverride",
    "LevelReserve",
    "LevelSwitch",
    "Levels",
    "PriorityGate",
    "PriorityGateOptions",
    "SampledDrop",
    "SampledDropOptions",
    "ShedController",
    "ShedOptions",
    "ShedState",
    "ShedStep",
    "Signal",
    "admit_level",
    "chunked",
    "cpu_signal",
    "dagor_business",
    "key_fraction",
    "last_wins",
    "level_partition",
    "level_partitions",
    "limiter_signal",
    "max_signal",
    "queueing_signal",
    "shed_rate_signal",
]
