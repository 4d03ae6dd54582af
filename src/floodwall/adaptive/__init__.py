"""Adaptive overload protection: limits nobody has to hand-tune.

Pure limit algorithms (clock-free, fed ``on_sample(start, rtt, inflight, dropped)``):
:class:`AIMDLimit`, :class:`VegasLimit`, :class:`GradientLimit`, :class:`Gradient2Limit`,
:class:`FixedLimit`, and :class:`WindowedLimit` to aggregate samples per window.

Shells that hand out tokens or verdicts on an injected clock: :class:`AdaptiveLimiter`
(partitions, LIFO backlog), :class:`BBRLimiter` (Kratos BBR: CPU + in-flight),
:class:`QueueingTimeAdmission` (WeChat DAGOR: queueing time + compound priority),
:class:`ClientThrottle` (Google SRE client-side throttling) and :class:`LoadShedder`, the
server-side guard that rejects with :class:`~floodwall.OverloadedError` before work starts.
Each has its options as a frozen, validated object (:class:`AIMDOptions`, :class:`VegasOptions`,
:class:`GradientOptions`, :class:`Gradient2Options`, :class:`BBROptions`, :class:`DagorOptions`,
:class:`ThrottleOptions`, :class:`AdaptiveLimiterOptions`), held in its ``options`` attribute
and built by the configuration's ``adaptive:`` section. See ``docs/overload.md``.
"""

from floodwall.adaptive._base import (
    ExpAvgMeasurement,
    FixedLimit,
    Limit,
    MinimumMeasurement,
    log10_root,
    square_root,
)
from floodwall.adaptive.aimd import AIMDLimit, AIMDOptions
from floodwall.adaptive.bbr import BBR, BBRLimiter, BBROptions, BBRStats, BBRToken
from floodwall.adaptive.cpu import (
    CgroupCPU,
    CPUSource,
    ProcessCPU,
    SmoothedCPU,
    SystemCPU,
    default_cpu_source,
)
from floodwall.adaptive.dagor import (
    AdmissionLevel,
    DagorOptions,
    DagorPermit,
    QueueingTimeAdmission,
    UpstreamLevels,
    UserPriority,
    user_priority,
)
from floodwall.adaptive.gradient import GradientLimit, GradientOptions
from floodwall.adaptive.gradient2 import Gradient2Limit, Gradient2Options
from floodwall.adaptive.limiter import (
    AdaptiveLimiter,
    AdaptiveLimiterOptions,
    PartitionStats,
    Token,
)
from floodwall.adaptive.shedding import LoadShedder, Permit, ShedderStats, Ticket
from floodwall.adaptive.throttle import ClientThrottle, ThrottleOptions, reject_probability
from floodwall.adaptive.vegas import VegasLimit, VegasOptions
from floodwall.adaptive.windowed import WindowedLimit

__all__ = [
    "BBR",
    "AIMDLimit",
    "AIMDOptions",
    "AdaptiveLimiter",
    "AdaptiveLimiterOptions",
    "AdmissionLevel",
    "BBRLimiter",
    "BBROptions",
    "BBRStats",
    "BBRToken",
    "CPUSource",
    "CgroupCPU",
    "ClientThrottle",
    "DagorOptions",
    "DagorPermit",
    "ExpAvgMeasurement",
    "FixedLimit",
    "Gradient2Limit",
    "Gradient2Options",
    "GradientLimit",
    "GradientOptions",
    "Limit",
    "LoadShedder",
    "MinimumMeasurement",
    "PartitionStats",
    "Permit",
    "ProcessCPU",
    "QueueingTimeAdmission",
    "ShedderStats",
    "SmoothedCPU",
    "SystemCPU",
    "ThrottleOptions",
    "Ticket",
    "Token",
    "UpstreamLevels",
    "UserPriority",
    "VegasLimit",
    "VegasOptions",
    "WindowedLimit",
    "default_cpu_source",
    "log10_root",
    "reject_probability",
    "square_root",
    "user_priority",
]
