"""A scenario's fault schedule, applied at run time.

Faults on mock services become floodwall chaos policies (:mod:`floodwall.chaos`) on the
service's request path, built with ``allow=True`` (a drill is the explicit permission) and a
:class:`~floodwall.chaos.Schedule` counted from the run's origin, so they switch themselves on
at ``at`` and off at ``until``:

* ``latency`` → :class:`~floodwall.chaos.ChaosLatency` before the work;
* ``error`` → :class:`~floodwall.chaos.ChaosResult` answering that status instead of working;
* ``hang`` → a wait of ``duration`` seconds (the service carries on afterwards): a share
  ``1 - after_apply`` of the hangs before the work, ``after_apply`` of them after a write was
  applied and before the answer is sent.

A running service's :class:`~floodwall.drill.agent.DrillAgent` builds the same policies, from
the plain form :func:`fault_wire` sends it (its error answers built by the ``answer`` given).

Faults on an external edge (``reload``) patch the configuration file it watches: the drill
deep-merges the fault's mapping into the file at ``at`` and puts the original text back at
``until`` (and always when the run ends).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from floodwall._core.errors import ConfigError
from floodwall.chaos import ChaosLatency, ChaosPolicy, ChaosResult, Latency, Schedule
from floodwall.drill.metrics import FaultWindow
from floodwall.drill.scenario import FaultSpec, HangSpec, Scenario

__all__ = ["Answer", "ConfigPatch", "fault_wire", "service_faults", "windows"]

Answer = Callable[[int, dict[str, Any]], object]
"""Builds a service's answer to an ``error`` fault from a status and a JSON body."""


def _aiohttp_answer(status: int, body: dict[str, Any]) -> object:
    return web.json_response(body, status=status)


def windows(scenario: Scenario) -> list[FaultWindow]:
    """Each fault's window in run time (a fault without ``until`` lasts to the end of load)."""
    end = scenario.load.duration
    return [
        FaultWindow(f.target, f.at, min(f.until if f.until is not None else end, end), f.what)
        for f in scenario.faults
    ]


def service_faults(
    fault: FaultSpec, index: int, *, origin: float, seed: int, answer: Answer = _aiohttp_answer
) -> tuple[list[ChaosPolicy], list[ChaosPolicy]]:
    """The chaos policies a service fault puts before and after the work; an ``error`` fault
    answers ``answer(status, body)`` (default: an aiohttp response, for the mock services)."""
    assert fault.service is not None
    schedule = Schedule.between(fault.at, fault.until if fault.until is not None else math.inf)
    name = f"{fault.service}.fault{index}"
    common: dict[str, Any] = {
        "schedule": schedule,
        "allow": True,
        "origin": origin,
        "rng": random.Random(f"{seed}:{name}"),
    }
    if fault.latency is not None:
        return [ChaosLatency(fault.latency, name=name, rate=fault.rate, **common)], []
    if fault.error is not None:
        status = int(fault.error)
        body = {"error": "injected", "service": fault.service}
        injected = ChaosResult(
            factory=lambda: answer(status, body), name=name, rate=fault.rate, **common
        )
        return [injected], []
    hang = fault.hang
    assert isinstance(hang, HangSpec)
    share = fault.rate * (1 - hang.after_apply)
    before = ChaosLatency(hang.duration, name=name, rate=share, **common)
    if not hang.after_apply:
        return [before], []
    common["rng"] = random.Random(f"{seed}:{name}:after")
    after = ChaosLatency(
        hang.duration, name=f"{name}.after", rate=fault.rate * hang.after_apply, **common
    )
    return [before], [after]


def _latency_wire(latency: Latency) -> object:
    """A :class:`Latency` in the scenario's own notation (what ``parse_latency`` reads)."""
    cap = {} if math.isinf(latency.cap) else {"cap": latency.cap}
    if latency.kind == "fixed":
        return latency.a
    if latency.kind == "uniform":
        return {"uniform": {"low": latency.a, "high": latency.b}}
    if latency.kind == "exponential":
        return {"exponential": {"mean": latency.a, **cap}}
    return {"lognormal": {"median": latency.a, "sigma": latency.b, **cap}}


def fault_wire(fault: FaultSpec) -> dict[str, Any]:
    """A service fault as plain JSON in the scenario's notation (seconds), which
    ``FaultSpec.model_validate`` reads back: how a fault travels to a running service."""
    if fault.reload is not None:
        raise ValueError("a reload fault acts on the edge's config, not on a service")
    wire: dict[str, Any] = {"at": fault.at, "until": fault.until, "rate": fault.rate}
    wire["service"] = fault.service
    if fault.latency is not None:
        wire["latency"] = _latency_wire(fault.latency)
    elif fault.error is not None:
        wire["error"] = int(fault.error)
    else:
        assert isinstance(fault.hang, HangSpec)
        wire["hang"] = {"duration": fault.hang.duration, "after_apply": fault.hang.after_apply}
    return wire


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class ConfigPatch:
    """A ``reload`` fault: merge into a config file at ``at``, restore it at ``until``."""

    def __init__(self, fault: FaultSpec, base_dir: Path | None) -> None:
        assert fault.reload is not None
        path = Path(fault.reload.file)
        self.path = path if path.is_absolute() or base_dir is None else base_dir / path
        self.merge = fault.reload.merge
        self.admin = fault.reload.admin
        self.token_env = fault.reload.token_env
        self.at = fault.at
        self.until = fault.until
        self._original: str | None = None

    def apply(self) -> None:
        """Merge the fault into the file, written back in its own format (YAML or JSON)."""
        if self.path.suffix not in (".yaml", ".yml", ".json"):
            raise ConfigError(f"{self.path}: a reload fault patches YAML or JSON files only")
        original = self.path.read_text(encoding="utf-8")
        current = yaml.safe_load(original) or {}  # JSON is YAML too
        patched = _merge(current, self.merge)
        if self.path.suffix == ".json":
            text = json.dumps(patched, indent=2)
        else:
            text = yaml.safe_dump(patched, sort_keys=False)
        self._original = original
        self.path.write_text(text, encoding="utf-8")

    def restore(self) -> None:
        if self._original is not None:
            self.path.write_text(self._original, encoding="utf-8")
            self._original = None

    async def reload(self) -> None:
        """Ask the gateway to re-read its file (``POST {admin}/reload`` with an empty body)."""
        if self.admin is None:
            return
        token = os.environ.get(self.token_env, "")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = aiohttp.ClientTimeout(total=10)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(self.admin.rstrip("/") + "/reload", headers=headers) as answer,
        ):
            if answer.status >= 400:
                detail = await answer.text()
                raise RuntimeError(f"{self.admin}/reload refused the fault: {detail[:300]}")

    async def run(self, origin: float) -> None:
        """Apply and restore on schedule; ``origin`` is the ``time.monotonic()`` of t = 0."""
        try:
            await asyncio.sleep(max(0.0, origin + self.at - time.monotonic()))
            self.apply()
            await self.reload()
            if self.until is None:
                await asyncio.Event().wait()  # until the run ends and cancels it
            else:
                await asyncio.sleep(max(0.0, self.until - self.at))
        finally:
            if self._original is not None:
                self.restore()
                await asyncio.shield(self.reload())
