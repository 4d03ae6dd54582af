"""WSGI integration (Flask, Django): ``FloodwallMiddleware`` and the guard's parts.

See :mod:`floodwall.integrations.wsgi` and ``docs/integrations.md``. Needs no framework itself.
"""

from floodwall.integrations._inbound import (
    Admission,
    InboundGuard,
    RateLimit,
    by_header,
    client_ip,
    current_admission,
)
from floodwall.integrations.wsgi import FloodwallMiddleware

__all__ = [
    "Admission",
    "FloodwallMiddleware",
    "InboundGuard",
    "RateLimit",
    "by_header",
    "client_ip",
    "current_admission",
]
