"""ASGI integration (FastAPI, Starlette): ``FloodwallMiddleware`` and the guard's parts.

See :mod:`floodwall.integrations.asgi` and ``docs/integrations.md``. Needs no framework itself.
"""

from floodwall.integrations._inbound import (
    Admission,
    InboundGuard,
    RateLimit,
    by_header,
    client_ip,
    current_admission,
)
from floodwall.integrations.asgi import FloodwallMiddleware

__all__ = [
    "Admission",
    "FloodwallMiddleware",
    "InboundGuard",
    "RateLimit",
    "by_header",
    "client_ip",
    "current_admission",
]
