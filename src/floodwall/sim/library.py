"""Ready-made scenarios: the published experiments floodwall reproduces, as scenario mappings.

Each returns a plain mapping for :func:`~floodwall.sim.run_scenario` (dump it to YAML to start
your own). ``guard`` is a guard spec (see :mod:`floodwall.sim.scenario`) or ``None``.

* :func:`grpc_example`: concurrency-limits' gRPC example (``concurrency-limits-grpc/src/test/
  .../example/Example.java``): a server of concurrency 2 with log-normal latency of mean 20 ms
  (capacity ≈ 100 rps) driven by exponential arrivals at 50, 90, 200 and 100 rps, 100 s each.
* :func:`fan_out`: DAGOR's experiment (SoCC 2018, §5): requests of 1–4 sequential sub-calls to
  an overloaded service at a feed rate of 1–4× its capacity.
* :func:`small_service_steps`: issue 18's small service (one worker, 2 ms a request, capacity
  500/s) under Poisson load stepping through multiples of its capacity, measured from each step.
* :func:`payment`: the seeds' post-mortem (004): 2 000 concurrent users, half of the requests
  call a payment service of which 5 % hang for 8 s.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "GRADIENT2",
    "SMALL_SERVICE_CAPACITY",
    "fan_out",
    "grpc_example",
    "payment",
    "small_service_steps",
]

GRADIENT2: dict[str, Any] = {
    "type": "limiter",
    "algorithm": "gradient2",
    "windowed": {"min_window_time": 1.0, "window_size": 10},
}
"""The example's limiter: Gradient2 with the builder defaults behind a 1 s, 10-sample window."""


def grpc_example(
    guard: dict[str, Any] | None = GRADIENT2,
    *,
    phase: float = 100.0,
    timeout: float = 1.0,
    warmup: float = 10.0,
    seed: int = 1,
) -> dict[str, Any]:
    """The gRPC example at 0.5×, 0.9×, 2× and 1× its ≈ 100 rps capacity, ``phase`` s each."""
    return {
        "name": "grpc-example",
        "seed": seed,
        "server": {"concurrency": 2},
        "guard": guard,
        "load": {
            "type": "open",
            "service_time": {"lognormal": {"mean": 0.020, "sigma": 1.0}},
            "timeout": timeout,
            "phases": [
                {"name": "0.5x", "duration": phase, "rate": 50},
                {"name": "0.9x", "duration": phase, "rate": 90},
                {"name": "2x", "duration": phase, "rate": 200},
                {"name": "1x", "duration": phase, "rate": 100},
            ],
        },
        "report": {"warmup": warmup},
    }


FAN_OUT_CONCURRENCY = 16
FAN_OUT_SERVICE = 0.020
"""Mean service time of the called service (uniform 10–30 ms); capacity 16 / 20 ms = 800/s."""


def fan_out(
    feed: float,
    fanout: int,
    *,
    coherent: bool = True,
    guard: dict[str, Any] | None = None,
    duration: float = 120.0,
    warmup: float = 60.0,
    upstream: bool = False,
    seed: int = 7,
) -> dict[str, Any]:
    """Requests of ``fanout`` sub-calls at ``feed`` × the service's capacity in sub-calls/s."""
    capacity = FAN_OUT_CONCURRENCY / FAN_OUT_SERVICE
    return {
        "name": f"fan-out k={fanout} feed={feed:g}x",
        "seed": seed,
        "server": {"concurrency": FAN_OUT_CONCURRENCY, "skip_expired": True},
        "guard": guard if guard is not None else {"type": "dagor"},
        "load": {
            "type": "fanout",
            "fanout": fanout,
            "coherent": coherent,
            "upstream": upstream,
            "timeout": 1.0,
            "service_time": {"uniform": {"low": 0.010, "high": 0.030}},
            "phases": [
                {"name": f"{feed:g}x", "duration": duration, "rate": feed * capacity / fanout}
            ],
        },
        "report": {"warmup": warmup},
    }


def payment(
    protected: bool,
    *,
    guard: dict[str, Any] | None = None,
    duration: float = 180.0,
    clients: int = 2000,
    seed: int = 4,
) -> dict[str, Any]:
    """The payment story: 200 worker threads; unprotected, the 8 s hangs pin them all.

    Protected = a 1 s timeout on the payment call, a bulkhead of 100 concurrent payment calls
    and an adaptive limit in front of the server (AIMD capped below the pool by default).
    """
    dependency: dict[str, Any] = {
        "share": 0.5,
        "latency": {
            "hang": {
                "base": {"lognormal": {"mean": 0.050, "sigma": 0.5}},
                "probability": 0.05,
                "duration": 8.0,
            }
        },
    }
    spec: dict[str, Any] = {
        "name": "payment " + ("protected" if protected else "unprotected"),
        "seed": seed,
        "server": {"concurrency": 200, "dependency": dependency},
        "load": {
            "type": "closed",
            "clients": clients,
            "think_time": {"exponential": {"mean": 1.0}},
            "service_time": 0.010,
            "timeout": 5.0,
            "retries": 2,
            "backoff": {"uniform": {"low": 0.1, "high": 1.0}},
            "duration": duration,
        },
    }
    if protected:
        dependency["timeout"] = 1.0
        dependency["bulkhead"] = 100
        spec["guard"] = guard or {
            "type": "limiter",
            "algorithm": "aimd",
            "options": {"max_limit": 180},
            "windowed": False,
        }
    return spec


SMALL_SERVICE_CAPACITY = 500.0
"""Requests per second of :func:`small_service_steps`' server (one worker, 2 ms mean)."""


def small_service_steps(
    guard: dict[str, Any] | None,
    *,
    steps: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0),
    step: float = 8.0,
    timeout: float = 0.1,
    seed: int = 3,
) -> dict[str, Any]:
    """One worker at 1.8–2.2 ms a request (the real-server benchmark's CPU-bound handler), open
    Poisson load at each of ``steps`` × its capacity for ``step`` s, a 100 ms client deadline,
    and no warm-up skipped: what a sudden step costs is part of the figure."""
    return {
        "name": "small-service",
        "seed": seed,
        "server": {"concurrency": 1},
        "guard": guard,
        "load": {
            "type": "open",
            "service_time": {"uniform": {"low": 0.0018, "high": 0.0022}},
            "timeout": timeout,
            "phases": [
                {
                    "name": f"{multiple:g}x",
                    "duration": step,
                    "rate": multiple * SMALL_SERVICE_CAPACITY,
                }
                for multiple in steps
            ],
        },
        "report": {"warmup": 0.0},
    }
