"""Overload signals for :class:`~floodwall.degrade.AutoShedder`, normalised so 1.0 = at capacity.

A signal is any ``Callable[[], float]``. These adapters read the guards of
:mod:`floodwall.adaptive` (duck-typed: nothing is imported) and scale their figures so that the
controller's default thresholds (shed at 1.0, restore below 0.7) mean the same thing for each:

============================  ================================================================
:func:`queueing_signal`       DAGOR: the last window's average queueing time / its threshold
                              (20 ms); the signal the WeChat paper argues for
:func:`limiter_signal`        an adaptive concurrency limiter: in flight / current limit
:func:`cpu_signal`            a CPU source: usage / ``threshold`` (0.8, BBR's)
:func:`shed_rate_signal`      a :class:`~floodwall.adaptive.LoadShedder`: the share of requests
                              it refused since the previous reading / ``at`` (5 %)
:func:`max_signal`            the worst of several signals
============================  ================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError

__all__ = [
    "Signal",
    "cpu_signal",
    "limiter_signal",
    "max_signal",
    "queueing_signal",
    "shed_rate_signal",
]

Signal = Callable[[], float]
"""Returns the load now; 1.0 means at capacity."""


class _Queueing(Protocol):
    @property
    def last_queueing_time(self) -> float: ...

    @property
    def threshold(self) -> float: ...


class _Limiter(Protocol):
    @property
    def inflight(self) -> int: ...

    @property
    def limit(self) -> int: ...


class _Stats(Protocol):
    @property
    def admitted(self) -> int: ...

    @property
    def shed(self) -> int: ...


class _Shedder(Protocol):
    def stats(self) -> _Stats: ...


def _has(name: str, value: object, *attributes: str) -> None:
    if not all(hasattr(value, attribute) for attribute in attributes):
        raise ConfigError(f"{name} must have {', '.join(attributes)}, got {value!r}")


def queueing_signal(admission: _Queueing) -> Signal:
    """``last_queueing_time / threshold`` of a
    :class:`~floodwall.adaptive.QueueingTimeAdmission` (fed ``on_start`` by its server)."""
    _has("admission", admission, "last_queueing_time", "threshold")
    return lambda: admission.last_queueing_time / admission.threshold


def limiter_signal(limiter: _Limiter) -> Signal:
    """``inflight / limit`` of an :class:`~floodwall.adaptive.AdaptiveLimiter`."""
    _has("limiter", limiter, "inflight", "limit")
    return lambda: limiter.inflight / max(1, limiter.limit)


def cpu_signal(
    source: Callable[[], float], threshold: float = defaults.BBR_CPU_THRESHOLD
) -> Signal:
    """``source() / threshold`` for a CPU source (:mod:`floodwall.adaptive.cpu`)."""
    validate.function("source", source, what="a callable returning a CPU usage")
    validate.number("threshold", threshold, 0.0, 1.0, low_open=True)
    return lambda: source() / threshold


def shed_rate_signal(shedder: _Shedder, at: float = 0.05) -> Signal:
    """The share of requests ``shedder`` refused since the previous reading, over ``at``: a
    guard refusing ``at`` (5 %) of the traffic reads 1.0. NaN while no request arrived."""
    if not callable(getattr(shedder, "stats", None)):
        raise ConfigError(f"shedder must have stats() (a LoadShedder), got {shedder!r}")
    validate.number("at", at, 0.0, 1.0, low_open=True)
    last = [0, 0]

    def read() -> float:
        stats = shedder.stats()
        admitted, shed = stats.admitted - last[0], stats.shed - last[1]
        last[0], last[1] = stats.admitted, stats.shed
        total = admitted + shed
        return math.nan if total == 0 else shed / total / at

    return read


def max_signal(*signals: Signal) -> Signal:
    """The highest reading of ``signals`` (NaN readings ignored; NaN when all are)."""
    if not signals:
        raise ConfigError("max_signal needs at least one signal, got none")

    def read() -> float:
        values = [value for value in (signal() for signal in signals) if not math.isnan(value)]
        return max(values) if values else math.nan

    return read
