"""``metrics``: the registry's and the inbound guard's metrics in Prometheus' text format.

``path("metrics", floodwall.django.views.metrics)`` in ``urls.py``; needs
``floodwall[prometheus]``. Resources (breaker state, calls by outcome, fallbacks, timeouts,
shed levels) and the guard's decisions by outcome and reason (``guard="http"``), from this
process: under several worker processes each answers for itself (use Prometheus' multiprocess
mode or scrape each worker).
"""

from __future__ import annotations

import threading
from typing import Any

from django.http import HttpRequest, HttpResponse

from floodwall.django.apps import built

__all__ = ["metrics"]

_lock = threading.Lock()
_published: dict[int, Any] = {}


def _registry() -> Any:
    from prometheus_client import CollectorRegistry

    from floodwall.observe.prometheus import register, register_guard

    current = built()
    with _lock:
        found = _published.get(id(current))
        if found is None:
            _published.clear()
            found = CollectorRegistry(auto_describe=True)
            register(current.registry, into=found)
            register_guard(current.guard, into=found, name="http")
            _published[id(current)] = found
    return found


def metrics(request: HttpRequest) -> HttpResponse:
    """The metrics of this process (``text/plain; version=0.0.4``)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)
