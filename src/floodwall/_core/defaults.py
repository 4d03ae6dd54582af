"""Every default in one place, with where it comes from.

The circuit breaker's figures are Hystrix's (and the seeds'): a 10 s window in 1 s buckets,
20 calls before the rate means anything, 50 % errors to trip, 5 s open, one half-open probe.
"""

from __future__ import annotations

BREAKER_FAILURE_RATE = 0.5
BREAKER_MINIMUM_CALLS = 20
BREAKER_WINDOW = 10.0
BREAKER_BUCKETS = 10
BREAKER_OPEN_DURATION = 5.0
BREAKER_HALF_OPEN_CALLS = 1
BREAKER_OPEN_DURATION_GROWTH = 1.0
"""Multiplier applied to the open duration each time a half-open probe fails (1 = no growth)."""
BREAKER_MAX_OPEN_DURATION = 60.0
BREAKER_PROBE_TIMEOUT = 10.0
"""A half-open probe not back after this many seconds counts as failed, so it cannot wedge."""

MAX_SLOTS = 1_000_000
"""Buckets, counted calls or levels one rolling structure allocates at most: a bound that keeps
a mistyped option (``buckets=10**9``) a clear error at construction, not a ``MemoryError``."""

TIMEOUT_THREAD_LIMIT = 8
"""Sync ``Timeout(mode="thread")``: abandoned, still-running worker threads allowed at once."""

# -- retries, budgets, hedging (retry issue) -------------------------------------------------

RETRY_ATTEMPTS = 3
"""Total attempts (the first call plus two retries): the seeds' "at most 3 times"."""
RETRY_BACKOFF_BASE = 0.1
"""Seconds: the first retry of the default exponential full-jitter backoff waits up to this."""
RETRY_BACKOFF_CAP = 10.0
"""Seconds: no backoff delay is ever longer."""
RETRY_MAX_RETRY_AFTER = 30.0
"""Seconds: a server's ``Retry-After`` is honoured up to this much waiting, then capped."""
RETRY_MAX_LEVEL = 2
"""Dependency levels above this never retry (level 3, "nice to have", fails fast)."""
RETRY_BUDGET_RATIO = 0.1
"""Retries per request over the budget's window: the seeds' 10 % (amplification about 1.1)."""
RETRY_BUDGET_MIN_PER_SECOND = 1.0
"""Retries per second always allowed, so a quiet caller can still retry a blip."""
RETRY_BUDGET_WINDOW = 10.0
RETRY_BUDGET_BUCKETS = 10
HEDGE_MAX_HEDGES = 1
"""Extra attempts a :class:`~floodwall.Hedge` may start beside the first."""
HEDGE_MIN_SAMPLES = 20
"""Latency samples a percentile hedge delay needs before it replaces the fixed delay."""

# -- bulkheads and rate limits (isolation issue) ---------------------------------------------
# Bulkheads take Hystrix's semaphore defaults (10 concurrent, no queue, reject at once) and
# its thread-pool defaults (10 threads, 5 queued: queueSizeRejectionThreshold).
BULKHEAD_MAX_CONCURRENT = 10
BULKHEAD_MAX_QUEUE = 0
BULKHEAD_MAX_WAIT = 0.0
THREAD_POOL_WORKERS = 10
THREAD_POOL_QUEUE = 5
POOL_SIZE_BUFFER = 2
"""Threads added to ``peak RPS × p99 latency`` by ``floodwall.pool_size`` (the seeds' buffer)."""
RATE_LIMIT_MAX_WAIT = 0.0
"""Rate limiters used as policies reject at once unless given a ``max_wait`` to pace within."""
RATE_LIMIT_MAX_KEYS = 100_000
"""Keys a keyed limiter tracks at most (about 20 MB of per-key state at the bound)."""
WARMUP_COLD_FACTOR = 3.0
"""Sentinel's coldFactor: a cold limiter starts at rate / 3."""

# -- adaptive limits, shedding, simulator (adaptive issue) ----------------------------------

