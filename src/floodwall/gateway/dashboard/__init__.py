"""The live dashboard: a page on the admin listener, fed a frame a second over SSE.

The page (``index.html``, ``app.js``, ``style.css`` beside this module) opens an
``EventSource`` on ``/dashboard/events``; each event is one :func:`frame`: per route the
request rate, error rate, latency p50/p99 over the last interval, breaker state, limiter
rejections, bulkhead use and shedding, what the upstream did apart from what clients got
(the dependency error rate: requests the upstream did not answer; the degraded rate: answers
a fallback gave; so a route whose every request is answered by its fallback reads 100 % and
100 %, not 0 % errors), and per upstream the same two rates, the share of tries that failed,
and its endpoints' state (``up``,
``failing``: a failure since the last frame or in its latest run, ``unhealthy``, ``ejected``)
with the failures per second and by reason, all computed
here from two successive cumulative snapshots (so every worker's counters simply add up).
It is the Hystrix/Sentinel dashboard, for this gateway.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Any

from floodwall._core import validate
from floodwall._core.window import latency_bin_bounds

__all__ = ["asset", "frame", "histogram_percentile", "merge_status", "shares"]

ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


def asset(name: str) -> tuple[bytes, str]:
    """``(content, content type)`` of one of the page's files."""
    content_type = ASSETS.get(name) if isinstance(name, str) else None
    if content_type is None:
        raise ValueError(f"name must be one of {', '.join(sorted(ASSETS))}, got {name!r}")
    return resources.files(__name__).joinpath(name).read_bytes(), content_type


