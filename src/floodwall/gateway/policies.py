"""Each route's protection, built from the configuration: the per-route pipeline.

A request that matched a route meets, in this order (first = outermost, as everywhere in
floodwall):

1. the **inbound guard** (:class:`~floodwall.integrations._inbound.InboundGuard`): the
   deadline (the client's ``X-Request-Deadline``, capped by the route's ``timeout``), the retry
   marker (a client's ``X-Retry-Attempt`` turns the gateway's own retries off: one retrying layer
   per request), the priority, and **adaptive shedding** (``shedding:``; 503 + ``Retry-After``);
2. the route's **rate limit** (local, or global through a store), keyed by client IP, a header
   or a path parameter: 429 with ``Retry-After`` and ``RateLimit-*``;
3. the route's **resource** (``resources[route.resource]``), whose pipeline is the library's:
   dependency level (shed levels answer from the fallback), fallback, circuit breaker,
   bulkhead, rate limit, retry (with its budget; only idempotent methods or requests with an
   ``Idempotency-Key``), timeout per try;
4. the **upstream** pool: an endpoint by the balancer, outlier detection per endpoint;
5. the route's **fallbacks** (cache, backup, static) for the failures they answer.

:class:`RouteStats` keeps what the admin API, the dashboard and ``/metrics`` read: cumulative
counts by outcome and a latency histogram in the library's log-linear bins (±12 %).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from floodwall._core.clock import Clock
from floodwall._core.errors import ConfigError, RejectedError
from floodwall._core.events import Listeners
from floodwall._core.meter import ANSWERS
from floodwall._core.meter import OUTCOMES as METER_OUTCOMES
from floodwall._core.window import _EDGES, HISTOGRAM_BINS
from floodwall.adaptive import (
    AdaptiveLimiter,
    AIMDLimit,
    FixedLimit,
    Gradient2Limit,
    GradientLimit,
    LoadShedder,
    QueueingTimeAdmission,
    VegasLimit,
)
from floodwall.adaptive._base import Limit
from floodwall.config.registry import FieldError, Registry, Resource, build_limiter, open_store
from floodwall.gateway._headers import RESPONSE_DROPPED
from floodwall.gateway.config import GatewayDocument, RouteConfig, RouteRateLimitConfig
from floodwall.gateway.fallbacks import Answer, LastGood, static_answer
from floodwall.gateway.routing import Matcher
from floodwall.gateway.upstream import UpstreamPool
from floodwall.integrations._inbound import Inbound, InboundGuard, no_priority
from floodwall.integrations._wire import parse_level
from floodwall.ratelimit import Keyed, RateLimiter
from floodwall.ratelimit._base import Decision
from floodwall.shared.global_limit import GlobalLimiter

__all__ = [
    "ANSWERS",
    "DEPENDENCY_OUTCOMES",
    "OUTCOMES",
    "Route",
    "RouteStats",
    "build_route",
    "build_shedder",
    "rejection_outcome",
]

OUTCOMES = (
    "rate_limited",
    "store_unavailable",
    "overloaded",
    "circuit_open",
    "bulkhead_full",
    "timeout",
    "degraded",
    "upstream_5xx",
    "upstream_unavailable",
    "fallback",
    "client_error",
)
"""What a route's answers are counted under besides their status class."""

