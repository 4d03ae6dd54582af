"""Observability adapters: the core emits events and keeps counters; these expose them.

``Meter`` (cumulative outcomes and latency per resource) is core-side and imports nothing;
``prometheus``, ``otel`` and ``logs`` are adapters over the registry, imported on demand so
their client libraries stay optional.
"""

from floodwall.observe.meter import OUTCOMES, Meter

__all__ = ["OUTCOMES", "Meter"]
