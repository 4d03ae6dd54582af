"""Scenarios: a service, its guard and its load as data (YAML, JSON or a dict), run in seconds.

A scenario file for ``floodwall simulate scenario.yaml``::

    name: grpc-example            # concurrency-limits' example server
    seed: 1
    server:
      concurrency: 2              # workers; capacity = concurrency / mean service time
      discipline: fifo            # or lifo
      queue_limit: null           # unbounded
      skip_expired: false         # true: drop queued jobs whose client deadline passed
      dependency:                 # optional downstream call holding the worker
        latency: {hang: {base: 0.05, probability: 0.05, duration: 8}}
        timeout: 1.0
        bulkhead: 60              # concurrent calls allowed (fixed limit)
    guard:                        # optional; omit for no protection
      type: limiter               # limiter | bbr | dagor | shedder
      algorithm: gradient2        # aimd | vegas | gradient | gradient2 | fixed
      options: {}                 # the algorithm's keywords (initial_limit, min_limit, ...)
      windowed: {min_window_time: 1.0, window_size: 10}   # or true / false
    load:
      type: open                  # open | closed | fanout
      service_time: {lognormal: {mean: 0.020, sigma: 1.0}}
      timeout: 1.0                # client timeout, seconds
      phases:
        - {name: "0.5x", duration: 100, rate: 50}
        - {name: "2x", duration: 100, rate: 200}
    report: {warmup: 10}          # seconds skipped at the start of each phase

Distributions are seconds or ``{constant|exponential|uniform|lognormal|hang: {...}}``. Every
configuration error names its path in the file.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from floodwall._core import validate
from floodwall._core.errors import ConfigError
from floodwall.adaptive import (
    AdaptiveLimiter,
    AIMDLimit,
    BBRLimiter,
    FixedLimit,
    Gradient2Limit,
    GradientLimit,
    Limit,
    LoadShedder,
    QueueingTimeAdmission,
    SmoothedCPU,
    VegasLimit,
    WindowedLimit,
)
from floodwall.sim.clients import ClosedLoop, FanOut, OpenLoop, Phase, phase_bounds
from floodwall.sim.engine import Simulation
from floodwall.sim.metrics import Recorder, Summary
from floodwall.sim.models import (
    BBRGuard,
    DagorGuard,
    Dependency,
    Guard,
    LimiterGuard,
    Server,
    ShedderGuard,
    SimCPU,
    distribution,
)

__all__ = ["SimResult", "build_limit", "format_report", "read_scenario", "run_scenario"]

_ALGORITHMS: dict[str, type[Limit]] = {
    "aimd": AIMDLimit,
    "vegas": VegasLimit,
    "gradient": GradientLimit,
    "gradient2": Gradient2Limit,
}


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: expected a mapping, got {value!r}")
    return value


def read_scenario(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """The raw mapping of a simulator scenario from a YAML/JSON file (or a mapping as is);
    not :func:`floodwall.drill.load_scenario`, which validates a drill."""
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            yaml: Any = importlib.import_module("yaml")  # optional: only YAML needs PyYAML
        except ImportError as exc:  # pragma: no cover - PyYAML ships with the gateway extra
            raise ConfigError(f"{path}: reading YAML needs PyYAML (pip install pyyaml)") from exc
        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    return dict(_mapping(data, str(path)))


def build_limit(spec: Mapping[str, Any], path: str = "guard") -> Limit:
    """The limit algorithm of a guard spec, windowed unless ``windowed: false``."""
    validate.text("path", path)
    if not isinstance(spec, Mapping):
        raise ConfigError(f"spec must be a mapping (a guard section), got {spec!r}")
    name = spec.get("algorithm", "gradient2")
    options = dict(_mapping(spec.get("options"), f"{path}.options"))
    try:
        if name == "fixed":
            return FixedLimit(int(options.get("limit", 10)))
        if name not in _ALGORITHMS:
            raise ConfigError(f"{path}.algorithm: unknown algorithm {name!r}")
        limit: Limit = _ALGORITHMS[name](**options)
    except TypeError as exc:
        raise ConfigError(f"{path}.options: {exc}") from None
    windowed = spec.get("windowed", True)
    if windowed:
        kwargs = dict(windowed) if isinstance(windowed, Mapping) else {}
        try:
            limit = WindowedLimit(limit, **kwargs)
        except TypeError as exc:
            raise ConfigError(f"{path}.windowed: {exc}") from None
    return limit


def _guard(spec: Mapping[str, Any], sim: Simulation, server: Server, path: str) -> Guard:
    kind = spec.get("type", "limiter")
    clock = sim.clock
    if kind == "limiter":
        partitions = spec.get("partitions")
        return LimiterGuard(
            AdaptiveLimiter(build_limit(spec, path), partitions=partitions, clock=clock)
        )
    if kind == "bbr":
        options = dict(_mapping(spec.get("options"), f"{path}.options"))
        cpu = SmoothedCPU(SimCPU(server), clock=clock)
        return BBRGuard(BBRLimiter(cpu=cpu, clock=clock, **options))
    if kind == "dagor":
        options = dict(_mapping(spec.get("options"), f"{path}.options"))
        return DagorGuard(QueueingTimeAdmission(clock=clock, **options))
    if kind == "shedder":
        inner = spec.get("limiter")
        limiter = None
        if inner is not None:
            built = _guard(_mapping(inner, f"{path}.limiter"), sim, server, f"{path}.limiter")
            limiter = getattr(built, "limiter", None) or getattr(built, "admission", None)
        shedder = LoadShedder(limiter, max_queue_time=spec.get("max_queue_time"), clock=clock)
        return ShedderGuard(shedder, at=spec.get("at", "arrival"))
    raise ConfigError(f"{path}.type: unknown guard {kind!r}")


@dataclass
class SimResult:
    """A finished run: its recorder, phases and server, and ways to summarise them."""

    name: str
    recorder: Recorder
    phases: list[tuple[float, float, str]]
    server: Server
    duration: float
    events: int
    warmup: float = 0.0
    extra: dict[str, Any] | None = None

    def summaries(self, warmup: float | None = None) -> list[tuple[str, Summary]]:
        """One summary per phase, skipping ``warmup`` seconds at each phase's start."""
        skip = self.warmup if warmup is None else warmup
        return [
            (name, self.recorder.summary(min(start + skip, end), end))
            for start, end, name in self.phases
        ]

    def overall(self) -> Summary:
        return self.recorder.summary(0.0, self.duration)


