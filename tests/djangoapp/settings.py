"""Settings of the test project: the floodwall app, its middleware first, two dependencies.

``FW_DOWN`` names a file whose existence means "the dependencies are down" (shared by every
worker process of a real server); ``FW_LIMIT`` is the rate of the ``/limited`` route.
"""

from __future__ import annotations

import os
from pathlib import Path

import floodwall as fw

SECRET_KEY = "floodwall-tests-only"  # noqa: S105 - a test project's, never deployed
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "djangoapp.urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "floodwall.django"]
MIDDLEWARE = ["floodwall.django.middleware.FloodwallMiddleware"]
DATABASES: dict[str, object] = {}
USE_TZ = True
LOGGING = {"version": 1, "disable_existing_loggers": False}

DOWN = Path(os.environ.get("FW_DOWN", "/nonexistent/floodwall-down"))

FLOODWALL = {
    "resources": {
        "reviews": {
            "level": 3,
            "circuit_breaker": {"minimum_calls": 2, "failure_rate": 0.5, "open_duration": "30s"},
            "fallback": {"value": []},
        },
        "payments": {
            "level": 1,
            "circuit_breaker": {"minimum_calls": 2, "failure_rate": 0.5, "open_duration": "30s"},
        },
    }
}
FLOODWALL_GUARD = {
    "limits": [{"limiter": os.environ.get("FW_LIMIT", "5/m"), "route": "/limited", "key": "ip"}],
    "idempotency": fw.Idempotency("memory://", fingerprint=str),
}
