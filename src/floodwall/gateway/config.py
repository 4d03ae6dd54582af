"""The gateway's configuration: the library's document plus listeners, upstreams and routes.

A gateway file is a :class:`floodwall.config.Document` (``defaults``, ``resources``,
``stores``: the same inheritance, level rules and units) with these keys added::

    listen: 0.0.0.0:8080
    workers: 1
    admin: {listen: 127.0.0.1:9901, token_env: FLOODWALL_ADMIN_TOKEN}
    upstreams:
      product: {endpoints: [http://127.0.0.1:9001, http://127.0.0.1:9002], balance: least_request}
    routes:
      - match: {path_prefix: /api/product}
        upstream: product
        resource: product              # its policies come from `resources`
        rate_limit: {rate: 100/s, burst: 50, key: client_ip, scope: global}
        fallback: {status: 200, json: {gifts: [rose, star]}}

Every model forbids unknown keys, and every error names its path in the file
(``gateway.yaml: routes[1].upstream: no upstream named 'gift' (known: gifts, product)``).
Cross-references (a route's upstream and resource, a backup upstream, a rate limit's store)
are checked when the file is read, never when the first request arrives.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from yarl import URL

from floodwall._core import validate
from floodwall._core.errors import ConfigError
from floodwall.config.loader import _path, inherit, loads
from floodwall.config.schema import Document, RateLimitConfig
from floodwall.config.units import Duration
from floodwall.gateway._tls import ClientTls, build_client_tls

__all__ = [
    "AdminConfig",
    "CacheFallbackConfig",
    "ClientLimits",
    "EdgeConfig",
    "GatewayDocument",
    "HealthCheckConfig",
    "ListenAddress",
    "MatchConfig",
    "OutlierConfig",
    "ProxyConfig",
    "RouteConfig",
    "RouteFallbackConfig",
    "RouteRateLimitConfig",
    "SheddingConfig",
    "SyncConfig",
    "TlsConfig",
    "UpstreamConfig",
    "load_gateway",
    "parse_gateway",
]

KIB = 1024
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _listen(value: object) -> tuple[str, int]:
    """``"host:port"``, ``"[::1]:port"`` or ``":port"`` (all interfaces) as ``(host, port)``."""
    if isinstance(value, list | tuple) and len(value) == 2:
        value = f"{value[0]}:{value[1]}"
    if not isinstance(value, str):
        raise ValueError(f"expected 'host:port', got {value!r}")
    host, colon, port = value.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected 'host:port' with a port in 0..65535, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - ':port' means every interface, by request
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ValueError(
                f"the host must be an IP address or 'localhost', got {host!r}"
            ) from None
    return host, int(port)


ListenAddress = Annotated[tuple[str, int], BeforeValidator(_listen)]
"""``host:port`` read as ``(host, port)``; port 0 lets the kernel pick (tests)."""


def _endpoint(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected an endpoint URL such as 'http://10.0.0.5:8080', got {value!r}")
    url = URL(value)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"expected an http:// or https:// URL with a host, got {value!r}")
    if url.path not in ("", "/") or url.query_string or url.fragment or url.user:
        raise ValueError(
            f"an endpoint is scheme://host:port only (no path, query or user), got {value!r}"
        )
    return f"{url.scheme}://{url.raw_authority}"


Endpoint = Annotated[str, BeforeValidator(_endpoint)]


class HealthCheckConfig(_Model):
    """Active health checks: ``GET path`` every ``interval``; an endpoint turns unhealthy after
    ``unhealthy_threshold`` failed checks in a row and healthy again after
    ``healthy_threshold`` good ones (status below 500 unless ``expect`` lists statuses)."""

    path: str = "/health"
    interval: Duration = Field(5.0, gt=0)
    timeout: Duration = Field(1.0, gt=0)
    healthy_threshold: int = Field(2, ge=1)
    unhealthy_threshold: int = Field(3, ge=1)
    expect: tuple[int, ...] | None = None

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must start with '/', got {value!r}")
        return value


class OutlierConfig(_Model):
    """Passive outlier detection (Envoy's): an endpoint failing ``consecutive_5xx`` tries in a
    row (5xx answers and gateway failures), or ``consecutive_gateway_failures`` in a row (Envoy's
    ``consecutive_gateway_failure``: timeouts, connect errors, resets, invalid answers and
    502/503/504), is ejected for ``base_ejection_time × times ejected`` (capped at
    ``max_ejection_time``); never more than ``max_ejection_share`` of a pool at once (at least
    one endpoint of two or more)."""

    consecutive_5xx: int = Field(5, ge=1)
    consecutive_gateway_failures: int = Field(5, ge=1)
    base_ejection_time: Duration = Field(30.0, gt=0)
    max_ejection_time: Duration = Field(300.0, gt=0)
    max_ejection_share: float = Field(0.5, ge=0, le=1)


def _file(value: Path | None) -> Path | None:
    if value is not None and not value.is_file():
        raise ValueError(f"no such file {str(value)!r}")
    return value


class TlsConfig(_Model):
    """How the gateway connects to an upstream's ``https://`` endpoints.

    ``ca_file``: a PEM bundle of the certificates to trust, instead of the system's (a private
    CA). ``verify: false`` accepts any certificate and any name: unsafe, for tests only.
    ``server_name``: the name sent in SNI and checked against the certificate, instead of the
    endpoint's host (endpoints given by address, certificates issued for a name).
    ``cert_file`` (and ``key_file`` unless the key is in the same file): the client certificate
    presented to upstreams that require one (mTLS); keys must be unencrypted. Relative paths
    are from the gateway's working directory. The files are read when the configuration is
    loaded or reloaded.
    """

    ca_file: Annotated[Path | None, AfterValidator(_file)] = None
    verify: bool = True
    server_name: str | None = Field(None, min_length=1)
    cert_file: Annotated[Path | None, AfterValidator(_file)] = None
    key_file: Annotated[Path | None, AfterValidator(_file)] = None
    _built: ClientTls = PrivateAttr()

    @model_validator(mode="after")
    def _build(self) -> TlsConfig:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError(f"key_file {str(self.key_file)!r} needs a cert_file")
        if not self.verify and self.ca_file is not None:
            raise ValueError("ca_file has no effect with verify: false (drop one of them)")
        self._built = build_client_tls(
            ca_file=self.ca_file,
            verify=self.verify,
            cert_file=self.cert_file,
            key_file=self.key_file,
        )
        return self

    @property
    def context(self) -> ssl.SSLContext:
        """The context built from these settings when they were loaded."""
        return self._built.context


class UpstreamConfig(_Model):
    """A pool of endpoints serving one service."""

    endpoints: tuple[Endpoint, ...] = Field(min_length=1)
    balance: Literal["round_robin", "least_request"] = "round_robin"
    max_connections: int = Field(1000, ge=1)
    """Connections the pool keeps at most (all endpoints); requests beyond wait for one."""
    max_connections_per_endpoint: int = Field(0, ge=0)
    """0: no per-endpoint cap beyond ``max_connections``."""
    connect_timeout: Duration = Field(1.0, gt=0)
    """Seconds to get a connection (from the pool, or a new TCP connect)."""
    read_timeout: Duration = Field(30.0, gt=0)
    """Seconds a try may wait for the answer's head (from its start, getting a connection
    included), then without a byte from the upstream while its answer streams."""
    keepalive: Duration = Field(30.0, gt=0)
    """Seconds an idle pooled connection is kept."""
    host_header: Literal["upstream", "client"] = "upstream"
    """``Host`` sent upstream: the endpoint's host (default) or the client's."""
    health_check: HealthCheckConfig | None = None
    outlier_detection: OutlierConfig | None = OutlierConfig()
    tls: TlsConfig | None = None
    """TLS settings of the ``https://`` endpoints (default: the system's trust store)."""

    @model_validator(mode="before")
    @classmethod
    def _false_is_off(cls, data: object) -> object:
        if isinstance(data, dict):
            return {k: (None if v is False else v) for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _tls_needs_https(self) -> UpstreamConfig:
        if self.tls is not None and not any(e.startswith("https://") for e in self.endpoints):
            raise ValueError(
                f"tls: applies to https:// endpoints, and this upstream has none "
                f"(endpoints: {', '.join(self.endpoints)})"
            )
        return self


def _methods(value: object) -> object:
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple):
        return tuple(str(m).upper() for m in value)
    return value


