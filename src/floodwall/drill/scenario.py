"""Drill scenarios as data: mock services, the edge and its routes, load, faults, modes.

A scenario file (YAML or JSON) for ``floodwall drill scenario.yaml``; durations take human
units (``250ms``, ``5s``), rates are requests per second (``150`` or ``"150/s"``)::

    name: product_page
    seed: 1
    warmup: 2s               # skipped by every "before the fault" figure
    drain: 5s                # after the load, wait at most this for work still in flight
    services:                # real aiohttp servers on 127.0.0.1 (free ports unless `port`)
      product: {latency: {lognormal: {median: 50ms, sigma: 0.25}}}
      reviews: {latency: 30ms, error_rate: 0.0, capacity: {concurrency: 50, queue: 100}}
      payments: {latency: 80ms, idempotent: true}      # POSTs go to its ledger
      users: {url: http://127.0.0.1:8101}   # your running service, with a DrillAgent
    edge:                    # the service under test: `local` (built here) or `external`
      workers: 100           # its worker pool (threads of a servlet container) ...
      queue: 200             # ... and accept queue; beyond both: 503 at once
      routes:
        - {path: /product, calls: [product]}
        - {path: /page, calls: [product, price, reviews]}          # fan-out, in parallel
        - {path: /checkout, method: POST, calls: [payments]}        # a write
      client: {timeout: null, retries: 0}   # what the edge does on its own, unprotected
    load:
      duration: 30s
      rate: 150              # or ramp: {from: 10, to: 200}, or spike: {base:, peak:, at:, for:}
      arrivals: poisson      # or uniform
      timeout: 2s            # the caller gives up after this
      mix: {/product: 3, /price: 3, /reviews: 2, /page: 2}
    faults:
      - {at: 8s, until: 20s, service: reviews, latency: 5s}
      - {at: 20s, service: payments, error: 503, rate: 0.3}
      - {at: 5s, until: 15s, service: payments, rate: 0.05, hang: {duration: 4s, after_apply: 0.5}}
    modes:                   # run side by side; or a single top-level `config:`
      unprotected: {config: null}
      protected: {config: floodwall.yaml}        # a file (relative to this one) or inline
    expect:                  # optional: the drill fails (exit 1) when a figure misses
      protected: {healthy_success_rate: ">= 0.99", detection_time_s: "<= 2"}

Every error names its path in the file (``drill.yaml: faults[1].service: no service named
'review' (known: price, product, reviews)``).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from floodwall._core import validate
from floodwall._core.errors import ConfigError
from floodwall.chaos import Latency
from floodwall.config.loader import _path, loads, parse
from floodwall.config.schema import Document
from floodwall.config.units import Duration, PerSecond, parse_duration

__all__ = [
    "FIGURES",
    "CapacitySpec",
    "ClientSpec",
    "EdgeSpec",
    "FaultSpec",
    "HangSpec",
    "LoadSpec",
    "Mode",
    "ModeSpec",
    "RouteSpec",
    "Scenario",
    "ServiceSpec",
    "load_scenario",
    "parse_latency",
    "parse_scenario",
]

FIGURES = (
    "healthy_success_rate",
    "healthy_success_rate_before",
    "healthy_p99_ms_before",
    "healthy_p99_ms_during",
    "first_action_s",
    "detection_time_s",
    "recovery_time_s",
    "doubled_writes",
    "lost_writes",
    "unconfirmed_writes",
    "amplification",
    "success_rate",
)
"""Figures an ``expect`` section may check (see docs/drills.md for their definitions)."""

_EXPECT = re.compile(r"^\s*(<=|>=|==|<|>)\s*(-?\d+(?:\.\d*)?)\s*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def parse_latency(value: object) -> Latency:
    """A :class:`~floodwall.chaos.Latency` from ``"50ms"``, ``0.05``, ``{fixed: 50ms}``,
    ``{uniform: {low:, high:}}``, ``{exponential: {mean:, cap:}}`` or
    ``{lognormal: {median:, sigma:, cap:}}``."""
    if isinstance(value, Latency):
        return value
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return Latency.fixed(parse_duration(value))
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ValueError(
            "expected a duration or one of {fixed: d}, {uniform: {low, high}}, "
            f"{{exponential: {{mean}}}}, {{lognormal: {{median, sigma}}}}, got {value!r}"
        )
    ((kind, args),) = value.items()
    try:
        if kind == "fixed":
            return Latency.fixed(parse_duration(args))
        if not isinstance(args, Mapping):
            raise ValueError(f"{kind}: expected a mapping of parameters, got {args!r}")
        cap = parse_duration(args["cap"]) if "cap" in args else math.inf
        if kind == "uniform":
            return Latency.uniform(parse_duration(args["low"]), parse_duration(args["high"]))
        if kind == "exponential":
            return Latency.exponential(parse_duration(args["mean"]), cap=cap)
        if kind == "lognormal":
            return Latency.lognormal(
                parse_duration(args["median"]), float(args.get("sigma", 0.5)), cap=cap
            )
    except KeyError as exc:
        raise ValueError(f"{kind}: missing parameter {exc.args[0]!r}") from None
    except ConfigError as exc:
        raise ValueError(f"{kind}: {exc}") from None
    raise ValueError(f"unknown distribution {kind!r} (fixed, uniform, exponential, lognormal)")


LatencySpec = Annotated[Latency, PlainValidator(parse_latency)]


class CapacitySpec(_Model):
    """At most ``concurrency`` requests are handled at once; ``queue`` more wait (FIFO); any
    beyond get 503 at once."""

    concurrency: int = Field(ge=1)
    queue: int = Field(0, ge=0)


class ServiceSpec(_Model):
    """A mock dependency: a real aiohttp server on loopback.

    GET answers after ``latency``; a share ``error_rate`` answers ``error_status`` instead. POST
    is a write: it is applied to the service's ledger (one JSON line per applied write); with
    ``idempotent: true`` a write carrying an ``Idempotency-Key`` is applied once per key and
    repeats get the stored answer.

    With ``url`` it is instead a real service that is already running, wrapped in a
    :class:`~floodwall.drill.agent.DrillAgent` (which records its calls and takes its faults);
    the mock's settings then do not apply.
    """

    latency: LatencySpec = Latency.fixed(0.01)
    error_rate: float = Field(0.0, ge=0, le=1)
    error_status: int = Field(500, ge=400, le=599)
    capacity: CapacitySpec | None = None
    idempotent: bool = False
    port: int = Field(0, ge=0, le=65535)
    url: str | None = None

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return None if value is None else value.rstrip("/")

    @model_validator(mode="after")
    def _remote_or_mock(self) -> ServiceSpec:
        mock = sorted(self.model_fields_set - {"url"})
        if self.url is not None and mock:
            raise ValueError(
                f"a running service (url) takes no mock settings: drop {', '.join(mock)}"
            )
        return self

    @property
    def remote(self) -> bool:
        """A running service the drill reaches through its agent (not a mock it starts)."""
        return self.url is not None


class RouteSpec(_Model):
    """An edge route: ``method path`` calls every dependency in ``calls`` (in parallel, or one
    after the other with ``fanout: sequential``) and answers 200 when all answered."""

    path: str
    method: Literal["GET", "POST"] = "GET"
    calls: tuple[str, ...] = Field(min_length=1)
    fanout: Literal["parallel", "sequential"] = "parallel"

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or value.startswith("/_drill"):
            raise ValueError(f"must start with '/' (and not '/_drill'), got {value!r}")
        return value

    @property
    def write(self) -> bool:
        return self.method == "POST"


class ClientSpec(_Model):
    """How the edge calls a dependency that no floodwall resource guards (the baseline):
    ``timeout`` per attempt (``null``: none), ``retries`` blind retries on any failure, and
    whether writes carry an ``Idempotency-Key``."""

    timeout: Duration | None = None
    retries: int = Field(0, ge=0, le=10)
    idempotency_keys: bool = False


class StatusSpec(_Model):
    """An external edge's status endpoint, polled for breaker states: a JSON document shaped
    like ``Registry.snapshot()`` (``{name: {circuit_breaker: {state: "OPEN"}}}``), at the top
    level or under ``resources``. ``token_env`` names the variable holding the bearer token
    (the gateway's default: ``FLOODWALL_ADMIN_TOKEN``; ``null``: none)."""

    url: str
    token_env: str | None = "FLOODWALL_ADMIN_TOKEN"  # noqa: S105 - a variable's name
    interval: Duration = Field(0.5, gt=0)


class EdgeSpec(_Model):
    """The service under test: ``local`` (an aiohttp service built by the drill from the mode's
    floodwall config, or unprotected) or ``external`` (your running edge, e.g. the gateway)."""

    kind: Literal["local", "external"] = "local"
    workers: int = Field(100, ge=1)
    queue: int = Field(200, ge=0)
    routes: tuple[RouteSpec, ...] = Field(min_length=1)
    client: ClientSpec = ClientSpec()
    url: str | None = None
    status: StatusSpec | None = None

    @model_validator(mode="after")
    def _kind(self) -> EdgeSpec:
        if self.kind == "external" and self.url is None:
            raise ValueError("an external edge needs `url` (where the load is sent)")
        if self.kind == "local" and (self.url is not None or self.status is not None):
            raise ValueError("`url` and `status` are for `kind: external` edges")
        seen: set[tuple[str, str]] = set()
        for index, route in enumerate(self.routes):
            key = (route.method, route.path)
            if key in seen:
                raise ValueError(f"routes[{index}]: {route.method} {route.path} is listed twice")
            seen.add(key)
        return self

    def route(self, path: str) -> RouteSpec:
        for route in self.routes:
            if route.path == path:
                return route
        raise KeyError(path)


class RampSpec(_Model):
    start: PerSecond = Field(alias="from")
    end: PerSecond = Field(alias="to")


class SpikeSpec(_Model):
    base: PerSecond
    peak: PerSecond
    at: Duration
    length: Duration = Field(alias="for", gt=0)


class LoadSpec(_Model):
    """Open-loop arrivals for ``duration`` seconds (and never more than ``max_requests``):
    ``rate`` (constant), ``ramp`` (linear from..to over the duration) or ``spike`` (``base``,
    with ``peak`` from ``at`` for ``for`` seconds). ``arrivals``: ``poisson`` (exponential gaps)
    or ``uniform`` (even gaps). Each arrival picks a route by ``mix`` weight (default: equal)."""

    duration: Duration = Field(gt=0)
    rate: PerSecond | None = None
    ramp: RampSpec | None = None
    spike: SpikeSpec | None = None
    arrivals: Literal["poisson", "uniform"] = "poisson"
    timeout: Duration = Field(2.0, gt=0)
    max_requests: int = Field(100_000, ge=1)
    max_in_flight: int = Field(2_000, ge=1)
    mix: dict[str, float] | None = None

    @model_validator(mode="after")
    def _one_profile(self) -> LoadSpec:
        given = [k for k in ("rate", "ramp", "spike") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of rate, ramp, spike, got {given or 'none'}")
        for path, weight in (self.mix or {}).items():
            if not weight >= 0:
                raise ValueError(f"mix.{path}: a weight must be >= 0, got {weight!r}")
        if self.mix is not None and not sum(self.mix.values()) > 0:
            raise ValueError("mix: at least one weight must be > 0")
        return self

    def rate_at(self, t: float) -> float:
        """Arrivals per second ``t`` seconds into the load."""
        if self.rate is not None:
            return self.rate
        if self.ramp is not None:
            share = min(max(t / self.duration, 0.0), 1.0)
            return self.ramp.start + (self.ramp.end - self.ramp.start) * share
        assert self.spike is not None
        spike = self.spike
        return spike.peak if spike.at <= t < spike.at + spike.length else spike.base

    @property
    def peak_rate(self) -> float:
        if self.rate is not None:
            return self.rate
        if self.ramp is not None:
            return max(self.ramp.start, self.ramp.end)
        assert self.spike is not None
        return max(self.spike.base, self.spike.peak)


class HangSpec(_Model):
    """A hang: the request gets no answer for ``duration`` seconds (then the service carries
    on). ``after_apply``: share of hangs that happen after a write was applied and before the
    answer is sent (the seeds' "the response timed out but the money moved")."""

    duration: Duration = Field(30.0, gt=0)
    after_apply: float = Field(0.0, ge=0, le=1)


class ReloadSpec(_Model):
    """A fault applied through your edge's configuration: the drill deep-merges ``merge`` into
    ``file`` at the fault's start and puts the file back at its end; with ``admin`` (the
    gateway's admin URL) it then asks for a reload (``POST /reload``, bearer token from
    ``token_env``), else your edge must watch the file."""

    file: str
    merge: dict[str, Any]
    admin: str | None = None
    token_env: str = "FLOODWALL_ADMIN_TOKEN"  # noqa: S105 - the variable's name, not a token


class FaultSpec(_Model):
    """From ``at`` until ``until`` (``null``: the end of the run), on a share ``rate`` of the
    requests to ``service``: ``latency`` added, an ``error`` status answered (``true``: 503), or a
    ``hang``; or a ``reload`` of an external edge's configuration."""

    at: Duration
    until: Duration | None = None
    service: str | None = None
    rate: float = Field(1.0, ge=0, le=1)
    latency: LatencySpec | None = None
    error: int | bool | None = None
    hang: HangSpec | bool | None = None
    reload: ReloadSpec | None = None

    @field_validator("error")
    @classmethod
    def _status(cls, value: int | bool | None) -> int | None:
        if value is None or value is False:
            return None
        if value is True:
            return 503
        if not 400 <= value <= 599:
            raise ValueError(f"an error status must be in 400..599, got {value!r}")
        return value

    @field_validator("hang")
    @classmethod
    def _hang(cls, value: HangSpec | bool | None) -> HangSpec | None:
        if value is True:
            return HangSpec()
        return None if value is False else value

    @model_validator(mode="after")
    def _one_fault(self) -> FaultSpec:
        given = [k for k in ("latency", "error", "hang", "reload") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of latency, error, hang, reload, got {given or 'none'}"
            )
        if self.reload is None and self.service is None:
            raise ValueError(f"a {given[0]} fault needs `service`")
        if self.reload is not None and self.service is not None:
            raise ValueError("a reload fault acts on your edge's config: drop `service`")
        if self.until is not None and not self.until > self.at:
            raise ValueError(f"until ({self.until:g}s) must be after at ({self.at:g}s)")
        return self

    @property
    def what(self) -> str:
        if self.latency is not None:
            text = f"latency +{self.latency}"
        elif self.error is not None:
            text = f"answers {self.error}"
        elif self.hang is not None:
            assert isinstance(self.hang, HangSpec)
            text = f"hangs {self.hang.duration:g}s"
            if self.hang.after_apply:
                text += f" ({self.hang.after_apply:.0%} after applying)"
        else:
            assert self.reload is not None
            text = f"reload {self.reload.file}"
        share = "" if self.rate == 1 else f"{self.rate:.0%} of calls: "
        return share + text

    @property
    def target(self) -> str:
        return self.service if self.service is not None else "edge"


class ModeSpec(_Model):
    """One way of running the scenario: the floodwall ``config`` the edge is built from (a file
    relative to the scenario, an inline document, or ``null``: unprotected) and, optionally, the
    edge's own ``client`` behaviour in this mode."""

    config: str | dict[str, Any] | None = None
    client: ClientSpec | None = None


def _expectation(value: object) -> str:
    if value is None:
        return "== null"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a check such as '>= 0.99' or '== 0', got {value!r}")
    text = str(value) if isinstance(value, str) else f"== {value}"
    if text.strip() != "== null" and _EXPECT.match(text) is None:
        raise ValueError(f"expected a check such as '>= 0.99' or '== 0', got {value!r}")
    return text


Expectation = Annotated[str, PlainValidator(_expectation)]


class Scenario(_Model):
    """A whole drill (see [Chaos drills][guide-drills])."""

    name: str = "drill"
    description: str = ""
    seed: int = 1
    warmup: Duration = 1.0
    drain: Duration = 5.0
    services: dict[str, ServiceSpec] = Field(default_factory=dict)
    edge: EdgeSpec
    load: LoadSpec
    faults: tuple[FaultSpec, ...] = ()
    config: str | dict[str, Any] | None = None
    modes: dict[str, ModeSpec] | None = None
    expect: dict[str, dict[str, Expectation]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        _check_references(self)
        return self

    def mode_specs(self) -> dict[str, ModeSpec]:
        """The modes to run, in order. Without ``modes``, one: ``unprotected`` or ``protected``
        by its ``config``, ``external`` for an external edge (its protection is its own)."""
        if self.modes is not None:
            return dict(self.modes)
        if self.edge.kind == "external":
            return {"external": ModeSpec(config=self.config)}
        name = "unprotected" if self.config is None else "protected"
        return {name: ModeSpec(config=self.config)}

    def faulty_services(self) -> frozenset[str]:
        return frozenset(f.service for f in self.faults if f.service is not None)


def _known(names: Any) -> str:
    return ", ".join(sorted(names)) or "none"


def _check_references(s: Scenario) -> None:
    """Every name must exist; raised as ``ValueError`` naming the path."""
    local = s.edge.kind == "local"
    for index, route in enumerate(s.edge.routes):
        for call in route.calls:
            if local and call not in s.services:
                raise ValueError(
                    f"edge.routes[{index}].calls: no service named {call!r} "
                    f"(known: {_known(s.services)})"
                )
            spec = s.services.get(call)
            if route.write and spec is not None and spec.remote:
                raise ValueError(
                    f"edge.routes[{index}]: a write calls {call!r}, a running service; the "
                    "ledger audit counts writes on mock services only"
                )
    _check_faults_and_mix(s)
    _check_modes(s)


def _check_faults_and_mix(s: Scenario) -> None:
    paths = {route.path for route in s.edge.routes}
    for path in s.load.mix or {}:
        if path not in paths:
            raise ValueError(f"load.mix: no route {path!r} (routes: {_known(paths)})")
    for index, fault in enumerate(s.faults):
        if fault.service is not None and fault.service not in s.services:
            raise ValueError(
                f"faults[{index}].service: no service named {fault.service!r} "
                f"(known: {_known(s.services)})"
            )
        if fault.at >= s.load.duration:
            raise ValueError(
                f"faults[{index}].at: {fault.at:g}s is not within the load ({s.load.duration:g}s)"
            )


def _check_modes(s: Scenario) -> None:
    if s.modes is not None and s.config is not None:
        raise ValueError("give either `config` (one mode) or `modes`, not both")
    if s.modes is not None and not s.modes:
        raise ValueError("modes: give at least one mode")
    names = set(s.mode_specs())
    for mode, checks in s.expect.items():
        if mode not in names:
            raise ValueError(f"expect.{mode}: no mode named {mode!r} (modes: {_known(names)})")
        for figure in checks:
            if figure not in FIGURES:
                raise ValueError(
                    f"expect.{mode}.{figure}: unknown figure (known: {', '.join(FIGURES)})"
                )


# -- loading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """A mode ready to run: its name, its floodwall document (``None``: unprotected), the raw
    mapping it came from, and the edge's own client behaviour."""

    name: str
    document: Document | None
    raw_config: dict[str, Any] | None
    client: ClientSpec


def parse_scenario(
    raw: Mapping[str, Any], source: str = "<scenario>", base_dir: Path | None = None
) -> tuple[Scenario, list[Mode]]:
    """Validate a raw mapping into a :class:`Scenario` and its runnable :class:`Mode` list;
    every floodwall config is read (files relative to ``base_dir``) and validated too."""
    validate.text("source", source)
    if base_dir is not None and not isinstance(base_dir, str | os.PathLike):
        raise ConfigError(f"base_dir must be a directory path or None, got {base_dir!r}")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: the scenario must be a mapping, got {type(raw).__name__}")
    try:
        scenario = Scenario.model_validate(dict(raw))
    except ValidationError as exc:
        raise _explain(exc, source) from None
    modes: list[Mode] = []
    where = "config" if scenario.modes is None else "modes.{}.config"
    for name, spec in scenario.mode_specs().items():
        path = where.format(name)
        raw_config = _read_config(spec.config, f"{source}: {path}", base_dir)
        document = None
        if raw_config is not None:
            document = parse(raw_config, f"{source}: {path}")
            _check_config(scenario, document, f"{source}: {path}")
        client = spec.client if spec.client is not None else scenario.edge.client
        modes.append(Mode(name, document, raw_config, client))
    return scenario, modes


def _read_config(
    config: str | dict[str, Any] | None, where: str, base_dir: Path | None
) -> dict[str, Any] | None:
    if config is None or isinstance(config, dict):
        return config
    path = Path(config)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {str(path)!r}: {exc.strerror}") from None
    return loads(text, str(path))


def _check_config(scenario: Scenario, document: Document, where: str) -> None:
    if scenario.edge.kind != "local":
        return
    called = {call for route in scenario.edge.routes for call in route.calls}
    for name in document.resources:
        if name not in called:
            raise ConfigError(
                f"{where}.resources.{name}: no route calls a dependency named {name!r} "
                f"(called: {_known(called)}); resources guard the dependency of the same name"
            )


def load_scenario(source: str | Path | Mapping[str, Any]) -> tuple[Scenario, list[Mode]]:
    """Read a scenario file (YAML, or JSON by extension) or take a mapping."""
    if isinstance(source, Mapping):
        return parse_scenario(source)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the scenario: {exc.strerror}") from None
    return parse_scenario(loads(text, str(path)), str(path), path.parent)


def _explain(error: ValidationError, source: str) -> ConfigError:
    lines = []
    for item in error.errors(include_url=False):
        message = item["msg"].removeprefix("Value error, ")
        got = item.get("input")
        shown = "" if isinstance(got, dict) or "got " in message else f" (got {_short(got)})"
        path = _path(item["loc"])
        lines.append(f"{source}: {path + ': ' if path else ''}{message}{shown}")
    return ConfigError("\n".join(lines))


def _short(value: object) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_expectation(figure: float | None, check: str) -> bool:
    """Whether ``figure`` satisfies ``check`` (``'>= 0.99'``, ``'== 0'``, ``'== null'``)."""
    if check.strip() == "== null":
        return figure is None
    match = _EXPECT.match(check)
    if match is None or figure is None or (isinstance(figure, float) and math.isnan(figure)):
        return False
    op, number = match.group(1), float(match.group(2))
    return {
        "<=": figure <= number,
        ">=": figure >= number,
        "<": figure < number,
        ">": figure > number,
        "==": figure == number,
    }[op]