def _phases(spec: Any, path: str) -> list[Phase]:
    if not isinstance(spec, list) or not spec:
        raise ConfigError(f"{path}: expected a non-empty list of phases, got {spec!r}")
    phases = []
    for index, raw in enumerate(spec):
        item = _mapping(raw, f"{path}[{index}]")
        try:
            phases.append(
                Phase(float(item["duration"]), float(item["rate"]), str(item.get("name", index)))
            )
        except KeyError as missing:
            raise ConfigError(f"{path}[{index}]: missing {missing}") from None
    return phases


def run_scenario(source: str | os.PathLike[str] | Mapping[str, Any]) -> SimResult:
    """Build and run a scenario (see [Overload protection][guide-overload]); deterministic for a
    given seed."""
    spec = read_scenario(source)
    sim = Simulation(int(spec.get("seed", 0)))
    recorder = Recorder(float(spec.get("bin", 1.0)))
    server_spec = _mapping(spec.get("server"), "server")
    dependency = None
    if "dependency" in server_spec:
        dep = _mapping(server_spec["dependency"], "server.dependency")
        bulkhead = None
        if dep.get("bulkhead"):
            bulkhead = AdaptiveLimiter(FixedLimit(int(dep["bulkhead"])), clock=sim.clock)
        dependency = Dependency(
            distribution(dep.get("latency", 0.0), "server.dependency.latency"),
            timeout=dep.get("timeout"),
            bulkhead=bulkhead,
            share=float(dep.get("share", 1.0)),
        )
    server = Server(
        sim,
        int(server_spec.get("concurrency", 1)),
        recorder,
        queue_limit=server_spec.get("queue_limit"),
        discipline=server_spec.get("discipline", "fifo"),
        skip_expired=bool(server_spec.get("skip_expired", False)),
        dependency=dependency,
    )
    if spec.get("guard"):
        server.guard = _guard(_mapping(spec["guard"], "guard"), sim, server, "guard")
    load = _mapping(spec.get("load"), "load")
    kind = load.get("type", "open")
    service = distribution(load.get("service_time", 0.01), "load.service_time")
    timeout = load.get("timeout")
    retries = int(load.get("retries", 0))
    backoff = distribution(load["backoff"], "load.backoff") if "backoff" in load else None
    retry_on = tuple(load.get("retry_on", ("error", "timeout")))
    phases: list[Phase]
    if kind == "open":
        phases = _phases(load.get("phases"), "load.phases")
        partitions = list(_mapping(load.get("partitions"), "load.partitions").items())
        OpenLoop(
            sim,
            server,
            recorder,
            phases,
            service,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            retry_on=retry_on,
            partitions=partitions,
        ).start()
    elif kind == "closed":
        duration = float(load.get("duration", 60.0))
        phases = [Phase(duration, math.nan, "closed")]
        ClosedLoop(
            sim,
            server,
            recorder,
            int(load.get("clients", 10)),
            service_time=service,
            think_time=distribution(load.get("think_time", 1.0), "load.think_time"),
            until=duration,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            retry_on=retry_on,
        ).start()
    elif kind == "fanout":
        phases = _phases(load.get("phases"), "load.phases")
        guard = server.guard
        levels = None
        if load.get("upstream") and isinstance(guard, DagorGuard):
            levels = lambda: guard.admission.level  # noqa: E731 - a one-line callback
        FanOut(
            sim,
            server,
            recorder,
            phases,
            service,
            fanout=int(load.get("fanout", 1)),
            timeout=timeout,
            coherent=bool(load.get("coherent", True)),
            levels=levels,
        ).start()
    else:
        raise ConfigError(f"load.type: unknown load {kind!r}")
    bounds = phase_bounds(phases)
    duration = float(spec.get("duration", bounds[-1][1]))
    sim.run(duration + (float(timeout) if timeout else 0.0))
    report = _mapping(spec.get("report"), "report")
    return SimResult(
        name=str(spec.get("name", "scenario")),
        recorder=recorder,
        phases=[(start, end, phase.name) for start, end, phase in bounds],
        server=server,
        duration=duration,
        events=sim.events,
        warmup=float(report.get("warmup", 0.0)),
        extra={"dependency": dependency} if dependency else None,
    )


def format_report(result: SimResult) -> str:
    """A plain-text table: one row per phase."""
    head = (
        f"{'phase':>10} {'offered/s':>10} {'goodput/s':>10} {'success':>8} {'shed':>7} "
        f"{'timeout':>8} {'p50 ms':>8} {'p99 ms':>8} {'busy':>5} {'limit':>7}"
    )
    lines = [f"scenario {result.name}: {result.events} events", head, "-" * len(head)]
    for name, s in result.summaries():
        span = max(s.end - s.start, 1e-9)
        answered = max(s.answered, 1)
        lines.append(
            f"{name:>10} {s.offered / span:>10.1f} {s.goodput:>10.1f} {s.success_rate:>8.1%} "
            f"{s.rejected / answered:>7.1%} {s.timeout / answered:>8.1%} "
            f"{s.p50 * 1000:>8.1f} {s.p99 * 1000:>8.1f} {s.max_busy:>5} {s.mean_limit:>7.1f}"
        )
    return "\n".join(lines)