def histogram_percentile(bins: dict[int, int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a histogram of log-linear bins, in seconds (the bin's
    midpoint, ±12 %); ``None`` when the histogram is empty."""
    if not isinstance(bins, Mapping):
        raise TypeError(f"bins must be a mapping of bin index to count, got {bins!r}")
    validate.share("q", q, error=ValueError)
    total = sum(bins.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(bins):
        seen += bins[index]
        if seen >= rank:
            low, high = latency_bin_bounds(index)
            return (low + high) / 2
    low, high = latency_bin_bounds(max(bins))
    return (low + high) / 2


_FIRST = frozenset({"level", "failure_rate", "limit", "scope", "upstream", "resource", "state"})
"""Figures that are not added up across workers (the first worker's is kept)."""


def _add(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if key in _FIRST or isinstance(value, bool) or not isinstance(value, int | float | dict):
            into.setdefault(key, value)
        elif isinstance(value, dict):
            _add(into.setdefault(key, {}), value)
        else:
            into[key] = into.get(key, 0) + value


_STATE_RANK = {
    "CLOSED": 0,
    "DISABLED": 1,
    "FORCED_CLOSED": 2,
    "HALF_OPEN": 3,
    "OPEN": 4,
    "FORCED_OPEN": 5,
}


def merge_status(statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """Several workers' ``/status`` as one: counters added, the most alarming breaker state,
    an endpoint up only where every worker has it up, a level shed or an override in force
    where any worker has it."""
    if len(statuses) == 1:
        return statuses[0]
    merged: dict[str, Any] = {"routes": {}, "upstreams": {}, "workers": len(statuses)}
    for status in statuses:
        for key in ("requests", "in_flight"):
            merged[key] = merged.get(key, 0) + status.get(key, 0)
        merged.setdefault("version", status.get("version"))
        levels = set(merged.get("shed_levels", [])) | set(status.get("shed_levels", []))
        merged["shed_levels"] = sorted(levels)  # (shed on any worker: shown)
        overrides = merged.setdefault("overrides", [])
        overrides.extend(o for o in status.get("overrides", []) if o not in overrides)
        merged.setdefault("resources", status.get("resources", {}))
        for name, route in status["routes"].items():
            into = merged["routes"].setdefault(name, {})
            state = route.get("breaker", {}).get("state")
            _add(into, route)
            if state is not None:
                current = into["breaker"].get("state_merged", "CLOSED")
                worst = max(current, state, key=lambda s: _STATE_RANK.get(s, 0))
                into["breaker"]["state_merged"] = worst
                into["breaker"]["state"] = worst
        for name, upstream in status["upstreams"].items():
            into = merged["upstreams"].setdefault(name, {"endpoints": []})
            for index, endpoint in enumerate(upstream["endpoints"]):
                if index >= len(into["endpoints"]):
                    into["endpoints"].append(dict(endpoint))
                    continue
                _merge_endpoint(into["endpoints"][index], endpoint)
            for part in ("dependency", "answers", "tries"):
                _add(into.setdefault(part, {}), upstream.get(part, {}))
            into["balance"] = upstream.get("balance")
            into["retries_elsewhere"] = into.get("retries_elsewhere", 0) + upstream.get(
                "retries_elsewhere", 0
            )
    return merged


_STATE_ORDER = ("up", "failing", "unhealthy", "ejected")
"""Endpoint states, least alarming first (several workers: the worst is shown)."""


def _merge_endpoint(mine: dict[str, Any], other: dict[str, Any]) -> None:
    """One endpoint as every worker saw it: counts added, up only where all have it up."""
    for key in ("requests", "failures", "in_flight"):
        mine[key] += other[key]
    mine["healthy"] = mine["healthy"] and other["healthy"]
    mine["ejected"] = mine["ejected"] or other["ejected"]
    reasons = mine.setdefault("failures_by_reason", {})
    for reason, count in other.get("failures_by_reason", {}).items():
        reasons[reason] = reasons.get(reason, 0) + count
    mine["consecutive_failures"] = max(
        mine.get("consecutive_failures", 0), other.get("consecutive_failures", 0)
    )
    mine["last_failure"] = mine.get("last_failure") or other.get("last_failure")
    states = [s for s in (mine.get("state"), other.get("state")) if s in _STATE_ORDER]
    if states:
        mine["state"] = max(states, key=_STATE_ORDER.index)


def _endpoint_frame(
    now: dict[str, Any], before: dict[str, Any] | None, dt: float
) -> dict[str, Any]:
    """An endpoint in a frame: its state and what failed since the previous frame."""
    failed = max(
        0, now["failures"] - (before["failures"] if before is not None else now["failures"])
    )
    state = now.get("state") or ("ejected" if now["ejected"] else "up")
    if state == "up" and failed:
        state = "failing"
    return {
        "url": now["url"],
        "up": now["healthy"] and not now["ejected"],
        "state": state,
        "healthy": now["healthy"],
        "ejected": now["ejected"],
        "in_flight": now["in_flight"],
        "requests": now["requests"],
        "failures": now["failures"],
        "failures_per_s": round(failed / dt, 2) if dt > 0 else 0.0,
        "failures_by_reason": now.get("failures_by_reason", {}),
        "last_failure": now.get("last_failure"),
    }


def _delta_bins(now: dict[str, int], before: dict[str, int]) -> dict[int, int]:
    out = {}
    for key, count in now.items():
        diff = count - before.get(key, 0)
        if diff > 0:
            out[int(key)] = diff
    return out


def _rate(now: int, before: int, dt: float) -> float:
    return max(0, now - before) / dt if dt > 0 else 0.0


def shares(now: dict[str, Any], before: dict[str, Any] | None) -> dict[str, float | None]:
    """What the upstream did and what clients got between two snapshots of a route or an
    upstream (``dependency`` and ``answers`` counts): ``dependency_error_rate`` (requests the
    upstream did not answer: errors, timeouts, refusals), ``degraded_rate`` (answered by a
    fallback), ``client_error_rate`` (the client got an error); ``None`` without requests."""
    dependency = now.get("dependency", {})
    answers = now.get("answers", {})
    old_dependency = (before or {}).get("dependency", {})
    old_answers = (before or {}).get("answers", {})
    total = sum(dependency.values()) - sum(old_dependency.values())
    if total <= 0:
        return {"dependency_error_rate": None, "degraded_rate": None, "client_error_rate": None}

    def delta(counts: dict[str, int], old: dict[str, int], key: str) -> int:
        return counts.get(key, 0) - old.get(key, 0)

    failed = total - delta(dependency, old_dependency, "success")
    return {
        "dependency_error_rate": round(failed / total, 4),
        "degraded_rate": round(delta(answers, old_answers, "fallback") / total, 4),
        "client_error_rate": round(delta(answers, old_answers, "error") / total, 4),
    }


def _route_frame(
    name: str, now: dict[str, Any], before: dict[str, Any] | None, dt: float
) -> dict[str, Any]:
    stats = now["stats"]
    empty: dict[str, Any] = {"requests": 0, "classes": {}, "outcomes": {}, "bins": {}}
    old: dict[str, Any] = before["stats"] if before is not None else empty
    classes, old_classes = stats["classes"], old["classes"]
    answered = sum(classes.values()) - sum(old_classes.values())
    errors = (classes.get("5xx", 0) - old_classes.get("5xx", 0)) + (
        classes.get("aborted", 0) - old_classes.get("aborted", 0)
    )
    bins = _delta_bins(stats["bins"], old["bins"])
    p50, p99 = histogram_percentile(bins, 0.5), histogram_percentile(bins, 0.99)
    outcomes, old_outcomes = stats["outcomes"], old["outcomes"]
    out: dict[str, Any] = {
        "name": name,
        "upstream": now.get("upstream"),
        "level": now.get("level"),
        "rps": round(_rate(stats["requests"], old.get("requests", 0), dt), 2),
        "error_rate": round(errors / answered, 4) if answered > 0 else 0.0,
        "p50_ms": None if p50 is None else round(p50 * 1000, 3),
        "p99_ms": None if p99 is None else round(p99 * 1000, 3),
        "in_flight": stats["in_flight"],
        "outcomes_per_s": {
            k: round(_rate(v, old_outcomes.get(k, 0), dt), 2) for k, v in outcomes.items()
        },
        **shares(stats, old),
        "breaker": now.get("breaker", {}).get("state"),
        "failure_rate": now.get("breaker", {}).get("failure_rate"),
    }
    limit = now.get("rate_limit")
    if limit is not None:
        old_limit = (before or {}).get("rate_limit", {})
        out["limiter"] = {
            "scope": limit["scope"],
            "rejected": limit["rejected"],
            "rejected_per_s": round(_rate(limit["rejected"], old_limit.get("rejected", 0), dt), 2),
        }
    bulkhead = now.get("bulkhead")
    if bulkhead is not None:
        out["bulkhead"] = {
            "in_flight": bulkhead["in_flight"],
            "max": bulkhead["max_concurrent"],
            "rejected": bulkhead["rejected"],
        }
    shedding = now.get("shedding")
    if shedding is not None:
        out["shedding"] = {"shed": shedding["shed"], "limit": shedding.get("limit")}
    return out


def frame(
    now: dict[str, Any], before: dict[str, Any] | None, dt: float, at: float
) -> dict[str, Any]:
    """One dashboard frame from the merged status ``now`` and the previous one ``dt`` seconds
    earlier (``None`` at first: rates from zero are then left at zero)."""
    routes = []
    for name, route in now["routes"].items():
        prior = None if before is None else before["routes"].get(name)
        if before is None:
            prior = route
        routes.append(_route_frame(name, route, prior, dt))
    upstreams = []
    for name, upstream in now["upstreams"].items():
        old = None if before is None else before["upstreams"].get(name)
        old_endpoints = {e["url"]: e for e in old["endpoints"]} if old is not None else {}
        tries, old_tries = upstream.get("tries", {}), (old or upstream).get("tries", {})
        sent = tries.get("requests", 0) - old_tries.get("requests", 0)
        failed = tries.get("failures", 0) - old_tries.get("failures", 0)
        upstreams.append(
            {
                "name": name,
                "balance": upstream.get("balance"),
                "retries_elsewhere": upstream.get("retries_elsewhere", 0),
                **shares(upstream, old if old is not None else upstream),
                "try_failure_rate": round(failed / sent, 4) if sent > 0 else None,
                "endpoints": [
                    _endpoint_frame(e, old_endpoints.get(e["url"]), dt)
                    for e in upstream["endpoints"]
                ],
            }
        )
    return {
        "time": at,
        "version": now.get("version"),
        "workers": now.get("workers", 1),
        "workers_down": now.get("workers_down", []),
        "shed_levels": now.get("shed_levels", []),
        "overrides": now.get("overrides", []),
        "routes": routes,
        "upstreams": upstreams,
    }
