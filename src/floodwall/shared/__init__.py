"""Shared state: the policies whose state can live in a store, so that processes agree.

Each is a policy of the layers above (a rate limit, a frequency rule, a cache, a queue) whose
state sits behind a :class:`~floodwall.stores.Store` chosen by URL (``memory://``, Redis, Redis
Cluster, PostgreSQL, SQLite) and a :class:`~floodwall.stores.StoreGuard` that turns an outage
into the policy's configured behaviour, never into an error for the caller.

===========================  =================================================================
:class:`GlobalLimiter`       one rate limit across processes, one round trip per decision
:class:`HostBulkhead`        one bulkhead for every process of a host (``host://`` store)
:class:`LeasedLimiter`       permits taken from the store in small leases and spent locally
:class:`TimeSliceLimiter`    counts locally, syncs per slice, drops with an elected drop rate
:class:`Frequency`           "once per N seconds" and "at most M per N seconds" per key
:class:`Idempotency`         a keyed call runs once; repeats get the stored answer
:class:`OneTimeTokens`       tokens issued once and consumed once (form resubmission)
:class:`Cache`               TTL + LRU in process, optional shared second level, stale-on-error
:class:`WriteBehind`         bounded queued writes (memory or Redis Streams), at least once
===========================  =================================================================

The limiters keep their options in a frozen, validated object, ``options``
(:class:`GlobalLimitOptions`, :class:`LeaseOptions`, :class:`TimeSliceOptions`,
:class:`FrequencyOptions`), as do the cache and idempotency (:class:`CacheOptions`,
:class:`IdempotencyOptions`); the store, its key function and its breaker are what a policy is
wired to, not options.

The layer map (``docs/architecture.md``): this package sits below ``floodwall.stores`` and
above ``floodwall.config``; nothing in the policy packages imports it. The most used names are
also re-exported by ``floodwall`` itself; see ``docs/distributed.md``.
"""

from floodwall.shared.cache import Cache, Cached, CacheOptions, LruTtl
from floodwall.shared.frequency import Frequency, FrequencyDecision, FrequencyOptions
from floodwall.shared.global_limit import GlobalLimiter, GlobalLimitOptions
from floodwall.shared.host_bulkhead import HostBulkhead
from floodwall.shared.idempotency import (
    DuplicateInFlightError,
    Idempotency,
    IdempotencyKeyMissingError,
    IdempotencyKeyReusedError,
    IdempotencyOptions,
    IdempotencyTokenError,
    IdempotencyUnavailableError,
    OneTimeTokens,
    fingerprint_of,
)
from floodwall.shared.leasing import LeasedLimiter, LeaseOptions
from floodwall.shared.timeslice import TimeSliceLimiter, TimeSliceOptions
from floodwall.shared.write_behind import (
    Deferred,
    DeliveryCore,
    MemoryQueue,
    Message,
    StreamQueue,
    WriteBehind,
    WriteQueue,
)

__all__ = [
    "Cache",
    "CacheOptions",
    "Cached",
    "Deferred",
    "DeliveryCore",
    "DuplicateInFlightError",
    "Frequency",
    "FrequencyDecision",
    "FrequencyOptions",
    "GlobalLimitOptions",
    "GlobalLimiter",
    "HostBulkhead",
    "Idempotency",
    "IdempotencyKeyMissingError",
    "IdempotencyKeyReusedError",
    "IdempotencyOptions",
    "IdempotencyTokenError",
    "IdempotencyUnavailableError",
    "LeaseOptions",
    "LeasedLimiter",
    "LruTtl",
    "MemoryQueue",
    "Message",
    "OneTimeTokens",
    "StreamQueue",
    "TimeSliceLimiter",
    "TimeSliceOptions",
    "WriteBehind",
    "WriteQueue",
    "fingerprint_of",
]