# concurrency-limits (Netflix), builder defaults; times in seconds.
AIMD_INITIAL_LIMIT = 20
AIMD_MIN_LIMIT = 20
AIMD_MAX_LIMIT = 200
AIMD_BACKOFF_RATIO = 0.9
AIMD_TIMEOUT = 5.0
"""Seconds: an RTT above this counts as a drop (``AIMDLimit.Builder.timeout``)."""
VEGAS_INITIAL_LIMIT = 20
VEGAS_MAX_CONCURRENCY = 1000
VEGAS_SMOOTHING = 1.0
VEGAS_PROBE_MULTIPLIER = 30
GRADIENT_INITIAL_LIMIT = 50
GRADIENT_MIN_LIMIT = 1
GRADIENT_MAX_CONCURRENCY = 1000
GRADIENT_SMOOTHING = 0.2
GRADIENT_RTT_TOLERANCE = 2.0
GRADIENT_PROBE_INTERVAL = 1000
GRADIENT_BACKOFF_RATIO = 0.9
GRADIENT2_INITIAL_LIMIT = 20
GRADIENT2_MIN_LIMIT = 1
"""Java's builder says 20, which is also the floor under overload: on a small service (one
core, 2 ms a request) 20 in flight is a 40 ms queue; 1 lets the latency decide."""
GRADIENT2_COLD_LIMIT = 100
"""In flight admitted before the first sample (floodwall's; Java starts at ``initial_limit``)."""
GRADIENT2_MAX_CONCURRENCY = 200
GRADIENT2_SMOOTHING = 0.2
"""How far a growing limit moves towards its target per sample (Java's builder)."""
GRADIENT2_DECREASE_SMOOTHING = 0.5
"""How far a shrinking limit moves per sample (Java: ``smoothing`` both ways). Behind the
recommended 1 s window, 0.2 walks a limit down a tenth of the way per second at the gradient's
0.5 floor (``e → 0.9 e + 0.2 q``): ten seconds of a queue the latency already shows; 0.5 halves
the time constant. Growth stays careful (TCP's rule): a limit growing as fast as it shrinks
outruns a baseline learned under load."""
# Gradient2's queue_size defaults to a function, floodwall.adaptive.square_root (Java's Gradient
# v1 default, and the seeds' "queue_size is usually the square root of the limit"; Java's
# Gradient2 says a constant 4). Under overload the limit tends to 2 x queue_size (the gradient's
# 0.5 floor): 8 in flight with 4, 4 with the square root, a few requests of queue on one worker.
GRADIENT2_LONG_WINDOW = 600
GRADIENT2_WARMUP = 10
GRADIENT2_RTT_TOLERANCE = 1.5
"""An RTT up to 1.5 × the long RTT is not queueing (``Gradient2Limit.Builder.rttTolerance``)."""
GRADIENT2_LONG_RTT_DECAY = 0.95
"""A long RTT over twice the sample is multiplied by this per sample (recovery after overload)."""
WINDOW_MIN_TIME = 1.0
WINDOW_MAX_TIME = 1.0
WINDOW_SIZE = 10
WINDOW_MIN_RTT_THRESHOLD = 100e-6
"""Seconds: RTT samples below 100 µs are discarded by ``WindowedLimit``."""
LIFO_BACKLOG_SIZE = 100
LIFO_BACKLOG_TIMEOUT = 1.0

# Kratos BBR (go-kratos/aegis ratelimit/bbr): CPU EMA every 500 ms with decay 0.95.
BBR_WINDOW = 10.0
BBR_BUCKETS = 100
BBR_CPU_THRESHOLD = 0.8
BBR_CPU_DECAY = 0.95
BBR_CPU_INTERVAL = 0.5
BBR_COOLDOWN = 1.0
"""Seconds after the last drop during which a drop is still possible below the CPU threshold."""
BBR_RT_RESOLUTION = 0.001
"""Seconds: BBR measures RT in whole milliseconds (rounded up), as Kratos does."""

# DAGOR (WeChat, SoCC 2018): queueing time 20 ms, windows of 1 s or 2000 requests.
DAGOR_QUEUE_THRESHOLD = 0.020
DAGOR_WINDOW = 1.0
DAGOR_WINDOW_REQUESTS = 2000
DAGOR_SURGE = 5.0
"""A window queueing more than 5 x the threshold (100 ms) is a surge, a sudden step rather than
the steady hovering around the threshold: the level then follows the measured service rate at
once. Lower values react sooner but disturb fan-out requests at a steady overload."""
DAGOR_EARLY_WINDOW = 0.1
"""Seconds: in a surge, a window that has seen ``DAGOR_EARLY_REQUESTS`` arrivals closes this
early, so the level moves ten times a second until the queue is calm again..."""
DAGOR_EARLY_REQUESTS = 50
"""...and a quiet server keeps the paper's 1 s window (too few samples to judge sooner)."""
DAGOR_MAX_WAIT_RATIO = 4.0
"""An arrival that would wait longer than 4 mean service times to start is refused (floodwall's
wait rule; the p99 of what is admitted stays within about five service times)."""
DAGOR_OVERFLOW_SHARE = 0.2
"""A window in which the wait rule refused more than 20 % of the arrivals counts as overloaded:
the level (whole users) then takes the sustained excess, the rule only the bursts. Lower shares
shed more by priority and fill the queue less: on one worker, 5 % keeps ~85 % of capacity."""
DAGOR_USER_LEVELS = 128
DAGOR_BUSINESS_LEVELS = 64
DAGOR_ALPHA = 0.05
"""Share of admitted requests removed per overloaded window."""
DAGOR_BETA = 0.01
"""Share of admitted requests added back per window without overload."""
DAGOR_ROTATION = 3600.0
"""Seconds: user priorities are re-hashed every hour, so nobody is shed for long."""

