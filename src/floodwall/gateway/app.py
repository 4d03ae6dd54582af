"""The gateway process: its proxy (:class:`Gateway`), live reloads, and graceful shutdown.

A :class:`Gateway` is one worker: the routes, upstream pools and registry of one
configuration, the HTTP server in front of them, and the operations the admin API calls
(status, overrides, reload, metrics). :mod:`floodwall.gateway.supervisor` runs one in-process
(``workers: 1``) or spreads N of them over processes sharing the port (``SO_REUSEPORT``).

**Reload** (:meth:`Gateway.reload`): the new document is validated, its resources built
aside, its pools and routes built; only then is anything swapped, in one assignment, so a
request sees either the old configuration or the new one, never a mix, and none is lost.
Unchanged upstream pools keep their connections, outlier and health state; unchanged routes
keep their rate-limit state, shedder, cache and figures; breakers keep their state (the
registry reconfigures them). A bad document raises :class:`~floodwall.ConfigError` and
changes nothing. A changed ``listen`` or ``workers`` is a handover to a new generation of
workers (:mod:`floodwall.gateway.supervisor`); ``admin`` and ``event_loop`` need a restart
(reported, not applied).

**Shutdown** (:meth:`Gateway.stop`): stop accepting, let requests in flight finish (up to
``proxy.shutdown_timeout``), then close the upstream connections.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall.config.registry import Registry
from floodwall.gateway._edge import EdgeRules
from floodwall.gateway._headers import trust_check
from floodwall.gateway._server import BACKLOG, HttpServer, listen_socket
from floodwall.gateway.config import GatewayDocument, parse_gateway_text
from floodwall.gateway.policies import Route, build_route
from floodwall.gateway.proxy import Proxy, Table
from floodwall.gateway.routing import Router
from floodwall.gateway.upstream import UpstreamPool
from floodwall.observe.logs import JsonLogListener
from floodwall.shared.global_limit import GlobalLimiter

__all__ = ["RESTART_KEYS", "Gateway", "exposed_admin"]

log = logging.getLogger("floodwall.gateway")

RESTART_KEYS = ("listen", "workers", "admin", "event_loop")
"""Top-level keys a reload cannot change in a running gateway."""


class Gateway:
    """One worker's proxy over a :class:`GatewayDocument` (see [Gateway][guide-gateway])."""

    def __init__(
        self,
        document: GatewayDocument,
        *,
        text: str | None = None,
        source: str = "<gateway>",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
        log_events: bool = True,
    ) -> None:
        self.document = document
        self.text = text
        self.source = source
        self.clock = clock
        self.listeners = Listeners(listeners)
        """Listeners of every policy's events (nobody by default: the request path then
        builds no event at all)."""
        self.events = Listeners(self.listeners)
        """Listeners of the gateway's own events (reloads, ejections, health, breaker
        changes): logged as JSON lines unless ``log_events=False``."""
        if log_events:
            self.events = Listeners(
                [*self.listeners, JsonLogListener(logging.getLogger("floodwall.gateway.events"))]
            )
        self.registry = Registry(document, clock=clock, listeners=self.listeners)
        self._breaker_states: dict[str, str] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._pools: dict[str, UpstreamPool] = {}
        self._routes: dict[str, Route] = {}
        self.proxy: Proxy | None = None
        self._servers: list[asyncio.Server] = []
        self._web: HttpServer | None = None
        self.port = 0
        self.reloads_applied = 0
        self.reloads_rejected = 0
        self.version = 1
        self._reload_lock = asyncio.Lock()

    # -- building -----------------------------------------------------------------------------

    async def _build_pools(
        self, doc: GatewayDocument
    ) -> tuple[dict[str, UpstreamPool], list[UpstreamPool]]:
        """Pools for ``doc``: unchanged ones kept; the new ones started. Also the old ones to
        drain."""
        pools: dict[str, UpstreamPool] = {}
        for name, config in doc.upstreams.items():
            old = self._pools.get(name)
            if old is not None and old.config == config:
                pools[name] = old
                continue
            if config.tls is not None and not config.tls.verify:
                log.warning(
                    "upstream %s: tls.verify is false, its certificates are not checked", name
                )
            pool = UpstreamPool(name, config, clock=self.clock, listeners=self.events)
            await pool.start()
            pools[name] = pool
        retired = [p for name, p in self._pools.items() if pools.get(name) is not p]
        return pools, retired

    def _build_routes(
        self, doc: GatewayDocument, pools: dict[str, UpstreamPool]
    ) -> tuple[dict[str, Route], Table]:
        trusted = trust_check(doc.proxy.trusted_proxies)
        routes: dict[str, Route] = {}
        for index, (config, name) in enumerate(zip(doc.routes, doc.route_names(), strict=True)):
            try:
                routes[name] = build_route(
                    index,
                    name,
                    config,
                    doc,
                    pools=pools,
                    previous=self._routes.get(name),
                    registry=self.registry,
                    trusted=trusted,
                    clock=self.clock,
                )
            except (ConfigError, ValueError) as exc:
                raise ConfigError(f"routes[{index}] ({name}): {exc}") from None
        router: Router[Route] = Router([(r.matcher, r) for r in routes.values()])
        table = Table(
            router=router,
            limits=doc.limits,
            proxy=doc.proxy,
            trusted=trusted,
            request_id=doc.proxy.request_id_header,
        )
        return routes, table

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, sock: socket.socket | Sequence[socket.socket] | None = None) -> None:
        """Build everything and start serving on ``sock`` (one listening socket or several;
        default: bind ``listen``). The sockets are the gateway's: :meth:`stop` closes them
        (hand it duplicates of sockets that must outlive it)."""
        doc = self.document
        pools, _ = await self._build_pools(doc)
        try:
            routes, table = self._build_routes(doc, pools)
        except ConfigError:
            await asyncio.gather(*(pool.close() for pool in pools.values()))
            raise
        for route in routes.values():
            route.bind(self.registry)
        self._pools, self._routes = pools, routes
        self.proxy = Proxy(table, clock=self.clock)
        limits = doc.limits
        self._web = HttpServer(
            self.proxy.handle,
            rules=EdgeRules(doc.edge),
            head_timeout=limits.header_timeout,
            keepalive_timeout=limits.keepalive_timeout,
            max_line=limits.max_line,
            max_field=limits.max_line,
            max_headers=limits.max_headers,
        )
        if sock is None:
            host, port = doc.listen
            sock = listen_socket(host, port, reuse_port=True)
        socks = [sock] if isinstance(sock, socket.socket) else list(sock)
        loop = asyncio.get_running_loop()
        for each in socks:
            server = await loop.create_server(self._web, sock=each, backlog=BACKLOG)
            self._servers.append(server)  # (the backlog: create_server listens again, at 100)
        if self.events:
            self._watcher = loop.create_task(self._watch_breakers(), name="floodwall-breakers")
        address = socks[0].getsockname()
        self.port = address[1]
        log.info("gateway listening on %s:%d (%d routes)", address[0], self.port, len(routes))
        exposed = exposed_admin(doc)
        if exposed is not None:
            log.warning("%s", exposed)

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, finish requests in flight (up to ``timeout``), close upstreams."""
        if grace is None:
            grace = self.document.proxy.shutdown_timeout
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        for server in self._servers:
            server.close()
        if self._web is not None:
            await self._web.shutdown(grace)
        for server in self._servers:
            await server.wait_closed()
        self._servers = []
        await asyncio.gather(*(pool.close() for pool in self._pools.values()))
        await asyncio.gather(*(_close_limiter(r) for r in self._routes.values()))

    # -- reloading ------------------------------------------------------------------------------

    async def reload(self, text: str, source: str = "<reload>") -> dict[str, Any]:
        """Apply the document in ``text`` (see [Gateway][guide-gateway]); ``ConfigError`` if bad."""
        async with self._reload_lock:
            try:
                doc = parse_gateway_text(text, source)
                Registry(doc, metrics=False)  # every resource builds, or nothing changes
            except ConfigError as exc:
                self._rejected(source, exc)
                raise
            pools, retired = await self._build_pools(doc)
            try:
                routes, table = self._build_routes(doc, pools)
                self.registry.reload(doc, source)
            except (ConfigError, ValueError) as exc:
                for name, pool in pools.items():
                    if self._pools.get(name) is not pool:
                        await pool.close()
                error = exc if isinstance(exc, ConfigError) else ConfigError(f"{source}: {exc}")
                self._rejected(source, error)
                raise error from None
            for route in routes.values():
                route.bind(self.registry)
            restart = [k for k in RESTART_KEYS if getattr(doc, k) != getattr(self.document, k)]
            old_routes = self._routes
            self._pools, self._routes = pools, routes
            assert self.proxy is not None
            self.proxy.table = table
            if self._web is not None:
                self._web.rules = EdgeRules(doc.edge)
            self.document, self.text, self.source = doc, text, source
            self.version += 1
            self.reloads_applied += 1
            for pool in retired:
                asyncio.get_running_loop().create_task(pool.close(drain=grace(doc)))
            for name, route in old_routes.items():
                if routes.get(name) is None or routes[name].limiter is not route.limiter:
                    asyncio.get_running_loop().create_task(_close_limiter(route))
            self._emit(
                "gateway_reloaded", f"{source}: version {self.version}, {len(routes)} routes"
            )
            return {"applied": True, "version": self.version, "restart_required": restart}

    def _rejected(self, source: str, exc: ConfigError) -> None:
        self.reloads_rejected += 1
        log.warning("configuration %s refused, the running one is kept: %s", source, exc)
        self._emit("gateway_reload_rejected", str(exc))

    def _emit(self, kind: str, reason: str) -> None:
        if self.events:
            self.events.emit(Event(kind, "gateway", "gateway", self.clock.monotonic(), reason))

    async def _watch_breakers(self) -> None:
        """Report breaker state changes as events, once a second (polling keeps the request
        path free of listeners)."""
        while True:
            for resource in self.registry:
                breaker = resource.breaker
                if breaker is None:
                    continue
                state = breaker.state.name
                before = self._breaker_states.get(resource.name, "CLOSED")
                if state != before:
                    self._emit("breaker_state", f"{resource.name}: {before} -> {state}")
                self._breaker_states[resource.name] = state
            await self.clock.async_sleep(1.0)

    # -- operators -----------------------------------------------------------------------------

    def override(
        self, action: str, target: str, ttl: float | None = None, reason: str = ""
    ) -> None:
        """``force_open`` / ``force_closed`` / ``clear`` a resource's breaker (a route name
        also works: its resource), ``shed`` / ``restore`` a dependency level (``"2"``), or
        ``chaos_on`` / ``chaos_off`` a resource's ``chaos`` section (until the next reload,
        which takes the file's switch again; on only where chaos is allowed)."""
        registry = self.registry
        if action in ("chaos_on", "chaos_off"):
            self._chaos(action == "chaos_on", target, ttl)
            return
        if action in ("shed", "restore"):
            level = _level(target)
            if action == "shed":
                registry.shed(level, ttl=ttl, reason=reason)
            else:
                registry.clear(f"level:{level}")
            return
        name = self._resource_name(target)
        if action == "force_open":
            registry.force_open(name, ttl=ttl, reason=reason)
        elif action == "force_closed":
            registry.force_closed(name, ttl=ttl, reason=reason)
        elif action == "clear":
            registry.clear(name)
            breaker = registry.get(name).breaker
            if breaker is not None:
                breaker.reset("cleared by operator")
        else:
            raise ConfigError(f"unknown action {action!r}")

    def _chaos(self, on: bool, target: str, ttl: float | None) -> None:
        if ttl is not None:
            raise ConfigError("a chaos switch takes no ttl: turn it off with DELETE /chaos/NAME")
        name = self._resource_name(target)
        chaos = self.registry.get(name).chaos
        if chaos is None:
            raise ConfigError(f"resources.{name} has no chaos section to switch")
        if on:
            chaos.enable()  # ConfigError when this process does not allow chaos
        else:
            chaos.disable()

    def _resource_name(self, target: str) -> str:
        route = self._routes.get(target)
        if route is not None:
            if route.config.resource is None:
                raise ConfigError(f"route {target!r} has no resource (no breaker, no chaos)")
            return route.config.resource
        if target in self.registry.names():
            return target
        known = ", ".join(sorted({*self._routes, *self.registry.names()})) or "none"
        raise ConfigError(f"no route or resource named {target!r} (known: {known})")

    # -- observing -----------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        return list(self._routes.values())

    def pools(self) -> dict[str, UpstreamPool]:
        return dict(self._pools)

    def status(self) -> dict[str, Any]:
        """Every route, upstream, breaker and limiter, live (the admin API's ``/status``).

        Each route and each upstream says what the upstream did (``dependency``: requests by
        outcome) apart from what clients got (``answers``: answer, fallback, error); an
        upstream's are its routes' summed, and its ``tries`` count every try sent to its
        endpoints (retries included) and those that failed."""
        registry = self.registry
        routes = {name: route.snapshot() for name, route in self._routes.items()}
        upstreams = {name: pool.snapshot() for name, pool in self._pools.items()}
        for entry in upstreams.values():
            entry["dependency"], entry["answers"] = {}, {}
            entry["tries"] = {
                "requests": sum(e["requests"] for e in entry["endpoints"]),
                "failures": sum(e["failures"] for e in entry["endpoints"]),
            }
        for route in routes.values():
            upstream = upstreams.get(route["upstream"])
            if upstream is not None:
                for part in ("dependency", "answers"):
                    totals = upstream[part]
                    for key, count in route["stats"][part].items():
                        totals[key] = totals.get(key, 0) + count
        return {
            "version": self.version,
            "source": self.source,
            "requests": self.proxy.requests if self.proxy is not None else 0,
            "in_flight": self.proxy.in_flight if self.proxy is not None else 0,
            "routes": routes,
            "upstreams": upstreams,
            "resources": registry.snapshot(),
            "shed_levels": [level for level in (2, 3) if registry.is_shed(level)],
            "overrides": [
                {"target": o.target, "action": o.action, "reason": o.reason}
                for o in registry.overrides()
            ],
            "reloads": {"applied": self.reloads_applied, "rejected": self.reloads_rejected},
        }

    def metrics(self) -> str:
        from floodwall.gateway.metrics import render

        return render(self)


