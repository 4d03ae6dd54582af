"""Observability adapters: the core emits events and keeps counters; these expose them.

``Meter`` (cumulative outcomes and latency per resource) lives in the core, since the config
registry keeps one per resource, and is re-exported here;
``prometheus``, ``otel`` and ``logs`` are adapters over the registry, imported on demand so
their client libraries stay optional.
"""

from floodwall._core.meter import OUTCOMES, Meter

__all__ = ["OUTCOMES", "Meter"]