# Client-side throttling (Google SRE book, "Handling Overload", eq. 21-1).
THROTTLE_K = 2.0
THROTTLE_WINDOW = 120.0
THROTTLE_BUCKETS = 24

SHED_RETRY_AFTER = 1.0
"""Seconds suggested to a shed caller (HTTP Retry-After)."""

# -- stores and idempotency (distributed issue) ---

STORE_PREFIX = "floodwall:"
"""Every key a store writes starts with this (then ``{key}``, the Redis Cluster hash tag)."""
STORE_TIMEOUT = 0.5
"""Seconds a store waits for its server (connect and each command) before it counts as down:
short, because a guarded store degrades instead of making every caller wait."""
STORE_POOL_SIZE = 10
"""PostgreSQL connections per store (sync), and per event loop (async)."""
STORE_REDIS_MAX_CONNECTIONS = 50
"""Redis: connections per async client (per node on a cluster)."""
STORE_MEMORY_MAX_KEYS = 100_000
"""Memory store: records held at most (about 16 MB); a new key past it evicts (see memory.py)."""
STORE_HOST_MAX_KEYS = 4096
"""``host://``: records in the shared segment (fixed size, ``max_keys x record_bytes``)."""
STORE_HOST_RECORD_BYTES = 1024
"""``host://``: bytes per record, 16 of them header: key + value fit in the other 1008 (an
idempotency record holds the call's result)."""
STORE_HOST_BULKHEADS = 64
"""``host://``: host bulkheads one name holds (one semaphore each, in one set)."""
STORE_HOST_TIMEOUT = 0.5
"""``host://``: seconds to wait for the segment's lock (held for microseconds; a holder that
is stopped, not dead, would otherwise stop every process of the host)."""
STORE_SQL_PURGE_EVERY = 1000
"""SQL stores: every this many ops, delete up to ``STORE_SQL_PURGE_BATCH`` expired rows."""
STORE_SQL_PURGE_BATCH = 1000
STORE_BREAKER_ERRORS = 3
"""Store guard: this many failures within the window open its breaker (one failure may be a
blip; three in a row are an outage)."""
STORE_BREAKER_WINDOW = 10.0
STORE_BREAKER_OPEN = 1.0
"""Seconds the guard's breaker stays open before one probe tries the store again."""
STORE_BREAKER_OPEN_GROWTH = 2.0
STORE_BREAKER_MAX_OPEN = 10.0
"""Seconds: the longest an outage can hide a recovered store (open duration doubles per failed
probe, up to this)."""
IDEMPOTENCY_TTL = 86400.0
"""Seconds a finished request's result is kept and replayed: 24 h, as payment APIs do."""
IDEMPOTENCY_LOCK_TTL = 60.0
"""Seconds an in-progress record blocks duplicates; a crashed owner's lock lapses after this."""
IDEMPOTENCY_TOKEN_TTL = 3600.0
"""Seconds a one-time token stays valid when unused."""