def exposed_admin(doc: GatewayDocument) -> str | None:
    """The warning due when the admin listener is not on a loopback address, or ``None``:
    reloads, overrides and chaos switches then stand behind the token alone."""
    if doc.admin is None:
        return None
    host, port = doc.admin.listen
    if host == "localhost" or ipaddress.ip_address(host).is_loopback:
        return None
    where = "every interface" if ipaddress.ip_address(host).is_unspecified else host
    return (
        f"admin.listen {host}:{port} is not a loopback address: the admin API (reload, "
        f"overrides, chaos) is reachable on {where}, behind its token alone; prefer "
        "127.0.0.1 and a tunnel, or a firewall"
    )


def grace(doc: GatewayDocument) -> float:
    return doc.proxy.shutdown_timeout


def _level(target: str) -> int:
    try:
        level = int(target.removeprefix("level:"))
    except ValueError:
        raise ConfigError(f"a level is 2 or 3, got {target!r}") from None
    return level


async def _close_limiter(route: Route) -> None:
    limiter = route.limiter
    if isinstance(limiter, GlobalLimiter):
        try:
            await limiter.aclose()
        except Exception as exc:  # noqa: BLE001 - closing must never fail a reload or a stop
            log.debug("closing the limiter of %s: %r", route.name, exc)
