"""Upstreams: endpoints, load balancing, active health checks and passive outlier detection.

An :class:`UpstreamPool` is one service's endpoints behind one connection pool
(:class:`~floodwall.gateway._client.ConnectionPool`: keep-alive HTTP/1.1 with limits). Each
request asks :meth:`UpstreamPool.pick` for an endpoint among the *available* ones (healthy by
the active checks and not ejected by outlier detection) and reports how it went with
:meth:`UpstreamPool.report`.

* **Balancing**: ``round_robin``, or ``least_request``: the power of two choices (Mitzenmacher
  2001; Envoy's default): two distinct endpoints drawn at random, the one with fewer requests
  in flight wins. It needs no global scan and avoids the herd that "always the least loaded"
  causes when many balancers share stale figures. A retry avoids every endpoint the request
  already tried while another one is available (Envoy's ``previous_hosts`` predicate).
* **Every outcome counts** (:meth:`UpstreamPool.report`): an answer by its status, and each
  gateway failure by its reason (:data:`FAILURE_REASONS`: a try that ran out of time, a
  connection refused or not opened, a connection reset after the request went out, an answer
  that broke the protocol). Each endpoint keeps its counts by reason and its current run of
  failures, which ``/status``, the dashboard and the metrics show.
* **Outlier detection** (:class:`OutlierDetector`, pure, Envoy's semantics): consecutive 5xx,
  or consecutive gateway failures (timeouts, connect errors, resets, invalid answers,
  502/503/504: Envoy's ``consecutive_gateway_failure``), eject an endpoint
  for ``base × n`` seconds, ``n`` the times it was ejected (capped; ``n`` decays by one per
  ``base`` seconds without ejection), never more than ``max_ejection_share`` of the pool (at
  least one of two or more). Back from an ejection, an endpoint is on probation until it
  answers below 500: :meth:`UpstreamPool.pick` gives it one request at a time, and a failure
  ejects it again at once, for as long as the last time (nginx's probe of a server back from
  ``fail_timeout``). It is the
  per-endpoint breaker: the route's own breaker sees the upstream as a whole.
* **Active health checks** (:class:`HealthTracker`, pure thresholds; the pool's task sends the
  probes): ``unhealthy_threshold`` failed probes in a row mark an endpoint down,
  ``healthy_threshold`` good ones bring it back. Without health checks every endpoint is
  healthy.

When no endpoint is available the pool answers ``None`` and the proxy fails fast (503, or the
route's fallback) instead of queueing requests on a dead service.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from yarl import URL

from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.events import Event, EventListener, Listeners
from floodwall.gateway._client import ConnectionPool, Origin, UpstreamResponse
from floodwall.gateway.config import HealthCheckConfig, OutlierConfig, UpstreamConfig

__all__ = [
    "FAILURE_REASONS",
    "GATEWAY_FAILURE_STATUSES",
    "Endpoint",
    "HealthTracker",
    "OutlierDetector",
    "UpstreamPool",
    "endpoint_state",
]

GATEWAY_FAILURE_STATUSES = frozenset({502, 503, 504})
"""Upstream answers that count as gateway failures (with connect errors and timeouts)."""

FAILURE_REASONS = ("timeout", "connect", "reset", "protocol", "5xx")
"""Why a try failed, as each endpoint counts it: ``timeout`` (no answer head within the try's
time: the per-try timeout, ``read_timeout`` or the request's deadline; or no body byte within
``read_timeout``), ``connect`` (no connection: refused, unreachable, TLS, ``connect_timeout``),
``reset`` (the connection broke after the request went out, before the answer's body ended),
``protocol`` (an answer that is not valid HTTP/1.1) and ``5xx``
(an answer with a 5xx status). All but ``5xx`` are gateway failures; so are 502, 503 and 504."""

_INF = math.inf


class Endpoint:
    """One endpoint of a pool and its live figures."""

    __slots__ = (
        "authority",
        "base",
        "failures",
        "healthy",
        "host",
        "host_field",
        "in_flight",
        "index",
        "last_failure",
        "origin",
        "port",
        "reasons",
        "requests",
        "streak",
        "url",
    )

    def __init__(self, index: int, url: str) -> None:
        parsed = URL(url)
        self.index = index
        self.url = url
        self.base = url.rstrip("/")
        self.host = parsed.host or ""
        self.port = parsed.port
        self.authority = parsed.raw_authority
        self.host_field = ("Host", self.authority)
        """The ``Host`` field of a request to it (made once: the proxy sends it per try)."""
        self.origin = Origin(self.host, parsed.port or 80, parsed.scheme == "https")
        self.in_flight = 0
        self.requests = 0
        self.failures = 0
        self.reasons = dict.fromkeys(FAILURE_REASONS, 0)
        """Failures by reason (:data:`FAILURE_REASONS`)."""
        self.streak = 0
        """Failures in a row since its last answer below 500."""
        self.last_failure: str | None = None
        self.healthy = True

    def __repr__(self) -> str:
        return f"Endpoint({self.url!r}, in_flight={self.in_flight})"


# -- outlier detection (pure) -------------------------------------------------------------------


@dataclass(slots=True)
class _Outlier:
    consecutive_5xx: int = 0
    consecutive_gateway: int = 0
    times: int = 0
    until: float = -_INF
    last_ejected: float = -_INF
    probation: bool = False
    """Ejected, and no answer below 500 since: one more failure ejects it again."""


class OutlierDetector:
    """Passive outlier detection over ``size`` endpoints (see [Gateway][guide-gateway]).

    Pure: every method takes ``now``; :meth:`record` returns the reason when it ejects.
    """

    def __init__(self, size: int, config: OutlierConfig) -> None:
        self.size = size
        self.config = config
        self._state = [_Outlier() for _ in range(size)]
        share = math.floor(config.max_ejection_share * size + 1e-9)
        self.max_ejected = 0 if size < 2 or config.max_ejection_share == 0 else max(1, share)
        """Endpoints that may be ejected at once."""
        self.ejections = 0
        self.probing = 0
        """Endpoints on probation (see :meth:`on_probation`)."""

    def ejected(self, index: int, now: float) -> bool:
        return self._state[index].until > now

    def ejected_count(self, now: float) -> int:
        return sum(1 for s in self._state if s.until > now)

    def until(self, index: int) -> float:
        """When ``index``'s current (or last) ejection ends."""
        return self._state[index].until

    def on_probation(self, index: int) -> bool:
        """Whether ``index`` was ejected and has not answered below 500 since: back from its
        ejection, its next failure ejects it again at once (nginx's ``max_fails`` probe: a
        server still failing when its ``fail_timeout`` ends is out again after one request)."""
        return self._state[index].probation

    def answered(self, index: int) -> None:
        """:meth:`record` of an answer below 500: both runs of failures and the probation end
        (no clock read)."""
        state = self._state[index]
        state.consecutive_5xx = 0
        state.consecutive_gateway = 0
        if state.probation:
            state.probation = False
            self.probing -= 1

    def record(self, index: int, now: float, status: int | None) -> str | None:
        """Count one answer (``status``) or gateway failure (``None``) of ``index``; the reason
        if this ejects it."""
        state = self._state[index]
        if status is not None and status < 500:
            self.answered(index)
            return None
        gateway = status is None or status in GATEWAY_FAILURE_STATUSES
        state.consecutive_5xx += 1
        state.consecutive_gateway = state.consecutive_gateway + 1 if gateway else 0
        config = self.config
        grow = True
        if state.probation and state.until <= now:
            why, grow = "failed again after its ejection", False
        elif state.consecutive_gateway >= config.consecutive_gateway_failures:
            why = f"{state.consecutive_gateway} consecutive gateway failures"
        elif state.consecutive_5xx >= config.consecutive_5xx:
            why = f"{state.consecutive_5xx} consecutive 5xx answers"
        else:
            return None
        if state.until > now or self.ejected_count(now) >= self.max_ejected:
            return None
        return self._eject(state, now, why, grow)

    def _eject(self, state: _Outlier, now: float, why: str, grow: bool) -> str:
        """Eject for ``base × n``; ``grow``: ``n`` counts this ejection (not when the endpoint
        failed its probation: it is out again for as long as the last time, nginx's
        ``fail_timeout``, so a healed endpoint is not kept out longer for its first request)."""
        config = self.config
        base = config.base_ejection_time
        if state.last_ejected > -_INF:
            quiet = max(0.0, now - max(state.until, state.last_ejected))
            state.times = max(0, state.times - int(quiet // base))
        state.times = state.times + 1 if grow else max(1, state.times)
        duration = min(base * state.times, config.max_ejection_time)
        state.until = now + duration
        state.last_ejected = now
        state.consecutive_5xx = 0
        state.consecutive_gateway = 0
        if not state.probation:
            state.probation = True
            self.probing += 1
        self.ejections += 1
        return f"{why}: ejected for {duration:g}s (ejection #{state.times})"

    def next_return(self, now: float) -> float:
        """The earliest end of an ejection still in force (``inf`` when none)."""
        return min((s.until for s in self._state if s.until > now), default=_INF)


# -- active health checks (pure thresholds) ---------------------------------------------------


class HealthTracker:
    """Healthy/unhealthy per endpoint from probe results, with thresholds (hysteresis)."""

    def __init__(self, size: int, config: HealthCheckConfig) -> None:
        self.config = config
        self.healthy = [True] * size
        self._streak = [0] * size

    def record(self, index: int, ok: bool) -> bool | None:
        """Count one probe; the new health when it changed, else ``None``."""
        healthy = self.healthy[index]
        if ok == healthy:
            self._streak[index] = 0
            return None
        self._streak[index] += 1
        needed = self.config.healthy_threshold if ok else self.config.unhealthy_threshold
        if self._streak[index] < needed:
            return None
        self._streak[index] = 0
        self.healthy[index] = ok
        return ok

    def probe_ok(self, status: int | None) -> bool:
        if status is None:
            return False
        expect = self.config.expect
        return status in expect if expect else status < 500


# -- the pool --------------------------------------------------------------------------------


class UpstreamPool:
    """One upstream's endpoints, balancer, outlier detection, health checks and connections.

    ``start()`` (in the event loop that will use it) opens the session and starts the probes;
    ``close()`` stops them and closes the connections. ``rng`` and ``clock`` are injected.
    """

    def __init__(
        self,
        name: str,
        config: UpstreamConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = name
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random()
        self.listeners = Listeners(listeners)
        self.endpoints = [Endpoint(i, url) for i, url in enumerate(config.endpoints)]
        self.outliers = (
            OutlierDetector(len(self.endpoints), config.outlier_detection)
            if config.outlier_detection is not None
            else None
        )
        self.health = (
            HealthTracker(len(self.endpoints), config.health_check)
            if config.health_check is not None
            else None
        )
        self.least_request = config.balance == "least_request"
        # (read per request: plain attributes, not the pydantic model's slow lookups)
        self.read_timeout = config.read_timeout
        self.client_host = config.host_header == "client"
        """Whether requests carry the client's ``Host`` (else the endpoint's)."""
        self._rr = itertools.count()
        self._all = tuple(self.endpoints)
        self._available: tuple[Endpoint, ...] = self._all
        self._recheck_at = _INF
        self.sole: Endpoint | None = None
        """What :meth:`pick` gives whatever it is asked while it is the one endpoint available
        and nothing is ejected nor due back (else ``None``): the proxy reads it first, no call
        per try for a pool of one."""
        self._set_sole()
        self.client: ConnectionPool | None = None
        self._probes: asyncio.Task[None] | None = None
        self.retries_elsewhere = 0
        """Tries the proxy sent to another endpoint after a gateway failure, past the retry
        policy's own time rule (see :mod:`floodwall.gateway.proxy`)."""

    # -- choosing ------------------------------------------------------------------------------

    def available(self, now: float) -> tuple[Endpoint, ...]:
        """Endpoints that may take a request now (healthy and not ejected)."""
        if now >= self._recheck_at:
            self._refresh(now)
        return self._available

    def _set_sole(self) -> None:
        available = self._available
        single = len(available) == 1 and self._recheck_at == _INF
        self.sole = available[0] if single else None

    def _refresh(self, now: float) -> None:
        outliers = self.outliers
        before = self._available
        self._available = tuple(
            e
            for e in self._all
            if e.healthy and (outliers is None or not outliers.ejected(e.index, now))
        )
        self._recheck_at = outliers.next_return(now) if outliers is not None else _INF
        self._set_sole()
        if self.listeners:
            for endpoint in self._available:
                if endpoint not in before:
                    self._emit("returned", endpoint, "back in the pool", now)

    def pick(self, avoid: Endpoint | Collection[Endpoint] | None = None) -> Endpoint | None:
        """An endpoint for the next request: not one of ``avoid`` (the endpoints a request
        already tried) while another one is available."""
        recheck = self._recheck_at
        if recheck == _INF:  # nothing ejected nor due back: no clock read (the usual case)
            candidates = self._available
        else:
            now = self.clock.monotonic()
            candidates = self._available if now < recheck else self.available(now)
        count = len(candidates)
        if count == 0:
            return None
        if count == 1:
            return candidates[0]
        outliers = self.outliers
        if outliers is not None and outliers.probing:  # one request at a time on probation
            ready = tuple(
                e for e in candidates if not (e.in_flight and outliers.on_probation(e.index))
            )
            if ready:
                candidates, count = ready, len(ready)
                if count == 1:
                    return candidates[0]
        if avoid:  # (a first try's empty list costs nothing)
            tried = (avoid,) if isinstance(avoid, Endpoint) else avoid
            fresh = tuple(e for e in candidates if e not in tried)
            if fresh:
                candidates, count = fresh, len(fresh)
                if count == 1:
                    return candidates[0]
        if not self.least_request:
            return candidates[next(self._rr) % count]
        first, second = self.rng.sample(candidates, 2)
        return second if second.in_flight < first.in_flight else first

    def untried(self, tried: Collection[Endpoint]) -> bool:
        """Whether an available endpoint is not in ``tried``."""
        return any(e not in tried for e in self.available(self.clock.monotonic()))

    # -- outcomes ------------------------------------------------------------------------------

    def report(
        self,
        endpoint: Endpoint,
        status: int | None,
        reason: str = "connect",
        *,
        counted: bool = False,
    ) -> None:
        """How a try on ``endpoint`` went: its answer's ``status``, or ``None`` for a gateway
        failure with its ``reason`` (one of :data:`FAILURE_REASONS`). ``counted``: the try was
        counted in :attr:`Endpoint.requests` when its answer's head came, and this is how its
        body ended (an answer below 500 ends a run of failures only once its body is whole)."""
        if not counted:
            endpoint.requests += 1
        outliers = self.outliers
        if status is None or status >= 500:
            kind = "5xx" if status is not None else reason
            endpoint.failures += 1
            endpoint.reasons[kind] += 1
            endpoint.streak += 1
            endpoint.last_failure = kind
        else:
            if endpoint.streak:  # (the detector's runs count the failures reported here: they
                endpoint.streak = 0  # are 0 when the streak is, and the usual answer no call)
                if outliers is not None:  # (OutlierDetector.record of an answer below 500)
                    outliers.answered(endpoint.index)
            return
        if outliers is None:
            return
        now = self.clock.monotonic()
        why = outliers.record(endpoint.index, now, status)
        if why is not None:
            self._refresh(now)
            self._emit("ejected", endpoint, why, now)

    def _set_health(self, endpoint: Endpoint, healthy: bool) -> None:
        endpoint.healthy = healthy
        now = self.clock.monotonic()
        self._refresh(now)
        what = "healthy" if healthy else "unhealthy"
        self._emit(what, endpoint, f"active health check: {what}", now)

    def _emit(self, kind: str, endpoint: Endpoint, reason: str, now: float) -> None:
        if self.listeners:
            self.listeners.emit(
                Event(kind, "upstream", f"{self.name}/{endpoint.authority}", now, reason)
            )

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        tls = config.tls
        self.client = ConnectionPool(
            limit=config.max_connections,
            limit_per_origin=config.max_connections_per_endpoint,
            keepalive=config.keepalive,
            connect_timeout=config.connect_timeout,
            ssl_context=tls.context if tls is not None else None,
            server_name=tls.server_name if tls is not None else None,
        )
        if self.health is not None:
            self._probes = asyncio.get_running_loop().create_task(
                self._probe_forever(), name=f"floodwall-health-{self.name}"
            )

    async def _probe_forever(self) -> None:
        health = self.health
        assert health is not None
        interval = health.config.interval
        while True:
            await asyncio.gather(*(self._probe(e) for e in self.endpoints))
            await self.clock.async_sleep(interval)

    async def _probe(self, endpoint: Endpoint) -> None:
        health = self.health
        assert health is not None
        assert self.client is not None
        status: int | None = None
        answer: UpstreamResponse | None = None
        fields = [("Host", endpoint.authority), ("User-Agent", "floodwall-health-check")]
        try:
            async with asyncio.timeout(health.config.timeout):
                answer = await self.client.request(
                    endpoint.origin, "GET", health.config.path, fields, None
                )
                status = answer.status
        except (OSError, TimeoutError):  # (the client's errors are OSError too)
            status = None
        finally:
            if answer is not None:
                answer.release()
        changed = health.record(endpoint.index, health.probe_ok(status))
        if changed is not None:
            self._set_health(endpoint, changed)

    @property
    def in_flight(self) -> int:
        return sum(e.in_flight for e in self.endpoints)

    async def close(self, drain: float = 0.0) -> None:
        """Stop probing, wait up to ``drain`` seconds for requests in flight, then close."""
        if self._probes is not None:
            self._probes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probes
            self._probes = None
        waited = 0.0
        while self.in_flight and waited < drain:
            await asyncio.sleep(0.05)
            waited += 0.05
        if self.client is not None:
            await self.client.close()
            self.client = None

    # -- observing -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        now = self.clock.monotonic()
        outliers = self.outliers
        endpoints = []
        for e in self.endpoints:
            until = outliers.until(e.index) if outliers is not None else -_INF
            ejected = until > now
            endpoints.append(
                {
                    "url": e.url,
                    "state": endpoint_state(e.healthy, ejected, e.streak),
                    "healthy": e.healthy,
                    "ejected": ejected,
                    "ejected_for": round(until - now, 3) if ejected else 0.0,
                    "in_flight": e.in_flight,
                    "requests": e.requests,
                    "failures": e.failures,
                    "failures_by_reason": dict(e.reasons),
                    "consecutive_failures": e.streak,
                    "last_failure": e.last_failure,
                }
            )
        return {
            "balance": self.config.balance,
            "endpoints": endpoints,
            "available": len(self.available(now)),
            "ejections": outliers.ejections if outliers is not None else 0,
            "retries_elsewhere": self.retries_elsewhere,
        }


def endpoint_state(healthy: bool, ejected: bool, streak: int) -> str:
    """One word for an endpoint: ``ejected`` (by outlier detection), ``unhealthy`` (by the
    active checks), ``failing`` (its last try failed, not ejected yet) or ``up``."""
    if ejected:
        return "ejected"
    if not healthy:
        return "unhealthy"
    return "failing" if streak else "up"