RATE_FIELDS = frozenset(
    {"ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "ratelimit-policy"}
)
"""Lower-case names of the fields a route's rate limit writes into every answer."""
PROXY_READS = frozenset(
    {"x-request-deadline", "grpc-timeout", "expect", "connection", "idempotency-key"}
)
"""Lower-case names of the request headers the proxy reads after routing (besides the request
id's): with the guard's, :attr:`Route.reads`."""
RATE_FIELDS_KEPT = 1024
"""Distinct ``RateLimit-*`` field sets a route keeps made (past it, the table starts over)."""
DEPENDENCY_OUTCOMES = (*METER_OUTCOMES, "upstream_unavailable")
"""What the upstream did for a request, as a resource's meter says it (``success``, ``error``,
``timeout``, or the rejection that kept it from being called), plus ``upstream_unavailable``:
no endpoint of the upstream could take it (all unhealthy or ejected)."""


def rejection_outcome(error: RejectedError) -> str:
    """The dependency outcome of a request refused with ``error``."""
    kind = error.kind
    return kind if kind in DEPENDENCY_OUTCOMES else "rejected"


KeyFunc = Callable[[str | None, Mapping[str, str], Mapping[str, str]], Hashable]
"""``key(client_ip, headers, path_params)`` of a rate limit."""


class RouteStats:
    """Cumulative figures of one route (read by the admin API; one event loop writes them).

    Each request the route's protection handled is counted twice, as a resource's meter
    counts calls: by what the upstream did (:attr:`dependency`, :data:`DEPENDENCY_OUTCOMES`)
    and by what the client got (:attr:`answers`: ``answer`` from the upstream, ``fallback``
    from the resource's or the route's fallback, ``error``). An outage answered by fallbacks
    thus reads 100 % dependency errors and 100 % degraded answers, however green the status
    codes are. Requests refused for the client's own fault (a body too large or too slow, an
    unsupported ``Expect``) are in neither."""

    __slots__ = (
        "_answers",
        "_dependency",
        "answered",
        "bins",
        "classes",
        "in_flight",
        "outcomes",
        "requests",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.in_flight = 0
        self.classes = [0, 0, 0, 0, 0, 0]
        """Answers by status class: index 1 = 1xx … 5 = 5xx (0: the client went away)."""
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.bins = [0] * HISTOGRAM_BINS
        self.answered = 0
        """Requests the upstream answered and the client got that answer (the hot path's
        one increment; the other pairs go through :meth:`settle`)."""
        self._dependency: dict[str, int] = {}
        self._answers: dict[str, int] = {"fallback": 0, "error": 0}

    def settle(self, outcome: str, answer: str) -> None:
        """A request the upstream did not answer (``outcome``), the client got ``answer``."""
        self._dependency[outcome] = self._dependency.get(outcome, 0) + 1
        self._answers[answer] += 1

    @property
    def dependency(self) -> dict[str, int]:
        """Requests by what the upstream did."""
        return {"success": self.answered, **self._dependency}

    @property
    def answers(self) -> dict[str, int]:
        """Requests by what the client got."""
        return {"answer": self.answered, **self._answers}

    def done(self, status: int, duration: float) -> None:
        """One answer with ``status`` after ``duration`` seconds (status 0: no answer)."""
        self.classes[status // 100 if 100 <= status < 600 else 0] += 1
        self.bins[bisect_right(_EDGES, duration)] += 1

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "classes": {f"{i}xx" if i else "aborted": n for i, n in enumerate(self.classes)},
            "outcomes": dict(self.outcomes),
            "dependency": self.dependency,
            "answers": self.answers,
            "bins": {str(i): n for i, n in enumerate(self.bins) if n},
        }


def client_ip_key(
    ip: str | None, headers: Mapping[str, str], params: Mapping[str, str]
) -> str | None:
    """The ``client_ip`` key: the client's address (the proxy tests for this function and
    takes the address itself, without a call)."""
    return ip


def _key_func(config: RouteRateLimitConfig) -> KeyFunc | None:
    key = config.key
    if key is None:
        return None
    if key == "client_ip":
        return client_ip_key
    kind, _, name = key.partition(":")
    if kind == "header":
        lower = name.lower()
        return lambda ip, headers, params: headers.get(lower)
    return lambda ip, headers, params: params.get(name)


def build_limiter_for(
    name: str, config: RouteRateLimitConfig, doc: GatewayDocument, clock: Clock
) -> RateLimiter[Any] | GlobalLimiter:
    """The route's local (keyed) limiter, or its global one on ``stores[config.store]``; an
    error names its field (``rate_limit.store: stores.shared cannot be opened: …``)."""
    try:
        return _route_limiter(name, config, doc, clock)
    except FieldError as exc:
        raise ConfigError(f"rate_limit.{exc.field}: {exc}") from exc
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"rate_limit: {exc}") from exc


def check_limits(doc: GatewayDocument, clock: Clock) -> None:
    """Build (and close) every route's rate limiter, as the gateway will: an error names the
    route and the field (``check-config`` calls it; nothing connects)."""
    for index, (config, name) in enumerate(zip(doc.routes, doc.route_names(), strict=True)):
        if config.rate_limit is None:
            continue
        try:
            limiter = build_limiter_for(name, config.rate_limit, doc, clock)
        except ConfigError as exc:
            raise ConfigError(f"routes[{index}] ({name}): {exc}") from None
        if isinstance(limiter, GlobalLimiter):
            limiter.close()


def _route_limiter(
    name: str, config: RouteRateLimitConfig, doc: GatewayDocument, clock: Clock
) -> RateLimiter[Any] | GlobalLimiter:
    if config.scope == "global":
        open_store(config.store, doc.stores).close()  # its URL, checked with the entry named
        return GlobalLimiter(
            config.algorithm,
            config.rate,
            burst=config.burst,
            store=doc.stores[config.store],
            name=f"gateway:{name}",
            on_store_error=config.on_store_error,
            expected_instances=config.expected_instances,
            clock=clock,
        )
    local = build_limiter(f"gateway:{name}", config, clock, Listeners())
    if isinstance(local, GlobalLimiter):  # (not reached: scope global is built above)
        return local
    return Keyed(local) if config.key is not None else local


def _limit(algorithm: str, initial: int | None, maximum: int | None) -> Limit:
    options: dict[str, Any] = {}
    if initial is not None:
        options["initial_limit"] = initial
    if algorithm == "fixed":
        if initial is None:
            raise ConfigError("shedding.limit is required with algorithm: fixed")
        return FixedLimit(initial)
    if algorithm == "aimd":
        if maximum is not None:
            options["max_limit"] = maximum
        if initial is not None:
            options["min_limit"] = min(initial, 20)
        return AIMDLimit(**options)
    if maximum is not None:
        options["max_concurrency"] = maximum
    if algorithm == "vegas":
        return VegasLimit(**options)
    if algorithm == "gradient":
        return GradientLimit(**options)
    if initial is not None:
        options["min_limit"] = min(initial, 20)
    return Gradient2Limit(**options)


def build_shedder(name: str, route: RouteConfig, clock: Clock) -> LoadShedder | None:
    config = route.shedding
    if config is None:
        return None
    limiter: AdaptiveLimiter | QueueingTimeAdmission | None = None
    if config.algorithm == "dagor":
        limiter = QueueingTimeAdmission(
            name=f"gateway:{name}", threshold=config.queue_threshold, clock=clock
        )
    elif config.algorithm is not None:
        limit = _limit(config.algorithm, config.limit, config.max_limit)
        limiter = AdaptiveLimiter(limit, name=f"gateway:{name}", clock=clock)
    return LoadShedder(
        limiter,
        name=f"gateway:{name}",
        max_queue_time=config.max_queue_time,
        retry_after=config.retry_after,
        clock=clock,
    )


class Route:
    """One route's runtime: matcher, upstream, guard, limiter, fallbacks and figures."""

    def __init__(
        self,
        name: str,
        config: RouteConfig,
        *,
        pool: UpstreamPool,
        backup: UpstreamPool | None,
        guard: InboundGuard,
        limiter: RateLimiter[Any] | GlobalLimiter | None,
        cache: LastGood | None,
        stats: RouteStats,
        request_id: str = "X-Request-Id",
    ) -> None:
        self.name = name
        self.config = config
        self.matcher = Matcher.compile(config.match)
        self.pool = pool
        self.backup = backup
        self.guard = guard
        self.guard_reads = guard.wanted_headers
        """The request headers the guard reads (``None``: any): a request with none of them is
        admitted without the guard parsing its headers."""
        self.reads = (self.guard_reads or frozenset()) | PROXY_READS | {request_id.lower()}
        """The request headers the guard (its listed ones) or the proxy reads: a request with
        none of them, the usual one, is told by one test instead of a lookup for each."""
        self.limiter = limiter
        self.global_limit = isinstance(limiter, GlobalLimiter)
        self.key = _key_func(config.rate_limit) if config.rate_limit is not None else None
        own = {request_id.lower(), *(RATE_FIELDS if limiter is not None else ())}
        self.answer_dropped = RESPONSE_DROPPED | own
        """Upstream answer fields the client never sees: hop-by-hop and framing ones, and
        those the route writes itself (the request id, ``RateLimit-*`` with a rate limit)."""
        self._rate_fields: dict[
            tuple[float, float, int], tuple[tuple[tuple[str, str], ...], str]
        ] = {}
        self._rate_last: tuple[Decision | None, tuple[tuple[tuple[str, str], ...], str]] = (
            None,
            ((), ""),
        )
        """The last decision :meth:`rate_fields` was asked about, and its fields: a keyed GCRA
        hands out one immutable decision for its usual case, told by identity (about 1.7 k
        instructions less than the key and table lookup)."""
        self.cache = cache
        self.stats = stats
        fallback = config.fallback
        self.static: Answer | None = static_answer(fallback) if fallback is not None else None
        self.fallback_on = frozenset(fallback.on) if fallback is not None else frozenset()
        self.fallback_order = fallback.order if fallback is not None else ()
        self.strip = config.match.path_prefix if config.strip_prefix else None
        # (read per request: plain attributes, not the pydantic model's slow lookups)
        self.timeout = config.timeout
        self.retry_body_limit = config.retry_body_limit
        self.resource: Resource | None = None
        self.backup_resource: Resource | None = None
        self.call_record = True
        """Whether an outbound call opens its own call record (see ``bind``)."""

    def bind(self, registry: Registry) -> None:
        """Point the route at the registry's (live) resources after a (re)load."""
        config = self.config
        self.resource = registry.get(config.resource) if config.resource else None
        # Only the resource's answering policies (fallback, cache, backup source) note a
        # degradation on the call record: without one, an outbound call need not open its own
        # (the Call's `record`; a degradation would land on the request's record all the same)
        self.call_record = self.resource is not None and len(self.resource.answering()) > 0
        backup = config.fallback.backup if config.fallback is not None else None
        self.backup_resource = (
            registry.get(backup.resource) if backup is not None and backup.resource else None
        )

    def rate_key(
        self, ip: str | None, headers: Mapping[str, str], params: Mapping[str, str]
    ) -> Hashable:
        key = self.key
        return None if key is None else key(ip, headers, params)

    def rate_fields(self, decision: Decision) -> tuple[tuple[tuple[str, str], ...], str]:
        """The ``RateLimit-*`` fields of an admitted answer (what
        :func:`~floodwall.ratelimit.headers.rate_limit_headers` writes, with
        ``RateLimit-Policy``), and the same as the lines of a head (``name: value`` and CRLF
        each), kept per (limit, remaining, reset) seen (a bounded table: a busy route repeats
        a few)."""
        last = self._rate_last
        if decision is last[0]:
            return last[1]
        _, left, reset, _, limit = decision
        key = (limit, left, math.ceil(reset - 1e-9))
        kept = self._rate_fields.get(key)
        if kept is None:
            if len(self._rate_fields) >= RATE_FIELDS_KEPT:
                self._rate_fields.clear()
            window = self.limiter.window if self.limiter is not None else None
            made: tuple[tuple[str, str], ...] = (
                ("RateLimit-Limit", str(limit)),
                ("RateLimit-Remaining", str(max(0, left))),
                ("RateLimit-Reset", str(max(0, key[2]))),
            )
            if window is not None:
                made = (*made, ("RateLimit-Policy", f"{limit};w={max(1, round(window))}"))
            text = "".join(f"{name}: {value}\r\n" for name, value in made)
            kept = self._rate_fields[key] = (made, text)
        self._rate_last = (decision, kept)
        return kept

    def snapshot(self) -> dict[str, Any]:
        resource = self.resource
        entry: dict[str, Any] = {
            "upstream": self.config.upstream,
            "resource": self.config.resource,
            "level": resource.level if resource is not None else None,
            "stats": self.stats.snapshot(),
        }
        if resource is not None:
            breaker = resource.breaker
            if breaker is not None:
                window = breaker.metrics()
                entry["breaker"] = {
                    "state": breaker.state.name,
                    "failure_rate": round(window.failure_rate, 4),
                    "calls": window.calls,
                    "rejected": breaker.rejected,
                }
            bulkhead = resource.bulkhead
            if bulkhead is not None:
                entry["bulkhead"] = {
                    "in_flight": bulkhead.in_flight,
                    "queued": bulkhead.queued,
                    "max_concurrent": bulkhead.options.max_concurrent,
                    "rejected": bulkhead.rejected,
                }
            chaos = resource.chaos
            if chaos is not None:
                entry["chaos"] = {
                    "fault": chaos.fault,
                    "enabled": chaos.options.enabled,
                    "allowed": chaos.allowed,
                    "rate": chaos.options.rate,
                }
            retry = resource.retry
            if retry is not None:
                entry["retry"] = {
                    "retries": retry.retries,
                    "budget_refusals": retry.budget_refusals,
                }
        if self.limiter is not None:
            entry["rate_limit"] = {
                "scope": "global" if self.global_limit else "local",
                "rejected": self.limiter.rejected,
                "limit": self.limiter.limit,
            }
        shedder = self.guard.shedder
        if shedder is not None:
            stats = shedder.stats()
            limiter = shedder.limiter
            entry["shedding"] = {
                "shed": stats.shed,
                "in_flight": stats.inflight,
                "limit": limiter.limit if isinstance(limiter, AdaptiveLimiter) else None,
                "level": (
                    list(limiter.level) if isinstance(limiter, QueueingTimeAdmission) else None
                ),
            }
        if self.cache is not None:
            entry["cache"] = {
                "entries": len(self.cache),
                "bytes": self.cache.bytes,
                "hits": self.cache.hits,
            }
        return entry


def _trusted_priority(
    trusted: Callable[[str | None], bool], anyone: bool
) -> Callable[[Inbound], tuple[int, int] | None]:
    """DAGOR priority from ``X-Request-Priority``, believed from trusted proxies only
    (``anyone``: whether any proxy is trusted; else no priority, and no header to read)."""
    if not anyone:
        return no_priority  # (no proxy is trusted to send one: the header is not read)

    def priority(request: Inbound) -> tuple[int, int] | None:
        if not trusted(request.client):
            return None
        return parse_level(request.headers.get("x-request-priority"))

    priority.headers = ("x-request-priority",)  # type: ignore[attr-defined]
    return priority


def build_route(
    index: int,
    name: str,
    config: RouteConfig,
    doc: GatewayDocument,
    *,
    pools: Mapping[str, UpstreamPool],
    previous: Route | None,
    registry: Registry,
    trusted: Callable[[str | None], bool],
    clock: Clock,
) -> Route:
    """Build route ``index``; keep ``previous``'s limiter, shedder, cache and figures where
    their configuration did not change (a reload must not reset a rate limit)."""
    prev = previous
    if prev is not None and prev.config.rate_limit == config.rate_limit and prev.limiter:
        limiter: RateLimiter[Any] | GlobalLimiter | None = prev.limiter
    elif config.rate_limit is not None:
        limiter = build_limiter_for(name, config.rate_limit, doc, clock)
    else:
        limiter = None
    if prev is not None and prev.config.shedding == config.shedding:
        shedder = prev.guard.shedder
    else:
        shedder = build_shedder(name, config, clock)
    fallback = config.fallback
    cache_config = fallback.cache if fallback is not None else None
    prev_cache = prev.cache if prev is not None else None
    if prev_cache is not None and cache_config == prev_cache.config:
        cache: LastGood | None = prev_cache
    else:
        cache = LastGood(cache_config) if cache_config is not None else None
    timeout = config.timeout
    max_deadline = doc.proxy.max_deadline
    if timeout is not None:
        max_deadline = min(timeout, max_deadline) if max_deadline is not None else timeout
    guard = InboundGuard(
        shedder=shedder,
        registry=registry,
        deadline=timeout,
        max_deadline=max_deadline,
        priority=_trusted_priority(trusted, bool(doc.proxy.trusted_proxies)),
        rate_limit_headers=False,
        clock=clock,
    )
    backup = fallback.backup if fallback is not None else None
    return Route(
        name,
        config,
        pool=pools[config.upstream],
        backup=pools[backup.upstream] if backup is not None else None,
        guard=guard,
        limiter=limiter,
        cache=cache,
        stats=prev.stats if prev is not None else RouteStats(),
        request_id=doc.proxy.request_id_header,
    )
