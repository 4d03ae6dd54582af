"""A deterministic discrete-event simulator running real floodwall policies on virtual time.

Model a service (workers, a queue, a service-time distribution, a dependency behind a timeout
and a bulkhead), put a guard in front (an adaptive limiter, BBR, DAGOR, a load shedder), drive
it with open-loop, closed-loop or fan-out clients, and read goodput, success rate and latency
per phase: overload behaviour tested and tuned in seconds instead of hours, and capacity
planning from a YAML file (``floodwall simulate scenario.yaml``). Same seed, same result.
"""

from floodwall.sim.clients import ClosedLoop, FanOut, OpenLoop, Phase, phase_bounds
from floodwall.sim.engine import SimClock, Simulation
from floodwall.sim.metrics import OUTCOMES, Recorder, Summary
from floodwall.sim.models import (
    BBRGuard,
    Constant,
    DagorGuard,
    Dependency,
    Distribution,
    Exponential,
    Guard,
    Hang,
    Job,
    LimiterGuard,
    LogNormal,
    Server,
    ShedderGuard,
    SimCPU,
    Uniform,
    distribution,
)
from floodwall.sim.scenario import (
    SimResult,
    build_limit,
    format_report,
    read_scenario,
    run_scenario,
)

__all__ = [
    "OUTCOMES",
    "BBRGuard",
    "ClosedLoop",
    "Constant",
    "DagorGuard",
    "Dependency",
    "Distribution",
    "Exponential",
    "FanOut",
    "Guard",
    "Hang",
    "Job",
    "LimiterGuard",
    "LogNormal",
    "OpenLoop",
    "Phase",
    "Recorder",
    "Server",
    "ShedderGuard",
    "SimCPU",
    "SimClock",
    "SimResult",
    "Simulation",
    "Summary",
    "Uniform",
    "build_limit",
    "distribution",
    "format_report",
    "phase_bounds",
    "read_scenario",
    "run_scenario",
]
