"""What every metrics adapter reads, defined once (Prometheus and OpenTelemetry agree by
construction): the rate limiter's decisions, and the inbound guard's figures."""

from __future__ import annotations

from typing import Any, Protocol

from floodwall.shared.host_bulkhead import HostBulkhead
from floodwall.shared.idempotency import Idempotency
from floodwall.stores.guard import StoreGuard

__all__ = [
    "InboundGuard",
    "TaskGuard",
    "rate_limit_decisions",
    "shedder_figures",
    "store_figures",
    "task_deliveries",
]

_BEFORE_LIMITER = ("circuit_open", "bulkhead_full", "degraded")
"""Outcomes of calls refused before the limiter saw them (the pipeline's order is fixed:
sampled drop, fallback, cache, breaker, bulkhead, rate limit, ...)."""


def rate_limit_decisions(resource: Any) -> dict[str, int] | None:
    """``{"admitted": n, "rejected": m, "store_unavailable": k}`` of a resource's rate
    limiter, from its meter: ``rejected`` by the limit, refused because its store was down
    (``fail_closed``: nothing was checked), and every other call not refused before the
    limiter admitted. ``None`` without a limiter (or without a meter)."""
    if resource.limiter is None or resource.meter is None:
        return None
    counts, _, _ = resource.meter.read()
    rejected = counts.get("rate_limited", 0)
    down = counts.get("store_unavailable", 0)
    before = sum(counts.get(kind, 0) for kind in _BEFORE_LIMITER)
    admitted = sum(counts.values()) - before - rejected - down
    return {"admitted": admitted, "rejected": rejected, "store_unavailable": down}


class InboundGuard(Protocol):
    """What the adapters read of an inbound guard (``floodwall.integrations``' guard; named
    structurally, since observe sits below the integrations layer)."""

    shedder: Any

    def decisions(self) -> dict[tuple[str, str], int]: ...


class TaskGuard(Protocol):
    """What the adapters read of a task guard (Celery, Dramatiq, arq: named structurally, as
    :class:`InboundGuard` is)."""

    name: str

    def snapshot(self) -> dict[str, int]: ...


def task_deliveries(guard: TaskGuard) -> dict[str, int]:
    """A task guard's deliveries by what became of them: ``executions`` (the function ran),
    ``replays`` (a stored result answered), ``deferred``, ``retried``, ``failed``."""
    return dict(guard.snapshot())


def shedder_figures(guard: InboundGuard) -> tuple[float, float] | None:
    """``(limit, in flight)`` of the guard's load shedder when its limiter has both (an
    adaptive limit), else ``None``."""
    shedder = guard.shedder
    limiter = None if shedder is None else shedder.limiter
    limit = getattr(limiter, "limit", None)
    inflight = getattr(limiter, "inflight", None)
    if isinstance(limit, int | float) and isinstance(inflight, int | float):
        return float(limit), float(inflight)
    return None


def store_figures(resource: Any) -> list[tuple[str, bool, int]]:
    """``(policy, up, degraded calls)`` for each of a resource's policies that keep their
    state in a store (``rate_limit``, ``bulkhead``, ``cache``, ``idempotency``): whether the
    store answers, and how many calls ``on_store_error`` answered instead."""
    idempotency = next((p for p in resource.policies if isinstance(p, Idempotency)), None)
    parts = (
        ("rate_limit", resource.limiter),
        ("bulkhead", resource.bulkhead),
        ("cache", resource.cache),
        ("idempotency", idempotency),
    )
    out = []
    for label, policy in parts:
        if isinstance(policy, HostBulkhead):
            out.append((label, policy.store_state == "up", policy.degraded))
            continue
        guard = getattr(policy, "guard", None)
        if isinstance(guard, StoreGuard):
            out.append((label, guard.state == "up", guard.degraded))
    return out