class MatchConfig(_Model):
    """What a route answers: all given conditions must hold. ``host`` is an exact name or a
    ``*.example.com`` wildcard (without port); ``path_prefix`` is a plain string prefix
    (with ``prefix_boundary: true`` it ends at a segment: ``/api`` then matches ``/api`` and
    ``/api/x`` but not ``/apis``); ``path_regex`` is a full match whose named
    groups are path parameters (``/users/(?P<user>[^/]+)``); ``headers`` must be present with
    these exact values (``"*"``: any value)."""

    host: str | tuple[str, ...] | None = None
    path: str | None = None
    path_prefix: str | None = None
    path_regex: str | None = None
    methods: Annotated[tuple[str, ...] | None, BeforeValidator(_methods)] = None
    headers: dict[str, str] = Field(default_factory=dict)
    prefix_boundary: bool = False

    @model_validator(mode="after")
    def _one_path(self) -> MatchConfig:
        given = [k for k in ("path", "path_prefix", "path_regex") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of path, path_prefix, path_regex, got {given}")
        for key in ("path", "path_prefix"):
            value = getattr(self, key)
            if value is not None and not value.startswith("/"):
                raise ValueError(f"{key} must start with '/', got {value!r}")
        if self.path_regex is not None:
            try:
                re.compile(self.path_regex)
            except re.error as exc:
                raise ValueError(
                    f"path_regex {self.path_regex!r} does not compile: {exc}"
                ) from None
        return self


class RouteRateLimitConfig(RateLimitConfig):
    """A route's rate limit (the library's ``rate_limit`` section, keyed per request).

    ``key``: ``client_ip`` (honours ``proxy.trusted_proxies``), ``header:NAME``,
    ``path:NAME`` (a named group of ``path_regex``) or none (one limit for the route).
    ``scope: global`` keeps the state in ``stores[store]`` (Redis for several gateways);
    ``expected_instances`` and ``on_store_error`` say how to limit when that store is down.
    """

    expected_instances: int = Field(1, ge=1)
    on_store_error: Literal["local", "fail_open", "fail_closed"] = "local"

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        if value in (None, "client_ip", "ip"):
            return None if value is None else "client_ip"
        for prefix in ("header:", "path:"):
            if value.startswith(prefix) and len(value) > len(prefix):
                return value
        raise ValueError(f"key must be client_ip, header:NAME or path:NAME, got {value!r}")


class CacheFallbackConfig(_Model):
    """The last good answer to each GET, kept ``ttl`` seconds and served when the route fails
    (bounded: ``max_entries`` answers of at most ``max_body`` bytes, ``max_bytes`` in all)."""

    ttl: Duration = Field(300.0, gt=0)
    max_entries: int = Field(1000, ge=1)
    max_body: int = Field(256 * KIB, ge=1)
    max_bytes: int = Field(64 * KIB * KIB, ge=1)
    statuses: tuple[int, ...] = (200,)


class BackupConfig(_Model):
    """A backup upstream, protected by its own ``resource``'s policies."""

    upstream: str
    resource: str | None = None


FALLBACK_KINDS = (
    "circuit_open",
    "bulkhead_full",
    "timeout",
    "degraded",
    "overloaded",
    "upstream_5xx",
    "upstream_unavailable",
)
"""Failures a route's fallback answers by default (never ``rate_limited``: that one is the
client's to slow down)."""


class RouteFallbackConfig(_Model):
    """What a failing route answers: a ``cache`` of last good GETs, a ``backup`` upstream and
    a static answer (``status`` with ``json`` or ``body`` and ``headers``), tried in ``order``;
    ``on`` says which failures they answer."""

    status: int | None = Field(None, ge=100, le=599)
    headers: dict[str, str] = Field(default_factory=dict)
    json_body: Any = Field(None, alias="json")
    body: str | None = None
    cache: CacheFallbackConfig | None = None
    backup: BackupConfig | None = None
    order: tuple[Literal["cache", "backup", "static"], ...] = ("cache", "backup", "static")
    on: tuple[str, ...] = FALLBACK_KINDS

    @model_validator(mode="after")
    def _static(self) -> RouteFallbackConfig:
        if self.json_body is not None and self.body is not None:
            raise ValueError("give json or body, not both")
        if (self.json_body is not None or self.body is not None) and self.status is None:
            object.__setattr__(self, "status", 200)
        if self.status is None and self.cache is None and self.backup is None:
            raise ValueError("a fallback needs a static answer (status/json/body), cache or backup")
        unknown = set(self.on) - {*FALLBACK_KINDS, "upstream_4xx"}
        if unknown:
            raise ValueError(
                f"on: unknown failure kinds {sorted(unknown)}; known: {FALLBACK_KINDS}"
            )
        for name, value in self.headers.items():  # written as they are into every such answer
            if _TOKEN.fullmatch(name) is None:
                raise ValueError(f"headers: {name!r} is not a field name (an RFC 9110 token)")
            if _FIELD_CONTROL.search(value) is not None:
                raise ValueError(f"headers.{name}: control characters in {value!r}")
        return self

    @property
    def static(self) -> bool:
        return self.status is not None


class SheddingConfig(_Model):
    """Adaptive load shedding in front of a route (``floodwall.adaptive.LoadShedder``):
    a concurrency limit found by ``algorithm``, or DAGOR priority admission (``dagor``: fed
    ``X-Request-Start`` and ``X-Request-Priority`` from trusted proxies, answering with
    ``X-Admission-Level``), and/or a queueing-time bound."""

    algorithm: Literal["gradient2", "gradient", "vegas", "aimd", "fixed", "dagor"] | None = (
        "gradient2"
    )
    limit: int | None = Field(None, ge=1)
    """``fixed``: the limit; others: their initial limit."""
    max_limit: int | None = Field(None, ge=1)
    max_queue_time: Duration | None = None
    queue_threshold: Duration = Field(0.020, gt=0)
    """``dagor``: the queueing time above which a window counts as overloaded (20 ms)."""
    retry_after: Duration = 1.0


class RouteConfig(_Model):
    """One route: what it matches and where it sends what it matched."""

    name: str | None = None
    match: MatchConfig = MatchConfig()
    upstream: str
    resource: str | None = None
    timeout: Duration | None = Field(None, gt=0)
    """The whole request's budget (all tries; also caps a client's ``X-Request-Deadline``)."""
    rate_limit: RouteRateLimitConfig | None = None
    fallback: RouteFallbackConfig | None = None
    shedding: SheddingConfig | None = None
    strip_prefix: bool = False
    """Remove ``match.path_prefix`` from the path sent upstream."""
    retry_body_limit: int = Field(64 * KIB, ge=0)
    """Request bodies up to this size are buffered so they can be retried; larger ones stream
    and are sent once."""

    @model_validator(mode="before")
    @classmethod
    def _false_is_off(cls, data: object) -> object:
        if isinstance(data, dict):
            return {k: (None if v is False else v) for k, v in data.items()}
        return data

    def label(self, index: int) -> str:
        """The route's name: ``name``, else its path condition (with host), else its index."""
        if self.name:
            return self.name
        m = self.match
        path = m.path or m.path_prefix or m.path_regex
        host = m.host if isinstance(m.host, str) else (m.host[0] if m.host else None)
        if path is None and host is None:
            return f"route-{index}"
        return f"{host or ''}{path or ''}"


class AdminConfig(_Model):
    """The admin listener (status, overrides, reload, metrics, dashboard): loopback by
    default; every call but ``/healthz`` needs ``Authorization: Bearer <token>``, the token
    read from the environment variable ``token_env`` (at least 16 characters)."""

    listen: ListenAddress = ("127.0.0.1", 9901)
    token_env: str = "FLOODWALL_ADMIN_TOKEN"  # noqa: S105 - a variable's name, not a secret
    dashboard_interval: Duration = Field(1.0, gt=0)


class ClientLimits(_Model):
    """Limits on what clients send, and how slowly (slowloris)."""

    max_line: int = Field(8 * KIB, ge=256)
    """Bytes in the request line or one header line."""
    max_headers: int = Field(100, ge=1)
    max_body: int = Field(10 * KIB * KIB, ge=0)
    """Request body bytes (413 past it); 0 refuses any body."""
    header_timeout: Duration = Field(10.0, gt=0)
    """Seconds a connection may take to send a complete request head (idle keep-alive
    connections are closed after ``keepalive_timeout``)."""
    body_timeout: Duration = Field(10.0, gt=0)
    """Seconds without a byte of a request body being received (408 past it)."""
    keepalive_timeout: Duration = Field(60.0, gt=0)
    write_timeout: Duration = Field(30.0, gt=0)
    """Seconds a client may take to accept one chunk of the answer."""


class ProxyConfig(_Model):
    """How requests are forwarded."""

    trusted_proxies: tuple[str, ...] = ()
    """Peers (addresses or networks) whose ``Forwarded``/``X-Forwarded-*``, ``X-Request-Id``
    and ``X-Request-Priority`` are kept; from anyone else they are replaced."""
    request_id_header: str = "X-Request-Id"
    via: bool = False
    max_deadline: Duration | None = Field(None, gt=0)
    """Cap on a client's ``X-Request-Deadline`` (routes' ``timeout`` also cap it)."""
    error_body_limit: int = Field(64 * KIB, ge=0)
    """Bytes of a failed upstream answer kept to hand back once retries give up."""
    shutdown_timeout: Duration = Field(15.0, ge=0)

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError as exc:
                raise ValueError(f"{item!r} is not an address or network: {exc}") from None
        return value

    @field_validator("request_id_header")
    @classmethod
    def _field_name(cls, value: str) -> str:
        if _TOKEN.fullmatch(value) is None:  # written as it is into every answer's head
            raise ValueError(f"{value!r} is not a field name (an RFC 9110 token)")
        return value


# -- the edge rules (issue 20): kept together, apart from the other sections ---------------------


def _field_value(value: str | None) -> str | None:
    if value is not None and (
        value != value.strip() or any(c < " " or c == "\x7f" for c in value) or not value.isascii()
    ):
        raise ValueError(
            f"must be printable ASCII without control characters or outer spaces, got {value!r}"
        )
    return value


class EdgeConfig(_Model):
    """Rules at the edge, on top of the HTTP parser's (see :mod:`floodwall.gateway._edge`)."""

    max_head: int = Field(32 * KIB, ge=KIB)
    """Bytes of a request head: the request line and every field line (431 past it)."""
    path_parameters: Literal["refuse_dot_segments", "forward"] = "refuse_dot_segments"
    """``refuse_dot_segments``: a path segment that is ``.`` or ``..`` once its ``;parameters``
    are cut (``/api/..;/admin``) is a 400, as Tomcat and Spring would resolve it; ``forward``:
    sent as it came."""
    server_header: Annotated[str | None, AfterValidator(_field_value)] = Field(
        None, min_length=1, max_length=256
    )
    """The ``Server`` field of every answer (the upstream's is replaced); ``None``: none."""


# -- end of the edge rules ---------------------------------------------------------------------


class SyncConfig(_Model):
    """Share configuration and operator overrides between gateways through a store (Redis):
    a reload or override on one gateway's admin API reaches all of them."""

    store: str = "default"
    key: str = "floodwall:gateway"


class GatewayDocument(Document):
    """The gateway file: the library's document plus the gateway's sections."""

    listen: ListenAddress = ("0.0.0.0", 8080)  # noqa: S104 - a gateway listens for its clients
    workers: int = Field(1, ge=1, le=256)
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    admin: AdminConfig | None = AdminConfig()
    upstreams: dict[str, UpstreamConfig] = Field(default_factory=dict)
    routes: tuple[RouteConfig, ...] = ()
    limits: ClientLimits = ClientLimits()
    proxy: ProxyConfig = ProxyConfig()
    edge: EdgeConfig = EdgeConfig()
    sync: SyncConfig | None = None

    @model_validator(mode="after")
    def _references(self) -> GatewayDocument:
        check_references(self)
        return self

    def route_names(self) -> list[str]:
        return route_labels(self.routes)


def route_labels(routes: tuple[RouteConfig, ...]) -> list[str]:
    """Every route's name: its ``name``, else its host and path, made unique by ``#index``."""
    labels: list[str] = []
    for index, route in enumerate(routes):
        label = route.label(index)
        if not route.name and label in labels:
            label = f"{label}#{index}"
        labels.append(label)
    return labels


def _known(names: Any) -> str:
    return ", ".join(sorted(names)) or "none"


def check_references(doc: GatewayDocument) -> None:
    """Every name a route uses must exist (raised as ``ValueError`` naming the route)."""
    names: set[str] = set()
    for index, (route, label) in enumerate(zip(doc.routes, route_labels(doc.routes), strict=True)):
        where = f"routes[{index}]"
        if label in names:
            raise ValueError(f"{where}.name: two routes are named {label!r}")
        names.add(label)
        if route.upstream not in doc.upstreams:
            raise ValueError(
                f"{where}.upstream: no upstream named {route.upstream!r} "
                f"(known: {_known(doc.upstreams)})"
            )
        if route.resource is not None and route.resource not in doc.resources:
            raise ValueError(
                f"{where}.resource: no resource named {route.resource!r} "
                f"(known: {_known(doc.resources)})"
            )
        _check_route_extras(doc, route, where)


def _check_route_extras(doc: GatewayDocument, route: RouteConfig, where: str) -> None:
    limit = route.rate_limit
    if limit is not None:
        if limit.burst is not None and limit.algorithm not in ("gcra", "token_bucket"):
            raise ValueError(
                f"{where}.rate_limit.burst: applies to gcra and token_bucket only, "
                f"not {limit.algorithm}"
            )
        if limit.store not in doc.stores:
            raise ValueError(
                f"{where}.rate_limit.store: no store named {limit.store!r} "
                f"(known: {_known(doc.stores)})"
            )
        if limit.key is not None and limit.key.startswith("path:"):
            group = limit.key[len("path:") :]
            regex = route.match.path_regex
            if regex is None or group not in re.compile(regex).groupindex:
                raise ValueError(
                    f"{where}.rate_limit.key: {limit.key!r} needs a match.path_regex with the "
                    f"named group (?P<{group}>...)"
                )
        if limit.scope == "global" and limit.algorithm in ("sliding_log", "leaky"):
            raise ValueError(
                f"{where}.rate_limit.algorithm: {limit.algorithm!r} has no global form "
                "(use gcra, token_bucket, fixed or sliding)"
            )
    fallback = route.fallback
    if fallback is not None and fallback.backup is not None:
        backup = fallback.backup
        if backup.upstream not in doc.upstreams:
            raise ValueError(
                f"{where}.fallback.backup.upstream: no upstream named {backup.upstream!r} "
                f"(known: {_known(doc.upstreams)})"
            )
        if backup.resource is not None and backup.resource not in doc.resources:
            raise ValueError(
                f"{where}.fallback.backup.resource: no resource named {backup.resource!r} "
                f"(known: {_known(doc.resources)})"
            )
    if doc.sync is not None and doc.sync.store not in doc.stores:
        raise ValueError(
            f"sync.store: no store named {doc.sync.store!r} (known: {_known(doc.stores)})"
        )


def parse_gateway(raw: dict[str, Any], source: str = "<gateway>") -> GatewayDocument:
    """Validate a raw mapping into a :class:`GatewayDocument` (inheritance and level rules
    applied to ``resources`` first); :class:`~floodwall.ConfigError` names the path on error."""
    validate.text("source", source)
    try:
        resolved = inherit(raw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        return GatewayDocument.model_validate(resolved)
    except ValidationError as exc:
        raise _explain(exc, source) from None


def _explain(error: ValidationError, source: str) -> ConfigError:
    """One line per error: ``source: path: message (got value)``; document-level checks name
    their own path in the message."""
    lines = []
    for item in error.errors(include_url=False):
        message = item["msg"].removeprefix("Value error, ")
        got = item.get("input")
        said = (
            isinstance(got, dict) or "got " in message or (got is not None and repr(got) in message)
        )
        shown = "" if said else f" (got {got!r})"
        path = _path(item["loc"])
        lines.append(f"{source}: {path + ': ' if path else ''}{message}{shown}")
    return ConfigError("\n".join(lines))


def parse_gateway_text(text: str, source: str = "<gateway>") -> GatewayDocument:
    """:func:`parse_gateway` from text (YAML, or JSON/TOML by ``source``'s extension)."""
    return parse_gateway(loads(text, source), source)


def load_gateway(path: str | Path) -> tuple[GatewayDocument, str]:
    """Read and validate a gateway file: the document and its text."""
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"path must be a file path, got {path!r}")
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the file: {exc.strerror}") from exc
    return parse_gateway_text(text, source), text