# -- degradation (degradation issue) ---
# Automatic shedding of dependency levels (the seeds' flash sale: level 3 first, then level 2).
# Signals are normalised so that 1.0 means "at capacity" (utilisation, queueing time over its
# threshold, CPU over its threshold).
SHED_ABOVE = 1.0
"""A signal at or above this is overload (1.0 = at capacity)."""
SHED_RESTORE_BELOW = 0.7
"""A signal below this is calm; between the two the controller holds (hysteresis band)."""
SHED_AFTER = 2.0
"""Seconds of sustained overload before the next level is shed (one level per step)."""
SHED_RESTORE_AFTER = 30.0
"""Seconds of sustained calm before the most recently shed level is restored."""
SHED_RESTORE_GROWTH = 2.0
"""Flap damping: a level shed again within its restore delay doubles that delay..."""
SHED_MAX_RESTORE_AFTER = 300.0
"""...up to this many seconds."""
SHED_INTERVAL = 1.0
"""Seconds between two readings of the overload signal by ``AutoShedder``."""
SHED_LEASE = 30.0
"""Seconds an automatic shed lasts unless renewed: a dead controller cannot pin a level off."""
PRIORITY_RESERVE_LEVEL2 = 0.1
"""Share of a capacity that level-2 work may not take (kept for level 1)."""
PRIORITY_RESERVE_LEVEL3 = 0.3
"""Share of a capacity that level-3 work may not take (kept for levels 1 and 2)."""
CACHE_MAX_ENTRIES = 10_000
"""Entries an in-process cache level keeps (least recently used evicted first)."""
CACHE_TTL = 60.0
"""Seconds an entry is fresh: served without calling the dependency."""
CACHE_STALE_TTL = 3600.0
"""Seconds an entry is kept to be served stale while the dependency fails (or is switched off)."""
WRITE_BEHIND_MAX_PENDING = 10_000
"""Writes a write-behind queue holds before it refuses more (bounded: backpressure, not OOM)."""
WRITE_BEHIND_BATCH = 100
"""Messages a write-behind worker takes per read."""
WRITE_BEHIND_RETRY_BASE = 0.1
"""Seconds: the first redelivery after a failed write waits up to this (full jitter)..."""
WRITE_BEHIND_RETRY_CAP = 10.0
"""...doubling per failure up to this."""
WRITE_BEHIND_IDLE_WAIT = 0.05
"""Seconds a worker waits before polling an empty queue again."""
WRITE_BEHIND_CLAIM_AFTER = 30.0
"""Seconds a Redis Streams message may stay unacknowledged with another (crashed) consumer
before this one claims it."""
COALESCE_WINDOW = 0.1
"""Seconds writes to one key are gathered before one downstream call."""
COALESCE_MAX_KEYS = 10_000
"""Keys with pending writes a coalescer holds before it refuses new keys."""
CHUNK_SIZE = 100
"""Items per chunk of a bulk job."""

# -- global limits (distributed issue, part B) ---

GLOBAL_MAX_BATCH = 512
"""Requests one coalesced round trip of an async global limiter decides at most."""
LEASE_SHARE = 10
"""A leased limiter's default lease is ``limit ÷ (LEASE_SHARE × expected_instances)`` permits:
the fleet's unspent leases, its over-admission bound, stay within 10 % of the limit."""
LEASE_MAX = 100
"""Permits per lease at most by default (past this, fewer round trips no longer pay)."""
LEASE_TTL = 1.0
"""Seconds leased permits stay usable in the process that took them; unused ones are dropped."""
TIMESLICE_LENGTH = 10.0
"""Seconds per slice of a time-slice limiter: instances report and re-read the drop rate once
per slice (the seeds: 10 s or 30 s; shorter reacts faster, longer costs less)."""
TIMESLICE_STALE_SLICES = 2
"""An instance's report counts towards the global QPS for this many slices."""
TIMESLICE_LEASE_SLICES = 3
"""Slices the elected instance's lease (and the published drop rate) lasts without renewal."""

# -- task queues (issue 21) ---

TASK_MAX_DEFER = 3600.0
"""Seconds a task may be deferred in all (open breaker, rate limit, claim held elsewhere) before
it fails with the refusal: an hour outlives most outages without keeping a message forever."""
TASK_DEFER = 5.0
"""Seconds a task waits after a refusal that names no ``retry_after`` (a breaker forced open by
an operator): the breaker's default open duration."""
TASK_DEFER_JITTER = 0.5
"""A deferral waits ``retry_after × (1 + U(0, 0.5))``: tasks refused together come back spread
over half the wait, not in one burst at the breaker's half-open moment."""
TASK_MIN_DELAY = 0.05
"""Seconds a deferred or retried task waits at least: never a tight loop through the broker."""
TASK_HOLD_SHARE = 0.5
"""The longest countdown a Celery task is re-published with, as a share of the broker's
``visibility_timeout`` (Redis, SQS): a message held in a worker's memory longer than that is
delivered again. Longer waits go in steps of at most this, the message carrying when it may
run (``floodwall-until``); half leaves room for a busy worker's delay in fetching it."""
TASK_VISIBILITY_TIMEOUTS = {"redis": 3600.0, "rediss": 3600.0, "sentinel": 3600.0, "sqs": 1800.0}
"""kombu's default ``visibility_timeout`` per broker scheme, used when the app sets none."""
