"""CPU usage sources for :class:`~floodwall.adaptive.BBRLimiter`, and the 0.95 EMA over them.

A source is any zero-argument callable returning the CPU usage *since its previous call* as a
fraction in ``[0, 1]`` (0.0 on the first call). This module is the only place in the adaptive
package that reads operating-system state; limiters take a source by injection, so tests pass a
lambda and never touch the OS.

* :class:`CgroupCPU`: the container's usage against its CPU quota (cgroup v2 ``cpu.stat`` +
  ``cpu.max``, or v1 ``cpuacct.usage`` + ``cpu.cfs_quota_us``), what Kratos reads in a pod.
* :class:`SystemCPU`: the whole machine, from psutil when installed (``pip install
  floodwall[adaptive]``), else from ``/proc/stat``.
* :class:`ProcessCPU`: this process's CPU time against ``cores`` cores (default 1). A CPython
  server is bound by one core through the GIL long before the machine is busy, so for a
  single-process server this is the figure that reaches 80 % when it is overloaded.
* :func:`default_cpu_source`: cgroup when a quota is set, else the system.

:class:`SmoothedCPU` applies Kratos' exponential average (``cpu = cpu × 0.95 + sample × 0.05``
every 500 ms), sampling lazily when read, so there is no background thread.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError

__all__ = [
    "CPUSource",
    "CgroupCPU",
    "ProcessCPU",
    "SmoothedCPU",
    "SystemCPU",
    "default_cpu_source",
]

CPUSource = Callable[[], float]
"""Returns CPU usage since the previous call, a fraction in [0, 1]."""


def _clamp(value: float) -> float:
    return 0.0 if value < 0 else min(1.0, value)


def _cores_available() -> float:
    try:
        return float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return float(os.cpu_count() or 1)


class ProcessCPU:
    """This process's CPU time (user + system) per wall second, over ``cores`` cores."""

    def __init__(self, *, cores: float = 1.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.cores = validate.number("cores", cores, 0.0, low_open=True)
        self._now = clock.monotonic
        self._last: tuple[float, float] | None = None

    def __call__(self) -> float:
        times = os.times()
        used, now = times.user + times.system, self._now()
        last, self._last = self._last, (used, now)
        if last is None or now <= last[1]:
            return 0.0
        return _clamp((used - last[0]) / ((now - last[1]) * self.cores))


class CgroupCPU:
    """The container's CPU usage against its quota (cgroup v2, then v1).

    ``quota_cores`` overrides the quota read from the cgroup; without a quota the allowed cores
    (scheduler affinity) are the denominator. :attr:`available` is False when no cgroup CPU
    accounting is readable.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = "/sys/fs/cgroup",
        *,
        quota_cores: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not isinstance(root, str | os.PathLike):
            raise ConfigError(f"root must be a path, got {root!r}")
        if quota_cores is not None:
            validate.number("quota_cores", quota_cores, 0.0, low_open=True)
        self.root = Path(root)
        self._now = clock.monotonic
        self._usage: Callable[[], float | None] = self._usage_v2
        quota = self._quota_v2()
        if self._usage_v2() is None:
            self._usage = self._usage_v1
            quota = self._quota_v1()
        self.has_quota = quota is not None
        self.cores = quota_cores or quota or _cores_available()
        self.available = self._usage() is not None
        self._last: tuple[float, float] | None = None

    def _read(self, *parts: str) -> str | None:
        try:
            return self.root.joinpath(*parts).read_text()
        except OSError:
            return None

    def _usage_v2(self) -> float | None:
        text = self._read("cpu.stat")
        if text is None:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return None

    def _quota_v2(self) -> float | None:
        text = self._read("cpu.max")
        if text is None:
            return None
        fields = text.split()
        if len(fields) < 2 or fields[0] == "max":
            return None
        return int(fields[0]) / int(fields[1])

    def _usage_v1(self) -> float | None:
        text = self._read("cpuacct", "cpuacct.usage")
        return None if text is None else int(text) / 1e9

    def _quota_v1(self) -> float | None:
        quota = self._read("cpu", "cpu.cfs_quota_us")
        period = self._read("cpu", "cpu.cfs_period_us")
        if quota is None or period is None or int(quota) <= 0:
            return None
        return int(quota) / int(period)

    def __call__(self) -> float:
        used, now = self._usage(), self._now()
        if used is None:
            return 0.0
        last, self._last = self._last, (used, now)
        if last is None or now <= last[1]:
            return 0.0
        return _clamp((used - last[0]) / ((now - last[1]) * self.cores))


class SystemCPU:
    """Whole-machine CPU usage: ``psutil.cpu_percent`` when psutil is installed, else
    ``/proc/stat`` deltas."""

    def __init__(self, *, use_psutil: bool = True) -> None:
        self._psutil: Any = None
        if validate.flag("use_psutil", use_psutil):
            try:
                self._psutil = importlib.import_module("psutil")
            except ImportError:
                self._psutil = None
        if self._psutil is not None:
            self._psutil.cpu_percent(interval=None)  # prime: the first reading is meaningless
        self._last: tuple[int, int] | None = None

    @property
    def available(self) -> bool:
        return self._psutil is not None or Path("/proc/stat").is_file()

    def __call__(self) -> float:
        if self._psutil is not None:
            return _clamp(float(self._psutil.cpu_percent(interval=None)) / 100.0)
        try:
            first = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return 0.0
        ticks = [int(value) for value in first]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        total = sum(ticks)
        last, self._last = self._last, (idle, total)
        if last is None or total <= last[1]:
            return 0.0
        return _clamp(1.0 - (idle - last[0]) / (total - last[1]))


def default_cpu_source(clock: Clock = SYSTEM_CLOCK) -> CPUSource:
    """The container's usage when it runs under a CPU quota, else the machine's."""
    cgroup = CgroupCPU(clock=clock)
    if cgroup.available and cgroup.has_quota:
        return cgroup
    system = SystemCPU()
    if system.available:
        return system
    return ProcessCPU(cores=_cores_available(), clock=clock)


class SmoothedCPU:
    """``value = value × decay + sample × (1 − decay)`` every ``interval`` seconds, read lazily.

    Reading it (calling it) samples ``source`` when at least ``interval`` seconds have passed
    since the last sample; when ``n`` intervals have passed the update is applied as ``n`` steps
    of the same sample (``decay ** n``). Defaults are Kratos': 0.95 every 500 ms.
    """

    def __init__(
        self,
        source: CPUSource,
        *,
        decay: float = defaults.BBR_CPU_DECAY,
        interval: float = defaults.BBR_CPU_INTERVAL,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        validate.number("decay", decay, 0.0, 1.0, high_open=True)
        validate.seconds("interval", interval, positive=True)
        self.source = validate.function("source", source, what="a callable returning a CPU usage")
        self.decay = float(decay)
        self.interval = float(interval)
        self._now = clock.monotonic
        self.value = 0.0
        self._next = self._now() + self.interval
        source()  # start the source's delta

    def __call__(self) -> float:
        now = self._now()
        if now >= self._next:
            steps = int((now - self._next) // self.interval) + 1
            self._next += steps * self.interval
            keep = self.decay**steps
            self.value = self.value * keep + _clamp(self.source()) * (1 - keep)
        return self.value
