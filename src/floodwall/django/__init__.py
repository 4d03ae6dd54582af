"""Django: an app (``INSTALLED_APPS``), a settings-driven registry, the inbound guard as
middleware, a metrics view and ``manage.py floodwall_check``.

::

    INSTALLED_APPS = [..., "floodwall.django"]
    MIDDLEWARE = ["floodwall.django.middleware.FloodwallMiddleware", ...]   # first
    FLOODWALL = {"resources": {"reviews": {"timeout": "1s", "fallback": {"value": []}}}}
    #   or FLOODWALL = BASE_DIR / "floodwall.yaml" (YAML, TOML or JSON)
    FLOODWALL_GUARD = {"limits": [RateLimit("100/s", key="ip")], "deadline": 30.0}

``FLOODWALL`` is the configuration document (the one schema of ``floodwall.yaml``) or the path
of a file holding it; it builds one :class:`~floodwall.config.Registry` per process, read with
:func:`registry` (``registry().get("reviews")`` in a view, or as a decorator). ``FLOODWALL_GUARD``
holds the :class:`~floodwall.integrations._inbound.InboundGuard` options (``limits``,
``shedder``, ``idempotency``, ``deadline``, …; a limit may be a ``RateLimit`` or a mapping of its
arguments); the guard gets the registry, so views can ask ``request.floodwall.degraded(name)``.

The middleware (WSGI and ASGI, sync and async views alike) is a shell over the same guard core
as :mod:`floodwall.wsgi` and :mod:`floodwall.asgi`: 429/503/504 with ``Retry-After`` and a
problem+json body, 409/422 for idempotency conflicts, a floodwall rejection raised by a view
answered the same way (``process_exception``), ``X-Degraded`` when a fallback answered.
:func:`floodwall.django.views.metrics` serves the registry's and the guard's metrics to
Prometheus (needs ``floodwall[prometheus]``).

An invalid configuration is reported by Django's system checks (``floodwall.E001``, at
``runserver`` and ``manage.py check``), by ``manage.py floodwall_check`` (exit status 1), and
stops the server from loading the middleware (``ImproperlyConfigured``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from floodwall._core.extras import missing_extra

try:
    import django as _django
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.django", "django") from _missing

if TYPE_CHECKING:
    from floodwall.config import Registry
    from floodwall.integrations._inbound import InboundGuard

__all__ = ["guard", "registry"]

del _django


def registry() -> Registry:
    """The registry built from ``settings.FLOODWALL`` (``ImproperlyConfigured`` if invalid)."""
    from floodwall.django.apps import built

    return built().registry


def guard() -> InboundGuard:
    """The inbound guard built from ``settings.FLOODWALL_GUARD`` and the registry."""
    from floodwall.django.apps import built

    return built().guard
